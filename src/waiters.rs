//! Long-poll claims waiting for work, and waking as many of them as there is
//! work for: a registration of 3 children in queue `q` wakes the 3 oldest
//! waiters of `q` (fewer when they asked for more than one child each), not
//! every waiter of every queue.
//!
//! Waiters wait per queue, oldest first. A waiter is woken at most once per
//! wait and then looks again; if another claimer was quicker it waits again
//! (at the back). The periodic recheck of a waiting claim still covers a
//! wake-up that never comes (a notification lost while a replica's `LISTEN`
//! reconnects).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::ledger::{ParentId, QueueName, Work};

struct Entry {
    id: u64,
    parent: Option<ParentId>,
    wants: u64,
    bell: Arc<Notify>,
}

impl Entry {
    /// Whether this waiter can claim children of `parent` (any parent of its
    /// queue when the work does not say which).
    fn can_take(&self, parent: Option<&ParentId>) -> bool {
        match (&self.parent, parent) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => true,
        }
    }
}

/// This process's waiting claims, by queue, oldest first.
#[derive(Default)]
pub struct Waiters {
    queues: Mutex<HashMap<QueueName, VecDeque<Entry>>>,
    next_id: AtomicU64,
    woken_total: AtomicU64,
    /// Work announced so far (anywhere): a claim that found nothing and then
    /// joined a line need not look again when nothing was announced since it
    /// looked (`announced`).
    announced: AtomicU64,
    /// Rung when a slot under a queue's or a key's limits may have freed
    /// (an outcome, a release, an expiry, new limits: anything that changes
    /// what live views show, here or on another replica): the long polls
    /// that limits held back look again.
    slots: Notify,
}

impl Waiters {
    /// What a long poll that limits held back waits on (see `slots`); made
    /// before it claims, so a slot freed meanwhile is not missed.
    pub fn slot_freed(&self) -> std::pin::Pin<Box<tokio::sync::futures::Notified<'_>>> {
        let mut freed = Box::pin(self.slots.notified());
        freed.as_mut().enable();
        freed
    }

    /// A slot may have freed: every long poll that limits held back looks again.
    pub fn slots_may_have_freed(&self) {
        self.slots.notify_waiters();
    }

    /// Joins the line of `queue` for up to `wants` children (of `parent`
    /// only, when set). Leaving is dropping the returned `Waiting`.
    pub fn wait(self: &Arc<Self>, queue: &QueueName, parent: Option<&ParentId>, wants: u64) -> Waiting {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let bell = Arc::new(Notify::new());
        let wants = wants.max(1);
        let entry = Entry {
            id,
            parent: parent.cloned(),
            wants,
            bell: Arc::clone(&bell),
        };
        self.lock().entry(queue.clone()).or_default().push_back(entry);
        Waiting {
            waiters: Arc::clone(self),
            queue: queue.clone(),
            parent: parent.cloned(),
            wants,
            id,
            bell,
        }
    }

    /// Wakes the oldest waiters that can take `work`, until what they asked
    /// for covers it. Returns how many were woken.
    pub fn wake(&self, work: &Work) -> u64 {
        // Counted before any waiter is looked at: a claim that reads the same
        // count after it joined its line is in line for every later wake.
        self.announced.fetch_add(1, Ordering::SeqCst);
        let mut queues = self.lock();
        let mut woken = 0;
        let mut wake_line = |line: &mut VecDeque<Entry>| {
            let mut left = work.children;
            line.retain(|entry| {
                if left == 0 || !entry.can_take(work.parent.as_ref()) {
                    return true;
                }
                left = left.saturating_sub(entry.wants);
                // A stored permit: a waiter between its look and its wait still hears it.
                entry.bell.notify_one();
                woken += 1;
                false
            });
        };
        match &work.queue {
            Some(queue) => {
                if let Some(line) = queues.get_mut(queue) {
                    wake_line(line);
                }
            }
            None => queues.values_mut().for_each(wake_line),
        }
        queues.retain(|_, line| !line.is_empty());
        drop(queues);
        self.woken_total.fetch_add(woken, Ordering::Relaxed);
        woken
    }

    /// How many announcements of work this process has heard (see `announced`).
    pub fn announced(&self) -> u64 {
        self.announced.load(Ordering::SeqCst)
    }

    /// Waiting claims woken since the process started.
    pub fn woken_total(&self) -> u64 {
        self.woken_total.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<QueueName, VecDeque<Entry>>> {
        // The map holds no invariant a panic elsewhere could break halfway.
        self.queues.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A place in a queue's line; dropping it leaves the line.
pub struct Waiting {
    waiters: Arc<Waiters>,
    queue: QueueName,
    parent: Option<ParentId>,
    wants: u64,
    id: u64,
    bell: Arc<Notify>,
}

impl Waiting {
    /// Resolves once this waiter is woken (at once if it already was).
    pub async fn woken(&self) {
        self.bell.notified().await;
    }

    /// A new place at the back of the same line, for the same work (a wake-up
    /// took this one out of line).
    pub fn again(&self) -> Waiting {
        self.waiters.wait(&self.queue, self.parent.as_ref(), self.wants)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut queues = self.waiters.lock();
        if let Some(line) = queues.get_mut(&self.queue) {
            line.retain(|entry| entry.id != self.id);
            if line.is_empty() {
                queues.remove(&self.queue);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(name: &str) -> QueueName {
        QueueName::parse(name).unwrap()
    }

    fn parent(id: &str) -> ParentId {
        ParentId::parse(id).unwrap()
    }

    async fn was_woken(waiting: &Waiting) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(5), waiting.woken())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn wakes_the_oldest_waiters_until_their_asks_cover_the_work() {
        let waiters = Arc::new(Waiters::default());
        let line: Vec<Waiting> = (0..10).map(|_| waiters.wait(&queue("q"), None, 1)).collect();
        assert_eq!(waiters.wake(&Work::in_queue(queue("q"), 3)), 3);
        for (i, waiting) in line.iter().enumerate() {
            assert_eq!(was_woken(waiting).await, i < 3, "waiter {i}");
        }
        // A waiter asking for 100 covers 3 children alone.
        let big = waiters.wait(&queue("r"), None, 100);
        let behind = waiters.wait(&queue("r"), None, 100);
        assert_eq!(waiters.wake(&Work::in_queue(queue("r"), 3)), 1);
        assert!(was_woken(&big).await);
        assert!(!was_woken(&behind).await);
    }

    #[tokio::test]
    async fn another_queue_or_parent_is_not_woken() {
        let waiters = Arc::new(Waiters::default());
        let other_queue = waiters.wait(&queue("other"), None, 1);
        let other_parent = waiters.wait(&queue("q"), Some(&parent("B")), 1);
        let this_parent = waiters.wait(&queue("q"), Some(&parent("A")), 1);
        let any_parent = waiters.wait(&queue("q"), None, 1);
        assert_eq!(waiters.wake(&Work::of_parent(queue("q"), parent("A"), 5)), 2);
        assert!(!was_woken(&other_queue).await);
        assert!(!was_woken(&other_parent).await);
        assert!(was_woken(&this_parent).await);
        assert!(was_woken(&any_parent).await);
    }

    #[tokio::test]
    async fn work_anywhere_wakes_in_every_queue_and_unknown_work_wakes_all() {
        let waiters = Arc::new(Waiters::default());
        let a: Vec<Waiting> = (0..3).map(|_| waiters.wait(&queue("a"), None, 1)).collect();
        let b: Vec<Waiting> = (0..3).map(|_| waiters.wait(&queue("b"), None, 1)).collect();
        assert_eq!(waiters.wake(&Work::anywhere(1)), 2);
        assert_eq!(waiters.wake(&Work::unknown()), 4);
        for waiting in a.iter().chain(&b) {
            assert!(was_woken(waiting).await);
        }
        assert_eq!(waiters.woken_total(), 6);
    }

    #[tokio::test]
    async fn a_waiter_that_left_is_not_counted_and_leaves_no_line_behind() {
        let waiters = Arc::new(Waiters::default());
        drop(waiters.wait(&queue("q"), None, 1));
        let stays = waiters.wait(&queue("q"), None, 1);
        assert_eq!(waiters.wake(&Work::in_queue(queue("q"), 1)), 1);
        assert!(was_woken(&stays).await);
        drop(stays);
        assert!(waiters.lock().is_empty());
    }

    #[tokio::test]
    async fn a_woken_waiter_goes_back_in_line_behind_the_others_for_the_same_work() {
        let waiters = Arc::new(Waiters::default());
        let first = waiters.wait(&queue("q"), Some(&parent("A")), 5);
        let second = waiters.wait(&queue("q"), None, 1);
        assert_eq!(waiters.wake(&Work::of_parent(queue("q"), parent("A"), 1)), 1);
        assert!(was_woken(&first).await);
        let first = first.again();
        // Back at the end: the next child goes to `second`; another parent's
        // child never goes to `first`.
        assert_eq!(waiters.wake(&Work::of_parent(queue("q"), parent("B"), 1)), 1);
        assert!(was_woken(&second).await);
        assert!(!was_woken(&first).await);
        assert_eq!(waiters.wake(&Work::of_parent(queue("q"), parent("A"), 1)), 1);
        assert!(was_woken(&first).await);
    }

    #[test]
    fn the_notification_payload_is_short_and_round_trips() {
        let work = Work::of_parent(queue("events"), parent("P-42"), 1000);
        let text = serde_json::to_string(&work).unwrap();
        assert_eq!(text, r#"{"q":"events","p":"P-42","n":1000}"#);
        assert_eq!(serde_json::from_str::<Work>(&text).unwrap(), work);
    }
}
