//! The HTTP API: one module per resource, each with its router, request and
//! response types and handlers. Every route is registered through utoipa-axum,
//! so the OpenAPI document is built from the code that routes requests.

mod children;
mod claims;
pub mod extract;
mod ops;
mod outcomes;
mod parents;
mod reconcile;

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use ops::Metrics;

use crate::AppState;
use crate::error::{ApiError, Problem};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "child-ledger",
        description = "A durable per-child ledger for fan-out work. Register a parent with its full child list \
before dispatching anything; workers in any language claim leased chunks of pending children, \
and record exactly one terminal outcome per child (first writer wins). Parent counters are a \
projection of the child rows: reconcile shows and repairs any drift. Every error is \
`application/problem+json` (RFC 9457) with a stable `type`.",
        license(name = "MIT OR Apache-2.0")
    ),
    components(schemas(Problem)),
    tags(
        (name = "parents", description = "Register, append, seal, read and list parents"),
        (name = "children", description = "Read children and retry held ones"),
        (name = "claims", description = "Leased chunks of pending children"),
        (name = "outcomes", description = "Terminal outcomes: first writer wins"),
        (name = "reconcile", description = "Compare and repair the stored projection"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
struct ApiDoc;

/// All routes with their OpenAPI description, before state is attached.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(parents::router())
        .merge(children::router())
        .merge(claims::router())
        .merge(outcomes::router())
        .merge(reconcile::router())
        .merge(ops::router())
}

/// The OpenAPI document, as served at `/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    routes().into_openapi()
}

/// The service's router. The limits sit inside the problem layer, so their
/// rejections come out as problem+json too.
pub fn router(state: AppState, request_timeout: Duration) -> axum::Router {
    let (router, api) = routes().split_for_parts();
    router
        .merge(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", api))
        .fallback(route_not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(state.limits.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), ops::track))
        .layer(middleware::from_fn_with_state(state.clone(), problem_for_every_error))
        .with_state(state)
}

async fn route_not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::RouteNotFound(format!("{method} {}", uri.path()))
}

/// Rewrites any error response that is not already problem+json (axum's own
/// 405, a body-limit 413, a timeout) into one, so every 4xx/5xx has our shape.
async fn problem_for_every_error(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/problem+json"));
    if is_problem {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let error = match status {
        StatusCode::METHOD_NOT_ALLOWED => ApiError::MethodNotAllowed(format!("{method} {path}")),
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::BodyTooLarge {
            limit: state.limits.max_body_bytes,
        },
        StatusCode::NOT_FOUND => ApiError::RouteNotFound(format!("{method} {path}")),
        StatusCode::SERVICE_UNAVAILABLE => ApiError::TimedOut(format!("{method} {path}")),
        other => {
            let (_, body) = response.into_parts();
            let bytes = axum::body::to_bytes(body, 64 * 1024).await.unwrap_or_default();
            let detail = String::from_utf8_lossy(&bytes).into_owned();
            let mut problem = Problem {
                r#type: "/problems/http-error".to_owned(),
                title: other.canonical_reason().unwrap_or("Error").to_owned(),
                status: other.as_u16(),
                detail,
                ..Problem::default()
            };
            if problem.detail.is_empty() {
                problem.detail = problem.title.clone();
            }
            let mut response = (other, Body::from(serde_json::to_vec(&problem).unwrap_or_default())).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/problem+json"),
            );
            return response;
        }
    };
    let mut response = error.into_response();
    if let Some(allow) = allow {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}
