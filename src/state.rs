//! What every handler and background loop shares.

use std::sync::Arc;

use crate::access::Access;
use crate::events::EventHub;
use crate::limits::Limits;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::waiters::Waiters;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
    /// Who may call what: open, or the tokens file as last read.
    pub access: Arc<Access>,
    /// Long-polling claims in this process, woken when work becomes claimable
    /// (the store says so after a registration, seal, release, retry, resume
    /// or expired lease here; `jobs::listen_for_work` when another replica's
    /// `NOTIFY` says so): as many as there is work for.
    pub waiters: Arc<Waiters>,
    /// This process among the replicas (the store's id of it).
    pub replica: u64,
    pub metrics: Arc<Metrics>,
    /// What this process's event streams watch, read once for all of them;
    /// the store's change signals mark what to read.
    pub events: Arc<EventHub>,
    /// Turns of the results exports streaming now (`--max-exports`, a
    /// token's share `--max-exports-per-token`).
    pub exports: Arc<crate::turns::Turns>,
    /// Turns for bulk bodies over 1 MiB being read and handled at once
    /// (`--max-bulk-bodies`).
    pub bulk_bodies: Arc<tokio::sync::Semaphore>,
    /// Long-poll claims waiting now in this process (`--max-waiting-claims`).
    pub waiting_claims: Arc<std::sync::atomic::AtomicUsize>,
    /// Set once on SIGTERM: waiting claims answer at once instead of holding on.
    pub shutdown: Arc<tokio::sync::watch::Sender<bool>>,
}

impl AppState {
    /// The state of a service over `store`; the store's work signals wake
    /// this state's waiting claims.
    pub fn new(store: Store, limits: Limits) -> Self {
        let metrics = Arc::new(Metrics::with_max_queues(limits.max_metric_queues));
        let bulk_bodies = Arc::new(tokio::sync::Semaphore::new(limits.max_bulk_bodies.max(1) as usize));
        let waiters: Arc<Waiters> = Arc::default();
        let woken = Arc::clone(&waiters);
        store.on_work(move |work| {
            woken.wake(work);
        });
        let events = EventHub::new(
            store.clone(),
            Arc::clone(&metrics),
            limits.max_event_streams,
            limits.max_event_streams_per_token,
        );
        let exports = Arc::new(crate::turns::Turns::new(
            limits.max_exports,
            limits.max_exports_per_token,
        ));
        let hub = Arc::downgrade(&events);
        let freed = Arc::clone(&waiters);
        store.on_change(move |changes| {
            freed.slots_may_have_freed();
            if let Some(hub) = hub.upgrade() {
                hub.changed(changes);
            }
        });
        Self {
            replica: store.replica(),
            store,
            limits: Arc::new(limits),
            access: Arc::new(Access::open()),
            waiters,
            metrics,
            events,
            exports,
            waiting_claims: Arc::default(),
            bulk_bodies,
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
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
