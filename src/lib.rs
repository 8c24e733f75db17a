//! child-ledger: a durable per-child ledger for fan-out work.
//!
//! One row per child is written before anything is dispatched; workers claim
//! leased chunks over HTTP and record exactly one terminal outcome per child;
//! parent counters are a projection of the child rows.

pub mod access;
pub mod api;
pub mod cli;
pub mod config;
pub mod error;
pub mod events;
pub mod jobs;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod server;
pub mod startup;
mod state;
pub mod store;
pub mod telemetry;
pub mod turns;
pub mod waiters;

use std::time::Duration;

use axum::Router;
use axum::http::Request;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, RequestId, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, OnResponse, TraceLayer};

pub use state::AppState;

pub use api::REQUEST_ID;

/// The whole service as a router, each request answered within
/// `request_timeout` (`startup` serves it, in `main` and in the tests).
pub fn app(state: AppState, request_timeout: Duration) -> Router {
    let trace = TraceLayer::new_for_http()
        .make_span_with(|request: &Request<_>| {
            let id = request
                .extensions()
                .get::<RequestId>()
                .and_then(|id| id.header_value().to_str().ok())
                .unwrap_or("-");
            let span = tracing::info_span!(
                "request",
                method = %request.method(),
                path = %request.uri().path(),
                request_id = %id,
                otel.name = tracing::field::Empty,
                otel.kind = "server",
                http.request.method = %request.method(),
                http.route = tracing::field::Empty,
                http.response.status_code = tracing::field::Empty,
                parent_id = tracing::field::Empty,
                queue = tracing::field::Empty,
            );
            telemetry::join_caller(&span, request.headers());
            span
        })
        .on_response(
            |response: &axum::http::Response<_>, latency: Duration, span: &tracing::Span| {
                span.record("http.response.status_code", response.status().as_u16());
                // Then the line every response logs ("finished processing request").
                OnResponse::on_response(DefaultOnResponse::default(), response, latency, span);
            },
        );
    api::router(state, request_timeout)
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
        .layer(axum::middleware::map_request(drop_unfit_request_id))
}

/// A caller's request id is kept only when it is 1-64 characters of
/// `A-Z a-z 0-9 . _ -`: anything else (a newline, quotes, a megabyte) would
/// forge or flood log lines, so it is replaced by a fresh one.
async fn drop_unfit_request_id<B>(mut request: Request<B>) -> Request<B> {
    let fit = request
        .headers()
        .get(&REQUEST_ID)
        .is_none_or(|id| request_id_is_fit(id.as_bytes()));
    if !fit {
        request.headers_mut().remove(&REQUEST_ID);
    }
    request
}

fn request_id_is_fit(id: &[u8]) -> bool {
    (1..=64).contains(&id.len())
        && id
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_plain_short_request_ids_are_kept() {
        assert!(super::request_id_is_fit(b"abc-123_X.y"));
        assert!(super::request_id_is_fit(&[b'a'; 64]));
        assert!(!super::request_id_is_fit(&[b'a'; 65]));
        assert!(!super::request_id_is_fit(b""));
        assert!(!super::request_id_is_fit(b"a b"));
        assert!(!super::request_id_is_fit(b"x\" level=error"));
    }
}
