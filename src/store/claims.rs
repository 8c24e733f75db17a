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

use super::rows::{Lane, LaneAsk, LaneTurn, Leased};
use super::{ChildRef, Db, Store, StoreError, StoreResult, dispatch};
use crate::ledger::budget::ByteBudget;
use crate::ledger::{Child, ChildState, Claim, ClaimRequest, ClaimScope, ParentId, QueueName};
use crate::waiters::Work;

/// How many expired leases one sweep statement moves at most.
const EXPIRE_BATCH: i64 = 5_000;

/// How many lanes one queue claim visits at most: a claim of 1,000 over
/// parents of one child each is filled from the first 64 and comes back short.
const MAX_LANES: i64 = 64;

/// A claim, and the queue its children came from (`None` when it is empty).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: Claim,
    pub queue: Option<QueueName>,
}

impl Store {
    /// Claims up to `limit` claimable children under one lease: lowest sequence
    /// first within a parent, fair across the parents of a queue; fewer when
    /// more would not fit in the response's byte budget.
    pub async fn claim(&self, request: &ClaimRequest) -> StoreResult<Claimed> {
        let mut budget = request.budget;
        let mut leased = self.claim_scope(request, request.limit, &mut budget).await?;
        let short = request.limit - leased.children.len() as i64;
        if short > 0 && self.expire_leases(Some(&request.scope)).await? > 0 {
            leased.merge(self.claim_scope(request, short, &mut budget).await?);
        }
        if let (ClaimScope::Parent(parent_id), true) = (&request.scope, leased.children.is_empty()) {
            self.require_parent(parent_id).await?;
        }
        // RETURNING has no order: hand children out lowest sequence first.
        leased
            .children
            .sort_by(|a, b| (&a.parent_id, a.sequence).cmp(&(&b.parent_id, b.sequence)));
        Ok(Claimed {
            claim: Claim {
                claim_id: request.claim_id,
                lease_expires_at: leased.lease_expires_at,
                children: leased.children,
            },
            queue: leased.queue,
        })
    }

    /// Up to `limit` children of the request's scope, within `budget`.
    async fn claim_scope(&self, request: &ClaimRequest, limit: i64, budget: &mut ByteBudget) -> StoreResult<Leased> {
        match &request.scope {
            ClaimScope::Parent(parent_id) => {
                let want = budget.claimable(self.child_bytes(parent_id).await?, limit);
                self.claim_within(request, parent_id, want, LaneTurn::Wait, budget)
                    .await
                    .map(|(leased, _)| leased)
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
        let Some(bytes) = dispatch!(self, s => s.lane_child_bytes(parent_id).await)? else {
            return Ok(None);
        };
        let bytes = bytes.map(i64::from);
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
    ) -> StoreResult<(Leased, bool)> {
        if want <= 0 {
            return Ok((Leased::default(), false));
        }
        let (leased, taken) = self.claim_lane(request, parent_id, want, turn).await?;
        budget.spend_claimed(&leased.children);
        Ok((leased, taken))
    }

    /// Up to `limit` children from the lanes of a queue, in serving order.
    async fn claim_queue(
        &self,
        request: &ClaimRequest,
        queue: &QueueName,
        limit: i64,
        budget: &mut ByteBudget,
    ) -> StoreResult<Leased> {
        let lanes = dispatch!(self, s => s.queue_lanes(queue, limit.min(MAX_LANES)).await)?;
        let mut leased = Leased::default();
        // The first lane passed by as busy, waited for before any lower priority.
        let mut busy: Option<&Lane> = None;
        for lane in &lanes {
            if let Some(first_busy) = busy.filter(|b| b.priority > lane.priority) {
                let want = budget.claimable(first_busy.child_bytes, limit - leased.children.len() as i64);
                leased.merge(
                    self.claim_within(request, &first_busy.parent_id, want, LaneTurn::Wait, budget)
                        .await?
                        .0,
                );
                busy = None;
            }
            let want = limit - leased.children.len() as i64;
            if want <= 0 {
                return Ok(leased);
            }
            let want = budget.claimable(lane.child_bytes, want);
            if want <= 0 {
                // This lane's children do not fit what is left; a later lane's smaller ones might.
                continue;
            }
            let (got, taken) = self
                .claim_within(request, &lane.parent_id, want, LaneTurn::Skip, budget)
                .await?;
            leased.merge(got);
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
                    .0,
            );
        }
        Ok(leased)
    }

    /// Up to `limit` children of one parent; whether its lane was taken.
    /// Claims of the same parent in this process share a statement when they
    /// arrive while one runs (see `combine`); a queue claim passes a lane this
    /// process is claiming from by, as it would pass one locked elsewhere.
    async fn claim_lane(
        &self,
        request: &ClaimRequest,
        parent_id: &ParentId,
        limit: i64,
        turn: LaneTurn,
    ) -> StoreResult<(Leased, bool)> {
        let key = (parent_id.clone(), turn);
        if turn == LaneTurn::Skip
            && (self.lane_claims.busy(&key) || self.lane_claims.busy(&(parent_id.clone(), LaneTurn::Wait)))
        {
            return Ok((Leased::default(), false));
        }
        let ask = LaneAsk {
            claim_id: request.claim_id,
            worker: request.worker.clone(),
            lease_seconds: request.lease_seconds,
            limit,
        };
        let store = self.clone();
        let parent = parent_id.clone();
        let claim = self
            .lane_claims
            .submit(key, ask, move |asks| {
                let (store, parent) = (store.clone(), parent.clone());
                async move { dispatch!(store, s => s.claim_lane(&parent, &asks, turn).await) }
            })
            .await?;
        Ok((claim.leased, claim.taken))
    }

    /// The queues of the parents whose children a claim holds (in practice
    /// one: a claim is made on one parent or one queue).
    pub async fn queues_of_claim(&self, claim_id: Uuid) -> StoreResult<Vec<QueueName>> {
        let queues = dispatch!(self, s => s.queues_of_claim(claim_id).await)?;
        Ok(queues.into_iter().map(QueueName::from_ledger).collect())
    }

    /// Extends every live lease of a claim. Returns how many and the new expiry.
    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<(u64, Option<DateTime<Utc>>)> {
        dispatch!(self, s => s.extend(claim_id, lease_seconds).await)
    }

    /// Returns a claim's children (all, or the named ones) to `pending`.
    /// Returns children a claim holds to pending. Returns how many, and the
    /// work that makes claimable (`None` when nothing was released).
    pub async fn release(
        &self,
        claim_id: Uuid,
        children: Option<&[ChildRef]>,
        delay_seconds: i64,
    ) -> StoreResult<(u64, Option<Work>)> {
        let by_parent = dispatch!(self, s => s.release(claim_id, children, delay_seconds).await)?;
        let released = by_parent.iter().map(|(_, n)| n).sum();
        // A claim is made on one parent or one queue: its children share a queue.
        let work = match by_parent.as_slice() {
            [] => None,
            [(parent_id, n)] => {
                let parent_id = ParentId::from_ledger(parent_id.clone());
                self.queue_of(&parent_id)
                    .await?
                    .map(|queue| Work::of_parent(queue, parent_id, *n))
            }
            [(parent_id, _), ..] => self
                .queue_of(&ParentId::from_ledger(parent_id.clone()))
                .await?
                .map(|queue| Work::in_queue(queue, released)),
        };
        Ok((released, work))
    }

    /// Returns a `held` child to `pending`; one already pending is returned as is.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Child> {
        let (retried, child) = dispatch!(self, s => s.retry(parent_id, sequence).await)?;
        let child = child.ok_or_else(|| StoreError::ChildNotFound {
            parent_id: parent_id.clone(),
            sequence,
        })?;
        if retried || child.state == ChildState::Pending {
            Ok(child)
        } else {
            Err(StoreError::RetryConflict { child: Box::new(child) })
        }
    }

    /// Moves children whose lease ran out to `pending`, `held` (hold policy) or
    /// `failed` (attempts exhausted), in `scope` or everywhere. Returns how many.
    pub async fn expire_leases(&self, scope: Option<&ClaimScope>) -> StoreResult<u64> {
        let mut moved = 0;
        loop {
            let (batch, completed) = dispatch!(self, s => s.expire_leases(scope, EXPIRE_BATCH).await)?;
            self.completed(&completed);
            moved += batch;
            if batch < EXPIRE_BATCH as u64 {
                if moved > 0 {
                    self.expired_total.fetch_add(moved, Ordering::Relaxed);
                }
                return Ok(moved);
            }
        }
    }
}
