//! `search.*` (issue 26): how long one page of `GET /v1/children` takes,
//! 1,000 children a page, with 1,000,000 children in the state asked for, on
//! both stores.
//!
//! The ledger holds six queues, one per state, each of `PARENTS` parents
//! registered over HTTP and drained to their state: `pending` as registered,
//! `in_flight` by claims of 1,000 (leases of an hour), and `held`,
//! `processed`, `failed` and `skipped` by one SQL update each (as the outcome
//! statement writes them: the search reads the same columns), their
//! projections repaired by reconcile. Then, for each
//! state, the median over `ROUNDS` of:
//! - `state` alone, the first page and the page after it (`next_cursor`);
//! - `state` and the queue that holds them;
//! - `state` and one parent that holds them;
//! - `state` and another queue, which holds none of them (the reader that
//!   finds nothing must not scan the million).

use std::time::Instant;

use serde_json::Value;
use sqlx::Connection;

use super::{Scenario, ScratchDb, Service, register};

const STATES: [&str; 6] = ["pending", "in_flight", "held", "processed", "failed", "skipped"];
const PARENTS: usize = 10;
const PAGE: usize = 1000;
const ROUNDS: usize = 5;

/// Every state and filter, on Postgres and then SQLite, `per_state` children
/// in each state.
pub(super) async fn search_scenarios(admin_url: &str, per_state: usize) -> Vec<Scenario> {
    let mut scenarios = Vec::new();

    eprintln!("search: Postgres, {per_state} children in each of six states ...");
    let db = ScratchDb::create(admin_url, "search").await;
    let service = Service::start(&db.url).await;
    fill(&service.base, per_state).await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    for state in ["held", "processed", "failed", "skipped"] {
        for statement in settle_sql(state, Store::Postgres) {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    drop(conn);
    repair(&service.base).await;
    super::settle(&db.url).await;
    scenarios.extend(measure(&service.base, "postgres", per_state).await);
    service.stop().await;
    db.drop_now().await;

    eprintln!("search: SQLite, {per_state} children in each of six states ...");
    let dir = std::env::temp_dir().join(format!("ledger-bench-search-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.db");
    let url = format!("sqlite://{}", path.display());
    let service = Service::start(&url).await;
    fill(&service.base, per_state).await;
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    for state in ["held", "processed", "failed", "skipped"] {
        for statement in settle_sql(state, Store::Sqlite) {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    drop(conn);
    repair(&service.base).await;
    super::settle_sqlite(&path).await;
    scenarios.extend(measure(&service.base, "sqlite", per_state).await);
    service.stop().await;
    let _ = std::fs::remove_dir_all(&dir);

    scenarios
}

/// Registers `PARENTS` parents per state, and claims the in-flight queue's.
async fn fill(base: &str, per_state: usize) {
    let client = reqwest::Client::new();
    let each = per_state / PARENTS;
    for state in STATES {
        for p in 0..PARENTS {
            register(&client, base, &format!("{state}-{p}"), &queue(state), each).await;
        }
    }
    let mut claimed = 0;
    while claimed < each * PARENTS {
        let r: Value = client
            .post(format!("{base}/v1/queues/{}/claims", queue("in_flight")))
            .json(&serde_json::json!({"limit": PAGE, "lease_seconds": 86_400, "worker": "search-bench"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let n = r["children"].as_array().map_or(0, Vec::len);
        assert!(n > 0, "the in-flight queue ran dry after {claimed}: {r}");
        claimed += n;
    }
}

fn queue(state: &str) -> String {
    format!("search-{}", state.replace('_', "-"))
}

/// Moves every child of `state`'s queue to `state`, as an outcome (or an
/// expired last attempt, for `held`) leaves its row, in SQL both stores run,
/// and leaves their lanes as claims would have (nothing left never-claimed).
/// The projections are repaired afterwards (`repair`), as an operator who
/// edits rows with SQL does. Processed children are named in outcome batches
/// of 500 as the outcome statement names them (`processed_batch`), in each
/// store's own SQL.
fn settle_sql(state: &str, store: Store) -> Vec<String> {
    let (reason, terminal) = match state {
        "held" => ("NULL", "NULL"),
        "processed" => ("NULL", "changed_at"),
        _ => ("'bench'", "changed_at"),
    };
    let attempts = if state == "skipped" { 0 } else { 1 };
    // Processed children as outcome batches of 500 leave them: each batch
    // a millisecond after the one before.
    let changed = match (state, store) {
        ("processed", Store::Postgres) => "changed_at + (sequence / 500) * interval '1 millisecond'",
        ("processed", Store::Sqlite) => {
            "strftime('%Y-%m-%dT%H:%M:%fZ', changed_at, '+' || ((sequence / 500) / 1000.0) || ' seconds')"
        }
        _ => "changed_at",
    };
    let children = format!(
        "UPDATE child SET state = '{state}', reason = {reason}, terminal_at = {terminal}, changed_at = {changed}, \
             attempts = {attempts}, outcome_attempt = {outcome}, settled_from = {from} \
         WHERE parent_id IN (SELECT parent_id FROM parent WHERE queue = '{queue}')",
        outcome = if state == "held" || state == "skipped" {
            "NULL"
        } else {
            "1"
        },
        from = if state == "held" { "NULL" } else { "'pending'" },
        queue = queue(state),
    );
    let lanes = format!(
        "UPDATE lane SET floor = NULL WHERE parent_id IN (SELECT parent_id FROM parent WHERE queue = '{}')",
        queue(state)
    );
    let mut statements = vec![children, lanes];
    if state == "processed" {
        let list = match store {
            Store::Postgres => "array_agg(sequence ORDER BY sequence)",
            Store::Sqlite => "json_group_array(sequence)",
        };
        statements.push(format!(
            "INSERT INTO processed_batch (parent_id, changed_at, lo, hi, sequences) \
             SELECT parent_id, changed_at, min(sequence), max(sequence), {list} \
             FROM (SELECT parent_id, changed_at, sequence FROM child \
                   WHERE parent_id IN (SELECT parent_id FROM parent WHERE queue = '{queue}') \
                   ORDER BY parent_id, changed_at, sequence) c \
             GROUP BY parent_id, changed_at",
            queue = queue(state)
        ));
    }
    statements
}

/// Which store a bench statement is written for.
#[derive(Debug, Clone, Copy)]
enum Store {
    Postgres,
    Sqlite,
}

/// Reconciles every parent, repairing the projections the SQL moved.
async fn repair(base: &str) {
    let client = reqwest::Client::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut body = serde_json::json!({"dry_run": false, "limit": 1000});
        if let Some(cursor) = &cursor {
            body["cursor"] = cursor.clone().into();
        }
        let r: Value = client
            .post(format!("{base}/v1/reconcile"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        match r["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return,
        }
    }
}

/// The median time of one page for each state and filter.
async fn measure(base: &str, store: &str, per_state: usize) -> Vec<Scenario> {
    let client = reqwest::Client::new();
    let mut scenarios = Vec::new();
    let mut worst: f64 = 0.0;
    for (i, state) in STATES.into_iter().enumerate() {
        let other = queue(STATES[(i + 3) % STATES.len()]);
        let cases = [
            ("first_page", format!("state={state}")),
            ("queue", format!("state={state}&queue={}", queue(state))),
            ("parent", format!("state={state}&parent_id={state}-3")),
            ("other_queue", format!("state={state}&queue={other}")),
        ];
        for (case, query) in cases {
            let (ms, body) = median_page(&client, base, &query).await;
            let found = body["children"].as_array().map_or(0, Vec::len);
            let expect = if case == "other_queue" { 0 } else { PAGE };
            assert_eq!(found, expect, "{store} {query}: {found} children");
            worst = worst.max(ms);
            scenarios.push(Scenario::new(&format!("search.{store}.{state}.{case}"), "ms", ms).target("<= 50 ms"));
            if case == "first_page" {
                let cursor = body["next_cursor"].as_str().expect("a next cursor").to_owned();
                let (ms, body) = median_page(&client, base, &format!("{query}&cursor={cursor}")).await;
                assert_eq!(
                    body["children"].as_array().map_or(0, Vec::len),
                    PAGE,
                    "{store} {query}: page 2"
                );
                worst = worst.max(ms);
                scenarios
                    .push(Scenario::new(&format!("search.{store}.{state}.next_page"), "ms", ms).target("<= 50 ms"));
            }
        }
    }
    eprintln!("search: {store}, {per_state} children per state: slowest page {worst:.1} ms");
    scenarios
}

/// The median of `ROUNDS` reads of one page (after one unmeasured read), and
/// the page.
async fn median_page(client: &reqwest::Client, base: &str, query: &str) -> (f64, Value) {
    let url = format!("{base}/v1/children?{query}&limit={PAGE}");
    let read = || async {
        let r = client.get(&url).send().await.unwrap();
        assert!(r.status().is_success(), "{url}: {}", r.status());
        r.json::<Value>().await.unwrap()
    };
    let mut body = read().await;
    let mut times = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        body = read().await;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (times[ROUNDS / 2], body)
}
