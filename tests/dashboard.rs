//! `/dashboard` in a real headless browser (Debian's `chromium`, driven by
//! `chromedriver` over the W3C WebDriver HTTP API), on both stores: the page
//! asks for a token, shows queues, parents with their progress, a parent's
//! failed child with its reason and its held child; a reader's retry is
//! refused in words, an admin's retry makes the child pending again; the
//! reconcile dry run shows a hand-made drift; polls come back 304. With
//! polling slowed to once an hour, a parent's progress and completion still
//! reach the page, through its event stream (read with the bearer token);
//! with the stream refused (429), the page polls the parent instead.
//! A screenshot lands in `target/dashboard-<store>.png`.
//!
//! Without `chromium` and `chromedriver` the test is skipped with a loud
//! message, and fails when `CI=true` or `LEDGER_REQUIRE_POSTGRES=1`.

#[path = "dashboard/browser.rs"]
mod browser;
mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use browser::{Browser, BrowserTools, WAIT};
use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const QUEUE: &str = "events";
const FAILED_REASON: &str = "remote rejected the event: card expired";
/// Markup in a reason must reach the page as text.
const MARKUP_REASON: &str = "bad gateway from <img src=x onerror=\"document.title='xss'\"> upstream";

both_stores!(dashboard_in_a_browser);
both_stores!(progress_arrives_through_the_stream);
both_stores!(progress_is_polled_when_the_stream_is_refused);

async fn dashboard_in_a_browser(backend: Backend) {
    let Some(tools) = BrowserTools::find() else {
        return;
    };
    let started = Instant::now();
    let (reader, reader_entry) = token("dashboard", &[Role::Reader], &[]);
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let mut app = spawn_app_with_tokens(backend, json!([reader_entry, admin_entry])).await;
    app.token = Some(admin.clone());
    seed(&app).await;
    let seeded = started.elapsed();

    let browser = Browser::start(&tools).await;
    browser.goto(&format!("{}/dashboard", app.base)).await;

    // The API answers 401: the page asks for a token; a reader's is enough to look.
    browser.wait_text("#token-form", |t| t.contains("needs a token")).await;
    let screenshot = screenshot_path(backend);
    browser.screenshot(&named(&screenshot, backend, "token")).await;
    browser.type_into("#token-input", &reader).await;
    browser.click("#token-use").await;

    // What a person sees: the queues, and each parent with its progress.
    let parents = browser.wait_text("#parents-table", |t| t.contains("order-1003")).await;
    assert!(parents.contains(QUEUE) && parents.contains("billing"), "{parents}");
    let row = browser.text(r#"#parents-table tr[data-parent="order-1001"]"#).await;
    assert!(row.contains("8 / 12 · 66%"), "order-1001's progress: {row}");
    let row = browser.text(r#"#parents-table tr[data-parent="order-1003"]"#).await;
    assert!(row.contains("4 / 4 · 100%") && row.contains("complete"), "{row}");
    // The queue overview is read from `GET /v1/queues`: it must answer.
    let queues = app.get("/v1/queues").await;
    assert_eq!(queues.status, StatusCode::OK, "GET /v1/queues: {queues:?}");
    let overview = browser.wait_text("#queues-table", |t| t.contains("billing")).await;
    assert!(overview.contains(QUEUE), "queue overview: {overview}");
    // 8 of order-1001 and 2 of order-1002 are terminal, of 18.
    let row = browser.text(r#"#queues-table tr[data-queue="events"]"#).await;
    assert!(row.contains("10 / 18 · 55%"), "the events queue's progress: {row}");

    // The parent list filters: only the parent with a held child.
    browser.click(r#"#filter-has option[value="held"]"#).await;
    browser
        .wait_rows("#parents-table tbody tr", |rows| rows == ["order-1002"])
        .await;
    browser.click(r#"#filter-has option[value=""]"#).await;
    browser
        .wait_rows("#parents-table tbody tr", |rows| rows.len() == 3)
        .await;

    // One parent: its failed children with their reasons, markup as text.
    browser
        .click(r#"#parents-table tr[data-parent="order-1001"] button.link"#)
        .await;
    let failed = browser
        .wait_text("#failed-children", |t| t.contains(FAILED_REASON))
        .await;
    assert!(!failed.contains("No failed children"), "{failed}");
    browser
        .wait_text("#reconcile-verdict", |t| t.contains("needs an admin token"))
        .await;

    browser
        .click(r#"#parents-table tr[data-parent="order-1002"] button.link"#)
        .await;
    browser
        .wait_text("#failed-children", |t| t.contains(MARKUP_REASON))
        .await;
    let injected = browser
        .script(
            "return [document.querySelectorAll('main img').length, document.title]",
            json!([]),
        )
        .await;
    assert_eq!(injected, json!([0, "child-ledger dashboard"]), "a reason ran as markup");
    let held = browser.wait_text("#held-children", |t| t.contains("worker-b")).await;
    assert!(held.contains("Retry"), "{held}");

    // A reader may look but not retry: the 403 is said in words.
    let retry = r#"#held-children tr[data-sequence="2"] button.retry"#;
    browser.click(retry).await;
    browser
        .wait_text("#flash", |t| t.contains("403") && t.contains("admin token"))
        .await;
    assert_eq!(child_state(&app, "order-1002", 2).await, "held");

    // An admin's token: the reconcile dry run shows, and retry works.
    browser.click("#token-toggle").await;
    browser.type_into("#token-input", &admin).await;
    browser.click("#token-use").await;
    browser
        .wait_text("#reconcile-verdict", |t| t.contains("No drift"))
        .await;
    let diff = browser.text("#reconcile-table").await;
    assert!(diff.contains("processed") && diff.contains("not complete"), "{diff}");
    browser.wait_text("#held-children", |t| t.contains("worker-b")).await;
    browser.screenshot(&screenshot).await;

    browser.click(retry).await;
    browser
        .wait_text("#flash", |t| t.contains("Child 2 of order-1002 is pending again"))
        .await;
    browser
        .wait_text("#held-children", |t| t.contains("No held children"))
        .await;
    browser.wait_fact("Pending", "4").await;
    browser.wait_fact("Held", "0").await;
    // The dry run is taken again: nothing held, and still no drift.
    browser.wait_text("#reconcile-table", |t| !t.contains("held\t1")).await;
    browser
        .wait_text("#reconcile-verdict", |t| t.contains("No drift"))
        .await;
    assert_eq!(child_state(&app, "order-1002", 2).await, "pending");
    browser.screenshot(&named(&screenshot, backend, "retried")).await;

    // Someone "fixes" a counter by hand: the dry run shows the drift.
    app.exec("UPDATE parent SET processed = 573 WHERE parent_id = 'order-1001'")
        .await;
    browser
        .click(r#"#parents-table tr[data-parent="order-1001"] button.link"#)
        .await;
    browser
        .wait_text("#reconcile-verdict", |t| {
            t.contains("Drift in 1 field: processed 573 → 6")
        })
        .await;
    let changed = browser.text("#reconcile-table tr.changed").await;
    assert_eq!(changed, "processed\t573\t6");
    browser.screenshot(&named(&screenshot, backend, "drift")).await;

    // It polls with ETags: an unchanged parent list comes back as a bodiless 304.
    let not_modified = "return performance.getEntriesByType('resource') \
                        .filter(e => e.name.includes('/v1/parents?') && e.responseStatus === 304).length";
    let started_waiting = Instant::now();
    while browser.script(not_modified, json!([])).await == json!(0) {
        assert!(
            started_waiting.elapsed() < WAIT,
            "the page never got a 304 while polling"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Swagger UI still renders under its Content-Security-Policy (its own
    // scripts only, never framed), and lists the operations.
    browser.goto(&format!("{}/docs/", app.base)).await;
    let docs = browser
        .wait_text(".swagger-ui", |t| {
            t.contains("registerParent") || t.contains("/v1/parents/{parent_id}")
        })
        .await;
    assert!(docs.contains("child-ledger"), "{docs}");

    browser.quit().await;
    eprintln!(
        "dashboard[{backend:?}]: token prompt, queues, progress, filter, failed reasons (markup as text), \
         reader retry refused (403), admin retry to pending, reconcile drift, 304 polls, /docs under its CSP: OK in {:.1} s (seeding {:.1} s); screenshot {}",
        started.elapsed().as_secs_f64(),
        seeded.as_secs_f64(),
        screenshot.display()
    );
}

/// The page polls once an hour (`?poll=3600`): after the first poll, the
/// selected parent's progress and completion can only come from its event
/// stream, and the page does not read the parent by polling meanwhile.
async fn progress_arrives_through_the_stream(backend: Backend) {
    let Some(tools) = BrowserTools::find() else {
        return;
    };
    let (reader, reader_entry) = token("dashboard", &[Role::Reader], &[]);
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let mut app = spawn_app_with_tokens(backend, json!([reader_entry, admin_entry])).await;
    app.token = Some(admin);
    let reply = app
        .put("/v1/parents/live-1", json!({"queue": QUEUE, "children": lines(6)}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);

    let browser = Browser::start(&tools).await;
    browser.goto(&format!("{}/dashboard?poll=3600#live-1", app.base)).await;
    browser.wait_text("#token-form", |t| t.contains("needs a token")).await;
    browser.type_into("#token-input", &reader).await;
    browser.click("#token-use").await;
    browser.wait_fact("Processed", "0").await;
    browser.wait_text("#status", |t| t.contains("parent live")).await;
    // Reads of the parent that start from now on: a poll that was already
    // on its way when the stream opened may still finish after this point.
    let opened = browser.script("return performance.now()", json!([])).await;
    let parent_reads = "return performance.getEntriesByType('resource') \
                        .filter(e => e.name.endsWith('/v1/parents/live-1') && e.startTime > arguments[0]).length";

    let claim_id = claim(&app, "live-1", 6, 300, "worker-live").await;
    let outcome = |n: u32| json!({"parent_id": "live-1", "sequence": n, "outcome": "processed", "claim_id": claim_id});
    post_outcomes(&app, (0..3).map(outcome).collect()).await;
    browser.wait_fact("Processed", "3").await;
    browser.wait_fact("In flight", "3").await;
    post_outcomes(&app, (3..6).map(outcome).collect()).await;
    browser.wait_fact("Processed", "6").await;
    browser.wait_text("#detail-state", |t| t == "complete").await;
    browser.wait_fact("Verdict", "succeeded").await;
    browser.wait_text("#detail-verdict", |t| t == "succeeded").await;
    assert_eq!(
        browser.script(parent_reads, json!([opened])).await,
        json!(0),
        "the page polled the parent while its stream was open"
    );
    let status = browser.text("#status").await;
    assert!(status.contains("every 3600 s"), "{status}");
    browser.quit().await;
    eprintln!("dashboard[{backend:?}]: progress 0 -> 3 -> 6 and complete through the stream, polling hourly: OK");
}

/// With the replica's one event stream taken, the page's stream is refused
/// (429): the page polls the parent (every second here) and still moves.
async fn progress_is_polled_when_the_stream_is_refused(backend: Backend) {
    let Some(tools) = BrowserTools::find() else {
        return;
    };
    let (reader, reader_entry) = token("dashboard", &[Role::Reader], &[]);
    let (admin, admin_entry) = token("ops", &[Role::Admin], &[]);
    let limits = child_ledger::config::Limits {
        max_event_streams: 1,
        ..child_ledger::config::Limits::default()
    };
    let mut app = spawn_app_with_tokens_and_limits(backend, json!([reader_entry, admin_entry]), limits).await;
    app.token = Some(admin);
    let reply = app
        .put("/v1/parents/polled-1", json!({"queue": QUEUE, "children": lines(4)}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    let taken = reqwest::Client::new()
        .get(format!("{}/v1/queues/{QUEUE}/events", app.base))
        .bearer_auth(&reader)
        .send()
        .await
        .unwrap();
    assert_eq!(taken.status(), StatusCode::OK);

    let browser = Browser::start(&tools).await;
    browser.goto(&format!("{}/dashboard?poll=1#polled-1", app.base)).await;
    browser.wait_text("#token-form", |t| t.contains("needs a token")).await;
    browser.type_into("#token-input", &reader).await;
    browser.click("#token-use").await;
    browser.wait_fact("Processed", "0").await;
    let claim_id = claim(&app, "polled-1", 4, 300, "worker-polled").await;
    post_outcomes(
        &app,
        (0..3)
            .map(|n| json!({"parent_id": "polled-1", "sequence": n, "outcome": "processed", "claim_id": claim_id}))
            .collect(),
    )
    .await;
    browser.wait_fact("Processed", "3").await;
    let status = browser.text("#status").await;
    assert!(!status.contains("parent live"), "{status}");
    let refused = "return performance.getEntriesByType('resource') \
                   .filter(e => e.name.endsWith('/v1/parents/polled-1/events') && e.responseStatus === 429).length";
    assert_ne!(
        browser.script(refused, json!([])).await,
        json!(0),
        "the page's stream was not refused"
    );
    browser.quit().await;
    drop(taken);
    eprintln!("dashboard[{backend:?}]: stream refused (429), progress 0 -> 3 by polling: OK");
}

/// Three parents: `order-1001` (events) mid-way with a failed child and one in
/// flight, `order-1002` (events, `expired_lease: hold`) with a failed child
/// and a held one, `order-1003` (billing) complete.
async fn seed(app: &TestApp) {
    let mut first = lines(12);
    first[11]["skip"] = json!("invalid timestamp");
    let reply = app
        .put("/v1/parents/order-1001", json!({"queue": QUEUE, "children": first}))
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    let claim_id = claim(app, "order-1001", 8, 300, "worker-a").await;
    let mut outcomes: Vec<Value> = (0..6)
        .map(|n| json!({"parent_id": "order-1001", "sequence": n, "outcome": "processed", "claim_id": claim_id}))
        .collect();
    outcomes.push(json!({"parent_id": "order-1001", "sequence": 6, "outcome": "failed",
        "reason": FAILED_REASON, "claim_id": claim_id}));
    post_outcomes(app, outcomes).await;

    let reply = app
        .put(
            "/v1/parents/order-1002",
            json!({"queue": QUEUE, "children": lines(6), "expired_lease": "hold"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    let claim_id = claim(app, "order-1002", 2, 300, "worker-b").await;
    post_outcomes(
        app,
        vec![
            json!({"parent_id": "order-1002", "sequence": 0, "outcome": "processed", "claim_id": claim_id}),
            json!({"parent_id": "order-1002", "sequence": 1, "outcome": "failed",
                   "reason": MARKUP_REASON, "claim_id": claim_id}),
        ],
    )
    .await;
    // Sequence 2 on a one-second lease that runs out: the reaper holds it.
    claim(app, "order-1002", 1, 1, "worker-b").await;

    let reply = app
        .put(
            "/v1/parents/order-1003",
            json!({"queue": "billing", "children": lines(4)}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{:?}", reply.body);
    let claim_id = claim(app, "order-1003", 4, 300, "worker-c").await;
    post_outcomes(
        app,
        (0..4)
            .map(|n| json!({"parent_id": "order-1003", "sequence": n, "outcome": "processed", "claim_id": claim_id}))
            .collect(),
    )
    .await;

    let deadline = Instant::now() + Duration::from_secs(30);
    while child_state(app, "order-1002", 2).await != "held" {
        assert!(Instant::now() < deadline, "order-1002/2 was never held");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `n` children with keys, as an order's lines would have.
fn lines(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| json!({"payload": {"line": i}, "key": format!("line-{}", i + 1)}))
        .collect()
}

async fn claim(app: &TestApp, parent: &str, limit: u32, lease_seconds: u32, worker: &str) -> String {
    let reply = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": worker}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    assert_eq!(reply.body["children"].as_array().map(Vec::len), Some(limit as usize));
    reply.body["claim_id"].as_str().unwrap().to_owned()
}

async fn post_outcomes(app: &TestApp, outcomes: Vec<Value>) {
    let reply = app.post("/v1/outcomes", json!({ "outcomes": outcomes })).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    for result in reply.body["results"].as_array().unwrap() {
        assert_eq!(result["status"], "applied", "{result}");
    }
}

async fn child_state(app: &TestApp, parent: &str, sequence: u32) -> String {
    let reply = app
        .request(Method::GET, &format!("/v1/parents/{parent}/children/{sequence}"), None)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.body);
    reply.body["state"].as_str().unwrap().to_owned()
}

fn name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
    }
}

fn screenshot_path(backend: Backend) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&target).unwrap();
    target.join(format!("dashboard-{}.png", name(backend)))
}

/// `target/dashboard-<store>-<step>.png`, beside the main screenshot.
fn named(screenshot: &Path, backend: Backend, step: &str) -> PathBuf {
    screenshot.with_file_name(format!("dashboard-{}-{step}.png", name(backend)))
}
