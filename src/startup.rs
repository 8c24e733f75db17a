//! Starting and stopping the service, in one place: `main`, the tests and
//! the bench (through the binary) start the same thing.
//!
//! 1. `Application::bind` opens the port. `/healthz` answers at once;
//!    `/readyz` and `/v1` answer 503 with `Retry-After` until the ledger is ready.
//! 2. `Application::start` connects (retrying while the database is not up),
//!    migrates, starts the background loops and serves the ledger.
//! 3. `Running::wait` serves until stopped (SIGTERM in `main`, `Stopper::stop`
//!    anywhere), then stops accepting, lets requests in flight finish within
//!    `--shutdown-grace-seconds`, and lets every background loop finish its
//!    step and give back what it holds (a reconcile job's lease), so another
//!    replica takes over at once.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::access::Access;
use crate::api::until_ready;
use crate::config::Config;
use crate::jobs;
use crate::server::ServeOptions;
use crate::state::AppState;
use crate::store::{Store, StoreOptions, backend_of, permanent_connect_error};

/// The service with its port open, before the ledger is ready.
pub struct Application {
    config: Config,
    access: Arc<Access>,
    backend: &'static str,
    address: SocketAddr,
    ready: Arc<OnceLock<axum::Router>>,
    /// Why the database cannot be used yet, for `/readyz`.
    why: Arc<Mutex<Option<String>>>,
    stopping: Arc<watch::Sender<bool>>,
    server: JoinHandle<std::io::Result<()>>,
}

/// Stops a service from anywhere: its server stops accepting, and its
/// waiting claims and background loops wind down.
#[derive(Clone)]
pub struct Stopper(Arc<watch::Sender<bool>>);

impl Stopper {
    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

/// The service serving its ledger, with its background loops.
pub struct Running {
    state: AppState,
    address: SocketAddr,
    server: JoinHandle<std::io::Result<()>>,
    loops: Vec<(&'static str, JoinHandle<()>)>,
    grace: Duration,
}

impl Application {
    /// Checks the configuration and opens the port.
    pub async fn bind(config: Config, access: Arc<Access>) -> anyhow::Result<Self> {
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
        // Checked before the port opens: a bad flag is a message, not a 503.
        config.store_options()?;
        crate::api::guard::check_rules(&crate::api::openapi())?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let address = listener.local_addr()?;
        tracing::info!(listen = %address, "serving HTTP");
        let ready = Arc::new(OnceLock::new());
        let why = Arc::default();
        let stopping = Arc::new(watch::Sender::new(false));
        let bounds = ServeOptions {
            header_read_timeout: Duration::from_secs(config.header_read_timeout_seconds),
            max_connections: config.max_connections as usize,
        };
        let mut stop = stopping.subscribe();
        let server = tokio::spawn(crate::server::serve(
            listener,
            until_ready(ready.clone(), backend, Arc::clone(&why)),
            bounds,
            async move {
                let _ = stop.wait_for(|stopping| *stopping).await;
            },
        ));
        Ok(Self {
            config,
            access,
            backend,
            address,
            ready,
            why,
            stopping,
            server,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.stopping))
    }

    /// Connects, migrates, starts the background loops and serves the
    /// ledger. `None` when it was stopped before the database answered (the
    /// server has then finished too).
    pub async fn start(self) -> anyhow::Result<Option<Running>> {
        let options = self.config.store_options()?;
        let mut stop = self.stopping.subscribe();
        let store = tokio::select! {
            store = connect_with_backoff(&self.config.database.database_url, &options, &self.why) => store?,
            _ = stop.wait_for(|stopping| *stopping) => {
                self.server.await??;
                return Ok(None);
            }
        };
        store.migrate().await.context("applying migrations")?;
        if options.behind_transaction_pooler && options.direct_url.is_none() && self.backend == "postgres" {
            tracing::warn!(
                wait_recheck_ms = self.config.limits.wait_recheck_ms,
                "--db-pooler transaction without --listen-database-url: LISTEN cannot work through the pooler, so a \
                 waiting claim learns of another replica's work only on its periodic recheck; pass a URL straight \
                 to Postgres as --listen-database-url (LEDGER_LISTEN_DATABASE_URL) for long polls that wake at once"
            );
        }
        let mut state = AppState::new(store, self.config.limits.clone()).with_access(Arc::clone(&self.access));
        state.shutdown = Arc::clone(&self.stopping);
        let loops = start_loops(&state, &self.config);
        let _ = self.ready.set(crate::app(
            state.clone(),
            Duration::from_secs(self.config.request_timeout_seconds),
        ));
        tracing::info!(backend = self.backend, "ledger ready");
        Ok(Some(Running {
            state,
            address: self.address,
            server: self.server,
            loops,
            grace: Duration::from_secs(self.config.shutdown_grace_seconds),
        }))
    }
}

/// The loops every replica runs beside the server.
fn start_loops(state: &AppState, config: &Config) -> Vec<(&'static str, JoinHandle<()>)> {
    let mut loops = vec![
        (
            "lease reaper",
            tokio::spawn(jobs::reap_expired_leases(state.clone(), config.reap_interval())),
        ),
        ("work listener", tokio::spawn(jobs::listen_for_work(state.clone()))),
        (
            "statistics",
            tokio::spawn(jobs::keep_statistics_fresh(state.clone(), jobs::STATISTICS_INTERVAL)),
        ),
        (
            "reconcile jobs",
            tokio::spawn(jobs::work_reconcile_jobs(
                state.clone(),
                config.reconcile_jobs.options(),
            )),
        ),
    ];
    if let Some(sender) = config.webhooks.sender(&config.limits.webhook_allow_hosts) {
        loops.push((
            "webhook sender",
            tokio::spawn(jobs::send_webhooks(state.clone(), sender)),
        ));
    }
    if let Some((retain, every)) = config.retention() {
        loops.push((
            "pruner",
            tokio::spawn(jobs::prune_complete_parents(state.clone(), retain, every)),
        ));
    }
    loops
}

impl Running {
    pub fn local_addr(&self) -> SocketAddr {
        self.address
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    pub fn stopper(&self) -> Stopper {
        Stopper(Arc::clone(&self.state.shutdown))
    }

    /// Serves until stopped, then winds down (see the module comment): at
    /// most the grace period for requests in flight, and as long again for
    /// the loops to finish their step.
    pub async fn wait(mut self) -> anyhow::Result<()> {
        let mut stop = self.state.shutdown.subscribe();
        let served = tokio::select! {
            served = &mut self.server => Some(served),
            _ = stop.wait_for(|stopping| *stopping) => None,
        };
        // The server ended by itself (its listener failed): stop the rest too.
        self.state.begin_shutdown();
        let served = match served {
            Some(served) => Some(served),
            None => match tokio::time::timeout(self.grace, &mut self.server).await {
                Ok(served) => Some(served),
                Err(_) => {
                    tracing::warn!(
                        grace_seconds = self.grace.as_secs(),
                        "requests still in flight after the grace period; exiting"
                    );
                    self.server.abort();
                    None
                }
            },
        };
        let aborts: Vec<_> = self.loops.iter().map(|(name, h)| (*name, h.abort_handle())).collect();
        let loops = futures::future::join_all(self.loops.into_iter().map(|(_, handle)| handle));
        if tokio::time::timeout(self.grace, loops).await.is_err() {
            for (name, abort) in aborts.iter().filter(|(_, abort)| !abort.is_finished()) {
                tracing::warn!(name, "background loop still busy after the grace period; stopped");
                abort.abort();
            }
        }
        tracing::info!("stopped");
        match served {
            Some(served) => Ok(served??),
            None => Ok(()),
        }
    }
}

/// Connects, retrying with backoff while the database is not up yet; an
/// error no retry can fix ends the process with what to change.
async fn connect_with_backoff(url: &str, options: &StoreOptions, why: &Mutex<Option<String>>) -> anyhow::Result<Store> {
    let mut delay = Duration::from_millis(250);
    loop {
        match Store::connect_with(url, options).await {
            Ok(store) => return Ok(store),
            Err(err) => {
                if let Some(what_to_change) = permanent_connect_error(&err) {
                    anyhow::bail!("cannot use the database: {what_to_change}");
                }
                *why.lock().expect("reason lock") = Some(format!("{err:#}"));
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
