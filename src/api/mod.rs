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
    complete(routes().into_openapi())
}

/// What holds for every operation, written once instead of on each handler:
/// any `/v1` operation can answer a 4xx problem (a body over the limit, a
/// wrong content type, an invalid parameter) and a 503 problem with
/// `Retry-After` (the database is unreachable or the request ran out of time);
/// a request body whose members are all optional may be left out entirely,
/// as the extractor reads an empty body as `{}`.
fn complete(mut api: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::header::HeaderBuilder;
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, ResponseBuilder, Schema};

    let problem = |description: &str| {
        ResponseBuilder::new().description(description).content(
            "application/problem+json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("Problem")))
                .build(),
        )
    };
    let client_error: utoipa::openapi::Response = problem("Invalid request: the problem's `type` says which kind and `field` names the input at fault; nothing was written").build();
    let unavailable: utoipa::openapi::Response =
        problem("The database is unreachable or the request ran out of time: retry after `Retry-After` seconds")
            .header(
                "Retry-After",
                HeaderBuilder::new()
                    .schema(Some(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0))))
                    .description(Some("Seconds to wait before retrying"))
                    .build(),
            )
            .build();
    // Request bodies refer to a component schema; with no required member, the body may be left out.
    let schemas = api.components.as_ref().map(|c| c.schemas.clone()).unwrap_or_default();
    let all_optional = |body: &utoipa::openapi::request_body::RequestBody| {
        body.content.values().any(|content| {
            let RefOr::T(content) = content else { return false };
            let Some(RefOr::Ref(r)) = &content.schema else {
                return false;
            };
            let name = r.ref_location.rsplit('/').next().unwrap_or_default();
            matches!(schemas.get(name), Some(RefOr::T(Schema::Object(object))) if object.required.is_empty())
        })
    };
    for (path, item) in api.paths.paths.iter_mut() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for op in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
        {
            let responses = &mut op.responses.responses;
            responses
                .entry("4XX".to_owned())
                .or_insert_with(|| RefOr::T(client_error.clone()));
            responses
                .entry("503".to_owned())
                .or_insert_with(|| RefOr::T(unavailable.clone()));
            if let Some(RefOr::T(body)) = op
                .request_body
                .as_mut()
                .filter(|b| matches!(b, RefOr::T(b) if all_optional(b)))
            {
                body.required = Some(Required::False);
                let note = "Every member is optional: an empty body (or none) reads as `{}`.";
                body.description = Some(match body.description.take() {
                    Some(d) => format!("{d}. {note}"),
                    None => note.to_owned(),
                });
            }
        }
    }
    api
}

/// The service's router. The limits sit inside the problem layer, so their
/// rejections come out as problem+json too.
pub fn router(state: AppState, request_timeout: Duration) -> axum::Router {
    let (router, api) = routes().split_for_parts();
    let api = complete(api);
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
