//! Reconcile: compare the stored projection with the child rows, show the
//! difference, and repair it. When they disagree, the ledger wins.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, parent_id_param};
use super::guard::Caller;
use crate::error::{ApiResult, Problem};
use crate::ledger::{ParentId, QueueName, ReconcileReport, SweepReport};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(reconcile_parent))
        .routes(routes!(reconcile_all))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileParent {
    /// `true`: only report the differences (default `false`: repair them).
    dry_run: Option<bool>,
}

/// Reconcile one parent's projection with its child rows.
///
/// Derives `total/processed/failed/skipped/complete` from the rows, compares
/// them with the stored projection and, unless `dry_run`, repairs it. A
/// premature `completed_at` (a non-terminal child remains) is cleared.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/reconcile",
    tag = "reconcile",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body(content = ReconcileParent, description = "`{\"dry_run\": true}` to only look"),
    responses(
        (status = 200, body = ReconcileReport),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn reconcile_parent(
    State(state): State<AppState>,
    Path(parent_id): Path<String>,
    AppJson(body): AppJson<ReconcileParent>,
) -> ApiResult<Json<ReconcileReport>> {
    let parent_id = parent_id_param(&parent_id)?;
    Ok(Json(
        state.store.reconcile(&parent_id, body.dry_run.unwrap_or(false)).await?,
    ))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileAll {
    /// `true`: only report (default `false`: repair).
    dry_run: Option<bool>,
    /// Only this queue's parents.
    queue: Option<QueueName>,
}

/// Reconcile every parent, or one queue's.
///
/// Returns how many were checked, drifted and repaired, with the drifted
/// parents' reports.
#[utoipa::path(
    post,
    path = "/v1/reconcile",
    tag = "reconcile",
    request_body(content = ReconcileAll, description = "`{\"dry_run\": true}` to only look"),
    responses(
        (status = 200, body = SweepReport),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn reconcile_all(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<ReconcileAll>,
) -> ApiResult<Json<SweepReport>> {
    Ok(Json(
        state
            .store
            .reconcile_sweep(body.queue.as_ref(), &caller.0.queues, body.dry_run.unwrap_or(false))
            .await?,
    ))
}
