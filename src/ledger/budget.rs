//! The byte budget of a response (`--max-response-bytes`): a claim or a page
//! of children holds fewer children rather than exceed it.
//!
//! A claim cannot read its children and then decide: once leased they are
//! the claimer's. So it asks each parent for as many children as fit if each
//! were as large as that parent's largest payload (`child_bytes`, recorded at
//! registration) plus `CLAIMED_CHILD_OVERHEAD` for every other member, and
//! spends what it actually got. A page of children can look before it
//! answers: it reads in small chunks and stops at the first child that would
//! not fit.

use super::{ClaimedChild, NewChild};

/// The largest payload of `children`, in bytes of JSON: recorded on the
/// parent as its `child_bytes`.
pub fn largest_payload(children: &[NewChild]) -> i64 {
    children.iter().map(|c| c.payload.get().len() as i64).max().unwrap_or(0)
}

/// The most a claimed child's members other than `payload` take in JSON:
/// `parent_id` (200 chars), `key` (200 chars, each escaped to at most 6
/// bytes), the idempotency key, attempt, previous attempt and member names.
/// A unit test serializes the largest possible one.
pub const CLAIMED_CHILD_OVERHEAD: u64 = 2048;

/// Room a page's child needs besides its payload and result: its conflict log
/// (20 entries of up to 1,000-character reasons) and other members. The
/// service refuses to start unless a response can hold the largest child.
pub const PAGE_CHILD_ROOM: usize = 256 * 1024;

/// Bytes of the response not taken by children (`claim_id`, `next_after`,
/// brackets).
pub const ENVELOPE: u64 = 256;

/// The length of `value` in JSON, counted without writing it anywhere.
pub fn json_len<T: serde::Serialize>(value: &T) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, nor can serializing a ledger type.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// What is left of one response's byte budget.
#[derive(Debug, Clone, Copy)]
pub struct ByteBudget {
    left: u64,
    /// Counted for a parent whose largest payload is not on record (registered
    /// before it was recorded): the largest payload allowed.
    unknown_child_bytes: u64,
}

impl ByteBudget {
    pub fn new(max_bytes: u64, unknown_child_bytes: u64) -> Self {
        Self {
            left: max_bytes.saturating_sub(ENVELOPE),
            unknown_child_bytes,
        }
    }

    /// How many claimed children of a parent whose largest payload is
    /// `child_bytes` still fit, at most `want`.
    pub fn claimable(&self, child_bytes: Option<i64>, want: i64) -> i64 {
        let each = child_bytes.map_or(self.unknown_child_bytes, |b| b.max(0) as u64) + CLAIMED_CHILD_OVERHEAD;
        want.min((self.left / each) as i64).max(0)
    }

    /// Spends what `children` were counted at (their payload plus the
    /// overhead), which is at most what `claimable` allowed for them.
    pub fn spend_claimed(&mut self, children: &[ClaimedChild]) {
        let spent: u64 = children
            .iter()
            .map(|c| c.payload.get().len() as u64 + CLAIMED_CHILD_OVERHEAD)
            .sum();
        self.left = self.left.saturating_sub(spent);
    }

    /// Takes `bytes` if they fit; `false` (nothing taken) if they do not.
    pub fn take(&mut self, bytes: u64) -> bool {
        match self.left.checked_sub(bytes) {
            Some(left) => {
                self.left = left;
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::value::RawValue;

    use super::*;
    use crate::ledger::{ParentId, PreviousAttempt};

    /// The largest claimed child the ledger can hand out, with a payload of `payload_bytes`.
    fn largest_claimed_child(payload_bytes: usize) -> ClaimedChild {
        let parent_id = "p".repeat(ParentId::MAX_LEN);
        let payload = format!("\"{}\"", "x".repeat(payload_bytes - 2));
        ClaimedChild {
            parent_id: ParentId::parse(&parent_id).unwrap(),
            sequence: i64::MAX,
            // Control characters are escaped to 6 bytes each.
            key: Some("\u{1}".repeat(200)),
            payload: RawValue::from_string(payload).unwrap(),
            attempt: i32::MAX,
            idempotency_key: crate::ledger::idempotency_key(&parent_id, i64::MAX),
            previous_attempt: Some(PreviousAttempt::Expired),
            traceparent: Some(format!("00-{}-{}-01", "a".repeat(32), "b".repeat(16))),
        }
    }

    #[test]
    fn a_claimed_child_takes_at_most_its_payload_plus_the_overhead() {
        let child = largest_claimed_child(1000);
        let bytes = serde_json::to_vec(&child).unwrap().len() as u64;
        assert!(bytes <= 1000 + CLAIMED_CHILD_OVERHEAD, "{bytes}");
    }

    #[test]
    fn claims_ask_for_what_fits_and_spend_what_they_got() {
        let mut budget = ByteBudget::new(10 * 1024 * 1024 + ENVELOPE, 1024 * 1024);
        // 1 MiB payloads: 9 fit in 10 MiB with the overhead, not 10.
        assert_eq!(budget.claimable(Some(1024 * 1024), 1000), 9);
        // Small payloads: the limit asked for.
        assert_eq!(budget.claimable(Some(100), 1000), 1000);
        // Unknown: counted at the largest payload allowed.
        assert_eq!(budget.claimable(None, 1000), 9);
        budget.spend_claimed(&vec![largest_claimed_child(1024 * 1024); 5]);
        assert_eq!(budget.claimable(Some(1024 * 1024), 1000), 4);
        assert_eq!(budget.claimable(Some(1024 * 1024), 2), 2);
    }

    #[test]
    fn json_len_counts_what_serializing_writes() {
        let child = largest_claimed_child(500);
        assert_eq!(json_len(&child), serde_json::to_vec(&child).unwrap().len() as u64);
    }

    #[test]
    fn take_refuses_what_does_not_fit() {
        let mut budget = ByteBudget::new(ENVELOPE + 100, 0);
        assert!(budget.take(60));
        assert!(!budget.take(60));
        assert!(budget.take(40));
        assert!(!budget.take(1));
    }
}
