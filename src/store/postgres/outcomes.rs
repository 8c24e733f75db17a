//! Outcomes on Postgres: the winning writes and their counters in one
//! statement, and what the losers are told.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{PgStore, PgTx};
use crate::ledger::{OutcomeWrite, ParentId};
use crate::store::backend::{LoserWrites, Outcomes};
use crate::store::error::retry_transient;
use crate::store::reports::{Applied, LoserFacts};
use crate::store::rows::parse_column;
use crate::store::{StoreResult, sql};

/// Adds a `deltas (parent_id, processed, failed, skipped, from_in_flight,
/// from_held)` CTE's counts to their parents (the last two: how many of those
/// outcomes settled an in-flight or a held child, for the open counts) and
/// completes those whose last child just went terminal;
/// `bumped (parent_id, completed)` names the parents this statement completed.
/// The `CASE` sees the row as it stands under the update's lock, so only one
/// statement sets `completed_at`; `completed` holds where it was set to this
/// transaction's `now()` and the counts before this statement's delta were
/// short of the total (so another transaction that started in the same
/// microsecond and completed it first is not counted twice). Their webhook
/// events are written by the same statement (`webhooks::ENQUEUE_BUMPED`).
pub(super) static BUMP_PARENTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "bumped AS ( \
             UPDATE parent p SET processed = p.processed + d.processed, failed = p.failed + d.failed, \
                 skipped = p.skipped + d.skipped, last_progress_at = now(), \
                 settled_in_flight = p.settled_in_flight + d.from_in_flight, \
                 settled_held = p.settled_held + d.from_held, {minute}, \
                 completed_at = CASE WHEN p.completed_at IS NULL AND {} THEN now() ELSE p.completed_at END \
             FROM deltas d WHERE p.parent_id = d.parent_id \
             RETURNING p.parent_id, p.completed_at = now() \
                 AND p.processed + p.failed + p.skipped - d.processed - d.failed - d.skipped < p.total \
                 AS completed), \
         {enqueue}",
        sql::complete(
            "p.decomposed_at IS NOT NULL",
            "p.processed + d.processed + p.failed + d.failed + p.skipped + d.skipped",
            "p.total"
        ),
        minute = sql::count_minute("p.", super::MINUTE, "d.processed", "d.failed"),
        enqueue = super::webhooks::ENQUEUE_BUMPED.as_str()
    )
});

/// Child transitions of one parent and its counters in one statement. The
/// guarded UPDATE only touches non-terminal rows of a decomposed parent, so
/// what it returns is exactly the set of writes that won. The parent comes in
/// as an array (the same id for every write) joined on both key columns: a
/// constant `parent_id` would let a planner whose statistics predate the
/// parent walk every child of it instead of looking each one up.
pub(super) static APPLY_OUTCOMES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::uuid[]) \
                 AS u(parent_id, sequence, outcome, reason, result, claim_id)), \
         applied AS ( \
             UPDATE child c SET state = u.outcome, reason = u.reason, result = u.result::json, \
                 terminal_at = now(), changed_at = now(), settled_from = c.state, outcome_attempt = {credited} \
             FROM input u JOIN parent p ON p.parent_id = u.parent_id AND p.decomposed_at IS NOT NULL \
             WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence \
               AND c.state IN ('pending', 'in_flight', 'held') AND {fenced} \
             RETURNING c.parent_id, c.sequence, c.state, c.settled_from), \
         deltas AS ( \
             SELECT parent_id, count(*) FILTER (WHERE state = 'processed') AS processed, \
                 count(*) FILTER (WHERE state = 'failed') AS failed, \
                 count(*) FILTER (WHERE state = 'skipped') AS skipped, \
                 count(*) FILTER (WHERE settled_from = 'in_flight') AS from_in_flight, \
                 count(*) FILTER (WHERE settled_from = 'held') AS from_held \
             FROM applied GROUP BY parent_id), \
         {bump} \
         SELECT parent_id, sequence FROM applied \
         UNION ALL SELECT parent_id, NULL FROM bumped WHERE completed",
        credited = sql::credited_attempt("u.claim_id"),
        fenced = sql::fence_admits("u.claim_id"),
        bump = BUMP_PARENTS.as_str()
    )
});

/// Appends a losing write to its child's conflict log.
static LOG_CONFLICT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE child c SET conflict_count = c.conflict_count + 1, conflicts = ( \
             SELECT jsonb_agg(e ORDER BY i) FROM ( \
                 SELECT e, i FROM jsonb_array_elements(coalesce(c.conflicts, '[]'::jsonb) || jsonb_build_array( \
                     jsonb_build_object('outcome', $3::text, 'reason', $4::text, 'claim_id', $5::uuid, \
                                        'attempt', {}, 'at', now()))) WITH ORDINALITY AS x(e, i) \
                 ORDER BY i DESC LIMIT {keep}) kept) \
         WHERE c.parent_id = $1 AND c.sequence = $2",
        sql::attempt_of("$5::uuid"),
        keep = crate::ledger::outcome::CONFLICTS_KEPT
    )
});

#[async_trait]
impl Outcomes for PgStore {
    /// Records the writes that win, one statement per parent. A batch of one
    /// parent (what a claim hands out) is its own transaction, so the hot
    /// parent row is locked only while the statement runs; a batch of several
    /// is one transaction, parent by parent in id order.
    async fn apply_outcomes(&self, writes: &[OutcomeWrite]) -> StoreResult<Applied> {
        let mut by_parent: BTreeMap<&str, Vec<&OutcomeWrite>> = BTreeMap::new();
        for write in writes {
            by_parent.entry(write.parent_id.as_str()).or_default().push(write);
        }
        let by_parent = &by_parent;
        let rows = retry_transient(|| async move {
            if by_parent.len() == 1 {
                let (parent_id, writes) = by_parent.iter().next().expect("one parent");
                apply_in_parent(&self.pool, self.pool.sql(APPLY_OUTCOMES.as_str()), parent_id, writes).await
            } else {
                self.apply_by_parent(by_parent).await
            }
        })
        .await?;
        let mut applied = Applied::default();
        for (parent_id, sequence) in rows {
            let parent_id = ParentId::from_ledger(parent_id);
            match sequence {
                Some(sequence) => applied.won.push((parent_id, sequence)),
                None => applied.completed.push(parent_id),
            }
        }
        Ok(applied)
    }
}

impl PgStore {
    async fn apply_by_parent(&self, by_parent: &BTreeMap<&str, Vec<&OutcomeWrite>>) -> StoreResult<Vec<AppliedRow>> {
        let mut tx = self.held_tx().await?;
        let mut rows = Vec::new();
        for (parent_id, writes) in by_parent {
            rows.extend(apply_in_parent(&mut *tx, self.pool.sql(APPLY_OUTCOMES.as_str()), parent_id, writes).await?);
        }
        tx.commit().await?;
        Ok(rows)
    }
}

/// A winning write `(parent, Some(sequence))`, or a parent it completed `(parent, None)`.
type AppliedRow = (String, Option<i64>);

/// Runs `APPLY_OUTCOMES` (`statement`: its text to send, see `PgDb::sql`)
/// for the writes of one parent.
async fn apply_in_parent<'e>(
    executor: impl sqlx::Executor<'e, Database = sqlx::Postgres>,
    statement: &'static str,
    parent_id: &str,
    writes: &[&OutcomeWrite],
) -> StoreResult<Vec<AppliedRow>> {
    let parents = vec![parent_id; writes.len()];
    let sequences: Vec<i64> = writes.iter().map(|w| w.sequence).collect();
    let outcomes: Vec<&str> = writes.iter().map(|w| w.outcome.as_str()).collect();
    let reasons: Vec<Option<&str>> = writes.iter().map(|w| w.reason.as_deref()).collect();
    let results: Vec<Option<&str>> = writes.iter().map(|w| w.result.as_deref().map(|r| r.get())).collect();
    let claims: Vec<Option<Uuid>> = writes.iter().map(|w| w.claim_id).collect();
    Ok(sqlx::query_as(statement)
        .bind(&parents)
        .bind(&sequences)
        .bind(&outcomes)
        .bind(&reasons)
        .bind(&results)
        .bind(&claims)
        .fetch_all(executor)
        .await?)
}

#[async_trait]
impl LoserWrites for PgTx {
    async fn loser_facts(&mut self, losers: &[&OutcomeWrite]) -> StoreResult<Vec<LoserFacts>> {
        let parents: Vec<&str> = losers.iter().map(|w| w.parent_id.as_str()).collect();
        let sequences: Vec<i64> = losers.iter().map(|w| w.sequence).collect();
        let claims: Vec<Option<uuid::Uuid>> = losers.iter().map(|w| w.claim_id).collect();
        let rows: Vec<(i64, Option<bool>, Option<String>, bool)> = sqlx::query_as(AssertSqlSafe(sql::loser_facts(
            "unnest($1::text[], $2::bigint[], $3::uuid[]) WITH ORDINALITY AS u(parent_id, sequence, claim_id, i)",
        )))
        .bind(&parents)
        .bind(&sequences)
        .bind(&claims)
        .fetch_all(&mut **self)
        .await?;
        let mut facts = vec![LoserFacts::default(); losers.len()];
        for (i, decomposed, state, admitted) in rows {
            facts[i as usize - 1] = LoserFacts {
                parent_decomposed: decomposed,
                state: state.as_deref().map(parse_column).transpose()?,
                fenced_out: !admitted,
            };
        }
        Ok(facts)
    }

    async fn log_conflict(&mut self, write: &OutcomeWrite) -> StoreResult<()> {
        sqlx::query(LOG_CONFLICT.as_str())
            .bind(write.parent_id.as_str())
            .bind(write.sequence)
            .bind(write.outcome.as_str())
            .bind(write.reason.as_deref())
            .bind(write.claim_id)
            .execute(&mut **self)
            .await?;
        Ok(())
    }
}
