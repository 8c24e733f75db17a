//! Fresh planner statistics: the hot tables analyzed as they grow and churn,
//! whether or not the database's autovacuum runs.
//!
//! A ledger on a fresh or restored database, or on one whose autovacuum is
//! off or behind, would otherwise plan its claims and outcomes for tables as
//! they were when empty, and keep those plans: one outcome statement walked
//! every child of its parent, and throughput fell to a third in the first
//! minute (`benches/RESULTS.md`, "fresh database").

use std::time::Duration;

use crate::state::AppState;

/// How often the hot tables' change counts are looked at.
pub const STATISTICS_INTERVAL: Duration = Duration::from_secs(5);

/// Every `interval`, analyzes the hot tables whose statistics went stale
/// (`Store::refresh_statistics`). Replicas may all run it: a table another
/// is analyzing is skipped, and one just analyzed is not stale.
pub async fn keep_statistics_fresh(state: AppState, interval: Duration) {
    while !super::rest(&state, interval).await {
        match state.store.refresh_statistics().await {
            Ok(tables) if tables.is_empty() => {}
            Ok(tables) => tracing::debug!(?tables, "stale statistics refreshed"),
            Err(err) => tracing::warn!(error = %err, "refreshing statistics failed; retrying next tick"),
        }
    }
}
