//! Prometheus metrics, kept in process and rendered as text at `/metrics`.
//!
//! Counters are keyed by their label values; a request takes one short lock
//! per family it touches. Pool gauges are read from the store when rendered.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::store::PoolStats;

/// How many queue label values are kept by default (`--max-metric-queues`).
pub const DEFAULT_MAX_QUEUES: usize = 100;

/// The queue label of every queue past the first `max_queues`.
const OTHER_QUEUES: &str = "other";

/// Upper bounds (seconds) of the request duration histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    /// Observations at or below each bound (not cumulative until rendered).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|&bound| seconds <= bound) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// What one method and route template answered: counts by status, and times.
#[derive(Debug, Default)]
struct RouteStats {
    statuses: BTreeMap<u16, u64>,
    duration: Histogram,
}

/// The long polls of this process: waiting now, and woken since it started.
#[derive(Debug, Default, Clone, Copy)]
pub struct WaitingClaims {
    pub waiting: usize,
    pub woken_total: u64,
}

#[derive(Debug)]
pub struct Metrics {
    /// By method, then route template: one lock and, once a route has been
    /// seen, no allocation per request.
    routes: Mutex<BTreeMap<&'static str, BTreeMap<String, RouteStats>>>,
    claimed: Mutex<BTreeMap<String, u64>>,
    /// Most queue label values kept; later queues are counted as `other`.
    max_queues: usize,
    outcomes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    auth_failures: Mutex<BTreeMap<&'static str, u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::with_max_queues(DEFAULT_MAX_QUEUES)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// One answered request, under its route template (never the raw path).
    /// Methods outside HTTP's standard set are counted as `OTHER`, so a client
    /// cannot grow the label set without bound.
    pub fn request(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let method = match method {
            "GET" => "GET",
            "HEAD" => "HEAD",
            "POST" => "POST",
            "PUT" => "PUT",
            "PATCH" => "PATCH",
            "DELETE" => "DELETE",
            "OPTIONS" => "OPTIONS",
            "TRACE" => "TRACE",
            "CONNECT" => "CONNECT",
            _ => "OTHER",
        };
        let mut routes = lock(&self.routes);
        let by_route = routes.entry(method).or_default();
        let stats = match by_route.get_mut(route) {
            Some(stats) => stats,
            None => by_route.entry(route.to_owned()).or_default(),
        };
        *stats.statuses.entry(status).or_default() += 1;
        stats.duration.observe(elapsed.as_secs_f64());
    }

    /// Metrics whose queue label takes at most `max_queues` values besides `other`.
    pub fn with_max_queues(max_queues: usize) -> Self {
        Self {
            routes: Mutex::default(),
            claimed: Mutex::default(),
            max_queues: max_queues.max(1),
            outcomes: Mutex::default(),
            auth_failures: Mutex::default(),
        }
    }

    /// Children handed out by a claim, by the queue of their parent. Queue
    /// names come from callers: past the first `max_queues` seen, they are
    /// counted under `other`, so the label set stays bounded.
    pub fn claimed(&self, queue: &str, children: usize) {
        if children == 0 {
            return;
        }
        let mut claimed = lock(&self.claimed);
        let label = if claimed.contains_key(queue) || claimed.len() < self.max_queues {
            queue
        } else {
            OTHER_QUEUES
        };
        *claimed.entry(label.to_owned()).or_default() += children as u64;
    }

    /// One outcome write and what became of it (`applied`, `duplicate`, ...).
    pub fn outcome(&self, outcome: &'static str, status: &'static str) {
        *lock(&self.outcomes).entry((outcome, status)).or_default() += 1;
    }

    /// A request refused by access control, by why (`missing`, `malformed`,
    /// `unknown`, `forbidden`, `outside_queues`): a fixed set, never the token.
    pub fn auth_failure(&self, reason: &'static str) {
        *lock(&self.auth_failures).entry(reason).or_default() += 1;
    }

    /// Prometheus text exposition format 0.0.4.
    /// `leases_expired` is the store's count of children whose lease ran out
    /// and were swept back to pending (or held, or failed) by this process;
    /// `parents_completed` its count of parents this process completed;
    /// `claims` the long polls waiting now and woken so far.
    pub fn render(
        &self,
        pools: &[PoolStats],
        leases_expired: u64,
        parents_completed: u64,
        claims: WaitingClaims,
    ) -> String {
        let mut out = String::with_capacity(4096);
        family(
            &mut out,
            "child_ledger_http_requests_total",
            "counter",
            "HTTP requests answered, by method, route template and status.",
        );
        let routes = lock(&self.routes);
        let each_route = || {
            routes
                .iter()
                .flat_map(|(method, by_route)| by_route.iter().map(move |(route, stats)| (method, route, stats)))
        };
        for (method, route, stats) in each_route() {
            for (status, n) in &stats.statuses {
                let _ = writeln!(
                    out,
                    "child_ledger_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }

        family(
            &mut out,
            "child_ledger_http_request_duration_seconds",
            "histogram",
            "Time from request to response, by method and route template.",
        );
        for (method, route, stats) in each_route() {
            let h = &stats.duration;
            let labels = format!("method=\"{method}\",route=\"{}\"", escape(route));
            let mut cumulative = 0;
            for (bound, n) in BUCKETS.iter().zip(h.buckets) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "child_ledger_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
            let _ = writeln!(
                out,
                "child_ledger_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "child_ledger_http_request_duration_seconds_sum{{{labels}}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "child_ledger_http_request_duration_seconds_count{{{labels}}} {}",
                h.count
            );
        }
        drop(routes);

        family(
            &mut out,
            "child_ledger_children_claimed_total",
            "counter",
            "Children handed out by claims, by the queue of their parent.",
        );
        for (queue, n) in lock(&self.claimed).iter() {
            let _ = writeln!(
                out,
                "child_ledger_children_claimed_total{{queue=\"{}\"}} {n}",
                escape(queue)
            );
        }

        family(
            &mut out,
            "child_ledger_outcomes_total",
            "counter",
            "Outcome writes, by outcome and by what became of them (applied, duplicate, conflict, claim_mismatch, not_found, not_decomposed).",
        );
        for ((outcome, status), n) in lock(&self.outcomes).iter() {
            let _ = writeln!(
                out,
                "child_ledger_outcomes_total{{outcome=\"{outcome}\",status=\"{status}\"}} {n}"
            );
        }

        family(
            &mut out,
            "child_ledger_auth_failures_total",
            "counter",
            "Requests refused by access control, by reason (missing, malformed, unknown, forbidden, outside_queues).",
        );
        for (reason, n) in lock(&self.auth_failures).iter() {
            let _ = writeln!(out, "child_ledger_auth_failures_total{{reason=\"{reason}\"}} {n}");
        }

        family(
            &mut out,
            "child_ledger_leases_expired_total",
            "counter",
            "Children whose lease ran out, swept by this process.",
        );
        let _ = writeln!(out, "child_ledger_leases_expired_total {leases_expired}");

        family(
            &mut out,
            "child_ledger_parents_completed_total",
            "counter",
            "Parents whose completion this process committed (an outcome, a sweep, a seal, a reconcile).",
        );
        let _ = writeln!(out, "child_ledger_parents_completed_total {parents_completed}");

        family(
            &mut out,
            "child_ledger_waiting_claims",
            "gauge",
            "Long-poll claims waiting for work in this process now.",
        );
        let _ = writeln!(out, "child_ledger_waiting_claims {}", claims.waiting);
        family(
            &mut out,
            "child_ledger_claim_wakeups_total",
            "counter",
            "Waiting claims woken by new work (as many as the work covers, not all of them).",
        );
        let _ = writeln!(out, "child_ledger_claim_wakeups_total {}", claims.woken_total);

        family(
            &mut out,
            "child_ledger_db_pool_connections",
            "gauge",
            "Open database connections, by pool and state (idle or in use).",
        );
        for pool in pools {
            let _ = writeln!(
                out,
                "child_ledger_db_pool_connections{{pool=\"{}\",state=\"idle\"}} {}",
                pool.name, pool.idle
            );
            let _ = writeln!(
                out,
                "child_ledger_db_pool_connections{{pool=\"{}\",state=\"in_use\"}} {}",
                pool.name,
                pool.size.saturating_sub(pool.idle)
            );
        }
        family(
            &mut out,
            "child_ledger_db_pool_max_connections",
            "gauge",
            "The most connections each pool opens.",
        );
        for pool in pools {
            let _ = writeln!(
                out,
                "child_ledger_db_pool_max_connections{{pool=\"{}\"}} {}",
                pool.name, pool.max
            );
        }
        out
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escapes a label value (routes and queues are already restricted, but a
/// label must never break the exposition format).
fn escape(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_in_inf() {
        let metrics = Metrics::default();
        for ms in [0.5, 3.0, 3.0, 200.0, 40_000.0] {
            metrics.request(
                "GET",
                "/v1/parents/{parent_id}",
                200,
                Duration::from_secs_f64(ms / 1000.0),
            );
        }
        let text = metrics.render(&[], 0, 0, WaitingClaims::default());
        let bucket = |le: &str| {
            let prefix = format!(
                "child_ledger_http_request_duration_seconds_bucket{{method=\"GET\",route=\"/v1/parents/{{parent_id}}\",le=\"{le}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
                .parse::<u64>()
                .unwrap()
        };
        assert_eq!(bucket("0.001"), 1);
        assert_eq!(bucket("0.005"), 3);
        assert_eq!(bucket("0.25"), 4);
        assert_eq!(bucket("30"), 4);
        assert_eq!(bucket("+Inf"), 5);
        assert!(text.contains(
            "child_ledger_http_request_duration_seconds_count{method=\"GET\",route=\"/v1/parents/{parent_id}\"} 5"
        ));
        assert!(text.contains(
            "child_ledger_http_requests_total{method=\"GET\",route=\"/v1/parents/{parent_id}\",status=\"200\"} 5"
        ));
    }

    #[test]
    fn counters_and_gauges_render_with_their_labels() {
        let metrics = Metrics::default();
        metrics.claimed("events", 3);
        metrics.claimed("events", 0);
        metrics.outcome("processed", "applied");
        metrics.outcome("processed", "applied");
        metrics.outcome("failed", "conflict");
        metrics.request("FOO1", "unmatched", 405, Duration::ZERO);
        metrics.request("FOO2", "unmatched", 405, Duration::ZERO);
        let pools = [PoolStats {
            name: "postgres",
            size: 5,
            idle: 2,
            max: 16,
        }];
        let text = metrics.render(
            &pools,
            4,
            2,
            WaitingClaims {
                waiting: 3,
                woken_total: 7,
            },
        );
        for line in [
            "child_ledger_children_claimed_total{queue=\"events\"} 3",
            "child_ledger_outcomes_total{outcome=\"processed\",status=\"applied\"} 2",
            "child_ledger_outcomes_total{outcome=\"failed\",status=\"conflict\"} 1",
            "child_ledger_leases_expired_total 4",
            "child_ledger_parents_completed_total 2",
            "child_ledger_http_requests_total{method=\"OTHER\",route=\"unmatched\",status=\"405\"} 2",
            "child_ledger_db_pool_connections{pool=\"postgres\",state=\"idle\"} 2",
            "child_ledger_db_pool_connections{pool=\"postgres\",state=\"in_use\"} 3",
            "child_ledger_db_pool_max_connections{pool=\"postgres\"} 16",
            "# TYPE child_ledger_http_request_duration_seconds histogram",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }
}
