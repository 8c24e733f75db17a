//! Claims: leased chunks of children, and the lease operations.
//!
//! A parent's claim starts at its floor (see `floors`) and scans from 0 when
//! that comes back short. When still short, expired leases in the same scope
//! are swept and the claim is topped up, so abandoned work comes back without
//! waiting for the reaper.

use std::sync::atomic::Ordering;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::rows::Leased;
use super::{ChildRef, Db, Store, StoreError, StoreResult, dispatch};
use crate::ledger::{Child, ChildState, Claim, ClaimRequest, ClaimScope, ParentId, QueueName};

/// How many expired leases one sweep statement moves at most.
const EXPIRE_BATCH: i64 = 5_000;

/// A claim, and the queue its children came from (`None` when it is empty).
#[derive(Debug, Clone)]
pub struct Claimed {
    pub claim: Claim,
    pub queue: Option<QueueName>,
}

impl Store {
    /// Claims up to `limit` claimable children under one lease, lowest sequence first.
    pub async fn claim(&self, request: &ClaimRequest) -> StoreResult<Claimed> {
        let parent = match &request.scope {
            ClaimScope::Parent(parent_id) => Some(parent_id),
            ClaimScope::Queue(_) => None,
        };
        let floor = parent.map_or(0, |p| self.floors.floor(p));
        let mut leased = dispatch!(self, s => s.claim(request, request.limit, floor).await)?;
        if floor > 0 {
            self.top_up(request, &mut leased).await?;
        }
        if (leased.children.len() as i64) < request.limit && self.expire_leases(Some(&request.scope)).await? > 0 {
            self.top_up(request, &mut leased).await?;
        }
        if let Some(parent_id) = parent {
            match leased.children.iter().map(|c| c.sequence).min() {
                Some(lowest) => self.floors.claimed(parent_id, lowest),
                None => self.require_parent(parent_id).await?,
            }
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

    /// Claims what `leased` is short of, scanning from sequence 0.
    async fn top_up(&self, request: &ClaimRequest, leased: &mut Leased) -> StoreResult<()> {
        let short = request.limit - leased.children.len() as i64;
        if short > 0 {
            let more = dispatch!(self, s => s.claim(request, short, 0).await)?;
            leased.lease_expires_at = leased.lease_expires_at.or(more.lease_expires_at);
            leased.queue = leased.queue.take().or(more.queue);
            leased.children.extend(more.children);
        }
        Ok(())
    }

    /// Extends every live lease of a claim. Returns how many and the new expiry.
    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<(u64, Option<DateTime<Utc>>)> {
        dispatch!(self, s => s.extend(claim_id, lease_seconds).await)
    }

    /// Returns a claim's children (all, or the named ones) to `pending`.
    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> StoreResult<u64> {
        let released = dispatch!(self, s => s.release(claim_id, children, delay_seconds).await)?;
        match children {
            Some(children) => children.iter().for_each(|c| self.floors.forget(&c.parent_id)),
            None => self.floors.forget_all(),
        }
        Ok(released)
    }

    /// Returns a `held` child to `pending`; one already pending is returned as is.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Child> {
        let (retried, child) = dispatch!(self, s => s.retry(parent_id, sequence).await)?;
        let child = child.ok_or_else(|| StoreError::ChildNotFound {
            parent_id: parent_id.clone(),
            sequence,
        })?;
        self.floors.forget(parent_id);
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
                    self.floors.forget_all();
                    self.expired_total.fetch_add(moved, Ordering::Relaxed);
                }
                return Ok(moved);
            }
        }
    }
}
