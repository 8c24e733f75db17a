//! Where every Postgres statement goes: straight to Postgres, or through a
//! pooler in transaction mode (PgBouncer's `pool_mode = transaction`).
//!
//! Directly, `PgDb` is sqlx's pool: settings are startup parameters of each
//! connection and each statement is prepared once per connection.
//!
//! Behind a transaction pooler a server connection is this process's only
//! while one of its transactions is open, so nothing may outlive one:
//! - a statement outside a transaction runs in a transaction of its own
//!   (sqlx prepares a statement and binds it in two round trips, which the
//!   pooler could otherwise send to two different servers);
//! - the settings are `SET LOCAL`, in the same message as `BEGIN`;
//! - sqlx's statement cache is off, and each transaction ends by dropping the
//!   statements it prepared (`DEALLOCATE ALL`, in the same message as
//!   `COMMIT`), so no name is left for another client of that server.
//!
//! Nothing prepared survives a transaction, so every statement would be
//! parsed and planned on each call: most of what the mode costs. The hot
//! claim and outcome statements run as calls of PL/pgSQL functions instead,
//! whose plans each server connection keeps (`wrap_hot_statements`). Each
//! statement outside a transaction still costs three round trips more than
//! directly (begin, prepare, commit); the README gives the measured cost.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use either::Either;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgQueryResult, PgRow, PgStatement, PgTypeInfo};
use sqlx::{AssertSqlSafe, Column, Execute, Executor, PgPool, Postgres, SqlSafeStr, SqlStr, Statement as _, TypeInfo};

use super::held::Held;
use super::primary::Primary;
use crate::store::error::NoWritableHost;

/// How a transaction begins and ends on one kind of connection.
#[derive(Debug)]
pub(super) struct Session {
    pub begin: Arc<str>,
    pub commit: &'static str,
    pub rollback: &'static str,
    /// Whether every statement must run inside a transaction.
    pub transaction_pooled: bool,
}

impl Session {
    /// A direct connection: its settings came with its startup.
    pub fn direct() -> Self {
        Self {
            begin: Arc::from("BEGIN"),
            commit: "COMMIT",
            rollback: "ROLLBACK",
            transaction_pooled: false,
        }
    }

    /// A connection through a transaction pooler: `settings` are set for
    /// each transaction, and its prepared statements dropped at its end.
    pub fn transaction_pooled(settings: &[(&str, String)]) -> Self {
        let mut begin = "BEGIN".to_owned();
        for (name, value) in settings {
            begin.push_str(&format!("; SET LOCAL {name} = '{value}'"));
        }
        Self {
            begin: Arc::from(begin),
            // Dropped before the commit, so a commit that fails has still
            // left no statement behind (a rollback always runs to its end).
            commit: "DEALLOCATE ALL; COMMIT",
            rollback: "ROLLBACK; DEALLOCATE ALL",
            transaction_pooled: true,
        }
    }
}

/// The pool, and how its connections begin and end transactions.
#[derive(Debug, Clone)]
pub(crate) struct PgDb {
    pub(super) pool: PgPool,
    pub(super) session: Arc<Session>,
    /// Through a transaction pooler, once the schema is current: the hot
    /// statements' calls of their wrapping functions, by statement text (see
    /// `wrap_hot_statements`).
    pub(super) wrapped: Arc<OnceLock<HashMap<&'static str, &'static str>>>,
    /// The host in use: while it is lost and the primary is searched for,
    /// every statement is answered unavailable at once (`gate`).
    pub(super) primary: Arc<Primary>,
}

impl PgDb {
    /// The text to send for `sql`: itself, or through a transaction pooler
    /// the call of its wrapping function when it is one of the hot statements.
    pub(super) fn sql(&self, sql: &'static str) -> &'static str {
        match self.wrapped.get() {
            Some(wrapped) => wrapped.get(sql).copied().unwrap_or(sql),
            None => sql,
        }
    }

    /// Through a transaction pooler no statement stays prepared, so each
    /// would be parsed and planned on every call: for the hot statements
    /// (claims, outcomes) that is most of what the mode costs. Each is wrapped
    /// in a PL/pgSQL function instead, whose plan every server connection
    /// caches across transactions and clients (the generic plan, as
    /// `plan_cache_mode` asks directly); the call is trivial to plan. The
    /// function is named by a hash of the statement, so replicas of
    /// different versions each find theirs, and is created once (a replica
    /// that finds it created by another goes on). Its parameter and column
    /// types are the statement's own, as Postgres describes it.
    pub(super) async fn wrap_hot_statements(&self, statements: &[&'static str]) -> Result<(), sqlx::Error> {
        let mut wrapped = HashMap::new();
        for sql in statements {
            let mut tx = self.begin().await?;
            // Prepared (unnamed, as nothing is cached through a pooler) for
            // its types: `describe` would also ask `EXPLAIN` for nullability,
            // which sqlx 0.9.1 cannot do for an unnamed statement.
            let described = tx.prepare(AssertSqlSafe(sql.to_string()).into_sql_str()).await?;
            let parameters: Vec<String> = match described.parameters() {
                Some(Either::Left(types)) => types.iter().map(|t| t.name().to_owned()).collect(),
                _ => Vec::new(),
            };
            let columns: Vec<(String, String)> = described
                .columns()
                .iter()
                .map(|c| (c.name().to_owned(), c.type_info().name().to_owned()))
                .collect();
            let signature = format!(
                "({parameters}) RETURNS TABLE ({returns})",
                parameters = parameters.join(", "),
                returns = (1..=columns.len())
                    .zip(&columns)
                    .map(|(i, (_, ty))| format!("out_{i} {ty}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            // Named by the statement and the types it has on this schema: a
            // migration that changes what it returns makes a new function.
            let name = format!(
                "child_ledger_stmt_{}",
                &hex::encode(Sha256::digest(format!("{sql}\n{signature}").as_bytes()))[..16]
            );
            let create = format!(
                "DO $wrap$ BEGIN \
                   CREATE FUNCTION {name}{signature} LANGUAGE plpgsql \
                   SET plan_cache_mode = force_generic_plan AS $body$ \
                   #variable_conflict use_column \n BEGIN RETURN QUERY {sql}; END $body$; \
                 EXCEPTION WHEN duplicate_function OR unique_violation THEN NULL; \
                 END $wrap$"
            );
            tx.execute(AssertSqlSafe(create)).await?;
            tx.commit().await?;
            let call = format!(
                "SELECT {columns} FROM {name}({arguments})",
                columns = (1..=columns.len())
                    .zip(&columns)
                    .map(|(i, (column, _))| format!("out_{i} AS \"{}\"", column.replace('"', "\"\"")))
                    .collect::<Vec<_>>()
                    .join(", "),
                arguments = (1..=parameters.len())
                    .zip(&parameters)
                    .map(|(i, ty)| format!("${i}::{ty}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            );
            // Made once per statement per process: kept for the life of it.
            wrapped.insert(*sql, &*Box::leak(call.into_boxed_str()));
        }
        let _ = self.wrapped.set(wrapped);
        Ok(())
    }

    /// Unavailable at once while no writable host is in use (the pool would
    /// wait out its acquire timeout for the lost one, and a request that
    /// outlived the search would have waited with no answer meanwhile).
    fn gate(&self) -> Result<(), sqlx::Error> {
        match self.primary.problem() {
            Some(why) => Err(NoWritableHost::error(why)),
            None => Ok(()),
        }
    }

    /// A transaction on a held connection.
    pub(super) async fn begin(&self) -> Result<Held, sqlx::Error> {
        self.gate()?;
        Held::begin(&self.pool, &self.session).await
    }

    /// A connection for a read that may scan; through a transaction pooler,
    /// in a transaction.
    pub(super) async fn read(&self) -> Result<Held, sqlx::Error> {
        self.gate()?;
        if self.session.transaction_pooled {
            self.begin().await
        } else {
            Held::acquire(&self.pool, &self.session).await
        }
    }
}

/// `&PgDb` runs a statement like `&PgPool` does; through a transaction
/// pooler, in a transaction of its own.
impl<'p> Executor<'p> for &'_ PgDb {
    type Database = Postgres;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Either<PgQueryResult, PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if let Err(err) = self.gate() {
            return futures::stream::once(futures::future::ready(Err(err))).boxed();
        }
        if !self.session.transaction_pooled {
            return (&self.pool).fetch_many(query);
        }
        let db = self.clone();
        futures::stream::once(async move {
            let mut tx = db.begin().await?;
            let results: Vec<_> = tx.fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures::stream::iter(results.into_iter().map(Ok)))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<PgRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Postgres>,
    {
        if let Err(err) = self.gate() {
            return Box::pin(futures::future::ready(Err(err)));
        }
        if !self.session.transaction_pooled {
            return (&self.pool).fetch_optional(query);
        }
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let row = tx.fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: SqlStr,
        parameters: &'e [PgTypeInfo],
    ) -> BoxFuture<'e, Result<PgStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let statement = tx.prepare_with(sql, parameters).await?;
            tx.commit().await?;
            Ok(statement)
        })
    }

    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<sqlx::Describe<Postgres>, sqlx::Error>>
    where
        'p: 'e,
    {
        let db = self.clone();
        Box::pin(async move {
            let mut tx = db.begin().await?;
            let described = tx.describe(sql).await?;
            tx.commit().await?;
            Ok(described)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::store::backend::Connection as _;
    use std::time::Duration;

    use crate::store::StoreOptions;
    use crate::store::postgres::PgStore;

    /// The mode works against Postgres directly too, where its session is
    /// visible: each statement sees the `SET LOCAL` settings, and none leaves
    /// a prepared statement on its connection (the pool's only one).
    #[tokio::test]
    async fn a_pooled_transaction_sets_its_settings_and_leaves_no_statement_behind() {
        let Some(url) = crate::store::test_postgres_url().await else {
            return;
        };
        let options = StoreOptions {
            max_connections: 1,
            statement_timeout: Duration::from_secs(7),
            behind_transaction_pooler: true,
            ..StoreOptions::default()
        };
        let store = PgStore::connect(&url, &options).await.unwrap();
        for _ in 0..3 {
            store.ping().await.unwrap();
            let (timeout, check): (String, String) = sqlx::query_as(
                "SELECT current_setting('statement_timeout'), current_setting('client_connection_check_interval')",
            )
            .fetch_one(&store.pool)
            .await
            .unwrap();
            assert_eq!((timeout.as_str(), check.as_str()), ("7s", "500ms"));
            let mut tx = store.held_tx().await.unwrap();
            let one: i32 = sqlx::query_scalar("SELECT $1::int")
                .bind(1)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            assert_eq!(one, 1);
            tx.commit().await.unwrap();
            // Only the statement asking is prepared while it runs.
            let names: Vec<String> = sqlx::query_scalar("SELECT name FROM pg_prepared_statements")
                .fetch_all(&store.pool)
                .await
                .unwrap();
            assert!(
                names.len() <= 1,
                "prepared statements outlived their transactions: {names:?}"
            );
        }
        // Outside the service's transactions, the session has its defaults.
        let mut conn = store.pool.pool.acquire().await.unwrap();
        let timeout: String = sqlx::query_scalar("SELECT current_setting('statement_timeout')")
            .persistent(false)
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_ne!(timeout, "7s", "a setting outlived its transaction");
    }
}
