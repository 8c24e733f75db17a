//! What every handler and background loop shares.

use std::sync::Arc;

use crate::access::Access;
use crate::config::Limits;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::waiters::{Waiters, Work};

/// A `NOTIFY` payload: which replica found which work.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct WorkNotice {
    #[serde(rename = "r")]
    pub replica: u64,
    #[serde(flatten)]
    pub work: Work,
}

impl WorkNotice {
    pub fn to_payload(&self) -> String {
        serde_json::to_string(self).expect("a work notice serializes")
    }

    /// The notice in a payload; `None` for one this build cannot read (an
    /// older replica's empty payload), which should wake every waiter.
    pub fn from_payload(payload: &str) -> Option<Self> {
        serde_json::from_str(payload).ok()
    }
}

/// A random id for this process, told apart from other replicas by it.
fn rand_replica() -> u64 {
    let uuid = uuid::Uuid::new_v4().as_u64_pair();
    uuid.0 ^ uuid.1
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub limits: Arc<Limits>,
    /// Who may call what: open, or the tokens file as last read.
    pub access: Arc<Access>,
    /// Long-polling claims in this process, woken when work becomes claimable
    /// (a registration, seal, release, retry or expired lease, here or,
    /// through Postgres `NOTIFY`, on another replica): as many as there is
    /// work for.
    pub waiters: Arc<Waiters>,
    /// This process among the replicas: its own notifications are not
    /// answered twice.
    pub replica: u64,
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
            waiters: Arc::default(),
            replica: rand_replica(),
            metrics,
            waiting_claims: Arc::default(),
            bulk_bodies,
            shutdown: Arc::new(tokio::sync::watch::Sender::new(false)),
        }
    }

    /// Work became claimable: wake as many of this process's waiting claims
    /// as it covers now and, with one `NOTIFY` (never one per child), as many
    /// of every other replica's.
    pub fn signal_work(&self, work: Work) {
        if work.children == 0 {
            return;
        }
        self.waiters.wake(&work);
        let store = self.store.clone();
        let notice = WorkNotice {
            replica: self.replica,
            work,
        };
        tokio::spawn(async move {
            if let Err(err) = store.notify_work(&notice.to_payload()).await {
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
