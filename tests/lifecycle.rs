//! A parent's lifecycle around its children: cancel, pause and resume a
//! queue, and retention (the pruner and `DELETE /v1/parents/{id}`).

mod common;

use std::time::{Duration, Instant};

use common::process::ServiceProcess;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, body: Value) {
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn claim(app: &TestApp, path: &str, body: Value) -> Value {
    let r = app.post(path, body).await;
    assert_eq!(r.status, StatusCode::OK, "claim {path}: {r:?}");
    r.body
}

/// A claim of up to 10 that waits up to `wait_seconds`, in the background:
/// how long it waited, and its answer.
fn long_poll(app: &TestApp, path: &str, wait_seconds: u64) -> tokio::task::JoinHandle<(Duration, Value)> {
    let (client, url) = (app.client.clone(), format!("{}{path}", app.base));
    tokio::spawn(async move {
        let started = Instant::now();
        let r = client
            .post(url)
            .json(&json!({"limit": 10, "wait_seconds": wait_seconds}))
            .send()
            .await
            .unwrap();
        let body: Value = r.json().await.unwrap();
        (started.elapsed(), body)
    })
}

fn taken(claim: &Value) -> usize {
    claim["children"].as_array().unwrap().len()
}

/// Cancel skips every open child with the reason in one go, completes the
/// parent, keeps the projection right, and turns a holder's late outcome into
/// a logged conflict.
async fn cancel_skips_open_children_and_completes(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "C-1", json!({"queue": "lc", "children": children(6)})).await;
    let held = claim(
        &app,
        "/v1/parents/C-1/claims",
        json!({"limit": 2, "lease_seconds": 300}),
    )
    .await;
    let claim_id = held["claim_id"].as_str().unwrap().to_owned();
    let r = app
        .post(
            "/v1/parents/C-1/children/0/outcome",
            json!({"outcome": "processed", "claim_id": claim_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");

    let r = app
        .post("/v1/parents/C-1/cancel", json!({"reason": "order withdrawn"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["skipped"], 5, "{r:?}");
    let parent = &r.body["parent"];
    assert_eq!(parent["state"], "complete", "{parent}");
    assert_eq!(parent["complete"], true, "{parent}");
    assert_eq!(
        parent["counts"],
        json!({"total": 6, "processed": 1, "failed": 0, "skipped": 5, "pending": 0, "in_flight": 0, "held": 0}),
        "{parent}"
    );
    for sequence in 1..6 {
        let child = app.get(&format!("/v1/parents/C-1/children/{sequence}")).await.body;
        assert_eq!(child["state"], "skipped", "{child}");
        assert_eq!(child["reason"], "order withdrawn", "{child}");
    }
    assert_eq!(app.get("/v1/parents/C-1/children/0").await.body["state"], "processed");

    // The worker still holding child 1 reports late: the cancel won.
    let r = app
        .post(
            "/v1/parents/C-1/children/1/outcome",
            json!({"outcome": "processed", "claim_id": claim_id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    let child = app.get("/v1/parents/C-1/children/1").await.body;
    assert_eq!(child["conflict_count"], 1, "{child}");
    assert_eq!(child["state"], "skipped", "{child}");

    let report = app.post("/v1/parents/C-1/reconcile", json!({"dry_run": true})).await;
    assert_eq!(report.body["changes"], json!([]), "{report:?}");
    let queue = app.get("/v1/queues/lc").await.body;
    assert_eq!(queue["parents"]["complete"], 1, "{queue}");
    assert_eq!(queue["children"]["pending"], 0, "{queue}");

    // Again: nothing left to skip. An unknown parent, a missing reason.
    let r = app.post("/v1/parents/C-1/cancel", json!({"reason": "again"})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["skipped"], 0, "{r:?}");
    let r = app.post("/v1/parents/C-none/cancel", json!({"reason": "x"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    for bad in [json!({}), json!({"reason": "  "}), json!({"reason": "x".repeat(1001)})] {
        let r = app.post("/v1/parents/C-1/cancel", bad.clone()).await;
        assert!(r.status.is_client_error(), "{bad}: {r:?}");
        assert!(
            r.body.to_string().contains("reason"),
            "the problem names the field: {r:?}"
        );
    }

    // A parent still being decomposed is sealed at what it holds.
    register(&app, "C-2", json!({"queue": "lc", "decomposed": false})).await;
    let r = app
        .post(
            "/v1/parents/C-2/children",
            json!({"children": [{"sequence": 0, "payload": {}}, {"sequence": 1, "payload": {}}]}),
        )
        .await;
    assert!(r.status.is_success(), "{r:?}");
    let r = app
        .post("/v1/parents/C-2/cancel", json!({"reason": "no longer needed"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["skipped"], 2, "{r:?}");
    assert_eq!(r.body["parent"]["state"], "complete", "{r:?}");
    println!("cancel: 5 open children skipped, a late outcome logged as a conflict, a decomposing parent sealed");
}

/// A paused queue hands out nothing, to queue or parent claims, and a long
/// poll waiting on it gets its children as soon as it is resumed.
async fn pause_holds_claims_until_resumed(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "Z-1", json!({"queue": "pz", "children": children(3)})).await;
    let r = app.post("/v1/queues/pz/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body, json!({"queue": "pz", "paused": true}));
    assert_eq!(app.get("/v1/queues/pz").await.body["paused"], true);

    let queue_claim = claim(&app, "/v1/queues/pz/claims", json!({"limit": 10})).await;
    assert_eq!(taken(&queue_claim), 0, "{queue_claim}");
    let parent_claim = claim(&app, "/v1/parents/Z-1/claims", json!({"limit": 10})).await;
    assert_eq!(taken(&parent_claim), 0, "{parent_claim}");

    let waiting = long_poll(&app, "/v1/queues/pz/claims", 15);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = app.post("/v1/queues/pz/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body, json!({"queue": "pz", "paused": false}));
    let (waited, body) = waiting.await.unwrap();
    println!(
        "a long poll on a paused queue got {} children {waited:?} after it started (resumed at 0.5 s)",
        taken(&body)
    );
    assert_eq!(taken(&body), 3, "{body}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    assert_eq!(app.get("/v1/queues/pz").await.body["paused"], false);

    // A queue with no parents may be paused; a bad name is refused.
    let r = app.post("/v1/queues/empty-one/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.post("/v1/queues/Not%20One/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{r:?}");
}

/// A pause through one replica holds the claims of another at once, and a
/// resume through the other frees them: the pause is a row every claim
/// statement reads, not a flag in one process. A long poll waiting on one
/// replica is answered when the queue is resumed through the other.
async fn pause_is_honoured_by_every_replica(backend: Backend) {
    let one = spawn_app(backend).await;
    let two = one.replica().await;
    register(&one, "ZR-1", json!({"queue": "pr", "children": children(4)})).await;
    let r = one.post("/v1/queues/pr/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(two.get("/v1/queues/pr").await.body["paused"], true);
    let queue_claim = claim(&two, "/v1/queues/pr/claims", json!({"limit": 10})).await;
    assert_eq!(taken(&queue_claim), 0, "the other replica's queue claim: {queue_claim}");
    let parent_claim = claim(&two, "/v1/parents/ZR-1/claims", json!({"limit": 10})).await;
    assert_eq!(
        taken(&parent_claim),
        0,
        "the other replica's parent claim: {parent_claim}"
    );

    let waiting = long_poll(&two, "/v1/queues/pr/claims", 20);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = one.post("/v1/queues/pr/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let (waited, body) = waiting.await.unwrap();
    println!(
        "[{backend:?}] a long poll on the other replica got {} children {waited:?} after it started (resumed at 0.5 s)",
        taken(&body)
    );
    assert_eq!(taken(&body), 4, "{body}");
    assert!(waited < Duration::from_secs(10), "{waited:?}");

    // Paused again through the other replica: the first holds its claims.
    register(&one, "ZR-2", json!({"queue": "pr", "children": children(2)})).await;
    let r = two.post("/v1/queues/pr/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let held = claim(&one, "/v1/queues/pr/claims", json!({"limit": 10})).await;
    assert_eq!(taken(&held), 0, "{held}");
    let r = two.post("/v1/queues/pr/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let freed = claim(&one, "/v1/queues/pr/claims", json!({"limit": 10})).await;
    assert_eq!(taken(&freed), 2, "{freed}");
}

/// `DELETE /v1/parents/{id}`: only a complete parent, with all its children.
async fn delete_removes_a_complete_parent(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "D-1", json!({"queue": "dl", "children": children(3)})).await;
    let r = app.request(reqwest::Method::DELETE, "/v1/parents/D-1", None).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{r:?}");
    assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
    let r = app.request(reqwest::Method::DELETE, "/v1/parents/D-none", None).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");

    let r = app
        .post("/v1/parents/D-1/cancel", json!({"reason": "done with it"}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.request(reqwest::Method::DELETE, "/v1/parents/D-1", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    assert_eq!(app.get("/v1/parents/D-1").await.status, StatusCode::NOT_FOUND);
    assert_eq!(app.count("SELECT count(*) FROM child WHERE parent_id = 'D-1'").await, 0);
    assert_eq!(app.count("SELECT count(*) FROM lane WHERE parent_id = 'D-1'").await, 0);
}

/// Records every child of `parent` processed, claim by claim (10 at a time).
async fn process_all(app: &TestApp, parent: &str) {
    loop {
        let claim = claim(app, &format!("/v1/parents/{parent}/claims"), json!({"limit": 10})).await;
        let outcomes: Vec<Value> = claim["children"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!({"parent_id": parent, "sequence": c["sequence"], "outcome": "processed", "claim_id": claim["claim_id"]}))
            .collect();
        if outcomes.is_empty() {
            return;
        }
        let r = app.post("/v1/outcomes", json!({"outcomes": outcomes})).await;
        assert_eq!(r.status, StatusCode::OK, "{r:?}");
    }
}

/// Every processed child the children search lists with `query` (`queue=`,
/// `parent_id=` or nothing more), two a page: (parent, sequence), newest first.
async fn processed_listed(app: &TestApp, query: &str) -> Vec<(String, i64)> {
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/v1/children?state=processed{query}&limit=2");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {r:?}");
        for c in r.body["children"].as_array().unwrap() {
            listed.push((
                c["parent_id"].as_str().unwrap().to_owned(),
                c["sequence"].as_i64().unwrap(),
            ));
        }
        match r.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return listed,
        }
    }
    panic!("paging did not end");
}

/// Parents `{prefix}-1` (25 children) and then `{prefix}-2` (7) in `queue`,
/// every child processed, the first parent's before the second's.
async fn two_processed_parents(app: &TestApp, prefix: &str, queue: &str) {
    for (n, size) in [(1, 25), (2, 7)] {
        register(
            app,
            &format!("{prefix}-{n}"),
            json!({"queue": queue, "children": children(size)}),
        )
        .await;
    }
    for n in [1, 2] {
        process_all(app, &format!("{prefix}-{n}")).await;
    }
}

/// Deleting a complete parent takes the outcome batches that name its
/// processed children with it, and the children search of processed
/// children goes on listing every other parent's, whole.
async fn a_deleted_parent_leaves_the_processed_search_whole(backend: Backend) {
    let app = spawn_app(backend).await;
    two_processed_parents(&app, "PS", "ps").await;
    for query in ["&queue=ps", ""] {
        let listed = processed_listed(&app, query).await;
        assert_eq!(listed.len(), 32, "{query}: {listed:?}");
    }
    assert!(
        app.count("SELECT count(*) FROM processed_batch WHERE parent_id = 'PS-1'")
            .await
            >= 3
    );

    let r = app.request(reqwest::Method::DELETE, "/v1/parents/PS-1", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM processed_batch WHERE parent_id = 'PS-1'")
            .await,
        0
    );
    let want: Vec<(String, i64)> = (0..7).rev().map(|s| ("PS-2".to_owned(), s)).collect();
    for query in ["&queue=ps", ""] {
        let listed = processed_listed(&app, query).await;
        let mut got = listed.clone();
        got.sort_by_key(|c| std::cmp::Reverse(c.1));
        assert_eq!(got, want, "{query} after the delete: {listed:?}");
    }
}

/// A processed child whose row is gone while a batch row still names it
/// (a parent mid-prune, deleted 5,000 children at a time) is passed over:
/// the search goes on to the older ones, across parents and in one parent,
/// rather than ending at the gap.
async fn the_processed_search_passes_over_children_gone_from_their_batches(backend: Backend) {
    let app = spawn_app(backend).await;
    two_processed_parents(&app, "PG", "pg").await;
    // The newer parent's children go, its batch rows stay.
    app.exec("DELETE FROM child WHERE parent_id = 'PG-2'").await;
    assert!(
        app.count("SELECT count(*) FROM processed_batch WHERE parent_id = 'PG-2'")
            .await
            >= 1
    );
    let want: Vec<(String, i64)> = (0..25).rev().map(|s| ("PG-1".to_owned(), s)).collect();
    for query in ["&queue=pg", ""] {
        let mut listed = processed_listed(&app, query).await;
        listed.sort_by_key(|c| std::cmp::Reverse(c.1));
        assert_eq!(listed, want, "{query}");
    }
    // In one parent: its newest children gone, the older ones listed.
    app.exec("DELETE FROM child WHERE parent_id = 'PG-1' AND sequence >= 20")
        .await;
    let mut listed = processed_listed(&app, "&parent_id=PG-1").await;
    listed.sort_by_key(|c| std::cmp::Reverse(c.1));
    assert_eq!(listed, want[5..], "one parent");
}

/// A queue reads as one (200) while it has a parent or is paused: a paused
/// queue whose last parent was deleted still shows `"paused": true`, and so
/// does a paused queue that never had one; a queue with neither is 404.
async fn a_paused_queue_outlives_its_parents(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "Q-1", json!({"queue": "gone", "children": children(2)})).await;
    let r = app.post("/v1/queues/gone/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.post("/v1/parents/Q-1/cancel", json!({"reason": "done"})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.request(reqwest::Method::DELETE, "/v1/parents/Q-1", None).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{r:?}");

    let r = app.get("/v1/queues/gone").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(r.body["paused"], true, "{r:?}");
    assert_eq!(
        r.body["parents"],
        json!({"decomposing": 0, "active": 0, "complete": 0}),
        "{r:?}"
    );
    assert_eq!(r.body["children"]["total"], 0, "{r:?}");
    assert!(r.body["oldest_pending_since"].is_null(), "{r:?}");
    let r = app.post("/v1/queues/never-had-one/pause", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(app.get("/v1/queues/never-had-one").await.body["paused"], true);
    register(&app, "Q-2", json!({"queue": "open", "children": children(1)})).await;
    let listed: Vec<(String, bool)> = app.get("/v1/queues").await.body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| (q["queue"].as_str().unwrap().to_owned(), q["paused"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("gone".to_owned(), true),
            ("never-had-one".to_owned(), true),
            ("open".to_owned(), false)
        ],
        "by name, paused ones too"
    );

    // Resumed, a queue with no parent is unknown again.
    let r = app.post("/v1/queues/gone/resume", json!({})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.get("/v1/queues/gone").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{r:?}");
    assert!(r.content_type.starts_with("application/problem+json"), "{r:?}");
}

/// With `--retain-complete-seconds 1` the pruner deletes complete parents
/// (one of 12,000 children, more than one batch) and leaves the rest.
async fn retention_prunes_complete_parents(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let service = ServiceProcess::start("lifecycle-retention", &db.url, &["--retain-complete-seconds", "1"]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let put = |parent: &'static str, n: usize| {
        let (client, url) = (client.clone(), format!("{}/v1/parents/{parent}", service.base));
        async move {
            let r = client
                .put(url)
                .json(&json!({"queue": "rt", "children": children(n)}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::CREATED);
        }
    };
    put("R-big", 12_000).await;
    put("R-small", 1).await;
    put("R-open", 2).await;
    for parent in ["R-big", "R-small"] {
        let r = client
            .post(format!("{}/v1/parents/{parent}/cancel", service.base))
            .json(&json!({"reason": "expire me"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let started = Instant::now();
    loop {
        let mut gone = 0;
        for parent in ["R-big", "R-small"] {
            let r = client
                .get(format!("{}/v1/parents/{parent}", service.base))
                .send()
                .await
                .unwrap();
            gone += usize::from(r.status() == StatusCode::NOT_FOUND);
        }
        if gone == 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the pruner never deleted them"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pruned_in = started.elapsed();
    let store = db.store().await;
    let children_left = store
        .count_raw("SELECT count(*) FROM child WHERE parent_id IN ('R-big', 'R-small')")
        .await
        .unwrap();
    let open_left = store
        .count_raw("SELECT count(*) FROM child WHERE parent_id = 'R-open'")
        .await
        .unwrap();
    println!(
        "2 complete parents (12,001 children) pruned {pruned_in:?} after completing; {children_left} children left of them"
    );
    assert_eq!(children_left, 0);
    assert_eq!(open_left, 2, "an active parent is kept");
    let r = client
        .get(format!("{}/v1/parents/R-open", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let metrics = client
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.lines().any(|l| l == "child_ledger_pruned_total 2"), "{metrics}");
}

/// Two replicas, each with its pruner, delete each complete parent once:
/// their `child_ledger_pruned_total` add up to the parents deleted, and no
/// child of them is left.
async fn two_pruners_delete_a_parent_once(backend: Backend) {
    const PARENTS: usize = 12;
    let db = TestDatabase::new(backend).await;
    let flags = ["--retain-complete-seconds", "1"];
    let one = ServiceProcess::start("pruner-one", &db.url, &flags).await;
    let two = ServiceProcess::start("pruner-two", &db.url, &flags).await;
    one.ready().await;
    two.ready().await;
    let client = reqwest::Client::new();
    for i in 0..PARENTS {
        let base = if i % 2 == 0 { &one.base } else { &two.base };
        let r = client
            .put(format!("{base}/v1/parents/PR-{i}"))
            .json(&json!({"queue": "prune", "children": children(3_000)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let r = client
            .post(format!("{base}/v1/parents/PR-{i}/cancel"))
            .json(&json!({"reason": "expire me"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let store = db.store().await;
    let started = Instant::now();
    while store
        .count_raw("SELECT count(*) FROM parent WHERE parent_id LIKE 'PR-%'")
        .await
        .unwrap()
        > 0
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the pruners never deleted them"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let children_left = store
        .count_raw("SELECT count(*) FROM child WHERE parent_id LIKE 'PR-%'")
        .await
        .unwrap();
    assert_eq!(children_left, 0);
    // Each replica counts a parent once its deletion committed: read both
    // until they add up, then once more to see that nothing more is counted.
    let pruned_counts = || async {
        let mut pruned = Vec::new();
        for service in [&one, &two] {
            let metrics = client
                .get(format!("{}/metrics", service.base))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            let line = metrics
                .lines()
                .find(|l| l.starts_with("child_ledger_pruned_total "))
                .unwrap_or_else(|| panic!("no child_ledger_pruned_total: {metrics}"));
            pruned.push(line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap());
        }
        pruned
    };
    let counted = Instant::now();
    while pruned_counts().await.iter().sum::<u64>() < PARENTS as u64 && counted.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pruned = pruned_counts().await;
    println!(
        "[{backend:?}] {PARENTS} complete parents of 3,000 children pruned by two replicas in {:?}: {} and {}",
        started.elapsed(),
        pruned[0],
        pruned[1]
    );
    assert_eq!(
        pruned.iter().sum::<u64>(),
        PARENTS as u64,
        "each parent deleted once: {pruned:?}"
    );
}

both_stores!(
    cancel_skips_open_children_and_completes,
    pause_holds_claims_until_resumed,
    pause_is_honoured_by_every_replica,
    two_pruners_delete_a_parent_once,
    delete_removes_a_complete_parent,
    a_deleted_parent_leaves_the_processed_search_whole,
    the_processed_search_passes_over_children_gone_from_their_batches,
    a_paused_queue_outlives_its_parents,
    retention_prunes_complete_parents,
);
