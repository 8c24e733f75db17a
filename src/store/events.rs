//! What live views read: many parents in one statement, a queue's
//! completions since a moment, and which queues are paused. The event hub
//! runs these one at a time, for every stream of the process together.

use chrono::{DateTime, Utc};

use super::rows;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult, sql};
use crate::ledger::{Parent, ParentId, QueueName};

/// Parents `$1` (a JSON array of ids), with their open counts.
static PARENTS_BY_IDS: Sql = Sql::new(|d| {
    format!(
        "{} WHERE p.parent_id IN ({})",
        sql::PARENT_SELECT.as_str(),
        (d.json_texts)("$1")
    )
});

/// The parents of queue `$1` completed after completion time `$2` and, at
/// that time, after parent `$4`, oldest completion first, `$3` at most
/// (index `parent_queue_completed`).
static QUEUE_COMPLETIONS: Sql = Sql::new(|_| {
    format!(
        "{} WHERE p.queue = $1 AND p.completed_at IS NOT NULL AND (p.completed_at, p.parent_id) > ($2, $4) \
         ORDER BY p.completed_at, p.parent_id LIMIT $3",
        sql::PARENT_SELECT.as_str()
    )
});

const PAUSED_QUEUES: &str = "SELECT queue FROM queue_pause";

/// How many parents one read names at most.
const PARENTS_PER_READ: usize = 500;

impl Store {
    /// The parents of `ids` that exist, in no order, read in as few
    /// statements as their number allows.
    pub async fn parents_now(&self, ids: &[ParentId]) -> StoreResult<Vec<Parent>> {
        let mut parents = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(PARENTS_PER_READ) {
            let list =
                serde_json::to_string(&chunk.iter().map(ParentId::as_str).collect::<Vec<_>>()).expect("ids serialize");
            let rows = self
                .scan(Statement::new(self.sql(&PARENTS_BY_IDS)).text(list.as_str()))
                .await?;
            for row in &rows {
                parents.push(rows::parent(&**row, false)?);
            }
        }
        Ok(parents)
    }

    /// The parents of `queue` completed after `after` (a completion time,
    /// and the parent id of a completion at that time to go on after; none:
    /// every completion at that time is after it), oldest completion first,
    /// `limit` at most.
    pub async fn queue_completions(
        &self,
        queue: &QueueName,
        after: (DateTime<Utc>, Option<&ParentId>),
        limit: i64,
    ) -> StoreResult<Vec<Parent>> {
        let (at, parent_id) = after;
        let rows = self
            .scan(
                Statement::new(self.sql(&QUEUE_COMPLETIONS))
                    .text(queue.as_str())
                    .time(at)
                    .int(limit)
                    // No parent id sorts before every other.
                    .text(parent_id.map_or("", ParentId::as_str)),
            )
            .await?;
        rows.iter().map(|row| Ok(rows::parent(&**row, false)?)).collect()
    }

    /// Every paused queue.
    pub async fn paused_queues(&self) -> StoreResult<Vec<QueueName>> {
        let rows = self.scan(Statement::new(PAUSED_QUEUES)).await?;
        Ok(rows
            .iter()
            .map(|row| row.text("queue").map(QueueName::from_ledger))
            .collect::<Result<_, _>>()?)
    }
}
