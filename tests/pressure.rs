//! Writes under pressure: many concurrent writers (and, on SQLite, two
//! processes on one file) never surface a lock as a 5xx, and a SIGKILL in the
//! middle of a 100,000-child registration leaves no partial parent.

mod common;

use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const WRITERS: usize = 24;
const ROUNDS: usize = 6;

/// One writer's loop: register, claim, record, append + seal, reconcile.
/// Returns every status it was answered.
async fn writer(client: reqwest::Client, bases: Vec<String>, w: usize) -> Vec<(String, u16)> {
    let mut answers = Vec::new();
    let mut note = |what: &str, status: StatusCode| answers.push((what.to_owned(), status.as_u16()));
    for round in 0..ROUNDS {
        let base = &bases[(w + round) % bases.len()];
        let parent = format!("W{w}-{round}");
        let children: Vec<Value> = (0..50).map(|i| json!({"payload": {"w": w, "i": i}})).collect();
        let r = client
            .put(format!("{base}/v1/parents/{parent}"))
            .json(&json!({"queue": "pressure", "children": children}))
            .send()
            .await
            .unwrap();
        note("register", r.status());
        let r = client
            .post(format!("{base}/v1/parents/{parent}/claims"))
            .json(&json!({"limit": 50}))
            .send()
            .await
            .unwrap();
        note("claim", r.status());
        let claim: Value = r.json().await.unwrap_or_default();
        let outcomes: Vec<Value> = claim["children"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| json!({"parent_id": parent, "sequence": c["sequence"], "outcome": "processed", "claim_id": claim["claim_id"]}))
            .collect();
        if !outcomes.is_empty() {
            let r = client
                .post(format!("{base}/v1/outcomes"))
                .json(&json!({ "outcomes": outcomes }))
                .send()
                .await
                .unwrap();
            note("outcomes", r.status());
        }
        let paged = format!("{parent}-paged");
        let r = client
            .put(format!("{base}/v1/parents/{paged}"))
            .json(&json!({"queue": "pressure", "decomposed": false}))
            .send()
            .await
            .unwrap();
        note("register decomposing", r.status());
        let page: Vec<Value> = (0..20).map(|s| json!({"sequence": s, "payload": s})).collect();
        let r = client
            .post(format!("{base}/v1/parents/{paged}/children"))
            .json(&json!({ "children": page }))
            .send()
            .await
            .unwrap();
        note("append", r.status());
        let r = client
            .post(format!("{base}/v1/parents/{paged}/seal"))
            .json(&json!({"total": 20}))
            .send()
            .await
            .unwrap();
        note("seal", r.status());
        let r = client
            .post(format!("{base}/v1/parents/{parent}/reconcile"))
            .json(&json!({"dry_run": false}))
            .send()
            .await
            .unwrap();
        note("reconcile", r.status());
    }
    answers
}

async fn concurrent_writers_never_see_a_lock(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    // Two processes on one database: for SQLite that is two writers on one
    // file, serialised by SQLite's own lock, which must wait, not fail.
    let a = ServiceProcess::start("pressure-a", &db.url, &[]).await;
    a.ready().await;
    let b = ServiceProcess::start("pressure-b", &db.url, &[]).await;
    b.ready().await;
    let bases = vec![a.base.clone(), b.base.clone()];
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let started = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| tokio::spawn(writer(client.clone(), bases.clone(), w)))
        .collect();
    let mut answers = Vec::new();
    for w in writers {
        answers.extend(w.await.unwrap());
    }
    let elapsed = started.elapsed();
    let failures: Vec<_> = answers.iter().filter(|(_, s)| !(200..300).contains(s)).collect();
    assert!(
        failures.is_empty(),
        "{backend:?}: {} of {} writes failed: {failures:?}\n--- a ---\n{}\n--- b ---\n{}",
        failures.len(),
        answers.len(),
        a.log_text(),
        b.log_text()
    );
    for process in [&a, &b] {
        let log = process.log_text();
        assert!(!log.contains("database is locked"), "{}: {log}", process.name);
    }
    let store = db.store().await;
    let parents = (WRITERS * ROUNDS * 2) as i64;
    assert_eq!(store.count_raw("SELECT count(*) FROM parent").await.unwrap(), parents);
    assert_eq!(
        store
            .count_raw("SELECT count(*) FROM parent WHERE completed_at IS NOT NULL")
            .await
            .unwrap(),
        (WRITERS * ROUNDS) as i64
    );
    eprintln!(
        "{backend:?}: {} writes from {WRITERS} writers over 2 processes in {elapsed:.1?}, none failed",
        answers.len()
    );
}

/// Whether the 100,000-child registration is being written right now.
async fn registration_in_progress(backend: Backend, db: &TestDatabase, store: &common::raw::RawDb) -> bool {
    match backend {
        // The write transaction grows the WAL file long before it commits.
        Backend::Sqlite => {
            let path = db.url.trim_start_matches("sqlite://");
            std::fs::metadata(format!("{path}-wal")).is_ok_and(|m| m.len() > 4 * 1024 * 1024)
        }
        Backend::Postgres => store
            .count_raw(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND state = 'active' AND query ILIKE '%INSERT INTO child%'",
            )
            .await
            .is_ok_and(|n| n > 0),
    }
}

async fn sigkill_during_a_big_registration_leaves_nothing(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let mut service = ServiceProcess::start("big-kill", &db.url, &[]).await;
    service.ready().await;
    let store = db.store().await;
    let children: Vec<Value> = (0..100_000)
        .map(|i| json!({"key": format!("evt-{i}"), "payload": {"event": i, "body": "x".repeat(40)}}))
        .collect();
    let body = json!({"queue": "big", "children": children});

    let upload = {
        let url = format!("{}/v1/parents/BIG", service.base);
        let body = body.clone();
        tokio::spawn(async move { reqwest::Client::new().put(url).json(&body).send().await })
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !registration_in_progress(backend, &db, &store).await {
        assert!(
            !upload.is_finished(),
            "the registration finished before it could be interrupted"
        );
        assert!(Instant::now() < deadline, "the registration never started writing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    service.kill().await;
    let answer = upload.await.unwrap();
    assert!(answer.is_err(), "the killed service still answered: {answer:?}");

    service.restart().await;
    service.ready().await;
    let store = db.store().await;
    assert_eq!(store.count_raw("SELECT count(*) FROM parent").await.unwrap(), 0);
    assert_eq!(store.count_raw("SELECT count(*) FROM child").await.unwrap(), 0);
    if backend == Backend::Sqlite {
        let path = db.url.trim_start_matches("sqlite://").to_owned();
        let check = std::process::Command::new("python3")
            .args(["-c", "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('PRAGMA integrity_check').fetchone()[0])"])
            .arg(&path)
            .output()
            .expect("python3 for the integrity check");
        assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "ok");
    }
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let r = client
        .get(format!("{}/v1/parents/BIG", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    // The same registration, sent again, is whole.
    let r = client
        .put(format!("{}/v1/parents/BIG", service.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(store.count_raw("SELECT count(*) FROM child").await.unwrap(), 100_000);
    eprintln!("{backend:?}: SIGKILL mid-registration left 0 parents and 0 children; the retry wrote all 100,000");
}

both_stores!(
    concurrent_writers_never_see_a_lock,
    sigkill_during_a_big_registration_leaves_nothing
);
