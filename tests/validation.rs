//! A catalogue of bad requests: each gets an RFC 9457 problem naming what is
//! wrong, and none of them writes anything.

mod common;

use child_ledger::config::Limits;
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// One bad request and the rejection it must get.
struct Case {
    name: &'static str,
    method: Method,
    path: String,
    content_type: &'static str,
    body: Vec<u8>,
    status: u16,
    /// The problem `type`, without the `/problems/` prefix.
    kind: &'static str,
    /// A field (JSON path, parameter or member) the problem must name.
    field: Option<&'static str>,
}

/// Builds the catalogue with less ceremony per case.
#[derive(Default)]
struct Catalogue(Vec<Case>);

impl Catalogue {
    fn raw(
        &mut self,
        name: &'static str,
        method: Method,
        path: impl Into<String>,
        content_type: &'static str,
        body: &[u8],
    ) -> &mut Case {
        self.0.push(Case {
            name,
            method,
            path: path.into(),
            content_type,
            body: body.to_vec(),
            status: 422,
            kind: "invalid-field",
            field: None,
        });
        self.0.last_mut().unwrap()
    }

    fn json(&mut self, name: &'static str, method: Method, path: impl Into<String>, body: Value) -> &mut Case {
        let body = serde_json::to_vec(&body).unwrap();
        self.raw(name, method, path, "application/json", &body)
    }

    fn put(&mut self, name: &'static str, path: impl Into<String>, body: Value) -> &mut Case {
        self.json(name, Method::PUT, path, body)
    }

    fn post(&mut self, name: &'static str, path: impl Into<String>, body: Value) -> &mut Case {
        self.json(name, Method::POST, path, body)
    }

    fn get(&mut self, name: &'static str, path: impl Into<String>) -> &mut Case {
        self.raw(name, Method::GET, path, "", b"")
    }
}

impl Case {
    /// Expects a 422 `invalid-field` naming `field` (the default kind).
    fn field(&mut self, field: &'static str) -> &mut Self {
        self.field = Some(field);
        self
    }

    /// Expects a 400 `invalid-parameter` naming the path or query parameter.
    fn param(&mut self, field: &'static str) -> &mut Self {
        self.expect(400, "invalid-parameter").field(field)
    }

    fn expect(&mut self, status: u16, kind: &'static str) -> &mut Self {
        self.status = status;
        self.kind = kind;
        self
    }
}

#[track_caller]
fn assert_problem(case: &str, r: &Reply, status: u16, kind: &str, field: Option<&str>) {
    assert_eq!(r.status.as_u16(), status, "{case}: {r:?}");
    assert!(
        r.content_type.starts_with("application/problem+json"),
        "{case}: content type {:?}: {r:?}",
        r.content_type
    );
    for member in ["type", "title", "detail"] {
        assert!(r.body[member].is_string(), "{case}: problem without {member}: {r:?}");
    }
    assert_eq!(r.body["type"], format!("/problems/{kind}"), "{case}: {r:?}");
    assert_eq!(r.body["status"], status, "{case}: status member: {r:?}");
    if let Some(field) = field {
        assert!(
            r.body["field"].as_str().is_some_and(|f| f.contains(field)),
            "{case}: problem does not name {field} in `field`: {r:?}"
        );
    }
}

/// Limits small enough that every one of them can be crossed cheaply.
fn tight_limits() -> Limits {
    Limits {
        max_body_bytes: 64 * 1024,
        max_children_per_request: 20,
        max_claim_limit: 50,
        default_lease_seconds: 60,
        max_lease_seconds: 3600,
        max_outcomes_per_request: 10,
        max_payload_bytes: 256,
        max_result_bytes: 128,
        max_wait_seconds: 20,
        wait_recheck_ms: 2000,
        ..Limits::default()
    }
}

fn catalogue() -> Vec<Case> {
    let mut c = Catalogue::default();
    let uuid = "3f2b9c1e-8d4a-4f6b-9a7e-2c5d8e1f0a3b";
    let item = |extra: Value| {
        let mut item = json!({"parent_id": "V-ok", "sequence": 0, "outcome": "processed"});
        item.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        item
    };

    // Bodies that are not what the endpoint reads.
    c.raw(
        "malformed JSON",
        Method::PUT,
        "/v1/parents/V-new",
        "application/json",
        br#"{"queue": "events","#,
    )
    .expect(400, "malformed-json");
    c.raw(
        "trailing garbage after the JSON",
        Method::PUT,
        "/v1/parents/V-new",
        "application/json",
        br#"{"queue": "events"} x"#,
    )
    .expect(400, "malformed-json");
    c.raw(
        "JSON body that is not UTF-8",
        Method::POST,
        "/v1/outcomes",
        "application/json",
        b"{\"outcomes\": [\"\xff\"]}",
    )
    .expect(400, "malformed-json");
    c.raw(
        "text/plain body",
        Method::PUT,
        "/v1/parents/V-new",
        "text/plain",
        br#"{"queue": "events"}"#,
    )
    .expect(415, "unsupported-media-type");
    c.raw(
        "form-encoded claim",
        Method::POST,
        "/v1/parents/V-ok/claims",
        "application/x-www-form-urlencoded",
        b"limit=5",
    )
    .expect(415, "unsupported-media-type");
    c.raw(
        "body without a content type",
        Method::POST,
        "/v1/outcomes",
        "",
        br#"{"outcomes": []}"#,
    )
    .expect(415, "unsupported-media-type");
    c.put("body that is a string", "/v1/parents/V-new", json!("register me"))
        .field("body");
    c.post("body that is an array of members", "/v1/reconcile", json!([true, null]))
        .field("body");
    c.post(
        "body that is an array of nulls",
        "/v1/parents/V-ok/claims",
        json!([null, null]),
    )
    .field("body");
    c.put(
        "unknown member",
        "/v1/parents/V-new",
        json!({"queue": "events", "colour": "red"}),
    )
    .field("colour");
    c.post("unknown claim member", "/v1/parents/V-ok/claims", json!({"limitt": 5}))
        .field("limitt");
    c.post(
        "unknown member in a batch item",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"extra": 1}))]}),
    )
    .field("outcomes[0]");

    // Wrong JSON types.
    c.put("queue of the wrong type", "/v1/parents/V-new", json!({"queue": 5}))
        .field("queue");
    c.put(
        "children not an array",
        "/v1/parents/V-new",
        json!({"children": {"payload": {}}}),
    )
    .field("children");
    c.put(
        "child key a number",
        "/v1/parents/V-new",
        json!({"children": [{"key": 7}]}),
    )
    .field("children[0].key");
    c.put(
        "max_attempts a string",
        "/v1/parents/V-new",
        json!({"max_attempts": "three"}),
    )
    .field("max_attempts");
    c.put("decomposed a string", "/v1/parents/V-new", json!({"decomposed": "yes"}))
        .field("decomposed");
    c.post(
        "claim limit a string",
        "/v1/parents/V-ok/claims",
        json!({"limit": "10"}),
    )
    .field("limit");
    c.post(
        "claim limit a fraction",
        "/v1/parents/V-ok/claims",
        json!({"limit": 1.5}),
    )
    .field("limit");
    c.post(
        "claim limit beyond i64",
        "/v1/queues/events/claims",
        json!({"limit": 1e20}),
    )
    .field("limit");
    c.post("worker a number", "/v1/queues/events/claims", json!({"worker": 5}))
        .field("worker");
    c.post(
        "reason a number",
        "/v1/parents/V-ok/children/0/outcome",
        json!({"outcome": "failed", "reason": 5}),
    )
    .field("reason");
    c.post(
        "batch sequence a string",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"sequence": "1"}))]}),
    )
    .field("outcomes[0].sequence");
    c.post(
        "claim_id in a body not a uuid",
        "/v1/parents/V-ok/children/0/outcome",
        json!({"outcome": "processed", "claim_id": "abc"}),
    )
    .field("claim_id");
    c.post("seal total a string", "/v1/parents/V-open/seal", json!({"total": "3"}))
        .field("total");
    c.post(
        "release children a string",
        format!("/v1/claims/{uuid}/release"),
        json!({"children": "all"}),
    )
    .field("children");
    c.post(
        "dry_run a string",
        "/v1/parents/V-ok/reconcile",
        json!({"dry_run": "yes"}),
    )
    .field("dry_run");
    c.post("sweep queue a number", "/v1/reconcile", json!({"queue": 5}))
        .field("queue");

    // Unknown enum values.
    c.put(
        "unknown expired_lease",
        "/v1/parents/V-new",
        json!({"expired_lease": "forever"}),
    )
    .field("expired_lease");
    c.post(
        "outcome done",
        "/v1/parents/V-ok/children/0/outcome",
        json!({"outcome": "done"}),
    )
    .field("outcome");
    c.post(
        "outcome in upper case",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"outcome": "PROCESSED"}))]}),
    )
    .field("outcomes[0].outcome");
    c.get("unknown parent state filter", "/v1/parents?state=broken")
        .param("state");
    c.get("unknown child state filter", "/v1/parents/V-ok/children?state=lost")
        .param("state");
    c.get("unknown include", "/v1/parents/V-ok?include=everything")
        .param("include");
    c.get("unknown query parameter", "/v1/parents?colour=red")
        .param("colour");
    c.get("resumable not a boolean", "/v1/parents?resumable=maybe")
        .param("resumable");

    // Numbers out of range.
    c.post("claim limit 0", "/v1/parents/V-ok/claims", json!({"limit": 0}))
        .field("limit");
    c.post(
        "claim limit above the maximum",
        "/v1/parents/V-ok/claims",
        json!({"limit": 51}),
    )
    .field("limit");
    c.post(
        "lease_seconds 0",
        "/v1/queues/events/claims",
        json!({"lease_seconds": 0}),
    )
    .field("lease_seconds");
    c.post(
        "lease_seconds above the maximum",
        "/v1/queues/events/claims",
        json!({"lease_seconds": 3601}),
    )
    .field("lease_seconds");
    c.post(
        "wait_seconds 21",
        "/v1/parents/V-ok/claims",
        json!({"wait_seconds": 21}),
    )
    .field("wait_seconds");
    c.post(
        "wait_seconds negative",
        "/v1/parents/V-ok/claims",
        json!({"wait_seconds": -1}),
    )
    .field("wait_seconds");
    c.put("max_attempts 0", "/v1/parents/V-new", json!({"max_attempts": 0}))
        .field("max_attempts");
    c.put("priority 101", "/v1/parents/V-new", json!({"priority": 101}))
        .field("priority");
    c.put("priority -101", "/v1/parents/V-new", json!({"priority": -101}))
        .field("priority");
    c.put("priority 1.5", "/v1/parents/V-new", json!({"priority": 1.5}))
        .field("priority");
    c.put("priority a string", "/v1/parents/V-new", json!({"priority": "high"}))
        .field("priority");
    c.post(
        "extend by 0 seconds",
        format!("/v1/claims/{uuid}/extend"),
        json!({"lease_seconds": 0}),
    )
    .field("lease_seconds");
    c.post(
        "release delay negative",
        format!("/v1/claims/{uuid}/release"),
        json!({"delay_seconds": -1}),
    )
    .field("delay_seconds");
    c.post(
        "append sequence negative",
        "/v1/parents/V-open/children",
        json!({"children": [{"sequence": -1}]}),
    )
    .field("children[0].sequence");
    c.post("seal total negative", "/v1/parents/V-open/seal", json!({"total": -1}))
        .field("total");
    c.post(
        "batch sequence negative",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"sequence": -1}))]}),
    )
    .field("outcomes[0].sequence");
    c.get("parents limit 0", "/v1/parents?limit=0").param("limit");
    c.get("parents limit 1001", "/v1/parents?limit=1001").param("limit");
    c.get("children limit 0", "/v1/parents/V-ok/children?limit=0")
        .param("limit");
    c.get("children after not a number", "/v1/parents/V-ok/children?after=abc")
        .param("after");

    // Ids and uuids in paths and bodies.
    c.put("parent_id with a space and '!'", "/v1/parents/bad%20id%21", json!({}))
        .param("parent_id");
    c.put(
        "parent_id of 201 chars",
        format!("/v1/parents/{}", "a".repeat(201)),
        json!({}),
    )
    .param("parent_id");
    c.get("parent_id with a slash encoded", "/v1/parents/a%2Fb")
        .param("parent_id");
    // `.` and `..` in a path: `dot_segments_are_not_parent_ids`.
    c.get("searching children of parent `..`", "/v1/children?parent_id=..")
        .param("parent_id");
    c.post(
        "queue in upper case in a claim path",
        "/v1/queues/UPPER/claims",
        json!({}),
    )
    .param("queue");
    c.post(
        "queue of 65 chars in a claim path",
        format!("/v1/queues/{}/claims", "q".repeat(65)),
        json!({}),
    )
    .param("queue");
    c.post(
        "claim_id not a uuid (extend)",
        "/v1/claims/not-a-uuid/extend",
        json!({}),
    )
    .param("claim_id");
    c.post(
        "claim_id not a uuid (release)",
        "/v1/claims/not-a-uuid/release",
        json!({}),
    )
    .param("claim_id");
    c.get("sequence not a number", "/v1/parents/V-ok/children/abc")
        .param("sequence");
    c.get("sequence negative", "/v1/parents/V-ok/children/-1")
        .param("sequence");
    c.post(
        "sequence not a number (outcome)",
        "/v1/parents/V-ok/children/abc/outcome",
        json!({"outcome": "processed"}),
    )
    .param("sequence");
    c.post(
        "sequence beyond i64 (retry)",
        "/v1/parents/V-ok/children/99999999999999999999/retry",
        json!({}),
    )
    .param("sequence");
    c.post(
        "batch parent_id invalid",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"parent_id": "bad id!"}))]}),
    )
    .field("outcomes[0].parent_id");
    c.post(
        "batch parent_id `..`",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"parent_id": ".."}))]}),
    )
    .field("outcomes[0].parent_id");
    c.put("queue in upper case", "/v1/parents/V-new", json!({"queue": "UPPER"}))
        .field("queue");
    c.get("queue filter invalid", "/v1/parents?queue=UPPER").param("queue");
    c.get("cursor this service never issued", "/v1/parents?cursor=garbage")
        .param("cursor");

    // Strings too long or empty.
    c.put(
        "queue of 65 chars",
        "/v1/parents/V-new",
        json!({"queue": "q".repeat(65)}),
    )
    .field("queue");
    c.put(
        "key of 201 chars",
        "/v1/parents/V-new",
        json!({"children": [{"key": "k".repeat(201)}]}),
    )
    .field("children[0].key");
    c.put("empty key", "/v1/parents/V-new", json!({"children": [{"key": ""}]}))
        .field("children[0].key");
    c.put(
        "skip reason of 1001 chars",
        "/v1/parents/V-new",
        json!({"children": [{"skip": "s".repeat(1001)}]}),
    )
    .field("children[0].skip");
    c.put(
        "empty skip reason",
        "/v1/parents/V-new",
        json!({"children": [{}, {"skip": ""}]}),
    )
    .field("children[1].skip");
    c.post(
        "outcome reason of 1001 chars",
        "/v1/parents/V-ok/children/0/outcome",
        json!({"outcome": "failed", "reason": "x".repeat(1001)}),
    )
    .field("reason");
    c.post(
        "worker label of 201 chars",
        "/v1/queues/events/claims",
        json!({"worker": "w".repeat(201)}),
    )
    .field("worker");

    // JSON that parses but that a store cannot keep or give back.
    c.raw(
        "a lone surrogate in a child payload",
        Method::PUT,
        "/v1/parents/V-new",
        "application/json",
        br#"{"children": [{"payload": {"s": "\ud800"}}]}"#,
    )
    .field("children[0].payload");
    c.raw(
        "a number beyond a double in an appended payload",
        Method::POST,
        "/v1/parents/V-open/children",
        "application/json",
        br#"{"children": [{"sequence": 1, "payload": [1e400]}]}"#,
    )
    .field("children[0].payload");

    // U+0000, which neither store can keep, anywhere in a string.
    c.raw(
        "U+0000 in a payload member name",
        Method::PUT,
        "/v1/parents/V-new",
        "application/json",
        br#"{"children": [{}, {"payload": {"a\u0000b": 1}}]}"#,
    )
    .field("children[1].payload.a\\u0000b");
    c.raw(
        "U+0000 in an outcome reason",
        Method::POST,
        "/v1/parents/V-ok/children/0/outcome",
        "application/json",
        br#"{"outcome": "failed", "reason": "bad\u0000"}"#,
    )
    .field("reason");

    // Duplicates within a request or against the ledger.
    c.put(
        "duplicate child keys",
        "/v1/parents/V-new",
        json!({"children": [{"key": "evt-1"}, {"key": "evt-1"}]}),
    )
    .expect(409, "duplicate-key");
    c.post(
        "append a key the ledger already has",
        "/v1/parents/V-open/children",
        json!({"children": [{"sequence": 1, "key": "k0"}]}),
    )
    .expect(409, "duplicate-key");
    c.post(
        "append one sequence twice with different content",
        "/v1/parents/V-open/children",
        json!({"children": [{"sequence": 1}, {"sequence": 1, "payload": 2}]}),
    )
    .expect(409, "children-conflict");
    c.get("cursor negative", "/v1/parents?cursor=-5").param("cursor");
    c.post(
        "release an empty list",
        format!("/v1/claims/{uuid}/release"),
        json!({"children": []}),
    )
    .field("children");

    // Counts and sizes beyond the configured limits.
    c.put(
        "21 children in one registration",
        "/v1/parents/V-new",
        json!({"children": children(21)}),
    )
    .field("children");
    let page: Vec<Value> = (1..22).map(|s| json!({"sequence": s})).collect();
    c.post(
        "21 children in one append",
        "/v1/parents/V-open/children",
        json!({"children": page}),
    )
    .field("children");
    c.post("empty append", "/v1/parents/V-open/children", json!({"children": []}))
        .field("children");
    let items: Vec<Value> = (0..11).map(|s| item(json!({"sequence": s}))).collect();
    c.post("11 outcomes in one batch", "/v1/outcomes", json!({"outcomes": items}))
        .field("outcomes");
    c.post("empty batch", "/v1/outcomes", json!({"outcomes": []}))
        .field("outcomes");
    c.put(
        "child payload over the byte limit",
        "/v1/parents/V-new",
        json!({"children": [{}, {"payload": {"blob": "b".repeat(300)}}]}),
    )
    .field("children[1].payload");
    c.put(
        "parent payload over the byte limit",
        "/v1/parents/V-new",
        json!({"payload": {"blob": "b".repeat(300)}}),
    )
    .field("payload");
    c.post(
        "outcome result over the byte limit",
        "/v1/parents/V-ok/children/0/outcome",
        json!({"outcome": "processed", "result": {"blob": "r".repeat(200)}}),
    )
    .field("result");
    c.post(
        "batch result over the byte limit",
        "/v1/outcomes",
        json!({"outcomes": [item(json!({"result": ["r".repeat(200)]}))]}),
    )
    .field("outcomes[0].result");
    c.raw(
        "body over the byte limit",
        Method::PUT,
        "/v1/parents/V-new",
        "application/json",
        &vec![b' '; 70 * 1024],
    )
    .expect(413, "body-too-large");

    // Routing.
    c.get("unknown route", "/v1/no-such-route")
        .expect(404, "route-not-found");
    c.get("unversioned path", "/parents/V-ok")
        .expect(404, "route-not-found");
    c.raw(
        "DELETE a parent not complete",
        Method::DELETE,
        "/v1/parents/V-ok",
        "",
        b"",
    )
    .expect(409, "parent-not-complete");
    c.raw("DELETE the parent list", Method::DELETE, "/v1/parents", "", b"")
        .expect(405, "method-not-allowed");
    c.raw(
        "PATCH the outcome batch",
        Method::PATCH,
        "/v1/outcomes",
        "application/json",
        b"{}",
    )
    .expect(405, "method-not-allowed");
    c.get("GET the outcome batch", "/v1/outcomes")
        .expect(405, "method-not-allowed");

    // Well-formed requests the ledger refuses.
    c.get("unknown parent", "/v1/parents/no-such-parent")
        .expect(404, "not-found");
    c.get("unknown child", "/v1/parents/V-ok/children/99")
        .expect(404, "not-found");
    c.post(
        "outcome for an unknown child",
        "/v1/parents/V-ok/children/99/outcome",
        json!({"outcome": "processed"}),
    )
    .expect(404, "not-found");
    c.post(
        "claim from an unknown parent",
        "/v1/parents/no-such-parent/claims",
        json!({}),
    )
    .expect(404, "not-found");
    c.post(
        "outcome while the parent is decomposing",
        "/v1/parents/V-open/children/0/outcome",
        json!({"outcome": "processed"}),
    )
    .expect(409, "parent-decomposing");
    c.post(
        "seal with a total the ledger lacks",
        "/v1/parents/V-open/seal",
        json!({"total": 3}),
    )
    .expect(409, "seal-mismatch");
    c.post(
        "append to a decomposed parent",
        "/v1/parents/V-ok/children",
        json!({"children": [{"sequence": 2}]}),
    )
    .expect(409, "parent-decomposed");
    c.put(
        "register again with other content",
        "/v1/parents/V-ok",
        json!({"queue": "events", "children": children(3)}),
    )
    .expect(409, "registration-conflict");

    c.0
}

async fn rejects_bad_requests(backend: Backend) {
    let app = spawn_app_with(backend, tight_limits()).await;

    // A decomposed parent and a decomposing one to aim the requests at.
    let r = app
        .put("/v1/parents/V-ok", json!({"queue": "events", "children": children(2)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = app
        .put("/v1/parents/V-open", json!({"queue": "events", "decomposed": false}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = app
        .post(
            "/v1/parents/V-open/children",
            json!({"children": [{"sequence": 0, "key": "k0"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let ledger = "SELECT count(*) FROM child_status WHERE state = 'pending' AND attempts = 0 AND terminal_at IS NULL";
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 2);
    assert_eq!(app.count(ledger).await, 3);

    let cases = catalogue();
    assert!(cases.len() >= 50, "the catalogue holds {} cases", cases.len());
    for case in &cases {
        let r = app
            .raw(case.method.clone(), &case.path, case.content_type, case.body.clone())
            .await;
        assert_problem(case.name, &r, case.status, case.kind, case.field);
    }
    eprintln!("{backend:?}: {} bad requests rejected with problem+json", cases.len());

    // Nothing above wrote anything: no parent, child, claim, outcome or conflict.
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM child").await, 3);
    assert_eq!(app.count(ledger).await, 3);
    assert_eq!(
        app.count("SELECT count(*) FROM child_status WHERE claim_id IS NOT NULL OR conflicts IS NOT NULL")
            .await,
        0
    );
    let parent = app.get("/v1/parents/V-ok").await.body;
    assert_eq!(parent["counts"]["pending"], 2, "{parent}");
    assert_eq!(parent["counts"]["processed"], 0, "{parent}");
    let parent = app.get("/v1/parents/V-open").await.body;
    assert_eq!(parent["state"], "decomposing", "{parent}");
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
        422,
        "invalid-field",
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
    assert_problem("11 children in one append", &r, 422, "invalid-field", Some("children"));

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
    assert_problem("body over --max-body-bytes", &r, 413, "body-too-large", None);
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
        .await;
    // The server answers 413 as soon as the limit is crossed and stops reading;
    // a client still uploading may see the connection cut before it reads that
    // answer. Either way the body was refused and nothing was written.
    match streamed {
        Ok(response) => assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE),
        Err(err) => assert!(err.is_request() || err.is_body(), "{err:?}"),
    }
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 0);
}

/// A child named twice in one request is a retry, not an error: an append
/// writes it once, a batch records it once and answers the repeat as it would
/// answer the same write sent afterwards.
async fn repeats_within_one_request_are_retries(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app.put("/v1/parents/R-open", json!({"decomposed": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let page = json!({"children": [
        {"sequence": 0, "payload": {"a": 1}},
        {"sequence": 1, "payload": {"b": 2}},
        {"sequence": 0, "payload": { "a" : 1 }},
    ]});
    let r = app.post("/v1/parents/R-open/children", page).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(app.count("SELECT count(*) FROM child").await, 2);
    let r = app.post("/v1/parents/R-open/seal", json!({"total": 2})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");

    let item =
        |seq: i64, outcome: &str| json!({"parent_id": "R-open", "sequence": seq, "outcome": outcome, "reason": "r"});
    let batch = json!({"outcomes": [item(0, "processed"), item(0, "processed"), item(1, "failed"), item(0, "skipped"), item(1, "failed")]});
    let r = app.post("/v1/outcomes", batch).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let statuses: Vec<&str> = r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["applied", "duplicate", "applied", "conflict", "duplicate"]);
    let child = app.get("/v1/parents/R-open/children/0").await.body;
    assert_eq!(child["state"], "processed", "{child}");
    assert_eq!(child["conflicts"].as_array().map(Vec::len), Some(1), "{child}");
    assert_eq!(child["conflicts"][0]["outcome"], "skipped", "{child}");
    let parent = app.get("/v1/parents/R-open").await.body;
    assert_eq!(parent["counts"]["processed"], 1, "{parent}");
    assert_eq!(parent["counts"]["failed"], 1, "{parent}");

    // Integers written as JSON Schema allows (`2.0`) are integers.
    let r = app
        .post(
            "/v1/parents/R-open/claims",
            json!({"limit": 2.0, "lease_seconds": 30.0}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

/// `.` and `..` are path segments a URL normaliser removes (so a client
/// could never name such a parent reliably): sent as they are, or encoded,
/// over a raw connection (an HTTP client would normalise them away), they
/// are refused naming `parent_id`, and nothing is registered.
async fn dot_segments_are_not_parent_ids(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app(backend).await;
    let address = app.base.trim_start_matches("http://").to_owned();
    let register = r#"{"children": [{"payload": 1}]}"#;
    for (method, path, body) in [
        ("PUT", "/v1/parents/.", register),
        ("PUT", "/v1/parents/..", register),
        ("PUT", "/v1/parents/%2E", register),
        ("PUT", "/v1/parents/%2e%2E", register),
        ("GET", "/v1/parents/%2E%2E", ""),
        ("POST", "/v1/parents/./claims", "{}"),
        ("POST", "/v1/parents/%2E/seal", r#"{"total": 1}"#),
    ] {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 400"), "{method} {path}: {answer}");
        assert!(head.contains("application/problem+json"), "{method} {path}: {answer}");
        let problem: Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["field"], "parent_id", "{method} {path}: {problem}");
    }
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 0);
}

/// Sends `method path` over a raw connection (an HTTP client would normalise
/// dot segments away) and returns the status line's code and the body.
async fn raw_request(app: &TestApp, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = app.base.trim_start_matches("http://").to_owned();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, body.to_owned())
}

/// Queue names and flow keys made only of dots, or holding `/`, are a path
/// a normalising client or proxy rewrites (`/keys/../limits` becomes the
/// queue's `/limits`): nothing may create one. Each is a 422 naming the
/// field, in a body or a path, and writes nothing. A key made only of dots
/// written before names were checked stays readable and deletable, its dots
/// percent-encoded.
async fn names_that_traverse_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    for (field, body) in [
        ("queue", json!({"queue": "..", "children": [{"payload": 1}]})),
        ("queue", json!({"queue": ".", "children": [{"payload": 1}]})),
        ("queue", json!({"queue": "...", "children": [{"payload": 1}]})),
        (
            "flow_key",
            json!({"queue": "lim", "flow_key": "..", "children": [{"payload": 1}]}),
        ),
        (
            "flow_key",
            json!({"queue": "lim", "flow_key": ".", "children": [{"payload": 1}]}),
        ),
        (
            "flow_key",
            json!({"queue": "lim", "flow_key": "a/b", "children": [{"payload": 1}]}),
        ),
        ("queue", json!({"queue": "a/b", "children": [{"payload": 1}]})),
    ] {
        let r = app.put("/v1/parents/traverse", body.clone()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {r:?}");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 0);

    let r = app.put("/v1/queues/lim/limits", json!({"max_in_flight": 100})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    for (path, field) in [
        ("/v1/queues/lim/keys/%2E%2E/limits", "flow_key"),
        ("/v1/queues/lim/keys/%2e/limits", "flow_key"),
        ("/v1/queues/lim/keys/a%2Fb/limits", "flow_key"),
        ("/v1/queues/%2E%2E/limits", "queue"),
        ("/v1/queues/a%2Fb/limits", "queue"),
    ] {
        let (code, body) = raw_request(&app, "PUT", path, r#"{"max_in_flight": 1}"#).await;
        assert_eq!(code, 422, "PUT {path}: {body}");
        let problem: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(problem["field"], field, "PUT {path}: {problem}");
    }
    let r = app.get("/v1/queues/lim/limits").await;
    assert_eq!(r.body["max_in_flight"], 100, "the queue's limit moved: {r:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM flow_limit WHERE flow_key <> ''").await,
        0,
        "a key was written"
    );

    // A key made only of dots from before: readable and deletable, encoded.
    app.exec(
        "INSERT INTO flow_limit (queue, flow_key, max_in_flight, per_second, burst, overridden) \
         VALUES ('lim', '..', 3, NULL, NULL, true)",
    )
    .await;
    let (code, body) = raw_request(&app, "GET", "/v1/queues/lim/keys/%2E%2E/limits", "").await;
    assert_eq!(code, 200, "{body}");
    let limits: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(limits["max_in_flight"], 3, "{limits}");
    let (code, body) = raw_request(&app, "DELETE", "/v1/queues/lim/keys/%2E%2E/limits", "").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        app.count("SELECT count(*) FROM flow_limit WHERE flow_key = '..' AND overridden")
            .await,
        0
    );
    let r = app.get("/v1/queues/lim/limits").await;
    assert_eq!(r.body["max_in_flight"], 100, "{r:?}");
}

both_stores!(
    names_that_traverse_are_refused,
    dot_segments_are_not_parent_ids,
    repeats_within_one_request_are_retries,
    rejects_bad_requests,
    rejects_too_many_children,
    rejects_oversized_bodies
);
