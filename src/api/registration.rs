//! What a registration, an append and a seal carry, and how each is checked
//! into what the store writes: every field named in its 4xx, nothing written.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use utoipa::ToSchema;

use super::validate::{ChildChecker, ChildFields, ChildList, child_count, in_range, null_payload, raw_json_within};
use super::whole;
use crate::error::{ApiError, ApiResult};
use crate::ledger::admission::{ParentAdmission, RetryBackoff};
use crate::ledger::fingerprint::{RegistrationContent, fingerprint};
use crate::ledger::{ExpiredLease, NewChild, ParentId, QueueName, Registration, Tolerance};
use crate::limits::Limits;

/// A parent registration: the full child list, written before anything is dispatched.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"queue": "events", "children": [
    {"key": "evt-1", "payload": {"event_id": "evt-1", "ts": "2026-11-29T10:00:00Z"}},
    {"key": "evt-2", "payload": {"event_id": "evt-2"}, "skip": "invalid timestamp"}
]}))]
pub struct RegisterParent {
    /// Queue for queue-wide claims; default `"default"`.
    #[schema(example = "events")]
    queue: Option<QueueName>,
    /// Retained parent payload (e.g. the remote response a legacy parent still needs decomposed).
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<RawValue>>,
    /// The children; `children[i]` gets `sequence = i`. At most 100,000 (configurable)
    /// per request: use append + seal beyond that.
    #[serde(default)]
    #[schema(value_type = Vec<ChildSpec>)]
    children: ChildList<ChildSpec>,
    /// `true` (default): the list is complete, and rows and the decomposed mark are
    /// written in one transaction. `false`: the parent stays `decomposing` until sealed.
    decomposed: Option<bool>,
    /// When a child whose lease expired has been claimed this many times, it
    /// becomes `failed` (`attempts exhausted`). `null`: unlimited.
    #[schema(minimum = 1, maximum = 2147483647)]
    #[serde(default, deserialize_with = "whole::option")]
    max_attempts: Option<i32>,
    /// What an expired lease does: `retry` (default) or `hold`.
    expired_lease: Option<ExpiredLease>,
    /// Queue claims serve strictly higher priorities first; default 0.
    #[schema(minimum = -100, maximum = 100)]
    #[serde(default, deserialize_with = "whole::option")]
    priority: Option<i32>,
    /// Where to `POST` the `parent.completed` event when the parent completes
    /// (signed, Standard Webhooks, with the queue's secret); its host must be
    /// in `--webhook-allow-hosts`. Written as the WHATWG URL parser writes it
    /// back (lowercase host, no default port, a path), without credentials
    /// or fragment; readers other than admins see its query as `?redacted`.
    #[schema(example = "https://hooks.example.com/ledger", max_length = 2048)]
    webhook_url: Option<String>,
    /// No child is claimable before this moment (RFC 3339); a child's own
    /// `not_before` may make it later still.
    #[schema(example = "2026-12-01T09:00:00Z")]
    not_before: Option<DateTime<Utc>>,
    /// A child handed out again (its lease expired, or it was released
    /// without a delay) waits a random time between 0 and
    /// `min(max_seconds, initial_seconds * 2^(attempt - 1))` first.
    retry_backoff: Option<RetryBackoff>,
    /// The tenant, account or remote host the children count against: the
    /// queue's per-key limits apply to it. 1-128 of `[A-Za-z0-9._:-]`, not only dots.
    #[schema(
        example = "tenant-42",
        min_length = 1,
        max_length = 128,
        pattern = "^[A-Za-z0-9._:-]{1,128}$"
    )]
    flow_key: Option<String>,
    /// How many failed children to tolerate: `{"count": 10}` or
    /// `{"percent": 5.0}` (of `total`). The outcome that crosses it skips
    /// every open child (`parent failed`) and completes the parent with
    /// verdict `failed`, in its own transaction. `null`: the parent succeeds
    /// whatever failed.
    tolerated_failures: Option<ToleratedFailures>,
}

/// `tolerated_failures`: exactly one of a count and a percentage.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToleratedFailures {
    /// At most this many failed children.
    #[schema(minimum = 0, example = 10)]
    #[serde(default, deserialize_with = "whole::option")]
    count: Option<i64>,
    /// At most this percentage of `total` failed.
    #[schema(minimum = 0, maximum = 100, example = 5.0)]
    percent: Option<f64>,
}

/// One child of a registration.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChildSpec {
    /// The work item, any JSON.
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<RawValue>>,
    /// Optional client identity (e.g. an event id), unique within the parent.
    #[schema(min_length = 1)]
    key: Option<String>,
    /// Store the child as `skipped` with this reason: invalid input is recorded
    /// and counted, never dropped.
    #[schema(min_length = 1)]
    skip: Option<String>,
    /// This child's W3C trace context, handed back with its claims (instead
    /// of the registration's `traceparent` header). Not part of its content.
    /// One W3C says to ignore (version `ff`, an all-zero id) is kept as none.
    #[schema(example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    #[schema(pattern = "^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$")]
    traceparent: Option<String>,
    /// Not claimable before this moment (RFC 3339), nor before its parent's
    /// `not_before`. Part of its content.
    #[schema(example = "2026-12-01T09:30:00Z")]
    not_before: Option<DateTime<Utc>>,
}

/// One child of an append, with its explicit sequence.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendChild {
    #[schema(minimum = 0)]
    #[serde(deserialize_with = "whole::required")]
    sequence: i64,
    #[schema(value_type = Option<Value>)]
    payload: Option<Box<RawValue>>,
    #[schema(min_length = 1)]
    key: Option<String>,
    #[schema(min_length = 1)]
    skip: Option<String>,
    /// This child's W3C trace context (see registration).
    #[schema(pattern = "^[0-9a-fA-F]{2}-[0-9a-fA-F]{32}-[0-9a-fA-F]{16}-[0-9a-fA-F]{2}$")]
    traceparent: Option<String>,
    /// Not claimable before this moment (see registration).
    not_before: Option<DateTime<Utc>>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendChildren {
    /// At least one child; at most 100,000 (configurable) per request.
    #[schema(min_items = 1, value_type = Vec<AppendChild>)]
    children: ChildList<AppendChild>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SealParent {
    /// Exactly sequences `0..total-1` must exist.
    #[schema(minimum = 0, maximum = 4611686018427387903_i64)]
    #[serde(deserialize_with = "whole::required")]
    pub(super) total: i64,
}

impl super::extract::Bulk for RegisterParent {
    fn read_children(&mut self, body: &[u8], max: usize) -> ApiResult<()> {
        self.children.read(body, "children", max)
    }
}

impl super::extract::Bulk for AppendChildren {
    fn read_children(&mut self, body: &[u8], max: usize) -> ApiResult<()> {
        self.children.read(body, "children", max)
    }
}

impl RegisterParent {
    /// The checked registration of `parent_id`, with its fingerprint.
    pub(super) fn into_registration(self, parent_id: ParentId, limits: &Limits) -> ApiResult<Registration> {
        child_count("children", self.children.items.len(), limits.max_children_per_request)?;
        if let Some(max) = self.max_attempts {
            in_range("max_attempts", max, 1, i32::MAX)?;
        }
        let priority = self.priority.unwrap_or(0);
        in_range("priority", priority, -100, 100)?;
        if let Some(url) = &self.webhook_url {
            if url.len() > 2048 {
                return Err(ApiError::invalid("webhook_url", "longer than 2048 bytes"));
            }
            limits
                .webhook_allow_hosts
                .check(url)
                .map_err(|why| ApiError::invalid("webhook_url", why))?;
        }
        // Kept as the text sent; parsed once, only to fingerprint it as before.
        let parsed_payload: Option<Value> = match &self.payload {
            Some(payload) => {
                raw_json_within("payload", payload, limits.max_payload_bytes)?;
                Some(serde_json::from_str(payload.get()).map_err(|e| ApiError::invalid("payload", e.to_string()))?)
            }
            None => None,
        };
        let mut checker = ChildChecker::new(limits.max_payload_bytes);
        let children = self
            .children
            .items
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                checker.check(
                    &format!("children[{i}]"),
                    i as i64,
                    ChildFields {
                        payload: c.payload,
                        key: c.key,
                        skip: c.skip,
                        traceparent: c.traceparent,
                        not_before: c.not_before,
                    },
                )
            })
            .collect::<ApiResult<Vec<_>>>()?;
        let admission = admission(self.not_before, self.retry_backoff, self.flow_key)?;
        let tolerance = tolerance(self.tolerated_failures)?;
        let queue = self.queue.unwrap_or_default();
        let decomposed = self.decomposed.unwrap_or(true);
        let expired_lease = self.expired_lease.unwrap_or_default();
        let fingerprint = fingerprint(&RegistrationContent {
            queue: queue.as_str(),
            payload: parsed_payload.as_ref(),
            decomposed,
            max_attempts: self.max_attempts,
            expired_lease,
            priority,
            webhook_url: self.webhook_url.as_deref(),
            admission: &admission,
            tolerance,
            children: &children,
        });
        Ok(Registration {
            parent_id,
            queue,
            payload: self.payload,
            decomposed,
            max_attempts: self.max_attempts,
            expired_lease,
            priority,
            webhook_url: self.webhook_url,
            admission,
            tolerance,
            children,
            fingerprint,
            traceparent: None,
        })
    }
}

impl AppendChildren {
    /// The checked children of an append; a sequence repeated with the same
    /// content is one child, with other content a 409.
    pub(super) fn into_children(self, limits: &Limits) -> ApiResult<Vec<NewChild>> {
        child_count("children", self.children.items.len(), limits.max_children_per_request)?;
        if self.children.items.is_empty() {
            return Err(ApiError::invalid("children", "must hold at least one child"));
        }
        let mut checker = ChildChecker::new(limits.max_payload_bytes);
        let mut sequences = HashMap::new();
        let mut children = Vec::with_capacity(self.children.items.len());
        for (i, c) in self.children.items.into_iter().enumerate() {
            let field = format!("children[{i}]");
            if c.sequence < 0 {
                return Err(ApiError::invalid(format!("{field}.sequence"), "must be non-negative"));
            }
            if let Some(&first) = sequences.get(&c.sequence) {
                // A repeat is a retried page: the same child again is written once,
                // different content conflicts exactly as it would with a stored child.
                let repeat = NewChild {
                    sequence: c.sequence,
                    key: c.key,
                    payload: c.payload.unwrap_or_else(null_payload),
                    skip: c.skip,
                    traceparent: None,
                    not_before: c.not_before,
                };
                if repeat.same_content(&children[first]) {
                    continue;
                }
                return Err(ApiError::repeated_sequence_differs(&field, c.sequence));
            }
            sequences.insert(c.sequence, children.len());
            children.push(checker.check(
                &field,
                c.sequence,
                ChildFields {
                    payload: c.payload,
                    key: c.key,
                    skip: c.skip,
                    traceparent: c.traceparent,
                    not_before: c.not_before,
                },
            )?);
        }
        Ok(children)
    }
}

/// A registration's `tolerated_failures`, checked.
fn tolerance(tolerated: Option<ToleratedFailures>) -> ApiResult<Option<Tolerance>> {
    let Some(tolerated) = tolerated else { return Ok(None) };
    match (tolerated.count, tolerated.percent) {
        (Some(count), None) if count < 0 => Err(ApiError::invalid("tolerated_failures.count", "must be 0 or more")),
        (Some(count), None) => Ok(Some(Tolerance::Count(count))),
        (None, Some(percent)) if !(0.0..=100.0).contains(&percent) => Err(ApiError::invalid(
            "tolerated_failures.percent",
            "must be between 0 and 100",
        )),
        (None, Some(percent)) => Ok(Some(Tolerance::Percent(percent))),
        _ => Err(ApiError::invalid(
            "tolerated_failures",
            "give exactly one of count and percent",
        )),
    }
}

/// A registration's admission members, checked.
fn admission(
    not_before: Option<DateTime<Utc>>,
    retry_backoff: Option<RetryBackoff>,
    flow_key: Option<String>,
) -> ApiResult<ParentAdmission> {
    if let Some(backoff) = retry_backoff {
        for (field, value) in [
            ("retry_backoff.initial_seconds", backoff.initial_seconds),
            ("retry_backoff.max_seconds", backoff.max_seconds),
        ] {
            if !(0.0..=86_400.0).contains(&value) {
                return Err(ApiError::invalid(field, "must be between 0 and 86400 seconds"));
            }
        }
        if backoff.max_seconds < backoff.initial_seconds {
            return Err(ApiError::invalid(
                "retry_backoff.max_seconds",
                "must not be below initial_seconds",
            ));
        }
    }
    if let Some(key) = &flow_key {
        crate::ledger::admission::check_flow_key(key).map_err(|why| ApiError::invalid("flow_key", why))?;
    }
    Ok(ParentAdmission {
        not_before,
        flow_key,
        retry_backoff,
    })
}
