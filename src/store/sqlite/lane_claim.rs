//! The lane claim on SQLite: up to a claim's limit of one parent's lowest
//! claimable children (from the floor up, then given-back ones that are
//! due), admitted first under its queue's limits (`store::admission`; writes
//! take turns in SQLite), then the lease row and the lane's new floor.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::{NOW, SqliteStore, now_by};
use crate::ledger::{ParentId, QueueName};
use crate::store::StoreResult;
use crate::store::admission::Admission;
use crate::store::reports::{LaneAsk, LaneClaim};

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

impl SqliteStore {
    /// Leases up to `ask.limit` claimable children of one parent, lowest
    /// sequence first: from the floor up (`FRESH`) and, when some are due,
    /// given back ones (`DUE`); only the latter are written. Then the lease
    /// row, and the lane's new floor.
    pub(super) async fn claim_one(
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
