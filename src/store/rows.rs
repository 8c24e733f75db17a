//! What the store reads back besides ledger records: rows both backends
//! decode the same way, and the small reports its statements return.

use chrono::{DateTime, Utc};

use crate::ledger::projection::Tally;
use crate::ledger::{ChildState, ClaimedChild, ParentId, QueueName};

/// Parses a stored enum value, turning a bad one into a decode error.
pub(crate) fn parse_column<T: std::str::FromStr<Err = String>>(value: &str) -> Result<T, sqlx::Error> {
    value.parse().map_err(|e: String| sqlx::Error::Decode(e.into()))
}

/// What a registration's insert found.
#[derive(Debug)]
pub(crate) enum Inserted {
    /// Written; `completed` when every child was skipped on a decomposed parent.
    Created { completed: bool },
    /// The id is taken, by a registration with this fingerprint; nothing written.
    Taken { fingerprint: Option<String> },
}

/// Children one claim statement leased.
#[derive(Debug, Default)]
pub(crate) struct Leased {
    pub children: Vec<ClaimedChild>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The queue of the parents they came from (a claim draws from one queue).
    pub queue: Option<QueueName>,
}

/// What one outcome statement did: the writes that won, and the parents that
/// those writes completed.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    pub won: Vec<(ParentId, i64)>,
    pub completed: Vec<ParentId>,
}

/// What the ledger holds for a losing write's child: whether its parent exists
/// and is decomposed, and the child's state.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LoserFacts {
    pub parent_decomposed: Option<bool>,
    pub state: Option<ChildState>,
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
        stored != derived || self.completed != derived.is_complete(self.decomposed)
    }
}

/// A page of the drift scan: how many parents were compared, the ids whose
/// stored projection disagrees with their rows, and where the next page
/// starts (`None` after the last).
#[derive(Debug, Default)]
pub(crate) struct DriftPage {
    pub checked: u64,
    pub drifted: Vec<ParentId>,
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
                .map(|r| ParentId::from_ledger(r.parent_id))
                .collect(),
            next,
        }
    }
}
