//! A catalogue of bad requests: each gets an RFC 9457 problem naming what is
//! wrong, and none of them writes anything.

mod common;

use child_ledger::config::Limits;
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Statuses acceptable for a well-formed body with an invalid field.
const INVALID: &[u16] = &[400, 422];

#[track_caller]
fn assert_problem(case: &str, r: &Reply, statuses: &[u16], field: Option<&str>) {
    assert!(
        statuses.contains(&r.status.as_u16()),
        "{case}: expected one of {statuses:?}, got {r:?}"
    );
    assert!(
        r.content_type.starts_with("application/problem+json"),
        "{case}: content type {:?}: {r:?}",
        r.content_type
    );
    for member in ["type", "title", "detail"] {
        assert!(r.body[member].is_string(), "{case}: problem without {member}: {r:?}");
    }
    assert_eq!(r.body["status"], r.status.as_u16(), "{case}: status member: {r:?}");
    if let Some(field) = field {
        assert!(
            r.body.to_string().contains(field),
            "{case}: problem does not name {field}: {r:?}"
        );
    }
}

async fn rejects_bad_requests(backend: Backend) {
    let app = spawn_app(backend).await;

    // One valid parent to aim the child-level requests at.
    let r = app
        .put("/v1/parents/V-ok", json!({"queue": "events", "children": children(2)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let parents_before = app.count("SELECT count(*) FROM parent").await;
    let children_before = app.count("SELECT count(*) FROM child").await;
    assert_eq!((parents_before, children_before), (1, 2));

    // Bodies that are not what the endpoint reads.
    let r = app
        .raw(
            Method::PUT,
            "/v1/parents/V-new",
            "application/json",
            br#"{"queue": "events","#.to_vec(),
        )
        .await;
    assert_problem("malformed JSON", &r, &[400], None);
    let r = app
        .raw(
            Method::PUT,
            "/v1/parents/V-new",
            "text/plain",
            br#"{"queue": "events"}"#.to_vec(),
        )
        .await;
    assert_problem("text/plain body", &r, &[415], None);
    let r = app.put("/v1/parents/V-new", json!({"queue": 5})).await;
    assert_problem("queue of the wrong type", &r, INVALID, Some("queue"));
    let r = app.put("/v1/parents/V-new", json!({"children": {"payload": {}}})).await;
    assert_problem("children not an array", &r, INVALID, Some("children"));

    // Identifiers.
    let r = app.put("/v1/parents/bad%20id%21", json!({"queue": "events"})).await;
    assert_problem("parent_id with a space and '!'", &r, INVALID, Some("parent_id"));
    let long_id = "a".repeat(201);
    let r = app
        .put(&format!("/v1/parents/{long_id}"), json!({"queue": "events"}))
        .await;
    assert_problem("parent_id of 201 chars", &r, INVALID, Some("parent_id"));
    let r = app.put("/v1/parents/V-new", json!({"queue": "UPPER"})).await;
    assert_problem("queue in upper case", &r, INVALID, Some("queue"));
    let r = app.put("/v1/parents/V-new", json!({"queue": "q".repeat(65)})).await;
    assert_problem("queue of 65 chars", &r, INVALID, Some("queue"));
    let r = app.post("/v1/queues/UPPER/claims", json!({"limit": 1})).await;
    assert_problem("queue in a claim path", &r, INVALID, Some("queue"));

    // Registration settings and children.
    let r = app.put("/v1/parents/V-new", json!({"expired_lease": "forever"})).await;
    assert_problem("unknown expired_lease", &r, INVALID, Some("expired_lease"));
    let r = app.put("/v1/parents/V-new", json!({"max_attempts": 0})).await;
    assert_problem("max_attempts 0", &r, INVALID, Some("max_attempts"));
    let r = app
        .put(
            "/v1/parents/V-new",
            json!({"children": [{"payload": {"n": 0}, "key": "evt-1"}, {"payload": {"n": 1}, "key": "evt-1"}]}),
        )
        .await;
    assert_problem("duplicate child keys", &r, &[400, 409, 422], Some("key"));
    let r = app
        .put(
            "/v1/parents/V-new",
            json!({"children": [{"payload": {}, "key": "k".repeat(201)}]}),
        )
        .await;
    assert_problem("key of 201 chars", &r, INVALID, Some("key"));

    // Claims and leases.
    for limit in [0, 1001] {
        let r = app.post("/v1/parents/V-ok/claims", json!({ "limit": limit })).await;
        assert_problem(&format!("claim limit {limit}"), &r, INVALID, Some("limit"));
    }
    for lease in [0, 86_401] {
        let r = app
            .post("/v1/parents/V-ok/claims", json!({ "lease_seconds": lease }))
            .await;
        assert_problem(&format!("lease_seconds {lease}"), &r, INVALID, Some("lease_seconds"));
    }
    let r = app.post("/v1/parents/V-ok/claims", json!({"wait_seconds": 21})).await;
    assert_problem("wait_seconds 21", &r, INVALID, Some("wait_seconds"));
    let r = app
        .post("/v1/claims/not-a-uuid/extend", json!({"lease_seconds": 5}))
        .await;
    assert_problem("claim_id not a uuid (extend)", &r, &[400], Some("claim_id"));
    let r = app.post("/v1/claims/not-a-uuid/release", json!({})).await;
    assert_problem("claim_id not a uuid (release)", &r, &[400], Some("claim_id"));

    // Outcomes.
    let r = app
        .post("/v1/parents/V-ok/children/0/outcome", json!({"outcome": "done"}))
        .await;
    assert_problem("outcome done", &r, INVALID, Some("outcome"));
    let r = app
        .post(
            "/v1/parents/V-ok/children/0/outcome",
            json!({"outcome": "failed", "reason": "x".repeat(1001)}),
        )
        .await;
    assert_problem("reason of 1001 chars", &r, INVALID, Some("reason"));
    let r = app
        .post("/v1/parents/V-ok/children/99/outcome", json!({"outcome": "processed"}))
        .await;
    assert_problem("outcome for an unknown child", &r, &[404], None);
    let r = app.get("/v1/parents/V-ok/children/99").await;
    assert_problem("unknown child", &r, &[404], None);
    let r = app.get("/v1/parents/V-ok/children/abc").await;
    assert_problem("non-numeric sequence", &r, &[400], Some("sequence"));
    let r = app
        .post("/v1/parents/V-ok/children/abc/outcome", json!({"outcome": "processed"}))
        .await;
    assert_problem("non-numeric sequence (outcome)", &r, &[400], Some("sequence"));
    let r = app.post("/v1/outcomes", json!({"outcomes": []})).await;
    assert_problem("empty batch", &r, INVALID, Some("outcomes"));
    let item = json!({"parent_id": "V-ok", "sequence": 0, "outcome": "processed"});
    let too_many: Vec<Value> = (0..1001).map(|_| item.clone()).collect();
    let r = app.post("/v1/outcomes", json!({ "outcomes": too_many })).await;
    assert_problem("batch of 1001", &r, INVALID, Some("outcomes"));

    // Reconcile.
    let r = app.post("/v1/parents/V-ok/reconcile", json!({"dry_run": "yes"})).await;
    assert_problem("dry_run as a string", &r, INVALID, Some("dry_run"));

    // Routing.
    let r = app.get("/v1/parents/no-such-parent").await;
    assert_problem("unknown parent", &r, &[404], None);
    let r = app.get("/v1/no-such-route").await;
    assert_problem("unknown route", &r, &[404], None);
    let r = app.request(Method::DELETE, "/v1/parents/x", None).await;
    assert_problem("DELETE a parent", &r, &[405], None);

    // Nothing above wrote anything.
    assert_eq!(app.count("SELECT count(*) FROM parent").await, parents_before);
    assert_eq!(app.count("SELECT count(*) FROM child").await, children_before);
    let r = app.get("/v1/parents/V-new").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let child = app.get("/v1/parents/V-ok/children/0").await.body;
    assert_eq!(child["state"], "pending", "{child}");
    assert!(child["outcome"].is_null(), "{child}");
    let parent = app.get("/v1/parents/V-ok").await.body;
    assert_eq!(parent["counts"]["pending"], 2, "{parent}");
    assert_eq!(parent["counts"]["processed"], 0, "{parent}");
}

async fn rejects_too_many_children(backend: Backend) {
    let limits = Limits {
        max_children_per_request: 10,
        ..Default::default()
    };
    let app = spawn_app_with(backend, limits).await;

    let r = app.put("/v1/parents/T-big", json!({"children": children(11)})).await;
    assert_problem(
        "11 children in one registration",
        &r,
        &[400, 413, 422],
        Some("children"),
    );
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM child").await, 0);

    // At the limit is fine; beyond it, append + seal is the way, each page within the limit.
    let r = app.put("/v1/parents/T-ten", json!({"children": children(10)})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");

    let r = app.put("/v1/parents/T-pages", json!({"decomposed": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let page: Vec<Value> = (0..11).map(|s| json!({"sequence": s, "payload": {}})).collect();
    let r = app
        .post("/v1/parents/T-pages/children", json!({ "children": page }))
        .await;
    assert_problem("11 children in one append", &r, &[400, 413, 422], Some("children"));

    assert_eq!(app.count("SELECT count(*) FROM parent").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM child").await, 10);
}

async fn rejects_oversized_bodies(backend: Backend) {
    let limits = Limits {
        max_body_bytes: 4096,
        ..Default::default()
    };
    let app = spawn_app_with(backend, limits).await;
    let r = app.put("/v1/parents/B-big", json!({"children": children(500)})).await;
    assert_problem("body over --max-body-bytes", &r, &[413], None);
    assert!(r.body["detail"].as_str().unwrap().contains("4096"), "{r:?}");
    // Without a content-length the limit still holds while the body streams in.
    let chunks = (0..3000).map(|i| {
        Ok::<_, std::io::Error>(if i == 0 {
            b"{\"children\": [".to_vec()
        } else {
            b"{},".to_vec()
        })
    });
    let streamed = app
        .client
        .put(format!("{}/v1/parents/B-stream", app.base))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 0);
}

both_stores!(
    rejects_bad_requests,
    rejects_too_many_children,
    rejects_oversized_bodies
);
