//! Operations: liveness, readiness and metrics.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use axum::Json;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::AppState;
use crate::error::{ApiResult, Problem};

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
}

/// Liveness: the process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, body = Health)))]
async fn healthz(State(state): State<AppState>) -> Json<Health> {
    Json(Health {
        status: "ok".to_owned(),
        store: state.store.backend().to_owned(),
    })
}

/// Readiness: the database answers.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    responses(
        (status = 200, body = Health),
        (status = 503, description = "The database does not answer", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn readyz(State(state): State<AppState>) -> ApiResult<Json<Health>> {
    state.store.ping().await?;
    Ok(Json(Health {
        status: "ready".to_owned(),
        store: state.store.backend().to_owned(),
    }))
}

/// Request counters, by method, matched route and status.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
}

impl Metrics {
    fn record(&self, method: &str, route: &str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        *requests
            .entry((method.to_owned(), route.to_owned(), status))
            .or_default() += 1;
    }

    fn render(&self) -> String {
        let requests = self.requests.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::from(
            "# HELP child_ledger_http_requests_total HTTP requests answered.\n\
             # TYPE child_ledger_http_requests_total counter\n",
        );
        for ((method, route, status), count) in requests.iter() {
            let _ = writeln!(
                out,
                "child_ledger_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {count}"
            );
        }
        out
    }
}

/// Counts every answered request under its route template, never its raw path.
pub async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().as_str().to_owned();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    state.metrics.record(&method, &route, response.status().as_u16());
    response
}

/// Prometheus text exposition.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain"))
)]
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        state.metrics.render(),
    )
}
