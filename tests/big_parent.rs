//! A 100,000-child registration takes the bulk path and leaves claims able to
//! stay fast: the claim statements' plans use the pending index right after
//! the registration, with no manual ANALYZE. (How fast is measured by the
//! benchmarks, not by a timed test.)

mod common;

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
    let created = app
        .put("/v1/parents/P-big", json!({"queue": "bulk", "children": children}))
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{:?}", created.body);
    assert_eq!(created.body["counts"]["total"], CHILDREN);
    assert_eq!(created.body["counts"]["pending"], CHILDREN);
    assert_eq!(app.count("SELECT count(*) FROM child").await, CHILDREN as i64);

    let claim = app.post("/v1/parents/P-big/claims", json!({"limit": 100})).await;
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

    if backend == Backend::Postgres {
        // The planner must pick the partial pending index for both claim shapes
        // straight after the bulk insert.
        let mut conn = sqlx::PgConnection::connect(&app.database_url).await.unwrap();
        // The statements the service runs, planned with real values as the
        // service plans them (never a cached generic plan).
        for (name, statement, scope, floor) in [
            (
                "parent",
                &*child_ledger::store::POSTGRES_PARENT_CLAIM,
                "P-big",
                Some(0_i64),
            ),
            ("queue", &*child_ledger::store::POSTGRES_QUEUE_CLAIM, "bulk", None),
        ] {
            let types = if floor.is_some() {
                "text, bigint, uuid, text, float8, bigint"
            } else {
                "text, bigint, uuid, text, float8"
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "PREPARE claim_{name} ({types}) AS {statement}"
            )))
            .execute(&mut conn)
            .await
            .unwrap();
            let floor = floor.map(|f| format!(", {f}")).unwrap_or_default();
            let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "EXPLAIN EXECUTE claim_{name}('{scope}', 100, gen_random_uuid(), NULL, 300{floor})"
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap();
            let plan = plan.join("\n");
            assert!(
                plan.contains("child_pending"),
                "the {name} claim does not use the pending index:\n{plan}"
            );
            assert!(
                !plan.contains("Sort"),
                "the {name} claim sorts instead of walking the index:\n{plan}"
            );
        }
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
