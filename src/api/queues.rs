//! Queues: what each queue's parents hold, for dashboards.

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::queue_param;
use super::guard::Caller;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::Queue;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_queues))
        .routes(routes!(get_queue))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct QueueList {
    /// Every queue that has had a parent (within the token's queues), by name.
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
    params(("queue" = String, Path, description = "Queue name")),
    responses(
        (status = 200, description = "The queue", body = Queue),
        (status = 404, description = "The queue has never had a parent", body = Problem,
         content_type = "application/problem+json"),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
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
