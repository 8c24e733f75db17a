//! `results.*`, `summary.*`, `redrive.*` and `tolerance.*` (`--verdicts-only`,
//! and the full run): a parent's answers once it completes.
//!
//! - `results.export_1m`: one parent of 1,000,000 failed children (results
//!   of about 60 bytes, 30 reasons), its results streamed as NDJSON and read
//!   to the end: rows/s, target >= 50,000; and the service's resident memory
//!   while it streams, above its idle level (sampled every 20 ms from
//!   `/proc`), target <= 64 MiB. `results.export_1m.gzip` the same, gzipped.
//! - `summary.1m`: the summary of that parent (counts and the 20 most
//!   frequent reasons counted from 1,000,000 rows), the median of 5, ms;
//!   target <= 200 ms.
//! - `redrive.1m`: every failed child of it redriven into a new parent in
//!   one request, s; target <= 60 s, within the request timeout.
//! - `tolerance.burn_down`: a burn-down (2 parents, the plain Node `fetch`
//!   worker, claims of 500) of parents registered with a tolerance, against
//!   the same without, alternated twice, fresh databases: its outcome
//!   batches each run in a transaction, and the one that crosses takes the
//!   lane's lock. Target >= 0.95.
//!
//! The 1,000,000 rows are written by SQL (`generate_series`) into a parent
//! registered decomposing, then sealed through the API, which counts them,
//! and reconciled, which counts their reasons (`reconcile.1m`, s).

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use sqlx::Connection;

use super::{Scenario, ScratchDb, Service, settle};

const QUEUE: &str = "verdicts";

/// Resident memory of a process now, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// Parent `parent` with `n` failed children written by SQL, then sealed and
/// reconciled: how long the reconcile took, s.
async fn fill_failed(client: &reqwest::Client, base: &str, url: &str, parent: &str, n: i64) -> f64 {
    let r = client
        .put(format!("{base}/v1/parents/{parent}"))
        .json(&json!({"queue": QUEUE, "children": [], "decomposed": false}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "register {parent}: {}", r.status());
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(
        "INSERT INTO child (parent_id, sequence, key, payload, state, reason, result, terminal_at, changed_at, \
             outcome_attempt, attempts) \
         SELECT $1, g, 'key-' || g, json_build_object('event', g, 'source', 'bench'), 'failed', \
             'remote said ' || (500 + g % 30), json_build_object('status', 500 + g % 30, 'attempt', 1, 'took_ms', g % 997), \
             now(), now(), 1, 1 \
         FROM generate_series(0, $2 - 1) AS g",
    )
    .bind(parent)
    .bind(n)
    .execute(&mut conn)
    .await
    .unwrap();
    drop(conn);
    let r = client
        .post(format!("{base}/v1/parents/{parent}/seal"))
        .json(&json!({"total": n}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "seal {parent}: {}", r.status());
    // The reason counts the summary reads were not written with the rows:
    // reconcile counts them, as it would after any repair by hand.
    let started = Instant::now();
    let r = client
        .post(format!("{base}/v1/parents/{parent}/reconcile"))
        .json(&json!({"dry_run": false}))
        .send()
        .await
        .unwrap();
    let report: Value = r.json().await.unwrap();
    assert_eq!(report["changes"][0]["field"], "reasons", "{report}");
    started.elapsed().as_secs_f64()
}

/// Streams a parent's results to the end: rows, seconds, and the peak
/// resident memory of the service above `idle` while it ran.
async fn export(client: &reqwest::Client, service: &Service, parent: &str, gzip: bool) -> (u64, f64, f64) {
    let idle = rss_mib(service.pid);
    let pid = service.pid;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        tokio::spawn(async move {
            let mut peak: f64 = 0.0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_mib(pid));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            peak
        })
    };
    let started = Instant::now();
    let mut request = client.get(format!("{}/v1/parents/{parent}/results", service.base));
    if gzip {
        request = request.header("accept-encoding", "gzip");
    }
    let response = request.send().await.unwrap();
    assert!(response.status().is_success(), "results: {}", response.status());
    let mut body = response.bytes_stream();
    let mut raw = Vec::new();
    let mut lines = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        if gzip {
            raw.extend_from_slice(&chunk);
        } else {
            lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        }
    }
    if gzip {
        use std::io::Read;
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut text)
            .unwrap();
        lines = text.iter().filter(|b| **b == b'\n').count() as u64;
    }
    let took = started.elapsed().as_secs_f64();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.await.unwrap();
    (lines, took, peak - idle)
}

/// Two parents of `n / 2` children (with `extra` in their registrations),
/// burned down by the Node worker with claims of 500: children/s.
async fn burn_down(admin_url: &str, n: usize, extra: &Value) -> f64 {
    let db = ScratchDb::create(admin_url, "tolerance").await;
    let service = Service::start(&db.url).await;
    let client = reqwest::Client::new();
    for (name, count) in [("tol-a", n / 2), ("tol-b", n - n / 2)] {
        let children: Vec<Value> = (0..count)
            .map(
                |i| json!({"payload": {"event": i, "source": "bench", "body": "abcdefghijklmnopqrstuvwxyz0123456789"}}),
            )
            .collect();
        let mut body = json!({"queue": "tol", "children": children});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = client
            .put(format!("{}/v1/parents/{name}", service.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "register {name}: {}", r.status());
    }
    settle(&db.url).await;
    let started = Instant::now();
    let node = super::cost::node_worker(&service.base, "tol", 500, n).await;
    let rate = node.children_per_second.min(n as f64 / started.elapsed().as_secs_f64());
    service.stop().await;
    db.drop_now().await;
    rate
}

pub(super) async fn verdicts_scenarios(admin_url: &str, children: i64, burn: usize) -> Vec<Scenario> {
    let mut scenarios = Vec::new();
    let db = ScratchDb::create(admin_url, "verdicts").await;
    let service = Service::start(&db.url).await;
    let client = reqwest::Client::new();
    let label = if children >= 1_000_000 {
        format!("{}m", children / 1_000_000)
    } else {
        format!("{}k", children / 1000)
    };
    eprintln!("verdicts: {children} failed children ...");
    let reconcile = fill_failed(&client, &service.base, &db.url, "V", children).await;
    scenarios.push(Scenario::new(&format!("reconcile.{label}"), "s", reconcile));
    settle(&db.url).await;

    let (rows, took, above_idle) = export(&client, &service, "V", false).await;
    assert_eq!(rows, children as u64, "every child exported");
    eprintln!("results: {rows} rows in {took:.2} s, {above_idle:.1} MiB above idle");
    scenarios.push(Scenario::new(&format!("results.export_{label}"), "rows/s", rows as f64 / took).target(">= 50000"));
    scenarios.push(Scenario::new(&format!("results.export_{label}.rss_above_idle"), "MiB", above_idle).target("<= 64"));
    let (rows, took, above_idle) = export(&client, &service, "V", true).await;
    assert_eq!(rows, children as u64, "every child exported");
    scenarios.push(Scenario::new(
        &format!("results.export_{label}.gzip"),
        "rows/s",
        rows as f64 / took,
    ));
    scenarios.push(Scenario::new(
        &format!("results.export_{label}.gzip.rss_above_idle"),
        "MiB",
        above_idle,
    ));

    let mut times = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let r = client
            .get(format!("{}/v1/parents/V/summary", service.base))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
        let summary: Value = r.json().await.unwrap();
        times.push(started.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(summary["reasons"].as_array().unwrap().len(), 20);
    }
    times.sort_by(f64::total_cmp);
    scenarios.push(Scenario::new(&format!("summary.{label}"), "ms", times[2]).target("<= 200"));

    let started = Instant::now();
    let r = client
        .post(format!("{}/v1/parents/V/redrive", service.base))
        .json(&json!({"into": "V-r1", "states": ["failed"]}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: Value = r.json().await.unwrap();
    let took = started.elapsed().as_secs_f64();
    assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
    assert_eq!(body["children"], children);
    scenarios.push(Scenario::new(&format!("redrive.{label}"), "s", took).target("<= 60"));
    service.stop().await;
    db.drop_now().await;

    eprintln!("tolerance: burn-downs of {burn} children with and without a tolerance ...");
    let with = json!({"tolerated_failures": {"percent": 50.0}});
    let without = json!({});
    let mut runs = (Vec::new(), Vec::new());
    for _ in 0..2 {
        runs.0.push(burn_down(admin_url, burn, &without).await);
        runs.1.push(burn_down(admin_url, burn, &with).await);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!("tolerance: without {:?}, with {:?}", runs.0, runs.1);
    scenarios.push(
        Scenario::new("tolerance.burn_down", "children/s", mean(&runs.1))
            .against("the same without a tolerance", mean(&runs.0))
            .target(">= 0.95"),
    );
    scenarios
}
