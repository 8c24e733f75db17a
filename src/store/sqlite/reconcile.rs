//! Reconcile on SQLite: the stored projection, its repair, and the drift scan.

use std::sync::LazyLock;

use sqlx::AssertSqlSafe;

use super::{SqliteStore, SqliteTx, now};
use crate::access::QueueScope;
use crate::ledger::QueueName;
use crate::store::rows::{DriftPage, DriftRow};
use crate::store::{StoreResult, sql, steps};

steps::projection_steps!(SqliteTx, "", now!());

impl SqliteStore {
    /// One page of the reconcile sweep: the parents after `after` whose stored
    /// projection disagrees with their rows.
    pub async fn drift_page(
        &self,
        queue: Option<&QueueName>,
        within: &QueueScope,
        after: i64,
        page: i64,
    ) -> StoreResult<DriftPage> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
                 p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id) AS rows_total, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'processed') \
                     AS rows_processed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'failed') \
                     AS rows_failed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'skipped') \
                     AS rows_skipped, \
                 {open}, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'in_flight') \
                     AS rows_in_flight, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'held') AS rows_held \
             FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id WHERE p.position > ?1 AND (?2 IS NULL OR p.queue = ?2) AND {within} \
             ORDER BY p.position LIMIT ?3",
                within = sql::within_sqlite("?4"),
                open = sql::open_counts!()
            )
        });
        let mut conn = self.read().await?;
        let rows: Vec<DriftRow> = sqlx::query_as(AssertSqlSafe(SQL.as_str()))
            .bind(after)
            .bind(queue.map(QueueName::as_str))
            .bind(page)
            .bind(within.as_json())
            .fetch_all(&mut *conn)
            .await?;
        conn.finish().await?;
        Ok(DriftPage::from_rows(rows, page))
    }
}

crate::store::queues::queue_reads!(
    SqliteStore,
    super::MINUTE,
    "((julianday('now') - 2440587.5) * 86400.0)",
    sql::within_sqlite
);
