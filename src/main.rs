use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;

use child_ledger::access::{self, Access, Role};
use child_ledger::api::until_ready;
use child_ledger::config::{Cli, Command, Config, TokenCommand};
use child_ledger::server::ServeOptions;
use child_ledger::store::{Store, StoreOptions, backend_of, permanent_connect_error};
use child_ledger::{AppState, app_with_timeout, listen_for_work, prune_complete_parents, reap_expired_leases};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    child_ledger::cli::exit_code(run(Cli::parse_args()).await)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(config) => serve(*config).await,
        Command::Token {
            command: TokenCommand::New { name, roles, queues },
        } => print_new_token(&name, roles, queues),
        Command::Migrate(database) => {
            child_ledger::cli::migrate(&database.database_url, &database.store_options()?).await
        }
        Command::Openapi => child_ledger::cli::openapi(),
        Command::Reconcile { queue, apply, database } => {
            let options = database.store_options()?;
            child_ledger::cli::reconcile(&database.database_url, &options, queue.as_ref(), apply).await
        }
    }
}

/// `token new`: the token on stdout's first line, its file entry on the
/// second; what to do with them on stderr.
fn print_new_token(name: &str, roles: Vec<Role>, queues: Vec<String>) -> anyhow::Result<()> {
    let (token, entry) = access::new_token(name, roles, queues)?;
    eprintln!("The token, shown this once (give it to its holder; the service keeps only its hash):");
    println!("{token}");
    eprintln!("Its entry, for the \"tokens\" list of the tokens file (then send SIGHUP to the service):");
    println!("{}", serde_json::to_string(&entry)?);
    Ok(())
}

/// The access rules the configuration asks for, refusing an open service on
/// an address others can reach unless that is asked for explicitly.
fn access_of(config: &Config) -> anyhow::Result<Access> {
    let Some(path) = &config.tokens_file else {
        if !config.listen.ip().is_loopback() {
            anyhow::ensure!(
                config.allow_anonymous,
                "refusing to serve {} without a tokens file: anyone who reaches it could claim, finish and \
                 reconcile every team's work. Give --tokens-file (README, \"Access control\"), listen on \
                 127.0.0.1, or pass --allow-anonymous when something in front authenticates callers",
                config.listen
            );
            tracing::warn!(listen = %config.listen, "serving without tokens on a non-loopback address (--allow-anonymous): every caller is an admin");
        }
        return Ok(Access::open());
    };
    let access = Access::from_file(path).context("reading the tokens file")?;
    tracing::info!(file = %path.display(), "access control on");
    Ok(access)
}

/// Re-reads the tokens file on every SIGHUP; a file that does not read keeps
/// the tokens in force.
#[cfg(unix)]
async fn reload_tokens_on_sighup(access: Arc<Access>, mut hangups: tokio::signal::unix::Signal) {
    while hangups.recv().await.is_some() {
        match access.reload() {
            Ok(count) => tracing::info!(tokens = count, "tokens file reloaded"),
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "tokens file not reloaded; the tokens in force stay"
            ),
        }
    }
}

/// Connects, migrates and serves HTTP until SIGTERM.
async fn serve(config: Config) -> anyhow::Result<()> {
    config.log_format.init_tracing();

    let backend = backend_of(&config.database.database_url)
        .context("unsupported DATABASE_URL: use postgres://… or sqlite://…")?;
    config.limits.check()?;
    anyhow::ensure!(
        config.limits.webhook_allow_hosts.is_empty() || config.webhooks.webhook_secret.is_some(),
        "--webhook-allow-hosts needs --webhook-secret (LEDGER_WEBHOOK_SECRET, whsec_ and base64): every webhook is signed"
    );
    if config.database.statement_timeout_seconds >= config.request_timeout_seconds {
        tracing::warn!(
            statement_timeout_seconds = config.database.statement_timeout_seconds,
            request_timeout_seconds = config.request_timeout_seconds,
            "a statement may outlive the request that started it: keep --statement-timeout-seconds below \
             --request-timeout-seconds"
        );
    }
    let access = Arc::new(access_of(&config)?);
    // Installed before anything else waits, so a SIGHUP never ends the process.
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("handling SIGHUP")?;
    let options = config.store_options()?;

    // The port opens before the database is reached: /healthz answers at once,
    // /readyz and /v1 answer 503 with Retry-After until the ledger is ready.
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, "serving HTTP");
    let ready = Arc::new(OnceLock::new());
    let shutdown = Arc::new(tokio::sync::watch::Sender::new(false));
    // On SIGTERM: stop accepting, let waiting claims answer at once, finish
    // what is in flight, and give up on stragglers after the grace period.
    let stopping = shutdown.clone();
    let bounds = ServeOptions {
        header_read_timeout: Duration::from_secs(config.header_read_timeout_seconds),
        max_connections: config.max_connections as usize,
    };
    let server = child_ledger::server::serve(listener, until_ready(ready.clone(), backend), bounds, async move {
        shutdown_signal().await;
        stopping.send_replace(true);
    });
    let mut server = tokio::spawn(server);

    // A SIGTERM while the database is still being waited for is a clean exit too.
    let mut stop = shutdown.subscribe();
    let store = tokio::select! {
        store = connect_with_backoff(&config.database.database_url, &options) => store?,
        _ = stop.wait_for(|stopping| *stopping) => return Ok(server.await??),
    };
    store.migrate().await.context("applying migrations")?;
    if options.behind_transaction_pooler && options.direct_url.is_none() && backend == "postgres" {
        tracing::warn!(
            wait_recheck_ms = config.limits.wait_recheck_ms,
            "--db-pooler transaction without --listen-database-url: LISTEN cannot work through the pooler, so a \
             waiting claim learns of another replica's work only on its periodic recheck; pass a URL straight \
             to Postgres as --listen-database-url (LEDGER_LISTEN_DATABASE_URL) for long polls that wake at once"
        );
    }

    let mut state = AppState::new(store, config.limits.clone()).with_access(Arc::clone(&access));
    state.shutdown = shutdown.clone();
    #[cfg(unix)]
    tokio::spawn(reload_tokens_on_sighup(access, hangups));
    let reaper = tokio::spawn(reap_expired_leases(state.clone(), config.reap_interval()));
    let work_listener = tokio::spawn(listen_for_work(state.clone()));
    let webhooks = child_ledger::jobs::WebhookSender::from_config(&config.webhooks, &config.limits.webhook_allow_hosts)
        .map(|sender| tokio::spawn(child_ledger::jobs::send_webhooks(state.clone(), sender)));
    let reconcile_jobs = tokio::spawn(child_ledger::jobs::work_reconcile_jobs(
        state.clone(),
        config.reconcile_jobs.options(),
    ));
    let pruner = config
        .retention()
        .map(|(retain, every)| tokio::spawn(prune_complete_parents(state.clone(), retain, every)));
    let _ = ready.set(app_with_timeout(
        state,
        Duration::from_secs(config.request_timeout_seconds),
    ));
    tracing::info!(backend, "ledger ready");

    let grace = Duration::from_secs(config.shutdown_grace_seconds);
    let mut stop = shutdown.subscribe();
    let deadline = async move {
        let _ = stop.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = &mut server => served??,
        () = deadline => tracing::warn!(grace_seconds = grace.as_secs(), "requests still in flight after the grace period; exiting"),
    }
    reaper.abort();
    work_listener.abort();
    if let Some(webhooks) = webhooks {
        webhooks.abort();
    }
    reconcile_jobs.abort();
    if let Some(pruner) = pruner {
        pruner.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Connects, retrying with backoff while the database is not up yet; an
/// error no retry can fix ends the process with what to change.
async fn connect_with_backoff(url: &str, options: &StoreOptions) -> anyhow::Result<Store> {
    let mut delay = Duration::from_millis(250);
    loop {
        match Store::connect_with(url, options).await {
            Ok(store) => return Ok(store),
            Err(err) => {
                if let Some(what_to_change) = permanent_connect_error(&err) {
                    anyhow::bail!("cannot use the database: {what_to_change}");
                }
                tracing::warn!(
                    error = format!("{err:#}"),
                    retry_in_ms = delay.as_millis() as u64,
                    "database not reachable; retrying"
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
