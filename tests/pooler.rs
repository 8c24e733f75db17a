//! Replicas behind PgBouncer in transaction mode (`--db-pooler transaction`).
//! The chaos workload through it is `tests/chaos.rs::postgres_through_pgbouncer`;
//! here: long polls that wake across replicas through the direct `LISTEN`
//! URL, and without it on their recheck (said once at startup); migrations,
//! which need a direct session; and the startup errors no retry can fix.
//! Postgres only: SQLite has no pooler.

mod common;

use std::time::{Duration, Instant};

use common::pgbouncer::PgBouncer;
use common::process::ServiceProcess;
use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// The pooler in front of the test Postgres and a fresh database (dropped
/// with the value), or `None` when the Postgres half is skipped.
async fn setup() -> Option<(PgBouncer, TestDatabase)> {
    if !postgres_available().await {
        return None;
    }
    let bouncer = pgbouncer().await?;
    Some((bouncer, TestDatabase::new(Backend::Postgres).await))
}

fn pooled<'a>(direct: Option<&'a str>, extra: &[&'a str]) -> Vec<&'a str> {
    let mut flags = vec!["--db-pooler", "transaction"];
    if let Some(direct) = direct {
        flags.extend(["--listen-database-url", direct]);
    }
    flags.extend(extra);
    flags
}

/// Registers a one-child parent on `base`'s queue `queue`.
async fn register(client: &reqwest::Client, base: &str, parent: &str, queue: &str) {
    let r = client
        .put(format!("{base}/v1/parents/{parent}"))
        .json(&json!({"queue": queue, "children": [{"payload": {"n": 1}}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
}

/// A long poll on `waiter` for `queue`, and a registration on `other` after
/// 300 ms: how long after the registration the poll was answered, with what.
async fn woken_after(waiter: &str, other: &str, queue: &str, wait_seconds: u64) -> (Duration, Value) {
    let client = reqwest::Client::new();
    let poll = {
        let client = client.clone();
        let url = format!("{waiter}/v1/queues/{queue}/claims");
        tokio::spawn(async move {
            let r = client
                .post(url)
                .json(&json!({"limit": 5, "lease_seconds": 30, "worker": "poller", "wait_seconds": wait_seconds}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            (Instant::now(), r.json::<Value>().await.unwrap())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    register(&client, other, &format!("{queue}-parent"), queue).await;
    let registered = Instant::now();
    let (answered, body) = poll.await.unwrap();
    (answered.saturating_duration_since(registered), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn long_polls_wake_across_replicas_through_the_direct_listen_url() {
    let Some((bouncer, database)) = setup().await else {
        return;
    };
    let direct = database.url.clone();
    let via_pooler = bouncer.url_for(&direct);
    // A recheck far longer than the poll: only a notification can wake it in time.
    let flags = pooled(Some(&direct), &["--wait-recheck-ms", "60000"]);
    let a = ServiceProcess::start("pooler-a", &via_pooler, &flags).await;
    a.ready().await;
    let b = ServiceProcess::start("pooler-b", &via_pooler, &flags).await;
    b.ready().await;
    for (waiter, other, queue) in [(&a, &b, "wake-ab"), (&b, &a, "wake-ba")] {
        let (after, body) = woken_after(&waiter.base, &other.base, queue, 15).await;
        eprintln!("{queue}: the long poll was answered {after:?} after the other replica's registration");
        assert_eq!(body["children"].as_array().map(Vec::len), Some(1), "{body}");
        assert!(after < Duration::from_secs(3), "woken only after {after:?}: {body}");
    }
    assert!(!a.log_text().contains("without --listen-database-url"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_direct_url_migrations_are_refused_and_long_polls_recheck() {
    let Some((bouncer, database)) = setup().await else {
        return;
    };
    let direct = database.url.clone();
    let via_pooler = bouncer.url_for(&direct);

    // Migrations need a session: through the pooler alone the service says
    // what to do, and exits, writing nothing.
    let mut refused = ServiceProcess::start("pooler-unmigrated", &via_pooler, &pooled(None, &[])).await;
    let status = refused.exited(Duration::from_secs(30)).await;
    assert!(!status.success());
    let log = refused.log_text();
    assert!(log.contains("child-ledger migrate"), "{log}");
    assert!(log.contains("--listen-database-url"), "{log}");
    let db = common::raw::RawDb::connect(&direct).await;
    assert!(
        db.count_raw("SELECT count(*) FROM _sqlx_migrations").await.is_err(),
        "something was migrated through the pooler"
    );

    // `child-ledger migrate` straight to Postgres, then the service starts
    // through the pooler alone.
    let migrate = std::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(["migrate", "--database-url", &direct])
        .output()
        .unwrap();
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));
    // Both at once: each creates the functions that wrap the hot statements
    // (see `PgDb::wrap_hot_statements`), and the one that loses goes on.
    let flags = pooled(None, &["--wait-recheck-ms", "1000"]);
    let a = ServiceProcess::start("pooler-recheck-a", &via_pooler, &flags).await;
    let b = ServiceProcess::start("pooler-recheck-b", &via_pooler, &flags).await;
    a.ready().await;
    b.ready().await;
    assert_eq!(
        db.count_raw("SELECT count(*) FROM pg_proc WHERE proname LIKE 'child\\_ledger\\_stmt\\_%'")
            .await
            .unwrap(),
        6,
        "the lane claim, the queue lanes (each of a queue's four orders) and the outcome statement are wrapped once"
    );
    let said = a.log_text().matches("without --listen-database-url").count();
    assert_eq!(said, 1, "the missing LISTEN is said once at startup: {}", a.log_text());
    let (after, body) = woken_after(&a.base, &b.base, "recheck", 15).await;
    eprintln!("without LISTEN, the long poll was answered {after:?} after the other replica's registration");
    assert_eq!(body["children"].as_array().map(Vec::len), Some(1), "{body}");
    assert!(
        after < Duration::from_secs(3),
        "not even the recheck woke it: {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn startup_errors_no_retry_can_fix_end_the_process_with_what_to_change() {
    let Some((bouncer, database)) = setup().await else {
        return;
    };
    let direct = database.url.clone();
    let via_pooler = bouncer.url_for(&direct);

    // PgBouncer refuses the startup parameters of a direct connection.
    let mut direct_mode = ServiceProcess::start("pooler-refused", &via_pooler, &[]).await;
    let started = Instant::now();
    let status = direct_mode.exited(Duration::from_secs(20)).await;
    let log = direct_mode.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("unsupported startup parameter"), "{log}");
    assert!(log.contains("--db-pooler transaction"), "{log}");
    assert!(!log.contains("retrying"), "a permanent error was retried: {log}");
    eprintln!(
        "a direct-mode service behind PgBouncer exits after {:?}",
        started.elapsed()
    );

    // `migrate` and `reconcile` say the same fix, once, and exit.
    for command in [&["migrate"][..], &["reconcile"]] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
            .args(command)
            .args(["--database-url", &via_pooler])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{command:?}: {stderr}");
        assert!(
            stderr.starts_with("Error: cannot use the database:"),
            "{command:?}: {stderr}"
        );
        assert!(stderr.contains("--db-pooler transaction"), "{command:?}: {stderr}");
        assert_eq!(
            stderr.matches("unsupported startup parameter").count(),
            1,
            "{command:?}: the refusal is said once: {stderr}"
        );
    }

    // A database that does not exist, through the pooler.
    let missing = bouncer.url_for(&format!("{}/no_such_database", direct.rsplit_once('/').unwrap().0));
    let mut unknown = ServiceProcess::start("pooler-unknown-db", &missing, &pooled(Some(&direct), &[])).await;
    let status = unknown.exited(Duration::from_secs(20)).await;
    let log = unknown.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("cannot use the database"), "{log}");
    assert!(!log.contains("retrying"), "a permanent error was retried: {log}");

    // A direct URL without the pooler mode is a configuration error.
    let mut misplaced = ServiceProcess::start("pooler-misplaced", &direct, &["--listen-database-url", &direct]).await;
    let status = misplaced.exited(Duration::from_secs(20)).await;
    let log = misplaced.log_text();
    assert!(!status.success(), "{log}");
    assert!(log.contains("only for --db-pooler transaction"), "{log}");
}
