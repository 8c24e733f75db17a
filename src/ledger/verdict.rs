//! A parent's verdict: whether its fan-out worked. The rule is here once;
//! `store/sql.rs` mirrors `Tolerance::crossed` for the statements that end
//! a parent whose failures crossed it, and is tested against it.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// How many failed children a parent tolerates before it fails: a count, or
/// a percentage of its `total`. Without one, a parent that completes has
/// succeeded, whatever failed (`{"count": 0}` fails it at the first).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Tolerance {
    /// At most this many failed children (0 or more).
    Count(i64),
    /// At most this percentage of `total` failed (0-100).
    Percent(f64),
}

impl Tolerance {
    /// Whether `failed` children of `total` are more than it tolerates.
    pub fn crossed(self, failed: i64, total: i64) -> bool {
        match self {
            Self::Count(count) => failed > count,
            Self::Percent(percent) => failed as f64 * 100.0 > percent * total as f64,
        }
    }

    /// Its stored columns: `(count, percent)`, one of them set.
    pub fn columns(tolerance: Option<Self>) -> (Option<i64>, Option<f64>) {
        match tolerance {
            None => (None, None),
            Some(Self::Count(count)) => (Some(count), None),
            Some(Self::Percent(percent)) => (None, Some(percent)),
        }
    }

    /// From its stored columns.
    pub fn from_columns(count: Option<i64>, percent: Option<f64>) -> Option<Self> {
        match (count, percent) {
            (Some(count), _) => Some(Self::Count(count)),
            (None, Some(percent)) => Some(Self::Percent(percent)),
            (None, None) => None,
        }
    }
}

/// How a completed parent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No more failures than it tolerates (or no tolerance set).
    Succeeded,
    /// Its failures crossed its tolerance: the outcome that crossed it
    /// skipped every open child (`parent failed`) and completed it.
    Failed,
    /// Cancelled before it completed.
    Cancelled,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The verdict of a parent: none while it is open; `cancelled` when a
    /// cancel completed it; `failed` when its failures are past its
    /// tolerance; `succeeded` otherwise.
    pub fn of(completed: bool, cancelled: bool, tolerance: Option<Tolerance>, failed: i64, total: i64) -> Option<Self> {
        if !completed {
            None
        } else if cancelled {
            Some(Self::Cancelled)
        } else if tolerance.is_some_and(|t| t.crossed(failed, total)) {
            Some(Self::Failed)
        } else {
            Some(Self::Succeeded)
        }
    }
}

/// The reason every open child of a failed parent is skipped with.
pub const PARENT_FAILED: &str = "parent failed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_tolerates_up_to_itself() {
        assert!(!Tolerance::Count(2).crossed(2, 10));
        assert!(Tolerance::Count(2).crossed(3, 10));
        assert!(Tolerance::Count(0).crossed(1, 10));
        assert!(!Tolerance::Count(0).crossed(0, 10));
    }

    #[test]
    fn a_percent_is_of_the_total() {
        assert!(!Tolerance::Percent(10.0).crossed(10, 100));
        assert!(Tolerance::Percent(10.0).crossed(11, 100));
        assert!(Tolerance::Percent(0.0).crossed(1, 100));
        assert!(!Tolerance::Percent(100.0).crossed(100, 100));
        assert!(Tolerance::Percent(2.5).crossed(1, 39));
        assert!(!Tolerance::Percent(2.5).crossed(1, 40));
    }

    #[test]
    fn the_verdict_follows_completion_cancel_and_tolerance() {
        let some = Some(Tolerance::Count(1));
        assert_eq!(Verdict::of(false, false, some, 5, 10), None);
        assert_eq!(Verdict::of(true, true, some, 5, 10), Some(Verdict::Cancelled));
        assert_eq!(Verdict::of(true, false, some, 2, 10), Some(Verdict::Failed));
        assert_eq!(Verdict::of(true, false, some, 1, 10), Some(Verdict::Succeeded));
        assert_eq!(Verdict::of(true, false, None, 10, 10), Some(Verdict::Succeeded));
    }

    #[test]
    fn columns_round_trip() {
        for t in [None, Some(Tolerance::Count(3)), Some(Tolerance::Percent(2.5))] {
            let (count, percent) = Tolerance::columns(t);
            assert_eq!(Tolerance::from_columns(count, percent), t);
        }
    }
}
