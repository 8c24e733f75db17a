//! Database outage: with Postgres stopped, requests fail fast with 503
//! problem+json and `Retry-After`, `/readyz` answers 503, and when Postgres
//! comes back the service recovers by itself, without a restart. A service
//! started while the database is down retries with backoff, says so in its log,
//! and serves once the database is up.
//!
//! These tests never touch the shared server: each starts and stops its own
//! throwaway cluster (`initdb` + `pg_ctl` on a free port, socket and data in a
//! temporary directory). When `initdb` cannot be found the tests fail under
//! `CI=true` or `LEDGER_REQUIRE_POSTGRES=1` and are skipped loudly otherwise.

mod common;

use std::time::{Duration, Instant};

use common::cluster::PgCluster;
use common::process::ServiceProcess;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// A failing request must be answered within this.
const FAIL_FAST: Duration = Duration::from_secs(5);
/// The service must serve again within this of Postgres coming back.
const RECOVERY: Duration = Duration::from_secs(15);

/// One answer, reduced to what these tests look at.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    content_type: String,
    retry_after: Option<String>,
    request_id: Option<String>,
    body: Value,
    took: Duration,
}

struct Http {
    base: String,
    client: reqwest::Client,
}

impl Http {
    fn new(base: &str) -> Self {
        Self {
            base: base.to_owned(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
        }
    }

    /// Sends a request; `Err` when no HTTP answer came back at all.
    async fn try_send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Answer, reqwest::Error> {
        let started = Instant::now();
        let mut request = self.client.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = response.status();
        let content_type = header(reqwest::header::CONTENT_TYPE).unwrap_or_default();
        let retry_after = header(reqwest::header::RETRY_AFTER);
        let request_id = header(reqwest::header::HeaderName::from_static("x-request-id"));
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer {
            status,
            content_type,
            retry_after,
            request_id,
            body,
            took: started.elapsed(),
        })
    }

    async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Answer {
        let label = format!("{method} {path}");
        self.try_send(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("{label}: no answer: {e}"))
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    async fn ok(&self, method: Method, path: &str, body: Option<Value>, expected: StatusCode) -> Value {
        let answer = self.send(method.clone(), path, body.as_ref()).await;
        assert_eq!(answer.status, expected, "{method} {path}: {answer:?}");
        answer.body
    }
}

/// Why an answer given during the outage is not the contract's 503, if it is not.
fn unavailable_violation(answer: &Answer) -> Option<String> {
    let mut wrong = Vec::new();
    if answer.took > FAIL_FAST {
        wrong.push(format!("took {:?}", answer.took));
    }
    if answer.status != StatusCode::SERVICE_UNAVAILABLE {
        wrong.push(format!("status {}", answer.status));
    }
    if !answer.content_type.starts_with("application/problem+json") {
        wrong.push(format!("content-type {:?}", answer.content_type));
    }
    if answer.retry_after.is_none() {
        wrong.push("no Retry-After".to_owned());
    }
    if answer.body["type"] != "/problems/database-unavailable" || answer.body["status"] != 503 {
        wrong.push(format!("body {}", answer.body));
    }
    (!wrong.is_empty()).then(|| wrong.join(", "))
}

const PARENT: &str = "outage-parent";

fn registration() -> Value {
    let mut children: Vec<Value> = (0..10)
        .map(|i| json!({"payload": {"event": i, "body": format!("event body {i}")}, "key": format!("evt-{i}")}))
        .collect();
    children.push(json!({"payload": {"event": 10}, "key": "evt-10", "skip": "invalid timestamp"}));
    json!({"queue": "outage", "payload": {"origin": "outage test"}, "children": children, "max_attempts": 5})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outage_answers_503_fast_and_recovers_without_restart() {
    let Some(cluster) = PgCluster::init().await else {
        return;
    };
    cluster.start().await;
    let url = cluster.create_database("ledger").await;
    // The lease reaper sweeps once at start and then not again during the
    // test: its statement reads `parent`, so it would queue behind the table
    // lock below and be counted as one of the requests waiting there.
    let service = ServiceProcess::start("outage", &url, &["--reap-interval-ms", "3600000"]).await;
    service.wait_for("/healthz", Duration::from_secs(60)).await;
    service.ready().await;
    let http = Http::new(&service.base);

    // Work written and acknowledged before the outage.
    let parent_path = format!("/v1/parents/{PARENT}");
    http.ok(Method::PUT, &parent_path, Some(registration()), StatusCode::CREATED)
        .await;
    let claim = http
        .ok(
            Method::POST,
            &format!("{parent_path}/claims"),
            Some(json!({"limit": 4, "lease_seconds": 300, "worker": "w-outage"})),
            StatusCode::OK,
        )
        .await;
    let claim_id = claim["claim_id"].as_str().expect("claim_id").to_owned();
    let claimed: Vec<u64> = claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(claimed, [0, 1, 2, 3]);
    let acknowledged = http
        .ok(
            Method::POST,
            &format!("{parent_path}/children/0/outcome"),
            Some(json!({"outcome": "processed", "result": {"remote_id": "r-0"}, "claim_id": claim_id})),
            StatusCode::OK,
        )
        .await;
    assert_eq!(acknowledged["applied"], true, "{acknowledged}");
    let batch = http
        .ok(
            Method::POST,
            "/v1/outcomes",
            Some(
                json!({"outcomes": [{"parent_id": PARENT, "sequence": 1, "outcome": "failed",
                                      "reason": "remote said no", "claim_id": claim_id}]}),
            ),
            StatusCode::OK,
        )
        .await;
    assert_eq!(batch["results"][0]["status"], "applied", "{batch}");
    let before = http.ok(Method::GET, &parent_path, None, StatusCode::OK).await;
    let children_path = format!("{parent_path}/children?limit=100");
    let children_before = http.ok(Method::GET, &children_path, None, StatusCode::OK).await;

    // Requests inside the database when it goes away: block two of them on a
    // table lock, so they are mid-statement when Postgres ends their sessions.
    let mut locker = cluster.connect("ledger").await;
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE parent IN ACCESS EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let in_flight = {
        let base = service.base.clone();
        let parent_path = parent_path.clone();
        let claim_id = claim_id.clone();
        tokio::spawn(async move {
            let http = Http::new(&base);
            let outcome = json!({"outcome": "processed", "result": {"remote_id": "r-2"}, "claim_id": claim_id});
            let outcome_path = format!("{parent_path}/children/2/outcome");
            let (read, write) = tokio::join!(
                http.try_send(Method::GET, &parent_path, None),
                http.try_send(Method::POST, &outcome_path, Some(&outcome)),
            );
            [("GET parent (in flight)", read), ("POST outcome (in flight)", write)]
        })
    };
    let mut watcher = cluster.connect("postgres").await;
    let waiting_since = Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = 'ledger' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting >= 2 {
            break;
        }
        assert!(
            waiting_since.elapsed() < Duration::from_secs(20),
            "the two requests never blocked on the lock; service log:\n{}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(watcher);

    // The outage.
    let stopping = Instant::now();
    cluster.stop("fast").await;
    let stopped_in = stopping.elapsed();
    drop(locker);

    // A request in flight when the database goes may still have finished
    // (Postgres can let it complete while shutting down): a success is a right
    // answer too, a 500 or a slow answer never is.
    let mut violations: Vec<String> = Vec::new();
    let mut in_flight_statuses: Vec<(&str, StatusCode)> = Vec::new();
    for (name, result) in in_flight.await.unwrap() {
        match result {
            Ok(answer) if answer.status.is_success() && answer.took <= FAIL_FAST => {
                in_flight_statuses.push((name, answer.status))
            }
            Ok(answer) => {
                if let Some(why) = unavailable_violation(&answer) {
                    violations.push(format!("{name}: {why}; {answer:?}"));
                }
                in_flight_statuses.push((name, answer.status));
            }
            Err(e) => violations.push(format!("{name}: no answer: {e}")),
        }
    }
    let outcome_in_flight = in_flight_statuses[1].1;
    let mut answers: Vec<(String, Answer)> = Vec::new();
    let probes: Vec<(&str, Method, String, Option<Value>)> = vec![
        ("GET /readyz", Method::GET, "/readyz".to_owned(), None),
        ("GET parent", Method::GET, parent_path.clone(), None),
        ("GET child", Method::GET, format!("{parent_path}/children/3"), None),
        (
            "POST claim",
            Method::POST,
            format!("{parent_path}/claims"),
            Some(json!({"limit": 2})),
        ),
        (
            "POST queue claim",
            Method::POST,
            "/v1/queues/outage/claims".to_owned(),
            Some(json!({"limit": 2})),
        ),
        (
            "POST outcome",
            Method::POST,
            format!("{parent_path}/children/3/outcome"),
            Some(json!({"outcome": "processed", "claim_id": claim_id})),
        ),
        (
            "POST batch outcomes",
            Method::POST,
            "/v1/outcomes".to_owned(),
            Some(json!({"outcomes": [{"parent_id": PARENT, "sequence": 3, "outcome": "processed"}]})),
        ),
        (
            "PUT new parent",
            Method::PUT,
            "/v1/parents/outage-new".to_owned(),
            Some(json!({"queue": "outage", "children": [{"payload": {"n": 1}}]})),
        ),
    ];
    // Twice, every endpoint at once: the first round meets the pool's dead
    // connections, the second a pool with none left.
    for round in 1..=2 {
        let sent = probes
            .iter()
            .map(|(_, method, path, body)| http.try_send(method.clone(), path, body.as_ref()));
        for ((name, ..), result) in probes.iter().zip(futures::future::join_all(sent).await) {
            match result {
                Ok(answer) => answers.push((format!("{name} (round {round})"), answer)),
                Err(e) => violations.push(format!("{name} (round {round}): no answer: {e}")),
            }
        }
    }
    violations.extend(
        answers
            .iter()
            .filter_map(|(name, answer)| unavailable_violation(answer).map(|why| format!("{name}: {why}"))),
    );
    let slowest = answers.iter().map(|(_, a)| a.took).max().unwrap_or_default();
    let healthz = http.get("/healthz").await;
    assert!(
        violations.is_empty(),
        "during the outage, answers that are not a fast 503 problem with Retry-After:\n  {}\n\
         answers:\n{answers:#?}\nservice log:\n{}",
        violations.join("\n  "),
        service.log_text()
    );
    assert_eq!(
        healthz.status,
        StatusCode::OK,
        "/healthz during the outage: {healthz:?}"
    );

    // Postgres comes back: the same process must serve again by itself.
    cluster.start().await;
    let back = Instant::now();
    let recovered_in = loop {
        let ready = http.try_send(Method::GET, "/readyz", None).await;
        if ready.is_ok_and(|a| a.status == StatusCode::OK) {
            let read = http.try_send(Method::GET, &parent_path, None).await;
            let claim = http
                .try_send(
                    Method::POST,
                    "/v1/queues/outage/claims",
                    Some(&json!({"limit": 1, "lease_seconds": 300})),
                )
                .await;
            if read.is_ok_and(|a| a.status == StatusCode::OK) && claim.is_ok_and(|a| a.status == StatusCode::OK) {
                break back.elapsed();
            }
        }
        assert!(
            back.elapsed() < Duration::from_secs(60),
            "the service did not recover within 60 s of Postgres coming back; log:\n{}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        recovered_in <= RECOVERY,
        "the service took {recovered_in:?} to serve again after Postgres came back (bound {RECOVERY:?})"
    );

    // Nothing written before the outage was lost or changed. The outcome in
    // flight for child 2 may have committed even when its answer was a 503
    // (the commit raced the session's end): that is the one change allowed.
    let child2_done = http
        .ok(Method::GET, &format!("{parent_path}/children/2"), None, StatusCode::OK)
        .await["state"]
        == "processed";
    let after = http.ok(Method::GET, &parent_path, None, StatusCode::OK).await;
    for field in [
        "parent_id",
        "queue",
        "state",
        "max_attempts",
        "expired_lease",
        "created_at",
        "decomposed_at",
    ] {
        assert_eq!(
            after[field], before[field],
            "parent {field} changed: {before} -> {after}"
        );
    }
    for count in ["total", "failed", "skipped"] {
        assert_eq!(
            after["counts"][count], before["counts"][count],
            "{count}: {before} -> {after}"
        );
    }
    assert_eq!(
        (after["counts"]["total"].as_u64(), after["counts"]["processed"].as_u64()),
        (Some(11), Some(1 + u64::from(child2_done)))
    );
    assert_eq!(
        (after["counts"]["failed"].as_u64(), after["counts"]["skipped"].as_u64()),
        (Some(1), Some(1))
    );
    let children_after = http.ok(Method::GET, &children_path, None, StatusCode::OK).await;
    let stable = |page: &Value| -> Vec<Value> {
        page["children"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["sequence"] != 2)
            .map(|c| {
                json!([
                    c["sequence"],
                    c["key"],
                    c["payload"],
                    c["outcome"],
                    c["reason"],
                    c["result"]
                ])
            })
            .collect()
    };
    assert_eq!(stable(&children_after), stable(&children_before));
    let child0 = http
        .ok(Method::GET, &format!("{parent_path}/children/0"), None, StatusCode::OK)
        .await;
    assert_eq!(
        (&child0["state"], &child0["result"]),
        (&json!("processed"), &json!({"remote_id": "r-0"})),
        "the outcome acknowledged before the outage: {child0}"
    );
    let child1 = http
        .ok(Method::GET, &format!("{parent_path}/children/1"), None, StatusCode::OK)
        .await;
    assert_eq!(
        (&child1["state"], &child1["reason"]),
        (&json!("failed"), &json!("remote said no")),
        "{child1}"
    );
    // The outcome in flight: the worker retries it unless it was acknowledged;
    // either way it is recorded once, as sent.
    let child2 = http
        .ok(Method::GET, &format!("{parent_path}/children/2"), None, StatusCode::OK)
        .await;
    if outcome_in_flight == StatusCode::OK {
        assert_eq!(
            child2["state"], "processed",
            "acknowledged in flight, then lost: {child2}"
        );
    }
    let retried = http
        .ok(
            Method::POST,
            &format!("{parent_path}/children/2/outcome"),
            Some(json!({"outcome": "processed", "result": {"remote_id": "r-2"}, "claim_id": claim_id})),
            StatusCode::OK,
        )
        .await;
    if outcome_in_flight == StatusCode::OK {
        assert_eq!(retried["applied"], false, "{retried}");
    }
    let child2 = http
        .ok(Method::GET, &format!("{parent_path}/children/2"), None, StatusCode::OK)
        .await;
    assert_eq!(
        (&child2["state"], &child2["result"]),
        (&json!("processed"), &json!({"remote_id": "r-2"})),
        "{child2}"
    );

    eprintln!(
        "outage: {} requests during the outage all answered 503 problem+json with Retry-After within {:.2} s; \
         the 2 in flight when Postgres stopped (pg_ctl stop took {:.2} s) answered {:?}; /healthz 200; \
         recovered {:.2} s after Postgres came back, without a restart",
        answers.len(),
        slowest.as_secs_f64(),
        stopped_in.as_secs_f64(),
        in_flight_statuses
            .iter()
            .map(|(name, status)| format!("{name}: {}", status.as_u16()))
            .collect::<Vec<_>>(),
        recovered_in.as_secs_f64()
    );
}

/// The log without ANSI colour sequences (`ESC [ ... m`).
fn strip_ansi(log: &str) -> String {
    let mut plain = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// The `retry_in_ms` values of the service's "database not reachable" lines.
fn retry_delays(log: &str) -> Vec<u64> {
    strip_ansi(log)
        .lines()
        .filter(|line| line.contains("database not reachable"))
        .filter_map(|line| {
            let (_, rest) = line.split_once("retry_in_ms")?;
            let digits: String = rest
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn started_while_database_is_down_retries_with_backoff_then_serves() {
    let Some(cluster) = PgCluster::init().await else {
        return;
    };
    cluster.start().await;
    let url = cluster.create_database("ledger").await;
    cluster.stop("fast").await;

    let service = ServiceProcess::start("start-while-down", &url, &[]).await;
    let started = Instant::now();
    // Two retries, the second after a longer pause than the first.
    let delays = loop {
        let delays = retry_delays(&service.log_text());
        if delays.len() >= 2 {
            break delays;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no two \"database not reachable\" retries logged within 30 s; log:\n{}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        delays[1] > delays[0],
        "no backoff between retries: retry_in_ms {delays:?}"
    );
    let retried_after = started.elapsed();

    // The port is open while the database is down: the process is live, not
    // ready, and /v1 says to come back later.
    let http = Http::new(&service.base);
    let healthz = http.get("/healthz").await;
    assert_eq!(
        healthz.status,
        StatusCode::OK,
        "/healthz while the database is down: {healthz:?}"
    );
    assert_eq!(healthz.body["status"], "ok", "{healthz:?}");
    assert!(
        healthz.request_id.is_some(),
        "no x-request-id while starting: {healthz:?}"
    );
    let ready = http.get("/readyz").await;
    assert!(ready.request_id.is_some(), "no x-request-id while starting: {ready:?}");
    assert_eq!(
        unavailable_violation(&ready),
        None,
        "/readyz while the database is down: {ready:?}"
    );
    for (method, path, body) in [
        (Method::GET, "/v1/parents", None),
        (Method::PUT, "/v1/parents/early", Some(json!({"children": []}))),
        (Method::POST, "/v1/queues/default/claims", Some(json!({}))),
    ] {
        let answer = http.send(method.clone(), path, body.as_ref()).await;
        assert_eq!(
            unavailable_violation(&answer),
            None,
            "{method} {path} while the database is down: {answer:?}"
        );
    }

    cluster.start().await;
    let back = Instant::now();
    let ready_in = service.wait_for("/readyz", Duration::from_secs(60)).await;
    let ready_after = back.elapsed();
    assert!(
        ready_after <= RECOVERY,
        "ready {ready_after:?} after Postgres came back (bound {RECOVERY:?}); log:\n{}",
        service.log_text()
    );
    let _ = ready_in;
    // And it serves for real, on the schema it migrated once the database came up.
    http.ok(
        Method::PUT,
        "/v1/parents/late-start",
        Some(json!({"children": [{"payload": {"n": 0}}, {"payload": {"n": 1}}]})),
        StatusCode::CREATED,
    )
    .await;
    let parent = http
        .ok(Method::GET, "/v1/parents/late-start", None, StatusCode::OK)
        .await;
    assert_eq!(parent["counts"]["total"], 2, "{parent}");
    let delays_logged = retry_delays(&service.log_text());

    eprintln!(
        "start while down: {} \"database not reachable\" retries logged (retry_in_ms {:?}), the second {:.1} s \
         after start; while down /healthz 200, /readyz and /v1 503 with Retry-After; ready {:.2} s after \
         Postgres came back, without a restart",
        delays_logged.len(),
        delays_logged,
        retried_after.as_secs_f64(),
        ready_after.as_secs_f64()
    );
}
