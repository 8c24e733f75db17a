//! Reconcile: compare the stored projection with the child rows, show the
//! difference, and repair it. When they disagree, the ledger wins.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, parent_id_param};
use super::guard::Caller;
use super::validate::in_range;
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::{ParentId, QueueName, ReconcileJob, ReconcileReport, SweepReport};
use crate::state::AppState;
use crate::store::SweepQuery;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(reconcile_parent))
        .routes(routes!(reconcile_all))
        .routes(routes!(start_job))
        .routes(routes!(get_job))
}

/// What a reconcile that names no `dry_run` does: only look, as
/// `child-ledger reconcile` without `--apply` does. Repairing is asked for.
const DRY_RUN_BY_DEFAULT: bool = true;

/// Parents one `POST /v1/reconcile` checks when it names no `limit`.
const DEFAULT_SWEEP_LIMIT: i64 = 1000;
/// The most parents one `POST /v1/reconcile` may check.
const MAX_SWEEP_LIMIT: i64 = 10_000;

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileParent {
    /// `true` (the default): only report the differences; `false`: repair them.
    #[schema(default = true)]
    dry_run: Option<bool>,
}

/// Reconcile one parent's projection with its child rows.
///
/// Derives `total/processed/failed/skipped/complete` from the rows, compares
/// them with the stored projection and, with `"dry_run": false`, repairs it
/// (by default it only reports). A premature `completed_at` (a non-terminal
/// child remains) is cleared.
#[utoipa::path(
    post,
    path = "/v1/parents/{parent_id}/reconcile",
    tag = "reconcile",
    params(("parent_id" = ParentId, Path, description = "Parent id")),
    request_body(content = ReconcileParent, description = "`{}` only looks (a dry run); `{\"dry_run\": false}` repairs"),
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
        state
            .store
            .reconcile(&parent_id, body.dry_run.unwrap_or(DRY_RUN_BY_DEFAULT))
            .await?,
    ))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileAll {
    /// `true` (the default): only report; `false`: repair.
    #[schema(default = true)]
    dry_run: Option<bool>,
    /// Only this queue's parents.
    queue: Option<QueueName>,
    /// Most parents this call checks, 1-10000 (default 1000).
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "super::whole::option")]
    limit: Option<i64>,
    /// `next_cursor` of the previous call: go on after the parents it checked.
    #[schema(pattern = "^[0-9]{1,18}$")]
    cursor: Option<String>,
}

/// A sweep cursor as this service issues it: a parent position.
fn sweep_cursor(cursor: Option<&str>) -> ApiResult<i64> {
    let Some(cursor) = cursor else { return Ok(0) };
    let issued = (1..=18).contains(&cursor.len()) && cursor.bytes().all(|b| b.is_ascii_digit());
    cursor
        .parse::<i64>()
        .ok()
        .filter(|_| issued)
        .ok_or_else(|| ApiError::invalid("cursor", "not a cursor this service issued"))
}

/// Reconcile the parents (or one queue's), at most `limit` per call.
///
/// Returns how many were checked, drifted and repaired, with the drifted
/// parents' reports, and `next_cursor` to go on from (`null` once every
/// parent was checked). For a sweep of the whole ledger in the background,
/// use `POST /v1/reconcile/jobs`.
#[utoipa::path(
    post,
    path = "/v1/reconcile",
    tag = "reconcile",
    request_body(content = ReconcileAll, description = "`{}` only looks (a dry run); `{\"dry_run\": false}` repairs"),
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
    let limit = in_range("limit", body.limit.unwrap_or(DEFAULT_SWEEP_LIMIT), 1, MAX_SWEEP_LIMIT)?;
    let after = sweep_cursor(body.cursor.as_deref())?;
    Ok(Json(
        state
            .store
            .reconcile_sweep(SweepQuery {
                queue: body.queue.as_ref(),
                within: &caller.0.queues,
                dry_run: body.dry_run.unwrap_or(DRY_RUN_BY_DEFAULT),
                after,
                limit,
            })
            .await?,
    ))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartJob {
    /// `true` (the default): only report; `false`: repair.
    #[schema(default = true)]
    dry_run: Option<bool>,
    /// Only this queue's parents.
    queue: Option<QueueName>,
}

/// Start a reconcile sweep of every parent (or one queue's) in the background.
///
/// Answers at once with the job; a background loop on any replica works it
/// a page at a time, resuming after a restart, and marks it `failed` after
/// repeated errors. `GET /v1/reconcile/jobs/{job_id}` shows its progress.
#[utoipa::path(
    post,
    path = "/v1/reconcile/jobs",
    tag = "reconcile",
    request_body(content = StartJob, description = "`{\"dry_run\": false, \"queue\": \"events\"}`"),
    responses(
        (status = 202, body = ReconcileJob),
        (status = 403, description = "The role does not allow it, or `queue` is outside the token's queues", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn start_job(
    State(state): State<AppState>,
    caller: Caller,
    AppJson(body): AppJson<StartJob>,
) -> ApiResult<(StatusCode, Json<ReconcileJob>)> {
    // A job its creator could not read back, checking nothing: refused.
    if let Some(queue) = &body.queue
        && !caller.0.reaches(queue.as_str())
    {
        return Err(ApiError::Forbidden(format!(
            "token {:?} does not reach queue {:?}: a reconcile job may sweep only the token's queues",
            caller.0.name,
            queue.as_str()
        )));
    }
    let job = state
        .store
        .create_reconcile_job(
            body.dry_run.unwrap_or(DRY_RUN_BY_DEFAULT),
            body.queue.as_ref(),
            &caller.0.queues,
        )
        .await?;
    let queue = job.queue.as_ref().map(QueueName::as_str);
    tracing::info!(job_id = %job.job_id, dry_run = job.dry_run, queue, "reconcile job started");
    Ok((StatusCode::ACCEPTED, Json(job)))
}

/// A background reconcile sweep: its progress, and once `done` its report.
#[utoipa::path(
    get,
    path = "/v1/reconcile/jobs/{job_id}",
    tag = "reconcile",
    params(("job_id" = uuid::Uuid, Path, description = "Job id")),
    responses(
        (status = 200, body = ReconcileJob),
        (status = 404, description = "Unknown job", body = Problem, content_type = "application/problem+json"),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    Path(job_id): Path<String>,
) -> ApiResult<Json<ReconcileJob>> {
    let job_id =
        uuid::Uuid::parse_str(&job_id).map_err(|e| ApiError::bad_request("job_id", format!("must be a uuid: {e}")))?;
    // A job that may have touched queues outside the caller's is answered as
    // if it did not exist.
    state
        .store
        .reconcile_job(job_id)
        .await?
        .filter(|job| job.visible_within(&caller.0.queues))
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("no reconcile job {job_id}")))
}
