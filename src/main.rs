use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use tracing_subscriber::EnvFilter;

use child_ledger::config::{Cli, LogFormat};
use child_ledger::store::{Store, StoreOptions};
use child_ledger::{AppState, app_with_timeout, reap_expired_leases};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = cli.config;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    match config.log_format {
        LogFormat::Text => tracing_subscriber::fmt().with_env_filter(filter).init(),
        LogFormat::Json => tracing_subscriber::fmt().json().with_env_filter(filter).init(),
    }

    let options = StoreOptions {
        max_connections: config.db_max_connections,
        ..StoreOptions::default()
    };
    let store = connect_with_backoff(&config.database_url, &options).await;
    store.migrate().await.context("applying migrations")?;
    tracing::info!(backend = store.backend(), "ledger ready");

    let state = AppState::new(store, config.limits.clone());
    let reaper = tokio::spawn(reap_expired_leases(state.clone(), config.reap_interval()));
    let router = app_with_timeout(state, Duration::from_secs(config.request_timeout_seconds));

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("binding {}", config.listen))?;
    tracing::info!(listen = %config.listen, "serving HTTP");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    reaper.abort();
    tracing::info!("stopped");
    Ok(())
}

/// Connects, retrying with backoff while the database is not up yet.
async fn connect_with_backoff(url: &str, options: &StoreOptions) -> Store {
    let mut delay = Duration::from_millis(250);
    loop {
        match Store::connect_with(url, options).await {
            Ok(store) => return store,
            Err(err) => {
                tracing::warn!(
                    error = format!("{err:#}"),
                    retry_in_ms = delay.as_millis() as u64,
                    "database not reachable"
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
