//! The ledger's storage: Postgres for shared production ledgers, SQLite as the
//! embedded default, chosen once from the database URL.
//!
//! `Store` is the one face of both. Each resource has a file here holding what
//! both backends share (the claim's lane order, the seal and reconcile decisions, how a
//! batch's losers are told why, the completion hook) and a file per backend
//! under `postgres/` and `sqlite/` holding its statements. SQL that both
//! dialects write the same, and the rules SQL must mirror, are in `sql.rs`.
//! The store answers in its own types and `StoreError`; it never speaks HTTP.

mod claims;
mod combine;
mod error;
mod lifecycle;
mod outcomes;
mod parents;
mod postgres;
mod queues;
mod reconcile;
mod reconcile_jobs;
mod rows;
mod sql;
mod sqlite;
mod steps;
mod webhooks;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::ledger::{Child, OutcomeWrite, ParentId, QueueName};

pub use claims::Claimed;
#[cfg(test)]
pub(crate) use error::lost_database_errors;
pub(crate) use error::retry_transient;
pub use error::{StoreError, StoreResult, permanent_connect_error};
use postgres::PgStore;
/// The Postgres claim statements, exactly as claims run them, for an operator
/// (or a test) to `EXPLAIN`. The lane claim binds `$1` parent id, `$2` limit,
/// `$3` claim id, `$4` worker, `$5` lease seconds; the queue's lanes bind `$1`
/// queue, `$2` how many.
pub use postgres::claims::{LANE_CLAIM as POSTGRES_LANE_CLAIM, QUEUE_LANES as POSTGRES_QUEUE_LANES};
pub use reconcile_jobs::{JobLease, JobStep};
use sqlite::SqliteStore;
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

/// The ledger's store: one backend, chosen once from the URL.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    /// Lane claims waiting for their parent's next statement.
    lane_claims: Arc<combine::Combiner<(ParentId, rows::LaneTurn), rows::LaneAsk, rows::LaneClaim>>,
    /// Outcome batches of one parent waiting for its next statement.
    outcome_batches: Arc<combine::Combiner<ParentId, Arc<[OutcomeWrite]>, rows::Applied>>,
    /// Children whose expired lease this process swept, for the metrics.
    expired_total: Arc<AtomicU64>,
    /// Parents this process completed, for the metrics.
    completed_total: Arc<AtomicU64>,
    /// Wakes the webhook sender when this process completed a parent.
    webhook_wake: Arc<tokio::sync::Notify>,
    /// Decomposed parents' largest payloads, which no longer change (see
    /// `claims::child_bytes`).
    child_bytes: Arc<std::sync::Mutex<std::collections::HashMap<ParentId, Option<i64>>>>,
}

/// One connection pool's occupancy, for the metrics gauges.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub name: &'static str,
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

#[derive(Debug, Clone)]
enum Db {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

/// A write transaction on either backend, for the steps `Store` sequences itself.
enum Tx {
    Postgres(postgres::PgTx),
    Sqlite(sqlite::SqliteTx),
}

impl Tx {
    async fn commit(self) -> StoreResult<()> {
        match self {
            Self::Postgres(tx) => tx.commit().await?,
            Self::Sqlite(tx) => tx.commit().await?,
        }
        Ok(())
    }
}

/// Calls the same method on whichever backend this store has.
macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match &$self.db {
            Db::Postgres($store) => $call,
            Db::Sqlite($store) => $call,
        }
    };
}
use dispatch;

/// Runs one step of a transaction: `in_tx!(tx, parents::tally(&parent_id))`
/// calls `postgres::parents::tally` or `sqlite::parents::tally` on it.
macro_rules! in_tx {
    ($tx:expr, $module:ident :: $step:ident ( $($arg:expr),* $(,)? )) => {
        match $tx {
            Tx::Postgres(tx) => $crate::store::postgres::$module::$step(tx, $($arg),*).await,
            Tx::Sqlite(tx) => $crate::store::sqlite::$module::$step(tx, $($arg),*).await,
        }
    };
}
use in_tx;

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

/// Filters of the parent list.
#[derive(Debug, Clone, Default)]
pub struct ParentFilter {
    pub queue: Option<QueueName>,
    pub state: Option<crate::ledger::ParentState>,
    /// Only active parents with a child claimable now.
    pub resumable: bool,
    /// Only parents of these queues (a token's reach).
    pub within: crate::access::QueueScope,
    /// List parents after this position (exclusive), in the list's order.
    pub after_position: Option<i64>,
    pub limit: i64,
    /// Only parents with a failed child, a held child or a logged conflict.
    pub has: Option<ParentHas>,
    /// Newest first instead of oldest first.
    pub newest: bool,
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// Filters of the cross-parent children search (`GET /v1/children`).
#[derive(Debug, Clone, Default)]
pub struct ChildFilter {
    pub queue: Option<QueueName>,
    pub state: Option<crate::ledger::ChildState>,
    pub parent_id: Option<ParentId>,
    /// Only children of these queues (a token's reach).
    pub within: crate::access::QueueScope,
    /// Children after this one in the search's order (newest change first):
    /// its `changed_at`, parent and sequence.
    pub after: Option<(chrono::DateTime<chrono::Utc>, ParentId, i64)>,
    pub limit: i64,
}

/// A page of the children search; `next` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ChildSearch {
    pub children: Vec<Child>,
    pub next: Option<(chrono::DateTime<chrono::Utc>, ParentId, i64)>,
}

/// What a listed parent must have (`GET /v1/parents?has=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParentHas {
    /// A failed child.
    Failed,
    /// A held child (outcome unknown, waiting for a retry or an outcome).
    Held,
    /// A child with a logged conflict (a losing outcome write).
    Conflicts,
}

impl ParentHas {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Held => "held",
            Self::Conflicts => "conflicts",
        }
    }
}

/// One page of parents; `next_position` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ParentPage {
    pub parents: Vec<crate::ledger::Parent>,
    pub next_position: Option<i64>,
}

/// One page of a parent's children; `next_after` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ChildPage {
    pub children: Vec<Child>,
    pub next_after: Option<i64>,
}

/// A child named in a release.
#[derive(Debug, Clone)]
pub struct ChildRef {
    pub parent_id: ParentId,
    pub sequence: i64,
}

/// Notifications that another replica made work claimable (Postgres `LISTEN`).
pub struct WorkListener(sqlx::postgres::PgListener);

impl WorkListener {
    /// Waits for the next notification; returns its payload.
    pub async fn recv(&mut self) -> StoreResult<String> {
        Ok(self.0.recv().await?.payload().to_owned())
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
        let db = match backend_of(url) {
            Some("postgres") => Db::Postgres(PgStore::connect(url, options).await.context("connecting to Postgres")?),
            Some(_) => Db::Sqlite(SqliteStore::connect(url, options).await.context("opening SQLite")?),
            None => anyhow::bail!("unsupported database URL scheme: use postgres://… or sqlite://…"),
        };
        Ok(Self {
            db,
            lane_claims: Arc::new(combine::Combiner::new(1)),
            outcome_batches: Arc::new(combine::Combiner::new(2)),
            expired_total: Arc::default(),
            completed_total: Arc::default(),
            webhook_wake: Arc::default(),
            child_bytes: Arc::default(),
        })
    }

    pub fn backend(&self) -> &'static str {
        match self.db {
            Db::Postgres(_) => "postgres",
            Db::Sqlite(_) => "sqlite",
        }
    }

    /// Applies this backend's embedded migrations.
    pub async fn migrate(&self) -> anyhow::Result<()> {
        dispatch!(self, s => s.migrate().await)
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> StoreResult<()> {
        dispatch!(self, s => s.ping().await)
    }

    /// Each pool's size, idle connections and maximum.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        dispatch!(self, s => s.pool_stats())
    }

    /// Children whose expired lease this process has swept since it started.
    pub fn leases_expired_total(&self) -> u64 {
        self.expired_total.load(Ordering::Relaxed)
    }

    /// Parents this process has completed since it started.
    pub fn parents_completed_total(&self) -> u64 {
        self.completed_total.load(Ordering::Relaxed)
    }

    /// Tells every replica's waiting claims that work may have become
    /// claimable (Postgres `NOTIFY`; nothing to do for the one SQLite process).
    pub async fn notify_work(&self, payload: &str) -> StoreResult<()> {
        match &self.db {
            Db::Postgres(s) => s.notify_work(payload).await,
            Db::Sqlite(_) => Ok(()),
        }
    }

    /// Other replicas' work notifications (Postgres only; `None` on SQLite,
    /// where every claim is in this process, and through a transaction pooler
    /// without a direct URL, where waiting claims rely on their recheck).
    pub async fn listen_for_work(&self) -> StoreResult<Option<WorkListener>> {
        match &self.db {
            Db::Postgres(s) => Ok(s.listen_for_work().await?.map(WorkListener)),
            Db::Sqlite(_) => Ok(None),
        }
    }

    async fn begin(&self) -> StoreResult<Tx> {
        Ok(match &self.db {
            Db::Postgres(s) => Tx::Postgres(s.begin().await?),
            Db::Sqlite(s) => Tx::Sqlite(s.begin().await?),
        })
    }

    /// The one place that learns a parent just completed: every statement
    /// that can complete a parent returns the parents it completed, and
    /// `Store` hands them here once they are committed.
    fn completed(&self, parents: &[ParentId]) {
        if parents.is_empty() {
            return;
        }
        self.completed_total.fetch_add(parents.len() as u64, Ordering::Relaxed);
        // Their completion events (if any) were committed with them.
        self.webhook_wake.notify_one();
        for parent_id in parents {
            tracing::debug!(%parent_id, "parent complete");
        }
    }
}
