//! The retention pruner: complete parents older than `--retain-complete-seconds`
//! are deleted with their children, a bounded batch at a time.

use std::time::Duration;

use crate::state::AppState;

/// Parents one round of the pruner looks at.
const ROUND: i64 = 100;

/// After each batch of deletes the pruner rests this many times as long as
/// the batch took: it uses the database a tenth of the time at most, so a
/// burn-down beside it keeps its pace (`cargo bench`, `retention.*`), and a
/// million children take about as many seconds as 10,000 per second allow.
const PACE: u32 = 9;

/// Every `interval`, deletes the parents complete for longer than `retain`,
/// oldest first, until none is left, then waits for the next tick. Each
/// parent's children go in batches of their own transactions (see
/// `Store::prune`), so the pruner never holds a lock a claim or an outcome
/// waits for. Replicas may all run it: a parent is deleted once.
pub async fn prune_complete_parents(state: AppState, retain: Duration, interval: Duration) {
    loop {
        if let Err(err) = prune_round(&state, retain).await {
            tracing::warn!(error = %err, "pruning failed; retrying next tick");
        }
        if super::rest(&state, interval).await {
            return;
        }
    }
}

async fn prune_round(state: &AppState, retain: Duration) -> crate::store::StoreResult<()> {
    loop {
        let parents = state.store.prunable(retain, ROUND).await?;
        let mut pruned = 0;
        for parent_id in &parents {
            // Each parent is deleted whole or left for the next round.
            if state.is_shutting_down() {
                return Ok(());
            }
            // Counted as each is deleted: an error later in the round
            // (another replica's pruner, a busy database) loses no count.
            if state.store.prune(parent_id, PACE).await? {
                pruned += 1;
                state.metrics.pruned(1);
            }
        }
        if pruned > 0 {
            tracing::info!(pruned, "complete parents deleted");
        }
        if (parents.len() as i64) < ROUND {
            return Ok(());
        }
    }
}
