//! Outcome rules: which attempt a write is credited to, why a write lost, and
//! how a batch that names a child twice is recorded.

use std::collections::HashMap;

use uuid::Uuid;

use super::model::{OutcomeStatus, OutcomeWrite};
use super::state::{ChildState, Outcome};

/// The attempt a claim id names on a child: the current attempt for its
/// current claim, the one before for the claim it replaced, none otherwise.
/// Mirrored in SQL by `store::sql::attempt_of`.
pub fn attempt_of(
    attempts: i32,
    claim_id: Option<Uuid>,
    previous_claim_id: Option<Uuid>,
    claim: Option<Uuid>,
) -> Option<i32> {
    match claim {
        Some(claim) if Some(claim) == claim_id => Some(attempts),
        Some(claim) if Some(claim) == previous_claim_id => Some(attempts - 1),
        _ => None,
    }
}

/// How many of a child's losing writes its conflict log keeps (the most
/// recent); `conflict_count` counts them all.
pub const CONFLICTS_KEPT: usize = 20;

/// Outcome fencing: a write that names a claim counts only when that claim
/// holds the child now or held it last (the late-win rule); any other claim
/// id is refused and writes nothing. A write without a claim id passes (who
/// may send one is access control's business). Mirrored in SQL by
/// `store::sql::fence_admits`.
pub fn fence_admits(claim_id: Option<Uuid>, previous_claim_id: Option<Uuid>, claim: Option<Uuid>) -> bool {
    claim.is_none() || attempt_of(0, claim_id, previous_claim_id, claim).is_some()
}

/// The attempt a winning outcome write is credited to. A write without a
/// claim id counts for the current attempt (none if the child was never
/// claimed); a late write by the previous holder counts for its own attempt,
/// below `attempts`. Mirrored in SQL by `store::sql::credited_attempt`.
pub fn credited_attempt(
    attempts: i32,
    claim_id: Option<Uuid>,
    previous_claim_id: Option<Uuid>,
    claim: Option<Uuid>,
) -> Option<i32> {
    match claim {
        None => (attempts > 0).then_some(attempts),
        Some(_) => attempt_of(attempts, claim_id, previous_claim_id, claim),
    }
}

/// Why a write that did not win lost, from what the ledger holds for its
/// child now: whether the parent exists and is decomposed, the child's state,
/// and whether the write's claim id passes the fence. `None`: nothing made it
/// lose any more (its parent was sealed, or its child appended, since the
/// write was tried), so it is tried again.
pub fn losing_status(
    parent_decomposed: Option<bool>,
    state: Option<ChildState>,
    fenced_out: bool,
    outcome: Outcome,
) -> Option<OutcomeStatus> {
    match (parent_decomposed, state) {
        (None, _) | (_, None) => Some(OutcomeStatus::NotFound),
        (Some(false), _) => Some(OutcomeStatus::NotDecomposed),
        _ if fenced_out => Some(OutcomeStatus::ClaimMismatch),
        (Some(true), Some(state)) if !state.is_terminal() => None,
        (Some(true), Some(state)) if state == outcome.state() => Some(OutcomeStatus::Duplicate),
        (Some(true), Some(_)) => Some(OutcomeStatus::Conflict),
    }
}

/// Splits a batch into rounds, each naming a child at most once, in request
/// order. A child named again later in the same batch is a retry of the
/// earlier item: it goes in a later round, where it can only be a `duplicate`
/// or a logged `conflict`, exactly as if it had been sent afterwards.
pub fn rounds(writes: &[OutcomeWrite]) -> Vec<Vec<usize>> {
    let mut seen: HashMap<(&str, i64), usize> = HashMap::with_capacity(writes.len());
    let mut rounds: Vec<Vec<usize>> = vec![Vec::new()];
    for (i, w) in writes.iter().enumerate() {
        let times = seen.entry((w.parent_id.as_str(), w.sequence)).or_insert(0);
        if *times == rounds.len() {
            rounds.push(Vec::new());
        }
        rounds[*times].push(i);
        *times += 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ParentId;

    #[test]
    fn credit_goes_to_the_attempt_that_wrote() {
        let (a, b, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(credited_attempt(0, None, None, None), None);
        assert_eq!(credited_attempt(2, Some(b), Some(a), None), Some(2));
        assert_eq!(credited_attempt(2, Some(b), Some(a), Some(b)), Some(2));
        assert_eq!(credited_attempt(2, Some(b), Some(a), Some(a)), Some(1));
        assert_eq!(credited_attempt(2, Some(b), Some(a), Some(other)), None);
        assert_eq!(attempt_of(2, Some(b), Some(a), None), None);
    }

    #[test]
    fn losers_are_told_why() {
        use OutcomeStatus::*;
        let processed = Some(ChildState::Processed);
        assert_eq!(losing_status(None, None, false, Outcome::Processed), Some(NotFound));
        assert_eq!(
            losing_status(Some(true), None, false, Outcome::Processed),
            Some(NotFound)
        );
        assert_eq!(
            losing_status(Some(false), Some(ChildState::Pending), false, Outcome::Processed),
            Some(NotDecomposed)
        );
        assert_eq!(
            losing_status(Some(true), processed, false, Outcome::Processed),
            Some(Duplicate)
        );
        assert_eq!(
            losing_status(Some(true), processed, false, Outcome::Failed),
            Some(Conflict)
        );
        // A claim that never held the child, or held it two claims ago, is
        // refused before anything else is said about the child.
        for state in [ChildState::Pending, ChildState::InFlight, ChildState::Processed] {
            assert_eq!(
                losing_status(Some(true), Some(state), true, Outcome::Processed),
                Some(ClaimMismatch)
            );
        }
        // Sealed (or appended) since the write was tried: a non-terminal child
        // is no conflict; the write is tried again.
        for open in [ChildState::Pending, ChildState::InFlight, ChildState::Held] {
            assert_eq!(losing_status(Some(true), Some(open), false, Outcome::Failed), None);
        }
    }

    #[test]
    fn the_fence_admits_the_current_and_previous_claim_only() {
        let (current, previous, other) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        assert!(fence_admits(Some(current), Some(previous), None));
        assert!(fence_admits(Some(current), Some(previous), Some(current)));
        assert!(fence_admits(Some(current), Some(previous), Some(previous)));
        assert!(!fence_admits(Some(current), Some(previous), Some(other)));
        assert!(!fence_admits(None, None, Some(other)), "a child never claimed");
    }

    #[test]
    fn repeats_go_to_later_rounds() {
        let write = |p: &str, s: i64| OutcomeWrite {
            parent_id: ParentId::parse(p).unwrap(),
            sequence: s,
            outcome: Outcome::Processed,
            reason: None,
            result: None,
            claim_id: None,
        };
        let writes = [
            write("A", 0),
            write("A", 1),
            write("A", 0),
            write("B", 0),
            write("A", 0),
        ];
        assert_eq!(rounds(&writes), vec![vec![0, 1, 3], vec![2], vec![4]]);
        assert_eq!(rounds(&writes[..2]), vec![vec![0, 1]]);
    }
}
