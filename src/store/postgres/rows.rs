//! Postgres rows into ledger records.

use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::ledger::{
    Child, ChildState, ClaimedChild, Conflict, OpenCounts, Outcome, Parent, ParentId, ParentRow, QueueName,
    idempotency_key,
};
use crate::store::rows::parse_column;

pub(super) fn parent(row: &PgRow, include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.try_get("parent_id")?),
        queue: QueueName::from_ledger(row.try_get("queue")?),
        payload: row.try_get("payload")?,
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

pub(super) fn child(row: &PgRow) -> Result<Child, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let state: ChildState = parse_column(row.try_get("state")?)?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    let conflicts: Option<sqlx::types::Json<Vec<Conflict>>> = row.try_get("conflicts")?;
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        state,
        payload: row.try_get("payload")?,
        attempts: row.try_get("attempts")?,
        claim_id: row.try_get("claim_id")?,
        claimed_by: row.try_get("claimed_by")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
        available_at: row.try_get("available_at")?,
        outcome: Outcome::from_state(state),
        reason: row.try_get("reason")?,
        result: row.try_get("result")?,
        outcome_attempt: row.try_get("outcome_attempt")?,
        terminal_at: row.try_get("terminal_at")?,
        conflicts: conflicts.map(|c| c.0).unwrap_or_default(),
    })
}

pub(super) fn claimed_child(row: &PgRow) -> Result<ClaimedChild, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    Ok(ClaimedChild {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        payload: row.try_get("payload")?,
        attempt: row.try_get("attempts")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
    })
}
