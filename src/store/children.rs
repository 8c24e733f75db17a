//! Children as readers see them: one child, a parent's pages, and the search
//! across parents. Pages are read a chunk at a time and stop before the
//! response outgrows its byte budget, so a page of large children never sits
//! in memory at once.

use chrono::{DateTime, Utc};

use super::rows;
use super::statement::{Dialect, Sql, Statement};
use super::{Store, StoreError, StoreResult, sql};
use crate::ledger::budget::{ByteBudget, json_len};
use crate::ledger::{Child, ChildState, ParentId, QueueName, QueueScope};

/// Children read per statement while a page is filled.
const PAGE_CHUNK: i64 = 100;

/// Filters of the cross-parent children search (`GET /v1/children`).
#[derive(Debug, Clone, Default)]
pub struct ChildFilter {
    pub queue: Option<QueueName>,
    pub state: Option<ChildState>,
    pub parent_id: Option<ParentId>,
    /// Only children of these queues (a token's reach).
    pub within: QueueScope,
    /// Children after this one in the search's order (newest change first):
    /// its `changed_at`, parent and sequence.
    pub after: Option<(DateTime<Utc>, ParentId, i64)>,
    pub limit: i64,
}

/// A page of the children search; `next` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ChildSearch {
    pub children: Vec<Child>,
    pub next: Option<(DateTime<Utc>, ParentId, i64)>,
}

/// Which of a parent's children a page holds (`GET /v1/parents/{id}/children`).
#[derive(Debug, Clone, Copy)]
pub struct ChildPageQuery<'a> {
    pub parent_id: &'a ParentId,
    /// Only children in this state, as readers see it.
    pub state: Option<ChildState>,
    /// Children after this sequence.
    pub after: Option<i64>,
    pub limit: i64,
}

/// One page of a parent's children; `next_after` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ChildPage {
    pub children: Vec<Child>,
    pub next_after: Option<i64>,
}

/// One child, by its primary key.
static CHILD_BY_KEY: Sql = Sql::new(|d| {
    format!(
        "SELECT {} FROM {} WHERE c.parent_id = $1 AND c.sequence = $2",
        sql::CHILD_COLUMNS,
        sql::child_view(d)
    )
});

/// Up to `$4` children of parent `$1` after sequence `$3`, in sequence order,
/// optionally in state `$2` (as readers see it: an in-flight child's row
/// says `pending`).
static CHILDREN: Sql = Sql::new(|d| {
    format!(
        "SELECT {} FROM {} \
         WHERE c.parent_id = $1 \
           AND ($2 IS NULL OR (CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END) = $2) \
           AND ($3 IS NULL OR c.sequence > $3) \
         ORDER BY c.sequence LIMIT $4",
        sql::CHILD_COLUMNS,
        sql::child_view(d)
    )
});

/// The children search, newest change first: the statement for one state (or
/// every state, `None`) and the first page or the next ones (`after`). Each
/// state reads its own index in the search's order, so a page costs the
/// same however many children are in that state: pending ones
/// `child_pending_changed` (passing by those a lease holds, whose rows say
/// pending too), in-flight ones their claims' leases (newest claim first),
/// the others `child_attention`. Every state at once (a parent's
/// children, `parent_id` given) merges one such read per state. The state is
/// written into the statement (one of six words) so that Postgres, which
/// plans a statement once per connection, knows the index.
fn search(d: &Dialect, state: Option<ChildState>, after: bool) -> String {
    let within = (d.within)("$3");
    let branch = |state: ChildState| -> String {
        // In-flight children changed when their claim leased them: the
        // lease's time, in the lease's index.
        let (from, changed, in_state) = match state {
            ChildState::InFlight => (
                format!(
                    "claim_lease h {join} JOIN parent p ON p.parent_id = c.parent_id",
                    join = (d.leased_children)("h")
                ),
                "h.claimed_at",
                "true".to_owned(),
            ),
            ChildState::Pending => (
                format!("{} JOIN parent p ON p.parent_id = c.parent_id", sql::child_view(d)),
                "c.changed_at",
                "c.state = 'pending' AND h.claim_id IS NULL".to_owned(),
            ),
            _ => (
                format!("{} JOIN parent p ON p.parent_id = c.parent_id", sql::child_view(d)),
                "c.changed_at",
                format!("c.state = '{}'", state.as_str()),
            ),
        };
        let cursor = if after {
            format!("AND ({changed}, c.parent_id, c.sequence) < ($4, $5, $6)")
        } else {
            // Bound but not needed on the first page.
            "AND ($4 IS NULL OR $5 IS NULL OR $6 IS NULL OR true)".to_owned()
        };
        format!(
            "SELECT * FROM (SELECT {columns} FROM {from} \
             WHERE {in_state} AND ($1 IS NULL OR c.parent_id = $1) AND ($2 IS NULL OR p.queue = $2) \
               AND {within} {cursor} \
             ORDER BY {changed} DESC, c.parent_id DESC, c.sequence DESC LIMIT $7) s",
            columns = sql::CHILD_COLUMNS,
        )
    };
    match state {
        Some(state) => branch(state),
        None => format!(
            "SELECT * FROM ({}) u ORDER BY changed_at DESC, parent_id DESC, sequence DESC LIMIT $7",
            ChildState::ALL
                .into_iter()
                .map(branch)
                .collect::<Vec<_>>()
                .join(" UNION ALL ")
        ),
    }
}

/// `search` for each state (`None` first) and page.
static SEARCH: [[Sql; 2]; 7] = [
    [
        Sql::new(|d| search(d, None, false)),
        Sql::new(|d| search(d, None, true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::Pending), false)),
        Sql::new(|d| search(d, Some(ChildState::Pending), true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::InFlight), false)),
        Sql::new(|d| search(d, Some(ChildState::InFlight), true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::Held), false)),
        Sql::new(|d| search(d, Some(ChildState::Held), true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::Processed), false)),
        Sql::new(|d| search(d, Some(ChildState::Processed), true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::Failed), false)),
        Sql::new(|d| search(d, Some(ChildState::Failed), true)),
    ],
    [
        Sql::new(|d| search(d, Some(ChildState::Skipped), false)),
        Sql::new(|d| search(d, Some(ChildState::Skipped), true)),
    ],
];

fn search_sql(state: Option<ChildState>, after: bool) -> &'static Sql {
    let row = match state {
        None => 0,
        Some(ChildState::Pending) => 1,
        Some(ChildState::InFlight) => 2,
        Some(ChildState::Held) => 3,
        Some(ChildState::Processed) => 4,
        Some(ChildState::Failed) => 5,
        Some(ChildState::Skipped) => 6,
    };
    &SEARCH[row][usize::from(after)]
}

impl Store {
    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Child> {
        let row = self
            .fetch_optional(
                Statement::new(self.sql(&CHILD_BY_KEY))
                    .text(parent_id.as_str())
                    .int(sequence),
            )
            .await?;
        match row {
            Some(row) => Ok(rows::child(&*row)?),
            None => Err(StoreError::ChildNotFound {
                parent_id: parent_id.clone(),
                sequence,
            }),
        }
    }

    /// A page of a parent's children after `after`: up to `limit`, and fewer
    /// when more would not fit in `budget` (`next_after` goes on from there).
    pub async fn children(&self, query: ChildPageQuery<'_>, mut budget: ByteBudget) -> StoreResult<ChildPage> {
        let ChildPageQuery {
            parent_id,
            state,
            after,
            limit,
        } = query;
        let mut children: Vec<Child> = Vec::new();
        let mut cursor = after;
        loop {
            let want = (limit - children.len() as i64).min(PAGE_CHUNK);
            // One row past the chunk says whether more follow.
            let rows = self
                .scan(
                    Statement::new(self.sql(&CHILDREN))
                        .text(parent_id.as_str())
                        .text(state.map(ChildState::as_str))
                        .int(cursor)
                        .int(want + 1),
                )
                .await?;
            let more = rows.len() as i64 > want;
            for row in rows.iter().take(want as usize) {
                let child = rows::child(&**row)?;
                // The first child always goes: `Limits::check` makes room for the largest.
                // (+1: the comma before it.)
                if !budget.take(json_len(&child) + 1) && !children.is_empty() {
                    let next_after = children.last().map(|c| c.sequence);
                    return Ok(ChildPage { children, next_after });
                }
                children.push(child);
            }
            cursor = children.last().map(|c| c.sequence);
            if !more || children.len() as i64 >= limit {
                if children.is_empty() {
                    self.require_parent(parent_id).await?;
                }
                return Ok(ChildPage {
                    next_after: cursor.filter(|_| more),
                    children,
                });
            }
        }
    }

    /// A page of children across parents, newest change first (see
    /// `ChildFilter`), read like a parent's pages. `next` is the last child's
    /// key when more may follow.
    pub async fn search_children(&self, mut filter: ChildFilter, mut budget: ByteBudget) -> StoreResult<ChildSearch> {
        let limit = filter.limit;
        let scope = filter.within.as_json();
        let mut children: Vec<Child> = Vec::new();
        let key = |c: &Child| (c.changed_at, c.parent_id.clone(), c.sequence);
        loop {
            let want = (limit - children.len() as i64).min(PAGE_CHUNK);
            let (after_time, after_parent, after_sequence) = match &filter.after {
                Some((time, parent_id, sequence)) => (Some(*time), Some(parent_id.as_str()), Some(*sequence)),
                None => (None, None, None),
            };
            let rows = self
                .scan(
                    Statement::new(self.sql(search_sql(filter.state, filter.after.is_some())))
                        .text(filter.parent_id.as_ref().map(ParentId::as_str))
                        .text(filter.queue.as_ref().map(QueueName::as_str))
                        .text(scope.as_deref())
                        .time(after_time)
                        .text(after_parent)
                        .int(after_sequence)
                        .int(want + 1),
                )
                .await?;
            let more = rows.len() as i64 > want;
            for row in rows.iter().take(want as usize) {
                let child = rows::child(&**row)?;
                if !budget.take(json_len(&child) + 1) && !children.is_empty() {
                    let next = children.last().map(key);
                    return Ok(ChildSearch { children, next });
                }
                children.push(child);
            }
            filter.after = children.last().map(key);
            if !more || children.len() as i64 >= limit {
                return Ok(ChildSearch {
                    next: filter.after.filter(|_| more),
                    children,
                });
            }
        }
    }
}
