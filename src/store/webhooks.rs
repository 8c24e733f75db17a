//! The completion webhooks' outbox: an event row per completion, written in
//! the transaction that completes the parent (`Transaction::enqueue_completed`,
//! and the same SQL inside the statements that complete parents on their
//! own); the sender's leased claims of due events (`SKIP LOCKED` on
//! Postgres, one writer on SQLite); every attempt, recorded.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::rows::LedgerRow;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult};
use crate::ledger::ParentId;

/// Where a completion event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its next attempt (or being attempted).
    Pending,
    /// A 2xx answered it.
    Delivered,
    /// Every retry failed; `POST …/deliveries/redeliver` queues it again.
    Failed,
}

/// An event the sender claimed: its lease runs while it is attempted.
#[derive(Debug, Clone)]
pub struct DueEvent {
    pub event_id: Uuid,
    pub parent_id: ParentId,
    pub url: String,
    /// This attempt's number (1 for the first).
    pub attempt: i32,
    /// Failed attempts in a row before this one.
    pub failures: i32,
    /// The body the first attempt fixed; `None` before it.
    pub body: Option<String>,
}

impl DueEvent {
    /// The `webhook-id`: the same on every attempt of this event.
    pub fn webhook_id(&self) -> String {
        webhook_id(self.event_id)
    }
}

fn webhook_id(event_id: Uuid) -> String {
    format!("msg_{}", event_id.simple())
}

/// What one attempt came to.
#[derive(Debug, Clone)]
pub struct AttemptOutcome {
    /// The receiver's status, when it answered.
    pub status_code: Option<u16>,
    /// Why there was no 2xx answer (a timeout, a refused connection, a status).
    pub error: Option<String>,
    /// Delivered (a 2xx).
    pub delivered: bool,
    /// When not delivered: the wait before the next attempt; `None` gives up.
    pub retry_in: Option<Duration>,
}

/// One attempt to deliver an event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryAttempt {
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status; `null` when it did not answer.
    pub status_code: Option<i32>,
    /// Why the attempt did not deliver (timeout, connection, non-2xx); `null` when it did.
    pub error: Option<String>,
    /// When the next attempt is due; `null` after a delivery or when given up.
    pub next_attempt_at: Option<DateTime<Utc>>,
}

/// A completion event and its attempts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Delivery {
    /// The `webhook-id` header of every attempt: deduplicate on it.
    #[schema(example = "msg_5f0c3b7e9a2d4c1f8e6b0a9d7c5e3f1a")]
    pub webhook_id: String,
    pub url: String,
    pub state: DeliveryState,
    /// The completion this event announces.
    pub completed_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    /// When the next attempt is due, while `pending`.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub delivered_at: Option<DateTime<Utc>>,
    pub attempts: Vec<DeliveryAttempt>,
}

/// An attempt as read.
fn attempt(row: &dyn LedgerRow) -> Result<DeliveryAttempt, sqlx::Error> {
    Ok(DeliveryAttempt {
        attempt: row.int32("attempt")?,
        attempted_at: row.time("attempted_at")?,
        status_code: row.opt_int32("status_code")?,
        error: row.opt_text("error")?,
        next_attempt_at: row.opt_time("next_attempt_at")?,
    })
}

/// An event as read, before its attempts; and its id.
fn event(row: &dyn LedgerRow) -> StoreResult<(Uuid, Delivery)> {
    let event_id = row.uuid("event_id")?.ok_or(sqlx::Error::RowNotFound)?;
    let state = match row.text("state")?.as_str() {
        "pending" => DeliveryState::Pending,
        "delivered" => DeliveryState::Delivered,
        _ => DeliveryState::Failed,
    };
    let delivery = Delivery {
        webhook_id: webhook_id(event_id),
        url: row.text("url")?,
        state,
        completed_at: row.time("completed_at")?,
        created_at: row.time("created_at")?,
        next_attempt_at: Some(row.time("next_attempt_at")?).filter(|_| state == DeliveryState::Pending),
        delivered_at: row.opt_time("delivered_at")?,
        attempts: Vec::new(),
    };
    Ok((event_id, delivery))
}

/// Leases up to `$1` due events for `$2` seconds, one attempt each.
static CLAIM_DUE: Sql = Sql::new(|d| {
    format!(
        "UPDATE webhook_event SET attempts = attempts + 1, lease_expires_at = {lease} \
         WHERE event_id IN ( \
             SELECT event_id FROM webhook_event \
             WHERE state = 'pending' AND next_attempt_at <= {now} \
               AND (lease_expires_at IS NULL OR lease_expires_at <= {now}) \
             ORDER BY next_attempt_at LIMIT $1{skip_locked}) \
         RETURNING event_id, parent_id, url, attempts, failures, body",
        lease = (d.later)("$2"),
        now = d.now,
        skip_locked = d.skip_locked
    )
});

const FIX_BODY: &str = "UPDATE webhook_event SET body = coalesce(body, $2) WHERE event_id = $1 RETURNING body";

/// Moves an attempted event on: `$3` is `delivered`, `pending` (again in
/// `$4` seconds) or `failed`. Only the attempt that holds the lease moves it.
static MOVE_ATTEMPTED: Sql = Sql::new(|d| {
    format!(
        "UPDATE webhook_event SET state = $3, lease_expires_at = NULL, \
             failures = CASE WHEN $3 = 'delivered' THEN failures ELSE failures + 1 END, \
             next_attempt_at = CASE WHEN $4 IS NULL THEN next_attempt_at ELSE {later} END, \
             delivered_at = CASE WHEN $3 = 'delivered' THEN {now} END \
         WHERE event_id = $1 AND attempts = $2 AND state = 'pending' AND lease_expires_at IS NOT NULL",
        later = (d.later)("$4"),
        now = d.now
    )
});

/// Records an attempt (once: a repeat of the same attempt writes nothing).
static RECORD_ATTEMPT: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO webhook_attempt (event_id, attempt, attempted_at, status_code, error, next_attempt_at, sender) \
         VALUES ($1, $2, {now}, $3, $4, CASE WHEN $5 IS NULL THEN NULL ELSE {later} END, $6) \
         ON CONFLICT (event_id, attempt) DO NOTHING",
        now = d.now,
        later = (d.later)("$5")
    )
});

const EVENTS: &str = "SELECT event_id, url, state, completed_at, created_at, next_attempt_at, delivered_at \
    FROM webhook_event WHERE parent_id = $1 ORDER BY created_at, event_id";

const ATTEMPTS: &str = "SELECT attempt, attempted_at, status_code, error, next_attempt_at FROM webhook_attempt \
    WHERE event_id = $1 ORDER BY attempt";

/// Queues a parent's latest event again, due now, with a fresh run of retries.
static REDELIVER: Sql = Sql::new(|d| {
    format!(
        "UPDATE webhook_event SET state = 'pending', failures = 0, next_attempt_at = {now}, \
             lease_expires_at = NULL, delivered_at = NULL \
         WHERE event_id = (SELECT event_id FROM webhook_event WHERE parent_id = $1 \
                           ORDER BY created_at DESC, event_id DESC LIMIT 1)",
        now = d.now
    )
});

const BACKLOG: &str = "SELECT count(*) AS backlog FROM webhook_event WHERE state = 'pending'";

impl Store {
    /// Claims up to `limit` due events for one attempt each, leased for
    /// `lease`: no other sender takes them until the attempt is recorded or the
    /// lease runs out (a sender that died).
    pub async fn claim_webhooks(&self, limit: i64, lease: Duration) -> StoreResult<Vec<DueEvent>> {
        let rows = self
            .db
            .write(
                Statement::new(self.sql(&CLAIM_DUE))
                    .int(limit)
                    .float(lease.as_secs_f64()),
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(DueEvent {
                    event_id: row.uuid("event_id")?.ok_or(sqlx::Error::RowNotFound)?,
                    parent_id: ParentId::from_ledger(row.text("parent_id")?),
                    url: row.text("url")?,
                    attempt: row.int32("attempts")?,
                    failures: row.int32("failures")?,
                    body: row.opt_text("body")?,
                })
            })
            .collect()
    }

    /// Fixes an event's body unless an earlier attempt already did; returns
    /// the body every attempt sends.
    pub async fn fix_webhook_body(&self, event_id: Uuid, body: &str) -> StoreResult<String> {
        let rows = self
            .db
            .write(Statement::new(FIX_BODY).uuid(event_id).text(body))
            .await?;
        match rows.first() {
            Some(row) => Ok(row.text("body")?),
            None => Ok(body.to_owned()),
        }
    }

    /// Records an attempt by `sender` and moves its event on (delivered, due
    /// again later, or failed). An attempt whose lease was lost (it ran out
    /// and another sender took the event, or it was redelivered) is recorded
    /// but moves nothing.
    pub async fn record_webhook_attempt(
        &self,
        event: &DueEvent,
        outcome: &AttemptOutcome,
        sender: &str,
    ) -> StoreResult<()> {
        let state = match (outcome.delivered, outcome.retry_in) {
            (true, _) => "delivered",
            (false, Some(_)) => "pending",
            (false, None) => "failed",
        };
        // Seconds until the next attempt, when there is one.
        let retry = outcome.retry_in.filter(|_| !outcome.delivered).map(|d| d.as_secs_f64());
        let mut tx = self.db.begin().await?;
        tx.execute(
            Statement::new(self.sql(&MOVE_ATTEMPTED))
                .uuid(event.event_id)
                .int32(event.attempt)
                .text(state)
                .float(retry),
        )
        .await?;
        tx.execute(
            Statement::new(self.sql(&RECORD_ATTEMPT))
                .uuid(event.event_id)
                .int32(event.attempt)
                .int32(outcome.status_code.map(i32::from))
                .text(outcome.error.as_deref())
                .float(retry)
                .text(sender),
        )
        .await?;
        tx.commit().await
    }

    /// A parent's completion events with their attempts, oldest first.
    pub async fn deliveries(&self, parent_id: &ParentId) -> StoreResult<Vec<Delivery>> {
        self.require_parent(parent_id).await?;
        let events = self.db.fetch(Statement::new(EVENTS).text(parent_id.as_str())).await?;
        let mut deliveries = Vec::with_capacity(events.len());
        for row in &events {
            let (event_id, mut delivery) = event(&**row)?;
            let attempts = self.db.fetch(Statement::new(ATTEMPTS).uuid(event_id)).await?;
            delivery.attempts = attempts.iter().map(|row| attempt(&**row)).collect::<Result<_, _>>()?;
            deliveries.push(delivery);
        }
        Ok(deliveries)
    }

    /// Queues a parent's latest completion event again, due now, with a fresh
    /// run of retries. Returns whether there was one.
    pub async fn redeliver(&self, parent_id: &ParentId) -> StoreResult<bool> {
        self.require_parent(parent_id).await?;
        let queued = self
            .db
            .execute(Statement::new(self.sql(&REDELIVER)).text(parent_id.as_str()))
            .await?
            > 0;
        if queued {
            self.wake_webhooks();
        }
        Ok(queued)
    }

    /// Events not yet delivered nor given up (the outbox backlog).
    pub async fn webhook_backlog(&self) -> StoreResult<i64> {
        let rows = self.db.fetch(Statement::new(BACKLOG)).await?;
        Ok(rows.first().map(|row| row.int("backlog")).transpose()?.unwrap_or(0))
    }
}
