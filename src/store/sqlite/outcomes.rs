//! Outcomes on SQLite: the winning writes, their counters, and what the
//! losers are told.

use std::collections::{BTreeMap, HashSet};
use std::sync::LazyLock;

use async_trait::async_trait;
use serde_json::value::RawValue;
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::group::{Write, Written};
use super::quiet::{LISTED, record_quiet};
use super::{NOW, SqliteStore, SqliteTx};
use crate::ledger::verdict::PARENT_FAILED;
use crate::ledger::{OutcomeWrite, ParentId};
use crate::store::backend::{LoserWrites, Outbox, Outcomes};
use crate::store::parents::close_skipping;
use crate::store::reports::{Applied, LoserFacts};
use crate::store::rows::parse_column;
use crate::store::{StoreResult, sql};

/// The guarded UPDATE only touches non-terminal rows of decomposed parents:
/// what it returns is exactly the set of writes that won. A child is in
/// flight when its lane's floor has passed it (migration 0013 on SQLite); the write's
/// own claim's lease (`h`) says which lease holds it, and only a write for a
/// child leased by another claim, or by none it names, looks the lease up.
/// A child that looks in flight but that no lease holds was recorded
/// without its row rewritten (`QUIET_OUTCOMES`), and is left alone.
/// The outcome ends the attempt on the row, as a lease end does.
/// The writes are read out of their JSON once (`j`, materialized): the
/// statement names their fields a dozen times, and each `->>` parses the
/// element again (about a sixth of the statement's time with 500 writes).
/// `jsonb_each` hands each element over parsed (`json_each` as text, which
/// each `->>` parsed again): half of `j`'s time.
static APPLY_OUTCOMES: LazyLock<String> = LazyLock::new(|| {
    let leased = sql::leased("ln.floor", "ln.parent_id IS NOT NULL");
    let lookup = |column: &str| {
        format!(
            "CASE WHEN h.claim_id IS NOT NULL THEN h.{column} ELSE {} END",
            sql::holder(&super::SQLITE, column)
        )
    };
    let view = sql::ClaimView::of(&leased, "h.claim_id");
    format!(
        "WITH j AS MATERIALIZED ( \
             SELECT value ->> 0 AS parent_id, value ->> 1 AS sequence, value ->> 2 AS outcome, \
                 value ->> 3 AS reason, \
                 CASE WHEN json_type(value, '$[4]') = 'null' THEN NULL ELSE value -> 4 END AS result, \
                 value ->> 5 AS claim_id \
             FROM jsonb_each(?1)), \
             {LISTED} \
         UPDATE child AS c SET state = j.outcome, reason = j.reason, result = j.result, terminal_at = {now}, \
             changed_at = {now}, settled_from = CASE WHEN {leased} THEN 'in_flight' ELSE c.state END, \
             outcome_attempt = {credited}, attempts = {attempts}, previous_claim_id = {previous}, \
             claim_id = CASE WHEN {leased} THEN {holder} ELSE c.claim_id END, \
             claimed_by = CASE WHEN {leased} THEN {worker} ELSE c.claimed_by END, \
             lease_expires_at = CASE WHEN {leased} THEN {expires} ELSE c.lease_expires_at END, \
             available_at = NULL \
         FROM j \
             LEFT JOIN lane ln ON ln.parent_id = j.parent_id \
             LEFT JOIN h ON h.claim_id = j.claim_id AND h.parent_id = j.parent_id AND h.sequence = j.sequence \
         WHERE c.parent_id = j.parent_id AND c.sequence = j.sequence \
           AND c.state IN ('pending', 'held') AND {fenced} AND (h.claim_id IS NOT NULL OR NOT {quiet}) \
           AND EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = j.parent_id AND p.decomposed_at IS NOT NULL) \
         RETURNING parent_id, sequence, state, settled_from, claim_id, changed_at",
        now = NOW,
        credited = sql::credited_attempt("j.claim_id", &view),
        fenced = sql::fence_admits("j.claim_id", &view),
        attempts = view.attempts,
        previous = view.previous_claim_id,
        holder = lookup("claim_id"),
        worker = lookup("worker"),
        expires = lookup("expires_at"),
        quiet = sql::quiet_with(&super::SQLITE, &leased)
    )
});

/// Closes the leases whose last open children were just recorded: JSON
/// `[[parent_id, claim_id, n, [quiet sequences]], ...]` in `?1`, `n` of each
/// lease's children recorded.
const CLOSE_LEASES: &str = "DELETE FROM claim_lease WHERE EXISTS ( \
        SELECT 1 FROM json_each(?1) j WHERE j.value ->> 0 = claim_lease.parent_id \
          AND j.value ->> 1 = claim_lease.claim_id AND claim_lease.open <= j.value ->> 2)";

/// Counts the children just recorded out of the other leases (see
/// `CLOSE_LEASES`), and takes those recorded without their rows rewritten
/// out of their lists: a lease lists the children it still holds of them.
const COUNT_DOWN_LEASES: &str = "UPDATE claim_lease SET open = open - (j.value ->> 2), \
        sequences = CASE WHEN json_array_length(j.value, '$[3]') = 0 THEN claim_lease.sequences \
            ELSE (SELECT json_group_array(s.value) FROM json_each(claim_lease.sequences) s \
                  WHERE s.value NOT IN (SELECT value FROM json_each(j.value, '$[3]'))) END \
    FROM json_each(?1) AS j WHERE claim_lease.parent_id = j.value ->> 0 AND claim_lease.claim_id = j.value ->> 1";

/// Completes a parent whose last child just went terminal; a row back says
/// this statement completed it.
static COMPLETE_PARENT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE parent AS p SET completed_at = {now} \
         WHERE p.parent_id = ?1 AND p.completed_at IS NULL AND {complete} RETURNING parent_id",
        now = NOW,
        complete = sql::parent_complete("p")
    )
});

static LOG_CONFLICT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE child AS c SET conflict_count = c.conflict_count + 1, conflicts = ( \
             SELECT json_group_array(json(value)) FROM (SELECT value FROM ( \
                 SELECT value, key FROM json_each(json_insert(coalesce(c.conflicts, '[]'), '$[#]', json_object( \
                     'outcome', ?3, 'reason', ?4, 'claim_id', ?5, 'attempt', {attempt}, 'at', {now}))) \
                 ORDER BY key DESC LIMIT {keep}) ORDER BY key)) \
         WHERE c.parent_id = ?1 AND c.sequence = ?2",
        attempt = sql::attempt_of("?5", &sql::conflict_view(&super::SQLITE)),
        now = NOW,
        keep = crate::ledger::outcome::CONFLICTS_KEPT
    )
});

#[async_trait]
impl Outcomes for SqliteStore {
    /// Records the writes that win, and their parents' counters, in one
    /// transaction: first those recorded without their rows rewritten
    /// (`QUIET_OUTCOMES`), then the rest by rewriting their rows.
    async fn apply_outcomes(&self, writes: &[OutcomeWrite]) -> StoreResult<Applied> {
        match self.in_group(Write::Outcomes(writes.to_vec())).await? {
            Written::Applied(applied) => Ok(applied),
            Written::Claims(_) => unreachable!("an outcome batch is answered with what it applied"),
        }
    }
}

/// Records the writes that win, and their parents' counters, in `tx` (a
/// transaction of the writer's group): first those recorded without their
/// rows rewritten (`QUIET_OUTCOMES`), then the rest by rewriting their rows.
pub(super) async fn apply_outcomes(tx: &mut SqliteTx, writes: &[OutcomeWrite]) -> StoreResult<Applied> {
    let json = outcomes_json(writes.iter());
    let quiet = record_quiet(tx, writes, &json).await?;
    let won: Vec<Won> = if quiet.len() == writes.len() {
        Vec::new()
    } else {
        let rest = if quiet.is_empty() {
            json
        } else {
            let recorded: HashSet<usize> = quiet.iter().map(|q| q.0 as usize).collect();
            outcomes_json(
                writes
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !recorded.contains(i))
                    .map(|(_, w)| w),
            )
        };
        sqlx::query_as(APPLY_OUTCOMES.as_str())
            .bind(rest)
            .fetch_all(&mut **tx)
            .await?
    };
    let mut deltas: BTreeMap<&str, Counted> = BTreeMap::new();
    let mut leases: BTreeMap<(&str, &str), Recorded> = BTreeMap::new();
    for (parent_id, _, state, from, claim_id, _) in &won {
        let delta = deltas.entry(parent_id.as_str()).or_default();
        match state.as_str() {
            "processed" => delta.processed += 1,
            "failed" => delta.failed += 1,
            _ => delta.skipped += 1,
        }
        match (from.as_str(), claim_id) {
            ("in_flight", Some(claim_id)) => {
                delta.from_in_flight += 1;
                leases.entry((parent_id.as_str(), claim_id.as_str())).or_default().0 += 1;
            }
            ("in_flight", None) => delta.from_in_flight += 1,
            ("held", _) => delta.from_held += 1,
            _ => {}
        }
    }
    let mut batches = processed_batches(&won);
    let claims: Vec<String> = quiet
        .iter()
        .map(|(i, ..)| writes[*i as usize].claim_id.map(|c| c.to_string()).unwrap_or_default())
        .collect();
    for ((i, worker, expires_at, at), claim_id) in quiet.iter().zip(&claims) {
        let write = &writes[*i as usize];
        let delta = deltas.entry(write.parent_id.as_str()).or_default();
        delta.processed += 1;
        delta.from_in_flight += 1;
        let lease = leases.entry((write.parent_id.as_str(), claim_id.as_str())).or_default();
        lease.0 += 1;
        lease.1.push(write.sequence);
        batches
            .entry((write.parent_id.as_str(), at.as_str(), Some(claim_id.as_str())))
            .or_insert_with(|| Batch {
                worker: worker.as_deref(),
                expires_at: Some(expires_at.as_str()),
                sequences: Vec::new(),
            })
            .sequences
            .push(write.sequence);
    }
    close_and_log(tx, leases_json(&leases), processed_json(batches)).await?;
    let completed = bump_parents(tx, &deltas).await?;
    let won = won
        .into_iter()
        .map(|(parent_id, sequence, _, _, _, _)| (ParentId::from_ledger(parent_id), sequence));
    let quiet = quiet.iter().map(|(i, ..)| {
        let write = &writes[*i as usize];
        (write.parent_id.clone(), write.sequence)
    });
    Ok(Applied {
        won: won.chain(quiet).collect(),
        completed,
    })
}

/// A write that won, as `APPLY_OUTCOMES` returns it: parent, sequence, new
/// state, the state it settled from, the claim that held it, and its `changed_at`.
type Won = (String, i64, String, String, Option<String>, String);

/// Of one lease, the children just recorded, and those of them recorded
/// without their rows rewritten.
#[derive(Debug, Default)]
struct Recorded(i64, Vec<i64>);

/// An outcome batch's children, and for one whose rows were not rewritten,
/// its claim's worker and lease expiry.
#[derive(Debug)]
struct Batch<'a> {
    worker: Option<&'a str>,
    expires_at: Option<&'a str>,
    sequences: Vec<i64>,
}

/// Outcome batches by parent, time, and claim (for those whose rows were not rewritten).
type Batches<'a> = BTreeMap<(&'a str, &'a str, Option<&'a str>), Batch<'a>>;

/// The children `APPLY_OUTCOMES` made processed, a batch per parent and change.
fn processed_batches(won: &[Won]) -> Batches<'_> {
    let mut batches = Batches::new();
    for (parent_id, sequence, state, _, _, changed_at) in won {
        if state == "processed" {
            batches
                .entry((parent_id.as_str(), changed_at.as_str(), None))
                .or_insert_with(|| Batch {
                    worker: None,
                    expires_at: None,
                    sequences: Vec::new(),
                })
                .sequences
                .push(*sequence);
        }
    }
    batches
}

/// Names the children this statement made processed in `processed_batch`
/// (migration 0019), a row per parent and change, and per claim for those
/// recorded without their rows rewritten (migration 0022): the children
/// search finds them there, and readers what such a child's row does not say.
/// JSON `[[parent_id, changed_at, lo, hi, [sequences], claim_id, worker, expires_at], ...]`.
const LOG_PROCESSED: &str = "INSERT INTO processed_batch \
        (parent_id, changed_at, lo, hi, sequences, claim_id, worker, expires_at) \
    SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3, value -> 4, value ->> 5, value ->> 6, value ->> 7 \
    FROM json_each(?1)";

/// `LOG_PROCESSED`'s JSON for `batches`; `None` when there are none.
fn processed_json(batches: Batches<'_>) -> Option<String> {
    if batches.is_empty() {
        return None;
    }
    type Row<'a> = (
        &'a str,
        &'a str,
        i64,
        i64,
        Vec<i64>,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    );
    let rows: Vec<Row> = batches
        .into_iter()
        .map(|((parent_id, changed_at, claim_id), mut batch)| {
            batch.sequences.sort_unstable();
            let (lo, hi) = (batch.sequences[0], batch.sequences[batch.sequences.len() - 1]);
            let sequences = batch.sequences;
            (
                parent_id,
                changed_at,
                lo,
                hi,
                sequences,
                claim_id,
                batch.worker,
                batch.expires_at,
            )
        })
        .collect();
    Some(serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned()))
}

/// `CLOSE_LEASES`' JSON for the children just recorded, by `(parent,
/// claim)`; `None` when there are none.
fn leases_json(recorded: &BTreeMap<(&str, &str), Recorded>) -> Option<String> {
    if recorded.is_empty() {
        return None;
    }
    let rows: Vec<(&str, &str, i64, &[i64])> = recorded
        .iter()
        .map(|((p, c), Recorded(n, quiet))| (*p, *c, *n, quiet.as_slice()))
        .collect();
    Some(serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned()))
}

/// Takes the children just recorded out of their leases (`leases`, as
/// `leases_json` writes them; those recorded without their rows rewritten
/// out of the lease's list too): a lease whose last open child this was goes
/// (the usual case: a worker records a claim's children in one batch), the
/// rest count down. Then names the children made processed (`processed`,
/// see `LOG_PROCESSED`). One round trip to the writer's thread: sqlx runs
/// the statements of one text in turn, binding `?N` across them.
async fn close_and_log(tx: &mut SqliteTx, leases: Option<String>, processed: Option<String>) -> StoreResult<()> {
    static BOTH: LazyLock<String> = LazyLock::new(|| {
        format!(
            "{CLOSE_LEASES}; {COUNT_DOWN_LEASES}; {}",
            LOG_PROCESSED.replace("?1", "?2")
        )
    });
    static LEASES: LazyLock<String> = LazyLock::new(|| format!("{CLOSE_LEASES}; {COUNT_DOWN_LEASES}"));
    let (sql, first, second) = match (leases, processed) {
        (Some(leases), Some(processed)) => (BOTH.as_str(), leases, Some(processed)),
        (Some(leases), None) => (LEASES.as_str(), leases, None),
        (None, Some(processed)) => (LOG_PROCESSED, processed, None),
        (None, None) => return Ok(()),
    };
    let mut query = sqlx::query(sql).bind(first);
    if let Some(second) = second {
        query = query.bind(second);
    }
    query.execute(&mut **tx).await?;
    Ok(())
}

/// A parent's children that went terminal in one statement: by outcome, and
/// how many of them were in flight or held before (for its open counts).
#[derive(Debug, Default)]
pub(super) struct Counted {
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub from_in_flight: i64,
    pub from_held: i64,
}

/// Adds terminal counts to parents' projections and completes those whose last
/// child went terminal. Returns the parents this completed.
pub(super) async fn bump_parents(tx: &mut SqliteTx, deltas: &BTreeMap<&str, Counted>) -> StoreResult<Vec<ParentId>> {
    let mut completed = Vec::new();
    for (parent_id, delta) in deltas {
        // Says whether this statement's failures took the parent past its tolerance.
        static BUMP: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE parent SET processed = processed + ?2, failed = failed + ?3, skipped = skipped + ?4, \
                 settled_in_flight = settled_in_flight + ?5, settled_held = settled_held + ?6, \
                 last_progress_at = {now}, {minute} WHERE parent_id = ?1 \
                 RETURNING completed_at IS NULL AND {crossed} AND NOT {crossed_before} AS crossed",
                now = NOW,
                minute = sql::count_minute("", super::MINUTE, "?2", "?3"),
                crossed = sql::parent_crossed("parent", "failed"),
                crossed_before = sql::parent_crossed("parent", "(failed - ?3)")
            )
        });
        let crossed: Option<bool> = sqlx::query_scalar(BUMP.as_str())
            .bind(parent_id)
            .bind(delta.processed)
            .bind(delta.failed)
            .bind(delta.skipped)
            .bind(delta.from_in_flight)
            .bind(delta.from_held)
            .fetch_optional(&mut **tx)
            .await?;
        if crossed == Some(true) {
            // The rest of the parent is skipped and it completes, failed, here.
            let parent = ParentId::from_ledger((*parent_id).to_owned());
            let (_, ended) = close_skipping(&mut *tx, &parent, PARENT_FAILED, false).await?;
            if ended {
                completed.push(parent);
            }
            continue;
        }
        let done: Option<String> = sqlx::query_scalar(COMPLETE_PARENT.as_str())
            .bind(parent_id)
            .fetch_optional(&mut **tx)
            .await?;
        completed.extend(done.map(ParentId::from_ledger));
    }
    // Their webhook events, in the transaction that completed them.
    tx.enqueue_completed(&completed).await?;
    Ok(completed)
}

#[async_trait]
impl LoserWrites for SqliteTx {
    async fn loser_facts(&mut self, losers: &[&OutcomeWrite]) -> StoreResult<Vec<LoserFacts>> {
        let named: Vec<(&str, i64, Option<String>)> = losers
            .iter()
            .map(|w| (w.parent_id.as_str(), w.sequence, w.claim_id.map(|c| c.to_string())))
            .collect();
        let rows: Vec<(i64, Option<bool>, Option<String>, bool)> = sqlx::query_as(AssertSqlSafe(sql::loser_facts(
            &super::SQLITE,
            "(SELECT key AS i, value ->> 0 AS parent_id, value ->> 1 AS sequence, value ->> 2 AS claim_id \
          FROM json_each($1)) AS u",
        )))
        .bind(serde_json::to_string(&named).unwrap_or_else(|_| "[]".to_owned()))
        .fetch_all(&mut **self)
        .await?;
        let mut facts = vec![LoserFacts::default(); losers.len()];
        for (i, decomposed, state, admitted) in rows {
            facts[i as usize] = LoserFacts {
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
            .bind(write.claim_id.map(|c| c.to_string()))
            .execute(&mut **self)
            .await?;
        Ok(())
    }
}

/// Outcome writes as one JSON array of
/// `[parent_id, sequence, outcome, reason, result, claim_id]` for `json_each`,
/// written straight from the writes (a result stays the text the worker sent).
pub(super) fn outcomes_json<'a>(writes: impl Iterator<Item = &'a OutcomeWrite>) -> String {
    type Row<'a> = (
        &'a str,
        i64,
        &'a str,
        Option<&'a str>,
        Option<&'a RawValue>,
        Option<Uuid>,
    );
    let rows: Vec<Row> = writes
        .map(|w| {
            (
                w.parent_id.as_str(),
                w.sequence,
                w.outcome.as_str(),
                w.reason.as_deref(),
                w.result.as_deref(),
                w.claim_id,
            )
        })
        .collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned())
}
