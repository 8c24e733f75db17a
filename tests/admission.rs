//! Claim admission: `not_before` on parents and children, `retry_backoff`,
//! flow keys with per-queue and per-key limits (in flight and per second)
//! enforced by the claim itself, no head-of-line blocking across keys, and
//! the queue's order of parents. Every test runs on both stores; the race
//! across replicas runs on Postgres.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn in_ms(ms: i64) -> String {
    (Utc::now() + chrono::Duration::milliseconds(ms)).to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn claim(app: &TestApp, path: &str, limit: u64) -> Value {
    let r = app.post(path, json!({"limit": limit, "lease_seconds": 60})).await;
    assert_eq!(r.status, StatusCode::OK, "claim: {r:?}");
    r.body
}

fn taken(claim: &Value) -> Vec<(String, u64)> {
    claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["parent_id"].as_str().unwrap().to_owned(),
                c["sequence"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str().unwrap_or_else(|| panic!("a time: {v}")).parse().unwrap()
}

async fn outcome(app: &TestApp, parent: &str, sequence: u64, claim_id: &str) {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/children/{sequence}/outcome"),
            json!({"outcome": "processed", "claim_id": claim_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "outcome: {r:?}");
}

/// Nothing of a parent is claimable before its `not_before`; an empty claim
/// says when to come back; GET shows it.
async fn a_parent_waits_for_its_not_before(backend: Backend) {
    let app = spawn_app(backend).await;
    let at = in_ms(1500);
    register(
        &app,
        "P",
        json!({"queue": "nb", "not_before": at, "children": children(3)}),
    )
    .await;
    let parent = app.get("/v1/parents/P").await.body;
    assert!(parent["not_before"].is_string(), "{parent}");
    assert_eq!(time(&parent["not_before"]), time(&json!(at)), "{parent}");
    for path in ["/v1/parents/P/claims", "/v1/queues/nb/claims"] {
        let early = claim(&app, path, 10).await;
        assert!(taken(&early).is_empty(), "{early}");
        assert!(early["next_available_at"].is_string(), "{path}: {early}");
        assert_eq!(time(&early["next_available_at"]), time(&json!(at)), "{early}");
    }
    tokio::time::sleep_until(tokio::time::Instant::now() + Duration::from_millis(1700)).await;
    let later = claim(&app, "/v1/queues/nb/claims", 10).await;
    assert_eq!(taken(&later).len(), 3, "{later}");
    assert!(later.get("next_available_at").is_none(), "{later}");
}

/// A child's own `not_before` holds it alone back; the others are claimed in
/// sequence order and none is handed out twice.
async fn a_child_waits_for_its_own_not_before(backend: Backend) {
    let app = spawn_app(backend).await;
    let at = in_ms(1500);
    let mut kids = children(5);
    kids[2]["not_before"] = json!(at);
    register(&app, "C", json!({"queue": "nbc", "children": kids})).await;
    let child = app.get("/v1/parents/C/children/2").await.body;
    assert_eq!(time(&child["not_before"]), time(&json!(at)), "{child}");
    let first = claim(&app, "/v1/queues/nbc/claims", 2).await;
    let second = claim(&app, "/v1/queues/nbc/claims", 10).await;
    let mut got: Vec<u64> = taken(&first)
        .into_iter()
        .chain(taken(&second))
        .map(|(_, s)| s)
        .collect();
    got.sort();
    assert_eq!(got, [0, 1, 3, 4], "{first} {second}");
    let none = claim(&app, "/v1/queues/nbc/claims", 10).await;
    assert!(taken(&none).is_empty(), "{none}");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let last = claim(&app, "/v1/queues/nbc/claims", 10).await;
    assert_eq!(taken(&last), [("C".to_owned(), 2)], "{last}");
    assert!(taken(&claim(&app, "/v1/queues/nbc/claims", 10).await).is_empty());
}

/// A child released without a delay comes back after a random share of
/// its backoff (full jitter), never later than its ceiling.
async fn a_released_child_backs_off(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "B",
        json!({"queue": "bo", "retry_backoff": {"initial_seconds": 4, "max_seconds": 4}, "children": children(20)}),
    )
    .await;
    let parent = app.get("/v1/parents/B").await.body;
    assert_eq!(
        parent["retry_backoff"],
        json!({"initial_seconds": 4.0, "max_seconds": 4.0}),
        "{parent}"
    );
    let c = claim(&app, "/v1/queues/bo/claims", 20).await;
    let released_at = Utc::now();
    let r = app
        .post(
            &format!("/v1/claims/{}/release", c["claim_id"].as_str().unwrap()),
            json!({}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let mut later = 0;
    for s in 0..20 {
        let child = app.get(&format!("/v1/parents/B/children/{s}")).await.body;
        let at = time(&child["available_at"]);
        assert!(at <= released_at + chrono::Duration::milliseconds(4500), "{child}");
        later += usize::from(at > released_at + chrono::Duration::milliseconds(300));
    }
    assert!(later > 0, "full jitter spreads 20 children over 4 s");
    let next = claim(&app, "/v1/queues/bo/claims", 20).await;
    assert!(taken(&next).len() < 20, "{next}");
}

/// A queue's `max_in_flight` is never passed; an outcome, a release and an
/// expired lease each free slots.
async fn a_queue_cap_holds_and_frees(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app.put("/v1/queues/cap/limits", json!({"max_in_flight": 5})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["max_in_flight"], 5, "{r:?}");
    register(&app, "Q", json!({"queue": "cap", "children": children(20)})).await;
    let first = claim(&app, "/v1/queues/cap/claims", 10).await;
    // On Postgres this claim first took 10, was counted over the cap and
    // rolled back, then was admitted first: nothing of the 10 is left behind.
    let lowest: Vec<(String, u64)> = (0..5).map(|s| ("Q".to_owned(), s)).collect();
    assert_eq!(taken(&first), lowest, "{first}");
    assert!(
        first["children"].as_array().unwrap().iter().all(|c| c["attempt"] == 1),
        "{first}"
    );
    let held = claim(&app, "/v1/parents/Q/claims", 10).await;
    assert!(taken(&held).is_empty(), "{held}");
    assert!(held["next_available_at"].is_string(), "{held}");
    let limits = app.get("/v1/queues/cap/limits").await.body;
    assert_eq!(limits["in_flight"], 5, "{limits}");
    let claim_id = first["claim_id"].as_str().unwrap();
    for s in 0..2 {
        outcome(&app, "Q", s, claim_id).await;
    }
    let second = claim(&app, "/v1/queues/cap/claims", 10).await;
    assert_eq!(taken(&second).len(), 2, "two outcomes free two slots: {second}");
    let r = app.post(&format!("/v1/claims/{claim_id}/release"), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let third = claim(&app, "/v1/queues/cap/claims", 10).await;
    assert_eq!(taken(&third).len(), 3, "a release frees its slots: {third}");
    app.expire_claim(second["claim_id"].as_str().unwrap()).await;
    let fourth = claim(&app, "/v1/queues/cap/claims", 10).await;
    assert_eq!(taken(&fourth).len(), 2, "an expired lease frees its slots: {fourth}");
    // Removing the limit lets the rest through.
    let r = app.put("/v1/queues/cap/limits", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let rest = claim(&app, "/v1/queues/cap/claims", 100).await;
    assert!(taken(&rest).len() >= 10, "{rest}");
}

/// A key at its cap is passed by: a lone child of another key is claimed at
/// once. A key's own limits replace the queue's `per_key`, and a DELETE
/// gives the queue's back.
async fn a_key_at_its_cap_blocks_nobody_else(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/queues/keys/limits", json!({"per_key": {"max_in_flight": 2}}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    register(
        &app,
        "BIG",
        json!({"queue": "keys", "flow_key": "big", "children": children(50)}),
    )
    .await;
    register(
        &app,
        "BIG2",
        json!({"queue": "keys", "flow_key": "big", "children": children(50)}),
    )
    .await;
    let first = claim(&app, "/v1/queues/keys/claims", 10).await;
    assert_eq!(taken(&first).len(), 2, "{first}");
    register(
        &app,
        "SMALL",
        json!({"queue": "keys", "flow_key": "small", "children": children(1)}),
    )
    .await;
    let second = claim(&app, "/v1/queues/keys/claims", 10).await;
    assert_eq!(taken(&second), [("SMALL".to_owned(), 0)], "{second}");
    let third = claim(&app, "/v1/queues/keys/claims", 10).await;
    assert!(taken(&third).is_empty(), "{third}");
    assert!(third["next_available_at"].is_string(), "{third}");
    let key = app.get("/v1/queues/keys/keys/big/limits").await;
    assert_eq!(key.status, StatusCode::OK, "{key:?}");
    assert_eq!(
        (key.body["in_flight"].clone(), key.body["max_in_flight"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(key.body["overridden"], false);
    let r = app
        .put("/v1/queues/keys/keys/big/limits", json!({"max_in_flight": 5}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["overridden"], true, "{r:?}");
    let more = claim(&app, "/v1/queues/keys/claims", 10).await;
    assert_eq!(taken(&more).len(), 3, "{more}");
    let queue = app.get("/v1/queues/keys/limits").await.body;
    let keys: BTreeMap<&str, i64> = queue["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| (k["flow_key"].as_str().unwrap(), k["in_flight"].as_i64().unwrap()))
        .collect();
    assert_eq!(keys, BTreeMap::from([("big", 5), ("small", 1)]), "{queue}");
    assert_eq!(queue["in_flight"], 6, "{queue}");
    // The queue page and the metrics show each key's usage too.
    let page = app.get("/v1/queues/keys").await.body;
    assert_eq!(
        page["flow_keys"],
        json!([{"flow_key": "big", "in_flight": 5}, {"flow_key": "small", "in_flight": 1}]),
        "{page}"
    );
    let metrics = app.get("/metrics").await.body;
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains("child_ledger_flow_key_in_flight{queue=\"keys\",flow_key=\"big\"} 5"),
        "{metrics}"
    );
    let r = app
        .request(Method::DELETE, "/v1/queues/keys/keys/big/limits", None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        (r.body["overridden"].clone(), r.body["max_in_flight"].clone()),
        (json!(false), json!(2))
    );
    assert!(taken(&claim(&app, "/v1/queues/keys/claims", 10).await).is_empty());
}

/// A queue's rate lets `burst` through at once, then `per_second`.
async fn a_rate_limit_meters_claims(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/queues/rate/limits", json!({"per_second": 10, "burst": 5}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    register(&app, "R", json!({"queue": "rate", "children": children(100)})).await;
    let start = tokio::time::Instant::now();
    let first = claim(&app, "/v1/queues/rate/claims", 50).await;
    assert_eq!(taken(&first).len(), 5, "the burst: {first}");
    let empty = claim(&app, "/v1/queues/rate/claims", 50).await;
    let got_now = taken(&empty).len();
    assert!(got_now <= 2, "{empty}");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let later = claim(&app, "/v1/queues/rate/claims", 50).await;
    let elapsed = start.elapsed().as_secs_f64();
    let total = 5 + got_now + taken(&later).len();
    assert!(
        total as f64 <= 5.0 + 10.0 * elapsed + 1.0,
        "{total} claimed in {elapsed:.2} s at 10/s after a burst of 5"
    );
    assert_eq!(
        taken(&later).len(),
        5,
        "a second refills the bucket, to its burst: {later}"
    );
    let limits = app.get("/v1/queues/rate/limits").await.body;
    assert!(limits["tokens"].as_f64().unwrap() < 5.0, "{limits}");
}

/// A long poll held back by a cap is answered as soon as an outcome frees a slot.
async fn a_long_poll_wakes_when_a_slot_frees(backend: Backend) {
    let app = spawn_app(backend).await;
    app.put("/v1/queues/lp/limits", json!({"max_in_flight": 1})).await;
    register(&app, "L", json!({"queue": "lp", "children": children(3)})).await;
    let first = claim(&app, "/v1/queues/lp/claims", 5).await;
    assert_eq!(taken(&first).len(), 1);
    let poller = {
        let (base, client) = (app.base.clone(), app.client.clone());
        let token = app.token.clone();
        tokio::spawn(async move {
            let mut req = client
                .post(format!("{base}/v1/queues/lp/claims"))
                .json(&json!({"limit": 5, "wait_seconds": 10}));
            if let Some(token) = token {
                req = req.bearer_auth(token);
            }
            let started = tokio::time::Instant::now();
            let body: Value = req.send().await.unwrap().json().await.unwrap();
            (body, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    outcome(&app, "L", 0, first["claim_id"].as_str().unwrap()).await;
    let (body, waited) = poller.await.unwrap();
    assert_eq!(taken(&body).len(), 1, "{body}");
    assert!(waited < Duration::from_secs(3), "answered {waited:?} after it began");
}

/// `oldest` serves the oldest parent first; `fair` takes turns.
async fn a_queue_may_serve_oldest_first(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app.get("/v1/queues/old/settings").await;
    assert_eq!(r.body["order"], "fair", "{r:?}");
    let r = app.put("/v1/queues/old/settings", json!({"order": "oldest"})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(app.get("/v1/queues/old/settings").await.body["order"], "oldest");
    for p in ["A", "B"] {
        register(&app, p, json!({"queue": "old", "children": children(6)})).await;
    }
    let mut order = Vec::new();
    for _ in 0..4 {
        let c = claim(&app, "/v1/queues/old/claims", 4).await;
        order.extend(taken(&c).into_iter().map(|(p, _)| p));
    }
    assert_eq!(order.iter().filter(|p| *p == "A").count(), 6);
    assert_eq!(order[..6], ["A", "A", "A", "A", "A", "A"], "{order:?}");
    let r = app.put("/v1/queues/old/settings", json!({"order": "newest"})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{r:?}");
}

/// Bad admission input is a 4xx naming the field, and writes nothing; the
/// flow key is part of a registration's content.
async fn bad_admission_input_names_its_field(backend: Backend) {
    let app = spawn_app(backend).await;
    for (body, field) in [
        (json!({"flow_key": "has space", "children": []}), "flow_key"),
        (json!({"flow_key": "", "children": []}), "flow_key"),
        (
            json!({"retry_backoff": {"initial_seconds": 5, "max_seconds": 1}, "children": []}),
            "retry_backoff.max_seconds",
        ),
        (
            json!({"retry_backoff": {"initial_seconds": -1, "max_seconds": 1}, "children": []}),
            "retry_backoff.initial_seconds",
        ),
        (json!({"not_before": "tomorrow", "children": []}), "not_before"),
    ] {
        let r = app.put("/v1/parents/X", body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {r:?}");
        assert!(r.body.to_string().contains(field), "{body} should name {field}: {r:?}");
    }
    assert_eq!(app.get("/v1/parents/X").await.status, StatusCode::NOT_FOUND);
    for (body, field) in [
        (json!({"burst": 5}), "burst"),
        (json!({"max_in_flight": -1}), "max_in_flight"),
        (json!({"per_second": 0}), "per_second"),
        (json!({"per_key": {"burst": 0.5, "per_second": 1}}), "per_key.burst"),
        (json!({"limit": 5}), "limit"),
    ] {
        let r = app.put("/v1/queues/v/limits", body.clone()).await;
        assert!(r.status.is_client_error(), "{body}: {r:?}");
        assert!(r.body.to_string().contains(field), "{body} should name {field}: {r:?}");
    }
    let r = app.get("/v1/queues/v/keys/no%20space/limits").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(app.get("/v1/queues/v/limits").await.body["max_in_flight"], Value::Null);
    register(&app, "F", json!({"flow_key": "t-1", "children": children(1)})).await;
    let same = app
        .put("/v1/parents/F", json!({"flow_key": "t-1", "children": children(1)}))
        .await;
    assert_eq!(same.status, StatusCode::OK, "{same:?}");
    let other = app
        .put("/v1/parents/F", json!({"flow_key": "t-2", "children": children(1)}))
        .await;
    assert_eq!(other.status, StatusCode::CONFLICT, "{other:?}");
    assert_eq!(app.get("/v1/parents/F").await.body["flow_key"], "t-1");
}

both_stores!(
    a_parent_waits_for_its_not_before,
    a_child_waits_for_its_own_not_before,
    a_released_child_backs_off,
    a_queue_cap_holds_and_frees,
    a_key_at_its_cap_blocks_nobody_else,
    a_rate_limit_meters_claims,
    a_long_poll_wakes_when_a_slot_frees,
    a_queue_may_serve_oldest_first,
    bad_admission_input_names_its_field,
);

/// A long poll on one replica that a cap holds back is answered when an
/// outcome on another replica frees a slot: well before the lease it waits
/// behind runs out, and before its own recheck.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_poll_wakes_when_another_replica_frees_a_slot() {
    if !postgres_available().await {
        return;
    }
    let app = spawn_app(Backend::Postgres).await;
    let other = app.replica().await;
    app.put("/v1/queues/lp2/limits", json!({"max_in_flight": 1})).await;
    register(&app, "L2", json!({"queue": "lp2", "children": children(3)})).await;
    let first = claim(&app, "/v1/queues/lp2/claims", 5).await;
    assert_eq!(taken(&first).len(), 1);
    let poll = {
        let (base, client) = (other.base.clone(), other.client.clone());
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let body: Value = client
                .post(format!("{base}/v1/queues/lp2/claims"))
                .json(&json!({"limit": 5, "wait_seconds": 15}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (body, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let recorded = tokio::time::Instant::now();
    outcome(&app, "L2", 0, first["claim_id"].as_str().unwrap()).await;
    let (body, waited) = poll.await.unwrap();
    assert_eq!(taken(&body).len(), 1, "{body}");
    let after = waited.saturating_sub(Duration::from_millis(2500));
    println!("answered {after:?} after the outcome on the other replica");
    assert!(
        recorded.elapsed() < Duration::from_millis(1000),
        "answered {after:?} after the outcome"
    );
}

/// Eight claimers on two replicas never hold more of a key than its cap,
/// sampled from the database between claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caps_hold_across_replicas() {
    if !postgres_available().await {
        return;
    }
    let app = std::sync::Arc::new(spawn_app(Backend::Postgres).await);
    let other = std::sync::Arc::new(app.replica().await);
    app.put(
        "/v1/queues/race/limits",
        json!({"max_in_flight": 12, "per_key": {"max_in_flight": 3}}),
    )
    .await;
    for (p, key) in [("K1", "a"), ("K2", "a"), ("K3", "b"), ("K4", "c"), ("K5", "d")] {
        register(
            &app,
            p,
            json!({"queue": "race", "flow_key": key, "children": children(40)}),
        )
        .await;
    }
    let mut tasks = Vec::new();
    for w in 0..8 {
        let app = std::sync::Arc::clone(if w % 2 == 0 { &app } else { &other });
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < 25 {
                let c = claim(&app, "/v1/queues/race/claims", 4).await;
                let got = taken(&c);
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    done += 1;
                    continue;
                }
                for (p, s) in got {
                    outcome(&app, &p, s, c["claim_id"].as_str().unwrap()).await;
                }
            }
        }));
    }
    let mut worst: BTreeMap<String, i64> = BTreeMap::new();
    let mut queue_worst = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        let limits = app.get("/v1/queues/race/limits").await.body;
        queue_worst = queue_worst.max(limits["in_flight"].as_i64().unwrap());
        for k in limits["keys"].as_array().unwrap() {
            let e = worst.entry(k["flow_key"].as_str().unwrap().to_owned()).or_default();
            *e = (*e).max(k["in_flight"].as_i64().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(queue_worst <= 12, "queue in flight reached {queue_worst}");
    assert!(worst.values().all(|&n| n <= 3), "a key passed its cap: {worst:?}");
    let keys: BTreeSet<&String> = worst.keys().collect();
    assert!(keys.len() >= 3, "several keys were in flight at once: {worst:?}");
    let open = app
        .count("SELECT count(*) FROM child_status WHERE parent_id LIKE 'K%' AND state = 'pending'")
        .await;
    assert_eq!(open, 0, "every child was claimed and recorded");
}
