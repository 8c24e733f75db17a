//! The HTTP API: one module per resource, each with its router, request and
//! response types and handlers. Every route is registered through utoipa-axum,
//! so the OpenAPI document is built from the code that routes requests.

mod children;
mod claims;
mod dashboard;
mod deliveries;
mod etag;
mod events;
pub mod extract;
pub mod guard;
mod leases;
mod limits;
mod openapi;
mod ops;
mod outcomes;
mod parents;
mod queues;
mod reconcile;
mod redact;
mod redrive;
mod registration;
mod results;
mod starting;
pub mod validate;
pub mod whole;

use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

use crate::error::ApiError;
use crate::limits::Limits;
use crate::state::AppState;
pub use starting::until_ready;

/// The header that carries a request's id: taken from the caller when sent,
/// generated (a UUID) otherwise, echoed on the response and on every log line.
pub const REQUEST_ID: axum::http::HeaderName = axum::http::HeaderName::from_static("x-request-id");

/// All routes with their OpenAPI description, before state is attached.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .merge(parents::router())
        .merge(deliveries::router())
        .merge(children::router())
        .merge(results::router())
        .merge(redrive::router())
        .merge(claims::router())
        .merge(leases::router())
        .merge(queues::router())
        .merge(limits::router())
        .merge(outcomes::router())
        .merge(events::router())
        .merge(reconcile::router())
        .merge(ops::router())
}

/// The OpenAPI document of a service with the default limits, as checked in.
pub fn openapi() -> utoipa::openapi::OpenApi {
    openapi::complete(routes().into_openapi(), &Limits::default())
}

/// The service's router. The limits sit inside the problem layer, so their
/// rejections come out as problem+json too.
pub fn router(state: AppState, request_timeout: Duration) -> axum::Router {
    let (router, api) = routes().split_for_parts();
    guard::check_rules(&api).expect("every operation has an access rule");
    let operations = std::sync::Arc::new(guard::Operations::of(&api));
    let api = openapi::complete(api, &state.limits);
    router
        .route_layer(middleware::from_fn_with_state(
            (state.clone(), operations),
            guard::guard,
        ))
        .route_layer(middleware::from_fn(etag::etag))
        .merge(docs(api))
        .merge(dashboard::router())
        .fallback(route_not_found)
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(RequestBodyLimitLayer::new(state.limits.max_body_bytes))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::SERVICE_UNAVAILABLE,
            request_timeout,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), ops::track))
        .layer(middleware::from_fn_with_state(state.clone(), problem_for_every_error))
        .layer(middleware::from_fn(refuse_large_heads))
        .with_state(state)
}

/// Swagger UI loads only its own files and is never framed (a page that
/// framed it could have its "Try it out" clicked through a decoy); its
/// styles are partly inline, its scripts are not.
const DOCS_CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src 'self' data:; font-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// `/docs` (Swagger UI) and `/openapi.json`, with headers that keep the page
/// from being framed or loading anything from elsewhere.
fn docs(api: utoipa::openapi::OpenApi) -> axum::Router<AppState> {
    axum::Router::from(utoipa_swagger_ui::SwaggerUi::new("/docs").url("/openapi.json", api)).layer(
        middleware::map_response(|mut response: Response| async move {
            let headers = response.headers_mut();
            for (name, value) in [
                (header::CONTENT_SECURITY_POLICY, DOCS_CONTENT_SECURITY_POLICY),
                (header::X_FRAME_OPTIONS, "DENY"),
                (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                (header::REFERRER_POLICY, "no-referrer"),
            ] {
                headers.insert(name, header::HeaderValue::from_static(value));
            }
            response
        }),
    )
}

/// The largest request head (request line and headers) the service reads:
/// past it, `431` with a problem. hyper itself answers a bare `431` (it has
/// no hook for a body) to a head past its own buffer (about 400 KiB) or with
/// more than 100 headers, before any of this code runs.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Refuses a request whose head is over `MAX_HEAD_BYTES`.
async fn refuse_large_heads(request: Request, next: Next) -> Response {
    let uri = request.uri();
    let head = request.method().as_str().len()
        + uri.authority().map_or(0, |a| a.as_str().len())
        + uri.path_and_query().map_or(0, |p| p.as_str().len())
        + request
            .headers()
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 4)
            .sum::<usize>();
    if head > MAX_HEAD_BYTES {
        let mut response = ApiError::HeadTooLarge { limit: MAX_HEAD_BYTES }.into_response();
        // Its body, if any, is not read: the connection cannot carry another request.
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
        return response;
    }
    next.run(request).await
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
            ApiError::Http {
                status: other,
                detail: String::from_utf8_lossy(&bytes).into_owned(),
            }
        }
    };
    let mut response = error.into_response();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // Rejected on its declared length, the body was never read, so the
        // connection cannot carry another request: say so, rather than let the
        // client reuse it and fail.
        response
            .headers_mut()
            .insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    if let Some(allow) = allow {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}
