//! Child and parent states, and the one-way rules between them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Where one child stands. `processed`, `failed` and `skipped` are terminal:
/// the first terminal write wins and nothing changes it afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ChildState {
    /// Claimable now (or after a release delay).
    Pending,
    /// Handed out under a lease.
    InFlight,
    /// The lease expired under the `hold` policy: the outcome is unknown, so the
    /// child is not handed out again until someone calls `retry`.
    Held,
    Processed,
    Failed,
    Skipped,
}

impl ChildState {
    pub const ALL: [ChildState; 6] = [
        Self::Pending,
        Self::InFlight,
        Self::Held,
        Self::Processed,
        Self::Failed,
        Self::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InFlight => "in_flight",
            Self::Held => "held",
            Self::Processed => "processed",
            Self::Failed => "failed",
            Self::Skipped => "skipped",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Processed | Self::Failed | Self::Skipped)
    }
}

impl fmt::Display for ChildState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ChildState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown child state {s:?}"))
    }
}

/// A terminal outcome a worker (or the registration) records for a child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Processed,
    Failed,
    Skipped,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Self::Processed, Self::Failed, Self::Skipped];

    pub fn as_str(self) -> &'static str {
        self.state().as_str()
    }

    pub fn state(self) -> ChildState {
        match self {
            Self::Processed => ChildState::Processed,
            Self::Failed => ChildState::Failed,
            Self::Skipped => ChildState::Skipped,
        }
    }

    pub fn from_state(state: ChildState) -> Option<Self> {
        match state {
            ChildState::Processed => Some(Self::Processed),
            ChildState::Failed => Some(Self::Failed),
            ChildState::Skipped => Some(Self::Skipped),
            _ => None,
        }
    }
}

/// What happens to a child whose lease ran out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ExpiredLease {
    /// The child becomes claimable again.
    #[default]
    Retry,
    /// The child becomes `held` until an operator calls `retry`.
    Hold,
}

impl ExpiredLease {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Hold => "hold",
        }
    }
}

impl FromStr for ExpiredLease {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "retry" => Ok(Self::Retry),
            "hold" => Ok(Self::Hold),
            other => Err(format!("unknown expired_lease policy {other:?}")),
        }
    }
}

/// How a child's previous attempt ended, as shown to the next claimer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PreviousAttempt {
    /// The last holder gave it back: it did not do the work.
    Released,
    /// The last lease ran out: the earlier attempt may have had its effect.
    Expired,
}

impl FromStr for PreviousAttempt {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "released" => Ok(Self::Released),
            "expired" => Ok(Self::Expired),
            other => Err(format!("unknown previous_attempt {other:?}")),
        }
    }
}

/// A parent's state, derived from its marks, never stored: there is no
/// "failed" parent, so an interrupted parent is always resumable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParentState {
    /// The child list is not complete yet: nothing is claimable.
    Decomposing,
    /// Decomposed, with children still to finish.
    Active,
    /// Every child is terminal.
    Complete,
}

impl ParentState {
    pub fn derive(decomposed: bool, completed: bool) -> Self {
        match (decomposed, completed) {
            (false, _) => Self::Decomposing,
            (true, false) => Self::Active,
            (true, true) => Self::Complete,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decomposing => "decomposing",
            Self::Active => "active",
            Self::Complete => "complete",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_outcomes_are_terminal() {
        let terminal: Vec<_> = ChildState::ALL.into_iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(
            terminal,
            [ChildState::Processed, ChildState::Failed, ChildState::Skipped]
        );
        for state in terminal {
            assert_eq!(Outcome::from_state(state).unwrap().state(), state);
        }
        assert_eq!(Outcome::from_state(ChildState::Held), None);
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for state in ChildState::ALL {
            assert_eq!(state.as_str().parse::<ChildState>(), Ok(state));
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
        assert!("done".parse::<ChildState>().is_err());
    }

    #[test]
    fn parent_state_is_derived() {
        assert_eq!(ParentState::derive(false, false), ParentState::Decomposing);
        assert_eq!(ParentState::derive(false, true), ParentState::Decomposing);
        assert_eq!(ParentState::derive(true, false), ParentState::Active);
        assert_eq!(ParentState::derive(true, true), ParentState::Complete);
    }
}
