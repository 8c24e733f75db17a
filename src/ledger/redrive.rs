//! Redrive: a new parent registered from another's selected children (their
//! keys and payloads), in the database in one statement, idempotent by the
//! new parent's id.

use sha2::{Digest, Sha256};

use super::{Outcome, ParentId, QueueName};

/// At most this many reasons select children.
pub const MAX_REASONS: usize = 100;

/// What to redrive, and into which new parent.
#[derive(Debug, Clone)]
pub struct Redrive {
    pub from: ParentId,
    pub into: ParentId,
    /// The terminal states selected (at least one, each once).
    pub states: Vec<Outcome>,
    /// Only children whose reason is one of these; `None`: any reason.
    pub reasons: Option<Vec<String>>,
    /// The new parent's queue; `None`: the old parent's.
    pub queue: Option<QueueName>,
    /// The new parent's priority; `None`: the old parent's.
    pub priority: Option<i32>,
}

impl Redrive {
    pub fn selects(&self, outcome: Outcome) -> bool {
        self.states.contains(&outcome)
    }

    /// The new parent's fingerprint: the same redrive again is the same
    /// parent (`200`), anything else under its id a conflict.
    pub fn fingerprint(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"child-ledger/redrive/v1");
        let mut field = |name: &[u8], value: &[u8]| {
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name);
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(value);
        };
        field(b"from", self.from.as_str().as_bytes());
        for outcome in Outcome::ALL {
            if self.selects(outcome) {
                field(b"state", outcome.as_str().as_bytes());
            }
        }
        if let Some(reasons) = &self.reasons {
            let mut sorted = reasons.clone();
            sorted.sort();
            sorted.dedup();
            for reason in &sorted {
                field(b"reason", reason.as_bytes());
            }
        }
        if let Some(queue) = &self.queue {
            field(b"queue", queue.as_str().as_bytes());
        }
        if let Some(priority) = self.priority {
            field(b"priority", &priority.to_le_bytes());
        }
        hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redrive(states: Vec<Outcome>, reasons: Option<Vec<&str>>) -> Redrive {
        Redrive {
            from: ParentId::parse("P-1").unwrap(),
            into: ParentId::parse("P-1-r1").unwrap(),
            states,
            reasons: reasons.map(|r| r.into_iter().map(str::to_owned).collect()),
            queue: None,
            priority: None,
        }
    }

    #[test]
    fn the_fingerprint_is_the_selection_not_its_spelling() {
        let a = redrive(vec![Outcome::Failed, Outcome::Skipped], Some(vec!["b", "a"]));
        let b = redrive(vec![Outcome::Skipped, Outcome::Failed], Some(vec!["a", "b", "a"]));
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(
            a.fingerprint(),
            redrive(vec![Outcome::Failed], Some(vec!["a", "b"])).fingerprint()
        );
        assert_ne!(
            a.fingerprint(),
            redrive(vec![Outcome::Failed, Outcome::Skipped], None).fingerprint()
        );
        let mut other_queue = a.clone();
        other_queue.queue = Some(QueueName::parse("q2").unwrap());
        assert_ne!(a.fingerprint(), other_queue.fingerprint());
    }
}
