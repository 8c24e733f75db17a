//! What the store's statements return besides ledger records: leases,
//! lanes, the outcome statement's winners, the seal's census, the drift scan
//! and a queue's summary.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows::{LedgerRow, claimed_child};
use crate::ledger::admission::HeldBy;
use crate::ledger::projection::Tally;
use crate::ledger::{ChildState, ClaimedChild, ParentId, QueueName};

/// Children one claim statement leased.
#[derive(Debug, Default)]
pub(crate) struct Leased {
    pub children: Vec<ClaimedChild>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The queue of the parents they came from (a claim draws from one queue).
    pub queue: Option<QueueName>,
    /// When a claim that limits (or a `not_before`) held back may find
    /// children: the earliest of its lanes'.
    pub next_available_at: Option<DateTime<Utc>>,
}

impl Leased {
    /// Adds the children of another lane claim under the same claim id; the
    /// claim's expiry is the earliest of its children's.
    pub fn merge(&mut self, more: Leased) {
        self.lease_expires_at = match (self.lease_expires_at, more.lease_expires_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.queue = self.queue.take().or(more.queue);
        self.next_available_at = match (self.next_available_at, more.next_available_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.children.extend(more.children);
    }

    /// The children of one claim statement, each with its lease expiry and queue.
    pub fn from_rows(
        rows: impl Iterator<Item = Result<(ClaimedChild, DateTime<Utc>, QueueName), sqlx::Error>>,
    ) -> Result<Self, sqlx::Error> {
        let mut leased = Self::default();
        for row in rows {
            let (child, lease_expires_at, queue) = row?;
            leased.children.push(child);
            leased.lease_expires_at = Some(lease_expires_at);
            leased.queue = Some(queue);
        }
        Ok(leased)
    }
}

/// A lane a queue claim may visit: a parent with claimable children.
#[derive(Debug, Clone)]
pub(crate) struct Lane {
    pub parent_id: ParentId,
    pub priority: i32,
    /// Its parent's flow key.
    pub flow_key: Option<String>,
    /// The parent's largest payload in bytes (`None`: not on record).
    pub child_bytes: Option<i64>,
}

impl Lane {
    pub fn new(parent_id: String, priority: i32, child_bytes: Option<i32>, flow_key: Option<String>) -> Self {
        Self {
            parent_id: ParentId::from_ledger(parent_id),
            priority,
            flow_key,
            child_bytes: child_bytes.map(i64::from),
        }
    }
}

/// How a claim takes its turn on a lane another claim of the same parent holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum LaneTurn {
    /// Wait until that claim commits, then claim after it.
    Wait,
    /// Pass the lane by (`SKIP LOCKED`): a queue claim tries the next one.
    Skip,
}

/// One claim's share of a lane claim statement.
#[derive(Debug, Clone)]
pub(crate) struct LaneAsk {
    pub claim_id: Uuid,
    pub worker: Option<String>,
    pub lease_seconds: i64,
    pub limit: i64,
}

/// What a claim on one lane did.
#[derive(Debug, Default)]
pub(crate) struct LaneClaim {
    pub leased: Leased,
    /// The lane was there and this claim took its turn on it; `false` when it
    /// was passed by as busy, or the parent has no lane (not decomposed).
    pub taken: bool,
    /// Which limit held it back, if one did.
    pub held_by: Option<HeldBy>,
}

impl LaneClaim {
    /// The rows of a lane claim statement shared by `asks`, on a lane this
    /// claim took its turn on: each ask's children (by their `claim_id`
    /// column).
    pub fn taken_from_rows<'r, R: LedgerRow + 'r>(
        asks: &[LaneAsk],
        rows: impl IntoIterator<Item = &'r R>,
    ) -> Result<Vec<Self>, sqlx::Error> {
        let mut children: Vec<Vec<&R>> = vec![Vec::new(); asks.len()];
        for row in rows {
            let claim_id = row.uuid("claim_id")?;
            let ask = asks.iter().position(|a| Some(a.claim_id) == claim_id).unwrap_or(0);
            children[ask].push(row);
        }
        children
            .into_iter()
            .map(|rows| {
                Ok(Self {
                    leased: Leased::from_rows(rows.into_iter().map(claimed_child))?,
                    taken: true,
                    held_by: None,
                })
            })
            .collect()
    }
}

/// What one outcome statement did: the writes that won, and the parents that
/// those writes completed.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub won: Vec<(ParentId, i64)>,
    pub completed: Vec<ParentId>,
}

/// What the ledger holds for a losing write's child: whether its parent exists
/// and is decomposed, the child's state, and whether the write's claim id
/// fails the fence.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LoserFacts {
    pub parent_decomposed: Option<bool>,
    pub state: Option<ChildState>,
    pub fenced_out: bool,
}

/// A seal's count of stored sequences below and at or past its total.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SealCensus {
    pub below: i64,
    pub beyond: i64,
}

impl SealCensus {
    /// Exactly `0..total` are stored.
    pub fn matches(&self, total: i64) -> bool {
        self.below == total && self.beyond == 0
    }
}

/// What a seal mismatch names: the lowest stored sequence below the total, the
/// gap runs (see `projection::missing_sequences`) and the extra sequences.
#[derive(Debug, Default)]
pub(crate) struct SealReport {
    pub first: Option<i64>,
    pub gaps: Vec<(i64, Option<i64>)>,
    pub extra: Vec<i64>,
}

/// One parent of the drift scan: its stored projection beside its row counts.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DriftRow {
    pub parent_id: String,
    pub position: i64,
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub completed: bool,
    pub decomposed: bool,
    pub rows_total: i64,
    pub rows_processed: i64,
    pub rows_failed: i64,
    pub rows_skipped: i64,
    pub open_in_flight: i64,
    pub open_held: i64,
    pub rows_in_flight: i64,
    pub rows_held: i64,
    pub reasons_failed: i64,
    pub reasons_skipped: i64,
}

impl DriftRow {
    /// Whether the stored projection disagrees with the rows.
    pub fn drifted(&self) -> bool {
        let stored = Tally {
            total: self.total,
            processed: self.processed,
            failed: self.failed,
            skipped: self.skipped,
        };
        let derived = Tally {
            total: self.rows_total,
            processed: self.rows_processed,
            failed: self.rows_failed,
            skipped: self.rows_skipped,
        };
        stored != derived
            || self.completed != derived.is_complete(self.decomposed)
            || (self.open_in_flight, self.open_held) != (self.rows_in_flight, self.rows_held)
            || (self.reasons_failed, self.reasons_skipped) != (self.rows_failed, self.rows_skipped)
    }
}

/// A page of the drift scan: how many parents were compared, the ids whose
/// stored projection disagrees with their rows, and where the next page
/// starts (`None` after the last).
#[derive(Debug, Default)]
pub(crate) struct DriftPage {
    pub checked: u64,
    /// The drifted parents with their positions.
    pub drifted: Vec<(ParentId, i64)>,
    pub next: Option<i64>,
}

impl DriftPage {
    pub fn from_rows(rows: Vec<DriftRow>, page: i64) -> Self {
        let full = rows.len() as i64 == page;
        let next = rows.last().map(|r| r.position).filter(|_| full);
        Self {
            checked: rows.len() as u64,
            drifted: rows
                .into_iter()
                .filter(DriftRow::drifted)
                .map(|r| (ParentId::from_ledger(r.parent_id), r.position))
                .collect(),
            next,
        }
    }
}

/// One queue's row of `queues::QUEUE_SUMMARIES`.
#[derive(Debug)]
pub(crate) struct QueueRow {
    pub queue: String,
    pub decomposing: i64,
    pub active: i64,
    pub complete: i64,
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub in_flight: i64,
    pub held: i64,
    pub processed_now: i64,
    pub failed_now: i64,
    pub processed_before: i64,
    pub failed_before: i64,
    pub oldest_pending_since: Option<chrono::DateTime<chrono::Utc>>,
    /// The database clock, in seconds since the epoch.
    pub epoch: f64,
    pub paused: bool,
}

impl QueueRow {
    pub fn from_row(row: &dyn LedgerRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            queue: row.text("queue")?,
            decomposing: row.int("decomposing")?,
            active: row.int("active")?,
            complete: row.int("complete")?,
            total: row.int("total")?,
            processed: row.int("processed")?,
            failed: row.int("failed")?,
            skipped: row.int("skipped")?,
            in_flight: row.int("in_flight")?,
            held: row.int("held")?,
            processed_now: row.int("processed_now")?,
            failed_now: row.int("failed_now")?,
            processed_before: row.int("processed_before")?,
            failed_before: row.int("failed_before")?,
            oldest_pending_since: [
                row.opt_time("oldest_fresh_since")?,
                row.opt_time("oldest_given_back_since")?,
            ]
            .into_iter()
            .flatten()
            .min(),
            epoch: row.float("epoch")?,
            paused: row.bool("paused")?,
        })
    }

    pub fn into_queue(self) -> crate::ledger::Queue {
        use crate::ledger::{Counts, Queue, QueueParents, Throughput};
        Queue {
            queue: crate::ledger::QueueName::from_ledger(self.queue),
            paused: self.paused,
            parents: QueueParents {
                decomposing: self.decomposing,
                active: self.active,
                complete: self.complete,
            },
            children: Counts {
                total: self.total,
                processed: self.processed,
                failed: self.failed,
                skipped: self.skipped,
                pending: (self.total - self.processed - self.failed - self.skipped - self.in_flight - self.held).max(0),
                in_flight: self.in_flight,
                held: self.held,
            },
            oldest_pending_since: self.oldest_pending_since,
            throughput: Throughput::over_last_minute(
                (self.processed_now, self.failed_now),
                (self.processed_before, self.failed_before),
                self.epoch.rem_euclid(60.0),
            ),
            flow_keys: Vec::new(),
        }
    }
}

impl LaneClaim {
    /// Each ask's share of `allowed` children, in order: the first asks are
    /// served whole.
    pub fn admitted_asks(asks: &[LaneAsk], allowed: i64) -> Vec<LaneAsk> {
        let mut left = allowed;
        asks.iter()
            .map(|ask| {
                let limit = ask.limit.min(left).max(0);
                left -= limit;
                LaneAsk { limit, ..ask.clone() }
            })
            .collect()
    }

    /// What each of `asks` gets from a lane a limit or a `not_before` holds
    /// back: nothing, and when to come back.
    pub fn held_back(asks: &[LaneAsk], held_by: Option<HeldBy>, next: Option<DateTime<Utc>>) -> Vec<Self> {
        asks.iter()
            .map(|_| Self {
                leased: Leased {
                    next_available_at: next,
                    ..Leased::default()
                },
                taken: true,
                held_by,
            })
            .collect()
    }
}
