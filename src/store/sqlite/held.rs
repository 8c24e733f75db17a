//! A connection held for one request's work: a transaction, or a read that may
//! scan. When the request is dropped while a statement runs (its timeout
//! fired, or its client went away), sqlx's worker thread would run the
//! statement on to its end; a held connection dropped before it finished
//! interrupts it instead (`sqlite3_interrupt`), then rolls back as usual.

use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use sqlx::pool::PoolConnection;
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};

enum Hold {
    Transaction(Transaction<'static, Sqlite>),
    Read(PoolConnection<Sqlite>),
}

pub(crate) struct Held {
    hold: Option<Hold>,
    handle: RawHandle,
    /// The transaction's time, once a statement asked for it (`time`).
    time: Option<String>,
}

/// The connection's `sqlite3` handle, used for nothing but `sqlite3_interrupt`.
struct RawHandle(NonNull<libsqlite3_sys::sqlite3>);

// SAFETY: `sqlite3_interrupt` is the one call made through the handle, and
// SQLite documents it as safe to call from any thread while the connection
// runs a statement. It is only called while the connection is held (`Held`
// owns it), so the connection cannot have been closed.
unsafe impl Send for RawHandle {}
unsafe impl Sync for RawHandle {}

impl Held {
    /// A transaction begun with `begin` (`BEGIN IMMEDIATE` for writes).
    pub(super) async fn begin(pool: &SqlitePool, begin: &'static str) -> Result<Self, sqlx::Error> {
        let mut tx = pool.begin_with(begin).await?;
        let handle = RawHandle(tx.lock_handle().await?.as_raw_handle());
        Ok(Self {
            hold: Some(Hold::Transaction(tx)),
            handle,
            time: None,
        })
    }

    /// A connection for a read that may scan.
    pub(super) async fn acquire(pool: &SqlitePool) -> Result<Self, sqlx::Error> {
        let mut conn = pool.acquire().await?;
        let handle = RawHandle(conn.lock_handle().await?.as_raw_handle());
        Ok(Self {
            hold: Some(Hold::Read(conn)),
            handle,
            time: None,
        })
    }

    /// One time for every statement of the transaction that asks for it, as
    /// `NOW` writes times: SQLite's clock moves between statements, where
    /// Postgres' `now()` is the transaction's. (The database clock is this
    /// process's.) Children written in chunks by one registration or append
    /// then change at one time, as on Postgres.
    pub fn time(&mut self) -> &str {
        self.time
            .get_or_insert_with(|| super::rows::time_param(chrono::Utc::now()))
    }

    pub async fn commit(mut self) -> Result<(), sqlx::Error> {
        match self.hold.take() {
            Some(Hold::Transaction(tx)) => tx.commit().await,
            Some(Hold::Read(_)) | None => Ok(()),
        }
    }

    /// Ends a read (committing, if it ran in a transaction) and gives the
    /// connection back to the pool.
    pub async fn finish(self) -> Result<(), sqlx::Error> {
        self.commit().await
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.hold.is_some() {
            // SAFETY: see `RawHandle`. A statement still running fails with
            // SQLITE_INTERRUPT; on an idle connection this does nothing, as
            // the flag is cleared when the next statement (the rollback) starts.
            unsafe { libsqlite3_sys::sqlite3_interrupt(self.handle.0.as_ptr()) };
        }
    }
}

impl Deref for Held {
    type Target = SqliteConnection;

    fn deref(&self) -> &SqliteConnection {
        match self
            .hold
            .as_ref()
            .expect("a held connection is present until it is finished")
        {
            Hold::Transaction(tx) => tx,
            Hold::Read(conn) => conn,
        }
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut SqliteConnection {
        match self
            .hold
            .as_mut()
            .expect("a held connection is present until it is finished")
        {
            Hold::Transaction(tx) => tx,
            Hold::Read(conn) => conn,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::store::backend::Connection as _;
    use std::time::{Duration, Instant};

    use crate::store::StoreOptions;
    use crate::store::sqlite::SqliteStore;

    /// Counts to a billion: minutes of work for one statement.
    const ENDLESS: &str = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000) \
                           SELECT count(*) FROM n";

    #[tokio::test]
    async fn a_dropped_statement_is_interrupted() {
        let dir = std::env::temp_dir().join(format!("held-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("ledger.db").display());
        // One reader and one writer, so the next statement needs the very
        // connection whose statement was dropped.
        let options = StoreOptions {
            max_connections: 1,
            ..StoreOptions::default()
        };
        let store = SqliteStore::connect(&url, &options).await.unwrap();
        store.migrate().await.unwrap();
        for in_transaction in [true, false] {
            let work = async {
                let mut held = if in_transaction {
                    store.held_tx().await?
                } else {
                    store.held_read().await?
                };
                sqlx::query(ENDLESS).execute(&mut *held).await?;
                held.finish().await?;
                Ok::<_, crate::store::StoreError>(())
            };
            assert!(tokio::time::timeout(Duration::from_millis(300), work).await.is_err());
            let dropped = Instant::now();
            let mut held = if in_transaction {
                store.held_tx().await.unwrap()
            } else {
                store.held_read().await.unwrap()
            };
            let one: i64 = sqlx::query_scalar("SELECT 1").fetch_one(&mut *held).await.unwrap();
            held.finish().await.unwrap();
            let free = dropped.elapsed();
            println!("a dropped endless statement (transaction: {in_transaction}) freed its connection in {free:?}");
            assert_eq!(one, 1);
            assert!(free < Duration::from_secs(2), "{free:?}");
        }
        // An interrupt on an idle connection touches nothing that follows.
        let held = store.held_tx().await.unwrap();
        drop(held);
        let mut tx = store.held_tx().await.unwrap();
        sqlx::query("CREATE TABLE after_interrupt (x)")
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
