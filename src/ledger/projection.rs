//! Projection arithmetic: the parent's counters derived from its child rows,
//! and the differences reconcile reports and repairs. When the stored counters
//! and the rows disagree, the rows win.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::verdict::{Tolerance, Verdict};

/// Terminal counts of one parent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Tally {
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
}

impl Tally {
    pub fn terminal(&self) -> i64 {
        self.processed + self.failed + self.skipped
    }

    /// A parent completes when it is decomposed and every child is terminal.
    pub fn is_complete(&self, decomposed: bool) -> bool {
        decomposed && self.terminal() >= self.total
    }
}

/// Open (non-terminal, not pending) counts of one parent. Pending is the
/// rest: `total - terminal - in_flight - held`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Open {
    pub in_flight: i64,
    pub held: i64,
}

/// The projection as stored on the parent row (and, for the open counts,
/// its lane: see migration 0009).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredProjection {
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub in_flight: i64,
    pub held: i64,
    pub completed_at: Option<DateTime<Utc>>,
    /// The verdict these counters give (`null` while open).
    #[serde(default)]
    pub verdict: Option<Verdict>,
}

impl StoredProjection {
    /// With the verdict its counters give under the parent's tolerance.
    pub fn judged(mut self, tolerance: Option<Tolerance>, cancelled: bool) -> Self {
        self.verdict = Verdict::of(
            self.completed_at.is_some(),
            cancelled,
            tolerance,
            self.failed,
            self.total,
        );
        self
    }

    pub fn tally(&self) -> Tally {
        Tally {
            total: self.total,
            processed: self.processed,
            failed: self.failed,
            skipped: self.skipped,
        }
    }
}

/// The projection derived from the child rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DerivedProjection {
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub in_flight: i64,
    pub held: i64,
    pub complete: bool,
    /// The verdict the rows give: `failed` as soon as a decomposed parent's
    /// failed rows are past its tolerance (a repair then ends it as the
    /// outcome that crossed it would have).
    #[serde(default)]
    pub verdict: Option<Verdict>,
}

impl DerivedProjection {
    pub fn from_rows(rows: Tally, open: Open, decomposed: bool) -> Self {
        let complete = rows.is_complete(decomposed);
        Self {
            total: rows.total,
            processed: rows.processed,
            failed: rows.failed,
            skipped: rows.skipped,
            in_flight: open.in_flight,
            held: open.held,
            complete,
            verdict: Verdict::of(complete, false, None, rows.failed, rows.total),
        }
    }

    /// With the verdict the rows give under the parent's tolerance.
    pub fn judged(mut self, tolerance: Option<Tolerance>, cancelled: bool, decomposed: bool) -> Self {
        let crossed = decomposed && tolerance.is_some_and(|t| t.crossed(self.failed, self.total));
        self.verdict = Verdict::of(self.complete || crossed, cancelled, tolerance, self.failed, self.total);
        self
    }

    /// The rows crossed the tolerance but children are still open: the
    /// repair skips them (`parent failed`) and completes the parent.
    pub fn ends_failed(&self) -> bool {
        self.verdict == Some(Verdict::Failed) && !self.complete
    }

    pub fn open(&self) -> Open {
        Open {
            in_flight: self.in_flight,
            held: self.held,
        }
    }

    pub fn tally(&self) -> Tally {
        Tally {
            total: self.total,
            processed: self.processed,
            failed: self.failed,
            skipped: self.skipped,
        }
    }
}

/// One field reconcile changes (or would change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Change {
    /// A counter, `completed_at`, `verdict`, or `reasons` (the failure and
    /// skip reason counts the summary reads).
    pub field: String,
    /// The stored value (a timestamp string or `null` for `completed_at`;
    /// for `reasons`, the `{state, reason, count}` pairs whose kept count
    /// differs from the rows', at most 20).
    pub from: Value,
    /// The derived value; for `completed_at`, `"set"` (to the repair time) or
    /// `null`; for `reasons`, the same pairs counted from the rows.
    pub to: Value,
}

/// What completion mark the derived projection asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionRepair {
    Keep,
    Set,
    Clear,
}

pub fn completion_repair(stored: &StoredProjection, derived: &DerivedProjection) -> CompletionRepair {
    match (stored.completed_at.is_some(), derived.complete) {
        (false, true) => CompletionRepair::Set,
        (true, false) => CompletionRepair::Clear,
        _ => CompletionRepair::Keep,
    }
}

/// The changes that turn the stored projection into the derived one, in a
/// fixed field order.
pub fn diff(stored: &StoredProjection, derived: &DerivedProjection) -> Vec<Change> {
    let counters = [
        ("total", stored.total, derived.total),
        ("processed", stored.processed, derived.processed),
        ("failed", stored.failed, derived.failed),
        ("skipped", stored.skipped, derived.skipped),
        ("in_flight", stored.in_flight, derived.in_flight),
        ("held", stored.held, derived.held),
    ];
    let mut changes: Vec<Change> = counters
        .into_iter()
        .filter(|(_, from, to)| from != to)
        .map(|(field, from, to)| Change {
            field: field.to_owned(),
            from: from.into(),
            to: to.into(),
        })
        .collect();
    let completed_from = || match stored.completed_at {
        Some(at) => Value::String(at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
        None => Value::Null,
    };
    match completion_repair(stored, derived) {
        CompletionRepair::Keep => {}
        CompletionRepair::Set => changes.push(Change {
            field: "completed_at".to_owned(),
            from: completed_from(),
            to: Value::String("set".to_owned()),
        }),
        CompletionRepair::Clear => changes.push(Change {
            field: "completed_at".to_owned(),
            from: completed_from(),
            to: Value::Null,
        }),
    }
    // A completion set or cleared changes the verdict with it (to or from
    // none): only a verdict that differs otherwise is a change of its own.
    if stored.verdict != derived.verdict && completion_repair(stored, derived) == CompletionRepair::Keep {
        let text = |v: Option<Verdict>| v.map_or(Value::Null, |v| Value::String(v.as_str().to_owned()));
        changes.push(Change {
            field: "verdict".to_owned(),
            from: text(stored.verdict),
            to: text(derived.verdict),
        });
    }
    changes
}

/// How many sequences a seal mismatch names at most.
pub const SEAL_REPORT_LIMIT: usize = 100;

/// The sequences missing from `0..total`, given the present sequences below
/// `total` as runs: each `(start, next)` is a present sequence whose successor
/// in the ledger is `next` (`None` for the last one). Runs must be in order and
/// include every present sequence that starts a gap, plus the first and the
/// last present sequence.
pub fn missing_sequences(total: i64, first: Option<i64>, gaps: &[(i64, Option<i64>)]) -> Vec<i64> {
    let mut missing = Vec::new();
    let push_range = |from: i64, to: i64, missing: &mut Vec<i64>| {
        let mut s = from;
        while s < to && missing.len() < SEAL_REPORT_LIMIT {
            missing.push(s);
            s += 1;
        }
    };
    match first {
        None => push_range(0, total, &mut missing),
        Some(first) => {
            push_range(0, first, &mut missing);
            for &(start, next) in gaps {
                push_range(start + 1, next.unwrap_or(total), &mut missing);
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(total: i64, processed: i64, failed: i64, completed: bool) -> StoredProjection {
        StoredProjection {
            total,
            processed,
            failed,
            skipped: 0,
            in_flight: 0,
            held: 0,
            completed_at: completed.then(Utc::now),
            verdict: completed.then_some(Verdict::Succeeded),
        }
    }

    #[test]
    fn reconcile_diff_names_every_drifted_field() {
        let derived = DerivedProjection::from_rows(
            Tally {
                total: 3,
                processed: 2,
                failed: 1,
                skipped: 0,
            },
            Open::default(),
            true,
        );
        assert!(derived.complete);
        let changes = diff(&stored(99, 0, 0, false), &derived);
        let fields: Vec<_> = changes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["total", "processed", "failed", "completed_at"]);
        assert_eq!(changes[0].from, 99);
        assert_eq!(changes[0].to, 3);
        assert_eq!(changes[3].from, Value::Null);
        assert_eq!(changes[3].to, "set");
    }

    #[test]
    fn open_counts_drift_like_the_counters() {
        let derived = DerivedProjection::from_rows(
            Tally {
                total: 3,
                ..Tally::default()
            },
            Open { in_flight: 2, held: 1 },
            true,
        );
        let mut stale = stored(3, 0, 0, false);
        stale.in_flight = 5;
        let changes = diff(&stale, &derived);
        let fields: Vec<_> = changes
            .iter()
            .map(|c| (c.field.as_str(), c.from.clone(), c.to.clone()))
            .collect();
        assert_eq!(
            fields,
            [("in_flight", 5.into(), 2.into()), ("held", 0.into(), 1.into())]
        );
    }

    #[test]
    fn a_verdict_that_differs_on_its_own_is_a_change() {
        let tally = Tally {
            total: 3,
            processed: 1,
            failed: 2,
            skipped: 0,
        };
        let derived =
            DerivedProjection::from_rows(tally, Open::default(), true).judged(Some(Tolerance::Count(1)), false, true);
        assert_eq!(derived.verdict, Some(Verdict::Failed));
        let stored = stored(3, 2, 1, true).judged(Some(Tolerance::Count(1)), false);
        assert_eq!(stored.verdict, Some(Verdict::Succeeded));
        let fields: Vec<_> = diff(&stored, &derived)
            .into_iter()
            .map(|c| (c.field, c.from, c.to))
            .collect();
        assert_eq!(
            fields,
            [
                ("processed".to_owned(), 2.into(), 1.into()),
                ("failed".to_owned(), 1.into(), 2.into()),
                ("verdict".to_owned(), "succeeded".into(), "failed".into())
            ]
        );
        // Open, but past its tolerance: the repair ends it.
        let open = Tally { total: 5, ..tally };
        let derived =
            DerivedProjection::from_rows(open, Open::default(), true).judged(Some(Tolerance::Count(1)), false, true);
        assert!(derived.ends_failed());
    }

    #[test]
    fn premature_completion_is_cleared() {
        let derived = DerivedProjection::from_rows(
            Tally {
                total: 2,
                processed: 1,
                failed: 0,
                skipped: 0,
            },
            Open::default(),
            true,
        );
        assert!(!derived.complete);
        let changes = diff(&stored(2, 1, 0, true), &derived);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].field, "completed_at");
        assert!(changes[0].from.is_string());
        assert_eq!(changes[0].to, Value::Null);
    }

    #[test]
    fn agreeing_projection_has_no_changes() {
        let derived = DerivedProjection::from_rows(
            Tally {
                total: 2,
                processed: 2,
                failed: 0,
                skipped: 0,
            },
            Open::default(),
            true,
        );
        assert!(diff(&stored(2, 2, 0, true), &derived).is_empty());
    }

    #[test]
    fn decomposing_parent_never_completes() {
        assert!(
            !Tally {
                total: 0,
                ..Tally::default()
            }
            .is_complete(false)
        );
        assert!(
            Tally {
                total: 0,
                ..Tally::default()
            }
            .is_complete(true)
        );
        assert!(
            Tally {
                total: 2,
                processed: 1,
                failed: 0,
                skipped: 1
            }
            .is_complete(true)
        );
    }

    #[test]
    fn missing_sequences_from_runs() {
        assert_eq!(missing_sequences(3, None, &[]), [0, 1, 2]);
        // present: 2, 3, 7 with total 9
        assert_eq!(
            missing_sequences(9, Some(2), &[(3, Some(7)), (7, None)]),
            [0, 1, 4, 5, 6, 8]
        );
        // complete run: nothing missing
        assert!(missing_sequences(4, Some(0), &[(3, None)]).is_empty());
        assert_eq!(missing_sequences(1_000_000, None, &[]).len(), SEAL_REPORT_LIMIT);
    }
}
