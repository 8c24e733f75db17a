//! Children: list a parent's, search across parents, read one, and return a
//! held child to pending.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, AppQuery, parent_id_param, sequence_param};
use super::guard::Caller;
use super::validate::page_limit;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{Child, ChildState, ParentId, QueueName};
use crate::state::AppState;
use crate::store::{ChildFilter, ChildPageQuery};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_children))
        .routes(routes!(search_children))
        .routes(routes!(get_child))
        .routes(routes!(retry_child))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ChildrenQuery {
    /// Only children in this state.
    state: Option<ChildState>,
    /// Children after this sequence (`next_after` of the previous page).
    after: Option<i64>,
    /// Page size, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChildList {
    /// In sequence order.
    pub children: Vec<Child>,
    /// Pass as `after` for the next page; `null` on the last page.
    pub next_after: Option<i64>,
}

/// List a parent's children in sequence order.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/children",
    tag = "children",
    params(("parent_id" = ParentId, Path, description = "Parent id"), ChildrenQuery),
    responses(
        (status = 200, body = ChildList),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid id or query", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_children(
    State(state): State<AppState>,
    Path(parent_id): Path<String>,
    AppQuery(query): AppQuery<ChildrenQuery>,
) -> ApiResult<Json<ChildList>> {
    let parent_id = parent_id_param(&parent_id)?;
    let limit = page_limit(query.limit)?;
    let page = state
        .store
        .children(
            ChildPageQuery {
                parent_id: &parent_id,
                state: query.state,
                after: query.after,
                limit,
            },
            state.limits.response_budget(),
        )
        .await?;
    Ok(Json(ChildList {
        children: page.children,
        next_after: page.next_after,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Only children of this queue's parents.
    queue: Option<QueueName>,
    /// Only children in this state; required without `parent_id`.
    state: Option<ChildState>,
    /// Only this parent's children.
    parent_id: Option<ParentId>,
    /// Page size, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    #[param(pattern = r"^[0-9]{1,19}\.[0-9]{1,19}\..+$")]
    cursor: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChildSearchPage {
    /// Newest change first (`changed_at`, then parent and sequence, descending).
    pub children: Vec<Child>,
    /// Pass as `cursor` for the next page; `null` on the last page. A page
    /// that examined `--max-search-rows` index rows ends early: it may hold
    /// fewer children than `limit`, even none, and still have a next page.
    pub next_cursor: Option<String>,
}

/// A search cursor: the last child's `changed_at` (microseconds since the
/// epoch), sequence and parent, as `micros.sequence.parent_id`.
fn cursor_of((changed_at, parent_id, sequence): &(chrono::DateTime<chrono::Utc>, ParentId, i64)) -> String {
    format!("{}.{sequence}.{parent_id}", changed_at.timestamp_micros())
}

fn cursor_param(raw: &str) -> Result<(chrono::DateTime<chrono::Utc>, ParentId, i64), ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "cursor",
            "not a cursor this service returned (pass `next_cursor` as is)",
        )
    };
    let mut parts = raw.splitn(3, '.');
    let (Some(micros), Some(sequence), Some(parent_id)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(invalid());
    };
    let changed_at = micros
        .parse::<i64>()
        .ok()
        .and_then(chrono::DateTime::from_timestamp_micros)
        .ok_or_else(invalid)?;
    let sequence = sequence.parse::<i64>().ok().filter(|s| *s >= 0).ok_or_else(invalid)?;
    let parent_id = ParentId::parse(parent_id).map_err(|_| invalid())?;
    Ok((changed_at, parent_id, sequence))
}

/// Search children across parents, newest change first: every held or failed
/// child of a queue in one paged call.
#[utoipa::path(
    get,
    path = "/v1/children",
    tag = "children",
    params(SearchQuery),
    responses(
        (status = 200, description = "A page of children", body = ChildSearchPage),
        (status = 400, description = "Invalid query, or no `state` without `parent_id`", body = Problem,
         content_type = "application/problem+json"),
    )
)]
async fn search_children(
    State(state): State<AppState>,
    caller: Caller,
    AppQuery(query): AppQuery<SearchQuery>,
) -> ApiResult<Json<ChildSearchPage>> {
    let limit = page_limit(query.limit)?;
    let parent_id = query.parent_id;
    if parent_id.is_none() && query.state.is_none() {
        return Err(ApiError::bad_request(
            "state",
            "required unless parent_id is given (failed, held, pending, in_flight, processed or skipped)",
        ));
    }
    let filter = ChildFilter {
        queue: query.queue,
        state: query.state,
        parent_id,
        within: caller.0.queues.clone(),
        after: query.cursor.as_deref().map(cursor_param).transpose()?,
        limit,
        max_rows: state.limits.max_search_rows,
    };
    let page = state
        .store
        .search_children(filter, state.limits.response_budget())
        .await?;
    Ok(Json(ChildSearchPage {
        children: page.children,
        next_cursor: page.next.as_ref().map(cursor_of),
    }))
}

/// Read one child: its state, lease, outcome and conflict log.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/children/{sequence}",
    tag = "children",
    params(
        ("parent_id" = ParentId, Path, description = "Parent id"),
        ("sequence" = i64, Path, description = "0-based position in the parent", minimum = 0),
    ),
    responses(
        (status = 200, body = Child),
        (status = 404, description = "Unknown child", body = Problem, content_type = "application/problem+json"),
        (status = 400, description = "Invalid id or sequence", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_child(
    State(state): State<AppState>,
    Path((parent_id, sequence)): Path<(String, String)>,
) -> ApiResult<Json<Child>> {
    let parent_id = parent_id_param(&parent_id)?;
    let sequence = sequence_param(&sequence)?;
    Ok(Json(state.store.child(&parent_id, sequence).await?))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryChild {}

/// Return a `held` child to `pending`: its outcome was found not to have happened.
///
/// A child that is already pending is returned as is. 409 for a terminal or
/// in-flight child: terminal is one-way.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/children/{sequence}/retry",
    tag = "children",
    params(
        ("parent_id" = ParentId, Path, description = "Parent id"),
        ("sequence" = i64, Path, description = "0-based position in the parent", minimum = 0),
    ),
    request_body(content = RetryChild, description = "`{}`"),
    responses(
        (status = 200, description = "The child, now pending", body = Child),
        (status = 404, description = "Unknown child", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The child is terminal or in flight", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn retry_child(
    State(state): State<AppState>,
    Path((parent_id, sequence)): Path<(String, String)>,
    _body: AppJson<RetryChild>,
) -> ApiResult<Json<Child>> {
    let parent_id = parent_id_param(&parent_id)?;
    let sequence = sequence_param(&sequence)?;
    let child = state.store.retry(&parent_id, sequence).await?;
    Ok(Json(child))
}
