//! The webhook outbox on Postgres: events written with their completion,
//! leased to one sender at a time (`FOR UPDATE SKIP LOCKED`), and attempts.

use std::time::Duration;

use uuid::Uuid;

use super::{PgStore, PgTx};
use crate::ledger::ParentId;
use crate::store::StoreResult;
use crate::store::webhooks::{AttemptOutcome, AttemptRow, Delivery, DueEvent, EventRow, attempts};

/// The outbox rows of the parents `bumped` just completed, as one more CTE of
/// a statement that runs `BUMP_PARENTS`. It reads `bumped` only where
/// `completed`, and looks each such parent's `webhook_url` up by its key (a
/// subquery per row, never a join the planner could turn into a scan): a
/// statement that completes nothing reads and writes nothing here. (`parent`
/// is read as it was before the statement: its `webhook_url` does not change,
/// and `completed_at` is this transaction's `now()`.)
pub(super) const ENQUEUE_BUMPED: &str = "webhook_events AS ( \
        INSERT INTO webhook_event (event_id, parent_id, completed_at, url) \
        SELECT gen_random_uuid(), c.parent_id, now(), c.url FROM ( \
            SELECT b.parent_id, (SELECT p.webhook_url FROM parent p WHERE p.parent_id = b.parent_id) AS url \
            FROM bumped b WHERE b.completed) c \
        WHERE c.url IS NOT NULL \
        ON CONFLICT (parent_id, completed_at) DO NOTHING)";

/// See `store::webhooks::enqueue_completed`.
pub(in crate::store) async fn enqueue_completed(tx: &mut PgTx, parent_ids: &[ParentId]) -> StoreResult<u64> {
    let ids: Vec<&str> = parent_ids.iter().map(ParentId::as_str).collect();
    let written = sqlx::query(
        "INSERT INTO webhook_event (event_id, parent_id, completed_at, url) \
         SELECT gen_random_uuid(), p.parent_id, p.completed_at, p.webhook_url \
         FROM parent p WHERE p.parent_id = ANY($1::text[]) \
           AND p.completed_at IS NOT NULL AND p.webhook_url IS NOT NULL \
         ON CONFLICT (parent_id, completed_at) DO NOTHING",
    )
    .bind(&ids)
    .execute(&mut **tx)
    .await?;
    Ok(written.rows_affected())
}

impl PgStore {
    pub async fn claim_webhooks(&self, limit: i64, lease: Duration) -> StoreResult<Vec<DueEvent>> {
        let rows: Vec<(Uuid, String, String, i32, i32, Option<String>)> = sqlx::query_as(
            "WITH due AS ( \
                 SELECT event_id FROM webhook_event \
                 WHERE state = 'pending' AND next_attempt_at <= now() \
                   AND (lease_expires_at IS NULL OR lease_expires_at <= now()) \
                 ORDER BY next_attempt_at LIMIT $1 FOR UPDATE SKIP LOCKED) \
             UPDATE webhook_event e SET attempts = e.attempts + 1, \
                 lease_expires_at = clock_timestamp() + $2 * interval '1 millisecond' \
             FROM due WHERE e.event_id = due.event_id \
             RETURNING e.event_id, e.parent_id, e.url, e.attempts, e.failures, e.body",
        )
        .bind(limit)
        .bind(lease.as_millis() as f64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(event_id, parent_id, url, attempt, failures, body)| DueEvent {
                event_id,
                parent_id: ParentId::from_ledger(parent_id),
                url,
                attempt,
                failures,
                body,
            })
            .collect())
    }

    pub async fn fix_webhook_body(&self, event_id: Uuid, body: &str) -> StoreResult<String> {
        Ok(
            sqlx::query_scalar("UPDATE webhook_event SET body = coalesce(body, $2) WHERE event_id = $1 RETURNING body")
                .bind(event_id)
                .bind(body)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or_else(|| body.to_owned()),
        )
    }

    pub async fn record_webhook_attempt(
        &self,
        event: &DueEvent,
        outcome: &AttemptOutcome,
        sender: &str,
    ) -> StoreResult<()> {
        // `$4`: 'delivered', 'pending' (again after `$5` ms) or 'failed'.
        let state = match (outcome.delivered, outcome.retry_in) {
            (true, _) => "delivered",
            (false, Some(_)) => "pending",
            (false, None) => "failed",
        };
        let retry_ms = outcome.retry_in.map(|d| d.as_millis() as f64);
        sqlx::query(
            "WITH moved AS ( \
                 UPDATE webhook_event SET state = $4, lease_expires_at = NULL, \
                     failures = CASE WHEN $4 = 'delivered' THEN failures ELSE failures + 1 END, \
                     next_attempt_at = CASE WHEN $5::float8 IS NULL THEN next_attempt_at \
                                            ELSE clock_timestamp() + $5 * interval '1 millisecond' END, \
                     delivered_at = CASE WHEN $4 = 'delivered' THEN clock_timestamp() END \
                 WHERE event_id = $1 AND attempts = $2 AND state = 'pending' AND lease_expires_at IS NOT NULL \
                 RETURNING next_attempt_at) \
             INSERT INTO webhook_attempt (event_id, attempt, attempted_at, status_code, error, next_attempt_at, sender) \
             VALUES ($1, $2, clock_timestamp(), $6, $7, \
                     CASE WHEN $4 = 'pending' THEN clock_timestamp() + $5 * interval '1 millisecond' END, $3) \
             ON CONFLICT (event_id, attempt) DO NOTHING",
        )
        .bind(event.event_id)
        .bind(event.attempt)
        .bind(sender)
        .bind(state)
        .bind(retry_ms)
        .bind(outcome.status_code.map(i32::from))
        .bind(outcome.error.as_deref())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn deliveries(&self, parent_id: &ParentId) -> StoreResult<Vec<Delivery>> {
        let events: Vec<EventRow> = sqlx::query_as(
            "SELECT event_id::text AS event_id, url, state, completed_at, created_at, next_attempt_at, delivered_at \
             FROM webhook_event WHERE parent_id = $1 ORDER BY created_at, event_id",
        )
        .bind(parent_id.as_str())
        .fetch_all(&self.pool)
        .await?;
        let mut deliveries = Vec::with_capacity(events.len());
        for event in events {
            let rows: Vec<AttemptRow> = sqlx::query_as(
                "SELECT attempt, attempted_at, status_code, error, next_attempt_at FROM webhook_attempt \
                 WHERE event_id = $1::uuid ORDER BY attempt",
            )
            .bind(&event.event_id)
            .fetch_all(&self.pool)
            .await?;
            deliveries.push(event.into_delivery(attempts(rows))?);
        }
        Ok(deliveries)
    }

    pub async fn redeliver(&self, parent_id: &ParentId) -> StoreResult<bool> {
        let queued = sqlx::query(
            "UPDATE webhook_event SET state = 'pending', failures = 0, next_attempt_at = now(), \
                 lease_expires_at = NULL, delivered_at = NULL \
             WHERE event_id = (SELECT event_id FROM webhook_event WHERE parent_id = $1 \
                               ORDER BY created_at DESC, event_id DESC LIMIT 1)",
        )
        .bind(parent_id.as_str())
        .execute(&self.pool)
        .await?;
        Ok(queued.rows_affected() > 0)
    }

    pub async fn webhook_backlog(&self) -> StoreResult<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM webhook_event WHERE state = 'pending'")
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
