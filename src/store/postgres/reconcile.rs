//! Reconcile on Postgres: the stored projection under its lock, its repair,
//! and the drift scan.

use sqlx::{AssertSqlSafe, Row};

use super::{PgStore, PgTx};
use crate::ledger::projection::{CompletionRepair, StoredProjection, Tally};
use crate::ledger::{ParentId, QueueName};
use crate::store::rows::{DriftPage, DriftRow};
use crate::store::{StoreResult, sql};

/// The stored projection, its parent row locked first: that orders a repair
/// with concurrent outcome writes, which bump the counters after their child
/// rows. `None` when the parent is missing; the flag says it is decomposed.
pub(in crate::store) async fn lock_projection(
    tx: &mut PgTx,
    parent_id: &ParentId,
) -> StoreResult<Option<(StoredProjection, bool)>> {
    let row = sqlx::query(AssertSqlSafe(format!("{} FOR UPDATE", sql::STORED_PROJECTION)))
        .bind(parent_id.as_str())
        .fetch_optional(&mut **tx)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let stored = StoredProjection {
        total: row.try_get("total")?,
        processed: row.try_get("processed")?,
        failed: row.try_get("failed")?,
        skipped: row.try_get("skipped")?,
        completed_at: row.try_get("completed_at")?,
    };
    Ok(Some((stored, row.try_get("decomposed")?)))
}

/// Writes the derived projection over the stored one.
pub(in crate::store) async fn repair(
    tx: &mut PgTx,
    parent_id: &ParentId,
    derived: &Tally,
    completion: CompletionRepair,
) -> StoreResult<()> {
    let completed_at = match completion {
        CompletionRepair::Keep => "completed_at",
        CompletionRepair::Set => "now()",
        CompletionRepair::Clear => "NULL",
    };
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, completed_at = {completed_at} \
         WHERE parent_id = $1"
    )))
    .bind(parent_id.as_str())
    .bind(derived.total)
    .bind(derived.processed)
    .bind(derived.failed)
    .bind(derived.skipped)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl PgStore {
    /// One page of the reconcile sweep: the parents after `after` whose stored
    /// projection disagrees with their rows, read without locks.
    pub async fn drift_page(&self, queue: Option<&QueueName>, after: i64, page: i64) -> StoreResult<DriftPage> {
        let rows: Vec<DriftRow> = sqlx::query_as(
            "SELECT p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
                 p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, \
                 coalesce(t.total, 0) AS rows_total, coalesce(t.processed, 0) AS rows_processed, \
                 coalesce(t.failed, 0) AS rows_failed, coalesce(t.skipped, 0) AS rows_skipped \
             FROM parent p \
             LEFT JOIN LATERAL ( \
                 SELECT count(*) AS total, count(*) FILTER (WHERE state = 'processed') AS processed, \
                     count(*) FILTER (WHERE state = 'failed') AS failed, \
                     count(*) FILTER (WHERE state = 'skipped') AS skipped \
                 FROM child c WHERE c.parent_id = p.parent_id) t ON true \
             WHERE p.position > $1 AND ($2::text IS NULL OR p.queue = $2) \
             ORDER BY p.position LIMIT $3",
        )
        .bind(after)
        .bind(queue.map(QueueName::as_str))
        .bind(page)
        .fetch_all(&self.pool)
        .await?;
        Ok(DriftPage::from_rows(rows, page))
    }
}
