//! Reconcile jobs on SQLite: the one process takes a job under a lease (its
//! writes are serialized already), which a restart waits out.

use super::{SqliteStore, SqliteTx, now};
use crate::ledger::QueueName;
use crate::store::StoreResult;
use crate::store::reconcile::JobMark;
use crate::store::reconcile_jobs::{JOB_PARENTS_KEPT, JobRow};

/// A job row's columns as `JobRow` reads them.
const JOB_COLUMNS: &str = "job_id, state, dry_run, queue, scope, after_position, drift_position, \
     checked, drifted, repaired, parents, error, created_at, updated_at";

/// The database clock `?N` seconds from now (`?N` a number).
macro_rules! later {
    ($param:literal) => {
        concat!(
            "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+' || ",
            $param,
            " || ' seconds')"
        )
    };
}

/// Counts one drifted parent in its job, in the transaction that reconciles
/// it; `false` when the job is not this owner's or already counted it.
pub(in crate::store) async fn record_drift(
    tx: &mut SqliteTx,
    mark: &JobMark<'_>,
    applied: bool,
    report: &str,
) -> StoreResult<bool> {
    let updated = sqlx::query(concat!(
        "UPDATE reconcile_job SET drifted = drifted + 1, repaired = repaired + ?3, drift_position = ?4, \
             parents = CASE WHEN json_array_length(parents) < ?5 THEN json_insert(parents, '$[#]', json(?6)) \
                       ELSE parents END, \
             updated_at = ",
        now!(),
        " WHERE job_id = ?1 AND lease_owner = ?2 AND state = 'running' AND drift_position < ?4"
    ))
    .bind(mark.job_id.to_string())
    .bind(mark.owner)
    .bind(i64::from(applied))
    .bind(mark.position)
    .bind(JOB_PARENTS_KEPT)
    .bind(report)
    .execute(&mut **tx)
    .await?;
    Ok(updated.rows_affected() == 1)
}

impl SqliteStore {
    pub async fn insert_job(
        &self,
        job_id: uuid::Uuid,
        dry_run: bool,
        queue: Option<&QueueName>,
        scope: Option<&str>,
    ) -> StoreResult<JobRow> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO reconcile_job (job_id, dry_run, queue, scope, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, {now}, {now}) RETURNING {JOB_COLUMNS}",
            now = now!()
        )))
        .bind(job_id.to_string())
        .bind(dry_run)
        .bind(queue.map(QueueName::as_str))
        .bind(scope)
        .fetch_one(&self.writer)
        .await?)
    }

    pub async fn job_row(&self, job_id: uuid::Uuid) -> StoreResult<Option<JobRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {JOB_COLUMNS} FROM reconcile_job WHERE job_id = ?1"
        )))
        .bind(job_id.to_string())
        .fetch_optional(&self.readers)
        .await?)
    }

    /// The oldest running job with a free or expired lease (the one writer
    /// connection makes the read and the update one step).
    pub async fn take_job(&self, owner: &str, lease_seconds: f64) -> StoreResult<Option<JobRow>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE reconcile_job SET lease_owner = ?1, lease_expires_at = {later}, updated_at = {now} \
             WHERE job_id = (SELECT job_id FROM reconcile_job \
                 WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < {now}) \
                 ORDER BY created_at LIMIT 1) \
             RETURNING {JOB_COLUMNS}",
            later = later!("?2"),
            now = now!()
        )))
        .bind(owner)
        .bind(lease_seconds)
        .fetch_optional(&self.writer)
        .await?)
    }

    /// Ends a step: `checked` grows, the job moves to `after` (or is done)
    /// and the lease is renewed; `false` when the job is no longer this owner's.
    pub async fn finish_job_page(
        &self,
        job_id: uuid::Uuid,
        owner: &str,
        checked: i64,
        after: i64,
        done: bool,
        lease_seconds: f64,
    ) -> StoreResult<bool> {
        let updated = sqlx::query(concat!(
            "UPDATE reconcile_job SET checked = checked + ?3, after_position = ?4, \
                 drift_position = max(drift_position, ?4), \
                 state = CASE WHEN ?5 THEN 'done' ELSE state END, attempts = 0, error = NULL, \
                 lease_expires_at = ",
            later!("?6"),
            ", updated_at = ",
            now!(),
            " WHERE job_id = ?1 AND lease_owner = ?2 AND state = 'running'"
        ))
        .bind(job_id.to_string())
        .bind(owner)
        .bind(checked)
        .bind(after)
        .bind(done)
        .bind(lease_seconds)
        .execute(&self.writer)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// A failed step: retried after `retry_seconds`, or failed after
    /// `attempts` in a row. The job's state, `None` when it was not this owner's.
    pub async fn fail_job_step(
        &self,
        job_id: uuid::Uuid,
        owner: &str,
        error: &str,
        attempts: i64,
        retry_seconds: f64,
    ) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar(concat!(
            "UPDATE reconcile_job SET attempts = attempts + 1, error = ?3, \
                 state = CASE WHEN attempts + 1 >= ?4 THEN 'failed' ELSE state END, \
                 lease_owner = NULL, lease_expires_at = ",
            later!("?5"),
            ", updated_at = ",
            now!(),
            " WHERE job_id = ?1 AND lease_owner = ?2 AND state = 'running' RETURNING state"
        ))
        .bind(job_id.to_string())
        .bind(owner)
        .bind(error)
        .bind(attempts)
        .bind(retry_seconds)
        .fetch_optional(&self.writer)
        .await?)
    }
}
