//! Claims: leased chunks of children, and the lease operations.
//!
//! Each decomposed parent has a lane (see `migrations/postgres/0004_lanes.sql`):
//! its floor, below which no child is pending, and when the queue last served
//! it. A claim always runs on one lane at a time: a parent-scoped claim on its
//! parent's, a queue claim on the claimable lanes of its queue in serving order
//! (higher priority, then least recently served, then oldest), taking what it
//! can from the first and filling a short claim from the next. Claims of one
//! parent take turns on its lane; a queue claim passes a busy lane by and
//! comes back to wait for it only when no other lane of that priority served
//! it, so a lower priority is never served while a higher one waits.
//!
//! When a claim is still short, expired leases in its scope are swept and it
//! is topped up, so abandoned work comes back without waiting for the reaper.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::backend::{LaneClaimParams, Release};
use super::error::retry_transient;
use super::reports::{Lane, LaneAsk, LaneClaim, LaneTurn, Leased};
use super::statement::{Sql, SqlSet, Statement};
use super::{ChildRef, Store, StoreError, StoreResult};
use crate::ledger::admission::HeldBy;
use crate::ledger::budget::ByteBudget;
use crate::ledger::{Changes, Child, ChildState, Claim, ClaimRequest, ClaimScope, ParentId, QueueName, Work};

/// How many expired leases (each of one claim and parent) one round of the
/// sweep takes at most.
const EXPIRE_BATCH: i64 = 64;

/// How many lanes one queue claim visits at most: a claim of 1,000 over
/// parents of one child each is filled from the first 64 and comes back short.
const MAX_LANES: i64 = 64;

/// How a queue claim orders its lanes: `QUEUE_LANES` by index.
pub(super) const FAIR: usize = 0;
pub(super) const OLDEST: usize = 1;
/// Added to either: the queue has flow keys, which take turns.
pub(super) const KEYED: usize = 2;

/// The claimable lanes of queue `$1` in serving order, `$2` at most: higher
/// priority first, then least recently served (`FAIR`) or oldest (`OLDEST`),
/// skipping parents whose `not_before` is ahead. With flow keys (`KEYED`):
/// keys least recently served first (parents without a key take their turn
/// as one key), four lanes of each in the queue's order. The index predicate
/// is repeated so SQLite uses it too.
pub(super) static QUEUE_LANES: SqlSet<4> = SqlSet::new(|d, i| {
    let claimable = format!(
        "l.queue = $1 AND (l.floor IS NOT NULL OR l.ready_at IS NOT NULL) \
           AND (l.floor IS NOT NULL OR l.ready_at <= {now}) \
           AND (l.not_before IS NULL OR l.not_before <= {now}) \
           AND NOT EXISTS (SELECT 1 FROM queue_pause WHERE queue = $1)",
        now = d.now
    );
    let order = if i % KEYED == OLDEST {
        "l.priority DESC, l.position"
    } else {
        "l.priority DESC, l.served, l.position"
    };
    if i < KEYED {
        return format!(
            "SELECT l.parent_id, l.priority, l.child_bytes, l.flow_key FROM lane l WHERE {claimable} \
             ORDER BY {order} LIMIT $2"
        );
    }
    format!(
        "SELECT parent_id, priority, child_bytes, flow_key FROM ( \
             SELECT l.parent_id, l.priority, l.child_bytes, l.flow_key, coalesce(f.served, 0) AS key_served, \
                 row_number() OVER (PARTITION BY coalesce(l.flow_key, '') ORDER BY {order}) AS nth \
             FROM lane l LEFT JOIN flow_limit f ON f.queue = l.queue AND f.flow_key = coalesce(l.flow_key, '') \
             WHERE {claimable}) w \
         WHERE nth <= 4 ORDER BY key_served, coalesce(flow_key, ''), nth LIMIT $2"
    )
});

/// When the first parent of queue `$1` whose `not_before` is ahead comes due.
static NEXT_NOT_BEFORE: Sql = Sql::new(|d| {
    format!(
        "SELECT min(not_before) AS due FROM lane \
         WHERE queue = $1 AND (floor IS NOT NULL OR ready_at IS NOT NULL) AND not_before > {}",
        d.now
    )
});

/// Queue `$1`'s order (`queue_setting`), and whether it has flow keys.
const QUEUE_ORDER: &str = "SELECT (SELECT claim_order FROM queue_setting WHERE queue = $1) AS claim_order, \
    EXISTS (SELECT 1 FROM flow_limit WHERE queue = $1 AND flow_key = '') AS keyed";

/// A decomposed parent's largest payload (its lane's `child_bytes`).
const LANE_CHILD_BYTES: &str = "SELECT child_bytes FROM lane WHERE parent_id = $1";

/// The queues of the parents whose children claim `$1` leased.
const CLAIM_QUEUES: &str = "SELECT DISTINCT p.queue FROM claim_lease l JOIN parent p ON p.parent_id = l.parent_id \
    WHERE l.claim_id = $1";

/// A claim, and the queue its children came from (`None` when it is empty).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: Claim,
    pub queue: Option<QueueName>,
    /// A queue claim that found no claimable parent at all in its queue (not
    /// one that found every lane taken meanwhile): a look right after it
    /// finds nothing either, unless work was announced in between.
    pub drained: bool,
}

impl Claimed {
    /// A claim that found nothing, without a look (see `api::claims`).
    pub fn nothing(claim_id: Uuid) -> Self {
        Self {
            claim: Claim {
                claim_id,
                lease_expires_at: None,
                next_available_at: None,
                children: Vec::new(),
                outcome_results: None,
            },
            queue: None,
            drained: true,
        }
    }
}

impl Store {
    /// Claims up to `limit` claimable children under one lease: lowest sequence
    /// first within a parent, fair across the parents of a queue; fewer when
    /// more would not fit in the response's byte budget.
    pub async fn claim(&self, request: &ClaimRequest) -> StoreResult<Claimed> {
        let mut budget = request.budget;
        let (mut leased, mut lanes) = self.claim_scope(request, request.limit, &mut budget).await?;
        let short = request.limit - leased.children.len() as i64;
        // The sweep's children go to this claim first; the rest wait for the
        // next claim or a recheck, as before the sweep.
        if short > 0 && self.sweep_expired(Some(&request.scope)).await? > 0 {
            let (more, more_lanes) = self.claim_scope(request, short, &mut budget).await?;
            leased.merge(more);
            lanes += more_lanes;
        }
        let drained = matches!(request.scope, ClaimScope::Queue(_)) && lanes == 0;
        if let (ClaimScope::Parent(parent_id), true) = (&request.scope, leased.children.is_empty()) {
            match (self.queue_of(parent_id).await?, &request.queue) {
                (Some(now), Some(checked)) if now != *checked => {
                    return Err(StoreError::ParentNotFound(parent_id.clone()));
                }
                (Some(_), _) => {}
                (None, _) => return Err(StoreError::ParentNotFound(parent_id.clone())),
            }
        }
        if let (ClaimScope::Queue(queue), true) = (&request.scope, leased.children.is_empty()) {
            // Parents whose `not_before` is ahead are not among its lanes: say when the first comes due.
            let sql = self.sql(&NEXT_NOT_BEFORE);
            let row = self.fetch_optional(Statement::new(sql).text(queue.as_str())).await?;
            let due = row.map(|row| row.opt_time("due")).transpose()?.flatten();
            leased.next_available_at = match (leased.next_available_at, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        // RETURNING has no order: hand children out lowest sequence first.
        leased
            .children
            .sort_by(|a, b| (&a.parent_id, a.sequence).cmp(&(&b.parent_id, b.sequence)));
        if let Some(queue) = &leased.queue {
            let mut changes = Changes::of_queue(queue.clone());
            for child in &leased.children {
                if changes.parents.last() != Some(&child.parent_id) {
                    changes.parents.push(child.parent_id.clone());
                }
            }
            self.signal_change(changes);
        }
        Ok(Claimed {
            claim: Claim {
                claim_id: request.claim_id,
                lease_expires_at: leased.lease_expires_at,
                next_available_at: leased.next_available_at.filter(|_| leased.children.is_empty()),
                children: leased.children,
                outcome_results: None,
            },
            queue: leased.queue,
            drained,
        })
    }

    /// Up to `limit` children of the request's scope, within `budget`, and
    /// how many claimable lanes it found (one for a parent's claim).
    async fn claim_scope(
        &self,
        request: &ClaimRequest,
        limit: i64,
        budget: &mut ByteBudget,
    ) -> StoreResult<(Leased, usize)> {
        match &request.scope {
            ClaimScope::Parent(parent_id) => {
                let want = budget.claimable(self.child_bytes(parent_id).await?, limit);
                self.claim_within(request, parent_id, want, LaneTurn::Wait, budget)
                    .await
                    .map(|claim| (claim.leased, 1))
            }
            ClaimScope::Queue(queue) => self.claim_queue(request, queue, limit, budget).await,
        }
    }

    /// A decomposed parent's largest payload in bytes (`None`: not on record,
    /// or not decomposed). Fixed once the parent is decomposed, so each
    /// process reads it once per parent (and forgets them all past 100,000).
    async fn child_bytes(&self, parent_id: &ParentId) -> StoreResult<Option<i64>> {
        let known = self
            .child_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(parent_id)
            .copied();
        if let Some(bytes) = known {
            return Ok(bytes);
        }
        let Some(row) = self
            .fetch_optional(Statement::new(LANE_CHILD_BYTES).text(parent_id.as_str()))
            .await?
        else {
            return Ok(None);
        };
        let bytes = row.opt_int32("child_bytes")?.map(i64::from);
        let mut cache = self.child_bytes.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= 100_000 {
            cache.clear();
        }
        cache.insert(parent_id.clone(), bytes);
        Ok(bytes)
    }

    /// `claim_lane` for up to `want` children, spending what they take of `budget`.
    async fn claim_within(
        &self,
        request: &ClaimRequest,
        parent_id: &ParentId,
        want: i64,
        turn: LaneTurn,
        budget: &mut ByteBudget,
    ) -> StoreResult<LaneClaim> {
        if want <= 0 {
            return Ok(LaneClaim::default());
        }
        let claim = self.claim_lane(request, parent_id, want, turn).await?;
        budget.spend_claimed(&claim.leased.children);
        Ok(claim)
    }

    /// The first `limit` claimable lanes of a queue, in serving order.
    async fn queue_lanes(&self, queue: &QueueName, limit: i64) -> StoreResult<Vec<Lane>> {
        let order = retry_transient(|| self.db.fetch(Statement::new(QUEUE_ORDER).text(queue.as_str()))).await?;
        let mut which = FAIR;
        if let Some(row) = order.first() {
            if row.opt_text("claim_order")?.as_deref() == Some("oldest") {
                which = OLDEST;
            }
            if row.bool("keyed")? {
                which += KEYED;
            }
        }
        let sql = self.sql_of(&QUEUE_LANES, which);
        let rows = retry_transient(|| self.db.fetch(Statement::new(sql).text(queue.as_str()).int(limit))).await?;
        Ok(rows
            .iter()
            .map(|row| {
                Ok(Lane::new(
                    row.text("parent_id")?,
                    row.int32("priority")?,
                    row.opt_int32("child_bytes")?,
                    row.opt_text("flow_key")?,
                ))
            })
            .collect::<Result<_, sqlx::Error>>()?)
    }

    /// Up to `limit` children from the lanes of a queue, in serving order,
    /// and how many claimable lanes there were. A lane whose key is at its
    /// limit is passed by with the rest of that key's lanes; a queue at its
    /// limit ends the claim.
    async fn claim_queue(
        &self,
        request: &ClaimRequest,
        queue: &QueueName,
        limit: i64,
        budget: &mut ByteBudget,
    ) -> StoreResult<(Leased, usize)> {
        let lanes = self.queue_lanes(queue, limit.min(MAX_LANES)).await?;
        let mut leased = Leased::default();
        let mut held_keys: Vec<&str> = Vec::new();
        // The first lane passed by as busy, waited for before any lower priority.
        let mut busy: Option<&Lane> = None;
        for lane in &lanes {
            if let Some(key) = lane.flow_key.as_deref()
                && held_keys.contains(&key)
            {
                continue;
            }
            if let Some(first_busy) = busy.filter(|b| b.priority > lane.priority) {
                let want = budget.claimable(first_busy.child_bytes, limit - leased.children.len() as i64);
                let claim = self
                    .claim_within(request, &first_busy.parent_id, want, LaneTurn::Wait, budget)
                    .await?;
                let stop = claim.held_by == Some(HeldBy::Queue);
                leased.merge(claim.leased);
                busy = None;
                if stop {
                    return Ok((leased, lanes.len()));
                }
            }
            let want = limit - leased.children.len() as i64;
            if want <= 0 {
                return Ok((leased, lanes.len()));
            }
            let want = budget.claimable(lane.child_bytes, want);
            if want <= 0 {
                // This lane's children do not fit what is left; a later lane's smaller ones might.
                continue;
            }
            let claim = self
                .claim_within(request, &lane.parent_id, want, LaneTurn::Skip, budget)
                .await?;
            let (taken, held_by) = (claim.taken, claim.held_by);
            leased.merge(claim.leased);
            match held_by {
                Some(HeldBy::Queue) => return Ok((leased, lanes.len())),
                Some(HeldBy::Key) => held_keys.extend(lane.flow_key.as_deref()),
                None => {}
            }
            if !taken && busy.is_none() {
                busy = Some(lane);
            }
        }
        let want = limit - leased.children.len() as i64;
        if let (Some(first_busy), true) = (busy, want > 0) {
            let want = budget.claimable(first_busy.child_bytes, want);
            leased.merge(
                self.claim_within(request, &first_busy.parent_id, want, LaneTurn::Wait, budget)
                    .await?
                    .leased,
            );
        }
        Ok((leased, lanes.len()))
    }

    /// Up to `limit` children of one parent; whether its lane was taken, and
    /// whether a limit held it back.
    /// Claims of the same parent in this process share a statement when they
    /// arrive while one runs (see `combine`); a queue claim passes a lane this
    /// process is claiming from by, as it would pass one locked elsewhere.
    async fn claim_lane(
        &self,
        request: &ClaimRequest,
        parent_id: &ParentId,
        limit: i64,
        turn: LaneTurn,
    ) -> StoreResult<LaneClaim> {
        // The queue the lane must still be in: a parent deleted and registered
        // again in another queue since it was chosen hands out nothing.
        let queue = match &request.scope {
            ClaimScope::Queue(queue) => Some(queue.clone()),
            ClaimScope::Parent(_) => request.queue.clone(),
        };
        let key = (parent_id.clone(), turn, queue.clone());
        if turn == LaneTurn::Skip
            && (self.lane_claims.busy(&key)
                || self
                    .lane_claims
                    .busy(&(parent_id.clone(), LaneTurn::Wait, queue.clone())))
        {
            return Ok(LaneClaim::default());
        }
        let ask = LaneAsk {
            claim_id: request.claim_id,
            worker: request.worker.clone(),
            lease_seconds: request.lease_seconds,
            limit,
        };
        let db = self.db.clone();
        let parent = parent_id.clone();
        let claim = self
            .lane_claims
            .submit(key, ask, move |asks| {
                let (db, parent, queue) = (db.clone(), parent.clone(), queue.clone());
                async move {
                    db.claim_lane(LaneClaimParams {
                        parent_id: &parent,
                        queue: queue.as_ref(),
                        asks: &asks,
                        turn,
                    })
                    .await
                }
            })
            .await?;
        Ok(claim)
    }

    /// The queues of the parents whose children a claim holds (in practice
    /// one: a claim is made on one parent or one queue).
    pub async fn queues_of_claim(&self, claim_id: Uuid) -> StoreResult<Vec<QueueName>> {
        let rows = self.db.fetch(Statement::new(CLAIM_QUEUES).uuid(claim_id)).await?;
        Ok(rows
            .iter()
            .map(|row| row.text("queue").map(QueueName::from_ledger))
            .collect::<Result<_, _>>()?)
    }

    /// Extends every live lease of a claim. Returns how many and the new expiry.
    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<(u64, Option<DateTime<Utc>>)> {
        let extended = self.db.extend(claim_id, lease_seconds).await?;
        Ok((extended.extended, extended.lease_expires_at))
    }

    /// Returns children a claim holds (all, or the named ones) to pending,
    /// not claimable for `delay_seconds`. Returns how many.
    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> StoreResult<u64> {
        let by_parent = self
            .db
            .release(Release {
                claim_id,
                children,
                delay_seconds,
            })
            .await?;
        let released = by_parent.iter().map(|(_, n)| n).sum();
        // A claim is made on one parent or one queue: its children share a queue.
        let work = match by_parent.as_slice() {
            [] => None,
            [(parent_id, n)] => self
                .queue_of(parent_id)
                .await?
                .map(|queue| Work::of_parent(queue, parent_id.clone(), *n)),
            [(parent_id, _), ..] => self
                .queue_of(parent_id)
                .await?
                .map(|queue| Work::in_queue(queue, released)),
        };
        if let Some(work) = work {
            self.signal_work(work);
        }
        Ok(released)
    }

    /// Returns a `held` child to `pending`; one already pending is returned as is.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Child> {
        let retried = self.db.retry_held(parent_id, Some(sequence)).await? > 0;
        let child = self.child(parent_id, sequence).await?;
        if retried {
            if let Some(queue) = self.queue_of(parent_id).await? {
                self.signal_work(Work::of_parent(queue, parent_id.clone(), 1));
            }
            Ok(child)
        } else if child.state == ChildState::Pending {
            Ok(child)
        } else {
            Err(StoreError::RetryConflict { child: Box::new(child) })
        }
    }

    /// Moves children whose lease ran out to `pending`, `held` (hold policy) or
    /// `failed` (attempts exhausted), in `scope` or everywhere, and wakes the
    /// claims waiting for them. Returns how many.
    pub async fn expire_leases(&self, scope: Option<&ClaimScope>) -> StoreResult<u64> {
        let moved = self.sweep_expired(scope).await?;
        // Some went to held or failed: a few waiters may look for nothing.
        self.signal_work(Work::anywhere(moved));
        Ok(moved)
    }

    /// `expire_leases` without the wake-up: for a claim that takes what it swept.
    async fn sweep_expired(&self, scope: Option<&ClaimScope>) -> StoreResult<u64> {
        let mut moved = 0;
        loop {
            let expired = self.db.expire_leases(scope, EXPIRE_BATCH).await?;
            self.completed(&expired.completed);
            moved += expired.moved;
            if !expired.more {
                if moved > 0 {
                    self.signals.expired_total.fetch_add(moved, Ordering::Relaxed);
                    // Which parents' leases ran out is not said: every view looks again.
                    self.signal_change(Changes::everything());
                }
                return Ok(moved);
            }
        }
    }
}
