//! Reconcile's drift scan on Postgres: each parent's rows counted once, by a
//! lateral join.

use std::sync::LazyLock;

use async_trait::async_trait;

use super::PgStore;
use crate::ledger::QueueName;
use crate::store::backend::{DriftQuery, Reconcile};
use crate::store::reports::{DriftPage, DriftRow};
use crate::store::{StoreResult, reconcile, sql};

static DRIFT_PAGE: LazyLock<String> = LazyLock::new(|| {
    let leased = sql::leased("l.floor", "l.parent_id IS NOT NULL");
    format!(
        "SELECT {columns}, \
             coalesce(t.total, 0) AS rows_total, coalesce(t.processed, 0) AS rows_processed, \
             coalesce(t.failed, 0) AS rows_failed, coalesce(t.skipped, 0) AS rows_skipped, \
             coalesce(t.in_flight, 0) AS rows_in_flight, coalesce(t.held, 0) AS rows_held \
         FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id \
         LEFT JOIN LATERAL ( \
             SELECT count(*) AS total, \
                 count(*) FILTER (WHERE state = 'processed') + count(*) FILTER (WHERE {leased}) - f.n AS processed, \
                 count(*) FILTER (WHERE state = 'failed') AS failed, \
                 count(*) FILTER (WHERE state = 'skipped') AS skipped, \
                 f.n AS in_flight, count(*) FILTER (WHERE state = 'held') AS held \
             FROM child c, (SELECT {listed} AS n) f WHERE c.parent_id = p.parent_id GROUP BY f.n) t ON true \
         WHERE p.position > $1 AND ($2::text IS NULL OR p.queue = $2) AND {within} \
         ORDER BY p.position LIMIT $3",
        columns = reconcile::drift_columns(),
        within = sql::within_postgres("$4"),
        listed = sql::listed_in_flight(&super::POSTGRES, "p.parent_id")
    )
});

#[async_trait]
impl Reconcile for PgStore {
    async fn drift_page(&self, page: DriftQuery<'_>) -> StoreResult<DriftPage> {
        let mut conn = self.held_read().await?;
        let rows: Vec<DriftRow> = sqlx::query_as(DRIFT_PAGE.as_str())
            .bind(page.after)
            .bind(page.queue.map(QueueName::as_str))
            .bind(page.limit)
            .bind(page.within.as_json())
            .fetch_all(&mut *conn)
            .await?;
        conn.finish().await?;
        Ok(DriftPage::from_rows(rows, page.limit))
    }
}
