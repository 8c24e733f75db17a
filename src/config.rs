//! Command line and environment configuration.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::access::Role;
use crate::ledger::webhook::{AllowHosts, RetrySchedule, WebhookSecret};

pub use crate::limits::{Limits, MAX_WAIT_SECONDS};

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
    #[command(
        after_help = "`-h` shows the common flags; `--help` shows every flag, with details.\n\n\
        Examples:\n  \
        child-ledger serve                        # 127.0.0.1:8080, SQLite file child-ledger.db\n  \
        child-ledger serve --listen 0.0.0.0:8080 --tokens-file tokens.json\n  \
        DATABASE_URL=postgres://ledger@db/ledger child-ledger",
        after_long_help = "Examples:\n  \
        child-ledger serve                        # 127.0.0.1:8080, SQLite file child-ledger.db\n  \
        child-ledger serve --listen 0.0.0.0:8080 --tokens-file tokens.json\n  \
        DATABASE_URL=postgres://ledger@db/ledger child-ledger"
    )]
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
    /// Completion webhooks: the per-queue signing secrets.
    #[command(after_help = "Examples:\n  \
        LEDGER_WEBHOOK_SECRET=whsec_... child-ledger webhook secret --queue events")]
    Webhook {
        #[command(subcommand)]
        command: WebhookCommand,
    },
}

/// What a webhook receiver needs.
#[derive(Debug, Subcommand)]
pub enum WebhookCommand {
    /// Print the secret that signs one queue's completion events (`whsec_`
    /// and base64), derived from `--webhook-secret`: give it to that queue's
    /// receiver, which verifies with it as with any Standard Webhooks secret.
    #[command(after_help = "Examples:\n  \
        LEDGER_WEBHOOK_SECRET=whsec_... child-ledger webhook secret --queue events")]
    Secret {
        /// The queue whose events the receiver takes.
        #[arg(long, value_parser = parse_queue)]
        queue: crate::ledger::QueueName,
        /// The service's master secret (`whsec_` and base64), as it serves with.
        #[arg(long, env = "LEDGER_WEBHOOK_SECRET", hide_env_values = true, value_parser = parse_secret)]
        webhook_secret: Option<WebhookSecret>,
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
#[command(next_help_heading = "Database")]
pub struct DatabaseArgs {
    /// `sqlite://path` (created if missing) or `postgres://...`
    ///
    /// Its value is never shown (`--help` hides it): it may hold a password.
    #[arg(
        long,
        env = "DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://child-ledger.db"
    )]
    pub database_url: String,
    /// What sits between the service and Postgres
    ///
    /// `none` (a direct
    /// connection), or `transaction`, a pooler in transaction-pooling mode
    /// such as PgBouncer's `pool_mode = transaction`. In that mode no statement
    /// is prepared by name, every setting is `SET LOCAL` and every statement
    /// runs in a transaction, so no session state outlives it.
    #[arg(long, env = "LEDGER_DB_POOLER", value_enum, default_value_t = DbPooler::None)]
    pub db_pooler: DbPooler,
    /// A direct Postgres URL (not through the pooler), for LISTEN and migrations
    ///
    /// A direct connection to Postgres (not through the pooler) for what needs
    /// a session of its own: `LISTEN`, which wakes long polls across replicas,
    /// and migrations. Only with `--db-pooler transaction`; without it, long
    /// polls wake on their periodic recheck and migrations must be applied
    /// with `child-ledger migrate` against Postgres directly.
    #[arg(
        long,
        env = "LEDGER_LISTEN_DATABASE_URL",
        hide_env_values = true,
        hide_short_help = true
    )]
    pub listen_database_url: Option<String>,
    /// Most database connections this process opens
    ///
    /// Most database connections this process opens for requests (on Postgres
    /// one more is held for `LISTEN`; on SQLite, one writer and at most two
    /// readers per core).
    #[arg(long, env = "LEDGER_DB_MAX_CONNECTIONS", default_value_t = 16)]
    pub db_max_connections: u32,
    /// Longest one database statement may run
    ///
    /// Longest one database statement may run (Postgres `statement_timeout`;
    /// a transaction left idle ends after twice that).
    #[arg(long, env = "LEDGER_STATEMENT_TIMEOUT_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..), hide_short_help = true)]
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

/// What `serve` is told, under the headings `serve --help` shows: server,
/// database, access, limits, webhooks, observability, retention.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Address to serve HTTP on
    #[arg(
        long,
        env = "LEDGER_LISTEN",
        default_value = "127.0.0.1:8080",
        help_heading = "Server"
    )]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// How often expired leases are swept to pending, held or failed
    #[arg(
        long,
        env = "LEDGER_REAP_INTERVAL_MS",
        default_value_t = 1000,
        help_heading = "Server",
        hide_short_help = true
    )]
    pub reap_interval_ms: u64,
    /// Longest a request may run before it is answered 503
    #[arg(
        long,
        env = "LEDGER_REQUEST_TIMEOUT_SECONDS",
        default_value_t = 60,
        help_heading = "Server",
        hide_short_help = true
    )]
    pub request_timeout_seconds: u64,
    /// Disconnect a client that has not sent its request head by then
    ///
    /// A client must send each request head (the first, and the next one on a
    /// kept-alive connection) within this long, or it is disconnected.
    #[arg(long, env = "LEDGER_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Server", hide_short_help = true)]
    pub header_read_timeout_seconds: u64,
    /// Most open connections; more are closed as they are accepted
    #[arg(long, env = "LEDGER_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Server", hide_short_help = true)]
    pub max_connections: u64,
    /// After SIGTERM, how long in-flight requests get to finish
    ///
    /// After SIGTERM, how long in-flight requests get to finish before the process exits anyway.
    #[arg(
        long,
        env = "LEDGER_SHUTDOWN_GRACE_SECONDS",
        default_value_t = 25,
        help_heading = "Server"
    )]
    pub shutdown_grace_seconds: u64,
    /// JSON file of hashed bearer tokens, their roles and queues (SIGHUP re-reads)
    ///
    /// JSON file of hashed bearer tokens with their roles and queues (see
    /// docs/access-control.md); re-read on SIGHUP. Without it the service is
    /// open to anyone who can reach it.
    #[arg(long, env = "LEDGER_TOKENS_FILE", help_heading = "Access")]
    pub tokens_file: Option<PathBuf>,
    /// Serve without a tokens file on an address other than loopback
    ///
    /// Serve without a tokens file on an address other than loopback
    /// (only behind something else that authenticates callers).
    #[arg(long, env = "LEDGER_ALLOW_ANONYMOUS", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue, help_heading = "Access")]
    pub allow_anonymous: bool,
    #[command(flatten)]
    pub limits: Limits,
    #[command(flatten)]
    pub webhooks: WebhookConfig,
    /// Log lines as text or JSON (RUST_LOG filters; OTEL_* exports traces)
    ///
    /// Log lines as text (coloured only on a terminal) or one JSON object per
    /// line. `RUST_LOG` filters them (default `info`); the standard `OTEL_*`
    /// variables (`OTEL_EXPORTER_OTLP_ENDPOINT`) export traces over OTLP.
    #[arg(long, env = "LEDGER_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, help_heading = "Observability")]
    pub log_format: LogFormat,
    /// Delete complete parents this long after they completed (0: never)
    ///
    /// Complete parents whose `completed_at` is older than this are deleted
    /// with their children by a background pruner; 0 keeps them forever.
    #[arg(
        long,
        env = "LEDGER_RETAIN_COMPLETE_SECONDS",
        default_value_t = 0,
        help_heading = "Retention"
    )]
    pub retain_complete_seconds: u64,
    #[command(flatten)]
    pub reconcile_jobs: ReconcileJobConfig,
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
#[command(next_help_heading = "Retention")]
pub struct ReconcileJobConfig {
    /// Parents a background reconcile job checks per step
    #[arg(long, env = "LEDGER_RECONCILE_JOB_BATCH", default_value_t = 500, value_parser = clap::value_parser!(i64).range(1..=10_000), hide_short_help = true)]
    pub reconcile_job_batch: i64,
    /// How long a stalled reconcile job is held before another replica takes it
    ///
    /// How long a replica holds a reconcile job without finishing a step
    /// before another replica (or this one, restarted) takes it over.
    #[arg(long, env = "LEDGER_RECONCILE_JOB_LEASE_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..), hide_short_help = true)]
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
    /// Installs the log subscriber in this format (see `telemetry::init_tracing`);
    /// the OTLP exporter, when the `OTEL_*` variables ask for one, to flush at exit.
    pub fn init_tracing(self) -> Option<crate::telemetry::Exporter> {
        crate::telemetry::init_tracing(self == LogFormat::Json)
    }
}

/// The completion webhook sender (docs/webhooks.md).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Webhooks")]
pub struct WebhookConfig {
    /// Master key of the webhook signatures (`whsec_` and base64)
    ///
    /// Master key of the webhook signatures: `whsec_` and base64. Each
    /// queue's events are signed with a key derived from it (`child-ledger
    /// webhook secret --queue Q` prints it). Required when
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

impl WebhookConfig {
    /// The sender these flags ask for; `None` without a secret (no event can
    /// be signed, so none is sent: they wait in the outbox).
    pub fn sender(&self, allow: &AllowHosts) -> Option<crate::jobs::WebhookSender> {
        Some(crate::jobs::WebhookSender {
            secret: self.webhook_secret.clone()?,
            allow: allow.clone(),
            schedule: self.webhook_retry_schedule_ms.clone().unwrap_or_default(),
            poll: Duration::from_millis(self.webhook_poll_ms),
            timeout: Duration::from_millis(self.webhook_timeout_ms),
            resolver: std::sync::Arc::new(crate::jobs::SystemResolver),
        })
    }
}

fn parse_secret(secret: &str) -> Result<WebhookSecret, String> {
    WebhookSecret::parse(secret)
}

fn parse_schedule(list: &str) -> Result<RetrySchedule, String> {
    RetrySchedule::parse(list)
}

#[cfg(test)]
mod tests;
