//! Who may call what. After routing, every request to a guarded route shows
//! its bearer token (when the service has tokens), the token's role must grant
//! what the route needs, a write must say it is JSON (a browser form cannot)
//! unless it has no body and no browser sent it, and a parent or queue named
//! in the path must be in the token's queues.
//! One table, `rule`, says what each operation needs; the OpenAPI document
//! is written from the same table. Access is denied by default: an
//! operation the table does not name is refused, and a service with such an
//! operation does not start (`check_rules`).
//!
//! For a token limited to some queues, a parent named in the path is looked
//! up before the request is otherwise checked, and one that is not in the
//! token's queues, whether it is another queue's or does not exist at all,
//! is answered 404 then and there: the two cases cannot be told apart by how
//! the rest of the request (a bad query, a bad body) is answered. Only a
//! registration, which is how a parent comes to exist, checks its body first.

use std::collections::HashSet;
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

mod body;

pub use body::{BodyLimit, SMALL_BODY_BYTES};
use body::{bodiless_from_no_browser, carries_bulk, limit_body, require_json};

/// Who may call an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// Anyone: the probes, which orchestrators call without a token.
    Open,
    /// A token whose role grants this one.
    Needs(Role),
}

/// The rule of an operation, by method and route template; `None` when the
/// table does not name it. Such an operation is refused, and `check_rules`
/// keeps a service that has one from starting.
pub fn rule(method: &Method, route: &str) -> Option<Rule> {
    needed_role(method, route).map_or_else(
        || matches!(route, "/healthz" | "/readyz").then_some(Rule::Open),
        |role| Some(Rule::Needs(role)),
    )
}

/// The role an operation needs, by method and route template (`None`: the
/// probes, or no rule at all; see `rule`).
pub fn needed_role(method: &Method, route: &str) -> Option<Role> {
    match (method.as_str(), route) {
        (_, "/healthz" | "/readyz") => None,
        // A job's report names parents of every queue it reached.
        ("GET" | "HEAD", "/v1/reconcile/jobs/{job_id}") => Some(Role::Admin),
        (
            "GET" | "HEAD",
            "/metrics"
            | "/v1/children"
            | "/v1/parents"
            | "/v1/parents/{parent_id}"
            | "/v1/parents/{parent_id}/children"
            | "/v1/parents/{parent_id}/children/{sequence}"
            | "/v1/parents/{parent_id}/deliveries"
            | "/v1/parents/{parent_id}/events"
            | "/v1/parents/{parent_id}/results"
            | "/v1/parents/{parent_id}/summary"
            | "/v1/queues"
            | "/v1/queues/{queue}"
            | "/v1/queues/{queue}/events"
            | "/v1/queues/{queue}/limits"
            | "/v1/queues/{queue}/keys/{flow_key}/limits"
            | "/v1/queues/{queue}/settings",
        ) => Some(Role::Reader),
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
            | "/v1/parents/{parent_id}/retry"
            | "/v1/parents/{parent_id}/redrive"
            | "/v1/parents/{parent_id}/reconcile"
            | "/v1/reconcile"
            | "/v1/reconcile/jobs"
            | "/v1/parents/{parent_id}/deliveries/redeliver"
            | "/v1/parents/{parent_id}/cancel"
            | "/v1/queues/{queue}/pause"
            | "/v1/queues/{queue}/resume",
        ) => Some(Role::Admin),
        ("DELETE", "/v1/parents/{parent_id}" | "/v1/queues/{queue}/keys/{flow_key}/limits")
        | (
            "PUT",
            "/v1/queues/{queue}/limits" | "/v1/queues/{queue}/keys/{flow_key}/limits" | "/v1/queues/{queue}/settings",
        ) => Some(Role::Admin),
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
    /// A turn of `turns` for this caller: within its token's share, and
    /// within the process's turns (an admin may take one kept for admins).
    /// Without tokens every caller is the same admin: no share, no reserve.
    pub fn turn(
        &self,
        state: &AppState,
        turns: &crate::turns::Turns,
    ) -> Result<crate::turns::Turn, crate::turns::NoTurn> {
        let holder = (!state.access.is_open()).then_some(self.0.name.as_str());
        turns.admit(holder, holder.is_some() && self.0.may(Role::Admin))
    }

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

/// The operations a router serves, by method and route template: what the
/// guard refuses when the table has no rule for it.
#[derive(Debug, Default)]
pub struct Operations(HashSet<(Method, String)>);

impl Operations {
    /// The operations of a document built from the routes.
    pub fn of(api: &utoipa::openapi::OpenApi) -> Self {
        let mut operations = HashSet::new();
        for (path, item) in &api.paths.paths {
            let methods = [
                (Method::GET, item.get.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::DELETE, item.delete.is_some()),
                (Method::PATCH, item.patch.is_some()),
            ];
            for (method, present) in methods {
                if present {
                    operations.insert((method, path.clone()));
                }
            }
        }
        Self(operations)
    }

    fn contains(&self, method: &Method, route: &str) -> bool {
        let method = if method == Method::HEAD { &Method::GET } else { method };
        self.0.contains(&(method.clone(), route.to_owned()))
    }

    /// The methods the document lists for a route (`GET` allows `HEAD`).
    fn methods(&self, route: &str) -> Vec<Method> {
        let mut methods: Vec<Method> = self
            .0
            .iter()
            .filter(|(_, r)| r == route)
            .map(|(m, _)| m.clone())
            .collect();
        if methods.contains(&Method::GET) {
            methods.push(Method::HEAD);
        }
        methods.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        methods
    }
}

/// Every operation of the document has a rule; else what to add, for the
/// service to refuse to start with.
pub fn check_rules(api: &utoipa::openapi::OpenApi) -> anyhow::Result<()> {
    let mut missing: Vec<String> = Operations::of(api)
        .0
        .into_iter()
        .filter(|(method, route)| rule(method, route).is_none())
        .map(|(method, route)| format!("{method} {route}"))
        .collect();
    missing.sort();
    anyhow::ensure!(
        missing.is_empty(),
        "operations without an access rule (add each to api::guard::needed_role): {}",
        missing.join(", ")
    );
    Ok(())
}

/// The guard, as a route layer: it runs once the route is known.
pub async fn guard(
    State((state, operations)): State<(AppState, Arc<Operations>)>,
    matched: MatchedPath,
    params: RawPathParams,
    mut request: Request,
    next: Next,
) -> Response {
    name_the_span(request.method(), matched.as_str(), &params);
    let needed = match rule(request.method(), matched.as_str()) {
        Some(Rule::Open) => return next.run(request).await,
        Some(Rule::Needs(role)) => role,
        // Denied by default: an operation with no rule is nobody's. A method
        // the document does not list for a documented route (axum's 405, or
        // a handler routed without being documented) is not allowed; a route
        // the document does not list at all is refused.
        None => {
            let allowed = operations.methods(matched.as_str());
            if !allowed.is_empty() && !operations.contains(request.method(), matched.as_str()) {
                let mut response = ApiError::MethodNotAllowed(format!("{} {}", request.method(), request.uri().path()))
                    .into_response();
                let allow = allowed.iter().map(Method::as_str).collect::<Vec<_>>().join(",");
                if let Ok(allow) = header::HeaderValue::from_str(&allow) {
                    response.headers_mut().insert(header::ALLOW, allow);
                }
                return response;
            }
            state.metrics.auth_failure("forbidden");
            return ApiError::Forbidden(format!(
                "{} {} has no access rule: no token may call it",
                request.method(),
                matched.as_str()
            ))
            .into_response();
        }
    };
    let route = matched.as_str();
    match admit(&state, needed, &params, request.method(), route, request.headers()).await {
        Ok(grant) => {
            request.extensions_mut().insert(Caller(grant));
            if !carries_bulk(request.method(), route) {
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

/// The request's span says what it is about: its route (also its name), and
/// the parent or queue its path names.
fn name_the_span(method: &Method, route: &str, params: &RawPathParams) {
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    span.record("otel.name", format!("{method} {route}"));
    span.record("http.route", route);
    for (name, value) in params.iter() {
        match name {
            "parent_id" => span.record("parent_id", value),
            "queue" => span.record("queue", value),
            _ => &span,
        };
    }
}

async fn admit(
    state: &AppState,
    needed: Role,
    params: &RawPathParams,
    method: &Method,
    route: &str,
    headers: &HeaderMap,
) -> ApiResult<Arc<Grant>> {
    let authorization: Vec<&[u8]> = headers
        .get_all(header::AUTHORIZATION)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    let grant = state.access.authenticate(&authorization).map_err(|failure| {
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
    if !grant.queues.is_every() {
        in_scope(state, &grant, params, registers(method, route)).await?;
    }
    Ok(grant)
}

/// The registration route: the parent it names does not exist yet.
fn registers(method: &Method, route: &str) -> bool {
    *method == Method::PUT && route == "/v1/parents/{parent_id}"
}

/// A parent or queue in the path outside the token's queues is answered as
/// if it did not exist, and so is a parent that does not exist (unless the
/// request registers it): both before anything else about the request is
/// checked. (A claim id is checked by its handler, which answers an unknown
/// claim with nothing held.)
async fn in_scope(state: &AppState, grant: &Arc<Grant>, params: &RawPathParams, registering: bool) -> ApiResult<()> {
    let mut sequence = None;
    let mut parent = None;
    for (name, value) in params.iter() {
        match name {
            "queue" if !grant.reaches(value) => {
                state.metrics.auth_failure("outside_queues");
                return Err(ApiError::NotFound(format!("no queue {value}")));
            }
            "parent_id" => parent = ParentId::parse(value).ok(),
            "sequence" => sequence = Some(value.to_owned()),
            _ => {}
        }
    }
    // An invalid id is left for the handler to name as a bad parameter:
    // whether it is invalid does not depend on what exists.
    let Some(parent_id) = parent else {
        return Ok(());
    };
    if registering {
        // The handler checks the body, then `Caller::hides_parent`.
        return Ok(());
    }
    match Caller(Arc::clone(grant)).parent_reached(state, &parent_id).await? {
        Reach::Reached => Ok(()),
        Reach::Hidden | Reach::Missing => Err(ApiError::NotFound(match sequence {
            Some(sequence) => format!("no child {sequence} in parent {parent_id}"),
            None => format!("no parent {parent_id}"),
        })),
    }
}

/// Whether a caller reaches a parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    Reached,
    /// It exists, in a queue outside the caller's.
    Hidden,
    Missing,
}

impl Caller {
    /// Where `parent_id` stands for this caller (counting a hidden one among
    /// the auth failures, `outside_queues`).
    pub async fn parent_reached(&self, state: &AppState, parent_id: &ParentId) -> ApiResult<Reach> {
        Ok(match state.store.queue_of(parent_id).await? {
            Some(queue) if self.0.reaches(queue.as_str()) => Reach::Reached,
            Some(_) => {
                state.metrics.auth_failure("outside_queues");
                Reach::Hidden
            }
            None => Reach::Missing,
        })
    }

    /// For a registration, once its body is checked: whether the id is taken
    /// by a parent the caller does not reach, to be answered as not found.
    pub async fn hides_parent(&self, state: &AppState, parent_id: &ParentId) -> ApiResult<bool> {
        if self.0.queues.is_every() {
            return Ok(false);
        }
        Ok(self.parent_reached(state, parent_id).await? == Reach::Hidden)
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
        // A read is named like any other operation: a new route has no rule
        // (and is refused) until the table gives it one.
        assert_eq!(rule(&Method::GET, "/v1/parents/{parent_id}/anything-new"), None);
    }

    #[test]
    fn every_operation_has_a_rule() {
        check_rules(&crate::api::openapi()).unwrap();
        let mut api = crate::api::openapi();
        api.paths.paths.insert(
            "/v1/unguarded".to_owned(),
            utoipa::openapi::path::PathItem::new(
                utoipa::openapi::HttpMethod::Post,
                utoipa::openapi::path::Operation::new(),
            ),
        );
        let refused = check_rules(&api).unwrap_err().to_string();
        assert!(refused.contains("POST /v1/unguarded"), "{refused}");
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
