//! Access control on both stores: every operation against no token, an
//! unknown token and each role; tokens limited to queues on single-item and
//! list routes; outcome fencing; and writes a browser could forge.

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
        "SELECT count(*) FROM child WHERE state = 'pending'",
        "SELECT count(*) FROM child WHERE state = 'in_flight'",
        "SELECT count(*) FROM child WHERE state = 'held'",
        "SELECT CAST(coalesce(sum(attempts), 0) AS BIGINT) FROM child",
        "SELECT count(*) FROM child WHERE conflicts IS NOT NULL",
        "SELECT count(*) FROM child WHERE lease_expires_at IS NOT NULL",
        "SELECT CAST(coalesce(sum(served), 0) AS BIGINT) FROM lane",
    ] {
        parts.push(app.count(sql).await.to_string());
    }
    parts.join(",")
}

/// An operation, the role it needs, and a request that would succeed (or
/// fail for a reason other than access) with that role.
struct Operation {
    method: Method,
    path: String,
    body: Option<Value>,
    needs: Role,
}

fn op(method: Method, path: &str, body: Option<Value>, needs: Role) -> Operation {
    Operation {
        method,
        path: path.to_owned(),
        body,
        needs,
    }
}

/// Every operation of the contract that access control guards.
fn operations(n: usize) -> Vec<Operation> {
    let stranger = "00000000-0000-4000-8000-000000000000";
    vec![
        op(Method::GET, "/v1/parents", None, Role::Reader),
        op(Method::GET, "/v1/parents/P", None, Role::Reader),
        op(Method::GET, "/v1/parents/P/children", None, Role::Reader),
        op(Method::GET, "/v1/parents/P/children/0", None, Role::Reader),
        op(Method::GET, "/metrics", None, Role::Reader),
        op(
            Method::PUT,
            &format!("/v1/parents/new-{n}"),
            Some(json!({"queue": "q", "children": children(1)})),
            Role::Producer,
        ),
        op(
            Method::POST,
            "/v1/parents/D/children",
            Some(json!({"children": [{"sequence": 0, "payload": {}}]})),
            Role::Producer,
        ),
        op(
            Method::POST,
            "/v1/parents/D/seal",
            Some(json!({"total": 9})),
            Role::Producer,
        ),
        op(
            Method::POST,
            "/v1/parents/P/claims",
            Some(json!({"limit": 1})),
            Role::Worker,
        ),
        op(
            Method::POST,
            "/v1/queues/q/claims",
            Some(json!({"limit": 1})),
            Role::Worker,
        ),
        op(
            Method::POST,
            &format!("/v1/claims/{stranger}/extend"),
            Some(json!({})),
            Role::Worker,
        ),
        op(
            Method::POST,
            &format!("/v1/claims/{stranger}/release"),
            Some(json!({})),
            Role::Worker,
        ),
        op(
            Method::POST,
            "/v1/parents/P/children/1/outcome",
            Some(json!({"outcome": "processed", "claim_id": stranger})),
            Role::Worker,
        ),
        op(
            Method::POST,
            "/v1/outcomes",
            Some(
                json!({"outcomes": [{"parent_id": "P", "sequence": 2, "outcome": "processed", "claim_id": stranger}]}),
            ),
            Role::Worker,
        ),
        op(
            Method::POST,
            "/v1/parents/P/children/3/retry",
            Some(json!({})),
            Role::Admin,
        ),
        op(
            Method::POST,
            "/v1/parents/P/reconcile",
            Some(json!({"dry_run": true})),
            Role::Admin,
        ),
        op(
            Method::POST,
            "/v1/reconcile",
            Some(json!({"dry_run": true})),
            Role::Admin,
        ),
    ]
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
    for (n, operation) in operations(0).into_iter().enumerate() {
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
            let what = format!("{} {} as {name}", operation.method, operation.path);
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
        let operation = &operations(n)[n];
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
            "SELECT count(*) FROM child WHERE parent_id = 'B' AND state = 'in_flight' AND claim_id = '{b_claim}'"
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

both_stores!(
    every_operation_against_every_caller,
    only_bearer_tokens_authenticate,
    tokens_reach_only_their_queues,
    outcomes_are_fenced_by_claim,
    writes_need_a_json_content_type,
);
