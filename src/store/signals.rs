//! What the store tells the rest of the service when its statements change
//! what others wait for. The store raises these itself, after the commit, so
//! every caller (HTTP, the command line, a background loop) raises the same:
//! - **work**: children became claimable (a registration, seal, release,
//!   retry, resume or expired lease). This process's waiting claims hear it
//!   through the hook `Store::on_work` sets; every other replica's through
//!   one `NOTIFY` per statement, never one per child.
//! - **completion**: a parent completed. Its webhook event was committed with
//!   it; the sender is woken, and it is counted for the metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::backend::Notifications;
use super::{Store, StoreResult};
use crate::ledger::{ParentId, Work};

/// Who hears of work in this process.
type WorkHook = Box<dyn Fn(&Work) + Send + Sync>;

pub(super) struct Signals {
    /// This process among the replicas: its own notifications are not
    /// answered twice.
    replica: u64,
    on_work: OnceLock<WorkHook>,
    /// Wakes the webhook sender when this process completed a parent.
    webhook_wake: tokio::sync::Notify,
    /// Children whose expired lease this process swept, for the metrics.
    pub expired_total: AtomicU64,
    /// Parents this process completed, for the metrics.
    completed_total: AtomicU64,
}

impl Default for Signals {
    fn default() -> Self {
        let uuid = uuid::Uuid::new_v4().as_u64_pair();
        Self {
            replica: uuid.0 ^ uuid.1,
            on_work: OnceLock::new(),
            webhook_wake: tokio::sync::Notify::new(),
            expired_total: AtomicU64::new(0),
            completed_total: AtomicU64::new(0),
        }
    }
}

/// A `NOTIFY` payload: which replica found which work.
#[derive(Debug, Serialize, Deserialize)]
struct WorkNotice {
    #[serde(rename = "r")]
    replica: u64,
    #[serde(flatten)]
    work: Work,
}

/// Other replicas' work, as they notify it (Postgres `LISTEN`).
pub struct WorkListener {
    notifications: Box<dyn Notifications>,
    replica: u64,
}

impl WorkListener {
    /// Waits for the next notification: the work another replica found,
    /// `None` for this process's own (its waiters heard it when it was sent),
    /// and unknown work (every waiter looks again) for a payload this build
    /// cannot read.
    pub async fn recv(&mut self) -> StoreResult<Option<Work>> {
        let payload = self.notifications.recv().await?;
        Ok(match serde_json::from_str::<WorkNotice>(&payload) {
            Ok(notice) if notice.replica == self.replica => None,
            Ok(notice) => Some(notice.work),
            Err(_) => Some(Work::unknown()),
        })
    }
}

impl Store {
    /// Who in this process hears of work (the waiting claims); set once,
    /// when the service is built.
    pub fn on_work(&self, hook: impl Fn(&Work) + Send + Sync + 'static) {
        if self.signals.on_work.set(Box::new(hook)).is_err() {
            tracing::error!("the work hook was set twice; the first one stays");
        }
    }

    /// This process's id among the replicas.
    pub fn replica(&self) -> u64 {
        self.signals.replica
    }

    /// Children became claimable: tells this process's waiting claims at
    /// once and every other replica's with one notification.
    pub(super) fn signal_work(&self, work: Work) {
        if work.children == 0 {
            return;
        }
        if let Some(hook) = self.signals.on_work.get() {
            hook(&work);
        }
        let db = Arc::clone(&self.db);
        let payload = serde_json::to_string(&WorkNotice {
            replica: self.signals.replica,
            work,
        })
        .expect("a work notice serializes");
        tokio::spawn(async move {
            if let Err(err) = db.notify(&payload).await {
                tracing::debug!(error = %err, "work notification not sent; other replicas recheck on their own");
            }
        });
    }

    /// Other replicas' work notifications (Postgres only; `None` on SQLite,
    /// where every claim is in this process, and through a transaction pooler
    /// without a direct URL, where waiting claims rely on their recheck).
    pub async fn listen_for_work(&self) -> StoreResult<Option<WorkListener>> {
        Ok(self.db.listen().await?.map(|notifications| WorkListener {
            notifications,
            replica: self.signals.replica,
        }))
    }

    /// The one place that learns parents just completed: every statement
    /// that can complete a parent says which it completed, and `Store` hands
    /// them here once they are committed (with their webhook events).
    pub(super) fn completed(&self, parents: &[ParentId]) {
        if parents.is_empty() {
            return;
        }
        self.signals
            .completed_total
            .fetch_add(parents.len() as u64, Ordering::Relaxed);
        self.signals.webhook_wake.notify_one();
        for parent_id in parents {
            tracing::debug!(%parent_id, "parent complete");
        }
    }

    /// Wakes the webhook sender (a redelivery was queued).
    pub(super) fn wake_webhooks(&self) {
        self.signals.webhook_wake.notify_one();
    }

    /// Waits until this process completed a parent or queued a redelivery
    /// (the sender also polls: other replicas' completions do not wake it).
    pub async fn webhook_due(&self) {
        self.signals.webhook_wake.notified().await;
    }

    /// Children whose expired lease this process has swept since it started.
    pub fn leases_expired_total(&self) -> u64 {
        self.signals.expired_total.load(Ordering::Relaxed)
    }

    /// Parents this process has completed since it started.
    pub fn parents_completed_total(&self) -> u64 {
        self.signals.completed_total.load(Ordering::Relaxed)
    }
}
