//! Bounds against hostile input, each proved on the real binary with a figure
//! the test measures, prints and asserts: memory while refusing a huge
//! registration, slow and idle sockets, a crowd of long polls, a conflict-log
//! flood, forged request ids, unbounded metric labels and leaked secrets.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Peak resident memory of a process so far (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb / 1024.0
}

/// `{"children":[{},{},…]}` of about `mib` MiB.
fn flood_body(mib: usize) -> Vec<u8> {
    let n = mib * 1024 * 1024 / 3;
    let mut body = Vec::with_capacity(n * 3 + 32);
    body.extend_from_slice(br#"{"queue":"q","children":["#);
    for i in 0..n {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{}");
    }
    body.extend_from_slice(b"]}");
    body
}

async fn put_flood(base: &str, parent: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/parents/{parent}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// 60 MB of empty children is refused after reading the allowed number, not
/// after building twenty million: one such request, then four at once.
async fn memory_is_bounded_by_the_request(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start("hostile-memory", &db.url, &["--max-bulk-bodies", "2"]).await;
    service.ready().await;
    let baseline = peak_rss_mib(service.pid());

    let (status, body) = put_flood(&service.base, "amp", flood_body(60)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["field"], "children");
    let one = peak_rss_mib(service.pid());
    println!("peak RSS refusing one 60 MB registration: {one:.0} MiB (at start {baseline:.0} MiB)");
    assert!(one <= 300.0, "{one:.0} MiB");

    // The bodies are built before the clock starts: building 240 MB on the
    // test's own runtime threads starved its /healthz probe on a 2-core
    // machine (a failure of the test, not of the service).
    let bodies: Vec<Vec<u8>> = (0..4).map(|_| flood_body(60)).collect();
    let floods: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| tokio::spawn(put_flood_owned(service.base.clone(), format!("amp{i}"), body)))
        .collect();
    // The service keeps answering meanwhile.
    let started = Instant::now();
    let mut health = Vec::new();
    while !floods.iter().all(|f| f.is_finished()) {
        let r = reqwest::Client::new()
            .get(format!("{}/healthz", service.base))
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        health.push(r.is_ok_and(|r| r.status().is_success()));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(started.elapsed() < Duration::from_secs(120));
    }
    for flood in floods {
        assert_eq!(flood.await.unwrap(), StatusCode::UNPROCESSABLE_ENTITY);
    }
    let four = peak_rss_mib(service.pid());
    // With --max-bulk-bodies 2, two of the four waited for a turn before being read.
    let answered = health.iter().filter(|ok| **ok).count();
    println!(
        "peak RSS refusing four at once: {four:.0} MiB; /healthz answered {answered} of {} times meanwhile",
        health.len()
    );
    assert!(four <= 500.0, "{four:.0} MiB");
    assert_eq!(answered, health.len(), "/healthz failed while refusing");
    assert_eq!(
        db.store().await.count_raw("SELECT count(*) FROM parent").await.unwrap(),
        0
    );
}

async fn put_flood_owned(base: String, parent: String, body: Vec<u8>) -> StatusCode {
    put_flood(&base, &parent, body).await.0
}

/// Sockets that send half a request head, or nothing, are closed within the
/// header-read timeout while the service answers everyone else.
async fn slow_and_idle_sockets_are_closed(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start("hostile-slow", &db.url, &["--header-read-timeout-seconds", "2"]).await;
    service.ready().await;
    let addr = format!("127.0.0.1:{}", service.port);
    let mut sockets = Vec::new();
    for i in 0..60 {
        let mut socket = TcpStream::connect(&addr).unwrap();
        if i % 2 == 0 {
            // Half a head, as slowloris sends it.
            socket
                .write_all(b"GET /v1/parents HTTP/1.1\r\nHost: x\r\nX-Slow: ")
                .unwrap();
        }
        socket.set_read_timeout(Some(Duration::from_secs(6))).unwrap();
        sockets.push(socket);
    }
    let opened = Instant::now();
    let watcher = std::thread::spawn(move || {
        sockets
            .into_iter()
            .map(|mut socket| {
                let mut buf = [0u8; 1024];
                // Closed: EOF (0 bytes), or whatever the server last sent then EOF.
                loop {
                    match socket.read(&mut buf) {
                        Ok(0) => return Some(opened.elapsed()),
                        Ok(_) => continue,
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            return None;
                        }
                        Err(_) => return Some(opened.elapsed()),
                    }
                }
            })
            .collect::<Vec<_>>()
    });
    let mut served = 0;
    while !watcher.is_finished() {
        let r = reqwest::Client::new()
            .get(format!("{}/v1/parents", service.base))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        served += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed = watcher.join().unwrap();
    let closed_in: Vec<Duration> = closed.iter().flatten().copied().collect();
    let latest = closed_in.iter().max().copied().unwrap_or_default();
    println!(
        "{} of {} slow or idle sockets closed, the last after {latest:?}; {served} requests served meanwhile",
        closed_in.len(),
        closed.len()
    );
    assert_eq!(closed_in.len(), closed.len(), "a socket stayed open");
    assert!(
        latest <= Duration::from_secs(4),
        "closed after {latest:?} with a 2 s timeout"
    );
    assert!(served > 0);
}

/// Twice `--max-waiting-claims` long polls: the excess is answered 429 with
/// Retry-After, and a registration and an outcome posted meanwhile are fast.
async fn a_crowd_of_long_polls_is_bounded(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start("hostile-crowd", &db.url, &["--max-waiting-claims", "50"]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/v1/parents/work", service.base))
        .json(&json!({"queue": "busy", "children": children(1)}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    let claim = client
        .post(format!("{}/v1/queues/busy/claims", service.base))
        .json(&json!({"limit": 1}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let crowd: Vec<_> = (0..100)
        .map(|_| {
            let (client, base) = (client.clone(), service.base.clone());
            tokio::spawn(async move {
                let r = client
                    .post(format!("{base}/v1/queues/empty/claims"))
                    .json(&json!({"limit": 1, "wait_seconds": 3}))
                    .send()
                    .await
                    .unwrap();
                (r.status(), r.headers().contains_key("retry-after"))
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let put = client
        .put(format!("{}/v1/parents/meanwhile", service.base))
        .json(&json!({"queue": "other", "children": children(100)}))
        .send()
        .await
        .unwrap();
    let registered = started.elapsed();
    assert_eq!(put.status(), StatusCode::CREATED);
    let started = Instant::now();
    let outcome = client
        .post(format!("{}/v1/parents/work/children/0/outcome", service.base))
        .json(&json!({"outcome": "processed", "claim_id": claim["claim_id"]}))
        .send()
        .await
        .unwrap();
    let recorded = started.elapsed();
    assert_eq!(outcome.status(), StatusCode::OK);
    let mut refused = 0;
    let mut waited = 0;
    for r in crowd {
        let (status, retry_after) = r.await.unwrap();
        match status {
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(retry_after, "429 without Retry-After");
                refused += 1;
            }
            StatusCode::OK => waited += 1,
            other => panic!("long poll answered {other}"),
        }
    }
    println!(
        "100 long polls against --max-waiting-claims 50: {waited} waited, {refused} got 429; \
         a registration took {registered:?} and an outcome {recorded:?} meanwhile"
    );
    assert_eq!(waited, 50);
    assert_eq!(refused, 50);
    assert!(registered < Duration::from_secs(2) && recorded < Duration::from_secs(2));
}

/// A value of a metric without labels, read from `/metrics`.
async fn metric(client: &reqwest::Client, base: &str, name: &str) -> u64 {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Polls `/metrics` until `name` reaches `want` (a figure, not a sleep).
async fn metric_reaches(client: &reqwest::Client, base: &str, name: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = metric(client, base, name).await;
        if value == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} stayed at {value}, expected {want}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `n` long polls of one child each on `queue`: each answers the children it got.
fn long_polls(client: &reqwest::Client, base: &str, queue: &str, n: usize) -> Vec<tokio::task::JoinHandle<usize>> {
    (0..n)
        .map(|_| {
            let (client, url) = (client.clone(), format!("{base}/v1/queues/{queue}/claims"));
            tokio::spawn(async move {
                let r = client
                    .post(url)
                    .json(&json!({"limit": 1, "wait_seconds": 6}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::OK);
                r.json::<Value>().await.unwrap()["children"].as_array().unwrap().len()
            })
        })
        .collect()
}

/// Registering 5 children in front of 60 waiting claims (40 on its queue, 20
/// on another) wakes 5 of them, not 60; on Postgres, a registration through
/// one replica wakes as many on the other as there are children.
async fn long_polls_wake_as_many_as_there_is_work(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    // No periodic recheck within the test: every wake-up is a notification's.
    let quiet = ["--wait-recheck-ms", "60000"];
    let service = ServiceProcess::start("hostile-wake", &db.url, &quiet).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let base = service.base.clone();
    let here = long_polls(&client, &base, "wake", 40);
    let elsewhere = long_polls(&client, &base, "idle", 20);
    metric_reaches(&client, &base, "child_ledger_waiting_claims", 60).await;
    let before = metric(&client, &base, "child_ledger_claim_wakeups_total").await;
    let put = client
        .put(format!("{base}/v1/parents/five"))
        .json(&json!({"queue": "wake", "children": children(5)}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    metric_reaches(&client, &base, "child_ledger_waiting_claims", 55).await;
    let woken = metric(&client, &base, "child_ledger_claim_wakeups_total").await - before;
    let mut served = 0;
    for poll in here.into_iter().chain(elsewhere) {
        served += poll.await.unwrap();
    }
    println!("{backend:?}: 5 children registered in front of 60 waiting claims woke {woken}; {served} claimed");
    assert_eq!(woken, 5);
    assert_eq!(served, 5);

    if backend == Backend::Postgres {
        let other = ServiceProcess::start("hostile-wake-b", &db.url, &quiet).await;
        other.ready().await;
        let there = long_polls(&client, &other.base, "far", 30);
        metric_reaches(&client, &other.base, "child_ledger_waiting_claims", 30).await;
        let before = metric(&client, &other.base, "child_ledger_claim_wakeups_total").await;
        let put = client
            .put(format!("{base}/v1/parents/three"))
            .json(&json!({"queue": "far", "children": children(3)}))
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), StatusCode::CREATED);
        metric_reaches(&client, &other.base, "child_ledger_waiting_claims", 27).await;
        let woken = metric(&client, &other.base, "child_ledger_claim_wakeups_total").await - before;
        let mut served = 0;
        for poll in there {
            served += poll.await.unwrap();
        }
        println!("3 children registered on replica A woke {woken} of 30 waiting claims on replica B; {served} claimed");
        assert_eq!(woken, 3);
        assert_eq!(served, 3);
    }
}

/// Children of ~900 KB payloads against `--max-response-bytes` 4 MiB: every
/// claim and every page stays under it by holding fewer children, and paging
/// and claiming still reach every child exactly once. A payload of numbers
/// in exponent form comes back as sent (Postgres `jsonb` wrote each `1e300`
/// out as 301 digits: 1,400 bytes became 60 KB).
async fn responses_stay_under_the_byte_cap(backend: Backend) {
    const CAP: usize = 4 * 1024 * 1024;
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start("hostile-bytes", &db.url, &["--max-response-bytes", &CAP.to_string()]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let base = &service.base;
    let big: Vec<Value> = (0..20)
        .map(|i| json!({"payload": {"i": i, "blob": "x".repeat(900_000)}}))
        .collect();
    let put = client
        .put(format!("{base}/v1/parents/big"))
        .json(&json!({"queue": "bytes", "children": big}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);

    let mut pages = 0;
    let mut largest_page = 0;
    let mut seen = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let url = match after {
            Some(a) => format!("{base}/v1/parents/big/children?limit=1000&after={a}"),
            None => format!("{base}/v1/parents/big/children?limit=1000"),
        };
        let bytes = client.get(url).send().await.unwrap().bytes().await.unwrap();
        largest_page = largest_page.max(bytes.len());
        pages += 1;
        let page: Value = serde_json::from_slice(&bytes).unwrap();
        seen.extend(
            page["children"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["sequence"].as_i64().unwrap()),
        );
        match page["next_after"].as_i64() {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    assert_eq!(seen, (0..20).collect::<Vec<_>>(), "every child once, in order");

    let mut claims = 0;
    let mut largest_claim = 0;
    let mut claimed = Vec::new();
    loop {
        let bytes = client
            .post(format!("{base}/v1/queues/bytes/claims"))
            .json(&json!({"limit": 1000}))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let claim: Value = serde_json::from_slice(&bytes).unwrap();
        let children = claim["children"].as_array().unwrap();
        if children.is_empty() {
            break;
        }
        claims += 1;
        largest_claim = largest_claim.max(bytes.len());
        claimed.extend(children.iter().map(|c| c["sequence"].as_i64().unwrap()));
    }
    claimed.sort();
    assert_eq!(claimed, (0..20).collect::<Vec<_>>(), "every child claimed once");
    println!(
        "{backend:?}: 20 children of 900 KB, cap {CAP} B: {pages} pages (largest {largest_page} B), \
         {claims} claims of limit 1000 (largest {largest_claim} B)"
    );
    assert!(largest_page <= CAP && largest_claim <= CAP);
    assert!(pages > 1 && claims > 1);

    let numbers = format!("[{}]", vec!["1e300,-1e-300"; 100].join(","));
    let put = client
        .put(format!("{base}/v1/parents/numbers"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"queue": "numbers", "payload": {numbers}, "children": [{{"payload": {numbers}}}]}}"#
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    let get_bytes = |path: &str| {
        let request = client.get(format!("{base}{path}"));
        async move { request.send().await.unwrap().bytes().await.unwrap() }
    };
    let child = get_bytes("/v1/parents/numbers/children/0").await;
    let parent = get_bytes("/v1/parents/numbers?include=payload").await;
    println!(
        "{backend:?}: a {} B payload of exponents reads back in a {} B child and a {} B parent",
        numbers.len(),
        child.len(),
        parent.len()
    );
    let bound = 2 * numbers.len() + 1024;
    assert!(child.len() < bound && parent.len() < bound);
}

/// A 1000-item batch naming one decided child 1000 times: its conflict log
/// keeps the last 20, counts all, and the batch is answered promptly.
async fn a_conflict_flood_is_bounded(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.put("/v1/parents/F", json!({"queue": "q", "children": children(1)}))
            .await
            .status,
        StatusCode::CREATED
    );
    let claim = app.post("/v1/parents/F/claims", json!({"limit": 1})).await.body;
    let claim_id = claim["claim_id"].as_str().unwrap();
    let r = app
        .post(
            "/v1/parents/F/children/0/outcome",
            json!({"outcome": "processed", "claim_id": claim_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let items: Vec<Value> = (0..1000)
        .map(|i| json!({"parent_id": "F", "sequence": 0, "outcome": "failed", "reason": format!("flood {i}"), "claim_id": claim_id}))
        .collect();
    let started = Instant::now();
    let r = app.post("/v1/outcomes", json!({"outcomes": items})).await;
    let took = started.elapsed();
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        r.body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["status"] == "conflict")
    );
    let child = app.get("/v1/parents/F/children/0").await.body;
    let kept = child["conflicts"].as_array().unwrap();
    let bytes = app
        .count("SELECT CAST(length(CAST(conflicts AS TEXT)) AS BIGINT) FROM child WHERE parent_id = 'F'")
        .await;
    println!(
        "1000 conflicting writes in one batch: answered in {took:?}; the log keeps {} entries ({bytes} bytes), conflict_count {}",
        kept.len(),
        child["conflict_count"]
    );
    assert_eq!(kept.len(), 20);
    assert_eq!(kept.last().unwrap()["reason"], "flood 999", "the most recent are kept");
    assert_eq!(child["conflict_count"], 1000);
    assert!(bytes < 8 * 1024);
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// A request id that could forge a log line is replaced; a plain one is kept.
async fn forged_request_ids_are_replaced(backend: Backend) {
    let app = spawn_app(backend).await;
    let send = |id: String| {
        let client = app.client.clone();
        let url = format!("{}/v1/parents", app.base);
        async move {
            let r = client.get(url).header("x-request-id", id).send().await.unwrap();
            r.headers().get("x-request-id").unwrap().to_str().unwrap().to_owned()
        }
    };
    assert_eq!(send("job-42.retry_1".to_owned()).await, "job-42.retry_1");
    let mut replaced = 0;
    for forged in [
        "x\" level=error msg=\"forged".to_owned(),
        "a".repeat(65),
        "id with spaces".to_owned(),
        "semi;colon".to_owned(),
    ] {
        let answered = send(forged.clone()).await;
        assert_ne!(answered, forged);
        assert!(uuid::Uuid::parse_str(&answered).is_ok(), "{answered}");
        replaced += 1;
    }
    println!("{replaced} of 4 forged request ids replaced by fresh UUIDs");
}

/// 300 queues claimed from: the claimed-children metric keeps at most
/// `--max-metric-queues` (100) queue labels, plus `other`.
async fn metric_labels_are_bounded(backend: Backend) {
    let app = spawn_app(backend).await;
    for q in 0..300 {
        let r = app
            .put(
                &format!("/v1/parents/p{q}"),
                json!({"queue": format!("q{q}"), "children": children(1)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        let r = app.post(&format!("/v1/queues/q{q}/claims"), json!({"limit": 1})).await;
        assert_eq!(r.body["children"].as_array().unwrap().len(), 1);
    }
    let metrics = app.get("/metrics").await.body;
    let labels: Vec<&str> = metrics
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("child_ledger_children_claimed_total{"))
        .collect();
    let other: u64 = labels
        .iter()
        .find(|l| l.contains("queue=\"other\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    println!(
        "300 queues claimed from: {} queue label values, `other` counts {other}",
        labels.len()
    );
    assert!(labels.len() <= 101, "{}", labels.len());
    assert_eq!(other, 200);
}

/// The database password appears neither in `--help` nor in the logs of a
/// service that cannot reach its database.
async fn secrets_stay_out_of_logs_and_help(_backend: Backend) {
    let secret = "s3cr3t-Pa55word";
    let url = format!("postgres://ledger:{secret}@127.0.0.1:1/ledger");
    // The flags are serve's (`child-ledger --help` lists the commands).
    let mut help_bytes = 0;
    for args in [&["--help"][..], &["serve", "--help"]] {
        let help = std::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
            .args(args)
            .env("DATABASE_URL", &url)
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        assert!(!help.contains(secret), "{args:?}: {help}");
        help_bytes += help.len();
        if args[0] == "serve" {
            assert!(help.contains("--database-url"), "{help}");
        }
    }
    let service = ServiceProcess::start_with_env("hostile-secret", &url, &[], &[("RUST_LOG", "debug")]).await;
    let started = Instant::now();
    while !service.log_text().contains("database not reachable") {
        assert!(started.elapsed() < Duration::from_secs(10), "{}", service.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = service.log_text();
    println!(
        "--help ({help_bytes} bytes) and {} log lines checked: no password",
        log.lines().count()
    );
    assert!(!log.contains(secret), "{log}");
}

/// A request head over 64 KiB (one big header, or many) is answered 431
/// with a problem, on every route, the open ones included; under the limit
/// it is served.
async fn an_oversized_head_is_a_problem(backend: Backend) {
    let app = spawn_app(backend).await;
    let big = "a".repeat(100 * 1024);
    for path in ["/v1/parents", "/healthz", "/docs/", "/no/such/route"] {
        let r = app
            .client
            .get(format!("{}{path}", app.base))
            .header("x-filler", big.as_str())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "{path}");
        let content_type = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(
            content_type.starts_with("application/problem+json"),
            "{path}: {content_type}"
        );
        let problem: Value = r.json().await.unwrap();
        assert_eq!(problem["type"], "/problems/head-too-large", "{problem}");
        assert_eq!(problem["status"], 431);
    }
    let mut many = app.client.get(format!("{}/v1/parents", app.base));
    for i in 0..40 {
        many = many.header(format!("x-filler-{i}"), "b".repeat(2048));
    }
    assert_eq!(
        many.send().await.unwrap().status(),
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    let r = app
        .client
        .get(format!("{}/v1/parents", app.base))
        .header("x-filler", "a".repeat(32 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

both_stores!(
    an_oversized_head_is_a_problem,
    memory_is_bounded_by_the_request,
    slow_and_idle_sockets_are_closed,
    a_crowd_of_long_polls_is_bounded,
    long_polls_wake_as_many_as_there_is_work,
    responses_stay_under_the_byte_cap,
    a_conflict_flood_is_bounded,
    forged_request_ids_are_replaced,
    metric_labels_are_bounded,
);

/// A request held past `--request-timeout-seconds` ends its statement: a
/// reconcile waiting on a parent row another session locked is answered 503
/// at the timeout, and its statement is gone from `pg_stat_activity` soon
/// after, not left waiting until the lock goes. (Postgres: SQLite's writer
/// waits for a lock outside any statement; its interrupt is proved in
/// `store::sqlite::held`.) With `bouncer`, the service reaches Postgres
/// through PgBouncer in transaction mode: closing its connection to the
/// pooler mid-statement must end the statement too.
async fn a_timed_out_request_ends_its_statement(bouncer: Option<&common::pgbouncer::PgBouncer>) {
    let db = TestDatabase::new(Backend::Postgres).await;
    let mut flags = vec!["--request-timeout-seconds", "1"];
    let service_url = match bouncer {
        Some(bouncer) => {
            flags.extend(["--db-pooler", "transaction", "--listen-database-url", &db.url]);
            bouncer.url_for(&db.url)
        }
        None => db.url.clone(),
    };
    let service = ServiceProcess::start("hostile-timeout", &service_url, &flags).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let r = client
        .put(format!("{}/v1/parents/locked", service.base))
        .json(&json!({"queue": "q", "children": [{}, {}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    let mut locker = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("SELECT 1 FROM parent WHERE parent_id = 'locked' FOR UPDATE")
        .execute(&mut locker)
        .await
        .unwrap();
    let mut observer = <sqlx::PgConnection as sqlx::Connection>::connect(&db.url)
        .await
        .unwrap();
    const WAITING: &str = "SELECT count(*) FROM pg_stat_activity \
                           WHERE datname = current_database() AND wait_event_type = 'Lock'";

    let reconcile = client
        .post(format!("{}/v1/parents/locked/reconcile", service.base))
        .json(&json!({"dry_run": false}))
        .send();
    let watch = async {
        tokio::time::sleep(Duration::from_millis(600)).await;
        sqlx::query_scalar::<_, i64>(WAITING)
            .fetch_one(&mut observer)
            .await
            .unwrap()
    };
    let started = Instant::now();
    let (r, waiting_meanwhile) = tokio::join!(reconcile, watch);
    let r = r.unwrap();
    let answered = started.elapsed();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(waiting_meanwhile, 1, "the reconcile was not waiting on the lock");
    let timed_out = Instant::now();
    let gone = loop {
        let waiting: i64 = sqlx::query_scalar(WAITING).fetch_one(&mut observer).await.unwrap();
        if waiting == 0 {
            break timed_out.elapsed();
        }
        assert!(
            timed_out.elapsed() < Duration::from_secs(10),
            "the statement still waits"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "{}a reconcile blocked on a lock was answered 503 after {answered:?} (timeout 1 s); its statement was gone \
         {gone:?} later",
        if bouncer.is_some() { "through pgbouncer: " } else { "" }
    );
    assert!(gone <= Duration::from_secs(2), "{gone:?}");

    // With the lock gone the same request succeeds: nothing was left behind.
    sqlx::query("ROLLBACK").execute(&mut locker).await.unwrap();
    let r = client
        .post(format!("{}/v1/parents/locked/reconcile", service.base))
        .json(&json!({"dry_run": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

mod timeouts {
    /// Postgres only (see the test); it fails, not skips, when Postgres is required and missing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_timed_out_request_ends_its_statement() {
        if super::common::postgres_available().await {
            super::a_timed_out_request_ends_its_statement(None).await
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_timed_out_request_ends_its_statement_through_pgbouncer() {
        if !super::common::postgres_available().await {
            return;
        }
        if let Some(bouncer) = super::common::pgbouncer().await {
            super::a_timed_out_request_ends_its_statement(Some(&bouncer)).await
        }
    }
}

mod secrets {
    #[tokio::test]
    async fn stay_out_of_logs_and_help() {
        super::secrets_stay_out_of_logs_and_help(super::common::Backend::Postgres).await
    }
}
