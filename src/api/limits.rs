//! Claim admission's admin routes: a queue's limits and each flow key's,
//! and the order in which its claims serve its parents. Stored in the
//! database: every replica's next claim honours a change.

use axum::Json;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{AppJson, queue_param};
use crate::error::{ApiError, ApiResult, Problem};
use crate::ledger::QueueName;
use crate::ledger::admission::{ClaimOrder, FlowLimits, KeyLimits, QueueLimits, QueueSettings, check_flow_key};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_queue_limits, put_queue_limits))
        .routes(routes!(get_key_limits, put_key_limits, delete_key_limits))
        .routes(routes!(get_queue_settings, put_queue_settings))
}

/// A queue's limits: its own, and each flow key's unless the key has its own.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"max_in_flight": 500, "per_second": 200, "burst": 50,
    "per_key": {"max_in_flight": 10, "per_second": 5, "burst": 5}}))]
pub struct SetQueueLimits {
    /// The queue's children with a live lease at most (0-1,000,000,000).
    #[schema(minimum = 0, maximum = 1000000000)]
    #[serde(default, deserialize_with = "super::whole::option")]
    max_in_flight: Option<i64>,
    /// The queue's children claimed per second (0.001-1,000,000).
    #[schema(minimum = 0.001, maximum = 1000000)]
    per_second: Option<f64>,
    /// The queue's bucket size (see `SetLimits`).
    #[schema(minimum = 1, maximum = 1000000000)]
    burst: Option<f64>,
    /// Each flow key's limits (a key may have its own instead).
    per_key: Option<SetLimits>,
}

/// Limits as sent: each member optional, `null` (or absent) = no limit.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetLimits {
    /// Children with a live lease at most (0-1,000,000,000).
    #[schema(minimum = 0, maximum = 1000000000)]
    #[serde(default, deserialize_with = "super::whole::option")]
    max_in_flight: Option<i64>,
    /// Children claimed per second (0.001-1,000,000): a token bucket.
    #[schema(minimum = 0.001, maximum = 1000000)]
    per_second: Option<f64>,
    /// The bucket's size (1-1,000,000,000; needs `per_second`; default: `per_second`, at least 1).
    #[schema(minimum = 1, maximum = 1000000000)]
    burst: Option<f64>,
}

impl SetLimits {
    /// The checked limits; `field` names them in a 422.
    fn checked(self, field: &str) -> ApiResult<FlowLimits> {
        let name = |member: &str| {
            if field.is_empty() {
                member.to_owned()
            } else {
                format!("{field}.{member}")
            }
        };
        if let Some(max) = self.max_in_flight
            && !(0..=1_000_000_000).contains(&max)
        {
            return Err(ApiError::invalid(
                name("max_in_flight"),
                "must be between 0 and 1000000000",
            ));
        }
        if let Some(rate) = self.per_second
            && !(0.001..=1_000_000.0).contains(&rate)
        {
            return Err(ApiError::invalid(
                name("per_second"),
                "must be between 0.001 and 1000000",
            ));
        }
        if let Some(burst) = self.burst {
            if !(1.0..=1_000_000_000.0).contains(&burst) {
                return Err(ApiError::invalid(name("burst"), "must be between 1 and 1000000000"));
            }
            if self.per_second.is_none() {
                return Err(ApiError::invalid(name("burst"), "needs per_second"));
            }
        }
        Ok(FlowLimits {
            max_in_flight: self.max_in_flight,
            per_second: self.per_second,
            burst: self.burst,
        })
    }
}

/// A queue's limits and what is used under them now.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/limits",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    responses(
        (status = 200, description = "The queue's limits (all `null` when it has none)", body = QueueLimits),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_queue_limits(State(state): State<AppState>, Path(queue): Path<String>) -> ApiResult<Json<QueueLimits>> {
    let queue = queue_param(&queue)?;
    Ok(Json(state.store.queue_limits(&queue).await?))
}

/// Set a queue's limits, replacing them whole: children in flight (a live
/// lease) and claimed per second, over the queue and for each flow key.
/// Enforced by the statement that claims, on every replica at once; a claim
/// passes a key at its limit by and fills from the next keys.
#[utoipa::path(
    put,
    path = "/v1/queues/{queue}/limits",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    request_body(content = SetQueueLimits, description = "Every member optional; `{}` removes every limit"),
    responses(
        (status = 200, description = "The queue's limits now", body = QueueLimits),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn put_queue_limits(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    AppJson(body): AppJson<SetQueueLimits>,
) -> ApiResult<Json<QueueLimits>> {
    let queue = queue_param(&queue)?;
    let limits = SetLimits {
        max_in_flight: body.max_in_flight,
        per_second: body.per_second,
        burst: body.burst,
    }
    .checked("")?;
    let per_key = body.per_key.unwrap_or_default().checked("per_key")?;
    state.store.set_queue_limits(&queue, limits, per_key).await?;
    Ok(Json(state.store.queue_limits(&queue).await?))
}

/// The queue and flow key of a key's path, checked. A key made only of dots
/// is refused (422) where it would be written; one that was written before
/// names were checked stays readable and deletable, its dots percent-encoded
/// (`/keys/%2E%2E/limits`), which no client normalises.
fn key_path((queue, key): &(String, String), writing: bool) -> ApiResult<(QueueName, String)> {
    let queue = queue_param(queue)?;
    match check_flow_key(key) {
        Ok(()) => {}
        Err(_) if !writing && crate::ledger::ids::only_dots(key) && key.len() <= 128 => {}
        Err(why) if crate::ledger::ids::traverses(key) => return Err(ApiError::invalid("flow_key", why)),
        Err(why) => return Err(ApiError::bad_request("flow_key", why)),
    }
    Ok((queue, key.clone()))
}

/// One flow key's limits (its own, or the queue's `per_key`) and what is used under them now.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/keys/{flow_key}/limits",
    tag = "queues",
    params(
        ("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`"),
        ("flow_key" = String, Path, description = "Flow key, 1-128 chars of `A-Z a-z 0-9 . _ : -`, not only dots"),
    ),
    responses(
        (status = 200, description = "The key's limits", body = KeyLimits),
        (status = 400, description = "Invalid queue name or key", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots or holding `/`, or a flow key holding `/` (a key made only of dots that exists stays reachable here, sent percent-encoded: `%2E%2E`)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_key_limits(
    State(state): State<AppState>,
    Path(path): Path<(String, String)>,
) -> ApiResult<Json<KeyLimits>> {
    let (queue, key) = key_path(&path, false)?;
    Ok(Json(state.store.key_limits(&queue, &key).await?))
}

/// Give one flow key limits of its own, replacing the queue's `per_key` for
/// it (whole: a member absent or `null` is no limit for this key).
#[utoipa::path(
    put,
    path = "/v1/queues/{queue}/keys/{flow_key}/limits",
    tag = "queues",
    params(
        ("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`"),
        ("flow_key" = String, Path, description = "Flow key, 1-128 chars of `A-Z a-z 0-9 . _ : -`, not only dots"),
    ),
    request_body(content = SetLimits, description = "Every member optional"),
    responses(
        (status = 200, description = "The key's limits now", body = KeyLimits),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn put_key_limits(
    State(state): State<AppState>,
    Path(path): Path<(String, String)>,
    AppJson(body): AppJson<SetLimits>,
) -> ApiResult<Json<KeyLimits>> {
    let (queue, key) = key_path(&path, true)?;
    let limits = body.checked("")?;
    state.store.set_key_limits(&queue, &key, Some(limits)).await?;
    Ok(Json(state.store.key_limits(&queue, &key).await?))
}

/// Take a flow key's own limits away: the queue's `per_key` applies to it again.
#[utoipa::path(
    delete,
    path = "/v1/queues/{queue}/keys/{flow_key}/limits",
    tag = "queues",
    params(
        ("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`"),
        ("flow_key" = String, Path, description = "Flow key, 1-128 chars of `A-Z a-z 0-9 . _ : -`, not only dots"),
    ),
    responses(
        (status = 200, description = "The key's limits now", body = KeyLimits),
        (status = 400, description = "Invalid queue name or key", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots or holding `/`, or a flow key holding `/` (a key made only of dots that exists stays reachable here, sent percent-encoded: `%2E%2E`)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn delete_key_limits(
    State(state): State<AppState>,
    Path(path): Path<(String, String)>,
) -> ApiResult<Json<KeyLimits>> {
    let (queue, key) = key_path(&path, false)?;
    state.store.set_key_limits(&queue, &key, None).await?;
    Ok(Json(state.store.key_limits(&queue, &key).await?))
}

/// A queue's settings as sent.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"order": "oldest"}))]
pub struct SetQueueSettings {
    /// `fair` (default): least recently served parent first. `oldest`:
    /// oldest parent first, a short claim filled from the next. With flow
    /// keys, claims take keys in turn and follow this order within a key.
    order: ClaimOrder,
}

/// A queue's settings: the order in which its claims serve its parents.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/settings",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    responses(
        (status = 200, description = "The queue's settings", body = QueueSettings),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn get_queue_settings(
    State(state): State<AppState>,
    Path(queue): Path<String>,
) -> ApiResult<Json<QueueSettings>> {
    let queue = queue_param(&queue)?;
    let order = state.store.claim_order(&queue).await?;
    Ok(Json(QueueSettings { queue, order }))
}

/// Set a queue's settings; its next claims, on every replica, follow them.
#[utoipa::path(
    put,
    path = "/v1/queues/{queue}/settings",
    tag = "queues",
    params(("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`")),
    request_body(content = SetQueueSettings),
    responses(
        (status = 200, description = "The queue's settings now", body = QueueSettings),
        (status = "4XX", description = "Invalid input", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn put_queue_settings(
    State(state): State<AppState>,
    Path(queue): Path<String>,
    AppJson(body): AppJson<SetQueueSettings>,
) -> ApiResult<Json<QueueSettings>> {
    let queue = queue_param(&queue)?;
    state.store.set_claim_order(&queue, body.order).await?;
    Ok(Json(QueueSettings {
        queue,
        order: body.order,
    }))
}
