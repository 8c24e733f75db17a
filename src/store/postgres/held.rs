//! A connection held for one request's long work: a transaction, or a read
//! that may scan. When the request is dropped while a statement runs (its
//! timeout fired, or its client went away), sqlx would drain the statement
//! before reusing the connection, so it would run on to its end. A held
//! connection dropped before it finished is instead given a moment to become
//! idle (a rollback, or a ping) and otherwise closed; Postgres ends the
//! statement of a closed connection the next time it checks its client
//! (`client_connection_check_interval`, set on every connection).

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool, Postgres};

use super::pooler::Session;

/// How often a backend running a statement checks that its client is still
/// there: how soon after its request is dropped an abandoned statement ends.
pub(super) const CLIENT_CHECK: Duration = Duration::from_millis(500);

/// How long a connection dropped before it finished may take to become idle
/// before it is closed instead: longer than any rollback, far shorter than a
/// statement worth cancelling.
const SETTLE_GRACE: Duration = Duration::from_millis(250);

pub(crate) struct Held {
    conn: Option<PoolConnection<Postgres>>,
    in_transaction: bool,
    /// How this connection's transactions end (see `Session`).
    commit: &'static str,
    rollback: &'static str,
}

impl Held {
    /// A connection for a read that may scan.
    pub(super) async fn acquire(pool: &PgPool, session: &Session) -> Result<Self, sqlx::Error> {
        Ok(Self {
            conn: Some(pool.acquire().await?),
            in_transaction: false,
            commit: session.commit,
            rollback: session.rollback,
        })
    }

    /// A connection in a transaction, begun as `session` says.
    pub(super) async fn begin(pool: &PgPool, session: &Session) -> Result<Self, sqlx::Error> {
        let mut held = Self::acquire(pool, session).await?;
        // Set first: a BEGIN dropped halfway may still have started the transaction.
        held.in_transaction = true;
        held.execute(AssertSqlSafe(Arc::clone(&session.begin))).await?;
        Ok(held)
    }

    pub async fn commit(self) -> Result<(), sqlx::Error> {
        let commit = self.commit;
        self.end(commit).await
    }

    /// Undoes the transaction and gives the connection back to the pool.
    pub async fn rollback(self) -> Result<(), sqlx::Error> {
        let rollback = self.rollback;
        self.end(rollback).await
    }

    /// Ends the transaction with `sql` and gives the connection back.
    async fn end(mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        self.execute(sql).await?;
        self.in_transaction = false;
        self.conn.take();
        Ok(())
    }

    /// Ends a read (committing, if it ran in a transaction) and gives the
    /// connection back to the pool.
    pub async fn finish(mut self) -> Result<(), sqlx::Error> {
        if self.in_transaction {
            return self.commit().await;
        }
        self.conn.take();
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            drop(conn.detach());
            return;
        };
        let in_transaction = self.in_transaction;
        let rollback = self.rollback;
        runtime.spawn(async move {
            let settle = async {
                if in_transaction {
                    conn.execute(rollback).await.map(drop)
                } else {
                    conn.ping().await
                }
            };
            if !matches!(tokio::time::timeout(SETTLE_GRACE, settle).await, Ok(Ok(()))) {
                // Still running its statement: closing its socket is what ends
                // it. Not sqlx's graceful close, which may wait on the busy
                // server (a TLS goodbye) for seconds; the pool opens a new one.
                drop(conn.detach());
            }
        });
    }
}

impl Deref for Held {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn
            .as_ref()
            .expect("a held connection is present until it is finished")
    }
}

impl DerefMut for Held {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a held connection is present until it is finished")
    }
}

#[cfg(test)]
mod tests {
    use crate::store::backend::Connection as _;
    use std::time::Instant;

    use super::*;
    use crate::store::StoreOptions;
    use crate::store::postgres::PgStore;

    /// Active statements whose text holds `marker`, seen from another connection.
    async fn running(observer: &mut PgConnection, marker: &str) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid() \
             AND strpos(query, $1) > 0",
        )
        .bind(marker)
        .fetch_one(observer)
        .await
        .unwrap()
    }

    /// How long after its future was dropped the statement marked `marker` was gone.
    async fn gone_after(observer: &mut PgConnection, marker: &str, dropped: Instant) -> Duration {
        while running(observer, marker).await > 0 {
            assert!(dropped.elapsed() < Duration::from_secs(10), "the statement still runs");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        dropped.elapsed()
    }

    #[tokio::test]
    async fn a_dropped_statement_ends_and_a_finished_connection_is_reused() {
        let Some(url) = crate::store::test_postgres_url().await else {
            return;
        };
        let options = StoreOptions {
            max_connections: 1,
            ..StoreOptions::default()
        };
        let store = PgStore::connect(&url, &options).await.unwrap();
        let mut observer = PgConnection::connect(&url).await.unwrap();
        for in_transaction in [true, false] {
            let marker = uuid::Uuid::new_v4().simple().to_string();
            let sql = format!("SELECT pg_sleep(60), '{marker}'");
            let work = async {
                let mut held = if in_transaction {
                    store.held_tx().await?
                } else {
                    store.held_read().await?
                };
                sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                    .execute(&mut *held)
                    .await?;
                held.finish().await?;
                Ok::<_, crate::store::StoreError>(())
            };
            assert!(tokio::time::timeout(Duration::from_millis(500), work).await.is_err());
            let dropped = Instant::now();
            let gone = gone_after(&mut observer, &marker, dropped).await;
            println!("a dropped 60 s statement (transaction: {in_transaction}) ended {gone:?} after its future");
            assert!(gone < Duration::from_secs(3), "{gone:?}");
            // The pool's one connection slot is free again.
            store.ping().await.unwrap();
        }

        // A transaction that ends in an error rolls back, and its connection
        // goes back to the pool rather than being closed.
        let mut tx = store.held_tx().await.unwrap();
        let first: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        sqlx::query("SELECT 1 / 0").execute(&mut *tx).await.unwrap_err();
        drop(tx);
        tokio::time::sleep(2 * SETTLE_GRACE).await;
        let state: Option<String> = sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
            .bind(first)
            .fetch_optional(&mut observer)
            .await
            .unwrap();
        assert_eq!(
            state.as_deref(),
            Some("idle"),
            "the connection was closed or left in its transaction"
        );
    }
}
