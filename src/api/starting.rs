//! What the service answers while it is still reaching its database. The
//! port opens at once, so a liveness probe sees a live process and does not
//! restart it in a loop; readiness and every other route answer `503` with
//! `Retry-After` until the ledger is connected and migrated.

use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::Request;
use axum::routing::get;
use axum::{Json, Router};
use tower::ServiceExt;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};

use super::REQUEST_ID;
use super::ops::Health;
use crate::error::ApiError;

/// Serves `ready` once it is set, and the starting answers until then.
/// `why` holds the last reason the database could not be used, which
/// `/readyz` gives.
pub fn until_ready(ready: Arc<OnceLock<Router>>, backend: &'static str, why: Arc<Mutex<Option<String>>>) -> Router {
    let starting = Router::new()
        .route(
            "/readyz",
            get(move || async move {
                match why.lock().expect("reason lock").clone() {
                    Some(why) => ApiError::NotReady(why),
                    None => ApiError::Starting,
                }
            }),
        )
        .route(
            "/healthz",
            get(move || async move {
                Json(Health {
                    status: "ok".to_owned(),
                    store: backend.to_owned(),
                    host: None,
                })
            })
            .fallback(|| async { ApiError::Starting }),
        )
        .fallback(|| async { ApiError::Starting })
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid));
    Router::new().fallback_service(tower::service_fn(move |request: Request| {
        let router = ready.get().cloned().unwrap_or_else(|| starting.clone());
        async move { router.oneshot(request).await }
    }))
}
