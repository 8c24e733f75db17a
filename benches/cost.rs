//! `cost.*`: what one child costs, from its registration to its outcome, in
//! CPU (from `/proc`), WAL and buffers, with a plain Node `fetch` worker as
//! the client (`peers/ledger.mjs`), beside graphile-worker draining as many
//! jobs. CPU time is far steadier than throughput on a shared machine, so it
//! is the figure that counts; throughput is shown beside it.
//!
//! Each run measures one window on a fresh database:
//! - ours: the service starts; two parents of half the children each are
//!   registered, the database is settled (`VACUUM ANALYZE`, `CHECKPOINT`),
//!   and the Node worker drains the queue; then a `CHECKPOINT` writes back
//!   what the run dirtied;
//! - graphile-worker: its script enqueues, settles and drains as many jobs.
//!
//! and reports, per child: CPU µs of the whole machine, of the service, of
//! every Postgres process (backends and background writers alike, exited
//! ones included through the postmaster's account of its children) and of the
//! client; WAL bytes (`pg_current_wal_lsn`); buffers written by checkpoints,
//! the background writer and backends (`pg_stat_bgwriter`): the buffers the
//! run dirtied; and the share of updates that were HOT.

use std::path::Path;
use std::process::Stdio;
use std::time::Instant;

use serde::Deserialize;
use sqlx::Connection;

use super::{ScratchDb, Service, register, settle};

/// Clock ticks per second of `/proc`'s CPU times (`sysconf(_SC_CLK_TCK)`,
/// 100 on Linux).
pub(super) const TICK_US: f64 = 10_000.0;

/// CPU ticks of a `/proc/<pid>/stat` line: utime, stime, cutime, cstime.
fn stat_ticks(stat: &str) -> Option<(u64, u64)> {
    // The command may hold spaces and parentheses: the fields follow the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let n = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // Field 14 of the whole line is utime: index 11 after the state field.
    Some((n(11) + n(12), n(13) + n(14)))
}

pub(super) fn process_ticks(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0, |(own, _)| own)
}

/// CPU of the children this process has waited for (the Node clients).
fn waited_children_ticks() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0, |(_, children)| children)
}

/// CPU of every Postgres process, and of those that exited (the postmaster's
/// waited-for children).
pub(super) fn postgres_ticks() -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if comm.trim() != "postgres" {
            continue;
        }
        if let Some((own, children)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| stat_ticks(&s))
        {
            total += own + children;
        }
    }
    total
}

/// Busy ticks of the whole machine (everything but idle and iowait).
pub(super) fn machine_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or_default();
    let fields: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal
    fields
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .take(7)
        .map(|(_, v)| v)
        .sum()
}

/// What the machine, Postgres and the WAL stood at.
#[derive(Debug, Clone, Copy)]
struct Reading {
    machine: u64,
    postgres: u64,
    clients: u64,
    service: u64,
    wal_lsn: f64,
    buffers_written: f64,
}

async fn wal_and_buffers(admin_url: &str) -> (f64, f64) {
    let mut admin = sqlx::PgConnection::connect(admin_url).await.unwrap();
    let (lsn, buffers): (f64, f64) = sqlx::query_as(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8, \
         (buffers_checkpoint + buffers_clean + buffers_backend)::float8 FROM pg_stat_bgwriter",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    (lsn, buffers)
}

/// Writes out what the server holds dirty (`CHECKPOINT`: it is the whole
/// server's, whichever database `url` names).
pub(super) async fn checkpoint(url: &str) {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("CHECKPOINT").execute(&mut conn).await.unwrap();
}

async fn read(admin_url: &str, service: Option<u32>) -> Reading {
    let (wal_lsn, buffers_written) = wal_and_buffers(admin_url).await;
    Reading {
        machine: machine_ticks(),
        postgres: postgres_ticks(),
        clients: waited_children_ticks(),
        service: service.map_or(0, process_ticks),
        wal_lsn,
        buffers_written,
    }
}

/// One run's cost per child.
#[derive(Debug, Clone, Default)]
pub(super) struct Cost {
    pub children_per_second: f64,
    pub machine_us: f64,
    pub service_us: f64,
    pub postgres_us: f64,
    pub client_us: f64,
    pub wal_bytes: f64,
    pub buffers: f64,
    /// HOT updates among all updates of the ledger's (or the peer's) tables.
    pub hot_share: f64,
    /// Updates of the table of children (or jobs) per child.
    pub updates: f64,
}

impl Cost {
    fn between(before: Reading, after: Reading, children: u64) -> Self {
        let per = |ticks: u64| ticks as f64 * TICK_US / children as f64;
        Self {
            machine_us: per(after.machine - before.machine),
            service_us: per(after.service.saturating_sub(before.service)),
            postgres_us: per(after.postgres.saturating_sub(before.postgres)),
            client_us: per(after.clients - before.clients),
            wal_bytes: (after.wal_lsn - before.wal_lsn) / children as f64,
            buffers: (after.buffers_written - before.buffers_written) / children as f64,
            ..Self::default()
        }
    }

    /// The mean of two runs of the same measure, figure by figure.
    pub fn mean(a: &Self, b: &Self) -> Self {
        let m = |x: f64, y: f64| (x + y) / 2.0;
        Self {
            children_per_second: m(a.children_per_second, b.children_per_second),
            machine_us: m(a.machine_us, b.machine_us),
            service_us: m(a.service_us, b.service_us),
            postgres_us: m(a.postgres_us, b.postgres_us),
            client_us: m(a.client_us, b.client_us),
            wal_bytes: m(a.wal_bytes, b.wal_bytes),
            buffers: m(a.buffers, b.buffers),
            hot_share: m(a.hot_share, b.hot_share),
            updates: m(a.updates, b.updates),
        }
    }

    pub fn line(&self, what: &str) -> String {
        format!(
            "{what}: {:.0} children/s; CPU µs per child: machine {:.1}, service {:.1}, postgres {:.1}, client {:.1}; \
             WAL {:.0} B, {:.2} buffers written, {:.2} updates ({:.0}% HOT) per child",
            self.children_per_second,
            self.machine_us,
            self.service_us,
            self.postgres_us,
            self.client_us,
            self.wal_bytes,
            self.buffers,
            self.updates,
            self.hot_share * 100.0
        )
    }
}

#[derive(Debug, Deserialize)]
pub(super) struct NodeResult {
    pub children_per_second: f64,
}

/// How the Node worker reports a chunk's outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loop {
    /// A claim, then its outcomes as one batch (`POST /v1/outcomes`): two
    /// requests per chunk.
    TwoRequests,
    /// Each chunk's outcomes go with the next claim (its `outcomes`), as
    /// examples/node/worker.mjs sends them: one request per chunk.
    OneRequest,
}

/// Runs the Node worker of `peers/ledger.mjs` to the end.
pub(super) async fn node_worker(base: &str, queue: &str, batch: usize, children: usize) -> NodeResult {
    node_loop(base, queue, batch, children, Loop::TwoRequests).await
}

/// Runs the Node worker of `peers/ledger.mjs` to the end, its loop `how`.
pub(super) async fn node_loop(base: &str, queue: &str, batch: usize, children: usize, how: Loop) -> NodeResult {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers");
    let one_request = (how == Loop::OneRequest).then_some("--one-request");
    let output = tokio::process::Command::new("node")
        .args([
            "ledger.mjs",
            "--base",
            base,
            "--queue",
            queue,
            "--batch",
            &batch.to_string(),
            "--concurrency",
            &super::WORKERS.to_string(),
            "--children",
            &children.to_string(),
        ])
        .args(one_request)
        .current_dir(&dir)
        .stderr(Stdio::inherit())
        .output()
        .await
        .expect("node");
    assert!(output.status.success(), "the Node worker failed: {}", output.status);
    let line = String::from_utf8_lossy(&output.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .to_owned();
    serde_json::from_str(&line).expect("the Node worker's result line")
}

/// Our cost on Postgres: `children` over two parents, claims of `batch`,
/// the service being `bin` (this build, or an older one to compare with),
/// the Node worker's loop `how`.
pub(super) async fn ours_on_postgres(
    admin_url: &str,
    bin: Option<&str>,
    children: usize,
    batch: usize,
    how: Loop,
) -> Cost {
    let db = ScratchDb::create(admin_url, "cost").await;
    let service = Service::start_bin(bin, &db.url, &[]).await;
    let client = reqwest::Client::new();
    checkpoint(admin_url).await;
    let before = read(admin_url, Some(service.pid)).await;
    let half = children / 2;
    register(&client, &service.base, "cost-a", "cost", half).await;
    register(&client, &service.base, "cost-b", "cost", children - half).await;
    settle(&db.url).await;
    let started = Instant::now();
    let node = node_loop(&service.base, "cost", batch, children, how).await;
    let drained = started.elapsed();
    checkpoint(admin_url).await;
    let after = read(admin_url, Some(service.pid)).await;
    service.stop().await;
    // The service's connections are closed: their statistics are flushed.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let (updates, hot, child_updates): (f64, f64, f64) = sqlx::query_as(
        "SELECT coalesce(sum(n_tup_upd), 0)::float8, coalesce(sum(n_tup_hot_upd), 0)::float8, \
             coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'child'), 0)::float8 \
         FROM pg_stat_user_tables",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    drop(conn);
    db.drop_now().await;
    let mut cost = Cost::between(before, after, children as u64);
    cost.children_per_second = node.children_per_second.min(children as f64 / drained.as_secs_f64());
    cost.hot_share = if updates > 0.0 { hot / updates } else { 0.0 };
    cost.updates = child_updates / children as f64;
    cost
}

/// Our cost on SQLite, the same run: the service's CPU is all of it.
pub(super) async fn ours_on_sqlite(children: usize, batch: usize, how: Loop) -> Cost {
    let dir = std::env::temp_dir().join(format!("ledger-bench-cost-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ledger.db");
    let service = Service::start_bin(None, &format!("sqlite://{}", path.display()), &[]).await;
    let client = reqwest::Client::new();
    let service_before = process_ticks(service.pid);
    let (machine_before, clients_before) = (machine_ticks(), waited_children_ticks());
    let half = children / 2;
    register(&client, &service.base, "cost-a", "cost", half).await;
    register(&client, &service.base, "cost-b", "cost", children - half).await;
    super::settle_sqlite(&path).await;
    let started = Instant::now();
    let node = node_loop(&service.base, "cost", batch, children, how).await;
    let drained = started.elapsed();
    let per = |ticks: u64| ticks as f64 * TICK_US / children as f64;
    let cost = Cost {
        children_per_second: node.children_per_second.min(children as f64 / drained.as_secs_f64()),
        machine_us: per(machine_ticks() - machine_before),
        service_us: per(process_ticks(service.pid) - service_before),
        client_us: per(waited_children_ticks() - clients_before),
        ..Cost::default()
    };
    service.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
    cost
}

#[derive(Debug, Deserialize)]
struct GraphileResult {
    version: String,
    jobs_per_second: f64,
    table_stats: GraphileStats,
}

#[derive(Debug, Deserialize)]
struct GraphileStats {
    updates: f64,
    hot_updates: f64,
}

/// graphile-worker's cost for as many jobs, with a local queue of `batch`.
pub(super) async fn graphile(admin_url: &str, jobs: usize, batch: usize) -> Option<(String, Cost)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers");
    if !dir.join("node_modules").exists() {
        let status = tokio::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&dir)
            .status()
            .await;
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!("npm ci failed in {}: graphile-worker skipped", dir.display());
            return None;
        }
    }
    checkpoint(admin_url).await;
    let before = read(admin_url, None).await;
    let output = tokio::process::Command::new("node")
        .args([
            "graphile.mjs",
            "--database-url",
            admin_url,
            "--jobs",
            &jobs.to_string(),
            "--concurrency",
            &super::WORKERS.to_string(),
        ])
        .env("GRAPHILE_LOCAL_QUEUE", batch.to_string())
        .env("GRAPHILE_CHECKPOINT_AFTER", "1")
        .current_dir(&dir)
        .stderr(Stdio::inherit())
        .output()
        .await
        .ok()?;
    let after = read(admin_url, None).await;
    if !output.status.success() {
        eprintln!("graphile.mjs failed: {}", output.status);
        return None;
    }
    let line = String::from_utf8_lossy(&output.stdout).lines().last()?.to_owned();
    let result: GraphileResult = serde_json::from_str(&line).ok()?;
    let mut cost = Cost::between(before, after, jobs as u64);
    cost.children_per_second = result.jobs_per_second;
    let stats = result.table_stats;
    cost.hot_share = if stats.updates > 0.0 {
        stats.hot_updates / stats.updates
    } else {
        0.0
    };
    cost.updates = stats.updates / jobs as f64;
    Some((format!("graphile-worker {}", result.version), cost))
}
