//! The event hub: what every event stream of this process watches, read
//! once for all of them.
//!
//! A stream subscribes to a subject (a parent, or a queue). The store says
//! which subjects may have changed (`Store::on_change`, and other replicas'
//! notices through `jobs::listen_for_work`); the hub marks them, and its one
//! reader reads the marked subjects at most every `TICK` (the parents in
//! one statement, each queue in two) and sends what moved to every stream of
//! the subject. So N streams of one parent cost one read per tick, not N,
//! and all streams of a replica share one database connection at a time for
//! their reads. A subject with no stream left is forgotten at the next tick.
//! Every `BACKSTOP` each subject is read again anyway: a change made behind
//! the service's back (SQL by hand), or a notice lost while `LISTEN`
//! reconnected, shows within it.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Notify, broadcast};

use crate::ledger::{Changes, Parent, ParentId, Queue, QueueName, QueueScope};
use crate::metrics::Metrics;
use crate::store::{Store, StoreResult};
use crate::turns::Turns;

/// The shortest time between two reads of a subject: a stream sends at most
/// one `progress` per tick while its counts change.
pub const TICK: Duration = Duration::from_millis(250);

/// Every subject is read at least this often, changed or not.
const BACKSTOP: Duration = Duration::from_secs(5);

/// How many events a slow stream may fall behind before it is resynced.
const CHANNEL: usize = 64;

/// How many completions of one queue a tick reads at most (more wait for
/// the next tick).
const COMPLETIONS_PER_READ: i64 = 1000;

/// How long a queue's completions are read again after they were stamped:
/// a transaction's clock is read when it starts, so a completion may commit
/// after one stamped later (the statements that complete a parent are short).
/// Within it, each is sent once (by parent and time). A queue's first read
/// starts this long before the service's clock, and sends nothing: what
/// completed before a stream opened is in its snapshot.
const LATE_COMMIT: chrono::TimeDelta = chrono::TimeDelta::seconds(2);

/// What a subject's streams are sent.
#[derive(Debug, Clone)]
pub enum Live {
    /// A parent as it is now (a parent stream's `progress`; complete once
    /// it completed).
    Parent(Arc<LiveParent>),
    /// The parent is gone (deleted): its streams end.
    Gone,
    /// A queue as it is now (a queue stream's `progress`).
    Queue(Arc<Queue>),
    /// A parent of the queue completed (a queue stream's `completed`).
    Completed(Arc<LiveParent>),
    /// The queue (of the parent) was paused or resumed.
    Paused { queue: QueueName, paused: bool },
}

/// A parent as one read saw it, shared by every stream that shows it: its
/// JSON is written once for each way a reader may be shown it (see
/// `api::redact`), not once per stream.
#[derive(Debug)]
pub struct LiveParent {
    pub parent: Parent,
    json: [std::sync::OnceLock<String>; 2],
}

impl LiveParent {
    pub fn new(parent: Parent) -> Self {
        Self {
            parent,
            json: [std::sync::OnceLock::new(), std::sync::OnceLock::new()],
        }
    }

    /// The parent's JSON as shown to readers of kind `kind` (0 or 1),
    /// written by `write` the first time it is asked for.
    pub fn json(&self, kind: usize, write: impl FnOnce(&Parent) -> String) -> &str {
        self.json[kind.min(1)].get_or_init(|| write(&self.parent))
    }
}

/// One watched parent or queue.
struct Subject<T> {
    sender: broadcast::Sender<Live>,
    state: Mutex<T>,
}

#[derive(Default)]
struct ParentSeen {
    last: Option<Arc<LiveParent>>,
    paused: Option<bool>,
}

#[derive(Default)]
struct QueueSeen {
    last: Option<Arc<Queue>>,
    /// Completions are read after this completion time and, at that time,
    /// after this parent (none: every one at that time is read again).
    after: Option<(DateTime<Utc>, Option<ParentId>)>,
    /// The completions sent that are still read again (see `LATE_COMMIT`).
    sent: HashSet<(ParentId, DateTime<Utc>)>,
    last_completed: Option<DateTime<Utc>>,
    /// When its first stream subscribed: a completion at or after it is news
    /// to that stream even when the subject's first read finds it.
    since: Option<DateTime<Utc>>,
}

impl<T: Default> Subject<T> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            sender: broadcast::channel(CHANNEL).0,
            state: Mutex::new(T::default()),
        })
    }

    fn watched(&self) -> bool {
        self.sender.receiver_count() > 0
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// What is marked for the next read.
#[derive(Default)]
struct Marked {
    parents: HashSet<ParentId>,
    queues: HashSet<QueueName>,
    /// Which queues are paused.
    pauses: bool,
}

/// The subjects due for a read.
struct Due {
    parents: Vec<(ParentId, Arc<Subject<ParentSeen>>)>,
    queues: Vec<(QueueName, Arc<Subject<QueueSeen>>)>,
    pauses: bool,
}

#[derive(Default)]
struct Subjects {
    parents: HashMap<ParentId, Arc<Subject<ParentSeen>>>,
    queues: HashMap<QueueName, Arc<Subject<QueueSeen>>>,
    marked: Marked,
}

/// The event hub of one process.
pub struct EventHub {
    store: Store,
    metrics: Arc<Metrics>,
    subjects: Mutex<Subjects>,
    marked: Notify,
    /// Turns of the streams open now: `--max-event-streams`, a token's share.
    streams: Turns,
    /// Queues paused as last read.
    paused: Mutex<Option<Arc<HashSet<QueueName>>>>,
    reader: OnceLock<()>,
}

/// A stream's subscription to a parent or a queue.
pub struct Subscription {
    pub receiver: broadcast::Receiver<Live>,
}

impl EventHub {
    /// A hub over `store`, with room for `max_streams` streams, `per_token`
    /// of them for any one token. Its reader starts with the first stream
    /// and ends with the hub.
    pub fn new(store: Store, metrics: Arc<Metrics>, max_streams: usize, per_token: usize) -> Arc<Self> {
        Arc::new(Self {
            store,
            metrics,
            subjects: Mutex::default(),
            marked: Notify::new(),
            streams: Turns::new(max_streams, per_token),
            paused: Mutex::new(None),
            reader: OnceLock::new(),
        })
    }

    /// The turns of this process's streams (`--max-event-streams`).
    pub fn turns(&self) -> &Turns {
        &self.streams
    }

    /// Streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.open()
    }

    /// Subscribes to a parent; what it is now comes with it when a stream of
    /// it is already open and nothing changed since its last read (otherwise
    /// the caller reads it).
    pub fn watch_parent(self: &Arc<Self>, parent_id: &ParentId) -> (Subscription, Option<Arc<LiveParent>>) {
        self.start_reader();
        let mut subjects = lock(&self.subjects);
        let subject = match subjects.parents.get(parent_id) {
            Some(subject) => Arc::clone(subject),
            None => {
                let subject = Subject::new();
                subjects.parents.insert(parent_id.clone(), Arc::clone(&subject));
                // Read soon, so the next change has something to compare with.
                subjects.marked.parents.insert(parent_id.clone());
                self.marked.notify_one();
                subject
            }
        };
        let receiver = subject.sender.subscribe();
        // What it was at the last read, unless it changed since.
        let last = match subjects.marked.parents.contains(parent_id) {
            true => None,
            false => lock(&subject.state).last.clone(),
        };
        (Subscription { receiver }, last)
    }

    /// Subscribes to a queue; what it is now comes with it when a stream of
    /// it is already open, and the time of the last completion it saw.
    pub fn watch_queue(self: &Arc<Self>, queue: &QueueName) -> (Subscription, Option<Arc<Queue>>) {
        self.start_reader();
        let mut subjects = lock(&self.subjects);
        let subject = match subjects.queues.get(queue) {
            Some(subject) => Arc::clone(subject),
            None => {
                let subject = Subject::<QueueSeen>::new();
                lock(&subject.state).since = Some(Utc::now());
                subjects.queues.insert(queue.clone(), Arc::clone(&subject));
                subjects.marked.queues.insert(queue.clone());
                self.marked.notify_one();
                subject
            }
        };
        let receiver = subject.sender.subscribe();
        let last = match subjects.marked.queues.contains(queue) {
            true => None,
            false => lock(&subject.state).last.clone(),
        };
        (Subscription { receiver }, last)
    }

    /// The paused queues, as last read (read now when never read).
    pub async fn paused(&self) -> StoreResult<Arc<HashSet<QueueName>>> {
        if let Some(paused) = lock(&self.paused).clone() {
            return Ok(paused);
        }
        let paused: Arc<HashSet<QueueName>> = Arc::new(self.store.paused_queues().await?.into_iter().collect());
        *lock(&self.paused) = Some(Arc::clone(&paused));
        Ok(paused)
    }

    /// What the store (or another replica) says changed: the subjects it
    /// names are marked for the next read.
    pub fn changed(&self, changes: &Changes) {
        let mut subjects = lock(&self.subjects);
        let Subjects {
            parents,
            queues,
            marked,
        } = &mut *subjects;
        if changes.all {
            marked.parents.extend(parents.keys().cloned());
            marked.queues.extend(queues.keys().cloned());
            marked.pauses = true;
        } else {
            marked
                .parents
                .extend(changes.parents.iter().filter(|p| parents.contains_key(*p)).cloned());
            if changes.every_queue {
                marked.queues.extend(queues.keys().cloned());
            } else {
                marked
                    .queues
                    .extend(changes.queues.iter().filter(|q| queues.contains_key(*q)).cloned());
            }
            if changes.paused {
                marked.pauses = true;
                // A parent stream shows its queue's pause too.
                for (parent_id, subject) in parents.iter() {
                    let of_queue = lock(&subject.state)
                        .last
                        .as_ref()
                        .is_some_and(|p| changes.queues.contains(&p.parent.queue));
                    if of_queue {
                        marked.parents.insert(parent_id.clone());
                    }
                }
            }
        }
        let any = !marked.parents.is_empty() || !marked.queues.is_empty() || marked.pauses;
        drop(subjects);
        if any {
            self.marked.notify_one();
        }
    }

    fn start_reader(self: &Arc<Self>) {
        self.reader.get_or_init(|| {
            tokio::spawn(read_marked(Arc::downgrade(self)));
        });
    }

    /// Takes what is marked, forgetting subjects no stream watches.
    fn take_marked(&self) -> Due {
        let mut subjects = lock(&self.subjects);
        subjects.parents.retain(|_, s| s.watched());
        subjects.queues.retain(|_, s| s.watched());
        let marked = std::mem::take(&mut subjects.marked);
        Due {
            parents: marked
                .parents
                .into_iter()
                .filter_map(|p| subjects.parents.get(&p).map(|s| (p, Arc::clone(s))))
                .collect(),
            queues: marked
                .queues
                .into_iter()
                .filter_map(|q| subjects.queues.get(&q).map(|s| (q, Arc::clone(s))))
                .collect(),
            pauses: marked.pauses,
        }
    }

    /// Marks every subject (the backstop, or after a failed read).
    fn mark_all(&self) {
        self.changed(&Changes::everything());
    }

    /// Reads what is marked and sends what moved.
    async fn read_once(&self) -> StoreResult<()> {
        let Due {
            parents,
            queues,
            pauses,
        } = self.take_marked();
        let statements = u64::from(pauses) + parents.len().div_ceil(500) as u64 + 2 * queues.len() as u64;
        self.metrics.event_reads(statements);
        if pauses {
            let paused: HashSet<QueueName> = self.store.paused_queues().await?.into_iter().collect();
            *lock(&self.paused) = Some(Arc::new(paused));
        }
        let paused = lock(&self.paused).clone();
        if !parents.is_empty() {
            let ids: Vec<ParentId> = parents.iter().map(|(p, _)| p.clone()).collect();
            let read = self.store.parents_now(&ids).await?;
            let mut now: HashMap<ParentId, Parent> = read.into_iter().map(|p| (p.parent_id.clone(), p)).collect();
            for (parent_id, subject) in parents {
                let mut seen = lock(&subject.state);
                let Some(parent) = now.remove(&parent_id) else {
                    if seen.last.take().is_some() {
                        let _ = subject.sender.send(Live::Gone);
                    }
                    continue;
                };
                if seen
                    .last
                    .as_deref()
                    .is_none_or(|last| !same_parent(&last.parent, &parent))
                {
                    let parent = Arc::new(LiveParent::new(parent));
                    seen.last = Some(Arc::clone(&parent));
                    let _ = subject.sender.send(Live::Parent(Arc::clone(&parent)));
                }
                let queue = seen.last.as_ref().map(|p| p.parent.queue.clone()).expect("just set");
                if let Some(paused) = paused.as_ref().map(|set| set.contains(&queue))
                    && seen.paused.replace(paused).is_some_and(|was| was != paused)
                {
                    let _ = subject.sender.send(Live::Paused { queue, paused });
                }
            }
        }
        for (queue, subject) in queues {
            self.read_queue(&queue, &subject).await?;
        }
        Ok(())
    }

    /// Reads one queue and its completions since the last read.
    async fn read_queue(&self, queue: &QueueName, subject: &Subject<QueueSeen>) -> StoreResult<()> {
        let now = self
            .store
            .queues(Some(queue), &QueueScope::every())
            .await?
            .into_iter()
            .next();
        let after = lock(&subject.state).after.clone();
        let first = after.is_none();
        let (from, past) = after.unwrap_or_else(|| (Utc::now() - LATE_COMMIT * 2, None));
        let completions = self
            .store
            .queue_completions(queue, (from, past.as_ref()), COMPLETIONS_PER_READ)
            .await?;
        let full = completions.len() as i64 == COMPLETIONS_PER_READ;
        let last = completions
            .last()
            .and_then(|p| Some((p.completed_at?, p.parent_id.clone())));
        let mut seen = lock(&subject.state);
        // The first read's completions happened before anyone watched, but
        // for those after the first stream subscribed (the read waits up to
        // a `TICK`): they are sent, or that stream would never hear of them.
        let since = seen.since;
        for parent in completions {
            let Some(at) = parent.completed_at else { continue };
            if seen.sent.insert((parent.parent_id.clone(), at)) {
                seen.last_completed = seen.last_completed.max(Some(at));
                if !first || since.is_some_and(|since| at >= since) {
                    let _ = subject.sender.send(Live::Completed(Arc::new(LiveParent::new(parent))));
                }
            }
        }
        // Next time from the newest seen less what may still commit late
        // (never back), or right after the last one read after a full page
        // (the completions of one time may fill more than a page).
        let next = match (seen.last_completed, last) {
            (_, Some((at, parent_id))) if full => (at, Some(parent_id)),
            (Some(newest), _) => (from.max(newest - LATE_COMMIT), None),
            (None, _) => (from, None),
        };
        let kept_from = next.0;
        seen.after = Some(next);
        seen.sent.retain(|(_, at)| *at >= kept_from);
        if let Some(queue_now) = now
            && seen.last.as_deref() != Some(&queue_now)
        {
            let was_paused = seen.last.as_ref().map(|q| q.paused);
            let queue_now = Arc::new(queue_now);
            seen.last = Some(Arc::clone(&queue_now));
            let _ = subject.sender.send(Live::Queue(Arc::clone(&queue_now)));
            if was_paused.is_some_and(|was| was != queue_now.paused) {
                let _ = subject.sender.send(Live::Paused {
                    queue: queue.clone(),
                    paused: queue_now.paused,
                });
            }
        }
        Ok(())
    }

    /// The `completed_at` of the last completion a queue's streams were sent.
    pub fn last_completed(&self, queue: &QueueName) -> Option<DateTime<Utc>> {
        let subjects = lock(&self.subjects);
        let subject = subjects.queues.get(queue)?;
        lock(&subject.state).last_completed
    }
}

/// Whether two reads of a parent show the same (a stream sends no
/// `progress` for a read that moved nothing).
pub fn same_parent(a: &Parent, b: &Parent) -> bool {
    a.created_at == b.created_at
        && a.queue == b.queue
        && a.counts == b.counts
        && a.state == b.state
        && a.completed_at == b.completed_at
        && a.decomposed_at == b.decomposed_at
        && a.last_progress_at == b.last_progress_at
        && a.priority == b.priority
}

/// The hub's reader: waits for marks (or the backstop), then reads at most
/// once per `TICK`. Ends when the hub is gone.
async fn read_marked(hub: Weak<EventHub>) {
    let mut last_read = tokio::time::Instant::now() - TICK;
    loop {
        let Some(strong) = hub.upgrade() else { return };
        let marked = async { strong.marked.notified().await };
        tokio::select! {
            _ = marked => {}
            _ = tokio::time::sleep(BACKSTOP) => strong.mark_all(),
        }
        tokio::time::sleep_until(last_read + TICK).await;
        last_read = tokio::time::Instant::now();
        if let Err(err) = strong.read_once().await {
            tracing::warn!(error = %err, "event streams could not read; trying again");
            strong.mark_all();
            drop(strong);
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
