//! The completion webhook sender: claims due events from the outbox with a
//! lease, `POST`s each signed the Standard Webhooks way, and records every
//! attempt. Every replica runs one; the leases keep them off each other's
//! attempts, and a killed replica's lease runs out for another to take over.
//! Each event is signed with its queue's secret (derived from the master
//! `--webhook-secret`), so a receiver of one queue cannot be sent a validly
//! signed event of another. At most `BATCH` attempts run at once, each
//! holding at most a small, fixed buffer of its answer (`webhook_client`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};

use super::webhook_client::{self, Resolve};
use crate::ledger::webhook::{AllowHosts, RetrySchedule, WebhookSecret};
use crate::state::AppState;
use crate::store::{AttemptOutcome, DueEvent};

/// Events claimed per round; a full round is followed by another at once.
const BATCH: i64 = 32;

/// The header that names the event's queue: which queue's secret verifies
/// it (the signed body says so too, in `data.queue`).
pub const QUEUE_HEADER: &str = "child-ledger-queue";

/// What the sender needs from the configuration.
#[derive(Debug, Clone)]
pub struct WebhookSender {
    /// The master secret: each queue's events are signed with
    /// `secret.for_queue(queue)`.
    pub secret: WebhookSecret,
    pub allow: AllowHosts,
    pub schedule: RetrySchedule,
    pub poll: Duration,
    /// Longest one attempt may take; the lease is twice that.
    pub timeout: Duration,
    /// Resolves host names at every attempt.
    pub resolver: Arc<dyn Resolve>,
}

/// Delivers due events until the process ends: at once when this process
/// completes a parent, and every `poll` for other replicas' and retries.
pub async fn send_webhooks(state: AppState, sender: WebhookSender) {
    let me = format!("{:016x}", state.replica);
    let lease = sender.timeout * 2;
    // A round's attempts all finish (each within the timeout) before it stops.
    while !state.is_shutting_down() {
        let mut full = false;
        match state.store.claim_webhooks(BATCH, lease).await {
            Ok(events) => {
                full = events.len() as i64 == BATCH;
                let attempts = events.into_iter().map(|event| attempt(&state, &sender, &me, event));
                futures::future::join_all(attempts).await;
            }
            Err(err) => tracing::warn!(error = %err, "webhook claim failed; retrying"),
        }
        match state.store.webhook_backlog().await {
            Ok(backlog) => state.metrics.webhook_backlog(backlog),
            Err(err) => tracing::debug!(error = %err, "webhook backlog not counted"),
        }
        if !full {
            let mut stopping = state.shutdown.subscribe();
            tokio::select! {
                () = state.store.webhook_due() => {}
                () = tokio::time::sleep(sender.poll) => {}
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
        }
    }
}

/// One attempt at one event, recorded.
async fn attempt(state: &AppState, sender: &WebhookSender, me: &str, event: DueEvent) {
    let webhook_id = event.webhook_id();
    let sent = tokio::time::timeout(sender.timeout, post(state, sender, &event, &webhook_id))
        .await
        .unwrap_or_else(|_| Err(format!("timed out after {} ms", sender.timeout.as_millis())));
    let (status_code, error) = match sent {
        Ok(status) if (200..300).contains(&status) => (Some(status), None),
        Ok(status) => (Some(status), Some(format!("answered {status}"))),
        Err(error) => (None, Some(error)),
    };
    let delivered = error.is_none();
    let failures = u32::try_from(event.failures).unwrap_or(0) + 1;
    let retry_in = if delivered {
        None
    } else {
        sender.schedule.after(failures)
    };
    let status = match (delivered, retry_in) {
        (true, _) => "delivered",
        (false, Some(_)) => "retrying",
        (false, None) => "failed",
    };
    state.metrics.webhook_delivery(status);
    match &error {
        None => tracing::info!(parent_id = %event.parent_id, webhook_id, attempt = event.attempt, "webhook delivered"),
        Some(error) => tracing::warn!(
            parent_id = %event.parent_id,
            webhook_id,
            attempt = event.attempt,
            error,
            retry_in_ms = retry_in.map(|d| d.as_millis() as u64),
            "webhook not delivered"
        ),
    }
    let outcome = AttemptOutcome {
        status_code,
        error,
        delivered,
        retry_in,
    };
    if let Err(err) = state.store.record_webhook_attempt(&event, &outcome, me).await {
        // Its lease runs out and the event is attempted again, with the same id.
        tracing::warn!(error = %err, webhook_id, "webhook attempt not recorded");
    }
}

/// Sends the event; its status, or why there was none.
async fn post(state: &AppState, sender: &WebhookSender, event: &DueEvent, webhook_id: &str) -> Result<u16, String> {
    // Checked again at every attempt: the allowed hosts may have changed, and
    // the name is resolved (and its addresses checked) now, not at registration.
    let target = sender.allow.check(&event.url)?;
    let addresses = webhook_client::checked_addresses(&target, &sender.allow, sender.resolver.as_ref()).await?;
    let body = match &event.body {
        Some(body) => body.clone(),
        None => {
            let body = event_body(state, event).await?;
            state
                .store
                .fix_webhook_body(event.event_id, &body)
                .await
                .map_err(|e| format!("database: {e}"))?
        }
    };
    let queue = queue_of_body(&body)?;
    let timestamp = Utc::now().timestamp();
    let signature = sender.secret.for_queue(&queue).sign(webhook_id, timestamp, &body);
    let headers = [
        ("content-type", "application/json".to_owned()),
        (
            "user-agent",
            concat!("child-ledger/", env!("CARGO_PKG_VERSION")).to_owned(),
        ),
        ("webhook-id", webhook_id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
        (QUEUE_HEADER, queue),
    ];
    webhook_client::post(&target, addresses, &headers, body).await
}

/// The queue an event body names (`data.queue`): whose secret signs it.
fn queue_of_body(body: &str) -> Result<String, String> {
    let body: serde_json::Value = serde_json::from_str(body).map_err(|e| format!("event body: {e}"))?;
    body["data"]["queue"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| "the event body names no queue".to_owned())
}

/// An error with its causes (hyper's own words are terse: "client error (Connect)").
pub(super) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `{"type": "parent.completed", "timestamp", "data": {parent_id, queue, counts, verdict, completed_at}}`.
async fn event_body(state: &AppState, event: &DueEvent) -> Result<String, String> {
    let parent = state
        .store
        .parent(&event.parent_id, false)
        .await
        .map_err(|e| format!("database: {e}"))?;
    let completed_at = parent
        .completed_at
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Micros, true));
    let body = serde_json::json!({
        "type": "parent.completed",
        "timestamp": completed_at,
        "data": {
            "parent_id": parent.parent_id,
            "queue": parent.queue,
            "counts": parent.counts,
            "verdict": parent.verdict,
            "completed_at": completed_at,
        }
    });
    Ok(body.to_string())
}
