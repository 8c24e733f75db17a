//! Postgres failover, with real processes: a primary and a streaming
//! standby (`pg_basebackup -R`), two service replicas given both hosts in
//! one URL, eight workers burning down 20,000 children through them. The
//! primary is SIGKILLed in the middle and the standby promoted 2 s later.
//!
//! With the standby synchronous, nothing the service acknowledged is lost:
//! every outcome answered `200` (as `applied`) is on the new primary, no
//! child is terminal twice, every parent completes with its webhook sent,
//! reconcile finds no drift, and the only 5xx are the 503s of the gap. Each
//! replica serves again within 10 s of the promotion. The same run with
//! the standby asynchronous reports what it lost.
//!
//! Also: a service started with only the standby up is not ready and says
//! why, and becomes ready by itself once that host is promoted.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use common::cluster::PgCluster;
use common::process::{ServiceProcess, free_port};
use reqwest::StatusCode;
use serde_json::{Value, json};

const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItY2hpbGQtbGVkZ2VyLXRlc3Rz";
const QUEUE: &str = "failover";
const PARENTS: usize = 20;
const CHILDREN: usize = 1_000;
const WORKERS: usize = 8;
/// Each replica must serve a `200` within this of the promotion.
const FOLLOW_TARGET: Duration = Duration::from_secs(10);

/// Completion webhooks received, by the parent in their path.
#[derive(Default)]
struct Hooks(Mutex<Vec<String>>);

async fn hook_receiver() -> (u16, Arc<Hooks>) {
    async fn hook(State(hooks): State<Arc<Hooks>>, Path(parent): Path<String>) -> StatusCode {
        hooks.0.lock().unwrap().push(parent);
        StatusCode::OK
    }
    let hooks = Arc::new(Hooks::default());
    let port = free_port();
    let router = axum::Router::new()
        .route("/hook/{parent}", axum::routing::post(hook))
        .with_state(Arc::clone(&hooks));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (port, hooks)
}

/// One outcome the service answered `applied`.
#[derive(Clone, Debug)]
struct Acked {
    parent: String,
    sequence: i64,
    outcome: String,
}

/// What the workers saw.
#[derive(Default)]
struct Seen {
    acked: Mutex<Vec<Acked>>,
    /// Every HTTP answer: replica, when it was asked, when answered, status.
    answers: Mutex<Vec<(usize, Instant, Instant, u16)>>,
    /// Answers the contract does not allow: a 5xx other than 503, or none.
    violations: Mutex<Vec<String>>,
}

impl Seen {
    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }
}

/// Sends one request through `replica`, recording its answer.
async fn call(client: &reqwest::Client, seen: &Seen, replica: usize, url: &str, body: &Value) -> Option<(u16, Value)> {
    let asked = Instant::now();
    let sent = client.post(url).json(body).send().await;
    let response = match sent {
        Ok(response) => response,
        Err(err) => {
            seen.violations.lock().unwrap().push(format!("{url}: no answer: {err}"));
            return None;
        }
    };
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key(reqwest::header::RETRY_AFTER);
    seen.answers
        .lock()
        .unwrap()
        .push((replica, asked, Instant::now(), status));
    let body: Value = response.json().await.unwrap_or(Value::Null);
    if status >= 500 && (status != 503 || !retry_after) {
        seen.violations.lock().unwrap().push(format!("{url}: {status} {body}"));
    }
    Some((status, body))
}

/// Claims and records outcomes through one replica until told to stop;
/// an outcome batch is sent again until it is answered (as a real worker's).
async fn worker(id: usize, base: String, replica: usize, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let claims = format!("{base}/v1/queues/{QUEUE}/claims");
    let outcomes_url = format!("{base}/v1/outcomes");
    while !stop.load(Ordering::Relaxed) {
        let claim = json!({"limit": 50, "lease_seconds": 10, "worker": format!("w{id}")});
        let children = match call(&client, &seen, replica, &claims, &claim).await {
            Some((200, body)) => body,
            _ => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let claim_id = children["claim_id"].as_str().unwrap_or_default().to_owned();
        let children = children["children"].as_array().cloned().unwrap_or_default();
        if children.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let outcomes: Vec<Value> = children
            .iter()
            .map(|c| {
                let failed = c["sequence"].as_i64().unwrap() % 7 == 0;
                json!({
                    "parent_id": c["parent_id"], "sequence": c["sequence"], "claim_id": claim_id,
                    "outcome": if failed { "failed" } else { "processed" },
                    "reason": if failed { json!("failed on purpose") } else { Value::Null },
                })
            })
            .collect();
        let batch = json!({ "outcomes": outcomes });
        let started = Instant::now();
        loop {
            match call(&client, &seen, replica, &outcomes_url, &batch).await {
                Some((200, body)) => {
                    let results = body["results"].as_array().cloned().unwrap_or_default();
                    let mut acked = seen.acked.lock().unwrap();
                    for (sent, result) in outcomes.iter().zip(&results) {
                        if result["status"] == "applied" {
                            acked.push(Acked {
                                parent: sent["parent_id"].as_str().unwrap().to_owned(),
                                sequence: sent["sequence"].as_i64().unwrap(),
                                outcome: sent["outcome"].as_str().unwrap().to_owned(),
                            });
                        }
                    }
                    break;
                }
                Some((503, _)) | None if started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Some((status, body)) if status != 503 => {
                    seen.violations
                        .lock()
                        .unwrap()
                        .push(format!("outcomes: {status} {body}"));
                    break;
                }
                _ => break,
            }
        }
    }
}

async fn get(base: &str, path: &str) -> Option<(u16, Value)> {
    let response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

/// A primary and its started standby, synchronous or not, and the URL
/// naming both (primary first).
async fn primary_and_standby(synchronous: bool) -> Option<(PgCluster, PgCluster, String)> {
    let primary = PgCluster::init().await?;
    primary.start().await;
    primary.create_database("ledger").await;
    let standby = primary.standby_of().await;
    standby.start().await;
    primary.synchronous_standbys(if synchronous { "*" } else { "" }).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/ledger",
        primary.port, standby.port
    );
    Some((primary, standby, url))
}

/// What one failover run found.
struct Report {
    acked: usize,
    /// Acknowledged outcomes not on the new primary as answered.
    lost: Vec<String>,
    /// Children answered `applied` more than once: the first answer's
    /// outcome was lost with the old primary, and the child came back as
    /// work.
    twice: usize,
    /// Each replica's first `200` after the promotion.
    first_ok: Vec<Option<Duration>>,
    gap_503s: usize,
    /// Requests asked before the promotion and answered after it: held by
    /// the service while there was no primary.
    held_across: usize,
}

impl Report {
    /// Whether the workers met the failover at all: a `503`, or a request
    /// that was in flight while no primary was up and answered once the
    /// standby was promoted (the service may hold a request rather than
    /// answer `503` while it finds the new primary).
    fn failover_seen(&self) -> bool {
        self.gap_503s > 0 || self.held_across > 0
    }
}

async fn burn_down_through_a_failover(synchronous: bool) -> Option<Report> {
    let (primary, standby, url) = primary_and_standby(synchronous).await?;
    let (hook_port, hooks) = hook_receiver().await;
    let allow = format!("127.0.0.1:{hook_port}");
    let flags = [
        "--webhook-allow-hosts",
        &allow,
        "--webhook-secret",
        SECRET,
        "--webhook-poll-ms",
        "100",
        "--webhook-retry-schedule-ms",
        "200,500,1000,2000,5000",
        "--reap-interval-ms",
        "200",
    ];
    let replicas = [
        ServiceProcess::start("failover-a", &url, &flags).await,
        ServiceProcess::start("failover-b", &url, &flags).await,
    ];
    for replica in &replicas {
        replica.ready().await;
    }
    let client = reqwest::Client::new();
    let parents: Vec<String> = (0..PARENTS).map(|i| format!("failover-{i}")).collect();
    for parent in &parents {
        let body = json!({
            "queue": QUEUE,
            "children": common::children(CHILDREN),
            "webhook_url": format!("http://127.0.0.1:{hook_port}/hook/{parent}"),
        });
        let response = client
            .put(format!("{}/v1/parents/{parent}", replicas[0].base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "{}",
            response.text().await.unwrap()
        );
    }

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..WORKERS)
        .map(|id| {
            let replica = id % 2;
            tokio::spawn(worker(
                id,
                replicas[replica].base.clone(),
                replica,
                Arc::clone(&seen),
                Arc::clone(&stop),
            ))
        })
        .collect();

    // The primary dies with about a third of the children done.
    let total = PARENTS * CHILDREN;
    let started = Instant::now();
    while seen.acked() < total / 3 {
        assert!(started.elapsed() < Duration::from_secs(120), "burn-down too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    primary.kill();
    let killed_at_acked = seen.acked();
    tokio::time::sleep(Duration::from_secs(2)).await;
    standby.promote().await;
    let promoted = Instant::now();

    // Every parent completes.
    let mut open: HashSet<&String> = parents.iter().collect();
    while !open.is_empty() {
        assert!(
            promoted.elapsed() < Duration::from_secs(180),
            "{} parents still open 180 s after the promotion; replica log:\n{}",
            open.len(),
            replicas[0].log_text()
        );
        let mut done = Vec::new();
        for parent in &open {
            if let Some((200, body)) = get(&replicas[0].base, &format!("/v1/parents/{parent}")).await
                && body["complete"] == true
            {
                done.push(*parent);
            }
        }
        for parent in done {
            open.remove(parent);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }

    // What the new primary holds.
    let mut new_primary = standby.connect("ledger").await;
    let terminal: HashMap<(String, i64), String> = sqlx::query_as::<_, (String, i64, String)>(
        "SELECT parent_id, sequence, state FROM child_status WHERE state IN ('processed', 'failed')",
    )
    .fetch_all(&mut new_primary)
    .await
    .unwrap()
    .into_iter()
    .map(|(parent, sequence, state)| ((parent, sequence), state))
    .collect();
    let acked = seen.acked.lock().unwrap().clone();
    let lost: Vec<String> = acked
        .iter()
        .filter(|a| terminal.get(&(a.parent.clone(), a.sequence)) != Some(&a.outcome))
        .map(|a| format!("{}/{} {}", a.parent, a.sequence, a.outcome))
        .collect();
    let mut applied = HashSet::new();
    let twice = acked
        .iter()
        .filter(|a| !applied.insert((a.parent.clone(), a.sequence)))
        .count();

    let violations = seen.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "answers outside the contract: {violations:#?}");

    let reconcile = client
        .post(format!("{}/v1/reconcile", replicas[1].base))
        .json(&json!({"dry_run": true, "queue": QUEUE}))
        .send()
        .await
        .unwrap();
    assert_eq!(reconcile.status(), StatusCode::OK);
    let reconcile: Value = reconcile.json().await.unwrap();
    assert_eq!(reconcile["checked"], PARENTS, "{reconcile}");
    assert_eq!(reconcile["drifted"], 0, "{reconcile}");

    // Every completion webhook arrives (at least once).
    let waited = Instant::now();
    loop {
        let heard: HashSet<String> = hooks.0.lock().unwrap().iter().cloned().collect();
        let missing: Vec<&String> = parents.iter().filter(|p| !heard.contains(*p)).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "completion webhooks never sent for {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let answers = seen.answers.lock().unwrap().clone();
    let first_ok = (0..replicas.len())
        .map(|replica| {
            answers
                .iter()
                .filter(|(r, _, at, status)| *r == replica && *at > promoted && *status == 200)
                .map(|(_, _, at, _)| at.duration_since(promoted))
                .min()
        })
        .collect();
    let gap_503s = answers.iter().filter(|(_, _, _, status)| *status == 503).count();
    let held_across = answers
        .iter()
        .filter(|(_, asked, at, _)| *asked < promoted && *at > promoted)
        .count();
    eprintln!(
        "failover ({}): {} outcomes acknowledged, {killed_at_acked} before the kill; acknowledged and then lost: \
         {} not on the new primary as answered, {twice} answered applied twice (lost, then done again); first 200 \
         after the promotion, per replica: {:?}; {gap_503s} answers were 503, {held_across} requests were held across \
         the promotion",
        if synchronous {
            "synchronous standby"
        } else {
            "asynchronous standby"
        },
        acked.len(),
        lost.len(),
        first_ok,
    );
    Some(Report {
        acked: acked.len(),
        lost,
        twice,
        first_ok,
        gap_503s,
        held_across,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nothing_acknowledged_is_lost_with_a_synchronous_standby() {
    let Some(report) = burn_down_through_a_failover(true).await else {
        return;
    };
    assert!(
        report.acked >= PARENTS * CHILDREN * 9 / 10,
        "{} acknowledged",
        report.acked
    );
    assert!(report.lost.is_empty(), "acknowledged, then lost: {:?}", report.lost);
    assert_eq!(report.twice, 0, "children terminal twice");
    assert!(
        report.failover_seen(),
        "the failover was never seen: no 503, and no request held across the promotion"
    );
    for (replica, first) in report.first_ok.iter().enumerate() {
        let first = first.unwrap_or_else(|| panic!("replica {replica} never answered 200 after the promotion"));
        assert!(
            first <= FOLLOW_TARGET,
            "replica {replica} took {first:?} to follow the primary"
        );
    }
}

/// The same run with the standby asynchronous: the service follows all the
/// same, and what was lost is reported (an acknowledged outcome lost with
/// the primary's unsent WAL comes back as work, and is done again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_an_asynchronous_standby_the_service_follows_and_reports_what_was_lost() {
    let Some(report) = burn_down_through_a_failover(false).await else {
        return;
    };
    assert!(
        report.failover_seen(),
        "the failover was never seen: no 503, and no request held across the promotion"
    );
    for (replica, first) in report.first_ok.iter().enumerate() {
        let first = first.unwrap_or_else(|| panic!("replica {replica} never answered 200 after the promotion"));
        assert!(
            first <= FOLLOW_TARGET,
            "replica {replica} took {first:?} to follow the primary"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn started_on_a_standby_it_waits_saying_why_and_serves_once_promoted() {
    let Some((primary, standby, url)) = primary_and_standby(false).await else {
        return;
    };
    primary.stop("fast").await;
    let service = ServiceProcess::start("failover-standby-only", &url, &[]).await;
    // Not ready, and saying why: no writable host, the standby read-only.
    let started = Instant::now();
    let why = loop {
        if let Some((503, body)) = get(&service.base, "/readyz").await
            && body["detail"].as_str().is_some_and(|d| d.contains("read-only"))
        {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "/readyz never said the standby is read-only; log:\n{}",
            service.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(why["type"], "/problems/database-unavailable", "{why}");
    let detail = why["detail"].as_str().unwrap();
    assert!(detail.contains(&format!("127.0.0.1:{}", standby.port)), "{detail}");
    assert!(!detail.contains("postgres@"), "no user or password in {detail}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(get(&service.base, "/readyz").await.map(|(s, _)| s), Some(503));

    standby.promote().await;
    let promoted = Instant::now();
    let took = service.wait_for("/readyz", Duration::from_secs(30)).await;
    let (status, ready) = get(&service.base, "/readyz").await.unwrap();
    assert_eq!(status, 200, "{ready}");
    assert_eq!(ready["host"], format!("127.0.0.1:{}", standby.port), "{ready}");
    eprintln!(
        "ready {:?} after the promotion ({took:?} of polling)",
        promoted.elapsed()
    );
}
