//! Queue claims are fair across parents (least recently served first, a
//! short claim filled from the next), serve strictly higher priorities first,
//! keep lowest sequence first within a parent, never hand one child to two
//! live claims, and keep all of it across replicas sharing one ledger.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, queue: &str, n: usize, priority: Option<i64>) {
    let mut body = json!({"queue": queue, "children": children(n)});
    if let Some(priority) = priority {
        body["priority"] = json!(priority);
    }
    let r = app.put(&format!("/v1/parents/{parent}"), body).await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

async fn queue_claim(app: &TestApp, queue: &str, limit: u64) -> Value {
    let r = app
        .post(&format!("/v1/queues/{queue}/claims"), json!({"limit": limit}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim: {r:?}");
    r.body
}

/// The `(parent_id, sequence)` of each child of a claim, in answer order.
fn taken(claim: &Value) -> Vec<(String, u64)> {
    claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["parent_id"].as_str().unwrap().to_owned(),
                c["sequence"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn parents_of(claim: &Value) -> BTreeSet<String> {
    taken(claim).into_iter().map(|(p, _)| p).collect()
}

/// With P parents holding claimable children, every P consecutive claims
/// serve each of them; a parent never served goes first, ties to the oldest.
async fn each_parent_served_within_p_claims(backend: Backend) {
    let app = spawn_app(backend).await;
    let parents = ["A", "B", "C", "D"];
    for p in parents {
        register(&app, p, "fair", 40, None).await;
    }
    let mut served = Vec::new();
    for _ in 0..12 {
        let claim = queue_claim(&app, "fair", 5).await;
        let from = parents_of(&claim);
        assert_eq!(
            from.len(),
            1,
            "a claim the first parent can fill takes only from it: {claim}"
        );
        served.push(from.into_iter().next().unwrap());
    }
    assert_eq!(&served[..4], ["A", "B", "C", "D"], "never served first, oldest first");
    for window in served.windows(parents.len()) {
        let seen: BTreeSet<&str> = window.iter().map(String::as_str).collect();
        assert_eq!(
            seen.len(),
            parents.len(),
            "a window of {} claims missed a parent: {served:?}",
            parents.len()
        );
    }
    // Lowest sequence first within each parent: each parent's claims are
    // consecutive runs from 0.
    let all: Vec<(String, u64)> = taken(&queue_claim(&app, "fair", 1000).await);
    let mut next: BTreeMap<String, u64> = BTreeMap::new();
    for p in parents {
        next.insert(p.to_owned(), 15);
    }
    for (p, s) in all {
        let want = next.get_mut(&p).unwrap();
        assert_eq!(s, *want, "parent {p} out of sequence order");
        *want += 1;
    }
}

/// A 10-child parent registered behind a big one is claimed within the next
/// claims, not after the big one drains.
async fn small_parent_behind_big_one_is_served_at_once(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "big", "mixed", 20_000, None).await;
    let first = queue_claim(&app, "mixed", 100).await;
    assert_eq!(parents_of(&first), BTreeSet::from(["big".to_owned()]));
    register(&app, "small", "mixed", 10, None).await;
    let second = queue_claim(&app, "mixed", 100).await;
    let got = taken(&second);
    assert_eq!(
        got.iter().filter(|(p, _)| p == "small").count(),
        10,
        "the small parent, never served, comes first and its claim is filled from the big one: {got:?}"
    );
    assert_eq!(got.len(), 100);
    assert_eq!(got.iter().filter(|(p, _)| p == "big").map(|(_, s)| *s).min(), Some(100));
}

/// A short claim is filled from the next parents in serving order, and each
/// parent it took from counts as served.
async fn short_claim_is_filled_from_the_next_parents(backend: Backend) {
    let app = spawn_app(backend).await;
    for p in ["A", "B", "C"] {
        register(&app, p, "fill", 3, None).await;
    }
    let claim = queue_claim(&app, "fill", 7).await;
    let got: BTreeSet<(String, u64)> = taken(&claim).into_iter().collect();
    let want: BTreeSet<(String, u64)> = [("A", 0), ("A", 1), ("A", 2), ("B", 0), ("B", 1), ("B", 2), ("C", 0)]
        .into_iter()
        .map(|(p, s)| (p.to_owned(), s))
        .collect();
    assert_eq!(got, want);
    // A and B have nothing left; C was served least recently of those with work.
    assert_eq!(
        taken(&queue_claim(&app, "fill", 7).await),
        [("C".to_owned(), 1), ("C".to_owned(), 2)]
    );
    assert!(taken(&queue_claim(&app, "fill", 7).await).is_empty());
}

/// Strictly higher priorities first: a lower priority gets nothing while a
/// higher one has claimable children, and is fair within its own level.
async fn higher_priority_first(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "low", "prio", 10, Some(-5)).await;
    register(&app, "normal", "prio", 10, None).await;
    register(&app, "urgent-1", "prio", 4, Some(50)).await;
    register(&app, "urgent-2", "prio", 4, Some(50)).await;
    let parent = app.get("/v1/parents/urgent-1").await;
    assert_eq!(parent.body["priority"], 50);
    assert_eq!(app.get("/v1/parents/normal").await.body["priority"], 0);

    let order: Vec<BTreeSet<String>> = Vec::from_iter([
        parents_of(&queue_claim(&app, "prio", 3).await),
        parents_of(&queue_claim(&app, "prio", 3).await),
    ]);
    assert_eq!(order[0], BTreeSet::from(["urgent-1".to_owned()]));
    assert_eq!(order[1], BTreeSet::from(["urgent-2".to_owned()]));
    // The rest of the urgent ones, then normal fills the claim; low waits.
    let third = taken(&queue_claim(&app, "prio", 5).await);
    assert_eq!(
        third,
        [
            ("normal".to_owned(), 0),
            ("normal".to_owned(), 1),
            ("normal".to_owned(), 2),
            ("urgent-1".to_owned(), 3),
            ("urgent-2".to_owned(), 3),
        ]
    );
    let fourth = taken(&queue_claim(&app, "prio", 10).await);
    assert_eq!(fourth.iter().filter(|(p, _)| p == "normal").count(), 7);
    assert_eq!(fourth.iter().filter(|(p, _)| p == "low").count(), 3);

    // A child of a higher priority that comes back (released) goes out before
    // lower ones again.
    let claim = queue_claim(&app, "prio", 2).await;
    assert_eq!(parents_of(&claim), BTreeSet::from(["low".to_owned()]));
    let held = app.get("/v1/parents/urgent-1/children?state=in_flight").await;
    let claim_id = held.body["children"][0]["claim_id"].as_str().unwrap().to_owned();
    let r = app
        .post(
            &format!("/v1/claims/{claim_id}/release"),
            json!({"children": [{"parent_id": "urgent-1", "sequence": 0}]}),
        )
        .await;
    assert_eq!(r.body["released"], 1);
    assert_eq!(taken(&queue_claim(&app, "prio", 1).await), [("urgent-1".to_owned(), 0)]);

    let bad = app
        .put(
            "/v1/parents/too-urgent",
            json!({"children": children(1), "priority": 101}),
        )
        .await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(bad.body.to_string().contains("priority"), "{:?}", bad.body);
    assert_eq!(app.get("/v1/parents/too-urgent").await.status, StatusCode::NOT_FOUND);
}

/// Concurrent queue claims over several parents never hand one child to two
/// live claims, and together hand out every child once.
async fn no_child_in_two_live_claims(backend: Backend) {
    let app = spawn_app(backend).await;
    let parents = ["A", "B", "C", "D", "E"];
    for (i, p) in parents.iter().enumerate() {
        register(&app, p, "race", 60 + i * 7, Some((i % 2) as i64)).await;
    }
    let total: usize = (0..parents.len()).map(|i| 60 + i * 7).sum();
    let replica = app.replica().await;
    let workers: Vec<_> = (0..12)
        .map(|w| {
            let base = if w % 2 == 0 {
                app.base.clone()
            } else {
                replica.base.clone()
            };
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut got = Vec::new();
                loop {
                    let claim: Value = client
                        .post(format!("{base}/v1/queues/race/claims"))
                        .json(&json!({"limit": 1 + w % 5}))
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    let children = taken(&claim);
                    if children.is_empty() {
                        return got;
                    }
                    got.extend(children);
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    let unique: BTreeSet<_> = all.iter().cloned().collect();
    assert_eq!(unique.len(), all.len(), "a child went to two live claims");
    assert_eq!(all.len(), total);
}

/// Fairness lives in the ledger: claims alternating between two replicas
/// serve the parents in turn, and a replica that starts afresh carries on.
async fn fair_across_replicas(backend: Backend) {
    let app = spawn_app(backend).await;
    let parents = ["A", "B", "C"];
    for p in parents {
        register(&app, p, "shared", 30, None).await;
    }
    let replica = app.replica().await;
    let mut served = Vec::new();
    for i in 0..6 {
        let on = if i % 2 == 0 { &app } else { &replica };
        let from = parents_of(&queue_claim(on, "shared", 2).await);
        assert_eq!(from.len(), 1);
        served.push(from.into_iter().next().unwrap());
    }
    drop(replica);
    let restarted = app.replica().await;
    for _ in 0..3 {
        let from = parents_of(&queue_claim(&restarted, "shared", 2).await);
        served.push(from.into_iter().next().unwrap());
    }
    assert_eq!(served, ["A", "B", "C", "A", "B", "C", "A", "B", "C"]);
}

/// A ledger written before lanes existed: its decomposed parents are
/// claimable from the queue once this build has migrated it, with their
/// floors where their pending children are and their due children included;
/// a parent still being appended to stays out until it is sealed.
async fn parents_of_an_upgraded_ledger_get_lanes(backend: Backend) {
    let (applied, now, later, past) = match backend {
        Backend::Postgres => (3, "now()", "now() + interval '1 hour'", "now() - interval '1 minute'"),
        Backend::Sqlite => (
            2,
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+1 hour')",
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 minute')",
        ),
    };
    let seed = format!(
        "INSERT INTO parent (parent_id, queue, fingerprint, total, processed, created_at, decomposed_at) VALUES
            ('old', 'up', 'f', 5, 1, {now}, {now}),
            ('next', 'up', 'f', 1, 0, {now}, {now}),
            ('open', 'up', 'f', 1, 0, {now}, NULL);
         INSERT INTO child (parent_id, sequence, payload, state, terminal_at) VALUES ('old', 0, '{{}}', 'processed', {now});
         INSERT INTO child (parent_id, sequence, payload, state) VALUES
            ('old', 1, '{{}}', 'pending'), ('old', 2, '{{}}', 'pending'),
            ('next', 0, '{{}}', 'pending'), ('open', 0, '{{}}', 'pending');
         INSERT INTO child (parent_id, sequence, payload, state, available_at) VALUES
            ('old', 3, '{{}}', 'pending', {past}), ('old', 4, '{{}}', 'pending', {later});"
    );
    let app = spawn_upgraded_app(backend, applied, &seed).await;
    assert_eq!(
        app.count("SELECT count(*) FROM lane").await,
        2,
        "a lane per decomposed parent"
    );
    let first = taken(&queue_claim(&app, "up", 2).await);
    assert_eq!(
        first,
        [("old".to_owned(), 1), ("old".to_owned(), 2)],
        "oldest parent, lowest sequence first"
    );
    let rest: BTreeSet<(String, u64)> = taken(&queue_claim(&app, "up", 10).await).into_iter().collect();
    let expected: BTreeSet<(String, u64)> = [("next".to_owned(), 0), ("old".to_owned(), 3)].into_iter().collect();
    assert_eq!(
        rest, expected,
        "the next parent and the due child; the delayed one waits"
    );
    assert!(taken(&queue_claim(&app, "up", 10).await).is_empty());
    let r = app.post("/v1/parents/open/seal", json!({"total": 1})).await;
    assert_eq!(r.status, StatusCode::OK, "seal: {r:?}");
    assert_eq!(taken(&queue_claim(&app, "up", 10).await), [("open".to_owned(), 0)]);
}

both_stores!(
    each_parent_served_within_p_claims,
    small_parent_behind_big_one_is_served_at_once,
    short_claim_is_filled_from_the_next_parents,
    higher_priority_first,
    no_child_in_two_live_claims,
    fair_across_replicas,
    parents_of_an_upgraded_ledger_get_lanes,
);
