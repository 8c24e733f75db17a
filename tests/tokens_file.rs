//! The tokens file as operators use it, against the real binary on both
//! stores: tokens minted with `child-ledger token new`, rotation by SIGHUP
//! (a broken file keeps the tokens in force), no token ever in the logs, and
//! an open service that refuses to listen beyond loopback.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::{ServiceProcess, free_port, signal};
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// `child-ledger token new`: the token (first line) and its entry (second).
fn mint(name: &str, role: &str, queues: &[&str]) -> (String, Value) {
    let mut args = vec!["token", "new", "--name", name, "--role", role];
    for queue in queues {
        args.extend(["--queue", queue]);
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(&args)
        .output()
        .expect("token new");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let mut lines = stdout.lines();
    let token = lines.next().unwrap().to_owned();
    let entry: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert!(token.len() >= 32, "at least 128 bits: {token}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains(&token),
        "the token is printed once"
    );
    (token, entry)
}

fn write_tokens(path: &Path, entries: &[&Value]) {
    std::fs::write(path, json!({ "tokens": entries }).to_string()).unwrap();
}

async fn status(base: &str, token: &str) -> StatusCode {
    reqwest::Client::new()
        .get(format!("{base}/v1/parents"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
}

/// Waits (5 s at most) until `token` is answered `want`.
async fn until_status(base: &str, token: &str, want: StatusCode) {
    let started = Instant::now();
    while status(base, token).await != want {
        assert!(started.elapsed() < Duration::from_secs(5), "never {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Rotation: add the new token, SIGHUP, move the clients, remove the old
/// one, SIGHUP. A file that does not read keeps the tokens in force. No
/// token, good or bad, appears in a debug-level log.
async fn sighup_rotates_tokens_and_logs_none(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let dir = std::env::temp_dir().join(format!("child-ledger-tokens-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens.json");
    let (old, old_entry) = mint("ingest-2026-11", "producer", &["events"]);
    let (new, new_entry) = mint("ingest-2026-12", "producer", &["events"]);
    let bad = "clt_not-a-token-this-service-knows";
    write_tokens(&file, &[&old_entry]);
    let service = ServiceProcess::start_with_env(
        "tokens",
        &db.url,
        &["--tokens-file", file.to_str().unwrap()],
        &[("RUST_LOG", "debug")],
    )
    .await;
    service.ready().await;

    assert_eq!(status(&service.base, &old).await, StatusCode::OK);
    assert_eq!(status(&service.base, &new).await, StatusCode::UNAUTHORIZED);
    assert_eq!(status(&service.base, bad).await, StatusCode::UNAUTHORIZED);
    let register = reqwest::Client::new()
        .put(format!("{}/v1/parents/P", service.base))
        .bearer_auth(&old)
        .json(&json!({"queue": "events", "children": children(2)}))
        .send()
        .await
        .unwrap();
    assert_eq!(register.status(), StatusCode::CREATED);

    write_tokens(&file, &[&old_entry, &new_entry]);
    signal(service.pid(), "HUP");
    until_status(&service.base, &new, StatusCode::OK).await;
    assert_eq!(
        status(&service.base, &old).await,
        StatusCode::OK,
        "both during the move"
    );

    write_tokens(&file, &[&new_entry]);
    signal(service.pid(), "HUP");
    until_status(&service.base, &old, StatusCode::UNAUTHORIZED).await;
    assert_eq!(status(&service.base, &new).await, StatusCode::OK);

    for broken in [
        "{\"tokens\": [",
        "{\"tokens\": [{\"name\": \"x\", \"sha256\": \"beef\", \"roles\": [\"admin\"]}]}",
    ] {
        std::fs::write(&file, broken).unwrap();
        signal(service.pid(), "HUP");
        let started = Instant::now();
        while service.log_text().matches("tokens file not reloaded").count() < 1 {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "no error logged:\n{}",
                service.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            status(&service.base, &new).await,
            StatusCode::OK,
            "the tokens in force stay"
        );
        assert_eq!(status(&service.base, &old).await, StatusCode::UNAUTHORIZED);
    }
    assert!(
        service.log_text().matches("tokens file not reloaded").count() >= 2,
        "each broken file is reported"
    );

    let log = service.log_text();
    assert!(log.contains("tokens file reloaded"), "reloads are logged");
    for token in [&old, &new, bad] {
        assert!(!log.contains(token), "a token is in the log");
        assert!(!log.contains(&token[4..20]), "part of a token is in the log");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without a tokens file the service refuses a non-loopback address unless
/// told `--allow-anonymous`; with a tokens file it serves there.
async fn an_open_service_stays_on_loopback(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let run = |extra: &[&str], port: u16| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"));
        command
            .args(["--listen", &format!("0.0.0.0:{port}"), "--database-url", &db.url])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command.spawn().expect("start child-ledger")
    };
    let refused = run(&[], free_port());
    let out = tokio::time::timeout(Duration::from_secs(20), refused.wait_with_output())
        .await
        .expect("an open service on 0.0.0.0 exits at once")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        text.contains("refusing to serve") && text.contains("--tokens-file"),
        "{text}"
    );

    let healthy = |port: u16| async move {
        let started = Instant::now();
        loop {
            let ok = reqwest::get(format!("http://127.0.0.1:{port}/readyz"))
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "not serving on {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let port = free_port();
    let mut anonymous = run(&["--allow-anonymous"], port);
    healthy(port).await;
    anonymous.kill().await.unwrap();

    let (_, entry) = mint("ops", "admin", &[]);
    let file = std::env::temp_dir().join(format!("child-ledger-tokens-{}.json", uuid::Uuid::new_v4()));
    write_tokens(&file, &[&entry]);
    let port = free_port();
    let mut closed = run(&["--tokens-file", file.to_str().unwrap()], port);
    healthy(port).await;
    let r = reqwest::get(format!("http://127.0.0.1:{port}/v1/parents"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    closed.kill().await.unwrap();
    let _ = std::fs::remove_file(&file);

    // A tokens file that does not read stops the start, saying why.
    let broken = std::env::temp_dir().join(format!("child-ledger-tokens-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&broken, "not json").unwrap();
    let out = tokio::time::timeout(
        Duration::from_secs(20),
        run(&["--tokens-file", broken.to_str().unwrap()], free_port()).wait_with_output(),
    )
    .await
    .expect("exits")
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokens file"));
    let _ = std::fs::remove_file(&broken);
}

/// Opens an event stream with `token` and reads its first event (the
/// snapshot); the response is returned to read on.
async fn open_stream(base: &str, path: &str, token: &str) -> reqwest::Response {
    let mut response = reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    let first = tokio::time::timeout(Duration::from_secs(5), response.chunk())
        .await
        .expect("a snapshot at once")
        .unwrap()
        .unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&first).contains("snapshot"),
        "{path}: {first:?}"
    );
    response
}

/// How long until a stream ends (its body closes), reading what it sends.
async fn ends_within(mut response: reqwest::Response, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    loop {
        match tokio::time::timeout(limit.saturating_sub(started.elapsed()), response.chunk()).await {
            Err(_) => return None,
            Ok(Ok(Some(_))) => continue,
            Ok(_) => return Some(started.elapsed()),
        }
    }
}

/// A reload of the tokens file ends, within 1 s, every open event stream,
/// parent or queue, busy or quiet, whose token it no longer grants: one
/// removed from the file, and one narrowed to other queues. A token still
/// granted keeps its streams.
async fn a_reload_ends_the_streams_of_tokens_it_no_longer_grants(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let dir = std::env::temp_dir().join(format!("child-ledger-revoke-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tokens.json");
    let (admin, admin_entry) = mint("ops", "admin", &[]);
    let (revoked, revoked_entry) = mint("dash-old", "reader", &[]);
    let (narrowed, narrowed_entry) = mint("dash-team", "reader", &["events"]);
    let (kept, kept_entry) = mint("dash-kept", "reader", &["events"]);
    write_tokens(&file, &[&admin_entry, &revoked_entry, &narrowed_entry, &kept_entry]);
    let service = ServiceProcess::start("revoke", &db.url, &["--tokens-file", file.to_str().unwrap()]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    for parent in ["P", "Q"] {
        let r = client
            .put(format!("{}/v1/parents/{parent}", service.base))
            .bearer_auth(&admin)
            .json(&json!({"queue": "events", "children": children(3)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let mut closing = Vec::new();
    for token in [&revoked, &narrowed] {
        closing.push(open_stream(&service.base, "/v1/parents/P/events", token).await);
        closing.push(open_stream(&service.base, "/v1/queues/events/events", token).await);
    }
    let staying = [
        open_stream(&service.base, "/v1/parents/P/events", &kept).await,
        open_stream(&service.base, "/v1/queues/events/events", &kept).await,
    ];

    let mut narrowed_entry = narrowed_entry.clone();
    narrowed_entry["queues"] = json!(["billing"]);
    write_tokens(&file, &[&admin_entry, &narrowed_entry, &kept_entry]);
    signal(service.pid(), "HUP");
    // Quiet: nothing changes in the queue after the reload.
    let mut waits = Vec::new();
    for stream in closing {
        waits.push(tokio::spawn(ends_within(stream, Duration::from_millis(1500))));
    }
    for (n, wait) in waits.into_iter().enumerate() {
        let ended = wait.await.unwrap();
        eprintln!("stream {n} ended after {ended:?}");
        let ended = ended.unwrap_or_else(|| panic!("stream {n} of an ungranted token stayed open after the reload"));
        assert!(ended <= Duration::from_secs(1), "stream {n} ended after {ended:?}");
    }
    for stream in staying {
        assert_eq!(
            ends_within(stream, Duration::from_millis(300)).await,
            None,
            "a granted token's stream ended"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

both_stores!(
    sighup_rotates_tokens_and_logs_none,
    an_open_service_stays_on_loopback,
    a_reload_ends_the_streams_of_tokens_it_no_longer_grants
);
