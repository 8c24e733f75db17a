//! Reconcile on Postgres: the stored projection under its lock, its repair,
//! and the drift scan.

use std::sync::LazyLock;

use sqlx::AssertSqlSafe;

use super::{PgStore, PgTx};
use crate::access::QueueScope;
use crate::ledger::QueueName;
use crate::store::rows::{DriftPage, DriftRow};
use crate::store::{StoreResult, sql, steps};

steps::projection_steps!(PgTx, " FOR UPDATE", "now()");

impl PgStore {
    /// One page of the reconcile sweep: the parents after `after` whose stored
    /// projection disagrees with their rows, read without locks.
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
                 coalesce(t.total, 0) AS rows_total, coalesce(t.processed, 0) AS rows_processed, \
                 coalesce(t.failed, 0) AS rows_failed, coalesce(t.skipped, 0) AS rows_skipped, \
                 {open}, coalesce(t.in_flight, 0) AS rows_in_flight, coalesce(t.held, 0) AS rows_held \
             FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id \
             LEFT JOIN LATERAL ( \
                 SELECT count(*) AS total, count(*) FILTER (WHERE state = 'processed') AS processed, \
                     count(*) FILTER (WHERE state = 'failed') AS failed, \
                     count(*) FILTER (WHERE state = 'skipped') AS skipped, \
                     count(*) FILTER (WHERE state = 'in_flight') AS in_flight, \
                     count(*) FILTER (WHERE state = 'held') AS held \
                 FROM child c WHERE c.parent_id = p.parent_id) t ON true \
             WHERE p.position > $1 AND ($2::text IS NULL OR p.queue = $2) AND {within} \
             ORDER BY p.position LIMIT $3",
                within = sql::within_postgres("$4"),
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
    PgStore,
    super::MINUTE,
    "CAST(extract(epoch FROM now()) AS float8)",
    sql::within_postgres
);
