//! Parents that are decomposed after registration: append pages of children,
//! then seal. Also idempotent re-registration.

mod common;

use std::ops::Range;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const PARENT: &str = "L-legacy";

fn page(sequences: Range<u64>) -> Value {
    let children: Vec<Value> = sequences.map(|s| json!({"sequence": s, "payload": {"n": s}})).collect();
    json!({ "children": children })
}

async fn append(app: &TestApp, body: Value) -> Reply {
    app.post(&format!("/v1/parents/{PARENT}/children"), body).await
}

async fn seal(app: &TestApp, total: u64) -> Reply {
    app.post(&format!("/v1/parents/{PARENT}/seal"), json!({ "total": total }))
        .await
}

async fn claim(app: &TestApp, path: &str, limit: u64) -> Value {
    let r = app.post(path, json!({"limit": limit, "lease_seconds": 300})).await;
    assert_eq!(r.status, StatusCode::OK, "claim {path}: {r:?}");
    r.body
}

/// Sequences of every child currently in the ledger, via the list endpoint.
async fn listed_sequences(app: &TestApp) -> Vec<u64> {
    let r = app.get(&format!("/v1/parents/{PARENT}/children?limit=1000")).await;
    assert_eq!(r.status, StatusCode::OK, "list children: {r:?}");
    assert!(r.body["next_after"].is_null(), "{r:?}");
    r.body["children"]
        .as_array()
        .expect("children array")
        .iter()
        .map(|c| c["sequence"].as_u64().expect("sequence"))
        .collect()
}

#[track_caller]
fn assert_problem(r: &Reply, status: StatusCode) {
    assert_eq!(r.status, status, "{r:?}");
    assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
    assert_eq!(r.body["status"], status.as_u16(), "{r:?}");
}

/// Whether `body` names sequence `n`: as a number in one of its lists, or as a
/// word of its `detail`.
fn names_sequence(body: &Value, n: u64) -> bool {
    fn in_lists(v: &Value, n: u64) -> bool {
        match v {
            Value::Array(items) => items.iter().any(|i| i.as_u64() == Some(n) || in_lists(i, n)),
            Value::Object(fields) => fields.values().any(|f| in_lists(f, n)),
            _ => false,
        }
    }
    let word = n.to_string();
    in_lists(body, n)
        || body["detail"]
            .as_str()
            .is_some_and(|d| d.split(|c: char| !c.is_ascii_digit()).any(|w| w == word))
}

async fn legacy_append_and_seal(backend: Backend) {
    let app = spawn_app(backend).await;
    let payload = json!({"response": "s3://bucket/events-2024-01-01.json", "events": 100});

    let r = app
        .put(
            &format!("/v1/parents/{PARENT}"),
            json!({"queue": "legacy", "decomposed": false, "payload": payload}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["state"], "decomposing", "{r:?}");
    assert_eq!(r.body["complete"], false, "{r:?}");
    assert!(r.body["decomposed_at"].is_null(), "{r:?}");

    let r = app.get(&format!("/v1/parents/{PARENT}?include=payload")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["payload"], payload, "the retained payload comes back");
    assert_eq!(r.body["state"], "decomposing");

    // Nothing is claimable before the parent is decomposed.
    let claimed = claim(&app, &format!("/v1/parents/{PARENT}/claims"), 100).await;
    assert_eq!(claimed["children"], json!([]), "{claimed}");
    let claimed = claim(&app, "/v1/queues/legacy/claims", 100).await;
    assert_eq!(claimed["children"], json!([]), "{claimed}");

    // Appending is idempotent per sequence.
    let r = append(&app, page(0..50)).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["inserted"], 50, "{r:?}");
    assert_eq!(r.body["existing"], 0, "{r:?}");

    let r = append(&app, page(0..50)).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["inserted"], 0, "{r:?}");
    assert_eq!(r.body["existing"], 50, "{r:?}");

    // Different content for an existing sequence is refused, and the whole
    // request with it: the new sequences 50..54 are not inserted either.
    let mut overlapping = page(45..55);
    overlapping["children"][3]["payload"] = json!({"n": "changed"});
    assert_eq!(overlapping["children"][3]["sequence"], 48);
    let r = append(&app, overlapping).await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert_eq!(listed_sequences(&app).await, (0..50).collect::<Vec<_>>());
    assert_eq!(app.count("SELECT count(*) FROM child").await, 50);
    let r = app.get(&format!("/v1/parents/{PARENT}/children/48")).await;
    assert_eq!(
        r.body["payload"],
        json!({"n": 48}),
        "stored content is unchanged: {r:?}"
    );

    let r = append(&app, page(50..100)).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["inserted"], 50, "{r:?}");
    assert_eq!(r.body["existing"], 0, "{r:?}");

    // Outcomes wait for the seal.
    let r = app
        .post(
            &format!("/v1/parents/{PARENT}/children/0/outcome"),
            json!({"outcome": "processed"}),
        )
        .await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert_eq!(
        app.get(&format!("/v1/parents/{PARENT}/children/0")).await.body["state"],
        "pending"
    );

    // A seal must match the ledger exactly.
    let r = seal(&app, 101).await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert!(names_sequence(&r.body, 100), "names missing sequence 100: {r:?}");
    // The lists, read from their own fields: 0..99 are stored, so a seal at
    // 101 misses exactly 100 and has nothing extra.
    assert_eq!(r.body["missing"], json!([100]), "{r:?}");
    assert_eq!(r.body["extra"], json!([]), "{r:?}");

    let r = seal(&app, 99).await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert!(names_sequence(&r.body, 99), "names extra sequence 99: {r:?}");
    assert_eq!(r.body["missing"], json!([]), "{r:?}");
    assert_eq!(r.body["extra"], json!([99]), "{r:?}");

    let r = app.get(&format!("/v1/parents/{PARENT}")).await;
    assert_eq!(r.body["state"], "decomposing", "failed seals change nothing: {r:?}");

    let r = seal(&app, 100).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["state"], "active", "{r:?}");
    assert_eq!(r.body["counts"]["total"], 100, "{r:?}");
    assert_eq!(r.body["counts"]["pending"], 100, "{r:?}");
    assert!(r.body["decomposed_at"].is_string(), "{r:?}");

    let r = seal(&app, 100).await;
    assert_eq!(r.status, StatusCode::OK, "repeating a successful seal: {r:?}");
    assert_eq!(r.body["state"], "active", "{r:?}");
    assert_eq!(r.body["counts"]["total"], 100, "{r:?}");

    // Once decomposed, the ledger is the only source of truth.
    let r = append(&app, page(100..101)).await;
    assert_problem(&r, StatusCode::CONFLICT);
    assert_eq!(app.count("SELECT count(*) FROM child").await, 100);

    let claimed = claim(&app, &format!("/v1/parents/{PARENT}/claims"), 10).await;
    let children = claimed["children"].as_array().expect("children");
    let seqs: Vec<u64> = children.iter().map(|c| c["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..10).collect::<Vec<_>>(), "{claimed}");
    for child in children {
        assert_eq!(child["payload"], json!({"n": child["sequence"]}), "{child}");
        assert_eq!(child["attempt"], 1, "{child}");
    }
}

async fn repeated_registration(backend: Backend) {
    let app = spawn_app(backend).await;
    let body = json!({"queue": "events", "payload": {"batch": 7}, "children": children(3), "max_attempts": 3});

    let first = app.put("/v1/parents/R-1", body.clone()).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.body["counts"]["total"], 3);

    let again = app.put("/v1/parents/R-1", body.clone()).await;
    assert_eq!(again.status, StatusCode::OK, "the same registration again: {again:?}");
    assert_eq!(again.body["parent_id"], "R-1");
    assert_eq!(again.body["counts"], first.body["counts"]);
    assert_eq!(again.body["created_at"], first.body["created_at"]);

    let mut more_children = body.clone();
    more_children["children"] = json!(children(4));
    let mut other_queue = body.clone();
    other_queue["queue"] = json!("other");
    let mut other_child = body.clone();
    other_child["children"][1]["payload"] = json!({"n": "changed"});
    let mut other_settings = body.clone();
    other_settings["max_attempts"] = json!(4);
    for different in [more_children, other_queue, other_child, other_settings] {
        let r = app.put("/v1/parents/R-1", different.clone()).await;
        assert_problem(&r, StatusCode::CONFLICT);
        assert!(r.body["type"].is_string() && r.body["detail"].is_string(), "{r:?}");
    }

    let r = app.get("/v1/parents/R-1").await;
    assert_eq!(r.body["queue"], "events", "{r:?}");
    assert_eq!(r.body["counts"]["total"], 3, "{r:?}");
    assert_eq!(r.body["max_attempts"], 3, "{r:?}");
    assert_eq!(app.count("SELECT count(*) FROM child").await, 3);
    assert_eq!(app.count("SELECT count(*) FROM parent").await, 1);
}

async fn append_with_keys_and_skips(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/K-1", json!({"decomposed": false, "queue": "keys"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let keyed = json!({"children": [
        {"sequence": 0, "key": "evt-0", "payload": {"n": 0}},
        {"sequence": 1, "key": "evt-1", "payload": {"n": 1}, "skip": "bad timestamp"},
        {"sequence": 2, "payload": {"n": 2}},
    ]});
    let r = app.post("/v1/parents/K-1/children", keyed.clone()).await;
    assert_eq!(r.body, json!({"inserted": 3, "existing": 0}), "{r:?}");
    // The same page again, keys and all, is a no-op.
    let r = app.post("/v1/parents/K-1/children", keyed).await;
    assert_eq!(r.body, json!({"inserted": 0, "existing": 3}), "{r:?}");
    // A key another sequence already uses is a conflict; nothing of the page is written.
    let r = app
        .post(
            "/v1/parents/K-1/children",
            json!({"children": [{"sequence": 3, "payload": {}}, {"sequence": 4, "key": "evt-0", "payload": {}}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(r.body["type"].as_str().unwrap().ends_with("duplicate-key"), "{r:?}");
    // A skip reason that differs is different content.
    let r = app
        .post(
            "/v1/parents/K-1/children",
            json!({"children": [{"sequence": 1, "key": "evt-1", "payload": {"n": 1}, "skip": "other reason"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(r.body["sequences"], json!([1]), "{r:?}");
    assert_eq!(app.count("SELECT count(*) FROM child").await, 3);

    let parent = app.get("/v1/parents/K-1").await.body;
    assert_eq!(parent["counts"]["total"], 3, "{parent}");
    assert_eq!(parent["counts"]["skipped"], 1, "{parent}");
    let sealed = app.post("/v1/parents/K-1/seal", json!({"total": 3})).await;
    assert_eq!(sealed.status, StatusCode::OK, "{sealed:?}");
    assert_eq!(sealed.body["counts"]["skipped"], 1, "{sealed:?}");
    assert_eq!(sealed.body["counts"]["pending"], 2, "{sealed:?}");
    let skipped = app.get("/v1/parents/K-1/children/1").await.body;
    assert_eq!(skipped["state"], "skipped", "{skipped}");
    assert_eq!(skipped["outcome"], "skipped", "{skipped}");
    assert_eq!(skipped["reason"], "bad timestamp", "{skipped}");
}

/// A seal mismatch names exactly the sequences missing below the total and
/// the ones stored at or past it, in their own fields.
async fn seal_mismatch_names_gaps_and_extras(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app.put("/v1/parents/G-1", json!({"decomposed": false})).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let stored: Vec<Value> = [0, 1, 5, 9]
        .map(|s| json!({"sequence": s, "payload": {"n": s}}))
        .to_vec();
    let stored = json!({ "children": stored });
    assert_eq!(
        app.post("/v1/parents/G-1/children", stored).await.status,
        StatusCode::OK
    );
    for (total, missing, extra) in [
        (7, json!([2, 3, 4, 6]), json!([9])),
        (3, json!([2]), json!([5, 9])),
        (12, json!([2, 3, 4, 6, 7, 8, 10, 11]), json!([])),
        (0, json!([]), json!([0, 1, 5, 9])),
    ] {
        let r = app.post("/v1/parents/G-1/seal", json!({"total": total})).await;
        assert_problem(&r, StatusCode::CONFLICT);
        assert_eq!(r.body["missing"], missing, "seal at {total}: {r:?}");
        assert_eq!(r.body["extra"], extra, "seal at {total}: {r:?}");
    }
    assert_eq!(app.get("/v1/parents/G-1").await.body["state"], "decomposing");
}

both_stores!(
    legacy_append_and_seal,
    seal_mismatch_names_gaps_and_extras,
    repeated_registration,
    append_with_keys_and_skips
);
