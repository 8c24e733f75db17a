//! Claims on SQLite: extend, release, retry and the sweep of expired
//! leases; the lane claim is `lane_claim`.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::group::{Write, Written};
use super::outcomes::{Counted, bump_parents};
use super::{NOW, SqliteStore, SqliteTx, now_by};
use crate::ledger::{ClaimScope, ParentId};
use crate::store::backend::{Claims, Expired, Extended, LaneClaimParams, Release};
use crate::store::reports::LaneClaim;
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

#[async_trait]
impl Claims for SqliteStore {
    /// Leases children of one parent for each of `asks` in turn, in one
    /// transaction of the writer's group. Writes take turns in SQLite, so a
    /// claim never finds a lane busy and `turn` changes nothing.
    async fn claim_lane(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>> {
        let claim = Write::Claim {
            parent_id: lane.parent_id.clone(),
            queue: lane.queue.cloned(),
            asks: lane.asks.to_vec(),
        };
        match self.in_group(claim).await? {
            Written::Claims(claims) => Ok(claims),
            Written::Applied(_) => unreachable!("a lane claim is answered with its claims"),
        }
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

    /// Returns held children to pending; how many.
    async fn retry_held(&self, parent_id: &ParentId, sequence: Option<i64>) -> StoreResult<u64> {
        let mut tx = self.held_tx().await?;
        let retried = sqlx::query(RETRY_HELD.as_str())
            .bind(parent_id.as_str())
            .bind(sequence)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if retried > 0 {
            static RETRIED: LazyLock<String> = LazyLock::new(|| {
                format!(
                    "UPDATE lane SET held_out = held_out + ?2, \
                         ready_at = CASE WHEN ready_at IS NULL OR ready_at > {NOW} THEN {NOW} ELSE ready_at END \
                     WHERE parent_id = ?1"
                )
            });
            sqlx::query(RETRIED.as_str())
                .bind(parent_id.as_str())
                .bind(retried as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(retried)
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
