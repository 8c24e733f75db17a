//! A parent's results and summary: every child's outcome read a chunk at a
//! time along the primary key (the export writes each chunk as it comes,
//! and each chunk is its own statement, so it runs through a transaction
//! pooler too), and the most frequent reasons counted from the rows.

use super::rows::parse_column;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult, sql};
use crate::ledger::results::{ChildResult, ReasonCount, SUMMARY_REASONS, Summary};
use crate::ledger::{ChildState, ParentId};

/// Up to `$4` children of parent `$1` after sequence `$3`, in sequence
/// order, optionally in state `$2` as readers see it, with only what the
/// results show.
static RESULTS: Sql = Sql::new(|d| {
    format!(
        "SELECT c.sequence, c.key, CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END AS state, \
             c.outcome_attempt, c.result, c.reason, c.terminal_at \
         FROM {} \
         WHERE c.parent_id = $1 \
           AND ($2 IS NULL OR (CASE WHEN h.claim_id IS NULL THEN c.state ELSE 'in_flight' END) = $2) \
           AND ($3 IS NULL OR c.sequence > $3) \
         ORDER BY c.sequence LIMIT $4",
        sql::child_view(d)
    )
});

/// The most frequent reasons of parent `$1`'s failed and skipped children.
static REASONS: Sql = Sql::new(|_| {
    format!(
        "SELECT c.state, c.reason, count(*) AS n FROM child c \
         WHERE c.parent_id = $1 AND c.state IN ('failed', 'skipped') \
         GROUP BY c.state, c.reason \
         ORDER BY n DESC, c.state, c.reason IS NULL, c.reason LIMIT {SUMMARY_REASONS}"
    )
});

impl Store {
    /// Up to `limit` of a parent's results after sequence `after` (none: from
    /// the first), in sequence order; fewer than `limit` means the last.
    /// Says nothing of whether the parent exists: ask `require_parent` first.
    pub async fn results_chunk(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        limit: i64,
    ) -> StoreResult<Vec<ChildResult>> {
        let rows = self
            .scan(
                Statement::new(self.sql(&RESULTS))
                    .text(parent_id.as_str())
                    .text(state.map(ChildState::as_str))
                    .int(after)
                    .int(limit),
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(ChildResult {
                    sequence: row.int("sequence")?,
                    key: row.opt_text("key")?,
                    state: parse_column(&row.text("state")?)?,
                    attempt: row.opt_int32("outcome_attempt")?,
                    result: row.raw_json("result")?,
                    reason: row.opt_text("reason")?,
                    finished_at: row.opt_time("terminal_at")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// `ParentNotFound` unless the parent exists (before a stream starts).
    pub async fn parent_exists(&self, parent_id: &ParentId) -> StoreResult<()> {
        self.require_parent(parent_id).await
    }

    /// A parent's counts (its projection) and its most frequent reasons.
    pub async fn summary(&self, parent_id: &ParentId) -> StoreResult<Summary> {
        let parent = self.parent(parent_id, false).await?;
        let rows = self
            .scan(Statement::new(self.sql(&REASONS)).text(parent_id.as_str()))
            .await?;
        let reasons = rows
            .iter()
            .map(|row| {
                Ok(ReasonCount {
                    state: parse_column(&row.text("state")?)?,
                    reason: row.opt_text("reason")?,
                    count: row.int("n")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(Summary {
            parent_id: parent.parent_id,
            counts: parent.counts,
            reasons,
        })
    }
}
