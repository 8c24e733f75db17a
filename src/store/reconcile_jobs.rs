//! Background reconcile sweeps: a job is a row, worked one drift page per
//! step by whichever replica holds its lease. A drifted parent is counted in
//! the transaction that repairs it, and a page's `checked` with the step that
//! ends it, so a step worked again after a crash counts nothing twice.

use std::time::Duration;

use super::reconcile::JobMark;
use super::{Db, Store, StoreError, StoreResult, dispatch};
use crate::access::QueueScope;
use crate::ledger::{JobState, QueueName, ReconcileJob};

/// How many drifted parents' reports a job keeps; `drifted` counts them all.
pub const JOB_PARENTS_KEPT: i64 = 1000;

/// Failed steps in a row after which a job is marked failed.
pub const JOB_STEP_ATTEMPTS: i64 = 5;

/// A job row as both backends read it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JobRow {
    pub job_id: String,
    pub state: String,
    pub dry_run: bool,
    pub queue: Option<String>,
    pub scope: Option<String>,
    pub after_position: i64,
    pub drift_position: i64,
    pub checked: i64,
    pub drifted: i64,
    pub repaired: i64,
    pub parents: String,
    pub error: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl JobRow {
    fn job_id(&self) -> StoreResult<uuid::Uuid> {
        uuid::Uuid::parse_str(&self.job_id).map_err(|e| StoreError::Db(sqlx::Error::Decode(Box::new(e))))
    }

    fn into_job(self) -> StoreResult<ReconcileJob> {
        let state = match self.state.as_str() {
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            _ => JobState::Running,
        };
        Ok(ReconcileJob {
            job_id: self.job_id()?,
            state,
            dry_run: self.dry_run,
            queue: self.queue.map(QueueName::from_ledger),
            checked: self.checked as u64,
            drifted: self.drifted as u64,
            repaired: self.repaired as u64,
            parents: serde_json::from_str(&self.parents)
                .map_err(|e| StoreError::Db(sqlx::Error::Decode(Box::new(e))))?,
            error: self.error,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A job this process holds the lease of, with where it is.
#[derive(Debug)]
pub struct JobLease {
    job_id: uuid::Uuid,
    dry_run: bool,
    queue: Option<QueueName>,
    /// `None` when the stored scope does not read: every step then fails.
    scope: Option<QueueScope>,
    after_position: i64,
    drift_position: i64,
}

impl JobLease {
    pub fn job_id(&self) -> uuid::Uuid {
        self.job_id
    }
}

/// What one step of a job came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobStep {
    /// More parents remain.
    Continue,
    /// The last parent was checked: the job is done.
    Done,
    /// Another worker holds the job now (this one's lease ran out): stop.
    Lost,
}

impl Store {
    /// A new running job, for the background loop to take.
    pub async fn create_reconcile_job(
        &self,
        dry_run: bool,
        queue: Option<&QueueName>,
        within: &QueueScope,
    ) -> StoreResult<ReconcileJob> {
        let job_id = uuid::Uuid::new_v4();
        let scope = within.as_json();
        let row = dispatch!(self, s => s.insert_job(job_id, dry_run, queue, scope.as_deref()).await)?;
        row.into_job()
    }

    pub async fn reconcile_job(&self, job_id: uuid::Uuid) -> StoreResult<Option<ReconcileJob>> {
        dispatch!(self, s => s.job_row(job_id).await)?
            .map(JobRow::into_job)
            .transpose()
    }

    /// Takes the oldest running job whose lease is free or ran out, for
    /// `lease`, as `owner`.
    pub async fn take_reconcile_job(&self, owner: &str, lease: Duration) -> StoreResult<Option<JobLease>> {
        let Some(row) = dispatch!(self, s => s.take_job(owner, lease.as_secs_f64()).await)? else {
            return Ok(None);
        };
        Ok(Some(JobLease {
            job_id: row.job_id()?,
            dry_run: row.dry_run,
            queue: row.queue.map(QueueName::from_ledger),
            scope: QueueScope::from_json(row.scope.as_deref()),
            after_position: row.after_position,
            drift_position: row.drift_position,
        }))
    }

    /// Checks the next `batch` parents of a held job, repairs them unless it
    /// is a dry run, and renews the lease for `lease`.
    pub async fn reconcile_job_step(
        &self,
        job: &mut JobLease,
        owner: &str,
        lease: Duration,
        batch: i64,
    ) -> StoreResult<JobStep> {
        let Some(scope) = &job.scope else {
            return Err(StoreError::Db(sqlx::Error::Protocol(
                "the job's stored queue scope does not read".to_owned(),
            )));
        };
        let page = dispatch!(self, s => s.drift_page(job.queue.as_ref(), scope, job.after_position, batch).await)?;
        for (parent_id, position) in page.drifted {
            // Counted before a crash: repaired then, or still to be shown once only.
            if position <= job.drift_position {
                continue;
            }
            let mark = JobMark {
                job_id: job.job_id,
                owner,
                position,
            };
            match self.reconcile_marked(&parent_id, job.dry_run, Some(mark)).await {
                Ok(Some(report)) => {
                    if !report.changes.is_empty() {
                        job.drift_position = position;
                    }
                }
                Ok(None) => return Ok(JobStep::Lost),
                // Deleted since the page was read: nothing to reconcile.
                Err(StoreError::ParentNotFound(_)) => {}
                Err(err) => return Err(err),
            }
        }
        let done = page.next.is_none();
        let after = page.next.unwrap_or(job.after_position);
        let checked = page.checked as i64;
        let held = dispatch!(self, s => s.finish_job_page(job.job_id, owner, checked, after, done, lease.as_secs_f64()).await)?;
        if !held {
            return Ok(JobStep::Lost);
        }
        job.after_position = after;
        job.drift_position = job.drift_position.max(after);
        Ok(if done { JobStep::Done } else { JobStep::Continue })
    }

    /// Records a failed step: the job is retried (by any replica) after
    /// `retry_in`, or marked failed once `JOB_STEP_ATTEMPTS` failed in a row.
    /// `None` when the job was no longer this owner's.
    pub async fn fail_reconcile_job_step(
        &self,
        job_id: uuid::Uuid,
        owner: &str,
        error: &str,
        retry_in: Duration,
    ) -> StoreResult<Option<JobState>> {
        let state = dispatch!(self, s => s.fail_job_step(job_id, owner, error, JOB_STEP_ATTEMPTS, retry_in.as_secs_f64()).await)?;
        Ok(state.map(|s| {
            if s == "failed" {
                JobState::Failed
            } else {
                JobState::Running
            }
        }))
    }
}
