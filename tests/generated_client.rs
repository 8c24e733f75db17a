//! The service driven through the Python client that openapi-python-client
//! generates from openapi/openapi.json (`.ci/clients` writes it to
//! `target/clients/child_ledger_client`, with a venv in `target/clients-venv`),
//! not through hand-written HTTP: tests/clients/seed_story.py runs the seed
//! story with a worker token and an admin token, on both stores.
//!
//! Without the generated client the test is skipped with a loud message, and
//! fails when `CI=true` or `LEDGER_REQUIRE_POSTGRES=1`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};
use tokio::process::Command;

const QUEUE: &str = "seed";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's Python, once the generated package is there; `None` (after a
/// loud message) when it is not and nothing requires it.
fn generated_python() -> Option<PathBuf> {
    let python = root().join("target/clients-venv/bin/python");
    let package = root().join("target/clients/child_ledger_client/__init__.py");
    if python.is_file() && package.is_file() {
        return Some(python);
    }
    missing_tool(
        &format!(
            "the generated Python client is missing ({} or {}): run .ci/clients to generate it",
            python.display(),
            package.display()
        ),
        "the generated-client test is",
    );
    None
}

async fn seed_story_through_the_generated_client(backend: Backend) {
    let Some(python) = generated_python() else {
        return;
    };
    let (worker_token, worker_entry) = token("generated-worker", &[Role::Worker], &[QUEUE]);
    let (admin_token, admin_entry) = token("generated-admin", &[Role::Admin], &[]);
    let app = spawn_app_with_tokens(backend, json!([worker_entry, admin_entry])).await;

    let child = Command::new(python)
        .arg(root().join("tests/clients/seed_story.py"))
        .args(["--url", &app.base])
        .env("PYTHONPATH", root().join("target/clients"))
        .env("LEDGER_WORKER_TOKEN", &worker_token)
        .env("LEDGER_ADMIN_TOKEN", &admin_token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the generated-client script");
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .expect("the generated-client script did not finish within 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "seed_story.py exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    let line = stdout.lines().last().expect("seed_story.py printed no summary");
    let summary: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("summary {line:?}: {e}"));
    assert_eq!(
        summary,
        json!({
            "parent_id": "seed-story-1", "state": "complete",
            "total": 5, "processed": 3, "failed": 1, "skipped": 1,
            "conflicts": 2, "reclaimed_expired": 2,
            "reconcile_checked": 1, "reconcile_drifted": 0,
        })
    );

    // The rows agree with what the client was told.
    let rows = |state: &str| {
        format!("SELECT count(*) FROM child_status WHERE parent_id = 'seed-story-1' AND state = '{state}'")
    };
    assert_eq!(app.count(&rows("processed")).await, 3);
    assert_eq!(app.count(&rows("failed")).await, 1);
    assert_eq!(app.count(&rows("skipped")).await, 1);
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE conflicts IS NOT NULL")
            .await,
        2
    );
    eprintln!("{backend:?}: generated Python client ran the seed story: {summary}");
}

both_stores!(seed_story_through_the_generated_client);
