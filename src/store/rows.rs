//! What the store reads back besides ledger records: rows both backends
//! decode the same way, and the small reports its statements return.

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use crate::ledger::admission::{ParentAdmission, RetryBackoff};
use crate::ledger::{
    Child, ChildState, ClaimedChild, Conflict, OpenCounts, Outcome, Parent, ParentId, ParentRow, QueueName, RedriveOf,
    Tolerance, idempotency_key,
};

/// A row as the ledger reads it, by column name. Plain types read the same
/// on both backends; each says how it keeps JSON and uuids (`DialectRow`).
pub(crate) trait LedgerRow {
    fn text(&self, column: &str) -> Result<String, sqlx::Error>;
    fn opt_text(&self, column: &str) -> Result<Option<String>, sqlx::Error>;
    fn int(&self, column: &str) -> Result<i64, sqlx::Error>;
    fn opt_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error>;
    fn int32(&self, column: &str) -> Result<i32, sqlx::Error>;
    fn opt_int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error>;
    fn float(&self, column: &str) -> Result<f64, sqlx::Error>;
    fn opt_float(&self, column: &str) -> Result<Option<f64>, sqlx::Error>;
    fn bool(&self, column: &str) -> Result<bool, sqlx::Error>;
    fn time(&self, column: &str) -> Result<DateTime<Utc>, sqlx::Error>;
    fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error>;
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error>;
    /// A JSON column as its text, not parsed into a tree.
    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error>;
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error>;
}

/// How a backend's rows keep what the dialects store differently.
pub(crate) trait DialectRow {
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error>;
    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error>;
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error>;
}

/// Every backend row whose database decodes the plain types is a `LedgerRow`.
impl<R> LedgerRow for R
where
    R: sqlx::Row + DialectRow,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> f64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> bool: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> DateTime<Utc>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn text(&self, column: &str) -> Result<String, sqlx::Error> {
        self.try_get(column)
    }
    fn opt_text(&self, column: &str) -> Result<Option<String>, sqlx::Error> {
        self.try_get(column)
    }
    fn int(&self, column: &str) -> Result<i64, sqlx::Error> {
        self.try_get(column)
    }
    fn opt_int(&self, column: &str) -> Result<Option<i64>, sqlx::Error> {
        self.try_get(column)
    }
    fn int32(&self, column: &str) -> Result<i32, sqlx::Error> {
        self.try_get(column)
    }
    fn opt_int32(&self, column: &str) -> Result<Option<i32>, sqlx::Error> {
        self.try_get(column)
    }
    fn float(&self, column: &str) -> Result<f64, sqlx::Error> {
        self.try_get(column)
    }
    fn opt_float(&self, column: &str) -> Result<Option<f64>, sqlx::Error> {
        self.try_get(column)
    }
    fn bool(&self, column: &str) -> Result<bool, sqlx::Error> {
        self.try_get(column)
    }
    fn time(&self, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
        self.try_get(column)
    }
    fn opt_time(&self, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        self.try_get(column)
    }
    fn json(&self, column: &str) -> Result<Option<Value>, sqlx::Error> {
        DialectRow::json(self, column)
    }
    fn raw_json(&self, column: &str) -> Result<Option<Box<serde_json::value::RawValue>>, sqlx::Error> {
        DialectRow::raw_json(self, column)
    }
    fn uuid(&self, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
        DialectRow::uuid(self, column)
    }
}

/// A parent row with its open counts.
pub(crate) fn parent(row: &(impl LedgerRow + ?Sized), include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.text("parent_id")?),
        queue: QueueName::from_ledger(row.text("queue")?),
        // Decoded only when asked for: a page of parents must not build every
        // retained payload to drop it.
        payload: if include_payload {
            row.raw_json("payload")?
        } else {
            None
        },
        max_attempts: row.opt_int32("max_attempts")?,
        expired_lease: parse_column(&row.text("expired_lease")?)?,
        priority: row.int32("priority")?,
        webhook_url: row.opt_text("webhook_url")?,
        admission: ParentAdmission {
            not_before: row.opt_time("not_before")?,
            flow_key: row.opt_text("flow_key")?,
            retry_backoff: match (row.opt_float("backoff_initial")?, row.opt_float("backoff_max")?) {
                (Some(initial_seconds), Some(max_seconds)) => Some(RetryBackoff {
                    initial_seconds,
                    max_seconds,
                }),
                _ => None,
            },
        },
        total: row.int("total")?,
        processed: row.int("processed")?,
        failed: row.int("failed")?,
        skipped: row.int("skipped")?,
        created_at: row.time("created_at")?,
        decomposed_at: row.opt_time("decomposed_at")?,
        completed_at: row.opt_time("completed_at")?,
        last_progress_at: row.opt_time("last_progress_at")?,
        tolerance: Tolerance::from_columns(row.opt_int("tolerated_count")?, row.opt_float("tolerated_percent")?),
        cancelled: row.opt_time("cancelled_at")?.is_some(),
        redrive_of: row.opt_text("redrive_of")?.map(ParentId::from_ledger),
    };
    let open = OpenCounts {
        // A count is never below zero, even over a drifted projection
        // (reconcile shows and repairs that drift).
        pending: row.int("open_pending")?.max(0),
        in_flight: row.int("open_in_flight")?,
        held: row.int("open_held")?,
    };
    Ok(parent.into_parent(open, include_payload))
}

/// JSON `null`, for a payload column that holds none.
fn null_json() -> Box<serde_json::value::RawValue> {
    serde_json::value::RawValue::from_string("null".to_owned()).expect("null is JSON")
}

/// A child row (`sql::child_columns`).
pub(crate) fn child(row: &(impl LedgerRow + ?Sized)) -> Result<Child, sqlx::Error> {
    let parent_id = row.text("parent_id")?;
    let sequence = row.int("sequence")?;
    let state: ChildState = parse_column(&row.text("state")?)?;
    let conflicts: Vec<Conflict> = match row.json("conflicts")? {
        Some(value) => serde_json::from_value(value).map_err(|e| sqlx::Error::Decode(e.into()))?,
        None => Vec::new(),
    };
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.opt_text("key")?,
        state,
        payload: row.raw_json("payload")?.unwrap_or_else(null_json),
        attempts: row.int32("attempts")?,
        claim_id: row.uuid("claim_id")?,
        claimed_by: row.opt_text("claimed_by")?,
        lease_expires_at: row.opt_time("lease_expires_at")?,
        previous_attempt: row
            .opt_text("previous_attempt")?
            .as_deref()
            .map(parse_column)
            .transpose()?,
        available_at: row.opt_time("available_at")?,
        not_before: row.opt_time("not_before")?,
        outcome: Outcome::from_state(state),
        reason: row.opt_text("reason")?,
        result: row.raw_json("result")?,
        outcome_attempt: row.opt_int32("outcome_attempt")?,
        terminal_at: row.opt_time("terminal_at")?,
        changed_at: row.time("changed_at")?,
        conflicts,
        conflict_count: row.int("conflict_count")?,
        redrive_of: match (
            optional(row.opt_text("redrive_of_parent"))?,
            optional(row.opt_int("redrive_of_sequence"))?,
        ) {
            (Some(parent_id), Some(sequence)) => Some(RedriveOf {
                parent_id: ParentId::from_ledger(parent_id),
                sequence,
            }),
            _ => None,
        },
    })
}

/// A column some statements that read children do not select: `None` there.
fn optional<T>(read: Result<Option<T>, sqlx::Error>) -> Result<Option<T>, sqlx::Error> {
    match read {
        Err(sqlx::Error::ColumnNotFound(_)) => Ok(None),
        other => other,
    }
}

/// A child a claim statement leased, with its lease expiry and its parent's queue.
pub(crate) fn claimed_child(
    row: &(impl LedgerRow + ?Sized),
) -> Result<(ClaimedChild, DateTime<Utc>, QueueName), sqlx::Error> {
    let child = claimed(
        ParentId::from_ledger(row.text("parent_id")?),
        row.int("sequence")?,
        row.opt_text("key")?,
        row.raw_json("payload")?.unwrap_or_else(null_json),
        row.int32("attempts")?,
        row.opt_text("previous_attempt")?.as_deref(),
        row.opt_text("traceparent")?,
    )?;
    Ok((
        child,
        row.time("lease_expires_at")?,
        QueueName::from_ledger(row.text("queue")?),
    ))
}

/// A claimed child from what a claim statement read of it.
pub(crate) fn claimed(
    parent_id: ParentId,
    sequence: i64,
    key: Option<String>,
    payload: Box<serde_json::value::RawValue>,
    attempt: i32,
    previous_attempt: Option<&str>,
    traceparent: Option<String>,
) -> Result<ClaimedChild, sqlx::Error> {
    Ok(ClaimedChild {
        idempotency_key: idempotency_key(parent_id.as_str(), sequence),
        parent_id,
        sequence,
        key,
        payload,
        attempt,
        previous_attempt: previous_attempt.map(parse_column).transpose()?,
        traceparent,
    })
}

/// Parses a stored enum value, turning a bad one into a decode error.
pub(crate) fn parse_column<T: std::str::FromStr<Err = String>>(value: &str) -> Result<T, sqlx::Error> {
    value.parse().map_err(|e: String| sqlx::Error::Decode(e.into()))
}
