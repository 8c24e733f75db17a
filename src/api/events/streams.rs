//! The tasks behind the event streams (`api/events.rs`): who watches, and
//! what a parent's or a queue's stream sends, from its snapshot on.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue};
use axum::response::sse::Event;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::access::Role;
use crate::api::guard::Caller;
use crate::events::{Live, LiveParent, Subscription, same_parent};
use crate::ledger::events::{completed_event_id, owes_completed, parent_event_id, queue_event_id};
use crate::ledger::{ParentId, Queue, QueueName};
use crate::state::AppState;

/// How long a client waits before it reconnects (the `retry` field).
const RECONNECT: Duration = Duration::from_secs(1);

/// How long an event may wait for a client that does not read (its
/// connection's buffers and the stream's are full) before the stream ends
/// and gives its turn back.
pub(super) const STALLED: Duration = Duration::from_secs(30);

/// Sends an event, or says the stream is over: the client left, or did not
/// take it within `STALLED`.
async fn deliver(sender: &mpsc::Sender<Event>, event: Event) -> bool {
    matches!(tokio::time::timeout(STALLED, sender.send(event)).await, Ok(Ok(())))
}

/// A `paused` or `resumed` event's data.
#[derive(Debug, Serialize)]
pub(super) struct Pause<'a> {
    pub(super) queue: &'a QueueName,
    pub(super) paused: bool,
}

/// Who watches, checked again as what the stream shows changes.
pub(super) struct Watcher {
    pub(super) state: AppState,
    pub(super) caller: Caller,
    pub(super) authorization: Vec<HeaderValue>,
}

impl Watcher {
    pub(super) fn new(state: &AppState, caller: Caller, headers: &HeaderMap) -> Self {
        Self {
            state: state.clone(),
            caller,
            authorization: headers
                .get_all(axum::http::header::AUTHORIZATION)
                .iter()
                .cloned()
                .collect(),
        }
    }

    /// Whether the token, as the tokens file grants it now (it may have been
    /// reloaded since the stream opened), still reaches `queue`.
    pub(super) fn reaches(&self, queue: &QueueName) -> bool {
        let authorization: Vec<&[u8]> = self.authorization.iter().map(HeaderValue::as_bytes).collect();
        match self.state.access.authenticate(&authorization) {
            Ok(grant) => grant.may(Role::Reader) && grant.reaches(queue.as_str()),
            Err(_) => false,
        }
    }

    fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.state.shutdown.subscribe()
    }

    /// What says the tokens were read again (and every stream must check).
    fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.state.access.reloads()
    }

    /// An event named `name` of `live` as this caller is shown it: its JSON
    /// written once for every stream of the same kind of reader.
    fn parent_event(&self, name: &str, live: &LiveParent, id: Option<&str>) -> Event {
        let kind = usize::from(!self.caller.sees_webhook_secrets());
        let json = live.json(kind, |parent| {
            serde_json::to_string(&self.caller.shown(parent.clone())).unwrap_or_else(|_| "null".to_owned())
        });
        let event = Event::default().event(name).data(json);
        match id {
            Some(id) => event.id(id),
            None => event,
        }
    }
}

/// A `paused` or `resumed` event for `queue`, when `paused` is not what the
/// client was last told (`told`, which it updates): the hub reports a pause
/// only against its own last read, which a new stream's snapshot may not
/// share, so each stream says what it has not said yet, once.
async fn tell_pause(sender: &mpsc::Sender<Event>, told: &mut bool, queue: &QueueName, paused: bool) -> bool {
    if *told == paused {
        return true;
    }
    *told = paused;
    let name = if paused { "paused" } else { "resumed" };
    deliver(sender, event(name, &Pause { queue, paused }, None)).await
}

/// One event: its name, data and id (none: the client keeps the last one).
fn event(name: &str, data: &impl Serialize, id: Option<&str>) -> Event {
    let event = Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name).data("null"));
    match id {
        Some(id) => event.id(id),
        None => event,
    }
}

/// What a stream's task does next.
enum Next {
    /// Show this change (or catch up after falling behind).
    Live(Result<Live, RecvError>),
    /// The tokens were read again: check that the token still grants the stream.
    Recheck,
}

/// Waits for the next event of a subscription, or a reload of the tokens,
/// or for the service to stop or the client to leave (`None`).
async fn next_live(
    subscription: &mut Subscription,
    sender: &mpsc::Sender<Event>,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
    reloads: &mut tokio::sync::watch::Receiver<u64>,
) -> Option<Next> {
    if *stopping.borrow() {
        return None;
    }
    tokio::select! {
        live = subscription.receiver.recv() => Some(Next::Live(live)),
        changed = reloads.changed() => changed.is_ok().then_some(Next::Recheck),
        _ = sender.closed() => None,
        _ = stopping.wait_for(|stopping| *stopping) => None,
    }
}

/// A parent stream's task.
pub(super) struct ParentStream {
    pub(super) watcher: Watcher,
    pub(super) sender: mpsc::Sender<Event>,
    /// What the client was last sent.
    pub(super) sent: Option<Arc<LiveParent>>,
    pub(super) sent_completed: Option<String>,
    /// Whether the client was last told the parent's queue is paused.
    pub(super) told_paused: bool,
}

impl ParentStream {
    async fn send(&self, event: Event) -> bool {
        deliver(&self.sender, event).await
    }

    pub(super) async fn open(&mut self, live: Arc<LiveParent>, paused: bool, last_event_id: Option<&str>) {
        let parent = &live.parent;
        let snapshot = self
            .watcher
            .parent_event("snapshot", &live, Some(&parent_event_id(parent)))
            .retry(RECONNECT);
        if !self.send(snapshot).await {
            return;
        }
        tell_pause(&self.sender, &mut self.told_paused, &parent.queue, paused).await;
        if owes_completed(parent, last_event_id) {
            self.send_completed(&live).await;
        } else {
            self.sent_completed = completed_event_id(parent);
        }
        self.sent = Some(live);
    }

    async fn send_completed(&mut self, live: &LiveParent) -> bool {
        let Some(id) = completed_event_id(&live.parent) else {
            return true;
        };
        let sent = self.send(self.watcher.parent_event("completed", live, Some(&id))).await;
        self.sent_completed = Some(id);
        sent
    }

    /// Sends a parent as it is now: `progress` when it moved, `completed`
    /// when this completion was not sent yet. `false` ends the stream.
    async fn show(&mut self, live: Arc<LiveParent>) -> bool {
        let parent = &live.parent;
        let moved_hands = self
            .sent
            .as_ref()
            .is_none_or(|sent| sent.parent.queue != parent.queue || sent.parent.created_at != parent.created_at);
        if moved_hands && !self.watcher.reaches(&parent.queue) {
            return false;
        }
        if self
            .sent
            .as_deref()
            .is_none_or(|sent| !same_parent(&sent.parent, parent))
        {
            let progress = self
                .watcher
                .parent_event("progress", &live, Some(&parent_event_id(parent)));
            if !self.send(progress).await {
                return false;
            }
        }
        if completed_event_id(parent).is_some_and(|id| self.sent_completed.as_deref() != Some(id.as_str()))
            && !self.send_completed(&live).await
        {
            return false;
        }
        // A pause the hub took in with its first read of this parent comes
        // with no `Paused` of its own: the paused queues as last read say it.
        if let Ok(paused) = self.watcher.state.events.paused().await
            && !tell_pause(
                &self.sender,
                &mut self.told_paused,
                &parent.queue,
                paused.contains(&parent.queue),
            )
            .await
        {
            return false;
        }
        self.sent = Some(live);
        true
    }

    pub(super) async fn follow(&mut self, mut subscription: Subscription) {
        let mut stopping = self.watcher.stopping();
        let mut reloads = self.watcher.reloads();
        while let Some(next) = next_live(&mut subscription, &self.sender, &mut stopping, &mut reloads).await {
            let live = match next {
                Next::Live(live) => live,
                // A token revoked or narrowed since: the stream ends.
                Next::Recheck => match &self.sent {
                    Some(sent) if self.watcher.reaches(&sent.parent.queue) => continue,
                    _ => return,
                },
            };
            let go_on = match live {
                Ok(Live::Parent(parent)) => self.show(parent).await,
                Ok(Live::Gone) | Err(RecvError::Closed) => false,
                Ok(Live::Paused { queue, paused }) => {
                    tell_pause(&self.sender, &mut self.told_paused, &queue, paused).await
                }
                Ok(Live::Queue(_) | Live::Completed(_)) => true,
                // Fell behind: what it is now says all (a completion included).
                Err(RecvError::Lagged(_)) => match self.sent.as_ref().map(|p| p.parent.parent_id.clone()) {
                    Some(parent_id) => match self.watcher.state.store.parent(&parent_id, false).await {
                        Ok(parent) => self.show(Arc::new(LiveParent::new(parent))).await,
                        Err(_) => false,
                    },
                    None => false,
                },
            };
            if !go_on {
                return;
            }
        }
    }
}

/// Completions a resumed queue stream reads per statement.
const REPLAY_PAGE: i64 = 500;

/// How recent a replayed completion must be for the live feed to still
/// carry it (the hub reads completions again for a few seconds).
const REMEMBERED_SECONDS: i64 = 30;

/// A queue stream's task.
pub(super) struct QueueStream {
    pub(super) watcher: Watcher,
    pub(super) sender: mpsc::Sender<Event>,
    pub(super) queue: QueueName,
    /// The `completed_at` of the last completion sent (or when the stream
    /// opened): its events' id.
    pub(super) last_completed: DateTime<Utc>,
    /// Completions replayed at the start, not sent again live.
    pub(super) replayed: HashSet<(ParentId, DateTime<Utc>)>,
    pub(super) sent: Option<Arc<Queue>>,
    /// Whether the client was last told the queue is paused.
    pub(super) told_paused: bool,
}

impl QueueStream {
    fn id(&self) -> String {
        queue_event_id(Some(self.last_completed))
    }

    async fn send(&self, event: Event) -> bool {
        deliver(&self.sender, event).await
    }

    /// Sends the snapshot, and then, for a stream resumed from a
    /// `Last-Event-ID`, every completion since `replay`, page by page.
    pub(super) async fn open(&mut self, snapshot: Arc<Queue>, replay: Option<DateTime<Utc>>) {
        let first = event("snapshot", &*snapshot, Some(&self.id())).retry(RECONNECT);
        if !self.send(first).await {
            return;
        }
        tell_pause(&self.sender, &mut self.told_paused, &self.queue, snapshot.paused).await;
        self.sent = Some(snapshot);
        if let Some(from) = replay {
            self.replay(from, true).await;
        }
    }

    /// Sends every completion of the queue after `from`, oldest first, a
    /// page at a time (the channel's room paces the reads); `false` when
    /// the stream ended. With `remember`, the recent ones are noted so that
    /// the live feed does not send them again.
    async fn replay(&mut self, from: DateTime<Utc>, remember: bool) -> bool {
        let recent = Utc::now() - chrono::TimeDelta::seconds(REMEMBERED_SECONDS);
        let mut after: (DateTime<Utc>, Option<ParentId>) = (from, None);
        loop {
            let page = match self
                .watcher
                .state
                .store
                .queue_completions(&self.queue, (after.0, after.1.as_ref()), REPLAY_PAGE)
                .await
            {
                Ok(page) => page,
                Err(_) => return false,
            };
            let full = page.len() as i64 == REPLAY_PAGE;
            for parent in page {
                let Some(at) = parent.completed_at else { continue };
                if remember && at >= recent {
                    self.replayed.insert((parent.parent_id.clone(), at));
                }
                after = (at, Some(parent.parent_id.clone()));
                if !self.completed(&LiveParent::new(parent)).await {
                    return false;
                }
            }
            if !full {
                return true;
            }
        }
    }

    async fn completed(&mut self, live: &LiveParent) -> bool {
        if let Some(at) = live.parent.completed_at {
            self.last_completed = self.last_completed.max(at);
        }
        let id = self.id();
        self.send(self.watcher.parent_event("completed", live, Some(&id))).await
    }

    pub(super) async fn follow(&mut self, mut subscription: Subscription) {
        let mut stopping = self.watcher.stopping();
        let mut reloads = self.watcher.reloads();
        while let Some(next) = next_live(&mut subscription, &self.sender, &mut stopping, &mut reloads).await {
            let live = match next {
                Next::Live(live) => live,
                Next::Recheck if self.watcher.reaches(&self.queue) => continue,
                Next::Recheck => return,
            };
            let go_on = match live {
                _ if !self.watcher.reaches(&self.queue) => false,
                Ok(Live::Queue(queue)) => {
                    if self.sent.as_deref() == Some(&*queue) {
                        true
                    } else {
                        let sent = self.send(event("progress", &*queue, Some(&self.id()))).await;
                        let paused = queue.paused;
                        self.sent = Some(queue);
                        sent && tell_pause(&self.sender, &mut self.told_paused, &self.queue, paused).await
                    }
                }
                Ok(Live::Completed(live)) => {
                    let parent = &live.parent;
                    let replayed = parent
                        .completed_at
                        .is_some_and(|at| self.replayed.remove(&(parent.parent_id.clone(), at)));
                    replayed || self.completed(&live).await
                }
                Ok(Live::Paused { paused, .. }) => {
                    tell_pause(&self.sender, &mut self.told_paused, &self.queue, paused).await
                }
                Ok(Live::Parent(_) | Live::Gone) => true,
                Err(RecvError::Closed) => false,
                // Fell behind: replay the completions since the last one sent.
                Err(RecvError::Lagged(_)) => {
                    let from = self.last_completed - chrono::TimeDelta::seconds(5);
                    self.replay(from, false).await
                }
            };
            if !go_on {
                return;
            }
        }
    }
}
