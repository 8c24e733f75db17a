//! Running failures again: redrive a parent's selected children into a new
//! parent, and return every held child of a parent to pending at once.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, parent_id_param};
use super::guard::Caller;
use super::validate::{MAX_REASON_CHARS, max_chars};
use super::whole;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::redrive::{MAX_REASONS, Redrive};
use crate::ledger::{Outcome, Parent, ParentId, QueueName};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(redrive_parent))
        .routes(routes!(retry_children))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveParent {
    /// The new parent's id: the same redrive again answers `200` with it;
    /// another parent under that id is a `409`.
    #[schema(example = "P-42-r1")]
    into: ParentId,
    /// The terminal states to run again; default `["failed"]`.
    #[schema(example = json!(["failed"]), min_items = 1)]
    states: Option<Vec<Outcome>>,
    /// Only children whose reason is one of these (1-100, each at most 1000
    /// characters); default: any reason.
    #[schema(example = json!(["timeout"]), min_items = 1, max_items = 100)]
    reasons: Option<Vec<String>>,
    /// The new parent's queue; default: the old parent's.
    #[schema(example = "events")]
    queue: Option<QueueName>,
    /// The new parent's priority (-100..100); default: the old parent's.
    #[schema(minimum = -100, maximum = 100)]
    #[serde(default, deserialize_with = "whole::option")]
    priority: Option<i32>,
    /// Only count the children it would select; write nothing.
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Redriven {
    pub dry_run: bool,
    pub into: ParentId,
    /// The children selected: the new parent's `total`.
    pub children: i64,
    /// The new parent; `null` on a dry run.
    pub parent: Option<Parent>,
}

/// Redrive: register a new parent (`into`) whose children are this parent's
/// children in the selected terminal states (and reasons): their keys and
/// payloads, in their sequence order from 0, each showing `redrive_of`. The
/// new parent takes this one's queue and settings (tolerance, attempts,
/// lease policy, webhook, flow key, backoff) unless given; it is written in
/// the database in one statement, never a request per child. This parent
/// keeps its outcomes. Idempotent by `into`; `dry_run` answers the count.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/redrive",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "The parent whose children run again")),
    request_body = RedriveParent,
    responses(
        (status = 201, description = "The new parent, registered", body = Redriven),
        (status = 200, description = "A dry run's count, or the same redrive done before", body = Redriven),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Another parent already has the id `into`", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn redrive_parent(
    State(state): State<AppState>,
    Path(parent_id): Path<String>,
    caller: Caller,
    AppJson(body): AppJson<RedriveParent>,
) -> ApiResult<impl IntoResponse> {
    let from = parent_id_param(&parent_id)?;
    let into = body.into;
    if into == from {
        // That parent exists, with other content: as for any other taken id.
        return Err(ApiError::RegistrationConflict(format!(
            "into: parent {into} is the one redriven; a redrive registers a new parent"
        )));
    }
    let mut states = body.states.unwrap_or_else(|| vec![Outcome::Failed]);
    if states.is_empty() {
        return Err(ApiError::invalid(
            "states",
            "must name at least one of processed, failed, skipped",
        ));
    }
    states.sort_by_key(|s| s.as_str());
    states.dedup();
    if let Some(reasons) = &body.reasons {
        if reasons.is_empty() || reasons.len() > MAX_REASONS {
            return Err(ApiError::invalid(
                "reasons",
                format!("must hold 1 to {MAX_REASONS} reasons"),
            ));
        }
        for (i, reason) in reasons.iter().enumerate() {
            max_chars(&format!("reasons[{i}]"), reason, MAX_REASON_CHARS)?;
        }
    }
    let queue = body.queue;
    if let Some(priority) = body.priority
        && !(-100..=100).contains(&priority)
    {
        return Err(ApiError::invalid("priority", "must be between -100 and 100"));
    }
    if let Some(queue) = &queue
        && !caller.0.reaches(queue.as_str())
    {
        return Err(ApiError::Forbidden(format!(
            "queue: token {:?} may not register parents in queue {queue}",
            caller.0.name
        )));
    }
    if caller.hides_parent(&state, &into).await? {
        return Err(ApiError::NotFound(format!("no parent {into}")));
    }
    let redrive = Redrive {
        from,
        into: into.clone(),
        states,
        reasons: body.reasons,
        queue,
        priority: body.priority,
    };
    if body.dry_run {
        let children = state.store.redrive_count(&redrive).await?;
        let answer = Redriven {
            dry_run: true,
            into,
            children,
            parent: None,
        };
        return Ok((StatusCode::OK, Json(answer)));
    }
    let done = state.store.redrive(&redrive).await?;
    let status = if done.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(Redriven {
            dry_run: false,
            into,
            children: done.children,
            parent: done.parent.map(|p| caller.shown(p)),
        }),
    ))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryChildren {
    /// The states to return to pending: `["held"]`, the only one a retry applies to.
    #[schema(example = json!(["held"]), min_items = 1)]
    states: Vec<Retryable>,
}

/// The state a bulk retry applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Retryable {
    Held,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Retried {
    /// How many held children went back to pending (0: none was held).
    pub retried: u64,
}

/// Return every held child of a parent to pending at once, as retrying each
/// would: claimable now, the next claimer told `previous_attempt`.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/retry",
    tag = "children",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body = RetryChildren,
    responses(
        (status = 200, body = Retried),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid body", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn retry_children(
    State(state): State<AppState>,
    Path(parent_id): Path<String>,
    AppJson(body): AppJson<RetryChildren>,
) -> ApiResult<Json<Retried>> {
    let parent_id = parent_id_param(&parent_id)?;
    if body.states.is_empty() {
        return Err(ApiError::invalid(
            "states",
            "must be [\"held\"]: only a held child is retried (a terminal one is redriven into a new parent)",
        ));
    }
    let retried = state.store.retry_all_held(&parent_id).await?;
    Ok(Json(Retried { retried }))
}
