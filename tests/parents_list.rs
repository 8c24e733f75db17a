//! Listing parents: filters by queue and derived state, the scheduler's
//! `resumable` query, and cursor pagination, oldest first.

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

both_stores!(lists_parents);
