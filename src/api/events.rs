//! Event streams: a parent's or a queue's progress as server-sent events.
//!
//! A stream sends what it shows now at once (`snapshot`), then `progress`
//! at most every 250 ms while it changes, `completed` once per completion,
//! `paused` and `resumed`, and a comment every 15 s. What it shows comes from
//! the event hub (`events.rs`), which reads each subject once for all of its
//! streams. The token's reach is checked again whenever what the stream shows
//! could change hands: a parent deleted and registered again in a queue the
//! token does not reach ends its stream, and so does a token the tokens file
//! no longer grants.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{parent_id_param, queue_param};
use super::guard::Caller;
use crate::access::Role;
use crate::error::{ApiError, ApiResult, Problem};
use crate::events::{Live, StreamTurn, Subscription, same_parent};
use crate::ledger::events::{completed_event_id, owes_completed, parent_event_id, queue_event_id, queue_replay_from};
use crate::ledger::{Parent, ParentId, Queue, QueueName};
use crate::state::AppState;

/// A comment this often keeps proxies from closing an idle stream.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// How long a client waits before it reconnects (the `retry` field).
const RECONNECT: Duration = Duration::from_secs(1);

/// How many completions a resumed queue stream replays at most.
const REPLAY_LIMIT: i64 = 1000;

/// Events a stream buffers before its task waits for the client.
const BUFFERED: usize = 32;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(parent_events))
        .routes(routes!(queue_events))
}

/// A `paused` or `resumed` event's data.
#[derive(Debug, Serialize)]
struct Pause<'a> {
    queue: &'a QueueName,
    paused: bool,
}

/// Watch a parent: `snapshot`, then `progress`, `completed`, `paused` and
/// `resumed` as server-sent events.
///
/// `text/event-stream`. At once a `snapshot` event (the Parent, as `GET`
/// shows it), then `progress` (the Parent) at most every 250 ms while its
/// counts change, `completed` (the Parent, complete; its id names the
/// completion) when it completes, `paused` or `resumed`
/// (`{"queue", "paused"}`) when its queue is, and a comment line every 15 s.
/// A change made through any replica arrives. Reconnecting with
/// `Last-Event-ID` (browsers' `EventSource` sends it by itself) sends a
/// `completed` the client has not seen, so none is missed. The stream ends
/// when the parent is deleted, when it is registered again in a queue the
/// token does not reach, and when the service stops; a client then
/// reconnects, and is answered `404` if the parent is gone. Beyond
/// `--max-event-streams` open streams in this process: `429`.
#[utoipa::path(
    get,
    path = "/v1/parents/{parent_id}/events",
    tag = "events",
    params(
        ("parent_id" = ParentId, Path, description = "Parent id"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received, to resume from"),
    ),
    responses(
        (status = 200, description = "Server-sent events: snapshot, progress, completed, paused, resumed",
         body = String, content_type = "text/event-stream"),
        (status = 404, description = "Unknown parent", body = Problem, content_type = "application/problem+json"),
        (status = 429, description = "Too many event streams open in this process", body = Problem,
         content_type = "application/problem+json"),
        (status = 400, description = "Invalid id", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn parent_events(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(parent_id): Path<String>,
) -> ApiResult<Response> {
    let parent_id = parent_id_param(&parent_id)?;
    let turn = admit(&state)?;
    let watcher = Watcher::new(&state, caller, &headers);
    // Subscribed before the snapshot is read: nothing between is missed.
    let (subscription, known) = state.events.watch_parent(&parent_id);
    let parent = match known {
        Some(parent) => parent,
        None => Arc::new(state.store.parent(&parent_id, false).await?),
    };
    if !watcher.reaches(&parent.queue) {
        return Err(ApiError::NotFound(format!("no parent {parent_id}")));
    }
    let paused = state.events.paused().await?.contains(&parent.queue);
    let last_event_id = last_event_id(&headers);
    let (sender, receiver) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        let mut stream = ParentStream {
            watcher,
            sender,
            sent: None,
            sent_completed: None,
        };
        stream.open(parent, paused, last_event_id.as_deref()).await;
        stream.follow(subscription).await;
    });
    Ok(sse(receiver, turn))
}

/// Watch a queue: `snapshot`, then `progress`, `completed` (of each of its
/// parents), `paused` and `resumed` as server-sent events.
///
/// `text/event-stream`. At once a `snapshot` event (the Queue, as `GET`
/// shows it), then `progress` (the Queue) at most every 250 ms while it
/// changes, `completed` (the Parent) whenever one of its parents completes,
/// `paused` or `resumed` (`{"queue", "paused"}`), and a comment line every
/// 15 s. A change made through any replica arrives. Every event's id names
/// the last completion sent; reconnecting with it as `Last-Event-ID` first
/// replays the queue's completions since a few seconds before it (a
/// completion may be stamped before one that committed earlier), so none is
/// missed: one of those last seconds may come twice (`parent_id` and
/// `completed_at` tell). `404` for a queue with no parent that is not
/// paused; beyond `--max-event-streams` open streams in this process: `429`.
#[utoipa::path(
    get,
    path = "/v1/queues/{queue}/events",
    tag = "events",
    params(
        ("queue" = QueueName, Path, description = "Queue name, 1-64 chars of `a-z 0-9 . _ -`"),
        ("Last-Event-ID" = Option<String>, Header, description = "The id of the last event received, to resume from"),
    ),
    responses(
        (status = 200, description = "Server-sent events: snapshot, progress, completed, paused, resumed",
         body = String, content_type = "text/event-stream"),
        (status = 404, description = "The queue has no parent and is not paused", body = Problem,
         content_type = "application/problem+json"),
        (status = 429, description = "Too many event streams open in this process", body = Problem,
         content_type = "application/problem+json"),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn queue_events(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> ApiResult<Response> {
    let queue = queue_param(&queue)?;
    let turn = admit(&state)?;
    let watcher = Watcher::new(&state, caller, &headers);
    if !watcher.reaches(&queue) {
        return Err(ApiError::NotFound(format!("no queue {queue}")));
    }
    let (subscription, known) = state.events.watch_queue(&queue);
    let snapshot = match known {
        Some(snapshot) => snapshot,
        None => Arc::new(
            state
                .store
                .queues(Some(&queue), &watcher.caller.0.queues)
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| ApiError::NotFound(format!("no queue {queue}")))?,
        ),
    };
    let replay = match last_event_id(&headers).as_deref().and_then(queue_replay_from) {
        Some(from) => state.store.queue_completions(&queue, from, REPLAY_LIMIT).await?,
        None => Vec::new(),
    };
    let (sender, receiver) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        let mut stream = QueueStream {
            watcher,
            sender,
            queue,
            // A new stream has seen, in its snapshot, everything until now.
            last_completed: Utc::now(),
            replayed: HashSet::new(),
            sent: None,
        };
        stream.open(snapshot, replay).await;
        stream.follow(subscription).await;
    });
    Ok(sse(receiver, turn))
}

/// A turn among `--max-event-streams`, or 429.
fn admit(state: &AppState) -> ApiResult<StreamTurn> {
    state
        .events
        .admit()
        .ok_or_else(|| ApiError::TooManyStreams(state.events.max_streams()))
}

fn last_event_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The response: the events the stream's task sends, a comment every
/// `HEARTBEAT`. The stream's turn is held as long as the client is.
fn sse(mut receiver: mpsc::Receiver<Event>, turn: StreamTurn) -> Response {
    let events = futures::stream::poll_fn(move |cx| {
        let _held = &turn;
        receiver.poll_recv(cx).map(|event| event.map(Ok::<_, Infallible>))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    // Proxies that buffer responses (nginx) pass this one on as it comes.
    response.headers_mut().insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    response
}

/// Who watches, checked again as what the stream shows changes.
struct Watcher {
    state: AppState,
    caller: Caller,
    authorization: Vec<HeaderValue>,
}

impl Watcher {
    fn new(state: &AppState, caller: Caller, headers: &HeaderMap) -> Self {
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
    fn reaches(&self, queue: &QueueName) -> bool {
        let authorization: Vec<&[u8]> = self.authorization.iter().map(HeaderValue::as_bytes).collect();
        match self.state.access.authenticate(&authorization) {
            Ok(grant) => grant.may(Role::Reader) && grant.reaches(queue.as_str()),
            Err(_) => false,
        }
    }

    fn stopping(&self) -> tokio::sync::watch::Receiver<bool> {
        self.state.shutdown.subscribe()
    }
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

/// Waits for the next event of a subscription, or for the service to stop
/// or the client to leave (`None`).
async fn next_live(
    subscription: &mut Subscription,
    sender: &mpsc::Sender<Event>,
    stopping: &mut tokio::sync::watch::Receiver<bool>,
) -> Option<Result<Live, RecvError>> {
    if *stopping.borrow() {
        return None;
    }
    tokio::select! {
        live = subscription.receiver.recv() => Some(live),
        _ = sender.closed() => None,
        _ = stopping.wait_for(|stopping| *stopping) => None,
    }
}

/// A parent stream's task.
struct ParentStream {
    watcher: Watcher,
    sender: mpsc::Sender<Event>,
    /// What the client was last sent.
    sent: Option<Arc<Parent>>,
    sent_completed: Option<String>,
}

impl ParentStream {
    async fn send(&self, event: Event) -> bool {
        self.sender.send(event).await.is_ok()
    }

    async fn open(&mut self, parent: Arc<Parent>, paused: bool, last_event_id: Option<&str>) {
        let shown = self.watcher.caller.shown((*parent).clone());
        let snapshot = event("snapshot", &shown, Some(&parent_event_id(&parent))).retry(RECONNECT);
        if !self.send(snapshot).await {
            return;
        }
        if paused {
            let pause = Pause {
                queue: &parent.queue,
                paused: true,
            };
            self.send(event("paused", &pause, None)).await;
        }
        if owes_completed(&parent, last_event_id) {
            self.send_completed(&parent).await;
        } else {
            self.sent_completed = completed_event_id(&parent);
        }
        self.sent = Some(parent);
    }

    async fn send_completed(&mut self, parent: &Parent) -> bool {
        let Some(id) = completed_event_id(parent) else {
            return true;
        };
        let shown = self.watcher.caller.shown(parent.clone());
        let sent = self.send(event("completed", &shown, Some(&id))).await;
        self.sent_completed = Some(id);
        sent
    }

    /// Sends a parent as it is now: `progress` when it moved, `completed`
    /// when this completion was not sent yet. `false` ends the stream.
    async fn show(&mut self, parent: Arc<Parent>) -> bool {
        let moved_hands = self
            .sent
            .as_ref()
            .is_none_or(|sent| sent.queue != parent.queue || sent.created_at != parent.created_at);
        if moved_hands && !self.watcher.reaches(&parent.queue) {
            return false;
        }
        if self.sent.as_deref().is_none_or(|sent| !same_parent(sent, &parent)) {
            let shown = self.watcher.caller.shown((*parent).clone());
            if !self
                .send(event("progress", &shown, Some(&parent_event_id(&parent))))
                .await
            {
                return false;
            }
        }
        if completed_event_id(&parent).is_some_and(|id| self.sent_completed.as_deref() != Some(id.as_str()))
            && !self.send_completed(&parent).await
        {
            return false;
        }
        self.sent = Some(parent);
        true
    }

    async fn follow(&mut self, mut subscription: Subscription) {
        let mut stopping = self.watcher.stopping();
        while let Some(live) = next_live(&mut subscription, &self.sender, &mut stopping).await {
            let go_on = match live {
                Ok(Live::Parent(parent)) => self.show(parent).await,
                Ok(Live::Gone) | Err(RecvError::Closed) => false,
                Ok(Live::Paused { queue, paused }) => {
                    let name = if paused { "paused" } else { "resumed" };
                    let pause = Pause { queue: &queue, paused };
                    self.send(event(name, &pause, None)).await
                }
                Ok(Live::Queue(_) | Live::Completed(_)) => true,
                // Fell behind: what it is now says all (a completion included).
                Err(RecvError::Lagged(_)) => match self.sent.as_ref().map(|p| p.parent_id.clone()) {
                    Some(parent_id) => match self.watcher.state.store.parent(&parent_id, false).await {
                        Ok(parent) => self.show(Arc::new(parent)).await,
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

/// A queue stream's task.
struct QueueStream {
    watcher: Watcher,
    sender: mpsc::Sender<Event>,
    queue: QueueName,
    /// The `completed_at` of the last completion sent (or when the stream
    /// opened): its events' id.
    last_completed: DateTime<Utc>,
    /// Completions replayed at the start, not sent again live.
    replayed: HashSet<(ParentId, DateTime<Utc>)>,
    sent: Option<Arc<Queue>>,
}

impl QueueStream {
    fn id(&self) -> String {
        queue_event_id(Some(self.last_completed))
    }

    async fn send(&self, event: Event) -> bool {
        self.sender.send(event).await.is_ok()
    }

    async fn open(&mut self, snapshot: Arc<Queue>, replay: Vec<Parent>) {
        let first = event("snapshot", &*snapshot, Some(&self.id())).retry(RECONNECT);
        if !self.send(first).await {
            return;
        }
        if snapshot.paused {
            let pause = Pause {
                queue: &self.queue,
                paused: true,
            };
            self.send(event("paused", &pause, None)).await;
        }
        self.sent = Some(snapshot);
        for parent in replay {
            if let Some(at) = parent.completed_at {
                self.replayed.insert((parent.parent_id.clone(), at));
            }
            if !self.completed(&parent).await {
                return;
            }
        }
    }

    async fn completed(&mut self, parent: &Parent) -> bool {
        if let Some(at) = parent.completed_at {
            self.last_completed = self.last_completed.max(at);
        }
        let shown = self.watcher.caller.shown(parent.clone());
        let id = self.id();
        self.send(event("completed", &shown, Some(&id))).await
    }

    async fn follow(&mut self, mut subscription: Subscription) {
        let mut stopping = self.watcher.stopping();
        while let Some(live) = next_live(&mut subscription, &self.sender, &mut stopping).await {
            let go_on = match live {
                _ if !self.watcher.reaches(&self.queue) => false,
                Ok(Live::Queue(queue)) => {
                    if self.sent.as_deref() == Some(&*queue) {
                        true
                    } else {
                        let sent = self.send(event("progress", &*queue, Some(&self.id()))).await;
                        self.sent = Some(queue);
                        sent
                    }
                }
                Ok(Live::Completed(parent)) => {
                    let replayed = parent
                        .completed_at
                        .is_some_and(|at| self.replayed.remove(&(parent.parent_id.clone(), at)));
                    replayed || self.completed(&parent).await
                }
                Ok(Live::Paused { paused, .. }) => {
                    let name = if paused { "paused" } else { "resumed" };
                    let pause = Pause {
                        queue: &self.queue,
                        paused,
                    };
                    self.send(event(name, &pause, None)).await
                }
                Ok(Live::Parent(_) | Live::Gone) => true,
                Err(RecvError::Closed) => false,
                // Fell behind: replay the completions since the last one sent.
                Err(RecvError::Lagged(_)) => {
                    let from = self.last_completed - chrono::TimeDelta::seconds(5);
                    match self
                        .watcher
                        .state
                        .store
                        .queue_completions(&self.queue, from, REPLAY_LIMIT)
                        .await
                    {
                        Ok(parents) => {
                            let mut ok = true;
                            for parent in parents {
                                ok = ok && self.completed(&parent).await;
                            }
                            ok
                        }
                        Err(_) => false,
                    }
                }
            };
            if !go_on {
                return;
            }
        }
    }
}
