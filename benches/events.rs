//! `events.*` and `otel.*` (`--events-only`, and the full run): watching it live.
//!
//! - `events.latency`: 1,000 event streams on one replica (9 on each of 100
//!   parents, 100 on their queue) during a burn-down of the queue by 8 HTTP
//!   workers: for each outcome post and each stream that shows it, the time
//!   from the post's answer (its commit is before it) to the first `progress`
//!   or `completed` event whose counts include it. Target p99 <= 500 ms.
//! - `events.beside_burn_down`: that burn-down's rate against the same one
//!   with no streams, run before and after it (fresh databases all; the
//!   baseline is their mean). Target >= 0.9.
//! - `otel.on`: a burn-down of parents registered with a `traceparent`, with
//!   the service exporting OTLP/HTTP to a local receiver, against the same
//!   burn-down with the variables unset, before and after. Target >= 0.95.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;

use super::{ClaimReply, OutcomeItem, Scenario, ScratchDb, Service, WORKERS, registration_body, settle};

const PARENTS: usize = 100;
const PER_PARENT: usize = 9;
const ON_QUEUE: usize = 100;
const QUEUE: &str = "live";

/// What the bench's workers committed: per parent (and for the queue, under
/// `QUEUE`), when each outcome post was answered and how many of that
/// subject's children the bench had finished by then.
#[derive(Default)]
struct Commits {
    by_subject: HashMap<String, Vec<(Instant, i64)>>,
    done: HashMap<String, i64>,
}

impl Commits {
    fn record(&mut self, at: Instant, parents: &HashMap<String, i64>) {
        for (subject, n) in parents
            .iter()
            .map(|(p, n)| (p.as_str(), *n))
            .chain([(QUEUE, parents.values().sum())])
        {
            let done = self.done.entry(subject.to_owned()).or_default();
            *done += n;
            let done = *done;
            self.by_subject.entry(subject.to_owned()).or_default().push((at, done));
        }
    }
}

/// One subscriber's events: when each arrived and the finished count it showed.
type Seen = Arc<Mutex<Vec<(Instant, i64)>>>;

/// What a subscriber reads of an event's data: a Parent's `counts`, a
/// Queue's `children` (the rest is skipped unread, as a lean subscriber
/// would: the subscribers share the bench's two cores with the burn-down).
#[derive(serde::Deserialize)]
struct Shown {
    counts: Option<Tally>,
    children: Option<Tally>,
}

#[derive(serde::Deserialize)]
struct Tally {
    #[serde(default)]
    processed: i64,
    #[serde(default)]
    failed: i64,
    #[serde(default)]
    skipped: i64,
}

/// The terminal count an event's data shows.
fn finished(data: &str) -> Option<i64> {
    let shown: Shown = serde_json::from_str(data).ok()?;
    let tally = shown.counts.or(shown.children)?;
    Some(tally.processed + tally.failed + tally.skipped)
}

/// Reads the stream at `url` until `stop`, keeping every progress-like event.
async fn subscribe(client: reqwest::Client, url: String, seen: Seen, opened: Arc<AtomicU64>) {
    let response = client
        .get(&url)
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "GET {url}: {}", response.status());
    opened.fetch_add(1, Ordering::Relaxed);
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut kind = String::new();
    while let Some(Ok(chunk)) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find('\n') {
            let line: String = buffer.drain(..=end).collect();
            let line = line.trim_end();
            if let Some(name) = line.strip_prefix("event: ") {
                kind = name.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ")
                && matches!(kind.as_str(), "snapshot" | "progress" | "completed")
                && let Some(n) = finished(data)
            {
                seen.lock().unwrap().push((Instant::now(), n));
            }
        }
    }
}

/// Claims from the queue and posts outcomes in batches of 100, recording each
/// post's answer in `commits`.
async fn timed_worker(client: reqwest::Client, base: String, commits: Arc<Mutex<Commits>>) -> u64 {
    let claim_url = format!("{base}/v1/queues/{QUEUE}/claims");
    let outcomes_url = format!("{base}/v1/outcomes");
    let claim_body = serde_json::to_vec(&json!({"limit": 100, "lease_seconds": 600})).unwrap();
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
        let items: Vec<_> = claim
            .children
            .iter()
            .map(|c| OutcomeItem {
                parent_id: &c.parent_id,
                sequence: c.sequence,
                outcome: "processed",
                claim_id: claim.claim_id,
            })
            .collect();
        let r = client
            .post(&outcomes_url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&json!({ "outcomes": items })).unwrap())
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "outcomes: {}", r.status());
        r.bytes().await.unwrap();
        let at = Instant::now();
        let mut parents: HashMap<String, i64> = HashMap::new();
        for c in &claim.children {
            *parents.entry(c.parent_id.clone()).or_default() += 1;
        }
        commits.lock().unwrap().record(at, &parents);
        done += claim.children.len() as u64;
    }
}

/// Registers `n` children over `PARENTS` parents of `QUEUE`, each with
/// `traceparent` when given.
async fn register_parents(client: &reqwest::Client, base: &str, n: usize, traceparent: Option<&str>) {
    for p in 0..PARENTS {
        let mut put = client
            .put(format!("{base}/v1/parents/live-{p}"))
            .header("content-type", "application/json")
            .body(registration_body(n / PARENTS, QUEUE, true, 0));
        if let Some(t) = traceparent {
            put = put.header("traceparent", t);
        }
        let status = put.send().await.unwrap().status();
        assert!(status.is_success(), "register live-{p}: {status}");
    }
}

/// The latencies: for each post and each subscriber of its subject, from the
/// post's answer to the first event showing at least what was done by then.
fn latencies(commits: &Commits, subscribers: &[(String, Seen)]) -> Vec<f64> {
    let mut out = Vec::new();
    for (subject, seen) in subscribers {
        let seen = seen.lock().unwrap();
        for &(at, done) in commits.by_subject.get(subject).into_iter().flatten() {
            let first = seen.iter().find(|&&(_, n)| n >= done);
            let ms = match first {
                Some(&(when, _)) => when.saturating_duration_since(at).as_secs_f64() * 1000.0,
                None => f64::INFINITY, // never shown: counts against the target
            };
            out.push(ms);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

/// A burn-down of `n` children over `PARENTS` parents on a fresh database,
/// with `streams` subscribers; its rate, and the latencies when streamed.
async fn burn_with_streams(admin_url: &str, tag: &str, n: usize, streams: bool) -> (f64, Vec<f64>) {
    let db = ScratchDb::create(admin_url, tag).await;
    let service = Service::start(&db.url).await;
    let client = reqwest::Client::new();
    register_parents(&client, &service.base, n, None).await;
    settle(&db.url).await;
    let watchers = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    let opened = Arc::new(AtomicU64::new(0));
    let mut subscribers: Vec<(String, Seen)> = Vec::new();
    let mut tasks = Vec::new();
    if streams {
        let paths = (0..PARENTS)
            .flat_map(|p| std::iter::repeat_n(format!("live-{p}"), PER_PARENT))
            .chain(std::iter::repeat_n(QUEUE.to_owned(), ON_QUEUE));
        for subject in paths {
            let url = if subject == QUEUE {
                format!("{}/v1/queues/{QUEUE}/events", service.base)
            } else {
                format!("{}/v1/parents/{subject}/events", service.base)
            };
            let seen: Seen = Arc::default();
            subscribers.push((subject, seen.clone()));
            tasks.push(tokio::spawn(subscribe(watchers.clone(), url, seen, opened.clone())));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while (opened.load(Ordering::Relaxed) as usize) < subscribers.len() {
            assert!(Instant::now() < deadline, "the streams did not all open");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Every stream has had its snapshot before the burn-down starts.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let commits = Arc::new(Mutex::new(Commits::default()));
    let workers = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let started = Instant::now();
    let running: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(timed_worker(workers.clone(), service.base.clone(), commits.clone())))
        .collect();
    let mut done = 0;
    for w in running {
        done += w.await.unwrap();
    }
    let rate = done as f64 / started.elapsed().as_secs_f64();
    assert_eq!(done as usize, n / PARENTS * PARENTS);
    // The last events: at most a tick and a throttle after the last commit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for task in &tasks {
        task.abort();
    }
    let latencies = latencies(&commits.lock().unwrap(), &subscribers);
    service.stop().await;
    db.drop_now().await;
    (rate, latencies)
}

/// An OTLP/HTTP receiver on a free port that takes every export and drops it.
async fn otlp_receiver() -> (String, Arc<AtomicU64>) {
    let received = Arc::new(AtomicU64::new(0));
    let counted = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(body.len() as u64, Ordering::Relaxed);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), received)
}

/// A burn-down of `n` children registered in a producer's trace, with the
/// service exporting to `endpoint` or not; children/s.
async fn burn_traced(admin_url: &str, tag: &str, n: usize, endpoint: Option<&str>) -> f64 {
    let db = ScratchDb::create(admin_url, tag).await;
    let env: Vec<(&str, &str)> = endpoint
        .map(|e| {
            vec![
                ("OTEL_EXPORTER_OTLP_ENDPOINT", e),
                ("OTEL_SERVICE_NAME", "ledger-bench"),
            ]
        })
        .unwrap_or_default();
    let service = Service::start_env(&db.url, &[], &env).await;
    let client = reqwest::Client::new();
    register_parents(
        &client,
        &service.base,
        n,
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    )
    .await;
    settle(&db.url).await;
    let commits = Arc::new(Mutex::new(Commits::default()));
    let workers = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let started = Instant::now();
    let running: Vec<_> = (0..WORKERS)
        .map(|_| tokio::spawn(timed_worker(workers.clone(), service.base.clone(), commits.clone())))
        .collect();
    let mut done = 0;
    for w in running {
        done += w.await.unwrap();
    }
    let rate = done as f64 / started.elapsed().as_secs_f64();
    service.stop().await;
    db.drop_now().await;
    rate
}

pub(super) async fn events_scenarios(admin_url: &str, n: usize) -> Vec<Scenario> {
    eprintln!("events: a burn-down of {n} over {PARENTS} parents, alone and beside 1000 streams ...");
    // Alone, beside the streams, alone again: the baseline is the mean of
    // the two runs alone (a burn-down's rate drifts within a run).
    let (alone, _) = burn_with_streams(admin_url, "evalone", n, false).await;
    let (beside, latencies) = burn_with_streams(admin_url, "evbeside", n, true).await;
    let (again, _) = burn_with_streams(admin_url, "evagain", n, false).await;
    eprintln!("events: alone {alone:.0}, beside {beside:.0}, alone again {again:.0} children/s");
    let alone = (alone + again) / 2.0;
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    let p99 = at(0.99);
    eprintln!(
        "events.latency: {} samples, p50 {:.1} ms, p90 {:.1} ms, p99 {p99:.1} ms, max {:.1} ms",
        latencies.len(),
        at(0.5),
        at(0.9),
        latencies.last().copied().unwrap_or(f64::NAN)
    );

    eprintln!("otel: a traced burn-down of {n}, export off and on ...");
    let (endpoint, received) = otlp_receiver().await;
    let off = burn_traced(admin_url, "oteloff", n, None).await;
    let on = burn_traced(admin_url, "otelon", n, Some(&endpoint)).await;
    let off_again = burn_traced(admin_url, "oteloff2", n, None).await;
    eprintln!("otel: off {off:.0}, on {on:.0}, off again {off_again:.0} children/s");
    let off = (off + off_again) / 2.0;
    eprintln!(
        "otel.on: the receiver took {:.1} MB of spans",
        received.load(Ordering::Relaxed) as f64 / 1e6
    );
    vec![
        Scenario::new(
            "events.latency",
            &format!("ms p99 of {} (p50 {:.1})", latencies.len(), at(0.5)),
            p99,
        )
        .target("<= 500 ms"),
        Scenario::new("events.beside_burn_down", "children/s", beside)
            .against("the same burn-down, no streams", alone)
            .target(">= 0.9"),
        Scenario::new("otel.on", "children/s", on)
            .against("the same burn-down, no export", off)
            .target(">= 0.95"),
    ]
}
