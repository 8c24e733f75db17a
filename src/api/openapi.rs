//! The OpenAPI document: built from the routes themselves, then completed
//! with what holds for every operation and with the limits this service runs
//! with (the checked-in copy shows the defaults).

use utoipa::OpenApi;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Ref, RefOr, Required, ResponseBuilder, Schema};

use axum::http::Method;

use super::guard::needed_role;
use super::validate::{MAX_KEY_CHARS, MAX_REASON_CHARS, MAX_WORKER_CHARS};
use crate::error::Problem;
use crate::limits::{Limits, MAX_WAIT_SECONDS};

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
    components(schemas(Problem, crate::store::ParentHas, super::parents::ListOrder)),
    tags(
        (name = "parents", description = "Register, append, seal, read and list parents"),
        (name = "children", description = "Read children and retry held ones"),
        (name = "claims", description = "Leased chunks of pending children"),
        (name = "queues", description = "Each queue's parents and children by state, for dashboards"),
        (name = "outcomes", description = "Terminal outcomes: first writer wins"),
        (name = "events", description = "A parent's or a queue's progress, live, as server-sent events"),
        (name = "reconcile", description = "Compare and repair the stored projection"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
pub(super) struct ApiDoc;

/// The routes' document completed for a service running with `limits`.
pub(super) fn complete(mut api: utoipa::openapi::OpenApi, limits: &Limits) -> utoipa::openapi::OpenApi {
    document_every_operation(&mut api);
    document_etags(&mut api);
    document_access(&mut api);
    document_limits(&mut api, limits);
    name_for_clients(&mut api);
    api
}

/// What strict validators and client generators need of every operation:
/// an `operationId` in lowerCamelCase (`registerParent`, from the handler
/// `register_parent`), and a description on every response (the status's
/// reason phrase where the handler gives none; OpenAPI 3.1 requires one).
fn name_for_clients(api: &mut utoipa::openapi::OpenApi) {
    for item in api.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
            &mut item.head,
            &mut item.options,
            &mut item.trace,
        ];
        for op in operations.into_iter().flatten() {
            if let Some(id) = op.operation_id.as_mut() {
                *id = lower_camel(id);
            }
            for (status, response) in op.responses.responses.iter_mut() {
                if let RefOr::T(response) = response
                    && response.description.is_empty()
                {
                    response.description = status
                        .parse::<u16>()
                        .ok()
                        .and_then(|code| axum::http::StatusCode::from_u16(code).ok())
                        .and_then(|code| code.canonical_reason())
                        .unwrap_or("Answer")
                        .to_owned();
                }
            }
        }
    }
}

/// `register_parent` → `registerParent`.
fn lower_camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// What holds for every operation, written once instead of on each handler:
/// any `/v1` operation can answer a 4xx problem (a body over the limit, a
/// wrong content type, an invalid parameter) and a 503 problem with
/// `Retry-After` (the database is unreachable or the request ran out of time);
/// a request body whose members are all optional is not required: `{}`, an
/// empty body (read as `{}`) sent as `application/json`, or no body and no
/// content type at all (`curl -X POST`) are the same. Any other write without
/// that content type is 415, which a browser form cannot forge, and so is a
/// bodiless one that carries an `Origin` (a browser sent it).
fn document_every_operation(api: &mut utoipa::openapi::OpenApi) {
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
                let note = "Every member is optional, and so is the body: `{}`, an empty body and no body \
                            are the same. A body is sent as `application/json`; only a request with no body \
                            and no `Origin` header may leave the content type out.";
                body.description = Some(match body.description.take() {
                    Some(d) => format!("{d}. {note}"),
                    None => note.to_owned(),
                });
            }
        }
    }
}

/// Every `GET` under `/v1` answers with an `ETag`, and `304` with no body
/// when `If-None-Match` names the current one (`etag.rs`).
fn document_etags(api: &mut utoipa::openapi::OpenApi) {
    let text = || ObjectBuilder::new().schema_type(Type::String);
    let etag = HeaderBuilder::new()
        .schema(Some(text()))
        .description(Some(
            "A digest of the body: send it back in `If-None-Match` to poll cheaply",
        ))
        .build();
    let not_modified: utoipa::openapi::Response = ResponseBuilder::new()
        .description("Not modified: the `ETag` sent in `If-None-Match` is still current; no body")
        .header("ETag", etag.clone())
        .build();
    let if_none_match = ParameterBuilder::new()
        .name("If-None-Match")
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .schema(Some(text()))
        .description(Some(
            "An `ETag` from an earlier answer: `304` with no body if it is still current",
        ))
        .build();
    for (path, item) in api.paths.paths.iter_mut() {
        // An event stream is never a body to compare, and results are
        // streamed as they are read, not held to be digested: no ETag.
        let tagged = path.starts_with("/v1/") && !path.ends_with("/events") && !path.ends_with("/results");
        let Some(op) = item.get.as_mut().filter(|_| tagged) else {
            continue;
        };
        op.parameters
            .get_or_insert_with(Vec::new)
            .push(RefOr::T(if_none_match.clone()));
        let responses = &mut op.responses.responses;
        if let Some(RefOr::T(ok)) = responses.get_mut("200") {
            ok.headers.insert("ETag".to_owned(), RefOr::T(etag.clone()));
        }
        responses
            .entry("304".to_owned())
            .or_insert_with(|| RefOr::T(not_modified.clone()));
    }
}

/// The bearer scheme, and on each operation the role it needs, from the
/// guard's own table (`guard::needed_role`). The role is the requirement's
/// scope, as OpenAPI 3.1 allows for non-OAuth schemes, and is said in words.
fn document_access(api: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
    let mut bearer = Http::new(HttpAuthScheme::Bearer);
    bearer.description = Some(
        "A token from the service's tokens file (`child-ledger token new`). Needed only when the service runs \
         with `--tokens-file`; roles: `reader` (every GET), `producer` (+ register, append, seal), `worker` \
         (+ claims, extend, release, outcomes), `admin` (everything). Outside the token's queues a parent, \
         child or queue answers 404."
            .to_owned(),
    );
    api.components
        .get_or_insert_with(Default::default)
        .add_security_scheme("bearer", SecurityScheme::Http(bearer));
    let problem = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/problem+json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("Problem")))
                        .build(),
                )
                .build(),
        )
    };
    let unauthenticated = problem("No token, or a token this service does not know (with `WWW-Authenticate: Bearer`)");
    let forbidden = problem("The token's role does not allow this operation");
    for (path, item) in api.paths.paths.iter_mut() {
        let operations = [
            (Method::GET, &mut item.get),
            (Method::PUT, &mut item.put),
            (Method::POST, &mut item.post),
            (Method::DELETE, &mut item.delete),
            (Method::PATCH, &mut item.patch),
        ];
        for (method, op) in operations {
            let (Some(op), Some(role)) = (op.as_mut(), needed_role(&method, path)) else {
                continue;
            };
            op.security = Some(vec![SecurityRequirement::new("bearer", [role.as_str()])]);
            let note = format!("Role: `{}` (when the service runs with tokens).", role.as_str());
            op.description = Some(match op.description.take() {
                Some(d) => format!("{d}\n\n{note}"),
                None => note,
            });
            let responses = &mut op.responses.responses;
            responses
                .entry("401".to_owned())
                .or_insert_with(|| unauthenticated.clone());
            responses.entry("403".to_owned()).or_insert_with(|| forbidden.clone());
        }
    }
}

/// A bound the document states, and where.
enum Bound {
    Maximum(i64),
    MaxItems(usize),
    MaxLength(usize),
}

/// Every bound of a request body, from the one place it is enforced.
fn document_limits(api: &mut utoipa::openapi::OpenApi, limits: &Limits) {
    use Bound::*;
    let bounds = [
        ("ClaimChildren", "limit", Maximum(limits.max_claim_limit)),
        ("ClaimChildren", "lease_seconds", Maximum(limits.max_lease_seconds)),
        ("ClaimChildren", "wait_seconds", Maximum(MAX_WAIT_SECONDS as i64)),
        ("ClaimChildren", "worker", MaxLength(MAX_WORKER_CHARS)),
        ("ExtendClaim", "lease_seconds", Maximum(limits.max_lease_seconds)),
        ("ReleaseClaim", "delay_seconds", Maximum(limits.max_lease_seconds)),
        (
            "ReleaseClaim",
            "children",
            MaxItems(limits.max_claim_limit.max(0) as usize),
        ),
        ("RecordOutcomes", "outcomes", MaxItems(limits.max_outcomes_per_request)),
        ("RecordOutcome", "reason", MaxLength(MAX_REASON_CHARS)),
        ("BatchOutcome", "reason", MaxLength(MAX_REASON_CHARS)),
        ("ChildSpec", "key", MaxLength(MAX_KEY_CHARS)),
        ("ChildSpec", "skip", MaxLength(MAX_REASON_CHARS)),
        ("AppendChild", "key", MaxLength(MAX_KEY_CHARS)),
        ("AppendChild", "skip", MaxLength(MAX_REASON_CHARS)),
    ];
    let Some(components) = api.components.as_mut() else {
        return;
    };
    for (schema, property, bound) in bounds {
        let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(schema) else {
            continue;
        };
        match (object.properties.get_mut(property), bound) {
            (Some(RefOr::T(Schema::Object(p))), Maximum(n)) => p.maximum = Some(utoipa::Number::Int(n as isize)),
            (Some(RefOr::T(Schema::Object(p))), MaxLength(n)) => p.max_length = Some(n),
            (Some(RefOr::T(Schema::Array(p))), MaxItems(n)) => p.max_items = Some(n),
            // A renamed field must not silently drop its bound from the document.
            _ if cfg!(debug_assertions) => panic!("{schema}.{property}: no such property for its bound"),
            _ => {}
        }
    }
}
