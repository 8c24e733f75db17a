//! Background loops every replica runs beside the HTTP server.

mod pruner;
mod reaper;
mod reconcile_jobs;
mod statistics;
mod webhook_client;
mod webhooks;
mod work_listener;

pub use pruner::prune_complete_parents;
pub use reaper::reap_expired_leases;
pub use reconcile_jobs::{ReconcileJobOptions, work_reconcile_jobs};
pub use statistics::{STATISTICS_INTERVAL, keep_statistics_fresh};
pub use webhook_client::{ANSWER_BYTES, Resolve, SystemResolver};
pub use webhooks::{QUEUE_HEADER, WebhookSender, send_webhooks};
pub use work_listener::listen_for_work;

use std::time::Duration;

use crate::state::AppState;

/// Waits `duration`, or less when the service starts stopping; whether it
/// is stopping (the loop then ends, having finished its last step).
pub(crate) async fn rest(state: &AppState, duration: Duration) -> bool {
    let mut stopping = state.shutdown.subscribe();
    tokio::select! {
        () = tokio::time::sleep(duration) => state.is_shutting_down(),
        _ = stopping.wait_for(|stopping| *stopping) => true,
    }
}
