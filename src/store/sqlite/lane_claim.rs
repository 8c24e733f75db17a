//! The lane claim on SQLite: up to a claim's limit of one parent's lowest
//! claimable children (from the floor up, then given-back ones that are
//! due), admitted first under its queue's limits (`store::admission`; writes
//! take turns in SQLite), then the lease row and the lane's new floor.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;

use super::{NOW, SqliteStore, SqliteTx, now_by};
use crate::ledger::admission::HeldBy;
use crate::ledger::{ParentId, QueueName};
use crate::store::StoreResult;
use crate::store::admission::Admission;
use crate::store::reports::{LaneAsk, LaneClaim, Leased};
use crate::store::rows::claimed;

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

/// Moves lane `?2` on after a claim that took `?6` children: its new floor
/// `?12`, its claimed count, when it was served, and (`?13`: some were due)
/// when its next given-back child comes due.
const MOVE_LANE: &str = "UPDATE lane SET floor = ?12, claimed = claimed + ?6, \
        served = CASE WHEN ?6 > 0 THEN (SELECT served FROM lane_clock) ELSE served END, \
        ready_at = CASE WHEN ?13 THEN ( \
            SELECT min(c.available_at) FROM child c INDEXED BY child_delayed \
            WHERE c.parent_id = lane.parent_id AND c.state = 'pending' AND c.available_at IS NOT NULL) \
        ELSE ready_at END \
    WHERE parent_id = ?2";

/// What a claim that took children writes, as one text (one round trip to
/// the writer's thread; sqlx binds `?N` across its statements): the lane
/// clock's turn, the lease (`LEASE`), and the lane moved on (`MOVE_LANE`).
static TAKE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE lane_clock SET served = served + 1; {}; {MOVE_LANE}",
        LEASE.as_str()
    )
});

/// A claimed child's trace context: its own when children have their own
/// (`?5`), else its parent's (`?6`).
const TRACEPARENT: &str = "coalesce((SELECT t.traceparent FROM trace_context t \
    WHERE ?5 AND t.parent_id = child.parent_id AND t.sequence = child.sequence), ?6) AS traceparent";

/// What a claim read hands over, as one row: the children (`picked`, a JSON
/// array of `Read`s in `order`) and the lease's expiry (`?4`, a clock
/// modifier, from now). One row, not a row per child: sqlx hands each row
/// from the connection's thread to the task that reads it, and a wake-up
/// per child cost more than building and parsing the array.
fn handed_over(picked: &str, order: &str) -> String {
    format!(
        "SELECT coalesce(json_group_array(json_array(sequence, key, payload, attempts + 1, previous_attempt, \
             traceparent) ORDER BY {order}), '[]'), {lease} FROM ({picked})",
        lease = now_by("?4")
    )
}

/// Up to `?2` + 1 children of parent `?1` from its floor `?3` up, in the
/// primary key (past the floor no claim has taken any), with what a claim
/// hands out (`handed_over`): the extra one is the next floor. `?5` and
/// `?6` are the trace context (`TRACEPARENT`).
static FRESH: LazyLock<String> = LazyLock::new(|| {
    handed_over(
        &format!(
            "SELECT sequence, key, payload, attempts, previous_attempt, {TRACEPARENT} \
             FROM child WHERE parent_id = ?1 AND sequence >= ?3 AND state = 'pending' AND available_at IS NULL \
             ORDER BY sequence LIMIT ?2 + 1"
        ),
        "sequence",
    )
});

/// Up to `?2` children given back to parent `?1` that are due, earliest due
/// first, as `FRESH` reads them.
static DUE: LazyLock<String> = LazyLock::new(|| {
    handed_over(
        &format!(
            "SELECT sequence, key, payload, attempts, previous_attempt, available_at, {TRACEPARENT} \
             FROM child WHERE parent_id = ?1 AND state = 'pending' AND available_at <= {NOW} \
             ORDER BY available_at LIMIT ?2"
        ),
        "available_at, sequence",
    )
});

/// A child a claim read, as `handed_over` lists it: sequence, key, payload
/// (its stored text), attempt, previous attempt and trace context.
type Read = (i64, Option<String>, String, i32, Option<String>, Option<String>);

impl SqliteStore {
    /// Leases up to `ask.limit` claimable children of one parent, lowest
    /// sequence first: from the floor up (`FRESH`) and, when some are due,
    /// given back ones (`DUE`); only the latter are written. Then the lease
    /// row, and the lane's new floor.
    /// Runs in `tx`, a transaction of the writer's group (`group`): the
    /// children are parsed once it has committed (`Picked::finish`), so the
    /// write lock is not held for it.
    pub(super) async fn claim_one(
        tx: &mut SqliteTx,
        parent_id: &ParentId,
        queue: Option<&QueueName>,
        ask: &LaneAsk,
    ) -> StoreResult<Picked> {
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
            .fetch_optional(&mut **tx)
            .await?;
        let Some((queue, floor, due, traceparent, children_traced, flow_key, wait_until, flow_rows)) = lane else {
            return Ok(Picked::Answered(LaneClaim::default()));
        };
        if wait_until.is_some() || (floor.is_none() && !due) {
            return Ok(Picked::Answered(
                LaneClaim::held_back(std::slice::from_ref(ask), None, wait_until).remove(0),
            ));
        }
        let flow_key = flow_key.as_deref();
        let admission = Admission::read(tx, &queue, flow_key, flow_rows, ask.limit, 0).await?;
        let held_by = admission.admitted.and_then(|a| a.held_by);
        let allowed = admission.allowed(ask.limit);
        if allowed == 0 {
            admission.spend(tx, &queue, flow_key, 0).await?;
            let next = admission.admitted.and_then(|a| a.next_available_at);
            return Ok(Picked::Answered(
                LaneClaim::held_back(std::slice::from_ref(ask), held_by, next).remove(0),
            ));
        }
        let ask = &LaneAsk {
            limit: allowed,
            ..ask.clone()
        };
        let lease = format!("+{} seconds", ask.lease_seconds);
        let claim = ask.claim_id.to_string();
        let mut lease_expires_at: Option<DateTime<Utc>> = None;
        let mut read = async |sql: &'static str| -> StoreResult<Vec<Read>> {
            let (picked, expires): (String, DateTime<Utc>) = sqlx::query_as(sql)
                .bind(parent_id.as_str())
                .bind(ask.limit)
                .bind(floor)
                .bind(&lease)
                .bind(children_traced)
                .bind(&traceparent)
                .fetch_one(&mut **tx)
                .await?;
            // Told the earlier of two reads' expiries: never a later one than the lease's.
            lease_expires_at = Some(lease_expires_at.map_or(expires, |at| at.min(expires)));
            Ok(serde_json::from_str(&picked).map_err(|e| sqlx::Error::Decode(e.into()))?)
        };
        let fresh = match floor {
            Some(_) => read(FRESH.as_str()).await?,
            None => Vec::new(),
        };
        let given_back = if due { read(DUE.as_str()).await? } else { Vec::new() };
        let read_fresh: Vec<i64> = fresh.iter().map(|r| r.0).collect();
        // The lowest of the fresh and given-back ones, marked whether given back.
        let mut picked: Vec<(Read, bool)> = fresh.into_iter().take(ask.limit as usize).map(|r| (r, false)).collect();
        if !given_back.is_empty() {
            picked.extend(given_back.into_iter().map(|r| (r, true)));
            picked.sort_by_key(|(r, _)| r.0);
            picked.truncate(ask.limit as usize);
        }
        let taken: BTreeSet<i64> = picked.iter().map(|(r, _)| r.0).collect();
        let returned: Vec<i64> = picked.iter().filter(|(_, back)| *back).map(|(r, _)| r.0).collect();
        let next_floor = read_fresh.into_iter().find(|s| !taken.contains(s));
        if !returned.is_empty() {
            sqlx::query(
                "UPDATE child SET available_at = NULL \
                 WHERE parent_id = ?1 AND sequence IN (SELECT value FROM json_each(?2))",
            )
            .bind(parent_id.as_str())
            .bind(serde_json::to_string(&returned).unwrap_or_else(|_| "[]".to_owned()))
            .execute(&mut **tx)
            .await?;
        }
        // Spent first: its rows are the queue's, which nothing below reads.
        admission.spend(tx, &queue, flow_key, taken.len() as i64).await?;
        let (sql, lo, hi) = match (taken.first(), taken.last()) {
            (Some(lo), Some(hi)) => (TAKE.as_str(), Some(*lo), Some(*hi)),
            // Its parameters skip some numbers: sqlx binds values to those too, unread.
            _ => (MOVE_LANE, None, None),
        };
        sqlx::query(sql)
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
            .bind(next_floor)
            .bind(due)
            .execute(&mut **tx)
            .await?;
        Ok(Picked::Read {
            parent_id: parent_id.clone(),
            children: picked.into_iter().map(|(read, _)| read).collect(),
            lease_expires_at,
            queue,
            held_by,
        })
    }
}

/// A lane claim done in a transaction that has not committed yet.
pub(super) enum Picked {
    /// Nothing to parse: the answer as it is.
    Answered(LaneClaim),
    /// The children read, to be parsed (`finish`) once committed.
    Read {
        parent_id: ParentId,
        children: Vec<Read>,
        lease_expires_at: Option<DateTime<Utc>>,
        queue: String,
        held_by: Option<HeldBy>,
    },
}

impl Picked {
    /// The claim's answer: its children parsed.
    pub(super) fn finish(self) -> StoreResult<LaneClaim> {
        let (parent_id, children, lease_expires_at, queue, held_by) = match self {
            Self::Answered(claim) => return Ok(claim),
            Self::Read {
                parent_id,
                children,
                lease_expires_at,
                queue,
                held_by,
            } => (parent_id, children, lease_expires_at, queue, held_by),
        };
        let children = children
            .into_iter()
            .map(|(sequence, key, payload, attempt, previous, traceparent)| {
                let payload = RawValue::from_string(payload).map_err(|e| sqlx::Error::Decode(e.into()))?;
                claimed(
                    parent_id.clone(),
                    sequence,
                    key,
                    payload,
                    attempt,
                    previous.as_deref(),
                    traceparent,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let leased = if children.is_empty() {
            Leased::default()
        } else {
            Leased {
                children,
                lease_expires_at,
                queue: Some(QueueName::from_ledger(queue)),
                next_available_at: None,
            }
        };
        Ok(LaneClaim {
            leased,
            taken: true,
            held_by,
        })
    }
}
