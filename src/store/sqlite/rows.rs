//! SQLite rows into ledger records: JSON and uuids are stored as text.

use serde_json::Value;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::ledger::{
    Child, ChildState, ClaimedChild, Conflict, OpenCounts, Outcome, Parent, ParentId, ParentRow, QueueName,
    idempotency_key,
};
use crate::store::rows::parse_column;

/// Reads a JSON text column.
fn json_column(row: &SqliteRow, column: &str) -> Result<Option<Value>, sqlx::Error> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
        .transpose()
}

fn uuid_column(row: &SqliteRow, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| Uuid::parse_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
        .transpose()
}

pub(super) fn parent(row: &SqliteRow, include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.try_get("parent_id")?),
        queue: QueueName::from_ledger(row.try_get("queue")?),
        payload: json_column(row, "payload")?,
        max_attempts: row.try_get("max_attempts")?,
        expired_lease: parse_column(row.try_get("expired_lease")?)?,
        total: row.try_get("total")?,
        processed: row.try_get("processed")?,
        failed: row.try_get("failed")?,
        skipped: row.try_get("skipped")?,
        created_at: row.try_get("created_at")?,
        decomposed_at: row.try_get("decomposed_at")?,
        completed_at: row.try_get("completed_at")?,
    };
    let open = OpenCounts {
        pending: row.try_get("open_pending")?,
        in_flight: row.try_get("open_in_flight")?,
        held: row.try_get("open_held")?,
    };
    Ok(parent.into_parent(open, include_payload))
}

pub(super) fn child(row: &SqliteRow) -> Result<Child, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let state: ChildState = parse_column(row.try_get("state")?)?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    let conflicts: Vec<Conflict> = match json_column(row, "conflicts")? {
        Some(value) => serde_json::from_value(value).map_err(|e| sqlx::Error::Decode(e.into()))?,
        None => Vec::new(),
    };
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        state,
        payload: json_column(row, "payload")?.unwrap_or(Value::Null),
        attempts: row.try_get("attempts")?,
        claim_id: uuid_column(row, "claim_id")?,
        claimed_by: row.try_get("claimed_by")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
        available_at: row.try_get("available_at")?,
        outcome: Outcome::from_state(state),
        reason: row.try_get("reason")?,
        result: json_column(row, "result")?,
        outcome_attempt: row.try_get("outcome_attempt")?,
        terminal_at: row.try_get("terminal_at")?,
        conflicts,
    })
}

pub(super) fn claimed_child(row: &SqliteRow) -> Result<ClaimedChild, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    Ok(ClaimedChild {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        payload: json_column(row, "payload")?.unwrap_or(Value::Null),
        attempt: row.try_get("attempts")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
    })
}
