//! What the store reads back besides ledger records: rows both backends
//! decode the same way, and the small reports its statements return.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::ledger::projection::Tally;
use crate::ledger::{
    Child, ChildState, ClaimedChild, Conflict, OpenCounts, Outcome, Parent, ParentId, ParentRow, QueueName,
    idempotency_key,
};

/// A row as the ledger reads it. Columns of plain types read the same on
/// both backends (`row_columns!`); each backend says how it keeps JSON and uuids.
pub(crate) trait LedgerRow {
    fn text(&self, column: &str) -> Result<String, sqlx::Error>;
    fn opt_text(&self, column: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, column: &str) -> Result<i64, sqlx::Error>;
    fn opt_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, column: &str) -> Result<i32, sqlx::Error>;
    fn opt_int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error>;
    fn time(&self, column: &str) -> Result<DateTime<Utc>, sqlx::Error>;
    fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error>;
    /// A JSON column as its text, not parsed into a tree.
    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error>;
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error>;
}

/// The plain-typed `LedgerRow` methods, for a backend row type that decodes them all.
macro_rules! row_columns {
    () => {
        fn text(&self, column: &str) -> Result<String, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn opt_text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn int(&self, column: &str) -> Result<i64, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn opt_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn int32(&self, column: &str) -> Result<i32, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn opt_int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn time(&self, column: &str) -> Result<chrono::DateTime<chrono::Utc>, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
        fn opt_time(&self, column: &str) -> Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
            sqlx::Row::try_get(self, column)
        }
    };
}
pub(crate) use row_columns;

/// A parent row with its open counts.
pub(crate) fn parent(row: &impl LedgerRow, include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.text("parent_id")?),
        queue: QueueName::from_ledger(row.text("queue")?),
        // Decoded only when asked for: a page of parents must not build every
        // retained payload to drop it.
        payload: if include_payload {
            row.raw_json("payload")?
        } else {
            None
        },
        max_attempts: row.opt_int32("max_attempts")?,
        expired_lease: parse_column(&row.text("expired_lease")?)?,
        priority: row.int32("priority")?,
        webhook_url: row.opt_text("webhook_url")?,
        total: row.int("total")?,
        processed: row.int("processed")?,
        failed: row.int("failed")?,
        skipped: row.int("skipped")?,
        created_at: row.time("created_at")?,
        decomposed_at: row.opt_time("decomposed_at")?,
        completed_at: row.opt_time("completed_at")?,
        last_progress_at: row.opt_time("last_progress_at")?,
    };
    let open = OpenCounts {
        // A count is never below zero, even over a drifted projection
        // (reconcile shows and repairs that drift).
        pending: row.int("open_pending")?.max(0),
        in_flight: row.int("open_in_flight")?,
        held: row.int("open_held")?,
    };
    Ok(parent.into_parent(open, include_payload))
}

/// JSON `null`, for a payload column that holds none.
fn null_json() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// A child row (`sql::CHILD_COLUMNS`).
pub(crate) fn child(row: &impl LedgerRow) -> Result<Child, sqlx::Error> {
    let parent_id = row.text("parent_id")?;
    let sequence = row.int("sequence")?;
    let state: ChildState = parse_column(&row.text("state")?)?;
    let conflicts: Vec<Conflict> = match row.json("conflicts")? {
        Some(value) => serde_json::from_value(value).map_err(|e| sqlx::Error::Decode(e.into()))?,
        None => Vec::new(),
    };
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.opt_text("key")?,
        state,
        payload: row.raw_json("payload")?.unwrap_or_else(null_json),
        attempts: row.int32("attempts")?,
        claim_id: row.uuid("claim_id")?,
        claimed_by: row.opt_text("claimed_by")?,
        lease_expires_at: row.opt_time("lease_expires_at")?,
        previous_attempt: row
            .opt_text("previous_attempt")?
            .as_deref()
            .map(parse_column)
            .transpose()?,
        available_at: row.opt_time("available_at")?,
        outcome: Outcome::from_state(state),
        reason: row.opt_text("reason")?,
        result: row.raw_json("result")?,
        outcome_attempt: row.opt_int32("outcome_attempt")?,
        terminal_at: row.opt_time("terminal_at")?,
        changed_at: row.time("changed_at")?,
        conflicts,
        conflict_count: row.int("conflict_count")?,
    })
}

/// A child a claim statement leased, with its lease expiry and its parent's queue.
pub(crate) fn claimed_child(row: &impl LedgerRow) -> Result<(ClaimedChild, DateTime<Utc>, QueueName), sqlx::Error> {
    let parent_id = row.text("parent_id")?;
    let sequence = row.int("sequence")?;
    let child = ClaimedChild {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.opt_text("key")?,
        payload: row.raw_json("payload")?.unwrap_or_else(null_json),
        attempt: row.int32("attempts")?,
        previous_attempt: row
            .opt_text("previous_attempt")?
            .as_deref()
            .map(parse_column)
            .transpose()?,
    };
    Ok((
        child,
        row.time("lease_expires_at")?,
        QueueName::from_ledger(row.text("queue")?),
    ))
}

/// Parses a stored enum value, turning a bad one into a decode error.
pub(crate) fn parse_column<T: std::str::FromStr<Err = String>>(value: &str) -> Result<T, sqlx::Error> {
    value.parse().map_err(|e: String| sqlx::Error::Decode(e.into()))
}

/// Children one claim statement leased.
#[derive(Debug, Default)]
pub(crate) struct Leased {
    pub children: Vec<ClaimedChild>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The queue of the parents they came from (a claim draws from one queue).
    pub queue: Option<QueueName>,
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
    /// The parent's largest payload in bytes (`None`: not on record).
    pub child_bytes: Option<i64>,
}

impl Lane {
    pub fn new(parent_id: String, priority: i32, child_bytes: Option<i32>) -> Self {
        Self {
            parent_id: ParentId::from_ledger(parent_id),
            priority,
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
}

impl LaneClaim {
    /// The rows of a lane claim statement shared by `asks`: each ask's
    /// children (by their `claim_id` column), and whether the lane was taken
    /// (a last row with no sequence).
    pub fn from_rows<R: LedgerRow>(asks: &[LaneAsk], rows: &[R]) -> Result<Vec<Self>, sqlx::Error> {
        let mut taken = false;
        let mut children: Vec<Vec<&R>> = vec![Vec::new(); asks.len()];
        for row in rows {
            if row.opt_int("sequence")?.is_none() {
                taken = true;
                continue;
            }
            let claim_id = row.uuid("claim_id")?;
            let ask = asks.iter().position(|a| Some(a.claim_id) == claim_id).unwrap_or(0);
            children[ask].push(row);
        }
        children
            .into_iter()
            .map(|rows| {
                Ok(Self {
                    leased: Leased::from_rows(rows.into_iter().map(claimed_child))?,
                    taken,
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

/// One queue's row of `sql::queue_summaries`.
#[derive(Debug, sqlx::FromRow)]
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
        }
    }
}
