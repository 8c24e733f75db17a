//! Wakes this process's waiting claims when another replica signals work,
//! and marks what its event streams show when another replica changed it:
//! both arrive on the one `LISTEN` connection the process holds.

use std::time::Duration;

use crate::ledger::{Changes, Work};
use crate::state::AppState;
use crate::store::Heard;

/// Listens for other replicas' work notifications (Postgres `LISTEN`) and
/// reconnects with backoff when the database goes away. Returns at once on
/// SQLite, where every claim is in this process.
pub async fn listen_for_work(state: AppState) {
    let mut delay = Duration::from_millis(250);
    let mut stopping = state.shutdown.subscribe();
    loop {
        let listening = tokio::select! {
            listening = state.store.listen_for_work() => listening,
            _ = stopping.wait_for(|stopping| *stopping) => return,
        };
        match listening {
            Ok(None) => return,
            Ok(Some(mut listener)) => {
                delay = Duration::from_millis(250);
                // A (re)connection may have missed notifications: look again.
                state.waiters.wake(&Work::unknown());
                state.events.changed(&Changes::everything());
                loop {
                    let heard = tokio::select! {
                        heard = listener.recv() => heard,
                        _ = stopping.wait_for(|stopping| *stopping) => return,
                    };
                    match heard {
                        Ok(Heard::Work(work)) => {
                            state.waiters.wake(&work);
                        }
                        Ok(Heard::Changed(changes)) => {
                            state.waiters.slots_may_have_freed();
                            state.events.changed(&changes);
                        }
                        // This process told its own waiters and streams when it sent it.
                        Ok(Heard::Own) => {}
                        Err(err) => {
                            tracing::warn!(error = %err, "work notifications interrupted; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "cannot listen for work"),
        }
        if super::rest(&state, delay).await {
            return;
        }
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
