//! Reconcile on SQLite: the stored projection, its repair, and the drift scan.

use sqlx::{AssertSqlSafe, Row};

use super::{SqliteStore, SqliteTx, now};
use crate::ledger::projection::{CompletionRepair, StoredProjection, Tally};
use crate::ledger::{ParentId, QueueName};
use crate::store::rows::{DriftPage, DriftRow};
use crate::store::{StoreResult, sql};

/// The stored projection (the write transaction already holds SQLite's one
/// write lock). `None` when the parent is missing; the flag says it is decomposed.
pub(in crate::store) async fn lock_projection(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
) -> StoreResult<Option<(StoredProjection, bool)>> {
    let row = sqlx::query(sql::STORED_PROJECTION)
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
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    derived: &Tally,
    completion: CompletionRepair,
) -> StoreResult<()> {
    let completed_at = match completion {
        CompletionRepair::Keep => "completed_at",
        CompletionRepair::Set => now!(),
        CompletionRepair::Clear => "NULL",
    };
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE parent SET total = ?2, processed = ?3, failed = ?4, skipped = ?5, completed_at = {completed_at} \
         WHERE parent_id = ?1"
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

impl SqliteStore {
    /// One page of the reconcile sweep: the parents after `after` whose stored
    /// projection disagrees with their rows.
    pub async fn drift_page(&self, queue: Option<&QueueName>, after: i64, page: i64) -> StoreResult<DriftPage> {
        let rows: Vec<DriftRow> = sqlx::query_as(
            "SELECT p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
                 p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id) AS rows_total, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'processed') \
                     AS rows_processed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'failed') \
                     AS rows_failed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'skipped') \
                     AS rows_skipped \
             FROM parent p WHERE p.position > ?1 AND (?2 IS NULL OR p.queue = ?2) \
             ORDER BY p.position LIMIT ?3",
        )
        .bind(after)
        .bind(queue.map(QueueName::as_str))
        .bind(page)
        .fetch_all(&self.readers)
        .await?;
        Ok(DriftPage::from_rows(rows, page))
    }
}
