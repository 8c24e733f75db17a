//! The webhook outbox on SQLite: events written with their completion, leased
//! to one sender at a time (each claim is a write transaction, and SQLite has
//! one writer across processes), and attempts.

use std::sync::LazyLock;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::{SqliteStore, SqliteTx, now};
use crate::ledger::ParentId;
use crate::store::StoreResult;
use crate::store::webhooks::{AttemptOutcome, AttemptRow, Delivery, DueEvent, EventRow, attempts};

/// SQLite's clock `d` from now, as a `strftime` modifier.
fn later(d: Duration) -> String {
    format!("+{:.3} seconds", d.as_secs_f64())
}

/// See `store::webhooks::enqueue_completed`.
pub(in crate::store) async fn enqueue_completed(tx: &mut SqliteTx, parent_ids: &[ParentId]) -> StoreResult<u64> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "INSERT INTO webhook_event (event_id, parent_id, completed_at, url, next_attempt_at, created_at) \
             SELECT ?2, p.parent_id, p.completed_at, p.webhook_url, {now}, {now} \
             FROM parent p WHERE p.parent_id = ?1 AND p.completed_at IS NOT NULL AND p.webhook_url IS NOT NULL \
             ON CONFLICT (parent_id, completed_at) DO NOTHING",
            now = now!()
        )
    });
    let mut written = 0;
    for parent_id in parent_ids {
        written += sqlx::query(AssertSqlSafe(SQL.as_str()))
            .bind(parent_id.as_str())
            .bind(Uuid::new_v4().to_string())
            .execute(&mut **tx)
            .await?
            .rows_affected();
    }
    Ok(written)
}

impl SqliteStore {
    pub async fn claim_webhooks(&self, limit: i64, lease: Duration) -> StoreResult<Vec<DueEvent>> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE webhook_event SET attempts = attempts + 1, \
                     lease_expires_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?2) \
                 WHERE event_id IN ( \
                     SELECT event_id FROM webhook_event \
                     WHERE state = 'pending' AND next_attempt_at <= {now} \
                       AND (lease_expires_at IS NULL OR lease_expires_at <= {now}) \
                     ORDER BY next_attempt_at LIMIT ?1) \
                 RETURNING event_id, parent_id, url, attempts, failures, body",
                now = now!()
            )
        });
        let mut tx = self.begin().await?;
        let rows: Vec<(String, String, String, i32, i32, Option<String>)> = sqlx::query_as(AssertSqlSafe(SQL.as_str()))
            .bind(limit)
            .bind(later(lease))
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.into_iter()
            .map(|(event_id, parent_id, url, attempt, failures, body)| {
                Ok(DueEvent {
                    event_id: parse_uuid(&event_id)?,
                    parent_id: ParentId::from_ledger(parent_id),
                    url,
                    attempt,
                    failures,
                    body,
                })
            })
            .collect()
    }

    pub async fn fix_webhook_body(&self, event_id: Uuid, body: &str) -> StoreResult<String> {
        let mut tx = self.begin().await?;
        let fixed: Option<String> =
            sqlx::query_scalar("UPDATE webhook_event SET body = coalesce(body, ?2) WHERE event_id = ?1 RETURNING body")
                .bind(event_id.to_string())
                .bind(body)
                .fetch_optional(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(fixed.unwrap_or_else(|| body.to_owned()))
    }

    pub async fn record_webhook_attempt(
        &self,
        event: &DueEvent,
        outcome: &AttemptOutcome,
        sender: &str,
    ) -> StoreResult<()> {
        static MOVE: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE webhook_event SET state = ?3, lease_expires_at = NULL, \
                     failures = CASE WHEN ?3 = 'delivered' THEN failures ELSE failures + 1 END, \
                     next_attempt_at = CASE WHEN ?4 IS NULL THEN next_attempt_at \
                                            ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?4) END, \
                     delivered_at = CASE WHEN ?3 = 'delivered' THEN {now} END \
                 WHERE event_id = ?1 AND attempts = ?2 AND state = 'pending' AND lease_expires_at IS NOT NULL",
                now = now!()
            )
        });
        static ATTEMPT: LazyLock<String> = LazyLock::new(|| {
            format!(
                "INSERT INTO webhook_attempt (event_id, attempt, attempted_at, status_code, error, next_attempt_at, \
                                              sender) \
                 VALUES (?1, ?2, {now}, ?3, ?4, \
                         CASE WHEN ?5 IS NULL THEN NULL ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ?5) END, ?6) \
                 ON CONFLICT (event_id, attempt) DO NOTHING",
                now = now!()
            )
        });
        let state = match (outcome.delivered, outcome.retry_in) {
            (true, _) => "delivered",
            (false, Some(_)) => "pending",
            (false, None) => "failed",
        };
        let retry = if outcome.delivered {
            None
        } else {
            outcome.retry_in.map(later)
        };
        let event_id = event.event_id.to_string();
        let mut tx = self.begin().await?;
        sqlx::query(AssertSqlSafe(MOVE.as_str()))
            .bind(&event_id)
            .bind(event.attempt)
            .bind(state)
            .bind(retry.as_deref())
            .execute(&mut *tx)
            .await?;
        sqlx::query(AssertSqlSafe(ATTEMPT.as_str()))
            .bind(&event_id)
            .bind(event.attempt)
            .bind(outcome.status_code.map(i32::from))
            .bind(outcome.error.as_deref())
            .bind(retry.as_deref())
            .bind(sender)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn deliveries(&self, parent_id: &ParentId) -> StoreResult<Vec<Delivery>> {
        let events: Vec<EventRow> = sqlx::query_as(
            "SELECT event_id, url, state, completed_at, created_at, next_attempt_at, delivered_at \
             FROM webhook_event WHERE parent_id = ?1 ORDER BY created_at, event_id",
        )
        .bind(parent_id.as_str())
        .fetch_all(&self.readers)
        .await?;
        let mut deliveries = Vec::with_capacity(events.len());
        for event in events {
            let rows: Vec<AttemptRow> = sqlx::query_as(
                "SELECT attempt, attempted_at, status_code, error, next_attempt_at FROM webhook_attempt \
                 WHERE event_id = ?1 ORDER BY attempt",
            )
            .bind(&event.event_id)
            .fetch_all(&self.readers)
            .await?;
            deliveries.push(event.into_delivery(attempts(rows))?);
        }
        Ok(deliveries)
    }

    pub async fn redeliver(&self, parent_id: &ParentId) -> StoreResult<bool> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "UPDATE webhook_event SET state = 'pending', failures = 0, next_attempt_at = {now}, \
                     lease_expires_at = NULL, delivered_at = NULL \
                 WHERE event_id = (SELECT event_id FROM webhook_event WHERE parent_id = ?1 \
                                   ORDER BY created_at DESC, event_id DESC LIMIT 1)",
                now = now!()
            )
        });
        let mut tx = self.begin().await?;
        let queued = sqlx::query(AssertSqlSafe(SQL.as_str()))
            .bind(parent_id.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(queued.rows_affected() > 0)
    }

    pub async fn webhook_backlog(&self) -> StoreResult<i64> {
        Ok(
            sqlx::query_scalar("SELECT count(*) FROM webhook_event WHERE state = 'pending'")
                .fetch_one(&self.readers)
                .await?,
        )
    }
}

fn parse_uuid(text: &str) -> StoreResult<Uuid> {
    text.parse()
        .map_err(|e| crate::store::StoreError::Db(sqlx::Error::Decode(Box::new(e))))
}
