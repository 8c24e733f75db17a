//! One source of the children search: an index read in the search's order
//! (see the module above), what it has read ahead, and what a page has spent.

use std::collections::VecDeque;

use chrono::{DateTime, Utc};

use super::statements::{self, Start};
use super::{CHUNK, KEY_CHUNK, OneParent, ROWS_PER_READ, Reach, SearchKey, Walk};
use crate::ledger::{Child, ChildState, ParentId, QueueName};
use crate::store::rows::LedgerRow;
use crate::store::statement::Statement;
use crate::store::{Store, StoreResult, rows};

/// One index read in the search's order, and what it has read ahead.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) walk: Walk,
    pub(super) reach: Reach,
    /// Where the next read starts: below this position (`None`: the top).
    pub(super) after: Option<SearchKey>,
    /// Whether `after` is a child this source read (not the page's cursor).
    pub(super) after_own: bool,
    pub(super) read: VecDeque<(SearchKey, Child)>,
    pub(super) done: bool,
}

/// What a page has spent, and may.
#[derive(Debug)]
pub(super) struct Spent {
    pub(super) examined: u64,
    pub(super) reads: u64,
    pub(super) max_rows: u64,
}

impl Spent {
    pub(super) fn new(max_rows: u64) -> Self {
        Self {
            examined: 0,
            reads: 0,
            max_rows,
        }
    }

    pub(super) fn exhausted(&self) -> bool {
        self.examined >= self.max_rows || self.reads >= (self.max_rows / ROWS_PER_READ).max(1)
    }
}

pub(super) fn key_of(child: &Child) -> SearchKey {
    (child.changed_at, child.parent_id.clone(), child.sequence)
}

impl Source {
    pub(super) fn new(walk: Walk, reach: Reach, after: Option<SearchKey>) -> Self {
        Self {
            walk,
            reach,
            after,
            after_own: false,
            read: VecDeque::new(),
            done: false,
        }
    }

    /// Whether the source needs a read before its next child is known.
    pub(super) fn starved(&self) -> bool {
        self.read.is_empty() && !self.done
    }

    /// How a read starts, and the bound of a read of one parent (`$1`, `$2`).
    pub(super) fn start_in_parent(&self, parent_id: &ParentId) -> (Start, Option<DateTime<Utc>>, Option<i64>) {
        match &self.after {
            None => (Start::Top, None, None),
            Some((at, _, sequence)) if self.after_own => (Start::Own, Some(*at), Some(*sequence)),
            Some((at, p, sequence)) if p == parent_id => (Start::Below, Some(*at), Some(*sequence)),
            // A position of another parent: this parent's children at the
            // same time lie above it (a smaller parent id comes later) or
            // below it.
            Some((at, p, _)) if parent_id < p => (Start::Below, Some(*at), Some(i64::MAX)),
            Some((at, _, _)) => (Start::Below, Some(*at), Some(-1)),
        }
    }

    /// Reads the next chunk of up to `want` children.
    pub(super) async fn fill(&mut self, store: &Store, want: i64, spent: &mut Spent) -> StoreResult<()> {
        spent.reads += 1;
        if self.walk == Walk::Leased {
            return self.fill_leased(store, want, spent).await;
        }
        match self.reach.clone() {
            Reach::One(parent) => self.fill_one(store, &parent, want, spent).await,
            Reach::All => self.fill_all(store, want, spent).await,
            Reach::Kept { queue, scope } => self.fill_kept(store, queue.as_ref(), scope.as_deref(), spent).await,
        }
    }

    pub(super) fn start(&self) -> Start {
        if self.after.is_some() { Start::Below } else { Start::Top }
    }

    pub(super) fn cursor_binds(&self) -> (Option<DateTime<Utc>>, Option<&str>, Option<i64>) {
        match &self.after {
            Some((at, parent_id, sequence)) => (Some(*at), Some(parent_id.as_str()), Some(*sequence)),
            None => (None, None, None),
        }
    }

    pub(super) async fn fill_one(
        &mut self,
        store: &Store,
        parent: &OneParent,
        want: i64,
        spent: &mut Spent,
    ) -> StoreResult<()> {
        let (start, at, sequence) = self.start_in_parent(&parent.parent_id);
        let sql = match self.walk {
            Walk::Settled(state) => store.sql_of(&statements::SETTLED_OF_PARENT, statements::settled(state, start)),
            Walk::Leased => unreachable!("leases are read by fill_leased"),
            Walk::GivenBack => store.sql_of(&statements::GIVEN_BACK_OF_PARENT, statements::starting(start)),
            Walk::NeverClaimed if parent.in_order => {
                store.sql_of(&statements::NEVER_CLAIMED_IN_ORDER, statements::starting(start))
            }
            Walk::NeverClaimed => store.sql_of(&statements::NEVER_CLAIMED_SORTED, statements::starting(start)),
        };
        let floor = if parent.has_lane { parent.floor } else { Some(0) };
        let rows = store
            .scan(
                Statement::new(sql)
                    .time(at)
                    .int(sequence)
                    .text(parent.parent_id.as_str())
                    .int(want)
                    .int(floor.unwrap_or(i64::MAX)),
            )
            .await?;
        spent.examined += rows.len() as u64;
        self.done = (rows.len() as i64) < want;
        for row in &rows {
            self.after_own = true;
            let Some(child) = self.found(&**row)? else {
                continue;
            };
            let key = key_of(&child);
            self.after = Some(key.clone());
            self.read.push_back((key, child));
        }
        Ok(())
    }

    /// The child a row of this walk holds. A processed walk reads a row
    /// for each key (`statements::PROCESSED_FOUND`): for a child no longer
    /// there the walk only moves past its key, and this is `None`.
    fn found(&mut self, row: &(dyn LedgerRow + Send + Sync)) -> StoreResult<Option<Child>> {
        if self.walk == Walk::Settled(ChildState::Processed) && !row.bool("found")? {
            self.after = Some((
                row.time("key_at")?,
                ParentId::from_ledger(row.text("key_parent")?),
                row.int("key_sequence")?,
            ));
            return Ok(None);
        }
        Ok(Some(rows::child(row)?))
    }

    pub(super) async fn fill_all(&mut self, store: &Store, want: i64, spent: &mut Spent) -> StoreResult<()> {
        let start = self.start();
        let sql = match self.walk {
            Walk::Settled(state) => store.sql_of(&statements::SETTLED_ROWS, statements::settled(state, start)),
            Walk::Leased => unreachable!("leases are read by fill_leased"),
            Walk::NeverClaimed => store.sql_of(&statements::PENDING_ROWS, statements::starting(start)),
            Walk::GivenBack => store.sql_of(&statements::GIVEN_BACK_ROWS, statements::starting(start)),
        };
        let (at, parent_id, sequence) = self.cursor_binds();
        let rows = store
            .scan(Statement::new(sql).time(at).text(parent_id).int(sequence).int(want))
            .await?;
        spent.examined += rows.len() as u64;
        self.done = (rows.len() as i64) < want;
        let passes_leased = self.walk == Walk::NeverClaimed;
        for row in &rows {
            let Some(child) = self.found(&**row)? else {
                continue;
            };
            let key = key_of(&child);
            if passes_leased && row.bool("in_flight")? {
                // The rest of this parent's children of this change are
                // in flight too: go on below all of them.
                self.after = Some((key.0, key.1, 0));
                self.done = false;
                return Ok(());
            }
            self.after = Some(key.clone());
            self.read.push_back((key, child));
        }
        Ok(())
    }

    /// Children leases hold: the leases' lists read in order, keys first,
    /// and the rows of those still in flight (and kept, for a walk that
    /// keeps a queue's or a scope's children).
    pub(super) async fn fill_leased(&mut self, store: &Store, want: i64, spent: &mut Spent) -> StoreResult<()> {
        let statement = match &self.reach {
            Reach::One(parent) => {
                let (start, at, sequence) = self.start_in_parent(&parent.parent_id);
                Statement::new(store.sql_of(&statements::LEASED_OF_PARENT, statements::starting(start)))
                    .time(at)
                    .int(sequence)
                    .text(parent.parent_id.as_str())
                    .int(want)
            }
            Reach::All | Reach::Kept { .. } => {
                let start = statements::starting(self.start());
                let (at, parent_id, sequence) = self.cursor_binds();
                let set = match self.reach {
                    Reach::Kept { .. } => &statements::LEASED_KEPT,
                    _ => &statements::LEASED_ROWS,
                };
                let statement = Statement::new(store.sql_of(set, start))
                    .time(at)
                    .text(parent_id)
                    .int(sequence)
                    .int(want);
                match &self.reach {
                    Reach::Kept { queue, scope } => statement
                        .text(queue.as_ref().map(QueueName::as_str))
                        .text(scope.as_deref()),
                    _ => statement,
                }
            }
        };
        let rows = store.scan(statement).await?;
        spent.examined += rows.len() as u64;
        self.done = (rows.len() as i64) < want;
        for row in &rows {
            let key: SearchKey = (
                row.time("changed_at")?,
                ParentId::from_ledger(row.text("parent_id")?),
                row.int("sequence")?,
            );
            self.after = Some(key.clone());
            self.after_own = true;
            if row.bool("hit")? && row.bool("held")? {
                self.read.push_back((key, rows::child(&**row)?));
            }
        }
        Ok(())
    }

    /// A walk across parents that keeps the children of a queue or scope:
    /// keys first, then the rows of those it keeps.
    pub(super) async fn fill_kept(
        &mut self,
        store: &Store,
        queue: Option<&QueueName>,
        scope: Option<&str>,
        spent: &mut Spent,
    ) -> StoreResult<()> {
        let start = self.start();
        let sql = match self.walk {
            Walk::Settled(state) => store.sql_of(&statements::SETTLED_KEYS, statements::settled(state, start)),
            Walk::Leased => unreachable!("leases are read by fill_leased"),
            Walk::NeverClaimed => store.sql_of(&statements::PENDING_KEYS, statements::starting(start)),
            Walk::GivenBack => store.sql_of(&statements::GIVEN_BACK_KEYS, statements::starting(start)),
        };
        let (at, parent_id, sequence) = self.cursor_binds();
        let rows = store
            .scan(
                Statement::new(sql)
                    .time(at)
                    .text(parent_id)
                    .int(sequence)
                    .int(KEY_CHUNK)
                    .text(queue.map(QueueName::as_str))
                    .text(scope),
            )
            .await?;
        spent.examined += rows.len() as u64;
        self.done = (rows.len() as i64) < KEY_CHUNK;
        let mut kept: Vec<SearchKey> = Vec::new();
        for row in &rows {
            let key: SearchKey = (
                row.time("changed_at")?,
                ParentId::from_ledger(row.text("parent_id")?),
                row.int("sequence")?,
            );
            if row.bool("in_flight")? {
                self.after = Some((key.0, key.1, 0));
                self.done = false;
                break;
            }
            self.after = Some(key.clone());
            if row.bool("hit")? {
                kept.push(key);
            }
        }
        for keys in kept.chunks(CHUNK as usize) {
            let pairs: Vec<(i64, &str)> = keys.iter().map(|(_, p, s)| (*s, p.as_str())).collect();
            let pairs = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned());
            spent.reads += 1;
            let rows = store
                .scan(Statement::new(store.sql(&statements::ROWS_OF_KEYS)).text(pairs.as_str()))
                .await?;
            let mut found: Vec<(SearchKey, Child)> = Vec::with_capacity(rows.len());
            for row in &rows {
                let child = rows::child(&**row)?;
                let key = key_of(&child);
                // A child that moved since its key was read is no longer
                // where the walk found it: it is left out here.
                if child.state == self.walk.state() && keys.contains(&key) {
                    found.push((key, child));
                }
            }
            found.sort_by(|a, b| b.0.cmp(&a.0));
            self.read.extend(found);
        }
        Ok(())
    }
}
