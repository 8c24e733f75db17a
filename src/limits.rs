//! Request limits: the bounds every request is held to, enforced at the edge
//! with a 4xx naming the field, and stated in the OpenAPI document from the
//! same values. Set by flags (`config` flattens them into `serve`).

use crate::ledger::webhook::AllowHosts;

/// The longest long poll a claim may ask for (`wait_seconds`), by the contract.
pub const MAX_WAIT_SECONDS: u64 = 20;

/// Request limits, enforced at the edge with a 4xx naming the field.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct Limits {
    /// Largest request body in bytes (413 beyond)
    #[arg(long, env = "LEDGER_MAX_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Most children in one registration or append (append + seal beyond)
    #[arg(long, env = "LEDGER_MAX_CHILDREN_PER_REQUEST", default_value_t = 100_000)]
    pub max_children_per_request: usize,
    /// Largest claim `limit`.
    #[arg(long, env = "LEDGER_MAX_CLAIM_LIMIT", default_value_t = 1000, hide_short_help = true)]
    pub max_claim_limit: i64,
    /// Lease given when a claim names none.
    #[arg(
        long,
        env = "LEDGER_DEFAULT_LEASE_SECONDS",
        default_value_t = 300,
        hide_short_help = true
    )]
    pub default_lease_seconds: i64,
    /// Longest lease a claim or extend may ask for.
    #[arg(
        long,
        env = "LEDGER_MAX_LEASE_SECONDS",
        default_value_t = 86_400,
        hide_short_help = true
    )]
    pub max_lease_seconds: i64,
    /// Most outcomes in one batch.
    #[arg(
        long,
        env = "LEDGER_MAX_OUTCOMES_PER_REQUEST",
        default_value_t = 1000,
        hide_short_help = true
    )]
    pub max_outcomes_per_request: usize,
    /// Longest a claim's long poll is held, whatever its `wait_seconds` (0-20)
    /// asks: below 20 when a proxy in front cuts idle requests sooner.
    #[arg(long, env = "LEDGER_MAX_WAIT_SECONDS", default_value_t = MAX_WAIT_SECONDS, value_parser = clap::value_parser!(u64).range(0..=MAX_WAIT_SECONDS), hide_short_help = true)]
    pub max_wait_seconds: u64,
    /// How often a waiting claim looks again on its own, in case a work
    /// notification was missed (a replica's `LISTEN` reconnecting).
    #[arg(long, env = "LEDGER_WAIT_RECHECK_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..), hide_short_help = true)]
    pub wait_recheck_ms: u64,
    /// Largest child payload (and retained parent payload), in bytes of JSON.
    #[arg(long, env = "LEDGER_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024, hide_short_help = true)]
    pub max_payload_bytes: usize,
    /// Most registrations, appends and outcome batches over 1 MiB read and
    /// handled at once; more wait their turn (within the request timeout).
    #[arg(long, env = "LEDGER_MAX_BULK_BODIES", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..), hide_short_help = true)]
    pub max_bulk_bodies: u64,
    /// Most long-poll claims waiting at once in this process (429 beyond)
    ///
    /// Most long-poll claims waiting at once in this process; beyond, 429 with Retry-After.
    #[arg(long, env = "LEDGER_MAX_WAITING_CLAIMS", default_value_t = 1000)]
    pub max_waiting_claims: usize,
    /// Most event streams open at once in this process (429 beyond)
    ///
    /// Most event streams (`GET .../events`) open at once in this process;
    /// beyond, 429 with Retry-After.
    #[arg(long, env = "LEDGER_MAX_EVENT_STREAMS", default_value_t = 2000)]
    pub max_event_streams: usize,
    /// Most event streams one token holds at once in this process (429 beyond)
    ///
    /// Most event streams one token holds open at once in this process; beyond,
    /// 429 with Retry-After, so no tenant's dashboards take every stream of
    /// `--max-event-streams`. A service without tokens has one caller, and no
    /// share. Four more streams than `--max-event-streams` are kept for admins.
    #[arg(long, env = "LEDGER_MAX_EVENT_STREAMS_PER_TOKEN", default_value_t = 200, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), hide_short_help = true)]
    pub max_event_streams_per_token: usize,
    /// Most results exports streaming at once in this process (429 beyond)
    ///
    /// Most results exports (`GET .../results`) streaming at once in this
    /// process; beyond, 429 with Retry-After. Each holds about one chunk
    /// (256 KiB of results) while its client reads; one whose client stops
    /// reading for 60 s is ended. Four more are kept for admins.
    #[arg(long, env = "LEDGER_MAX_EXPORTS", default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), hide_short_help = true)]
    pub max_exports: usize,
    /// Most results exports one token streams at once (429 beyond)
    #[arg(long, env = "LEDGER_MAX_EXPORTS_PER_TOKEN", default_value_t = 8, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..), hide_short_help = true)]
    pub max_exports_per_token: usize,
    /// Largest outcome `result`, in bytes of JSON.
    #[arg(long, env = "LEDGER_MAX_RESULT_BYTES", default_value_t = 64 * 1024, hide_short_help = true)]
    pub max_result_bytes: usize,
    /// Largest claim or page of children, in bytes of JSON: a response holds
    /// fewer children rather than exceed it (`next_after` goes on from there).
    #[arg(long, env = "LEDGER_MAX_RESPONSE_BYTES", default_value_t = 16 * 1024 * 1024, hide_short_help = true)]
    pub max_response_bytes: usize,
    /// Most index rows one page of the children search (`GET /v1/children`)
    /// examines: past it the page ends early, with the children found so far
    /// and `next_cursor`.
    #[arg(long, env = "LEDGER_MAX_SEARCH_ROWS", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..), hide_short_help = true)]
    pub max_search_rows: u64,
    /// Hosts a parent's `webhook_url` may point at (default none)
    ///
    /// Where a parent's `webhook_url` may point, comma-separated: host names
    /// (`host`, `*.domain`, each with an optional `:port`), and addresses or
    /// networks (`10.1.2.3`, `10.0.0.0/8:9000`, `[fd00::/8]`) that may be
    /// named literally or reached although not public (loopback, private,
    /// link-local, ...). Default none: a `webhook_url` is refused.
    #[arg(long, env = "LEDGER_WEBHOOK_ALLOW_HOSTS", default_value = "", value_parser = parse_allow_hosts, help_heading = "Webhooks")]
    pub webhook_allow_hosts: AllowHosts,
    /// Most queue label values in the metrics; later queues count as `other`
    #[arg(long, env = "LEDGER_MAX_METRIC_QUEUES", default_value_t = crate::metrics::DEFAULT_MAX_QUEUES, help_heading = "Observability")]
    pub max_metric_queues: usize,
}

fn parse_allow_hosts(list: &str) -> Result<AllowHosts, String> {
    AllowHosts::parse(list)
}

impl Limits {
    /// Whether the limits agree: the largest child must fit in a response, or
    /// a claim or page could never hand it out.
    pub fn check(&self) -> anyhow::Result<()> {
        let room = crate::ledger::budget::PAGE_CHILD_ROOM;
        let largest = self.max_payload_bytes + self.max_result_bytes + room;
        anyhow::ensure!(
            self.max_response_bytes >= largest,
            "--max-response-bytes {} is below the largest child a response may hold ({largest}: \
             --max-payload-bytes + --max-result-bytes + {room}); raise it or lower those",
            self.max_response_bytes
        );
        Ok(())
    }

    /// A fresh byte budget for one claim or page.
    pub fn response_budget(&self) -> crate::ledger::budget::ByteBudget {
        crate::ledger::budget::ByteBudget::new(self.max_response_bytes as u64, self.max_payload_bytes as u64)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024 * 1024,
            max_children_per_request: 100_000,
            max_claim_limit: 1000,
            default_lease_seconds: 300,
            max_lease_seconds: 86_400,
            max_outcomes_per_request: 1000,
            max_payload_bytes: 1024 * 1024,
            max_result_bytes: 64 * 1024,
            max_response_bytes: 16 * 1024 * 1024,
            max_metric_queues: crate::metrics::DEFAULT_MAX_QUEUES,
            max_waiting_claims: 1000,
            max_event_streams: 2000,
            max_event_streams_per_token: 200,
            max_exports: 64,
            max_exports_per_token: 8,
            max_bulk_bodies: 4,
            max_wait_seconds: MAX_WAIT_SECONDS,
            wait_recheck_ms: 2000,
            max_search_rows: 20_000,
            webhook_allow_hosts: AllowHosts::default(),
        }
    }
}
