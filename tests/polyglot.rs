//! The example workers, in Python and Node, run side by side on one queue:
//! first interrupted with SIGTERM (they must give back what they hold), then
//! to the end. Every child is processed exactly once, by the ledger and on the
//! "remote side" (the shared effects file), and both languages do work.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

const PARENTS: usize = 6;
const CHILDREN: usize = 100;
const QUEUE: &str = "polyglot";

fn example(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(path)
}

/// Starts one worker with a worker token (Python takes it as `--token`, Node
/// from `LEDGER_TOKEN`: the two ways the examples accept it); `extra` adds
/// flags after the common ones.
fn worker(lang: &str, base: &str, token: &str, effects: &Path, extra: &[&str]) -> Child {
    let (program, script) = match lang {
        "python" => ("python3", example("python/worker.py")),
        _ => ("node", example("node/worker.mjs")),
    };
    let mut command = Command::new(program);
    command.arg(script);
    if lang == "python" {
        command.args(["--token", token]);
    } else {
        command.env("LEDGER_TOKEN", token);
    }
    command
        .args(["--url", base, "--queue", QUEUE, "--worker", &format!("{lang}-test")])
        .args(["--limit", "20", "--lease-seconds", "10", "--batch-size", "10"])
        .arg("--effects-file")
        .arg(effects)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program} (needed for the {lang} worker): {e}"))
}

/// Waits for a worker to exit 0 and returns its summary line.
async fn summary(lang: &str, child: Child) -> Value {
    let output = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the {lang} worker did not finish within 120 s"))
        .unwrap();
    assert!(output.status.success(), "{lang} worker exited with {}", output.status);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .last()
        .unwrap_or_else(|| panic!("{lang} worker printed no summary"));
    let summary: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{lang} summary {line:?}: {e}"));
    assert_eq!(summary["lang"], lang, "{summary}");
    summary
}

fn n(summary: &Value, field: &str) -> i64 {
    summary[field]
        .as_i64()
        .unwrap_or_else(|| panic!("summary without {field}: {summary}"))
}

fn sigterm(child: &Child) {
    let pid = child.id().expect("running").to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
}

async fn python_and_node_share_a_queue(backend: Backend) {
    let (worker_token, worker_entry) = token("polyglot-workers", &[Role::Worker], &[QUEUE]);
    let (admin_token, admin_entry) = token("polyglot-test", &[Role::Admin], &[]);
    let mut app = spawn_app_with_tokens(backend, json!([worker_entry, admin_entry])).await;
    app.token = Some(admin_token);
    for p in 0..PARENTS {
        let children: Vec<Value> = (0..CHILDREN).map(|i| json!({"payload": {"p": p, "i": i}})).collect();
        let r = app
            .put(
                &format!("/v1/parents/poly-{p}"),
                json!({"queue": QUEUE, "children": children}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{r:?}");
    }
    let total = (PARENTS * CHILDREN) as i64;
    let dir = std::env::temp_dir().join(format!("child-ledger-polyglot-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let effects = dir.join("effects.jsonl");

    // Round 1: both start slowly and are told to stop part way through.
    let slow = ["--work-ms", "5", "--wait-seconds", "1"];
    let python = worker("python", &app.base, &worker_token, &effects, &slow);
    let node = worker("node", &app.base, &worker_token, &effects, &slow);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while app.count("SELECT count(*) FROM child WHERE state = 'processed'").await < total / 5 {
        assert!(tokio::time::Instant::now() < deadline, "the workers made no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    sigterm(&python);
    sigterm(&node);
    let first = [summary("python", python).await, summary("node", node).await];
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE state = 'in_flight'").await,
        0,
        "SIGTERM left children leased: {first:?}"
    );
    let released: i64 = first.iter().map(|s| n(s, "released")).sum();
    let processed_first: i64 = first.iter().map(|s| n(s, "processed")).sum();
    assert!(processed_first < total, "round 1 was not interrupted: {first:?}");

    // Round 2: both drain the queue and exit when it is empty.
    let drain = ["--exit-when-empty", "--work-ms", "1"];
    let python = worker("python", &app.base, &worker_token, &effects, &drain);
    let node = worker("node", &app.base, &worker_token, &effects, &drain);
    let second = [summary("python", python).await, summary("node", node).await];

    let all: Vec<&Value> = first.iter().chain(&second).collect();
    for lang in ["python", "node"] {
        let did: i64 = all
            .iter()
            .filter(|s| s["lang"] == lang)
            .map(|s| n(s, "processed"))
            .sum();
        assert!(did > 0, "the {lang} worker processed nothing: {all:?}");
    }
    let processed: i64 = all.iter().map(|s| n(s, "processed")).sum();
    let not_applied: i64 = all.iter().map(|s| n(s, "not_applied")).sum();
    assert_eq!(processed, total, "{all:?}");
    assert_eq!(not_applied, 0, "{all:?}");

    // The ledger: every child processed once, nothing in conflict.
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE state = 'processed'").await,
        total
    );
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE conflicts IS NOT NULL")
            .await,
        0
    );
    for p in 0..PARENTS {
        let parent = app.get(&format!("/v1/parents/poly-{p}")).await.body;
        assert_eq!(parent["state"], "complete", "{parent}");
        assert_eq!(parent["counts"]["processed"], CHILDREN, "{parent}");
    }
    // The remote side: each idempotency key had its effect exactly once.
    let text = std::fs::read_to_string(&effects).unwrap();
    let mut effects_per_key: HashMap<String, usize> = HashMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let key = serde_json::from_str::<Value>(line)
            .ok()
            .and_then(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .or_else(|| v["key"].as_str().map(str::to_owned))
            })
            .unwrap_or_else(|| line.trim().to_owned());
        *effects_per_key.entry(key).or_default() += 1;
    }
    assert_eq!(
        effects_per_key.len() as i64,
        total,
        "effects recorded for {} keys",
        effects_per_key.len()
    );
    let repeated: Vec<_> = effects_per_key.iter().filter(|(_, n)| **n > 1).collect();
    assert!(repeated.is_empty(), "effects repeated: {repeated:?}");
    eprintln!(
        "{backend:?}: {total} children; round 1 processed {processed_first} and released {released} on SIGTERM; \
         python {} + node {} processed in all",
        all.iter()
            .filter(|s| s["lang"] == "python")
            .map(|s| n(s, "processed"))
            .sum::<i64>(),
        all.iter()
            .filter(|s| s["lang"] == "node")
            .map(|s| n(s, "processed"))
            .sum::<i64>(),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

both_stores!(python_and_node_share_a_queue);
