//! What reconcile answers: one parent's projection against its rows, a page
//! of a sweep, and a background sweep's progress.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::ids::{ParentId, QueueName};
use super::projection::{Change, DerivedProjection, StoredProjection};

/// One parent's projection compared with its rows.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReconcileReport {
    pub parent_id: ParentId,
    pub dry_run: bool,
    /// Whether this call wrote the repair.
    pub applied: bool,
    pub stored: StoredProjection,
    pub derived: DerivedProjection,
    /// Empty when the projection agrees with the ledger.
    pub changes: Vec<Change>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SweepReport {
    pub dry_run: bool,
    /// Parents compared.
    pub checked: u64,
    /// Parents whose projection disagreed with their rows.
    pub drifted: u64,
    /// Parents repaired by this call.
    pub repaired: u64,
    /// The drifted parents' reports.
    pub parents: Vec<ReconcileReport>,
    /// Pass as `cursor` to check the next parents; `null` once every parent
    /// has been checked.
    pub next_cursor: Option<String>,
}

/// Where a background reconcile sweep is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Queued or being worked, a page at a time.
    Running,
    /// Every parent was checked: the report is final.
    Done,
    /// Stopped after repeated errors; `error` says the last one.
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }
}

/// A background reconcile sweep (`POST /v1/reconcile/jobs`): its progress so
/// far and, once `done`, its report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReconcileJob {
    pub job_id: Uuid,
    pub state: JobState,
    pub dry_run: bool,
    /// Only this queue's parents; `null`: every queue.
    pub queue: Option<QueueName>,
    /// Parents compared so far.
    pub checked: u64,
    /// Parents whose projection disagreed with their rows, so far.
    pub drifted: u64,
    /// Parents repaired, so far.
    pub repaired: u64,
    /// The first drifted parents' reports (at most 1000; `drifted` counts all).
    pub parents: Vec<ReconcileReport>,
    /// Why the job failed; `null` unless `failed` (or retrying a failed step).
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The queues the job may reach: its queue, or its creator's reach
    /// (`None` when the stored reach does not read). Not shown: it decides
    /// who may see the job.
    #[serde(skip)]
    pub reach: Option<super::QueueScope>,
}

impl ReconcileJob {
    /// Whether a caller reaching `queues` may see this job: only when it
    /// reaches every queue the job may have touched, so a job's report never
    /// shows another tenant's parents or counts.
    pub fn visible_within(&self, queues: &super::QueueScope) -> bool {
        match (&self.queue, &self.reach) {
            (Some(queue), _) => queues.allows(queue.as_str()),
            (None, Some(reach)) => queues.covers(reach),
            (None, None) => queues.is_every(),
        }
    }
}
