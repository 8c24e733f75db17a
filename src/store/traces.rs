//! Trace context kept with a registration (migration 0015 on Postgres,
//! 0014 on SQLite): the parent's `traceparent` (sequence -1) and each
//! child's that was given one, written with the registration or append, read
//! back for every claimed child, deleted with the parent.

use std::collections::HashMap;

use super::backend::Transaction;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult, WRITE_CHUNK};
use crate::ledger::{ClaimedChild, NewChild, ParentId};

/// The sequence under which a parent's own trace context is kept.
const PARENT: i64 = -1;

/// Writes `$2`, a JSON array of `[sequence, traceparent]`, for parent `$1`;
/// what is already kept stays (an append's retried page).
static KEEP: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO trace_context (parent_id, sequence, traceparent) SELECT $1, x.n, x.t FROM ({}) AS x WHERE true \
         ON CONFLICT (parent_id, sequence) DO NOTHING",
        (d.json_pairs)("$2")
    )
});

/// A parent's own trace context, and whether any child has one.
const OF_PARENT: &str = "SELECT (SELECT traceparent FROM trace_context WHERE parent_id = $1 AND sequence = -1) \
        AS traceparent, \
    EXISTS (SELECT 1 FROM trace_context WHERE parent_id = $1 AND sequence >= 0) AS children";

/// The children's trace contexts of parent `$1` from sequence `$2` to `$3`.
const OF_CHILDREN: &str = "SELECT sequence, traceparent FROM trace_context \
    WHERE parent_id = $1 AND sequence BETWEEN $2 AND $3";

/// What is kept of a parent: its own, and whether children have their own.
#[derive(Debug, Clone, Default)]
pub(super) struct ParentTrace {
    parent: Option<String>,
    children: bool,
}

/// Keeps the trace contexts of a registration (`parent`) or append (`None`)
/// in its transaction: one statement per chunk of children that have one.
pub(super) async fn keep(
    tx: &mut dyn Transaction,
    store: &Store,
    parent_id: &ParentId,
    parent: Option<&str>,
    children: &[NewChild],
) -> StoreResult<()> {
    let mut pairs: Vec<(i64, &str)> = Vec::new();
    if let Some(parent) = parent {
        pairs.push((PARENT, parent));
    }
    pairs.extend(
        children
            .iter()
            .filter_map(|c| c.traceparent.as_deref().map(|t| (c.sequence, t))),
    );
    for chunk in pairs.chunks(WRITE_CHUNK) {
        let json = serde_json::to_string(chunk).expect("pairs serialize");
        tx.execute(
            Statement::new(store.sql(&KEEP))
                .text(parent_id.as_str())
                .text(json.as_str()),
        )
        .await?;
    }
    Ok(())
}

impl Store {
    /// What is kept of a parent's trace context, read once per process
    /// (a decomposed parent's no longer changes).
    async fn parent_trace(&self, parent_id: &ParentId) -> StoreResult<ParentTrace> {
        if let Some(known) = self.traces.lock().unwrap_or_else(|p| p.into_inner()).get(parent_id) {
            return Ok(known.clone());
        }
        let trace = match self
            .fetch_optional(Statement::new(OF_PARENT).text(parent_id.as_str()))
            .await?
        {
            Some(row) => ParentTrace {
                parent: row.opt_text("traceparent")?,
                children: row.bool("children")?,
            },
            None => ParentTrace::default(),
        };
        let mut cache = self.traces.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= 100_000 {
            cache.clear();
        }
        cache.insert(parent_id.clone(), trace.clone());
        Ok(trace)
    }

    /// Gives each claimed child the trace context kept for it: its own, or
    /// its parent's.
    pub(super) async fn trace_claimed(&self, children: &mut [ClaimedChild]) -> StoreResult<()> {
        let mut start = 0;
        // Children come sorted by parent: one parent's run at a time.
        while start < children.len() {
            let parent_id = children[start].parent_id.clone();
            let end = start
                + children[start..]
                    .iter()
                    .take_while(|c| c.parent_id == parent_id)
                    .count();
            let run = &mut children[start..end];
            let trace = self.parent_trace(&parent_id).await?;
            let mut own = HashMap::new();
            if trace.children {
                let first = run.iter().map(|c| c.sequence).min().unwrap_or(0);
                let last = run.iter().map(|c| c.sequence).max().unwrap_or(0);
                let rows = self
                    .db
                    .fetch(
                        Statement::new(OF_CHILDREN)
                            .text(parent_id.as_str())
                            .int(first)
                            .int(last),
                    )
                    .await?;
                for row in rows {
                    own.insert(row.int("sequence")?, row.text("traceparent")?);
                }
            }
            for child in run {
                child.traceparent = own.remove(&child.sequence).or_else(|| trace.parent.clone());
            }
            start = end;
        }
        Ok(())
    }

    /// Forgets what this process knew of a deleted parent's trace context.
    pub(super) fn forget_trace(&self, parent_id: &ParentId) {
        self.traces.lock().unwrap_or_else(|p| p.into_inner()).remove(parent_id);
    }
}
