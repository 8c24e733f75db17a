//! Concurrent claimers never receive the same live child, and concurrent outcome
//! writers for one child produce exactly one winner.

mod common;

use std::collections::BTreeSet;

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

/// Claims chunks of 7 from `url` until a claim comes back empty; returns every
/// `(parent_id, sequence)` this worker received.
async fn claim_until_empty(client: reqwest::Client, url: String, worker: String) -> Vec<(String, u64)> {
    let mut got = Vec::new();
    for _ in 0..1000 {
        let resp = client
            .post(&url)
            .json(&json!({"limit": 7, "lease_seconds": 300, "worker": worker}))
            .send()
            .await
            .expect("claim request");
        let status = resp.status();
        let body: Value = resp.json().await.expect("claim body is JSON");
        assert_eq!(status, StatusCode::OK, "claim by {worker}: {body}");
        let claimed = body["children"].as_array().expect("children array");
        if claimed.is_empty() {
            return got;
        }
        assert!(claimed.len() <= 7, "claim over its limit: {body}");
        for child in claimed {
            assert_eq!(child["attempt"], 1, "no child is claimed twice: {child}");
            got.push((
                child["parent_id"].as_str().expect("parent_id").to_owned(),
                child["sequence"].as_u64().expect("sequence"),
            ));
        }
    }
    panic!("{worker} never saw an empty claim");
}

/// Runs `workers` concurrent claimers against `path` and checks that together
/// they received exactly `expected`, each child once.
async fn claim_concurrently(app: &TestApp, path: &str, workers: usize, expected: &BTreeSet<(String, u64)>) {
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            tokio::spawn(claim_until_empty(
                app.client.clone(),
                format!("{}{path}", app.base),
                format!("worker-{w}"),
            ))
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("claimer task"));
    }
    let unique: BTreeSet<(String, u64)> = all.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        all.len(),
        "{} duplicate hand-outs",
        all.len() - unique.len()
    );
    assert_eq!(&unique, expected, "claimers together cover every child exactly once");

    // Everything is under a live lease now.
    let r = app.post(path, json!({"limit": 1000})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["children"], json!([]), "nothing left to claim: {r:?}");
}

async fn parent_claimers(backend: Backend, workers: usize) {
    let app = spawn_app(backend).await;
    register(&app, "P-conc", "events", 500).await;
    let expected = (0..500).map(|s| ("P-conc".to_owned(), s)).collect();
    claim_concurrently(&app, "/v1/parents/P-conc/claims", workers, &expected).await;

    let r = app.get("/v1/parents/P-conc").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["counts"]["in_flight"], 500, "{r:?}");
    assert_eq!(r.body["counts"]["pending"], 0, "{r:?}");
}

async fn two_parent_claimers(backend: Backend) {
    parent_claimers(backend, 2).await;
}

async fn eight_parent_claimers(backend: Backend) {
    parent_claimers(backend, 8).await;
}

async fn eight_queue_claimers(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut expected = BTreeSet::new();
    for p in 0..5 {
        let parent = format!("P-q{p}");
        register(&app, &parent, "bulk", 100).await;
        expected.extend((0..100).map(|s| (parent.clone(), s)));
    }
    // A parent in another queue is never handed out by this queue's claims.
    register(&app, "P-elsewhere", "other", 10).await;

    claim_concurrently(&app, "/v1/queues/bulk/claims", 8, &expected).await;

    let r = app.get("/v1/parents/P-elsewhere").await;
    assert_eq!(r.body["counts"]["pending"], 10, "{r:?}");
    assert_eq!(r.body["counts"]["in_flight"], 0, "{r:?}");
}

async fn conflicting_outcomes(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "P-race", "events", 1).await;
    let r = app
        .post("/v1/parents/P-race/claims", json!({"limit": 1, "lease_seconds": 300}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["children"][0]["sequence"], 0, "{r:?}");
    let claim_id = r.body["claim_id"].as_str().expect("claim_id").to_owned();

    let url = format!("{}/v1/parents/P-race/children/0/outcome", app.base);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let client = app.client.clone();
            let url = url.clone();
            let processed = i % 2 == 0;
            let body = if processed {
                json!({"outcome": "processed", "claim_id": claim_id})
            } else {
                json!({"outcome": "failed", "reason": "remote said no", "claim_id": claim_id})
            };
            tokio::spawn(async move {
                let resp = client.post(&url).json(&body).send().await.expect("outcome request");
                let status = resp.status();
                let content_type = resp
                    .headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                let body: Value = resp.json().await.expect("outcome body is JSON");
                (processed, status, content_type, body)
            })
        })
        .collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("outcome task"));
    }

    let winners: Vec<_> = replies
        .iter()
        .filter(|(_, status, _, body)| *status == StatusCode::OK && body["applied"] == true)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one write wins: {replies:#?}");
    let winner = if winners[0].0 { "processed" } else { "failed" };
    let loser = if winners[0].0 { "failed" } else { "processed" };

    let (mut duplicates, mut conflicts) = (0, 0);
    for (processed, status, content_type, body) in &replies {
        let mine = if *processed { "processed" } else { "failed" };
        if *status == StatusCode::OK && body["applied"] == true {
            assert_eq!(mine, winner);
            assert_eq!(body["child"]["state"], winner, "{body}");
        } else if mine == winner {
            assert_eq!(*status, StatusCode::OK, "same outcome again is a duplicate: {body}");
            assert_eq!(body["applied"], false, "{body}");
            assert_eq!(body["child"]["state"], winner, "{body}");
            duplicates += 1;
        } else {
            assert_eq!(*status, StatusCode::CONFLICT, "different outcome conflicts: {body}");
            assert!(content_type.starts_with("application/problem+json"), "{content_type}");
            let kind = body["type"].as_str().expect("problem type");
            assert!(kind.ends_with("outcome-conflict"), "{body}");
            assert_eq!(body["status"], 409, "{body}");
            assert!(body["child"].is_object(), "conflict carries the child: {body}");
            assert_eq!(body["child"]["state"], winner, "{body}");
            assert_eq!(body["child"]["outcome"], winner, "{body}");
            conflicts += 1;
        }
    }
    assert_eq!(duplicates, 9);
    assert_eq!(conflicts, 10);

    let r = app.get("/v1/parents/P-race").await;
    assert_eq!(r.status, StatusCode::OK);
    let counts = &r.body["counts"];
    let terminal = counts["processed"].as_u64().unwrap() + counts["failed"].as_u64().unwrap();
    assert_eq!(terminal, 1, "one child, one terminal outcome: {r:?}");
    assert_eq!(counts[winner], 1, "{r:?}");
    assert_eq!(r.body["complete"], true, "{r:?}");

    // Late writes are answered and recorded, never silently dropped.
    let r = app.get("/v1/parents/P-race/children/0").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["state"], winner, "{r:?}");
    let recorded = r.body["conflicts"].as_array().expect("conflicts list");
    assert_eq!(recorded.len(), 10, "every losing write is recorded: {r:?}");
    for conflict in recorded {
        assert_eq!(conflict["outcome"], loser, "{conflict}");
        assert_eq!(conflict["claim_id"], claim_id.as_str(), "{conflict}");
        assert!(conflict["at"].is_string(), "{conflict}");
    }
}

both_stores!(
    two_parent_claimers,
    eight_parent_claimers,
    eight_queue_claimers,
    conflicting_outcomes
);
