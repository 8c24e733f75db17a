//! A parent's verdict and tolerated failures, on both stores: the outcome
//! that crosses the tolerance (one of a batch, or one of two racing
//! workers', or an expiry that ran out of attempts) skips every open child
//! (`parent failed`) and completes the parent with verdict `failed` in its
//! own transaction; nothing is handed out afterwards; a holder's late
//! outcome is a logged conflict; `succeeded` and `cancelled` verdicts; and
//! reconcile finds and repairs a drifted verdict.

mod common;

use std::collections::HashMap;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn parent(app: &TestApp, parent: &str) -> Value {
    let r = app.get(&format!("/v1/parents/{parent}")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body
}

async fn claim(app: &TestApp, parent: &str, limit: usize, lease_seconds: u64) -> (String, Vec<i64>) {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": "verdict-test"}),
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

/// Posts one batch; the status of each write, in order.
async fn outcomes(app: &TestApp, parent: &str, claim_id: &str, writes: &[(i64, &str)]) -> Vec<String> {
    let outcomes: Vec<Value> = writes
        .iter()
        .map(|(s, outcome)| json!({"parent_id": parent, "sequence": s, "outcome": outcome, "reason": "boom", "claim_id": claim_id}))
        .collect();
    let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(r.status, StatusCode::OK, "outcomes: {r:?}");
    r.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect()
}

/// Every child of a parent, by sequence.
async fn children_of(app: &TestApp, parent: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let path = match after {
            Some(a) => format!("/v1/parents/{parent}/children?limit=1000&after={a}"),
            None => format!("/v1/parents/{parent}/children?limit=1000"),
        };
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        all.extend(r.body["children"].as_array().unwrap().iter().cloned());
        match r.body["next_after"].as_i64() {
            Some(a) => after = Some(a),
            None => return all,
        }
    }
}

fn count_states(children: &[Value]) -> HashMap<String, i64> {
    let mut counts = HashMap::new();
    for c in children {
        *counts.entry(c["state"].as_str().unwrap().to_owned()).or_default() += 1;
    }
    counts
}

async fn no_drift(app: &TestApp, parent: &str) {
    let r = app
        .post(&format!("/v1/parents/{parent}/reconcile"), json!({"dry_run": true}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["changes"], json!([]), "{}", r.body);
}

async fn one_outcome_of_a_batch_crosses(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "T",
        json!({"queue": "qt", "children": children(20), "tolerated_failures": {"count": 2}}),
    )
    .await;
    let p = parent(&app, "T").await;
    assert_eq!(p["verdict"], Value::Null);
    assert_eq!(p["tolerated_failures"], json!({"count": 2}));
    // A second worker holds 10..15 before the crossing.
    let (first, got) = claim(&app, "T", 10, 300).await;
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    let (late, held) = claim(&app, "T", 5, 300).await;
    assert_eq!(held, (10..15).collect::<Vec<_>>());

    // Two failures are tolerated.
    let statuses = outcomes(&app, "T", &first, &[(0, "failed"), (1, "processed"), (2, "failed")]).await;
    assert!(statuses.iter().all(|s| s == "applied"), "{statuses:?}");
    assert_eq!(parent(&app, "T").await["verdict"], Value::Null);

    // The third, in the middle of a batch, crosses: the whole batch is recorded.
    let statuses = outcomes(
        &app,
        "T",
        &first,
        &[(3, "processed"), (4, "failed"), (5, "processed"), (6, "processed")],
    )
    .await;
    assert!(statuses.iter().all(|s| s == "applied"), "{statuses:?}");
    let p = parent(&app, "T").await;
    assert_eq!(p["verdict"], "failed", "{p}");
    assert_eq!(p["state"], "complete", "{p}");
    assert_eq!(
        p["counts"],
        json!({"total": 20, "processed": 4, "failed": 3, "skipped": 13, "pending": 0, "in_flight": 0, "held": 0}),
        "{p}"
    );
    let all = children_of(&app, "T").await;
    for c in &all[7..] {
        assert_eq!(c["state"], "skipped", "{c}");
        assert_eq!(c["reason"], "parent failed", "{c}");
    }

    // Nothing is handed out afterwards, by the parent or the queue.
    assert!(claim(&app, "T", 100, 60).await.1.is_empty());
    let r = app
        .post("/v1/queues/qt/claims", json!({"limit": 100, "worker": "w"}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["children"], json!([]), "{r:?}");

    // The holders' late outcomes are conflicts, logged on the child.
    let statuses = outcomes(&app, "T", &late, &[(10, "processed")]).await;
    assert_eq!(statuses, ["conflict"]);
    let statuses = outcomes(&app, "T", &first, &[(7, "failed")]).await;
    assert_eq!(statuses, ["conflict"]);
    let child = app.get("/v1/parents/T/children/10").await.body;
    assert_eq!(child["state"], "skipped", "{child}");
    assert_eq!(child["conflict_count"], 1, "{child}");
    assert_eq!(child["conflicts"][0]["outcome"], "processed", "{child}");
    // The failed parent's counters still are its rows.
    assert_eq!(p["verdict"], parent(&app, "T").await["verdict"]);
    no_drift(&app, "T").await;

    // The summary tells why.
    let summary = app.get("/v1/parents/T/summary").await.body;
    assert_eq!(
        summary["reasons"],
        json!([{"state": "skipped", "reason": "parent failed", "count": 13}, {"state": "failed", "reason": "boom", "count": 3}])
    );
}

async fn racing_workers_cross_once(backend: Backend) {
    let app = spawn_app(backend).await;
    const N: usize = 400;
    register(
        &app,
        "R",
        json!({"queue": "qr", "children": children(N), "tolerated_failures": {"percent": 5.0}}),
    )
    .await;
    // Four workers each hold a quarter and fail every child, in batches of 10, at once.
    let mut claims = Vec::new();
    for _ in 0..4 {
        claims.push(claim(&app, "R", N / 4, 300).await);
    }
    let mut tasks = Vec::new();
    for (claim_id, sequences) in claims {
        let (base, client, token) = (app.base.clone(), app.client.clone(), app.token.clone());
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            for chunk in sequences.chunks(10) {
                let outcomes: Vec<Value> = chunk
                    .iter()
                    .map(|s| json!({"parent_id": "R", "sequence": s, "outcome": "failed", "claim_id": claim_id}))
                    .collect();
                let mut req = client
                    .post(format!("{base}/v1/outcomes"))
                    .json(&json!({"outcomes": outcomes}));
                if let Some(token) = &token {
                    req = req.bearer_auth(token);
                }
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                let body: Value = r.json().await.unwrap();
                for result in body["results"].as_array().unwrap() {
                    statuses.push(result["status"].as_str().unwrap().to_owned());
                }
            }
            statuses
        }));
    }
    let mut applied = 0;
    for task in tasks {
        for status in task.await.unwrap() {
            match status.as_str() {
                "applied" => applied += 1,
                "conflict" => {}
                other => panic!("unexpected status {other}"),
            }
        }
    }
    let p = parent(&app, "R").await;
    assert_eq!(p["verdict"], "failed", "{p}");
    // 5% of 400 is 20: the 21st failure crossed; every write that lost it
    // was told so, and every child has exactly one terminal state.
    assert!(applied > 20, "{applied}");
    let all = children_of(&app, "R").await;
    let counts = count_states(&all);
    assert_eq!(counts.get("failed").copied().unwrap_or(0), applied, "{counts:?}");
    assert_eq!(
        counts.get("failed").copied().unwrap_or(0) + counts.get("skipped").copied().unwrap_or(0),
        N as i64
    );
    assert_eq!(p["counts"]["failed"], applied);
    assert_eq!(p["counts"]["skipped"], N as i64 - applied);
    no_drift(&app, "R").await;
}

async fn an_expiry_that_runs_out_of_attempts_crosses(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "X",
        json!({"queue": "qx", "children": children(5), "max_attempts": 1, "tolerated_failures": {"count": 0}}),
    )
    .await;
    let (claim_id, got) = claim(&app, "X", 1, 300).await;
    assert_eq!(got, [0]);
    app.expire_claim(&claim_id).await;
    // A short claim takes what is pending, then sweeps the lease that ran
    // out: the child fails, and the parent with it, those just taken too.
    let (taken, next) = claim(&app, "X", 10, 300).await;
    assert_eq!(next, [1, 2, 3, 4]);
    let p = parent(&app, "X").await;
    assert!(claim(&app, "X", 10, 300).await.1.is_empty());
    assert_eq!(outcomes(&app, "X", &taken, &[(1, "processed")]).await, ["conflict"]);
    assert_eq!(p["verdict"], "failed", "{p}");
    assert_eq!(p["counts"]["failed"], 1, "{p}");
    assert_eq!(p["counts"]["skipped"], 4, "{p}");
    no_drift(&app, "X").await;
}

async fn succeeded_and_cancelled(backend: Backend) {
    let app = spawn_app(backend).await;
    // No tolerance: failures do not fail it.
    register(&app, "S", json!({"children": children(3)})).await;
    let (c, _) = claim(&app, "S", 3, 300).await;
    outcomes(&app, "S", &c, &[(0, "failed"), (1, "failed"), (2, "processed")]).await;
    let p = parent(&app, "S").await;
    assert_eq!(
        (p["verdict"].clone(), p["tolerated_failures"].clone()),
        (json!("succeeded"), Value::Null)
    );
    // Within its tolerance: succeeded.
    register(
        &app,
        "W",
        json!({"children": children(10), "tolerated_failures": {"percent": 20.0}}),
    )
    .await;
    let (c, _) = claim(&app, "W", 10, 300).await;
    let writes: Vec<(i64, &str)> = (0..10)
        .map(|s| (s, if s < 2 { "failed" } else { "processed" }))
        .collect();
    outcomes(&app, "W", &c, &writes).await;
    assert_eq!(parent(&app, "W").await["verdict"], "succeeded");
    // Cancelled, with one in flight.
    register(
        &app,
        "C",
        json!({"children": children(4), "tolerated_failures": {"count": 0}}),
    )
    .await;
    let (c, _) = claim(&app, "C", 1, 300).await;
    let r = app.post("/v1/parents/C/cancel", json!({"reason": "called off"})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let p = parent(&app, "C").await;
    assert_eq!(p["verdict"], "cancelled", "{p}");
    assert_eq!(outcomes(&app, "C", &c, &[(0, "failed")]).await, ["conflict"]);
    assert_eq!(parent(&app, "C").await["verdict"], "cancelled");
    no_drift(&app, "C").await;
    // A tolerance is part of the registration: another one is a conflict.
    let r = app
        .put(
            "/v1/parents/W",
            json!({"children": children(10), "tolerated_failures": {"percent": 25.0}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    let r = app
        .put(
            "/v1/parents/W",
            json!({"children": children(10), "tolerated_failures": {"percent": 20.0}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

async fn reconcile_repairs_a_drifted_verdict(backend: Backend) {
    let app = spawn_app(backend).await;
    register(
        &app,
        "D",
        json!({"children": children(6), "tolerated_failures": {"count": 1}}),
    )
    .await;
    let (c, _) = claim(&app, "D", 6, 300).await;
    outcomes(&app, "D", &c, &[(0, "failed"), (1, "failed")]).await;
    assert_eq!(parent(&app, "D").await["verdict"], "failed");
    // The counter drifts: the stored projection now says it succeeded.
    app.exec("UPDATE parent SET failed = 0, processed = 2 WHERE parent_id = 'D'")
        .await;
    assert_eq!(parent(&app, "D").await["verdict"], "succeeded");
    let r = app.post("/v1/parents/D/reconcile", json!({"dry_run": true})).await;
    let changes = r.body["changes"].as_array().unwrap().clone();
    assert!(
        changes.contains(&json!({"field": "verdict", "from": "succeeded", "to": "failed"})),
        "{changes:?}"
    );
    assert_eq!(
        parent(&app, "D").await["verdict"],
        "succeeded",
        "a dry run writes nothing"
    );
    let r = app.post("/v1/parents/D/reconcile", json!({"dry_run": false})).await;
    assert_eq!(r.body["applied"], true, "{r:?}");
    assert_eq!(parent(&app, "D").await["verdict"], "failed");
    no_drift(&app, "D").await;

    // Rows past the tolerance with children still open (the counters had
    // hidden the crossing): the repair ends the parent as the outcome would have.
    register(
        &app,
        "E",
        json!({"children": children(6), "tolerated_failures": {"count": 1}}),
    )
    .await;
    let (c, _) = claim(&app, "E", 1, 300).await;
    outcomes(&app, "E", &c, &[(0, "failed")]).await;
    app.exec("UPDATE child SET state = 'failed', reason = 'drift', terminal_at = changed_at WHERE parent_id = 'E' AND sequence = 5")
        .await;
    let r = app.post("/v1/parents/E/reconcile", json!({"dry_run": false})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let p = parent(&app, "E").await;
    assert_eq!(p["verdict"], "failed", "{p}");
    assert_eq!(p["counts"]["skipped"], 4, "{p}");
    no_drift(&app, "E").await;
}

async fn bad_tolerances_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    for (body, field) in [
        (json!({"count": -1}), "tolerated_failures.count"),
        (json!({"count": 1.5}), "tolerated_failures.count"),
        (json!({"percent": 100.5}), "tolerated_failures.percent"),
        (json!({"percent": -0.1}), "tolerated_failures.percent"),
        (json!({"count": 1, "percent": 1.0}), "tolerated_failures"),
        (json!({}), "tolerated_failures"),
        (json!({"ratio": 1}), "tolerated_failures.ratio"),
        (json!(5), "tolerated_failures"),
    ] {
        let r = app
            .put(
                "/v1/parents/B",
                json!({"children": children(1), "tolerated_failures": body}),
            )
            .await;
        assert!(r.status.is_client_error(), "{body}: {r:?}");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    assert_eq!(app.get("/v1/parents/B").await.status, StatusCode::NOT_FOUND);
}

both_stores!(
    one_outcome_of_a_batch_crosses,
    racing_workers_cross_once,
    an_expiry_that_runs_out_of_attempts_crosses,
    succeeded_and_cancelled,
    reconcile_repairs_a_drifted_verdict,
    bad_tolerances_are_refused
);
