//! The ledger's storage: Postgres for shared production ledgers, SQLite as the
//! embedded default, chosen once from the database URL.
//!
//! `Store` is the one face of both. What a backend provides is one page,
//! `backend.rs`; `Store` holds one as `dyn Backend` and sequences every
//! transaction over it, once, in a file per resource (`parents.rs`,
//! `claims.rs`, ...) that also holds the statements both dialects write alike.
//! The store raises what the rest of the service reacts to (work for waiting
//! claims, completed parents: `signals.rs`), so every caller gets it. It
//! answers in its own types and `StoreError`, and never speaks HTTP.

mod admission;
mod backend;
mod children;
mod claims;
mod combine;
mod error;
mod events;
mod lifecycle;
mod outcomes;
mod parents;
mod postgres;
mod queues;
mod reconcile;
mod reconcile_jobs;
mod redrive;
mod registration;
mod reports;
mod results;
mod rows;
mod search;
mod signals;
mod sql;
mod sqlite;
mod statement;
mod traces;
mod webhooks;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use backend::{Backend, Row, Transaction};
use reports::{LaneAsk, LaneClaim, LaneTurn};
use statement::{Dialect, Sql, SqlSet, Statement};

use crate::ledger::{OutcomeWrite, ParentId, QueueName};

pub use children::{ChildPage, ChildPageQuery};
pub use claims::Claimed;
#[cfg(test)]
pub(crate) use error::lost_database_errors;
pub use error::{StoreError, StoreResult, permanent_connect_error};
pub use parents::{ParentFilter, ParentHas, ParentPage};
/// The Postgres claim statements, exactly as claims run them, for an operator
/// (or a test) to `EXPLAIN`. The lane claim binds `$1` parent id, `$2` how
/// many in all, one array element per child (`$3` claim ids, `$4` workers,
/// `$5` lease seconds), `$6` the lane's floor, `$7` whether given-back
/// children are due and `$8` the lane's queue; the queue's lanes bind `$1`
/// queue, `$2` how many.
pub use postgres::lane_claim::{LANE_CLAIM as POSTGRES_LANE_CLAIM, QUEUE_LANES as POSTGRES_QUEUE_LANES};
pub use reconcile::SweepQuery;
pub use reconcile_jobs::{JobLease, JobStep};
pub use redrive::Redriven;
pub use search::{ChildFilter, ChildSearch, SearchKey};
pub use signals::{Heard, WorkListener};
pub use sqlite::prepare_sqlite_memory;
pub use webhooks::{AttemptOutcome, Delivery, DeliveryAttempt, DeliveryState, DueEvent};

/// How many children one bulk statement writes or compares: a 100,000-child
/// registration is a few statements in one transaction, so neither the bound
/// arguments nor SQLite's JSON parse of them ever holds the whole request twice.
pub(crate) const WRITE_CHUNK: usize = 10_000;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long a request waits for a connection before answering 503.
    pub acquire_timeout: Duration,
    /// Longest any one statement may run (Postgres `statement_timeout`); a
    /// transaction left idle is ended after twice that
    /// (`idle_in_transaction_session_timeout`).
    pub statement_timeout: Duration,
    /// Postgres is reached through a pooler in transaction mode (PgBouncer
    /// `pool_mode = transaction`): no named prepared statements, no session
    /// settings, every statement in a transaction of its own.
    pub behind_transaction_pooler: bool,
    /// A direct Postgres URL (bypassing the pooler) for `LISTEN` and migrations.
    pub direct_url: Option<String>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            // Under 5 s: with the database down, a request is answered 503 within 5 s.
            acquire_timeout: Duration::from_secs(3),
            statement_timeout: Duration::from_secs(30),
            behind_transaction_pooler: false,
            direct_url: None,
        }
    }
}

/// The claims that share a lane claim statement: of one parent, taking their
/// turn the same way, expecting the lane in the same queue.
type LaneKey = (ParentId, LaneTurn, Option<QueueName>);

/// The ledger's store: one backend, chosen once from the URL.
#[derive(Clone)]
pub struct Store {
    db: Arc<dyn Backend>,
    backend: &'static str,
    /// What the store tells the rest of the service, and its counters.
    signals: Arc<signals::Signals>,
    /// Lane claims waiting for their parent's next statement.
    lane_claims: Arc<combine::Combiner<LaneKey, LaneAsk, LaneClaim>>,
    /// Outcome batches of one parent waiting for its next statement.
    outcome_batches: Arc<combine::Combiner<ParentId, Arc<[OutcomeWrite]>, reports::Applied>>,
    /// Decomposed parents' largest payloads, which no longer change (see
    /// `claims::child_bytes`).
    child_bytes: Arc<std::sync::Mutex<std::collections::HashMap<ParentId, Option<i64>>>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// One connection pool's occupancy, for the metrics gauges.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub name: &'static str,
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

/// A child named in a release.
#[derive(Debug, Clone)]
pub struct ChildRef {
    pub parent_id: ParentId,
    pub sequence: i64,
}

/// The Postgres server for the store's own unit tests (`LEDGER_TEST_DATABASE_URL`,
/// or the local default); `None` when it does not answer and is not required
/// (`LEDGER_REQUIRE_POSTGRES=1` or `CI=true` make that a failure).
#[cfg(test)]
pub(crate) async fn test_postgres_url() -> Option<String> {
    use sqlx::Connection;
    let url = std::env::var("LEDGER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
    let required = std::env::var("LEDGER_REQUIRE_POSTGRES").is_ok_and(|v| v == "1" || v == "true")
        || std::env::var("CI").is_ok_and(|v| v == "true");
    match sqlx::PgConnection::connect(&url).await {
        Ok(_) => Some(url),
        Err(err) if !required => {
            eprintln!("Postgres not reachable ({err}): a Postgres unit test is skipped");
            None
        }
        Err(err) => panic!("Postgres is required but {url} does not answer: {err}"),
    }
}

/// The backend a database URL names: `postgres` or `sqlite`.
pub fn backend_of(url: &str) -> Option<&'static str> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Some("postgres")
    } else if url.starts_with("sqlite:") {
        Some("sqlite")
    } else {
        None
    }
}

impl Store {
    /// Connects to `postgres://…` or `sqlite://…` (the SQLite file is created if missing).
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Self::connect_with(url, &StoreOptions::default()).await
    }

    pub async fn connect_with(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        let (db, backend): (Arc<dyn Backend>, _) = match backend_of(url) {
            Some("postgres") => (
                Arc::new(
                    postgres::PgStore::connect(url, options)
                        .await
                        .context("connecting to Postgres")?,
                ),
                "postgres",
            ),
            Some(_) => (
                Arc::new(
                    sqlite::SqliteStore::connect(url, options)
                        .await
                        .context("opening SQLite")?,
                ),
                "sqlite",
            ),
            None => anyhow::bail!("unsupported database URL scheme: use postgres://… or sqlite://…"),
        };
        Ok(Self {
            db,
            backend,
            signals: Arc::default(),
            lane_claims: Arc::new(combine::Combiner::new(1)),
            outcome_batches: Arc::new(combine::Combiner::new(2)),
            child_bytes: Arc::default(),
        })
    }

    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// Applies this backend's embedded migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        self.db.migrate().await
    }

    /// Whether the database answers and can hold the ledger: the Postgres
    /// host in use, if any.
    pub async fn ping(&self) -> StoreResult<Option<String>> {
        self.db.ping().await
    }

    /// Each pool's size, idle connections and maximum.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.db.pool_stats()
    }

    /// Analyzes the hot tables whose statistics went stale (see
    /// `Connection::refresh_statistics`); their names.
    pub async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        self.db.refresh_statistics().await
    }

    /// The text of a shared statement in this store's dialect.
    fn sql(&self, sql: &'static Sql) -> &'static str {
        sql.of(self.dialect())
    }

    /// The text of statement `i` of a family of shared statements.
    fn sql_of<const N: usize>(&self, set: &'static SqlSet<N>, i: usize) -> &'static str {
        set.of(self.dialect(), i)
    }

    fn dialect(&self) -> &'static Dialect {
        self.db.dialect()
    }

    /// The rows of a read that may scan (see `Connection::scan`).
    async fn scan(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        self.db.scan(statement).await
    }

    /// The first row of a short read, if any.
    async fn fetch_optional(&self, statement: Statement<'_>) -> StoreResult<Option<Row>> {
        Ok(self.db.fetch(statement).await?.into_iter().next())
    }

    /// Commits a transaction in which `completed` parents completed, and
    /// tells of them: their completion events (the webhook outbox) are
    /// written in it first, so a completion and its event commit together.
    async fn commit_completing(&self, mut tx: Box<dyn Transaction>, completed: &[ParentId]) -> StoreResult<()> {
        if !completed.is_empty() {
            tx.enqueue_completed(completed).await?;
        }
        tx.commit().await?;
        self.completed(completed);
        Ok(())
    }
}
