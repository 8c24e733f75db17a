//! Queues: what each queue's parents hold, for dashboards.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, queue_param};
use super::guard::Caller;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{Queue, QueueName};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_queues))
        .routes(routes!(get_queue))
        .routes(routes!(pause_queue))
        .routes(routes!(resume_queue))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueueList {
    /// Every queue that has a parent or is paused (within the token's queues), by name.
    pub queues: Vec<Queue>,
}

/// List queues with their parents and children by state, oldest pending
/// child and throughput. Read from the parents' projections: the cost does
/// not grow with the children.
#[utoipa::path(
    get,
    path = "/v1/queues",
    tag = "queues",
    responses((status = 200, description = "Every queue", body = QueueList))
)]
async fn list_queues(State(state): State<AppState>, caller: Caller) -> ApiResult<Json<QueueList>> {
    let queues = state.store.queues(None, &caller.0.queues).await?;
    Ok(Json(QueueList { queues }))
}

/// One queue's parents and children by state, oldest pending child and throughput.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    responses(
        (status = 200, description = "The queue", body = Queue),
        (status = 404, description = "The queue has no parent and is not paused", body = Problem,
         content_type = "application/problem+json"),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_queue(State(state): State<AppState>, caller: Caller, Path(queue): Path<String>) -> ApiResult<Json<Queue>> {
    let queue = queue_param(&queue)?;
    state
        .store
        .queues(Some(&queue), &caller.0.queues)
        .await?
        .into_iter()
        .next()
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no queue {queue}")))
}

/// A pause or resume takes no fields: send `{}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueueChange {}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueuePause {
    pub queue: QueueName,
    pub paused: bool,
}

/// Pause a queue: its claims, queue or parent, hand out nothing (long polls
/// wait) until it is resumed. Stored in the database: every replica honours
/// it at once. A queue with no parents yet may be paused too.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/pause",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    request_body(content = QueueChange, description = "`{}`"),
    responses(
        (status = 200, description = "Paused", body = QueuePause),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn pause_queue(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    _body: AppJson<QueueChange>,
) -> ApiResult<Json<QueuePause>> {
    let queue = queue_param(&queue)?;
    state.store.set_paused(&queue, true).await?;
    Ok(Json(QueuePause { queue, paused: true }))
}

/// Resume a paused queue; its waiting claims are woken.
#[utoipa::path(
    post,
    path = "/v1/queues/{queue}/resume",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    request_body(content = QueueChange, description = "`{}`"),
    responses(
        (status = 200, description = "Resumed", body = QueuePause),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn resume_queue(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    _body: AppJson<QueueChange>,
) -> ApiResult<Json<QueuePause>> {
    let queue = queue_param(&queue)?;
    state.store.set_paused(&queue, false).await?;
    Ok(Json(QueuePause { queue, paused: false }))
}
