//! Queues as dashboards see them: each queue's parents and children by
//! state, its oldest pending child and its throughput over the last minute,
//! summed from its parents' projections (migration 0009), so reading a queue
//! costs the same whether its parents hold a thousand children or a million.

use super::rows::QueueRow;
use super::{Db, Store, StoreResult, dispatch};
use crate::access::QueueScope;
use crate::ledger::{Queue, QueueName};

impl Store {
    /// Every queue within `within` that has ever had a parent (or only
    /// `queue`), in name order.
    pub async fn queues(&self, queue: Option<&QueueName>, within: &QueueScope) -> StoreResult<Vec<Queue>> {
        let rows = dispatch!(self, s => s.queue_rows(queue, within).await)?;
        Ok(rows.into_iter().map(QueueRow::into_queue).collect())
    }

    /// Pauses (or resumes) a queue in the database, so every replica's claims
    /// see it at once; whether that changed anything.
    pub async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        dispatch!(self, s => s.set_paused(queue, paused).await)
    }
}
