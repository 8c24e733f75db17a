//! Prometheus metrics, kept in process with the Prometheus project's client
//! (`prometheus-client`) and rendered at `/metrics` in the Prometheus text
//! format 0.0.4.
//!
//! What this process counts lives in one registry built at start; what the
//! store knows (pools, sweeps, per-queue children) is read when rendered and
//! encoded from a registry built for that one scrape.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, prometheus_text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::ledger::{Outcome, OutcomeStatus};
use crate::store::PoolStats;

/// The `Content-Type` of what [`Metrics::render`] writes: the Prometheus text
/// format 0.0.4, which every Prometheus scrapes.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// How many queue label values are kept by default (`--max-metric-queues`).
pub const DEFAULT_MAX_QUEUES: usize = 100;

/// The queue label of every queue past the first `max_queues`.
const OTHER_QUEUES: &str = "other";

/// Why access control refused a request: the `reason` label's whole set.
const AUTH_FAILURE_REASONS: [&str; 6] = [
    "missing",
    "malformed",
    "repeated",
    "unknown",
    "forbidden",
    "outside_queues",
];

/// Upper bounds (seconds) of the request duration histogram's buckets.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The long polls of this process: waiting now, and woken since it started.
#[derive(Debug, Default, Clone, Copy)]
pub struct WaitingClaims {
    pub waiting: usize,
    pub woken_total: u64,
}

/// The children of one queue as the store counts them, for the per-queue gauges.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct QueueGauge {
    pub queue: String,
    pub pending: i64,
    pub in_flight: i64,
    pub held: i64,
    /// How long the oldest pending child has waited; `None` when none is pending.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Its flow keys with children in flight, and how many (20 at most).
    pub flow_keys: Vec<(String, i64)>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: &'static str,
    route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FlowKeyLabels {
    queue: String,
    flow_key: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

type DurationFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

#[derive(Debug)]
pub struct Metrics {
    /// Everything below, registered once; encoded at every scrape.
    registry: Registry,
    requests: Family<(RouteLabels, StatusLabel), Counter>,
    durations: DurationFamily,
    claimed: Family<QueueLabel, Counter>,
    /// Queues that have their own label in `claimed`; later ones count as `other`.
    claimed_queues: Mutex<HashSet<String>>,
    /// Most queue label values kept.
    max_queues: usize,
    outcomes: Family<OutcomeLabels, Counter>,
    auth_failures: Family<ReasonLabel, Counter>,
    webhook_deliveries: Family<StatusWord, Counter>,
    webhook_backlog: Gauge,
    pruned: Counter,
    event_streams: Gauge,
    event_reads: Counter,
}

/// A webhook attempt's result: `delivered`, `retrying` or `failed` (given up).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusWord {
    status: &'static str,
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
        let route = RouteLabels {
            method,
            route: route.to_owned(),
        };
        self.durations.get_or_create(&route).observe(elapsed.as_secs_f64());
        self.requests.get_or_create(&(route, StatusLabel { status })).inc();
    }

    /// Metrics whose queue label takes at most `max_queues` values besides `other`.
    pub fn with_max_queues(max_queues: usize) -> Self {
        // Counters are named without `_total` and help texts without their
        // final full stop: the encoder adds both.
        let mut registry = Registry::default();
        let requests = Family::default();
        registry.register(
            "child_ledger_http_requests",
            "HTTP requests answered, by method, route template and status",
            Family::clone(&requests),
        );
        let durations = DurationFamily::new_with_constructor(duration_histogram);
        registry.register(
            "child_ledger_http_request_duration_seconds",
            "Time from request to response, by method and route template",
            durations.clone(),
        );
        // Every series an alert's `rate()` may name exists from the first
        // scrape, at 0 (an absent series reads as "no data", not as none):
        // `other` at once, each queue as soon as a scrape lists it.
        let claimed = Family::<QueueLabel, Counter>::default();
        let _ = claimed.get_or_create(&QueueLabel {
            queue: OTHER_QUEUES.to_owned(),
        });
        registry.register(
            "child_ledger_children_claimed",
            "Children handed out by claims, by the queue of their parent",
            Family::clone(&claimed),
        );
        let outcomes = Family::<OutcomeLabels, Counter>::default();
        for outcome in Outcome::ALL {
            for status in OutcomeStatus::ALL {
                let _ = outcomes.get_or_create(&OutcomeLabels {
                    outcome: outcome.as_str(),
                    status: status.as_str(),
                });
            }
        }
        registry.register(
            "child_ledger_outcomes",
            "Outcome writes, by outcome and by what became of them (applied, duplicate, conflict, claim_mismatch, not_found, not_decomposed)",
            Family::clone(&outcomes),
        );
        let auth_failures = Family::<ReasonLabel, Counter>::default();
        for reason in AUTH_FAILURE_REASONS {
            let _ = auth_failures.get_or_create(&ReasonLabel { reason });
        }
        registry.register(
            "child_ledger_auth_failures",
            "Requests refused by access control, by reason (missing, malformed, repeated, unknown, forbidden, outside_queues)",
            Family::clone(&auth_failures),
        );
        let pruned = Counter::default();
        registry.register(
            "child_ledger_pruned",
            "Complete parents this process deleted with their children (retention pruner, DELETE /v1/parents/{id})",
            Counter::clone(&pruned),
        );
        let webhook_deliveries = Family::<StatusWord, Counter>::default();
        for status in ["delivered", "retrying", "failed"] {
            let _ = webhook_deliveries.get_or_create(&StatusWord { status });
        }
        registry.register(
            "child_ledger_webhook_deliveries",
            "Completion webhook attempts by this process, by what came of them (delivered, retrying, failed: given up)",
            Family::clone(&webhook_deliveries),
        );
        let webhook_backlog = Gauge::default();
        registry.register(
            "child_ledger_webhook_outbox_backlog",
            "Completion events neither delivered nor given up, as this process's webhook sender last counted them",
            Gauge::clone(&webhook_backlog),
        );
        let event_streams = Gauge::default();
        registry.register(
            "child_ledger_event_streams",
            "Event streams (GET .../events) open in this process now",
            Gauge::clone(&event_streams),
        );
        let event_reads = Counter::default();
        registry.register(
            "child_ledger_event_stream_reads",
            "Statements the event hub ran for this process's streams (one per tick for every stream of a subject)",
            Counter::clone(&event_reads),
        );
        Self {
            registry,
            requests,
            durations,
            claimed,
            claimed_queues: Mutex::default(),
            max_queues: max_queues.max(1),
            outcomes,
            auth_failures,
            webhook_deliveries,
            webhook_backlog,
            pruned,
            event_streams,
            event_reads,
        }
    }

    /// Children handed out by a claim, by the queue of their parent. Queue
    /// names come from callers: past the first `max_queues` seen, they are
    /// counted under `other`, so the label set stays bounded.
    pub fn claimed(&self, queue: &str, children: usize) {
        if children == 0 {
            return;
        }
        self.claimed
            .get_or_create(&self.claimed_label(queue))
            .inc_by(children as u64);
    }

    /// The label `queue` is counted under: its own while fewer than
    /// `max_queues` have one, `other` past them.
    fn claimed_label(&self, queue: &str) -> QueueLabel {
        let mut seen = lock(&self.claimed_queues);
        let label = if seen.contains(queue) {
            queue
        } else if seen.len() < self.max_queues {
            seen.insert(queue.to_owned());
            queue
        } else {
            OTHER_QUEUES
        };
        QueueLabel {
            queue: label.to_owned(),
        }
    }

    /// Gives every queue the store lists a claimed series (at 0 until its
    /// first claim), so `rate()` over it reads 0 rather than "no data".
    fn known_queues(&self, queues: &[QueueGauge]) {
        let mut names: Vec<&str> = queues.iter().map(|q| q.queue.as_str()).collect();
        names.sort_unstable();
        for queue in names.into_iter().take(self.max_queues) {
            let _ = self.claimed.get_or_create(&self.claimed_label(queue));
        }
    }

    /// One outcome write and what became of it (`applied`, `duplicate`, ...).
    pub fn outcome(&self, outcome: &'static str, status: &'static str) {
        self.outcomes.get_or_create(&OutcomeLabels { outcome, status }).inc();
    }

    /// A request refused by access control, by why (`missing`, `malformed`,
    /// `repeated`, `unknown`, `forbidden`, `outside_queues`): a fixed set, never the token.
    pub fn auth_failure(&self, reason: &'static str) {
        self.auth_failures.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Complete parents deleted with their children.
    pub fn pruned(&self, parents: u64) {
        self.pruned.inc_by(parents);
    }

    /// A webhook attempt: `delivered`, `retrying` or `failed` (given up).
    pub fn webhook_delivery(&self, status: &'static str) {
        self.webhook_deliveries.get_or_create(&StatusWord { status }).inc();
    }

    /// The outbox backlog the webhook sender counted.
    pub fn webhook_backlog(&self, events: i64) {
        self.webhook_backlog.set(events);
    }

    /// How many event streams are open now.
    pub fn event_streams(&self, open: usize) {
        self.event_streams.set(open as i64);
    }

    /// Statements the event hub ran.
    pub fn event_reads(&self, statements: u64) {
        self.event_reads.inc_by(statements);
    }

    /// Prometheus text exposition format 0.0.4 ([`CONTENT_TYPE`]).
    /// `leases_expired` is the store's count of children whose lease ran out
    /// and were swept back to pending (or held, or failed) by this process;
    /// `parents_completed` its count of parents this process completed;
    /// `claims` the long polls waiting now and woken so far; `queues` the
    /// store's per-queue children, of which the first `max_queues` by name
    /// are shown.
    pub fn render(
        &self,
        pools: &[PoolStats],
        leases_expired: u64,
        parents_completed: u64,
        claims: WaitingClaims,
        queues: &[QueueGauge],
    ) -> String {
        self.known_queues(queues);
        let mut scrape = Registry::default();
        scrape.register(
            "child_ledger_leases_expired",
            "Children whose lease ran out, swept by this process",
            ConstCounter::new(leases_expired),
        );
        scrape.register(
            "child_ledger_parents_completed",
            "Parents whose completion this process committed (an outcome, a sweep, a seal, a reconcile)",
            ConstCounter::new(parents_completed),
        );
        scrape.register(
            "child_ledger_waiting_claims",
            "Long-poll claims waiting for work in this process now",
            ConstGauge::new(claims.waiting),
        );
        scrape.register(
            "child_ledger_claim_wakeups",
            "Waiting claims woken by new work (as many as the work covers, not all of them)",
            ConstCounter::new(claims.woken_total),
        );

        let connections = Family::<(PoolLabel, StateLabel), Gauge>::default();
        let max_connections = Family::<PoolLabel, Gauge>::default();
        for pool in pools {
            let label = PoolLabel { pool: pool.name };
            let by_state = |state| (label.clone(), StateLabel { state });
            connections.get_or_create(&by_state("idle")).set(pool.idle.into());
            connections
                .get_or_create(&by_state("in_use"))
                .set(pool.size.saturating_sub(pool.idle).into());
            max_connections.get_or_create(&label).set(pool.max.into());
        }
        scrape.register(
            "child_ledger_db_pool_connections",
            "Open database connections, by pool and state (idle or in use)",
            connections,
        );
        scrape.register(
            "child_ledger_db_pool_max_connections",
            "The most connections each pool opens",
            max_connections,
        );

        self.register_queue_gauges(&mut scrape, queues);

        let mut out = String::with_capacity(4096);
        // Writing to a String cannot fail, and nothing here is of a kind the
        // text format refuses (native-only histograms).
        prometheus_text::encode(&mut out, &self.registry).expect("metrics encode as text");
        prometheus_text::encode(&mut out, &scrape).expect("metrics encode as text");
        out
    }
}

mod queues;

#[cfg(test)]
mod tests;
