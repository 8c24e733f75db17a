//! What the store can answer besides a result: the ledger refusing a write,
//! a row that is not there, or the database itself failing. No user-facing
//! text lives here; `crate::error` words each kind once.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::ledger::{Child, ParentId};

/// Woken whenever a statement in this process lost its connection or met a
/// read-only host: the Postgres store then checks its host at once (see
/// `postgres::primary`) instead of at its next periodic check.
pub(crate) static DATABASE_LOST: Notify = Notify::const_new();

/// A statement met a read-only host (25006): the connections the pool holds
/// are retired even if the check that follows lands on a good one.
pub(crate) static READ_ONLY_SEEN: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no parent {0}")]
    ParentNotFound(ParentId),
    #[error("no child {sequence} in parent {parent_id}")]
    ChildNotFound { parent_id: ParentId, sequence: i64 },
    /// The parent exists with a different registration fingerprint.
    #[error("parent {0} exists with different content")]
    RegistrationConflict(ParentId),
    /// An append names sequences already stored with different content.
    #[error("children of {parent_id} conflict with the ledger")]
    ChildrenConflict { parent_id: ParentId, sequences: Vec<i64> },
    /// A child key is already used by another sequence of the parent.
    #[error("duplicate child key in {0}")]
    DuplicateKey(ParentId),
    /// Appends go only to decomposing parents.
    #[error("parent {0} is decomposed")]
    ParentDecomposed(ParentId),
    /// A seal whose total does not match the stored sequences.
    #[error("seal with total {total} does not match the ledger")]
    SealMismatch {
        total: i64,
        missing: Vec<i64>,
        extra: Vec<i64>,
    },
    /// Only a complete parent can be deleted.
    #[error("parent {0} is not complete")]
    ParentNotComplete(ParentId),
    /// Only a held (or already pending) child can be retried.
    #[error("child cannot be retried")]
    RetryConflict { child: Box<Child> },
    /// The database, or the connection to it, is gone: retrying later is right.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// The database answers but cannot hold the ledger now (no writable host
    /// is in use), with why, for `/readyz`.
    #[error("the database is not ready: {0}")]
    NotReady(String),
    /// Anything else the database said.
    #[error(transparent)]
    Db(sqlx::Error),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A failure to connect that no retry can fix, with what the operator should
/// change: the server refusing the user or its password, a database that
/// does not exist, TLS the server does not speak or a certificate that does
/// not verify, an option in the URL it cannot use, a startup parameter a
/// connection pooler in front refuses, a SQLite file that cannot be opened. `None`: retrying may help (the server
/// is not up yet, the network is down).
pub fn permanent_connect_error(err: &anyhow::Error) -> Option<String> {
    let cause = err.chain().find_map(|e| e.downcast_ref::<sqlx::Error>())?;
    match cause {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("28P01" | "28000") => Some(format!(
                "the database refused the connection ({}): fix the user or password in DATABASE_URL, or the server's pg_hba.conf",
                db.message()
            )),
            // PgBouncer answers these with its own code (08P01), in words.
            _ if db.message().starts_with("database \"") && db.message().ends_with("does not exist") => Some(format!(
                "{}: create it first (createdb), or fix the database name in DATABASE_URL (behind PgBouncer, \
                     also its [databases] section)",
                db.message()
            )),
            _ if [
                "password authentication failed",
                "no such user",
                "SASL authentication failed",
            ]
            .iter()
            .any(|words| db.message().contains(words)) =>
            {
                Some(format!(
                    "the pooler refused the connection ({}): fix the user or password in DATABASE_URL, or PgBouncer's \
                     auth_file / auth_query",
                    db.message()
                ))
            }
            Some("3D000") => Some(format!(
                "{}: create it first (createdb), or fix the database name in DATABASE_URL",
                db.message()
            )),
            // SQLite's SQLITE_CANTOPEN: a directory that is not there, or not
            // writable; no retry creates it.
            Some("14") => Some(format!(
                "SQLite cannot open the file ({}): create its directory (mkdir -p) or fix the path in \
                 DATABASE_URL, and check that the service may write there",
                db.message()
            )),
            _ if db.message().contains("unsupported startup parameter") => Some(format!(
                "{}: a connection pooler in front of Postgres refused a startup parameter. Behind PgBouncer in \
                 transaction mode, run with `--db-pooler transaction` (LEDGER_DB_POOLER=transaction), which sends \
                 none and keeps no session state; in session mode, set PgBouncer's \
                 `ignore_startup_parameters = extra_float_digits, options` (the settings then come from the role: \
                 `ALTER ROLE … SET statement_timeout = '30s'`)",
                db.message()
            )),
            _ => None,
        },
        sqlx::Error::Tls(tls) => Some(format!(
            "TLS to the database failed ({tls}): check `sslmode` (and `sslrootcert` for verify-ca/verify-full) in \
             DATABASE_URL, and that the server has ssl = on"
        )),
        sqlx::Error::Configuration(config) => Some(format!("DATABASE_URL cannot be used: {config}")),
        _ => None,
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        if is_unavailable(&err) {
            if is_lost(&err) {
                DATABASE_LOST.notify_waiters();
            }
            Self::Unavailable(err)
        } else {
            Self::Db(err)
        }
    }
}

impl StoreError {
    /// The same failure, for another caller of a combined statement.
    pub(crate) fn shared_copy(&self) -> Self {
        let err = sqlx::Error::Protocol(format!("a combined statement failed: {self}"));
        match self {
            Self::Unavailable(_) | Self::NotReady(_) => Self::Unavailable(err),
            _ => Self::Db(err),
        }
    }

    /// A bulk child insert's error: a unique violation there can only be a
    /// child key (sequences are either new or absorbed by `ON CONFLICT`).
    pub(crate) fn from_child_insert(err: sqlx::Error, parent_id: &ParentId) -> Self {
        let unique = err
            .as_database_error()
            .is_some_and(|e| matches!(e.kind(), sqlx::error::ErrorKind::UniqueViolation));
        if unique {
            Self::DuplicateKey(parent_id.clone())
        } else {
            Self::from(err)
        }
    }

    /// Whether the whole transaction may simply be run again: Postgres aborted
    /// it as a deadlock victim or a serialization failure, and it wrote nothing.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Self::Db(err) => err
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|code| code == "40P01" || code == "40001"),
            _ => false,
        }
    }
}

/// Whether an error says the database, or the connection to it, is gone rather
/// than that this statement failed.
fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        // What a connection that died under a request reports.
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed => true,
        // Postgres ending the session: class 08 connection exception,
        // 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now,
        // 53300 too_many_connections. SQLite still busy or locked after the
        // busy timeout (5 SQLITE_BUSY, 6 SQLITE_LOCKED and every extended code
        // of theirs): another process held the file too long; retrying is right.
        // A statement cut short by `--statement-timeout-seconds` (Postgres
        // 57014 query_canceled, SQLite 9 SQLITE_INTERRUPT): the database is too
        // slow to answer now, which a later try may not be. 25006
        // read_only_sql_transaction: the host is a standby, or a primary
        // demoted by a failover; retried later, never at once on the same host.
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "53300" | "57014" | "25006")
                // SQLite's extended codes keep the primary code in the low byte.
                || code.parse::<u32>().is_ok_and(|n| matches!(n & 0xff, 5 | 6 | 9))
        }),
        _ => false,
    }
}

/// What a statement meets while the store knows it has no writable host and
/// is searching for one: it is answered unavailable at once (503 with
/// `Retry-After`), not after waiting out the pool's acquire timeout for a
/// host that is gone. It is not news of a lost host (the search is on), so
/// it does not wake the search again.
#[derive(Debug)]
pub(crate) struct NoWritableHost(pub String);

impl std::fmt::Display for NoWritableHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no writable database host: {}", self.0)
    }
}

impl std::error::Error for NoWritableHost {}

impl NoWritableHost {
    /// The error a statement returns instead of running (see the type).
    pub(crate) fn error(why: String) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::other(Self(why)))
    }
}

/// Whether an unavailable error says the host itself is gone or read-only
/// (not merely slow or busy): the store should look for the primary. A
/// read-only answer is remembered, so that the pool's connections to that
/// host are retired.
fn is_lost(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(io) => !io.get_ref().is_some_and(|inner| inner.is::<NoWritableHost>()),
        sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            if code == "25006" {
                READ_ONLY_SEEN.store(true, Ordering::Relaxed);
            }
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25006")
        }),
        _ => false,
    }
}

/// Runs a body again when Postgres aborted it as a deadlock victim or
/// serialization failure: such an abort wrote nothing.
/// `body` makes the attempt's future (a closure over references, returning
/// an `async move` block).
pub(crate) async fn retry_transient<T, F, Fut>(mut body: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<T>>,
{
    let mut tries = 0;
    loop {
        match body().await {
            Err(err) if tries < 5 && err.is_transient() => tries += 1,
            other => return other,
        }
    }
}

/// Errors a lost database or connection reports, for the tests of every layer.
#[cfg(test)]
pub(crate) fn lost_database_errors() -> Vec<sqlx::Error> {
    vec![
        sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed,
        sqlx::Error::WorkerCrashed,
        sqlx::Error::Protocol("unexpected message on a dead connection".to_owned()),
        sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_writable_host_is_unavailable_and_not_news_of_a_lost_one() {
        let err = NoWritableHost::error("db-a:5432: connection refused".to_owned());
        assert!(is_unavailable(&err));
        assert!(!is_lost(&err), "the search is already on");
        assert!(
            err.to_string().contains("no writable database host: db-a:5432"),
            "{err}"
        );
        assert!(is_lost(&sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into())));
        assert!(matches!(
            StoreError::from(NoWritableHost::error("x".to_owned())),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn a_lost_database_is_unavailable_and_a_failed_query_is_not() {
        for lost in lost_database_errors() {
            assert!(matches!(StoreError::from(lost), StoreError::Unavailable(_)));
        }
        let failed = StoreError::from(sqlx::Error::ColumnNotFound("total".to_owned()));
        assert!(matches!(failed, StoreError::Db(_)));
        assert!(!failed.is_transient());
    }
}
