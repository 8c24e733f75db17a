//! Cancel, pause and retention: the SQL both dialects write the same, and
//! the steps stamped into each backend for its own transaction and clock.

/// A cancel's parent row: `$2` children skipped, of which `$3` were in
/// flight and `$4` held (counted as outcomes count them), sealed at what it
/// holds and complete. Returns whether this statement completed it. `now` is
/// the dialect's clock.
pub(crate) fn cancel_parent(now: &str) -> String {
    format!(
        "UPDATE parent SET skipped = skipped + $2, settled_in_flight = settled_in_flight + $3, \
             settled_held = settled_held + $4, \
             last_progress_at = CASE WHEN $2 > 0 THEN {now} ELSE last_progress_at END, \
             decomposed_at = coalesce(decomposed_at, {now}), completed_at = coalesce(completed_at, {now}) \
         WHERE parent_id = $1"
    )
}

/// A cancelled parent's lane: nothing left to claim.
pub(crate) const CLOSE_LANE: &str = "UPDATE lane SET floor = NULL, ready_at = NULL WHERE parent_id = $1";

/// Whether a parent is complete; no row when it is missing.
pub(crate) const PARENT_COMPLETE: &str = "SELECT completed_at IS NOT NULL FROM parent WHERE parent_id = $1";

/// Deletes up to `$2` children of parent `$1` (the pruner's batch), by key.
pub(crate) const DELETE_CHILDREN: &str = "DELETE FROM child WHERE parent_id = $1 AND sequence IN ( \
    SELECT sequence FROM child WHERE parent_id = $1 ORDER BY sequence LIMIT $2)";

/// What goes with a complete parent whose children are gone, before its row
/// (`DELETE_PARENT`): its lane.
pub(crate) const DELETE_WITH_PARENT: [&str; 1] = ["DELETE FROM lane WHERE parent_id = $1 \
    AND EXISTS (SELECT 1 FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL) \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)"];

/// Deletes a complete parent whose children are gone.
pub(crate) const DELETE_PARENT: &str = "DELETE FROM parent WHERE parent_id = $1 AND completed_at IS NOT NULL \
    AND NOT EXISTS (SELECT 1 FROM child WHERE parent_id = $1)";

/// Complete parents whose completion is older than `$1` seconds, oldest
/// first, `$2` at most (the pruner's next batch); `ago` is the dialect's
/// "now minus `$1` seconds".
pub(crate) fn prunable(ago: &str) -> String {
    format!(
        "SELECT parent_id FROM parent WHERE completed_at IS NOT NULL AND completed_at < {ago} \
         ORDER BY completed_at LIMIT $2"
    )
}

/// Pauses queue `$1`; `now` is the dialect's clock.
pub(crate) fn pause_queue(now: &str) -> String {
    format!("INSERT INTO queue_pause (queue, paused_at) VALUES ($1, {now}) ON CONFLICT (queue) DO NOTHING")
}

pub(crate) const RESUME_QUEUE: &str = "DELETE FROM queue_pause WHERE queue = $1";

/// The parent and lane half of a cancel, in transaction `$tx` with the
/// dialect's clock `$now` (see `sql::cancel_parent`).
macro_rules! cancel_steps {
    ($tx:ty, $now:expr) => {
        /// Counts a cancel's skipped children on its parent, seals and completes
        /// it, and closes its lane.
        pub(in crate::store) async fn close_cancelled(
            tx: &mut $tx,
            parent_id: &$crate::ledger::ParentId,
            (skipped, from_in_flight, from_held): (i64, i64, i64),
        ) -> $crate::store::StoreResult<()> {
            static SQL: std::sync::LazyLock<String> =
                std::sync::LazyLock::new(|| $crate::store::lifecycle::cancel_parent($now));
            sqlx::query(sqlx::AssertSqlSafe(SQL.as_str()))
                .bind(parent_id.as_str())
                .bind(skipped)
                .bind(from_in_flight)
                .bind(from_held)
                .execute(&mut **tx)
                .await?;
            sqlx::query($crate::store::lifecycle::CLOSE_LANE)
                .bind(parent_id.as_str())
                .execute(&mut **tx)
                .await?;
            Ok(())
        }
    };
}
pub(in crate::store) use cancel_steps;

/// Pausing queues and deleting complete parents, as `impl` methods of a
/// backend store with the dialect's clock `$now` and its "`$1` seconds ago" `$ago`.
macro_rules! lifecycle_steps {
    ($store:ty, $now:expr, $ago:expr) => {
        impl $store {
            /// Pauses or resumes a queue; whether that changed anything.
            pub async fn set_paused(
                &self,
                queue: &$crate::ledger::QueueName,
                paused: bool,
            ) -> $crate::store::StoreResult<bool> {
                static PAUSE: std::sync::LazyLock<String> =
                    std::sync::LazyLock::new(|| $crate::store::lifecycle::pause_queue($now));
                let sql = if paused {
                    PAUSE.as_str()
                } else {
                    $crate::store::lifecycle::RESUME_QUEUE
                };
                let mut tx = self.begin().await?;
                let changed = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(queue.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(changed == 1)
            }

            /// Complete parents whose completion is older than `age`, oldest first.
            pub async fn prunable(
                &self,
                age: std::time::Duration,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<String>> {
                static SQL: std::sync::LazyLock<String> =
                    std::sync::LazyLock::new(|| $crate::store::lifecycle::prunable($ago));
                let mut conn = self.read().await?;
                let ids = sqlx::query_scalar(sqlx::AssertSqlSafe(SQL.as_str()))
                    .bind(age.as_secs_f64())
                    .bind(limit)
                    .fetch_all(&mut *conn)
                    .await?;
                conn.finish().await?;
                Ok(ids)
            }

            /// Deletes up to `batch` children of a parent, in a transaction of its own.
            pub async fn delete_children(
                &self,
                parent_id: &$crate::ledger::ParentId,
                batch: i64,
            ) -> $crate::store::StoreResult<u64> {
                let mut tx = self.begin().await?;
                let deleted = sqlx::query($crate::store::lifecycle::DELETE_CHILDREN)
                    .bind(parent_id.as_str())
                    .bind(batch)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(deleted)
            }

            /// Deletes a complete parent whose children are gone, with its
            /// lane; whether it did.
            pub async fn delete_parent_row(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<bool> {
                let mut tx = self.begin().await?;
                for sql in $crate::store::lifecycle::DELETE_WITH_PARENT {
                    sqlx::query(sql)
                        .bind(parent_id.as_str())
                        .execute(&mut *tx)
                        .await?;
                }
                let deleted = sqlx::query($crate::store::lifecycle::DELETE_PARENT)
                    .bind(parent_id.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                tx.commit().await?;
                Ok(deleted == 1)
            }

            /// Whether a parent is complete, `None` when it is missing.
            pub async fn parent_complete(
                &self,
                parent_id: &$crate::ledger::ParentId,
            ) -> $crate::store::StoreResult<Option<bool>> {
                Ok(sqlx::query_scalar($crate::store::lifecycle::PARENT_COMPLETE)
                    .bind(parent_id.as_str())
                    .fetch_optional(&mut *self.read().await?)
                    .await?)
            }
        }
    };
}
pub(in crate::store) use lifecycle_steps;
