//! Pause and retention: queues paused in the database (so every replica's
//! claims see it at once), and complete parents deleted in bounded batches.

use super::statement::{Sql, Statement};
use super::{Store, StoreError, StoreResult};
use crate::ledger::{Changes, ParentId, QueueName, QueueScope, Work};

/// Children a pruner's transaction deletes at most.
const PRUNE_BATCH: i64 = 5_000;

static PAUSE_QUEUE: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO queue_pause (queue, paused_at) VALUES ($1, {}) ON CONFLICT (queue) DO NOTHING",
        d.now
    )
});

const RESUME_QUEUE: &str = "DELETE FROM queue_pause WHERE queue = $1";

/// Complete parents whose completion is older than `$1` seconds, oldest
/// first, `$2` at most (the pruner's next batch).
static PRUNABLE: Sql = Sql::new(|d| {
    format!(
        "SELECT parent_id FROM parent WHERE completed_at IS NOT NULL AND completed_at < {} \
         ORDER BY completed_at LIMIT $2",
        (d.ago)("$1")
    )
});

/// Deletes up to `$2` children of parent `$1` (the pruner's batch), by key.
const DELETE_CHILDREN: &str = "DELETE FROM child WHERE parent_id = $1 AND sequence IN ( \
    SELECT sequence FROM child WHERE parent_id = $1 ORDER BY sequence LIMIT $2)";

/// The outcome batches that name a complete parent's processed children
/// (`processed_batch`), deleted before its children: while the children go,
/// batch by batch, the children search would otherwise find batches naming
/// children that are gone, and end its walk of processed children early.
const DELETE_BATCHES: &str = "DELETE FROM processed_batch WHERE parent_id = $1 \
    AND EXISTS (SELECT 1 FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL)";

/// What goes with a complete parent whose children are gone, before its row
/// (`DELETE_PARENT`): any lease row left on it (a lease row goes when its
/// last child is recorded, so normally there is none), then its lane.
const DELETE_LEASES: &str = "DELETE FROM claim_lease WHERE parent_id = $1 \
    AND EXISTS (SELECT 1 FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL) \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)";

/// The lane of a complete parent whose children are gone (see `DELETE_LEASES`).
const DELETE_LANE: &str = "DELETE FROM lane WHERE parent_id = $1 \
    AND EXISTS (SELECT 1 FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL) \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)";

/// The trace contexts kept for a complete parent whose children are gone.
const DELETE_TRACES: &str = "DELETE FROM trace_context WHERE parent_id = $1 \
    AND EXISTS (SELECT 1 FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL) \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)";

/// Deletes a complete parent whose children are gone.
const DELETE_PARENT: &str = "DELETE FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)";

impl Store {
    /// Pauses (or resumes) a queue in the database, so every replica's claims
    /// see it at once; whether that changed anything. A resume wakes the
    /// claims waiting for the queue's pending children.
    pub async fn set_paused(&self, queue: &QueueName, paused: bool) -> StoreResult<bool> {
        let statement = if paused {
            Statement::new(self.sql(&PAUSE_QUEUE))
        } else {
            Statement::new(RESUME_QUEUE)
        };
        let changed = self.db.execute(statement.text(queue.as_str())).await? == 1;
        if changed {
            self.signal_change(Changes::of_pause(queue.clone()));
        }
        if changed && !paused {
            let pending = self
                .queues(Some(queue), &QueueScope::every())
                .await?
                .first()
                .map_or(0, |q| q.children.pending);
            self.signal_work(Work::in_queue(queue.clone(), pending.max(0) as u64));
        }
        Ok(changed)
    }

    /// Deletes a complete parent now (`DELETE /v1/parents/{id}`), as the
    /// pruner does (see `prune`). Whether this call deleted it (a pruner may
    /// have been first).
    pub async fn delete_parent(&self, parent_id: &ParentId) -> StoreResult<bool> {
        match self.parent_complete(parent_id).await? {
            None => Err(StoreError::ParentNotFound(parent_id.clone())),
            Some(false) => Err(StoreError::ParentNotComplete(parent_id.clone())),
            Some(true) => self.prune(parent_id, 0).await,
        }
    }

    /// Complete parents whose completion is older than `age`, oldest first:
    /// the pruner's next batch.
    pub async fn prunable(&self, age: std::time::Duration, limit: i64) -> StoreResult<Vec<ParentId>> {
        let rows = self
            .scan(Statement::new(self.sql(&PRUNABLE)).float(age.as_secs_f64()).int(limit))
            .await?;
        Ok(rows
            .iter()
            .map(|row| row.text("parent_id").map(ParentId::from_ledger))
            .collect::<Result<_, _>>()?)
    }

    /// Deletes a complete parent with its children: first the outcome batches
    /// that name its processed children (`DELETE_BATCHES`), then the children
    /// in batches of `PRUNE_BATCH`, each its own transaction, so no lock is held for long
    /// and nothing a claim needs is touched; the parent row last. Two replicas
    /// pruning the same parent delete it once. After each batch it rests
    /// `pace` times as long as the batch took (the background pruner yields
    /// the database to the work it serves; `0` for an operator's delete).
    /// Whether this call deleted the parent.
    pub async fn prune(&self, parent_id: &ParentId, pace: u32) -> StoreResult<bool> {
        self.db
            .execute(Statement::new(DELETE_BATCHES).text(parent_id.as_str()))
            .await?;
        loop {
            let started = std::time::Instant::now();
            let deleted = self
                .db
                .execute(
                    Statement::new(DELETE_CHILDREN)
                        .text(parent_id.as_str())
                        .int(PRUNE_BATCH),
                )
                .await?;
            if deleted < PRUNE_BATCH as u64 {
                break;
            }
            tokio::time::sleep(started.elapsed() * pace).await;
        }
        let mut tx = self.db.begin().await?;
        tx.execute(Statement::new(DELETE_LEASES).text(parent_id.as_str()))
            .await?;
        tx.execute(Statement::new(DELETE_LANE).text(parent_id.as_str())).await?;
        tx.execute(Statement::new(DELETE_TRACES).text(parent_id.as_str()))
            .await?;
        let deleted = tx
            .execute(Statement::new(DELETE_PARENT).text(parent_id.as_str()))
            .await?;
        tx.commit().await?;
        if deleted == 1 {
            self.parents_changed([parent_id]);
        }
        self.child_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(parent_id);
        Ok(deleted == 1)
    }
}
