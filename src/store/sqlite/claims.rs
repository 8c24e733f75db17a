//! Claims on SQLite: the lease pick, extend, release, retry and the sweep of
//! expired leases.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::outcomes::{Counted, bump_parents};
use super::{NOW, SqliteStore, SqliteTx, now_by};
use crate::ledger::{ClaimScope, ParentId, QueueName};
use crate::store::backend::{Claims, Expired, Extended, LaneClaimParams, Release};
use crate::store::reports::{LaneAsk, LaneClaim};
use crate::store::{StoreResult, sql};

/// Recomputes the lanes of the parents in JSON array `?1` from their rows:
/// the lowest pending sequence without a delay, and the earliest delay. In
/// SQLite an index holds no entries of rows gone by, so this is cheap, as
/// long as it reads the pending index: left to itself the planner walks the
/// primary key from sequence 0, through every child claimed or finished.
const REFRESH_LANES: &str = "UPDATE lane SET \
        floor = (SELECT c.sequence FROM child c INDEXED BY child_pending \
                 WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NULL \
                 ORDER BY c.sequence LIMIT 1), \
        ready_at = (SELECT min(c.available_at) FROM child c INDEXED BY child_delayed \
                    WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL) \
    WHERE parent_id IN (SELECT value FROM json_each(?1))";

/// Refreshes the lanes of `parents` (see `REFRESH_LANES`).
async fn refresh_lanes<'a>(tx: &mut SqliteTx, parents: impl IntoIterator<Item = &'a str>) -> StoreResult<()> {
    let parents: Vec<&str> = parents.into_iter().collect();
    if !parents.is_empty() {
        sqlx::query(REFRESH_LANES)
            .bind(serde_json::to_string(&parents).unwrap_or_else(|_| "[]".to_owned()))
            .execute(&mut **tx)
            .await?;
    }
    Ok(())
}

static RETRY_HELD: LazyLock<String> = LazyLock::new(|| sql::retry_held(NOW));

/// Records the lease of claim `?1` on parent `?2`: the children `?3` (a
/// JSON array), until `?4`, claimed at `?5` (when its children changed);
/// a second claim of the same claim id on the lane (a top-up) adds its
/// children.
const LEASE: &str = "INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at) \
         VALUES (?1, ?2, ?3, ?4, ?5) \
         ON CONFLICT (claim_id, parent_id) DO UPDATE SET \
             sequences = (SELECT json_group_array(value) FROM ( \
                 SELECT value FROM json_each(claim_lease.sequences) \
                 UNION ALL SELECT value FROM json_each(excluded.sequences))), \
             expires_at = max(claim_lease.expires_at, excluded.expires_at)";

/// The children claim `?1` leased, as `(parent_id, sequence)` rows (some
/// may have been released or recorded since: statements that use it check).
const LEASED: &str = "SELECT l.parent_id, s.value FROM claim_lease l, json_each(l.sequences) s WHERE l.claim_id = ?1";

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

/// Leases up to `?2` children of parent `?1` from `?6`, its floor, up (and,
/// with `due`, its delayed children that are due, earliest due first), lowest
/// sequence first. Binds: `?3` claim id, `?4` worker, `?5` lease modifier.
fn lane_claim(due: bool) -> String {
    let due = if due {
        format!(
            "UNION ALL SELECT sequence FROM ( \
                 SELECT sequence FROM child WHERE parent_id = ?1 AND state = 'pending' \
                   AND available_at <= {NOW} ORDER BY available_at LIMIT ?2)"
        )
    } else {
        String::new()
    };
    format!(
        "UPDATE child SET state = 'in_flight', attempts = attempts + 1, previous_claim_id = claim_id, \
             claim_id = ?3, claimed_by = ?4, lease_expires_at = {lease}, available_at = NULL, changed_at = {now} \
         WHERE parent_id = ?1 AND sequence IN ( \
             SELECT sequence FROM ( \
                 SELECT sequence FROM child WHERE parent_id = ?1 AND state = 'pending' \
                   AND available_at IS NULL AND sequence >= ?6 ORDER BY sequence LIMIT ?2) \
             {due} ORDER BY sequence LIMIT ?2) \
         RETURNING parent_id, sequence, key, payload, attempts, previous_attempt, lease_expires_at, claim_id, changed_at, \
             (SELECT queue FROM lane WHERE lane.parent_id = child.parent_id) AS queue",
        lease = now_by("?5"),
        now = NOW
    )
}

static CLAIM: LazyLock<String> = LazyLock::new(|| lane_claim(false));
static CLAIM_WITH_DUE: LazyLock<String> = LazyLock::new(|| lane_claim(true));

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
                "UPDATE child SET lease_expires_at = {lease} \
                 WHERE (parent_id, sequence) IN ({LEASED}) \
                   AND claim_id = ?1 AND state = 'in_flight' AND lease_expires_at > {NOW} \
                 RETURNING lease_expires_at",
                lease = now_by("?2")
            )
        });
        static RENEW: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE claim_lease SET expires_at = {lease} WHERE claim_id = ?1 AND expires_at > {NOW}",
                lease = now_by("?2")
            )
        });
        let mut tx = self.held_tx().await?;
        sqlx::query(RENEW.as_str())
            .bind(claim_id.to_string())
            .bind(format!("+{lease_seconds} seconds"))
            .execute(&mut *tx)
            .await?;
        let rows: Vec<DateTime<Utc>> = sqlx::query_scalar(EXTEND.as_str())
            .bind(claim_id.to_string())
            .bind(format!("+{lease_seconds} seconds"))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Extended {
            extended: rows.len() as u64,
            lease_expires_at: rows.into_iter().max(),
        })
    }

    async fn release(&self, release: Release<'_>) -> StoreResult<Vec<(ParentId, u64)>> {
        static RELEASE: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE child SET state = 'pending', previous_attempt = 'released', lease_expires_at = NULL, \
                     changed_at = {NOW}, available_at = CASE WHEN ?3 > 0 THEN {later} END \
                 WHERE claim_id = ?1 AND state = 'in_flight' \
                   AND (parent_id, sequence) IN ( \
                       SELECT value ->> 0, value ->> 1 FROM json_each(?4) WHERE NOT ?2 \
                       UNION ALL {LEASED} AND ?2) \
                 RETURNING parent_id",
                later = now_by("'+' || ?3 || ' seconds'")
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
        let released: Vec<String> = sqlx::query_scalar(RELEASE.as_str())
            .bind(claim_id.to_string())
            .bind(children.is_none())
            .bind(delay_seconds)
            .bind(named)
            .fetch_all(&mut *tx)
            .await?;
        let mut by_parent: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for parent_id in &released {
            by_parent.entry(parent_id).or_default().0 += 1;
        }
        refresh_lanes(&mut tx, by_parent.keys().copied().collect::<BTreeSet<_>>()).await?;
        count_unclaimed(&mut tx, &by_parent).await?;
        tx.commit().await?;
        Ok(by_parent
            .into_iter()
            .map(|(p, (n, _))| (ParentId::from_ledger(p.to_owned()), n as u64))
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
            refresh_lanes(&mut tx, [parent_id.as_str()]).await?;
            sqlx::query("UPDATE lane SET held_out = held_out + 1 WHERE parent_id = ?1")
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
        let due: Vec<(String, String, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "DELETE FROM claim_lease WHERE (claim_id, parent_id) IN ( \
                 SELECT claim_id, parent_id FROM claim_lease WHERE expires_at <= {NOW} {scope_filter} \
                 ORDER BY expires_at LIMIT ?1) \
             RETURNING claim_id, parent_id, sequences"
        )))
        .bind(batch)
        .bind(scope_key)
        .fetch_all(&mut *tx)
        .await?;
        let more = due.len() as i64 >= batch;
        let leases: Vec<(&str, &str, serde_json::Value)> = due
            .iter()
            .map(|(claim, parent, sequences)| {
                (
                    claim.as_str(),
                    parent.as_str(),
                    serde_json::from_str(sequences).unwrap_or_default(),
                )
            })
            .collect();
        let moved: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE child AS c SET \
                 state = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts THEN 'failed' \
                              WHEN p.expired_lease = 'hold' THEN 'held' ELSE 'pending' END, \
                 reason = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                               THEN 'attempts exhausted' ELSE c.reason END, \
                 terminal_at = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                                    THEN {now} ELSE c.terminal_at END, \
                 previous_attempt = 'expired', changed_at = {now} \
             FROM parent p \
             WHERE p.parent_id = c.parent_id AND c.state = 'in_flight' AND c.lease_expires_at <= {now} \
               AND (c.claim_id, c.parent_id, c.sequence) IN ( \
                   SELECT l.value ->> 0, l.value ->> 1, s.value \
                   FROM json_each(?1) l, json_each(l.value -> 2) s) \
             RETURNING parent_id, state",
            now = NOW
        )))
        .bind(serde_json::to_string(&leases).unwrap_or_else(|_| "[]".to_owned()))
        .fetch_all(&mut *tx)
        .await?;
        let mut failures: BTreeMap<&str, Counted> = BTreeMap::new();
        for (parent_id, _) in moved.iter().filter(|(_, state)| state == "failed") {
            failures.entry(parent_id.as_str()).or_default().failed += 1;
        }
        let completed = bump_parents(&mut tx, &failures).await?;
        let mut ended: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
        for (parent_id, state) in &moved {
            let lane = ended.entry(parent_id.as_str()).or_default();
            lane.0 += 1;
            lane.1 += i64::from(state == "held");
        }
        count_unclaimed(&mut tx, &ended).await?;
        let pending: BTreeSet<&str> = moved
            .iter()
            .filter(|(_, state)| state == "pending")
            .map(|(parent_id, _)| parent_id.as_str())
            .collect();
        refresh_lanes(&mut tx, pending).await?;
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
    /// sequence first, and moves its lane.
    async fn claim_one(
        &self,
        parent_id: &ParentId,
        queue: Option<&QueueName>,
        ask: &LaneAsk,
    ) -> StoreResult<LaneClaim> {
        static LANE: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT floor, coalesce(ready_at <= {NOW}, 0) FROM lane WHERE parent_id = ?1 \
                 AND (?2 IS NULL OR queue = ?2) \
                 AND NOT EXISTS (SELECT 1 FROM queue_pause qp WHERE qp.queue = lane.queue)"
            )
        });
        let mut tx = self.held_tx().await?;
        let lane: Option<(Option<i64>, bool)> = sqlx::query_as(LANE.as_str())
            .bind(parent_id.as_str())
            .bind(queue.map(QueueName::as_str))
            .fetch_optional(&mut *tx)
            .await?;
        let Some((floor, due)) = lane else {
            return Ok(LaneClaim::default());
        };
        if floor.is_none() && !due {
            return Ok(LaneClaim {
                taken: true,
                ..LaneClaim::default()
            });
        }
        let sql = if due { &*CLAIM_WITH_DUE } else { &*CLAIM };
        let rows = sqlx::query(sql.as_str())
            .bind(parent_id.as_str())
            .bind(ask.limit)
            .bind(ask.claim_id.to_string())
            .bind(ask.worker.as_deref())
            .bind(format!("+{} seconds", ask.lease_seconds))
            .bind(floor)
            .fetch_all(&mut *tx)
            .await?;
        refresh_lanes(&mut tx, [parent_id.as_str()]).await?;
        if !rows.is_empty() {
            let served: i64 = sqlx::query_scalar("UPDATE lane_clock SET served = served + 1 RETURNING served")
                .fetch_one(&mut *tx)
                .await?;
            sqlx::query("UPDATE lane SET served = ?2, claimed = claimed + ?3 WHERE parent_id = ?1")
                .bind(parent_id.as_str())
                .bind(served)
                .bind(rows.len() as i64)
                .execute(&mut *tx)
                .await?;
            let sequences: Vec<i64> = rows
                .iter()
                .map(|row| row.try_get::<i64, _>("sequence"))
                .collect::<Result<_, _>>()?;
            let expires: Option<String> = rows
                .iter()
                .map(|row| row.try_get::<String, _>("lease_expires_at"))
                .collect::<Result<Vec<_>, _>>()?
                .into_iter()
                .max();
            sqlx::query(LEASE)
                .bind(ask.claim_id.to_string())
                .bind(parent_id.as_str())
                .bind(serde_json::to_string(&sequences).unwrap_or_else(|_| "[]".to_owned()))
                .bind(expires)
                .bind(rows[0].try_get::<String, _>("changed_at")?)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        let mut claim = LaneClaim::from_rows(std::slice::from_ref(ask), &rows)?.remove(0);
        claim.taken = true;
        Ok(claim)
    }
}
