use std::sync::Arc;

use anyhow::Context;

use child_ledger::access::{self, Access, Role};
use child_ledger::config::{Cli, Command, Config, TokenCommand, WebhookCommand};
use child_ledger::startup::Application;

/// mimalloc: under glibc's malloc, allocating and freeing (rows, JSON,
/// request and response buffers) took about a sixth of the service's CPU in
/// a burn-down beside event streams.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's options, set before the runtime starts (`mi_option_e` of the
/// bundled mimalloc v3's `mimalloc.h`).
mod allocator_options {
    use libmimalloc_sys::{mi_option_set, mi_option_t};

    /// `mi_option_purge_delay`: how long freed pages stay committed before
    /// they go back to the system, in milliseconds (1,000 by default).
    /// Not among the sys crate's named options, so its number is written here.
    const PURGE_DELAY: mi_option_t = 15;

    /// Pages a request freed go back to the system 10 ms later rather than a
    /// second later. A registration of 100,000 children (12 MB of JSON, its
    /// parsed children, the statement's arrays) frees large blocks while the
    /// next one allocates: three of them in a row took the SQLite service to
    /// 148-166 MiB of resident memory with the default, 111-121 with 10 ms,
    /// 91-95 at once (glibc's malloc: 95); a SQLite burn-down of 200,000
    /// children peaked at 132-148 MiB, 105-108 with 10 ms. At once cost that
    /// burn-down's service 11-15% more CPU; 10 ms, nothing measurable
    /// (`benches/RESULTS.md`).
    pub fn set() {
        // SAFETY: `mi_option_set` is not thread safe: `main` calls this
        // before the runtime (or anything else) starts a thread. The option is
        // read when memory is next freed.
        unsafe {
            mi_option_set(PURGE_DELAY, 10);
        }
    }

    #[cfg(test)]
    mod tests {
        /// `PURGE_DELAY` is a position in mimalloc's option list, written by
        /// hand: the option there has purge_delay's default (1,000 ms) before
        /// `set`, and 10 after (run without `MIMALLOC_PURGE_DELAY` set).
        #[test]
        fn purge_delay_is_the_option_it_names() {
            use libmimalloc_sys::mi_option_get;
            // SAFETY: this test is the only code in its binary that reads or
            // sets mimalloc's options.
            assert_eq!(unsafe { mi_option_get(super::PURGE_DELAY) }, 1_000);
            super::set();
            assert_eq!(unsafe { mi_option_get(super::PURGE_DELAY) }, 10);
        }
    }
}

fn main() -> std::process::ExitCode {
    // Before the runtime's threads, and before anything opens a database.
    allocator_options::set();
    child_ledger::store::prepare_sqlite_memory();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build();
    match runtime {
        Ok(runtime) => runtime.block_on(async { child_ledger::cli::exit_code(run(Cli::parse_args()).await) }),
        Err(err) => child_ledger::cli::exit_code(Err(anyhow::Error::new(err).context("starting the runtime"))),
    }
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
        Command::Webhook {
            command: WebhookCommand::Secret { queue, webhook_secret },
        } => child_ledger::cli::webhook_secret(webhook_secret.as_ref(), &queue),
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
                 reconcile every team's work. Give --tokens-file (docs/access-control.md), listen on \
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

/// Serves HTTP until SIGTERM (see `startup`).
async fn serve(config: Config) -> anyhow::Result<()> {
    let exporter = config.log_format.init_tracing();
    let served = serve_logged(config).await;
    if let Some(exporter) = exporter {
        // The batch exporter's thread blocks: not on the runtime's.
        let _ = tokio::task::spawn_blocking(move || exporter.shutdown()).await;
    }
    served
}

async fn serve_logged(config: Config) -> anyhow::Result<()> {
    let access = Arc::new(access_of(&config)?);
    // Installed before anything else waits, so a SIGHUP never ends the process.
    #[cfg(unix)]
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("handling SIGHUP")?;
    let app = Application::bind(config, Arc::clone(&access)).await?;
    let stopper = app.stopper();
    tokio::spawn(async move {
        shutdown_signal().await;
        stopper.stop();
    });
    #[cfg(unix)]
    tokio::spawn(reload_tokens_on_sighup(access, hangups));
    match app.start().await? {
        Some(running) => running.wait().await,
        None => Ok(()),
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
