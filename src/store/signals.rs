//! What the store tells the rest of the service when its statements change
//! what others wait for. The store raises these itself, after the commit, so
//! every caller (HTTP, the command line, a background loop) raises the same:
//! - **work**: children became claimable (a registration, seal, release,
//!   retry, resume or expired lease). This process's waiting claims hear it
//!   through the hook `Store::on_work` sets; every other replica's through
//!   one `NOTIFY` per statement, never one per child.
//! - **completion**: a parent completed. Its webhook event was committed with
//!   it; the sender is woken, and it is counted for the metrics.
//! - **changes**: what a live view shows of some parents or queues may have
//!   moved (counts, completion, pause). This process's event streams hear it
//!   at once through the hook `Store::on_change` sets; other replicas' through
//!   one `NOTIFY` per `CHANGE_FLUSH` at most, on the work channel, naming
//!   every parent and queue that changed meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::backend::Notifications;
use super::{Store, StoreResult};
use crate::ledger::{Changes, ParentId, Work};

/// Who hears of work in this process.
type WorkHook = Box<dyn Fn(&Work) + Send + Sync>;

/// Who hears of changes in this process (the event streams).
type ChangeHook = Box<dyn Fn(&Changes) + Send + Sync>;

/// How long changes gather before they are told to other replicas in one
/// notification: a burn-down recording thousands of outcomes a second sends
/// a few notifications a second, not one per outcome.
const CHANGE_FLUSH: Duration = Duration::from_millis(100);

/// The most names one change notification carries (a `NOTIFY` payload is at
/// most 8000 bytes); past them it says "everything".
const MAX_NOTIFIED_NAMES: usize = 30;

pub(super) struct Signals {
    /// This process among the replicas: its own notifications are not
    /// answered twice.
    replica: u64,
    on_work: OnceLock<WorkHook>,
    on_change: OnceLock<ChangeHook>,
    /// Changes not yet told to other replicas; `Some` while a flush is due.
    unsent_changes: Mutex<Option<Changes>>,
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
            on_change: OnceLock::new(),
            unsent_changes: Mutex::new(None),
            webhook_wake: tokio::sync::Notify::new(),
            expired_total: AtomicU64::new(0),
            completed_total: AtomicU64::new(0),
        }
    }
}

/// A `NOTIFY` payload: which replica found which work, or changed what. A
/// change notice is a work notice of no children (`"n": 0`) too, so a build
/// that does not know changes reads it as work for no one.
#[derive(Debug, Serialize, Deserialize)]
struct WorkNotice {
    #[serde(rename = "r")]
    replica: u64,
    #[serde(flatten)]
    work: Work,
    #[serde(rename = "c", default, skip_serializing_if = "Option::is_none")]
    changes: Option<Changes>,
}

/// What a replica's notification said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// This process's own (its waiters and streams heard it when it was sent).
    Own,
    Work(Work),
    Changed(Changes),
}

/// Other replicas' work, as they notify it (Postgres `LISTEN`).
pub struct WorkListener {
    notifications: Box<dyn Notifications>,
    replica: u64,
}

impl WorkListener {
    /// Waits for the next notification: the work another replica found or
    /// what it changed, `Own` for this process's own, and unknown work (every
    /// waiter looks again) for a payload this build cannot read.
    pub async fn recv(&mut self) -> StoreResult<Heard> {
        let payload = self.notifications.recv().await?;
        Ok(match serde_json::from_str::<WorkNotice>(&payload) {
            Ok(notice) if notice.replica == self.replica => Heard::Own,
            Ok(WorkNotice {
                changes: Some(changes), ..
            }) => Heard::Changed(changes),
            Ok(notice) => Heard::Work(notice.work),
            Err(_) => Heard::Work(Work::unknown()),
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

    /// Who in this process hears of changes (the event streams); set once.
    pub fn on_change(&self, hook: impl Fn(&Changes) + Send + Sync + 'static) {
        if self.signals.on_change.set(Box::new(hook)).is_err() {
            tracing::error!("the change hook was set twice; the first one stays");
        }
    }

    /// What a live view shows of these parents or queues may have moved:
    /// tells this process's streams at once, and other replicas within
    /// `CHANGE_FLUSH`, with every change gathered meanwhile in one notice.
    pub(super) fn signal_change(&self, changes: Changes) {
        if changes.is_empty() {
            return;
        }
        if let Some(hook) = self.signals.on_change.get() {
            hook(&changes);
        }
        if self.backend != "postgres" {
            // One SQLite process: nobody else to tell.
            return;
        }
        let mut unsent = self.signals.unsent_changes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(gathering) = unsent.as_mut() {
            gathering.merge(changes);
            return;
        }
        *unsent = Some(changes);
        drop(unsent);
        let (db, signals) = (Arc::clone(&self.db), Arc::clone(&self.signals));
        tokio::spawn(async move {
            tokio::time::sleep(CHANGE_FLUSH).await;
            let Some(mut changes) = signals.unsent_changes.lock().unwrap_or_else(|p| p.into_inner()).take() else {
                return;
            };
            if changes.parents.len() + changes.queues.len() > MAX_NOTIFIED_NAMES {
                changes = Changes::everything();
            }
            let payload = serde_json::to_string(&WorkNotice {
                replica: signals.replica,
                work: Work::anywhere(0),
                changes: Some(changes),
            })
            .expect("a change notice serializes");
            if let Err(err) = db.notify(&payload).await {
                tracing::debug!(error = %err, "change notification not sent; other replicas' streams recheck on their own");
            }
        });
    }

    /// These parents' live views may have moved.
    pub(super) fn parents_changed<'a>(&self, parents: impl IntoIterator<Item = &'a ParentId>) {
        self.signal_change(Changes::of_parents(parents.into_iter().cloned()));
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
        self.signal_change(match (&work.parent, &work.queue) {
            (Some(parent), Some(queue)) => Changes::of_parent_in(parent.clone(), queue.clone()),
            (Some(parent), None) => Changes::of_parents([parent.clone()]),
            (None, Some(queue)) => Changes::of_queue(queue.clone()),
            (None, None) => Changes::everything(),
        });
        if let Some(hook) = self.signals.on_work.get() {
            hook(&work);
        }
        let db = Arc::clone(&self.db);
        let payload = serde_json::to_string(&WorkNotice {
            replica: self.signals.replica,
            work,
            changes: None,
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
        self.parents_changed(parents);
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
