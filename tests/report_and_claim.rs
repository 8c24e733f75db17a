//! A claim that carries the outcomes of the chunk before it (`outcomes` on
//! both claim routes): they are recorded first, answered in
//! `outcome_results` in request order, and the next chunk is claimed in the
//! same request. Bad input records nothing and claims nothing.

mod common;

use child_ledger::access::Role;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

async fn register(app: &TestApp, parent: &str, queue: &str, n: usize) {
    let r = app
        .put(
            &format!("/v1/parents/{parent}"),
            json!({"queue": queue, "children": children(n)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

fn sequences(claim: &Value) -> Vec<u64> {
    claim["children"]
        .as_array()
        .expect("children array")
        .iter()
        .map(|c| c["sequence"].as_u64().expect("sequence"))
        .collect()
}

/// Outcome items for every child of `claim`, all `processed`.
fn processed(claim: &Value) -> Vec<Value> {
    claim["children"]
        .as_array()
        .expect("children array")
        .iter()
        .map(|c| {
            json!({"parent_id": c["parent_id"], "sequence": c["sequence"], "outcome": "processed",
                   "claim_id": claim["claim_id"]})
        })
        .collect()
}

fn statuses(claim: &Value) -> Vec<(String, u64, String)> {
    claim["outcome_results"]
        .as_array()
        .expect("outcome_results array")
        .iter()
        .map(|r| {
            (
                r["parent_id"].as_str().unwrap().to_owned(),
                r["sequence"].as_u64().unwrap(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn counts(app: &TestApp, parent: &str) -> Value {
    let r = app.get(&format!("/v1/parents/{parent}")).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    r.body["counts"].clone()
}

/// A worker's loop in one request per chunk: each claim reports the chunk
/// before it; the answer says what became of each outcome, in order.
async fn each_claim_reports_the_chunk_before(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "RC-1", "rc", 6).await;

    let first = app.post("/v1/queues/rc/claims", json!({"limit": 3})).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(sequences(&first.body), vec![0, 1, 2]);
    assert!(
        first.body.get("outcome_results").is_none(),
        "a claim without outcomes answers none: {first:?}"
    );

    let mut outcomes = processed(&first.body);
    outcomes[2]["outcome"] = json!("failed");
    outcomes[2]["reason"] = json!("remote said no");
    let second = app
        .post("/v1/queues/rc/claims", json!({"limit": 3, "outcomes": outcomes}))
        .await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");
    assert_eq!(
        statuses(&second.body),
        vec![
            ("RC-1".to_owned(), 0, "applied".to_owned()),
            ("RC-1".to_owned(), 1, "applied".to_owned()),
            ("RC-1".to_owned(), 2, "applied".to_owned()),
        ]
    );
    assert_eq!(sequences(&second.body), vec![3, 4, 5], "the next chunk: {second:?}");
    let c = counts(&app, "RC-1").await;
    assert_eq!(
        (c["processed"].as_u64(), c["failed"].as_u64()),
        (Some(2), Some(1)),
        "{c}"
    );
    let child = app.get("/v1/parents/RC-1/children/2").await;
    assert_eq!(child.body["state"], "failed", "{child:?}");
    assert_eq!(child.body["reason"], "remote said no", "{child:?}");

    // The last chunk's outcomes, with the first chunk's again (a retried
    // request): those come back `duplicate`; nothing is left to claim.
    let mut again = processed(&first.body);
    again.truncate(2);
    again.extend(processed(&second.body));
    let last = app
        .post("/v1/parents/RC-1/claims", json!({"limit": 3, "outcomes": again}))
        .await;
    assert_eq!(last.status, StatusCode::OK, "{last:?}");
    let got: Vec<String> = statuses(&last.body).into_iter().map(|(_, _, s)| s).collect();
    assert_eq!(got, ["duplicate", "duplicate", "applied", "applied", "applied"]);
    assert!(sequences(&last.body).is_empty(), "{last:?}");
    let parent = app.get("/v1/parents/RC-1").await;
    assert_eq!(parent.body["counts"]["processed"], 5, "{parent:?}");
    assert!(
        parent.body["completed_at"].is_string(),
        "the last outcome completed it: {parent:?}"
    );

    // An empty list is allowed, and answered with an empty list.
    let empty = app
        .post("/v1/queues/rc/claims", json!({"limit": 3, "outcomes": []}))
        .await;
    assert_eq!(empty.status, StatusCode::OK, "{empty:?}");
    assert_eq!(empty.body["outcome_results"], json!([]), "{empty:?}");
}

/// An item that is not valid, a claim field out of range or an unknown
/// parent: a problem naming the field, and neither the outcomes nor a claim
/// are written.
async fn bad_input_records_nothing_and_claims_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    register(&app, "RC-2", "rc2", 4).await;
    let first = app.post("/v1/queues/rc2/claims", json!({"limit": 2})).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    let good = processed(&first.body);

    let cases = [
        (
            "an unknown outcome",
            json!({"outcomes": [good[0].clone(), {"parent_id": "RC-2", "sequence": 1, "outcome": "maybe"}]}),
            "outcomes[1].outcome",
        ),
        (
            "a negative sequence",
            json!({"outcomes": [good[0].clone(), {"parent_id": "RC-2", "sequence": -1, "outcome": "processed",
                                                   "claim_id": first.body["claim_id"]}]}),
            "outcomes[1].sequence",
        ),
        (
            "a reason past 1000 characters",
            json!({"outcomes": [good[0].clone(), {"parent_id": "RC-2", "sequence": 1, "outcome": "failed",
                                                   "reason": "x".repeat(1001), "claim_id": first.body["claim_id"]}]}),
            "outcomes[1].reason",
        ),
        (
            "a limit out of range",
            json!({"limit": 0, "outcomes": good.clone()}),
            "limit",
        ),
        (
            "outcomes that are not a list",
            json!({"outcomes": {"parent_id": "RC-2"}}),
            "outcomes",
        ),
    ];
    for (case, body, field) in cases {
        let r = app.post("/v1/queues/rc2/claims", body).await;
        assert!(r.status.is_client_error(), "{case}: {r:?}");
        assert!(r.content_type.starts_with("application/problem+json"), "{case}: {r:?}");
        assert_eq!(r.body["field"], field, "{case}: {r:?}");
    }
    let unknown = app
        .post("/v1/parents/RC-none/claims", json!({"outcomes": good.clone()}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{unknown:?}");

    let c = counts(&app, "RC-2").await;
    assert_eq!(c["processed"], 0, "no outcome was recorded: {c}");
    // Nothing was claimed either: the two children left are the next claim's.
    let next = app.post("/v1/queues/rc2/claims", json!({"limit": 4})).await;
    assert_eq!(sequences(&next.body), vec![2, 3], "{next:?}");
    for child in next.body["children"].as_array().unwrap() {
        assert_eq!(child["attempt"], 1, "claimed for the first time: {next:?}");
    }
}

/// Outcomes ride on a claim with the rights they have on their own: a
/// worker's token cannot record one without a `claim_id`, and an outcome of
/// a parent outside the token's queues is answered `not_found`, unwritten.
async fn outcomes_on_a_claim_keep_their_access_rules(backend: Backend) {
    let (admin, a) = token("admin", &[Role::Admin], &[]);
    let (worker_a, w) = token("team-a-worker", &[Role::Worker], &["team-a.*"]);
    let app = spawn_app_with_tokens(backend, json!([a, w])).await;
    for (parent, queue) in [("RC-A", "team-a.one"), ("RC-B", "team-b.one")] {
        let r = app
            .put_as(
                &admin,
                &format!("/v1/parents/{parent}"),
                json!({"queue": queue, "children": children(2)}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let theirs = app
        .post_as(&admin, "/v1/queues/team-b.one/claims", json!({"limit": 2}))
        .await;
    let mine = app
        .post_as(&worker_a, "/v1/queues/team-a.one/claims", json!({"limit": 1}))
        .await;
    assert_eq!(mine.status, StatusCode::OK, "{mine:?}");

    let no_claim_id = json!({"outcomes": [{"parent_id": "RC-A", "sequence": 0, "outcome": "processed"}]});
    let r = app
        .post_as(&worker_a, "/v1/queues/team-a.one/claims", no_claim_id)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{r:?}");

    let mut outcomes = processed(&mine.body);
    outcomes.extend(processed(&theirs.body));
    let r = app
        .post_as(
            &worker_a,
            "/v1/queues/team-a.one/claims",
            json!({"limit": 1, "outcomes": outcomes}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let got: Vec<String> = statuses(&r.body).into_iter().map(|(_, _, s)| s).collect();
    assert_eq!(got, ["applied", "not_found", "not_found"], "{r:?}");
    assert_eq!(sequences(&r.body), vec![1], "{r:?}");
    let b = app.get_as(&admin, "/v1/parents/RC-B").await;
    assert_eq!(
        b.body["counts"]["processed"], 0,
        "another team's parent untouched: {b:?}"
    );
}

both_stores!(
    each_claim_reports_the_chunk_before,
    bad_input_records_nothing_and_claims_nothing,
    outcomes_on_a_claim_keep_their_access_rules,
);
