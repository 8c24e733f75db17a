//! child-ledger's benchmark suite: `cargo bench --bench ledger [-- --quick] [-- --json PATH]`.
//!
//! Starts the release service (the crate's own binary) against scratch
//! Postgres databases and a scratch SQLite file, runs every scenario with its
//! baseline measured in the same run, prints a table and optionally writes
//! `{"scenarios": [...]}` as JSON. It cleans up after itself.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use child_ledger::ledger::{ClaimRequest, ClaimScope, Outcome, OutcomeWrite, ParentId, QueueName};
use child_ledger::store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::Connection;

/// What a child costs (`--cost-only`, and the full run).
mod cost;
mod search;

/// Event streams and trace export beside a burn-down (`--events-only`, and the full run).
mod events;

/// Claim admission: limits that never bind, a rate, caps across replicas (`--admission-only`, and the full run).
mod admission;

/// A parent's results, summary, redrive and tolerance (`--verdicts-only`, and the full run).
mod verdicts;

/// The tests' PgBouncer harness (transaction mode, a free port).
#[allow(dead_code)]
#[path = "../tests/common/pgbouncer.rs"]
mod pgbouncer;

const WORKERS: usize = 8;

struct Args {
    quick: bool,
    /// Only the fresh-database drain and the peers (to iterate on that comparison).
    fresh_only: bool,
    /// Only the dashboard scenarios.
    dashboard_only: bool,
    /// Only the connection-pooler scenarios.
    pooler_only: bool,
    /// Only the cost per child (`cost.*`).
    cost_only: bool,
    /// Only the children search (`search.*`).
    search_only: bool,
    /// Only the event streams and trace export (`events.*`, `otel.*`).
    events_only: bool,
    /// Only claim admission (`admission.*`).
    admission_only: bool,
    verdicts_only: bool,
    /// Only the claim latency at 10,000 rows and at scale (`claim_latency_scale*`).
    scale_only: bool,
    /// Another build's service binary, whose cost per child is measured
    /// beside this build's in the same run (`--baseline-bin PATH`).
    baseline_bin: Option<String>,
    json: Option<PathBuf>,
    admin_url: String,
    peers: bool,
}

fn parse_args() -> Args {
    let mut args = Args {
        quick: false,
        fresh_only: false,
        dashboard_only: false,
        pooler_only: false,
        cost_only: false,
        search_only: false,
        events_only: false,
        admission_only: false,
        verdicts_only: false,
        scale_only: false,
        baseline_bin: None,
        json: None,
        admin_url: std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned()),
        peers: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--quick" => args.quick = true,
            "--no-peers" => args.peers = false,
            "--fresh-only" => args.fresh_only = true,
            "--dashboard-only" => args.dashboard_only = true,
            "--pooler-only" => args.pooler_only = true,
            "--cost-only" => args.cost_only = true,
            "--search-only" => args.search_only = true,
            "--events-only" => args.events_only = true,
            "--admission-only" => args.admission_only = true,
            "--verdicts-only" => args.verdicts_only = true,
            "--scale-only" => args.scale_only = true,
            "--baseline-bin" => args.baseline_bin = it.next(),
            "--json" => args.json = it.next().map(PathBuf::from),
            "--database-url" => args.admin_url = it.next().expect("--database-url URL"),
            // cargo bench passes --bench; ignore anything else it adds.
            _ => {}
        }
    }
    if args.quick {
        args.peers = false;
    }
    args
}

struct Sizes {
    register: usize,
    burn: usize,
    queue_parents: usize,
    scale_rows: i64,
    peers_jobs: usize,
    /// Children of the cost runs.
    cost: usize,
    /// Children in each state of the children search (`search.*`).
    search: usize,
    /// Children of the fresh-database drain: as many as the peers' jobs.
    fresh: usize,
    /// Children of each big parent in `burn_down_http.big_parents`.
    big_parent: usize,
    /// Children of the parent a small one is registered behind (`fairness`).
    huge_parent: usize,
    /// Claims of `admission.cap_violations`.
    admission_claims: u64,
    /// Failed children of the parent whose results, summary and redrive are measured.
    results: i64,
}

impl Sizes {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                register: 20_000,
                burn: 20_000,
                queue_parents: 20,
                scale_rows: 500_000,
                peers_jobs: 0,
                cost: 20_000,
                search: 100_000,
                fresh: 20_000,
                big_parent: 20_000,
                huge_parent: 100_000,
                admission_claims: 10_000,
                results: 1_000_000,
            }
        } else {
            Self {
                register: 100_000,
                burn: 200_000,
                queue_parents: 100,
                scale_rows: 10_000_000,
                peers_jobs: 200_000,
                cost: 200_000,
                search: 1_000_000,
                fresh: 200_000,
                big_parent: 100_000,
                huge_parent: 1_000_000,
                admission_claims: 100_000,
                results: 1_000_000,
            }
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Scenario {
    name: String,
    unit: String,
    value: f64,
    baseline: Option<String>,
    baseline_value: Option<f64>,
    ratio: Option<f64>,
    target: Option<String>,
}

impl Scenario {
    fn new(name: &str, unit: &str, value: f64) -> Self {
        Self {
            name: name.to_owned(),
            unit: unit.to_owned(),
            value,
            baseline: None,
            baseline_value: None,
            ratio: None,
            target: None,
        }
    }

    fn against(mut self, baseline: &str, baseline_value: f64) -> Self {
        self.baseline = Some(baseline.to_owned());
        self.baseline_value = Some(baseline_value);
        self.ratio = Some(self.value / baseline_value);
        self
    }

    fn target(mut self, target: &str) -> Self {
        self.target = Some(target.to_owned());
        self
    }

    fn met(&self) -> Option<bool> {
        let target = self.target.as_deref()?;
        // "<= 1.5" bounds the ratio; "<= 150 MiB" or "<= 16 claims" the value.
        let (op, bound) = target.split_once(' ')?;
        let (bound, unit) = bound.split_once(' ').unwrap_or((bound, ""));
        let bound: f64 = bound.trim_end_matches('x').parse().ok()?;
        let value = if unit.is_empty() { self.ratio? } else { self.value };
        Some(match op {
            ">=" => value >= bound,
            "<=" => value <= bound,
            _ => return None,
        })
    }
}

/// A release service process on a free port.
struct Service {
    child: tokio::process::Child,
    base: String,
    pid: u32,
}

impl Service {
    async fn start(database_url: &str) -> Self {
        Self::start_with(database_url, &[]).await
    }

    /// `start` with extra command-line flags.
    async fn start_with(database_url: &str, extra: &[&str]) -> Self {
        Self::start_bin(None, database_url, extra).await
    }

    /// `start_with` of the service binary `bin` (this build's when `None`).
    async fn start_bin(bin: Option<&str>, database_url: &str, extra: &[&str]) -> Self {
        Self::start_bin_env(bin, database_url, extra, &[]).await
    }

    /// `start_with`, with environment variables `env` set for the service.
    async fn start_env(database_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::start_bin_env(None, database_url, extra, env).await
    }

    async fn start_bin_env(bin: Option<&str>, database_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new(bin.unwrap_or(env!("CARGO_BIN_EXE_child-ledger")))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--database-url", database_url])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start child-ledger");
        let pid = child.id().unwrap();
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..200 {
            if let Ok(r) = client.get(format!("{base}/readyz")).send().await
                && r.status().is_success()
            {
                return Self { child, base, pid };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("child-ledger did not become ready on {base}");
    }

    /// Peak resident set size of the process so far, in MiB.
    fn peak_rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(f64::NAN)
    }

    async fn stop(mut self) -> f64 {
        let peak = self.peak_rss_mib();
        let _ = self.child.kill().await;
        peak
    }
}

/// A scratch Postgres database, dropped at the end.
struct ScratchDb {
    admin_url: String,
    name: String,
    url: String,
}

impl ScratchDb {
    async fn create(admin_url: &str, tag: &str) -> Self {
        let name = format!("ledger_bench_{tag}_{}", uuid::Uuid::new_v4().simple());
        let mut admin = sqlx::PgConnection::connect(admin_url).await.expect("connect admin");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        let root = admin_url.rsplit_once('/').map(|(r, _)| r).unwrap_or(admin_url);
        // Plain TCP, as the peers connect: since TLS is compiled in, the
        // default `sslmode=prefer` would encrypt every round trip to a local
        // server with ssl = on, which only one side of each ratio would pay.
        let tls = admin_url.split_once('?').map_or("sslmode=disable", |(_, query)| query);
        Self {
            admin_url: admin_url.to_owned(),
            url: format!("{root}/{name}?{tls}"),
            name,
        }
    }

    async fn drop_now(self) {
        if let Ok(mut admin) = sqlx::PgConnection::connect(&self.admin_url).await {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            )))
            .execute(&mut admin)
            .await;
        }
    }
}

fn payload(i: usize) -> serde_json::Value {
    // ~100 bytes of JSON per child.
    json!({"event": i, "source": "bench", "body": "abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz"})
}

fn registration_body(n: usize, queue: &str, decomposed: bool, priority: i32) -> Vec<u8> {
    let children: Vec<_> = (0..n).map(|i| json!({"payload": payload(i)})).collect();
    serde_json::to_vec(&json!({"queue": queue, "children": children, "decomposed": decomposed, "priority": priority}))
        .unwrap()
}

async fn put_raw(client: &reqwest::Client, url: &str, body: Vec<u8>) -> reqwest::StatusCode {
    client
        .put(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
}

/// Registers `n` children under one parent, in pages of 100k (append + seal beyond).
async fn register(client: &reqwest::Client, base: &str, parent: &str, queue: &str, n: usize) {
    register_at(client, base, parent, queue, n, 0).await
}

/// `register` at a queue priority.
async fn register_at(client: &reqwest::Client, base: &str, parent: &str, queue: &str, n: usize, priority: i32) {
    const PAGE: usize = 100_000;
    if n <= PAGE {
        let status = put_raw(
            client,
            &format!("{base}/v1/parents/{parent}"),
            registration_body(n, queue, true, priority),
        )
        .await;
        assert!(status.is_success(), "register {parent}: {status}");
        return;
    }
    let status = put_raw(
        client,
        &format!("{base}/v1/parents/{parent}"),
        registration_body(0, queue, false, priority),
    )
    .await;
    assert!(status.is_success(), "register {parent}: {status}");
    for start in (0..n).step_by(PAGE) {
        let children: Vec<_> = (start..(start + PAGE).min(n))
            .map(|i| json!({"sequence": i, "payload": payload(i)}))
            .collect();
        let r = client
            .post(format!("{base}/v1/parents/{parent}/children"))
            .json(&json!({ "children": children }))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "append {parent}: {}", r.status());
    }
    let r = client
        .post(format!("{base}/v1/parents/{parent}/seal"))
        .json(&json!({"total": n}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "seal {parent}: {}", r.status());
}

#[derive(Deserialize)]
struct ClaimReply {
    claim_id: uuid::Uuid,
    children: Vec<ClaimedRef>,
}

#[derive(Deserialize)]
struct ClaimedRef {
    parent_id: String,
    sequence: i64,
}

#[derive(Serialize)]
struct OutcomeItem<'a> {
    parent_id: &'a str,
    sequence: i64,
    outcome: &'static str,
    claim_id: uuid::Uuid,
}

/// One HTTP worker: claim `limit`, post their outcomes in batches of
/// `batch`, until a claim comes back empty. Returns the children it finished.
async fn http_worker(
    client: reqwest::Client,
    claim_url: String,
    outcomes_url: String,
    limit: usize,
    batch: usize,
) -> u64 {
    let claim_body = serde_json::to_vec(&json!({"limit": limit, "lease_seconds": 600})).unwrap();
    let mut done = 0;
    loop {
        let reply = client
            .post(&claim_url)
            .header("content-type", "application/json")
            .body(claim_body.clone())
            .send()
            .await
            .unwrap();
        assert!(reply.status().is_success(), "claim: {}", reply.status());
        let claim: ClaimReply = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
        if claim.children.is_empty() {
            return done;
        }
        for chunk in claim.children.chunks(batch) {
            post_processed(&client, &outcomes_url, claim.claim_id, chunk).await;
            done += chunk.len() as u64;
        }
    }
}

/// Posts `processed` for `children` of `claim_id` in one batch.
async fn post_processed(client: &reqwest::Client, outcomes_url: &str, claim_id: uuid::Uuid, children: &[ClaimedRef]) {
    let items: Vec<_> = children
        .iter()
        .map(|c| OutcomeItem {
            parent_id: &c.parent_id,
            sequence: c.sequence,
            outcome: "processed",
            claim_id,
        })
        .collect();
    let r = client
        .post(outcomes_url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&json!({ "outcomes": items })).unwrap())
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "outcomes: {}", r.status());
}

/// Drains claimable work over HTTP with `workers` concurrent workers; each
/// worker uses its own claim path, claims `limit` at a time and posts their
/// outcomes in batches of 100. Returns children/s.
async fn burn_down_http(base: &str, claim_paths: &[String], limit: usize, expected: u64) -> f64 {
    burn_down_http_batched(base, claim_paths, limit, 100, expected).await
}

/// `burn_down_http` posting outcomes in batches of `batch`.
async fn burn_down_http_batched(base: &str, claim_paths: &[String], limit: usize, batch: usize, expected: u64) -> f64 {
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let started = Instant::now();
    let workers: Vec<_> = claim_paths
        .iter()
        .map(|path| {
            tokio::spawn(http_worker(
                client.clone(),
                format!("{base}{path}"),
                format!("{base}/v1/outcomes"),
                limit,
                batch,
            ))
        })
        .collect();
    let mut done = 0;
    for w in workers {
        done += w.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(done, expected, "burn-down finished a different number of children");
    done as f64 / elapsed
}

/// A hostile client beside the honest workers: 200 slowloris sockets that
/// send a header line a second (reconnecting when the service cuts them off),
/// 100 long polls on an empty queue (asked again as each ends), and one
/// client sending 60 MB registrations of `{}` children, each refused, back to
/// back.
struct Hostile {
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<u64>>,
}

impl Hostile {
    fn start(base: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = base.trim_start_matches("http://").to_owned();
        let mut tasks = Vec::new();
        for _ in 0..200 {
            let (stop, addr) = (stop.clone(), addr.clone());
            tasks.push(tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let mut cut_off = 0;
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut socket) = tokio::net::TcpStream::connect(&addr).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    let mut line = b"POST /v1/outcomes HTTP/1.1\r\nHost: x\r\n".to_vec();
                    while !stop.load(Ordering::Relaxed) && socket.write_all(&line).await.is_ok() {
                        line = b"X-Slow: 1\r\n".to_vec();
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    cut_off += 1;
                }
                cut_off
            }));
        }
        let client = reqwest::Client::new();
        for _ in 0..100 {
            let (stop, client, url) = (
                stop.clone(),
                client.clone(),
                format!("{base}/v1/queues/hostile-empty/claims"),
            );
            tasks.push(tokio::spawn(async move {
                let mut polls = 0;
                while !stop.load(Ordering::Relaxed) {
                    let _ = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(r#"{"limit": 1, "wait_seconds": 2}"#)
                        .send()
                        .await;
                    polls += 1;
                }
                polls
            }));
        }
        let (flag, url) = (stop.clone(), format!("{base}/v1/parents/hostile-flood"));
        let mut flood = br#"{"queue": "flood", "children": ["#.to_vec();
        flood.extend(b"{},".repeat(20_000_000));
        flood.extend(b"{}]}");
        // Shared, not copied per request: the hostile client's own CPU is the bench's too.
        let flood = bytes::Bytes::from(flood);
        tasks.push(tokio::spawn(async move {
            let mut refused = 0;
            while !flag.load(Ordering::Relaxed) {
                let sent = client
                    .put(&url)
                    .header("content-type", "application/json")
                    .body(flood.clone())
                    .send()
                    .await;
                if sent.map_or(true, |r| r.status().is_client_error()) {
                    refused += 1;
                }
            }
            refused
        }));
        Self { stop, tasks }
    }

    /// Stops the hostile client: how many floods were refused.
    async fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let mut last = 0;
        for task in self.tasks {
            last = task.await.unwrap();
        }
        last
    }
}

/// The same loop as `http_worker`, calling the store in-process.
async fn burn_down_inprocess(store: &Store, scopes: &[ClaimScope], limit: i64, expected: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let workers: Vec<_> = scopes
        .iter()
        .cloned()
        .map(|scope| {
            let store = store.clone();
            let done = done.clone();
            tokio::spawn(async move {
                loop {
                    let request = ClaimRequest {
                        scope: scope.clone(),
                        queue: None,
                        claim_id: uuid::Uuid::new_v4(),
                        limit,
                        lease_seconds: 600,
                        worker: None,
                        budget: child_ledger::config::Limits::default().response_budget(),
                    };
                    let claim = store.claim(&request).await.unwrap().claim;
                    if claim.children.is_empty() {
                        return;
                    }
                    for chunk in claim.children.chunks(100) {
                        let writes: Vec<_> = chunk
                            .iter()
                            .map(|c| OutcomeWrite {
                                parent_id: c.parent_id.clone(),
                                sequence: c.sequence,
                                outcome: Outcome::Processed,
                                reason: None,
                                result: None,
                                claim_id: Some(claim.claim_id),
                            })
                            .collect();
                        store.record_outcomes(writes.into()).await.unwrap();
                        done.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(done.load(Ordering::Relaxed), expected);
    expected as f64 / elapsed
}

fn parent_paths(parent: &str, n: usize) -> Vec<String> {
    vec![format!("/v1/parents/{parent}/claims"); n]
}

fn parent_scopes(parent: &str, n: usize) -> Vec<ClaimScope> {
    vec![ClaimScope::Parent(ParentId::parse(parent).unwrap()); n]
}

/// One answered queue claim of a running load: its number in answer order,
/// when it was answered, and how many children it took from each parent.
struct Served {
    number: u64,
    sent: Instant,
    at: Instant,
    parents: Vec<(String, usize)>,
}

/// `WORKERS` HTTP workers claiming 100 at a time from a queue and posting
/// their outcomes until stopped; every claim that returned children is kept.
struct QueueLoad {
    stop: Arc<AtomicBool>,
    served: Arc<Mutex<Vec<Served>>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

impl QueueLoad {
    fn start(base: &str, queue: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let claims = Arc::new(AtomicU64::new(0));
        let served = Arc::new(Mutex::new(Vec::new()));
        let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
        let workers = (0..WORKERS)
            .map(|_| {
                let (stop, claims, served, client) = (stop.clone(), claims.clone(), served.clone(), client.clone());
                let claim_url = format!("{base}/v1/queues/{queue}/claims");
                let outcomes_url = format!("{base}/v1/outcomes");
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let sent = Instant::now();
                        let reply = client
                            .post(&claim_url)
                            .json(&json!({"limit": 100}))
                            .send()
                            .await
                            .unwrap();
                        assert!(reply.status().is_success(), "claim: {}", reply.status());
                        let claim: ClaimReply = reply.json().await.unwrap();
                        if claim.children.is_empty() {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            continue;
                        }
                        let number = claims.fetch_add(1, Ordering::SeqCst);
                        let mut parents: Vec<(String, usize)> = Vec::new();
                        for c in &claim.children {
                            match parents.iter_mut().find(|(p, _)| *p == c.parent_id) {
                                Some((_, n)) => *n += 1,
                                None => parents.push((c.parent_id.clone(), 1)),
                            }
                        }
                        served.lock().unwrap().push(Served {
                            number,
                            sent,
                            at: Instant::now(),
                            parents,
                        });
                        post_processed(&client, &outcomes_url, claim.claim_id, &claim.children).await;
                    }
                })
            })
            .collect();
        Self { stop, served, workers }
    }

    /// Children claimed so far.
    fn children(&self) -> usize {
        self.served
            .lock()
            .unwrap()
            .iter()
            .flat_map(|s| &s.parents)
            .map(|(_, n)| n)
            .sum()
    }

    /// Waits until `parent` has had `n` children claimed (60 s at most);
    /// returns the claims that took its first and its last child.
    async fn until_claimed(&self, parent: &str, n: usize) -> (u64, Instant, u64, Instant) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            {
                let served = self.served.lock().unwrap();
                let mut got = 0;
                let mut first = None;
                for s in served.iter() {
                    if let Some((_, k)) = s.parents.iter().find(|(p, _)| p == parent) {
                        first.get_or_insert((s.number, s.at));
                        got += k;
                        if got >= n {
                            let (first_number, first_at) = first.unwrap();
                            return (first_number, first_at, s.number, s.at);
                        }
                    }
                }
            }
            assert!(Instant::now() < deadline, "{parent} was not claimed within 60 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Claims sent at or after `since` and answered before claim `number`.
    fn sent_since_before(&self, since: Instant, number: u64) -> usize {
        let served = self.served.lock().unwrap();
        served.iter().filter(|s| s.sent >= since && s.number < number).count()
    }

    /// Children of parents other than `parent` claimed in claims numbered `from..=to`.
    fn others_between(&self, parent: &str, from: u64, to: u64) -> usize {
        let served = self.served.lock().unwrap();
        served
            .iter()
            .filter(|s| (from..=to).contains(&s.number))
            .flat_map(|s| &s.parents)
            .filter(|(p, _)| p != parent)
            .map(|(_, n)| n)
            .sum()
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.workers {
            w.await.unwrap();
        }
    }
}

/// Burns `parents` of `n` children each, registered in one queue of a fresh
/// database with no VACUUM before the drain, through queue claims. Returns children/s.
async fn fresh_queue_burn(admin_url: &str, tag: &str, parents: usize, n: usize) -> (f64, f64) {
    let db = ScratchDb::create(admin_url, tag).await;
    let service = Service::start(&db.url).await;
    let client = reqwest::Client::new();
    for p in 0..parents {
        register(&client, &service.base, &format!("{tag}-{p}"), tag, n).await;
    }
    let path = format!("/v1/queues/{tag}/claims");
    let rate = burn_down_http(&service.base, &vec![path; WORKERS], 100, (parents * n) as u64).await;
    let rss = service.stop().await;
    db.drop_now().await;
    (rate, rss)
}

/// Puts the database in the same state before every measured run, so neither
/// side pays for the previous scenario's checkpoint or dead rows.
/// Burn-downs through PgBouncer in transaction mode (`--db-pooler
/// transaction`), against the same burn-down over a direct connection on the
/// same database, measured before and after it (their mean is the baseline):
/// one parent, and a queue of many parents.
async fn through_pgbouncer(admin_url: &str, sizes: &Sizes) -> Vec<Scenario> {
    let bouncer = match pgbouncer::PgBouncer::start(admin_url, None).await {
        Ok(bouncer) => bouncer,
        Err(why) => {
            eprintln!("{why}: the pooler scenarios are skipped");
            return Vec::new();
        }
    };
    let db = ScratchDb::create(admin_url, "pooler").await;
    let direct = Service::start(&db.url).await;
    let pooled = Service::start_with(
        &bouncer.url_for(&db.url),
        &["--db-pooler", "transaction", "--listen-database-url", &db.url],
    )
    .await;
    let client = reqwest::Client::new();
    let mut scenarios = Vec::new();

    eprintln!("burn_down through pgbouncer, one parent of {} children ...", sizes.burn);
    for run in RUNS {
        register(&client, &direct.base, run, "pooler", sizes.burn).await;
    }
    let rates = pooled_against_direct(&db.url, &direct, &pooled, |run| {
        (parent_paths(run, WORKERS), sizes.burn as u64)
    })
    .await;
    scenarios.push(
        Scenario::new("burn_down_http.through_pgbouncer", "children/s", rates.0)
            .against("burn_down_http, direct (mean of before and after)", rates.1)
            .target(">= 0.7"),
    );

    let per_parent = sizes.burn / sizes.queue_parents;
    eprintln!(
        "burn_down through pgbouncer, a queue of {} parents ...",
        sizes.queue_parents
    );
    for run in RUNS {
        for p in 0..sizes.queue_parents {
            register(&client, &direct.base, &format!("{run}-{p}"), run, per_parent).await;
        }
    }
    let total = (per_parent * sizes.queue_parents) as u64;
    let rates = pooled_against_direct(&db.url, &direct, &pooled, |run| {
        (vec![format!("/v1/queues/{run}/claims"); WORKERS], total)
    })
    .await;
    scenarios.push(
        Scenario::new("burn_down_http.queue_parents.through_pgbouncer", "children/s", rates.0)
            .against(
                "burn_down_http.queue_parents, direct (mean of before and after)",
                rates.1,
            )
            .target(">= 0.7"),
    );

    pooled.stop().await;
    direct.stop().await;
    drop(bouncer);
    db.drop_now().await;
    scenarios
}

/// The runs of `through_pgbouncer`, in order: a warm-up (the first burn-down
/// on a fresh database grows the heap and the indexes, see
/// `burn_down_http.cold_database`), then direct, pooled, direct.
const RUNS: [&str; 4] = ["warm-up", "direct-1", "pooled", "direct-2"];

/// Burns down each of `RUNS` (`work(run)`: its claim paths and children) on
/// its service; the pooled rate, and the mean of the two direct ones.
async fn pooled_against_direct(
    database_url: &str,
    direct: &Service,
    pooled: &Service,
    work: impl Fn(&str) -> (Vec<String>, u64),
) -> (f64, f64) {
    let mut rates = Vec::new();
    for run in RUNS {
        let base = if run == "pooled" { &pooled.base } else { &direct.base };
        let (paths, children) = work(run);
        settle(database_url).await;
        rates.push(burn_down_http(base, &paths, 100, children).await);
    }
    eprintln!(
        "  (warm-up {:.0}) direct {:.0}, pooled {:.0}, direct {:.0} children/s",
        rates[0], rates[1], rates[2], rates[3]
    );
    (rates[2], (rates[1] + rates[3]) / 2.0)
}

async fn settle(database_url: &str) {
    let mut conn = sqlx::PgConnection::connect(database_url).await.unwrap();
    sqlx::query("VACUUM ANALYZE").execute(&mut conn).await.unwrap();
    sqlx::query("CHECKPOINT").execute(&mut conn).await.unwrap();
}

/// SQLite's counterpart of `settle`: fresh statistics and the WAL written back.
async fn settle_sqlite(path: &Path) {
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("ANALYZE").execute(&mut conn).await.unwrap();
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
        .execute(&mut conn)
        .await
        .unwrap();
}

/// `COPY` of rows identical to what a registration writes, into the same table.
async fn copy_baseline(database_url: &str, parent: &str, n: usize) -> f64 {
    let mut conn = sqlx::PgConnection::connect(database_url).await.unwrap();
    sqlx::query("INSERT INTO parent (parent_id, queue, fingerprint) VALUES ($1, 'copy', 'copy')")
        .bind(parent)
        .execute(&mut conn)
        .await
        .unwrap();
    let mut data = Vec::with_capacity(n * 140);
    for i in 0..n {
        let line = format!("{parent}\t{i}\t{}\tpending\n", payload(i));
        data.extend_from_slice(line.as_bytes());
    }
    let started = Instant::now();
    let mut copy = conn
        .copy_in_raw("COPY child (parent_id, sequence, payload, state) FROM STDIN")
        .await
        .unwrap();
    copy.send(data).await.unwrap();
    copy.finish().await.unwrap();
    n as f64 / started.elapsed().as_secs_f64()
}

/// Registers fresh parents and returns the best children/s of `runs`.
async fn register_rate(base: &str, tag: &str, n: usize, runs: usize) -> f64 {
    let client = reqwest::Client::new();
    let mut best: f64 = 0.0;
    for run in 0..runs {
        let body = registration_body(n, "register", true, 0);
        let started = Instant::now();
        let status = put_raw(&client, &format!("{base}/v1/parents/{tag}-{run}"), body).await;
        assert_eq!(status, reqwest::StatusCode::CREATED);
        best = best.max(n as f64 / started.elapsed().as_secs_f64());
    }
    best
}

/// The times of `samples` sequential claims (limit 100) on one parent, in ms.
async fn claim_latency(base: &str, parent: &str, samples: usize) -> Vec<f64> {
    let client = reqwest::Client::new();
    let url = format!("{base}/v1/parents/{parent}/claims");
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let r = client
            .post(&url)
            .json(&json!({"limit": 100, "lease_seconds": 600}))
            .send()
            .await
            .unwrap();
        let claim: ClaimReply = r.json().await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(claim.children.len(), 100, "the latency parent ran dry");
    }
    times
}

/// Claims timed in each round.
const LATENCY_SAMPLES: usize = 100;
/// Rounds, each on a fresh 10k-child parent.
const LATENCY_ROUNDS: usize = 3;

/// p50 and p99 (nearest rank) of all claims over three rounds, each draining
/// a fresh 10k-child parent with 100 claims of 100: 300 samples, so the p99
/// is the 297th of them, not the second-largest of a hundred.
async fn latency_rounds(client: &reqwest::Client, base: &str, tag: &str) -> (f64, f64) {
    let mut times = Vec::with_capacity(LATENCY_SAMPLES * LATENCY_ROUNDS);
    for round in 0..LATENCY_ROUNDS {
        let parent = format!("{tag}-{round}");
        register(client, base, &parent, "latency", 10_000).await;
        times.extend(claim_latency(base, &parent, LATENCY_SAMPLES).await);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let rank = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    (rank(0.5), rank(0.99))
}

/// `claim_latency_scale`: claim latency (p50, p99) with 10,000 rows, then
/// again after `rows` terminal children were added; with the service's peak
/// RSS.
async fn claim_latency_scale(admin_url: &str, rows: i64, bin: Option<&str>) -> (Vec<Scenario>, f64) {
    let client = reqwest::Client::new();
    eprintln!("claim_latency_scale: 10k rows ({}) ...", bin.unwrap_or("this build"));
    let db = ScratchDb::create(admin_url, "scale").await;
    let service = Service::start_bin(bin, &db.url, &[]).await;
    let (p50_small, p99_small) = latency_rounds(&client, &service.base, "latency-small").await;
    eprintln!("claim_latency_scale: filling {rows} terminal rows ...");
    fill_terminal(&db.url, rows).await;
    // The fill and its VACUUM leave gigabytes the kernel has not written back
    // yet (2.2 GB, measured from /proc/meminfo): when the kernel writes them
    // back during the rounds, every claim's commit waits behind that write,
    // and the rounds measure the disk catching up with the fill (p50 3.6 ms
    // against 1.5). A checkpoint writes them out first, as `settle` does
    // before every other measured drain; the 10k rounds start on a fresh
    // database with nothing to write. The checkpoints that start during the
    // rounds at scale, and what the kernel still had to write when they
    // started, are printed, to tell their cost from the ledger's.
    cost::checkpoint(&db.url).await;
    let unwritten = kernel_unwritten_mib();
    let before = checkpoints(&db.url).await;
    let (p50_big, p99_big) = latency_rounds(&client, &service.base, "latency-big").await;
    let after = checkpoints(&db.url).await;
    eprintln!(
        "claim_latency_scale: during the rounds at scale: {} checkpoints, {} buffers written by them; \
         {} MiB not yet written back by the kernel when they started",
        after.0 - before.0,
        after.1 - before.1,
        unwritten.map_or_else(|| "?".to_owned(), |m| m.to_string())
    );
    let scale = format!("{}M rows", rows as f64 / 1e6);
    let (name, target) = match bin {
        None => ("claim_latency_scale", "<= 1.5"),
        Some(_) => ("claim_latency_scale.baseline_build", "-"),
    };
    let scenarios = vec![
        Scenario::new(name, &format!("ms p99 at {scale}"), p99_big)
            .against("p99 at 10k rows", p99_small)
            .target(target),
        Scenario::new(&format!("{name}.p50"), &format!("ms p50 at {scale}"), p50_big)
            .against("p50 at 10k rows", p50_small),
    ];
    let rss = service.stop().await;
    db.drop_now().await;
    (scenarios, rss)
}

/// What the kernel holds to write back (`Dirty` + `Writeback` in
/// `/proc/meminfo`), in MiB; `None` where there is no such file.
fn kernel_unwritten_mib() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = meminfo
        .lines()
        .filter(|line| line.starts_with("Dirty:") || line.starts_with("Writeback:"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some(kib / 1024)
}

/// Checkpoints so far (timed and requested) and the buffers they wrote.
async fn checkpoints(database_url: &str) -> (i64, i64) {
    let mut conn = sqlx::PgConnection::connect(database_url).await.unwrap();
    sqlx::query_as("SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint FROM pg_stat_bgwriter")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// Fills the ledger with terminal children of many parents, straight in SQL.
async fn fill_terminal(database_url: &str, rows: i64) {
    const PER_PARENT: i64 = 10_000;
    let mut conn = sqlx::PgConnection::connect(database_url).await.unwrap();
    let parents = (rows / PER_PARENT).max(1);
    sqlx::query(
        "INSERT INTO parent (parent_id, queue, fingerprint, total, processed, decomposed_at, completed_at) \
         SELECT 'done-' || p, 'done', 'x', $1, $1, now(), now() FROM generate_series(1, $2) p",
    )
    .bind(PER_PARENT)
    .bind(parents)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO child (parent_id, sequence, payload, state, attempts, terminal_at, outcome_attempt) \
         SELECT 'done-' || p, s, jsonb_build_object('event', s, 'source', 'fill'), 'processed', 1, now(), 1 \
         FROM generate_series(1, $2) p, generate_series(0, $1 - 1) s",
    )
    .bind(PER_PARENT)
    .bind(parents)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE child").execute(&mut conn).await.unwrap();
}

#[derive(Deserialize)]
struct PeerResult {
    peer: String,
    version: String,
    jobs_per_second: f64,
    settings: String,
}

/// Runs one peer's drain script; installs the peers' packages when missing.
async fn run_peer(script: &str, admin_url: &str, jobs: usize) -> Option<PeerResult> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers");
    if !dir.join("node_modules").exists() {
        let status = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .await;
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("npm ci failed in {}: peers skipped", dir.display());
            return None;
        }
    }
    let output = tokio::process::Command::new("node")
        .args([
            script,
            "--database-url",
            admin_url,
            "--jobs",
            &jobs.to_string(),
            "--concurrency",
            &WORKERS.to_string(),
        ])
        .current_dir(&dir)
        .stderr(Stdio::inherit())
        .output()
        .await
        .ok()?;
    if !output.status.success() {
        eprintln!("{script} failed: {}", output.status);
        return None;
    }
    let line = String::from_utf8_lossy(&output.stdout).lines().last()?.to_owned();
    serde_json::from_str(&line).ok()
}

fn print_table(scenarios: &[Scenario]) {
    println!(
        "\n{:<34} {:>14} {:<12} {:<28} {:>14} {:>7} {:<10} met",
        "scenario", "value", "unit", "baseline", "baseline value", "ratio", "target"
    );
    for s in scenarios {
        println!(
            "{:<34} {:>14.1} {:<12} {:<28} {:>14} {:>7} {:<10} {}",
            s.name,
            s.value,
            s.unit,
            s.baseline.as_deref().unwrap_or("-"),
            s.baseline_value
                .map(|v| format!("{v:.1}"))
                .unwrap_or_else(|| "-".to_owned()),
            s.ratio.map(|r| format!("{r:.2}")).unwrap_or_else(|| "-".to_owned()),
            s.target.as_deref().unwrap_or("-"),
            match s.met() {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
    }
}

/// A fresh database holding one parent of `n`, settled (VACUUM ANALYZE,
/// CHECKPOINT, as the peers are), drained once by `WORKERS` HTTP workers that
/// claim `batch` at a time and post each claim's outcomes as one batch.
/// Returns children/s and the service's peak memory.
async fn fresh_drain(admin_url: &str, n: usize, batch: usize) -> (f64, f64) {
    let client = reqwest::Client::new();
    let db = ScratchDb::create(admin_url, "fresh").await;
    let service = Service::start(&db.url).await;
    register(&client, &service.base, "fresh", "fresh", n).await;
    settle(&db.url).await;
    eprintln!("draining {n} children, claims of {batch} ...");
    let rate = burn_down_http_batched(&service.base, &parent_paths("fresh", WORKERS), batch, batch, n as u64).await;
    let rss = service.stop().await;
    db.drop_now().await;
    (rate, rss)
}

/// A peer against our drains of a fresh database. The ratio that counts
/// takes the peer's own shape: graphile-worker fetches 500 jobs per query
/// into its local queue and completes them in batches, so there our workers
/// claim 500 and post each claim's outcomes as one batch; pg-boss fetches and
/// completes 100 at a time, as our default workers do. The other drain is
/// shown beside it.
fn peer_scenarios(peer: &PeerResult, fresh: f64, fresh_500: f64) -> [Scenario; 2] {
    let against = format!("{} {}", peer.peer, peer.version);
    let (same, same_name, other, other_name) = if peer.peer == "graphile-worker" {
        (fresh_500, "claims_of_500", fresh, "claims_of_100")
    } else {
        (fresh, "claims_of_100", fresh_500, "claims_of_500")
    };
    [
        Scenario::new(
            &format!("peers.{}", peer.peer),
            &format!("children/s ({same_name})"),
            same,
        )
        .against(&against, peer.jobs_per_second)
        .target(">= 1.0"),
        Scenario::new(&format!("peers.{}.{other_name}", peer.peer), "children/s", other)
            .against(&against, peer.jobs_per_second),
    ]
}

/// Runs a cost window twice, `what` and `what, again`, each one's line in
/// `lines`; both runs, in turn.
async fn twice(lines: &mut Vec<String>, what: &str, window: impl AsyncFn() -> cost::Cost) -> [cost::Cost; 2] {
    let mut run = async |again: &str| {
        eprintln!("cost: {what}{again} ...");
        let cost = window().await;
        lines.push(cost.line(&format!("{what}{again}")));
        cost
    };
    [run("").await, run(", again").await]
}

/// `cost.*` (issue 28): what one child costs on Postgres and SQLite with a
/// plain Node worker, beside graphile-worker draining as many jobs, and beside
/// another build's service (`--baseline-bin`) measured the same way in the
/// same run. Ours with claims of 500 against the other build, and ours on
/// SQLite, are each the mean of two runs.
async fn cost_scenarios(args: &Args, sizes: &Sizes) -> Vec<Scenario> {
    let n = sizes.cost;
    let mut lines = Vec::new();
    let mut scenarios = Vec::new();
    let (two, one) = (cost::Loop::TwoRequests, cost::Loop::OneRequest);
    eprintln!("cost: {n} children, Node worker, claims of 500 ...");
    let first = cost::ours_on_postgres(&args.admin_url, None, n, 500, two).await;
    lines.push(first.line("ours, claims of 500"));
    // Against another build, each side is measured twice in the order ours,
    // theirs, theirs, ours, and compared by its mean: on a shared 2-core
    // machine one window's Postgres CPU moved by a fifth from one run to the
    // next, and whatever drifts over the four windows weighs on both sides
    // alike.
    let (ours, before) = match &args.baseline_bin {
        Some(bin) => {
            let theirs = twice(&mut lines, "baseline build, claims of 500", async || {
                cost::ours_on_postgres(&args.admin_url, Some(bin), n, 500, two).await
            })
            .await;
            eprintln!("cost: claims of 500, again ...");
            let again = cost::ours_on_postgres(&args.admin_url, None, n, 500, two).await;
            lines.push(again.line("ours, claims of 500, again"));
            let ours = cost::Cost::mean(&first, &again);
            let before = cost::Cost::mean(&theirs[0], &theirs[1]);
            lines.push(ours.line("ours, claims of 500, the mean of both runs"));
            lines.push(before.line("baseline build, claims of 500, the mean of both runs"));
            (ours, Some(before))
        }
        None => (first, None),
    };
    eprintln!("cost: claims of 100 ...");
    let ours_100 = cost::ours_on_postgres(&args.admin_url, None, n, 100, two).await;
    lines.push(ours_100.line("ours, claims of 100"));
    eprintln!("cost: claims of 500, each chunk's outcomes with the next claim ...");
    let ours_one = cost::ours_on_postgres(&args.admin_url, None, n, 500, one).await;
    lines.push(ours_one.line("ours, claims of 500, one request a chunk"));
    eprintln!("cost: claims of 100, each chunk's outcomes with the next claim ...");
    let ours_100_one = cost::ours_on_postgres(&args.admin_url, None, n, 100, one).await;
    lines.push(ours_100_one.line("ours, claims of 100, one request a chunk"));
    // SQLite's service CPU is measured twice as well, and reported by its
    // mean: one window moved by as much as 4 µs of 25 between runs.
    let sqlite_runs = twice(&mut lines, "ours on SQLite, claims of 500", async || {
        cost::ours_on_sqlite(n, 500, two).await
    })
    .await;
    let sqlite = cost::Cost::mean(&sqlite_runs[0], &sqlite_runs[1]);
    lines.push(sqlite.line("ours on SQLite, claims of 500, the mean of both runs"));
    eprintln!("cost: SQLite, claims of 500, one request a chunk ...");
    let sqlite_one = cost::ours_on_sqlite(n, 500, one).await;
    lines.push(sqlite_one.line("ours on SQLite, claims of 500, one request a chunk"));
    let peers = if args.peers && n >= 100_000 {
        let mut peers = Vec::new();
        for batch in [500, 100] {
            eprintln!("cost: graphile-worker, local queue of {batch} ...");
            if let Some((name, peer)) = cost::graphile(&args.admin_url, n, batch).await {
                lines.push(peer.line(&format!("{name}, local queue of {batch}")));
                peers.push((name, batch, peer));
            }
        }
        peers
    } else {
        Vec::new()
    };
    println!();
    for line in &lines {
        println!("{line}");
    }

    scenarios.push(Scenario::new(
        "cost.per_child.postgres_cpu",
        "µs per child",
        ours.postgres_us,
    ));
    if let Some(before) = &before {
        scenarios.push(
            Scenario::new(
                "cost.per_child.postgres_cpu.vs_baseline",
                "µs per child",
                ours.postgres_us,
            )
            .against("the baseline build", before.postgres_us)
            .target("<= 0.5"),
        );
        scenarios.push(
            Scenario::new(
                "cost.per_child.wal_bytes.vs_baseline",
                "bytes per child",
                ours.wal_bytes,
            )
            .against("the baseline build", before.wal_bytes),
        );
    }
    scenarios.push(Scenario::new(
        "cost.per_child.machine_cpu",
        "µs per child",
        ours.machine_us,
    ));
    scenarios.push(Scenario::new(
        "cost.per_child.service_cpu",
        "µs per child",
        ours.service_us,
    ));
    scenarios.push(Scenario::new(
        "cost.per_child.client_cpu",
        "µs per child",
        ours.client_us,
    ));
    scenarios.push(Scenario::new("cost.per_child.wal_bytes", "bytes per child", ours.wal_bytes).target("<= 900 bytes"));
    scenarios.push(Scenario::new(
        "cost.per_child.buffers_written",
        "per child",
        ours.buffers,
    ));
    scenarios.push(Scenario::new(
        "cost.per_child.hot_share",
        "% of updates",
        ours.hot_share * 100.0,
    ));
    scenarios.push(Scenario::new("cost.sqlite.service_cpu", "µs per child", sqlite.service_us).target("<= 25 µs"));
    scenarios.push(
        Scenario::new("cost.sqlite.burn_down", "children/s", sqlite.children_per_second)
            .against("ours on Postgres, claims of 500", ours.children_per_second)
            .target(">= 1.2"),
    );
    scenarios.push(
        Scenario::new(
            "cost.sqlite.burn_down.one_request",
            "children/s",
            sqlite_one.children_per_second,
        )
        .against(
            "ours on Postgres, claims of 500, one request a chunk",
            ours_one.children_per_second,
        )
        .target(">= 1.2"),
    );
    for (name, batch, peer) in &peers {
        let (mine, mine_one, label) = if *batch == 500 {
            (&ours, &ours_one, "claims_of_500")
        } else {
            (&ours_100, &ours_100_one, "claims_of_100")
        };
        scenarios.push(
            Scenario::new(
                &format!("node.burn_down.{label}.one_request"),
                "children/s",
                mine_one.children_per_second,
            )
            .against(&format!("{name}, local queue {batch}"), peer.children_per_second)
            .target(">= 1.0"),
        );
        scenarios.push(
            Scenario::new(
                &format!("cost.machine_cpu.{label}.one_request"),
                "µs per child",
                mine_one.machine_us,
            )
            .against(&format!("{name}, local queue {batch}"), peer.machine_us),
        );
        scenarios.push(
            Scenario::new(
                &format!("node.burn_down.{label}"),
                "children/s",
                mine.children_per_second,
            )
            .against(&format!("{name}, local queue {batch}"), peer.children_per_second)
            .target(">= 1.0"),
        );
        scenarios.push(
            Scenario::new(&format!("cost.postgres_cpu.{label}"), "µs per child", mine.postgres_us)
                .against(&format!("{name}, local queue {batch}"), peer.postgres_us),
        );
    }
    scenarios
}

/// `--fresh-only`: the fresh-database drains and the peers, nothing else.
async fn fresh_against_peers(args: &Args, sizes: &Sizes) {
    let (fresh, _) = fresh_drain(&args.admin_url, sizes.fresh, 100).await;
    let (fresh_500, _) = fresh_drain(&args.admin_url, sizes.fresh, 500).await;
    let mut scenarios = vec![
        Scenario::new("burn_down_http.fresh_database", "children/s", fresh),
        Scenario::new("burn_down_http.fresh_database.claims_of_500", "children/s", fresh_500),
    ];
    if args.peers {
        for script in ["graphile.mjs", "pgboss.mjs"] {
            if let Some(peer) = run_peer(script, &args.admin_url, sizes.peers_jobs).await {
                scenarios.extend(peer_scenarios(&peer, fresh, fresh_500));
            }
        }
    }
    print_table(&scenarios);
}

/// The median time of `samples` GETs of `path`, in ms.
async fn median_get_ms(client: &reqwest::Client, base: &str, path: &str, samples: usize) -> f64 {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        let r = client.get(format!("{base}{path}")).send().await.unwrap();
        assert!(r.status().is_success(), "GET {path}: {}", r.status());
        r.bytes().await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    times[samples / 2]
}

/// What a dashboard reads: the queue list, one queue, one parent.
const DASHBOARD_READS: [(&str, &str); 3] = [
    ("queue_list", "/v1/queues"),
    ("queue", "/v1/queues/dash"),
    ("parent", "/v1/parents/{parent}"),
];

/// The median of each dashboard read with a 1,000-child parent in the ledger,
/// then with a parent of `big` pending children beside it in the same queue
/// (the parent read: the big parent's). Reads come from projections, so the
/// ratios stay near 1 (target <= 2).
async fn dashboard_reads(admin_url: &str, big: usize) -> Vec<Scenario> {
    const SAMPLES: usize = 200;
    let client = reqwest::Client::new();
    let db = ScratchDb::create(admin_url, "dash").await;
    let service = Service::start(&db.url).await;
    register(&client, &service.base, "small", "dash", 1_000).await;
    let mut small = Vec::new();
    for (name, path) in DASHBOARD_READS {
        let path = path.replace("{parent}", "small");
        median_get_ms(&client, &service.base, &path, 20).await;
        small.push((name, median_get_ms(&client, &service.base, &path, SAMPLES).await));
    }
    eprintln!("dashboard reads: registering {big} pending children ...");
    register(&client, &service.base, "big", "dash", big).await;
    let mut scenarios = Vec::new();
    for ((name, path), (_, small_ms)) in DASHBOARD_READS.into_iter().zip(small) {
        let path = path.replace("{parent}", "big");
        median_get_ms(&client, &service.base, &path, 20).await;
        let big_ms = median_get_ms(&client, &service.base, &path, SAMPLES).await;
        scenarios.push(
            Scenario::new(
                &format!("dashboard.{name}"),
                &format!("ms (median, {big} pending)"),
                big_ms,
            )
            .against("ms (median, 1,000 pending)", small_ms)
            .target("<= 2.0"),
        );
    }
    service.stop().await;
    db.drop_now().await;
    scenarios
}

/// A burn-down of `n` alone, then on a fresh database again with four
/// dashboards polling beside it (each every 250 ms: the queue list, the
/// queue, the parent, the queue's parents and its failed children). Returns
/// the burn-down ratio (target >= 0.9) and the reads' latency meanwhile.
async fn dashboard_beside_burn_down(admin_url: &str, n: usize) -> Vec<Scenario> {
    let run = |tag: &'static str, dashboards: usize| async move {
        let client = reqwest::Client::new();
        let db = ScratchDb::create(admin_url, tag).await;
        let service = Service::start(&db.url).await;
        register(&client, &service.base, "burn", "dq", n).await;
        settle(&db.url).await;
        let stop = Arc::new(AtomicBool::new(false));
        let reads: Arc<Mutex<Vec<f64>>> = Arc::default();
        let pollers: Vec<_> = (0..dashboards)
            .map(|_| {
                let (client, base, stop, reads) = (client.clone(), service.base.clone(), stop.clone(), reads.clone());
                tokio::spawn(async move {
                    let paths = [
                        "/v1/queues",
                        "/v1/queues/dq",
                        "/v1/parents/burn",
                        "/v1/parents?queue=dq",
                        "/v1/children?queue=dq&state=failed",
                    ];
                    while !stop.load(Ordering::Relaxed) {
                        for path in paths {
                            let started = Instant::now();
                            let r = client.get(format!("{base}{path}")).send().await.unwrap();
                            assert!(r.status().is_success(), "GET {path}: {}", r.status());
                            r.bytes().await.unwrap();
                            reads.lock().unwrap().push(started.elapsed().as_secs_f64() * 1000.0);
                        }
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                })
            })
            .collect();
        let rate = burn_down_http(&service.base, &parent_paths("burn", WORKERS), 100, n as u64).await;
        stop.store(true, Ordering::Relaxed);
        for poller in pollers {
            poller.await.unwrap();
        }
        service.stop().await;
        db.drop_now().await;
        let mut reads = std::mem::take(&mut *reads.lock().unwrap());
        reads.sort_by(f64::total_cmp);
        (rate, reads)
    };
    eprintln!("dashboards beside a burn-down of {n} ...");
    let (alone, _) = run("dashalone", 0).await;
    let (beside, reads) = run("dashbeside", 4).await;
    let at = |q: f64| reads.get(((reads.len() as f64 * q) as usize).min(reads.len().saturating_sub(1)));
    vec![
        Scenario::new("dashboard.beside_burn_down", "children/s", beside)
            .against("the same burn-down, no dashboards", alone)
            .target(">= 0.9"),
        Scenario::new(
            "dashboard.reads_during_burn_down",
            &format!(
                "ms p50 of {} reads (p99 {:.1} ms)",
                reads.len(),
                at(0.99).copied().unwrap_or(0.0)
            ),
            at(0.5).copied().unwrap_or(0.0),
        ),
    ]
}

/// A burn-down of `n` beside `fill` terminal children of complete parents,
/// with the service keeping them, then (the same shape, a fresh database)
/// with `--retain-complete-seconds 1`, so the pruner deletes them while the
/// burn-down runs. Target: the burn-down keeps >= 0.9 of its rate.
async fn pruning_beside_burn_down(admin_url: &str, n: usize, fill: i64) -> Vec<Scenario> {
    let run = |tag: &'static str, retain: bool| async move {
        let client = reqwest::Client::new();
        let db = ScratchDb::create(admin_url, tag).await;
        let setup = Service::start(&db.url).await;
        fill_terminal(&db.url, fill).await;
        register(&client, &setup.base, "burn", "pq", n).await;
        setup.stop().await;
        settle(&db.url).await;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        let count = "SELECT count(*) FROM parent WHERE queue = 'done'";
        let before: i64 = sqlx::query_scalar(count).fetch_one(&mut conn).await.unwrap();
        let flags: &[&str] = if retain {
            &["--retain-complete-seconds", "1"]
        } else {
            &[]
        };
        let service = Service::start_with(&db.url, flags).await;
        let rate = burn_down_http(&service.base, &parent_paths("burn", WORKERS), 100, n as u64).await;
        let after: i64 = sqlx::query_scalar(count).fetch_one(&mut conn).await.unwrap();
        service.stop().await;
        drop(conn);
        db.drop_now().await;
        (rate, before - after)
    };
    eprintln!("pruning {fill} terminal children beside a burn-down of {n} ...");
    let (alone, _) = run("prunealone", false).await;
    let (beside, pruned) = run("prunebeside", true).await;
    vec![
        Scenario::new("retention.beside_burn_down", "children/s", beside)
            .against("the same burn-down, nothing pruned", alone)
            .target(">= 0.9"),
        Scenario::new(
            "retention.pruned_meanwhile",
            "complete parents of 10,000 children deleted during the burn-down",
            pruned as f64,
        ),
    ]
}

#[tokio::main]
async fn main() {
    let args = parse_args();
    let sizes = Sizes::new(args.quick);
    let run_started = Instant::now();
    let mut scenarios = Vec::new();
    let mut peak_rss: f64 = 0.0;
    eprintln!(
        "child-ledger bench ({}), Postgres admin {}",
        if args.quick { "quick" } else { "full" },
        args.admin_url
    );

    if args.fresh_only {
        return fresh_against_peers(&args, &sizes).await;
    }
    if args.pooler_only {
        return print_table(&through_pgbouncer(&args.admin_url, &sizes).await);
    }
    if args.cost_only {
        return print_table(&cost_scenarios(&args, &sizes).await);
    }
    if args.search_only {
        return print_table(&search::search_scenarios(&args.admin_url, sizes.search).await);
    }
    if args.events_only {
        return print_table(&events::events_scenarios(&args.admin_url, sizes.burn).await);
    }
    if args.admission_only {
        return print_table(&admission::admission_scenarios(&args.admin_url, sizes.burn, sizes.admission_claims).await);
    }
    if args.verdicts_only {
        return print_table(&verdicts::verdicts_scenarios(&args.admin_url, sizes.results, sizes.burn).await);
    }
    if args.scale_only {
        let mut scenarios = claim_latency_scale(&args.admin_url, sizes.scale_rows, None).await.0;
        if let Some(bin) = args.baseline_bin.as_deref() {
            scenarios.extend(
                claim_latency_scale(&args.admin_url, sizes.scale_rows, Some(bin))
                    .await
                    .0,
            );
        }
        return print_table(&scenarios);
    }
    if args.dashboard_only {
        let mut scenarios = dashboard_reads(&args.admin_url, sizes.huge_parent).await;
        scenarios.extend(dashboard_beside_burn_down(&args.admin_url, sizes.burn).await);
        scenarios.extend(pruning_beside_burn_down(&args.admin_url, sizes.burn, sizes.scale_rows).await);
        return print_table(&scenarios);
    }

    // --- Postgres: registration, burn-downs, hot parent ---------------------
    let db = ScratchDb::create(&args.admin_url, "pg").await;
    let service = Service::start(&db.url).await;
    let store = Store::connect(&db.url).await.unwrap();
    let base = service.base.clone();
    let client = reqwest::Client::new();

    let register_name = format!("register_{}k", sizes.register / 1000);
    eprintln!("{register_name} ...");
    let ours = register_rate(&base, "reg", sizes.register, 3).await;
    let mut copy: f64 = 0.0;
    for run in 0..3 {
        copy = copy.max(copy_baseline(&db.url, &format!("copy-{run}"), sizes.register).await);
    }
    scenarios.push(
        Scenario::new(&register_name, "children/s", ours)
            .against("copy", copy)
            .target(">= 0.5"),
    );

    eprintln!("burn_down one parent, {} children ...", sizes.burn);
    register(&client, &base, "burn-http", "burn", sizes.burn).await;
    register(&client, &base, "burn-inproc", "burn", sizes.burn).await;
    // The first burn-down on a fresh database grows the heap and the lease
    // indexes (relation extension under 8 writers); later ones reuse vacuumed
    // space, as a long-running ledger does. Measure it, then compare warm runs.
    register(&client, &base, "burn-cold", "burn", sizes.burn).await;
    settle(&db.url).await;
    let cold = burn_down_http(&base, &parent_paths("burn-cold", WORKERS), 100, sizes.burn as u64).await;
    settle(&db.url).await;
    let http = burn_down_http(&base, &parent_paths("burn-http", WORKERS), 100, sizes.burn as u64).await;
    settle(&db.url).await;
    let inproc = burn_down_inprocess(&store, &parent_scopes("burn-inproc", WORKERS), 100, sizes.burn as u64).await;
    scenarios.push(
        Scenario::new("burn_down_http", "children/s", http)
            .against("burn_down_inprocess", inproc)
            .target(">= 0.7"),
    );
    scenarios.push(Scenario::new("burn_down_inprocess", "children/s", inproc));
    scenarios.push(Scenario::new("burn_down_http.cold_database", "children/s", cold).against("burn_down_http", http));

    eprintln!("burn_down through a queue of {} parents ...", sizes.queue_parents);
    let per_parent = sizes.burn / sizes.queue_parents;
    for (queue, tag) in [("qhttp", "qh"), ("qinproc", "qi")] {
        for p in 0..sizes.queue_parents {
            register(&client, &base, &format!("{tag}-{p}"), queue, per_parent).await;
        }
    }
    let total = (per_parent * sizes.queue_parents) as u64;
    settle(&db.url).await;
    let http_q = burn_down_http(&base, &vec!["/v1/queues/qhttp/claims".to_owned(); WORKERS], 100, total).await;
    let scopes = vec![ClaimScope::Queue(QueueName::parse("qinproc").unwrap()); WORKERS];
    settle(&db.url).await;
    let inproc_q = burn_down_inprocess(&store, &scopes, 100, total).await;
    scenarios.push(
        Scenario::new("burn_down_http.queue_parents", "children/s", http_q)
            .against("burn_down_inprocess.queue", inproc_q)
            .target(">= 0.7"),
    );

    for (limit, n) in [(1usize, sizes.burn / 20), (10, sizes.burn / 4), (1000, sizes.burn)] {
        eprintln!("burn_down claim size {limit}, {n} children ...");
        let parent = format!("size-{limit}");
        register(&client, &base, &parent, "sizes", n).await;
        let inproc_parent = format!("size-{limit}-inproc");
        register(&client, &base, &inproc_parent, "sizes", n).await;
        settle(&db.url).await;
        let rate = burn_down_http(&base, &parent_paths(&parent, WORKERS), limit, n as u64).await;
        let parent = inproc_parent;
        settle(&db.url).await;
        let base_rate = burn_down_inprocess(&store, &parent_scopes(&parent, WORKERS), limit as i64, n as u64).await;
        scenarios.push(
            Scenario::new(&format!("burn_down_http.claim_{limit}"), "children/s", rate)
                .against(&format!("burn_down_inprocess.claim_{limit}"), base_rate),
        );
    }

    eprintln!("hot_parent ...");
    let hot_n = sizes.burn / 2;
    register(&client, &base, "hot", "hot", hot_n).await;
    let mut spread_paths = Vec::new();
    for w in 0..WORKERS {
        register(&client, &base, &format!("spread-{w}"), "spread", hot_n / WORKERS).await;
        spread_paths.push(format!("/v1/parents/spread-{w}/claims"));
    }
    settle(&db.url).await;
    let hot = burn_down_http(&base, &parent_paths("hot", WORKERS), 100, hot_n as u64).await;
    settle(&db.url).await;
    let spread = burn_down_http(&base, &spread_paths, 100, (hot_n / WORKERS * WORKERS) as u64).await;
    scenarios.push(
        Scenario::new("hot_parent", "children/s", hot)
            .against("8 workers on 8 parents", spread)
            .target(">= 0.8"),
    );

    eprintln!("burn_down beside a hostile client ...");
    register(&client, &base, "calm", "calm", sizes.burn).await;
    register(&client, &base, "beset", "beset", sizes.burn).await;
    settle(&db.url).await;
    let calm = burn_down_http(&base, &parent_paths("calm", WORKERS), 100, sizes.burn as u64).await;
    settle(&db.url).await;
    // A service of its own, so the memory the floods take is reported apart
    // from the honest workload's.
    let beset_service = Service::start(&db.url).await;
    let hostile = Hostile::start(&beset_service.base);
    // Let the sockets, the long polls and the first flood arrive first.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let beset = burn_down_http(
        &beset_service.base,
        &parent_paths("beset", WORKERS),
        100,
        sizes.burn as u64,
    )
    .await;
    let floods = hostile.stop().await;
    let beset_rss = beset_service.stop().await;
    scenarios.push(
        Scenario::new("burn_down_http.beside_hostile_client", "children/s", beset)
            .against("burn_down_http, calm", calm)
            .target(">= 0.5"),
    );
    scenarios.push(Scenario::new(
        "burn_down_http.beside_hostile_client.floods_refused",
        "60 MB registrations",
        floods as f64,
    ));
    scenarios.push(Scenario::new("memory.beside_hostile_client", "MiB", beset_rss).target("<= 500 MiB"));

    peak_rss = peak_rss.max(service.stop().await);
    drop(store);
    db.drop_now().await;

    scenarios.extend(through_pgbouncer(&args.admin_url, &sizes).await);
    scenarios.extend(cost_scenarios(&args, &sizes).await);
    scenarios.extend(search::search_scenarios(&args.admin_url, sizes.search).await);
    scenarios.extend(events::events_scenarios(&args.admin_url, sizes.burn).await);
    scenarios.extend(admission::admission_scenarios(&args.admin_url, sizes.burn, sizes.admission_claims).await);
    scenarios.extend(verdicts::verdicts_scenarios(&args.admin_url, sizes.results, sizes.burn).await);

    // --- Postgres: claim latency at 10k rows and at scale --------------------
    let (scale, rss) = claim_latency_scale(&args.admin_url, sizes.scale_rows, None).await;
    scenarios.extend(scale);
    peak_rss = peak_rss.max(rss);

    // --- Postgres: a fresh database drained once, as the peers are ----------
    // The peers each drain a new database once, after enqueueing and the same
    // settle step; this is child-ledger's side of that comparison: a new
    // database holding only the parent to drain, settled, drained once.
    eprintln!("burn_down on a fresh database, {} children ...", sizes.fresh);
    let (fresh, rss) = fresh_drain(&args.admin_url, sizes.fresh, 100).await;
    peak_rss = peak_rss.max(rss);
    scenarios.push(Scenario::new("burn_down_http.fresh_database", "children/s", fresh).against("burn_down_http", http));
    let (fresh_500, rss) = fresh_drain(&args.admin_url, sizes.fresh, 500).await;
    peak_rss = peak_rss.max(rss);
    scenarios.push(
        Scenario::new("burn_down_http.fresh_database.claims_of_500", "children/s", fresh_500)
            .against("burn_down_http.fresh_database", fresh),
    );

    // --- Postgres: big and small parents mixed on one queue ------------------
    // Fresh databases, no VACUUM between registration and drain (autovacuum is
    // off on every machine here): the queue claim must not slow down as the
    // parents it serves leave dead index entries behind.
    let big = sizes.big_parent;
    eprintln!("burn_down_http.big_parents: 1 x {big}, then 4 x {big} on one queue ...");
    let (one_big, rss) = fresh_queue_burn(&args.admin_url, "onebig", 1, big).await;
    peak_rss = peak_rss.max(rss);
    let (four_big, rss) = fresh_queue_burn(&args.admin_url, "fourbig", 4, big).await;
    peak_rss = peak_rss.max(rss);
    scenarios.push(
        Scenario::new("burn_down_http.big_parents", "children/s", four_big)
            .against(&format!("one parent of {big}"), one_big)
            .target(">= 0.8"),
    );

    // A 10-child parent registered behind a huge one, under a running load.
    let huge = sizes.huge_parent;
    eprintln!("fairness: 10 children behind {huge} ...");
    let db = ScratchDb::create(&args.admin_url, "fair").await;
    let service = Service::start(&db.url).await;
    register(&client, &service.base, "huge", "fair", huge).await;
    let load = QueueLoad::start(&service.base, "fair");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let registering_at = Instant::now();
    register(&client, &service.base, "small", "fair", 10).await;
    let registered_at = Instant::now();
    let (first, first_at, _, _) = load.until_claimed("small", 1).await;
    // Claims sent once the small parent was registered that passed it by.
    let passed = load.sent_since_before(registered_at, first);
    let big_left = huge - load.children();
    load.stop().await;
    scenarios.push(
        Scenario::new(
            "fairness",
            "claims sent after it that passed the small parent by",
            passed as f64,
        )
        .against(
            "claims the huge parent still needed (first come, first served)",
            (big_left / 100) as f64,
        )
        .target(&format!("<= {} claims", 2 * WORKERS)),
    );
    scenarios.push(Scenario::new(
        "fairness.ms",
        "ms from its registration to its first claim",
        first_at.saturating_duration_since(registering_at).as_secs_f64() * 1000.0,
    ));
    peak_rss = peak_rss.max(service.stop().await);
    db.drop_now().await;

    // An urgent parent registered at a higher priority under a running load.
    let urgent = 2_000;
    eprintln!("priority: {urgent} urgent children over 4 x {} ...", big / 2);
    let db = ScratchDb::create(&args.admin_url, "prio").await;
    let service = Service::start(&db.url).await;
    for p in 0..4 {
        register(&client, &service.base, &format!("normal-{p}"), "prio", big / 2).await;
    }
    let load = QueueLoad::start(&service.base, "prio");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (steady_from, steady_children) = (Instant::now(), load.children());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let steady_rate = (load.children() - steady_children) as f64 / steady_from.elapsed().as_secs_f64();
    register_at(&client, &service.base, "urgent", "prio", urgent, 10).await;
    let registered_at = Instant::now();
    let (first, _, last, last_at) = load.until_claimed("urgent", urgent).await;
    let lower_during = load.others_between("urgent", first, last);
    load.stop().await;
    let took_ms = last_at.saturating_duration_since(registered_at).as_secs_f64() * 1000.0;
    scenarios.push(
        Scenario::new("priority", "ms until every urgent child is claimed", took_ms)
            .against(
                "ms the whole queue takes for as many",
                urgent as f64 / steady_rate * 1000.0,
            )
            .target("<= 1.5"),
    );
    scenarios.push(Scenario::new(
        "priority.lower_claimed",
        "lower-priority children claimed meanwhile",
        lower_during as f64,
    ));
    peak_rss = peak_rss.max(service.stop().await);
    db.drop_now().await;

    // --- Dashboards: reads that do not grow with the ledger ---------------------
    scenarios.extend(dashboard_reads(&args.admin_url, huge).await);
    scenarios.extend(dashboard_beside_burn_down(&args.admin_url, sizes.burn).await);
    scenarios.extend(pruning_beside_burn_down(&args.admin_url, sizes.burn, sizes.scale_rows).await);

    // --- Peers on the same Postgres -------------------------------------------
    if args.peers {
        for script in ["graphile.mjs", "pgboss.mjs"] {
            eprintln!("peer {script}, {} jobs ...", sizes.peers_jobs);
            if let Some(peer) = run_peer(script, &args.admin_url, sizes.peers_jobs).await {
                eprintln!("{} {}: {}", peer.peer, peer.version, peer.settings);
                // Both sides are the one drain of a fresh database after the
                // same settle (VACUUM ANALYZE, CHECKPOINT).
                scenarios.extend(peer_scenarios(&peer, fresh, fresh_500));
            }
        }
    }

    // --- SQLite ----------------------------------------------------------------
    eprintln!("sqlite ...");
    let dir = std::env::temp_dir().join(format!("child-ledger-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let service = Service::start(&format!("sqlite://{}", dir.join("bench.db").display())).await;
    let sqlite_register = register_rate(&service.base, "reg", sizes.register, 3).await;
    scenarios.push(
        Scenario::new(&format!("sqlite.{register_name}"), "children/s", sqlite_register)
            .against(&format!("{register_name} (Postgres)"), ours),
    );
    register(&client, &service.base, "burn", "burn", sizes.burn).await;
    settle_sqlite(&dir.join("bench.db")).await;
    let sqlite_burn = burn_down_http(&service.base, &parent_paths("burn", WORKERS), 100, sizes.burn as u64).await;
    // Both a first drain of a fresh database after a settle step.
    scenarios.push(
        Scenario::new("sqlite.burn_down_http", "children/s", sqlite_burn)
            .against("burn_down_http.fresh_database (Postgres)", fresh),
    );
    let sqlite_rss = service.stop().await;
    let _ = std::fs::remove_dir_all(&dir);

    scenarios.push(Scenario::new("memory", "MiB", peak_rss.max(sqlite_rss)).target("<= 150 MiB"));
    scenarios.push(Scenario::new("memory.postgres_service", "MiB", peak_rss));
    scenarios.push(Scenario::new("memory.sqlite_service", "MiB", sqlite_rss));

    print_table(&scenarios);
    println!("\nwhole run: {:.0} s", run_started.elapsed().as_secs_f64());
    if let Some(path) = args.json {
        std::fs::write(
            &path,
            serde_json::to_vec_pretty(&json!({ "scenarios": scenarios })).unwrap(),
        )
        .unwrap();
        eprintln!("wrote {}", path.display());
    }
}
