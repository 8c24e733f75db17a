//! child-ledger: a durable per-child ledger for fan-out work.
//!
//! One row per child is written before anything is dispatched; workers claim
//! leased chunks over HTTP and record exactly one terminal outcome per child;
//! parent counters are a projection of the child rows.

pub mod access;
pub mod api;
pub mod config;
pub mod error;
pub mod jobs;
pub mod ledger;
pub mod metrics;
mod state;
pub mod store;

use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, Request};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::TraceLayer;

pub use jobs::{listen_for_work, reap_expired_leases};
pub use state::AppState;

/// The header that carries a request's id: taken from the caller when sent,
/// generated (a UUID) otherwise, echoed on the response and on every log line.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

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
