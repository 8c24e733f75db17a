//! What operators see: Prometheus metrics, `x-request-id` on every response
//! and log line, JSON logs; and long polls woken across replicas.

mod common;

use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The value of the first sample line of `text` that starts with `series `.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[track_caller]
fn expect_sample(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

async fn metrics_count_what_happened(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/M-1", json!({"queue": "obs", "children": children(4)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");

    // Two children claimed through the parent, one through the queue, one
    // under a 1-second lease that is left to run out.
    let by_parent = app.post("/v1/parents/M-1/claims", json!({"limit": 2})).await.body;
    let by_queue = app.post("/v1/queues/obs/claims", json!({"limit": 1})).await.body;
    let abandoned = app
        .post("/v1/queues/obs/claims", json!({"limit": 1, "lease_seconds": 1}))
        .await
        .body;
    assert_eq!(abandoned["children"].as_array().map(Vec::len), Some(1), "{abandoned}");
    let claim = by_parent["claim_id"].as_str().unwrap();
    let item = |seq: &Value, outcome: &str| json!({"parent_id": "M-1", "sequence": seq, "outcome": outcome, "reason": "r", "claim_id": claim});
    let first = &by_parent["children"][0]["sequence"];
    let second = &by_parent["children"][1]["sequence"];
    let batch = json!({"outcomes": [item(first, "processed"), item(second, "processed")]});
    assert_eq!(app.post("/v1/outcomes", batch.clone()).await.status, StatusCode::OK);
    assert_eq!(app.post("/v1/outcomes", batch).await.status, StatusCode::OK); // both duplicate
    let r = app
        .post(
            &format!("/v1/parents/M-1/children/{first}/outcome"),
            json!({"outcome": "failed", "reason": "late"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert_eq!(by_queue["children"].as_array().map(Vec::len), Some(1), "{by_queue}");

    // The reaper (every second in tests) sweeps the abandoned lease.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = app.get("/metrics").await.body.as_str().unwrap().to_owned();
        if sample(&text, "child_ledger_leases_expired_total").unwrap_or(0.0) >= 1.0 {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned lease was never counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    assert_eq!(
        expect_sample(&text, "child_ledger_children_claimed_total{queue=\"obs\"}"),
        4.0
    );
    assert_eq!(
        expect_sample(
            &text,
            "child_ledger_outcomes_total{outcome=\"processed\",status=\"applied\"}"
        ),
        2.0
    );
    assert_eq!(
        expect_sample(
            &text,
            "child_ledger_outcomes_total{outcome=\"processed\",status=\"duplicate\"}"
        ),
        2.0
    );
    assert_eq!(
        expect_sample(
            &text,
            "child_ledger_outcomes_total{outcome=\"failed\",status=\"conflict\"}"
        ),
        1.0
    );
    assert_eq!(
        expect_sample(
            &text,
            "child_ledger_http_requests_total{method=\"PUT\",route=\"/v1/parents/{parent_id}\",status=\"201\"}"
        ),
        1.0
    );
    let put = "method=\"PUT\",route=\"/v1/parents/{parent_id}\"";
    assert_eq!(
        expect_sample(
            &text,
            &format!("child_ledger_http_request_duration_seconds_count{{{put}}}")
        ),
        1.0
    );
    assert_eq!(
        expect_sample(
            &text,
            &format!("child_ledger_http_request_duration_seconds_bucket{{{put},le=\"+Inf\"}}")
        ),
        1.0
    );
    assert!(
        expect_sample(
            &text,
            &format!("child_ledger_http_request_duration_seconds_sum{{{put}}}")
        ) > 0.0
    );
    let pool = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite_writer",
    };
    let max = expect_sample(
        &text,
        &format!("child_ledger_db_pool_max_connections{{pool=\"{pool}\"}}"),
    );
    let idle = expect_sample(
        &text,
        &format!("child_ledger_db_pool_connections{{pool=\"{pool}\",state=\"idle\"}}"),
    );
    let in_use = expect_sample(
        &text,
        &format!("child_ledger_db_pool_connections{{pool=\"{pool}\",state=\"in_use\"}}"),
    );
    // The pool served every request above, so it holds at least one
    // connection, and never more than its maximum.
    assert!(max >= 1.0, "max {max}");
    assert!(
        idle + in_use >= 1.0 && idle + in_use <= max,
        "idle {idle} + in use {in_use}, max {max}"
    );
    for family in [
        "# TYPE child_ledger_http_requests_total counter",
        "# TYPE child_ledger_http_request_duration_seconds histogram",
        "# TYPE child_ledger_children_claimed_total counter",
        "# TYPE child_ledger_outcomes_total counter",
        "# TYPE child_ledger_leases_expired_total counter",
        "# TYPE child_ledger_db_pool_connections gauge",
    ] {
        assert!(text.lines().any(|l| l == family), "missing {family:?}");
    }
}

async fn every_response_carries_a_request_id(backend: Backend) {
    let limits = child_ledger::config::Limits {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let app = spawn_app_with(backend, limits).await;
    let limits_body = vec![b' '; 4096];
    let requests: Vec<(Method, &str, Option<Vec<u8>>)> = vec![
        (Method::GET, "/healthz", None),
        (Method::PUT, "/v1/parents/RID", Some(br#"{"children": [{}]}"#.to_vec())),
        (Method::GET, "/v1/parents/nope", None),
        (Method::GET, "/v1/nowhere", None),
        (Method::DELETE, "/v1/parents/RID", None),
        (
            Method::POST,
            "/v1/parents/RID/claims",
            Some(br#"{"limit": 0}"#.to_vec()),
        ),
        (Method::PUT, "/v1/parents/RID2", Some(limits_body)),
        (Method::GET, "/metrics", None),
    ];
    let mut seen = std::collections::HashSet::new();
    for (method, path, body) in requests {
        let mut req = app.client.request(method.clone(), format!("{}{path}", app.base));
        if let Some(body) = body {
            req = req.header("content-type", "application/json").body(body);
        }
        let response = req.send().await.unwrap();
        let id = response
            .headers()
            .get("x-request-id")
            .unwrap_or_else(|| panic!("{method} {path} answered {} without x-request-id", response.status()))
            .to_str()
            .unwrap()
            .to_owned();
        assert!(
            uuid::Uuid::parse_str(&id).is_ok(),
            "{method} {path}: generated id {id:?} is not a uuid"
        );
        assert!(seen.insert(id), "{method} {path}: request id reused");
    }
    // A caller's own id is kept and echoed.
    let response = app
        .client
        .get(format!("{}/v1/parents/RID", app.base))
        .header("x-request-id", "caller-chosen-7")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "caller-chosen-7");
}

/// A worker long-polling one replica wakes as soon as another replica
/// registers work: one Postgres NOTIFY per registration, not a recheck.
async fn long_poll_wakes_across_replicas(backend: Backend) {
    // The waiting claim's own periodic recheck is pushed past its wait, so
    // only the notification can wake it: the mechanism, not its fallback.
    let limits = child_ledger::config::Limits {
        wait_recheck_ms: 60_000,
        ..child_ledger::config::Limits::default()
    };
    let a = spawn_app_with(backend, limits).await;
    // SQLite is one process by design: its "replica" is the same service.
    let b = match backend {
        Backend::Postgres => Some(a.replica().await),
        Backend::Sqlite => None,
    };
    let registrar = b.as_ref().unwrap_or(&a);
    let waiter = {
        let client = a.client.clone();
        let url = format!("{}/v1/queues/wake/claims", a.base);
        tokio::spawn(async move {
            let started = Instant::now();
            let body: Value = client
                .post(url)
                .json(&json!({"wait_seconds": 15}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            (body, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let registered = Instant::now();
    let r = registrar
        .put("/v1/parents/W-1", json!({"queue": "wake", "children": children(3)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let (claim, waited) = waiter.await.unwrap();
    let after_registration = registered.elapsed();
    assert_eq!(claim["children"].as_array().map(Vec::len), Some(3), "{claim}");
    // With the recheck out of the way, only a wake-up answers within the wait.
    assert!(
        after_registration < Duration::from_millis(1500),
        "{backend:?}: the waiting claim answered {after_registration:?} after the registration (waited {waited:?})"
    );
}

/// `--log-format json` writes one JSON object per line, and every line logged
/// while serving a request carries that request's id.
async fn json_logs_carry_the_request_id(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start_with_env(
        "json-logs",
        &db.url,
        &["--log-format", "json"],
        &[("RUST_LOG", "info,tower_http=debug")],
    )
    .await;
    service.ready().await;
    let client = reqwest::Client::new();
    for (method, path) in [(Method::GET, "/v1/parents/nope"), (Method::PUT, "/v1/parents/J-1")] {
        let response = client
            .request(method, format!("{}{path}", service.base))
            .header("x-request-id", "log-trace-42")
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.headers()["x-request-id"], "log-trace-42");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = service.log_text();
        let lines: Vec<Value> = log
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}")))
            .collect();
        let tagged: Vec<&Value> = lines
            .iter()
            .filter(|l| l["span"]["request_id"] == "log-trace-42")
            .collect();
        let requests = tagged
            .iter()
            .filter(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("finished processing"))
            })
            .count();
        if requests == 2 {
            // Every line logged while serving any request names its request.
            for line in lines.iter().filter(|l| l["span"]["name"] == "request") {
                let id = line["span"]["request_id"].as_str().unwrap_or("");
                assert!(
                    !id.is_empty() && id != "-",
                    "a request's log line without its id: {line}"
                );
                if line["span"]["path"] == "/v1/parents/nope" || line["span"]["path"] == "/v1/parents/J-1" {
                    assert_eq!(id, "log-trace-42", "{line}");
                }
            }
            break;
        }
        assert!(Instant::now() < deadline, "request log lines without the id:\n{log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every completion is counted once, however it happens: at registration
/// (every child skipped), by a seal, and by the outcome of the last child;
/// repeating the outcomes completes nothing again.
async fn completions_are_counted_once(backend: Backend) {
    let app = spawn_app(backend).await;
    let skipped = json!({"children": [{"skip": "bad"}, {"skip": "bad"}]});
    assert_eq!(app.put("/v1/parents/C-1", skipped).await.status, StatusCode::CREATED);
    let decomposing = json!({"decomposed": false, "children": [{"skip": "bad"}]});
    assert_eq!(
        app.put("/v1/parents/C-2", decomposing).await.status,
        StatusCode::CREATED
    );
    assert_eq!(
        app.post("/v1/parents/C-2/seal", json!({"total": 1})).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.put("/v1/parents/C-3", json!({"children": children(2)}))
            .await
            .status,
        StatusCode::CREATED
    );
    let done = json!({"outcomes": [
        {"parent_id": "C-3", "sequence": 0, "outcome": "processed"},
        {"parent_id": "C-3", "sequence": 1, "outcome": "processed"}
    ]});
    assert_eq!(app.post("/v1/outcomes", done.clone()).await.status, StatusCode::OK);
    assert_eq!(app.post("/v1/outcomes", done).await.status, StatusCode::OK);
    for parent in ["C-1", "C-2", "C-3"] {
        let r = app.get(&format!("/v1/parents/{parent}")).await;
        assert_eq!(r.body["state"], "complete", "{r:?}");
    }
    let text = app.get("/metrics").await.body.as_str().unwrap().to_owned();
    assert_eq!(
        expect_sample(&text, "child_ledger_parents_completed_total"),
        3.0,
        "{text}"
    );
}

/// A fresh service's first scrape has the claim and outcome counters at 0:
/// `rate()` over them reads 0, not "no data", before the first claim.
async fn counters_exist_from_the_first_scrape(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/Z-1", json!({"queue": "zero", "children": children(1)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let text = app.get("/metrics").await.body.as_str().unwrap().to_owned();
    for series in [
        "child_ledger_outcomes_total{outcome=\"processed\",status=\"applied\"}",
        "child_ledger_outcomes_total{outcome=\"failed\",status=\"conflict\"}",
        "child_ledger_children_claimed_total{queue=\"zero\"}",
        "child_ledger_children_claimed_total{queue=\"other\"}",
    ] {
        assert_eq!(expect_sample(&text, series), 0.0, "{text}");
    }
}

/// Every replica reports the same per-queue figures (read from the
/// database, not counted in the process): the README tells operators to
/// aggregate them with `max`.
async fn replicas_report_the_same_queue_figures(backend: Backend) {
    let one = spawn_app(backend).await;
    let two = one.replica().await;
    let r = one
        .put("/v1/parents/M-1", json!({"queue": "same", "children": children(10)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = two.post("/v1/queues/same/claims", json!({"limit": 3})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let series = [
        "child_ledger_queue_children{queue=\"same\",state=\"pending\"}",
        "child_ledger_queue_children{queue=\"same\",state=\"in_flight\"}",
    ];
    let started = std::time::Instant::now();
    loop {
        let mut seen = Vec::new();
        for app in [&one, &two] {
            let text = app.get("/metrics").await.body.as_str().unwrap().to_owned();
            seen.push(series.map(|s| expect_sample(&text, s)));
        }
        if seen.iter().all(|figures| *figures == [7.0, 3.0]) {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(15),
            "the replicas report {seen:?}, not [7, 3] each"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

both_stores!(
    counters_exist_from_the_first_scrape,
    replicas_report_the_same_queue_figures,
    metrics_count_what_happened,
    completions_are_counted_once,
    every_response_carries_a_request_id,
    long_poll_wakes_across_replicas,
    json_logs_carry_the_request_id
);
