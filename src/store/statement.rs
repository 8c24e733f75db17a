//! Statements as data: SQL text with its values in bind order, so a
//! statement both dialects write alike is written once and run by either
//! backend (`Backend::fetch`, `Transaction::execute`, ...).
//!
//! Where the dialects differ only in a few words (the clock, a lock, a JSON
//! function, the queue-scope test) a statement is built from the dialect's
//! fragments (`Dialect`) once per dialect (`Sql`). Where they differ in shape
//! (arrays against `json_each`, one statement against several), the
//! statement is a method of the backend traits instead (`backend.rs`).

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// One value bound to a statement. Each backend binds each kind its own way
/// (SQLite keeps times and uuids as text); every kind keeps its Rust type, so
/// Postgres infers the same parameter types as for a typed bind.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Value<'a> {
    Text(Option<&'a str>),
    Int(Option<i64>),
    Int32(Option<i32>),
    Float(Option<f64>),
    Bool(bool),
    Time(Option<DateTime<Utc>>),
    Uuid(Option<Uuid>),
}

/// SQL text and its values, `$1` first.
#[derive(Debug, Clone)]
pub(crate) struct Statement<'a> {
    pub sql: &'static str,
    pub values: Vec<Value<'a>>,
}

impl<'a> Statement<'a> {
    pub fn new(sql: &'static str) -> Self {
        Self {
            sql,
            values: Vec::new(),
        }
    }

    pub fn text(mut self, value: impl Into<Option<&'a str>>) -> Self {
        self.values.push(Value::Text(value.into()));
        self
    }

    pub fn int(mut self, value: impl Into<Option<i64>>) -> Self {
        self.values.push(Value::Int(value.into()));
        self
    }

    pub fn int32(mut self, value: impl Into<Option<i32>>) -> Self {
        self.values.push(Value::Int32(value.into()));
        self
    }

    pub fn float(mut self, value: impl Into<Option<f64>>) -> Self {
        self.values.push(Value::Float(value.into()));
        self
    }

    pub fn bool(mut self, value: bool) -> Self {
        self.values.push(Value::Bool(value));
        self
    }

    pub fn time(mut self, value: impl Into<Option<DateTime<Utc>>>) -> Self {
        self.values.push(Value::Time(value.into()));
        self
    }

    pub fn uuid(mut self, value: impl Into<Option<Uuid>>) -> Self {
        self.values.push(Value::Uuid(value.into()));
        self
    }
}

/// What differs between the two SQL dialects in the statements they share,
/// as words to build statements from.
#[derive(Debug)]
pub(crate) struct Dialect {
    /// `Sql`'s slot for this dialect's texts.
    pub(super) slot: usize,
    /// The database clock.
    pub now: &'static str,
    /// The database clock as the statement starts (Postgres' `now()` is
    /// the transaction's start, which orders claims by when they began,
    /// not by when they took the lock they waited for).
    pub statement_now: &'static str,
    /// The current minute since the epoch, by the database clock.
    pub minute: &'static str,
    /// The database clock in seconds since the epoch, as a float.
    pub epoch: &'static str,
    /// Appended to a read that locks the rows it reads until the transaction
    /// ends (SQLite's write transaction already holds its one lock).
    pub for_update: &'static str,
    /// An expression that lets the transaction commit without waiting for
    /// its flush, for a commit whose answer waits for the flush afterwards
    /// (Postgres' `synchronous_commit`, for this transaction). SQLite: none.
    pub unflushed_commit: Option<&'static str>,
    /// Appended to a subquery picking rows another transaction may be taking.
    pub skip_locked: &'static str,
    /// A stamp later than every `flow_limit.served` of queue `$1`: Postgres
    /// draws it from a sequence (`flow_limit_served`, migration 0026), in
    /// one step however many keys the queue has; SQLite reads the queue's
    /// highest by its index.
    pub flow_served: &'static str,
    /// The larger of two values.
    pub greatest: &'static str,
    /// The clock `param` seconds (a float parameter) from now.
    pub later: fn(param: &str) -> String,
    /// The clock `param` seconds ago.
    pub ago: fn(param: &str) -> String,
    /// Time text `param` (as SQLite writes times) as a value of a time column.
    pub as_time: fn(param: &str) -> String,
    /// JSON text `param` as a value of a `json` column.
    pub json: fn(param: &str) -> String,
    /// A JSON array column with JSON text `param` appended to it.
    pub json_push: fn(column: &str, param: &str) -> String,
    /// The length of a JSON array column.
    pub json_length: fn(column: &str) -> String,
    /// The bytes of a JSON column's text (NULL for NULL).
    pub json_bytes: fn(column: &str) -> String,
    /// The sequences claim lease `alias` lists, as a `FROM` item `ls` whose
    /// column `value` is each sequence (and those a `processed_batch` row
    /// lists: the same columns, `lo`, `hi` and `sequences`).
    pub lease_sequences: fn(alias: &str) -> String,
    /// Whether claim lease `lease`'s list names child `sequence`.
    pub lease_holds: fn(lease: &str, sequence: &str) -> String,
    /// Column `column` of the outcome batch that recorded child row `c`
    /// without rewriting it (migration 0023 on Postgres, 0022 on SQLite; see
    /// `sql::child_view`), as a scalar subquery.
    pub quiet_batch: fn(column: &str) -> String,
    /// Rows `(n, t)` of JSON text `param`, an array of `[integer, text]` pairs.
    pub json_pairs: fn(param: &str) -> String,
    /// A subquery of the texts of JSON array text `param` (`x IN (...)`).
    pub json_texts: fn(param: &str) -> String,
    /// After a table in `FROM`: read it through index `name` (SQLite's
    /// planner, without statistics, may pick another that sorts).
    pub indexed_by: fn(name: &str) -> String,
    /// `QueueScope::allows` for parent `p`'s queue, the scope bound as
    /// `QueueScope::as_json` text `param` (`sql::within_postgres`, `within_sqlite`).
    pub within: fn(param: &str) -> String,
}

/// A shared statement: its text, built from each dialect's fragments the
/// first time that dialect runs it.
pub(crate) struct Sql {
    build: fn(&Dialect) -> String,
    texts: [OnceLock<String>; 2],
}

impl Sql {
    pub const fn new(build: fn(&Dialect) -> String) -> Self {
        Self {
            build,
            texts: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The statement's text in `dialect`.
    pub fn of(&'static self, dialect: &Dialect) -> &'static str {
        self.texts[dialect.slot].get_or_init(|| (self.build)(dialect))
    }
}

/// A family of shared statements told apart by an index (a state, a way of
/// starting a read): each text built the first time its dialect runs it.
pub(crate) struct SqlSet<const N: usize> {
    build: fn(&Dialect, usize) -> String,
    texts: [[OnceLock<String>; N]; 2],
}

impl<const N: usize> SqlSet<N> {
    pub const fn new(build: fn(&Dialect, usize) -> String) -> Self {
        Self {
            build,
            texts: [const { [const { OnceLock::new() }; N] }; 2],
        }
    }

    /// Statement `i`'s text in `dialect`.
    pub fn of(&'static self, dialect: &Dialect, i: usize) -> &'static str {
        self.texts[dialect.slot][i].get_or_init(|| (self.build)(dialect, i))
    }
}

/// The span of one statement, beneath its request's span: exported with
/// traces (`telemetry`), never logged; with export off nobody listens and
/// it costs a disabled callsite's check.
pub(crate) fn span(sql: &'static str) -> tracing::Span {
    let verb = sql.split_whitespace().next().unwrap_or("statement");
    tracing::trace_span!(
        target: "child_ledger::sql",
        "statement",
        otel.name = %format_args!("statement {verb}"),
        otel.kind = "client",
        db.query.text = sql,
    )
}
