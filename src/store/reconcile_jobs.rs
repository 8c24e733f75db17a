//! Background reconcile sweeps: a job is a row, worked one drift page per
//! step by whichever replica holds its lease. A drifted parent is counted in
//! the transaction that repairs it, and a page's `checked` with the step that
//! ends it, so a step worked again after a crash counts nothing twice. Any
//! replica takes a free job (`SKIP LOCKED` on Postgres; SQLite's one writer
//! makes the pick and the update one step).

use std::time::Duration;

use uuid::Uuid;

use super::backend::{DriftQuery, Transaction};
use super::rows::LedgerRow;
use super::statement::{Dialect, Sql, Statement};
use super::{Store, StoreError, StoreResult};
use crate::ledger::{JobState, ParentId, QueueName, QueueScope, ReconcileJob};

/// How many drifted parents' reports a job keeps; `drifted` counts them all.
pub const JOB_PARENTS_KEPT: i64 = 1000;

/// Failed steps in a row after which a job is marked failed.
pub const JOB_STEP_ATTEMPTS: i64 = 5;

/// A job row's columns as `JobRow` reads them.
const JOB_COLUMNS: &str = "job_id, state, dry_run, queue, scope, after_position, drift_position, \
     checked, drifted, repaired, parents, error, created_at, updated_at";

static INSERT_JOB: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO reconcile_job (job_id, dry_run, queue, scope, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, {now}, {now}) RETURNING {JOB_COLUMNS}",
        now = d.now
    )
});

static JOB: Sql = Sql::new(|_| format!("SELECT {JOB_COLUMNS} FROM reconcile_job WHERE job_id = $1"));

/// The oldest running job with a free or expired lease, skipping jobs
/// another replica is taking at this moment.
static TAKE_JOB: Sql = Sql::new(|d| {
    format!(
        "UPDATE reconcile_job SET lease_owner = $1, lease_expires_at = {later}, updated_at = {now} \
         WHERE job_id = (SELECT job_id FROM reconcile_job \
             WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < {now}) \
             ORDER BY created_at LIMIT 1{skip_locked}) \
         RETURNING {JOB_COLUMNS}",
        later = (d.later)("$2"),
        now = d.now,
        skip_locked = d.skip_locked
    )
});

/// Counts one drifted parent in its job; no row when the job is not this
/// owner's or counted that parent already.
static RECORD_DRIFT: Sql = Sql::new(|d| {
    format!(
        "UPDATE reconcile_job SET drifted = drifted + 1, repaired = repaired + $3, drift_position = $4, \
             parents = CASE WHEN {length} < $5 THEN {push} ELSE parents END, \
             updated_at = {now} \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' AND drift_position < $4",
        length = (d.json_length)("parents"),
        push = (d.json_push)("parents", "$6"),
        now = d.now
    )
});

/// Ends a step: `checked` grows, the job moves on (or is done) and the
/// lease is renewed.
static FINISH_PAGE: Sql = Sql::new(|d| {
    format!(
        "UPDATE reconcile_job SET checked = checked + $3, after_position = $4, \
             drift_position = {greatest}(drift_position, $4), \
             state = CASE WHEN $5 THEN 'done' ELSE state END, attempts = 0, error = NULL, \
             lease_expires_at = {later}, updated_at = {now} \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
        greatest = d.greatest,
        later = (d.later)("$6"),
        now = d.now
    )
});

/// A failed step: retried after `$5` seconds by whoever takes it, or failed
/// after `$4` in a row.
static FAIL_STEP: Sql = Sql::new(|d| {
    format!(
        "UPDATE reconcile_job SET attempts = attempts + 1, error = $3, \
             state = CASE WHEN attempts + 1 >= $4 THEN 'failed' ELSE state END, \
             lease_owner = NULL, lease_expires_at = {later}, updated_at = {now} \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' RETURNING state",
        later = (d.later)("$5"),
        now = d.now
    )
});

/// Gives a job back at once (its holder is stopping): the next replica to
/// look takes it from its last finished page.
static RELEASE_JOB: Sql = Sql::new(|d| {
    format!(
        "UPDATE reconcile_job SET lease_owner = NULL, lease_expires_at = NULL, updated_at = {now} \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
        now = d.now
    )
});

/// A job row as both backends read it.
#[derive(Debug)]
struct JobRow {
    job_id: Uuid,
    state: String,
    dry_run: bool,
    queue: Option<String>,
    scope: Option<String>,
    after_position: i64,
    drift_position: i64,
    checked: i64,
    drifted: i64,
    repaired: i64,
    parents: serde_json::Value,
    error: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    updated_at: chrono::DateTime<chrono::Utc>,
}

impl JobRow {
    fn from_row(row: &dyn LedgerRow) -> StoreResult<Self> {
        Ok(Self {
            job_id: row.uuid("job_id")?.ok_or(sqlx::Error::RowNotFound)?,
            state: row.text("state")?,
            dry_run: row.bool("dry_run")?,
            queue: row.opt_text("queue")?,
            scope: row.opt_text("scope")?,
            after_position: row.int("after_position")?,
            drift_position: row.int("drift_position")?,
            checked: row.int("checked")?,
            drifted: row.int("drifted")?,
            repaired: row.int("repaired")?,
            parents: row.json("parents")?.unwrap_or_default(),
            error: row.opt_text("error")?,
            created_at: row.time("created_at")?,
            updated_at: row.time("updated_at")?,
        })
    }

    fn into_job(self) -> StoreResult<ReconcileJob> {
        let state = match self.state.as_str() {
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            _ => JobState::Running,
        };
        Ok(ReconcileJob {
            job_id: self.job_id,
            state,
            dry_run: self.dry_run,
            queue: self.queue.map(QueueName::from_ledger),
            checked: self.checked as u64,
            drifted: self.drifted as u64,
            repaired: self.repaired as u64,
            parents: serde_json::from_value(self.parents)
                .map_err(|e| StoreError::Db(sqlx::Error::Decode(Box::new(e))))?,
            error: self.error,
            created_at: self.created_at,
            updated_at: self.updated_at,
            reach: QueueScope::from_json(self.scope.as_deref()),
        })
    }
}

/// A drifted parent to count in a background job, in the same transaction
/// that repairs it .
pub(super) struct JobMark<'a> {
    pub job_id: uuid::Uuid,
    pub owner: &'a str,
    pub position: i64,
}

/// A job this process holds the lease of, with where it is.
#[derive(Debug)]
pub struct JobLease {
    job_id: Uuid,
    dry_run: bool,
    queue: Option<QueueName>,
    /// `None` when the stored scope does not read: every step then fails.
    scope: Option<QueueScope>,
    after_position: i64,
    drift_position: i64,
}

impl JobLease {
    pub fn job_id(&self) -> Uuid {
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

/// Counts one drifted parent in its job, in the transaction that reconciles
/// it; `false` when the job is not this owner's or already counted it.
pub(super) async fn record_drift(
    tx: &mut dyn Transaction,
    mark: &JobMark<'_>,
    applied: bool,
    report: &str,
) -> StoreResult<bool> {
    let d: &'static Dialect = tx.dialect();
    let updated = tx
        .execute(
            Statement::new(RECORD_DRIFT.of(d))
                .uuid(mark.job_id)
                .text(mark.owner)
                .int(i64::from(applied))
                .int(mark.position)
                .int(JOB_PARENTS_KEPT)
                .text(report),
        )
        .await?;
    Ok(updated == 1)
}

impl Store {
    /// A new running job, for the background loop to take.
    pub async fn create_reconcile_job(
        &self,
        dry_run: bool,
        queue: Option<&QueueName>,
        within: &QueueScope,
    ) -> StoreResult<ReconcileJob> {
        let scope = within.as_json();
        let rows = self
            .db
            .write(
                Statement::new(self.sql(&INSERT_JOB))
                    .uuid(Uuid::new_v4())
                    .bool(dry_run)
                    .text(queue.map(QueueName::as_str))
                    .text(scope.as_deref()),
            )
            .await?;
        JobRow::from_row(&**rows.first().ok_or(sqlx::Error::RowNotFound)?)?.into_job()
    }

    pub async fn reconcile_job(&self, job_id: Uuid) -> StoreResult<Option<ReconcileJob>> {
        match self.fetch_optional(Statement::new(self.sql(&JOB)).uuid(job_id)).await? {
            Some(row) => Ok(Some(JobRow::from_row(&*row)?.into_job()?)),
            None => Ok(None),
        }
    }

    /// Takes the oldest running job whose lease is free or ran out, for
    /// `lease`, as `owner`.
    pub async fn take_reconcile_job(&self, owner: &str, lease: Duration) -> StoreResult<Option<JobLease>> {
        let rows = self
            .db
            .write(
                Statement::new(self.sql(&TAKE_JOB))
                    .text(owner)
                    .float(lease.as_secs_f64()),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let row = JobRow::from_row(&**row)?;
        Ok(Some(JobLease {
            job_id: row.job_id,
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
        let page = self
            .db
            .drift_page(DriftQuery {
                queue: job.queue.as_ref(),
                within: scope,
                after: job.after_position,
                limit: batch,
            })
            .await?;
        for (parent_id, position) in page.drifted {
            // Counted before a crash: repaired then, or still to be shown once only.
            if position <= job.drift_position {
                continue;
            }
            match self.reconcile_job_parent(job, owner, &parent_id, position).await? {
                Some(()) => {}
                None => return Ok(JobStep::Lost),
            }
        }
        let done = page.next.is_none();
        let after = page.next.unwrap_or(job.after_position);
        let held = self
            .db
            .execute(
                Statement::new(self.sql(&FINISH_PAGE))
                    .uuid(job.job_id)
                    .text(owner)
                    .int(page.checked as i64)
                    .int(after)
                    .bool(done)
                    .float(lease.as_secs_f64()),
            )
            .await?
            == 1;
        if !held {
            return Ok(JobStep::Lost);
        }
        job.after_position = after;
        job.drift_position = job.drift_position.max(after);
        Ok(if done { JobStep::Done } else { JobStep::Continue })
    }

    /// Reconciles one drifted parent of a job; `None` when the job was lost.
    async fn reconcile_job_parent(
        &self,
        job: &mut JobLease,
        owner: &str,
        parent_id: &ParentId,
        position: i64,
    ) -> StoreResult<Option<()>> {
        let mark = JobMark {
            job_id: job.job_id,
            owner,
            position,
        };
        match self.reconcile_marked(parent_id, job.dry_run, Some(mark)).await {
            Ok(Some(report)) => {
                if !report.changes.is_empty() {
                    job.drift_position = position;
                }
                Ok(Some(()))
            }
            Ok(None) => Ok(None),
            // Deleted since the page was read: nothing to reconcile.
            Err(StoreError::ParentNotFound(_)) => Ok(Some(())),
            Err(err) => Err(err),
        }
    }

    /// Records a failed step: the job is retried (by any replica) after
    /// `retry_in`, or marked failed once `JOB_STEP_ATTEMPTS` failed in a row.
    /// `None` when the job was no longer this owner's.
    pub async fn fail_reconcile_job_step(
        &self,
        job_id: Uuid,
        owner: &str,
        error: &str,
        retry_in: Duration,
    ) -> StoreResult<Option<JobState>> {
        let rows = self
            .db
            .write(
                Statement::new(self.sql(&FAIL_STEP))
                    .uuid(job_id)
                    .text(owner)
                    .text(error)
                    .int(JOB_STEP_ATTEMPTS)
                    .float(retry_in.as_secs_f64()),
            )
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(if row.text("state")? == "failed" {
            JobState::Failed
        } else {
            JobState::Running
        }))
    }

    /// Gives a held job back (its holder is stopping), so that another
    /// replica takes it on at once instead of after the lease; whether it
    /// was still this owner's.
    pub async fn release_reconcile_job(&self, job_id: Uuid, owner: &str) -> StoreResult<bool> {
        let released = self
            .db
            .execute(Statement::new(self.sql(&RELEASE_JOB)).uuid(job_id).text(owner))
            .await?;
        Ok(released == 1)
    }
}
