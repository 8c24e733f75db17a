//! A parent's results (`GET /v1/parents/{id}/results`) and summary
//! (`GET /v1/parents/{id}/summary`) against the ledger itself, on both
//! stores: the export holds exactly what the parent's own children pages
//! hold, in sequence order, as NDJSON, as CSV and gzipped, past several
//! chunks; `?state=` filters the same way the pages do; the summary's
//! counts are the rows' and its reasons are the rows' most frequent.

mod common;

use std::collections::HashMap;
use std::io::Read;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

use child_ledger::access::Role;

/// Children in the big parent: more than two of the export's chunks.
const BIG: usize = 2_300;

async fn ok(reply: Reply, what: &str) -> Value {
    assert!(reply.status.is_success(), "{what}: {reply:?}");
    reply.body
}

async fn claim(app: &TestApp, parent: &str, limit: usize, lease_seconds: u64) -> (String, Vec<i64>) {
    let body = ok(
        app.post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": "results-test"}),
        )
        .await,
        "claim",
    )
    .await;
    let sequences = body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sequence"].as_i64().unwrap())
        .collect();
    (body["claim_id"].as_str().unwrap_or_default().to_owned(), sequences)
}

/// A reason for failed child `i`: 25 distinct ones, of falling frequency,
/// some needing CSV quotes.
fn reason_of(i: i64) -> String {
    let k = (i % 300) as u32;
    let bucket = (0..25u32).find(|b| k < (b + 1) * (b + 2) / 2 + 2 * b).unwrap_or(24);
    match bucket % 3 {
        0 => format!("timeout {bucket}"),
        1 => format!("remote said \"no\", code {bucket}"),
        _ => format!("line one {bucket}\nline two"),
    }
}

/// Parent `R` on queue `qr`: children with keys (some with commas and
/// quotes), processed with results, failed with reasons, skipped at
/// registration and by a worker, held, in flight and pending.
async fn build(app: &TestApp) {
    let mut children: Vec<Value> = (0..BIG)
        .map(|i| json!({"key": format!("k{i},\"{}\"", i % 7), "payload": {"i": i}}))
        .collect();
    children[5] = json!({"skip": "bad input"});
    children[6] = json!({"skip": "bad input"});
    let r = app
        .put(
            "/v1/parents/R",
            json!({"queue": "qr", "children": children, "expired_lease": "hold"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    // Held: a lease that ran out under `hold`.
    let (held, _) = claim(app, "R", 3, 600).await;
    app.expire_claim(&held).await;
    // Outcomes for most of the rest, in batches of one claim each.
    loop {
        let (claim_id, sequences) = claim(app, "R", 500, 600).await;
        if sequences.is_empty() {
            break;
        }
        let outcomes: Vec<Value> = sequences
            .iter()
            .filter(|s| **s < BIG as i64 - 40)
            .map(|&s| match s % 5 {
                0 | 1 => json!({"parent_id": "R", "sequence": s, "outcome": "failed", "reason": reason_of(s), "claim_id": claim_id}),
                2 if s % 10 == 2 => json!({"parent_id": "R", "sequence": s, "outcome": "skipped", "claim_id": claim_id}),
                _ => json!({"parent_id": "R", "sequence": s, "outcome": "processed", "claim_id": claim_id,
                            "result": {"n": s, "text": "a,b \"c\"\n"}}),
            })
            .collect();
        if outcomes.is_empty() {
            // The last 40 stay in flight.
            break;
        }
        let body = ok(
            app.post("/v1/outcomes", json!({"outcomes": outcomes})).await,
            "outcomes",
        )
        .await;
        assert!(
            body["results"]
                .as_array()
                .unwrap()
                .iter()
                .all(|r| r["status"] == "applied"),
            "{body}"
        );
    }
    // Give the in-flight tail's last 10 back: pending again.
    let r = app.get("/v1/parents/R/children?state=in_flight&limit=1000").await;
    let in_flight = ok(r, "in flight").await;
    let last = in_flight["children"].as_array().unwrap().last().unwrap().clone();
    let claim_id = last["claim_id"].as_str().unwrap().to_owned();
    let tail: Vec<Value> = (BIG as i64 - 10..BIG as i64)
        .map(|s| json!({"parent_id": "R", "sequence": s}))
        .collect();
    ok(
        app.post(&format!("/v1/claims/{claim_id}/release"), json!({"children": tail}))
            .await,
        "release",
    )
    .await;
}

/// Every child of `parent` in `state` (all when `None`), through its pages,
/// as the export writes each.
async fn from_pages(app: &TestApp, parent: &str, state: Option<&str>) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after: Option<i64> = None;
    loop {
        let mut path = format!("/v1/parents/{parent}/children?limit=1000");
        if let Some(state) = state {
            path.push_str(&format!("&state={state}"));
        }
        if let Some(after) = after {
            path.push_str(&format!("&after={after}"));
        }
        let page = ok(app.get(&path).await, "children page").await;
        for c in page["children"].as_array().unwrap() {
            out.push(json!({
                "sequence": c["sequence"], "key": c["key"], "state": c["state"],
                "attempt": c["outcome_attempt"], "result": c["result"], "reason": c["reason"],
                "finished_at": c["terminal_at"],
            }));
        }
        match page["next_after"].as_i64() {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

/// The export's raw body, with `headers`.
async fn export(
    app: &TestApp,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, reqwest::header::HeaderMap, Vec<u8>) {
    let mut req = app.client.get(format!("{}{path}", app.base));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    (status, headers, resp.bytes().await.unwrap().to_vec())
}

fn ndjson(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "every line ends");
    text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn gunzip(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(body).read_to_end(&mut out).unwrap();
    out
}

/// RFC 4180 records (CRLF ends a record; quoted fields may hold anything).
fn csv_records(text: &str) -> Vec<Vec<Option<String>>> {
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut was_quoted) = (false, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' => (quoted, was_quoted) = (true, true),
            ',' => {
                record.push((was_quoted || !field.is_empty()).then(|| std::mem::take(&mut field)));
                was_quoted = false;
            }
            '\r' => {
                assert_eq!(chars.next(), Some('\n'), "CR is followed by LF");
                record.push((was_quoted || !field.is_empty()).then(|| std::mem::take(&mut field)));
                was_quoted = false;
                records.push(std::mem::take(&mut record));
            }
            _ => field.push(c),
        }
    }
    assert!(record.is_empty() && field.is_empty(), "the last record ends with CRLF");
    records
}

/// A CSV record as the NDJSON line it stands for.
fn csv_as_json(record: &[Option<String>]) -> Value {
    let text = |i: usize| record[i].clone().map_or(Value::Null, Value::String);
    let number = |i: usize| {
        record[i]
            .as_deref()
            .map_or(Value::Null, |v| json!(v.parse::<i64>().unwrap()))
    };
    json!({
        "sequence": number(0), "key": text(1), "state": text(2), "attempt": number(3),
        "result": record[4].as_deref().map_or(Value::Null, |r| serde_json::from_str(r).unwrap()),
        "reason": text(5), "finished_at": text(6),
    })
}

async fn results_are_the_children(backend: Backend) {
    let app = spawn_app(backend).await;
    build(&app).await;
    let all = from_pages(&app, "R", None).await;
    assert_eq!(all.len(), BIG);
    let states: std::collections::HashSet<&str> = all.iter().map(|c| c["state"].as_str().unwrap()).collect();
    for state in ["pending", "in_flight", "held", "processed", "failed", "skipped"] {
        assert!(states.contains(state), "the parent has a {state} child: {states:?}");
    }

    // NDJSON, the default.
    let (status, headers, body) = export(&app, "/v1/parents/R/results", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/x-ndjson");
    assert!(headers.get("etag").is_none(), "a stream is not held back to be tagged");
    assert_eq!(ndjson(&body), all);

    // Asked for by name, and gzipped.
    let (status, headers, body) = export(
        &app,
        "/v1/parents/R/results",
        &[("accept", "application/x-ndjson"), ("accept-encoding", "gzip")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-encoding"], "gzip");
    assert_eq!(ndjson(&gunzip(&body)), all);

    // CSV, plain and gzipped.
    for encoding in ["identity", "gzip"] {
        let (status, headers, body) = export(
            &app,
            "/v1/parents/R/results",
            &[("accept", "text/csv"), ("accept-encoding", encoding)],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers["content-type"].to_str().unwrap().starts_with("text/csv"));
        let body = if encoding == "gzip" { gunzip(&body) } else { body };
        let records = csv_records(std::str::from_utf8(&body).unwrap());
        let header: Vec<_> = records[0].iter().map(|f| f.clone().unwrap()).collect();
        assert_eq!(
            header,
            ["sequence", "key", "state", "attempt", "result", "reason", "finished_at"]
        );
        let rows: Vec<Value> = records[1..].iter().map(|r| csv_as_json(r)).collect();
        assert_eq!(rows.len(), all.len());
        // A null is an empty field, a result its JSON text.
        assert_eq!(rows, all, "{encoding}");
    }

    // Filtered by state: what the pages show in that state.
    for state in ["failed", "in_flight", "held", "pending", "skipped", "processed"] {
        let (status, _, body) = export(&app, &format!("/v1/parents/R/results?state={state}"), &[]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(ndjson(&body), from_pages(&app, "R", Some(state)).await, "{state}");
    }
}

async fn summary_is_the_rows(backend: Backend) {
    let app = spawn_app(backend).await;
    build(&app).await;
    let all = from_pages(&app, "R", None).await;
    let summary = ok(app.get("/v1/parents/R/summary").await, "summary").await;
    assert_eq!(summary["parent_id"], "R");
    let mut counts: HashMap<&str, i64> = HashMap::new();
    for child in &all {
        *counts.entry(child["state"].as_str().unwrap()).or_default() += 1;
    }
    for state in ["pending", "in_flight", "held", "processed", "failed", "skipped"] {
        assert_eq!(summary["counts"][state], json!(counts[state]), "{state}: {summary}");
    }
    assert_eq!(summary["counts"]["total"], json!(BIG));

    let mut by_reason: HashMap<(String, Option<String>), i64> = HashMap::new();
    for child in all.iter().filter(|c| c["state"] == "failed" || c["state"] == "skipped") {
        let key = (
            child["state"].as_str().unwrap().to_owned(),
            child["reason"].as_str().map(str::to_owned),
        );
        *by_reason.entry(key).or_default() += 1;
    }
    assert!(
        by_reason.len() > 20,
        "more reasons than a summary lists: {}",
        by_reason.len()
    );
    let mut expected: Vec<_> = by_reason.into_iter().collect();
    expected.sort_by(|((sa, ra), na), ((sb, rb), nb)| {
        nb.cmp(na)
            .then(sa.cmp(sb))
            .then(ra.is_none().cmp(&rb.is_none()))
            .then(ra.cmp(rb))
    });
    let expected: Vec<Value> = expected
        .into_iter()
        .take(20)
        .map(|((state, reason), count)| json!({"state": state, "reason": reason, "count": count}))
        .collect();
    assert_eq!(summary["reasons"], json!(expected));
}

/// The summary reads the reason counts kept beside the rows, not the rows:
/// reconcile finds kept counts that drifted from the rows, and rewrites them.
async fn drifted_reason_counts_are_reconciled(backend: Backend) {
    let app = spawn_app(backend).await;
    build(&app).await;
    let before = ok(app.get("/v1/parents/R/summary").await, "summary").await;
    let r = app.post("/v1/parents/R/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["changes"], json!([]), "{r:?}");

    app.exec("UPDATE child_reason SET n = n + 1000 WHERE parent_id = 'R' AND state = 'skipped'")
        .await;
    let drifted = ok(app.get("/v1/parents/R/summary").await, "summary").await;
    assert_eq!(drifted["reasons"][0]["state"], "skipped", "{drifted}");
    assert!(drifted["reasons"][0]["count"].as_i64().unwrap() > 1000, "{drifted}");

    let r = app.post("/v1/parents/R/reconcile", json!({"dry_run": true})).await;
    let changes = r.body["changes"].as_array().unwrap().clone();
    assert_eq!(changes.len(), 1, "only the reasons drifted: {changes:?}");
    assert_eq!(changes[0]["field"], "reasons");
    let from = changes[0]["from"].as_array().unwrap();
    let to = changes[0]["to"].as_array().unwrap();
    assert!(!from.is_empty() && from.len() == to.len(), "{changes:?}");
    for (kept, rows) in from.iter().zip(to) {
        assert_eq!(kept["state"], "skipped");
        assert_eq!(
            (kept["state"].clone(), kept["reason"].clone()),
            (rows["state"].clone(), rows["reason"].clone())
        );
        assert_eq!(kept["count"].as_i64().unwrap() - 1000, rows["count"].as_i64().unwrap());
    }
    assert_eq!(
        ok(app.get("/v1/parents/R/summary").await, "summary").await,
        drifted,
        "a dry run writes nothing"
    );

    let r = app.post("/v1/parents/R/reconcile", json!({"dry_run": false})).await;
    assert_eq!(r.body["applied"], true, "{r:?}");
    assert_eq!(ok(app.get("/v1/parents/R/summary").await, "summary").await, before);
    let r = app.post("/v1/parents/R/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["changes"], json!([]), "{r:?}");

    // Counts lost altogether are found by a sweep too, and recounted.
    app.exec("DELETE FROM child_reason WHERE parent_id = 'R'").await;
    assert_eq!(
        ok(app.get("/v1/parents/R/summary").await, "summary").await["reasons"],
        json!([])
    );
    let r = app.post("/v1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["drifted"], 1, "{r:?}");
    assert_eq!(r.body["parents"][0]["parent_id"], "R", "{r:?}");
    let r = app.post("/v1/reconcile", json!({"dry_run": false})).await;
    assert_eq!(r.body["repaired"], 1, "{r:?}");
    assert_eq!(r.body["parents"][0]["changes"][0]["field"], "reasons", "{r:?}");
    assert_eq!(ok(app.get("/v1/parents/R/summary").await, "summary").await, before);
    let r = app.post("/v1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(r.body["drifted"], 0, "{r:?}");
}

async fn bad_requests_are_refused(backend: Backend) {
    let app = spawn_app(backend).await;
    let r = app
        .put("/v1/parents/E", json!({"queue": "qe", "children": children(3)}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    for path in ["/v1/parents/nope/results", "/v1/parents/nope/summary"] {
        let r = app.get(path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}: {r:?}");
        assert_eq!(r.content_type, "application/problem+json");
    }
    let r = app.get("/v1/parents/E/results?state=lost").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["field"], "state");
    let r = app.get("/v1/parents/E/results?after=3").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["field"], "after");
    let r = app.get(&format!("/v1/parents/{}/results", "x".repeat(300))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.body["field"], "parent_id");
    let (status, headers, body) = export(&app, "/v1/parents/E/results", &[("accept", "application/xml")]).await;
    assert_eq!(status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["field"], "accept");
    // An empty selection is an empty body (CSV: the header alone).
    let (status, _, body) = export(&app, "/v1/parents/E/results?state=failed", &[]).await;
    assert_eq!((status, body.len()), (StatusCode::OK, 0));
    let (_, _, body) = export(&app, "/v1/parents/E/results?state=failed", &[("accept", "text/csv")]).await;
    assert_eq!(body, b"sequence,key,state,attempt,result,reason,finished_at\r\n");
}

async fn a_token_sees_only_its_queues(backend: Backend) {
    let (reader, reader_entry) = token("reader-qa", &[Role::Reader], &["qa"]);
    let (admin, admin_entry) = token("admin", &[Role::Admin, Role::Producer], &[]);
    let app = spawn_app_with_tokens(backend, json!([reader_entry, admin_entry])).await;
    for (parent, queue) in [("A", "qa"), ("B", "qb")] {
        let r = app
            .put_as(
                &admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(2)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    for route in ["results", "summary"] {
        assert_eq!(
            app.get_as(&reader, &format!("/v1/parents/A/{route}")).await.status,
            StatusCode::OK
        );
        let elsewhere = app.get_as(&reader, &format!("/v1/parents/B/{route}")).await;
        let parent = app.get_as(&reader, "/v1/parents/B").await;
        assert_eq!(elsewhere.status, parent.status, "{route} answers as the parent does");
        assert!(elsewhere.status.is_client_error(), "{elsewhere:?}");
        let r = app
            .request_as(None, reqwest::Method::GET, &format!("/v1/parents/A/{route}"), None)
            .await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
}

both_stores!(
    results_are_the_children,
    summary_is_the_rows,
    drifted_reason_counts_are_reconciled,
    bad_requests_are_refused,
    a_token_sees_only_its_queues
);

/// The service process's resident memory now, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// Sends a results request on a raw connection and reads nothing: a stalled
/// reader. Returns the connection (to keep it open) and the status, read
/// from the first bytes that came (a 429's head and body fit in them).
async fn stalled_reader(address: &str, path: &str, token: &str) -> (tokio::net::TcpStream, u16) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {token}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    let status = String::from_utf8_lossy(&head[9..12]).parse().unwrap();
    (stream, status)
}

/// A results export holds about one chunk (1 MiB of results) while its
/// client reads, whatever the parent's results weigh: 12 readers that never
/// read a parent of 1,000 results of 60 KB keep the service under 150 MiB;
/// beyond a token's share of exports (8) the next are 429 with Retry-After,
/// and 50 more stalled readers still leave it under 150 MiB. An export read
/// to its end has every row.
async fn stalled_exports_hold_a_chunk_each_and_a_token_its_share(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let dir = std::env::temp_dir().join(format!("child-ledger-exports-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let (a, a_entry) = token("export-a", &[Role::Reader], &[]);
    let (b, b_entry) = token("export-b", &[Role::Reader], &[]);
    let (crowd, crowd_entry) = token("export-crowd", &[Role::Reader], &[]);
    let tokens = dir.join("tokens.json");
    std::fs::write(
        &tokens,
        json!({"tokens": [admin_entry, a_entry, b_entry, crowd_entry]}).to_string(),
    )
    .unwrap();
    let service =
        common::process::ServiceProcess::start("exports", &db.url, &["--tokens-file", tokens.to_str().unwrap()]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let base = &service.base;
    let children: Vec<Value> = (0..1000).map(|i| json!({"payload": i})).collect();
    let r = client
        .put(format!("{base}/v1/parents/BIGRES"))
        .bearer_auth(&admin)
        .json(&json!({"queue": "heavy", "children": children}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let blob = "x".repeat(60_000);
    for first in (0..1000).step_by(10) {
        let outcomes: Vec<Value> = (first..first + 10)
            .map(|s| json!({"parent_id": "BIGRES", "sequence": s, "outcome": "processed", "result": {"n": s, "blob": blob}}))
            .collect();
        let r = client
            .post(format!("{base}/v1/outcomes"))
            .bearer_auth(&admin)
            .json(&json!({"outcomes": outcomes}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let before = rss_mib(service.pid());
    let address = base.trim_start_matches("http://").to_owned();
    let path = "/v1/parents/BIGRES/results";
    let mut held = Vec::new();
    for n in 0..12 {
        let token = if n % 2 == 0 { &a } else { &b };
        let (stream, status) = stalled_reader(&address, path, token).await;
        assert_eq!(status, 200, "stalled reader {n}");
        held.push(stream);
    }
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let twelve = rss_mib(service.pid());
    let mut refused = 0;
    for _ in 0..50 {
        let (stream, status) = stalled_reader(&address, path, &crowd).await;
        match status {
            200 => held.push(stream),
            429 => refused += 1,
            other => panic!("a stalled reader was answered {other}"),
        }
    }
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let sixty_two = rss_mib(service.pid());
    eprintln!(
        "{backend:?}: RSS {before:.0} MiB before, {twelve:.0} with 12 stalled exports, {sixty_two:.0} with 50 more \
         ({refused} of them 429)"
    );
    assert_eq!(refused, 42, "a token streams at most its share (8) of exports");
    assert!(twelve <= 150.0, "12 stalled exports: {twelve:.0} MiB");
    assert!(sixty_two <= 150.0, "50 more stalled readers: {sixty_two:.0} MiB");
    let r = client
        .get(format!("{base}{path}"))
        .bearer_auth(&crowd)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
    let problem: Value = r.json().await.unwrap();
    assert!(
        problem["type"].as_str().unwrap().ends_with("/too-many-streams"),
        "{problem}"
    );

    // Read to its end, an export has every row, in order, each whole.
    let text = client
        .get(format!("{base}{path}"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let rows: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 1000);
    for (n, row) in rows.iter().enumerate() {
        assert_eq!(row["sequence"], n as i64);
        assert_eq!(row["result"]["blob"].as_str().map(str::len), Some(60_000), "row {n}");
    }
    drop(held);
    let _ = std::fs::remove_dir_all(&dir);
}

both_stores!(stalled_exports_hold_a_chunk_each_and_a_token_its_share);
