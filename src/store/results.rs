//! A parent's results and summary: every child's outcome read a chunk at a
//! time along the primary key (the export writes each chunk as it comes,
//! and each chunk is its own statement, so it runs through a transaction
//! pooler too), and the most frequent reasons from the counts kept beside
//! the rows (`child_reason`), which reconcile reads and rewrites here too.

use super::backend::{Row, Transaction};
use super::rows::parse_column;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult, sql};
use crate::ledger::results::{ChildResult, ReasonCount, SUMMARY_REASONS, Summary};
use crate::ledger::{ChildState, ParentId};

/// Children of parent `$1` after sequence `$3` (-1: from the first), in
/// sequence order, optionally in state `$2` as readers see it, with only
/// what the results show: of the first `$4`, those that start within `$5`
/// bytes of result and reason (so at least one), and how many of `$4` there
/// were (`read`). A chunk is bounded in bytes, whatever its results weigh:
/// the sizes are read first, without the values (`sized`, summed above its
/// `LIMIT`), and only the rows taken are read whole. `$3` is always a
/// bound, never `$3 IS NULL OR ...`: a generic plan could not start the
/// primary key's range at it, and each chunk would scan the parent from its
/// first child.
static RESULTS: Sql = Sql::new(|d| {
    format!(
        "WITH sized AS ( \
             SELECT c.sequence, coalesce({bytes}, 0) + coalesce(length(c.reason), 0) + coalesce(length(c.key), 0) \
                 + 64 AS bytes \
             FROM {view} \
             WHERE c.parent_id = $1 AND ($2 IS NULL OR {may}) AND ($2 IS NULL OR ({state}) = $2) \
               AND c.sequence > $3 \
             ORDER BY c.sequence LIMIT $4), \
         taken AS ( \
             SELECT sequence, count(*) OVER () AS read, \
                 sum(bytes) OVER (ORDER BY sequence ROWS UNBOUNDED PRECEDING) - bytes AS before \
             FROM sized) \
         SELECT c.sequence, c.key, {state} AS state, {attempt} AS outcome_attempt, c.result, c.reason, \
             {terminal} AS terminal_at, t.read \
         FROM {view} JOIN taken t ON t.sequence = c.sequence \
         WHERE c.parent_id = $1 AND t.before < $5 \
         ORDER BY c.sequence",
        may = sql::may_be_in("$2"),
        state = sql::view_state(),
        attempt = sql::view_outcome_attempt(),
        terminal = sql::view_terminal_at(d),
        view = sql::child_view(d),
        bytes = (d.json_bytes)("c.result")
    )
});

/// The most frequent reasons of parent `$1`'s failed and skipped children,
/// from their counts (`child_reason`, written with the rows: see the
/// `reason_counts` migration), never from the rows themselves.
static REASONS: Sql = Sql::new(|_| {
    format!(
        "SELECT state, CASE WHEN reason_null THEN NULL ELSE reason END AS reason, n FROM child_reason \
         WHERE parent_id = $1 AND n > 0 \
         ORDER BY n DESC, state, reason_null, reason LIMIT {SUMMARY_REASONS}"
    )
});

/// Every reason count kept for parent `$1` (reconcile's stored side).
const KEPT_REASONS: &str = "SELECT state, CASE WHEN reason_null THEN NULL ELSE reason END AS reason, n \
    FROM child_reason WHERE parent_id = $1 AND n <> 0";

/// Parent `$1`'s failed and skipped children counted by state and reason
/// from its rows (reconcile's derived side).
const ROW_REASONS: &str = "SELECT state, reason, count(*) AS n FROM child \
    WHERE parent_id = $1 AND state IN ('failed', 'skipped') GROUP BY state, reason";

/// Drops parent `$1`'s reason counts, before `RECOUNT_REASONS`.
const DROP_REASONS: &str = "DELETE FROM child_reason WHERE parent_id = $1";

/// Parent `$1`'s reason counts, from its rows.
const RECOUNT_REASONS: &str = "INSERT INTO child_reason (parent_id, state, reason_null, reason, n) \
    SELECT parent_id, state, reason IS NULL, coalesce(reason, ''), count(*) FROM child \
    WHERE parent_id = $1 AND state IN ('failed', 'skipped') \
    GROUP BY parent_id, state, reason IS NULL, coalesce(reason, '')";

/// Which reason counts `reason_counts` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reasons {
    /// As kept beside the rows (what the summary shows).
    Kept,
    /// Counted from the rows.
    Counted,
}

fn reason_rows(rows: &[Row]) -> StoreResult<Vec<ReasonCount>> {
    rows.iter()
        .map(|row| {
            Ok(ReasonCount {
                state: parse_column(&row.text("state")?)?,
                reason: row.opt_text("reason")?,
                count: row.int("n")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// A parent's reason counts, kept or counted from its rows, in no order.
pub(super) async fn reason_counts(
    tx: &mut dyn Transaction,
    parent_id: &ParentId,
    which: Reasons,
) -> StoreResult<Vec<ReasonCount>> {
    let sql = match which {
        Reasons::Kept => KEPT_REASONS,
        Reasons::Counted => ROW_REASONS,
    };
    let rows = tx.fetch(Statement::new(sql).text(parent_id.as_str())).await?;
    reason_rows(&rows)
}

/// Rewrites a parent's reason counts from its rows (reconcile's repair).
pub(super) async fn recount_reasons(tx: &mut dyn Transaction, parent_id: &ParentId) -> StoreResult<()> {
    tx.execute(Statement::new(DROP_REASONS).text(parent_id.as_str()))
        .await?;
    tx.execute(Statement::new(RECOUNT_REASONS).text(parent_id.as_str()))
        .await?;
    Ok(())
}

impl Store {
    /// A parent's next results after sequence `after` (none: from the
    /// first), in sequence order: at most `limit` of them, and no more than
    /// start within `bytes` of results and reasons (always at least one);
    /// with whether they were the last. Says nothing of whether the parent
    /// exists: ask `require_parent` first.
    pub async fn results_chunk(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        limit: i64,
        bytes: i64,
    ) -> StoreResult<(Vec<ChildResult>, bool)> {
        let rows = self
            .scan(
                Statement::new(self.sql(&RESULTS))
                    .text(parent_id.as_str())
                    .text(state.map(ChildState::as_str))
                    .int(after.unwrap_or(-1))
                    .int(limit)
                    .int(bytes),
            )
            .await?;
        let read = match rows.first() {
            Some(row) => row.int("read")?,
            None => 0,
        };
        let last = read < limit && rows.len() as i64 == read;
        let results = rows
            .iter()
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
            .collect::<Result<_, sqlx::Error>>()?;
        Ok((results, last))
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
        let reasons = reason_rows(&rows)?;
        Ok(Summary {
            parent_id: parent.parent_id,
            counts: parent.counts,
            reasons,
        })
    }
}
