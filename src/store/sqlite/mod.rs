//! The embedded SQLite ledger. Every write goes through one connection, in a
//! transaction that takes the write lock up front (`BEGIN IMMEDIATE`), so two
//! claimers can never take the same child and no writer ever sees "database is
//! locked"; reads use their own pool and, in WAL mode, never wait for writes.
//! This file holds the pools; the statements live by resource.

pub(super) mod claims;
pub(super) mod outcomes;
pub(super) mod parents;
pub(super) mod reconcile;
mod rows;

use std::str::FromStr;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool, Transaction};

use super::{PoolStats, StoreOptions, StoreResult};

/// The database clock, as RFC 3339 UTC text with milliseconds.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
    ($modifier:literal) => {
        concat!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ", $modifier, ")")
    };
}
use now;

pub(super) type SqliteTx = Transaction<'static, Sqlite>;

/// How long a write waits for its turn: for the writer connection, and for
/// SQLite's file lock when another process writes the same file.
const WRITER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Clone)]
pub(crate) struct SqliteStore {
    /// One connection: SQLite has one writer at a time anyway, and queueing in
    /// the pool instead of in SQLite's lock means no "database is locked".
    writer: SqlitePool,
    readers: SqlitePool,
    /// Beside the database file: held while migrating (none in memory).
    migration_lock: Option<std::path::PathBuf>,
}

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
            .foreign_keys(true);
        let file = connect.get_filename();
        let migration_lock = (!file.as_os_str().is_empty() && file != std::path::Path::new(":memory:"))
            .then(|| std::path::PathBuf::from(format!("{}-migrate.lock", file.display())));
        // Writers queue here behind the one connection; a 100,000-child
        // registration holds it for seconds, which is no outage.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout.max(WRITER_WAIT))
            .connect_with(connect.clone())
            .await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(Self {
            writer,
            readers,
            migration_lock,
        })
    }

    pub(super) async fn begin(&self) -> StoreResult<SqliteTx> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    /// Applies the migrations. Two processes starting on one new file would
    /// both find them unapplied and the second would fail on the first's
    /// tables: an exclusive lock on a file beside the database makes one wait
    /// for the other, which then finds everything applied.
    pub async fn migrate(&self) -> anyhow::Result<()> {
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
        Ok(())
    }

    pub async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    /// Nothing to refresh: SQLite plans every statement afresh.
    pub async fn after_bulk_write(&self, _rows_written: i64) -> StoreResult<()> {
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
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
}
