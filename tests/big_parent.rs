//! A 100,000-child registration takes the bulk path and leaves claims fast:
//! the claim's plan uses the pending index right after the registration, with
//! no manual ANALYZE.

mod common;

use std::time::Instant;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;

const CHILDREN: usize = 100_000;

async fn hundred_thousand_children(backend: Backend) {
    let app = spawn_app(backend).await;
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| json!({"payload": {"event": i, "body": "x".repeat(80)}, "key": format!("evt-{i}")}))
        .collect();
    let started = Instant::now();
    let created = app
        .put("/v1/parents/P-big", json!({"queue": "bulk", "children": children}))
        .await;
    let registered = started.elapsed();
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    assert_eq!(created.body["counts"]["total"], CHILDREN);
    assert_eq!(created.body["counts"]["pending"], CHILDREN);
    assert_eq!(app.count("SELECT count(*) FROM child").await, CHILDREN as i64);

    let started = Instant::now();
    let claim = app.post("/v1/parents/P-big/claims", json!({"limit": 100})).await;
    let first_claim = started.elapsed();
    assert_eq!(claim.status, StatusCode::OK);
    let sequences: Vec<u64> = claim.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(sequences, (0..100).collect::<Vec<_>>());
    let queue_claim = app.post("/v1/queues/bulk/claims", json!({"limit": 100})).await;
    assert_eq!(queue_claim.body["children"][0]["sequence"], 100);
    eprintln!("{backend:?}: registered {CHILDREN} children in {registered:?}; first claim took {first_claim:?}");

    if backend == Backend::Postgres {
        // The planner must pick the partial pending index for both claim shapes
        // straight after the bulk insert.
        let mut conn = sqlx::PgConnection::connect(&app.database_url).await.unwrap();
        let plan: Vec<String> = sqlx::query_scalar(
            "EXPLAIN SELECT c.parent_id, c.sequence FROM child c \
             WHERE c.parent_id = 'P-big' AND c.state = 'pending' \
               AND (c.available_at IS NULL OR c.available_at <= now()) \
             ORDER BY c.sequence LIMIT 100 FOR UPDATE OF c SKIP LOCKED",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let plan = plan.join("\n");
        assert!(
            plan.contains("child_pending"),
            "claim does not use the pending index:\n{plan}"
        );
        assert!(
            !plan.contains("Sort"),
            "claim sorts instead of walking the index:\n{plan}"
        );
        let analyzed: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
            "SELECT greatest(last_analyze, last_autoanalyze) FROM pg_stat_user_tables WHERE relname = 'child'",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(
            analyzed.is_some(),
            "statistics were not refreshed after the bulk registration"
        );
    }
}

both_stores!(hundred_thousand_children);
