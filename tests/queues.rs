//! The dashboards' read model: every figure of `GET /v1/queues` against a
//! known scenario, and the children search across parents paged to the end
//! with no child twice and none missing.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn claim(app: &TestApp, parent: &str, limit: u64) -> String {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": 300}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim {parent}: {r:?}");
    r.body["claim_id"].as_str().unwrap().to_owned()
}

async fn outcome(app: &TestApp, parent: &str, sequence: u64, body: Value) {
    let r = app
        .post(&format!("/v1/parents/{parent}/children/{sequence}/outcome"), body)
        .await;
    assert_eq!(r.status, StatusCode::OK, "outcome {parent}/{sequence}: {r:?}");
    assert_eq!(r.body["applied"], true, "{r:?}");
}

async fn queue(app: &TestApp, name: &str) -> Value {
    let r = app.get(&format!("/v1/queues/{name}")).await;
    assert_eq!(r.status, StatusCode::OK, "GET queue {name}: {r:?}");
    r.body
}

/// Every figure of a queue with parents in every state and children in
/// every state, against what the scenario made.
async fn queue_figures_match_a_known_scenario(backend: Backend) {
    let app = spawn_app(backend).await;
    // qa/P1: 6 children, one skipped at registration; 3 claimed, of which one
    // processed and one failed, one still in flight; 2 pending.
    let mut children = children(6);
    children[5]["skip"] = json!("invalid input");
    register(&app, "P1", json!({"queue": "qa", "children": children})).await;
    let first = claim(&app, "P1", 3).await;
    outcome(&app, "P1", 0, json!({"outcome": "processed", "claim_id": first})).await;
    outcome(
        &app,
        "P1",
        1,
        json!({"outcome": "failed", "reason": "boom", "claim_id": first}),
    )
    .await;
    // qa/P2: its 2 children's leases run out under the hold policy.
    register(
        &app,
        "P2",
        json!({"queue": "qa", "children": children_n(2), "expired_lease": "hold"}),
    )
    .await;
    let held = claim(&app, "P2", 2).await;
    app.expire_claim(&held).await;
    // qa/P3 is still being decomposed; qa/P4 is complete.
    register(&app, "P3", json!({"queue": "qa", "decomposed": false})).await;
    register(&app, "P4", json!({"queue": "qa", "children": children_n(1)})).await;
    let last = claim(&app, "P4", 1).await;
    outcome(&app, "P4", 0, json!({"outcome": "processed", "claim_id": last})).await;
    // qb/P5: 3 pending children, nothing else.
    register(&app, "P5", json!({"queue": "qb", "children": children_n(3)})).await;

    let started = Instant::now();
    while app.get("/v1/parents/P2/children/1").await.body["state"] != "held" {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the expired leases were never swept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let qa = queue(&app, "qa").await;
    assert_eq!(qa["queue"], "qa");
    assert_eq!(qa["paused"], false);
    assert_eq!(
        qa["parents"],
        json!({"decomposing": 1, "active": 2, "complete": 1}),
        "{qa}"
    );
    assert_eq!(
        qa["children"],
        json!({"total": 9, "processed": 2, "failed": 1, "skipped": 1, "pending": 2, "in_flight": 1, "held": 2}),
        "{qa}"
    );
    // The longest-waiting pending child: P1's, pending since registration.
    let pending = app.get("/v1/children?queue=qa&state=pending").await;
    assert_eq!(pending.status, StatusCode::OK, "{pending:?}");
    let since: Vec<&str> = pending.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["changed_at"].as_str().unwrap())
        .collect();
    assert_eq!(since.len(), 2, "{pending:?}");
    let oldest = qa["oldest_pending_since"].as_str().expect("a pending child waits");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(oldest).unwrap(),
        since
            .iter()
            .map(|s| chrono::DateTime::parse_from_rfc3339(s).unwrap())
            .min()
            .unwrap(),
        "{qa}"
    );
    // Two processed and one failed within the last minute (a minute boundary
    // passed meanwhile weighs the earlier minute's by what the window still covers).
    let processed = qa["throughput"]["processed_per_minute"].as_f64().unwrap();
    let failed = qa["throughput"]["failed_per_minute"].as_f64().unwrap();
    assert!((1.8..=2.0).contains(&processed), "{qa}");
    assert!((0.9..=1.0).contains(&failed), "{qa}");

    // The same figures as per-queue gauges.
    let metrics = app
        .client
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"child_ledger_queue_children{queue="qa",state="pending"} 2"#,
        r#"child_ledger_queue_children{queue="qa",state="in_flight"} 1"#,
        r#"child_ledger_queue_children{queue="qa",state="held"} 2"#,
        r#"child_ledger_queue_children{queue="qb",state="pending"} 3"#,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} not in\n{metrics}");
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with(r#"child_ledger_queue_oldest_pending_age_seconds{queue="qa"} "#)),
        "{metrics}"
    );

    let qb = queue(&app, "qb").await;
    assert_eq!(
        qb["parents"],
        json!({"decomposing": 0, "active": 1, "complete": 0}),
        "{qb}"
    );
    assert_eq!(
        qb["children"],
        json!({"total": 3, "processed": 0, "failed": 0, "skipped": 0, "pending": 3, "in_flight": 0, "held": 0}),
        "{qb}"
    );
    assert_eq!(
        qb["throughput"],
        json!({"processed_per_minute": 0.0, "failed_per_minute": 0.0})
    );
    assert!(qb["oldest_pending_since"].is_string(), "{qb}");

    let all = app.get("/v1/queues").await;
    assert_eq!(all.status, StatusCode::OK, "{all:?}");
    // The throughput decays with the clock once the first events are a
    // minute old, so the reads agree on it only to within a moment's decay.
    let (mut listed, mut read) = (all.body["queues"].clone(), json!([qa, qb]));
    for (listed, read) in listed
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .zip(read.as_array_mut().unwrap())
    {
        for rate in ["processed_per_minute", "failed_per_minute"] {
            let (a, b) = (listed["throughput"][rate].take(), read["throughput"][rate].take());
            assert!(
                (a.as_f64().unwrap() - b.as_f64().unwrap()).abs() < 0.05,
                "{rate}: listed {a}, read {b}"
            );
        }
    }
    assert_eq!(listed, read, "the list shows each queue as its own read does");

    // A queue that never had a parent, and a name that cannot be one.
    let r = app.get("/v1/queues/nothing-here").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
    let r = app.get("/v1/queues/Not%20a%20queue").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");

    // Once everything is done, nothing is pending and no age is shown.
    let r = app.post(&format!("/v1/claims/{first}/release"), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let mut outcomes = Vec::new();
    for sequence in 2..5 {
        outcomes.push(json!({"parent_id": "P1", "sequence": sequence, "outcome": "skipped", "reason": "done"}));
    }
    for sequence in 0..2 {
        outcomes.push(json!({"parent_id": "P2", "sequence": sequence, "outcome": "skipped", "reason": "done"}));
    }
    let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let qa = queue(&app, "qa").await;
    assert_eq!(
        qa["parents"],
        json!({"decomposing": 1, "active": 0, "complete": 3}),
        "{qa}"
    );
    assert_eq!(
        qa["children"],
        json!({"total": 9, "processed": 2, "failed": 1, "skipped": 6, "pending": 0, "in_flight": 0, "held": 0}),
        "{qa}"
    );
    assert_eq!(qa["oldest_pending_since"], Value::Null, "{qa}");
}

/// `children(n)` as a JSON array value.
fn children_n(n: usize) -> Value {
    json!(children(n))
}

/// Failed children of a queue across three parents, paged four at a time:
/// every one exactly once, newest change first, though a batch gives many of
/// them the same change time.
async fn children_search_pages_across_parents(backend: Backend) {
    let app = spawn_app(backend).await;
    let mut expected = HashSet::new();
    for parent in ["S-a", "S-b", "S-c"] {
        register(&app, parent, json!({"queue": "qs", "children": children_n(9)})).await;
        let outcomes: Vec<Value> = (0..9)
            .map(|sequence| {
                if sequence % 3 != 2 {
                    expected.insert((parent.to_owned(), sequence));
                }
                let outcome = if sequence % 3 == 2 { "processed" } else { "failed" };
                json!({"parent_id": parent, "sequence": sequence, "outcome": outcome, "reason": "no"})
            })
            .collect();
        let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
    // Another queue's failed child stays out.
    register(
        &app,
        "S-other",
        json!({"queue": "elsewhere", "children": children_n(1)}),
    )
    .await;
    outcome(&app, "S-other", 0, json!({"outcome": "failed", "reason": "no"})).await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v1/children?queue=qs&state=failed&limit=4&cursor={cursor}"),
            None => "/v1/children?queue=qs&state=failed&limit=4".to_owned(),
        };
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        pages += 1;
        for child in r.body["children"].as_array().unwrap() {
            assert_eq!(child["state"], "failed", "{child}");
            seen.push((
                child["parent_id"].as_str().unwrap().to_owned(),
                child["sequence"].as_i64().unwrap(),
                child["changed_at"].as_str().unwrap().to_owned(),
            ));
        }
        match r.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 20, "paging does not end");
    }
    let keys: HashSet<(String, i64)> = seen.iter().map(|(p, s, _)| (p.clone(), *s)).collect();
    println!("{} failed children of 3 parents in {pages} pages of 4", seen.len());
    assert_eq!(keys.len(), seen.len(), "a child came twice: {seen:?}");
    assert_eq!(keys, expected, "children missing or extra");
    let times: Vec<chrono::DateTime<chrono::FixedOffset>> = seen
        .iter()
        .map(|(_, _, t)| chrono::DateTime::parse_from_rfc3339(t).unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "not newest first: {seen:?}");

    // One parent's children, every state, without `state`.
    let r = app.get("/v1/children?parent_id=S-b&limit=100").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["children"].as_array().unwrap().len(), 9, "{r:?}");

    // Without a parent the state is required, and a cursor must be one we gave.
    for bad in [
        "/v1/children?queue=qs",
        "/v1/children?state=failed&cursor=nonsense",
        "/v1/children?state=lost",
    ] {
        let r = app.get(bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {r:?}");
        assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
    }
    let r = app.get("/v1/children?queue=qs").await;
    assert!(
        r.body.to_string().contains("state"),
        "the problem names the field: {r:?}"
    );
}

/// The longest-waiting pending child once most of a queue's children were
/// recorded: those children, processed by the claim that held them, were
/// registered first and do not count. A child given back waits since it was
/// given back; a child never claimed since it was registered.
async fn oldest_pending_skips_recorded_children(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "O1", json!({"queue": "qo", "children": children_n(4)})).await;
    let held = claim(&app, "O1", 4).await;
    let outcomes: Vec<Value> = (0..3)
        .map(|sequence| json!({"parent_id": "O1", "sequence": sequence, "outcome": "processed", "claim_id": held}))
        .collect();
    let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let qo = queue(&app, "qo").await;
    assert_eq!(
        qo["oldest_pending_since"],
        Value::Null,
        "only one child left, in flight: {qo}"
    );

    tokio::time::sleep(Duration::from_millis(20)).await;
    let r = app.post(&format!("/v1/claims/{held}/release"), json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let given_back = app.get("/v1/parents/O1/children/3").await.body;
    assert_eq!(given_back["state"], "pending", "{given_back}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    register(&app, "O2", json!({"queue": "qo", "children": children_n(2)})).await;
    let fresh = app.get("/v1/parents/O2/children/0").await.body;
    let at = |child: &Value| chrono::DateTime::parse_from_rfc3339(child["changed_at"].as_str().unwrap()).unwrap();
    assert!(at(&fresh) > at(&given_back), "{fresh} {given_back}");

    let qo = queue(&app, "qo").await;
    assert_eq!(
        qo["children"],
        json!({"total": 6, "processed": 3, "failed": 0, "skipped": 0, "pending": 3, "in_flight": 0, "held": 0}),
        "{qo}"
    );
    let oldest = qo["oldest_pending_since"].as_str().expect("three children wait");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(oldest).unwrap(),
        at(&given_back),
        "{qo}"
    );

    // Claimed again and recorded, the given-back child no longer waits: the
    // fresh ones do, since their registration.
    let again = claim(&app, "O1", 1).await;
    outcome(&app, "O1", 3, json!({"outcome": "processed", "claim_id": again})).await;
    let qo = queue(&app, "qo").await;
    let oldest = qo["oldest_pending_since"].as_str().expect("two children wait");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(oldest).unwrap(),
        at(&fresh),
        "{qo}"
    );
}

both_stores!(
    queue_figures_match_a_known_scenario,
    children_search_pages_across_parents,
    oldest_pending_skips_recorded_children
);
