//! child-ledger: a durable per-child ledger for fan-out work.
//!
//! One row per child is written before anything is dispatched; workers claim
//! leased chunks over HTTP and record exactly one terminal outcome per child;
//! parent counters are a projection of the child rows.

pub mod api;
pub mod config;
pub mod error;
pub mod ledger;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tower_http::trace::TraceLayer;

use config::Limits;
use store::Store;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
    /// Wakes long-polling claims in this process when work may have become
    /// claimable (a registration, seal, release, retry or expired lease).
    pub work_signal: Arc<tokio::sync::Notify>,
    pub metrics: Arc<api::Metrics>,
}

impl AppState {
    pub fn new(store: Store, limits: Limits) -> Self {
        Self {
            store,
            limits: Arc::new(limits),
            work_signal: Arc::new(tokio::sync::Notify::new()),
            metrics: Arc::new(api::Metrics::default()),
        }
    }

    pub fn signal_work(&self) {
        self.work_signal.notify_waiters();
    }
}

/// The whole service as a router: shared by `main` and the tests.
pub fn app(state: AppState) -> Router {
    app_with_timeout(state, Duration::from_secs(60))
}

pub fn app_with_timeout(state: AppState, request_timeout: Duration) -> Router {
    api::router(state, request_timeout).layer(TraceLayer::new_for_http())
}

/// Sweeps expired leases every `interval` until the process ends, waking
/// long-polling claimers when children became claimable again.
pub async fn reap_expired_leases(state: AppState, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        match state.store.expire_leases(None).await {
            Ok(0) => {}
            Ok(moved) => {
                tracing::info!(moved, "expired leases swept");
                state.signal_work();
            }
            Err(err) => tracing::warn!(error = %err, "lease sweep failed; retrying next tick"),
        }
    }
}
