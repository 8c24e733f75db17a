//! The Postgres ledger: shared by many service replicas. Claims are one
//! statement with `FOR UPDATE SKIP LOCKED`; every terminal transition is a
//! guarded `UPDATE` whose row count decides who won. This file holds the pool,
//! the dialect, how statements run, work notifications and planner
//! statistics; the statements whose shape is Postgres' own live by resource.

mod claims;
mod dialect;
mod held;
mod hosts;
pub(super) mod lane_claim;
mod outcomes;
mod parents;
mod pooler;
mod primary;
mod reconcile;
mod rows;
mod webhooks;

use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _, PgConnection, Postgres};
use tracing::Instrument as _;

use super::admission::Binding;
use super::backend::{Connection, Notifications, Row, Transaction};
use super::error::StoreError;
use super::statement::{Dialect, Statement, Value};
use super::{PoolStats, StoreOptions, StoreResult};
use dialect::{MINUTE, POSTGRES, count_reasons, listed};
use held::Held;
use hosts::Hosts;
use pooler::{PgDb, Session};
use primary::Primary;

/// A statement's text and values as sqlx runs them on Postgres.
fn query(sql: &'static str, values: &[Value<'_>]) -> sqlx::query::Query<'static, Postgres, PgArguments> {
    let mut query = sqlx::query(sql);
    for value in values {
        query = match *value {
            Value::Text(v) => query.bind(v),
            Value::Int(v) => query.bind(v),
            Value::Int32(v) => query.bind(v),
            Value::Float(v) => query.bind(v),
            Value::Bool(v) => query.bind(v),
            Value::Time(v) => query.bind(v),
            Value::Uuid(v) => query.bind(v),
        };
    }
    query
}

fn boxed(rows: Vec<PgRow>) -> Vec<Row> {
    rows.into_iter().map(|row| Box::new(row) as Row).collect()
}

/// The `LISTEN`/`NOTIFY` channel on which replicas wake each other's waiting claims.
const WORK_CHANNEL: &str = "child_ledger_work";

/// A transaction on a held connection: dropped unfinished, its statement ends too.
pub(super) type PgTx = Held;

#[derive(Debug, Clone)]
pub(crate) struct PgStore {
    /// Every statement's way to Postgres (see `pooler`): `&self.pool` runs one.
    pool: PgDb,
    /// The host in use, followed when it is lost (`primary`).
    primary: Arc<Primary>,
    /// A direct URL's hosts, for what needs a session: `LISTEN` and migrations.
    direct: Option<Hosts>,
    /// Where limits held claims back lately (`store::admission::Binding`).
    bound: Arc<Binding>,
    /// Parents known to have a tolerance, whose outcomes go straight to the
    /// lane-locked path (`outcomes::Tolerant`).
    tolerant: Arc<outcomes::Tolerant>,
}

impl PgStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        let settings = [
            // Every statement here is written so that one index serves it in
            // order whatever the statistics say (partial indexes named by
            // literal states, rows looked up by both key columns): a generic
            // plan is as good as a custom one, and planning the claim's CTEs
            // per call cost about 5% of a burn-down. Prepared once per
            // connection, planned once. (Through a transaction pooler nothing
            // stays prepared; the functions wrapping the hot statements set it
            // themselves, see `pooler`.)
            ("plan_cache_mode", "force_generic_plan".to_owned()),
            // No JIT: a generic plan's cost is estimated for unknown
            // parameters, often past `jit_above_cost`, and JIT code is not
            // kept with a prepared plan, so every execution compiled its
            // expressions again: 10 ms for a 7 ms read, 250 ms once the
            // estimate also passed the optimizing threshold.
            ("jit", "off".to_owned()),
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
        ];
        let hosts = Hosts::parse(url)?;
        let url = hosts.pick().await?;
        let pooled = options.behind_transaction_pooler;
        let (session, pool_size) = if pooled {
            // `LISTEN` has its own connection, straight to Postgres.
            (Session::transaction_pooled(&settings[1..]), options.max_connections)
        } else {
            // One more than requests may use: the work listener holds one
            // connection for the life of the process.
            (Session::direct(), options.max_connections + 1)
        };
        let connect_options = move |url: &str| -> anyhow::Result<PgConnectOptions> {
            // Statements are spans of their own (`statement::span`); sqlx's log
            // line for each (its text summarised and formatted) was built for
            // every statement whenever trace export was on. Slow ones still warn.
            let parsed = url.parse::<PgConnectOptions>()?.log_statements(log::LevelFilter::Off);
            Ok(if pooled {
                // No startup parameter a pooler may refuse (sqlx's
                // `extra_float_digits` is for text-format floats; every value
                // here travels in binary), no statement kept by name.
                parsed.extra_float_digits(None).statement_cache_capacity(0)
            } else {
                parsed.options(settings.clone())
            })
        };
        let primary = Arc::new(Primary::new(hosts, url.clone()));
        let mut pool_options = PgPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(options.acquire_timeout);
        if primary.follows() {
            let keeper = Arc::clone(&primary);
            pool_options = pool_options.before_acquire(move |_, meta| {
                let keep = keeper.keeps(&meta);
                Box::pin(async move { Ok(keep) })
            });
        }
        let pool = pool_options.connect_with(connect_options(&url)?).await?;
        if primary.follows() {
            let follower = Arc::clone(&primary);
            let watched = pool.clone();
            tokio::spawn(async move { follower.follow(watched, connect_options).await });
        }
        let direct = options.direct_url.as_deref().map(Hosts::parse).transpose()?;
        if let Some(direct) = &direct {
            direct.pick().await?;
        }
        Ok(Self {
            pool: PgDb {
                pool,
                session: Arc::new(session),
                wrapped: Arc::default(),
                primary: Arc::clone(&primary),
            },
            primary,
            direct,
            bound: Arc::default(),
            tolerant: Arc::default(),
        })
    }

    /// Applies the migrations on one connection without the statement
    /// timeout: rewriting a big ledger's table may take minutes, on purpose.
    /// (The connection is closed afterwards rather than reset.) sqlx holds a
    /// session-level advisory lock while it migrates, so through a
    /// transaction pooler migrations run over the direct URL; without one,
    /// the schema must already be current.
    async fn run_migrations(&self) -> anyhow::Result<()> {
        let migrator = sqlx::migrate!("./migrations/postgres");
        if !self.pool.session.transaction_pooled {
            let mut conn = self.pool.pool.acquire().await?;
            sqlx::query("SET statement_timeout = 0").execute(&mut *conn).await?;
            migrator.run(&mut *conn).await?;
            conn.close_on_drop();
            return Ok(());
        }
        if let Some(direct) = &self.direct {
            let url = direct.pick().await?;
            let mut conn = PgConnection::connect(&url)
                .await
                .context("connecting to --listen-database-url (LEDGER_LISTEN_DATABASE_URL) to apply migrations")?;
            sqlx::query("SET statement_timeout = 0").execute(&mut conn).await?;
            migrator.run(&mut conn).await?;
            conn.close().await?;
            return self.wrap_hot_statements().await;
        }
        let latest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        let applied: Option<i64> = sqlx::query_scalar(
            "SELECT max(version) FROM _sqlx_migrations WHERE success AND to_regclass('_sqlx_migrations') IS NOT NULL",
        )
        .fetch_one(&self.pool)
        .await
        .or_else(|err| match &err {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("42P01") => Ok(None),
            _ => Err(err),
        })?;
        anyhow::ensure!(
            applied.unwrap_or(0) >= latest,
            "the schema is not current (migration {} applied, {latest} needed), and migrations need a session \
             of their own, which a transaction pooler does not give: pass --listen-database-url \
             (LEDGER_LISTEN_DATABASE_URL) with a URL straight to Postgres, or run \
             `child-ledger migrate --database-url <a URL straight to Postgres>` first",
            applied.unwrap_or(0)
        );
        self.wrap_hot_statements().await
    }

    /// Through a transaction pooler, the claim and outcome statements run
    /// as calls of functions whose plans each server connection keeps (see
    /// `PgDb::wrap_hot_statements`); once the schema they read is current.
    async fn wrap_hot_statements(&self) -> anyhow::Result<()> {
        self.pool
            .wrap_hot_statements(&[
                lane_claim::LANE_CLAIM,
                lane_claim::QUEUE_LANES[0],
                lane_claim::QUEUE_LANES[1],
                lane_claim::QUEUE_LANES[2],
                lane_claim::QUEUE_LANES[3],
                outcomes::APPLY_OUTCOMES.as_str(),
            ])
            .await
            .context("preparing the claim and outcome statements for the transaction pooler")
    }

    /// A transaction on a held connection.
    pub(super) async fn held_tx(&self) -> StoreResult<PgTx> {
        Ok(self.pool.begin().await?)
    }

    /// A connection for one read that may scan (a page of parents with their
    /// counts, a drift page): its statement ends if the request is dropped.
    pub(super) async fn held_read(&self) -> StoreResult<Held> {
        Ok(self.pool.read().await?)
    }
}

#[async_trait]
impl Connection for PgStore {
    fn dialect(&self) -> &'static Dialect {
        &POSTGRES
    }

    fn migrate(&self) -> futures::future::LocalBoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.run_migrations())
    }

    /// The host in use, once it answers as writable; while the primary is
    /// being searched for, why not.
    async fn ping(&self) -> StoreResult<Option<String>> {
        if let Some(why) = self.primary.problem() {
            return Err(StoreError::NotReady(why));
        }
        let row = sqlx::raw_sql(hosts::WRITABLE).fetch_one(&self.pool).await?;
        let host = self.primary.host();
        if !sqlx::Row::try_get::<bool, _>(&row, 0)? {
            return Err(StoreError::NotReady(format!(
                "{host} is read-only (a standby, or a primary demoted by a failover){}",
                if self.primary.follows() {
                    "; searching the database URL's hosts for the primary"
                } else {
                    ""
                }
            )));
        }
        Ok(Some(host))
    }

    fn pool_stats(&self) -> Vec<PoolStats> {
        let pool = &self.pool.pool;
        vec![PoolStats {
            name: "postgres",
            size: pool.size(),
            idle: pool.num_idle() as u32,
            max: pool.options().get_max_connections(),
        }]
    }

    async fn begin(&self) -> StoreResult<Box<dyn Transaction>> {
        Ok(Box::new(self.held_tx().await?))
    }

    async fn fetch(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let rows = query(self.pool.sql(statement.sql), &statement.values)
                .fetch_all(&self.pool)
                .await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn scan(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let mut conn = self.held_read().await?;
            let rows = query(self.pool.sql(statement.sql), &statement.values)
                .fetch_all(&mut *conn)
                .await?;
            conn.finish().await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn write(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move { self.fetch(statement).await };
        run.instrument(span).await
    }

    async fn execute(&self, statement: Statement<'_>) -> StoreResult<u64> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let done = query(self.pool.sql(statement.sql), &statement.values)
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected())
        };
        run.instrument(span).await
    }

    /// One notification per call, however many children it concerns.
    async fn notify(&self, payload: &str) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(WORK_CHANNEL)
            .bind(payload)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Other replicas' work notifications; `None` through a transaction
    /// pooler without a direct URL, where `LISTEN` would never hear anything.
    async fn listen(&self) -> StoreResult<Option<Box<dyn Notifications>>> {
        let renewed = self.primary.renewed();
        let mut listener = match (&self.direct, self.pool.session.transaction_pooled) {
            (_, false) => PgListener::connect_with(&self.pool.pool).await?,
            (Some(direct), true) => {
                let url = direct
                    .pick()
                    .await
                    .map_err(|err| StoreError::NotReady(format!("{err:#}")))?;
                PgListener::connect(&url).await?
            }
            (None, true) => return Ok(None),
        };
        listener.listen(WORK_CHANNEL).await?;
        Ok(Some(Box::new(WorkChannel { listener, renewed })))
    }

    /// Keeps the planner's picture of `child` fresh after a bulk write, so the
    /// first claims after a big registration use the pending index instead of a
    /// plan chosen for an empty table.
    async fn after_bulk_write(&self, rows_written: i64) -> StoreResult<()> {
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

    /// Analyzes each hot table whose rows changed by a tenth (and at least
    /// `STALE_AFTER_CHANGES`) since its last analysis, whoever made it: a
    /// fresh or restored database, or one whose autovacuum is off or lagging,
    /// plans its claims and outcomes for the tables as they are, not as they
    /// were when empty (a generic plan made then walks every child of a
    /// parent for each outcome). `SKIP_LOCKED`: a table another replica or
    /// autovacuum is analyzing is left to it.
    async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        let stale: Vec<String> = sqlx::query_scalar(STALE_TABLES)
            .bind(&HOT_TABLES[..])
            .bind(STALE_AFTER_CHANGES)
            .fetch_all(&self.pool)
            .await?;
        for table in &stale {
            // Only names of `HOT_TABLES`, as the catalog spells them.
            if HOT_TABLES.contains(&table.as_str()) {
                // A table skipped as locked is not worth a warning in the log.
                let mut tx = self.held_tx().await?;
                sqlx::query("SET LOCAL client_min_messages = error")
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(AssertSqlSafe(format!("ANALYZE (SKIP_LOCKED) {table}")))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }
        }
        Ok(stale)
    }
}

/// The tables every claim and outcome plans against.
const HOT_TABLES: [&str; 7] = [
    "child",
    "parent",
    "lane",
    "claim_lease",
    "processed_batch",
    "child_reason",
    "webhook_event",
];

/// Changes since the last analysis below which a table is never stale.
const STALE_AFTER_CHANGES: i64 = 500;

/// The hot tables (`$1`) in the ledger's schema whose rows changed by at
/// least `$2` and a tenth of the table since they were last analyzed.
const STALE_TABLES: &str = "SELECT c.relname::text FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid \
    WHERE c.oid = ANY (SELECT to_regclass(t) FROM unnest($1::text[]) t) \
      AND s.n_mod_since_analyze >= $2 + 0.1 * greatest(c.reltuples, 0)";

/// The work channel, as `LISTEN` hears it, until the pool's connections are
/// renewed (on another host after a failover, or the same one back): then
/// it ends, and is listened to again.
struct WorkChannel {
    listener: PgListener,
    renewed: tokio::sync::watch::Receiver<u64>,
}

#[async_trait]
impl Notifications for WorkChannel {
    async fn recv(&mut self) -> StoreResult<String> {
        tokio::select! {
            heard = self.listener.recv() => Ok(heard?.payload().to_owned()),
            _ = self.renewed.changed() => Err(StoreError::NotReady("the database connections were renewed".to_owned())),
        }
    }
}

#[async_trait]
impl Transaction for Held {
    fn dialect(&self) -> &'static Dialect {
        &POSTGRES
    }

    async fn fetch(&mut self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let rows = query(statement.sql, &statement.values).fetch_all(&mut **self).await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn execute(&mut self, statement: Statement<'_>) -> StoreResult<u64> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let done = query(statement.sql, &statement.values).execute(&mut **self).await?;
            Ok(done.rows_affected())
        };
        run.instrument(span).await
    }

    async fn commit(self: Box<Self>) -> StoreResult<()> {
        Ok(Held::commit(*self).await?)
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
