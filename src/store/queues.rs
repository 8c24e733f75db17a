//! Queues as dashboards see them: each queue's parents and children by
//! state, its oldest pending child and its throughput over the last minute,
//! summed from its parents' projections (migration 0009), so reading a queue
//! costs the same whether its parents hold a thousand children or a million.

use super::reports::QueueRow;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult};
use crate::ledger::admission::KeyUsage;
use crate::ledger::{Queue, QueueName, QueueScope};

impl Store {
    /// Every queue within `within` that has a parent or is paused (or only
    /// `queue`), in name order.
    pub async fn queues(&self, queue: Option<&QueueName>, within: &QueueScope) -> StoreResult<Vec<Queue>> {
        let scope = within.as_json();
        let rows = self
            .scan(
                Statement::new(self.sql(&QUEUE_SUMMARIES))
                    .text(queue.map(QueueName::as_str))
                    .text(scope.as_deref()),
            )
            .await?;
        let mut queues: Vec<Queue> = rows
            .iter()
            .map(|row| Ok(QueueRow::from_row(&**row)?.into_queue()))
            .collect::<StoreResult<_>>()?;
        if !queues.is_empty() {
            let rows = self
                .db
                .fetch(Statement::new(self.sql(&KEYS_IN_FLIGHT)).text(queue.map(QueueName::as_str)))
                .await?;
            for row in &rows {
                let name = row.text("queue")?;
                if let Some(q) = queues.iter_mut().find(|q| q.queue.as_str() == name)
                    && q.flow_keys.len() < KEYS_SHOWN
                {
                    q.flow_keys.push(KeyUsage {
                        flow_key: row.text("flow_key")?,
                        in_flight: row.int("in_flight")?,
                    });
                }
            }
        }
        Ok(queues)
    }
}

/// How many flow keys a queue shows at most.
const KEYS_SHOWN: usize = 20;

/// The flow keys with children in flight (of queue `$1`, or every queue),
/// most first, from the live leases.
static KEYS_IN_FLIGHT: Sql = Sql::new(|d| {
    format!(
        "SELECT queue, flow_key, CAST(sum(open) AS BIGINT) AS in_flight FROM claim_lease \
         WHERE expires_at > {now} AND flow_key IS NOT NULL AND ($1 IS NULL OR queue = $1) \
         GROUP BY queue, flow_key ORDER BY in_flight DESC, queue, flow_key LIMIT 2000",
        now = d.now
    )
});

/// Every queue (or queue `$1`) within scope `$2`, one row per queue (see
/// `reports::QueueRow`): parents by state and their projections summed, their
/// minute buckets, and the oldest pending child of its open lanes; and a row
/// of zeros for a paused queue without parents (none yet, or all deleted).
/// A lane's longest-waiting children are its oldest given back
/// (`child_given_back_by_parent`) and the next one its claims take, at its
/// floor: children are claimed in sequence order, and the rows below the
/// floor (in flight, or recorded processed without being rewritten) are
/// never read. Two probes per open lane, however many children the ledger
/// has recorded: a walk of `child_pending_changed` in time order went past
/// every such row first.
static QUEUE_SUMMARIES: Sql = Sql::new(|d| {
    format!(
        "SELECT p.queue, \
             CAST(sum(CASE WHEN p.decomposed_at IS NULL THEN 1 ELSE 0 END) AS BIGINT) AS decomposing, \
             CAST(sum(CASE WHEN p.decomposed_at IS NOT NULL AND p.completed_at IS NULL THEN 1 ELSE 0 END) AS BIGINT) \
                 AS active, \
             CAST(sum(CASE WHEN p.completed_at IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS complete, \
             CAST(sum(p.total) AS BIGINT) AS total, CAST(sum(p.processed) AS BIGINT) AS processed, \
             CAST(sum(p.failed) AS BIGINT) AS failed, CAST(sum(p.skipped) AS BIGINT) AS skipped, \
             CAST(sum(coalesce(l.claimed - l.unclaimed, 0) - p.settled_in_flight) AS BIGINT) AS in_flight, \
             CAST(sum(coalesce(l.held_in - l.held_out, 0) - p.settled_held) AS BIGINT) AS held, \
             CAST(sum(CASE WHEN p.minute = {minute} THEN p.minute_processed ELSE 0 END) AS BIGINT) AS processed_now, \
             CAST(sum(CASE WHEN p.minute = {minute} THEN p.minute_failed ELSE 0 END) AS BIGINT) AS failed_now, \
             CAST(sum(CASE WHEN p.minute = {minute} THEN p.previous_minute_processed \
                           WHEN p.minute = {minute} - 1 THEN p.minute_processed ELSE 0 END) AS BIGINT) \
                 AS processed_before, \
             CAST(sum(CASE WHEN p.minute = {minute} THEN p.previous_minute_failed \
                           WHEN p.minute = {minute} - 1 THEN p.minute_failed ELSE 0 END) AS BIGINT) AS failed_before, \
             (SELECT min((SELECT c.changed_at FROM child c WHERE c.parent_id = ql.parent_id \
                          AND c.sequence >= ql.floor AND c.state = 'pending' AND c.available_at IS NULL \
                          ORDER BY c.sequence LIMIT 1)) \
              FROM lane ql WHERE ql.queue = p.queue AND (ql.floor IS NOT NULL OR ql.ready_at IS NOT NULL)) \
                 AS oldest_fresh_since, \
             (SELECT min((SELECT min(c.changed_at) FROM child c WHERE c.parent_id = ql.parent_id \
                          AND c.state = 'pending' AND c.available_at IS NOT NULL)) \
              FROM lane ql WHERE ql.queue = p.queue AND (ql.floor IS NOT NULL OR ql.ready_at IS NOT NULL)) \
                 AS oldest_given_back_since, \
             {epoch} AS epoch, \
             EXISTS (SELECT 1 FROM queue_pause qp WHERE qp.queue = p.queue) AS paused \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id \
         WHERE ($1 IS NULL OR p.queue = $1) AND {within} \
         GROUP BY p.queue \
         UNION ALL \
         SELECT p.queue, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, {epoch}, TRUE FROM queue_pause p \
         WHERE ($1 IS NULL OR p.queue = $1) AND {within} \
             AND NOT EXISTS (SELECT 1 FROM parent x WHERE x.queue = p.queue) \
         ORDER BY queue",
        minute = d.minute,
        epoch = d.epoch,
        within = (d.within)("$2"),
    )
});
