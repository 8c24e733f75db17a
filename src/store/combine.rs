//! Group commit in the service: requests for the same parent that arrive
//! while a statement for it runs wait, and go together in the next one.
//!
//! The claims of one parent take turns on its lane row, and its outcomes on
//! its counters row, so the database runs them one at a time anyway; eight
//! workers of one parent each waiting for that turn make eight statements
//! and eight commits. Combined, the first request runs at once, alone (no
//! request waits for a tick), and those that arrived meanwhile share the
//! next statement and commit: under load a turn serves many requests, at
//! rest each runs as before. Every caller is answered once its own rows have
//! committed. This is an optimization only: the locks in the database still
//! decide, so replicas and requests that bypass it stay correct.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use super::{StoreError, StoreResult};

/// A request waiting for its key's next statement.
struct Waiter<Q, A> {
    ask: Q,
    reply: oneshot::Sender<StoreResult<A>>,
}

/// A key's waiting requests, and how many runners serve them.
struct Slot<Q, A> {
    queue: Vec<Waiter<Q, A>>,
    running: usize,
}

/// Per key, the requests waiting while that key's runners work.
pub(crate) struct Combiner<K, Q, A> {
    waiting: Mutex<HashMap<K, Slot<Q, A>>>,
    /// Statements of one key that may run at once: one where the database
    /// runs them one at a time anyway (a lane's claims), two where the next
    /// can do its row work while the last one commits (a parent's outcomes:
    /// only their counter update waits for the other's commit).
    runners: usize,
}

impl<K, Q, A> Combiner<K, Q, A> {
    pub fn new(runners: usize) -> Self {
        Self {
            waiting: Mutex::new(HashMap::new()),
            runners: runners.max(1),
        }
    }
}

impl<K, Q, A> std::fmt::Debug for Combiner<K, Q, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner").finish_non_exhaustive()
    }
}

impl<K, Q, A> Combiner<K, Q, A>
where
    K: Hash + Eq + Clone + Send + 'static,
    Q: Send + 'static,
    A: Send + 'static,
{
    /// Whether a statement for `key` is running in this process.
    pub fn busy(&self, key: &K) -> bool {
        self.lock().contains_key(key)
    }

    /// Runs `ask` in the next statement for `key`. `run` gets every request
    /// that waits then, in arrival order, and answers each in that order.
    pub async fn submit<F, Fut>(self: &Arc<Self>, key: K, ask: Q, run: F) -> StoreResult<A>
    where
        F: Fn(Vec<Q>) -> Fut + Send + 'static,
        Fut: Future<Output = StoreResult<Vec<A>>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut waiting = self.lock();
            let slot = waiting.entry(key.clone()).or_insert_with(|| Slot {
                queue: Vec::new(),
                running: 0,
            });
            slot.queue.push(Waiter { ask, reply });
            let start = slot.running < self.runners;
            if start {
                slot.running += 1;
            }
            start
        };
        if start {
            // The runner is its own task: it finishes the statements it started
            // even when the request that started it goes away.
            tokio::spawn(Arc::clone(self).runner(key, run));
        }
        answer.await.unwrap_or_else(|_| {
            Err(StoreError::Db(sqlx::Error::Protocol(
                "the combined statement was abandoned".to_owned(),
            )))
        })
    }

    /// Runs what waits for `key` until nothing does, then lets the key go.
    async fn runner<F, Fut>(self: Arc<Self>, key: K, run: F)
    where
        F: Fn(Vec<Q>) -> Fut + Send + 'static,
        Fut: Future<Output = StoreResult<Vec<A>>> + Send + 'static,
    {
        loop {
            let batch = {
                let mut waiting = self.lock();
                let Some(slot) = waiting.get_mut(&key) else { return };
                let queue = std::mem::take(&mut slot.queue);
                if queue.is_empty() {
                    slot.running -= 1;
                    if slot.running == 0 {
                        waiting.remove(&key);
                    }
                    return;
                }
                queue
            };
            let (asks, replies): (Vec<Q>, Vec<_>) = batch.into_iter().map(|w| (w.ask, w.reply)).unzip();
            match run(asks).await {
                Ok(answers) => {
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        let _ = reply.send(Ok(answer));
                    }
                }
                Err(err) => {
                    let mut replies = replies.into_iter();
                    let first = replies.next();
                    let mut failed: Vec<_> = replies.collect();
                    // With the database gone, those waiting for the next
                    // statement would only wait to learn the same: tell them now.
                    if matches!(err, StoreError::Unavailable(_)) {
                        let mut waiting = self.lock();
                        if let Some(slot) = waiting.get_mut(&key) {
                            failed.extend(std::mem::take(&mut slot.queue).into_iter().map(|w| w.reply));
                        }
                    }
                    for reply in failed {
                        let _ = reply.send(Err(err.shared_copy()));
                    }
                    if let Some(first) = first {
                        let _ = first.send(Err(err));
                    }
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Slot<Q, A>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}
