//! What a backend provides: the whole contract between `Store` and the two
//! databases, on one page. `postgres/` and `sqlite/` each implement every
//! trait here; `Store` holds one as `dyn Backend`, chosen once from the URL,
//! and sequences every transaction over it.
//!
//! A backend provides two kinds of operation:
//! - **Running statements** (`Connection`, and `Transaction`'s first
//!   methods): SQL both dialects write alike lives beside the `Store` method
//!   that runs it, as text built from the dialect's fragments
//!   (`statement::Sql`), and any backend runs it.
//! - **Statements whose shape differs** (the rest): arrays and `unnest` on
//!   Postgres against `json_each` on SQLite, one statement against several,
//!   `SKIP LOCKED` where rows lock one by one. Each backend writes its own.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::future::LocalBoxFuture;
use uuid::Uuid;

use super::reports::{Applied, DriftPage, LaneAsk, LaneClaim, LaneTurn, LoserFacts};
use super::rows::LedgerRow;
use super::statement::{Dialect, Statement};
use super::{ChildRef, PoolStats, StoreResult};
use crate::ledger::{ClaimScope, NewChild, OutcomeWrite, ParentId, QueueName, QueueScope};

/// A row as the ledger reads it, from either backend.
pub(crate) type Row = Box<dyn LedgerRow + Send + Sync>;

/// Everything a backend provides.
pub(crate) trait Backend: Connection + Claims + Outcomes + Reconcile {}

impl<T: Connection + Claims + Outcomes + Reconcile> Backend for T {}

/// The database itself: its dialect, its pools, and statements run on them.
#[async_trait]
pub(crate) trait Connection: Send + Sync + std::fmt::Debug {
    /// The words this dialect's shared statements are built from.
    fn dialect(&self) -> &'static Dialect;
    /// Applies this backend's embedded migrations (sqlx's migrator is not
    /// `Send`; it runs before the service serves).
    fn migrate(&self) -> LocalBoxFuture<'_, anyhow::Result<()>>;
    /// Whether the database answers and can hold the ledger; `Some` host
    /// (`host:port`) where there may be several to choose from.
    async fn ping(&self) -> StoreResult<Option<String>>;
    /// Each pool's size, idle connections and maximum.
    fn pool_stats(&self) -> Vec<PoolStats>;
    /// A write transaction (on SQLite it holds the one write lock).
    async fn begin(&self) -> StoreResult<Box<dyn Transaction>>;
    /// The rows of a short read (a lookup by key).
    async fn fetch(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>>;
    /// The rows of a read that may scan: dropped unfinished (its request
    /// timed out or left), its statement ends too.
    async fn scan(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>>;
    /// One write statement in a transaction of its own: the rows it returns.
    async fn write(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>>;
    /// One write statement in a transaction of its own: rows affected.
    async fn execute(&self, statement: Statement<'_>) -> StoreResult<u64>;
    /// Tells the other replicas (Postgres `NOTIFY`); nothing to tell for the
    /// one SQLite process.
    async fn notify(&self, _payload: &str) -> StoreResult<()> {
        Ok(())
    }
    /// The other replicas' notifications; `None` where there are none to hear
    /// (SQLite, or a transaction pooler without a direct URL).
    async fn listen(&self) -> StoreResult<Option<Box<dyn Notifications>>> {
        Ok(None)
    }
    /// Keeps the planner's statistics fresh after a bulk write.
    async fn after_bulk_write(&self, _rows_written: i64) -> StoreResult<()> {
        Ok(())
    }
    /// Analyzes the hot tables whose rows changed enough since their last
    /// analysis (by anyone) that the planner's picture of them is stale;
    /// their names. Nothing to do where plans do not follow statistics.
    async fn refresh_statistics(&self) -> StoreResult<Vec<String>> {
        Ok(Vec::new())
    }
}

/// Notifications from other replicas, in the order they were sent.
#[async_trait]
pub(crate) trait Notifications: Send {
    async fn recv(&mut self) -> StoreResult<String>;
}

/// A write transaction. Dropped without `commit`, it rolls back (and a
/// statement still running ends).
#[async_trait]
pub(crate) trait Transaction: ChildWrites + LoserWrites + Outbox + Send {
    fn dialect(&self) -> &'static Dialect;
    async fn fetch(&mut self, statement: Statement<'_>) -> StoreResult<Vec<Row>>;
    async fn execute(&mut self, statement: Statement<'_>) -> StoreResult<u64>;
    async fn commit(self: Box<Self>) -> StoreResult<()>;
}

/// Children written in bulk, in a transaction.
#[async_trait]
pub(crate) trait ChildWrites {
    /// Writes one chunk of children in one statement (never one per child).
    async fn insert_children(&mut self, chunk: ChildChunk<'_>) -> StoreResult<Inserted>;
    /// The first sequences of a chunk (at most 100) whose stored content
    /// differs from the appended one.
    async fn differing_sequences(&mut self, parent_id: &ParentId, chunk: &[NewChild]) -> StoreResult<Vec<i64>>;
    /// Skips every open child of a parent with `reason` (a cancel).
    async fn skip_open_children(&mut self, parent_id: &ParentId, reason: &str) -> StoreResult<Settled>;
}

/// What the writes that lost are told, in a transaction.
#[async_trait]
pub(crate) trait LoserWrites {
    /// What the ledger holds for each losing write's child, in input order.
    async fn loser_facts(&mut self, losers: &[&OutcomeWrite]) -> StoreResult<Vec<LoserFacts>>;
    /// Keeps a losing outcome write in its child's conflict log.
    async fn log_conflict(&mut self, write: &OutcomeWrite) -> StoreResult<()>;
}

/// The webhook outbox, written in the transaction that completes parents.
#[async_trait]
pub(crate) trait Outbox {
    /// Writes the completion event of each of `parents` that has a
    /// `webhook_url`, once per completion. The statements that complete
    /// parents on their own (outcomes, expiries) write the same rows with
    /// the same SQL, in the same statement.
    async fn enqueue_completed(&mut self, parents: &[ParentId]) -> StoreResult<u64>;
}

/// Leases: the claim of a lane and what moves leased children.
#[async_trait]
pub(crate) trait Claims {
    /// Leases children of one parent for each ask, lowest sequence first.
    async fn claim_lane(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>>;
    /// Extends every live lease of a claim.
    async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<Extended>;
    /// Returns a claim's children (all, or the named ones) to pending.
    async fn release(&self, release: Release<'_>) -> StoreResult<Vec<(ParentId, u64)>>;
    /// Returns a held child to pending; whether it was held.
    /// Returns held children (one, or all of the parent's) to pending; how many.
    async fn retry_held(&self, parent_id: &ParentId, sequence: Option<i64>) -> StoreResult<u64>;
    /// Moves up to `batch` children whose lease ran out, in `scope` or everywhere.
    async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> StoreResult<Expired>;
}

/// Terminal outcomes.
#[async_trait]
pub(crate) trait Outcomes {
    /// Records the writes that win, and their parents' counters, each parent
    /// in one statement; says which won and which parents they completed.
    async fn apply_outcomes(&self, writes: &[OutcomeWrite]) -> StoreResult<Applied>;
}

/// Reconcile's scan.
#[async_trait]
pub(crate) trait Reconcile {
    /// The parents after a position whose stored projection disagrees with
    /// their rows, read without locks.
    async fn drift_page(&self, page: DriftQuery<'_>) -> StoreResult<DriftPage>;
}

/// A lane claim shared by the claims that arrived while the last one ran.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneClaimParams<'a> {
    pub parent_id: &'a ParentId,
    /// The queue the lane must be in (`None`: any): a parent deleted and
    /// registered again in another queue hands out nothing.
    pub queue: Option<&'a QueueName>,
    pub asks: &'a [LaneAsk],
    pub turn: LaneTurn,
}

/// A release of a claim's children.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Release<'a> {
    pub claim_id: Uuid,
    /// `None`: every child the claim holds.
    pub children: Option<&'a [ChildRef]>,
    pub delay_seconds: i64,
}

/// What an extension did: how many leases, and the new expiry.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Extended {
    pub extended: u64,
    pub lease_expires_at: Option<DateTime<Utc>>,
}

/// What a sweep of expired leases moved.
#[derive(Debug, Default)]
pub(crate) struct Expired {
    pub moved: u64,
    /// More leases may have run out than this sweep took.
    pub more: bool,
    /// The parents whose last child this failed (attempts exhausted).
    pub completed: Vec<ParentId>,
}

/// A chunk of children to write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildChunk<'a> {
    pub parent_id: &'a ParentId,
    pub children: &'a [NewChild],
    /// Sequences already stored are left alone (an append); otherwise any
    /// such sequence is an error (a registration writes a new parent).
    pub idempotent: bool,
}

/// What a chunk wrote.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Inserted {
    pub rows: u64,
    /// Of those, children stored as skipped.
    pub skipped: i64,
}

/// Children a cancel settled: how many, and how many were in flight and held.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Settled {
    pub children: i64,
    pub from_in_flight: i64,
    pub from_held: i64,
}

/// A page of the drift scan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DriftQuery<'a> {
    pub queue: Option<&'a QueueName>,
    pub within: &'a QueueScope,
    /// Parents after this position.
    pub after: i64,
    pub limit: i64,
}
