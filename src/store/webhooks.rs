//! The completion webhooks' outbox: an event row per completion, written in
//! the transaction that completes the parent; the sender's leased claims of
//! due events; every attempt, recorded.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::{Db, Store, StoreError, StoreResult, Tx, dispatch};
use crate::ledger::ParentId;

/// Writes the completion event of each of `parent_ids` that has a
/// `webhook_url`, inside the transaction that completed them: call it after
/// the statement that set their `completed_at`, before `commit`, then hand the
/// parents to `Store::completed` after the commit (which wakes the sender).
/// Idempotent: one event per parent and `completed_at`, so a second call for
/// the same completion writes nothing. Returns how many events it wrote.
pub(in crate::store) async fn enqueue_completed(tx: &mut Tx, parent_ids: &[ParentId]) -> StoreResult<u64> {
    if parent_ids.is_empty() {
        return Ok(0);
    }
    match tx {
        Tx::Postgres(tx) => super::postgres::webhooks::enqueue_completed(tx, parent_ids).await,
        Tx::Sqlite(tx) => super::sqlite::webhooks::enqueue_completed(tx, parent_ids).await,
    }
}

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

/// An attempt row: `attempt, attempted_at, status_code, error, next_attempt_at`.
pub(super) type AttemptRow = (i32, DateTime<Utc>, Option<i32>, Option<String>, Option<DateTime<Utc>>);

/// The attempts of one event, as read.
pub(super) fn attempts(rows: Vec<AttemptRow>) -> Vec<DeliveryAttempt> {
    rows.into_iter()
        .map(
            |(attempt, attempted_at, status_code, error, next_attempt_at)| DeliveryAttempt {
                attempt,
                attempted_at,
                status_code,
                error,
                next_attempt_at,
            },
        )
        .collect()
}

/// An event row as read for `Delivery`, before its attempts.
#[derive(Debug, sqlx::FromRow)]
pub(super) struct EventRow {
    pub event_id: String,
    pub url: String,
    pub state: String,
    pub completed_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub next_attempt_at: DateTime<Utc>,
    pub delivered_at: Option<DateTime<Utc>>,
}

impl EventRow {
    pub(super) fn into_delivery(self, attempts: Vec<DeliveryAttempt>) -> StoreResult<Delivery> {
        let event_id: Uuid = self
            .event_id
            .parse()
            .map_err(|e| StoreError::Db(sqlx::Error::Decode(Box::new(e))))?;
        let state = match self.state.as_str() {
            "pending" => DeliveryState::Pending,
            "delivered" => DeliveryState::Delivered,
            _ => DeliveryState::Failed,
        };
        Ok(Delivery {
            webhook_id: webhook_id(event_id),
            url: self.url,
            state,
            completed_at: self.completed_at,
            created_at: self.created_at,
            next_attempt_at: (state == DeliveryState::Pending).then_some(self.next_attempt_at),
            delivered_at: self.delivered_at,
            attempts,
        })
    }
}

impl Store {
    /// Claims up to `limit` due events for one attempt each, leased for
    /// `lease`: no other sender takes them until the attempt is recorded or the
    /// lease runs out (a sender that died).
    pub async fn claim_webhooks(&self, limit: i64, lease: Duration) -> StoreResult<Vec<DueEvent>> {
        dispatch!(self, s => s.claim_webhooks(limit, lease).await)
    }

    /// Fixes an event's body unless an earlier attempt already did; returns
    /// the body every attempt sends.
    pub async fn fix_webhook_body(&self, event_id: Uuid, body: &str) -> StoreResult<String> {
        dispatch!(self, s => s.fix_webhook_body(event_id, body).await)
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
        dispatch!(self, s => s.record_webhook_attempt(event, outcome, sender).await)
    }

    /// A parent's completion events with their attempts, oldest first.
    pub async fn deliveries(&self, parent_id: &ParentId) -> StoreResult<Vec<Delivery>> {
        self.require_parent(parent_id).await?;
        dispatch!(self, s => s.deliveries(parent_id).await)
    }

    /// Queues a parent's latest completion event again, due now, with a fresh
    /// run of retries. Returns whether there was one.
    pub async fn redeliver(&self, parent_id: &ParentId) -> StoreResult<bool> {
        self.require_parent(parent_id).await?;
        let queued = dispatch!(self, s => s.redeliver(parent_id).await)?;
        if queued {
            self.webhook_wake.notify_one();
        }
        Ok(queued)
    }

    /// Events not yet delivered nor given up (the outbox backlog).
    pub async fn webhook_backlog(&self) -> StoreResult<i64> {
        dispatch!(self, s => s.webhook_backlog().await)
    }

    /// Waits until this process completed a parent or queued a redelivery
    /// (the sender also polls: other replicas' completions do not wake it).
    pub async fn webhook_due(&self) {
        self.webhook_wake.notified().await;
    }
}
