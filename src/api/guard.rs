//! Who may call what. After routing, every request to a guarded route shows
//! its bearer token (when the service has tokens), the token's role must grant
//! what the route needs, a write must say it is JSON (a browser form cannot)
//! unless it has no body and no browser sent it, and a parent or queue named
//! in the path must be in the token's queues.
//! One table, `needed_role`, says what each route needs; the OpenAPI document
//! is written from the same table.

use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::access::{Grant, Role};
use crate::error::{ApiError, ApiResult};
use crate::ledger::ParentId;
use crate::state::AppState;

/// The role an operation needs, by method and route template; `None` for the
/// probes, which stay open, and for a method the route does not have (axum
/// answers it 405). Every write is named here: a test walks the OpenAPI
/// document so that no operation is left out.
pub fn needed_role(method: &Method, route: &str) -> Option<Role> {
    match (method.as_str(), route) {
        (_, "/healthz" | "/readyz") => None,
        // A job's report names parents of every queue it reached.
        ("GET" | "HEAD", "/v1/reconcile/jobs/{job_id}") => Some(Role::Admin),
        ("GET" | "HEAD", _) => Some(Role::Reader),
        ("PUT", "/v1/parents/{parent_id}")
        | ("POST", "/v1/parents/{parent_id}/children" | "/v1/parents/{parent_id}/seal") => Some(Role::Producer),
        (
            "POST",
            "/v1/parents/{parent_id}/claims"
            | "/v1/queues/{queue}/claims"
            | "/v1/claims/{claim_id}/extend"
            | "/v1/claims/{claim_id}/release"
            | "/v1/parents/{parent_id}/children/{sequence}/outcome"
            | "/v1/outcomes",
        ) => Some(Role::Worker),
        (
            "POST",
            "/v1/parents/{parent_id}/children/{sequence}/retry"
            | "/v1/parents/{parent_id}/reconcile"
            | "/v1/reconcile"
            | "/v1/reconcile/jobs"
            | "/v1/parents/{parent_id}/deliveries/redeliver"
            | "/v1/parents/{parent_id}/cancel"
            | "/v1/queues/{queue}/pause"
            | "/v1/queues/{queue}/resume",
        ) => Some(Role::Admin),
        ("DELETE", "/v1/parents/{parent_id}") => Some(Role::Admin),
        _ => None,
    }
}

/// The caller of a guarded request, for handlers whose answer depends on the
/// token's role or queues (lists, batches, registrations).
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Grant>);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        // Every `/v1` route is guarded; a route that is not sees an open service.
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(|| Caller(Grant::anonymous())))
    }
}

impl Caller {
    /// Refuses unless the caller holds a role that grants `needed`.
    pub fn must(&self, needed: Role, doing: &str) -> ApiResult<()> {
        if self.0.may(needed) {
            Ok(())
        } else {
            Err(forbidden(&self.0, needed, doing))
        }
    }
}

impl Caller {
    /// Whether a claim holds children only in the caller's queues. A claim
    /// outside them is answered as an unknown one: nothing held.
    pub async fn reaches_claim(&self, state: &AppState, claim_id: uuid::Uuid) -> ApiResult<bool> {
        if self.0.queues.is_every() {
            return Ok(true);
        }
        let queues = state.store.queues_of_claim(claim_id).await?;
        let reached = queues.iter().all(|q| self.0.reaches(q.as_str()));
        if !reached {
            state.metrics.auth_failure("outside_queues");
        }
        Ok(reached)
    }
}

fn forbidden(grant: &Grant, needed: Role, doing: &str) -> ApiError {
    ApiError::Forbidden(format!(
        "token {:?} may not {doing}: that needs the {} role",
        grant.name,
        needed.as_str()
    ))
}

/// The guard, as a route layer: it runs once the route is known.
pub async fn guard(
    State(state): State<AppState>,
    matched: MatchedPath,
    params: RawPathParams,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(needed) = needed_role(request.method(), matched.as_str()) else {
        return next.run(request).await;
    };
    match admit(&state, needed, &params, request.method(), request.headers()).await {
        Ok(grant) => {
            request.extensions_mut().insert(Caller(grant));
            if !carries_bulk(request.method(), matched.as_str()) {
                request = limit_body(request, SMALL_BODY_BYTES);
                return next.run(request).await;
            }
            // A bulk body over the small limit (or of unknown length) waits
            // for one of `--max-bulk-bodies` turns before it is read, so the
            // bodies buffered at once stay bounded.
            let small = request
                .headers()
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
                .is_some_and(|len| len <= SMALL_BODY_BYTES);
            let _turn = if small {
                None
            } else {
                Arc::clone(&state.bulk_bodies).acquire_owned().await.ok()
            };
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

/// The body limit of every route but the bulk ones (`carries_bulk`).
pub const SMALL_BODY_BYTES: usize = 1024 * 1024;

/// The routes whose bodies may reach `--max-body-bytes`: registration, append
/// and outcome batches. Every other body is small.
fn carries_bulk(method: &Method, route: &str) -> bool {
    matches!(
        (method.as_str(), route),
        ("PUT", "/v1/parents/{parent_id}") | ("POST", "/v1/parents/{parent_id}/children" | "/v1/outcomes")
    )
}

/// The body limit a request was given, for the 413 to name.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// Stops reading a body past `limit` bytes: the extractor then answers 413
/// without having buffered more.
fn limit_body(request: Request, limit: usize) -> Request {
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(BodyLimit(limit));
    Request::from_parts(parts, axum::body::Body::new(http_body_util::Limited::new(body, limit)))
}

async fn admit(
    state: &AppState,
    needed: Role,
    params: &RawPathParams,
    method: &Method,
    headers: &HeaderMap,
) -> ApiResult<Arc<Grant>> {
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let grant = state.access.authenticate(authorization).map_err(|failure| {
        state.metrics.auth_failure(failure.as_str());
        ApiError::Unauthenticated(failure)
    })?;
    if !grant.may(needed) {
        state.metrics.auth_failure("forbidden");
        return Err(forbidden(&grant, needed, "call this operation"));
    }
    if (*method == Method::POST || *method == Method::PUT) && !bodiless_from_no_browser(headers) {
        require_json(headers)?;
    }
    if !grant.queues.is_every()
        && let Err(err) = in_scope(state, &grant, params).await
    {
        state.metrics.auth_failure("outside_queues");
        return Err(err);
    }
    Ok(grant)
}

/// Whether a write has no body, no content type and no `Origin`: then it
/// reads as `{}` (`curl -X POST .../pause`). A browser names the page's origin
/// on every POST it sends (the Fetch standard; a form, `fetch` in `no-cors`
/// mode and `sendBeacon` alike), so a cross-site page cannot make one of
/// these; with an `Origin`, even an empty write must say it is JSON.
fn bodiless_from_no_browser(headers: &HeaderMap) -> bool {
    let no_body = match headers.get(header::CONTENT_LENGTH) {
        Some(length) => length.as_bytes() == b"0",
        None => !headers.contains_key(header::TRANSFER_ENCODING),
    };
    no_body && !headers.contains_key(header::CONTENT_TYPE) && !headers.contains_key(header::ORIGIN)
}

/// A write must be declared JSON, even with an empty body, when a browser may
/// have sent it: a browser sends a cross-site form or `fetch` without
/// preflight only as `application/x-www-form-urlencoded`,
/// `multipart/form-data` or `text/plain`, or with no body and no type.
fn require_json(headers: &HeaderMap) -> ApiResult<()> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    match content_type {
        Some(ct) if super::extract::is_json(ct) => Ok(()),
        Some(ct) => Err(ApiError::UnsupportedMediaType(format!(
            "expected content-type application/json, got {ct:?}"
        ))),
        None => Err(ApiError::UnsupportedMediaType(
            "expected content-type application/json, got none (a body, or any write a browser sends, must say it is \
             JSON)"
                .to_owned(),
        )),
    }
}

/// A parent or queue in the path outside the token's queues is answered as
/// if it did not exist. (A claim id is checked by its handler, which answers
/// an unknown claim with nothing held.)
async fn in_scope(state: &AppState, grant: &Grant, params: &RawPathParams) -> ApiResult<()> {
    let mut sequence = None;
    let mut parent = None;
    for (name, value) in params.iter() {
        match name {
            "queue" if !grant.reaches(value) => return Err(ApiError::NotFound(format!("no queue {value}"))),
            "parent_id" => parent = ParentId::parse(value).ok(),
            "sequence" => sequence = Some(value.to_owned()),
            _ => {}
        }
    }
    // An invalid id is left for the handler to name as a bad parameter.
    let Some(parent_id) = parent else {
        return Ok(());
    };
    match state.store.queue_of(&parent_id).await? {
        Some(queue) if !grant.reaches(queue.as_str()) => Err(ApiError::NotFound(match sequence {
            Some(sequence) => format!("no child {sequence} in parent {parent_id}"),
            None => format!("no parent {parent_id}"),
        })),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_write_names_its_role_and_reads_need_reader() {
        let post = Method::POST;
        assert_eq!(needed_role(&Method::GET, "/v1/parents"), Some(Role::Reader));
        assert_eq!(needed_role(&Method::GET, "/metrics"), Some(Role::Reader));
        assert_eq!(needed_role(&Method::GET, "/healthz"), None);
        assert_eq!(
            needed_role(&Method::PUT, "/v1/parents/{parent_id}"),
            Some(Role::Producer)
        );
        assert_eq!(needed_role(&post, "/v1/outcomes"), Some(Role::Worker));
        assert_eq!(needed_role(&post, "/v1/reconcile"), Some(Role::Admin));
        assert_eq!(needed_role(&post, "/v1/reconcile/jobs"), Some(Role::Admin));
        assert_eq!(
            needed_role(&post, "/v1/parents/{parent_id}/deliveries/redeliver"),
            Some(Role::Admin)
        );
        assert_eq!(
            needed_role(&Method::GET, "/v1/reconcile/jobs/{job_id}"),
            Some(Role::Admin)
        );
        assert_eq!(
            needed_role(&post, "/v1/parents/{parent_id}/children/{sequence}/retry"),
            Some(Role::Admin)
        );
        assert_eq!(needed_role(&Method::PUT, "/metrics"), None, "not a route: 405");
    }

    #[test]
    fn every_operation_but_the_probes_needs_a_role() {
        let api = crate::api::openapi();
        for (path, item) in &api.paths.paths {
            let operations = [
                (Method::GET, item.get.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::DELETE, item.delete.is_some()),
                (Method::PATCH, item.patch.is_some()),
            ];
            for (method, present) in operations {
                if present && !matches!(path.as_str(), "/healthz" | "/readyz") {
                    assert!(needed_role(&method, path).is_some(), "{method} {path} has no role");
                }
            }
        }
    }
}
