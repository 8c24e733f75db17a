//! Leases: expiry, extension, release, fencing by claim id, attempt limits and
//! the `hold` policy. Leases are whole seconds, so tests use 1 s leases and wait
//! a little over 2 s for them to run out.

mod common;

use std::time::Duration;

use chrono::{DateTime, FixedOffset};
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Comfortably past a 1 s lease.
const PAST_LEASE: Duration = Duration::from_millis(2200);
/// A lease that runs out within a test, in seconds; `PAST_SHORT_LEASE` outlives it.
const SHORT_LEASE: u64 = 3;
const PAST_SHORT_LEASE: Duration = Duration::from_millis(3500);

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn claim(app: &TestApp, parent: &str, limit: u64, lease_seconds: u64, worker: &str) -> Value {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": worker}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim {parent}: {r:?}");
    assert!(r.body["children"].is_array(), "{r:?}");
    r.body
}

fn claim_id(claim: &Value) -> &str {
    claim["claim_id"].as_str().expect("claim_id")
}

fn sequences(claim: &Value) -> Vec<u64> {
    claim["children"]
        .as_array()
        .expect("children array")
        .iter()
        .map(|c| c["sequence"].as_u64().expect("sequence"))
        .collect()
}

async fn get_child(app: &TestApp, parent: &str, seq: u64) -> Value {
    let r = app.get(&format!("/v1/parents/{parent}/children/{seq}")).await;
    assert_eq!(r.status, StatusCode::OK, "GET child {parent}/{seq}: {r:?}");
    r.body
}

async fn get_parent(app: &TestApp, parent: &str) -> Value {
    let r = app.get(&format!("/v1/parents/{parent}")).await;
    assert_eq!(r.status, StatusCode::OK, "GET {parent}: {r:?}");
    r.body
}

/// Expired leases may be resolved by a background sweep, so poll (up to ~5 s).
async fn wait_for_child_state(app: &TestApp, parent: &str, seq: u64, state: &str) -> Value {
    let mut child = Value::Null;
    for _ in 0..25 {
        child = get_child(app, parent, seq).await;
        if child["state"] == state {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{parent}/{seq} never became {state}: {child}");
}

fn timestamp(v: &Value) -> DateTime<FixedOffset> {
    DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("not a timestamp: {v}")))
        .unwrap_or_else(|e| panic!("not RFC 3339 ({e}): {v}"))
}

async fn extend(app: &TestApp, claim_id: &str, lease_seconds: u64) -> Value {
    let r = app
        .post(
            &format!("/v1/claims/{claim_id}/extend"),
            json!({ "lease_seconds": lease_seconds }),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "extend: {r:?}");
    r.body
}

async fn release(app: &TestApp, claim_id: &str, body: Value) -> Value {
    let r = app.post(&format!("/v1/claims/{claim_id}/release"), body).await;
    assert_eq!(r.status, StatusCode::OK, "release: {r:?}");
    r.body
}

/// Claims start where the last claim of the parent did; a lower child that is
/// pending again (released here, or through another replica) still goes out
/// first.
async fn lower_child_pending_again_comes_first(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "F", json!({"children": children(300)})).await;
    let first = claim(&app, "F", 100, 300, "w").await;
    assert_eq!(sequences(&first), (0..100).collect::<Vec<_>>());
    let second = claim(&app, "F", 100, 300, "w").await;
    assert_eq!(sequences(&second), (100..200).collect::<Vec<_>>());

    // Released through this service.
    let first_id = first["claim_id"].as_str().unwrap();
    release(&app, first_id, json!({"children": [{"parent_id": "F", "sequence": 5}]})).await;
    let third = claim(&app, "F", 1, 300, "w").await;
    assert_eq!(sequences(&third), [5]);

    // Released through another replica: the floor is the ledger's, not a
    // process's, so this service's next claim starts at 7 too.
    let replica = app.replica().await;
    release(
        &replica,
        first_id,
        json!({"children": [{"parent_id": "F", "sequence": 7}]}),
    )
    .await;
    let fourth = claim(&app, "F", 100, 300, "w").await;
    let mut expected = vec![7];
    expected.extend(200..299);
    assert_eq!(sequences(&fourth), expected);
    assert_eq!(sequences(&claim(&app, "F", 100, 300, "w").await), [299]);
    assert!(
        claim(&app, "F", 100, 300, "w").await["children"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

async fn lease_expiry_hands_child_out_again(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P", json!({"children": children(1)})).await;

    let first = claim(&app, "P", 10, 300, "worker-a").await;
    assert_eq!(sequences(&first), [0]);
    let child = &first["children"][0];
    assert_eq!(child["attempt"], 1, "{first}");
    assert!(child["previous_attempt"].is_null(), "{first}");
    assert_eq!(child["idempotency_key"], "P/0", "{first}");

    // Under a live lease nobody else gets it.
    assert!(sequences(&claim(&app, "P", 10, 300, "worker-b").await).is_empty());

    // The lease runs out (driven by the test, not by a sleep).
    app.expire_claim(claim_id(&first)).await;

    let second = claim(&app, "P", 10, 300, "worker-b").await;
    assert_eq!(sequences(&second), [0], "{second}");
    let child = &second["children"][0];
    assert_eq!(child["attempt"], 2, "{second}");
    assert_eq!(child["previous_attempt"], "expired", "{second}");
    assert_eq!(child["idempotency_key"], "P/0", "stable across attempts: {second}");
    assert_eq!(child["payload"], json!({"n": 0}));
    assert_ne!(claim_id(&second), claim_id(&first), "each claim call has its own id");

    let stored = get_child(&app, "P", 0).await;
    assert_eq!(stored["state"], "in_flight", "{stored}");
    assert_eq!(stored["attempts"], 2, "{stored}");
    assert_eq!(stored["claim_id"], claim_id(&second), "{stored}");
    assert_eq!(stored["claimed_by"], "worker-b", "{stored}");
}

async fn extend_keeps_the_lease(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-ext", json!({"children": children(2)})).await;

    // A 3-second lease, extended at once: the extension is the next request,
    // far inside the lease even on a loaded machine.
    let claimed = claim(&app, "P-ext", 10, SHORT_LEASE, "worker-a").await;
    assert_eq!(sequences(&claimed), [0, 1]);
    let first_expiry = timestamp(&claimed["lease_expires_at"]);

    let extended = extend(&app, claim_id(&claimed), 60).await;
    assert_eq!(extended["extended"], 2, "{extended}");
    let new_expiry = timestamp(&extended["lease_expires_at"]);
    assert!(new_expiry > first_expiry, "{new_expiry} is not after {first_expiry}");

    tokio::time::sleep(PAST_SHORT_LEASE).await;

    let other = claim(&app, "P-ext", 10, 300, "worker-b").await;
    assert!(
        sequences(&other).is_empty(),
        "extended children are still leased: {other}"
    );
    for seq in [0, 1] {
        let child = get_child(&app, "P-ext", seq).await;
        assert_eq!(child["state"], "in_flight", "{child}");
        assert_eq!(child["claim_id"], claim_id(&claimed), "{child}");
        assert_eq!(child["attempts"], 1, "{child}");
    }
}

async fn release_returns_children(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-rel", json!({"children": children(3)})).await;

    let a = claim(&app, "P-rel", 10, 300, "worker-a").await;
    assert_eq!(sequences(&a), [0, 1, 2]);

    let released = release(
        &app,
        claim_id(&a),
        json!({"children": [{"parent_id": "P-rel", "sequence": 1}]}),
    )
    .await;
    assert_eq!(released["released"], 1, "{released}");

    let b = claim(&app, "P-rel", 10, 300, "worker-b").await;
    assert_eq!(sequences(&b), [1], "only the released child is claimable: {b}");
    assert_eq!(b["children"][0]["attempt"], 2, "{b}");
    assert_eq!(b["children"][0]["previous_attempt"], "released", "{b}");

    // Releasing everything only touches what this claim still holds.
    let released = release(&app, claim_id(&a), json!({})).await;
    assert_eq!(released["released"], 2, "{released}");

    let c = claim(&app, "P-rel", 10, 300, "worker-c").await;
    assert_eq!(sequences(&c), [0, 2], "{c}");
    for child in c["children"].as_array().unwrap() {
        assert_eq!(child["attempt"], 2, "{child}");
        assert_eq!(child["previous_attempt"], "released", "{child}");
    }
    assert_eq!(get_child(&app, "P-rel", 1).await["claim_id"], claim_id(&b));

    // A delayed release is pending but not claimable yet.
    let released = release(&app, claim_id(&c), json!({"delay_seconds": 3})).await;
    assert_eq!(released["released"], 2, "{released}");
    let d = claim(&app, "P-rel", 10, 300, "worker-d").await;
    assert!(sequences(&d).is_empty(), "delayed children are not claimable yet: {d}");

    let parent = get_parent(&app, "P-rel").await;
    assert_eq!(parent["counts"]["pending"], 2, "{parent}");
    assert_eq!(parent["counts"]["in_flight"], 1, "{parent}");
    assert_eq!(get_child(&app, "P-rel", 0).await["state"], "pending");
}

async fn stale_claim_is_fenced(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-fence", json!({"children": children(1)})).await;

    let a = claim(&app, "P-fence", 10, 1, "worker-a").await;
    assert_eq!(sequences(&a), [0]);
    tokio::time::sleep(PAST_LEASE).await;
    let b = claim(&app, "P-fence", 10, 300, "worker-b").await;
    assert_eq!(sequences(&b), [0], "{b}");

    // A's claim id no longer holds anything.
    let extended = extend(&app, claim_id(&a), 300).await;
    assert_eq!(extended["extended"], 0, "{extended}");
    let released = release(&app, claim_id(&a), json!({})).await;
    assert_eq!(released["released"], 0, "{released}");
    let released = release(
        &app,
        claim_id(&a),
        json!({"children": [{"parent_id": "P-fence", "sequence": 0}]}),
    )
    .await;
    assert_eq!(released["released"], 0, "{released}");

    let child = get_child(&app, "P-fence", 0).await;
    assert_eq!(child["state"], "in_flight", "{child}");
    assert_eq!(child["claim_id"], claim_id(&b), "{child}");
    assert_eq!(child["claimed_by"], "worker-b", "{child}");
    assert_eq!(child["attempts"], 2, "{child}");
    assert!(sequences(&claim(&app, "P-fence", 10, 300, "worker-c").await).is_empty());
}

/// The holder whose lease ran out may still finish first: its write wins
/// (first writer wins), credited to its own attempt, below `attempts`, so the
/// late win stays visible; the current holder's write is the logged conflict.
async fn late_win_by_an_expired_holder_stays_visible(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-late", json!({"children": children(1)})).await;
    let a = claim(&app, "P-late", 10, 1, "worker-a").await;
    tokio::time::sleep(PAST_LEASE).await;
    let b = claim(&app, "P-late", 10, 300, "worker-b").await;
    assert_eq!(b["children"][0]["attempt"], 2, "{b}");

    let r = app
        .post(
            "/v1/parents/P-late/children/0/outcome",
            json!({"outcome": "processed", "result": {"by": "a"}, "claim_id": claim_id(&a)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["applied"], true, "{r:?}");
    let child = &r.body["child"];
    assert_eq!(child["attempts"], 2, "{child}");
    assert_eq!(
        child["outcome_attempt"], 1,
        "the late win is credited to attempt 1: {child}"
    );

    let r = app
        .post(
            "/v1/parents/P-late/children/0/outcome",
            json!({"outcome": "failed", "reason": "b disagrees", "claim_id": claim_id(&b)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    let child = get_child(&app, "P-late", 0).await;
    assert_eq!(child["outcome"], "processed", "{child}");
    assert_eq!(child["conflicts"][0]["attempt"], 2, "{child}");
    assert_eq!(child["conflicts"][0]["claim_id"], claim_id(&b), "{child}");
}

async fn attempts_run_out(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-max", json!({"children": children(1), "max_attempts": 2})).await;
    assert_eq!(get_parent(&app, "P-max").await["max_attempts"], 2);

    let first = claim(&app, "P-max", 10, 1, "worker-a").await;
    assert_eq!(first["children"][0]["attempt"], 1, "{first}");
    tokio::time::sleep(PAST_LEASE).await;

    let second = claim(&app, "P-max", 10, 1, "worker-b").await;
    assert_eq!(sequences(&second), [0], "{second}");
    assert_eq!(second["children"][0]["attempt"], 2, "{second}");
    assert_eq!(second["children"][0]["previous_attempt"], "expired", "{second}");
    tokio::time::sleep(PAST_LEASE).await;

    let third = claim(&app, "P-max", 10, 300, "worker-c").await;
    assert!(sequences(&third).is_empty(), "two attempts were all it had: {third}");

    let child = wait_for_child_state(&app, "P-max", 0, "failed").await;
    assert_eq!(child["reason"], "attempts exhausted", "{child}");
    assert_eq!(child["outcome"], "failed", "{child}");
    assert_eq!(child["attempts"], 2, "{child}");

    let parent = get_parent(&app, "P-max").await;
    assert_eq!(parent["counts"]["failed"], 1, "{parent}");
    assert_eq!(parent["counts"]["pending"], 0, "{parent}");
    assert_eq!(parent["counts"]["in_flight"], 0, "{parent}");
    assert_eq!(parent["complete"], true, "{parent}");
    assert_eq!(parent["state"], "complete", "{parent}");

    // The expiry counted why, beside the rows, and reconcile agrees.
    let summary = app.get("/v1/parents/P-max/summary").await.body;
    assert_eq!(
        summary["reasons"],
        json!([{"state": "failed", "reason": "attempts exhausted", "count": 1}]),
        "{summary}"
    );
    let r = app.post("/v1/parents/P-max/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["changes"], json!([]), "{r:?}");
}

async fn hold_policy_waits_for_a_decision(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "P-hold",
        json!({"children": children(1), "expired_lease": "hold"}),
    )
    .await;
    assert_eq!(get_parent(&app, "P-hold").await["expired_lease"], "hold");

    let first = claim(&app, "P-hold", 10, 1, "worker-a").await;
    assert_eq!(sequences(&first), [0]);
    tokio::time::sleep(PAST_LEASE).await;

    let again = claim(&app, "P-hold", 10, 300, "worker-b").await;
    assert!(sequences(&again).is_empty(), "a held child is not handed out: {again}");

    wait_for_child_state(&app, "P-hold", 0, "held").await;
    let parent = get_parent(&app, "P-hold").await;
    assert_eq!(parent["counts"]["held"], 1, "{parent}");
    assert_eq!(parent["counts"]["pending"], 0, "{parent}");
    assert_eq!(parent["counts"]["in_flight"], 0, "{parent}");
    assert_eq!(parent["complete"], false, "{parent}");
    assert_eq!(parent["state"], "active", "{parent}");

    let r = app.post("/v1/parents/P-hold/children/0/retry", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "retry a held child: {r:?}");
    assert_eq!(get_child(&app, "P-hold", 0).await["state"], "pending");

    let resumed = claim(&app, "P-hold", 10, 300, "worker-b").await;
    assert_eq!(sequences(&resumed), [0], "{resumed}");
    assert_eq!(resumed["children"][0]["attempt"], 2, "{resumed}");

    let r = app
        .post(
            "/v1/parents/P-hold/children/0/outcome",
            json!({"outcome": "processed", "claim_id": claim_id(&resumed)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["applied"], true, "{r:?}");

    // Terminal is one-way.
    let r = app.post("/v1/parents/P-hold/children/0/retry", json!({})).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
    assert_eq!(r.body["status"], 409, "{r:?}");
    assert_eq!(get_child(&app, "P-hold", 0).await["state"], "processed");
}

/// A claim whose outcomes came in for some of its children only. Those stay
/// recorded as the claim left them (its id, its worker, its attempt) through
/// a release of the rest, their second claim and its expiry; a second
/// outcome for one of them loses; the rest go out again; and the counts and
/// the ledger agree at the end.
async fn a_lease_recorded_in_part(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-part", json!({"children": children(6)})).await;
    let a = claim(&app, "P-part", 10, 300, "worker-a").await;
    assert_eq!(sequences(&a), [0, 1, 2, 3, 4, 5]);

    let write = |sequence: u64, outcome: &str| {
        let mut w = json!({"parent_id": "P-part", "sequence": sequence, "outcome": outcome, "claim_id": claim_id(&a)});
        if outcome == "failed" {
            w["reason"] = json!("bad input");
        }
        w
    };
    let r = app
        .post(
            "/v1/outcomes",
            json!({"outcomes": [write(0, "processed"), write(1, "processed"), write(2, "failed")]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    for result in r.body["results"].as_array().expect("results") {
        assert_eq!(result["status"], "applied", "{r:?}");
    }
    let counts = |parent: &Value| parent["counts"].clone();
    assert_eq!(
        counts(&get_parent(&app, "P-part").await),
        json!({"total": 6, "processed": 2, "failed": 1, "skipped": 0, "pending": 0, "in_flight": 3, "held": 0})
    );

    // The claim gives back only what it still holds.
    let released = release(&app, claim_id(&a), json!({})).await;
    assert_eq!(released["released"], 3, "{released}");
    // A second outcome for a recorded child loses, even from its own claim.
    let r = app
        .post(
            "/v1/parents/P-part/children/1/outcome",
            json!({"outcome": "failed", "reason": "late", "claim_id": claim_id(&a)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");

    let b = claim(&app, "P-part", 10, 300, "worker-b").await;
    assert_eq!(sequences(&b), [3, 4, 5], "{b}");
    for child in b["children"].as_array().unwrap() {
        assert_eq!(child["attempt"], 2, "{child}");
        assert_eq!(child["previous_attempt"], "released", "{child}");
    }
    app.expire_claim(claim_id(&b)).await;
    let c = claim(&app, "P-part", 10, 300, "worker-c").await;
    assert_eq!(sequences(&c), [3, 4, 5], "{c}");
    for child in c["children"].as_array().unwrap() {
        assert_eq!(child["attempt"], 3, "{child}");
        assert_eq!(child["previous_attempt"], "expired", "{child}");
    }

    for sequence in [0, 1] {
        let child = get_child(&app, "P-part", sequence).await;
        assert_eq!(child["state"], "processed", "{child}");
        assert_eq!(child["outcome"], "processed", "{child}");
        assert_eq!(child["claim_id"], claim_id(&a), "{child}");
        assert_eq!(child["claimed_by"], "worker-a", "{child}");
        assert_eq!(child["attempts"], 1, "{child}");
        assert_eq!(child["outcome_attempt"], 1, "{child}");
        // The losing second outcome is logged on its child.
        assert_eq!(child["conflict_count"], u64::from(sequence == 1), "{child}");
        timestamp(&child["terminal_at"]);
    }
    let failed = get_child(&app, "P-part", 2).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["reason"], "bad input", "{failed}");
    assert_eq!(failed["claim_id"], claim_id(&a), "{failed}");
    let held = get_child(&app, "P-part", 4).await;
    assert_eq!(held["state"], "in_flight", "{held}");
    assert_eq!(held["claim_id"], claim_id(&c), "{held}");
    assert_eq!(held["attempts"], 3, "{held}");

    assert_eq!(
        counts(&get_parent(&app, "P-part").await),
        json!({"total": 6, "processed": 2, "failed": 1, "skipped": 0, "pending": 0, "in_flight": 3, "held": 0})
    );
    let r = app.post("/v1/parents/P-part/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["changes"], json!([]), "the projection is the ledger: {r:?}");
}

/// A claim's whole batch after one of its children was recorded failed: the
/// batch names every child its lease was given, but the lease no longer
/// holds them all, so the failed one loses and stays as it was; the rest are
/// recorded, the lease ends and the counts and the ledger agree.
async fn a_whole_batch_after_a_failure(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-whole", json!({"children": children(4)})).await;
    let a = claim(&app, "P-whole", 10, 300, "worker-a").await;
    assert_eq!(sequences(&a), [0, 1, 2, 3]);
    let r = app
        .post(
            "/v1/parents/P-whole/children/1/outcome",
            json!({"outcome": "failed", "reason": "bad input", "claim_id": claim_id(&a)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");

    let all: Vec<Value> = (0..4)
        .map(|sequence| {
            json!({"parent_id": "P-whole", "sequence": sequence, "outcome": "processed", "claim_id": claim_id(&a)})
        })
        .collect();
    let r = app.post("/v1/outcomes", json!({ "outcomes": all })).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let statuses: Vec<&str> = r.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|result| result["status"].as_str().expect("status"))
        .collect();
    assert_eq!(statuses, ["applied", "conflict", "applied", "applied"], "{r:?}");

    let failed = get_child(&app, "P-whole", 1).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["reason"], "bad input", "{failed}");
    assert_eq!(failed["conflict_count"], 1, "{failed}");
    for sequence in [0, 2, 3] {
        let child = get_child(&app, "P-whole", sequence).await;
        assert_eq!(child["state"], "processed", "{child}");
        assert_eq!(child["claim_id"], claim_id(&a), "{child}");
        assert_eq!(child["claimed_by"], "worker-a", "{child}");
    }
    assert_eq!(
        get_parent(&app, "P-whole").await["counts"],
        json!({"total": 4, "processed": 3, "failed": 1, "skipped": 0, "pending": 0, "in_flight": 0, "held": 0})
    );
    // The lease ended with its last child: nothing is left to give back.
    let released = release(&app, claim_id(&a), json!({})).await;
    assert_eq!(released["released"], 0, "{released}");
    let r = app
        .post("/v1/parents/P-whole/reconcile", json!({"dry_run": true}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["changes"], json!([]), "the projection is the ledger: {r:?}");
}

/// A claim recorded in part whose lease then runs out, on a parent that
/// holds expired children: only the unrecorded ones are held; the children
/// search finds each child in its state while the lease is live and after;
/// a cancellation skips the held ones and leaves the recorded ones alone.
async fn a_held_lease_recorded_in_part(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "P-hpart",
        json!({"children": children(4), "expired_lease": "hold"}),
    )
    .await;
    let a = claim(&app, "P-hpart", 10, 300, "worker-a").await;
    assert_eq!(sequences(&a), [0, 1, 2, 3]);
    for sequence in [0, 1] {
        let r = app
            .post(
                &format!("/v1/parents/P-hpart/children/{sequence}/outcome"),
                json!({"outcome": "processed", "claim_id": claim_id(&a)}),
            )
            .await;
        assert_eq!(r.body["applied"], true, "{r:?}");
    }
    let found = |state: &'static str| {
        let app = &app;
        async move {
            let r = app.get(&format!("/v1/children?state={state}&parent_id=P-hpart")).await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            let mut sequences: Vec<u64> = r.body["children"]
                .as_array()
                .expect("children")
                .iter()
                .map(|c| {
                    assert_eq!(c["state"], state, "{c}");
                    c["sequence"].as_u64().expect("sequence")
                })
                .collect();
            sequences.sort_unstable();
            sequences
        }
    };
    assert_eq!(found("processed").await, [0, 1]);
    assert_eq!(found("in_flight").await, [2, 3]);
    assert!(found("pending").await.is_empty());

    app.expire_claim(claim_id(&a)).await;
    for sequence in [2, 3] {
        wait_for_child_state(&app, "P-hpart", sequence, "held").await;
    }
    for sequence in [0, 1] {
        let child = get_child(&app, "P-hpart", sequence).await;
        assert_eq!(child["state"], "processed", "{child}");
        assert_eq!(child["claim_id"], claim_id(&a), "{child}");
    }
    assert_eq!(found("processed").await, [0, 1]);
    assert_eq!(found("held").await, [2, 3]);
    assert!(found("in_flight").await.is_empty());
    let parent = get_parent(&app, "P-hpart").await;
    assert_eq!(
        parent["counts"],
        json!({"total": 4, "processed": 2, "failed": 0, "skipped": 0, "pending": 0, "in_flight": 0, "held": 2}),
        "{parent}"
    );

    let r = app
        .post("/v1/parents/P-hpart/cancel", json!({"reason": "withdrawn"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["skipped"], 2, "{r:?}");
    assert_eq!(
        r.body["parent"]["counts"],
        json!({"total": 4, "processed": 2, "failed": 0, "skipped": 2, "pending": 0, "in_flight": 0, "held": 0}),
        "{r:?}"
    );
    assert_eq!(found("processed").await, [0, 1]);
    assert_eq!(found("skipped").await, [2, 3]);
    let r = app
        .post("/v1/parents/P-hpart/reconcile", json!({"dry_run": true}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["changes"], json!([]), "the projection is the ledger: {r:?}");
}

/// A claim recorded in part, read through every reader of a parent's
/// children: its list (whole and by state), its results export (whole and by
/// state) and its summary all show the recorded children as recorded, with
/// their results, and the rest as in flight.
async fn a_lease_recorded_in_part_reads_alike_everywhere(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-read", json!({"children": children(6)})).await;
    let a = claim(&app, "P-read", 10, 300, "worker-a").await;
    let r = app
        .post(
            "/v1/outcomes",
            json!({"outcomes": [
                {"parent_id": "P-read", "sequence": 0, "outcome": "processed", "claim_id": claim_id(&a)},
                {"parent_id": "P-read", "sequence": 1, "outcome": "processed", "result": {"ok": 1}, "claim_id": claim_id(&a)},
                {"parent_id": "P-read", "sequence": 2, "outcome": "failed", "reason": "bad input", "claim_id": claim_id(&a)},
            ]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let expected = [
        "processed",
        "processed",
        "failed",
        "in_flight",
        "in_flight",
        "in_flight",
    ];

    let r = app.get("/v1/parents/P-read/children").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let states: Vec<&str> = r.body["children"]
        .as_array()
        .expect("children")
        .iter()
        .map(|c| c["state"].as_str().expect("state"))
        .collect();
    assert_eq!(states, expected, "{r:?}");
    for (state, want) in [
        ("processed", vec![0, 1]),
        ("failed", vec![2]),
        ("in_flight", vec![3, 4, 5]),
    ] {
        let r = app.get(&format!("/v1/parents/P-read/children?state={state}")).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let got: Vec<u64> = r.body["children"]
            .as_array()
            .expect("children")
            .iter()
            .map(|c| c["sequence"].as_u64().expect("sequence"))
            .collect();
        assert_eq!(got, want, "{state}: {r:?}");
    }

    let export = |query: &'static str| {
        let app = &app;
        async move {
            let resp = app
                .client
                .get(format!("{}/v1/parents/P-read/results{query}", app.base))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let text = resp.text().await.unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap())
                .collect::<Vec<Value>>()
        }
    };
    let lines = export("").await;
    let states: Vec<&str> = lines.iter().map(|l| l["state"].as_str().expect("state")).collect();
    assert_eq!(states, expected, "{lines:?}");
    assert_eq!(lines[0]["attempt"], 1, "{lines:?}");
    timestamp(&lines[0]["finished_at"]);
    assert_eq!(lines[1]["result"], json!({"ok": 1}), "{lines:?}");
    assert_eq!(lines[2]["reason"], "bad input", "{lines:?}");
    assert!(lines[3]["finished_at"].is_null(), "{lines:?}");
    let processed = export("?state=processed").await;
    assert_eq!(
        processed
            .iter()
            .map(|l| l["sequence"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1],
        "{processed:?}"
    );

    let r = app.get("/v1/parents/P-read/summary").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        r.body["counts"],
        json!({"total": 6, "processed": 2, "failed": 1, "skipped": 0, "pending": 0, "in_flight": 3, "held": 0}),
        "{r:?}"
    );
    assert_eq!(r.body["reasons"][0]["reason"], "bad input", "{r:?}");
    assert_eq!(r.body["reasons"][0]["count"], 1, "{r:?}");
}

both_stores!(
    lease_expiry_hands_child_out_again,
    extend_keeps_the_lease,
    release_returns_children,
    stale_claim_is_fenced,
    late_win_by_an_expired_holder_stays_visible,
    attempts_run_out,
    hold_policy_waits_for_a_decision,
    lower_child_pending_again_comes_first,
    a_lease_recorded_in_part,
    a_whole_batch_after_a_failure,
    a_held_lease_recorded_in_part,
    a_lease_recorded_in_part_reads_alike_everywhere,
);

/// A release that waits for a lease's lock while a concurrent outcome of
/// the same claim commits (Postgres, where writers run side by side) lets go
/// of the lease by its count as locked: the claim held two children, one was
/// recorded meanwhile, the other is released, so nothing is left and the
/// lease goes. Deciding on the count the release's snapshot saw left the
/// lease holding the released child, which then showed as in flight under
/// the old claim and refused the next holder's outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_waiting_on_a_concurrent_outcome_lets_go_of_the_lease() {
    use sqlx::Connection;
    if !postgres_available().await {
        return;
    }
    let app = spawn_app(Backend::Postgres).await;
    let r = app
        .put("/v1/parents/RACE", json!({"queue": "race", "children": children(2)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let claim = app
        .post("/v1/parents/RACE/claims", json!({"limit": 2, "lease_seconds": 300}))
        .await;
    let claim_id = claim.body["claim_id"].as_str().unwrap().to_owned();
    assert_eq!(claim.body["children"].as_array().unwrap().len(), 2, "{claim:?}");

    // An outcome of child 0 in flight: its lease row locked and counted down,
    // not yet committed (as `APPLY_OUTCOMES` leaves it until its commit).
    let mut outcome = sqlx::PgConnection::connect(&app.database_url).await.unwrap();
    let mut tx = outcome.begin().await.unwrap();
    sqlx::query(
        "UPDATE child SET state = 'skipped', reason = 'raced', terminal_at = now() \
         WHERE parent_id = 'RACE' AND sequence = 0",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    sqlx::query("UPDATE parent SET skipped = skipped + 1 WHERE parent_id = 'RACE'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("UPDATE claim_lease SET open = open - 1 WHERE parent_id = 'RACE' AND claim_id = $1::uuid")
        .bind(&claim_id)
        .execute(&mut *tx)
        .await
        .unwrap();

    let release = {
        let (base, client, claim_id) = (app.base.clone(), app.client.clone(), claim_id.clone());
        tokio::spawn(async move {
            client
                .post(format!("{base}/v1/claims/{claim_id}/release"))
                .json(&json!({"children": [{"parent_id": "RACE", "sequence": 1}]}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!release.is_finished(), "the release did not wait for the lease's lock");
    tx.commit().await.unwrap();
    let released = release.await.unwrap();
    assert_eq!(released["released"], 1, "{released}");

    assert_eq!(
        app.count("SELECT count(*) FROM claim_lease WHERE parent_id = 'RACE'")
            .await,
        0,
        "the lease still holds a child after its last was released"
    );
    let child = app.get("/v1/parents/RACE/children/1").await;
    assert_eq!(child.body["state"], "pending", "{child:?}");
    assert_eq!(child.body["previous_attempt"], "released", "{child:?}");
}
