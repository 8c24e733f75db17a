//! Event streams: a parent's or a queue's progress as server-sent events.
//!
//! A stream sends what it shows now at once (`snapshot`), then `progress`
//! at most every 250 ms while it changes, `completed` once per completion,
//! `paused` and `resumed`, and a comment every 15 s. What it shows comes from
//! the event hub (`events.rs`), which reads each subject once for all of its
//! streams. The token's reach is checked again whenever what the stream shows
//! could change hands, and at every reload of the tokens file: a parent
//! deleted and registered again in a queue the token does not reach ends its
//! stream, and so does a token the tokens file no longer grants (revoked, or
//! narrowed to other queues), at once, whether the stream is busy or quiet.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use tokio::sync::mpsc;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{parent_id_param, queue_param};
use super::guard::Caller;
use crate::error::{ApiError, ApiResult, Problem};
use crate::events::LiveParent;
use crate::ledger::events::queue_replay_from;
use crate::ledger::{ParentId, QueueName};
use crate::state::AppState;
use crate::turns::{NoTurn, Turn};

mod streams;

use streams::{ParentStream, QueueStream, Watcher};

/// A comment this often keeps proxies from closing an idle stream.
const HEARTBEAT: Duration = Duration::from_secs(15);

/// Events a stream buffers before its task waits for the client.
const BUFFERED: usize = 32;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(parent_events))
        .routes(routes!(queue_events))
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
/// token does not reach, when a reload of the tokens file no longer grants
/// the token, when the client has not read for 30 s, and when the service
/// stops; a client then reconnects, and is answered `404` if the parent is
/// gone. Beyond `--max-event-streams` open streams in this process, or
/// `--max-event-streams-per-token` of one token: `429` (an admin token may
/// still open one of 4 streams kept for admins).
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
        (status = 429, description = "Too many event streams open in this process, or held by this token", body = Problem,
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
    let turn = admit(&state, &caller)?;
    let watcher = Watcher::new(&state, caller, &headers);
    // Subscribed before the snapshot is read: nothing between is missed.
    let (subscription, known) = state.events.watch_parent(&parent_id);
    let parent = match known {
        Some(parent) => parent,
        None => Arc::new(LiveParent::new(state.store.parent(&parent_id, false).await?)),
    };
    if !watcher.reaches(&parent.parent.queue) {
        return Err(ApiError::NotFound(format!("no parent {parent_id}")));
    }
    let paused = state.events.paused().await?.contains(&parent.parent.queue);
    let last_event_id = last_event_id(&headers);
    let (sender, receiver) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        // The turn is the task's: a client that left, or stopped reading
        // (see `streams::STALLED`), gives it back when the task ends.
        let _turn = turn;
        let mut stream = ParentStream {
            watcher,
            sender,
            sent: None,
            sent_completed: None,
            told_paused: false,
        };
        stream.open(parent, paused, last_event_id.as_deref()).await;
        stream.follow(subscription).await;
    });
    Ok(sse(receiver))
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
/// paused; beyond `--max-event-streams` open streams in this process, or
/// `--max-event-streams-per-token` of one token: `429` (an admin token may
/// still open one of 4 streams kept for admins). It ends as a parent's does
/// when the token is no longer granted or the client stops reading.
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
        (status = 429, description = "Too many event streams open in this process, or held by this token", body = Problem,
         content_type = "application/problem+json"),
        (status = 400, description = "Invalid queue name", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A queue name made only of dots, or holding `/`: no URL names it reliably", body = Problem, content_type = "application/problem+json"),
    )
)]
async fn queue_events(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Path(queue): Path<String>,
) -> ApiResult<Response> {
    let queue = queue_param(&queue)?;
    let turn = admit(&state, &caller)?;
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
    let replay = last_event_id(&headers).as_deref().and_then(queue_replay_from);
    let (sender, receiver) = mpsc::channel(BUFFERED);
    tokio::spawn(async move {
        // The turn is the task's: a client that left, or stopped reading
        // (see `streams::STALLED`), gives it back when the task ends.
        let _turn = turn;
        let mut stream = QueueStream {
            watcher,
            sender,
            queue,
            // A new stream has seen, in its snapshot, everything until now.
            last_completed: Utc::now(),
            replayed: HashSet::new(),
            sent: None,
            told_paused: false,
        };
        stream.open(snapshot, replay).await;
        stream.follow(subscription).await;
    });
    Ok(sse(receiver))
}

/// A turn among `--max-event-streams`, or 429.
/// A turn for the caller's stream (see `Caller::turn`).
fn admit(state: &AppState, caller: &Caller) -> ApiResult<Turn> {
    caller.turn(state, state.events.turns()).map_err(|refused| {
        ApiError::TooManyStreams(match refused {
            NoTurn::Process(max) => format!("{max} event streams are already open here"),
            NoTurn::Token(share) => format!(
                "token {:?} already holds its share of event streams ({share}, --max-event-streams-per-token)",
                caller.0.name
            ),
        })
    })
}

fn last_event_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The response: the events the stream's task sends, a comment every
/// `HEARTBEAT`.
fn sse(mut receiver: mpsc::Receiver<Event>) -> Response {
    let events = futures::stream::poll_fn(move |cx| receiver.poll_recv(cx).map(|event| event.map(Ok::<_, Infallible>)));
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
