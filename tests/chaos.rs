//! Chaos: service replicas on one database (two on Postgres, one on SQLite),
//! workers that crash mid-chunk (abandoning their leases), retry outcome posts
//! and race conflicting outcomes, and a replica SIGKILLed and restarted while
//! the queue drains. At the end every child is terminal exactly once, nothing
//! is lost, every acknowledged outcome is durable, the projection equals the
//! ledger (the reconcile sweep's dry run finds no drift), every parent is
//! complete, and no replica answered 5xx while it was up. Every parent's
//! completion webhook reaches a receiver in this process: one event per
//! parent, none lost across the kill.
//!
//! Size and randomness come from the environment: `CHAOS_PARENTS` (8),
//! `CHAOS_CHILDREN` per parent (150), `CHAOS_WORKERS` (8), `CHAOS_KILLS` (1),
//! `CHAOS_WORK_MS` (most simulated work per child, 2), `CHAOS_TIMEOUT_SECS`
//! and `CHAOS_SEED` (printed with the figures, so a run can be repeated).
//! `cargo test --test chaos -- --nocapture` shows the figures.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const QUEUE: &str = "chaos";
/// Short, so abandoned chunks come back quickly.
const LEASE_SECONDS: u64 = 2;
/// Percent chances per claimed chunk.
const CRASH_PERCENT: u64 = 8;
const RETRY_PERCENT: u64 = 15;
const RACE_PERCENT: u64 = 5;
/// One child in this many is skipped at registration; one in this many of the
/// rest is failed by the workers.
const SKIP_ONE_IN: u64 = 40;
const FAIL_ONE_IN: u64 = 10;

type ChildId = (String, i64);

/// The completion webhooks the replicas sent: `(parent, webhook-id)` per request.
type Webhooks = Arc<Mutex<Vec<(String, String)>>>;

/// A webhook receiver on a free port that answers 200 to `POST /hook/{parent}`.
async fn webhook_receiver() -> (u16, Webhooks, tokio::task::JoinHandle<()>) {
    async fn hook(
        axum::extract::State(seen): axum::extract::State<Webhooks>,
        axum::extract::Path(parent): axum::extract::Path<String>,
        headers: axum::http::HeaderMap,
    ) -> axum::http::StatusCode {
        let id = headers
            .get("webhook-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        seen.lock().unwrap().push((parent, id));
        axum::http::StatusCode::OK
    }
    let seen: Webhooks = Arc::default();
    let router = axum::Router::new()
        .route("/hook/{parent}", axum::routing::post(hook))
        .with_state(Arc::clone(&seen));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (port, seen, server)
}

/// xorshift64*: small, seeded, good enough to pick chaos.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(splitmix(seed) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn splitmix(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn parent_name(p: u64) -> String {
    format!("chaos-{p:04}")
}

/// A child's fixed fate, so that any two workers holding it post the same verdict.
fn skipped_at_registration(seed: u64, p: u64, i: u64) -> bool {
    splitmix(seed ^ (p << 32) ^ i ^ 0x5bd1_e995).is_multiple_of(SKIP_ONE_IN)
}

fn verdict(seed: u64, child: &ChildId) -> (&'static str, Option<String>) {
    let p: u64 = child.0.trim_start_matches("chaos-").parse().unwrap_or(0);
    if splitmix(seed ^ (p << 32) ^ child.1 as u64).is_multiple_of(FAIL_ONE_IN) {
        ("failed", Some("chaos: the remote side rejected it".to_owned()))
    } else {
        ("processed", None)
    }
}

/// The other verdict, for a conflicting post.
fn opposite(outcome: &str) -> (&'static str, Option<String>) {
    if outcome == "processed" {
        ("failed", Some("chaos: a conflicting verdict".to_owned()))
    } else {
        ("processed", None)
    }
}

struct Replica {
    name: &'static str,
    base: String,
    /// Set from just before a SIGKILL until the restarted process is ready.
    down: AtomicBool,
    /// Requests it answered, and how many of those by the time it was last restarted.
    answered: AtomicU64,
    answered_at_restart: AtomicU64,
}

#[derive(Default)]
struct Counters {
    claims: AtomicU64,
    claimed_children: AtomicU64,
    reissued_expired: AtomicU64,
    crashes: AtomicU64,
    abandoned: AtomicU64,
    outcome_posts: AtomicU64,
    resent_posts: AtomicU64,
    retry_posts: AtomicU64,
    retry_items: AtomicU64,
    retry_duplicate: AtomicU64,
    retry_conflict: AtomicU64,
    race_posts: AtomicU64,
    race_won_by_conflicting: AtomicU64,
    race_won_by_original: AtomicU64,
    race_won_elsewhere: AtomicU64,
    conflict_answers: AtomicU64,
    late_answers: AtomicU64,
    conn_errors_down: AtomicU64,
    conn_errors_up: AtomicU64,
    server_errors_down: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// An outcome a worker was told it applied.
#[derive(Clone, Debug)]
struct Ack {
    outcome: &'static str,
    reason: Option<String>,
    result: Value,
}

#[derive(Default)]
struct Book {
    /// Every `applied` answer, per child.
    acks: HashMap<ChildId, Vec<Ack>>,
    /// Every outcome posted, per child.
    posted: HashMap<ChildId, HashSet<&'static str>>,
    /// Children in a post whose answer was lost (connection error or 5xx) and which was sent again.
    lost: HashSet<ChildId>,
    /// Children abandoned by a crashed worker.
    crashed: HashSet<ChildId>,
    /// Children seen handed out with `previous_attempt: "expired"`.
    reissued: HashSet<ChildId>,
    /// The highest attempt each child was handed out with, and every (child, attempt) handed out.
    attempts_seen: HashMap<ChildId, i64>,
    handed_out: HashSet<(ChildId, i64)>,
    /// Children answered `duplicate` or `conflict` on a first, unraced post:
    /// another worker finished them after this worker's lease ran out.
    late: HashSet<ChildId>,
    /// 5xx answers from a replica that was up, and other impossible answers.
    server_errors: Vec<String>,
    anomalies: Vec<String>,
    /// Connection errors to a replica that was up (not failures by themselves).
    conn_error_notes: Vec<String>,
}

struct Shared {
    seed: u64,
    replicas: Vec<Replica>,
    counters: Counters,
    book: Mutex<Book>,
    stop: AtomicBool,
    deadline: Instant,
}

impl Shared {
    fn anomaly(&self, text: String) {
        let mut book = self.book.lock().unwrap();
        if book.anomalies.len() < 200 {
            book.anomalies.push(text);
        }
    }
}

/// One item of an outcome batch.
#[derive(Clone)]
struct Item {
    child: ChildId,
    outcome: &'static str,
    reason: Option<String>,
    result: Value,
    claim_id: String,
}

impl Item {
    fn batch_json(&self) -> Value {
        json!({"parent_id": self.child.0, "sequence": self.child.1, "outcome": self.outcome,
               "reason": self.reason, "result": self.result, "claim_id": self.claim_id})
    }

    fn ack(&self) -> Ack {
        Ack {
            outcome: self.outcome,
            reason: self.reason.clone(),
            result: self.result.clone(),
        }
    }
}

/// An answered request: its status, its body, and whether an earlier send of
/// it was lost (so it may already have taken effect).
struct Answered {
    status: StatusCode,
    body: Value,
    resent: bool,
}

struct Worker {
    id: usize,
    generation: u64,
    /// Chunks this worker (all its generations) has received.
    chunks: u64,
    rng: Rng,
    client: reqwest::Client,
    next: usize,
    avoid_until: Vec<Instant>,
    shared: Arc<Shared>,
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

impl Worker {
    fn name(&self) -> String {
        format!("w{}.{}", self.id, self.generation)
    }

    /// The next replica in turn, skipping one that just failed when another is there.
    fn pick(&mut self) -> usize {
        let n = self.shared.replicas.len();
        let now = Instant::now();
        for k in 0..n {
            let r = (self.next + k) % n;
            if self.avoid_until[r] <= now {
                self.next = r + 1;
                return r;
            }
        }
        let r = self.next % n;
        self.next = r + 1;
        r
    }

    /// Sends once: `None` when the answer was lost (connection error or 5xx).
    async fn send_once(&mut self, r: usize, path: &str, body: &Value) -> Option<(StatusCode, Value)> {
        let shared = self.shared.clone();
        let replica = &shared.replicas[r];
        let down_before = replica.down.load(Ordering::SeqCst);
        let sent = self
            .client
            .post(format!("{}{path}", replica.base))
            .json(body)
            .send()
            .await;
        let reply = match sent {
            Ok(resp) => {
                let status = resp.status();
                resp.bytes().await.map(|bytes| (status, bytes))
            }
            Err(e) => Err(e),
        };
        let down = down_before || replica.down.load(Ordering::SeqCst);
        match reply {
            Ok((status, bytes)) => {
                let body = serde_json::from_slice(&bytes)
                    .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
                if status.is_server_error() {
                    if down {
                        bump(&shared.counters.server_errors_down);
                    } else {
                        let mut book = shared.book.lock().unwrap();
                        book.server_errors
                            .push(format!("{} POST {path} -> {status}: {body}", replica.name));
                    }
                    self.avoid_until[r] = Instant::now() + Duration::from_millis(300);
                    return None;
                }
                replica.answered.fetch_add(1, Ordering::Relaxed);
                Some((status, body))
            }
            Err(e) => {
                if e.is_timeout() && !down {
                    let mut book = shared.book.lock().unwrap();
                    book.server_errors
                        .push(format!("{} POST {path} timed out while up: {e:?}", replica.name));
                } else if down {
                    bump(&shared.counters.conn_errors_down);
                } else {
                    bump(&shared.counters.conn_errors_up);
                    let mut book = shared.book.lock().unwrap();
                    if book.conn_error_notes.len() < 20 {
                        book.conn_error_notes
                            .push(format!("{} POST {path} (replica up): {e:?}", replica.name));
                    }
                }
                self.avoid_until[r] = Instant::now() + Duration::from_millis(300);
                None
            }
        }
    }

    /// Sends until answered, moving to another replica after a lost answer;
    /// `None` past the deadline, or (when `stoppable`) once the run is over.
    async fn send(&mut self, first: Option<usize>, path: &str, body: &Value, stoppable: bool) -> Option<Answered> {
        let mut resent = false;
        let mut target = first;
        loop {
            if Instant::now() > self.shared.deadline {
                self.shared
                    .anomaly(format!("{}: POST {path} unanswered at the deadline", self.name()));
                return None;
            }
            if stoppable && self.shared.stop.load(Ordering::SeqCst) {
                return None;
            }
            let r = target.take().unwrap_or_else(|| self.pick());
            if let Some((status, body)) = self.send_once(r, path, body).await {
                return Some(Answered { status, body, resent });
            }
            resent = true;
            let pause = 20 + self.rng.below(80);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    async fn run(mut self) {
        while !self.shared.stop.load(Ordering::SeqCst) && Instant::now() < self.shared.deadline {
            self.round().await;
        }
    }

    /// One claim and what this worker does with it.
    async fn round(&mut self) {
        let shared = self.shared.clone();
        let limit = 10 + self.rng.below(16);
        let body = json!({"limit": limit, "lease_seconds": LEASE_SECONDS, "worker": self.name(), "wait_seconds": 1});
        let Some(claim) = self
            .send(None, &format!("/v1/queues/{QUEUE}/claims"), &body, true)
            .await
        else {
            return;
        };
        if claim.status != StatusCode::OK {
            shared.anomaly(format!("claim answered {}: {}", claim.status, claim.body));
            return;
        }
        let claim_id = claim.body["claim_id"].as_str().unwrap_or_default().to_owned();
        let Some(children) = claim.body["children"].as_array() else {
            shared.anomaly(format!("claim without children: {}", claim.body));
            return;
        };
        if children.is_empty() {
            return;
        }
        bump(&shared.counters.claims);
        // Each kind of chaos happens at least once: on the first chunk of worker 0 (crash),
        // 1 (conflicting race) and 2 (retried post).
        let first_chunk = self.chunks == 0;
        self.chunks += 1;
        let forced = |kind: usize| first_chunk && self.id == kind;
        let (crash, race, retry) = (forced(0), forced(1), forced(2));
        let mut claimed: Vec<ChildId> = Vec::with_capacity(children.len());
        {
            let mut book = shared.book.lock().unwrap();
            for c in children {
                let id: ChildId = (
                    c["parent_id"].as_str().unwrap_or_default().to_owned(),
                    c["sequence"].as_i64().unwrap_or(-1),
                );
                let attempt = c["attempt"].as_i64().unwrap_or(0);
                let previous = &c["previous_attempt"];
                let consistent = match previous.as_str() {
                    None => previous.is_null() && attempt == 1,
                    Some("expired") => attempt > 1,
                    Some(_) => false,
                };
                if !consistent || c["idempotency_key"] != json!(format!("{}/{}", id.0, id.1)) {
                    book.anomalies
                        .push(format!("claim {claim_id} handed out an inconsistent child: {c}"));
                }
                if previous == "expired" {
                    bump(&shared.counters.reissued_expired);
                    book.reissued.insert(id.clone());
                }
                if !book.handed_out.insert((id.clone(), attempt)) {
                    let text =
                        format!("{id:?} handed out twice as attempt {attempt} (the second time by claim {claim_id})");
                    book.anomalies.push(text);
                }
                let seen = book.attempts_seen.entry(id.clone()).or_insert(0);
                *seen = (*seen).max(attempt);
                claimed.push(id);
            }
        }
        bump_by(&shared.counters.claimed_children, claimed.len() as u64);

        // The "work".
        let work_ms = env_u64("CHAOS_WORK_MS", 2);
        let pause = self.rng.below(work_ms * claimed.len() as u64 + 1);
        tokio::time::sleep(Duration::from_millis(pause)).await;

        let worker = self.name();
        let items: Vec<Item> = claimed
            .iter()
            .map(|child| {
                let (outcome, reason) = verdict(shared.seed, child);
                Item {
                    child: child.clone(),
                    outcome,
                    reason,
                    result: json!({"worker": worker, "claim_id": claim_id}),
                    claim_id: claim_id.clone(),
                }
            })
            .collect();

        // A chunk forced to race or retry is not crashed by chance first, or
        // that chaos could never happen in a run.
        if crash || (!race && !retry && self.rng.chance(CRASH_PERCENT)) {
            // Crash mid-chunk: report a prefix, abandon the rest (no outcome, no release).
            let keep = self.rng.below(items.len() as u64) as usize;
            if keep > 0 {
                self.post_batch(&items[..keep], None, &HashSet::new()).await;
            }
            bump(&shared.counters.crashes);
            bump_by(&shared.counters.abandoned, (items.len() - keep) as u64);
            shared
                .book
                .lock()
                .unwrap()
                .crashed
                .extend(items[keep..].iter().map(|i| i.child.clone()));
            // A fresh worker takes this one's place.
            self.generation += 1;
            self.client = client();
            return;
        }

        let first = self.pick();
        let race = self.rng.chance(RACE_PERCENT) || race;
        let answers = if race {
            let raced = items[self.rng.below(items.len() as u64) as usize].clone();
            let (conflicting, reason) = opposite(raced.outcome);
            let rival = Item {
                outcome: conflicting,
                reason,
                result: json!({"worker": format!("{worker}-rival"), "claim_id": claim_id}),
                ..raced.clone()
            };
            let other = (first + 1) % shared.replicas.len();
            let mut rival_worker = Worker {
                id: self.id,
                generation: self.generation,
                chunks: self.chunks,
                rng: Rng::new(self.rng.next()),
                client: self.client.clone(),
                next: other,
                avoid_until: self.avoid_until.clone(),
                shared: shared.clone(),
            };
            let raced_set: HashSet<ChildId> = [raced.child.clone()].into();
            let (answers, rival_status) = tokio::join!(
                self.post_batch(&items, Some(first), &raced_set),
                rival_worker.post_single(&rival, Some(other))
            );
            bump(&shared.counters.race_posts);
            if let Some(answers) = &answers {
                let original = items
                    .iter()
                    .position(|i| i.child == raced.child)
                    .map(|k| answers[k].as_str());
                match (original, rival_status.as_deref()) {
                    (Some("applied"), Some("conflict")) => bump(&shared.counters.race_won_by_original),
                    (Some("conflict"), Some("applied")) => bump(&shared.counters.race_won_by_conflicting),
                    (Some("applied"), Some("applied")) => shared.anomaly(format!(
                        "{:?}: both the batch and the conflicting post were applied",
                        raced.child
                    )),
                    _ => bump(&shared.counters.race_won_elsewhere),
                }
            }
            answers
        } else {
            self.post_batch(&items, Some(first), &HashSet::new()).await
        };

        // A retried post (the worker did not see the first answer): nothing is applied twice.
        if let Some(answers) = answers
            && (self.rng.chance(RETRY_PERCENT) || retry)
        {
            self.retry_batch(&items, &answers).await;
        }
    }

    /// Posts a batch until answered and books the answers; the statuses in order.
    async fn post_batch(
        &mut self,
        items: &[Item],
        first: Option<usize>,
        raced: &HashSet<ChildId>,
    ) -> Option<Vec<String>> {
        let shared = self.shared.clone();
        {
            let mut book = shared.book.lock().unwrap();
            for item in items {
                book.posted.entry(item.child.clone()).or_default().insert(item.outcome);
            }
        }
        let body = json!({"outcomes": items.iter().map(Item::batch_json).collect::<Vec<_>>()});
        bump(&shared.counters.outcome_posts);
        let answered = self.send(first, "/v1/outcomes", &body, false).await?;
        let statuses = self.batch_statuses(items, &answered)?;
        let mut book = shared.book.lock().unwrap();
        if answered.resent {
            bump(&shared.counters.resent_posts);
            book.lost.extend(items.iter().map(|i| i.child.clone()));
        }
        for (item, status) in items.iter().zip(&statuses) {
            match status.as_str() {
                "applied" => book.acks.entry(item.child.clone()).or_default().push(item.ack()),
                "duplicate" | "conflict" => {
                    if status == "conflict" {
                        bump(&shared.counters.conflict_answers);
                    }
                    if !answered.resent && !raced.contains(&item.child) {
                        bump(&shared.counters.late_answers);
                        book.late.insert(item.child.clone());
                    }
                }
                other => book
                    .anomalies
                    .push(format!("{:?} answered {other:?} to {}", item.child, item.outcome)),
            }
        }
        Some(statuses)
    }

    fn batch_statuses(&self, items: &[Item], answered: &Answered) -> Option<Vec<String>> {
        let results = answered.body["results"].as_array();
        let statuses: Option<Vec<String>> = results.and_then(|results| {
            results
                .iter()
                .zip(items)
                .map(|(r, item)| {
                    (r["parent_id"] == json!(item.child.0) && r["sequence"] == json!(item.child.1))
                        .then(|| r["status"].as_str().map(str::to_owned))
                        .flatten()
                })
                .collect()
        });
        match statuses {
            Some(s) if answered.status == StatusCode::OK && s.len() == items.len() => Some(s),
            _ => {
                self.shared.anomaly(format!(
                    "outcome batch of {} answered {}: {}",
                    items.len(),
                    answered.status,
                    answered.body
                ));
                None
            }
        }
    }

    /// The conflicting single post of a race: `applied`, `duplicate` or `conflict`.
    async fn post_single(&mut self, item: &Item, first: Option<usize>) -> Option<String> {
        let shared = self.shared.clone();
        shared
            .book
            .lock()
            .unwrap()
            .posted
            .entry(item.child.clone())
            .or_default()
            .insert(item.outcome);
        let path = format!("/v1/parents/{}/children/{}/outcome", item.child.0, item.child.1);
        let body =
            json!({"outcome": item.outcome, "reason": item.reason, "result": item.result, "claim_id": item.claim_id});
        let answered = self.send(first, &path, &body, false).await?;
        let status = match (answered.status, &answered.body["applied"]) {
            (StatusCode::OK, Value::Bool(true)) => "applied",
            (StatusCode::OK, Value::Bool(false)) => "duplicate",
            (StatusCode::CONFLICT, _)
                if answered.body["type"]
                    .as_str()
                    .is_some_and(|t| t.ends_with("outcome-conflict"))
                    && answered.body["child"]["outcome"].is_string() =>
            {
                "conflict"
            }
            _ => {
                shared.anomaly(format!(
                    "conflicting post for {:?} answered {}: {}",
                    item.child, answered.status, answered.body
                ));
                return None;
            }
        };
        let mut book = shared.book.lock().unwrap();
        if answered.resent {
            bump(&shared.counters.resent_posts);
            book.lost.insert(item.child.clone());
        }
        match status {
            "applied" => book.acks.entry(item.child.clone()).or_default().push(item.ack()),
            "conflict" => bump(&shared.counters.conflict_answers),
            _ => {}
        }
        Some(status.to_owned())
    }

    /// The same batch again: an item first answered `applied` or `duplicate`
    /// must now be `duplicate`; one answered `conflict` stays `conflict`.
    async fn retry_batch(&mut self, items: &[Item], first_answers: &[String]) {
        let shared = self.shared.clone();
        bump(&shared.counters.retry_posts);
        bump_by(&shared.counters.retry_items, items.len() as u64);
        let body = json!({"outcomes": items.iter().map(Item::batch_json).collect::<Vec<_>>()});
        let Some(answered) = self.send(None, "/v1/outcomes", &body, false).await else {
            return;
        };
        let Some(statuses) = self.batch_statuses(items, &answered) else {
            return;
        };
        for ((item, first), now) in items.iter().zip(first_answers).zip(&statuses) {
            let expected = if first == "conflict" { "conflict" } else { "duplicate" };
            match now.as_str() {
                "duplicate" => bump(&shared.counters.retry_duplicate),
                "conflict" => {
                    bump(&shared.counters.retry_conflict);
                    bump(&shared.counters.conflict_answers);
                }
                _ => {}
            }
            if now == "applied" {
                shared
                    .book
                    .lock()
                    .unwrap()
                    .acks
                    .entry(item.child.clone())
                    .or_default()
                    .push(item.ack());
            }
            if now != expected {
                shared.anomaly(format!(
                    "retried {:?} ({}) answered {now:?}, first {first:?}",
                    item.child, item.outcome
                ));
            }
        }
    }
}

fn bump_by(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

async fn terminal_count(store: &common::raw::RawDb) -> i64 {
    store
        .count_raw("SELECT count(*) FROM child_status WHERE state IN ('processed', 'failed')")
        .await
        .unwrap_or(0)
}

async fn state_counts(store: &common::raw::RawDb) -> String {
    let mut out = String::new();
    for state in ["pending", "in_flight", "held", "processed", "failed", "skipped"] {
        let n = store
            .count_raw(&format!("SELECT count(*) FROM child_status WHERE state = '{state}'"))
            .await
            .unwrap_or(-1);
        let _ = write!(out, "{state} {n}, ");
    }
    out
}

/// Every child of a parent, through the HTTP listing.
async fn list_children(client: &reqwest::Client, base: &str, parent: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let mut url = format!("{base}/v1/parents/{parent}/children?limit=1000");
        if let Some(after) = after {
            let _ = write!(url, "&after={after}");
        }
        let resp = client.get(&url).send().await.expect("list children");
        assert_eq!(resp.status(), StatusCode::OK, "GET {url}");
        let page: Value = resp.json().await.expect("children page");
        all.extend(page["children"].as_array().expect("children").iter().cloned());
        match page["next_after"].as_i64() {
            Some(next) => after = Some(next),
            None => return all,
        }
    }
}

async fn chaos(backend: Backend) {
    run_chaos(backend, None).await;
}

/// The same chaos, with both replicas reaching Postgres through PgBouncer in
/// transaction mode (`--db-pooler transaction`, fewer server connections
/// than the replicas' clients) and `LISTEN` through the direct URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_through_pgbouncer() {
    if !postgres_available().await {
        return;
    }
    let Some(bouncer) = pgbouncer().await else {
        return;
    };
    run_chaos(Backend::Postgres, Some(&bouncer)).await;
}

async fn run_chaos(backend: Backend, bouncer: Option<&common::pgbouncer::PgBouncer>) {
    let parents = env_u64("CHAOS_PARENTS", 8);
    let per_parent = env_u64("CHAOS_CHILDREN", 150);
    let workers = env_u64("CHAOS_WORKERS", 8) as usize;
    let kills = env_u64("CHAOS_KILLS", 1);
    let total = parents * per_parent;
    let timeout = Duration::from_secs(env_u64("CHAOS_TIMEOUT_SECS", (total / 20).max(180)));
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .map(|s| s.trim().parse::<u64>().expect("CHAOS_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                ^ u64::from(std::process::id())
        });
    let label = match (backend, bouncer) {
        (Backend::Sqlite, _) => "sqlite",
        (Backend::Postgres, None) => "postgres",
        (Backend::Postgres, Some(_)) => "postgres through pgbouncer",
    };
    eprintln!("chaos[{label}]: seed {seed} (CHAOS_SEED={seed} repeats the choices)");

    let db = TestDatabase::new(backend).await;
    let store = db.store().await;
    let (hook_port, webhooks, _receiver) = webhook_receiver().await;
    let allow = format!("127.0.0.1:{hook_port}");
    let mut flags = vec![
        "--reap-interval-ms",
        "200",
        "--webhook-allow-hosts",
        &allow,
        "--webhook-secret",
        "whsec_Y2hhb3Mtd2ViaG9vay1zZWNyZXQ=",
        "--webhook-poll-ms",
        "200",
    ];
    let service_url = match bouncer {
        Some(bouncer) => {
            flags.extend(["--db-pooler", "transaction", "--listen-database-url", &db.url]);
            bouncer.url_for(&db.url)
        }
        None => db.url.clone(),
    };
    let mut processes = vec![ServiceProcess::start("chaos-a", &service_url, &flags).await];
    processes[0].ready().await;
    if backend == Backend::Postgres {
        let b = ServiceProcess::start("chaos-b", &service_url, &flags).await;
        b.ready().await;
        processes.push(b);
    }
    let names = ["a", "b"];
    let replicas: Vec<Replica> = processes
        .iter()
        .zip(names)
        .map(|(p, name)| Replica {
            name,
            base: p.base.clone(),
            down: AtomicBool::new(false),
            answered: AtomicU64::new(0),
            answered_at_restart: AtomicU64::new(0),
        })
        .collect();
    let base_a = replicas[0].base.clone();
    let http = client();

    // Register every parent before any worker starts; a few children are skipped as invalid input.
    let mut skipped: HashSet<ChildId> = HashSet::new();
    for p in 0..parents {
        let id = parent_name(p);
        let children: Vec<Value> = (0..per_parent)
            .map(|i| {
                if skipped_at_registration(seed, p, i) {
                    skipped.insert((id.clone(), i as i64));
                    json!({"payload": {"p": p, "i": i}, "key": format!("k{i}"), "skip": "chaos: invalid input"})
                } else {
                    json!({"payload": {"p": p, "i": i}, "key": format!("k{i}")})
                }
            })
            .collect();
        let resp = http
            .put(format!("{base_a}/v1/parents/{id}"))
            .json(&json!({"queue": QUEUE, "payload": {"chaos": p}, "children": children,
                          "webhook_url": format!("http://{allow}/hook/{id}")}))
            .send()
            .await
            .expect("register");
        assert_eq!(
            resp.status(),
            StatusCode::CREATED,
            "register {id}: {:?}",
            resp.text().await
        );
    }
    let workable = total - skipped.len() as u64;

    let started = Instant::now();
    let shared = Arc::new(Shared {
        seed,
        replicas,
        counters: Counters::default(),
        book: Mutex::new(Book::default()),
        stop: AtomicBool::new(false),
        deadline: started + timeout,
    });
    let tasks: Vec<_> = (0..workers)
        .map(|id| {
            let worker = Worker {
                id,
                generation: 0,
                chunks: 0,
                rng: Rng::new(seed ^ ((id as u64 + 1) << 40)),
                client: client(),
                next: id,
                avoid_until: vec![Instant::now(); shared.replicas.len()],
                shared: shared.clone(),
            };
            tokio::spawn(worker.run())
        })
        .collect();

    // The killer: SIGKILL the last replica at 30% (60%, ...) of the work, and start it again.
    let victim_index = processes.len() - 1;
    let mut victim = processes.pop().expect("a replica");
    let killer_shared = shared.clone();
    let killer_store = db.store().await;
    let killer = tokio::spawn(async move {
        let mut downtimes = Vec::new();
        for k in 0..kills {
            let fraction = (0.3 + 0.3 * k as f64).min(0.9);
            let threshold = (workable as f64 * fraction) as i64;
            while terminal_count(&killer_store).await < threshold {
                if Instant::now() > killer_shared.deadline {
                    return (victim, downtimes);
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            let replica = &killer_shared.replicas[victim_index];
            replica.down.store(true, Ordering::SeqCst);
            let down_at = Instant::now();
            victim.kill().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            victim.restart().await;
            victim.ready().await;
            replica
                .answered_at_restart
                .store(replica.answered.load(Ordering::Relaxed), Ordering::Relaxed);
            replica.down.store(false, Ordering::SeqCst);
            downtimes.push(down_at.elapsed());
        }
        (victim, downtimes)
    });

    // Drain: until the ledger says every parent is complete and the killer is done.
    let mut drained = false;
    while Instant::now() < shared.deadline {
        if killer.is_finished() {
            let active = http
                .get(format!("{base_a}/v1/parents?queue={QUEUE}&state=active&limit=1"))
                .send()
                .await;
            if let Ok(resp) = active {
                let status = resp.status();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                assert_eq!(status, StatusCode::OK, "list active parents: {body}");
                if body["parents"].as_array().is_some_and(Vec::is_empty) {
                    drained = true;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    shared.stop.store(true, Ordering::SeqCst);
    let drain_wall = started.elapsed();
    for task in tasks {
        task.await.expect("worker task");
    }
    let (victim, downtimes) = killer.await.expect("killer task");
    processes.push(victim);
    let c = &shared.counters;
    let book = std::mem::take(&mut *shared.book.lock().unwrap());
    if !drained {
        panic!(
            "chaos[{label}] seed {seed}: not drained within {timeout:?}: rows {}; claims {}, crashes {}, \
             kills done {}/{kills}; anomalies {:?}; 5xx {:?}",
            state_counts(&store).await,
            get(&c.claims),
            get(&c.crashes),
            downtimes.len(),
            book.anomalies,
            book.server_errors,
        );
    }

    // ---- The ledger, read back.
    let mut failures: Vec<String> = Vec::new();
    let non_terminal = store
        .count_raw("SELECT count(*) FROM child_status WHERE state NOT IN ('processed', 'failed', 'skipped')")
        .await
        .unwrap();
    if non_terminal != 0 {
        failures.push(format!(
            "{non_terminal} children not terminal: {}",
            state_counts(&store).await
        ));
    }
    let mut rows = 0u64;
    let mut acked = 0u64;
    let mut answer_lost = 0u64;
    let mut reissued_children = 0u64;
    let mut extra_attempts = 0i64;
    let mut conflicts_logged = 0u64;
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    for p in 0..parents {
        let id = parent_name(p);
        let children = list_children(&http, &base_a, &id).await;
        if children.len() as u64 != per_parent {
            failures.push(format!("{id} lists {} children, not {per_parent}", children.len()));
        }
        let mut per_state: BTreeMap<&str, u64> = BTreeMap::new();
        for child in &children {
            rows += 1;
            let key: ChildId = (id.clone(), child["sequence"].as_i64().unwrap_or(-1));
            let state = child["state"].as_str().unwrap_or("?");
            *per_state.entry(state).or_default() += 1;
            *states.entry(state.to_owned()).or_default() += 1;
            let attempts = child["attempts"].as_i64().unwrap_or(0);
            if attempts > 1 {
                reissued_children += 1;
                extra_attempts += attempts - 1;
            }
            let conflicts = child["conflicts"].as_array().map_or(0, Vec::len) as u64;
            conflicts_logged += conflicts;
            if skipped.contains(&key) {
                if state != "skipped" || attempts != 0 || conflicts != 0 {
                    failures.push(format!("skipped-at-registration child {key:?} is now {child}"));
                }
                continue;
            }
            if child["outcome"].as_str() != Some(state) {
                failures.push(format!("{key:?}: state {state} but outcome {}", child["outcome"]));
            }
            if let Some(seen) = book.attempts_seen.get(&key)
                && attempts < *seen
            {
                failures.push(format!(
                    "{key:?}: stored attempts {attempts} < attempt {seen} handed out"
                ));
            }
            if book.crashed.contains(&key) && (attempts < 2 || !book.reissued.contains(&key)) {
                failures.push(format!(
                    "{key:?} was abandoned but not seen reissued after its lease expired: {child}"
                ));
            }
            if book.late.contains(&key) && attempts < 2 {
                failures.push(format!("{key:?} was answered late but was claimed only once: {child}"));
            }
            match book.acks.get(&key).map(Vec::as_slice).unwrap_or_default() {
                [ack] => {
                    acked += 1;
                    if child["outcome"] != json!(ack.outcome)
                        || child["reason"] != json!(ack.reason)
                        || child["result"] != ack.result
                    {
                        failures.push(format!(
                            "acknowledged {ack:?} for {key:?} is not what is stored: {child}"
                        ));
                    }
                }
                [] => {
                    // Applied by a request whose answer was lost (a kill), or not at all.
                    let posted = book.posted.get(&key);
                    let stored = child["outcome"].as_str().unwrap_or("");
                    if book.lost.contains(&key) && posted.is_some_and(|p| p.contains(stored)) {
                        answer_lost += 1;
                    } else {
                        failures.push(format!(
                            "{key:?} is terminal but no worker was told it applied an outcome \
                             (posted {posted:?}, answer lost: {}): {child}",
                            book.lost.contains(&key)
                        ));
                    }
                }
                many => failures.push(format!(
                    "{key:?} acknowledged as applied {} times: {many:?}",
                    many.len()
                )),
            }
        }
        // The parent: complete, and its counters are its rows.
        let resp = http
            .get(format!("{base_a}/v1/parents/{id}"))
            .send()
            .await
            .expect("get parent");
        let parent: Value = resp.json().await.expect("parent");
        let counts = &parent["counts"];
        let n = |f: &str| counts[f].as_u64().unwrap_or(u64::MAX);
        let from_rows = |s: &str| per_state.get(s).copied().unwrap_or(0);
        if parent["state"] != "complete"
            || parent["complete"] != true
            || parent["completed_at"].is_null()
            || n("total") != per_parent
            || n("processed") + n("failed") + n("skipped") != per_parent
            || n("processed") != from_rows("processed")
            || n("failed") != from_rows("failed")
            || n("skipped") != from_rows("skipped")
            || n("pending") + n("in_flight") + n("held") != 0
        {
            failures.push(format!(
                "parent {id} is not complete as its rows say ({per_state:?}): {parent}"
            ));
        }
    }
    if rows != total {
        failures.push(format!("{rows} child rows, {total} registered"));
    }
    if acked + answer_lost != workable {
        failures.push(format!(
            "{acked} children acknowledged + {answer_lost} with a lost answer != {workable} to work"
        ));
    }
    let conflict_answers = get(&c.conflict_answers);
    let lost_items = book.lost.len() as u64;
    if conflicts_logged < conflict_answers || conflicts_logged > conflict_answers + lost_items {
        failures.push(format!(
            "{conflicts_logged} conflicts logged on the children, {conflict_answers} answered \
             (+ at most {lost_items} from posts whose answer was lost)"
        ));
    }
    if get(&c.race_posts) > 0 && conflicts_logged == 0 {
        failures.push(format!("{} conflicting posts, no conflict logged", get(&c.race_posts)));
    }

    // The reconcile sweep's dry run finds nothing to repair.
    let resp = http
        .post(format!("{base_a}/v1/reconcile"))
        .json(&json!({"dry_run": true, "queue": QUEUE}))
        .send()
        .await
        .expect("reconcile");
    let status = resp.status();
    let sweep: Value = resp.json().await.unwrap_or(Value::Null);
    if status != StatusCode::OK || sweep["checked"] != json!(parents) || sweep["drifted"] != 0 {
        failures.push(format!("reconcile dry run {status}: {sweep}"));
    }

    // Every parent's completion event arrives, one per parent, whatever replica sent it.
    let hooks_started = Instant::now();
    let announced = loop {
        let seen = webhooks.lock().unwrap().clone();
        let parents_seen: HashSet<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
        if parents_seen.len() as u64 == parents || hooks_started.elapsed() > Duration::from_secs(30) {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let hooks_wait = hooks_started.elapsed();
    let mut ids_by_parent: BTreeMap<&str, HashSet<&str>> = BTreeMap::new();
    for (parent, id) in &announced {
        ids_by_parent.entry(parent.as_str()).or_default().insert(id.as_str());
    }
    if ids_by_parent.len() as u64 != parents || ids_by_parent.values().any(|ids| ids.len() != 1) {
        failures.push(format!(
            "completion webhooks: {} of {parents} parents announced, ids per parent {:?}",
            ids_by_parent.len(),
            ids_by_parent.values().map(HashSet::len).collect::<Vec<_>>()
        ));
    }
    let events = store.count_raw("SELECT count(*) FROM webhook_event").await.unwrap();
    if events as u64 != parents {
        failures.push(format!("{events} webhook events for {parents} parents"));
    }

    failures.extend(book.anomalies.iter().cloned());
    if !book.server_errors.is_empty() {
        failures.push(format!(
            "{} 5xx from a replica that was up: {:?}",
            book.server_errors.len(),
            &book.server_errors[..book.server_errors.len().min(10)]
        ));
    }
    if workers >= 3 && (get(&c.crashes) == 0 || get(&c.race_posts) == 0 || get(&c.retry_posts) == 0) {
        failures.push(format!(
            "some chaos never happened: crashes {}, conflicting posts {}, duplicate posts {}",
            get(&c.crashes),
            get(&c.race_posts),
            get(&c.retry_posts)
        ));
    }
    if downtimes.len() as u64 != kills {
        failures.push(format!("{} of {kills} kills done", downtimes.len()));
    }
    for process in &processes {
        let log = process.log_text();
        if let Some(line) = log.lines().find(|l| l.contains("panicked")) {
            failures.push(format!("replica {} panicked: {line}", process.name));
        }
    }

    let victim = &shared.replicas[victim_index];
    let after_restart = get(&victim.answered) - get(&victim.answered_at_restart);
    let downs: Vec<String> = downtimes.iter().map(|d| format!("{:.1} s", d.as_secs_f64())).collect();
    let result = if failures.is_empty() {
        "OK".to_owned()
    } else {
        format!("FAILED ({} findings)", failures.len())
    };
    eprintln!(
        "chaos[{label}]: {total} children ({} skipped at registration) in {parents} parents, {} replicas, \
         {workers} workers, seed {seed}: claims {} ({} children handed out), crashes {} ({} children abandoned; \
         leases expired and reissued: {} hand-outs, {reissued_children} children, {extra_attempts} extra attempts), \
         duplicate posts {} ({} items: {} duplicate, {} conflict, as expected), conflicting posts {} (won by the \
         conflicting post {}, by the original {}, elsewhere {}; {conflicts_logged} conflicts logged, \
         {conflict_answers} answered), late answers {}, kills {} (replica {} down {}; answered {after_restart} \
         requests after restart), connection errors {} (+{} to a replica that was up), posts re-sent after a \
         lost answer {} ({answer_lost} children applied without a seen answer), 5xx {} (+{} while down), \
         final states {states:?}, completion webhooks {} requests for {} parents (one id each; waited \
         {hooks_wait:.1?} after the other checks), wall {:.1} s (drained {:.1} s): {result}",
        skipped.len(),
        shared.replicas.len(),
        get(&c.claims),
        get(&c.claimed_children),
        get(&c.crashes),
        get(&c.abandoned),
        get(&c.reissued_expired),
        get(&c.retry_posts),
        get(&c.retry_items),
        get(&c.retry_duplicate),
        get(&c.retry_conflict),
        get(&c.race_posts),
        get(&c.race_won_by_conflicting),
        get(&c.race_won_by_original),
        get(&c.race_won_elsewhere),
        get(&c.late_answers),
        downtimes.len(),
        victim.name,
        downs.join(", "),
        get(&c.conn_errors_down),
        get(&c.conn_errors_up),
        get(&c.resent_posts),
        book.server_errors.len(),
        get(&c.server_errors_down),
        announced.len(),
        ids_by_parent.len(),
        started.elapsed().as_secs_f64(),
        drain_wall.as_secs_f64(),
    );
    if !book.conn_error_notes.is_empty() {
        eprintln!(
            "chaos[{label}]: connection errors to a replica that was up: {:?}",
            book.conn_error_notes
        );
    }
    assert!(
        failures.is_empty(),
        "chaos[{label}] seed {seed} (CHAOS_SEED={seed} to repeat): {} findings:\n{}",
        failures.len(),
        failures.iter().take(50).cloned().collect::<Vec<_>>().join("\n")
    );
}

both_stores!(chaos);
