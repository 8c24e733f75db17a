//! When the stored projection drifts from the child rows, the ledger wins:
//! reconcile reports the drift and, unless it is a dry run, repairs it.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, queue: &str, n: usize) {
    let r = app
        .put(
            &format!("/v1/parents/{parent}"),
            json!({"queue": queue, "children": children(n)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

/// Claims every claimable child of `parent`; returns the claim id.
async fn claim_all(app: &TestApp, parent: &str) -> String {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": 1000, "lease_seconds": 300}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim {parent}: {r:?}");
    r.body["claim_id"].as_str().expect("claim_id").to_owned()
}

async fn outcome(app: &TestApp, parent: &str, seq: u64, outcome: &str, claim_id: &str) {
    let mut body = json!({"outcome": outcome, "claim_id": claim_id});
    if outcome != "processed" {
        body["reason"] = json!("it did not work");
    }
    let r = app
        .post(&format!("/v1/parents/{parent}/children/{seq}/outcome"), body)
        .await;
    assert_eq!(r.status, StatusCode::OK, "outcome {parent}/{seq}: {r:?}");
    assert_eq!(r.body["applied"], true, "{r:?}");
}

async fn get_parent(app: &TestApp, parent: &str) -> Value {
    let r = app.get(&format!("/v1/parents/{parent}")).await;
    assert_eq!(r.status, StatusCode::OK, "GET {parent}: {r:?}");
    r.body
}

async fn reconcile(app: &TestApp, parent: &str, dry_run: bool) -> Value {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/reconcile"),
            json!({ "dry_run": dry_run }),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "reconcile {parent}: {r:?}");
    assert_eq!(r.body["parent_id"], parent, "{r:?}");
    assert_eq!(r.body["dry_run"], dry_run, "{r:?}");
    r.body
}

async fn sweep(app: &TestApp, body: Value) -> Value {
    let r = app.post("/v1/reconcile", body).await;
    assert_eq!(r.status, StatusCode::OK, "sweep: {r:?}");
    r.body
}

/// Every field of `expected` has that value in `actual` (which may carry more).
#[track_caller]
fn assert_fields(actual: &Value, expected: Value) {
    for (field, value) in expected.as_object().expect("expected is an object") {
        assert_eq!(&actual[field], value, "field {field} of {actual}");
    }
}

fn changes(report: &Value) -> &Vec<Value> {
    report["changes"].as_array().expect("changes list")
}

/// The ids of the drifted parents a sweep lists: one report each, as the
/// contract's `SweepReport.parents` holds.
fn swept_ids(report: &Value) -> Vec<String> {
    report["parents"]
        .as_array()
        .expect("parents list")
        .iter()
        .map(|p| {
            assert!(p["changes"].is_array(), "each swept parent is a report: {p}");
            p["parent_id"].as_str().expect("a report with parent_id").to_owned()
        })
        .collect()
}

async fn reconcile_repairs_drifted_counters(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-rec", "events", 3).await;
    let claim = claim_all(&app, "P-rec").await;
    outcome(&app, "P-rec", 0, "processed", &claim).await;
    outcome(&app, "P-rec", 1, "processed", &claim).await;
    outcome(&app, "P-rec", 2, "failed", &claim).await;

    app.exec("UPDATE parent SET total = 99, processed = 0, failed = 0, skipped = 0, completed_at = NULL WHERE parent_id = 'P-rec'")
        .await;

    let report = reconcile(&app, "P-rec", true).await;
    assert_eq!(report["applied"], false, "{report}");
    assert_fields(
        &report["stored"],
        json!({"total": 99, "processed": 0, "failed": 0, "skipped": 0, "completed_at": null}),
    );
    assert_fields(
        &report["derived"],
        json!({"total": 3, "processed": 2, "failed": 1, "skipped": 0, "complete": true}),
    );
    let found = changes(&report);
    let expected = [
        json!({"field": "total", "from": 99, "to": 3}),
        json!({"field": "processed", "from": 0, "to": 2}),
        json!({"field": "failed", "from": 0, "to": 1}),
        json!({"field": "completed_at", "from": null, "to": "set"}),
    ];
    for change in &expected {
        assert!(found.contains(change), "missing change {change} in {report}");
    }
    assert_eq!(found.len(), expected.len(), "only drifted fields are listed: {report}");

    // A dry run writes nothing.
    let parent = get_parent(&app, "P-rec").await;
    assert_eq!(parent["counts"]["total"], 99, "{parent}");
    assert_eq!(parent["counts"]["processed"], 0, "{parent}");
    assert!(parent["completed_at"].is_null(), "{parent}");

    let report = reconcile(&app, "P-rec", false).await;
    assert_eq!(report["applied"], true, "{report}");
    assert_eq!(changes(&report).len(), 4, "{report}");

    let parent = get_parent(&app, "P-rec").await;
    assert_eq!(parent["counts"]["total"], 3, "{parent}");
    assert_eq!(parent["counts"]["processed"], 2, "{parent}");
    assert_eq!(parent["counts"]["failed"], 1, "{parent}");
    assert_eq!(parent["counts"]["skipped"], 0, "{parent}");
    assert_eq!(parent["complete"], true, "{parent}");
    assert_eq!(parent["state"], "complete", "{parent}");
    assert!(parent["completed_at"].is_string(), "{parent}");

    // Once repaired there is nothing left to change.
    let report = reconcile(&app, "P-rec", true).await;
    assert_eq!(changes(&report), &Vec::<Value>::new(), "{report}");
}

async fn reconcile_clears_premature_completion(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-early", "events", 2).await;
    let claim = claim_all(&app, "P-early").await;
    outcome(&app, "P-early", 0, "processed", &claim).await;

    let now = match app.backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%dT%H:%M:%fZ','now')",
    };
    app.exec(&format!(
        "UPDATE parent SET completed_at = {now} WHERE parent_id = 'P-early'"
    ))
    .await;

    let report = reconcile(&app, "P-early", true).await;
    assert_eq!(report["applied"], false, "{report}");
    assert!(!report["stored"]["completed_at"].is_null(), "{report}");
    assert_eq!(report["derived"]["complete"], false, "{report}");
    let found = changes(&report);
    assert_eq!(found.len(), 1, "only completed_at drifted: {report}");
    assert_eq!(found[0]["field"], "completed_at", "{report}");
    assert!(!found[0]["from"].is_null(), "{report}");
    assert!(
        found[0]["to"].is_null(),
        "a premature completed_at is cleared: {report}"
    );

    let report = reconcile(&app, "P-early", false).await;
    assert_eq!(report["applied"], true, "{report}");

    let parent = get_parent(&app, "P-early").await;
    assert_eq!(parent["complete"], false, "{parent}");
    assert_eq!(parent["state"], "active", "{parent}");
    assert!(parent["completed_at"].is_null(), "{parent}");
    assert_eq!(parent["counts"]["processed"], 1, "{parent}");

    // The normal path still completes the parent afterwards.
    outcome(&app, "P-early", 1, "processed", &claim).await;
    let parent = get_parent(&app, "P-early").await;
    assert_eq!(parent["complete"], true, "{parent}");
    assert!(parent["completed_at"].is_string(), "{parent}");
}

async fn sweep_repairs_only_drifted_parents(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "S-1", "events", 2).await;
    register(&app, "S-2", "events", 2).await;
    register(&app, "S-3", "other", 2).await;
    let claim = claim_all(&app, "S-1").await;
    outcome(&app, "S-1", 0, "processed", &claim).await;
    outcome(&app, "S-1", 1, "skipped", &claim).await;
    let claim = claim_all(&app, "S-2").await;
    outcome(&app, "S-2", 0, "processed", &claim).await;

    app.exec("UPDATE parent SET processed = 0 WHERE parent_id = 'S-2'")
        .await;

    // A queue filter checks only that queue's parents.
    let report = sweep(&app, json!({"dry_run": true, "queue": "other"})).await;
    assert_eq!(report["checked"], 1, "{report}");
    assert_eq!(report["drifted"], 0, "{report}");
    assert_eq!(report["repaired"], 0, "{report}");
    assert!(swept_ids(&report).is_empty(), "{report}");

    let report = sweep(&app, json!({"dry_run": true, "queue": "events"})).await;
    assert_eq!(report["checked"], 2, "{report}");
    assert_eq!(report["drifted"], 1, "{report}");
    assert_eq!(swept_ids(&report), ["S-2"], "{report}");

    let report = sweep(&app, json!({"dry_run": true})).await;
    assert_eq!(report["checked"], 3, "{report}");
    assert_eq!(report["drifted"], 1, "{report}");
    assert_eq!(report["repaired"], 0, "{report}");
    assert_eq!(swept_ids(&report), ["S-2"], "{report}");
    assert_eq!(
        get_parent(&app, "S-2").await["counts"]["processed"],
        0,
        "a dry sweep writes nothing"
    );

    let report = sweep(&app, json!({"dry_run": false})).await;
    assert_eq!(report["checked"], 3, "{report}");
    assert_eq!(report["drifted"], 1, "{report}");
    assert_eq!(report["repaired"], 1, "{report}");
    assert_eq!(swept_ids(&report), ["S-2"], "{report}");
    assert_eq!(get_parent(&app, "S-2").await["counts"]["processed"], 1);

    let report = sweep(&app, json!({"dry_run": true})).await;
    assert_eq!(report["checked"], 3, "{report}");
    assert_eq!(report["drifted"], 0, "{report}");
    assert_eq!(report["repaired"], 0, "{report}");
    assert!(swept_ids(&report).is_empty(), "{report}");
}

/// The open counts a read shows (pending, in flight, held) are kept by the
/// statements that move children, never counted per read: after every kind
/// of transition they equal the rows, and reconcile finds nothing to repair.
async fn open_counts_follow_every_transition(backend: Backend) {
    let app = spawn_app(backend).await;
    let check = |parent: &'static str, step: &'static str| {
        let app = &app;
        async move {
            let counts = get_parent(app, parent).await["counts"].clone();
            for state in ["pending", "in_flight", "held"] {
                let rows = app
                    .count(&format!(
                        "SELECT count(*) FROM child_status WHERE parent_id = '{parent}' AND state = '{state}'"
                    ))
                    .await;
                assert_eq!(counts[state], rows, "{parent} after {step}: {state} of {counts}");
            }
            let report = reconcile(app, parent, true).await;
            assert!(changes(&report).is_empty(), "{parent} after {step}: {report}");
        }
    };
    for (parent, policy, max_attempts) in [
        ("P-open-retry", "retry", 3),
        ("P-open-hold", "hold", 3),
        ("P-open-fail", "retry", 1),
    ] {
        let r = app
            .put(
                &format!("/v1/parents/{parent}"),
                json!({"queue": "open", "children": children(10), "expired_lease": policy, "max_attempts": max_attempts}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        check(parent, "registration").await;

        let r = app
            .post(
                &format!("/v1/parents/{parent}/claims"),
                json!({"limit": 6, "lease_seconds": 300}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let first = r.body["claim_id"].as_str().unwrap().to_owned();
        check(parent, "a claim").await;

        let r = app
            .post(
                &format!("/v1/claims/{first}/release"),
                json!({"children": [{"parent_id": parent, "sequence": 0}, {"parent_id": parent, "sequence": 1}]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        check(parent, "a release").await;

        outcome(&app, parent, 2, "processed", &first).await;
        outcome(&app, parent, 3, "failed", &first).await;
        check(parent, "outcomes of in-flight children").await;

        let r = app
            .post(
                &format!("/v1/parents/{parent}/children/9/outcome"),
                json!({"outcome": "skipped", "reason": "not needed"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        check(parent, "an outcome of a pending child").await;

        // Sequences 4 and 5 are still leased: their lease runs out.
        app.expire_claim(&first).await;
        let r = app
            .post(
                &format!("/v1/parents/{parent}/claims"),
                json!({"limit": 1, "lease_seconds": 300}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let second = r.body["claim_id"].as_str().unwrap().to_owned();
        check(parent, "expired leases and a claim").await;

        // The lease sweep (the reaper, or a claim of the queue) moves them on.
        let started = std::time::Instant::now();
        while app.get(&format!("/v1/parents/{parent}/children/5")).await.body["state"] == "in_flight" {
            assert!(started.elapsed() < std::time::Duration::from_secs(20), "never swept");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        check(parent, "leases expired").await;
        if policy == "hold" {
            let r = app
                .post(&format!("/v1/parents/{parent}/children/4/retry"), json!({}))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{r:?}");
            check(parent, "a retry of a held child").await;
            // The expired holder's late outcome still wins a held child.
            outcome(&app, parent, 5, "processed", &first).await;
            check(parent, "an outcome of a held child").await;
        }
        let r = app.post(&format!("/v1/claims/{second}/release"), json!({})).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        check(parent, "a release of a whole claim").await;
    }
    // Drift in the open counts is reported and repaired like the counters.
    app.exec("UPDATE parent SET settled_in_flight = settled_in_flight + 7 WHERE parent_id = 'P-open-hold'")
        .await;
    let report = reconcile(&app, "P-open-hold", false).await;
    let fields: Vec<&str> = changes(&report).iter().map(|c| c["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["in_flight"], "{report}");
    check("P-open-hold", "a repair").await;
}

both_stores!(
    open_counts_follow_every_transition,
    reconcile_repairs_drifted_counters,
    reconcile_clears_premature_completion,
    sweep_repairs_only_drifted_parents
);
