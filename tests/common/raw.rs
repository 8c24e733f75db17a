//! Raw SQL against a test's database, as an operator repairing by hand would:
//! its own connection, beside the service's store.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{AssertSqlSafe, PgPool, SqlitePool};

/// A connection to a test's database for raw statements and counts.
#[derive(Debug, Clone)]
pub enum RawDb {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl RawDb {
    pub async fn connect(url: &str) -> Self {
        if url.starts_with("sqlite:") {
            // Waits out the service's writer as the service waits out other processes.
            let options = SqliteConnectOptions::from_str(url)
                .expect("SQLite URL")
                .create_if_missing(true)
                .busy_timeout(Duration::from_secs(60));
            Self::Sqlite(SqlitePool::connect_with(options).await.expect("open SQLite"))
        } else {
            Self::Postgres(PgPool::connect(url).await.expect("connect to Postgres"))
        }
    }

    /// Runs raw SQL (one or more statements).
    pub async fn execute_raw(&self, sql: &str) -> sqlx::Result<()> {
        match self {
            Self::Postgres(pool) => {
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(pool).await?;
            }
            Self::Sqlite(pool) => {
                sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(pool).await?;
            }
        }
        Ok(())
    }

    /// Runs a scalar count query.
    pub async fn count_raw(&self, sql: &str) -> sqlx::Result<i64> {
        match self {
            Self::Postgres(pool) => sqlx::query_scalar(AssertSqlSafe(sql.to_owned())).fetch_one(pool).await,
            Self::Sqlite(pool) => sqlx::query_scalar(AssertSqlSafe(sql.to_owned())).fetch_one(pool).await,
        }
    }
}
