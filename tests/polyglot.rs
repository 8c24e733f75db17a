//! The example workers, in Python, Node and TypeScript, run side by side on
//! one queue: first interrupted with SIGTERM (they must give back what they
//! hold), then to the end. Every child is processed exactly once, by the
//! ledger and on the "remote side" (the shared effects file), and every
//! language does work.
//!
//! The TypeScript worker is compiled here with `tsc --strict` against the
//! types openapi-typescript generates from openapi/openapi.json (`.ci/clients`
//! installs tsc and writes them to `target/clients/typescript`). Without them
//! it is left out with a loud message (Python and Node still run), and the
//! test fails when `CI=true` or `LEDGER_REQUIRE_POSTGRES=1`.

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

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One example worker: its language, and the program and script that run it.
struct Example {
    lang: &'static str,
    program: &'static str,
    script: PathBuf,
}

/// The examples to run: Python and Node, and TypeScript compiled into `dir`
/// when the generated types and tsc are there.
async fn examples(dir: &Path) -> Vec<Example> {
    let mut examples = vec![
        Example {
            lang: "python",
            program: "python3",
            script: root().join("examples/python/worker.py"),
        },
        Example {
            lang: "node",
            program: "node",
            script: root().join("examples/node/worker.mjs"),
        },
    ];
    if let Some(script) = compile_typescript(dir).await {
        examples.push(Example {
            lang: "typescript",
            program: "node",
            script,
        });
    }
    examples
}

/// Compiles examples/typescript/worker.ts with `tsc --strict` (its
/// tsconfig.json) into `dir`; `None`, after a loud message, when the generated
/// types or tsc are missing and nothing requires them.
async fn compile_typescript(dir: &Path) -> Option<PathBuf> {
    let generated = root().join("target/clients/typescript");
    let tsc = generated.join("node_modules/.bin/tsc");
    let needed = [
        tsc.clone(),
        generated.join("ledger.d.ts"),
        generated.join("node_modules/@types/node/package.json"),
    ];
    if let Some(missing) = needed.iter().find(|path| !path.exists()) {
        missing_tool(
            &format!(
                "{} is missing: run .ci/clients to generate the TypeScript types and install tsc",
                missing.display()
            ),
            "the TypeScript worker is (Python and Node still run)",
        );
        return None;
    }
    let out = dir.join("typescript");
    let output = Command::new(&tsc)
        .arg("-p")
        .arg(root().join("examples/typescript"))
        .arg("--outDir")
        .arg(&out)
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", tsc.display()));
    assert!(
        output.status.success(),
        "tsc --strict refuses examples/typescript/worker.ts:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The compiled worker is an ES module (top-level await), as worker.mjs is.
    std::fs::write(out.join("package.json"), r#"{"private": true, "type": "module"}"#).unwrap();
    Some(out.join("worker.js"))
}

/// Starts one worker with a worker token (Python takes it as `--token`, Node
/// and TypeScript from `LEDGER_TOKEN`: the two ways the examples accept it);
/// `extra` adds flags after the common ones.
fn worker(example: &Example, base: &str, token: &str, effects: &Path, extra: &[&str]) -> Child {
    let Example { lang, program, script } = example;
    let mut command = Command::new(program);
    command.arg(script);
    if *lang == "python" {
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

async fn example_workers_share_a_queue(backend: Backend) {
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
    let examples = examples(&dir).await;

    // Round 1: all start slowly and are told to stop part way through.
    let slow = ["--work-ms", "5", "--wait-seconds", "1"];
    let running: Vec<Child> = examples
        .iter()
        .map(|e| worker(e, &app.base, &worker_token, &effects, &slow))
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while app.count("SELECT count(*) FROM child WHERE state = 'processed'").await < total / 5 {
        assert!(tokio::time::Instant::now() < deadline, "the workers made no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.iter().for_each(sigterm);
    let mut first = Vec::new();
    for (example, child) in examples.iter().zip(running) {
        first.push(summary(example.lang, child).await);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM child WHERE state = 'in_flight'").await,
        0,
        "SIGTERM left children leased: {first:?}"
    );
    let released: i64 = first.iter().map(|s| n(s, "released")).sum();
    let processed_first: i64 = first.iter().map(|s| n(s, "processed")).sum();
    assert!(processed_first < total, "round 1 was not interrupted: {first:?}");

    // Round 2: all drain the queue and exit when it is empty.
    let drain = ["--exit-when-empty", "--work-ms", "1"];
    let running: Vec<Child> = examples
        .iter()
        .map(|e| worker(e, &app.base, &worker_token, &effects, &drain))
        .collect();
    let mut second = Vec::new();
    for (example, child) in examples.iter().zip(running) {
        second.push(summary(example.lang, child).await);
    }

    let all: Vec<&Value> = first.iter().chain(&second).collect();
    let processed_by = |lang: &str| -> i64 {
        all.iter()
            .filter(|s| s["lang"] == lang)
            .map(|s| n(s, "processed"))
            .sum()
    };
    for example in &examples {
        let lang = example.lang;
        assert!(processed_by(lang) > 0, "the {lang} worker processed nothing: {all:?}");
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
    let by_lang: Vec<String> = examples
        .iter()
        .map(|e| format!("{} {}", e.lang, processed_by(e.lang)))
        .collect();
    eprintln!(
        "{backend:?}: {total} children; round 1 processed {processed_first} and released {released} on SIGTERM; \
         processed in all: {}",
        by_lang.join(", ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

both_stores!(example_workers_share_a_queue);
