//! Reconcile jobs on Postgres: any replica takes a job with
//! `FOR UPDATE SKIP LOCKED` and holds it under a lease that runs out.

use super::{PgStore, PgTx};
use crate::ledger::QueueName;
use crate::store::StoreResult;
use crate::store::reconcile::JobMark;
use crate::store::reconcile_jobs::{JOB_PARENTS_KEPT, JobRow};

/// A job row's columns as `JobRow` reads them, from `j`.
macro_rules! job_columns {
    () => {
        "j.job_id::text AS job_id, j.state, j.dry_run, j.queue, j.scope, j.after_position, j.drift_position, \
         j.checked, j.drifted, j.repaired, j.parents::text AS parents, j.error, j.created_at, j.updated_at"
    };
}

/// Counts one drifted parent in its job, in the transaction that reconciles
/// it; `false` when the job is not this owner's or already counted it.
pub(in crate::store) async fn record_drift(
    tx: &mut PgTx,
    mark: &JobMark<'_>,
    applied: bool,
    report: &str,
) -> StoreResult<bool> {
    let updated = sqlx::query(
        "UPDATE reconcile_job SET drifted = drifted + 1, repaired = repaired + $3, drift_position = $4, \
             parents = CASE WHEN jsonb_array_length(parents) < $5 THEN parents || jsonb_build_array($6::jsonb) \
                       ELSE parents END, \
             updated_at = now() \
         WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' AND drift_position < $4",
    )
    .bind(mark.job_id)
    .bind(mark.owner)
    .bind(i64::from(applied))
    .bind(mark.position)
    .bind(JOB_PARENTS_KEPT)
    .bind(report)
    .execute(&mut **tx)
    .await?;
    Ok(updated.rows_affected() == 1)
}

impl PgStore {
    pub async fn insert_job(
        &self,
        job_id: uuid::Uuid,
        dry_run: bool,
        queue: Option<&QueueName>,
        scope: Option<&str>,
    ) -> StoreResult<JobRow> {
        Ok(sqlx::query_as(concat!(
            "INSERT INTO reconcile_job AS j (job_id, dry_run, queue, scope) VALUES ($1, $2, $3, $4) RETURNING ",
            job_columns!()
        ))
        .bind(job_id)
        .bind(dry_run)
        .bind(queue.map(QueueName::as_str))
        .bind(scope)
        .fetch_one(&self.pool)
        .await?)
    }

    pub async fn job_row(&self, job_id: uuid::Uuid) -> StoreResult<Option<JobRow>> {
        Ok(sqlx::query_as(concat!(
            "SELECT ",
            job_columns!(),
            " FROM reconcile_job j WHERE j.job_id = $1"
        ))
        .bind(job_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// One statement: the oldest running job with a free or expired lease,
    /// skipping jobs another replica is taking at this moment.
    pub async fn take_job(&self, owner: &str, lease_seconds: f64) -> StoreResult<Option<JobRow>> {
        Ok(sqlx::query_as(concat!(
            "WITH next AS ( \
                 SELECT job_id FROM reconcile_job \
                 WHERE state = 'running' AND (lease_expires_at IS NULL OR lease_expires_at < now()) \
                 ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
             UPDATE reconcile_job j SET lease_owner = $1, \
                 lease_expires_at = now() + make_interval(secs => $2), updated_at = now() \
             FROM next WHERE j.job_id = next.job_id RETURNING ",
            job_columns!()
        ))
        .bind(owner)
        .bind(lease_seconds)
        .fetch_optional(&self.pool)
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
        let updated = sqlx::query(
            "UPDATE reconcile_job SET checked = checked + $3, after_position = $4, \
                 drift_position = greatest(drift_position, $4), \
                 state = CASE WHEN $5 THEN 'done' ELSE state END, attempts = 0, error = NULL, \
                 lease_expires_at = now() + make_interval(secs => $6), updated_at = now() \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running'",
        )
        .bind(job_id)
        .bind(owner)
        .bind(checked)
        .bind(after)
        .bind(done)
        .bind(lease_seconds)
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() == 1)
    }

    /// A failed step: retried after `retry_seconds` by whoever takes it, or
    /// failed after `attempts` in a row. The job's state, `None` when it was
    /// not this owner's.
    pub async fn fail_job_step(
        &self,
        job_id: uuid::Uuid,
        owner: &str,
        error: &str,
        attempts: i64,
        retry_seconds: f64,
    ) -> StoreResult<Option<String>> {
        Ok(sqlx::query_scalar(
            "UPDATE reconcile_job SET attempts = attempts + 1, error = $3, \
                 state = CASE WHEN attempts + 1 >= $4 THEN 'failed' ELSE state END, \
                 lease_owner = NULL, lease_expires_at = now() + make_interval(secs => $5), updated_at = now() \
             WHERE job_id = $1 AND lease_owner = $2 AND state = 'running' RETURNING state",
        )
        .bind(job_id)
        .bind(owner)
        .bind(error)
        .bind(attempts)
        .bind(retry_seconds)
        .fetch_optional(&self.pool)
        .await?)
    }
}
