//! Turns for long-lived answers (event streams, results exports): at most
//! so many at once in this process, at most a share of them for any one
//! token, and a few kept for admins once every other is taken, so one
//! tenant's readers cannot take every turn and an operator can always look.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Turns kept for admins beyond the process's own.
pub const ADMIN_TURNS: usize = 4;

/// The turns of one kind of answer.
#[derive(Debug)]
pub struct Turns {
    open: Arc<Semaphore>,
    max: usize,
    reserve: Arc<Semaphore>,
    /// Turns each token holds now, by its name: at most `per_token` each.
    holders: Arc<Mutex<HashMap<String, usize>>>,
    per_token: usize,
}

/// A turn, held while the answer is open; dropping it gives it back.
#[derive(Debug)]
pub struct Turn {
    _permit: Option<OwnedSemaphorePermit>,
    holders: Arc<Mutex<HashMap<String, usize>>>,
    holder: Option<String>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(held) = holders.get_mut(&holder) {
                *held -= 1;
                if *held == 0 {
                    holders.remove(&holder);
                }
            }
        }
    }
}

/// Why there was no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoTurn {
    /// Every turn of this process is taken.
    Process(usize),
    /// The token holds its share.
    Token(usize),
}

impl Turns {
    pub fn new(max: usize, per_token: usize) -> Self {
        Self {
            open: Arc::new(Semaphore::new(max)),
            max,
            reserve: Arc::new(Semaphore::new(ADMIN_TURNS)),
            holders: Arc::default(),
            per_token: per_token.max(1),
        }
    }

    /// A turn for `holder` (a token's name; `None` on a service without
    /// tokens, where every caller is the same one): refused when the token
    /// holds its share, or when every turn of the process is taken, unless
    /// `admin` and one kept for admins is free.
    pub fn admit(&self, holder: Option<&str>, admin: bool) -> Result<Turn, NoTurn> {
        let mut turn = Turn {
            _permit: None,
            holders: Arc::clone(&self.holders),
            holder: None,
        };
        if let Some(holder) = holder {
            let mut holders = self.holders.lock().unwrap_or_else(|e| e.into_inner());
            let held = holders.entry(holder.to_owned()).or_default();
            if *held >= self.per_token {
                return Err(NoTurn::Token(self.per_token));
            }
            *held += 1;
            turn.holder = Some(holder.to_owned());
        }
        let permit = Arc::clone(&self.open)
            .try_acquire_owned()
            .or_else(|_| match admin {
                true => Arc::clone(&self.reserve).try_acquire_owned(),
                false => Err(TryAcquireError::NoPermits),
            })
            .map_err(|_| NoTurn::Process(self.max))?;
        turn._permit = Some(permit);
        Ok(turn)
    }

    pub fn max(&self) -> usize {
        self.max
    }

    /// Turns held now.
    pub fn open(&self) -> usize {
        self.max - self.open.available_permits() + ADMIN_TURNS - self.reserve.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_holds_its_share_and_an_admin_one_more() {
        let turns = Turns::new(3, 2);
        let a1 = turns.admit(Some("a"), false).unwrap();
        let _a2 = turns.admit(Some("a"), false).unwrap();
        assert_eq!(turns.admit(Some("a"), false).unwrap_err(), NoTurn::Token(2));
        let _b = turns.admit(Some("b"), false).unwrap();
        assert_eq!(turns.admit(Some("c"), false).unwrap_err(), NoTurn::Process(3));
        let _ops = turns.admit(Some("ops"), true).unwrap();
        assert_eq!(turns.open(), 4);
        drop(a1);
        let _a3 = turns.admit(Some("a"), false).unwrap();
        // Without tokens there is no share: only the process's turns.
        let open = Turns::new(2, 1);
        let _x = open.admit(None, false).unwrap();
        let _y = open.admit(None, false).unwrap();
        assert_eq!(open.admit(None, false).unwrap_err(), NoTurn::Process(2));
    }
}
