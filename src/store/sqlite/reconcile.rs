//! Reconcile's drift scan on SQLite: each parent's rows counted by
//! correlated subqueries (SQLite has no lateral join).

use std::sync::LazyLock;

use async_trait::async_trait;

use super::SqliteStore;
use crate::ledger::QueueName;
use crate::store::backend::{DriftQuery, Reconcile};
use crate::store::reports::{DriftPage, DriftRow};
use crate::store::{StoreResult, reconcile, sql};

#[async_trait]
impl Reconcile for SqliteStore {
    async fn drift_page(&self, page: DriftQuery<'_>) -> StoreResult<DriftPage> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            let leased = sql::leased("l.floor", "l.parent_id IS NOT NULL");
            format!(
                "SELECT {columns}, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id) AS rows_total, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id \
                      AND (c.state = 'processed' OR {leased})) - {listed} AS rows_processed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'failed') \
                     AS rows_failed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'skipped') \
                     AS rows_skipped, \
                 {listed} AS rows_in_flight, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'held') AS rows_held \
             FROM parent p LEFT JOIN lane l ON l.parent_id = p.parent_id WHERE p.position > ?1 AND (?2 IS NULL OR p.queue = ?2) AND {within} \
             ORDER BY p.position LIMIT ?3",
                within = sql::within_sqlite("?4"),
                columns = reconcile::drift_columns(),
                listed = sql::listed_in_flight(&super::SQLITE, "p.parent_id")
            )
        });
        let mut conn = self.held_read().await?;
        let rows: Vec<DriftRow> = sqlx::query_as(SQL.as_str())
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
