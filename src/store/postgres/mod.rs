//! The Postgres ledger: shared by many service replicas. Claims are one
//! statement with `FOR UPDATE SKIP LOCKED`; every terminal transition is a
//! guarded `UPDATE` whose row count decides who won. This file holds the pool,
//! work notifications and planner statistics; the statements live by resource.

pub(super) mod claims;
mod held;
pub(super) mod outcomes;
pub(super) mod parents;
pub(super) mod reconcile;
pub(super) mod reconcile_jobs;
mod rows;
pub(super) mod webhooks;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};

use super::{PoolStats, StoreOptions, StoreResult};
use held::Held;

/// The current minute since the epoch, by the database clock.
const MINUTE: &str = "(floor(extract(epoch FROM now()) / 60))::bigint";

/// The `LISTEN`/`NOTIFY` channel on which replicas wake each other's waiting claims.
const WORK_CHANNEL: &str = "child_ledger_work";

/// A transaction on a held connection: dropped unfinished, its statement ends too.
pub(super) type PgTx = Held;

#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        // Every statement here is written so that one index serves it in
        // order whatever the statistics say (partial indexes named by literal
        // states, rows looked up by both key columns): a generic plan is as
        // good as a custom one, and planning the claim's CTEs per call cost
        // about 5% of a burn-down. Prepared once per connection, planned once.
        let connect: PgConnectOptions = url.parse::<PgConnectOptions>()?.options([
            ("plan_cache_mode", "force_generic_plan".to_owned()),
            (
                "statement_timeout",
                format!("{}ms", options.statement_timeout.as_millis()),
            ),
            (
                "idle_in_transaction_session_timeout",
                format!("{}ms", 2 * options.statement_timeout.as_millis()),
            ),
            (
                "client_connection_check_interval",
                format!("{}ms", held::CLIENT_CHECK.as_millis()),
            ),
        ]);
        let pool = PgPoolOptions::new()
            // One more than requests may use: the work listener holds one
            // connection for the life of the process.
            .max_connections(options.max_connections + 1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(Self { pool })
    }

    /// Applies the migrations on one connection without the statement
    /// timeout: rewriting a big ledger's table may take minutes, on purpose.
    /// (The connection is closed afterwards rather than reset.)
    pub async fn migrate(&self) -> anyhow::Result<()> {
        let mut conn = self.pool.acquire().await?;
        sqlx::query("SET statement_timeout = 0").execute(&mut *conn).await?;
        sqlx::migrate!("./migrations/postgres").run(&mut *conn).await?;
        conn.close_on_drop();
        Ok(())
    }

    pub(super) async fn begin(&self) -> StoreResult<PgTx> {
        Ok(Held::begin(&self.pool, "BEGIN").await?)
    }

    /// A connection for one read that may scan (a page of parents with their
    /// counts, a drift page): its statement ends if the request is dropped.
    pub(super) async fn read(&self) -> StoreResult<Held> {
        Ok(Held::acquire(&self.pool).await?)
    }

    pub async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        vec![PoolStats {
            name: "postgres",
            size: self.pool.size(),
            idle: self.pool.num_idle() as u32,
            max: self.pool.options().get_max_connections(),
        }]
    }

    /// One notification per call, however many children it concerns.
    pub async fn notify_work(&self, payload: &str) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WORK_CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn listen_for_work(&self) -> StoreResult<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(WORK_CHANNEL).await?;
        Ok(listener)
    }

    /// Keeps the planner's picture of `child` fresh after a bulk write, so the
    /// first claims after a big registration use the pending index instead of a
    /// plan chosen for an empty table.
    pub async fn after_bulk_write(&self, rows_written: i64) -> StoreResult<()> {
        if rows_written < STATISTICS_MIN_ROWS {
            return Ok(());
        }
        let estimated: i64 =
            sqlx::query_scalar("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = 'child'")
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0);
        if needs_fresh_statistics(rows_written, estimated) {
            sqlx::query("ANALYZE child").execute(&self.pool).await?;
        }
        Ok(())
    }
}

/// Bulk writes smaller than this never make the statistics stale enough to matter.
const STATISTICS_MIN_ROWS: i64 = 10_000;

/// Whether a bulk write is big enough, relative to the table, that the
/// planner's statistics are stale and should be refreshed before claims run.
fn needs_fresh_statistics(rows_written: i64, rows_estimated: i64) -> bool {
    rows_written >= STATISTICS_MIN_ROWS && rows_written * 10 >= rows_estimated.max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_refresh_only_for_big_relative_writes() {
        assert!(!needs_fresh_statistics(9_999, 0));
        assert!(needs_fresh_statistics(100_000, 0));
        assert!(needs_fresh_statistics(100_000, 1_000_000));
        assert!(!needs_fresh_statistics(100_000, 10_000_000));
    }
}
