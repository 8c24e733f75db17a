//! Terminal outcomes, single and batched: first writer wins, one-way.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use super::extract::{AppJson, parent_id_param, sequence_param};
use super::guard::Caller;
use super::validate::{MAX_REASON_CHARS, max_chars, raw_json_within};
use super::whole;
use crate::access::Role;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{BatchResult, Child, Outcome, OutcomeStatus, OutcomeWrite, ParentId};
use crate::limits::Limits;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(record_outcome))
        .routes(routes!(record_outcomes))
}

/// A child's terminal outcome. Send the `claim_id` it was claimed under, so
/// the child records which attempt produced it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"outcome": "processed", "result": {"remote_id": "r-9"}, "claim_id": "5f0c8a4e-2b1d-4c3e-9f7a-6d8e1b2c3a4f"}))]
pub struct RecordOutcome {
    outcome: Outcome,
    /// Expected for `failed` and `skipped`; at most 1000 characters.
    reason: Option<String>,
    /// Any JSON the worker wants kept with the outcome (e.g. a remote id).
    #[schema(value_type = Option<Value>)]
    result: Option<Box<RawValue>>,
    /// The claim under which the work was done.
    claim_id: Option<Uuid>,
}

/// The answer to a single outcome: whether this write won, and the child now.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct OutcomeRecorded {
    /// `true`: this write made the child terminal (and moved the parent's
    /// counters). `false`: the same outcome was already recorded, e.g. by a
    /// retried request; nothing changed and the worker can move on.
    pub applied: bool,
    pub child: Child,
}

/// Checks an outcome's reason and result against their limits; `field`
/// prefixes the names in the problem (`outcomes[3].`).
fn checked(limits: &Limits, field: &str, write: OutcomeWrite) -> ApiResult<OutcomeWrite> {
    if let Some(reason) = &write.reason {
        max_chars(&format!("{field}reason"), reason, MAX_REASON_CHARS)?;
    }
    if let Some(result) = &write.result {
        raw_json_within(&format!("{field}result"), result, limits.max_result_bytes)?;
    }
    Ok(write)
}

/// Record a child's terminal outcome (first writer wins).
///
/// The parent's counters, and `completed_at` when this was the last child,
/// change in the same transaction. A later, different outcome is answered 409
/// with the current child and kept in its `conflicts` log.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/children/{sequence}/outcome",
    tag = "outcomes",
    params(
        ("parent_id" = ParentId, Path, description = "Parent id"),
        ("sequence" = i64, Path, description = "0-based position in the parent", minimum = 0),
    ),
    request_body = RecordOutcome,
    responses(
        (status = 200, description = "Applied, or the same outcome was already recorded", body = OutcomeRecorded),
        (status = 404, description = "Unknown child", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "A different outcome already won (the body holds `child`), or the parent is still decomposing", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input; nothing was written", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn record_outcome(
    State(state): State<AppState>,
    caller: Caller,
    Path((parent_id, sequence)): Path<(String, String)>,
    AppJson(body): AppJson<RecordOutcome>,
) -> ApiResult<Json<OutcomeRecorded>> {
    let parent_id = parent_id_param(&parent_id)?;
    let sequence = sequence_param(&sequence)?;
    if body.claim_id.is_none() {
        caller.must(Role::Admin, "record an outcome without a `claim_id`")?;
    }
    let write = OutcomeWrite {
        parent_id: parent_id.clone(),
        sequence,
        outcome: body.outcome,
        reason: body.reason,
        result: body.result,
        claim_id: body.claim_id,
    };
    let write = checked(&state.limits, "", write)?;
    let status = record_and_count(&state, Arc::new([write])).await?[0];
    let applied = match status {
        OutcomeStatus::Applied => true,
        OutcomeStatus::Duplicate => false,
        OutcomeStatus::NotFound => {
            return Err(ApiError::NotFound(format!("no child {sequence} in parent {parent_id}")));
        }
        OutcomeStatus::NotDecomposed => {
            return Err(ApiError::ParentDecomposing(parent_id.to_string()));
        }
        OutcomeStatus::Conflict => {
            let child = state.store.child(&parent_id, sequence).await?;
            return Err(ApiError::OutcomeConflict { child: Box::new(child) });
        }
        OutcomeStatus::ClaimMismatch => {
            return Err(ApiError::ClaimMismatch(format!(
                "claim_id {} holds neither the current nor the previous lease of child {sequence} in parent {parent_id}; nothing was written",
                body.claim_id.map(|c| c.to_string()).unwrap_or_default()
            )));
        }
    };
    let child = state.store.child(&parent_id, sequence).await?;
    Ok(Json(OutcomeRecorded { applied, child }))
}

/// One item of an outcome batch: the child, and its outcome as for a single write.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchOutcome {
    parent_id: ParentId,
    #[schema(minimum = 0)]
    #[serde(deserialize_with = "whole::required")]
    sequence: i64,
    outcome: Outcome,
    reason: Option<String>,
    #[schema(value_type = Option<Value>)]
    result: Option<Box<RawValue>>,
    claim_id: Option<Uuid>,
    /// The W3C trace context of the child's work (the one its claim handed
    /// out, or the worker's span of it): with trace export on, the batch's
    /// span links to it, so one batch relates to each child's trace. Not
    /// stored.
    #[schema(example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    #[schema(pattern = "^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$")]
    traceparent: Option<String>,
}

/// Links drawn from one batch's span at most (OpenTelemetry's default limit
/// of links per span is 128).
const MOST_LINKS: usize = 128;

/// Many outcomes, any parents, in one request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"outcomes": [
    {"parent_id": "P-42", "sequence": 2, "outcome": "processed", "result": {"remote_id": "r-10"}, "claim_id": "5f0c8a4e-2b1d-4c3e-9f7a-6d8e1b2c3a4f"},
    {"parent_id": "P-42", "sequence": 3, "outcome": "failed", "reason": "invalid timestamp", "claim_id": "5f0c8a4e-2b1d-4c3e-9f7a-6d8e1b2c3a4f"}
]}))]
pub struct RecordOutcomes {
    /// 1-1000 outcomes (configurable). A child named twice is recorded once: the
    /// later item is answered `duplicate` or `conflict`, as if sent afterwards.
    #[schema(min_items = 1)]
    outcomes: Vec<BatchOutcome>,
}

/// One result per batch item, in request order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BatchResults {
    /// In request order.
    pub results: Vec<BatchResult>,
}

/// Records outcomes and counts them in the metrics.
async fn record_and_count(state: &AppState, writes: Arc<[OutcomeWrite]>) -> ApiResult<Vec<OutcomeStatus>> {
    let statuses = state.store.record_outcomes(Arc::clone(&writes)).await?;
    for (write, status) in writes.iter().zip(&statuses) {
        state.metrics.outcome(write.outcome.as_str(), status.as_str());
    }
    Ok(statuses)
}

/// Records the writes whose parents are in the caller's queues; the others
/// are answered `not_found`, as if they did not exist, and not written.
async fn record_within_reach(
    state: &AppState,
    caller: &Caller,
    writes: Vec<OutcomeWrite>,
) -> ApiResult<(Arc<[OutcomeWrite]>, Vec<OutcomeStatus>)> {
    if caller.0.queues.is_every() {
        let writes: Arc<[OutcomeWrite]> = writes.into();
        let statuses = record_and_count(state, Arc::clone(&writes)).await?;
        return Ok((writes, statuses));
    }
    let mut reach: HashMap<ParentId, bool> = HashMap::new();
    for write in &writes {
        if !reach.contains_key(&write.parent_id) {
            let queue = state.store.queue_of(&write.parent_id).await?;
            let reached = queue.is_none_or(|q| caller.0.reaches(q.as_str()));
            reach.insert(write.parent_id.clone(), reached);
        }
    }
    let (inside, outside): (Vec<usize>, Vec<usize>) = (0..writes.len()).partition(|&i| reach[&writes[i].parent_id]);
    let mut statuses = vec![OutcomeStatus::NotFound; writes.len()];
    if !inside.is_empty() {
        let recorded: Arc<[OutcomeWrite]> = inside.iter().map(|&i| writes[i].clone()).collect();
        for (i, status) in inside.iter().zip(record_and_count(state, recorded).await?) {
            statuses[*i] = status;
        }
    }
    for i in outside {
        state
            .metrics
            .outcome(writes[i].outcome.as_str(), OutcomeStatus::NotFound.as_str());
    }
    Ok((writes.into(), statuses))
}

/// The writes of an outcome batch's items, each checked (a problem names
/// its field as `outcomes[3].reason`), and the trace contexts the request's
/// span links to. Writes nothing.
pub(super) fn batch_writes(
    state: &AppState,
    caller: &Caller,
    items: Vec<BatchOutcome>,
) -> ApiResult<(Vec<OutcomeWrite>, Vec<String>)> {
    let mut writes = Vec::with_capacity(items.len());
    let mut links: Vec<String> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        if let Some(traceparent) = &item.traceparent {
            let kept = crate::ledger::trace::traceparent_field(traceparent)
                .map_err(|why| ApiError::invalid(format!("outcomes[{i}].traceparent"), why))?;
            if let Some(kept) = kept
                && links.len() < MOST_LINKS
                && !links.contains(&kept)
            {
                links.push(kept);
            }
        }
        if item.sequence < 0 {
            return Err(ApiError::invalid(
                format!("outcomes[{i}].sequence"),
                "must be non-negative",
            ));
        }
        if item.claim_id.is_none() {
            caller.must(
                Role::Admin,
                &format!("record an outcome without a `claim_id` (outcomes[{i}].claim_id)"),
            )?;
        }
        let write = OutcomeWrite {
            parent_id: item.parent_id,
            sequence: item.sequence,
            outcome: item.outcome,
            reason: item.reason,
            result: item.result,
            claim_id: item.claim_id,
        };
        writes.push(checked(&state.limits, &format!("outcomes[{i}]."), write)?);
    }
    Ok((writes, links))
}

/// Records a batch's checked writes (`batch_writes`), the request's span
/// linked to `links`: one result per write, in order.
pub(super) async fn record_batch(
    state: &AppState,
    caller: &Caller,
    writes: Vec<OutcomeWrite>,
    links: &[String],
) -> ApiResult<Vec<BatchResult>> {
    for traceparent in links {
        crate::telemetry::link_current(traceparent);
    }
    let (writes, statuses) = record_within_reach(state, caller, writes).await?;
    Ok(writes
        .iter()
        .zip(statuses)
        .map(|(w, status)| BatchResult {
            parent_id: w.parent_id.clone(),
            sequence: w.sequence,
            status,
        })
        .collect())
}

/// Record many outcomes in one transaction.
///
/// Each item gets `applied`, `duplicate` (same outcome already recorded),
/// `conflict` (a different outcome won; kept in the child's `conflicts`),
/// `claim_mismatch` (the `claim_id` holds neither the child's current nor its
/// previous lease; nothing written), `not_found` (also for a child outside
/// the token's queues) or `not_decomposed`, in request order.
#[utoipa::path(
    post,
    path = "/v1/outcomes",
    tag = "outcomes",
    request_body = RecordOutcomes,
    responses(
        (status = 200, body = BatchResults),
        (status = "4XX", description = "Invalid input; nothing was written", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn record_outcomes(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<RecordOutcomes>,
) -> ApiResult<Json<BatchResults>> {
    let max = state.limits.max_outcomes_per_request;
    if body.outcomes.is_empty() || body.outcomes.len() > max {
        return Err(ApiError::invalid(
            "outcomes",
            format!("must hold 1-{max} outcomes, got {}", body.outcomes.len()),
        ));
    }
    let (writes, links) = batch_writes(&state, &caller, body.outcomes)?;
    let results = record_batch(&state, &caller, writes, &links).await?;
    Ok(Json(BatchResults { results }))
}
