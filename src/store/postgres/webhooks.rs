//! The webhook outbox on Postgres: the one statement text that writes
//! completion events, as a CTE of the statements that complete parents on
//! their own and as a statement of its own in a transaction.

use std::sync::LazyLock;

use async_trait::async_trait;

use super::PgTx;
use crate::ledger::ParentId;
use crate::store::StoreResult;
use crate::store::backend::Outbox;

/// Writes the events of the completed parents `source` names (a query of
/// `parent_id` as `s`), completed at `completed_at`; each parent is looked up
/// by its key (a subquery per row, never a join the planner could turn into
/// a scan), and there is one event per completion.
fn enqueue(source: &str, completed_at: &str) -> String {
    format!(
        "INSERT INTO webhook_event (event_id, parent_id, completed_at, url) \
         SELECT gen_random_uuid(), c.parent_id, c.completed_at, c.url FROM ( \
             SELECT s.parent_id, {completed_at} AS completed_at, \
                 (SELECT p.webhook_url FROM parent p WHERE p.parent_id = s.parent_id) AS url \
             FROM ({source}) s) c \
         WHERE c.url IS NOT NULL AND c.completed_at IS NOT NULL \
         ON CONFLICT (parent_id, completed_at) DO NOTHING"
    )
}

/// The outbox rows of the parents `bumped` just completed, as one more CTE of
/// a statement that runs `BUMP_PARENTS`: a statement that completes nothing
/// reads and writes nothing here. (`parent` is read as it was before the
/// statement: its `webhook_url` does not change, and `completed_at` is this
/// transaction's `now()`, which `bumped` returns.)
pub(super) static ENQUEUE_BUMPED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "webhook_events AS ({})",
        enqueue("SELECT parent_id FROM bumped WHERE completed", "now()")
    )
});

/// The same for the parents of `$1`, in a transaction that completed them.
static ENQUEUE: LazyLock<String> = LazyLock::new(|| {
    enqueue(
        "SELECT unnest($1::text[]) AS parent_id",
        "(SELECT p.completed_at FROM parent p WHERE p.parent_id = s.parent_id)",
    )
});

#[async_trait]
impl Outbox for PgTx {
    async fn enqueue_completed(&mut self, parents: &[ParentId]) -> StoreResult<u64> {
        let ids: Vec<&str> = parents.iter().map(ParentId::as_str).collect();
        let written = sqlx::query(ENQUEUE.as_str()).bind(&ids).execute(&mut **self).await?;
        Ok(written.rows_affected())
    }
}
