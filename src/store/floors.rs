//! Claim floors: per parent, the lowest sequence that may still be pending, as
//! this process last saw it. Postgres keeps an index entry for every claimed
//! row version until VACUUM, so a claim that always starts at sequence 0 wades
//! through every child already handed out: quadratic over a big parent. A
//! claim starts at its parent's floor instead and falls back to a full scan
//! when that comes back short, so a lower child that became pending again
//! (released, expired, retried, or claimed by a transaction that rolled back)
//! is still found; floors are also forgotten every second, which bounds how
//! long such a child can wait behind higher ones.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::ledger::ParentId;

/// How long a floor is trusted before the next claim scans from 0 again.
const TRUST: Duration = Duration::from_secs(1);
/// Parents remembered at most; beyond that all floors are forgotten.
const MAX_PARENTS: usize = 10_000;

#[derive(Debug)]
pub struct ClaimFloors {
    inner: Mutex<Floors>,
}

#[derive(Debug)]
struct Floors {
    by_parent: HashMap<ParentId, i64>,
    since: Instant,
}

impl Default for ClaimFloors {
    fn default() -> Self {
        Self {
            inner: Mutex::new(Floors {
                by_parent: HashMap::new(),
                since: Instant::now(),
            }),
        }
    }
}

impl ClaimFloors {
    fn with<T>(&self, f: impl FnOnce(&mut Floors) -> T) -> T {
        let mut floors = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if floors.since.elapsed() > TRUST || floors.by_parent.len() > MAX_PARENTS {
            floors.by_parent.clear();
            floors.since = Instant::now();
        }
        f(&mut floors)
    }

    /// Where a claim on this parent starts scanning.
    pub fn floor(&self, parent_id: &ParentId) -> i64 {
        self.with(|f| f.by_parent.get(parent_id).copied().unwrap_or(0))
    }

    /// A claim handed out sequences starting at `lowest`: nothing below it was
    /// pending and unlocked when it looked.
    pub fn claimed(&self, parent_id: &ParentId, lowest: i64) {
        self.with(|f| f.by_parent.insert(parent_id.clone(), lowest));
    }

    /// Children of this parent may have become pending again.
    pub fn forget(&self, parent_id: &ParentId) {
        self.with(|f| f.by_parent.remove(parent_id));
    }

    /// Children of unknown parents may have become pending again.
    pub fn forget_all(&self) {
        self.with(|f| f.by_parent.clear());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_follow_the_last_claim_until_forgotten() {
        let floors = ClaimFloors::default();
        let p = ParentId::parse("P").unwrap();
        assert_eq!(floors.floor(&p), 0);
        floors.claimed(&p, 100);
        assert_eq!(floors.floor(&p), 100);
        // A full scan that found a lower child moves the floor down again.
        floors.claimed(&p, 50);
        assert_eq!(floors.floor(&p), 50);
        floors.forget(&p);
        assert_eq!(floors.floor(&p), 0);
        floors.claimed(&p, 7);
        floors.forget_all();
        assert_eq!(floors.floor(&p), 0);
    }

    #[test]
    fn floors_expire() {
        let floors = ClaimFloors::default();
        let p = ParentId::parse("P").unwrap();
        floors.claimed(&p, 100);
        floors.with(|f| f.since -= TRUST * 2);
        assert_eq!(floors.floor(&p), 0);
    }
}
