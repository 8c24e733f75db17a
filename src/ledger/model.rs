//! The ledger's records as the API shows them, and the inputs the store takes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use utoipa::ToSchema;
use uuid::Uuid;

use super::admission::ParentAdmission;
use super::ids::{ParentId, QueueName};
use super::state::{ChildState, ExpiredLease, Outcome, ParentState, PreviousAttempt};
use super::verdict::{Tolerance, Verdict};

/// A parent's (or a queue's) counters: the stored projection, kept by the
/// statements that move children (never counted per read; reconcile compares
/// them with the rows).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Counts {
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub pending: i64,
    pub in_flight: i64,
    pub held: i64,
}

/// The counts of non-terminal rows, by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenCounts {
    pub pending: i64,
    pub in_flight: i64,
    pub held: i64,
}

/// A parent: its derived state and the projection of its children.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Parent {
    pub parent_id: ParentId,
    pub queue: QueueName,
    pub state: ParentState,
    /// `processed + failed + skipped >= total` on a decomposed parent.
    pub complete: bool,
    pub counts: Counts,
    /// `null` while it is open; once complete, `succeeded`, `failed` (its
    /// failures crossed `tolerated_failures`) or `cancelled`.
    pub verdict: Option<Verdict>,
    /// How many failed children it tolerates before it fails, as registered;
    /// `null`: none (it succeeds whatever failed).
    pub tolerated_failures: Option<Tolerance>,
    /// The parent whose children it was redriven from; `null` when registered.
    pub redrive_of: Option<ParentId>,
    /// Claims a child may take before an expired lease fails it; `null` = unlimited.
    pub max_attempts: Option<i32>,
    pub expired_lease: ExpiredLease,
    /// Queue claims serve higher priorities first (-100..100).
    pub priority: i32,
    /// Where its completion event is delivered (`POST`); `null`: none. Its
    /// query string, which may hold the receiver's secret, is shown only to
    /// an admin: every other caller sees it as `?redacted`.
    pub webhook_url: Option<String>,
    #[serde(flatten)]
    pub admission: ParentAdmission,
    pub created_at: DateTime<Utc>,
    pub decomposed_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    /// When an outcome was last recorded for one of its children (processed,
    /// failed or skipped after registration; a lease run out of attempts
    /// counts too); `null` until then. A dashboard's "stuck since".
    pub last_progress_at: Option<DateTime<Utc>>,
    /// The retained parent payload; only with `?include=payload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Value>)]
    pub payload: Option<Box<RawValue>>,
}

/// A parent row as stored, before the open counts are added.
#[derive(Debug, Clone)]
pub struct ParentRow {
    pub parent_id: ParentId,
    pub queue: QueueName,
    pub payload: Option<Box<RawValue>>,
    pub max_attempts: Option<i32>,
    pub expired_lease: ExpiredLease,
    pub priority: i32,
    pub webhook_url: Option<String>,
    pub admission: ParentAdmission,
    pub total: i64,
    pub processed: i64,
    pub failed: i64,
    pub skipped: i64,
    pub created_at: DateTime<Utc>,
    pub decomposed_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub last_progress_at: Option<DateTime<Utc>>,
    pub tolerance: Option<Tolerance>,
    /// A cancel completed it.
    pub cancelled: bool,
    pub redrive_of: Option<ParentId>,
}

impl ParentRow {
    pub fn into_parent(self, open: OpenCounts, include_payload: bool) -> Parent {
        let decomposed = self.decomposed_at.is_some();
        let terminal = self.processed + self.failed + self.skipped;
        Parent {
            state: ParentState::derive(decomposed, self.completed_at.is_some()),
            complete: decomposed && terminal >= self.total,
            verdict: Verdict::of(
                self.completed_at.is_some(),
                self.cancelled,
                self.tolerance,
                self.failed,
                self.total,
            ),
            tolerated_failures: self.tolerance,
            redrive_of: self.redrive_of,
            counts: Counts {
                total: self.total,
                processed: self.processed,
                failed: self.failed,
                skipped: self.skipped,
                pending: open.pending,
                in_flight: open.in_flight,
                held: open.held,
            },
            parent_id: self.parent_id,
            queue: self.queue,
            max_attempts: self.max_attempts,
            expired_lease: self.expired_lease,
            priority: self.priority,
            webhook_url: self.webhook_url,
            admission: self.admission,
            created_at: self.created_at,
            decomposed_at: self.decomposed_at,
            completed_at: self.completed_at,
            last_progress_at: self.last_progress_at,
            payload: if include_payload { self.payload } else { None },
        }
    }
}

/// One losing outcome write, kept so a late write is answered and visible,
/// never silently dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Conflict {
    pub outcome: Outcome,
    pub reason: Option<String>,
    pub claim_id: Option<Uuid>,
    pub attempt: Option<i32>,
    pub at: DateTime<Utc>,
}

/// One child row: its state, current or last lease, outcome and conflict log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Child {
    pub parent_id: ParentId,
    pub sequence: i64,
    pub key: Option<String>,
    pub state: ChildState,
    /// The work item, as the JSON text it was registered with.
    #[schema(value_type = Value)]
    pub payload: Box<RawValue>,
    /// How many times the child has been claimed.
    pub attempts: i32,
    /// `"{parent_id}/{sequence}"`: pass it to remote APIs so a repeated attempt is recognised.
    pub idempotency_key: String,
    /// The claim that last took this child.
    pub claim_id: Option<Uuid>,
    pub claimed_by: Option<String>,
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// How the last attempt ended: `released` or `expired`; `null` if never.
    pub previous_attempt: Option<PreviousAttempt>,
    /// The child is not claimable before this time (its `not_before`, a
    /// delayed release or a retry backoff).
    pub available_at: Option<DateTime<Utc>>,
    /// Its own `not_before` from its registration; `null`: none.
    pub not_before: Option<DateTime<Utc>>,
    pub outcome: Option<Outcome>,
    pub reason: Option<String>,
    #[schema(value_type = Option<Value>)]
    pub result: Option<Box<RawValue>>,
    /// The attempt whose write won. Below `attempts` when the previous holder
    /// (its lease expired, or it released the child) won after the child was
    /// handed out again: its work may have happened. `null` for children skipped
    /// at registration and for writes from a claim older than the previous one.
    pub outcome_attempt: Option<i32>,
    pub terminal_at: Option<DateTime<Utc>>,
    /// When the child last changed state (registered, claimed, released,
    /// expired, retried or given its outcome): for a pending child, since
    /// when it waits. Cross-parent search lists newest change first.
    pub changed_at: DateTime<Utc>,
    /// The most recent outcome writes (20 at most) that lost to the first one.
    pub conflicts: Vec<Conflict>,
    /// How many outcome writes lost to the first one, all of them.
    pub conflict_count: i64,
    /// The child this one was redriven from; `null` for a registered child.
    pub redrive_of: Option<RedriveOf>,
}

/// The child a redriven child was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RedriveOf {
    pub parent_id: ParentId,
    pub sequence: i64,
}

/// A child handed out by a claim.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClaimedChild {
    pub parent_id: ParentId,
    pub sequence: i64,
    pub key: Option<String>,
    #[schema(value_type = Value)]
    pub payload: Box<RawValue>,
    /// 1 on the first claim, +1 for each later claim.
    pub attempt: i32,
    pub idempotency_key: String,
    /// `null` on a first attempt; `released` when the last holder gave it back;
    /// `expired` when the last lease ran out: the earlier attempt may have had its
    /// effect, so check the remote side with `idempotency_key` before repeating it.
    pub previous_attempt: Option<PreviousAttempt>,
    /// The W3C trace context to do this child's work in: the child's own
    /// from its registration, else its parent's (the registration's
    /// `traceparent` header); `null` when neither carried one. With trace
    /// export on, it names this claim's span of the child, in that trace.
    /// Send it back as the `traceparent` header of the outcome.
    #[schema(example = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]
    pub traceparent: Option<String>,
}

/// A child to be written by a registration or an append. The payload stays
/// the JSON text the client sent: a 100,000-child registration never builds
/// 100,000 JSON trees.
#[derive(Debug, Clone)]
pub struct NewChild {
    pub sequence: i64,
    pub key: Option<String>,
    pub payload: Box<serde_json::value::RawValue>,
    /// When set, the child is stored `skipped` with this reason.
    pub skip: Option<String>,
    /// Its W3C trace context, kept and handed back with its claims (not part
    /// of its content: a repeat with another one is the same child).
    pub traceparent: Option<String>,
    /// Not claimable before this moment (nor before its parent's).
    pub not_before: Option<DateTime<Utc>>,
}

impl NewChild {
    /// Same sequence, key, skip reason and payload, the payloads compared as
    /// JSON values (member order and spacing aside), as a stored child is.
    pub fn same_content(&self, other: &NewChild) -> bool {
        let value = |p: &serde_json::value::RawValue| serde_json::from_str::<serde_json::Value>(p.get()).ok();
        self.sequence == other.sequence
            && self.key == other.key
            && self.skip == other.skip
            && self.not_before == other.not_before
            && value(&self.payload) == value(&other.payload)
    }
}

/// A complete, validated parent registration.
#[derive(Debug, Clone)]
pub struct Registration {
    pub parent_id: ParentId,
    pub queue: QueueName,
    /// As sent: JSON text, stored as it came.
    pub payload: Option<Box<RawValue>>,
    pub decomposed: bool,
    pub max_attempts: Option<i32>,
    pub expired_lease: ExpiredLease,
    pub priority: i32,
    /// Checked against `--webhook-allow-hosts`.
    pub webhook_url: Option<String>,
    pub admission: ParentAdmission,
    pub tolerance: Option<Tolerance>,
    pub children: Vec<NewChild>,
    /// Digest of the whole registration: an identical repeat writes nothing.
    pub fingerprint: String,
    /// The registration's W3C trace context (its `traceparent` header), kept
    /// for the children that have none of their own.
    pub traceparent: Option<String>,
}

/// Which children a claim draws from.
#[derive(Debug, Clone)]
pub enum ClaimScope {
    Parent(ParentId),
    Queue(QueueName),
}

impl ClaimScope {
    /// The one parent the claim draws from, if it is a parent's claim.
    pub fn parent(&self) -> Option<&ParentId> {
        match self {
            Self::Parent(parent_id) => Some(parent_id),
            Self::Queue(_) => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub scope: ClaimScope,
    /// For a parent's claim by a caller limited to some queues: the queue the
    /// parent was in when the caller's reach was checked. A parent now in
    /// another queue (deleted, and registered again elsewhere) hands out
    /// nothing and answers as unknown, on every recheck of a long poll.
    pub queue: Option<QueueName>,
    pub claim_id: Uuid,
    pub limit: i64,
    pub lease_seconds: i64,
    pub worker: Option<String>,
    /// The response's bytes: fewer than `limit` children when they would not fit.
    pub budget: super::budget::ByteBudget,
}

/// One terminal outcome to record.
#[derive(Debug, Clone)]
pub struct OutcomeWrite {
    pub parent_id: ParentId,
    pub sequence: i64,
    pub outcome: Outcome,
    pub reason: Option<String>,
    /// Kept as the JSON text the worker sent, from the request to the row.
    pub result: Option<Box<RawValue>>,
    pub claim_id: Option<Uuid>,
}

/// What became of one outcome write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeStatus {
    /// This write made the child terminal.
    Applied,
    /// The same outcome was already recorded: nothing changed.
    Duplicate,
    /// A different outcome already won; this write is kept in the child's `conflicts`.
    Conflict,
    /// The write's `claim_id` is neither the child's current claim nor its
    /// previous one: nothing was written.
    ClaimMismatch,
    NotFound,
    /// The parent is still decomposing: no outcome can be recorded yet.
    NotDecomposed,
}

impl OutcomeStatus {
    /// Every status, in the order the metrics list them.
    pub const ALL: [OutcomeStatus; 6] = [
        Self::Applied,
        Self::Duplicate,
        Self::Conflict,
        Self::ClaimMismatch,
        Self::NotFound,
        Self::NotDecomposed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::Conflict => "conflict",
            Self::ClaimMismatch => "claim_mismatch",
            Self::NotFound => "not_found",
            Self::NotDecomposed => "not_decomposed",
        }
    }
}

/// What became of one item of an outcome batch. Only `applied` changed
/// anything; the others are final answers, not errors to retry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchResult {
    pub parent_id: ParentId,
    pub sequence: i64,
    pub status: OutcomeStatus,
}

/// The answer to a claim: the children handed out under one lease.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Claim {
    /// Names this claim; the lease token for `extend` and `release`.
    pub claim_id: Uuid,
    /// When the lease on every child of this claim runs out; `null` when no
    /// child was claimable.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// Lowest sequence first; empty when nothing is claimable now.
    pub children: Vec<ClaimedChild>,
    /// On an empty claim that the queue's or a key's limits (or a
    /// `not_before`) held back: when children may be claimable again (a
    /// slot may free sooner, when an outcome is recorded). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_available_at: Option<DateTime<Utc>>,
    /// When the claim carried `outcomes`: what became of each, in request
    /// order, as `POST /v1/outcomes` answers them. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_results: Option<Vec<BatchResult>>,
}

/// What an append wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Appended {
    /// Children written by this request.
    pub inserted: u64,
    /// Children that were already in the ledger with the same content.
    pub existing: u64,
}
