//! The lease reaper: expired leases go back to pending, held or failed.

use std::time::Duration;

use crate::state::AppState;

/// Sweeps expired leases every `interval` until the process ends (the store
/// wakes the claims waiting for what came back).
pub async fn reap_expired_leases(state: AppState, interval: Duration) {
    while !super::rest(&state, interval).await {
        match state.store.expire_leases(None).await {
            Ok(0) => {}
            Ok(moved) => tracing::info!(moved, "expired leases swept"),
            Err(err) => tracing::warn!(error = %err, "lease sweep failed; retrying next tick"),
        }
    }
}
