//! Wakes this process's waiting claims when another replica signals work.

use std::time::Duration;

use crate::state::{AppState, WorkNotice};
use crate::waiters::Work;

/// Listens for other replicas' work notifications (Postgres `LISTEN`) and
/// reconnects with backoff when the database goes away. Returns at once on
/// SQLite, where every claim is in this process.
pub async fn listen_for_work(state: AppState) {
    let mut delay = Duration::from_millis(250);
    loop {
        match state.store.listen_for_work().await {
            Ok(None) => return,
            Ok(Some(mut listener)) => {
                delay = Duration::from_millis(250);
                // A (re)connection may have missed notifications: look again.
                state.waiters.wake(&Work::unknown());
                loop {
                    match listener.recv().await {
                        Ok(payload) => match WorkNotice::from_payload(&payload) {
                            // This process woke its own waiters when it sent it.
                            Some(notice) if notice.replica == state.replica => {}
                            Some(notice) => {
                                state.waiters.wake(&notice.work);
                            }
                            None => {
                                state.waiters.wake(&Work::unknown());
                            }
                        },
                        Err(err) => {
                            tracing::warn!(error = %err, "work notifications interrupted; reconnecting");
                            break;
                        }
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, retry_in_ms = delay.as_millis() as u64, "cannot listen for work"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}
