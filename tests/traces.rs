//! The trace context a registration carries comes back on every claimed
//! child, with OpenTelemetry export off: a child's own `traceparent` where it
//! was given one, its parent's otherwise, whether the parent was registered
//! whole or appended to and sealed, and whichever replica hands it out. A
//! parent deleted and registered again (in another queue, by another tenant)
//! hands out only its own, on every replica.

mod common;

use std::collections::BTreeMap;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const PARENT_TRACE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CHILD_TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

async fn register_traced(app: &TestApp, parent: &str, body: Value, traceparent: Option<&str>) {
    let headers: Vec<(&str, &str)> = traceparent.map(|t| ("traceparent", t)).into_iter().collect();
    let r = app
        .raw_with(
            Method::PUT,
            &format!("/v1/parents/{parent}"),
            "application/json",
            &headers,
            reqwest::Body::from(body.to_string()),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "register {parent}: {r:?}");
}

/// Claims every claimable child of `parent`: sequence -> traceparent.
async fn handed_out(app: &TestApp, parent: &str) -> BTreeMap<i64, Option<String>> {
    let r = app
        .post(
            &format!("/v1/parents/{parent}/claims"),
            json!({"limit": 100, "lease_seconds": 300}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "claim {parent}: {r:?}");
    r.body["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["sequence"].as_i64().unwrap(),
                c["traceparent"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

async fn kept_and_handed_back(backend: Backend) {
    let app = spawn_app(backend).await;
    // Registered whole: the parent's context, and one child's own.
    register_traced(
        &app,
        "T-whole",
        json!({"queue": "traced", "children": [{"payload": 0}, {"payload": 1, "traceparent": CHILD_TRACE}, {"payload": 2}]}),
        Some(PARENT_TRACE),
    )
    .await;
    let whole = handed_out(&app, "T-whole").await;
    assert_eq!(whole[&0].as_deref(), Some(PARENT_TRACE));
    assert_eq!(whole[&1].as_deref(), Some(CHILD_TRACE));
    assert_eq!(whole[&2].as_deref(), Some(PARENT_TRACE));

    // Appended to and sealed: the children's own contexts come with the pages.
    register_traced(
        &app,
        "T-paged",
        json!({"queue": "traced", "decomposed": false, "children": [{"payload": 0}]}),
        None,
    )
    .await;
    let r = app
        .post(
            "/v1/parents/T-paged/children",
            json!({"children": [{"sequence": 1, "payload": 1, "traceparent": CHILD_TRACE}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.post("/v1/parents/T-paged/seal", json!({"total": 2})).await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let paged = handed_out(&app, "T-paged").await;
    assert_eq!(paged[&0], None);
    assert_eq!(paged[&1].as_deref(), Some(CHILD_TRACE));
}

async fn a_parent_registered_again_hands_out_its_own(backend: Backend) {
    let app = spawn_app(backend).await;
    // Postgres: a second replica, which hands the first registration out
    // and must not keep anything of it past its deletion.
    let replica = match backend {
        Backend::Postgres => Some(app.replica().await),
        Backend::Sqlite => None,
    };
    let other = replica.as_ref().unwrap_or(&app);
    register_traced(
        &app,
        "T-again",
        json!({"queue": "tenant-a", "children": [{"payload": 0}]}),
        Some(PARENT_TRACE),
    )
    .await;
    let first = handed_out(other, "T-again").await;
    assert_eq!(first[&0].as_deref(), Some(PARENT_TRACE));
    let r = app
        .post(
            "/v1/outcomes",
            json!({"outcomes": [{"parent_id": "T-again", "sequence": 0, "outcome": "processed"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let r = app.request(Method::DELETE, "/v1/parents/T-again", None).await;
    assert!(r.status.is_success(), "delete: {r:?}");

    register_traced(
        &app,
        "T-again",
        json!({"queue": "tenant-b", "children": [{"payload": 0}, {"payload": 1}]}),
        None,
    )
    .await;
    let again = handed_out(other, "T-again").await;
    assert_eq!(again.len(), 2, "{again:?}");
    assert!(
        again.values().all(Option::is_none),
        "the deleted registration's trace context was handed out: {again:?}"
    );
}

/// A `traceparent` header of a later version is read as W3C Trace Context
/// says (its first four fields), and its extra fields are dropped: workers
/// get `00-<trace id>-<span id>-<flags>`, never the text that followed. One
/// that is not a trace context is none, as before.
async fn a_later_versions_extra_fields_are_never_handed_on(backend: Backend) {
    let app = spawn_app(backend).await;
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for (parent, header, want) in [
        (
            "T-later",
            format!("01-{trace}-\"><img src=x onerror=alert(1)>"),
            Some(PARENT_TRACE),
        ),
        (
            "T-later-plain",
            format!("Cc-{}", trace.to_uppercase()),
            Some(PARENT_TRACE),
        ),
        ("T-glued", format!("01-{trace}x"), None),
        ("T-zero-extra", format!("00-{trace}-more"), None),
    ] {
        register_traced(
            &app,
            parent,
            json!({"queue": "later", "children": [{"payload": 0}]}),
            Some(&header),
        )
        .await;
        let got = handed_out(&app, parent).await;
        assert_eq!(got[&0].as_deref(), want, "{header:?}");
    }
}

both_stores!(
    kept_and_handed_back,
    a_parent_registered_again_hands_out_its_own,
    a_later_versions_extra_fields_are_never_handed_on
);
