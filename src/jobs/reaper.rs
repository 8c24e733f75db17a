//! The lease reaper: expired leases go back to pending, held or failed.

use std::time::Duration;

use crate::state::AppState;
use crate::waiters::Work;

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
                // Some went to held or failed: a few waiters may look for nothing.
                state.signal_work(Work::anywhere(moved));
            }
            Err(err) => tracing::warn!(error = %err, "lease sweep failed; retrying next tick"),
        }
    }
}
