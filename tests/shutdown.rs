//! Graceful shutdown: on SIGTERM the service stops accepting connections,
//! finishes the requests in flight, answers waiting long polls at once and
//! exits 0 within a bound; no outcome it acknowledged is lost. Each test runs
//! the real binary on both stores and restarts it on the same database.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The process must have exited this long after SIGTERM.
const EXIT_BOUND: Duration = Duration::from_secs(10);
/// Children in the registration that is in flight when the signal comes.
const BIG: usize = 20_000;
/// Claimed children whose outcomes are posted around the signal.
const CLAIMED: usize = 300;
/// Outcomes acknowledged well before the signal.
const EARLY: usize = 20;
/// Sequences from here to `CLAIMED` form the outcome batch held in flight across the signal.
const HELD_FROM: usize = CLAIMED - BATCH;
/// Outcomes per batch posted around the signal (one batch every 2 ms).
const BATCH: usize = 10;
/// When the signal is sent, counted from the first of those batches.
const SIGNAL_DELAY: Duration = Duration::from_millis(15);

async fn start(db: &TestDatabase, name: &str) -> ServiceProcess {
    let service = ServiceProcess::start(name, &db.url, &[]).await;
    service.wait_for("/healthz", Duration::from_secs(60)).await;
    service.ready().await;
    service
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Sends a JSON request and returns the status and body, or panics.
async fn call(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client.request(method.clone(), url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

async fn expect(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
    want: StatusCode,
) -> Value {
    let (status, answer) = call(client, method.clone(), url, body).await;
    assert_eq!(status, want, "{method} {url}: {answer}");
    answer
}

/// Polls new TCP connections to the service until one is refused; how long that took.
async fn until_refused(port: u16, bound: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return started.elapsed(),
            // A handshake that raced the listener's closing: try again.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("connecting after SIGTERM: unexpected error {e}"),
            Ok(stream) => drop(stream),
        }
        assert!(
            started.elapsed() < bound,
            "new connections were still accepted {bound:?} after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A reconcile dry run finds the stored projection in agreement with the rows.
async fn assert_no_drift(client: &reqwest::Client, base: &str, parent: &str) {
    let report = expect(
        client,
        reqwest::Method::POST,
        &format!("{base}/v1/parents/{parent}/reconcile"),
        Some(json!({"dry_run": true})),
        StatusCode::OK,
    )
    .await;
    assert_eq!(report["changes"], json!([]), "{parent} drifted: {report}");
}

type Answered = Result<(StatusCode, Value), reqwest::Error>;

/// Sends `body` with its first half now and its second half only when the
/// returned sender fires, so the request is in flight for as long as the test
/// wants; the receiver fires once the first half is on its way.
fn held_request(
    client: &reqwest::Client,
    url: String,
    method: reqwest::Method,
    body: &Value,
) -> (
    tokio::task::JoinHandle<Answered>,
    tokio::sync::oneshot::Receiver<()>,
    tokio::sync::oneshot::Sender<()>,
) {
    let mut head = serde_json::to_vec(body).unwrap();
    let tail = head.split_off(head.len() / 2);
    let (head_sent, head_sent_rx) = tokio::sync::oneshot::channel::<()>();
    let (send_tail, send_tail_rx) = tokio::sync::oneshot::channel::<()>();
    let body = futures::stream::once(async move {
        let _ = head_sent.send(());
        Ok::<_, std::io::Error>(head)
    })
    .chain(futures::stream::once(async move {
        let _ = send_tail_rx.await;
        Ok(tail)
    }));
    let request = client
        .request(method, url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(reqwest::Body::wrap_stream(body));
    let answer = tokio::spawn(async move {
        let response = request.send().await?;
        let status = response.status();
        let body: Value = response.json().await?;
        Ok((status, body))
    });
    (answer, head_sent_rx, send_tail)
}

async fn sigterm_finishes_in_flight_requests_and_keeps_acknowledged_outcomes(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let mut service = start(&db, "shutdown").await;
    let base = service.base.clone();
    let http = client();
    use reqwest::Method;

    // A parent whose children are all claimed, for outcomes around the signal.
    let outcomes_parent = "sd-outcomes";
    expect(
        &http,
        Method::PUT,
        &format!("{base}/v1/parents/{outcomes_parent}"),
        Some(json!({"queue": "sd", "children": children(CLAIMED)})),
        StatusCode::CREATED,
    )
    .await;
    let claim = expect(
        &http,
        Method::POST,
        &format!("{base}/v1/parents/{outcomes_parent}/claims"),
        Some(json!({"limit": CLAIMED, "lease_seconds": 600, "worker": "w-shutdown"})),
        StatusCode::OK,
    )
    .await;
    assert_eq!(claim["children"].as_array().map(Vec::len), Some(CLAIMED));
    let claim_id = claim["claim_id"].as_str().unwrap().to_owned();
    let outcome = move |sequence: usize, tag: &str| {
        json!({"parent_id": outcomes_parent, "sequence": sequence, "outcome": "processed",
               "result": {"tag": tag}, "claim_id": claim_id})
    };
    let early: Vec<Value> = (0..EARLY).map(|s| outcome(s, "early")).collect();
    let answer = expect(
        &http,
        Method::POST,
        &format!("{base}/v1/outcomes"),
        Some(json!({"outcomes": early})),
        StatusCode::OK,
    )
    .await;
    assert!(
        answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == "applied"),
        "{answer}"
    );

    // In flight when the signal comes: a 20,000-child registration whose body
    // is sent half now and half after the signal.
    let big_parent = "sd-big";
    let registration = json!({
        "queue": "sd-big",
        "children": (0..BIG).map(|i| json!({"payload": {"n": i}, "key": format!("k-{i}")})).collect::<Vec<_>>(),
    });
    // On a connection the server has already accepted and answered on, so
    // the request cannot be left in the listen backlog when the signal comes.
    let streaming = client();
    expect(
        &streaming,
        Method::GET,
        &format!("{base}/healthz"),
        None,
        StatusCode::OK,
    )
    .await;
    let (in_flight, head_sent_rx, send_tail) = held_request(
        &streaming,
        format!("{base}/v1/parents/{big_parent}"),
        Method::PUT,
        &registration,
    );
    // And an outcome batch, held the same way on a connection of its own.
    let held_batch: Vec<Value> = (HELD_FROM..CLAIMED).map(|s| outcome(s, "held")).collect();
    let batch_client = client();
    expect(
        &batch_client,
        Method::GET,
        &format!("{base}/healthz"),
        None,
        StatusCode::OK,
    )
    .await;
    let (held_post, held_head_rx, send_held_tail) = held_request(
        &batch_client,
        format!("{base}/v1/outcomes"),
        Method::POST,
        &json!({"outcomes": held_batch}),
    );
    held_head_rx.await.unwrap();
    head_sent_rx.await.unwrap();
    // The server has read the headers and is reading the body.
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Outcome batches posted every 2 ms around the signal, each on its own connection.
    let batches: Vec<Vec<Value>> = (EARLY..HELD_FROM)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .enumerate()
        .map(|(b, sequences)| sequences.iter().map(|&s| outcome(s, &format!("batch-{b}"))).collect())
        .collect();
    let posted: Vec<_> = batches
        .iter()
        .enumerate()
        .map(|(b, batch)| {
            let url = format!("{base}/v1/outcomes");
            let body = json!({"outcomes": batch});
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2 * b as u64)).await;
                let fresh = reqwest::Client::builder()
                    .timeout(Duration::from_secs(60))
                    .build()
                    .unwrap();
                let response = fresh.post(url).json(&body).send().await?;
                let status = response.status();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                Ok::<_, reqwest::Error>((status, body))
            })
        })
        .collect();

    let port = service.port;
    let (exit, observed) = tokio::join!(
        async {
            tokio::time::sleep(SIGNAL_DELAY).await;
            let signalled = Instant::now();
            let status = service.terminate(EXIT_BOUND).await;
            (status, signalled.elapsed())
        },
        async {
            tokio::time::sleep(SIGNAL_DELAY).await;
            let refused_after = until_refused(port, Duration::from_secs(5)).await;
            // Not even an HTTP request gets through a new connection.
            let refused = reqwest::Client::new()
                .get(format!("http://127.0.0.1:{port}/healthz"))
                .timeout(Duration::from_secs(5))
                .send()
                .await;
            assert!(
                refused.is_err(),
                "a new request was answered after SIGTERM: {refused:?}"
            );
            // Only now do the in-flight registration and batch get the rest of their bodies.
            send_tail.send(()).unwrap();
            send_held_tail.send(()).unwrap();
            let released = Instant::now();
            let registered = in_flight.await.unwrap();
            let held = held_post.await.unwrap();
            (refused_after, registered, held, released.elapsed())
        },
    );
    let (status, exited_after) = exit;
    let (refused_after, registered, held, finished_after_release) = observed;
    // The batch in flight when the signal came was answered, all applied.
    let (held_status, held_body) = held.expect("the in-flight outcome batch got no answer");
    assert_eq!(held_status, StatusCode::OK, "the in-flight outcome batch: {held_body}");
    let held_results = held_body["results"].as_array().unwrap();
    assert_eq!(held_results.len(), CLAIMED - HELD_FROM, "{held_body}");
    assert!(held_results.iter().all(|r| r["status"] == "applied"), "{held_body}");
    let (status_code, registered) = registered.expect("the in-flight registration got no answer");
    assert_eq!(
        status_code,
        StatusCode::CREATED,
        "the in-flight registration: {registered}"
    );
    assert_eq!(registered["counts"]["total"], BIG, "{registered}");
    assert!(status.success(), "exit status after SIGTERM: {status}");

    let mut acknowledged: Vec<(usize, String)> = (0..EARLY)
        .map(|s| (s, "early".to_owned()))
        .chain((HELD_FROM..CLAIMED).map(|s| (s, "held".to_owned())))
        .collect();
    let (mut acked_batches, mut refused_batches, mut cut_batches, mut other) = (0, 0, 0, Vec::new());
    for (b, posted) in posted.into_iter().enumerate() {
        match posted.await.unwrap() {
            Ok((StatusCode::OK, body)) => {
                acked_batches += 1;
                for (result, write) in body["results"].as_array().unwrap().iter().zip(&batches[b]) {
                    assert_eq!(result["status"], "applied", "batch {b}: {body}");
                    let sequence = write["sequence"].as_u64().unwrap() as usize;
                    acknowledged.push((sequence, format!("batch-{b}")));
                }
            }
            Ok((status, body)) => other.push(format!("batch {b}: {status} {body}")),
            // Connecting after the listener closed: refused, nothing written.
            Err(err) if err.is_connect() => refused_batches += 1,
            // Accepted, but closed before the request was read: not acknowledged.
            Err(err) if err.is_request() => cut_batches += 1,
            Err(err) => other.push(format!("batch {b}: {err}")),
        }
    }
    assert!(
        other.is_empty(),
        "answers that are neither 200, a refused connection, nor a connection closed unread: {other:?}"
    );

    // The same database, a new process: everything acknowledged is there.
    service.restart().await;
    service.ready().await;
    for (sequence, tag) in &acknowledged {
        let child = expect(
            &http,
            Method::GET,
            &format!("{base}/v1/parents/{outcomes_parent}/children/{sequence}"),
            None,
            StatusCode::OK,
        )
        .await;
        assert_eq!(
            (&child["state"], &child["result"]),
            (&json!("processed"), &json!({"tag": tag})),
            "acknowledged outcome lost: {child}"
        );
    }
    let processed = expect(
        &http,
        Method::GET,
        &format!("{base}/v1/parents/{outcomes_parent}/children?state=processed&limit=1000"),
        None,
        StatusCode::OK,
    )
    .await;
    let processed: BTreeSet<u64> = processed["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_u64().unwrap())
        .collect();
    let parent = expect(
        &http,
        Method::GET,
        &format!("{base}/v1/parents/{outcomes_parent}"),
        None,
        StatusCode::OK,
    )
    .await;
    assert_eq!(parent["counts"]["processed"], processed.len(), "{parent}");
    assert_no_drift(&http, &base, outcomes_parent).await;

    // The registration that was in flight is whole.
    let big = expect(
        &http,
        Method::GET,
        &format!("{base}/v1/parents/{big_parent}"),
        None,
        StatusCode::OK,
    )
    .await;
    assert_eq!(big["state"], "active", "{big}");
    assert_eq!(
        (&big["counts"]["total"], &big["counts"]["pending"]),
        (&json!(BIG), &json!(BIG)),
        "{big}"
    );
    assert!(big["decomposed_at"].is_string(), "{big}");
    let last = expect(
        &http,
        Method::GET,
        &format!("{base}/v1/parents/{big_parent}/children/{}", BIG - 1),
        None,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (&last["key"], &last["payload"]),
        (&json!(format!("k-{}", BIG - 1)), &json!({"n": BIG - 1})),
        "{last}"
    );
    assert_no_drift(&http, &base, big_parent).await;
    service.terminate(EXIT_BOUND).await;

    eprintln!(
        "{backend:?} shutdown: new connections refused {:.2} s after SIGTERM; the in-flight {BIG}-child registration \
         answered 201 {:.2} s after its body was released; exited 0 {:.2} s after SIGTERM; {} outcomes acknowledged \
         ({acked_batches} batches around the signal and one held across it, {refused_batches} refused, {cut_batches} \
         closed unread), all durable after restart",
        refused_after.as_secs_f64(),
        finished_after_release.as_secs_f64(),
        exited_after.as_secs_f64(),
        acknowledged.len()
    );
}

async fn sigterm_ends_long_polls_promptly(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let mut service = start(&db, "shutdown-long-poll").await;
    let base = service.base.clone();
    let http = client();
    use reqwest::Method;

    // One parent whose only child is leased: nothing claimable anywhere.
    expect(
        &http,
        Method::PUT,
        &format!("{base}/v1/parents/sd-poll"),
        Some(json!({"queue": "sd-poll", "children": children(1)})),
        StatusCode::CREATED,
    )
    .await;
    expect(
        &http,
        Method::POST,
        &format!("{base}/v1/parents/sd-poll/claims"),
        Some(json!({"limit": 1, "lease_seconds": 600})),
        StatusCode::OK,
    )
    .await;

    let long_poll = |path: String| {
        let http = http.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let answer = call(
                &http,
                Method::POST,
                &path,
                Some(json!({"limit": 10, "wait_seconds": 20})),
            )
            .await;
            (answer, started.elapsed())
        })
    };
    let queue_poll = long_poll(format!("{base}/v1/queues/sd-poll/claims"));
    let parent_poll = long_poll(format!("{base}/v1/parents/sd-poll/claims"));
    // Both are waiting inside the service.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let signalled = Instant::now();
    let status = service.terminate(EXIT_BOUND).await;
    let exited_after = signalled.elapsed();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    for (name, poll) in [("queue", queue_poll), ("parent", parent_poll)] {
        let ((status, body), took) = poll.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{name} long poll: {body}");
        assert_eq!(body["children"], json!([]), "{name} long poll: {body}");
        assert!(
            took < Duration::from_secs(15),
            "{name} long poll held {took:?}: not ended by the shutdown"
        );
    }

    eprintln!(
        "{backend:?} shutdown with two 20 s long polls waiting: both answered 200 [] and the process exited 0 \
         {:.2} s after SIGTERM",
        exited_after.as_secs_f64()
    );
}

/// Open event streams end cleanly at SIGTERM (the body ends, no reset), so
/// the process exits at once instead of waiting out the grace period.
async fn sigterm_ends_event_streams_cleanly(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let mut service = start(&db, "shutdown-streams").await;
    let base = service.base.clone();
    let http = client();
    expect(
        &http,
        reqwest::Method::PUT,
        &format!("{base}/v1/parents/sd-stream"),
        Some(json!({"queue": "sd-stream", "children": children(1)})),
        StatusCode::CREATED,
    )
    .await;
    let watch = |path: String| {
        let http = http.clone();
        tokio::spawn(async move {
            let response = http.get(path).send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let mut body = response.bytes_stream();
            let mut text = String::new();
            let mut clean = true;
            while let Some(chunk) = body.next().await {
                match chunk {
                    Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
                    Err(_) => {
                        clean = false;
                        break;
                    }
                }
            }
            (text, clean, Instant::now())
        })
    };
    let streams = [
        watch(format!("{base}/v1/parents/sd-stream/events")),
        watch(format!("{base}/v1/queues/sd-stream/events")),
    ];
    tokio::time::sleep(Duration::from_millis(500)).await;
    let signalled = Instant::now();
    let status = service.terminate(EXIT_BOUND).await;
    assert!(status.success(), "exit status after SIGTERM: {status}");
    let exited_after = signalled.elapsed();
    for stream in streams {
        let (text, clean, ended) = stream.await.unwrap();
        assert!(text.contains("event: snapshot"), "{text}");
        assert!(clean, "the stream was cut, not ended: {text}");
        assert!(
            ended - signalled < Duration::from_secs(3),
            "a stream outlived SIGTERM by {:?}",
            ended - signalled
        );
    }
    assert!(
        exited_after < Duration::from_secs(5),
        "exited {exited_after:?} after SIGTERM"
    );
}

/// A request that never finishes (a client that sent half its body and
/// stalled) keeps the process no longer than `--shutdown-grace-seconds`
/// after SIGTERM: it then exits anyway (0), saying so in its log.
async fn the_grace_period_ends_the_process(backend: Backend) {
    use tokio::io::AsyncWriteExt;
    const GRACE: Duration = Duration::from_secs(2);
    let db = TestDatabase::new(backend).await;
    let mut service = ServiceProcess::start(
        "shutdown-grace",
        &db.url,
        &["--shutdown-grace-seconds", "2", "--request-timeout-seconds", "120"],
    )
    .await;
    service.ready().await;
    let port: u16 = service.base.rsplit(':').next().unwrap().parse().unwrap();
    let mut stalled = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = "PUT /v1/parents/G-1 HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
                content-length: 100000\r\n\r\n{\"queue\": \"grace\", \"children\": [";
    stalled.write_all(head.as_bytes()).await.unwrap();
    stalled.flush().await.unwrap();
    // The request is in the handler, reading its body.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let signalled = Instant::now();
    let status = service.terminate(Duration::from_secs(20)).await;
    let exited_after = signalled.elapsed();
    println!("[{backend:?}] a stalled request in flight: exited {exited_after:?} after SIGTERM (grace {GRACE:?})");
    assert!(status.success(), "{status:?}");
    assert!(
        exited_after >= GRACE - Duration::from_millis(200),
        "exited before the grace ran out: {exited_after:?}"
    );
    assert!(
        exited_after < GRACE * 2 + Duration::from_secs(2),
        "exited {exited_after:?} after SIGTERM"
    );
    assert!(
        service
            .log_text()
            .contains("requests still in flight after the grace period"),
        "{}",
        service.log_text()
    );
    let store = db.store().await;
    assert_eq!(
        store.count_raw("SELECT count(*) FROM parent").await.unwrap(),
        0,
        "the stalled request wrote nothing"
    );
    drop(stalled);
}

both_stores!(
    the_grace_period_ends_the_process,
    sigterm_finishes_in_flight_requests_and_keeps_acknowledged_outcomes,
    sigterm_ends_long_polls_promptly,
    sigterm_ends_event_streams_cleanly,
);
