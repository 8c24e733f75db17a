//! Claims: leased chunks of pending children, from a parent or a queue,
//! with the outcomes of the chunk before them. The lease operations fenced
//! by `claim_id` are `leases`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::extract::{AppJson, parent_id_param, queue_param};
use super::guard::Caller;
use super::outcomes::{BatchOutcome, batch_writes, record_batch};
use super::validate::{MAX_WORKER_CHARS, in_range, max_chars};
use super::whole;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{BatchResult, Claim, ClaimRequest, ClaimScope, ClaimedChild, ParentId, QueueName};
use crate::limits::{Limits, MAX_WAIT_SECONDS};
use crate::state::AppState;
use crate::store::{Claimed, StoreError};
use crate::waiters::Waiting;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(claim_from_parent))
        .routes(routes!(claim_from_queue))
}

/// Ask for a leased chunk. Every member is optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"limit": 50, "lease_seconds": 60, "worker": "worker-7", "wait_seconds": 5}))]
pub struct ClaimChildren {
    /// How many children at most, 1-1000 (default 100).
    #[schema(minimum = 1, example = 100)]
    #[serde(default, deserialize_with = "whole::option")]
    limit: Option<i64>,
    /// Lease length, 1-86400 seconds (default 300). Extend the lease before it
    /// runs out if the work takes longer: an expired lease hands the child out again.
    #[schema(minimum = 1, example = 300)]
    #[serde(default, deserialize_with = "whole::option")]
    lease_seconds: Option<i64>,
    /// A label for the worker, shown on the child as `claimed_by`.
    #[schema(example = "worker-7")]
    worker: Option<String>,
    /// When nothing is claimable, wait up to this long (0-20 s, default 0) and
    /// return as soon as something is.
    #[schema(minimum = 0)]
    #[serde(default, deserialize_with = "whole::option")]
    wait_seconds: Option<i64>,
    /// Outcomes of children claimed before (0-1000 items, configurable; each as in `POST
    /// /v1/outcomes`), recorded before this claim looks for children: a
    /// worker reports one chunk and asks for the next in one request. The
    /// answer's `outcome_results` says what became of each, in order. An
    /// invalid item is answered 4xx, and then nothing is recorded or
    /// claimed. Once recorded they stay recorded, whatever the claim then
    /// answers: repeating the request is safe (they come back `duplicate`).
    /// They count against a claim's body limit (1 MiB); a larger batch goes
    /// to `POST /v1/outcomes`.
    outcomes: Option<Vec<BatchOutcome>>,
}

impl ClaimChildren {
    /// The claim this body asks for in `scope`, and how long it may wait for work.
    fn into_request(self, scope: ClaimScope, limits: &Limits) -> ApiResult<(ClaimRequest, Duration)> {
        let limit = in_range(
            "limit",
            self.limit.unwrap_or(100.min(limits.max_claim_limit)),
            1,
            limits.max_claim_limit,
        )?;
        let lease_seconds = in_range(
            "lease_seconds",
            self.lease_seconds.unwrap_or(limits.default_lease_seconds),
            1,
            limits.max_lease_seconds,
        )?;
        let wait_seconds = in_range(
            "wait_seconds",
            self.wait_seconds.unwrap_or(0),
            0,
            MAX_WAIT_SECONDS as i64,
        )?;
        if let Some(worker) = &self.worker {
            max_chars("worker", worker, MAX_WORKER_CHARS)?;
        }
        let request = ClaimRequest {
            scope,
            queue: None,
            claim_id: Uuid::new_v4(),
            limit,
            lease_seconds,
            worker: self.worker,
            budget: limits.response_budget(),
        };
        // An operator may hold long polls shorter (a proxy's idle timeout, say):
        // the claim then answers empty sooner, which "wait up to" allows.
        let held = (wait_seconds as u64).min(limits.max_wait_seconds);
        Ok((request, Duration::from_secs(held)))
    }
}

/// One long poll counted among the process's waiting claims while it waits.
struct WaitingClaim(Arc<AtomicUsize>);

impl WaitingClaim {
    fn join(state: &AppState) -> ApiResult<Self> {
        let max = state.limits.max_waiting_claims;
        let counter = Arc::clone(&state.waiting_claims);
        let joined = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
        match joined {
            Ok(_) => Ok(Self(counter)),
            Err(_) => Err(ApiError::TooManyWaiting(max)),
        }
    }
}

impl Drop for WaitingClaim {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How long a long poll that limits held back waits, once a slot may have
/// freed, before it looks: the outcomes of one moment make one look.
const SLOT_SETTLE: Duration = Duration::from_millis(5);

/// Records the outcomes a claim carries, if any (all checked before any is
/// written; a claim of an unknown parent is answered 404 before they are).
async fn record_carried(
    state: &AppState,
    caller: &Caller,
    request: &ClaimRequest,
    outcomes: Option<Vec<BatchOutcome>>,
) -> ApiResult<Option<Vec<BatchResult>>> {
    let Some(items) = outcomes else {
        return Ok(None);
    };
    let max = state.limits.max_outcomes_per_request;
    if items.len() > max {
        return Err(ApiError::invalid(
            "outcomes",
            format!("must hold 0-{max} outcomes, got {}", items.len()),
        ));
    }
    let (writes, links) = batch_writes(state, caller, items)?;
    if let (ClaimScope::Parent(parent_id), None) = (&request.scope, &request.queue)
        && state.store.queue_of(parent_id).await?.is_none()
    {
        return Err(StoreError::ParentNotFound(parent_id.clone()).into());
    }
    Ok(Some(record_batch(state, caller, writes, &links).await?))
}

/// Claims now, or as soon as work turns up within `wait`, after recording
/// the outcomes the request carries.
async fn claim(
    state: AppState,
    caller: &Caller,
    scope: ClaimScope,
    queue: Option<QueueName>,
    mut body: ClaimChildren,
) -> ApiResult<Json<Claim>> {
    let outcomes = body.outcomes.take();
    let (mut request, wait) = body.into_request(scope, &state.limits)?;
    request.queue = queue;
    let outcome_results = record_carried(&state, caller, &request, outcomes).await?;
    let deadline = tokio::time::Instant::now() + wait;
    let mut shutdown = state.shutdown.subscribe();
    // Once it waits: its count among the waiting claims, and its place in line.
    let mut waiting: Option<(WaitingClaim, Waiting)> = None;
    // When the last look found nothing and no work has been announced since,
    // a look now would find nothing either: the claim waits instead.
    let mut quiet_since: Option<u64> = None;
    loop {
        // Only a long poll waits for a slot.
        let slot_freed = (!wait.is_zero()).then(|| state.waiters.slot_freed());
        let announced = state.waiters.announced();
        let claimed = if quiet_since.take() == Some(announced) {
            Claimed::nothing(request.claim_id)
        } else {
            state.store.claim(&request).await?
        };
        // Nothing claimable in the whole queue (not every lane taken by
        // another claim meanwhile), and nothing held back that comes with time.
        let drained = claimed.drained && claimed.claim.children.is_empty() && claimed.claim.next_available_at.is_none();
        // The first look, before the claim joins a line: if it found the
        // queue drained, the look once in line is needed only when work was
        // announced meanwhile. (Later looks, the rechecks, always run: they
        // cover an announcement that never came.)
        if waiting.is_none() && drained {
            quiet_since = Some(announced);
        }
        let now = tokio::time::Instant::now();
        // Shutting down, a waiting claim answers (empty) at once: it holds no
        // lease yet, so nothing is orphaned.
        if !claimed.claim.children.is_empty() || now >= deadline || state.is_shutting_down() {
            if let Some(queue) = &claimed.queue {
                state.metrics.claimed(queue.as_str(), claimed.claim.children.len());
            }
            let mut claim = claimed.claim;
            trace_each_child(&mut claim, request.worker.as_deref());
            claim.outcome_results = outcome_results;
            return Ok(Json(claim));
        }
        let Some((_, place)) = &mut waiting else {
            // A bounded crowd waits: past `--max-waiting-claims`, come back
            // later; a claim that recorded outcomes answers them, empty.
            let counted = match WaitingClaim::join(&state) {
                Ok(counted) => counted,
                Err(_) if outcome_results.is_some() => {
                    let mut claim = claimed.claim;
                    claim.outcome_results = outcome_results;
                    return Ok(Json(claim));
                }
                Err(full) => return Err(full),
            };
            let queue = match &request.scope {
                ClaimScope::Queue(queue) => queue.clone(),
                ClaimScope::Parent(parent_id) => state
                    .store
                    .queue_of(parent_id)
                    .await?
                    .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))?,
            };
            // In line before looking once more, so work that came in between still wakes us.
            let place = state.waiters.wait(&queue, request.scope.parent(), request.limit as u64);
            waiting = Some((counted, place));
            continue;
        };
        // Work is announced in this process and, through Postgres `NOTIFY`, by
        // every replica; in case an announcement is missed (the listener
        // reconnecting), a waiting claim still looks again on its own, and
        // keeps its place in line meanwhile.
        let mut recheck = Duration::from_millis(state.limits.wait_recheck_ms);
        let held_back = claimed.claim.next_available_at.is_some();
        if let Some(at) = claimed.claim.next_available_at {
            // Held back by limits (or a `not_before`): look again when a
            // token comes or a lease runs out, or as soon as a slot may have
            // freed (`slot_freed`), here or on another replica.
            let until = (at - chrono::Utc::now()).to_std().unwrap_or_default();
            recheck = recheck.min(until.max(Duration::from_millis(5)));
        }
        let limited = async {
            if let (true, Some(slot_freed)) = (held_back, slot_freed) {
                slot_freed.await;
                // Gathers the frees of one moment into one look.
                tokio::time::sleep(SLOT_SETTLE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let woken = tokio::select! {
            woken = tokio::time::timeout((deadline - now).min(recheck), place.woken()) => woken.is_ok(),
            _ = limited => false,
            _ = shutdown.wait_for(|stopping| *stopping) => false,
        };
        if woken {
            // A wake-up takes the waiter out of line: back in (at the back) before looking.
            *place = place.again();
        }
    }
}

/// Claim a leased chunk of one parent's children.
///
/// Lowest sequence first; never terminal, held or under a live lease; only
/// from decomposed parents. Concurrent claimers never receive the same live
/// child. When `previous_attempt` is `expired`, the earlier attempt may have
/// had its effect: check the remote side with `idempotency_key` before
/// repeating it. Send the previous chunk's outcomes in `outcomes` to record
/// them and claim the next chunk in one request.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/claims",
    tag = "claims",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body(content = ClaimChildren, description = "All fields optional: `{}` will do"),
    responses(
        (status = 200, description = "The claimed children (an empty list when nothing is claimable)", body = Claim),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn claim_from_parent(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    AppJson(body): AppJson<ClaimChildren>,
) -> ApiResult<Json<Claim>> {
    let parent_id = parent_id_param(&parent_id)?;
    // A caller limited to some queues claims only from the parent it was
    // admitted to: its queue as checked now goes with every claim of a long
    // poll, so a parent deleted and registered again in another queue meanwhile
    // hands it nothing.
    let queue = if caller.0.queues.is_every() {
        None
    } else {
        match state.store.queue_of(&parent_id).await? {
            Some(queue) if caller.0.reaches(queue.as_str()) => Some(queue),
            _ => return Err(StoreError::ParentNotFound(parent_id).into()),
        }
    };
    claim(state, &caller, ClaimScope::Parent(parent_id), queue, body).await
}

/// Claim a leased chunk from any active parent of a queue.
///
/// Higher priorities are served first; within a priority, the parent served
/// least recently comes first (never served counts as least recent, ties go
/// to the oldest), and a short claim is filled from the next parents in that
/// order. Within a parent, lowest sequence first. See the per-parent claim
/// for the lease rules, and for `outcomes`: the previous chunk's outcomes,
/// recorded before the next chunk is claimed, in one request.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/claims",
    tag = "claims",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    request_body(content = ClaimChildren, description = "All fields optional: `{}` will do"),
    responses(
        (status = 200, description = "The claimed children (an empty list when nothing is claimable)", body = Claim),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn claim_from_queue(
    State(state): State<AppState>,
    caller: Caller,
    Path(queue): Path<String>,
    AppJson(body): AppJson<ClaimChildren>,
) -> ApiResult<Json<Claim>> {
    let scope = ClaimScope::Queue(queue_param(&queue)?);
    claim(state, &caller, scope, None, body).await
}

/// With trace export on, the children of a claim that carry one trace
/// context (a parent's, or a child's own) get one span of this claim in that
/// trace, `child claimed` (named for the children it hands out: its parent,
/// their count and sequences), and are handed that span's context: each
/// worker's span of a child nests under it. One span per trace context and
/// claim, not per child: a claim of 500 children of one parent is one span.
/// Without export, the kept context is handed back as it is.
fn trace_each_child(claim: &mut Claim, worker: Option<&str>) {
    if !crate::telemetry::exporting() {
        return;
    }
    let claim_id = claim.claim_id;
    let mut handed: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for i in 0..claim.children.len() {
        let Some(kept) = claim.children[i].traceparent.clone() else {
            continue;
        };
        if let Some(span) = handed.get(&kept) {
            claim.children[i].traceparent = Some(span.clone());
            continue;
        }
        let together: Vec<&ClaimedChild> = claim.children[i..]
            .iter()
            .filter(|c| c.traceparent.as_deref() == Some(kept.as_str()))
            .collect();
        let child = &claim.children[i];
        let (first, last) = (
            together.first().map_or(child.sequence, |c| c.sequence),
            together.last().map_or(child.sequence, |c| c.sequence),
        );
        let span = crate::telemetry::span_under(&kept, || {
            tracing::info_span!(
                "child claimed",
                otel.name = "child claimed",
                parent_id = %child.parent_id,
                children = together.len(),
                first_sequence = first,
                last_sequence = last,
                attempt = child.attempt,
                claim_id = %claim_id,
                worker = worker.unwrap_or(""),
            )
        });
        handed.insert(kept, span.clone());
        claim.children[i].traceparent = Some(span);
    }
}
