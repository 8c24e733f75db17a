//! The database URL as operators get it wrong or right: TLS to Postgres
//! (`sslmode=require`) works, and an error no retry can fix (an unknown
//! database, user, or TLS the server does not speak) ends the process at once
//! saying what to change, instead of retrying forever as "not reachable".

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::process::{ServiceProcess, free_port};
use common::*;

/// Runs the service on `url`; its exit output, or `None` if still running after 20 s.
async fn exits_with(url: &str) -> Option<(bool, String)> {
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port()), "--database-url", url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
        .await
        .ok()?
        .unwrap();
    println!("exited after {:?}", started.elapsed());
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

fn with_query(url: &str, query: &str) -> String {
    format!("{url}{}{query}", if url.contains('?') { '&' } else { '?' })
}

#[tokio::test]
async fn permanent_database_errors_end_the_process() {
    if !postgres_available().await {
        return;
    }
    let db = TestDatabase::new(Backend::Postgres).await;
    let root = db.url.rsplit_once('/').unwrap().0.to_owned();
    let unknown_database = format!("{root}/no_such_ledger_database");
    let (ok, text) = exits_with(&unknown_database)
        .await
        .expect("an unknown database ends the process");
    assert!(
        !ok && text.contains("does not exist") && text.contains("createdb"),
        "{text}"
    );

    let unknown_user = db.url.replacen("postgres@", "no_such_ledger_user@", 1);
    assert_ne!(unknown_user, db.url);
    let (ok, text) = exits_with(&unknown_user)
        .await
        .expect("an unknown user ends the process");
    assert!(!ok && text.contains("refused the connection"), "{text}");
}

/// With the server's TLS on, `sslmode=require` connects over TLS; with it
/// off, the same URL ends the process at once naming TLS.
#[tokio::test]
async fn postgres_over_tls() {
    if !postgres_available().await {
        return;
    }
    let db = TestDatabase::new(Backend::Postgres).await;
    let raw = db.store().await;
    let url = with_query(&db.url, "sslmode=require");
    let server_tls = raw
        .count_raw("SELECT CAST(CASE WHEN current_setting('ssl') = 'on' THEN 1 ELSE 0 END AS BIGINT)")
        .await
        .unwrap()
        == 1;
    if !server_tls {
        eprintln!("this Postgres has ssl = off: checking that sslmode=require is refused at once");
        let (ok, text) = exits_with(&url).await.expect("TLS refused ends the process");
        assert!(!ok && text.contains("TLS"), "{text}");
        return;
    }
    let service = ServiceProcess::start("tls", &url, &[]).await;
    service.ready().await;
    let name = db.url.rsplit('/').next().unwrap().to_owned();
    let (tls, plain) = (
        raw.count_raw(&format!(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = '{name}' AND s.ssl"
        ))
        .await
        .unwrap(),
        raw.count_raw(&format!(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.datname = '{name}' AND NOT s.ssl AND a.application_name <> 'psql' AND a.backend_type = 'client backend' \
               AND a.pid <> pg_backend_pid()"
        ))
        .await
        .unwrap(),
    );
    println!("service connections over TLS: {tls}; without: {plain} (the test's own)");
    assert!(tls >= 1, "the service's connections are not TLS");
}

/// Processes starting together on one new SQLite file all become ready: the
/// migrations are applied once, the others wait and find them applied.
#[tokio::test]
async fn processes_starting_on_one_new_sqlite_file_all_start() {
    for round in 0..5 {
        let db = TestDatabase::new(Backend::Sqlite).await;
        let services = [
            ServiceProcess::start("sqlite-a", &db.url, &[]).await,
            ServiceProcess::start("sqlite-b", &db.url, &[]).await,
            ServiceProcess::start("sqlite-c", &db.url, &[]).await,
        ];
        for service in &services {
            service.ready().await;
        }
        let migrations = db
            .store()
            .await
            .count_raw("SELECT count(*) FROM _sqlx_migrations")
            .await
            .unwrap();
        println!("round {round}: 3 processes ready on one new file, {migrations} migrations applied once each");
        assert_eq!(
            migrations,
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/sqlite"))
                .unwrap()
                .count() as i64
        );
    }
}

/// Several hosts, as libpq writes them: a host that is down, first in the
/// list, is passed by, and the service serves from the next; an unsupported
/// `target_session_attrs` ends the process at once, naming it.
#[tokio::test]
async fn a_host_down_first_in_the_list_is_passed_by() {
    if !postgres_available().await {
        return;
    }
    let db = TestDatabase::new(Backend::Postgres).await;
    let (scheme_user, rest) = db.url.split_once('@').unwrap();
    let (host, database) = rest.split_once('/').unwrap();
    let dead = format!("127.0.0.1:{}", free_port());
    let url = format!("{scheme_user}@{dead},{host}/{database}");
    let service = ServiceProcess::start("two-hosts", &url, &[]).await;
    service.ready().await;
    let client = reqwest::Client::new();
    let r = client
        .put(format!("{}/v1/parents/H-1", service.base))
        .json(&serde_json::json!({"queue": "hosts", "children": children(3)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let r = client
        .post(format!("{}/v1/queues/hosts/claims", service.base))
        .json(&serde_json::json!({"limit": 10}))
        .send()
        .await
        .unwrap();
    let claim: serde_json::Value = r.json().await.unwrap();
    assert_eq!(claim["children"].as_array().unwrap().len(), 3, "{claim}");

    let (ok, text) = exits_with(&with_query(&url, "target_session_attrs=standby"))
        .await
        .expect("an unsupported target_session_attrs ends the process");
    assert!(!ok && text.contains("target_session_attrs=standby"), "{text}");
}

/// The same through a transaction pooler fronting each host, with the
/// direct URL for `LISTEN` and migrations given as several hosts too: the
/// service serves from the pooler of the host that answers, and listens on
/// the direct one.
#[tokio::test]
async fn through_a_pooler_each_host_in_the_list() {
    let Some(bouncer) = common::pgbouncer().await else {
        return;
    };
    let db = TestDatabase::new(Backend::Postgres).await;
    let dead_first = |url: &str| {
        let (scheme_user, rest) = url.split_once('@').unwrap();
        let (host, database) = rest.split_once('/').unwrap();
        format!("{scheme_user}@127.0.0.1:{},{host}/{database}", free_port())
    };
    let pooled = dead_first(&bouncer.url_for(&db.url));
    let direct = dead_first(&db.url);
    let service = ServiceProcess::start(
        "pooled-hosts",
        &pooled,
        &["--db-pooler", "transaction", "--listen-database-url", &direct],
    )
    .await;
    service.ready().await;
    let client = reqwest::Client::new();
    let ready: serde_json::Value = client
        .get(format!("{}/readyz", service.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["host"], format!("127.0.0.1:{}", bouncer.port), "{ready}");
    let r = client
        .put(format!("{}/v1/parents/PH-1", service.base))
        .json(&serde_json::json!({"queue": "pooled-hosts", "children": children(3)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), reqwest::StatusCode::CREATED);
    let r = client
        .post(format!("{}/v1/queues/pooled-hosts/claims", service.base))
        .json(&serde_json::json!({"limit": 10}))
        .send()
        .await
        .unwrap();
    let claim: serde_json::Value = r.json().await.unwrap();
    assert_eq!(claim["children"].as_array().unwrap().len(), 3, "{claim}");
    let log = service.log_text();
    assert!(!log.contains("cannot listen for work"), "LISTEN found its host: {log}");
}

/// A database that turns read-only under the service (as a primary demoted
/// by a failover does) is answered `503` with `Retry-After`, never `500`;
/// writable again, it is served again without a restart.
#[tokio::test]
async fn a_read_only_database_is_503_not_500() {
    if !postgres_available().await {
        return;
    }
    let db = TestDatabase::new(Backend::Postgres).await;
    let database = db.url.rsplit('/').next().unwrap().to_owned();
    let service = ServiceProcess::start("read-only", &db.url, &[]).await;
    service.ready().await;
    let store = db.store().await;
    let reconnect_all = |setting: &'static str| {
        let (store, database) = (&store, database.clone());
        async move {
            store
                .execute_raw(&format!(
                    "BEGIN READ WRITE; ALTER DATABASE \"{database}\" {setting}; COMMIT"
                ))
                .await
                .unwrap();
            store
                .execute_raw(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = '{database}' AND pid <> pg_backend_pid()"
                ))
                .await
                .unwrap();
        }
    };
    reconnect_all("SET default_transaction_read_only = on").await;
    let client = reqwest::Client::new();
    let register = |parent: &'static str| {
        client
            .put(format!("{}/v1/parents/{parent}", service.base))
            .json(&serde_json::json!({"queue": "ro", "children": children(2)}))
            .send()
    };
    let mut refused = 0;
    for _ in 0..5 {
        let r = register("RO-1").await.unwrap();
        let status = r.status();
        let retry_after = r.headers().get("retry-after").is_some();
        let body = r.text().await.unwrap();
        assert_eq!(status, reqwest::StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(retry_after, "a 503 carries Retry-After: {body}");
        refused += 1;
    }
    reconnect_all("RESET default_transaction_read_only").await;
    let started = Instant::now();
    loop {
        let status = register("RO-1").await.unwrap().status();
        if status == reqwest::StatusCode::CREATED {
            break;
        }
        assert_eq!(status, reqwest::StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still refused when writable again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "read-only: {refused} writes answered 503; writable again, served after {:?}",
        started.elapsed()
    );
}
