//! Listing parents: filters by queue and derived state, the scheduler's
//! `resumable` query, and cursor pagination, oldest first; the dashboard's
//! filters (`has`, `order`, `created_after/before`) and fields.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn ids(reply: &Reply) -> Vec<String> {
    reply.body["parents"]
        .as_array()
        .unwrap_or_else(|| panic!("no parents in {reply:?}"))
        .iter()
        .map(|p| p["parent_id"].as_str().unwrap().to_owned())
        .collect()
}

async fn list(app: &TestApp, query: &str) -> Reply {
    let reply = app.get(&format!("/v1/parents?{query}")).await;
    assert_eq!(reply.status, StatusCode::OK, "{query}: {reply:?}");
    reply
}

async fn lists_parents(backend: Backend) {
    let app = spawn_app(backend).await;
    // active with pending work; A-2: everything in flight; A-3: complete;
    // decomposing; B-1: active, other queue.
    for (id, body) in [
        ("A-1", json!({"queue": "a", "children": children(3)})),
        ("A-2", json!({"queue": "a", "children": children(2)})),
        (
            "A-3",
            json!({"queue": "a", "children": [{"payload": 1, "skip": "invalid"}]}),
        ),
        ("A-4", json!({"queue": "a", "decomposed": false})),
        ("B-1", json!({"queue": "b", "children": children(1)})),
    ] {
        let r = app.put(&format!("/v1/parents/{id}"), body).await;
        assert_eq!(r.status, StatusCode::CREATED, "{id}: {r:?}");
    }
    let claimed = app.post("/v1/parents/A-2/claims", json!({"limit": 10})).await;
    assert_eq!(claimed.body["children"].as_array().unwrap().len(), 2);

    assert_eq!(ids(&list(&app, "").await), ["A-1", "A-2", "A-3", "A-4", "B-1"]);
    assert_eq!(ids(&list(&app, "queue=a").await), ["A-1", "A-2", "A-3", "A-4"]);
    assert_eq!(ids(&list(&app, "queue=b").await), ["B-1"]);
    assert!(ids(&list(&app, "queue=none").await).is_empty());
    assert_eq!(ids(&list(&app, "state=active").await), ["A-1", "A-2", "B-1"]);
    assert_eq!(ids(&list(&app, "state=complete").await), ["A-3"]);
    assert_eq!(ids(&list(&app, "state=decomposing").await), ["A-4"]);
    assert_eq!(ids(&list(&app, "queue=a&state=active").await), ["A-1", "A-2"]);
    // The scheduler's query: active parents with a child claimable now.
    assert_eq!(ids(&list(&app, "resumable=true").await), ["A-1", "B-1"]);
    assert_eq!(ids(&list(&app, "queue=a&resumable=true").await), ["A-1"]);

    let listed = list(&app, "queue=a").await;
    let a1 = &listed.body["parents"][0];
    assert_eq!(a1["state"], "active");
    assert_eq!(a1["counts"]["pending"], 3, "{a1}");
    assert!(
        a1.get("payload").is_none(),
        "payloads are only included on request: {a1}"
    );
    let a2 = &listed.body["parents"][1];
    assert_eq!(a2["counts"]["in_flight"], 2, "{a2}");
    let a3 = &listed.body["parents"][2];
    assert_eq!(a3["complete"], true, "{a3}");
    assert!(a3["completed_at"].is_string(), "{a3}");

    // Pages of two, oldest first, until next_cursor is null.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..5 {
        let query = match &cursor {
            Some(c) => format!("limit=2&cursor={c}"),
            None => "limit=2".to_owned(),
        };
        let page = list(&app, &query).await;
        let page_ids = ids(&page);
        assert!(page_ids.len() <= 2, "{page:?}");
        seen.extend(page_ids);
        match &page.body["next_cursor"] {
            Value::String(next) => cursor = Some(next.clone()),
            Value::Null => break,
            other => panic!("next_cursor {other}"),
        }
    }
    assert_eq!(seen, ["A-1", "A-2", "A-3", "A-4", "B-1"]);

    // Bad queries are 400 problems naming the parameter; nothing is listed.
    for (query, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=x", "limit"),
        ("state=failed", "state"),
        ("resumable=maybe", "resumable"),
        ("cursor=not-a-cursor", "cursor"),
        ("queue=UPPER", "queue"),
        ("colour=red", "colour"),
    ] {
        let r = app.get(&format!("/v1/parents?{query}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {r:?}");
        assert!(r.content_type.starts_with("application/problem+json"), "{query}: {r:?}");
        assert!(
            r.body.to_string().contains(field),
            "{query} does not name {field}: {r:?}"
        );
    }
}

/// Claims one child of `parent` and records `outcome` for it; returns the claim id.
async fn finish_one(app: &TestApp, parent: &str, outcome: &str) -> Value {
    let claim = app
        .post(&format!("/v1/parents/{parent}/claims"), json!({"limit": 1}))
        .await;
    let claim_id = claim.body["claim_id"].clone();
    let r = app
        .post(
            &format!("/v1/parents/{parent}/children/0/outcome"),
            json!({"outcome": outcome, "claim_id": claim_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    claim_id
}

/// `has=failed|held|conflicts`, `order=newest` with its own paging,
/// `created_after/before`, and each parent's `priority`, `created_at` and
/// `last_progress_at`.
async fn dashboard_filters_and_fields(backend: Backend) {
    let app = spawn_app(backend).await;
    for (id, extra) in [
        ("D-plain", json!({})),
        ("D-failed", json!({})),
        ("D-conflict", json!({})),
        ("D-held", json!({"expired_lease": "hold", "priority": 7})),
    ] {
        let mut body = json!({"queue": "dash", "children": children(2)});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        assert_eq!(
            app.put(&format!("/v1/parents/{id}"), body).await.status,
            StatusCode::CREATED
        );
        // Distinct registration times, even at SQLite's millisecond precision.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let plain = app.get("/v1/parents/D-plain").await.body;
    assert_eq!(plain["priority"], 0);
    assert!(plain["created_at"].is_string(), "{plain}");
    assert!(plain["last_progress_at"].is_null(), "no outcome yet: {plain}");

    finish_one(&app, "D-failed", "failed").await;
    let failed = app.get("/v1/parents/D-failed").await.body;
    let progress = failed["last_progress_at"].as_str().expect("progress after an outcome");
    assert!(progress >= failed["created_at"].as_str().unwrap(), "{failed}");

    let claim_id = finish_one(&app, "D-conflict", "processed").await;
    let late = app
        .post(
            "/v1/parents/D-conflict/children/0/outcome",
            json!({"outcome": "failed", "claim_id": claim_id}),
        )
        .await;
    assert_eq!(late.status, StatusCode::CONFLICT, "{late:?}");

    let held = app
        .post("/v1/parents/D-held/claims", json!({"limit": 1, "lease_seconds": 1}))
        .await;
    assert_eq!(held.body["children"].as_array().unwrap().len(), 1);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    // A short claim sweeps the expired lease: the child is held, the other one claimed.
    app.post("/v1/parents/D-held/claims", json!({"limit": 10})).await;
    assert_eq!(app.get("/v1/parents/D-held").await.body["counts"]["held"], 1);

    assert_eq!(ids(&list(&app, "queue=dash&has=failed").await), ["D-failed"]);
    assert_eq!(ids(&list(&app, "queue=dash&has=held").await), ["D-held"]);
    assert_eq!(ids(&list(&app, "queue=dash&has=conflicts").await), ["D-conflict"]);
    assert_eq!(
        ids(&list(&app, "queue=dash&order=newest").await),
        ["D-held", "D-conflict", "D-failed", "D-plain"]
    );
    assert_eq!(
        ids(&list(&app, "queue=dash&order=oldest").await),
        ["D-plain", "D-failed", "D-conflict", "D-held"]
    );
    // Newest first, in pages of one: each parent once.
    let mut paged = Vec::new();
    let mut cursor = String::new();
    loop {
        let page = list(&app, &format!("queue=dash&order=newest&limit=1{cursor}")).await;
        paged.extend(ids(&page));
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert_eq!(paged, ["D-held", "D-conflict", "D-failed", "D-plain"]);

    let failed_at = app_created(&app, "D-failed").await;
    let conflict_at = app_created(&app, "D-conflict").await;
    assert_eq!(
        ids(&list(&app, &format!("queue=dash&created_after={failed_at}")).await),
        ["D-conflict", "D-held"]
    );
    assert_eq!(
        ids(&list(&app, &format!("queue=dash&created_before={conflict_at}")).await),
        ["D-plain", "D-failed"]
    );
    assert_eq!(
        ids(&list(
            &app,
            &format!("queue=dash&created_after={failed_at}&created_before={conflict_at}")
        )
        .await),
        Vec::<String>::new()
    );

    for (query, field) in [
        ("has=everything", "has"),
        ("order=random", "order"),
        ("created_after=yesterday", "created_after"),
    ] {
        let r = app.get(&format!("/v1/parents?{query}")).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{query}: {r:?}");
        assert!(
            r.body["detail"].as_str().unwrap_or_default().contains(field),
            "{query}: {r:?}"
        );
    }
}

async fn app_created(app: &TestApp, id: &str) -> String {
    app.get(&format!("/v1/parents/{id}")).await.body["created_at"]
        .as_str()
        .unwrap()
        .to_owned()
}

both_stores!(lists_parents, dashboard_filters_and_fields);
