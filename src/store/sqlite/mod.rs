//! The embedded SQLite ledger. Every write goes through one connection, in a
//! transaction that takes the write lock up front (`BEGIN IMMEDIATE`), so two
//! claimers can never take the same child and no writer ever sees "database is
//! locked"; reads use their own pool and, in WAL mode, never wait for writes.
//! This file holds the pools, the dialect and how statements run (SQLite's
//! process-wide memory setup is in `memory.rs`); the
//! statements whose shape is SQLite's own live by resource.

mod claims;
mod group;
mod held;
mod lane_claim;
mod memory;
mod outcomes;
mod parents;
mod quiet;
mod reconcile;
mod rows;
mod webhooks;

use std::ffi::{c_int, c_uint, c_void};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteArguments, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{ConnectOptions as _, Sqlite, SqlitePool};
use tracing::Instrument as _;

use super::backend::{Connection, Row, Transaction};
use super::statement::{Dialect, Statement, Value};
use super::{PoolStats, StoreOptions, StoreResult, sql};
use held::Held;
pub use memory::prepare_sqlite_memory;

/// The database clock, as RFC 3339 UTC text with milliseconds.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// The database clock `modifier` (an expression of a `strftime` modifier,
/// such as `'+5 seconds'`) from now.
fn now_by(modifier: &str) -> String {
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', {modifier})")
}

/// The words SQLite writes its shared statements with.
static SQLITE: Dialect = Dialect {
    slot: 1,
    now: NOW,
    statement_now: NOW,
    minute: MINUTE,
    epoch: "((julianday('now') - 2440587.5) * 86400.0)",
    for_update: "",
    unflushed_commit: None,
    skip_locked: "",
    flow_served: "(SELECT coalesce(max(f.served), 0) + 1 FROM flow_limit f WHERE f.queue = $1)",
    greatest: "max",
    later: |p| now_by(&format!("'+' || {p} || ' seconds'")),
    ago: |p| now_by(&format!("'-' || {p} || ' seconds'")),
    as_time: |p| p.to_owned(),
    json: |p| p.to_owned(),
    json_push: |column, p| format!("json_insert({column}, '$[#]', json({p}))"),
    json_length: |column| format!("json_array_length({column})"),
    // Read from the record's header: the value itself is not loaded.
    json_bytes: |column| format!("octet_length({column})"),
    lease_sequences: |l| format!("json_each({l}.sequences) ls"),
    lease_holds: |l, sequence| format!("EXISTS (SELECT 1 FROM json_each({l}.sequences) WHERE value = {sequence})"),
    quiet_batch: |column| {
        format!(
            "(SELECT q.{column} FROM processed_batch q WHERE q.parent_id = c.parent_id AND q.claim_id IS NOT NULL \
                AND q.hi >= c.sequence AND q.lo <= c.sequence AND {} ORDER BY q.hi LIMIT 1)",
            batch_lists("q", "c.sequence")
        )
    },
    json_pairs: |p| {
        format!("SELECT json_extract(value, '$[0]') AS n, json_extract(value, '$[1]') AS t FROM json_each({p})")
    },
    json_texts: |p| format!("SELECT value FROM json_each({p})"),
    indexed_by: |name| format!("INDEXED BY {name}"),
    within: sql::within_sqlite,
};

/// Whether outcome batch `b`'s list names child `sequence`. A batch of
/// every sequence from its `lo` to its `hi` (a claim's whole lease, usually)
/// says so by its length, without reading the list.
fn batch_lists(b: &str, sequence: &str) -> String {
    format!(
        "(json_array_length({b}.sequences) = {b}.hi - {b}.lo + 1 \
          OR EXISTS (SELECT 1 FROM json_each({b}.sequences) WHERE value = {sequence}))"
    )
}

/// A statement's text and values as sqlx runs them on SQLite, which keeps
/// times and uuids as text.
fn query(sql: &'static str, values: &[Value<'_>]) -> sqlx::query::Query<'static, Sqlite, SqliteArguments> {
    let mut query = sqlx::query(sql);
    for value in values {
        query = match *value {
            Value::Text(v) => query.bind(v),
            Value::Int(v) => query.bind(v),
            Value::Int32(v) => query.bind(v),
            Value::Float(v) => query.bind(v),
            Value::Bool(v) => query.bind(v),
            Value::Time(v) => query.bind(v.map(rows::time_param)),
            Value::Uuid(v) => query.bind(v.map(|u| u.to_string())),
        };
    }
    query
}

fn boxed(rows: Vec<SqliteRow>) -> Vec<Row> {
    rows.into_iter().map(|row| Box::new(row) as Row).collect()
}

/// A transaction on a held connection: dropped unfinished, its statement is interrupted.
pub(super) type SqliteTx = Held;

/// The current minute since the epoch, by the database clock.
const MINUTE: &str = "(CAST(strftime('%s', 'now') AS INTEGER) / 60)";

/// How long a write waits for its turn: for the writer connection, and for
/// SQLite's file lock when another process writes the same file.
const WRITER_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    /// One connection: SQLite has one writer at a time anyway, and queueing in
    /// the pool instead of in SQLite's lock means no "database is locked".
    writer: SqlitePool,
    readers: SqlitePool,
    /// Beside the database file: held while migrating (none in memory).
    migration_lock: Option<std::path::PathBuf>,
    watchdog: Watchdog,
    /// Lane claims and outcome batches waiting for the writer's next transaction.
    group: Arc<group::Group>,
}

/// SQLite's `--statement-timeout-seconds`. SQLite has no statement timeout,
/// but it can say when each statement starts (`sqlite3_trace_v2`) and it
/// calls a progress handler every few thousand VM instructions while one
/// runs: a statement still running past the timeout is interrupted
/// (`SQLITE_INTERRUPT`, answered 503). Armed once migrations are done: a
/// migration of a big ledger may run long, on purpose.
#[derive(Debug, Clone)]
struct Watchdog {
    limit: Duration,
    armed: Arc<AtomicBool>,
}

/// The origin of the statement clocks below.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn clock_now() -> u64 {
    EPOCH.elapsed().as_nanos() as u64
}

/// `sqlite3_trace_v2`'s callback: a statement starts on the connection whose
/// statement clock `ctx` is.
unsafe extern "C" fn statement_started(
    _event: c_uint,
    ctx: *mut c_void,
    _stmt: *mut c_void,
    _sql: *mut c_void,
) -> c_int {
    // SAFETY: `ctx` is the `AtomicU64` that `Watchdog::watch` registered with
    // this connection; the progress handler owns it for as long as the
    // connection runs statements.
    let started = unsafe { &*(ctx as *const AtomicU64) };
    started.store(clock_now(), Ordering::Relaxed);
    0
}

impl Watchdog {
    /// VM instructions between progress handler calls (microseconds of work).
    const EVERY: i32 = 10_000;

    fn new(limit: Duration) -> Self {
        Self {
            limit,
            armed: Arc::default(),
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Pool options whose every connection is watched.
    fn watch(&self, pool: SqlitePoolOptions) -> SqlitePoolOptions {
        let watchdog = self.clone();
        pool.after_connect(move |conn, _meta| {
            let watchdog = watchdog.clone();
            Box::pin(async move {
                let mut handle = conn.lock_handle().await?;
                let started = Arc::new(AtomicU64::new(clock_now()));
                // SAFETY: the handle is locked (no other thread calls into this
                // connection), and the clock outlives the registration: the
                // progress handler below holds it until the connection closes.
                unsafe {
                    libsqlite3_sys::sqlite3_trace_v2(
                        handle.as_raw_handle().as_ptr(),
                        libsqlite3_sys::SQLITE_TRACE_STMT,
                        Some(statement_started),
                        Arc::as_ptr(&started) as *mut c_void,
                    );
                }
                let limit = watchdog.limit.as_nanos() as u64;
                handle.set_progress_handler(Self::EVERY, move || {
                    // false interrupts the statement.
                    !watchdog.armed.load(Ordering::Relaxed)
                        || clock_now().saturating_sub(started.load(Ordering::Relaxed)) < limit
                });
                Ok(())
            })
        })
    }
}

/// Rows a statement may hand over before its reader takes them: a claim or
/// an outcome batch at its largest (`limits::Limits::max_claim_limit`).
const ROW_BUFFER: usize = 1024;

impl SqliteStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // An acknowledged outcome must survive a power cut, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            // Within this process one writer connection takes turns; another
            // process on the same file is waited for as long as a writer
            // queues here, so a lock is waited out, never answered as an error.
            .busy_timeout(WRITER_WAIT)
            .foreign_keys(true)
            // sqlx hands each row from the connection's thread to the task
            // that reads it; with its default of 50 rows in flight, a claim
            // or outcome batch of 500 stopped the connection's thread ten
            // times to wait for the reader.
            .row_buffer_size(ROW_BUFFER)
            // Statements are spans of their own (see the Postgres store).
            .log_statements(log::LevelFilter::Off);
        let file = connect.get_filename();
        // In memory (sqlx names such a database `file:sqlx-in-memory-N`) no
        // other process can open it, and there is no directory to lock in.
        let in_memory = file.as_os_str().is_empty()
            || file == std::path::Path::new(":memory:")
            || file.to_string_lossy().starts_with("file:sqlx-in-memory-");
        let migration_lock = (!in_memory).then(|| std::path::PathBuf::from(format!("{}-migrate.lock", file.display())));
        // Writers queue here behind the one connection; a 100,000-child
        // registration holds it for seconds, which is no outage.
        let watchdog = Watchdog::new(options.statement_timeout);
        let writer = watchdog
            .watch(SqlitePoolOptions::new())
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout.max(WRITER_WAIT))
            .connect_with(connect.clone())
            .await?;
        // Readers: at most two per core. Each runs SQLite on a thread of its
        // own, whose allocator keeps what a large read freed (results of
        // 60 KB held about 10 MB a thread) until that thread runs again, and
        // more threads than cores read no faster.
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
        let readers = watchdog
            .watch(SqlitePoolOptions::new())
            .max_connections(options.max_connections.clamp(1, 2 * cores))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(Self {
            writer,
            readers,
            migration_lock,
            watchdog,
            group: group::group(),
        })
    }

    /// A write transaction on the writer connection, holding the write lock.
    pub(super) async fn held_tx(&self) -> StoreResult<SqliteTx> {
        Ok(Held::begin(&self.writer, "BEGIN IMMEDIATE").await?)
    }

    /// A connection for one read that may scan (a page of parents with their
    /// counts, a drift page): its statement ends if the request is dropped.
    pub(super) async fn held_read(&self) -> StoreResult<Held> {
        Ok(Held::acquire(&self.readers).await?)
    }

    /// Applies the migrations. Two processes starting on one new file would
    /// both find them unapplied and the second would fail on the first's
    /// tables: an exclusive lock on a file beside the database makes one wait
    /// for the other, which then finds everything applied.
    async fn run_migrations(&self) -> anyhow::Result<()> {
        let _held = match &self.migration_lock {
            Some(path) => {
                let path = path.clone();
                Some(
                    tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
                        let file = std::fs::OpenOptions::new()
                            .create(true)
                            .truncate(false)
                            .write(true)
                            .open(&path)?;
                        file.lock()?;
                        Ok(file)
                    })
                    .await??,
                )
            }
            None => None,
        };
        sqlx::migrate!("./migrations/sqlite").run(&self.writer).await?;
        self.watchdog.arm();
        Ok(())
    }
}

#[async_trait]
impl Connection for SqliteStore {
    fn dialect(&self) -> &'static Dialect {
        &SQLITE
    }

    fn migrate(&self) -> futures::future::LocalBoxFuture<'_, anyhow::Result<()>> {
        Box::pin(self.run_migrations())
    }

    async fn ping(&self) -> StoreResult<Option<String>> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(None)
    }

    fn pool_stats(&self) -> Vec<PoolStats> {
        [("sqlite_writer", &self.writer), ("sqlite_readers", &self.readers)]
            .into_iter()
            .map(|(name, pool)| PoolStats {
                name,
                size: pool.size(),
                idle: pool.num_idle() as u32,
                max: pool.options().get_max_connections(),
            })
            .collect()
    }

    async fn begin(&self) -> StoreResult<Box<dyn Transaction>> {
        Ok(Box::new(self.held_tx().await?))
    }

    async fn fetch(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let rows = query(statement.sql, &statement.values).fetch_all(&self.readers).await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn scan(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let mut conn = self.held_read().await?;
            let rows = query(statement.sql, &statement.values).fetch_all(&mut *conn).await?;
            conn.finish().await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    /// On the writer, under the write lock taken up front, like every write.
    async fn write(&self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let mut tx = self.held_tx().await?;
            let rows = query(statement.sql, &statement.values).fetch_all(&mut *tx).await?;
            tx.commit().await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn execute(&self, statement: Statement<'_>) -> StoreResult<u64> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let mut tx = self.held_tx().await?;
            let done = query(statement.sql, &statement.values).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(done.rows_affected())
        };
        run.instrument(span).await
    }
}

#[async_trait]
impl Transaction for Held {
    fn dialect(&self) -> &'static Dialect {
        &SQLITE
    }

    async fn fetch(&mut self, statement: Statement<'_>) -> StoreResult<Vec<Row>> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let rows = query(statement.sql, &statement.values).fetch_all(&mut **self).await?;
            Ok(boxed(rows))
        };
        run.instrument(span).await
    }

    async fn execute(&mut self, statement: Statement<'_>) -> StoreResult<u64> {
        let span = super::statement::span(statement.sql);
        let run = async move {
            let done = query(statement.sql, &statement.values).execute(&mut **self).await?;
            Ok(done.rows_affected())
        };
        run.instrument(span).await
    }

    async fn commit(self: Box<Self>) -> StoreResult<()> {
        Ok(Held::commit(*self).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    /// Counts to a billion: minutes of work for one statement.
    const ENDLESS: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) \
                           SELECT count(*) FROM n";

    #[tokio::test]
    async fn a_statement_past_the_timeout_is_interrupted_once_migrated() {
        let options = StoreOptions {
            statement_timeout: Duration::from_millis(300),
            ..StoreOptions::default()
        };
        let store = SqliteStore::connect("sqlite::memory:", &options).await.unwrap();
        store.migrate().await.unwrap();
        let started = Instant::now();
        let err = sqlx::query(ENDLESS).fetch_one(&store.readers).await.unwrap_err();
        let took = started.elapsed();
        println!("a runaway SQLite statement was interrupted after {took:?} (timeout 300 ms)");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(matches!(StoreError::from(err), StoreError::Unavailable(_)));
        // The connection serves the next statement as usual, and statements
        // back to back for longer than the timeout are each on their own clock.
        let started = Instant::now();
        let mut statements = 0;
        while started.elapsed() < Duration::from_secs(1) {
            let counted: i64 = sqlx::query_scalar(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000) SELECT count(*) FROM n",
            )
            .fetch_one(&store.readers)
            .await
            .unwrap();
            assert_eq!(counted, 10_000);
            statements += 1;
        }
        println!("{statements} statements back to back for 1 s ran to their end");
    }

    #[tokio::test]
    async fn the_watchdog_sleeps_while_migrating() {
        let options = StoreOptions {
            statement_timeout: Duration::from_millis(100),
            ..StoreOptions::default()
        };
        let store = SqliteStore::connect("sqlite::memory:", &options).await.unwrap();
        // Not armed yet: a long statement (here 300 ms of counting) runs to its end.
        let started = Instant::now();
        let counted: i64 = sqlx::query_scalar(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000000) SELECT count(*) FROM n",
        )
        .fetch_one(&store.writer)
        .await
        .unwrap();
        assert_eq!(counted, 2_000_000);
        println!("before migrations, a {:?} statement ran to its end", started.elapsed());
    }
}
