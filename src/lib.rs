//! child-ledger: a durable per-child ledger for fan-out work.
//!
//! One row per child is written before anything is dispatched; workers claim
//! leased chunks over HTTP and record exactly one terminal outcome per child;
//! parent counters are a projection of the child rows.

pub mod api;
pub mod config;
pub mod error;
pub mod jobs;
pub mod ledger;
pub mod metrics;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, Request};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

use config::Limits;
pub use jobs::{listen_for_work, reap_expired_leases};
use store::Store;

/// The header that carries a request's id: taken from the caller when sent,
/// generated (a UUID) otherwise, echoed on the response and on every log line.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
    /// Wakes long-polling claims in this process when work may have become
    /// claimable (a registration, seal, release, retry or expired lease, here
    /// or, through Postgres `NOTIFY`, on another replica).
    pub work_signal: Arc<tokio::sync::Notify>,
    pub metrics: Arc<metrics::Metrics>,
    /// Set once on SIGTERM: waiting claims answer at once instead of holding on.
    pub shutdown: Arc<tokio::sync::watch::Sender<bool>>,
}

impl AppState {
    pub fn new(store: Store, limits: Limits) -> Self {
        Self {
            store,
            limits: Arc::new(limits),
            work_signal: Arc::new(tokio::sync::Notify::new()),
            metrics: Arc::default(),
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Work may have become claimable: wake this process's waiting claims now
    /// and, with one `NOTIFY` (never one per child), every other replica's.
    pub fn signal_work(&self) {
        self.work_signal.notify_waiters();
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(err) = store.notify_work().await {
                tracing::debug!(error = %err, "work notification not sent; other replicas recheck on their own");
            }
        });
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// The whole service as a router: shared by `main` and the tests.
pub fn app(state: AppState) -> Router {
    app_with_timeout(state, Duration::from_secs(60))
}

pub fn app_with_timeout(state: AppState, request_timeout: Duration) -> Router {
    let trace = TraceLayer::new_for_http().make_span_with(|request: &Request<_>| {
        let id = request
            .extensions()
            .get::<RequestId>()
            .and_then(|id| id.header_value().to_str().ok())
            .unwrap_or("-");
        tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
    });
    api::router(state, request_timeout)
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}
