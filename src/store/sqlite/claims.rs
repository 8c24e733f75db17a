//! Claims on SQLite: the lease pick, extend, release, retry and the sweep of
//! expired leases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteRow;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::outcomes::{Counted, bump_parents};
use super::{NOW, SqliteStore, SqliteTx, now_by};
use crate::ledger::{ClaimScope, ParentId, QueueName};
use crate::store::admission::Admission;
use crate::store::backend::{Claims, Expired, Extended, LaneClaimParams, Release};
use crate::store::reports::{LaneAsk, LaneClaim};
use crate::store::{StoreResult, sql};

/// Lowers the `ready_at` of lanes to when children given back to them come
/// due: JSON `[[parent_id, due], ...]` in `?1`.
const GIVE_BACK: &str = "UPDATE lane SET ready_at = CASE WHEN ready_at IS NULL OR ready_at > j.value ->> 1 \
        THEN j.value ->> 1 ELSE ready_at END \
    FROM json_each(?1) AS j WHERE lane.parent_id = j.value ->> 0";

/// Tells the lanes of `due` (parent, when its earliest child given back
/// comes due) about them (see `GIVE_BACK`).
async fn give_back(tx: &mut SqliteTx, due: &BTreeMap<&str, String>) -> StoreResult<()> {
    if !due.is_empty() {
        let rows: Vec<(&str, &str)> = due.iter().map(|(p, at)| (*p, at.as_str())).collect();
        sqlx::query(GIVE_BACK)
            .bind(serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned()))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// Notes in `due` when a child given back to `parent_id` at `at` comes due.
fn note_due<'a>(due: &mut BTreeMap<&'a str, String>, parent_id: &'a str, at: &str) {
    let earliest = due.entry(parent_id).or_insert_with(|| at.to_owned());
    if at < earliest.as_str() {
        *earliest = at.to_owned();
    }
}

/// SQLite's random fraction in [0, 1).
const RANDOM: &str = "((random() & 1048575) / 1048576.0)";

static RETRY_HELD: LazyLock<String> = LazyLock::new(|| sql::retry_held(NOW));

/// Records the lease of claim `?1` on parent `?2`: the children `?3` (a
/// JSON array; `?6` of them, `?7` the lowest, `?8` the highest), until `?4`
/// (a clock modifier) from now, by worker `?5`, in queue `?9` under flow
/// key `?10`, made at `?11` (when admission let it through; NULL: now); a second claim of the same
/// claim id on the lane (a top-up) adds its children. The children it hands
/// out were told an expiry read a moment before, never a later one.
static LEASE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at, worker, open, lo, hi, \
             queue, flow_key) \
         VALUES (?1, ?2, ?3, {expires}, coalesce(?11, {NOW}), ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (claim_id, parent_id) DO UPDATE SET \
             sequences = (SELECT json_group_array(value) FROM ( \
                 SELECT value FROM json_each(claim_lease.sequences) \
                 UNION ALL SELECT value FROM json_each(excluded.sequences))), \
             expires_at = max(claim_lease.expires_at, excluded.expires_at), \
             open = claim_lease.open + excluded.open, \
             lo = min(claim_lease.lo, excluded.lo), hi = max(claim_lease.hi, excluded.hi)",
        expires = now_by("?4")
    )
});

/// The children claim `?1` leased, as `(parent_id, sequence)` rows (some
/// may have been released or recorded since: statements that use it check).
const LEASED: &str = "SELECT l.parent_id, s.value FROM claim_lease l, json_each(l.sequences) s WHERE l.claim_id = ?1";

/// Takes the children `?3` (a JSON array) out of claim `?1`'s lease on
/// parent `?2`; `?4` of them were still open.
const LET_GO: &str = "UPDATE claim_lease SET \
        sequences = (SELECT json_group_array(value) FROM json_each(claim_lease.sequences) \
                     WHERE value NOT IN (SELECT value FROM json_each(?3))), \
        open = open - ?4 \
    WHERE claim_id = ?1 AND parent_id = ?2";

/// Drops claim `?1`'s lease on parent `?2` once it holds nothing.
const DROP_EMPTY: &str = "DELETE FROM claim_lease WHERE claim_id = ?1 AND parent_id = ?2 AND open <= 0";

/// Counts leases that ended without an outcome (`unclaimed`) and, of those,
/// the ones kept held (`held_in`), per lane: JSON `[[parent_id, ended, held], …]` in `?1`.
const COUNT_UNCLAIMED: &str = "UPDATE lane SET unclaimed = unclaimed + j.value ->> 1, held_in = held_in + j.value ->> 2 \
    FROM json_each(?1) AS j WHERE lane.parent_id = j.value ->> 0";

/// Adds the leases that ended without an outcome to their lanes (see `COUNT_UNCLAIMED`).
async fn count_unclaimed(tx: &mut SqliteTx, ended: &BTreeMap<&str, (i64, i64)>) -> StoreResult<()> {
    if !ended.is_empty() {
        let rows: Vec<(&str, i64, i64)> = ended.iter().map(|(p, (n, held))| (*p, *n, *held)).collect();
        sqlx::query(COUNT_UNCLAIMED)
            .bind(serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned()))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

/// A claimed child's trace context: its own when children have their own
/// (`?7`), else its parent's (`?8`).
const TRACEPARENT: &str = "coalesce((SELECT t.traceparent FROM trace_context t \
    WHERE ?7 AND t.parent_id = child.parent_id AND t.sequence = child.sequence), ?8) AS traceparent";

/// Up to `?2` + 1 children of parent `?1` from its floor `?3` up, in the
/// primary key (past the floor no claim has taken any), with what a claim
/// hands out: the extra one is the next floor. `?4` is the lease's clock
/// modifier, `?5` the claim id, `?6` the lane's queue, `?7` and `?8` the
/// trace context (`TRACEPARENT`).
static FRESH: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT parent_id, sequence, key, payload, attempts + 1 AS attempts, previous_attempt, \
             {lease} AS lease_expires_at, ?5 AS claim_id, ?6 AS queue, 0 AS returned, {TRACEPARENT} \
         FROM child WHERE parent_id = ?1 AND sequence >= ?3 AND state = 'pending' AND available_at IS NULL \
         ORDER BY sequence LIMIT ?2 + 1",
        lease = now_by("?4")
    )
});

/// Up to `?2` children given back to parent `?1` that are due, earliest due
/// first, as `FRESH` reads them.
static DUE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT parent_id, sequence, key, payload, attempts + 1 AS attempts, previous_attempt, \
             {lease} AS lease_expires_at, ?5 AS claim_id, ?6 AS queue, 1 AS returned, {TRACEPARENT} \
         FROM child WHERE parent_id = ?1 AND state = 'pending' AND available_at <= {NOW} \
         ORDER BY available_at LIMIT ?2",
        lease = now_by("?4")
    )
});

#[async_trait]
impl Claims for SqliteStore {
    /// Leases children of one parent for each of `asks` in turn. Writes take
    /// turns in SQLite, so a claim never finds a lane busy and `turn` changes nothing.
    async fn claim_lane(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>> {
        let mut claims = Vec::with_capacity(lane.asks.len());
        for ask in lane.asks {
            claims.push(self.claim_one(lane.parent_id, lane.queue, ask).await?);
        }
        Ok(claims)
    }

    async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<Extended> {
        static EXTEND: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE claim_lease SET expires_at = {lease} WHERE claim_id = ?1 AND expires_at > {NOW} \
                 RETURNING open, expires_at",
                lease = now_by("?2")
            )
        });
        let mut tx = self.held_tx().await?;
        let rows: Vec<(i64, DateTime<Utc>)> = sqlx::query_as(EXTEND.as_str())
            .bind(claim_id.to_string())
            .bind(format!("+{lease_seconds} seconds"))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Extended {
            extended: rows.iter().map(|(open, _)| *open as u64).sum(),
            lease_expires_at: rows.into_iter().map(|(_, at)| at).max(),
        })
    }

    async fn release(&self, release: Release<'_>) -> StoreResult<Vec<(ParentId, u64)>> {
        static RELEASE: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE child SET available_at = CASE WHEN ?3 > 0 THEN {later} ELSE {backoff} END, \
                     previous_attempt = 'released', attempts = attempts + 1, previous_claim_id = claim_id, \
                     claim_id = ?1, lease_expires_at = NULL, changed_at = {NOW}, \
                     claimed_by = (SELECT l.worker FROM claim_lease l \
                                   WHERE l.claim_id = ?1 AND l.parent_id = child.parent_id) \
                 WHERE state = 'pending' AND available_at IS NULL \
                   AND (parent_id, sequence) IN ({LEASED}) \
                   AND (?2 OR (parent_id, sequence) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?4))) \
                 RETURNING parent_id, sequence, available_at",
                later = now_by("'+' || ?3 || ' seconds'"),
                backoff = now_by(&format!(
                    "'+' || (SELECT round({}, 3) FROM parent p WHERE p.parent_id = child.parent_id) || ' seconds'",
                    sql::backoff_seconds(RANDOM, "p", "attempts + 1")
                ))
            )
        });
        let Release {
            claim_id,
            children,
            delay_seconds,
        } = release;
        let named: Vec<(&str, i64)> = children
            .unwrap_or_default()
            .iter()
            .map(|c| (c.parent_id.as_str(), c.sequence))
            .collect();
        let named = serde_json::to_string(&named).unwrap_or_else(|_| "[]".to_owned());
        let mut tx = self.held_tx().await?;
        let released: Vec<(String, i64, String)> = sqlx::query_as(RELEASE.as_str())
            .bind(claim_id.to_string())
            .bind(children.is_none())
            .bind(delay_seconds)
            .bind(named)
            .fetch_all(&mut *tx)
            .await?;
        let mut by_parent: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
        let mut due = BTreeMap::new();
        for (parent_id, sequence, available_at) in &released {
            by_parent.entry(parent_id).or_default().push(*sequence);
            note_due(&mut due, parent_id, available_at);
        }
        let claim = claim_id.to_string();
        for (parent_id, sequences) in &by_parent {
            sqlx::query(LET_GO)
                .bind(&claim)
                .bind(parent_id)
                .bind(serde_json::to_string(sequences).unwrap_or_else(|_| "[]".to_owned()))
                .bind(sequences.len() as i64)
                .execute(&mut *tx)
                .await?;
            sqlx::query(DROP_EMPTY)
                .bind(&claim)
                .bind(parent_id)
                .execute(&mut *tx)
                .await?;
        }
        give_back(&mut tx, &due).await?;
        let ended: BTreeMap<&str, (i64, i64)> = by_parent.iter().map(|(p, s)| (*p, (s.len() as i64, 0))).collect();
        count_unclaimed(&mut tx, &ended).await?;
        tx.commit().await?;
        Ok(by_parent
            .into_iter()
            .map(|(p, s)| (ParentId::from_ledger(p.to_owned()), s.len() as u64))
            .collect())
    }

    /// Returns a held child to pending; whether it did.
    async fn retry_held(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<bool> {
        let mut tx = self.held_tx().await?;
        let retried = sqlx::query(RETRY_HELD.as_str())
            .bind(parent_id.as_str())
            .bind(sequence)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if retried == 1 {
            static RETRIED: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "UPDATE lane SET held_out = held_out + 1, \
                         ready_at = CASE WHEN ready_at IS NULL OR ready_at > {NOW} THEN {NOW} ELSE ready_at END \
                     WHERE parent_id = ?1"
                )
            });
            sqlx::query(RETRIED.as_str())
                .bind(parent_id.as_str())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(retried == 1)
    }

    /// Moves the children of up to `batch` leases that ran out, in `scope` or
    /// everywhere, and drops those leases. Returns how many moved, and the
    /// parents whose last child this failed.
    async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> StoreResult<Expired> {
        let (scope_filter, scope_key) = match scope {
            None => ("", None),
            Some(ClaimScope::Parent(parent_id)) => ("AND parent_id = ?2", Some(parent_id.as_str())),
            Some(ClaimScope::Queue(queue)) => (
                "AND parent_id IN (SELECT parent_id FROM parent WHERE queue = ?2 AND completed_at IS NULL)",
                Some(queue.as_str()),
            ),
        };
        let mut tx = self.held_tx().await?;
        let due: Vec<(String, String, String, Option<String>, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "DELETE FROM claim_lease WHERE (claim_id, parent_id) IN ( \
                 SELECT claim_id, parent_id FROM claim_lease WHERE expires_at <= {NOW} {scope_filter} \
                 ORDER BY expires_at LIMIT ?1) \
             RETURNING claim_id, parent_id, sequences, worker, expires_at"
        )))
        .bind(batch)
        .bind(scope_key)
        .fetch_all(&mut *tx)
        .await?;
        let more = due.len() as i64 >= batch;
        let leases: Vec<(&str, &str, serde_json::Value, Option<&str>, &str)> = due
            .iter()
            .map(|(claim, parent, sequences, worker, expires)| {
                (
                    claim.as_str(),
                    parent.as_str(),
                    serde_json::from_str(sequences).unwrap_or_default(),
                    worker.as_deref(),
                    expires.as_str(),
                )
            })
            .collect();
        let exhausted = "p.max_attempts IS NOT NULL AND c.attempts + 1 >= p.max_attempts";
        let moved: Vec<(String, String, Option<String>)> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE child AS c SET \
                 state = CASE WHEN {exhausted} THEN 'failed' WHEN p.expired_lease = 'hold' THEN 'held' \
                              ELSE 'pending' END, \
                 available_at = CASE WHEN {exhausted} OR p.expired_lease = 'hold' THEN NULL ELSE {backoff} END, \
                 reason = CASE WHEN {exhausted} THEN 'attempts exhausted' ELSE c.reason END, \
                 terminal_at = CASE WHEN {exhausted} THEN {now} ELSE c.terminal_at END, \
                 attempts = c.attempts + 1, previous_claim_id = c.claim_id, claim_id = e.claim_id, \
                 claimed_by = e.worker, lease_expires_at = e.expires_at, \
                 previous_attempt = 'expired', changed_at = {now} \
             FROM parent p, ( \
                 SELECT l.value ->> 0 AS claim_id, l.value ->> 1 AS parent_id, s.value AS sequence, \
                     l.value ->> 3 AS worker, l.value ->> 4 AS expires_at \
                 FROM json_each(?1) l, json_each(l.value -> 2) s) e \
             WHERE c.parent_id = e.parent_id AND c.sequence = e.sequence AND p.parent_id = c.parent_id \
               AND c.state = 'pending' AND c.available_at IS NULL \
             RETURNING parent_id, state, available_at",
            now = NOW,
            backoff = now_by(&format!(
                "'+' || round({}, 3) || ' seconds'",
                sql::backoff_seconds(RANDOM, "p", "c.attempts + 1")
            ))
        )))
        .bind(serde_json::to_string(&leases).unwrap_or_else(|_| "[]".to_owned()))
        .fetch_all(&mut *tx)
        .await?;
        let mut failures: BTreeMap<&str, Counted> = BTreeMap::new();
        for (parent_id, _, _) in moved.iter().filter(|(_, state, _)| state == "failed") {
            failures.entry(parent_id.as_str()).or_default().failed += 1;
        }
        let completed = bump_parents(&mut tx, &failures).await?;
        let mut ended: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        let mut given_back = BTreeMap::new();
        for (parent_id, state, available_at) in &moved {
            let lane = ended.entry(parent_id.as_str()).or_default();
            lane.0 += 1;
            lane.1 += i64::from(state == "held");
            if let Some(at) = available_at {
                note_due(&mut given_back, parent_id, at);
            }
        }
        count_unclaimed(&mut tx, &ended).await?;
        give_back(&mut tx, &given_back).await?;
        tx.commit().await?;
        Ok(Expired {
            moved: moved.len() as u64,
            completed,
            more,
        })
    }
}

impl SqliteStore {
    /// Leases up to `ask.limit` claimable children of one parent, lowest
    /// sequence first: from the floor up (`FRESH`) and, when some are due,
    /// given back ones (`DUE`); only the latter are written. Then the lease
    /// row, and the lane's new floor.
    async fn claim_one(
        &self,
        parent_id: &ParentId,
        queue: Option<&QueueName>,
        ask: &LaneAsk,
    ) -> StoreResult<LaneClaim> {
        static LANE: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT queue, floor, coalesce(ready_at <= {NOW}, 0), traceparent, children_traced, flow_key, \
                     CASE WHEN not_before > {NOW} THEN not_before END, \
                     (SELECT f.limited FROM flow_limit f WHERE f.queue = lane.queue AND f.flow_key = '') \
                 FROM lane WHERE parent_id = ?1 \
                 AND (?2 IS NULL OR queue = ?2) \
                 AND NOT EXISTS (SELECT 1 FROM queue_pause qp WHERE qp.queue = lane.queue)"
            )
        });
        const MOVE_LANE: &str = "UPDATE lane SET floor = ?2, claimed = claimed + ?3, \
                     served = CASE WHEN ?3 > 0 THEN (SELECT served FROM lane_clock) ELSE served END, \
                     ready_at = CASE WHEN ?4 THEN ( \
                         SELECT min(c.available_at) FROM child c INDEXED BY child_delayed \
                         WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL) \
                     ELSE ready_at END \
                 WHERE parent_id = ?1";
        let mut tx = self.held_tx().await?;
        type Lane = (
            String,
            Option<i64>,
            bool,
            Option<String>,
            bool,
            Option<String>,
            Option<DateTime<Utc>>,
            Option<bool>,
        );
        let lane: Option<Lane> = sqlx::query_as(LANE.as_str())
            .bind(parent_id.as_str())
            .bind(queue.map(QueueName::as_str))
            .fetch_optional(&mut *tx)
            .await?;
        let Some((queue, floor, due, traceparent, children_traced, flow_key, wait_until, flow_rows)) = lane else {
            return Ok(LaneClaim::default());
        };
        if wait_until.is_some() || (floor.is_none() && !due) {
            return Ok(LaneClaim::held_back(std::slice::from_ref(ask), None, wait_until).remove(0));
        }
        let flow_key = flow_key.as_deref();
        let admission = Admission::read(&mut tx, &queue, flow_key, flow_rows, ask.limit, 0).await?;
        let held_by = admission.admitted.and_then(|a| a.held_by);
        let allowed = admission.allowed(ask.limit);
        if allowed == 0 {
            admission.spend(&mut tx, &queue, flow_key, 0).await?;
            tx.commit().await?;
            let next = admission.admitted.and_then(|a| a.next_available_at);
            return Ok(LaneClaim::held_back(std::slice::from_ref(ask), held_by, next).remove(0));
        }
        let ask = &LaneAsk {
            limit: allowed,
            ..ask.clone()
        };
        let lease = format!("+{} seconds", ask.lease_seconds);
        let claim = ask.claim_id.to_string();
        let read = |sql: &'static str| {
            sqlx::query(sql)
                .bind(parent_id.as_str())
                .bind(ask.limit)
                .bind(floor)
                .bind(&lease)
                .bind(&claim)
                .bind(&queue)
                .bind(children_traced)
                .bind(&traceparent)
        };
        let fresh = match floor {
            Some(_) => read(FRESH.as_str()).fetch_all(&mut *tx).await?,
            None => Vec::new(),
        };
        let mut picked: Vec<&SqliteRow> = fresh.iter().take(ask.limit as usize).collect();
        let given_back = if due {
            read(DUE.as_str()).fetch_all(&mut *tx).await?
        } else {
            Vec::new()
        };
        let sequence = |row: &SqliteRow| row.try_get::<i64, _>("sequence");
        if !given_back.is_empty() {
            picked.extend(given_back.iter());
            let mut keyed = picked
                .into_iter()
                .map(|row| Ok((sequence(row)?, row)))
                .collect::<Result<Vec<_>, sqlx::Error>>()?;
            keyed.sort_by_key(|(s, _)| *s);
            keyed.truncate(ask.limit as usize);
            picked = keyed.into_iter().map(|(_, row)| row).collect();
        }
        let mut taken = BTreeSet::new();
        let mut returned = Vec::new();
        for row in &picked {
            let s = sequence(row)?;
            taken.insert(s);
            if row.try_get::<i64, _>("returned")? == 1 {
                returned.push(s);
            }
        }
        let next_floor = fresh
            .iter()
            .map(sequence)
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .find(|s| !taken.contains(s));
        if !returned.is_empty() {
            sqlx::query(
                "UPDATE child SET available_at = NULL \
                 WHERE parent_id = ?1 AND sequence IN (SELECT value FROM json_each(?2))",
            )
            .bind(parent_id.as_str())
            .bind(serde_json::to_string(&returned).unwrap_or_else(|_| "[]".to_owned()))
            .execute(&mut *tx)
            .await?;
        }
        if let (Some(lo), Some(hi)) = (taken.first(), taken.last()) {
            sqlx::query("UPDATE lane_clock SET served = served + 1")
                .execute(&mut *tx)
                .await?;
            sqlx::query(LEASE.as_str())
                .bind(&claim)
                .bind(parent_id.as_str())
                .bind(serde_json::to_string(&taken).unwrap_or_else(|_| "[]".to_owned()))
                .bind(&lease)
                .bind(ask.worker.as_deref())
                .bind(taken.len() as i64)
                .bind(lo)
                .bind(hi)
                .bind(&queue)
                .bind(flow_key)
                .bind(
                    admission
                        .admitted_at()
                        .map(|at| at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()),
                )
                .execute(&mut *tx)
                .await?;
        }
        admission.spend(&mut tx, &queue, flow_key, taken.len() as i64).await?;
        sqlx::query(MOVE_LANE)
            .bind(parent_id.as_str())
            .bind(next_floor)
            .bind(taken.len() as i64)
            .bind(due)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut claim = LaneClaim::taken_from_rows(std::slice::from_ref(ask), picked)?.remove(0);
        claim.held_by = held_by;
        Ok(claim)
    }
}
