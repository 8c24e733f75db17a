//! The story the ledger exists for: a 1,000-event parent is partly processed, the
//! worker crashes with children in flight, and the resumed run hands out exactly
//! the children that never reached a terminal outcome, no more and no fewer.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const PARENT: &str = "P-seed";
const TOTAL: u64 = 1000;
const FIRST_RUN: u64 = 600;
const FAILURE_REASON: &str = "remote rejected the event";

/// The 12 children of the first run whose remote call fails.
fn fails_in_first_run(seq: u64) -> bool {
    seq < FIRST_RUN && seq % 50 == 7
}

/// The 15 children still in flight when the first run crashes.
fn abandoned_in_crash(seq: u64) -> bool {
    seq < FIRST_RUN && seq % 40 == 13
}

async fn claim(app: &TestApp, limit: u64, lease_seconds: u64) -> Value {
    let r = app
        .post(
            &format!("/v1/parents/{PARENT}/claims"),
            json!({"limit": limit, "lease_seconds": lease_seconds, "worker": "seed-worker"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim: {r:?}");
    assert!(r.body["children"].is_array(), "claim without a children list: {r:?}");
    r.body
}

fn claim_id(claim: &Value) -> String {
    claim["claim_id"].as_str().expect("claim_id is a string").to_owned()
}

fn sequences(claim: &Value) -> Vec<u64> {
    claim["children"]
        .as_array()
        .expect("children array")
        .iter()
        .map(|c| c["sequence"].as_u64().expect("sequence"))
        .collect()
}

fn outcome_fields(failed: bool, seq: u64, claim_id: &str) -> Value {
    if failed {
        json!({"outcome": "failed", "reason": FAILURE_REASON, "claim_id": claim_id})
    } else {
        json!({"outcome": "processed", "result": {"remote_id": format!("r-{seq}")}, "claim_id": claim_id})
    }
}

/// One `POST .../children/{seq}/outcome` per child.
async fn post_outcomes_one_by_one(app: &TestApp, work: &[(u64, bool)], claim_id: &str) {
    for &(seq, failed) in work {
        let r = app
            .post(
                &format!("/v1/parents/{PARENT}/children/{seq}/outcome"),
                outcome_fields(failed, seq, claim_id),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "outcome for {seq}: {r:?}");
        assert_eq!(r.body["applied"], true, "outcome for {seq}: {r:?}");
        let child = &r.body["child"];
        assert_eq!(child["parent_id"], PARENT);
        assert_eq!(child["sequence"], seq);
        assert_eq!(child["state"], if failed { "failed" } else { "processed" });
        assert_eq!(child["outcome"], if failed { "failed" } else { "processed" });
    }
}

/// One `POST /v1/outcomes` for the whole chunk.
async fn post_outcomes_in_batch(app: &TestApp, work: &[(u64, bool)], claim_id: &str) {
    let items: Vec<Value> = work
        .iter()
        .map(|&(seq, failed)| {
            let mut item = outcome_fields(failed, seq, claim_id);
            item["parent_id"] = json!(PARENT);
            item["sequence"] = json!(seq);
            item
        })
        .collect();
    let r = app.post("/v1/outcomes", json!({ "outcomes": items })).await;
    assert_eq!(r.status, StatusCode::OK, "batch outcomes: {r:?}");
    let results = r.body["results"].as_array().expect("results array");
    assert_eq!(results.len(), work.len(), "one result per item: {r:?}");
    for (result, &(seq, _)) in results.iter().zip(work) {
        assert_eq!(result["parent_id"], PARENT, "results are in request order");
        assert_eq!(result["sequence"], seq, "results are in request order");
        assert_eq!(result["status"], "applied", "batch item {seq}: {result}");
    }
}

async fn get_parent(app: &TestApp) -> Value {
    let r = app.get(&format!("/v1/parents/{PARENT}")).await;
    assert_eq!(r.status, StatusCode::OK, "GET parent: {r:?}");
    r.body
}

async fn seed_story(backend: Backend) {
    let app = spawn_app(backend).await;

    // The ledger is written before anything is handed out.
    let r = app
        .put(
            &format!("/v1/parents/{PARENT}"),
            json!({"queue": "events", "children": children(TOTAL as usize)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "register: {r:?}");
    assert_eq!(r.body["parent_id"], PARENT);
    assert_eq!(r.body["queue"], "events");
    assert_eq!(r.body["state"], "active");
    assert_eq!(r.body["complete"], false);
    assert_eq!(r.body["counts"]["total"], TOTAL);
    assert_eq!(r.body["counts"]["pending"], TOTAL);
    assert_eq!(r.body["counts"]["in_flight"], 0);
    assert!(r.body["decomposed_at"].is_string(), "{r:?}");
    assert!(r.body["completed_at"].is_null(), "{r:?}");

    // First run: six chunks of 100, each under a lease longer than the run.
    let mut terminal = BTreeSet::new();
    let mut failed_first_run = Vec::new();
    let mut first_run_claims = Vec::new();
    for chunk in 0..6u64 {
        let claimed = claim(&app, 100, 300).await;
        let expected: Vec<u64> = (chunk * 100..(chunk + 1) * 100).collect();
        assert_eq!(sequences(&claimed), expected, "lowest sequences first, chunk {chunk}");
        assert!(claimed["lease_expires_at"].is_string(), "{claimed}");
        for child in claimed["children"].as_array().unwrap() {
            let seq = child["sequence"].as_u64().unwrap();
            assert_eq!(child["parent_id"], PARENT);
            assert_eq!(child["payload"], json!({ "n": seq }));
            assert_eq!(child["attempt"], 1);
            assert!(child["previous_attempt"].is_null(), "{child}");
            assert_eq!(child["idempotency_key"], format!("{PARENT}/{seq}"));
        }

        let work: Vec<(u64, bool)> = expected
            .iter()
            .filter(|&&seq| !abandoned_in_crash(seq))
            .map(|&seq| (seq, fails_in_first_run(seq)))
            .collect();
        let id = claim_id(&claimed);
        first_run_claims.push(id.clone());
        if chunk % 2 == 0 {
            post_outcomes_one_by_one(&app, &work, &id).await;
        } else {
            post_outcomes_in_batch(&app, &work, &id).await;
        }
        for &(seq, failed) in &work {
            terminal.insert(seq);
            if failed {
                failed_first_run.push(seq);
            }
        }
    }
    assert_eq!(terminal.len(), 585);
    assert_eq!(failed_first_run.len(), 12);

    // The crash: 15 children stay in flight and nobody comes back for them.
    let crashed = get_parent(&app).await;
    assert_eq!(crashed["state"], "active");
    assert_eq!(crashed["complete"], false);
    assert_eq!(crashed["counts"]["total"], TOTAL);
    assert_eq!(crashed["counts"]["processed"], 573);
    assert_eq!(crashed["counts"]["failed"], 12);
    assert_eq!(crashed["counts"]["skipped"], 0);
    assert_eq!(crashed["counts"]["held"], 0);
    let open = crashed["counts"]["pending"].as_u64().unwrap() + crashed["counts"]["in_flight"].as_u64().unwrap();
    assert_eq!(open, 415, "{crashed}");
    assert!(crashed["completed_at"].is_null());

    // Nobody comes back for them: their leases run out (the test moves the
    // clock of those leases rather than sleeping past a short one, which a
    // loaded machine could also outlive while the run is still posting).
    for id in &first_run_claims {
        app.expire_claim(id).await;
    }

    // Resume: claim until nothing is left.
    let mut resumed: BTreeMap<u64, Value> = BTreeMap::new();
    let mut claims: Vec<(String, Vec<u64>)> = Vec::new();
    loop {
        assert!(claims.len() < 10, "resume never drained: {} claims", claims.len());
        let claimed = claim(&app, 1000, 300).await;
        let seqs = sequences(&claimed);
        if seqs.is_empty() {
            break;
        }
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "claim is in sequence order: {seqs:?}"
        );
        for child in claimed["children"].as_array().unwrap() {
            let seq = child["sequence"].as_u64().unwrap();
            assert!(
                resumed.insert(seq, child.clone()).is_none(),
                "sequence {seq} handed out twice"
            );
        }
        claims.push((claim_id(&claimed), seqs));
    }

    let abandoned: BTreeSet<u64> = (0..FIRST_RUN).filter(|&s| abandoned_in_crash(s)).collect();
    assert_eq!(abandoned.len(), 15);
    let expected: BTreeSet<u64> = abandoned.iter().copied().chain(FIRST_RUN..TOTAL).collect();
    let got: BTreeSet<u64> = resumed.keys().copied().collect();
    assert!(got.is_disjoint(&terminal), "a terminal child was handed out again");
    assert_eq!(
        got, expected,
        "resumed set is the abandoned 15 plus the never-dispatched 400"
    );

    for (&seq, child) in &resumed {
        assert_eq!(child["parent_id"], PARENT);
        assert_eq!(child["idempotency_key"], format!("{PARENT}/{seq}"));
        assert_eq!(child["payload"], json!({ "n": seq }));
        if abandoned.contains(&seq) {
            assert_eq!(child["attempt"], 2, "abandoned child {seq}: {child}");
            assert_eq!(child["previous_attempt"], "expired", "abandoned child {seq}: {child}");
        } else {
            assert_eq!(child["attempt"], 1, "fresh child {seq}: {child}");
            assert!(child["previous_attempt"].is_null(), "fresh child {seq}: {child}");
        }
    }

    // Finish the resumed work.
    for (id, seqs) in &claims {
        let work: Vec<(u64, bool)> = seqs.iter().map(|&s| (s, false)).collect();
        post_outcomes_in_batch(&app, &work, id).await;
    }

    let done = get_parent(&app).await;
    assert_eq!(done["state"], "complete", "{done}");
    assert_eq!(done["complete"], true, "{done}");
    let expected_counts = json!({"total": 1000, "processed": 988, "failed": 12, "skipped": 0,
                                 "pending": 0, "in_flight": 0, "held": 0});
    for (field, value) in expected_counts.as_object().unwrap() {
        assert_eq!(&done["counts"][field], value, "counts.{field}: {done}");
    }
    assert!(done["completed_at"].is_string(), "{done}");

    // Nothing is left to hand out.
    assert!(sequences(&claim(&app, 1000, 300).await).is_empty());

    // The failed children can be listed exactly, page by page.
    let mut listed = Vec::new();
    let mut after: Option<u64> = None;
    let mut pages = 0;
    loop {
        pages += 1;
        assert!(pages <= 10, "pagination never ended");
        let path = match after {
            Some(after) => {
                format!("/v1/parents/{PARENT}/children?state=failed&limit=5&after={after}")
            }
            None => format!("/v1/parents/{PARENT}/children?state=failed&limit=5"),
        };
        let r = app.get(&path).await;
        assert_eq!(r.status, StatusCode::OK, "list failed: {r:?}");
        let page = r.body["children"].as_array().expect("children array");
        assert!(page.len() <= 5, "page over the limit: {r:?}");
        for child in page {
            assert_eq!(child["state"], "failed", "{child}");
            assert_eq!(child["outcome"], "failed", "{child}");
            assert_eq!(child["reason"], FAILURE_REASON, "{child}");
            assert_eq!(child["idempotency_key"], format!("{PARENT}/{}", child["sequence"]));
            listed.push(child["sequence"].as_u64().expect("sequence"));
        }
        match r.body["next_after"].as_u64() {
            Some(next) => {
                assert_eq!(
                    Some(&next),
                    listed.last(),
                    "next_after is the last sequence of the page"
                );
                after = Some(next);
            }
            None => {
                assert!(r.body["next_after"].is_null(), "{r:?}");
                break;
            }
        }
    }
    assert_eq!(
        listed, failed_first_run,
        "exactly the 12 failed children, in sequence order"
    );
    assert_eq!(pages, 3, "12 children at 5 a page");
}

both_stores!(seed_story);
