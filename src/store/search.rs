//! The children search across parents (`GET /v1/children`), newest change
//! first: a merge of sources, each an index read in that order.
//!
//! - **Failed, skipped and held children**: all parents through
//!   `child_attention` (state, then newest change), one parent through
//!   `child_settled_by_parent`.
//! - **Processed children**: the outcome batches that made them
//!   (`processed_batch`, a row per outcome statement and parent, newest
//!   first across parents or of one), each unpacked into its children, as
//!   the leases are: most outcomes are processed, and per-child entries
//!   for them were a fifth of the database's work per child.
//! - **In flight**: the leases, newest claim first (a child a lease holds
//!   shows the claim's time), of all parents or of one.
//! - **Pending**: the never-claimed children and the given-back ones
//!   (released, or their lease ran out: they have an `available_at`), each
//!   read apart. Across parents the never-claimed ones are read with the
//!   children leases hold, whose rows say pending too: where the read meets
//!   one, it jumps past the rest of that parent's children of the same
//!   change, which lie below the lane's floor too and so are all in flight.
//!   Of one parent, they are the rows from its lane's floor up.
//!
//! A queue, or a token limited to some queues, is read parent by parent
//! when it has few parents, or few whose projections have children in the
//! state (a drifted projection is repaired by reconcile); otherwise the walk
//! across parents keeps the children of the queue and scope it passes,
//! reading keys first.
//!
//! Every page is bounded: once it has examined `max_rows` rows (or run a
//! statement for every `ROWS_PER_READ` of them) it ends, with the children
//! found so far (maybe none) and a cursor to go on from, so no query string
//! can make a page scan a million rows.

mod source;
mod statements;

use chrono::{DateTime, Utc};

use super::statement::Statement;
use super::{Store, StoreResult};
use crate::ledger::budget::{ByteBudget, json_len};
use crate::ledger::{Child, ChildState, ParentId, QueueName, QueueScope};
use source::{Source, Spent, key_of};
use statements::By;

/// A position in the search's order: `changed_at` as the search shows it
/// (a leased child's claim time), the parent and the sequence.
pub type SearchKey = (DateTime<Utc>, ParentId, i64);

/// Filters of the cross-parent children search (`GET /v1/children`).
#[derive(Debug, Clone, Default)]
pub struct ChildFilter {
    pub queue: Option<QueueName>,
    pub state: Option<ChildState>,
    pub parent_id: Option<ParentId>,
    /// Only children of these queues (a token's reach).
    pub within: QueueScope,
    /// Children after this one in the search's order (newest change first).
    pub after: Option<SearchKey>,
    pub limit: i64,
    /// Most rows the page examines before it ends early.
    pub max_rows: u64,
}

/// A page of the children search; `next` is set when more may follow (the
/// page may then hold fewer children than asked for, even none).
#[derive(Debug, Clone)]
pub struct ChildSearch {
    pub children: Vec<Child>,
    pub next: Option<SearchKey>,
}

/// Whole rows per read.
const CHUNK: i64 = 100;
/// Keys per read of a walk that keeps only a queue's or a scope's children.
const KEY_CHUNK: i64 = 1000;
/// Rows a page examines for each statement it may run (past its first
/// reads): what bounds the statements of a page that ends early.
const ROWS_PER_READ: u64 = 160;
/// Parents read one by one at most; past that, a walk across parents.
const ONE_BY_ONE: i64 = 32;

/// What a source reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Walk {
    /// Terminal or held children of a state.
    Settled(ChildState),
    /// Children leases hold.
    Leased,
    /// Pending children without an `available_at` (across parents: leased
    /// ones are passed over; of a parent: from its lane's floor up).
    NeverClaimed,
    /// Given-back children.
    GivenBack,
}

impl Walk {
    /// The state the children it finds are in, as readers see it.
    fn state(self) -> ChildState {
        match self {
            Self::Settled(state) => state,
            Self::Leased => ChildState::InFlight,
            Self::NeverClaimed | Self::GivenBack => ChildState::Pending,
        }
    }

    /// The walks that find children of `state`.
    fn of(state: ChildState) -> &'static [Walk] {
        match state {
            ChildState::Pending => &[Walk::NeverClaimed, Walk::GivenBack],
            ChildState::InFlight => &[Walk::Leased],
            ChildState::Processed => &[Walk::Settled(ChildState::Processed)],
            ChildState::Failed => &[Walk::Settled(ChildState::Failed)],
            ChildState::Skipped => &[Walk::Settled(ChildState::Skipped)],
            ChildState::Held => &[Walk::Settled(ChildState::Held)],
        }
    }
}

/// One parent a source reads, as `CANDIDATES` found it.
#[derive(Debug, Clone)]
struct OneParent {
    parent_id: ParentId,
    /// Its lane's floor; `None` with a lane: nothing never-claimed left.
    floor: Option<i64>,
    has_lane: bool,
    in_order: bool,
}

/// Which parents a source reads.
#[derive(Debug, Clone)]
enum Reach {
    /// Every parent.
    All,
    /// Every parent, keeping the children of a queue (if any) in a scope.
    Kept {
        queue: Option<QueueName>,
        scope: Option<String>,
    },
    One(OneParent),
}

impl Store {
    /// A page of children across parents, newest change first (see the
    /// module's comment and `ChildFilter`). `next` says where the next page
    /// starts when more may follow.
    pub async fn search_children(&self, filter: ChildFilter, mut budget: ByteBudget) -> StoreResult<ChildSearch> {
        let mut sources = self.search_sources(&filter).await?;
        let mut spent = Spent::new(filter.max_rows);
        let mut children: Vec<Child> = Vec::new();
        let limit = filter.limit;
        // Every source reads once, whatever the page has spent, so that the
        // cursor of a page that ends early is a position they all passed.
        let share = (limit / sources.len().max(1) as i64 + 1).clamp(10, CHUNK);
        for source in &mut sources {
            source.fill(self, share, &mut spent).await?;
        }
        loop {
            if children.len() as i64 >= limit {
                let more = sources.iter().any(|s| !s.done || !s.read.is_empty());
                return Ok(ChildSearch {
                    next: children.last().map(key_of).filter(|_| more),
                    children,
                });
            }
            // The next child is the newest one read ahead, once no source
            // that has none read ahead could hold a newer one.
            let newest = sources
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.read.front().map(|(key, _)| (i, key)))
                .max_by(|a, b| a.1.cmp(b.1));
            let blocked_by = sources.iter().position(|s| {
                s.starved()
                    && match (newest, &s.after) {
                        (Some((_, key)), Some(after)) => key < after,
                        _ => true,
                    }
            });
            let newest = newest.map(|(i, _)| i);
            if let Some(s) = blocked_by {
                if spent.exhausted() {
                    // The page ends early: everything above the position
                    // every source has passed has been shown.
                    let passed = sources
                        .iter()
                        .filter(|s| s.starved())
                        .filter_map(|s| s.after.clone())
                        .max();
                    let next = children.last().map(key_of).or(passed);
                    return Ok(ChildSearch { children, next });
                }
                let want = (limit - children.len() as i64 + 1).min(CHUNK);
                sources[s].fill(self, want, &mut spent).await?;
                continue;
            }
            let Some(n) = newest else {
                return Ok(ChildSearch { children, next: None });
            };
            let (_, child) = sources[n].read.pop_front().expect("a child read ahead");
            // The first child always goes: `Limits::check` makes room for the largest.
            // (+1: the comma before it.)
            if !budget.take(json_len(&child) + 1) && !children.is_empty() {
                let next = children.last().map(key_of);
                return Ok(ChildSearch { children, next });
            }
            children.push(child);
        }
    }

    /// The sources a search reads (see the module's comment).
    async fn search_sources(&self, filter: &ChildFilter) -> StoreResult<Vec<Source>> {
        let states: &[ChildState] = match &filter.state {
            Some(state) => std::slice::from_ref(state),
            None => &ChildState::ALL,
        };
        let scope = filter.within.as_json();
        let after = filter.after.clone();
        let across = |reach: Reach| -> Vec<Source> {
            states
                .iter()
                .flat_map(|state| Walk::of(*state))
                .map(|walk| Source::new(*walk, reach.clone(), after.clone()))
                .collect()
        };
        let by = match (&filter.parent_id, &filter.queue) {
            (Some(_), _) => By::Parent,
            (None, Some(_)) => By::Queue,
            (None, None) if scope.is_some() => By::Scope,
            (None, None) => return Ok(across(Reach::All)),
        };
        let mut parents = self.search_candidates(filter, by, None, scope.as_deref()).await?;
        if parents.len() as i64 > ONE_BY_ONE {
            // Many parents: those whose projections have children in the
            // state, if few (a drifted projection is repaired by reconcile).
            parents = match filter.state {
                Some(state) => {
                    self.search_candidates(filter, by, Some(state), scope.as_deref())
                        .await?
                }
                None => parents,
            };
            if parents.len() as i64 > ONE_BY_ONE {
                return Ok(across(Reach::Kept {
                    queue: filter.queue.clone(),
                    scope,
                }));
            }
        }
        let mut sources = Vec::new();
        for parent in parents {
            for state in states {
                for walk in Walk::of(*state) {
                    let reads = match walk {
                        Walk::Leased | Walk::GivenBack => parent.has_lane,
                        Walk::NeverClaimed => !parent.has_lane || parent.floor.is_some(),
                        Walk::Settled(_) => true,
                    };
                    if reads {
                        sources.push(Source::new(*walk, Reach::One(parent.clone()), after.clone()));
                    }
                }
            }
        }
        Ok(sources)
    }

    /// The parents a filtered search reads (at most `ONE_BY_ONE` + 1).
    async fn search_candidates(
        &self,
        filter: &ChildFilter,
        by: By,
        having: Option<ChildState>,
        scope: Option<&str>,
    ) -> StoreResult<Vec<OneParent>> {
        let sql = self.sql_of(&statements::CANDIDATES, statements::candidates_of(by, having));
        let rows = self
            .scan(
                Statement::new(sql)
                    .text(filter.parent_id.as_ref().map(ParentId::as_str))
                    .text(filter.queue.as_ref().map(QueueName::as_str))
                    .text(scope)
                    .int(ONE_BY_ONE + 1),
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(OneParent {
                    parent_id: ParentId::from_ledger(row.text("parent_id")?),
                    floor: row.opt_int("floor")?,
                    has_lane: row.bool("has_lane")?,
                    in_order: row.bool("children_in_order")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }
}
