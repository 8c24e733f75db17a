//! Command line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::access::Role;
use crate::ledger::webhook::{AllowHosts, RetrySchedule, WebhookSecret};

/// The longest long poll a claim may ask for (`wait_seconds`), by the contract.
pub const MAX_WAIT_SECONDS: u64 = 20;

#[derive(Debug, Parser)]
#[command(
    name = "child-ledger",
    version,
    about = "A durable per-child ledger for fan-out work",
    override_usage = "child-ledger [SERVE FLAGS]\n       child-ledger <COMMAND>",
    long_about = "A durable per-child ledger for fan-out work.\n\n\
        Without a command, `child-ledger [FLAGS]` is `child-ledger serve [FLAGS]`: \
        `child-ledger serve --help` lists its flags.",
    after_help = "Examples:\n  \
        child-ledger                                   # serve on 127.0.0.1:8080, SQLite file child-ledger.db\n  \
        child-ledger --listen 0.0.0.0:8080 --tokens-file tokens.json\n  \
        child-ledger token new --name ops --role admin\n  \
        child-ledger serve --help                      # every flag of the service"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// Parses the process's arguments; without a command they are `serve`'s.
    pub fn parse_args() -> Self {
        Self::parse_from(with_default_command(std::env::args_os()))
    }

    /// As `parse_args`, from `args` (the program name first), without exiting.
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString>,
    {
        Self::try_parse_from(with_default_command(args))
    }
}

/// `args` with `serve` put first when they name no command (nor ask for the
/// top-level help or version), so `child-ledger --listen ...` serves.
fn with_default_command<I, T>(args: I) -> Vec<std::ffi::OsString>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    use clap::CommandFactory;
    let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let names_a_command = args.get(1).and_then(|a| a.to_str()).is_some_and(|first| {
        matches!(first, "help" | "-h" | "--help" | "-V" | "--version")
            || Cli::command().get_subcommands().any(|c| c.get_name() == first)
    });
    if !names_a_command {
        args.insert(args.len().min(1), "serve".into());
    }
    args
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve HTTP (the default: `child-ledger [FLAGS]` is `child-ledger serve [FLAGS]`).
    #[command(after_help = "Examples:\n  \
        child-ledger serve                        # 127.0.0.1:8080, SQLite file child-ledger.db\n  \
        child-ledger serve --listen 0.0.0.0:8080 --tokens-file tokens.json\n  \
        DATABASE_URL=postgres://ledger@db/ledger child-ledger")]
    Serve(Box<Config>),
    /// Manage access tokens.
    #[command(after_help = "Examples:\n  child-ledger token new --name ingest --role producer --queue events")]
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Apply the database migrations and exit (serving applies them too).
    #[command(after_help = "Examples:\n  \
        child-ledger migrate --database-url sqlite://child-ledger.db\n  \
        DATABASE_URL=postgres://ledger@db/ledger child-ledger migrate")]
    Migrate(DatabaseArgs),
    /// Print the OpenAPI document (JSON) and exit.
    #[command(after_help = "Examples:\n  child-ledger openapi > openapi.json")]
    Openapi,
    /// Reconcile every parent's projection with its child rows, straight
    /// against the database: a dry run unless `--apply`. Prints the report
    /// (JSON) on stdout, progress on stderr.
    #[command(after_help = "Examples:\n  \
        child-ledger reconcile                    # dry run: report drift, write nothing\n  \
        child-ledger reconcile --queue events --apply\n  \
        DATABASE_URL=postgres://ledger@db/ledger child-ledger reconcile --apply > report.json")]
    Reconcile {
        /// Only this queue's parents.
        #[arg(long, value_parser = parse_queue)]
        queue: Option<crate::ledger::QueueName>,
        /// Repair the drifted parents (without it, only report them).
        #[arg(long)]
        apply: bool,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

fn parse_queue(queue: &str) -> Result<crate::ledger::QueueName, String> {
    crate::ledger::QueueName::parse(queue).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a fresh random token (once) and the entry to add to the tokens file.
    #[command(after_help = "Examples:\n  \
        child-ledger token new --name ingest --role producer --queue events --queue 'billing.*'\n  \
        child-ledger token new --name ops --role admin >ops.token   # line 1: the token; line 2: its entry")]
    New {
        /// A name for the token's holder (shown in logs and 403 answers).
        #[arg(long)]
        name: String,
        /// What the token may do; repeat for several.
        #[arg(long = "role", value_enum, required = true)]
        roles: Vec<Role>,
        /// A queue the token reaches: a name, a prefix ending in `*`, or `*`
        /// (the default); repeat for several.
        #[arg(long = "queue")]
        queues: Vec<String>,
    },
}

/// Where the ledger is: what `serve`, `migrate` and `reconcile` connect to.
#[derive(Debug, Clone, clap::Args)]
pub struct DatabaseArgs {
    /// `sqlite://path` (created if missing) or `postgres://...`.
    /// Its value is never shown (`--help` hides it): it may hold a password.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://child-ledger.db"
    )]
    pub database_url: String,
    /// What sits between the service and Postgres: `none` (a direct
    /// connection), or `transaction`, a pooler in transaction-pooling mode
    /// such as PgBouncer's `pool_mode = transaction`. In that mode no statement
    /// is prepared by name, every setting is `SET LOCAL` and every statement
    /// runs in a transaction, so no session state outlives it.
    #[arg(long, env = "LEDGER_DB_POOLER", value_enum, default_value_t = DbPooler::None)]
    pub db_pooler: DbPooler,
    /// A direct connection to Postgres (not through the pooler) for what needs
    /// a session of its own: `LISTEN`, which wakes long polls across replicas,
    /// and migrations. Only with `--db-pooler transaction`; without it, long
    /// polls wake on their periodic recheck and migrations must be applied
    /// with `child-ledger migrate` against Postgres directly.
    #[arg(long, env = "LEDGER_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
    /// Most database connections this process opens for requests (on Postgres
    /// one more is held for `LISTEN`).
    #[arg(long, env = "LEDGER_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
    /// Longest one database statement may run (Postgres `statement_timeout`;
    /// a transaction left idle ends after twice that).
    #[arg(long, env = "LEDGER_STATEMENT_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub statement_timeout_seconds: u64,
}

impl DatabaseArgs {
    /// How the store connects, as these flags say.
    pub fn store_options(&self) -> anyhow::Result<crate::store::StoreOptions> {
        anyhow::ensure!(
            self.listen_database_url.is_none() || self.db_pooler == DbPooler::Transaction,
            "--listen-database-url (LEDGER_LISTEN_DATABASE_URL) is only for --db-pooler transaction: without a pooler, \
             LISTEN already has a direct connection"
        );
        if let Some(url) = &self.listen_database_url {
            anyhow::ensure!(
                crate::store::backend_of(url) == Some("postgres"),
                "--listen-database-url (LEDGER_LISTEN_DATABASE_URL) must be a postgres://… URL straight to Postgres"
            );
        }
        Ok(crate::store::StoreOptions {
            max_connections: self.db_max_connections,
            statement_timeout: Duration::from_secs(self.statement_timeout_seconds),
            behind_transaction_pooler: self.db_pooler == DbPooler::Transaction,
            direct_url: self.listen_database_url.clone(),
            ..crate::store::StoreOptions::default()
        })
    }
}

/// What `serve` is told.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Address to serve HTTP on.
    #[arg(long, env = "LEDGER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// How often expired leases are swept to pending, held or failed.
    #[arg(long, env = "LEDGER_REAP_INTERVAL_MS", default_value_t = 1000)]
    pub reap_interval_ms: u64,
    /// Complete parents whose `completed_at` is older than this are deleted
    /// with their children by a background pruner; 0 keeps them forever.
    #[arg(long, env = "LEDGER_RETAIN_COMPLETE_SECONDS", default_value_t = 0)]
    pub retain_complete_seconds: u64,
    /// Longest a request may run before it is answered 503.
    #[arg(long, env = "LEDGER_REQUEST_TIMEOUT_SECONDS", default_value_t = 60)]
    pub request_timeout_seconds: u64,
    /// A client must send each request head (the first, and the next one on a
    /// kept-alive connection) within this long, or it is disconnected.
    #[arg(long, env = "LEDGER_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_seconds: u64,
    /// Most open connections; more are closed as they are accepted.
    #[arg(long, env = "LEDGER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_connections: u64,
    /// After SIGTERM, how long in-flight requests get to finish before the process exits anyway.
    #[arg(long, env = "LEDGER_SHUTDOWN_GRACE_SECONDS", default_value_t = 25)]
    pub shutdown_grace_seconds: u64,
    /// Log lines as text (coloured only on a terminal) or one JSON object per line.
    #[arg(long, env = "LEDGER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// JSON file of hashed bearer tokens with their roles and queues (see
    /// README, "Access control"); re-read on SIGHUP. Without it the service is
    /// open to anyone who can reach it.
    #[arg(long, env = "LEDGER_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// Serve without a tokens file on an address other than loopback
    /// (only behind something else that authenticates callers).
    #[arg(long, env = "LEDGER_ALLOW_ANONYMOUS", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub allow_anonymous: bool,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub reconcile_jobs: ReconcileJobConfig,
    #[command(flatten)]
    pub webhooks: WebhookConfig,
}

impl Config {
    /// How the store connects, as these flags say.
    pub fn store_options(&self) -> anyhow::Result<crate::store::StoreOptions> {
        self.database.store_options()
    }

    pub fn reap_interval(&self) -> Duration {
        Duration::from_millis(self.reap_interval_ms.max(10))
    }

    /// How long complete parents are kept, and how often the pruner looks
    /// (a quarter of that, between 1 s and a minute); `None`: forever.
    pub fn retention(&self) -> Option<(Duration, Duration)> {
        let retain = Duration::from_secs(self.retain_complete_seconds);
        (!retain.is_zero()).then(|| {
            (
                retain,
                (retain / 4).clamp(Duration::from_secs(1), Duration::from_secs(60)),
            )
        })
    }
}

/// How this replica works background reconcile jobs (`POST /v1/reconcile/jobs`).
#[derive(Debug, Clone, clap::Args)]
pub struct ReconcileJobConfig {
    /// Parents a background reconcile job checks per step.
    #[arg(long, env = "LEDGER_RECONCILE_JOB_BATCH", default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    pub reconcile_job_batch: i64,
    /// How long a replica holds a reconcile job without finishing a step
    /// before another replica (or this one, restarted) takes it over.
    #[arg(long, env = "LEDGER_RECONCILE_JOB_LEASE_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub reconcile_job_lease_seconds: u64,
}

impl ReconcileJobConfig {
    pub fn options(&self) -> crate::jobs::ReconcileJobOptions {
        crate::jobs::ReconcileJobOptions {
            lease: Duration::from_secs(self.reconcile_job_lease_seconds),
            batch: self.reconcile_job_batch,
            idle: Duration::from_millis(500),
        }
    }
}

/// What sits between the service and Postgres (`--db-pooler`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum DbPooler {
    /// A direct connection: sessions are the service's own.
    #[default]
    None,
    /// A pooler in transaction mode (PgBouncer `pool_mode = transaction`):
    /// a server connection is the service's only for one transaction.
    Transaction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// Installs the log subscriber: this format, the `RUST_LOG` filter
    /// (default `info`), written to stdout, in colour only when that is a
    /// terminal (a log file or a pipe gets no escape codes).
    pub fn init_tracing(self) {
        use std::io::IsTerminal;
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stdout().is_terminal());
        match self {
            LogFormat::Text => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
    }
}

/// Request limits, enforced at the edge with a 4xx naming the field.
#[derive(Debug, Clone, clap::Args)]
pub struct Limits {
    /// Largest request body in bytes (413 beyond).
    #[arg(long, env = "LEDGER_MAX_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Most children in one registration or append (use append + seal beyond).
    #[arg(long, env = "LEDGER_MAX_CHILDREN_PER_REQUEST", default_value_t = 100_000)]
    pub max_children_per_request: usize,
    /// Largest claim `limit`.
    #[arg(long, env = "LEDGER_MAX_CLAIM_LIMIT", default_value_t = 1000)]
    pub max_claim_limit: i64,
    /// Lease given when a claim names none.
    #[arg(long, env = "LEDGER_DEFAULT_LEASE_SECONDS", default_value_t = 300)]
    pub default_lease_seconds: i64,
    /// Longest lease a claim or extend may ask for.
    #[arg(long, env = "LEDGER_MAX_LEASE_SECONDS", default_value_t = 86_400)]
    pub max_lease_seconds: i64,
    /// Most outcomes in one batch.
    #[arg(long, env = "LEDGER_MAX_OUTCOMES_PER_REQUEST", default_value_t = 1000)]
    pub max_outcomes_per_request: usize,
    /// Longest a claim's long poll is held, whatever its `wait_seconds` (0-20)
    /// asks: below 20 when a proxy in front cuts idle requests sooner.
    #[arg(long, env = "LEDGER_MAX_WAIT_SECONDS", default_value_t = MAX_WAIT_SECONDS, value_parser = clap::value_parser!(u64).range(0..=MAX_WAIT_SECONDS))]
    pub max_wait_seconds: u64,
    /// How often a waiting claim looks again on its own, in case a work
    /// notification was missed (a replica's `LISTEN` reconnecting).
    #[arg(long, env = "LEDGER_WAIT_RECHECK_MS", default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..))]
    pub wait_recheck_ms: u64,
    /// Largest child payload (and retained parent payload), in bytes of JSON.
    #[arg(long, env = "LEDGER_MAX_PAYLOAD_BYTES", default_value_t = 1024 * 1024)]
    pub max_payload_bytes: usize,
    /// Most queue label values in the metrics; later queues count as `other`.
    #[arg(long, env = "LEDGER_MAX_METRIC_QUEUES", default_value_t = crate::metrics::DEFAULT_MAX_QUEUES)]
    pub max_metric_queues: usize,
    /// Most registrations, appends and outcome batches over 1 MiB read and
    /// handled at once; more wait their turn (within the request timeout).
    #[arg(long, env = "LEDGER_MAX_BULK_BODIES", default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_bulk_bodies: u64,
    /// Most long-poll claims waiting at once in this process; beyond, 429 with Retry-After.
    #[arg(long, env = "LEDGER_MAX_WAITING_CLAIMS", default_value_t = 1000)]
    pub max_waiting_claims: usize,
    /// Largest outcome `result`, in bytes of JSON.
    #[arg(long, env = "LEDGER_MAX_RESULT_BYTES", default_value_t = 64 * 1024)]
    pub max_result_bytes: usize,
    /// Largest claim or page of children, in bytes of JSON: a response holds
    /// fewer children rather than exceed it (`next_after` goes on from there).
    #[arg(long, env = "LEDGER_MAX_RESPONSE_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_response_bytes: usize,
    /// Hosts a parent's `webhook_url` may name, comma-separated: `host`,
    /// `host:port` or `*.domain`. Default none: a `webhook_url` is refused.
    #[arg(long, env = "LEDGER_WEBHOOK_ALLOW_HOSTS", default_value = "", value_parser = parse_allow_hosts)]
    pub webhook_allow_hosts: AllowHosts,
}

fn parse_allow_hosts(list: &str) -> Result<AllowHosts, String> {
    Ok(AllowHosts::parse(list))
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
            max_bulk_bodies: 4,
            max_wait_seconds: MAX_WAIT_SECONDS,
            wait_recheck_ms: 2000,
            webhook_allow_hosts: AllowHosts::default(),
        }
    }
}

/// The completion webhook sender (README, "Webhooks").
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookConfig {
    /// Key of the webhook signatures: `whsec_` and base64. Required when
    /// `--webhook-allow-hosts` names any host; never shown nor logged.
    #[arg(long, env = "LEDGER_WEBHOOK_SECRET", hide_env_values = true, value_parser = parse_secret)]
    pub webhook_secret: Option<WebhookSecret>,
    /// Delays between delivery attempts, in milliseconds, comma-separated;
    /// after the last the event is given up.
    #[arg(long, env = "LEDGER_WEBHOOK_RETRY_SCHEDULE_MS", value_parser = parse_schedule, hide = true)]
    pub webhook_retry_schedule_ms: Option<RetrySchedule>,
    /// How often the sender looks for due events on its own (it is also woken
    /// when this process completes a parent).
    #[arg(long, env = "LEDGER_WEBHOOK_POLL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..), hide = true)]
    pub webhook_poll_ms: u64,
    /// Longest one delivery attempt may take; its lease is twice that.
    #[arg(long, env = "LEDGER_WEBHOOK_TIMEOUT_MS", default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(100..), hide = true)]
    pub webhook_timeout_ms: u64,
}

fn parse_secret(secret: &str) -> Result<WebhookSecret, String> {
    WebhookSecret::parse(secret)
}

fn parse_schedule(list: &str) -> Result<RetrySchedule, String> {
    RetrySchedule::parse(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_contract() {
        let Command::Serve(config) = Cli::try_parse_args(["child-ledger"]).unwrap().command else {
            panic!("no command is serve");
        };
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        let parsed = config.limits;
        let default = Limits::default();
        assert_eq!(parsed.max_body_bytes, default.max_body_bytes);
        assert_eq!(parsed.max_children_per_request, default.max_children_per_request);
        assert_eq!(parsed.max_claim_limit, default.max_claim_limit);
        assert_eq!(parsed.default_lease_seconds, default.default_lease_seconds);
        assert_eq!(parsed.max_lease_seconds, default.max_lease_seconds);
        assert_eq!(parsed.max_outcomes_per_request, default.max_outcomes_per_request);
        assert_eq!(parsed.max_payload_bytes, default.max_payload_bytes);
        assert_eq!(parsed.max_result_bytes, default.max_result_bytes);
        assert_eq!(parsed.max_metric_queues, default.max_metric_queues);
        assert_eq!(parsed.max_waiting_claims, default.max_waiting_claims);
        assert_eq!(parsed.max_bulk_bodies, default.max_bulk_bodies);
        assert_eq!(parsed.max_wait_seconds, default.max_wait_seconds);
        assert_eq!(parsed.wait_recheck_ms, default.wait_recheck_ms);
        assert_eq!(parsed.max_response_bytes, default.max_response_bytes);
        default.check().unwrap();
        let tight = Limits {
            max_response_bytes: default.max_payload_bytes,
            ..default
        };
        assert!(tight.check().unwrap_err().to_string().contains("--max-response-bytes"));
    }

    #[test]
    fn token_new_takes_roles_and_queues() {
        let cli = Cli::try_parse_args([
            "child-ledger",
            "token",
            "new",
            "--name",
            "ingest",
            "--role",
            "producer",
            "--queue",
            "events",
            "--queue",
            "billing.*",
        ])
        .unwrap();
        let Command::Token {
            command: TokenCommand::New { name, roles, queues },
        } = cli.command
        else {
            panic!("not token new");
        };
        assert_eq!(name, "ingest");
        assert_eq!(roles, [Role::Producer]);
        assert_eq!(queues, ["events", "billing.*"]);
        assert!(
            Cli::try_parse_args(["child-ledger", "token", "new", "--name", "x"]).is_err(),
            "a role is required"
        );
        let Command::Serve(config) = Cli::try_parse_args(["child-ledger"]).unwrap().command else {
            panic!("no command is serve");
        };
        assert!(!config.allow_anonymous);
    }

    #[test]
    fn serve_subcommand_is_accepted() {
        let cli = Cli::try_parse_args(["child-ledger", "serve", "--listen", "0.0.0.0:9000"]).unwrap();
        let Command::Serve(config) = cli.command else {
            panic!("not serve");
        };
        assert_eq!(config.listen.port(), 9000);
    }

    #[test]
    fn serve_flags_without_a_command_serve() {
        let cli = Cli::try_parse_args(["child-ledger", "--listen", "0.0.0.0:9001"]).unwrap();
        let Command::Serve(config) = cli.command else {
            panic!("flags alone are serve's");
        };
        assert_eq!(config.listen.port(), 9001);
        let Command::Reconcile { database, apply, .. } =
            Cli::try_parse_args(["child-ledger", "reconcile", "--database-url", "sqlite://x.db"])
                .unwrap()
                .command
        else {
            panic!("not reconcile");
        };
        assert_eq!((database.database_url.as_str(), apply), ("sqlite://x.db", false));
        // Only serve takes serve's flags.
        for args in [
            &["child-ledger", "openapi", "--listen", "127.0.0.1:1"][..],
            &[
                "child-ledger",
                "token",
                "new",
                "--name",
                "x",
                "--role",
                "admin",
                "--database-url",
                "sqlite://x.db",
            ],
            &["child-ledger", "migrate", "--listen", "127.0.0.1:1"],
        ] {
            assert!(Cli::try_parse_args(args.iter().copied()).is_err(), "{args:?}");
        }
        // The top-level help and version are not serve's.
        for flag in ["--help", "-h", "--version", "help"] {
            let err = Cli::try_parse_args(["child-ledger", flag]).unwrap_err();
            assert!(!err.to_string().contains("--reap-interval-ms"), "{flag}: {err}");
        }
    }
}
