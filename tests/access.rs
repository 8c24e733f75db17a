//! Access control on both stores: every operation of the OpenAPI document
//! against no token, an unknown token and each role; tokens limited to
//! queues on every operation that names a parent or a queue (a parent of
//! another queue answered exactly as one that does not exist), on lists and
//! on `/metrics`; outcome fencing; writes a browser could forge; repeated
//! `Authorization` headers; and webhook secrets shown only to admins.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The four role tokens, each on every queue.
struct Roles {
    reader: String,
    producer: String,
    worker: String,
    admin: String,
}

async fn app_with_roles(backend: Backend, more: Vec<Value>) -> (TestApp, Roles) {
    let (reader, r) = token("reader", &[Role::Reader], &[]);
    let (producer, p) = token("producer", &[Role::Producer], &[]);
    let (worker, w) = token("worker", &[Role::Worker], &[]);
    let (admin, a) = token("admin", &[Role::Admin], &[]);
    let mut entries = vec![r, p, w, a];
    entries.extend(more);
    let app = spawn_app_with_tokens(backend, Value::Array(entries)).await;
    (
        app,
        Roles {
            reader,
            producer,
            worker,
            admin,
        },
    )
}

/// Everything a rejected request could have written, in one line.
async fn ledger_state(app: &TestApp) -> String {
    let mut parts = Vec::new();
    for sql in [
        "SELECT count(*) FROM parent",
        "SELECT CAST(coalesce(sum(total + processed * 10 + failed * 100 + skipped * 1000), 0) AS BIGINT) FROM parent",
        "SELECT count(*) FROM parent WHERE decomposed_at IS NOT NULL",
        "SELECT count(*) FROM parent WHERE completed_at IS NOT NULL",
        "SELECT count(*) FROM child",
        "SELECT count(*) FROM child_status WHERE state = 'pending'",
        "SELECT count(*) FROM child_status WHERE state = 'in_flight'",
        "SELECT count(*) FROM child_status WHERE state = 'held'",
        "SELECT CAST(coalesce(sum(attempts), 0) AS BIGINT) FROM child_status",
        "SELECT count(*) FROM child WHERE conflicts IS NOT NULL",
        "SELECT count(*) FROM child_status WHERE lease_expires_at IS NOT NULL",
        "SELECT count(*) FROM claim_lease",
        "SELECT CAST(coalesce(sum(open), 0) AS BIGINT) FROM claim_lease",
        "SELECT CAST(coalesce(sum(served), 0) AS BIGINT) FROM lane",
        "SELECT count(*) FROM queue_pause",
        "SELECT count(*) FROM flow_limit",
        "SELECT count(*) FROM queue_setting",
        "SELECT count(*) FROM reconcile_job",
        "SELECT count(*) FROM webhook_event",
    ] {
        parts.push(app.count(sql).await.to_string());
    }
    parts.join(",")
}

/// An operation of the OpenAPI document, the role it needs there, and a
/// request to it with the fixtures' ids and `{}` as the body of a write.
struct Operation {
    method: Method,
    /// The path template, as the document has it.
    template: String,
    path: String,
    body: Option<Value>,
    needs: Role,
}

/// The claim id of nobody's claim, and the job id of no job.
const STRANGER: &str = "00000000-0000-4000-8000-000000000000";

/// `template` with its parameters filled in: `parent_id` (and `queue`, and
/// `sequence`) as given, the ids of claims and jobs nobody has. A parameter
/// the matrix does not know fails the test: give it a fixture.
fn fill(template: &str, parent: &str, queue: &str, sequence: &str) -> String {
    let mut path = template
        .replace("{parent_id}", parent)
        .replace("{queue}", queue)
        .replace("{sequence}", sequence)
        .replace("{claim_id}", STRANGER)
        .replace("{job_id}", STRANGER)
        .replace("{flow_key}", "fixture-key");
    if path.contains('{') {
        panic!("{template}: a path parameter tests/access.rs has no fixture for");
    }
    if path.is_empty() {
        path.push('/');
    }
    path
}

/// Every operation of the OpenAPI document that access control guards (all
/// but the probes), with the role the document says it needs: a new
/// operation is in this matrix as soon as it is routed.
fn operations() -> Vec<Operation> {
    let doc = serde_json::to_value(child_ledger::api::openapi()).unwrap();
    let mut operations = Vec::new();
    for (template, item) in doc["paths"].as_object().unwrap() {
        for (name, method) in [
            ("get", Method::GET),
            ("put", Method::PUT),
            ("post", Method::POST),
            ("delete", Method::DELETE),
            ("patch", Method::PATCH),
        ] {
            let Some(operation) = item.get(name) else { continue };
            let Some(role) = operation["security"][0]["bearer"][0].as_str() else {
                assert!(
                    matches!(template.as_str(), "/healthz" | "/readyz"),
                    "{name} {template} names no role: only the probes are open"
                );
                continue;
            };
            let needs = match role {
                "reader" => Role::Reader,
                "producer" => Role::Producer,
                "worker" => Role::Worker,
                "admin" => Role::Admin,
                other => panic!("{name} {template}: unknown role {other}"),
            };
            assert!(
                method == Method::GET || needs != Role::Reader,
                "{name} {template}: a write needs more than reading"
            );
            let body = matches!(method, Method::POST | Method::PUT | Method::PATCH).then(|| json!({}));
            operations.push(Operation {
                path: fill(template, "P", "q", "1"),
                template: template.clone(),
                method,
                body,
                needs,
            });
        }
    }
    assert!(operations.len() >= 28, "{} operations", operations.len());
    operations
}

fn is_problem(reply: &Reply) -> bool {
    reply.content_type.starts_with("application/problem+json") && reply.body["type"].is_string()
}

/// Every operation × no token, an unknown token and each role: the
/// rejections are 401 (with the challenge) or 403 problems and write
/// nothing; the role that may call an operation gets past access control.
async fn every_operation_against_every_caller(backend: Backend) {
    let (app, roles) = app_with_roles(backend, vec![]).await;
    assert_eq!(
        app.put_as(
            &roles.admin,
            "/v1/parents/P",
            json!({"queue": "q", "children": children(5)})
        )
        .await
        .status,
        StatusCode::CREATED
    );
    let r = app
        .put_as(
            &roles.admin,
            "/v1/parents/D",
            json!({"queue": "q", "decomposed": false, "children": []}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");

    let callers: Vec<(&str, Option<&str>)> = vec![
        ("none", None),
        (
            "unknown",
            Some("clt_0000000000000000000000000000000000000000000000000000000000000000"),
        ),
        ("reader", Some(&roles.reader)),
        ("producer", Some(&roles.producer)),
        ("worker", Some(&roles.worker)),
        ("admin", Some(&roles.admin)),
    ];
    let role_of = |name: &str| match name {
        "reader" => Some(Role::Reader),
        "producer" => Some(Role::Producer),
        "worker" => Some(Role::Worker),
        "admin" => Some(Role::Admin),
        _ => None,
    };
    let grants = |held: Role, needed: Role| held == Role::Admin || needed == Role::Reader || held == needed;

    // All the rejections first, then check that none of them wrote anything.
    let before = ledger_state(&app).await;
    let mut allowed = Vec::new();
    let operations = operations();
    for (n, operation) in operations.iter().enumerate() {
        for (name, token) in &callers {
            let role = role_of(name);
            if role.is_some_and(|held| grants(held, operation.needs)) {
                allowed.push((n, *name, *token));
                continue;
            }
            let r = app
                .request_as(
                    *token,
                    operation.method.clone(),
                    &operation.path,
                    operation.body.clone(),
                )
                .await;
            let what = format!(
                "{} {} ({}) as {name}",
                operation.method, operation.path, operation.template
            );
            assert!(is_problem(&r), "{what}: not a problem: {r:?}");
            if role.is_none() {
                assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{what}: {r:?}");
                assert_eq!(r.body["type"], "/problems/unauthenticated", "{what}");
                let challenge = r
                    .headers
                    .get("www-authenticate")
                    .expect("WWW-Authenticate")
                    .to_str()
                    .unwrap();
                assert!(challenge.starts_with("Bearer"), "{what}: {challenge}");
            } else {
                assert_eq!(r.status, StatusCode::FORBIDDEN, "{what}: {r:?}");
                assert_eq!(r.body["type"], "/problems/forbidden", "{what}");
                let needs = operation.needs;
                assert!(
                    r.body["detail"].as_str().unwrap().contains(needs.as_str()),
                    "{what}: names the role"
                );
            }
        }
    }
    assert_eq!(ledger_state(&app).await, before, "a rejected request wrote something");

    for (n, name, token) in allowed {
        let operation = &operations[n];
        if operation.template.ends_with("/events") {
            // An event stream answers its head and goes on: read no body.
            let mut request = app.client.get(format!("{}{}", app.base, operation.path));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let status = request.send().await.expect("answered").status();
            assert!(
                status != StatusCode::UNAUTHORIZED && status != StatusCode::FORBIDDEN && !status.is_server_error(),
                "GET {} as {name}: {status}",
                operation.path
            );
            continue;
        }
        let r = app
            .request_as(token, operation.method.clone(), &operation.path, operation.body.clone())
            .await;
        let what = format!("{} {} as {name}", operation.method, operation.path);
        assert!(
            r.status != StatusCode::UNAUTHORIZED && r.status != StatusCode::FORBIDDEN && !r.status.is_server_error(),
            "{what}: {r:?}"
        );
    }

    // The probes and the documents stay open.
    for path in ["/healthz", "/readyz", "/openapi.json", "/docs/"] {
        let r = app.request_as(None, Method::GET, path, None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
    }
    let metrics = app.request_as(Some(&roles.reader), Method::GET, "/metrics", None).await;
    let text = metrics.body.as_str().unwrap();
    for reason in ["missing", "unknown", "forbidden"] {
        assert!(
            text.contains(&format!("child_ledger_auth_failures_total{{reason=\"{reason}\"}}")),
            "{reason} counted"
        );
    }
}

/// A malformed `Authorization` header is a 401 too.
async fn only_bearer_tokens_authenticate(backend: Backend) {
    let (app, roles) = app_with_roles(backend, vec![]).await;
    for header in ["Basic dXNlcjpwYXNz", "Bearer", &format!("Token {}", roles.admin)] {
        let r = app
            .client
            .get(format!("{}/v1/parents", app.base))
            .header("authorization", header)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{header}");
    }
    let r = app
        .request_as(Some(&roles.reader), Method::GET, "/v1/parents", None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

/// A token limited to queues sees, claims and finishes only their parents:
/// the others answer 404 on single-item routes, are left out of lists and
/// batches, and a claim on them is answered as an unknown one.
async fn tokens_reach_only_their_queues(backend: Backend) {
    let (worker_a, w) = token("team-a-worker", &[Role::Worker], &["team-a.*"]);
    let (reader_one, r) = token("team-a-one-reader", &[Role::Reader], &["team-a.one"]);
    let (producer_a, p) = token("team-a-producer", &[Role::Producer], &["team-a.*"]);
    let (admin_a, a) = token("team-a-admin", &[Role::Admin], &["team-a.one", "team-a.two"]);
    let (app, roles) = app_with_roles(backend, vec![w, r, p, a]).await;
    for (parent, queue) in [("A1", "team-a.one"), ("A2", "team-a.two"), ("B", "team-b")] {
        let r = app
            .request_as(
                Some(&roles.admin),
                Method::PUT,
                &format!("/v1/parents/{parent}"),
                Some(json!({"queue": queue, "children": children(3)})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let listed = |reply: Reply| -> Vec<String> {
        reply.body["parents"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["parent_id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(listed(app.get_as(&worker_a, "/v1/parents").await), ["A1", "A2"]);
    assert_eq!(listed(app.get_as(&reader_one, "/v1/parents").await), ["A1"]);
    assert!(listed(app.get_as(&reader_one, "/v1/parents?queue=team-b").await).is_empty());
    assert_eq!(
        listed(app.get_as(&roles.reader, "/v1/parents").await),
        ["A1", "A2", "B"]
    );

    for path in ["/v1/parents/B", "/v1/parents/B/children", "/v1/parents/B/children/0"] {
        let r = app.get_as(&worker_a, path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {r:?}");
        assert_eq!(r.body["type"], "/problems/not-found");
        assert_eq!(app.get_as(&roles.reader, path).await.status, StatusCode::OK, "{path}");
    }
    assert_eq!(
        app.get_as(&reader_one, "/v1/parents/A2").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(app.get_as(&reader_one, "/v1/parents/A1").await.status, StatusCode::OK);

    let r = app
        .post_as(&worker_a, "/v1/queues/team-b/claims", json!({"limit": 10}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = app
        .post_as(&worker_a, "/v1/parents/B/claims", json!({"limit": 10}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = app
        .post_as(&worker_a, "/v1/queues/team-a.one/claims", json!({"limit": 10}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let a_claim = r.body["claim_id"].as_str().unwrap().to_owned();
    assert_eq!(r.body["children"].as_array().unwrap().len(), 3);

    // Someone else's claim on team-b: out of reach, it holds nothing for this token.
    let b_claim = app
        .post_as(
            &roles.worker,
            "/v1/parents/B/claims",
            json!({"limit": 2, "lease_seconds": 300}),
        )
        .await;
    let b_claim = b_claim.body["claim_id"].as_str().unwrap().to_owned();
    let leases_before = ledger_state(&app).await;
    let r = app
        .post_as(
            &worker_a,
            &format!("/v1/claims/{b_claim}/extend"),
            json!({"lease_seconds": 5000}),
        )
        .await;
    assert_eq!((r.status, r.body["extended"].as_u64()), (StatusCode::OK, Some(0)));
    let r = app
        .post_as(&worker_a, &format!("/v1/claims/{b_claim}/release"), json!({}))
        .await;
    assert_eq!((r.status, r.body["released"].as_u64()), (StatusCode::OK, Some(0)));
    let r = app
        .post_as(
            &worker_a,
            "/v1/parents/B/children/0/outcome",
            json!({"outcome": "processed", "claim_id": b_claim}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = app
        .post_as(
            &worker_a,
            "/v1/outcomes",
            json!({"outcomes": [
                {"parent_id": "B", "sequence": 1, "outcome": "processed", "claim_id": b_claim},
                {"parent_id": "A1", "sequence": 0, "outcome": "processed", "claim_id": a_claim},
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["results"][0]["status"], "not_found");
    assert_eq!(r.body["results"][1]["status"], "applied");
    let b = app.get_as(&roles.reader, "/v1/parents/B").await;
    assert_eq!(
        (
            b.body["counts"]["processed"].as_i64(),
            b.body["counts"]["in_flight"].as_i64()
        ),
        (Some(0), Some(2))
    );
    let after = ledger_state(&app).await;
    assert_ne!(after, leases_before, "A1's outcome was written");
    let lease = app
        .count(&format!(
            "SELECT count(*) FROM child_status WHERE parent_id = 'B' AND state = 'in_flight' AND claim_id = '{b_claim}'"
        ))
        .await;
    assert_eq!(lease, 2, "the out-of-reach claim still holds its children");

    // Registration: only into reachable queues.
    let r = app
        .put_as(
            &producer_a,
            "/v1/parents/N1",
            json!({"queue": "team-b", "children": children(1)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert!(r.body["detail"].as_str().unwrap().contains("queue"));
    let r = app
        .put_as(
            &producer_a,
            "/v1/parents/B",
            json!({"queue": "team-a.x", "children": children(3)}),
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "an existing parent out of reach is not revealed: {r:?}"
    );
    let r = app
        .put_as(
            &producer_a,
            "/v1/parents/N2",
            json!({"queue": "team-a.x", "children": children(1)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(app.count("SELECT count(*) FROM parent WHERE parent_id = 'N1'").await, 0);

    // An admin of two queues sweeps only them.
    let r = app.post_as(&admin_a, "/v1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["checked"].as_u64(), Some(2), "{r:?}");
    let r = app
        .post_as(&admin_a, "/v1/reconcile", json!({"dry_run": true, "queue": "team-b"}))
        .await;
    assert_eq!(r.body["checked"].as_u64(), Some(0), "{r:?}");
    let r = app
        .post_as(&roles.admin, "/v1/reconcile", json!({"dry_run": true}))
        .await;
    assert_eq!(r.body["checked"].as_u64(), Some(4), "{r:?}");
}

/// An outcome must come from the claim that holds the child now or held it
/// last: any other claim id is refused and writes nothing; the late holder
/// still wins; an outcome without a claim id needs `admin`.
async fn outcomes_are_fenced_by_claim(backend: Backend) {
    let (app, roles) = app_with_roles(backend, vec![]).await;
    let r = app
        .request_as(
            Some(&roles.producer),
            Method::PUT,
            "/v1/parents/F",
            Some(json!({"queue": "q", "children": children(4)})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let before = ledger_state(&app).await;

    // Never claimed: no claim id can be its claim.
    let zero = "00000000-0000-0000-0000-000000000000";
    let r = app
        .post_as(
            &roles.worker,
            "/v1/parents/F/children/0/outcome",
            json!({"outcome": "processed", "claim_id": zero}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.body["type"], "/problems/claim-mismatch");
    assert!(r.body.get("child").is_none(), "the holder's claim id is not handed out");
    let r = app.post_as(
        &roles.worker,
        "/v1/outcomes",
        json!({"outcomes": [{"parent_id": "F", "sequence": 1, "outcome": "failed", "reason": "x", "claim_id": zero}]}),
    )
    .await;
    assert_eq!(r.body["results"][0]["status"], "claim_mismatch", "{r:?}");
    // Without a claim id: admin only.
    let r = app
        .post_as(
            &roles.worker,
            "/v1/parents/F/children/0/outcome",
            json!({"outcome": "processed"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert!(r.body["detail"].as_str().unwrap().contains("claim_id"));
    let r = app
        .post_as(
            &roles.worker,
            "/v1/outcomes",
            json!({"outcomes": [{"parent_id": "F", "sequence": 0, "outcome": "processed"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");
    assert_eq!(ledger_state(&app).await, before, "a refused outcome wrote something");

    // Claim 1 takes G's only child, its lease runs out, claim 2 takes it,
    // runs out, claim 3 takes it: claim 1 is two claims back and is refused;
    // claim 2, the previous holder, still wins.
    let r = app
        .request_as(
            Some(&roles.producer),
            Method::PUT,
            "/v1/parents/G",
            Some(json!({"queue": "q", "children": children(1)})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let mut claims: Vec<String> = Vec::new();
    while claims.len() < 3 {
        let r = app
            .post_as(
                &roles.worker,
                "/v1/parents/G/claims",
                json!({"limit": 1, "lease_seconds": 300}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        if r.body["children"].as_array().unwrap().is_empty() {
            // The sweep has not returned the expired child yet.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        let claim = r.body["claim_id"].as_str().unwrap().to_owned();
        if claims.len() < 2 {
            app.expire_claim(&claim).await;
        }
        claims.push(claim);
    }
    let conflicts_before = app
        .count("SELECT count(*) FROM child WHERE conflicts IS NOT NULL")
        .await;
    let r = app
        .post_as(
            &roles.worker,
            "/v1/parents/G/children/0/outcome",
            json!({"outcome": "failed", "reason": "stale", "claim_id": claims[0]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.body["type"], "/problems/claim-mismatch");
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE conflicts IS NOT NULL")
            .await,
        conflicts_before,
        "a fenced-out write is not a conflict to log"
    );
    let r = app
        .post_as(
            &roles.worker,
            "/v1/parents/G/children/0/outcome",
            json!({"outcome": "processed", "claim_id": claims[1]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["applied"], true);
    assert_eq!(
        r.body["child"]["outcome_attempt"], 2,
        "credited to the previous holder's attempt"
    );
    // The current holder is answered as any loser: the outcome is decided.
    let r = app
        .post_as(
            &roles.worker,
            "/v1/parents/G/children/0/outcome",
            json!({"outcome": "processed", "claim_id": claims[2]}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["applied"].as_bool()),
        (StatusCode::OK, Some(false)),
        "{r:?}"
    );
    // An admin may still record without a claim id.
    let r = app
        .post_as(
            &roles.admin,
            "/v1/parents/F/children/3/outcome",
            json!({"outcome": "skipped", "reason": "ops"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// A write must say it is JSON, even with no body, when a browser may have
/// sent it: a page in a browser cannot send that without the service's
/// consent (CORS preflight), and a browser names the page's `Origin` on every
/// POST. A write with no body, no content type and no `Origin` (`curl -X
/// POST`) reads as `{}`.
async fn writes_need_a_json_content_type(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/W", json!({"queue": "q", "children": children(2)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let before = ledger_state(&app).await;
    let page = [("origin", "https://elsewhere.example")];
    for (method, path) in [
        (Method::POST, "/v1/queues/q/claims"),
        (Method::POST, "/v1/parents/W/claims"),
        (Method::POST, "/v1/parents/W/children/0/retry"),
        (Method::POST, "/v1/reconcile"),
        (Method::POST, "/v1/queues/q/pause"),
        (Method::PUT, "/v1/parents/W2"),
    ] {
        for content_type in [
            "",
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            for origin in [&[][..], &page] {
                if content_type.is_empty() && origin.is_empty() {
                    continue; // curl's bodiless write: below
                }
                let r = app
                    .raw_with(method.clone(), path, content_type, origin, Vec::new().into())
                    .await;
                assert_eq!(
                    r.status,
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "{method} {path} {content_type:?} {origin:?}: {r:?}"
                );
                assert_eq!(r.body["type"], "/problems/unsupported-media-type");
            }
        }
        // A body of unknown length (chunked) without a content type may be a form.
        let chunks = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"limit=5"))]);
        let r = app
            .raw_with(method.clone(), path, "", &[], reqwest::Body::wrap_stream(chunks))
            .await;
        assert_eq!(
            r.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method} {path} chunked: {r:?}"
        );
    }
    assert_eq!(ledger_state(&app).await, before);
    let r = app
        .raw(Method::POST, "/v1/queues/q/claims", "application/json", Vec::new())
        .await;
    assert_eq!(r.status, StatusCode::OK, "an empty JSON body is still `{{}}`");
    assert_eq!(r.body["children"].as_array().unwrap().len(), 2);
    // curl -X POST: no body, no content type, no Origin.
    for (path, paused) in [("/v1/queues/q/pause", true), ("/v1/queues/q/resume", false)] {
        let r = app.raw(Method::POST, path, "", Vec::new()).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {r:?}");
        assert_eq!(r.body["paused"], paused, "{r:?}");
    }
}

/// A response with the parent id named in it replaced, to compare the
/// answers about two parents.
fn answer_without(r: &Reply, id: &str) -> String {
    format!(
        "{} {}",
        r.status,
        serde_json::to_string(&r.body).unwrap().replace(id, "<parent>")
    )
}

/// A token limited to queues, on every operation of the document that names
/// a parent or a queue in its path, with the role to call it (an admin of
/// `team-a.*`): another queue's parent, child or queue is 404, and a parent
/// of another queue is answered exactly as one that does not exist whatever
/// else is wrong with the request (a bad query, a bad body, the probes of
/// issue 26). Nothing is written.
async fn other_queues_cannot_be_told_from_nothing(backend: Backend) {
    let (admin_a, a) = token("team-a-admin", &[Role::Admin], &["team-a.*"]);
    let (app, roles) = app_with_roles(backend, vec![a]).await;
    for (parent, queue, decomposed) in [("B", "team-b", true), ("BD", "team-b", false)] {
        let r = app
            .put_as(
                &roles.admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(3), "decomposed": decomposed}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let before = ledger_state(&app).await;
    let mut compared = 0;
    let mut hidden_queues = 0;
    for operation in operations() {
        let template = operation.template.as_str();
        let names_parent = template.contains("{parent_id}");
        if template.contains("{queue}") {
            let path = fill(template, "B", "team-b", "0");
            let r = app
                .request_as(Some(&admin_a), operation.method.clone(), &path, operation.body.clone())
                .await;
            assert_eq!(r.status, StatusCode::NOT_FOUND, "{} {path}: {r:?}", operation.method);
            assert_eq!(r.body["type"], "/problems/not-found", "{path}");
            hidden_queues += 1;
        }
        if !names_parent {
            continue;
        }
        let write = operation.body.is_some();
        let mut probes: Vec<(String, Option<Value>)> = vec![
            (String::new(), operation.body.clone()),
            ("?bogus=1".to_owned(), operation.body.clone()),
        ];
        if write {
            probes.push((String::new(), Some(json!({"bogus": 1}))));
            probes.push((String::new(), Some(json!([]))));
        }
        // The probes issue 26 names, on the operations they belong to.
        let named: &[(&str, &str, Option<Value>)] = &[
            ("/v1/parents/{parent_id}", "?include=bogus", None),
            ("/v1/parents/{parent_id}/children", "?limit=0", None),
            ("/v1/parents/{parent_id}/claims", "", Some(json!({"limit": 0}))),
            ("/v1/parents/{parent_id}/children", "", Some(json!({"children": []}))),
            ("/v1/parents/{parent_id}/seal", "", Some(json!({"total": -1}))),
            ("/v1/parents/{parent_id}/cancel", "", Some(json!({"reason": ""}))),
            ("/v1/parents/{parent_id}/reconcile", "", Some(json!({"dry_run": "x"}))),
            (
                "/v1/parents/{parent_id}/children/{sequence}/outcome",
                "",
                Some(json!({"outcome": "nope"})),
            ),
        ];
        for (at, query, body) in named {
            if *at == template && (body.is_some() == write) {
                probes.push(((*query).to_owned(), body.clone()));
            }
        }
        for sequence in ["0", "x"] {
            if sequence == "x" && !template.contains("{sequence}") {
                continue;
            }
            for (query, body) in &probes {
                let answers: Vec<(String, Reply)> = {
                    let mut answers = Vec::new();
                    for id in ["B", "NOPE"] {
                        let path = format!("{}{query}", fill(template, id, "team-a.one", sequence));
                        let r = app
                            .request_as(Some(&admin_a), operation.method.clone(), &path, body.clone())
                            .await;
                        answers.push((path, r));
                    }
                    answers
                };
                let (hidden_path, hidden) = &answers[0];
                let (missing_path, missing) = &answers[1];
                let what = format!("{} {hidden_path} / {missing_path} with {body:?}", operation.method);
                assert_eq!(
                    answer_without(hidden, "B"),
                    answer_without(missing, "NOPE"),
                    "{what}: another queue's parent is told from a missing one"
                );
                assert!(is_problem(hidden), "{what}: {hidden:?}");
                if operation.method == Method::PUT {
                    // A registration checks its body first: alike, but not 404.
                    assert_ne!(hidden.status, StatusCode::NOT_FOUND, "{what}: {hidden:?}");
                } else {
                    assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{what}: {hidden:?}");
                }
                compared += 1;
            }
        }
    }
    assert_eq!(ledger_state(&app).await, before, "a refused request wrote something");
    // A valid registration of an id taken in another queue: 404, not a conflict.
    let r = app
        .put_as(
            &admin_a,
            "/v1/parents/B",
            json!({"queue": "team-a.x", "children": children(1)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert_eq!(ledger_state(&app).await, before);
    assert!(compared >= 60, "{compared} comparisons");
    eprintln!(
        "access[{backend:?}]: {compared} requests about another queue's parent answered as about a missing one; \
         {hidden_queues} operations on another queue answered 404"
    );
}

/// The lists that span queues (`/v1/queues`, `/v1/children`) leave out the
/// queues outside a token's, and one queue outside them is 404.
async fn lists_leave_out_other_queues(backend: Backend) {
    let (worker_a, w) = token("team-a-worker", &[Role::Worker], &["team-a.*"]);
    let (reader_one, r) = token("team-a-one-reader", &[Role::Reader], &["team-a.one"]);
    let (app, roles) = app_with_roles(backend, vec![w, r]).await;
    for (parent, queue) in [("A1", "team-a.one"), ("A2", "team-a.two"), ("B", "team-b")] {
        let r = app
            .put_as(
                &roles.admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(3)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let queues = |reply: Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        reply.body["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["queue"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        queues(app.get_as(&roles.reader, "/v1/queues").await),
        ["team-a.one", "team-a.two", "team-b"]
    );
    assert_eq!(
        queues(app.get_as(&worker_a, "/v1/queues").await),
        ["team-a.one", "team-a.two"]
    );
    assert_eq!(queues(app.get_as(&reader_one, "/v1/queues").await), ["team-a.one"]);
    for (token, path) in [(&worker_a, "/v1/queues/team-b"), (&reader_one, "/v1/queues/team-a.two")] {
        let r = app.get_as(token, path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {r:?}");
    }
    assert_eq!(
        app.get_as(&reader_one, "/v1/queues/team-a.one").await.status,
        StatusCode::OK
    );

    let parents_of = |reply: Reply| -> Vec<String> {
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        let mut parents: Vec<String> = reply.body["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["parent_id"].as_str().unwrap().to_owned())
            .collect();
        parents.dedup();
        parents.sort();
        parents.dedup();
        parents
    };
    assert_eq!(
        parents_of(app.get_as(&roles.reader, "/v1/children?state=pending").await),
        ["A1", "A2", "B"]
    );
    assert_eq!(
        parents_of(app.get_as(&worker_a, "/v1/children?state=pending").await),
        ["A1", "A2"]
    );
    assert_eq!(
        parents_of(app.get_as(&reader_one, "/v1/children?state=pending").await),
        ["A1"]
    );
    for path in [
        "/v1/children?state=pending&queue=team-b",
        "/v1/children?parent_id=B",
        "/v1/children?parent_id=B&state=pending",
    ] {
        assert!(parents_of(app.get_as(&worker_a, path).await).is_empty(), "{path}");
    }
    assert_eq!(
        parents_of(app.get_as(&worker_a, "/v1/children?parent_id=A2").await),
        ["A2"]
    );
}

/// A token limited to queues sees only those queues' series in `/metrics`,
/// and none of the process-wide ones (they add up every queue's work); a
/// token on every queue sees everything.
async fn metrics_show_a_limited_token_only_its_queues(backend: Backend) {
    let (reader_one, r) = token("team-a-one-reader", &[Role::Reader], &["team-a.one"]);
    let (app, roles) = app_with_roles(backend, vec![r]).await;
    for (parent, queue) in [("A1", "team-a.one"), ("A2", "team-a.two"), ("B", "team-b")] {
        let r = app
            .put_as(
                &roles.admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(4)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        let r = app
            .post_as(
                &roles.worker,
                &format!("/v1/queues/{queue}/claims"),
                json!({"limit": 2}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let text = |reply: Reply| {
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        reply.body.as_str().unwrap().to_owned()
    };
    let everything = text(app.get_as(&roles.reader, "/metrics").await);
    for wanted in [
        "child_ledger_http_requests_total{",
        "child_ledger_children_claimed_total{queue=\"team-b\"} 2",
        "child_ledger_queue_children{queue=\"team-b\",state=\"pending\"} 2",
        "child_ledger_queue_children{queue=\"team-a.one\",state=\"in_flight\"} 2",
    ] {
        assert!(everything.contains(wanted), "{wanted} in {everything}");
    }
    let limited = text(app.get_as(&reader_one, "/metrics").await);
    for wanted in [
        "child_ledger_children_claimed_total{queue=\"team-a.one\"} 2",
        "child_ledger_queue_children{queue=\"team-a.one\",state=\"pending\"} 2",
        "child_ledger_queue_children{queue=\"team-a.one\",state=\"in_flight\"} 2",
    ] {
        assert!(limited.contains(wanted), "{wanted} in {limited}");
    }
    for unwanted in [
        "team-b",
        "team-a.two",
        "child_ledger_http_requests_total",
        "child_ledger_outcomes",
        "child_ledger_auth_failures",
        "child_ledger_db_pool",
    ] {
        assert!(
            !limited.contains(unwanted),
            "{unwanted} shown to a token of team-a.one: {limited}"
        );
    }
}

/// Two `Authorization` headers are refused (which one counts would be a
/// guess), whatever they hold.
async fn repeated_authorization_headers_are_refused(backend: Backend) {
    let (app, roles) = app_with_roles(backend, vec![]).await;
    let unknown = "clt_0000000000000000000000000000000000000000000000000000000000000000";
    for pair in [
        [roles.reader.as_str(), roles.admin.as_str()],
        [unknown, roles.admin.as_str()],
        [roles.admin.as_str(), roles.admin.as_str()],
    ] {
        let response = app
            .client
            .get(format!("{}/v1/parents", app.base))
            .header("authorization", format!("Bearer {}", pair[0]))
            .header("authorization", format!("Bearer {}", pair[1]))
            .send()
            .await
            .unwrap();
        let status = response.status();
        let challenge = response.headers().get("www-authenticate").cloned();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
        assert_eq!(body["type"], "/problems/unauthenticated");
        assert!(
            body["detail"].as_str().unwrap().contains("one Authorization header"),
            "{body}"
        );
        assert!(challenge.is_some_and(|c| c.to_str().unwrap().contains("invalid_request")));
    }
    let metrics = app.get_as(&roles.reader, "/metrics").await;
    assert!(
        metrics
            .body
            .as_str()
            .unwrap()
            .contains("child_ledger_auth_failures_total{reason=\"repeated\"} 3"),
        "{metrics:?}"
    );
}

/// A `webhook_url`'s query string may hold the receiver's secret: only an
/// admin sees it, on the parent, in the parent list and in its deliveries;
/// everyone else sees `?redacted`.
async fn webhook_secrets_are_shown_only_to_admins(backend: Backend) {
    let (reader, r) = token("reader", &[Role::Reader], &[]);
    let (producer, p) = token("producer", &[Role::Producer], &[]);
    let (admin, a) = token("admin", &[Role::Admin], &[]);
    let limits = child_ledger::config::Limits {
        webhook_allow_hosts: child_ledger::ledger::webhook::AllowHosts::parse("hooks.example.test").unwrap(),
        ..child_ledger::config::Limits::default()
    };
    let app = spawn_app_with_tokens_and_limits(backend, json!([r, p, a]), limits).await;
    let url = "https://hooks.example.test/done?token=s3cret-receiver-token";
    let shown = "https://hooks.example.test/done?redacted";
    // Complete at registration: its completion event is written too.
    let r = app
        .put_as(
            &producer,
            "/v1/parents/W",
            json!({"queue": "q", "children": [{"skip": "x"}], "webhook_url": url}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["webhook_url"], shown, "the producer sees it redacted too");
    for (token, expected) in [(&reader, shown), (&producer, shown), (&admin, url)] {
        let r = app.get_as(token, "/v1/parents/W").await;
        assert_eq!(r.body["webhook_url"], expected, "{r:?}");
        let r = app.get_as(token, "/v1/parents").await;
        assert_eq!(r.body["parents"][0]["webhook_url"], expected, "{r:?}");
        let r = app.get_as(token, "/v1/parents/W/deliveries").await;
        assert_eq!(r.body["deliveries"][0]["url"], expected, "{r:?}");
        let text = serde_json::to_string(&app.get_as(token, "/v1/parents/W").await.body).unwrap();
        assert_eq!(text.contains("s3cret"), expected == url, "{text}");
    }
}

/// A long poll on a parent checks its reach again at every look: a worker of
/// queue `a` waiting on a complete parent of `a` gets nothing of a parent
/// registered under the same id in queue `b` meanwhile (issue 26, item 1).
async fn a_long_poll_never_claims_another_queues_parent(backend: Backend) {
    let (worker_a, w) = token("worker-a", &[Role::Worker], &["a"]);
    let (producer_b, p) = token("producer-b", &[Role::Producer], &["b"]);
    let (app, roles) = app_with_roles(backend, vec![w, p]).await;
    // A complete parent of `a`: its only child is stored skipped.
    let r = app
        .put_as(
            &roles.admin,
            "/v1/parents/PX",
            json!({"queue": "a", "children": [{"payload": {"n": 0}, "skip": "nothing to do"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["state"], "complete", "{r:?}");

    let poll = {
        let (client, base, token) = (app.client.clone(), app.base.clone(), worker_a.clone());
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let r = client
                .post(format!("{base}/v1/parents/PX/claims"))
                .bearer_auth(token)
                .json(&json!({"wait_seconds": 20}))
                .send()
                .await
                .unwrap();
            let status = r.status();
            (status, r.json::<Value>().await.unwrap(), started.elapsed())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let r = app
        .request_as(Some(&roles.admin), Method::DELETE, "/v1/parents/PX", None)
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    let r = app
        .put_as(
            &producer_b,
            "/v1/parents/PX",
            json!({"queue": "b", "children": [{"payload": {"secret": "of queue b"}}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");

    let (status, body, took) = poll.await.unwrap();
    println!("the poll answered {status} after {took:?}: {body}");
    assert!(
        !(status == StatusCode::OK && body["children"].as_array().is_some_and(|c| !c.is_empty())),
        "queue b's child was handed to a worker of queue a: {body}"
    );
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "the parent it waited on is gone from its queues: {body}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM child_status WHERE parent_id = 'PX' AND state = 'pending'")
            .await,
        1,
        "queue b's child is still there to claim"
    );
    // Queue b's own workers get it.
    let r = app.post_as(&roles.worker, "/v1/parents/PX/claims", json!({})).await;
    assert_eq!(r.body["children"][0]["payload"]["secret"], "of queue b", "{r:?}");
}

/// A reconcile job's report is seen only by admins who reach every queue it
/// may have touched (issue 26, item 5).
async fn reconcile_jobs_are_seen_within_their_queues(backend: Backend) {
    let (admin_a, a) = token("admin-a", &[Role::Admin], &["a"]);
    let (app, roles) = app_with_roles(backend, vec![a]).await;
    for (parent, queue) in [("PA", "a"), ("PB", "b")] {
        let r = app
            .put_as(
                &roles.admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(2)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
    }
    let job_of = |reply: Reply| -> String {
        assert_eq!(reply.status, StatusCode::ACCEPTED, "{reply:?}");
        reply.body["job_id"].as_str().unwrap().to_owned()
    };
    let every = job_of(
        app.post_as(&roles.admin, "/v1/reconcile/jobs", json!({"dry_run": true}))
            .await,
    );
    let of_b = job_of(
        app.post_as(
            &roles.admin,
            "/v1/reconcile/jobs",
            json!({"dry_run": true, "queue": "b"}),
        )
        .await,
    );
    let of_a = job_of(
        app.post_as(
            &roles.admin,
            "/v1/reconcile/jobs",
            json!({"dry_run": true, "queue": "a"}),
        )
        .await,
    );
    let mine = job_of(
        app.post_as(&admin_a, "/v1/reconcile/jobs", json!({"dry_run": true}))
            .await,
    );
    for job in [&every, &of_b] {
        let r = app.get_as(&admin_a, &format!("/v1/reconcile/jobs/{job}")).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "job {job}: {r:?}");
        assert_eq!(r.content_type, "application/problem+json");
        assert!(!r.body.to_string().contains("PB"), "{r:?}");
    }
    for job in [&of_a, &mine] {
        let r = app.get_as(&admin_a, &format!("/v1/reconcile/jobs/{job}")).await;
        assert_eq!(r.status, StatusCode::OK, "job {job}: {r:?}");
    }
    for job in [&every, &of_b, &of_a, &mine] {
        let r = app.get_as(&roles.admin, &format!("/v1/reconcile/jobs/{job}")).await;
        assert_eq!(r.status, StatusCode::OK, "job {job}: {r:?}");
    }
}

/// `/readyz` stays open to probes, but a caller without a valid token learns
/// only whether the service is ready: the host the ledger is on goes to a
/// caller with a token (any role), as it does on a service without tokens.
async fn readyz_tells_a_caller_without_a_token_only_ready_or_not(backend: Backend) {
    let (app, roles) = app_with_roles(backend, vec![]).await;
    let shown = |body: &Value| {
        let mut keys: Vec<String> = body.as_object().expect("an object").keys().cloned().collect();
        keys.sort();
        keys
    };
    for token in [None, Some("not-a-token")] {
        let r = app.request_as(token, Method::GET, "/readyz", None).await;
        assert_eq!(r.status, StatusCode::OK, "{token:?}: {r:?}");
        assert_eq!(r.body["status"], "ready", "{r:?}");
        assert_eq!(shown(&r.body), ["status", "store"], "{token:?}: {r:?}");
    }
    let r = app.request_as(Some(&roles.reader), Method::GET, "/readyz", None).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    if backend == Backend::Postgres {
        assert!(r.body["host"].as_str().is_some_and(|h| h.contains(':')), "{r:?}");
    }
    let open = spawn_app(backend).await;
    let r = open.get("/readyz").await;
    if backend == Backend::Postgres {
        assert!(
            r.body["host"].is_string(),
            "a service without tokens tells everyone: {r:?}"
        );
    }
}

both_stores!(
    readyz_tells_a_caller_without_a_token_only_ready_or_not,
    a_long_poll_never_claims_another_queues_parent,
    reconcile_jobs_are_seen_within_their_queues,
    every_operation_against_every_caller,
    other_queues_cannot_be_told_from_nothing,
    lists_leave_out_other_queues,
    metrics_show_a_limited_token_only_its_queues,
    repeated_authorization_headers_are_refused,
    webhook_secrets_are_shown_only_to_admins,
    only_bearer_tokens_authenticate,
    tokens_reach_only_their_queues,
    outcomes_are_fenced_by_claim,
    writes_need_a_json_content_type,
);
