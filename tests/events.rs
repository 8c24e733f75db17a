//! Event streams (`GET /v1/parents/{id}/events`, `GET /v1/queues/{queue}/events`):
//! a snapshot at once, progress while it moves, one `completed` per
//! completion (never missed across a reconnect with `Last-Event-ID`), pause
//! and resume, other replicas' changes, the stream limit, and the token's
//! reach, checked again when a parent changes hands.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One server-sent event as a client reads it.
#[derive(Debug, Clone)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: Value,
}

/// An open stream: its events as they arrive; `None` once it ended.
struct Stream {
    events: mpsc::UnboundedReceiver<SseEvent>,
    /// Every comment line (heartbeats) and event seen, for the record.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Stream {
    /// The next event within `wait`; `None` when the stream ended or nothing came.
    async fn next(&mut self, wait: Duration) -> Option<SseEvent> {
        tokio::time::timeout(wait, self.events.recv()).await.ok().flatten()
    }

    /// The next event named `name` within `wait`, skipping others.
    async fn next_named(&mut self, name: &str, wait: Duration) -> Option<SseEvent> {
        let deadline = Instant::now() + wait;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let event = self.next(left).await?;
            if event.event == name {
                return Some(event);
            }
        }
    }

    /// Every event until the stream ends (within `wait`); `Err` with what
    /// came when it did not end.
    async fn until_end(&mut self, wait: Duration) -> Result<Vec<SseEvent>, Vec<SseEvent>> {
        let deadline = Instant::now() + wait;
        let mut seen = Vec::new();
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Err(seen);
            };
            match tokio::time::timeout(left, self.events.recv()).await {
                Ok(Some(event)) => seen.push(event),
                Ok(None) => return Ok(seen),
                Err(_) => return Err(seen),
            }
        }
    }
}

/// Opens `path` as an event stream (as `token`, resuming after
/// `last_event_id`); the status and problem when it is refused.
async fn open(
    app: &TestApp,
    path: &str,
    token: Option<&str>,
    last_event_id: Option<&str>,
) -> Result<Stream, (StatusCode, reqwest::header::HeaderMap, Value)> {
    let mut request = reqwest::Client::new()
        .get(format!("{}{path}", app.base))
        .header("accept", "text/event-stream");
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id);
    }
    let response = request.send().await.expect("the service answers");
    if response.status() != StatusCode::OK {
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.json().await.unwrap_or(Value::Null);
        return Err((status, headers, body));
    }
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(content_type.starts_with("text/event-stream"), "{content_type}");
    assert!(response.headers().get("etag").is_none(), "a stream has no ETag");
    let (sender, events) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut body = response.bytes_stream();
        let mut buffer = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = ("message".to_owned(), None, String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // a comment (heartbeat) or a bare retry
                }
                let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                if sender.send(SseEvent { event, id, data }).is_err() {
                    return;
                }
            }
        }
    });
    Ok(Stream { events, task })
}

const WAIT: Duration = Duration::from_secs(5);

/// Claims every child of `parent` and records `processed` for `take` of them.
async fn process(app: &TestApp, parent: &str, take: usize) {
    let claim = app
        .post(&format!("/v1/parents/{parent}/claims"), json!({"limit": take}))
        .await
        .body;
    let claim_id = claim["claim_id"].as_str().unwrap();
    let outcomes: Vec<Value> = claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"parent_id": parent, "sequence": c["sequence"], "outcome": "processed", "claim_id": claim_id}))
        .collect();
    assert_eq!(outcomes.len(), take, "{claim}");
    let r = app.post("/v1/outcomes", json!({ "outcomes": outcomes })).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
}

async fn a_parent_stream_shows_progress_and_one_completion(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/E-1", json!({"queue": "live", "children": children(4)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let mut stream = open(&app, "/v1/parents/E-1/events", None, None).await.unwrap();
    let snapshot = stream.next(WAIT).await.expect("a snapshot at once");
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["parent_id"], "E-1");
    assert_eq!(snapshot.data["counts"]["pending"], 4, "{snapshot:?}");
    assert!(snapshot.id.is_some());

    let started = Instant::now();
    process(&app, "E-1", 2).await;
    let progress = loop {
        let event = stream.next_named("progress", WAIT).await.expect("progress");
        if event.data["counts"]["processed"] == 2 {
            break event;
        }
    };
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(progress.data["complete"], false);

    process(&app, "E-1", 2).await;
    let completed = stream.next_named("completed", WAIT).await.expect("completed");
    assert_eq!(completed.data["complete"], true, "{completed:?}");
    assert_eq!(completed.data["counts"]["processed"], 4);
    assert!(
        completed.id.as_deref().is_some_and(|id| id.contains(".c")),
        "{completed:?}"
    );
    // One completion, one `completed`.
    assert!(
        stream
            .next_named("completed", Duration::from_millis(800))
            .await
            .is_none()
    );
}

/// A client that reconnects with the id of the last event it saw is sent
/// the completion it missed; one that saw the completion is not sent it again.
/// On Postgres the parent completes through, and the client reconnects to,
/// another replica.
async fn a_reconnect_with_last_event_id_never_misses_a_completion(backend: Backend) {
    let first = spawn_app(backend).await;
    let replica = match backend {
        Backend::Postgres => Some(first.replica().await),
        Backend::Sqlite => None,
    };
    let app = &first;
    let other = replica.as_ref().unwrap_or(&first);
    let r = app
        .put("/v1/parents/R-1", json!({"queue": "resume", "children": children(2)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let mut stream = open(app, "/v1/parents/R-1/events", None, None).await.unwrap();
    let snapshot = stream.next(WAIT).await.unwrap();
    let mut queue = open(app, "/v1/queues/resume/events", None, None).await.unwrap();
    let queue_snapshot = queue.next(WAIT).await.unwrap();
    assert_eq!(queue_snapshot.event, "snapshot");
    assert_eq!(queue_snapshot.data["queue"], "resume");
    drop(stream);
    drop(queue);

    // The parent completes while nobody watches.
    process(other, "R-1", 2).await;

    let mut resumed = open(other, "/v1/parents/R-1/events", None, snapshot.id.as_deref())
        .await
        .unwrap();
    let first = resumed.next(WAIT).await.unwrap();
    assert_eq!(first.event, "snapshot");
    assert_eq!(first.data["complete"], true);
    let completed = resumed
        .next_named("completed", WAIT)
        .await
        .expect("the missed completion");
    assert_eq!(completed.data["parent_id"], "R-1");
    drop(resumed);

    // Having seen it, a client is not sent it again.
    let mut again = open(other, "/v1/parents/R-1/events", None, completed.id.as_deref())
        .await
        .unwrap();
    assert_eq!(again.next(WAIT).await.unwrap().event, "snapshot");
    assert!(
        again
            .next_named("completed", Duration::from_millis(1500))
            .await
            .is_none()
    );

    // The queue stream replays the completion it missed too.
    let mut queue = open(other, "/v1/queues/resume/events", None, queue_snapshot.id.as_deref())
        .await
        .unwrap();
    assert_eq!(queue.next(WAIT).await.unwrap().event, "snapshot");
    let completed = queue
        .next_named("completed", WAIT)
        .await
        .expect("the queue's missed completion");
    assert_eq!(completed.data["parent_id"], "R-1");
    assert_eq!(completed.data["complete"], true);
}

/// A queue stream: its counts move, each parent's completion is told, and a
/// pause and resume are events.
async fn a_queue_stream_shows_progress_completions_and_pauses(backend: Backend) {
    let app = spawn_app(backend).await;
    for parent in ["Q-1", "Q-2"] {
        let r = app
            .put(
                &format!("/v1/parents/{parent}"),
                json!({"queue": "board", "children": children(2)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let mut stream = open(&app, "/v1/queues/board/events", None, None).await.unwrap();
    let snapshot = stream.next(WAIT).await.unwrap();
    assert_eq!(snapshot.event, "snapshot");
    assert_eq!(snapshot.data["children"]["pending"], 4, "{snapshot:?}");
    // Let the hub take its first look, so what follows is new to it.
    tokio::time::sleep(Duration::from_millis(600)).await;

    process(&app, "Q-1", 2).await;
    let completed = stream.next_named("completed", WAIT).await.expect("Q-1 completed");
    assert_eq!(completed.data["parent_id"], "Q-1");
    let progress = loop {
        let event = stream.next_named("progress", WAIT).await.expect("progress");
        if event.data["children"]["processed"] == 2 {
            break event;
        }
    };
    assert_eq!(progress.data["parents"]["complete"], 1, "{progress:?}");

    let r = app.post("/v1/queues/board/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let paused = stream.next_named("paused", WAIT).await.expect("paused");
    assert_eq!(paused.data, json!({"queue": "board", "paused": true}));
    let r = app.post("/v1/queues/board/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let resumed = stream.next_named("resumed", WAIT).await.expect("resumed");
    assert_eq!(resumed.data["paused"], false);

    // A parent stream hears its queue's pause too.
    let mut parent = open(&app, "/v1/parents/Q-2/events", None, None).await.unwrap();
    assert_eq!(parent.next(WAIT).await.unwrap().event, "snapshot");
    tokio::time::sleep(Duration::from_millis(600)).await;
    app.post("/v1/queues/board/pause", json!({})).await;
    assert!(parent.next_named("paused", WAIT).await.is_some());
}

/// A queue stream resumed from an old `Last-Event-ID` replays every
/// completion since, however many (a page at a time), on any replica: 1,200
/// parents completed, the stream resumes on the other replica (Postgres)
/// and shows each of them.
async fn a_resumed_queue_stream_replays_every_completion(backend: Backend) {
    const PARENTS: usize = 1200;
    let a = spawn_app(backend).await;
    let b = match backend {
        Backend::Postgres => Some(a.replica().await),
        Backend::Sqlite => None,
    };
    let reader = b.as_ref().unwrap_or(&a);
    // Each parent's one child is skipped at registration: it completes at once.
    let client = reqwest::Client::new();
    let registered = futures::stream::iter(0..PARENTS)
        .map(|i| {
            let client = client.clone();
            let url = format!("{}/v1/parents/R-{i:04}", a.base);
            async move {
                client
                    .put(url)
                    .json(&json!({"queue": "many", "children": [{"skip": "done"}]}))
                    .send()
                    .await
                    .map(|r| r.status())
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    assert!(
        registered.iter().all(|s| matches!(s, Ok(StatusCode::CREATED))),
        "{:?}",
        registered.iter().find(|s| !matches!(s, Ok(StatusCode::CREATED)))
    );
    // Resumed from an id older than every completion.
    let mut stream = open(reader, "/v1/queues/many/events", None, Some("q1")).await.unwrap();
    assert_eq!(stream.next(WAIT).await.unwrap().event, "snapshot");
    let mut seen = std::collections::HashSet::new();
    while seen.len() < PARENTS {
        let event = stream
            .next_named("completed", Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{backend:?}: only {} of {PARENTS} completions replayed", seen.len()));
        seen.insert(event.data["parent_id"].as_str().unwrap().to_owned());
    }
    eprintln!(
        "events[{backend:?}]: {} completions replayed to a resumed queue stream",
        seen.len()
    );
}

/// A change made through another replica reaches this replica's stream
/// through the `LISTEN` connection, well within the hub's own backstop.
async fn another_replicas_change_arrives(backend: Backend) {
    let a = spawn_app(backend).await;
    // SQLite is one process by design: its "replica" is the same service.
    let b = match backend {
        Backend::Postgres => Some(a.replica().await),
        Backend::Sqlite => None,
    };
    let writer = b.as_ref().unwrap_or(&a);
    let r = a
        .put("/v1/parents/X-1", json!({"queue": "across", "children": children(3)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let mut parent = open(&a, "/v1/parents/X-1/events", None, None).await.unwrap();
    let mut queue = open(&a, "/v1/queues/across/events", None, None).await.unwrap();
    assert_eq!(parent.next(WAIT).await.unwrap().event, "snapshot");
    assert_eq!(queue.next(WAIT).await.unwrap().event, "snapshot");
    tokio::time::sleep(Duration::from_millis(600)).await;

    let started = Instant::now();
    process(writer, "X-1", 1).await;
    let progress = loop {
        let event = parent
            .next_named("progress", WAIT)
            .await
            .expect("progress from the other replica");
        if event.data["counts"]["processed"] == 1 {
            break event;
        }
    };
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{backend:?}: the other replica's outcome showed after {:?}",
        started.elapsed()
    );
    assert_eq!(progress.data["parent_id"], "X-1");
    process(writer, "X-1", 2).await;
    let completed = parent.next_named("completed", WAIT).await.expect("completed");
    assert_eq!(completed.data["parent_id"], "X-1");
    let completed = queue
        .next_named("completed", WAIT)
        .await
        .expect("the queue's completed");
    assert_eq!(completed.data["parent_id"], "X-1");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

/// Beyond `--max-event-streams`, 429 with `Retry-After`; a closed stream
/// frees its turn.
async fn streams_beyond_the_limit_are_refused(backend: Backend) {
    let limits = child_ledger::config::Limits {
        max_event_streams: 2,
        ..child_ledger::config::Limits::default()
    };
    let app = spawn_app_with(backend, limits).await;
    let r = app
        .put("/v1/parents/L-1", json!({"queue": "cap", "children": children(1)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let r = app.get("/v1/parents/nope/events").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    let r = app.get("/v1/queues/Bad/events").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
    assert!(
        r.body["detail"].as_str().unwrap_or("").contains("queue") || r.body.to_string().contains("queue"),
        "{r:?}"
    );
    let mut first = open(&app, "/v1/parents/L-1/events", None, None).await.unwrap();
    let mut second = open(&app, "/v1/queues/cap/events", None, None).await.unwrap();
    assert!(first.next(WAIT).await.is_some() && second.next(WAIT).await.is_some());
    let (status, headers, problem) = match open(&app, "/v1/parents/L-1/events", None, None).await {
        Err(refused) => refused,
        Ok(_) => panic!("a third stream was admitted"),
    };
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{problem}");
    assert!(headers.contains_key("retry-after"));
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/problem+json")
    );
    assert!(
        problem["type"].as_str().unwrap().ends_with("too-many-event-streams"),
        "{problem}"
    );
    let metrics = app.get("/metrics").await.body.as_str().unwrap().to_owned();
    assert!(
        metrics.lines().any(|l| l == "child_ledger_event_streams 2"),
        "{metrics}"
    );

    drop(second);
    // The server notices the client left at its next write: a heartbeat or an event.
    app.post("/v1/queues/cap/pause", json!({})).await;
    let deadline = Instant::now() + WAIT;
    loop {
        match open(&app, "/v1/parents/L-1/events", None, None).await {
            Ok(mut third) => {
                assert_eq!(third.next(WAIT).await.unwrap().event, "snapshot");
                break;
            }
            Err((status, ..)) if Instant::now() < deadline => {
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(refused) => panic!("the closed stream's turn was not freed: {refused:?}"),
        }
    }
}

/// A token limited to some queues is refused another queue's streams, as
/// if they did not exist.
async fn a_scoped_token_is_refused_another_queues_stream(backend: Backend) {
    let (reader, reader_entry) = token("reader-a", &[Role::Reader], &["a"]);
    let (admin, admin_entry) = token("admin", &[Role::Admin], &[]);
    let app = spawn_app_with_tokens(backend, json!([reader_entry, admin_entry])).await;
    for (parent, queue) in [("S-A", "a"), ("S-B", "b")] {
        let r = app
            .put_as(
                &admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(1)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let mut own = open(&app, "/v1/parents/S-A/events", Some(&reader), None).await.unwrap();
    assert_eq!(own.next(WAIT).await.unwrap().event, "snapshot");
    let mut own_queue = open(&app, "/v1/queues/a/events", Some(&reader), None).await.unwrap();
    assert_eq!(own_queue.next(WAIT).await.unwrap().event, "snapshot");
    for path in [
        "/v1/parents/S-B/events",
        "/v1/queues/b/events",
        "/v1/parents/S-missing/events",
    ] {
        match open(&app, path, Some(&reader), None).await {
            Err((status, _, problem)) => {
                assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {problem}");
                assert!(!problem.to_string().contains("\"b\""), "{problem}");
            }
            Ok(_) => panic!("{path} was streamed to a token of queue a"),
        }
    }
    match open(&app, "/v1/parents/S-A/events", None, None).await {
        Err((status, ..)) => assert_eq!(status, StatusCode::UNAUTHORIZED),
        Ok(_) => panic!("a stream without a token"),
    }
}

/// A parent deleted and registered again in a queue the token does not
/// reach: its stream ends, and shows nothing of the new parent. On Postgres
/// the deletion and the new registration go through another replica.
async fn a_parent_registered_again_elsewhere_does_not_leak(backend: Backend) {
    let (reader, reader_entry) = token("reader-a", &[Role::Reader], &["a"]);
    let (admin, admin_entry) = token("admin", &[Role::Admin], &[]);
    let app = spawn_app_with_tokens(backend, json!([reader_entry, admin_entry])).await;
    let replica = match backend {
        Backend::Postgres => Some(app.replica().await),
        Backend::Sqlite => None,
    };
    let writer = replica.as_ref().unwrap_or(&app);
    let put = |queue: &'static str, payload: &'static str| {
        let app = writer;
        let admin = admin.clone();
        async move {
            app.put_as(
                &admin,
                "/v1/parents/MOVE-1",
                json!({"queue": queue, "payload": {"secret": payload}, "children": [{"payload": {}, "skip": "done"}]}),
            )
            .await
        }
    };
    // Complete at once (its one child is skipped), so it may be deleted.
    assert_eq!(put("a", "first").await.status, StatusCode::CREATED);
    let mut stream = open(&app, "/v1/parents/MOVE-1/events", Some(&reader), None)
        .await
        .unwrap();
    let snapshot = stream.next(WAIT).await.unwrap();
    assert_eq!(snapshot.data["queue"], "a");
    tokio::time::sleep(Duration::from_millis(600)).await;

    let r = writer
        .request_as(Some(&admin), reqwest::Method::DELETE, "/v1/parents/MOVE-1", None)
        .await;
    assert!(r.status.is_success(), "{r:?}");
    assert_eq!(put("b", "second").await.status, StatusCode::CREATED);
    let seen = stream.until_end(Duration::from_secs(8)).await.unwrap_or_else(|seen| {
        panic!("the stream did not end: {seen:?}");
    });
    for event in &seen {
        assert_ne!(event.data["queue"], "b", "the new parent leaked: {seen:?}");
        assert!(!event.data.to_string().contains("second"), "{seen:?}");
    }
    // Reconnecting is a 404, as for any parent outside the token's queues.
    match open(&app, "/v1/parents/MOVE-1/events", Some(&reader), snapshot.id.as_deref()).await {
        Err((status, ..)) => assert_eq!(status, StatusCode::NOT_FOUND),
        Ok(_) => panic!("reconnected to another queue's parent"),
    }
}

/// N streams of one parent cost one read per tick, not N: the hub's reads
/// over a second of changes are about the same for 1 stream as for 40.
async fn many_streams_of_one_parent_share_each_read(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/N-1", json!({"queue": "many", "children": children(5000)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let reads = || async {
        let text = app.get("/metrics").await.body.as_str().unwrap().to_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("child_ledger_event_stream_reads_total "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let mut measured = Vec::new();
    for viewers in [1usize, 40] {
        let mut streams = Vec::new();
        for _ in 0..viewers {
            let mut stream = open(&app, "/v1/parents/N-1/events", None, None).await.unwrap();
            assert_eq!(stream.next(WAIT).await.unwrap().event, "snapshot");
            streams.push(stream);
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        let before = reads().await;
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            process(&app, "N-1", 5).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = reads().await;
        // Every stream saw the last count.
        for stream in &mut streams {
            let mut last = None;
            while let Some(event) = stream.next(Duration::from_millis(300)).await {
                last = Some(event);
            }
            assert!(last.is_some(), "a stream saw no progress");
        }
        measured.push(after - before);
    }
    let (one, forty) = (measured[0], measured[1]);
    // At most one read per tick (250 ms) over ~1.8 s, whatever the viewers.
    assert!(forty <= 12.0, "40 streams: {forty} reads (1 stream: {one})");
    assert!(
        forty <= one * 2.0 + 4.0,
        "reads grew with the viewers: {one} -> {forty}"
    );
}

/// Each token holds at most its share of the process's streams
/// (`--max-event-streams-per-token`), so one tenant's idle dashboards cannot
/// take every turn; once every turn is taken, an admin can still watch.
async fn each_token_holds_its_share_and_an_admin_can_always_watch(backend: Backend) {
    let (a, a_entry) = token("dash-a", &[Role::Reader], &[]);
    let (b, b_entry) = token("dash-b", &[Role::Reader], &[]);
    let (c, c_entry) = token("dash-c", &[Role::Reader], &[]);
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let limits = child_ledger::config::Limits {
        max_event_streams: 4,
        max_event_streams_per_token: 2,
        ..child_ledger::config::Limits::default()
    };
    let mut app =
        spawn_app_with_tokens_and_limits(backend, json!([a_entry, b_entry, c_entry, admin_entry]), limits).await;
    app.token = Some(admin.clone());
    let r = app
        .put("/v1/parents/S-1", json!({"queue": "share", "children": children(1)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let refused = |opened: Result<Stream, (StatusCode, reqwest::header::HeaderMap, Value)>, what: &str| match opened {
        Err((status, headers, problem)) => {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{what}: {problem}");
            assert!(headers.contains_key("retry-after"), "{what}");
            assert!(
                problem["type"].as_str().unwrap().ends_with("too-many-event-streams"),
                "{problem}"
            );
            problem
        }
        Ok(_) => panic!("{what} was admitted"),
    };
    let mut held = Vec::new();
    for path in ["/v1/parents/S-1/events", "/v1/queues/share/events"] {
        held.push(open(&app, path, Some(&a), None).await.expect("a's share"));
    }
    let problem = refused(
        open(&app, "/v1/queues/share/events", Some(&a), None).await,
        "a's third stream",
    );
    assert!(problem["detail"].as_str().unwrap().contains("dash-a"), "{problem}");
    for _ in 0..2 {
        held.push(
            open(&app, "/v1/queues/share/events", Some(&b), None)
                .await
                .expect("b's share"),
        );
    }
    refused(
        open(&app, "/v1/parents/S-1/events", Some(&c), None).await,
        "c's stream past the process's four",
    );
    let mut watching = open(&app, "/v1/parents/S-1/events", Some(&admin), None)
        .await
        .expect("an admin can always watch");
    assert_eq!(watching.next(WAIT).await.expect("a snapshot").event, "snapshot");
}

/// A completion or a pause right after a stream opened, before the hub's
/// first look at its subject (which waits up to a tick after its last read,
/// here of another stream's parent), reaches that stream: the first look
/// used to take every completion and pause it found as old news.
async fn news_right_after_a_stream_opens_is_sent(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/BUSY", json!({"queue": "busy", "children": children(50)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    let mut busy = open(&app, "/v1/parents/BUSY/events", None, None).await.unwrap();
    assert_eq!(busy.next(WAIT).await.unwrap().event, "snapshot");
    for round in 0..3 {
        let queue = format!("late-{round}");
        let parent = format!("LATE-{round}");
        let r = app
            .put(
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(1)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        // The hub reads the busy parent now, so its next read waits a tick.
        process(&app, "BUSY", 1).await;
        busy.next_named("progress", WAIT)
            .await
            .expect("the busy parent's progress");
        let mut stream = open(&app, &format!("/v1/queues/{queue}/events"), None, None)
            .await
            .unwrap();
        assert_eq!(stream.next(WAIT).await.unwrap().event, "snapshot");
        let r = app
            .post(&format!("/v1/parents/{parent}/cancel"), json!({"reason": "at once"}))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        let completed = stream
            .next_named("completed", WAIT)
            .await
            .unwrap_or_else(|| panic!("round {round}: no completed for {parent}"));
        assert_eq!(completed.data["parent_id"], parent.as_str());

        // A pause right after a stream opened is said too, on the queue's
        // stream and on its parent's.
        let paused_queue = format!("hold-{round}");
        let held = format!("HOLD-{round}");
        let r = app
            .put(
                &format!("/v1/parents/{held}"),
                json!({"queue": paused_queue, "children": children(1)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
        process(&app, "BUSY", 1).await;
        busy.next_named("progress", WAIT)
            .await
            .expect("the busy parent's progress");
        let mut queue_stream = open(&app, &format!("/v1/queues/{paused_queue}/events"), None, None)
            .await
            .unwrap();
        let mut parent_stream = open(&app, &format!("/v1/parents/{held}/events"), None, None)
            .await
            .unwrap();
        assert_eq!(queue_stream.next(WAIT).await.unwrap().event, "snapshot");
        assert_eq!(parent_stream.next(WAIT).await.unwrap().event, "snapshot");
        let r = app.post(&format!("/v1/queues/{paused_queue}/pause"), json!({})).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
        for (what, stream) in [("queue", &mut queue_stream), ("parent", &mut parent_stream)] {
            let paused = stream
                .next_named("paused", WAIT)
                .await
                .unwrap_or_else(|| panic!("round {round}: the {what} stream was never told of the pause"));
            assert_eq!(paused.data["paused"], true, "{paused:?}");
        }
    }
}

both_stores!(
    news_right_after_a_stream_opens_is_sent,
    each_token_holds_its_share_and_an_admin_can_always_watch,
    a_resumed_queue_stream_replays_every_completion,
    a_parent_stream_shows_progress_and_one_completion,
    a_reconnect_with_last_event_id_never_misses_a_completion,
    a_queue_stream_shows_progress_completions_and_pauses,
    another_replicas_change_arrives,
    streams_beyond_the_limit_are_refused,
    a_scoped_token_is_refused_another_queues_stream,
    a_parent_registered_again_elsewhere_does_not_leak,
    many_streams_of_one_parent_share_each_read,
);
