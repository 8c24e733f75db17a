//! Outcomes on Postgres: the winning writes and their counters in one
//! statement, and what the losers are told.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{PgStore, PgTx};
use crate::ledger::verdict::PARENT_FAILED;
use crate::ledger::{OutcomeWrite, ParentId};
use crate::store::backend::{LoserWrites, Outbox, Outcomes};
use crate::store::error::retry_transient;
use crate::store::parents::close_skipping;
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
/// `crossed` holds where this statement's failures took the parent past its
/// tolerance: the caller ends it in the same transaction.
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
                 AS completed, \
                 {crossed} AND NOT {crossed_before} AS crossed), \
         {enqueue}",
        sql::complete(
            "p.decomposed_at IS NOT NULL",
            "p.processed + d.processed + p.failed + d.failed + p.skipped + d.skipped",
            "p.total"
        ),
        minute = sql::count_minute("p.", super::MINUTE, "d.processed", "d.failed"),
        crossed = sql::parent_crossed("p", "p.failed"),
        crossed_before = sql::parent_crossed("p", "p.failed - d.failed"),
        enqueue = super::webhooks::ENQUEUE_BUMPED.as_str()
    )
});

/// Child transitions of one parent (`$7`) and its counters in one
/// statement. Only non-terminal rows of a decomposed parent are written, so
/// what it returns is exactly the set of writes that won; whether the parent
/// is decomposed is read once for the statement (every write is of `$7`), not
/// once per write (a join that cost about a microsecond per child). The parent comes
/// in as an array too (the same id for every write) joined on both key
/// columns: a constant `parent_id` would let a planner whose statistics
/// predate the parent walk every child of it instead of looking each one up.
///
/// Children are looked up by key, one input row at a time (`OFFSET 0`
/// keeps each lookup a subquery the planner cannot turn into a join): a
/// plan made while `child` was small, or never analyzed, would otherwise
/// scan every child of the table for each statement.
///
/// A child is in flight when its lane's floor has passed it and a lease
/// lists it (migration 0014). The leases that might list a written child
/// (`held`: those of the parent whose range meets the writes') are locked
/// first: a lease is what every writer of its children (outcomes, expiry,
/// release, cancellation) serializes on, and a lease that changed while the
/// statement waited for it is read as it is now. `seen` is each write with
/// its child and the lease that lists it, read once. The usual batch (`whole`)
/// is all of one claim's children on the parent, processed, without a reason
/// or a result, below the floor, and the only lease its range meets lists
/// exactly them with none of them settled (its `open` count is all of
/// them: every writer that settles a leased child counts it out of its lease
/// in the statement that settles it). Those children are in flight, so their
/// rows are not read (a child row looked up by key per write was about a
/// third of the statement's time with 500 writes).
///
/// A processed outcome from the claim whose lease holds the child, without
/// a reason or a result, does not rewrite the row (`quiet`, migration
/// 0023): it takes the child out of its lease and names it in an outcome
/// batch with that claim, its worker and the lease's expiry. Its row stays
/// pending below the floor with no lease listing it, which readers show as
/// processed (`sql::child_view`) and writers leave alone. Every other write
/// ends the attempt on the row, as before. A write for a child that looks
/// in flight but no lease lists may be one recorded so, or one whose lease
/// ran out or was let go after this statement began: unless the caller
/// holds the lane's lock (`$8`), the statement then writes nothing and says
/// so (`unheld`), and runs again under the lock, in a snapshot that sees
/// what the expiry or the release did (under it, such a child is recorded,
/// and the write loses).
///
/// The floor moves up only under the lane's lock, so a floor read from this
/// statement's snapshot is right for every child below it: those a claim
/// had leased before this statement began. A write for a child at or past
/// it might race a claim that is leasing it now; unless the caller holds the
/// lane's lock, the statement then writes nothing and says so with a row of
/// NULLs, and is run again under the lock (which also moves the floor past
/// the children it made terminal). A parent with a tolerance is written only
/// in a transaction (`$9`): the outcome that crosses it ends the parent
/// before the commit (`apply_by_parent`: every open child skipped under the
/// lane's lock, so no claim takes one after it commits). Out of one, the
/// statement writes nothing for it and says so with `(NULL, TOLERANT)`. A
/// crossed parent comes back as `(parent, CROSSED)`. The children it makes
/// processed are named in `processed_batch` rows (migration 0020), where the
/// children search finds them; those it makes failed or skipped count by
/// reason (`reasons`).
/// A lease stays or goes on its open count as `held` locked it, never as this
/// statement's snapshot saw it: a release that committed while `held` waited
/// for the lock moved the count, and on the older one neither `kept` nor
/// `closed` applied.
pub(super) static APPLY_OUTCOMES: LazyLock<String> = LazyLock::new(|| {
    let leased = sql::leased("(SELECT floor FROM ln)", "EXISTS (SELECT 1 FROM ln)");
    let view = sql::ClaimView::of(&leased, "h.claim_id");
    let written = sql::ClaimView::of("k.leased", "k.h_claim");
    format!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::uuid[]) \
                 WITH ORDINALITY AS u(parent_id, sequence, outcome, reason, result, claim_id, i)), \
         ln AS (SELECT floor FROM lane WHERE parent_id = $7), \
         held AS MATERIALIZED ( \
             SELECT l.claim_id, l.worker, l.expires_at, l.lo, l.hi, l.open, s.sequences, \
                 l.sequences IS NULL OR cardinality(s.sequences) = l.hi - l.lo + 1 AS dense \
             FROM claim_lease l, LATERAL (SELECT coalesce(l.sequences, '{{}}'::bigint[]) AS sequences) s \
             WHERE l.parent_id = $7 AND l.lo <= (SELECT max(sequence) FROM input) \
               AND l.hi >= (SELECT min(sequence) FROM input) \
             ORDER BY l.claim_id FOR NO KEY UPDATE OF l), \
         whole AS MATERIALIZED ( \
             SELECT coalesce(( \
                 SELECT h.dense AND h.open = h.hi - h.lo + 1 AND i.n = h.open AND i.distinct_n = i.n \
                     AND i.lo = h.lo AND i.hi = h.hi \
                     AND i.quiet AND (SELECT count(*) FROM held) = 1 \
                     AND (SELECT coalesce(h.hi < floor, true) FROM ln) \
                 FROM held h, ( \
                     SELECT count(*) AS n, count(DISTINCT sequence) AS distinct_n, min(sequence) AS lo, \
                         max(sequence) AS hi, bool_and(outcome = 'processed' AND reason IS NULL AND result IS NULL \
                             AND claim_id = (SELECT claim_id FROM held LIMIT 1)) IS TRUE AS quiet \
                     FROM input) i \
                 LIMIT 1), false) AS whole), \
         seen AS MATERIALIZED ( \
             SELECT u.parent_id, u.sequence, u.outcome, u.reason, u.result, u.claim_id, 'pending' AS state, \
                 true AS leased, h.claim_id AS h_claim, h.worker AS h_worker, h.expires_at AS h_expires, \
                 true AS admitted \
             FROM input u, held h WHERE (SELECT whole FROM whole) \
             UNION ALL ( \
             SELECT DISTINCT ON (u.sequence) u.parent_id, u.sequence, u.outcome, u.reason, u.result, u.claim_id, \
                 c.state, {leased} AS leased, h.claim_id AS h_claim, h.worker AS h_worker, \
                 h.expires_at AS h_expires, {fenced} AS admitted \
             FROM input u CROSS JOIN LATERAL ( \
                 SELECT * FROM child c WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence OFFSET 0) c \
                 LEFT JOIN held h ON u.sequence BETWEEN h.lo AND h.hi AND (h.dense OR u.sequence = ANY (h.sequences)) \
             WHERE NOT (SELECT whole FROM whole) \
             ORDER BY u.sequence, u.i)), \
         tolerant AS ( \
             SELECT 1 FROM parent WHERE NOT $9 AND parent_id = $7 \
               AND (tolerated_count IS NOT NULL OR tolerated_percent IS NOT NULL)), \
         racing AS ( \
             SELECT 1 FROM input u \
             WHERE NOT $8 AND u.sequence >= (SELECT floor FROM ln) AND EXISTS ( \
                 SELECT 1 FROM child c WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence \
                   AND c.state = 'pending' AND c.available_at IS NULL OFFSET 0) \
             LIMIT 1), \
         unheld AS (SELECT 1 FROM seen WHERE NOT $8 AND leased AND h_claim IS NULL LIMIT 1), \
         cand AS MATERIALIZED ( \
             SELECT k.*, (k.leased AND k.h_claim IS NOT NULL AND k.outcome = 'processed' AND k.reason IS NULL \
                 AND k.result IS NULL AND k.claim_id = k.h_claim) IS TRUE AS quiet \
             FROM seen k \
             WHERE EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = $7 AND p.decomposed_at IS NOT NULL) \
               AND k.state IN ('pending', 'held') AND NOT (k.leased AND k.h_claim IS NULL) AND k.admitted \
               AND NOT EXISTS (SELECT 1 FROM racing) AND NOT EXISTS (SELECT 1 FROM unheld) \
               AND NOT EXISTS (SELECT 1 FROM tolerant)), \
         rewritten AS ( \
             UPDATE child c SET state = k.outcome, reason = k.reason, result = k.result::json, \
                 terminal_at = now(), changed_at = now(), \
                 settled_from = CASE WHEN k.leased THEN 'in_flight' ELSE c.state END, \
                 outcome_attempt = {credited}, \
                 attempts = {attempts}, \
                 previous_claim_id = {previous}, \
                 claim_id = CASE WHEN k.leased THEN k.h_claim ELSE c.claim_id END, \
                 claimed_by = CASE WHEN k.leased THEN k.h_worker ELSE c.claimed_by END, \
                 lease_expires_at = CASE WHEN k.leased THEN k.h_expires ELSE c.lease_expires_at END, \
                 available_at = NULL \
             FROM cand k \
             WHERE NOT k.quiet AND c.parent_id = k.parent_id AND c.sequence = k.sequence \
               AND c.state IN ('pending', 'held') \
             RETURNING c.parent_id, c.sequence, c.state, c.settled_from, c.claim_id, c.reason), \
         applied AS ( \
             SELECT parent_id, sequence, state, settled_from, claim_id, reason, false AS quiet, \
                 NULL::text AS worker, NULL::timestamptz AS expires_at FROM rewritten \
             UNION ALL \
             SELECT parent_id, sequence, 'processed', 'in_flight', h_claim, NULL, true, h_worker, h_expires \
             FROM cand WHERE quiet), \
         {reasons}, \
         counted AS ( \
             SELECT claim_id, count(*) AS n, array_agg(sequence) FILTER (WHERE quiet) AS quiet \
             FROM applied WHERE settled_from = 'in_flight' GROUP BY claim_id), \
         kept AS ( \
             UPDATE claim_lease l SET open = l.open - k.n, \
                 sequences = CASE WHEN k.quiet IS NULL THEN l.sequences \
                     ELSE ARRAY(SELECT s FROM unnest({listed}) s WHERE s <> ALL (k.quiet)) END \
             FROM counted k, held h \
             WHERE h.claim_id = k.claim_id AND l.claim_id = k.claim_id AND l.parent_id = $7 AND h.open > k.n), \
         closed AS ( \
             DELETE FROM claim_lease l USING counted k, held h \
             WHERE h.claim_id = k.claim_id AND l.claim_id = k.claim_id AND l.parent_id = $7 AND h.open <= k.n), \
         advanced AS ( \
             UPDATE lane SET floor = ( \
                 SELECT min(c.sequence) FROM child c \
                 WHERE c.parent_id = $7 AND c.sequence >= lane.floor AND c.state = 'pending' \
                   AND c.available_at IS NULL AND c.sequence NOT IN (SELECT sequence FROM applied)) \
             WHERE $8 AND parent_id = $7 AND floor IS NOT NULL), \
         logged AS ( \
             INSERT INTO processed_batch (parent_id, changed_at, lo, hi, sequences, claim_id, worker, expires_at) \
             SELECT $7, now(), min(sequence), max(sequence), \
                 CASE WHEN count(*) = max(sequence) - min(sequence) + 1 THEN NULL \
                      ELSE array_agg(sequence ORDER BY sequence) END, \
                 b.claim_id, max(worker), max(expires_at) \
             FROM applied, LATERAL (SELECT CASE WHEN quiet THEN claim_id END AS claim_id) b \
             WHERE state = 'processed' GROUP BY b.claim_id), \
         deltas AS ( \
             SELECT parent_id, count(*) FILTER (WHERE state = 'processed') AS processed, \
                 count(*) FILTER (WHERE state = 'failed') AS failed, \
                 count(*) FILTER (WHERE state = 'skipped') AS skipped, \
                 count(*) FILTER (WHERE settled_from = 'in_flight') AS from_in_flight, \
                 count(*) FILTER (WHERE settled_from = 'held') AS from_held \
             FROM applied GROUP BY parent_id), \
         {bump} \
         SELECT parent_id, sequence FROM applied \
         UNION ALL SELECT parent_id, NULL FROM bumped WHERE completed \
         UNION ALL SELECT parent_id, {CROSSED} FROM bumped WHERE crossed \
         UNION ALL SELECT NULL, NULL FROM racing \
         UNION ALL SELECT NULL, NULL FROM unheld \
         UNION ALL SELECT NULL, {TOLERANT} FROM tolerant",
        fenced = sql::fence_admits("u.claim_id", &view),
        credited = sql::credited_attempt("k.claim_id", &written),
        attempts = written.attempts,
        previous = written.previous_claim_id,
        listed = super::listed("l"),
        bump = BUMP_PARENTS.as_str(),
        reasons = super::count_reasons("applied")
    )
});

/// The sequence `APPLY_OUTCOMES` names a parent whose tolerance it crossed
/// with (no child has it).
const CROSSED: i64 = -1;

/// The sequence of the row `APPLY_OUTCOMES` answers, having written nothing,
/// for a parent with a tolerance when its lane was not locked.
const TOLERANT: i64 = -2;

/// Parents whose outcomes were refused once out of a transaction because
/// they have a tolerance: their next batches start in one rather than run
/// the statement twice. A tolerance never changes, so a
/// parent named here stays right; one forgotten only costs that statement
/// again. Bounded: emptied when full.
#[derive(Debug, Default)]
pub(super) struct Tolerant(std::sync::Mutex<HashSet<String>>);

impl Tolerant {
    /// How many parents it remembers before it starts over.
    const KEPT: usize = 10_000;

    fn knows(&self, parent_id: &str) -> bool {
        self.0.lock().expect("tolerant parents").contains(parent_id)
    }

    fn learn(&self, parent_id: &str) {
        let mut known = self.0.lock().expect("tolerant parents");
        if known.len() >= Self::KEPT {
            known.clear();
        }
        known.insert(parent_id.to_owned());
    }
}

/// What `APPLY_OUTCOMES` did for one parent's writes.
enum Written {
    Rows(Vec<AppliedRow>),
    /// Nothing: the writes need the parent's lane locked (they may race a
    /// claim), or (`tolerant`) a transaction that can end the parent.
    NeedsLock {
        tolerant: bool,
    },
}

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
        sql::attempt_of("$5::uuid", &sql::conflict_view(&super::POSTGRES)),
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
                if self.tolerant.knows(parent_id) {
                    return self.apply_by_parent(by_parent, false).await;
                }
                let sql = self.pool.sql(APPLY_OUTCOMES.as_str());
                match apply_in_parent(&self.pool, sql, parent_id, writes, false, false).await? {
                    Written::Rows(rows) => Ok(rows),
                    Written::NeedsLock { tolerant: true } => {
                        self.tolerant.learn(parent_id);
                        self.apply_by_parent(by_parent, false).await
                    }
                    Written::NeedsLock { tolerant: false } => self.apply_by_parent(by_parent, true).await,
                }
            } else {
                self.apply_by_parent(by_parent, false).await
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
    /// Applies the writes parent by parent in id order, in one transaction;
    /// with `locked`, each parent's lane locked first (for writes that may
    /// race a claim: see `APPLY_OUTCOMES`), and otherwise a parent whose
    /// writes need it goes again with it. A parent whose tolerance the
    /// writes crossed ends here, before the commit: its open children skipped
    /// (`parent failed`) under its lane's lock, its lane closed. That lock
    /// comes after the parent's here, against the order other statements
    /// take them in; a deadlock with one of those (only ever at a crossing)
    /// is retried whole by `apply_outcomes`.
    async fn apply_by_parent(
        &self,
        by_parent: &BTreeMap<&str, Vec<&OutcomeWrite>>,
        locked: bool,
    ) -> StoreResult<Vec<AppliedRow>> {
        let mut tx = self.held_tx().await?;
        let mut rows = Vec::new();
        let sql = self.pool.sql(APPLY_OUTCOMES.as_str());
        for (parent_id, writes) in by_parent {
            let unlocked = if locked {
                None
            } else {
                match apply_in_parent(&mut *tx, sql, parent_id, writes, false, true).await? {
                    Written::Rows(applied) => Some(applied),
                    Written::NeedsLock { .. } => None,
                }
            };
            let applied = match unlocked {
                Some(applied) => applied,
                None => {
                    sqlx::query("SELECT 1 FROM lane WHERE parent_id = $1 FOR UPDATE")
                        .bind(*parent_id)
                        .execute(&mut *tx)
                        .await?;
                    match apply_in_parent(&mut *tx, sql, parent_id, writes, true, true).await? {
                        Written::Rows(applied) => applied,
                        Written::NeedsLock { .. } => Vec::new(),
                    }
                }
            };
            let crossed = applied.iter().any(|(_, sequence)| *sequence == Some(CROSSED));
            rows.extend(applied.into_iter().filter(|(_, sequence)| *sequence != Some(CROSSED)));
            if crossed {
                let parent = ParentId::from_ledger((*parent_id).to_owned());
                let (_, completed) = close_skipping(&mut tx, &parent, PARENT_FAILED, false).await?;
                if completed {
                    tx.enqueue_completed(std::slice::from_ref(&parent)).await?;
                    rows.push((parent_id.to_string(), None));
                }
            }
        }
        tx.commit().await?;
        Ok(rows)
    }
}

/// A winning write `(parent, Some(sequence))`, or a parent it completed `(parent, None)`.
type AppliedRow = (String, Option<i64>);

/// Runs `APPLY_OUTCOMES` (`statement`: its text to send, see `PgDb::sql`)
/// for the writes of one parent, `locked` when the caller holds its lane's
/// lock, `in_tx` when it runs in a transaction that ends a crossed parent;
/// `NeedsLock` when the writes need that lock (or, for a parent with a
/// tolerance, that transaction) and nothing was written.
async fn apply_in_parent<'e>(
    executor: impl sqlx::Executor<'e, Database = sqlx::Postgres>,
    statement: &'static str,
    parent_id: &str,
    writes: &[&OutcomeWrite],
    locked: bool,
    in_tx: bool,
) -> StoreResult<Written> {
    let parents = vec![parent_id; writes.len()];
    let sequences: Vec<i64> = writes.iter().map(|w| w.sequence).collect();
    let outcomes: Vec<&str> = writes.iter().map(|w| w.outcome.as_str()).collect();
    let reasons: Vec<Option<&str>> = writes.iter().map(|w| w.reason.as_deref()).collect();
    let results: Vec<Option<&str>> = writes.iter().map(|w| w.result.as_deref().map(|r| r.get())).collect();
    let claims: Vec<Option<Uuid>> = writes.iter().map(|w| w.claim_id).collect();
    let rows: Vec<(Option<String>, Option<i64>)> = sqlx::query_as(statement)
        .bind(&parents)
        .bind(&sequences)
        .bind(&outcomes)
        .bind(&reasons)
        .bind(&results)
        .bind(&claims)
        .bind(parent_id)
        .bind(locked)
        .bind(in_tx)
        .fetch_all(executor)
        .await?;
    if rows.iter().any(|(parent, _)| parent.is_none()) {
        let tolerant = rows.contains(&(None, Some(TOLERANT)));
        return Ok(Written::NeedsLock { tolerant });
    }
    Ok(Written::Rows(
        rows.into_iter()
            .filter_map(|(parent, sequence)| parent.map(|p| (p, sequence)))
            .collect(),
    ))
}

#[async_trait]
impl LoserWrites for PgTx {
    async fn loser_facts(&mut self, losers: &[&OutcomeWrite]) -> StoreResult<Vec<LoserFacts>> {
        let parents: Vec<&str> = losers.iter().map(|w| w.parent_id.as_str()).collect();
        let sequences: Vec<i64> = losers.iter().map(|w| w.sequence).collect();
        let claims: Vec<Option<uuid::Uuid>> = losers.iter().map(|w| w.claim_id).collect();
        let rows: Vec<(i64, Option<bool>, Option<String>, bool)> = sqlx::query_as(AssertSqlSafe(sql::loser_facts(
            &super::POSTGRES,
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
