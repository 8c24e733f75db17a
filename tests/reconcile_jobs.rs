//! Sweeps that no request timeout bounds: `POST /v1/reconcile` checks at most
//! `limit` parents per call and hands out a cursor, and `POST
//! /v1/reconcile/jobs` sweeps in the background, a page per step, surviving
//! the death of the process that worked it.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Registers `parent_0..parent_{n-1}` (one child each) in `queue` over HTTP,
/// a few at a time.
async fn register_many(client: &reqwest::Client, base: &str, prefix: &str, queue: &str, n: usize) {
    futures::stream::iter(0..n)
        .map(|i| {
            let url = format!("{base}/v1/parents/{prefix}-{i:05}");
            let body = json!({"queue": queue, "children": children(1)});
            async move {
                let r = client.put(&url).json(&body).send().await.expect("register");
                assert_eq!(r.status(), StatusCode::CREATED, "{url}");
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
}

/// The ids in a report's `parents`, sorted (a report lists them in
/// registration order, and the registrations here run side by side).
fn ids(report: &Value) -> Vec<String> {
    let mut ids: Vec<String> = report["parents"]
        .as_array()
        .expect("parents")
        .iter()
        .map(|p| p["parent_id"].as_str().expect("parent_id").to_owned())
        .collect();
    ids.sort();
    ids
}

async fn paged_sweep_visits_every_parent_once(backend: Backend) {
    let app = spawn_app(backend).await;
    register_many(&app.client, &app.base, "page", "paged", 25).await;
    register_many(&app.client, &app.base, "else", "elsewhere", 3).await;
    // Every parent of the queue drifts, so each page lists every parent it checked.
    app.exec("UPDATE parent SET total = total + 1").await;

    let mut cursor = Value::Null;
    let mut pages = Vec::new();
    let mut seen = Vec::new();
    loop {
        let r = app
            .post(
                "/v1/reconcile",
                json!({"dry_run": true, "queue": "paged", "limit": 7, "cursor": cursor}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let checked = r.body["checked"].as_u64().unwrap();
        assert!(checked <= 7, "a page checks at most `limit` parents: {}", r.body);
        assert_eq!(r.body["drifted"].as_u64().unwrap(), checked, "{}", r.body);
        assert_eq!(r.body["repaired"], 0, "{}", r.body);
        pages.push(checked);
        seen.extend(ids(&r.body));
        cursor = r.body["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
        assert!(cursor.is_string(), "{}", r.body);
        assert!(pages.len() < 10, "the cursor never ends: {pages:?}");
    }
    println!("limit 7 over 25 parents: pages of {pages:?}");
    assert_eq!(pages, [7, 7, 7, 4]);
    let distinct: BTreeSet<_> = seen.iter().cloned().collect();
    assert_eq!(seen.len(), 25, "every parent once: {seen:?}");
    assert_eq!(distinct.len(), 25, "no parent twice: {seen:?}");
    assert!(distinct.iter().all(|id| id.starts_with("page-")), "{distinct:?}");

    // Repairing page by page (a limit that divides the count: the last page is empty).
    let mut cursor = Value::Null;
    let mut repaired = 0;
    let mut calls = 0;
    loop {
        let r = app
            .post(
                "/v1/reconcile",
                json!({"dry_run": false, "limit": 5, "cursor": cursor, "queue": "paged"}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        repaired += r.body["repaired"].as_u64().unwrap();
        calls += 1;
        cursor = r.body["next_cursor"].clone();
        if cursor.is_null() {
            break;
        }
    }
    println!("limit 5 repaired {repaired} parents in {calls} calls");
    assert_eq!(repaired, 25);
    assert_eq!(calls, 6, "five full pages, then one that finds the end");
    // The default limit (1000) covers the rest in one call: only the other queue drifts.
    let r = app.post("/v1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["checked"], 28, "{}", r.body);
    assert_eq!(r.body["drifted"], 3, "{}", r.body);
    assert!(r.body["next_cursor"].is_null(), "{}", r.body);
}

async fn bad_input_is_refused_and_writes_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    register_many(&app.client, &app.base, "bad", "events", 2).await;
    app.exec("UPDATE parent SET total = 9").await;
    for (body, field) in [
        (json!({"limit": 0}), "limit"),
        (json!({"limit": 10_001}), "limit"),
        (json!({"limit": "ten"}), "limit"),
        (json!({"cursor": "abc"}), "cursor"),
        (json!({"cursor": "-1"}), "cursor"),
        (json!({"cursor": 12}), "cursor"),
        (json!({"queue": "Not A Queue"}), "queue"),
        (json!({"dry_run": "no"}), "dry_run"),
        (json!({"limt": 5}), "limt"),
    ] {
        let r = app.post("/v1/reconcile", body.clone()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {r:?}");
        assert_eq!(r.content_type, "application/problem+json", "{body}");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    for (body, field) in [
        (json!({"queue": "Not A Queue"}), "queue"),
        (json!({"dry_run": 1}), "dry_run"),
        (json!({"limit": 5}), "limit"),
    ] {
        let r = app.post("/v1/reconcile/jobs", body.clone()).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {r:?}");
        assert_eq!(r.body["field"], field, "{body}: {r:?}");
    }
    let r = app
        .raw(
            Method::POST,
            "/v1/reconcile/jobs",
            "application/json",
            b"{\"dry_run\":".to_vec(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    let r = app.get("/v1/reconcile/jobs/not-a-uuid").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert_eq!(r.body["field"], "job_id", "{r:?}");
    let r = app.get(&format!("/v1/reconcile/jobs/{}", uuid::Uuid::new_v4())).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert_eq!(r.content_type, "application/problem+json");

    assert_eq!(
        app.count("SELECT count(*) FROM reconcile_job").await,
        0,
        "no job was written"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM parent WHERE total = 9").await,
        2,
        "no repair was written"
    );
}

/// An admin scoped to some queues may start jobs over them (or over all of
/// its queues, naming none); naming a queue outside them is 403 and starts
/// nothing: a job its creator could not read back, checking nothing.
async fn a_job_outside_the_tokens_queues_is_forbidden(backend: Backend) {
    let (scoped, scoped_entry) = token("ops-a", &[Role::Admin], &["a"]);
    let (everywhere, every_entry) = token("ops", &[Role::Admin], &[]);
    let app = spawn_app_with_tokens(backend, json!([scoped_entry, every_entry])).await;
    for queue in ["b", "ab", "default"] {
        let r = app
            .post_as(&scoped, "/v1/reconcile/jobs", json!({"queue": queue}))
            .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{queue}: {r:?}");
        assert_eq!(r.content_type, "application/problem+json", "{queue}");
        assert!(r.body["detail"].as_str().unwrap_or("").contains(queue), "{r:?}");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM reconcile_job").await,
        0,
        "a job was written"
    );
    let r = app.post_as(&scoped, "/v1/reconcile/jobs", json!({"queue": "a"})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let r = app.post_as(&scoped, "/v1/reconcile/jobs", json!({})).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
    let r = app
        .post_as(&everywhere, "/v1/reconcile/jobs", json!({"queue": "b"}))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{r:?}");
}

/// Starts the service as a process on `db`, with `extra` arguments, and waits until it is ready.
async fn start(db: &TestDatabase, name: &str, extra: &[&str]) -> ServiceProcess {
    let service = ServiceProcess::start(name, &db.url, extra).await;
    service.ready().await;
    service
}

async fn get_job(client: &reqwest::Client, base: &str, job_id: &str) -> Value {
    let r = client
        .get(format!("{base}/v1/reconcile/jobs/{job_id}"))
        .send()
        .await
        .expect("GET job");
    assert_eq!(r.status(), StatusCode::OK);
    r.json().await.unwrap()
}

/// Polls the job until it is no longer running.
async fn until_finished(client: &reqwest::Client, service: &ServiceProcess, job_id: &str) -> Value {
    let started = Instant::now();
    loop {
        let job = get_job(client, &service.base, job_id).await;
        if job["state"] != "running" {
            return job;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "job still running: {job}; log:\n{}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start_job(client: &reqwest::Client, base: &str, body: Value) -> Value {
    let r = client
        .post(format!("{base}/v1/reconcile/jobs"))
        .json(&body)
        .send()
        .await
        .expect("POST job");
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    r.json().await.unwrap()
}

async fn job_runs_to_done_with_counts_and_repairs(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = start(&db, "jobs", &["--reconcile-job-batch", "3"]).await;
    let client = reqwest::Client::new();
    register_many(&client, &service.base, "ev", "events", 10).await;
    register_many(&client, &service.base, "ot", "other", 2).await;
    let raw = db.store().await;
    raw.execute_raw(
        "UPDATE parent SET processed = 1 WHERE parent_id IN ('ev-00001', 'ev-00004', 'ev-00007', 'ev-00009', 'ot-00000')",
    )
    .await
    .unwrap();

    let job = start_job(&client, &service.base, json!({"dry_run": false, "queue": "events"})).await;
    for (field, value) in [
        ("state", json!("running")),
        ("dry_run", json!(false)),
        ("queue", json!("events")),
        ("checked", json!(0)),
        ("drifted", json!(0)),
        ("repaired", json!(0)),
        ("parents", json!([])),
        ("error", Value::Null),
    ] {
        assert_eq!(job[field], value, "{field} of {job}");
    }
    assert!(job["created_at"].is_string() && job["updated_at"].is_string(), "{job}");
    let job_id = job["job_id"].as_str().unwrap().to_owned();

    let done = until_finished(&client, &service, &job_id).await;
    println!(
        "job {job_id}: state {}, checked {}, drifted {}, repaired {}",
        done["state"], done["checked"], done["drifted"], done["repaired"]
    );
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["checked"], 10, "{done}");
    assert_eq!(done["drifted"], 4, "{done}");
    assert_eq!(done["repaired"], 4, "{done}");
    assert_eq!(ids(&done), ["ev-00001", "ev-00004", "ev-00007", "ev-00009"], "{done}");
    assert!(done["parents"].as_array().unwrap().iter().all(|p| p["applied"] == true));
    assert_eq!(
        raw.count_raw("SELECT count(*) FROM parent WHERE processed = 1")
            .await
            .unwrap(),
        1,
        "the events parents were repaired; the other queue's was not"
    );

    // A dry run over every queue finds the one left and writes nothing.
    let job = start_job(&client, &service.base, json!({"dry_run": true})).await;
    let done = until_finished(&client, &service, job["job_id"].as_str().unwrap()).await;
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["queue"], Value::Null, "{done}");
    assert_eq!(done["checked"], 12, "{done}");
    assert_eq!(done["drifted"], 1, "{done}");
    assert_eq!(done["repaired"], 0, "{done}");
    assert_eq!(ids(&done), ["ot-00000"], "{done}");
    assert_eq!(
        raw.count_raw("SELECT count(*) FROM parent WHERE processed = 1")
            .await
            .unwrap(),
        1
    );
}

/// Parents of the resume test: more than the report keeps (1000).
const RESUME_PARENTS: usize = 1100;

async fn job_resumes_after_the_service_is_killed(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let args = ["--reconcile-job-batch", "5", "--reconcile-job-lease-seconds", "2"];
    let mut service = start(&db, "resume", &args).await;
    let client = reqwest::Client::new();
    register_many(&client, &service.base, "r", "events", RESUME_PARENTS).await;
    let raw = db.store().await;
    raw.execute_raw("UPDATE parent SET total = 7").await.unwrap();

    let job = start_job(&client, &service.base, json!({"dry_run": false})).await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    // Killed once the job is under way.
    let started = Instant::now();
    loop {
        let job = get_job(&client, &service.base, &job_id).await;
        if job["checked"].as_u64().unwrap() >= 10 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "never started: {job}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    service.kill().await;
    let checked_at_kill = raw.count_raw("SELECT checked FROM reconcile_job").await.unwrap();
    let repaired_at_kill = raw
        .count_raw("SELECT count(*) FROM parent WHERE total = 1")
        .await
        .unwrap();
    println!("killed with {checked_at_kill} of {RESUME_PARENTS} checked, {repaired_at_kill} repaired");
    assert!(
        (10..RESUME_PARENTS as i64).contains(&checked_at_kill),
        "killed mid-way: {checked_at_kill}"
    );

    service.restart().await;
    service.ready().await;
    let done = until_finished(&client, &service, &job_id).await;
    let listed = ids(&done);
    let distinct: BTreeSet<_> = listed.iter().collect();
    println!(
        "after the restart: state {}, checked {}, drifted {}, repaired {}, {} reports kept",
        done["state"],
        done["checked"],
        done["drifted"],
        done["repaired"],
        listed.len()
    );
    assert_eq!(done["state"], "done", "{}", done["error"]);
    assert_eq!(done["checked"], RESUME_PARENTS, "every parent counted once");
    assert_eq!(done["drifted"], RESUME_PARENTS, "every drift counted once");
    assert_eq!(done["repaired"], RESUME_PARENTS);
    assert_eq!(listed.len(), 1000, "the report keeps the first 1000");
    assert_eq!(distinct.len(), 1000, "no parent listed twice");
    assert_eq!(
        raw.count_raw("SELECT count(*) FROM parent WHERE total <> 1")
            .await
            .unwrap(),
        0,
        "every parent repaired"
    );
}

/// A job whose every step fails is retried, then marked failed with the error.
async fn job_failing_every_step_is_marked_failed(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = start(&db, "failing", &[]).await;
    let client = reqwest::Client::new();
    register_many(&client, &service.base, "f", "events", 3).await;
    // A job whose stored queue scope no longer reads (as a hand edit might leave it).
    let job_id = uuid::Uuid::new_v4();
    let (dry_run, now) = match backend {
        Backend::Postgres => ("true", "now()"),
        Backend::Sqlite => ("1", "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"),
    };
    let raw = db.store().await;
    raw.execute_raw(&format!(
        "INSERT INTO reconcile_job (job_id, dry_run, scope, created_at, updated_at) \
         VALUES ('{job_id}', {dry_run}, 'not a scope', {now}, {now})"
    ))
    .await
    .unwrap();
    let started = Instant::now();
    let failed = until_finished(&client, &service, &job_id.to_string()).await;
    let attempts = raw
        .count_raw(&format!(
            "SELECT CAST(attempts AS bigint) FROM reconcile_job WHERE job_id = '{job_id}'"
        ))
        .await
        .unwrap();
    println!(
        "failed after {attempts} attempts in {:?}: {}",
        started.elapsed(),
        failed["error"]
    );
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(attempts, 5, "{failed}");
    assert!(failed["error"].as_str().unwrap().contains("queue scope"), "{failed}");
    assert_eq!(failed["checked"], 0, "{failed}");
}

/// A replica stopped by SIGTERM finishes the step in hand and gives its job
/// back: the next replica takes it on at once, not once its lease (here a
/// minute) has run out.
async fn job_is_given_back_at_sigterm(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let args = ["--reconcile-job-batch", "5", "--reconcile-job-lease-seconds", "60"];
    let mut first = start(&db, "given-back-1", &args).await;
    let client = reqwest::Client::new();
    register_many(&client, &first.base, "g", "events", RESUME_PARENTS).await;
    let raw = db.store().await;
    raw.execute_raw("UPDATE parent SET total = 7").await.unwrap();

    let job = start_job(&client, &first.base, json!({"dry_run": false})).await;
    let job_id = job["job_id"].as_str().unwrap().to_owned();
    let started = Instant::now();
    while get_job(&client, &first.base, &job_id).await["checked"]
        .as_u64()
        .unwrap()
        < 10
    {
        assert!(started.elapsed() < Duration::from_secs(60), "the job never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let status = first.terminate(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "exit after SIGTERM: {status}; log:\n{}",
        first.log_text()
    );
    let checked_at_stop = raw.count_raw("SELECT checked FROM reconcile_job").await.unwrap();
    assert!(
        checked_at_stop < RESUME_PARENTS as i64,
        "stopped mid-way: {checked_at_stop} checked"
    );
    assert_eq!(
        raw.count_raw("SELECT count(*) FROM reconcile_job WHERE lease_owner IS NULL AND lease_expires_at IS NULL")
            .await
            .unwrap(),
        1,
        "the job's lease is given back; log:\n{}",
        first.log_text()
    );

    let second = start(&db, "given-back-2", &args).await;
    let stopped = Instant::now();
    loop {
        let checked = get_job(&client, &second.base, &job_id).await["checked"]
            .as_i64()
            .unwrap();
        if checked > checked_at_stop {
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(15),
            "the next replica has not taken the job on: {checked} checked; log:\n{}",
            second.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "stopped at {checked_at_stop} of {RESUME_PARENTS} checked; the next replica went on after {:?}",
        stopped.elapsed()
    );
    let done = until_finished(&client, &second, &job_id).await;
    assert_eq!(done["state"], "done", "{}", done["error"]);
    assert_eq!(done["checked"], RESUME_PARENTS, "every parent counted once");
    assert_eq!(done["repaired"], RESUME_PARENTS, "every parent repaired once");
}

both_stores!(
    a_job_outside_the_tokens_queues_is_forbidden,
    job_is_given_back_at_sigterm,
    job_failing_every_step_is_marked_failed,
    paged_sweep_visits_every_parent_once,
    bad_input_is_refused_and_writes_nothing,
    job_runs_to_done_with_counts_and_repairs,
    job_resumes_after_the_service_is_killed
);
