//! Operations: liveness, readiness and metrics.

use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::guard::Caller;
use crate::access::QueueScope;
use crate::error::{ApiError, ApiResult, Problem};
use crate::metrics::{QueueGauge, WaitingClaims};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: String,
    /// `postgres` or `sqlite`.
    pub store: String,
    /// On `/readyz` with Postgres: the host (`host:port`) the ledger is on,
    /// the writable one of the database URL's hosts; shown to a caller with
    /// a valid token (every caller of a service without tokens).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(example = "db-a:5432")]
    pub host: Option<String>,
}

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
        store: state.store.backend().to_owned(),
        host: None,
    })
}

/// Readiness: the database answers and can hold the ledger (on Postgres, a
/// writable host, named in `host`). A 503 says why not: still connecting,
/// or, with several hosts, no writable one found yet.
///
/// Orchestrators call it without a token. With a tokens file, such a caller
/// learns only whether the service is ready: the host and the reasons for a
/// 503 go to callers with a valid token (any role) and to the log.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready; `host` only for a caller with a valid token (or a service without tokens)", body = Health),
        (status = 503, description = "The database does not answer, or no host of it is writable (the problem's detail says which to a caller with a valid token)", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn readyz(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Json<Health>> {
    let authorization: Vec<&[u8]> = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .map(HeaderValue::as_bytes)
        .collect();
    let told = state.access.authenticate(&authorization).is_ok();
    match state.store.ping().await {
        Ok(host) => Ok(Json(Health {
            status: "ready".to_owned(),
            store: state.store.backend().to_owned(),
            host: host.filter(|_| told),
        })),
        Err(err) if told => Err(err.into()),
        Err(err) => {
            tracing::info!(error = %err, "not ready (the caller without a token is told only that)");
            Err(ApiError::NotReady("retry later".to_owned()))
        }
    }
}

/// Counts and times every answered request under its route template, never its raw path.
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let route = request.extensions().get::<MatchedPath>().cloned();
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    state
        .metrics
        .request(method.as_str(), route, response.status().as_u16(), started.elapsed());
    response
}

/// Prometheus text exposition.
///
/// A token limited to some queues sees only those queues' series; the
/// process-wide ones (requests, outcomes, pools, ...) add up every queue's
/// work and are shown only to a token that reaches every queue.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
async fn metrics(State(state): State<AppState>, caller: Caller) -> impl IntoResponse {
    let queues = queue_gauges(&state, &caller.0.queues).await;
    state.metrics.event_streams(state.events.open_streams());
    let content_type = [(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    )];
    if !caller.0.queues.is_every() {
        return (
            content_type,
            state.metrics.render_queues(&queues, &|q| caller.0.reaches(q)),
        );
    }
    (
        content_type,
        state.metrics.render(
            &state.store.pool_stats(),
            state.store.leases_expired_total(),
            state.store.parents_completed_total(),
            WaitingClaims {
                waiting: state.waiting_claims.load(std::sync::atomic::Ordering::Relaxed),
                woken_total: state.waiters.woken_total(),
            },
            &queues,
        ),
    )
}

/// Each queue's (within `scope`) open children and oldest pending age, from
/// the queue read model (one statement, whatever the queues hold). With the
/// database away the scrape still answers, without them.
async fn queue_gauges(state: &AppState, scope: &QueueScope) -> Vec<QueueGauge> {
    let queues = match state.store.queues(None, scope).await {
        Ok(queues) => queues,
        Err(error) => {
            tracing::warn!(%error, "queue gauges left out of this scrape");
            return Vec::new();
        }
    };
    let now = chrono::Utc::now();
    queues
        .into_iter()
        .map(|q| QueueGauge {
            queue: q.queue.to_string(),
            pending: q.children.pending,
            in_flight: q.children.in_flight,
            held: q.children.held,
            oldest_pending_age_seconds: q
                .oldest_pending_since
                .map(|since| (now - since).num_milliseconds().max(0) as f64 / 1000.0),
            flow_keys: q.flow_keys.into_iter().map(|k| (k.flow_key, k.in_flight)).collect(),
        })
        .collect()
}
