//! The ledger's storage: Postgres for shared production ledgers, SQLite as the
//! embedded default. The backend is chosen once, from the database URL; all
//! SQL lives in `postgres.rs` and `sqlite.rs`.

mod floors;
mod postgres;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::error::ApiResult;
use crate::ledger::{
    Appended, Child, ChildState, Claim, ClaimRequest, ClaimScope, NewChild, OutcomeStatus, OutcomeWrite, Parent,
    ParentId, QueueName, ReconcileReport, Registration, SweepReport,
};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// How many expired leases one sweep statement moves at most.
const EXPIRE_BATCH: i64 = 5_000;
/// How many children one bulk statement writes or compares: a 100,000-child
/// registration is a few statements in one transaction, so neither the bound
/// arguments nor SQLite's JSON parse of them ever holds the whole request twice.
pub(crate) const WRITE_CHUNK: usize = 10_000;
/// How many parents the reconcile sweep reads per page.
const SWEEP_PAGE: i64 = 500;

#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub max_connections: u32,
    /// How long a request waits for a connection before answering 503.
    pub acquire_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            max_connections: 16,
            // Under 5 s: with the database down, a request is answered 503 within 5 s.
            acquire_timeout: Duration::from_secs(3),
        }
    }
}

/// The ledger's store: one backend, chosen once from the URL.
#[derive(Debug, Clone)]
pub struct Store {
    db: Db,
    floors: Arc<floors::ClaimFloors>,
    /// Children whose expired lease this process swept, for the metrics.
    expired_total: Arc<std::sync::atomic::AtomicU64>,
    /// A parent's queue never changes: remembered for claim metrics.
    queues: Arc<std::sync::Mutex<std::collections::HashMap<ParentId, QueueName>>>,
}

/// One connection pool's occupancy, for the metrics gauges.
#[derive(Debug, Clone, Copy)]
pub struct PoolStats {
    pub name: &'static str,
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

/// How many parents' queues `Store::queue_of` remembers before starting over.
const QUEUE_CACHE: usize = 10_000;

#[derive(Debug, Clone)]
enum Db {
    Postgres(PgStore),
    Sqlite(SqliteStore),
}

/// Filters of the parent list.
#[derive(Debug, Clone, Default)]
pub struct ParentFilter {
    pub queue: Option<QueueName>,
    pub state: Option<crate::ledger::ParentState>,
    /// Only active parents with a child claimable now.
    pub resumable: bool,
    /// List parents after this position (exclusive).
    pub after_position: Option<i64>,
    pub limit: i64,
}

/// One page of parents; `next_position` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ParentPage {
    pub parents: Vec<Parent>,
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

macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match &$self.db {
            Db::Postgres($store) => $call,
            Db::Sqlite($store) => $call,
        }
    };
}

impl Store {
    /// Connects to `postgres://…` or `sqlite://…` (the SQLite file is created if missing).
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
        Self::connect_with(url, &StoreOptions::default()).await
    }

    pub async fn connect_with(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Self::new(Db::Postgres(
                PgStore::connect(url, options).await.context("connecting to Postgres")?,
            )))
        } else if url.starts_with("sqlite:") {
            Ok(Self::new(Db::Sqlite(
                SqliteStore::connect(url, options).await.context("opening SQLite")?,
            )))
        } else {
            anyhow::bail!("unsupported database URL {url:?}: use postgres://… or sqlite://…")
        }
    }

    fn new(db: Db) -> Self {
        Self {
            db,
            floors: Arc::default(),
            expired_total: Arc::default(),
            queues: Arc::default(),
        }
    }

    /// Children whose expired lease this process has swept since it started.
    pub fn leases_expired_total(&self) -> u64 {
        self.expired_total.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Each pool's size, idle connections and maximum.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        dispatch!(self, s => s.pool_stats())
    }

    /// The queue of a parent (cached: it never changes once registered).
    pub async fn queue_of(&self, parent_id: &ParentId) -> ApiResult<QueueName> {
        let cached = self
            .queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(parent_id)
            .cloned();
        if let Some(queue) = cached {
            return Ok(queue);
        }
        let queue = dispatch!(self, s => s.queue_of(parent_id).await)?;
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        if queues.len() >= QUEUE_CACHE {
            queues.clear();
        }
        queues.insert(parent_id.clone(), queue.clone());
        Ok(queue)
    }

    /// Tells every replica's waiting claims that work may have become
    /// claimable (Postgres `NOTIFY`; nothing to do for the one SQLite process).
    pub async fn notify_work(&self) -> ApiResult<()> {
        match &self.db {
            Db::Postgres(s) => s.notify_work().await,
            Db::Sqlite(_) => Ok(()),
        }
    }

    /// A stream of other replicas' work notifications (Postgres only).
    pub async fn listen_for_work(&self) -> ApiResult<Option<sqlx::postgres::PgListener>> {
        match &self.db {
            Db::Postgres(s) => s.listen_for_work().await.map(Some),
            Db::Sqlite(_) => Ok(None),
        }
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
    pub async fn ping(&self) -> ApiResult<()> {
        dispatch!(self, s => s.ping().await)
    }

    /// Registers a parent with its children in one transaction. Returns whether
    /// this call created it (`false`: an identical registration already existed).
    pub async fn register(&self, registration: &Registration) -> ApiResult<(bool, Parent)> {
        dispatch!(self, s => s.register(registration).await)
    }

    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> ApiResult<Appended> {
        dispatch!(self, s => s.append(parent_id, children).await)
    }

    pub async fn seal(&self, parent_id: &ParentId, total: i64) -> ApiResult<Parent> {
        let parent = dispatch!(self, s => s.seal(parent_id, total).await)?;
        self.floors.forget(parent_id);
        Ok(parent)
    }

    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> ApiResult<Parent> {
        dispatch!(self, s => s.parent(parent_id, include_payload).await)
    }

    pub async fn list_parents(&self, filter: &ParentFilter) -> ApiResult<ParentPage> {
        // One row past the page says whether another page follows.
        let mut rows = dispatch!(self, s => s.list_parents(filter, filter.limit + 1).await)?;
        let more = rows.len() as i64 > filter.limit;
        rows.truncate(filter.limit as usize);
        let next_position = rows.last().map(|(position, _)| *position).filter(|_| more);
        Ok(ParentPage {
            parents: rows.into_iter().map(|(_, parent)| parent).collect(),
            next_position,
        })
    }

    pub async fn children(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        limit: i64,
    ) -> ApiResult<ChildPage> {
        let mut children = dispatch!(self, s => s.children(parent_id, state, after, limit + 1).await)?;
        if children.is_empty() {
            dispatch!(self, s => s.parent_exists(parent_id).await)?;
        }
        let more = children.len() as i64 > limit;
        children.truncate(limit as usize);
        let next_after = children.last().map(|c| c.sequence).filter(|_| more);
        Ok(ChildPage { children, next_after })
    }

    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        dispatch!(self, s => s.child(parent_id, sequence).await)
    }

    /// Claims up to `limit` claimable children under one lease. A parent's
    /// claim starts at its floor (see `floors`) and scans from 0 when that
    /// comes back short. When still short, expired leases in the same scope are
    /// swept and the claim is topped up, so abandoned work comes back without
    /// waiting for the reaper.
    pub async fn claim(&self, request: &ClaimRequest) -> ApiResult<Claim> {
        let parent = match &request.scope {
            ClaimScope::Parent(parent_id) => Some(parent_id),
            ClaimScope::Queue(_) => None,
        };
        let floor = parent.map_or(0, |p| self.floors.floor(p));
        let mut claim = dispatch!(self, s => s.claim(request, request.limit, floor).await)?;
        if floor > 0 {
            self.top_up(request, &mut claim, 0).await?;
        }
        if (claim.children.len() as i64) < request.limit && self.expire_leases(Some(&request.scope)).await? > 0 {
            self.top_up(request, &mut claim, 0).await?;
        }
        if let (Some(parent_id), Some(lowest)) = (parent, claim.children.iter().map(|c| c.sequence).min()) {
            self.floors.claimed(parent_id, lowest);
        }
        // RETURNING has no order: hand children out lowest sequence first.
        claim
            .children
            .sort_by(|a, b| (&a.parent_id, a.sequence).cmp(&(&b.parent_id, b.sequence)));
        Ok(claim)
    }

    /// Claims what `claim` is short of, scanning from `floor`.
    async fn top_up(&self, request: &ClaimRequest, claim: &mut Claim, floor: i64) -> ApiResult<()> {
        let short = request.limit - claim.children.len() as i64;
        if short > 0 {
            let more = dispatch!(self, s => s.claim(request, short, floor).await)?;
            claim.lease_expires_at = claim.lease_expires_at.or(more.lease_expires_at);
            claim.children.extend(more.children);
        }
        Ok(())
    }

    /// Extends every live lease of a claim. Returns how many and the new expiry.
    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> ApiResult<(u64, Option<DateTime<Utc>>)> {
        dispatch!(self, s => s.extend(claim_id, lease_seconds).await)
    }

    /// Returns a claim's children (all, or the named ones) to `pending`.
    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> ApiResult<u64> {
        let released = dispatch!(self, s => s.release(claim_id, children, delay_seconds).await)?;
        match children {
            Some(children) => children.iter().for_each(|c| self.floors.forget(&c.parent_id)),
            None => self.floors.forget_all(),
        }
        Ok(released)
    }

    /// Returns a `held` child to `pending`.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        let child = dispatch!(self, s => s.retry(parent_id, sequence).await)?;
        self.floors.forget(parent_id);
        Ok(child)
    }

    /// Records terminal outcomes in one transaction, first writer wins; the
    /// statuses come back in request order.
    pub async fn record_outcomes(&self, writes: &[OutcomeWrite]) -> ApiResult<Vec<OutcomeStatus>> {
        dispatch!(self, s => s.record_outcomes(writes).await)
    }

    pub async fn reconcile(&self, parent_id: &ParentId, dry_run: bool) -> ApiResult<ReconcileReport> {
        dispatch!(self, s => s.reconcile(parent_id, dry_run).await)
    }

    /// Reconciles every parent (or one queue's), a page at a time.
    pub async fn reconcile_sweep(&self, queue: Option<&QueueName>, dry_run: bool) -> ApiResult<SweepReport> {
        let mut report = SweepReport {
            dry_run,
            checked: 0,
            drifted: 0,
            repaired: 0,
            parents: Vec::new(),
        };
        let mut after = 0;
        loop {
            let (ids, last) = dispatch!(self, s => s.drift_candidates(queue, after, SWEEP_PAGE).await)?;
            report.checked += ids.checked;
            for parent_id in ids.drifted {
                // Re-derived under the parent's lock: a concurrent outcome may have
                // closed the gap since the page was read.
                let one = self.reconcile(&parent_id, dry_run).await?;
                if one.changes.is_empty() {
                    continue;
                }
                report.drifted += 1;
                report.repaired += u64::from(one.applied);
                report.parents.push(one);
            }
            match last {
                Some(position) => after = position,
                None => break,
            }
        }
        Ok(report)
    }

    /// Moves children whose lease ran out to `pending`, `held` (hold policy) or
    /// `failed` (attempts exhausted), in `scope` or everywhere. Returns how many.
    pub async fn expire_leases(&self, scope: Option<&ClaimScope>) -> ApiResult<u64> {
        let mut moved = 0;
        loop {
            let batch = dispatch!(self, s => s.expire_leases(scope, EXPIRE_BATCH).await)?;
            moved += batch;
            if batch < EXPIRE_BATCH as u64 {
                if moved > 0 {
                    self.floors.forget_all();
                    self.expired_total
                        .fetch_add(moved, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(moved);
            }
        }
    }

    /// Runs raw SQL, as an operator repairing by hand would (tests use it to
    /// make the projection drift).
    pub async fn execute_raw(&self, sql: &str) -> anyhow::Result<()> {
        dispatch!(self, s => s.execute_raw(sql).await)
    }

    /// Runs a raw scalar count query.
    pub async fn count_raw(&self, sql: &str) -> anyhow::Result<i64> {
        dispatch!(self, s => s.count_raw(sql).await)
    }
}

/// A page of the drift scan: how many parents were compared, the ids whose
/// stored projection disagrees with their rows.
#[derive(Debug, Default)]
pub(crate) struct DriftPage {
    pub checked: u64,
    pub drifted: Vec<ParentId>,
}

/// One parent of the drift scan: `(parent_id, position, total, processed,
/// failed, skipped, completed, decomposed, rows_total, rows_processed,
/// rows_failed, rows_skipped)`, the stored projection beside the row counts.
pub(crate) type DriftRow = (String, i64, i64, i64, i64, i64, bool, bool, i64, i64, i64, i64);

/// The drifted parents of one scanned page, and where the next page starts
/// (`None` after the last page).
pub(crate) fn drift_page(rows: Vec<DriftRow>, page: i64) -> (DriftPage, Option<i64>) {
    let full = rows.len() as i64 == page;
    let mut result = DriftPage {
        checked: rows.len() as u64,
        drifted: Vec::new(),
    };
    let mut last = None;
    for (parent_id, position, total, processed, failed, skipped, completed, decomposed, rt, rp, rf, rs) in rows {
        last = Some(position);
        let stored = crate::ledger::projection::Tally {
            total,
            processed,
            failed,
            skipped,
        };
        let derived = crate::ledger::projection::Tally {
            total: rt,
            processed: rp,
            failed: rf,
            skipped: rs,
        };
        if stored != derived || completed != derived.is_complete(decomposed) {
            result.drifted.push(ParentId::from_ledger(parent_id));
        }
    }
    (result, if full { last } else { None })
}

/// Parses a stored enum value, turning a bad one into a decode error.
pub(crate) fn parse_column<T: std::str::FromStr<Err = String>>(value: &str) -> Result<T, sqlx::Error> {
    value.parse().map_err(|e: String| sqlx::Error::Decode(e.into()))
}
