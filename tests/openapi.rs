//! The OpenAPI document is generated from the code; the checked-in copy must
//! match it, and the Swagger UI must be served from the binary.

mod common;

use common::*;
use reqwest::StatusCode;

const CHECKED_IN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

fn generated() -> String {
    let mut doc = serde_json::to_string_pretty(&child_ledger::api::openapi()).expect("serialize openapi");
    doc.push('\n');
    doc
}

#[test]
fn openapi_document_is_checked_in() {
    let generated = generated();
    if std::env::var("UPDATE_OPENAPI").is_ok_and(|v| v == "1") {
        std::fs::write(CHECKED_IN, &generated).expect("write openapi/openapi.json");
        return;
    }
    let checked_in = std::fs::read_to_string(CHECKED_IN).unwrap_or_default();
    assert!(
        checked_in == generated,
        "openapi/openapi.json differs from the code's document: run `UPDATE_OPENAPI=1 cargo test --test openapi` \
         and commit the result"
    );
}

#[test]
fn every_contract_path_is_documented() {
    let doc = serde_json::to_value(child_ledger::api::openapi()).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/parents/{parent_id}", "put"),
        ("/v1/parents/{parent_id}", "get"),
        ("/v1/parents", "get"),
        ("/v1/parents/{parent_id}/children", "post"),
        ("/v1/parents/{parent_id}/children", "get"),
        ("/v1/parents/{parent_id}/children/{sequence}", "get"),
        ("/v1/parents/{parent_id}/seal", "post"),
        ("/v1/parents/{parent_id}/claims", "post"),
        ("/v1/queues/{queue}/claims", "post"),
        ("/v1/claims/{claim_id}/extend", "post"),
        ("/v1/claims/{claim_id}/release", "post"),
        ("/v1/parents/{parent_id}/children/{sequence}/retry", "post"),
        ("/v1/parents/{parent_id}/children/{sequence}/outcome", "post"),
        ("/v1/outcomes", "post"),
        ("/v1/parents/{parent_id}/reconcile", "post"),
        ("/v1/reconcile", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} is not documented"
        );
    }
}

async fn served_docs(backend: Backend) {
    let app = spawn_app(backend).await;
    let served = app.get("/openapi.json").await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.body, serde_json::to_value(child_ledger::api::openapi()).unwrap());

    let page = app.client.get(format!("{}/docs/", app.base)).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    // Never framed, and nothing loaded from elsewhere.
    let header = |name: &str| {
        page.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(header("x-frame-options"), "DENY");
    let policy = header("content-security-policy");
    for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'"] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert_eq!(header("x-content-type-options"), "nosniff");
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger"), "{html}");
    // Every asset the page references is served by the binary itself.
    let assets: Vec<&str> = html
        .split(['"', '\''])
        .filter(|s| s.starts_with("./") && (s.ends_with(".js") || s.ends_with(".css") || s.ends_with(".png")))
        .collect();
    assert!(assets.len() >= 3, "expected script and style assets in {html}");
    for asset in assets {
        let url = format!("{}/docs/{}", app.base, asset.trim_start_matches("./"));
        let resp = app.client.get(&url).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{url}");
        let body = resp.bytes().await.unwrap();
        assert!(!body.is_empty(), "{url} is empty");
        assert!(
            !String::from_utf8_lossy(&body).contains("://unpkg.com"),
            "{url} loads from the network"
        );
    }
    let initializer = app
        .client
        .get(format!("{}/docs/swagger-initializer.js", app.base))
        .send()
        .await
        .unwrap();
    assert!(initializer.text().await.unwrap().contains("/openapi.json"));
}

/// The pattern the document gives `parent_id` says what the service
/// accepts, as an independent regex engine (Python's `re`) reads it.
#[test]
fn the_parent_id_pattern_is_the_rule() {
    let doc = serde_json::to_value(child_ledger::api::openapi()).unwrap();
    let pattern = doc["components"]["schemas"]["ParentId"]["pattern"]
        .as_str()
        .expect("ParentId has a pattern")
        .to_owned();
    let ids = [
        ".", "..", "...", ".a", "..a", "a.", "a", "P-42", "~.~", "", "x/y", "a b", "é", ":.", "-..",
    ];
    let long = "x".repeat(200);
    let too_long = "x".repeat(201);
    let dotted = format!("..{}", "x".repeat(198));
    let ids: Vec<&str> = ids
        .iter()
        .copied()
        .chain([long.as_str(), too_long.as_str(), dotted.as_str()])
        .collect();
    let script = "import json, re, sys\npattern, ids = sys.argv[1], json.loads(sys.argv[2])\n\
                  print(json.dumps([re.search(pattern, i) is not None for i in ids]))";
    let output = std::process::Command::new("python3")
        .args(["-c", script, &pattern, &serde_json::to_string(&ids).unwrap()])
        .output()
        .expect("python3 on the PATH");
    assert!(output.status.success(), "{output:?}");
    let matched: Vec<bool> = serde_json::from_slice(&output.stdout).unwrap();
    for (id, matched) in ids.iter().zip(matched) {
        assert_eq!(
            matched,
            child_ledger::ledger::ParentId::parse(id).is_ok(),
            "{id:?} against {pattern}"
        );
    }
}

both_stores!(served_docs);
