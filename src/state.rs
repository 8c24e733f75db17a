//! What every handler and background loop shares.

use std::sync::Arc;

use crate::access::Access;
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::store::Store;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
    /// Who may call what: open, or the tokens file as last read.
    pub access: Arc<Access>,
    /// Wakes long-polling claims in this process when work may have become
    /// claimable (a registration, seal, release, retry or expired lease, here
    /// or, through Postgres `NOTIFY`, on another replica).
    pub work_signal: Arc<tokio::sync::Notify>,
    pub metrics: Arc<Metrics>,
    /// Turns for bulk bodies over 1 MiB being read and handled at once
    /// (`--max-bulk-bodies`).
    pub bulk_bodies: Arc<tokio::sync::Semaphore>,
    /// Long-poll claims waiting now in this process (`--max-waiting-claims`).
    pub waiting_claims: Arc<std::sync::atomic::AtomicUsize>,
    /// Set once on SIGTERM: waiting claims answer at once instead of holding on.
    pub shutdown: Arc<tokio::sync::watch::Sender<bool>>,
}

impl AppState {
    pub fn new(store: Store, limits: Limits) -> Self {
        let metrics = Arc::new(Metrics::with_max_queues(limits.max_metric_queues));
        let bulk_bodies = Arc::new(tokio::sync::Semaphore::new(limits.max_bulk_bodies.max(1) as usize));
        Self {
            store,
            limits: Arc::new(limits),
            access: Arc::new(Access::open()),
            work_signal: Arc::new(tokio::sync::Notify::new()),
            metrics,
            waiting_claims: Arc::default(),
            bulk_bodies,
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Work may have become claimable: wake this process's waiting claims now
    /// and, with one `NOTIFY` (never one per child), every other replica's.
    pub fn signal_work(&self) {
        self.work_signal.notify_waiters();
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(err) = store.notify_work().await {
                tracing::debug!(error = %err, "work notification not sent; other replicas recheck on their own");
            }
        });
    }

    /// The same service, with these access rules.
    pub fn with_access(mut self, access: Arc<Access>) -> Self {
        self.access = access;
        self
    }

    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}
