//! The built-in dashboard: one page of HTML, CSS and JavaScript compiled into
//! the binary, so it works with no network access. The page holds no data:
//! its script polls the `/v1` API, and reads the selected parent's event
//! stream, with the token the user enters, so the page
//! itself is open, like `/docs`, and each API call is guarded as usual.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::state::AppState;

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";

/// The page and the files it loads (relative to `/dashboard`, so the page
/// also works behind a proxy that serves the service under a path prefix).
const FILES: [(&str, &str, &str); 7] = [
    ("/dashboard", HTML, include_str!("dashboard.html")),
    ("/dashboard/dashboard.css", CSS, include_str!("dashboard.css")),
    ("/dashboard/dashboard.js", JAVASCRIPT, include_str!("dashboard.js")),
    (
        "/dashboard/dashboard-api.js",
        JAVASCRIPT,
        include_str!("dashboard-api.js"),
    ),
    (
        "/dashboard/dashboard-dom.js",
        JAVASCRIPT,
        include_str!("dashboard-dom.js"),
    ),
    (
        "/dashboard/dashboard-live.js",
        JAVASCRIPT,
        include_str!("dashboard-live.js"),
    ),
    (
        "/dashboard/dashboard-reconcile.js",
        JAVASCRIPT,
        include_str!("dashboard-reconcile.js"),
    ),
];

/// Everything the page loads comes from this service and nothing runs inline,
/// so text that slipped into the DOM as markup still could not run. The page
/// may not be framed (its retry button is not to be clicked through a decoy).
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `/dashboard` and its files, outside the guarded API routes.
pub fn router() -> Router<AppState> {
    FILES.iter().fold(Router::new(), |router, &(path, content_type, body)| {
        router.route(path, get(move || async move { file(content_type, body) }))
    })
}

fn file(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static(CONTENT_SECURITY_POLICY),
            ),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
            (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        body,
    )
}
