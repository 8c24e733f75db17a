//! Test harness: every behaviour test starts the real service on port 0 against a
//! fresh database (a new Postgres database or a new SQLite file) and talks HTTP.
#![allow(dead_code)]

pub mod cluster;
pub mod examples;
pub mod pgbouncer;
pub mod process;
pub mod raw;

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub use child_ledger::access::Role;
use child_ledger::access::{Access, TokenSet};
use child_ledger::config::{Cli, Command, Config, Limits};
use child_ledger::startup::{Application, Stopper};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use sqlx::Connection;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Declares `mod name { sqlite, postgres }` test pairs that run the same async fn
/// `name(Backend)` against both stores.
#[macro_export]
macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    if $crate::common::postgres_available().await {
                        super::$name($crate::common::Backend::Postgres).await
                    }
                }
            }
        )*
    };
}

fn admin_url() -> String {
    std::env::var("LEDGER_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub fn postgres_required() -> bool {
    std::env::var("LEDGER_REQUIRE_POSTGRES").is_ok_and(|v| v == "1" || v == "true")
        || std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A tool a test needs is missing: a failure when the suite must run whole
/// (`LEDGER_REQUIRE_POSTGRES=1` or `CI=true`), otherwise announced on stderr,
/// past the test capture, with what is `skipped`; the caller then skips it.
pub fn missing_tool(message: &str, skipped: &str) {
    assert!(
        !postgres_required(),
        "{message} (required under CI=true or LEDGER_REQUIRE_POSTGRES=1)"
    );
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {message}: {skipped} SKIPPED. Set LEDGER_REQUIRE_POSTGRES=1 to make that a failure. ***\n"
    );
}

/// Server connections per database of the tests' PgBouncer: far fewer than
/// two replicas' 16 clients each, so clients share them.
pub const PGBOUNCER_SERVER_POOL: u32 = 4;

/// PgBouncer in transaction mode in front of the test Postgres; `None` when
/// it is missing and nothing requires it (see `missing_tool`).
pub async fn pgbouncer() -> Option<pgbouncer::PgBouncer> {
    match pgbouncer::PgBouncer::start(&admin_url(), Some(PGBOUNCER_SERVER_POOL)).await {
        Ok(bouncer) => Some(bouncer),
        Err(message) => {
            missing_tool(&message, "the connection-pooler tests are");
            None
        }
    }
}

/// Whether the Postgres half of the suite can run. When Postgres is required
/// (`LEDGER_REQUIRE_POSTGRES=1` or `CI=true`) a missing server fails the test;
/// otherwise the skip is announced once on stderr, past the test capture.
pub async fn postgres_available() -> bool {
    static REACHABLE: tokio::sync::OnceCell<bool> = tokio::sync::OnceCell::const_new();
    let reachable = *REACHABLE
        .get_or_init(|| async {
            matches!(
                tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&admin_url())).await,
                Ok(Ok(_))
            )
        })
        .await;
    if reachable {
        return true;
    }
    if postgres_required() {
        panic!(
            "Postgres is required (LEDGER_REQUIRE_POSTGRES/CI) but {} does not answer",
            admin_url()
        );
    }
    static ANNOUNCED: OnceLock<()> = OnceLock::new();
    ANNOUNCED.get_or_init(|| {
        let _ = writeln!(
            std::io::stderr(),
            "\n*** Postgres at {} does not answer: the Postgres half of the suite is SKIPPED. \
             Set LEDGER_REQUIRE_POSTGRES=1 to make that a failure. ***\n",
            admin_url()
        );
    });
    false
}

pub struct TestApp {
    pub backend: Backend,
    pub base: String,
    pub client: reqwest::Client,
    pub database_url: String,
    /// Sent as `Authorization: Bearer` by `request`, `get`, `put`, `post` and `raw`.
    pub token: Option<String>,
    access: Arc<Access>,
    db: raw::RawDb,
    /// The service, as `main` runs it (`startup::Application`).
    service: tokio::task::JoinHandle<()>,
    stopper: Stopper,
    owns_database: bool,
    _dir: Option<TempDir>,
}

/// A scratch directory removed on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Creates a fresh, empty Postgres database and returns its URL.
pub async fn create_database() -> String {
    let name = format!("ledger_test_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(&admin_url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut admin)
        .await
        .unwrap();
    let base = admin_url();
    let root = base.rsplit_once('/').map(|(root, _)| root).unwrap_or(&base);
    format!("{root}/{name}")
}

/// A database for a test that runs the service as a process: a fresh Postgres
/// database, or a SQLite file in a fresh directory; dropped with the value.
pub struct TestDatabase {
    pub backend: Backend,
    pub url: String,
    _dir: Option<TempDir>,
}

impl TestDatabase {
    pub async fn new(backend: Backend) -> Self {
        match backend {
            Backend::Sqlite => {
                let dir = std::env::temp_dir().join(format!("child-ledger-test-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&dir).unwrap();
                let url = format!("sqlite://{}", dir.join("ledger.db").display());
                Self {
                    backend,
                    url,
                    _dir: Some(TempDir(dir)),
                }
            }
            Backend::Postgres => Self {
                backend,
                url: create_database().await,
                _dir: None,
            },
        }
    }

    /// A connection to this database, for looking at the rows directly.
    pub async fn store(&self) -> raw::RawDb {
        raw::RawDb::connect(&self.url).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        if self.backend == Backend::Postgres {
            drop_database(&self.url);
        }
    }
}

/// Drops a test's Postgres database (FORCE ends connections still open).
fn drop_database(url: &str) {
    let name = url.rsplit('/').next().unwrap_or_default().to_owned();
    let dropped = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            if let Ok(mut admin) = sqlx::PgConnection::connect(&admin_url()).await {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&mut admin)
                .await;
            }
        })
    });
    let _ = dropped.join();
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, Limits::default()).await
}

pub async fn spawn_app_with(backend: Backend, limits: Limits) -> TestApp {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
        ))
        .with_test_writer()
        .try_init();
    let (database_url, dir) = new_database(backend).await;
    start_app(backend, database_url, dir, limits, Arc::new(Access::open()), true).await
}

/// An app that knows only the tokens of `entries` (the `tokens` list of a
/// tokens file); its requests carry no token until one is set.
pub async fn spawn_app_with_tokens(backend: Backend, entries: Value) -> TestApp {
    let tokens = TokenSet::parse(&serde_json::json!({ "tokens": entries }).to_string()).expect("tokens");
    let (database_url, dir) = new_database(backend).await;
    start_app(
        backend,
        database_url,
        dir,
        Limits::default(),
        Arc::new(Access::from_tokens(tokens)),
        true,
    )
    .await
}

/// As `spawn_app_with_tokens`, with these limits.
pub async fn spawn_app_with_tokens_and_limits(backend: Backend, entries: Value, limits: Limits) -> TestApp {
    let tokens = TokenSet::parse(&serde_json::json!({ "tokens": entries }).to_string()).expect("tokens");
    let (database_url, dir) = new_database(backend).await;
    start_app(
        backend,
        database_url,
        dir,
        limits,
        Arc::new(Access::from_tokens(tokens)),
        true,
    )
    .await
}

/// A fresh token with `roles` on `queues` (every queue when empty): the token
/// and its tokens-file entry.
pub fn token(name: &str, roles: &[Role], queues: &[&str]) -> (String, Value) {
    let (token, entry) =
        child_ledger::access::new_token(name, roles.to_vec(), queues.iter().map(|q| (*q).to_owned()).collect())
            .expect("token");
    (token, serde_json::to_value(entry).unwrap())
}

/// A new, empty database of `backend`: its URL, and its directory to remove
/// for SQLite.
async fn new_database(backend: Backend) -> (String, Option<TempDir>) {
    match backend {
        Backend::Sqlite => {
            let dir = std::env::temp_dir().join(format!("child-ledger-test-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(&dir).unwrap();
            let url = format!("sqlite://{}", dir.join("ledger.db").display());
            (url, Some(TempDir(dir)))
        }
        Backend::Postgres => (create_database().await, None),
    }
}

/// An app started on a database that held only the first `applied`
/// migrations of its backend, with `seed` written under them: an existing
/// ledger that this build upgrades as it starts.
pub async fn spawn_upgraded_app(backend: Backend, applied: usize, seed: &str) -> TestApp {
    let (database_url, dir) = new_database(backend).await;
    let dialect = match backend {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    };
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(dialect);
    let mut files: Vec<_> = std::fs::read_dir(&source)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(
        applied < files.len(),
        "{applied} of {} migrations is not an old ledger",
        files.len()
    );
    let old = TempDir(std::env::temp_dir().join(format!("child-ledger-migrations-{}", uuid::Uuid::new_v4())));
    std::fs::create_dir_all(&old.0).unwrap();
    for file in &files[..applied] {
        std::fs::copy(file, old.0.join(file.file_name().unwrap())).unwrap();
    }
    let migrator = sqlx::migrate::Migrator::new(old.0.as_path())
        .await
        .expect("old migrations");
    let db = raw::RawDb::connect(&database_url).await;
    match &db {
        raw::RawDb::Postgres(pool) => migrator.run(pool).await,
        raw::RawDb::Sqlite(pool) => migrator.run(pool).await,
    }
    .expect("apply the old migrations");
    db.execute_raw(seed).await.expect("seed the old ledger");
    start_app(
        backend,
        database_url,
        dir,
        Limits::default(),
        Arc::new(Access::open()),
        true,
    )
    .await
}

impl TestApp {
    /// A second service on this app's database, as another replica would be:
    /// its own pools, reaper, work listener and port. The database stays the
    /// first app's to drop.
    pub async fn replica(&self) -> TestApp {
        start_app(
            self.backend,
            self.database_url.clone(),
            None,
            Limits::default(),
            Arc::clone(&self.access),
            false,
        )
        .await
    }
}

async fn start_app(
    backend: Backend,
    database_url: String,
    dir: Option<TempDir>,
    limits: Limits,
    access: Arc<Access>,
    owns_database: bool,
) -> TestApp {
    // The service as `main` starts it, on a free port: the reaper, the work
    // listener and the reconcile jobs' loop run as in production.
    let Command::Serve(config) = Cli::try_parse_args(["child-ledger", "serve"])
        .expect("the default configuration")
        .command
    else {
        unreachable!("serve")
    };
    let mut config: Config = *config;
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.database.database_url = database_url.clone();
    config.limits = limits;
    config.reap_interval_ms = 1000;
    config.shutdown_grace_seconds = 1;
    if !config.limits.webhook_allow_hosts.is_empty() {
        // Every webhook is signed: a service that allows any must have a secret.
        config.webhooks.webhook_secret = Some(
            child_ledger::ledger::webhook::WebhookSecret::parse("whsec_dGVzdC1zZWNyZXQtb2YtdGhlLWhhcm5lc3MtMzI=")
                .expect("a secret"),
        );
    }
    let app = Application::bind(config, Arc::clone(&access)).await.expect("bind");
    let addr = app.local_addr();
    let running = app.start().await.expect("start").expect("not stopped");
    let stopper = running.stopper();
    let service = tokio::spawn(async move {
        let _ = running.wait().await;
    });
    TestApp {
        backend,
        base: format!("http://{addr}"),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap(),
        db: raw::RawDb::connect(&database_url).await,
        database_url,
        token: None,
        access,
        service,
        stopper,
        owns_database,
        _dir: dir,
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stopper.stop();
        self.service.abort();
        if self.backend == Backend::Postgres && self.owns_database {
            // Drop the test's database so runs do not pile them up.
            drop_database(&self.database_url);
        }
    }
}

/// A response reduced to what tests look at.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl TestApp {
    pub async fn request(&self, method: Method, path: &str, body: Option<Value>) -> Reply {
        self.request_as(self.token.as_deref(), method, path, body).await
    }

    /// A request with `token` as its bearer token (none: no `Authorization`).
    pub async fn request_as(&self, token: Option<&str>, method: Method, path: &str, body: Option<Value>) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        Self::reply(req.send().await.expect("request")).await
    }

    pub async fn get_as(&self, token: &str, path: &str) -> Reply {
        self.request_as(Some(token), Method::GET, path, None).await
    }

    pub async fn put_as(&self, token: &str, path: &str, body: Value) -> Reply {
        self.request_as(Some(token), Method::PUT, path, Some(body)).await
    }

    pub async fn post_as(&self, token: &str, path: &str, body: Value) -> Reply {
        self.request_as(Some(token), Method::POST, path, Some(body)).await
    }

    /// Sends a raw body with the given content type (none when empty).
    pub async fn raw(&self, method: Method, path: &str, content_type: &str, body: Vec<u8>) -> Reply {
        self.raw_with(method, path, content_type, &[], reqwest::Body::from(body))
            .await
    }

    /// As `raw`, with more headers and any body (a stream is sent chunked).
    pub async fn raw_with(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        headers: &[(&str, &str)],
        body: reqwest::Body,
    ) -> Reply {
        let mut req = self.client.request(method, format!("{}{path}", self.base)).body(body);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        Self::reply(req.send().await.expect("request")).await
    }

    async fn reply(resp: reqwest::Response) -> Reply {
        let status = resp.status();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Reply {
            status,
            content_type,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, None).await
    }

    pub async fn put(&self, path: &str, body: Value) -> Reply {
        self.request(Method::PUT, path, Some(body)).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Reply {
        self.request(Method::POST, path, Some(body)).await
    }

    /// Runs raw SQL against the test's database, as an operator would.
    pub async fn exec(&self, sql: &str) {
        self.db.execute_raw(sql).await.expect("raw sql");
    }

    /// Makes every live lease of a claim run out now, as if its time had
    /// passed: tests whose point is expiry drive it, instead of sleeping past
    /// a short lease that a slow machine may also outlive elsewhere.
    pub async fn expire_claim(&self, claim_id: &str) {
        // The claim's lease rows: what a child's lease is, and what the
        // expiry sweep follows.
        self.exec(&format!(
            "UPDATE claim_lease SET expires_at = '2000-01-01T00:00:00.000Z' WHERE claim_id = '{claim_id}'"
        ))
        .await;
    }

    /// Runs a scalar count query (`SELECT count(*) ...`) against the test's database.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db.count_raw(sql).await.expect("raw count")
    }
}

/// A registration body with `n` children whose payload is `{"n": i}`.
pub fn children(n: usize) -> Vec<Value> {
    (0..n).map(|i| serde_json::json!({"payload": {"n": i}})).collect()
}
