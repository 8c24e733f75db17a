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

/// Per key, the requests waiting while that key's runner works.
pub(crate) struct Combiner<K, Q, A> {
    waiting: Mutex<HashMap<K, Vec<Waiter<Q, A>>>>,
}

impl<K, Q, A> Default for Combiner<K, Q, A> {
    fn default() -> Self {
        Self {
            waiting: Mutex::new(HashMap::new()),
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
            match waiting.get_mut(&key) {
                Some(queue) => {
                    queue.push(Waiter { ask, reply });
                    false
                }
                None => {
                    waiting.insert(key.clone(), vec![Waiter { ask, reply }]);
                    true
                }
            }
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
                let queue = waiting.get_mut(&key).map(std::mem::take).unwrap_or_default();
                if queue.is_empty() {
                    waiting.remove(&key);
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
                        let queue = waiting.get_mut(&key).map(std::mem::take).unwrap_or_default();
                        failed.extend(queue.into_iter().map(|w| w.reply));
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, Vec<Waiter<Q, A>>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}
