//! `admission.*` (`--admission-only`, and the full run): claim admission on
//! Postgres, each run on a fresh database.
//!
//! - `admission.unbound`: a burn-down of children of 40 parents over 20 flow
//!   keys by 8 HTTP workers (claims of 100), with queue and per-key limits
//!   set too high to bind, against the same burn-down with no limits, run
//!   before and after it (the baseline is their mean). Target >= 0.9.
//! - `admission.unbound.node_mixed`: the same comparison in the shape users
//!   run: two big parents and many small ones (100 children) mixed on one
//!   queue over 20 keys, drained by the plain Node `fetch` worker (claims of
//!   100). Target >= 0.9.
//! - `admission.rate`: a queue limited to R children/s (a fifth of the
//!   unlimited rate, burst R/10), claimed by 8 long-polling workers that
//!   never post outcomes, so every lease row stays with its `claimed_at`.
//!   From those: the rate over the run, (claimed - burst) / (last - first),
//!   within 5% of R; and the most claimed in any window of 1 s, against
//!   burst + R (never above).
//! - `admission.cap_violations`: 8 claimers on 2 replicas (claims of 4, each
//!   answered with its outcomes at once) over 20 keys capped at 5 in flight
//!   each; a sampler reads every key's in-flight count from the database
//!   (live leases) every few milliseconds. Target: no sample above the cap.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::Connection;

use super::cost::{TICK_US, machine_ticks, node_worker, postgres_ticks, process_ticks};
use super::{ClaimReply, Scenario, ScratchDb, Service, WORKERS, burn_down_http, post_processed, put_raw, settle};

const KEYS: usize = 20;
const PARENTS: usize = 40;
const KEY_CAP: i64 = 5;

/// Registers `n` children over `parents` parents of `queue`, keyed by
/// `k0`..`k19` in turn when `keyed`.
async fn register(base: &str, queue: &str, n: usize, parents: usize, keyed: bool) {
    let client = reqwest::Client::new();
    for p in 0..parents {
        let children: Vec<Value> = (p..n).step_by(parents).map(|i| json!({"payload": {"n": i}})).collect();
        let mut body = json!({"queue": queue, "children": children});
        if keyed {
            body["flow_key"] = json!(format!("k{}", p % KEYS));
        }
        let status = put_raw(
            &client,
            &format!("{base}/v1/parents/{queue}-{p}"),
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert!(status.is_success(), "register: {status}");
    }
}

async fn set_limits(base: &str, queue: &str, limits: Value) {
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/queues/{queue}/limits"))
        .json(&limits)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "limits: {}", r.status());
}

/// What one burn-down cost: children/s, and CPU µs per child of the whole
/// machine, of Postgres and of the service (from `/proc`, over the burn-down
/// alone).
#[derive(Debug, Clone, Copy, Default)]
struct Burn {
    rate: f64,
    machine_us: f64,
    postgres_us: f64,
    service_us: f64,
}

impl Burn {
    fn mean(a: Self, b: Self) -> Self {
        Self {
            rate: (a.rate + b.rate) / 2.0,
            machine_us: (a.machine_us + b.machine_us) / 2.0,
            postgres_us: (a.postgres_us + b.postgres_us) / 2.0,
            service_us: (a.service_us + b.service_us) / 2.0,
        }
    }
}

impl std::fmt::Display for Burn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.0} children/s, CPU µs per child: machine {:.1}, Postgres {:.1}, service {:.1}",
            self.rate, self.machine_us, self.postgres_us, self.service_us
        )
    }
}

/// A keyed burn-down of `n`, with `limits` set first when given.
async fn keyed_burn(admin_url: &str, tag: &str, n: usize, limits: Option<Value>) -> Burn {
    let db = ScratchDb::create(admin_url, tag).await;
    let service = Service::start(&db.url).await;
    if let Some(limits) = limits {
        set_limits(&service.base, "adm", limits).await;
    }
    register(&service.base, "adm", n, PARENTS, true).await;
    settle(&db.url).await;
    let paths = vec!["/v1/queues/adm/claims".to_owned(); WORKERS];
    let ticks = || (machine_ticks(), postgres_ticks(), process_ticks(service.pid));
    let before = ticks();
    let rate = burn_down_http(&service.base, &paths, 100, n as u64).await;
    let after = ticks();
    service.stop().await;
    db.drop_now().await;
    let per_child = |a: u64, b: u64| b.saturating_sub(a) as f64 * TICK_US / n as f64;
    Burn {
        rate,
        machine_us: per_child(before.0, after.0),
        postgres_us: per_child(before.1, after.1),
        service_us: per_child(before.2, after.2),
    }
}

/// The shape users run: `n` children in two big parents (two fifths of
/// them each) and small ones of 100 (the last fifth) mixed on one queue,
/// each parent with one of 20 flow keys, drained by the plain Node `fetch`
/// worker (claims of 100); `limits` set first when given.
async fn mixed_node_burn(admin_url: &str, tag: &str, n: usize, limits: Option<Value>) -> Burn {
    let db = ScratchDb::create(admin_url, tag).await;
    let service = Service::start(&db.url).await;
    if let Some(limits) = limits {
        set_limits(&service.base, "mixed", limits).await;
    }
    let client = reqwest::Client::new();
    let big = n * 2 / 5;
    let small = (n - 2 * big) / 100;
    let sizes = [big, big].into_iter().chain(std::iter::repeat_n(100, small));
    let mut registered = 0;
    for (p, size) in sizes.enumerate() {
        let children: Vec<Value> = (0..size).map(|i| json!({"payload": {"n": i}})).collect();
        let body = json!({"queue": "mixed", "flow_key": format!("k{}", p % KEYS), "children": children});
        let status = put_raw(
            &client,
            &format!("{}/v1/parents/mixed-{p}", service.base),
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
        assert!(status.is_success(), "register: {status}");
        registered += size;
    }
    settle(&db.url).await;
    let ticks = || (machine_ticks(), postgres_ticks(), process_ticks(service.pid));
    let before = ticks();
    let started = Instant::now();
    let node = node_worker(&service.base, "mixed", 100, registered).await;
    let drained = started.elapsed();
    let after = ticks();
    service.stop().await;
    db.drop_now().await;
    let per_child = |a: u64, b: u64| b.saturating_sub(a) as f64 * TICK_US / registered as f64;
    Burn {
        rate: node.children_per_second.min(registered as f64 / drained.as_secs_f64()),
        machine_us: per_child(before.0, after.0),
        postgres_us: per_child(before.1, after.1),
        service_us: per_child(before.2, after.2),
    }
}

/// Claims `n` children of a queue limited to `rate`/s (burst `burst`) with
/// long polls and no outcomes; the lease rows' `(claimed_at, children)`.
async fn metered(admin_url: &str, rate: f64, burst: f64, n: usize) -> Vec<(DateTime<Utc>, i64)> {
    let db = ScratchDb::create(admin_url, "admrate").await;
    let service = Service::start(&db.url).await;
    set_limits(&service.base, "rate", json!({"per_second": rate, "burst": burst})).await;
    register(&service.base, "rate", n, 8, false).await;
    settle(&db.url).await;
    let claimed = Arc::new(AtomicU64::new(0));
    let client = reqwest::Client::new();
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| {
            let (client, claimed) = (client.clone(), Arc::clone(&claimed));
            let url = format!("{}/v1/queues/rate/claims", service.base);
            tokio::spawn(async move {
                while claimed.load(Ordering::Relaxed) < n as u64 {
                    let reply = client
                        .post(&url)
                        .json(&json!({"limit": 100, "lease_seconds": 3600, "wait_seconds": 1}))
                        .send()
                        .await
                        .unwrap();
                    let claim: ClaimReply = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
                    claimed.fetch_add(claim.children.len() as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let rows: Vec<(DateTime<Utc>, i32)> =
        sqlx::query_as("SELECT claimed_at, open FROM claim_lease WHERE queue = 'rate' ORDER BY claimed_at")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    drop(conn);
    service.stop().await;
    db.drop_now().await;
    rows.into_iter().map(|(at, n)| (at, i64::from(n))).collect()
}

/// The most children claimed in any window of one second.
fn busiest_second(grants: &[(DateTime<Utc>, i64)]) -> i64 {
    let (mut most, mut sum, mut start) = (0, 0, 0);
    for end in 0..grants.len() {
        sum += grants[end].1;
        while grants[end].0 - grants[start].0 >= chrono::Duration::seconds(1) {
            sum -= grants[start].1;
            start += 1;
        }
        most = most.max(sum);
    }
    most
}

/// Eight claimers on two replicas over keys capped at `KEY_CAP`, until
/// `claims` claims were made: (samples above the cap, the most in flight
/// seen for one key, samples taken, claims made, seconds the claims took).
async fn capped(admin_url: &str, claims: u64) -> (u64, i64, u64, u64, f64) {
    let db = ScratchDb::create(admin_url, "admcap").await;
    let one = Service::start(&db.url).await;
    let two = Service::start(&db.url).await;
    set_limits(&one.base, "cap", json!({"per_key": {"max_in_flight": KEY_CAP}})).await;
    // Enough for every claim to take a few.
    register(&one.base, "cap", (claims * 4) as usize, PARENTS, true).await;
    settle(&db.url).await;
    let made = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
    let started = Instant::now();
    let sampler = {
        let (url, done) = (db.url.clone(), Arc::clone(&done));
        tokio::spawn(async move {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            let (mut over, mut most, mut samples) = (0u64, 0i64, 0u64);
            while !done.load(Ordering::Relaxed) {
                let rows: Vec<(String, i64)> = sqlx::query_as(
                    "SELECT flow_key, sum(open)::bigint FROM claim_lease \
                     WHERE queue = 'cap' AND expires_at > now() GROUP BY flow_key",
                )
                .fetch_all(&mut conn)
                .await
                .unwrap();
                samples += 1;
                let top = rows.iter().map(|(_, n)| *n).max().unwrap_or(0);
                most = most.max(top);
                over += u64::from(top > KEY_CAP);
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (over, most, samples)
        })
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let base = if w % 2 == 0 { one.base.clone() } else { two.base.clone() };
            let (client, made) = (client.clone(), Arc::clone(&made));
            tokio::spawn(async move {
                let claim_url = format!("{base}/v1/queues/cap/claims");
                let outcomes_url = format!("{base}/v1/outcomes");
                while made.fetch_add(1, Ordering::Relaxed) < claims {
                    let reply = client
                        .post(&claim_url)
                        .json(&json!({"limit": 4, "lease_seconds": 600}))
                        .send()
                        .await
                        .unwrap();
                    assert!(reply.status().is_success(), "claim: {}", reply.status());
                    let claim: ClaimReply = serde_json::from_slice(&reply.bytes().await.unwrap()).unwrap();
                    if !claim.children.is_empty() {
                        post_processed(&client, &outcomes_url, claim.claim_id, &claim.children).await;
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let (over, most, samples) = sampler.await.unwrap();
    one.stop().await;
    two.stop().await;
    db.drop_now().await;
    (over, most, samples, claims, seconds)
}

pub(super) async fn admission_scenarios(admin_url: &str, n: usize, claims: u64) -> Vec<Scenario> {
    eprintln!("admission.unbound: a keyed burn-down of {n}, no limits, limits that never bind, no limits ...");
    let high = json!({"max_in_flight": 1_000_000_000, "per_second": 1_000_000, "burst": 1_000_000_000,
        "per_key": {"max_in_flight": 1_000_000_000, "per_second": 1_000_000, "burst": 1_000_000_000}});
    let before = keyed_burn(admin_url, "admfree", n, None).await;
    let bound = keyed_burn(admin_url, "admhigh", n, Some(high.clone())).await;
    let after = keyed_burn(admin_url, "admfree2", n, None).await;
    eprintln!("admission.unbound: no limits: {before}\n  limits that never bind: {bound}\n  no limits again: {after}");
    let unlimited = Burn::mean(before, after);
    let free = unlimited.rate;

    eprintln!("admission.unbound.node_mixed: big and small parents over 20 keys, the Node worker, {n} children ...");
    let node_before = mixed_node_burn(admin_url, "admnode", n, None).await;
    let node_bound = mixed_node_burn(admin_url, "admnodehigh", n, Some(high)).await;
    let node_after = mixed_node_burn(admin_url, "admnode2", n, None).await;
    eprintln!(
        "admission.unbound.node_mixed: no limits: {node_before}\n  limits that never bind: {node_bound}\n  no limits again: {node_after}"
    );
    let node_free = Burn::mean(node_before, node_after);

    let rate = (free / 5.0).round().max(10.0);
    let burst = (rate / 10.0).round().max(1.0);
    let wanted = (rate * 10.0) as usize;
    eprintln!("admission.rate: {wanted} children at {rate}/s (burst {burst}) ...");
    let started = Instant::now();
    let grants = metered(admin_url, rate, burst, wanted).await;
    let claimed: i64 = grants.iter().map(|(_, n)| n).sum();
    let span = grants
        .last()
        .zip(grants.first())
        .map(|(last, first)| (last.0 - first.0).num_microseconds().unwrap_or(0) as f64 / 1e6)
        .unwrap_or(0.0);
    let measured = (claimed as f64 - burst) / span;
    let busiest = busiest_second(&grants);
    eprintln!(
        "admission.rate: {claimed} claimed in {span:.2} s by the database's clock ({:.1} s in all): {measured:.1}/s; \
         busiest second {busiest} (burst + rate = {})",
        started.elapsed().as_secs_f64(),
        burst + rate
    );

    eprintln!("admission.cap_violations: {claims} claims by 8 workers on 2 replicas, keys capped at {KEY_CAP} ...");
    let (over, most, samples, made, seconds) = capped(admin_url, claims).await;
    eprintln!(
        "admission.cap_violations: {made} claims in {seconds:.1} s ({:.0}/s), {samples} samples ({:.0}/s), \
         {over} above the cap, most seen in flight for a key {most}",
        made as f64 / seconds,
        samples as f64 / seconds
    );
    vec![
        Scenario::new("admission.unbound", "children/s", bound.rate)
            .against("the same burn-down, no limits", free)
            .target(">= 0.9"),
        Scenario::new("admission.unbound.cpu", "CPU µs per child, machine", bound.machine_us)
            .against("the same burn-down, no limits", unlimited.machine_us)
            .target("<= 1.11"),
        Scenario::new("admission.unbound.node_mixed", "children/s", node_bound.rate)
            .against("the same burn-down, no limits", node_free.rate)
            .target(">= 0.9"),
        Scenario::new("admission.unbound.node_mixed.cpu", "CPU µs per child, machine", node_bound.machine_us)
            .against("the same burn-down, no limits", node_free.machine_us)
            .target("<= 1.11"),
        Scenario::new("admission.unbound.postgres_cpu", "CPU µs per child, Postgres", bound.postgres_us)
            .against("the same burn-down, no limits", unlimited.postgres_us)
            .target("<= 1.11"),
        Scenario::new("admission.rate", "children/s", measured)
            .against("per_second", rate)
            .target(">= 0.95"),
        Scenario::new("admission.rate_at_most", "children/s", measured)
            .against("per_second", rate)
            .target("<= 1.05"),
        Scenario::new("admission.rate_busiest_second", "children", busiest as f64)
            .against("burst + per_second", burst + rate)
            .target("<= 1.0"),
        Scenario::new(
            "admission.cap_violations",
            &format!(
                "samples above the cap ({samples} samples over {made} claims in {seconds:.0} s; most in flight for a key {most}, cap {KEY_CAP})"
            ),
            over as f64,
        )
        .target("<= 0 samples"),
    ]
}
