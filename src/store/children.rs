//! Children as readers see them: one child and a parent's pages (the search
//! across parents is `search.rs`). Pages are read a chunk at a time and stop
//! before the response outgrows its byte budget, so a page of large children
//! never sits in memory at once.

use super::rows;
use super::statement::{Sql, Statement};
use super::{Store, StoreError, StoreResult, sql};
use crate::ledger::budget::{ByteBudget, json_len};
use crate::ledger::{Child, ChildState, ParentId};

/// Children read per statement while a page is filled.
const PAGE_CHUNK: i64 = 100;

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
        sql::child_columns(d),
        sql::child_view(d)
    )
});

/// Up to `$4` children of parent `$1` after sequence `$3` (-1: from the
/// first), in sequence order, optionally in state `$2` (as readers see it:
/// an in-flight child's row says `pending`). `$3` is always a bound: a
/// generic plan of `$3 IS NULL OR ...` could not start the primary key's
/// range at it, so a page deep in a large parent scanned it from the first.
/// A state is tested on the row first (`sql::may_be_in`), the leases only
/// for the children that pass.
static CHILDREN: Sql = Sql::new(|d| {
    format!(
        "SELECT {} FROM {} \
         WHERE c.parent_id = $1 AND ($2 IS NULL OR {}) AND ($2 IS NULL OR ({}) = $2) AND c.sequence > $3 \
         ORDER BY c.sequence LIMIT $4",
        sql::child_columns(d),
        sql::child_view(d),
        sql::may_be_in("$2"),
        sql::view_state()
    )
});

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
                        .int(cursor.unwrap_or(-1))
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
}
