//! Redrive (`POST /v1/parents/{id}/redrive`) and the bulk retry of held
//! children (`POST /v1/parents/{id}/retry`), on both stores: the new parent
//! holds exactly the selected children (keys, payloads, in order, each
//! naming the child it was), a dry run counts them and writes nothing, a
//! repeat is the same parent, other content under its id is a conflict, and
//! the redriven parent runs and completes on its own.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn claim(app: &TestApp, parent: &str, limit: usize, lease_seconds: u64) -> (String, Vec<i64>) {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": "redrive-test"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim: {r:?}");
    let sequences = r.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    (r.body["claim_id"].as_str().unwrap_or_default().to_owned(), sequences)
}

async fn children_of(app: &TestApp, parent: &str) -> Vec<Value> {
    let r = app.get(&format!("/v1/parents/{parent}/children?limit=1000")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["next_after"], Value::Null);
    r.body["children"].as_array().unwrap().clone()
}

/// Parent `S`: 12 children with keys; 0-3 processed, 4-8 failed (4, 6, 8
/// `timeout`; 5, 7 `bad input`), 9 skipped, 10 skipped at registration, 11 pending.
async fn build(app: &TestApp) {
    let mut children: Vec<Value> = (0..12)
        .map(|i| json!({"key": format!("k-{i}"), "payload": {"n": i}}))
        .collect();
    children[10] = json!({"key": "k-10", "payload": {"n": 10}, "skip": "invalid"});
    let r = app
        .put(
            "/v1/parents/S",
            json!({"queue": "qs", "children": children, "max_attempts": 3, "priority": 5}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let (claim_id, got) = claim(app, "S", 10, 300).await;
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    let outcomes: Vec<Value> = (0..10)
        .map(|s| {
            let (outcome, reason) = match s {
                0..=3 => ("processed", None),
                4 | 6 | 8 => ("failed", Some("timeout")),
                5 | 7 => ("failed", Some("bad input")),
                _ => ("skipped", Some("not needed")),
            };
            json!({"parent_id": "S", "sequence": s, "outcome": outcome, "reason": reason, "claim_id": claim_id})
        })
        .collect();
    let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

async fn redrive_selects_exactly_and_is_idempotent(backend: Backend) {
    let app = spawn_app(backend).await;
    build(&app).await;
    let before = children_of(&app, "S").await;

    // Dry runs count and write nothing.
    for (body, n) in [
        (json!({"into": "S-r1", "dry_run": true}), 5),
        (json!({"into": "S-r1", "dry_run": true, "reasons": ["timeout"]}), 3),
        (
            json!({"into": "S-r1", "dry_run": true, "states": ["failed", "skipped"]}),
            7,
        ),
        (
            json!({"into": "S-r1", "dry_run": true, "states": ["skipped"], "reasons": ["invalid"]}),
            1,
        ),
        (
            json!({"into": "S-r1", "dry_run": true, "states": ["processed"], "reasons": ["nope"]}),
            0,
        ),
    ] {
        let r = app.post("/v1/parents/S/redrive", body.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{body}: {r:?}");
        assert_eq!(r.body["children"], n, "{body}: {r:?}");
        assert_eq!(
            (r.body["dry_run"].clone(), r.body["parent"].clone()),
            (json!(true), Value::Null)
        );
    }
    assert_eq!(app.get("/v1/parents/S-r1").await.status, StatusCode::NOT_FOUND);

    // The failed children with reason timeout, into S-r1.
    let body = json!({"into": "S-r1", "reasons": ["timeout"]});
    let r = app.post("/v1/parents/S/redrive", body.clone()).await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(r.body["children"], 3);
    let parent = r.body["parent"].clone();
    assert_eq!(parent["parent_id"], "S-r1");
    assert_eq!(parent["redrive_of"], "S");
    assert_eq!(
        (parent["queue"].clone(), parent["priority"].clone()),
        (json!("qs"), json!(5))
    );
    assert_eq!(parent["max_attempts"], 3);
    assert_eq!(parent["state"], "active");
    assert_eq!(parent["counts"]["total"], 3);
    assert_eq!(parent["counts"]["pending"], 3);
    let redriven = children_of(&app, "S-r1").await;
    let expected: Vec<(i64, Value, Value, Value)> = [4, 6, 8]
        .iter()
        .enumerate()
        .map(|(i, old)| {
            let was = &before[*old as usize];
            (
                i as i64,
                was["key"].clone(),
                was["payload"].clone(),
                json!({"parent_id": "S", "sequence": old}),
            )
        })
        .collect();
    let got: Vec<(i64, Value, Value, Value)> = redriven
        .iter()
        .map(|c| {
            (
                c["sequence"].as_i64().unwrap(),
                c["key"].clone(),
                c["payload"].clone(),
                c["redrive_of"].clone(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    assert!(redriven.iter().all(|c| c["state"] == "pending" && c["attempts"] == 0));
    // The old parent keeps its outcomes.
    assert_eq!(children_of(&app, "S").await, before);
    // A repeat is the same parent; other content under its id is a conflict.
    let again = app.post("/v1/parents/S/redrive", body).await;
    assert_eq!(again.status, StatusCode::OK, "{again:?}");
    assert_eq!(again.body["parent"]["created_at"], parent["created_at"]);
    assert_eq!(again.body["children"], 3);
    let other = app.post("/v1/parents/S/redrive", json!({"into": "S-r1"})).await;
    assert_eq!(other.status, StatusCode::CONFLICT, "{other:?}");
    let taken = app.post("/v1/parents/S/redrive", json!({"into": "S"})).await;
    assert_eq!(taken.status, StatusCode::CONFLICT, "{taken:?}");
    // A registration under a redriven parent's id is other content too.
    let r = app
        .put("/v1/parents/S-r1", json!({"queue": "qs", "children": children(3)}))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(children_of(&app, "S-r1").await.len(), 3);

    // The redriven parent runs like any other: claimed from its queue and completed.
    let r = app
        .post("/v1/queues/qs/claims", json!({"limit": 10, "worker": "w"}))
        .await;
    let claim_id = r.body["claim_id"].as_str().unwrap().to_owned();
    let got: Vec<(String, i64)> = r.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["parent_id"].as_str().unwrap().to_owned(),
                c["sequence"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(got.contains(&("S-r1".to_owned(), 0)), "{got:?}");
    let outcomes: Vec<Value> = (0..3)
        .map(|s| json!({"parent_id": "S-r1", "sequence": s, "outcome": "processed", "claim_id": claim_id}))
        .collect();
    let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let done = app.get("/v1/parents/S-r1").await.body;
    assert_eq!(
        (done["state"].clone(), done["verdict"].clone()),
        (json!("complete"), json!("succeeded"))
    );
    let r = app.post("/v1/parents/S-r1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["changes"], json!([]), "{r:?}");

    // Selecting nothing makes a parent complete at once.
    let r = app
        .post(
            "/v1/parents/S/redrive",
            json!({"into": "S-r2", "states": ["processed"], "reasons": ["nope"]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(
        (r.body["parent"]["state"].clone(), r.body["children"].clone()),
        (json!("complete"), json!(0))
    );

    // Into another queue, at another priority.
    let r = app
        .post(
            "/v1/parents/S/redrive",
            json!({"into": "S-r3", "states": ["failed"], "queue": "retries", "priority": -3}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    assert_eq!(
        (r.body["parent"]["queue"].clone(), r.body["parent"]["priority"].clone()),
        (json!("retries"), json!(-3))
    );
    assert_eq!(r.body["children"], 5);
}

async fn bad_redrives_write_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    build(&app).await;
    for (body, field) in [
        (json!({}), "into"),
        (json!({"into": ""}), "into"),
        (json!({"into": "x".repeat(300)}), "into"),
        (json!({"into": "N", "states": []}), "states"),
        (json!({"into": "N", "states": ["held"]}), "states[0]"),
        (json!({"into": "N", "reasons": []}), "reasons"),
        (json!({"into": "N", "reasons": vec!["r"; 101]}), "reasons"),
        (json!({"into": "N", "reasons": ["x".repeat(1001)]}), "reasons[0]"),
        (json!({"into": "N", "queue": "no spaces"}), "queue"),
        (json!({"into": "N", "priority": 101}), "priority"),
        (json!({"into": "N", "dry_run": "yes"}), "dry_run"),
        (json!({"into": "N", "extra": 1}), "extra"),
    ] {
        let r = app.post("/v1/parents/S/redrive", body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {r:?}");
        assert_eq!(r.content_type, "application/problem+json");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    assert_eq!(app.get("/v1/parents/N").await.status, StatusCode::NOT_FOUND);
    let r = app.post("/v1/parents/missing/redrive", json!({"into": "N"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = app
        .post("/v1/parents/missing/redrive", json!({"into": "N", "dry_run": true}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert_eq!(app.get("/v1/parents/N").await.status, StatusCode::NOT_FOUND);
}

async fn held_children_are_retried_at_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put(
            "/v1/parents/H",
            json!({"queue": "qh", "children": children(6), "expired_lease": "hold"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    let (held, got) = claim(&app, "H", 4, 300).await;
    assert_eq!(got.len(), 4);
    app.expire_claim(&held).await;
    // A short claim takes the rest and sweeps the expired lease: four held.
    let (_, rest) = claim(&app, "H", 10, 300).await;
    assert_eq!(rest, [4, 5]);
    let parent = app.get("/v1/parents/H").await.body;
    assert_eq!(parent["counts"]["held"], 4, "{parent}");

    for body in [
        json!({"states": ["failed"]}),
        json!({"states": []}),
        json!({}),
        json!({"states": ["held"], "x": 1}),
    ] {
        let r = app.post("/v1/parents/H/retry", body.clone()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {r:?}");
    }
    let r = app.post("/v1/parents/missing/retry", json!({"states": ["held"]})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = app.post("/v1/parents/H/retry", json!({"states": ["held"]})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["retried"], 4);
    let parent = app.get("/v1/parents/H").await.body;
    assert_eq!(
        (parent["counts"]["held"].clone(), parent["counts"]["pending"].clone()),
        (json!(0), json!(4)),
        "{parent}"
    );
    let r = app.post("/v1/parents/H/retry", json!({"states": ["held"]})).await;
    assert_eq!(r.body["retried"], 0);
    // They are claimable again, told their last attempt expired.
    let r = app
        .post("/v1/parents/H/claims", json!({"limit": 10, "worker": "w"}))
        .await;
    let again: Vec<(i64, Value)> = r.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["sequence"].as_i64().unwrap(), c["previous_attempt"].clone()))
        .collect();
    assert_eq!(again, (0..4).map(|s| (s, json!("expired"))).collect::<Vec<_>>());
    let r = app.post("/v1/parents/H/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["changes"], json!([]), "{r:?}");
}

both_stores!(
    redrive_selects_exactly_and_is_idempotent,
    bad_redrives_write_nothing,
    held_children_are_retried_at_once
);
