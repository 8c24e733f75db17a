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
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::examples::{Example, examples};
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

const PARENTS: usize = 6;
const CHILDREN: usize = 100;
const QUEUE: &str = "polyglot";

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
    while app
        .count("SELECT count(*) FROM child_status WHERE state = 'processed'")
        .await
        < total / 5
    {
        assert!(tokio::time::Instant::now() < deadline, "the workers made no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    running.iter().for_each(sigterm);
    let mut first = Vec::new();
    for (example, child) in examples.iter().zip(running) {
        first.push(summary(example.lang, child).await);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM child_status WHERE state = 'in_flight'")
            .await,
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
        app.count("SELECT count(*) FROM child_status WHERE state = 'processed'")
            .await,
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

/// Runs one example worker with `args` (and `env`) to its end, within
/// `within`: its exit status, how long it ran, and its stderr.
async fn run_to_end(
    example: &Example,
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> (std::process::ExitStatus, Duration, String) {
    let started = std::time::Instant::now();
    let child = Command::new(example.program)
        .arg(&example.script)
        .args(args)
        .env_remove("LEDGER_TOKEN")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} (needed for the {} worker): {e}",
                example.program, example.lang
            )
        });
    let output = tokio::time::timeout(within, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the {} worker still ran after {within:?} ({args:?})", example.lang))
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status, started.elapsed(), stderr)
}

/// What retrying cannot fix stops every example worker at once, non-zero,
/// saying why: a token the service does not know (401), a token that cannot
/// go in a header (the README's old `LEDGER_TOKEN=…` placeholder), a
/// `--limit` past the service's bound (422).
#[tokio::test]
async fn workers_stop_at_once_on_what_cannot_get_better() {
    /// One way to start a worker that must stop at once, and what it must say.
    struct FailFast<'a> {
        case: &'a str,
        args: &'a [&'a str],
        env: &'a [(&'a str, &'a str)],
        says: &'a str,
    }
    let (worker_token, worker_entry) = token("fail-fast", &[Role::Worker], &[]);
    let app = spawn_app_with_tokens(Backend::Sqlite, json!([worker_entry])).await;
    let dir = std::env::temp_dir().join(format!("child-ledger-fail-fast-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut report = Vec::new();
    for example in &examples(&dir).await {
        let lang = example.lang;
        let common = ["--url", app.base.as_str(), "--queue", QUEUE, "--exit-when-empty"];
        let unknown = [&common[..], &["--token", "not-a-token-the-service-knows"]].concat();
        let too_many = [&common[..], &["--token", worker_token.as_str(), "--limit", "5000"]].concat();
        let non_ascii = [("LEDGER_TOKEN", "\u{2026}")];
        let cases = [
            FailFast {
                case: "unknown token",
                args: &unknown,
                env: &[],
                says: "401",
            },
            FailFast {
                case: "non-ASCII token",
                args: &common,
                env: &non_ascii,
                says: "token",
            },
            FailFast {
                case: "--limit 5000",
                args: &too_many,
                env: &[],
                says: "422",
            },
        ];
        for FailFast { case, args, env, says } in cases {
            let (status, took, stderr) = run_to_end(example, args, env, Duration::from_secs(20)).await;
            assert!(!status.success(), "{lang}, {case}: exited 0\n{stderr}");
            assert!(took < Duration::from_secs(5), "{lang}, {case}: took {took:?}\n{stderr}");
            assert!(
                stderr.contains(says),
                "{lang}, {case}: stderr does not say {says:?}:\n{stderr}"
            );
            assert!(
                !stderr.contains("retrying"),
                "{lang}, {case}: retried what cannot get better:\n{stderr}"
            );
            report.push(format!("{lang} {case}: {} in {:.2} s", status, took.as_secs_f64()));
        }
    }
    eprintln!("{}", report.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in for the service on `port`: it answers claims with `statuses` in
/// turn (each with `Retry-After: 0`), then with an empty claim, and counts
/// every request it was sent.
async fn flaky_service(
    listener: tokio::net::TcpListener,
    statuses: Vec<u16>,
    seen: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut statuses = statuses.into_iter();
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        let mut request = Vec::new();
        let mut buf = [0u8; 4096];
        // The head, then as much body as it announces.
        let head_end = loop {
            let n = socket.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break None;
            }
            request.extend_from_slice(&buf[..n]);
            if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                break Some(at + 4);
            }
        };
        let Some(head_end) = head_end else { continue };
        let head = String::from_utf8_lossy(&request[..head_end]).into_owned();
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        while request.len() < head_end + length {
            let n = socket.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            request.extend_from_slice(&buf[..n]);
        }
        let line = head.lines().next().unwrap_or("").to_owned();
        seen.lock().unwrap().push(line.clone());
        let refused = if line.contains("/claims") {
            statuses.next()
        } else {
            None
        };
        let (status, body) = match refused {
            Some(status) => (
                status,
                json!({"type": "/problems/database-unavailable", "title": "try again", "status": status}).to_string(),
            ),
            None => (
                200,
                json!({"claim_id": uuid::Uuid::new_v4(), "lease_expires_at": "2026-12-01T00:00:00Z", "children": []})
                    .to_string(),
            ),
        };
        let content_type = if status == 200 {
            "application/json"
        } else {
            "application/problem+json"
        };
        let answer = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nretry-after: 0\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(answer.as_bytes()).await;
        let _ = socket.shutdown().await;
    }
}

/// What can get better is retried: every example worker started before the
/// service listens (the service starts once the worker says its connection
/// was refused), then answered 503, 503 and 429, keeps claiming and ends
/// normally (`--exit-when-empty`) once a claim is answered.
#[tokio::test]
async fn workers_retry_what_can_get_better() {
    let dir = std::env::temp_dir().join(format!("child-ledger-retry-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut report = Vec::new();
    for example in &examples(&dir).await {
        let lang = example.lang;
        let port = common::process::free_port();
        let url = format!("http://127.0.0.1:{port}");
        let args = ["--url", url.as_str(), "--queue", QUEUE, "--exit-when-empty"];
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let started = std::time::Instant::now();
        let mut child = Command::new(example.program)
            .arg(&example.script)
            .args(args)
            .env_remove("LEDGER_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} for the {lang} worker: {e}", example.program));
        let mut lines = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
        // Nobody listens until the worker says its connection was refused.
        let mut stderr = String::new();
        while !stderr.to_lowercase().contains("refused") {
            let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("{lang}: no refused connection within 20 s:\n{stderr}"))
                .unwrap()
                .unwrap_or_else(|| panic!("{lang}: exited before a refused connection:\n{stderr}"));
            stderr.push_str(&line);
            stderr.push('\n');
        }
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let service = tokio::spawn(flaky_service(listener, vec![503, 503, 429], seen.clone()));
        let rest = tokio::time::timeout(Duration::from_secs(30), async {
            let mut rest = String::new();
            while let Some(line) = lines.next_line().await.unwrap() {
                rest.push_str(&line);
                rest.push('\n');
            }
            (child.wait().await.unwrap(), rest)
        })
        .await;
        let (status, rest) = rest.unwrap_or_else(|_| panic!("{lang}: still running 30 s after the service listened"));
        stderr.push_str(&rest);
        let took = started.elapsed();
        service.abort();
        let seen = seen.lock().unwrap().clone();
        assert!(status.success(), "{lang}: {status}\n{stderr}\nrequests: {seen:?}");
        let claims = seen
            .iter()
            .filter(|l| l.starts_with("POST") && l.contains("/claims"))
            .count();
        assert_eq!(
            claims, 4,
            "{lang}: 503, 503, 429, then the empty claim: {seen:?}\n{stderr}"
        );
        assert!(stderr.contains("503") && stderr.contains("429"), "{lang}:\n{stderr}");
        report.push(format!(
            "{lang}: {claims} claims, exit 0 after {:.2} s",
            took.as_secs_f64()
        ));
    }
    eprintln!("{}", report.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
