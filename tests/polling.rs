//! Cheap polling: every `GET` under `/v1` carries an `ETag`, and
//! `If-None-Match` with the current one is answered `304` with no body.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;

/// A GET with `If-None-Match`: its status, `ETag` and body bytes.
async fn get_if_none_match(app: &TestApp, path: &str, tag: &str) -> (StatusCode, Option<String>, usize) {
    let r = app
        .client
        .get(format!("{}{path}", app.base))
        .header("if-none-match", tag)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let etag = r.headers().get("etag").map(|v| v.to_str().unwrap().to_owned());
    (status, etag, r.bytes().await.unwrap().len())
}

fn etag_of(reply: &Reply) -> String {
    reply
        .headers
        .get("etag")
        .unwrap_or_else(|| panic!("no ETag on {reply:?}"))
        .to_str()
        .unwrap()
        .to_owned()
}

/// A dashboard polls a parent: 304 while nothing changed, 200 with a new tag
/// once an outcome changed it; lists, pages and children are tagged too.
async fn polling_a_parent_is_cheap_until_it_changes(backend: Backend) {
    let app = spawn_app(backend).await;
    assert_eq!(
        app.put("/v1/parents/P", json!({"queue": "q", "children": children(3)}))
            .await
            .status,
        StatusCode::CREATED
    );
    let first = app.get("/v1/parents/P").await;
    assert_eq!(first.status, StatusCode::OK);
    let tag = etag_of(&first);
    assert_eq!(first.headers.get("cache-control").unwrap(), "no-cache");

    let (status, etag, bytes) = get_if_none_match(&app, "/v1/parents/P", &tag).await;
    assert_eq!(
        (status, etag.as_deref(), bytes),
        (StatusCode::NOT_MODIFIED, Some(tag.as_str()), 0)
    );
    // Weak form, lists of tags and `*` match too; another tag does not.
    for sent in [format!("W/{tag}"), format!("\"stale\", {tag}"), "*".to_owned()] {
        assert_eq!(
            get_if_none_match(&app, "/v1/parents/P", &sent).await.0,
            StatusCode::NOT_MODIFIED,
            "{sent}"
        );
    }
    assert_eq!(
        get_if_none_match(&app, "/v1/parents/P", "\"stale\"").await.0,
        StatusCode::OK
    );

    let claim = app.post("/v1/parents/P/claims", json!({"limit": 1})).await;
    assert!(claim.headers.get("etag").is_none(), "only GETs are tagged");
    let changed = get_if_none_match(&app, "/v1/parents/P", &tag).await;
    assert_eq!(changed.0, StatusCode::OK);
    assert_ne!(changed.1.as_deref(), Some(tag.as_str()));

    for path in ["/v1/parents", "/v1/parents/P/children", "/v1/parents/P/children/0"] {
        let reply = app.get(path).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        let tag = etag_of(&reply);
        assert_eq!(
            get_if_none_match(&app, path, &tag).await.0,
            StatusCode::NOT_MODIFIED,
            "{path}"
        );
    }
    // Errors and operational routes carry none.
    assert!(app.get("/v1/parents/missing").await.headers.get("etag").is_none());
    assert!(app.get("/healthz").await.headers.get("etag").is_none());
}

both_stores!(polling_a_parent_is_cheap_until_it_changes);
