//! A 100,000-child registration takes the bulk path and leaves claims able to
//! stay fast: the claim statements' plans walk the primary key from the
//! lane's floor right after the registration, with no manual ANALYZE. (How fast is measured by the
//! benchmarks, not by a timed test.)

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::Connection;

const CHILDREN: usize = 100_000;

/// One claim of 100 as the lane claim statement takes it once the lane's turn
/// is taken: per position, the claim id, the worker and the lease seconds;
/// then the lane's floor, whether given-back children are due, its queue.
async fn claim_args(conn: &mut sqlx::PgConnection) -> String {
    let floor: i64 = sqlx::query_scalar("SELECT floor FROM lane WHERE parent_id = 'P-big'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    format!(
        "ARRAY[gen_random_uuid()], ARRAY['explain'::text], ARRAY[300::float8], {floor}, false, 'bulk', NULL, false, \
         ARRAY[1]::bigint[], NULL, NULL"
    )
}

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
        // The planner must walk the primary key from the lane's floor for the
        // lane claim straight after the bulk insert. Planned here with real values: the
        // service forces generic plans (`plan_cache_mode`), which the
        // statement is written to make the same plan, one index per part.
        let mut conn = sqlx::PgConnection::connect(&app.database_url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PREPARE lane_claim (text, bigint, uuid[], text[], float8[], bigint, boolean, text, text, boolean, bigint[], text, timestamptz) AS {}",
            child_ledger::store::POSTGRES_LANE_CLAIM
        )))
        .execute(&mut conn)
        .await
        .unwrap();
        let args = claim_args(&mut conn).await;
        let plan = explain(&mut conn, &format!("EXPLAIN EXECUTE lane_claim('P-big', 100, {args})")).await;
        assert!(
            plan.contains("Index Scan using child_pkey on child"),
            "the claim does not walk the primary key:\n{plan}"
        );
        assert!(
            !plan.contains("Seq Scan on child"),
            "the claim scans the child table:\n{plan}"
        );

        // A claim costs the same however many children were claimed before
        // it: with 50,000 claimed (no VACUUM in between), a claim of 100 reads about the buffers the
        // first one did, not the tens of thousands a walk from sequence 0 would.
        let first = claim_buffers(&mut conn).await;
        for _ in 0..50 {
            let claim = app.post("/v1/queues/bulk/claims", json!({"limit": 1000})).await;
            assert_eq!(claim.body["children"].as_array().unwrap().len(), 1000);
        }
        let later = claim_buffers(&mut conn).await;
        assert!(
            later < first + first / 2,
            "a claim after 50,000 claimed read {later} buffers, the first {first}"
        );
        let claimed = app
            .count("SELECT count(*) FROM child_status WHERE state = 'in_flight'")
            .await;
        assert_eq!(claimed, 50_400, "each explained claim took its 100");

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

/// The buffers one lane claim of 100 touches, measured by running it.
async fn claim_buffers(conn: &mut sqlx::PgConnection) -> i64 {
    let args = claim_args(conn).await;
    let analyzed: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE lane_claim('P-big', 100, {args})"
    )))
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    let buffers = most_buffers(&analyzed[0]["Plan"]);
    assert!(buffers > 0, "no buffers counted:\n{analyzed:#}");
    buffers
}

/// The most buffers (hit or read) any node of an `EXPLAIN (ANALYZE, BUFFERS)`
/// plan touched, its subplans included.
fn most_buffers(node: &serde_json::Value) -> i64 {
    let own = node["Shared Hit Blocks"].as_i64().unwrap_or(0) + node["Shared Read Blocks"].as_i64().unwrap_or(0);
    let children = node["Plans"].as_array().into_iter().flatten().map(most_buffers);
    children.fold(own, i64::max)
}

/// The plan `EXPLAIN` prints for `statement`, as one text.
async fn explain(conn: &mut sqlx::PgConnection, statement: &str) -> String {
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(statement.to_owned()))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    lines.join("\n")
}

both_stores!(hundred_thousand_children);

/// Many small registrations, none big enough to analyze `child` on its own
/// (`after_bulk_write`), on a database whose autovacuum may be off: the
/// service's statistics loop analyzes the hot tables once they have grown,
/// so their plans are not those of the empty tables (a generic plan made
/// then walked every child of the table for each outcome statement).
#[tokio::test]
async fn a_fresh_database_gets_its_hot_tables_analyzed_as_they_grow() {
    if !postgres_available().await {
        return;
    }
    let app = spawn_app(Backend::Postgres).await;
    for p in 0..40 {
        let children: Vec<_> = (0..25).map(|i| json!({ "payload": { "i": i } })).collect();
        let r = app
            .put(
                &format!("/v1/parents/small-{p}"),
                json!({"queue": "small", "children": children}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let mut conn = sqlx::PgConnection::connect(&app.database_url).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let child: f32 = sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = 'child'::regclass")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        if child >= 1000.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after 20 s the planner still sees {child} children (-1: never analyzed)"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}
