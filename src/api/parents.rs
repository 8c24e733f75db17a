//! Parents: register, append, seal, read, list, cancel and delete (the
//! bodies of the writes, and their checks, are in `registration`).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, AppQuery, BulkJson, parent_id_param};
use super::guard::Caller;
use super::registration::{AppendChildren, RegisterParent, SealParent};
use super::validate::{in_range, page_limit};
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{Appended, Parent, ParentId, ParentState, QueueName};
use crate::state::AppState;
use crate::store::{ParentFilter, ParentHas};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_parent, get_parent, delete_parent))
        .routes(routes!(list_parents))
        .routes(routes!(append_children))
        .routes(routes!(seal_parent))
        .routes(routes!(cancel_parent))
}

/// Register a parent with its full child list.
///
/// One row per child is written before anything can be claimed. Repeating the
/// same registration answers 200 and writes nothing; different content is 409.
#[utoipa::path(
    put,
    path = "/v1/parents/{parent_id}",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Client-chosen id, 1-200 chars of `A-Z a-z 0-9 . _ : ~ -`")),
    request_body = RegisterParent,
    responses(
        (status = 201, description = "Registered", body = Parent),
        (status = 200, description = "The same registration already exists; nothing was written", body = Parent),
        (status = 409, description = "The parent exists with different content, or a key is duplicated", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input; nothing was written", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn register_parent(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    headers: axum::http::HeaderMap,
    BulkJson(body): BulkJson<RegisterParent>,
) -> ApiResult<impl IntoResponse> {
    let mut registration = body.into_registration(parent_id_param(&parent_id)?, &state.limits)?;
    // Kept for its children's claims; one that is not W3C is ignored, as the
    // W3C asks (the request then starts no trace of its own either).
    registration.traceparent = headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| crate::ledger::trace::parse_traceparent(v).ok());
    if !caller.0.reaches(registration.queue.as_str()) {
        return Err(ApiError::Forbidden(format!(
            "queue: token {:?} may not register parents in queue {}",
            caller.0.name, registration.queue
        )));
    }
    if caller.hides_parent(&state, &registration.parent_id).await? {
        return Err(ApiError::NotFound(format!("no parent {}", registration.parent_id)));
    }
    let (created, parent) = state.store.register(&registration).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(caller.shown(parent))))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ParentQuery {
    /// `payload` adds the retained parent payload.
    #[param(value_type = Option<String>, pattern = "^payload$")]
    include: Option<Include>,
}

#[derive(Debug, Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
pub enum Include {
    Payload,
}

/// Read a parent: its derived state and projection.
///
/// `total/processed/failed/skipped` and `completed_at` are the stored projection;
/// `pending/in_flight/held` are read from the non-terminal rows.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id"), ParentQuery),
    responses(
        (status = 200, body = Parent),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid id or query", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_parent(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    AppQuery(query): AppQuery<ParentQuery>,
) -> ApiResult<Json<Parent>> {
    let parent_id = parent_id_param(&parent_id)?;
    let parent = state.store.parent(&parent_id, query.include.is_some()).await?;
    Ok(Json(caller.shown(parent)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this queue's parents.
    queue: Option<QueueName>,
    /// Only parents in this state.
    state: Option<ParentState>,
    /// Only active parents with a child claimable now (the scheduler's query).
    resumable: Option<bool>,
    /// Page size, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = "^[0-9]{1,18}$")]
    cursor: Option<String>,
    /// Only parents with a `failed` child, a `held` child, or a child with
    /// logged `conflicts`.
    has: Option<ParentHas>,
    /// `oldest` first (the default) or `newest` first.
    order: Option<ListOrder>,
    /// Only parents registered after this time (RFC 3339).
    created_after: Option<DateTime<Utc>>,
    /// Only parents registered before this time (RFC 3339).
    created_before: Option<DateTime<Utc>>,
}

/// The order of a parent list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    #[default]
    Oldest,
    Newest,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ParentList {
    /// Oldest first (or newest first, with `order=newest`).
    pub parents: Vec<Parent>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// List parents, oldest first (or newest first), filtered.
#[utoipa::path(
    get,
    path = "/v1/parents",
    tag = "parents",
    params(ListQuery),
    responses(
        (status = 200, body = ParentList),
        (status = 400, description = "Invalid query", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_parents(
    State(state): State<AppState>,
    caller: Caller,
    AppQuery(query): AppQuery<ListQuery>,
) -> ApiResult<Json<ParentList>> {
    let limit = page_limit(query.limit)?;
    let after_position = query
        .cursor
        .as_deref()
        .map(|c| {
            let issued = (1..=18).contains(&c.len()) && c.bytes().all(|b| b.is_ascii_digit());
            c.parse::<i64>()
                .ok()
                .filter(|_| issued)
                .ok_or_else(|| ApiError::bad_request("cursor", "not a cursor this service issued"))
        })
        .transpose()?;
    let page = state
        .store
        .list_parents(&ParentFilter {
            queue: query.queue,
            state: query.state,
            resumable: query.resumable.unwrap_or(false),
            within: caller.0.queues.clone(),
            after_position,
            limit,
            has: query.has,
            newest: query.order.unwrap_or_default() == ListOrder::Newest,
            created_after: query.created_after,
            created_before: query.created_before,
        })
        .await?;
    Ok(Json(ParentList {
        parents: page.parents.into_iter().map(|p| caller.shown(p)).collect(),
        next_cursor: page.next_position.map(|p| p.to_string()),
    }))
}

/// Append children to a decomposing parent.
///
/// Idempotent per sequence: the same content again is a no-op; different
/// content is 409 and nothing is written. 409 once the parent is decomposed.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/children",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body = AppendChildren,
    responses(
        (status = 200, body = Appended),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Parent decomposed, content differs, or key duplicated", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input; nothing was written", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn append_children(
    State(state): State<AppState>,
    Path(parent_id): Path<String>,
    BulkJson(body): BulkJson<AppendChildren>,
) -> ApiResult<Json<Appended>> {
    let parent_id = parent_id_param(&parent_id)?;
    let children = body.into_children(&state.limits)?;
    Ok(Json(state.store.append(&parent_id, &children).await?))
}

/// Seal a decomposing parent: mark it decomposed when exactly `0..total-1` exist.
///
/// Otherwise 409 naming the missing or extra sequences (at most the first 100
/// of each). Repeating a successful seal returns 200 and the parent.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/seal",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body = SealParent,
    responses(
        (status = 200, body = Parent),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Sequences missing or extra", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn seal_parent(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    AppJson(body): AppJson<SealParent>,
) -> ApiResult<Json<Parent>> {
    let parent_id = parent_id_param(&parent_id)?;
    let total = in_range("total", body.total, 0, i64::MAX / 2)?;
    let parent = state.store.seal(&parent_id, total).await?;
    Ok(Json(caller.shown(parent)))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelParent {
    /// Why: every child not yet terminal is skipped with this reason.
    #[schema(min_length = 1, max_length = 1000, example = "order withdrawn by the customer")]
    reason: String,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Cancelled {
    /// Children this call skipped (0 when the parent was already complete).
    pub skipped: i64,
    /// The parent after the cancel: complete.
    pub parent: Parent,
}

/// Cancel a parent: every child not yet terminal becomes `skipped` with the
/// reason, in one transaction, and the parent completes (sealed at what it
/// holds if it was still being decomposed).
///
/// A worker's later outcome for one of those children loses to the cancel
/// and is logged as a conflict. Cancelling a complete parent changes nothing.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/cancel",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body = CancelParent,
    responses(
        (status = 200, description = "Cancelled", body = Cancelled),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn cancel_parent(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    AppJson(body): AppJson<CancelParent>,
) -> ApiResult<Json<Cancelled>> {
    let parent_id = parent_id_param(&parent_id)?;
    let reason = body.reason.trim();
    if reason.is_empty() {
        return Err(ApiError::invalid("reason", "must be a non-empty reason"));
    }
    super::validate::max_chars("reason", reason, super::validate::MAX_REASON_CHARS)?;
    let skipped = state.store.cancel(&parent_id, reason).await?;
    let parent = caller.shown(state.store.parent(&parent_id, false).await?);
    Ok(Json(Cancelled { skipped, parent }))
}

/// Delete a complete parent with its children now (what the retention
/// pruner does to parents complete for longer than `--retain-complete-seconds`).
#[utoipa::path(
    delete,
    path = "/v1/parents/{parent_id}",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not complete", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn delete_parent(State(state): State<AppState>, Path(parent_id): Path<String>) -> ApiResult<StatusCode> {
    let parent_id = parent_id_param(&parent_id)?;
    if state.store.delete_parent(&parent_id).await? {
        state.metrics.pruned(1);
    }
    Ok(StatusCode::NO_CONTENT)
}
