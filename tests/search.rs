//! The children search across parents (`GET /v1/children`) against the
//! ledger itself: for every state and every filter (none, a queue with few
//! parents, a queue with many, one parent, a token limited to some queues),
//! paged to the end at several page sizes, it returns exactly the children
//! that every parent's own pages show in that state, newest change first,
//! each once. The ledger holds each way a child gets to its state: never
//! claimed, in flight, given back (released now or later, or its lease ran
//! out), given back and claimed again, held, processed, failed, skipped at
//! registration and by a cancel; parents registered whole, appended to in
//! order and out of order, and still decomposing.

mod common;

use std::collections::HashSet;

use chrono::{DateTime, FixedOffset};
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

use child_ledger::access::Role;
use child_ledger::config::Limits;

const STATES: [&str; 6] = ["pending", "in_flight", "held", "processed", "failed", "skipped"];

/// A child as the search orders it.
type Shown = (DateTime<FixedOffset>, String, i64, String);

fn shown(child: &Value) -> Shown {
    (
        DateTime::parse_from_rfc3339(child["changed_at"].as_str().expect("changed_at")).unwrap(),
        child["parent_id"].as_str().unwrap().to_owned(),
        child["sequence"].as_i64().unwrap(),
        child["state"].as_str().unwrap().to_owned(),
    )
}

async fn ok(app: &TestApp, reply: Reply, what: &str) -> Value {
    let _ = app;
    assert!(reply.status.is_success(), "{what}: {reply:?}");
    reply.body
}

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn claim(app: &TestApp, parent: &str, limit: u64, lease_seconds: u64) -> (String, Vec<i64>) {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": "search-test"}),
        )
        .await;
    let body = ok(app, r, "claim").await;
    let sequences = body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    (body["claim_id"].as_str().unwrap_or_default().to_owned(), sequences)
}

async fn outcomes(app: &TestApp, claim_id: &str, parent: &str, list: &[(i64, &str)]) {
    let outcomes: Vec<Value> = list
        .iter()
        .map(|(sequence, outcome)| {
            json!({"parent_id": parent, "sequence": sequence, "outcome": outcome, "reason": "because", "claim_id": claim_id})
        })
        .collect();
    let body = ok(
        app,
        app.post("/v1/outcomes", json!({"outcomes": outcomes})).await,
        "outcomes",
    )
    .await;
    for result in body["results"].as_array().unwrap() {
        assert_eq!(result["status"], "applied", "{body}");
    }
}

async fn release(app: &TestApp, claim_id: &str, parent: &str, sequences: &[i64], delay_seconds: u64) {
    let children: Vec<Value> = sequences
        .iter()
        .map(|s| json!({"parent_id": parent, "sequence": s}))
        .collect();
    ok(
        app,
        app.post(
            &format!("/v1/claims/{claim_id}/release"),
            json!({"children": children, "delay_seconds": delay_seconds}),
        )
        .await,
        "release",
    )
    .await;
}

/// The ledger of the module comment, in three queues.
async fn fill(app: &TestApp) -> Vec<(String, &'static str)> {
    let mut parents = Vec::new();
    // qa/A0: never claimed, in flight, processed, failed, given back now and
    // later, and given back then claimed again.
    register(app, "A0", json!({"queue": "qa", "children": children(30)})).await;
    let (first, taken) = claim(app, "A0", 10, 600).await;
    assert_eq!(taken, (0..10).collect::<Vec<_>>());
    outcomes(app, &first, "A0", &[(0, "processed"), (1, "processed"), (2, "failed")]).await;
    release(app, &first, "A0", &[3, 4], 0).await;
    release(app, &first, "A0", &[5], 3600).await;
    let (_, again) = claim(app, "A0", 3, 600).await;
    assert!(again.contains(&3) && again.contains(&4), "{again:?}");
    parents.push(("A0".to_owned(), "qa"));

    // qa/A1: held (a lease that ran out under `hold`) beside the rest.
    register(
        app,
        "A1",
        json!({"queue": "qa", "children": children(8), "expired_lease": "hold"}),
    )
    .await;
    let (held, _) = claim(app, "A1", 3, 600).await;
    app.expire_claim(&held).await;
    // A short claim sweeps the leases that ran out in its scope.
    let (later, _) = claim(app, "A1", 100, 600).await;
    outcomes(app, &later, "A1", &[(3, "skipped")]).await;
    parents.push(("A1".to_owned(), "qa"));

    // qa/A2: appended out of order, sealed, then claimed from.
    register(
        app,
        "A2",
        json!({"queue": "qa", "decomposed": false, "children": children(5)}),
    )
    .await;
    for range in [10..15, 5..10] {
        let appended: Vec<Value> = range.map(|s| json!({"sequence": s, "payload": {"n": s}})).collect();
        ok(
            app,
            app.post("/v1/parents/A2/children", json!({"children": appended})).await,
            "append",
        )
        .await;
    }
    ok(app, app.post("/v1/parents/A2/seal", json!({"total": 15})).await, "seal").await;
    let (a2, _) = claim(app, "A2", 4, 600).await;
    outcomes(app, &a2, "A2", &[(1, "failed")]).await;
    parents.push(("A2".to_owned(), "qa"));

    // qa/A3: appended in order and still decomposing (no lane yet).
    register(
        app,
        "A3",
        json!({"queue": "qa", "decomposed": false, "children": children(3)}),
    )
    .await;
    let appended: Vec<Value> = (3..6).map(|s| json!({"sequence": s, "payload": {"n": s}})).collect();
    ok(
        app,
        app.post("/v1/parents/A3/children", json!({"children": appended})).await,
        "append",
    )
    .await;
    parents.push(("A3".to_owned(), "qa"));

    // qa/A4: skipped at registration; qa/A5: cancelled with one in flight.
    register(
        app,
        "A4",
        json!({"queue": "qa", "children": [{"skip": "bad input"}, {"payload": 1}, {"skip": "bad input"}]}),
    )
    .await;
    parents.push(("A4".to_owned(), "qa"));
    register(app, "A5", json!({"queue": "qa", "children": children(4)})).await;
    claim(app, "A5", 1, 600).await;
    ok(
        app,
        app.post("/v1/parents/A5/cancel", json!({"reason": "called off"})).await,
        "cancel",
    )
    .await;
    parents.push(("A5".to_owned(), "qa"));

    // qbig: more parents than the search reads one by one, and more with
    // children processed, in flight and pending; a few with failed ones.
    for i in 0..40 {
        let parent = format!("Z{i:02}");
        register(app, &parent, json!({"queue": "qbig", "children": children(3)})).await;
        let (claim_id, _) = claim(app, &parent, 2, 600).await;
        let outcome = if i % 8 == 0 { "failed" } else { "processed" };
        outcomes(app, &claim_id, &parent, &[(0, outcome)]).await;
        parents.push((parent, "qbig"));
    }

    // qb: one parent, processed and pending.
    register(app, "B0", json!({"queue": "qb", "children": children(6)})).await;
    let (b0, _) = claim(app, "B0", 6, 600).await;
    outcomes(app, &b0, "B0", &[(0, "processed"), (1, "processed"), (2, "processed")]).await;
    release(app, &b0, "B0", &[3], 0).await;
    parents.push(("B0".to_owned(), "qb"));
    parents
}

/// Every child as its parent's own pages show it, with its queue.
async fn every_child(app: &TestApp, parents: &[(String, &'static str)]) -> Vec<(Shown, &'static str)> {
    let mut all = Vec::new();
    for (parent, queue) in parents {
        let body = ok(
            app,
            app.get(&format!("/v1/parents/{parent}/children?limit=1000")).await,
            "children",
        )
        .await;
        assert!(body["next_after"].is_null());
        for child in body["children"].as_array().unwrap() {
            all.push((shown(child), *queue));
        }
    }
    all
}

/// Every page of a search, concatenated.
async fn search(app: &TestApp, token: Option<&str>, query: &str, limit: usize) -> Vec<Shown> {
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20_000 {
        let mut path = format!("/v1/children?{query}&limit={limit}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let reply = match token {
            Some(token) => app.get_as(token, &path).await,
            None => app.get(&path).await,
        };
        assert_eq!(reply.status, StatusCode::OK, "{path}: {reply:?}");
        let page = reply.body["children"].as_array().unwrap();
        assert!(page.len() <= limit, "{path}: {} children", page.len());
        seen.extend(page.iter().map(shown));
        match reply.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return seen,
        }
    }
    panic!("{query}: paging did not end");
}

fn expected(all: &[(Shown, &'static str)], keep: impl Fn(&Shown, &str) -> bool) -> Vec<Shown> {
    let mut kept: Vec<Shown> = all
        .iter()
        .filter(|(child, queue)| keep(child, queue))
        .map(|(child, _)| child.clone())
        .collect();
    kept.sort_by(|a, b| (b.0, &b.1, b.2).cmp(&(a.0, &a.1, a.2)));
    kept
}

fn check(query: &str, limit: usize, got: &[Shown], want: &[Shown]) {
    let unique: HashSet<(&String, i64)> = got.iter().map(|(_, p, s, _)| (p, *s)).collect();
    assert_eq!(unique.len(), got.len(), "{query} (limit {limit}): a child came twice");
    assert_eq!(got, want, "{query} (limit {limit})");
}

async fn every_state_and_filter(backend: Backend) {
    searched_as_listed(backend, Limits::default()).await;
}

/// The same with pages that end early after examining 5 rows: every page
/// goes on from where the last one stopped, none misses a child or shows
/// one twice.
async fn pages_that_end_early(backend: Backend) {
    let limits = Limits {
        max_search_rows: 5,
        ..Limits::default()
    };
    searched_as_listed(backend, limits).await;
}

async fn searched_as_listed(backend: Backend, limits: Limits) {
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let (qa_reader, qa_entry) = token("qa-reader", &[Role::Reader], &["qa"]);
    let (q_reader, q_entry) = token("q-reader", &[Role::Reader], &["q*"]);
    let max_rows = limits.max_search_rows;
    let mut app = spawn_app_with_tokens_and_limits(backend, json!([admin_entry, qa_entry, q_entry]), limits).await;
    app.token = Some(admin);
    let parents = fill(&app).await;
    let all = every_child(&app, &parents).await;
    let states: HashSet<&str> = all.iter().map(|(c, _)| c.3.as_str()).collect();
    assert_eq!(states.len(), 6, "the ledger holds every state: {states:?}");

    let mut checked = 0;
    for state in STATES {
        let mut cases: Vec<(String, Option<&str>, Vec<Shown>)> = vec![
            (format!("state={state}"), None, expected(&all, |c, _| c.3 == state)),
            (
                format!("state={state}&queue=qa"),
                None,
                expected(&all, |c, q| c.3 == state && q == "qa"),
            ),
            (
                format!("state={state}&queue=qbig"),
                None,
                expected(&all, |c, q| c.3 == state && q == "qbig"),
            ),
            (format!("state={state}&queue=nobody"), None, Vec::new()),
            (
                format!("state={state}"),
                Some(qa_reader.as_str()),
                expected(&all, |c, q| c.3 == state && q == "qa"),
            ),
            (
                format!("state={state}"),
                Some(q_reader.as_str()),
                expected(&all, |c, _| c.3 == state),
            ),
            (format!("state={state}&queue=qb"), Some(qa_reader.as_str()), Vec::new()),
        ];
        for parent in ["A0", "A1", "A2", "A3", "Z03", "B0"] {
            cases.push((
                format!("state={state}&parent_id={parent}"),
                None,
                expected(&all, |c, _| c.3 == state && c.1 == parent),
            ));
        }
        cases.push((format!("state={state}&parent_id=A0&queue=qb"), None, Vec::new()));
        for (query, token, want) in cases {
            for limit in [1, 4, 1000] {
                let got = search(&app, token, &query, limit).await;
                check(&query, limit, &got, &want);
                checked += 1;
            }
        }
    }
    for parent in ["A0", "A2", "A3", "A5"] {
        let query = format!("parent_id={parent}");
        let want = expected(&all, |c, _| c.1 == parent);
        for limit in [3, 1000] {
            let got = search(&app, None, &query, limit).await;
            check(&query, limit, &got, &want);
            checked += 1;
        }
    }
    eprintln!(
        "search[{backend:?}, {max_rows} rows a page]: {} children of {} parents, {checked} searches paged to the end: each as the parents' pages show",
        all.len(),
        parents.len()
    );
}

both_stores!(every_state_and_filter, pages_that_end_early);
