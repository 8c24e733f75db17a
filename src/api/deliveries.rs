//! Deliveries: a parent's completion webhook events, every attempt at them,
//! and queueing one again.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, parent_id_param};
use super::guard::Caller;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::ParentId;
use crate::state::AppState;
use crate::store::Delivery;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_deliveries))
        .routes(routes!(redeliver))
}

/// A parent's completion events: one per completion, while it has a `webhook_url`
/// (each `url` with its query string shown only to an admin, `?redacted` otherwise).
#[derive(Debug, Serialize, ToSchema)]
pub struct Deliveries {
    pub parent_id: ParentId,
    /// Oldest first; empty until the parent completes (or without a `webhook_url`).
    pub deliveries: Vec<Delivery>,
}

/// List a parent's completion webhook deliveries and their attempts.
///
/// Each completion has one event with one `webhook-id`, sent until a 2xx
/// answers it or the retries run out; each attempt shows its time, the
/// status code or error, and when the next try is due.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/deliveries",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    responses(
        (status = 200, body = Deliveries),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn list_deliveries(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
) -> ApiResult<Json<Deliveries>> {
    let parent_id = parent_id_param(&parent_id)?;
    let deliveries = caller.shown_deliveries(state.store.deliveries(&parent_id).await?);
    Ok(Json(Deliveries { parent_id, deliveries }))
}

/// A redelivery takes no fields: send `{}`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Redeliver {}

/// Queue a parent's latest completion event again.
///
/// It is due at once, with the same `webhook-id` and a fresh run of retries,
/// whether it was delivered, given up or still pending.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/deliveries/redeliver",
    tag = "parents",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body(content = Redeliver, description = "`{}`"),
    responses(
        (status = 202, description = "Queued; the sender takes it at once", body = Deliveries),
        (status = 404, description = "Unknown parent, or it has no completion event", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn redeliver(
    State(state): State<AppState>,
    caller: Caller,
    Path(parent_id): Path<String>,
    _body: AppJson<Redeliver>,
) -> ApiResult<(StatusCode, Json<Deliveries>)> {
    let parent_id = parent_id_param(&parent_id)?;
    if !state.store.redeliver(&parent_id).await? {
        return Err(ApiError::NotFound(format!(
            "parent {parent_id} has no completion event to redeliver (not complete, or no webhook_url)"
        )));
    }
    let deliveries = caller.shown_deliveries(state.store.deliveries(&parent_id).await?);
    Ok((StatusCode::ACCEPTED, Json(Deliveries { parent_id, deliveries })))
}
