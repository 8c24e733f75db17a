//! Outcomes on SQLite recorded without rewriting their children's rows:
//! `processed`, without a reason or result, from the claim whose lease
//! lists the child (`outcomes` records the rest, and the counters of both).

use std::collections::BTreeMap;
use std::sync::LazyLock;

use uuid::Uuid;

use super::outcomes::outcomes_json;
use super::{NOW, SqliteTx};
use crate::ledger::{Outcome, OutcomeWrite};
use crate::store::{StoreResult, sql};

/// The writes an outcome records without rewriting their children's rows
/// (as on Postgres, migration 0023; SQLite's migration 0022): `processed`,
/// without a reason or result, from the claim whose lease lists the child,
/// which is in flight. Such a row stays as the claim found it (pending,
/// below its lane's floor); the outcome takes the child out of its lease
/// and names it, with the claim, its worker and the lease's expiry, in an
/// outcome batch, and readers show it processed (`sql::quiet_in_view`). The
/// rewrite of each such row was about a quarter of SQLite's work per child:
/// `state` and `changed_at` are in every partial index on `child`.
/// Returns each write's index in `?1` (JSON, as `outcomes_json` writes
/// them), its lease's worker and expiry, and the statement's time.
static QUIET_OUTCOMES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH j AS MATERIALIZED ( \
             SELECT key AS i, value ->> 0 AS parent_id, value ->> 1 AS sequence, value ->> 5 AS claim_id \
             FROM jsonb_each(?1) \
             WHERE value ->> 2 = 'processed' AND value ->> 3 IS NULL AND json_type(value, '$[4]') = 'null' \
               AND value ->> 5 IS NOT NULL), \
             {LISTED} \
         SELECT DISTINCT j.i, h.worker, h.expires_at, {now} AS at \
         FROM j \
             JOIN h ON h.claim_id = j.claim_id AND h.parent_id = j.parent_id AND h.sequence = j.sequence \
             JOIN child c ON c.parent_id = j.parent_id AND c.sequence = j.sequence \
             JOIN lane ln ON ln.parent_id = j.parent_id \
         WHERE {leased} \
           AND EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = j.parent_id AND p.decomposed_at IS NOT NULL)",
        now = NOW,
        leased = sql::leased("ln.floor", "true"),
    )
});

/// `QUIET_OUTCOMES` for the usual batch: all of one claim's children on a
/// parent, which its lease lists in the same order. `?1` is JSON
/// `[[parent_id, claim_id, [sequences, ascending]], ...]`, a group per
/// parent and claim; a group whose list is its lease's (the same text) is
/// read here, each child looked up by key, without the lease's list taken
/// apart and indexed (`LISTED`: two thirds of the statement's time with 500
/// writes). Returns, of those, the group's index, the sequence, its
/// lease's worker and expiry, and the statement's time; the writes of a
/// group not whole go to `QUIET_OUTCOMES`.
static WHOLE_LEASES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH g AS MATERIALIZED ( \
             SELECT key AS gi, value ->> 0 AS parent_id, value ->> 1 AS claim_id, value ->> 2 AS sequences \
             FROM json_each(?1)), \
         w AS MATERIALIZED ( \
             SELECT g.gi, g.parent_id, g.sequences, l.worker, l.expires_at, ln.floor \
             FROM g \
                 JOIN claim_lease l ON l.claim_id = g.claim_id AND l.parent_id = g.parent_id \
                     AND l.sequences = g.sequences \
                 JOIN lane ln ON ln.parent_id = g.parent_id \
             WHERE EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = g.parent_id AND p.decomposed_at IS NOT NULL)) \
         SELECT w.gi, s.value, w.worker, w.expires_at, {now} AS at \
         FROM w CROSS JOIN json_each(w.sequences) s CROSS JOIN child c \
         WHERE c.parent_id = w.parent_id AND c.sequence = s.value AND {leased}",
        now = NOW,
        leased = sql::leased("w.floor", "true"),
    )
});

/// The children listed by the leases of the claims the writes `j` name, as
/// `(claim_id, parent_id, worker, expires_at, sequence)` rows `h`.
/// Materialized, so a write finds its child through an index SQLite builds
/// once: joined as a subquery, each write read its lease's whole list again
/// (28 ms for 500 writes of one lease, against 3 ms).
pub(super) const LISTED: &str = "h AS MATERIALIZED ( \
        SELECT l.claim_id, l.parent_id, l.worker, l.expires_at, s.value AS sequence \
        FROM claim_lease l, json_each(l.sequences) s \
        WHERE (l.claim_id, l.parent_id) IN (SELECT claim_id, parent_id FROM j WHERE claim_id IS NOT NULL))";

/// A write `QUIET_OUTCOMES` recorded: its index, its lease's worker and
/// expiry, and the statement's time.
pub(super) type Quiet = (i64, Option<String>, String, String);

/// The writes recorded without their rows rewritten (`QUIET_OUTCOMES`):
/// those of whole leases first (`WHOLE_LEASES`), then the rest that may be.
/// `json` is all of `writes`, as `outcomes_json` writes them.
pub(super) async fn record_quiet(tx: &mut SqliteTx, writes: &[OutcomeWrite], json: &str) -> StoreResult<Vec<Quiet>> {
    // The writes that may be, by parent and claim, in sequence order.
    let mut groups: BTreeMap<(&str, Uuid), Vec<usize>> = BTreeMap::new();
    for (i, w) in writes.iter().enumerate() {
        if let (true, Some(claim_id)) = (may_be_quiet(w), w.claim_id) {
            groups.entry((w.parent_id.as_str(), claim_id)).or_default().push(i);
        }
    }
    if groups.is_empty() {
        return Ok(Vec::new());
    }
    let groups: Vec<((&str, Uuid), Vec<usize>)> = groups
        .into_iter()
        .map(|(key, mut at)| {
            at.sort_by_key(|&i| writes[i].sequence);
            (key, at)
        })
        .collect();
    let listed: Vec<(&str, Uuid, Vec<i64>)> = groups
        .iter()
        .map(|((parent_id, claim_id), at)| (*parent_id, *claim_id, at.iter().map(|&i| writes[i].sequence).collect()))
        .collect();
    let whole: Vec<(i64, i64, Option<String>, String, String)> = sqlx::query_as(WHOLE_LEASES.as_str())
        .bind(serde_json::to_string(&listed).unwrap_or_else(|_| "[]".to_owned()))
        .fetch_all(&mut **tx)
        .await?;
    let mut read = vec![false; groups.len()];
    let mut quiet: Vec<Quiet> = Vec::with_capacity(whole.len());
    for (gi, sequence, worker, expires_at, at) in whole {
        let Some((_, at_group)) = groups.get(gi as usize) else {
            continue;
        };
        read[gi as usize] = true;
        // A whole lease lists each child once, so its group names it once.
        if let Ok(k) = at_group.binary_search_by_key(&sequence, |&i| writes[i].sequence) {
            quiet.push((at_group[k] as i64, worker, expires_at, at));
        }
    }
    if read.iter().all(|r| *r) {
        return Ok(quiet);
    }
    // Groups not whole (or whose children were all recorded already).
    let mut rest: Vec<usize> = groups
        .iter()
        .zip(&read)
        .filter(|(_, read)| !**read)
        .flat_map(|((_, at), _)| at.iter().copied())
        .collect();
    rest.sort_unstable();
    let rest_json = if rest.len() == writes.len() {
        json.to_owned()
    } else {
        outcomes_json(rest.iter().map(|&i| &writes[i]))
    };
    let others: Vec<Quiet> = sqlx::query_as(QUIET_OUTCOMES.as_str())
        .bind(rest_json)
        .fetch_all(&mut **tx)
        .await?;
    quiet.extend(others.into_iter().filter_map(|(k, worker, expires_at, at)| {
        let i = *rest.get(usize::try_from(k).ok()?)?;
        Some((i as i64, worker, expires_at, at))
    }));
    Ok(quiet)
}

/// Whether `QUIET_OUTCOMES` might record write `w`: worth asking only then.
fn may_be_quiet(w: &OutcomeWrite) -> bool {
    w.outcome == Outcome::Processed && w.claim_id.is_some() && w.reason.is_none() && w.result.is_none()
}
