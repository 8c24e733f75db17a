//! Works background reconcile sweeps (`POST /v1/reconcile/jobs`). Every
//! replica runs this loop; a job is worked by the one holding its lease, a
//! page per step, and whoever finds the lease run out (the holder died or
//! restarted) takes it on from the last finished page.

use std::time::Duration;

use crate::ledger::JobState;
use crate::state::AppState;
use crate::store::{JobLease, JobStep, Store};

/// How a replica works reconcile jobs.
#[derive(Debug, Clone, Copy)]
pub struct ReconcileJobOptions {
    /// How long a taken job stays this replica's without a finished step.
    pub lease: Duration,
    /// Parents checked per step.
    pub batch: i64,
    /// How often to look for a job when there is none.
    pub idle: Duration,
}

/// How long a failed step waits before the job is tried again.
const RETRY_FAILED_STEP: Duration = Duration::from_secs(2);

/// Takes and works reconcile jobs until the service stops.
pub async fn work_reconcile_jobs(state: AppState, options: ReconcileJobOptions) {
    let owner = format!("{:016x}", state.replica);
    while !state.is_shutting_down() {
        match state.store.take_reconcile_job(&owner, options.lease).await {
            Ok(Some(mut job)) => work(&state, &mut job, &owner, options).await,
            Ok(None) => {
                if super::rest(&state, options.idle).await {
                    return;
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot look for reconcile jobs; retrying");
                if super::rest(&state, options.idle).await {
                    return;
                }
            }
        }
    }
}

/// Works one job a step at a time until it is done, fails a step, is
/// another replica's, or the service stops: then the step in hand finishes
/// and the lease is given back, for another replica to take the job on at
/// once from that step.
async fn work(state: &AppState, job: &mut JobLease, owner: &str, options: ReconcileJobOptions) {
    let store: &Store = &state.store;
    let job_id = job.job_id();
    tracing::info!(%job_id, "reconcile job taken");
    loop {
        match store.reconcile_job_step(job, owner, options.lease, options.batch).await {
            Ok(JobStep::Continue) if state.is_shutting_down() => {
                match store.release_reconcile_job(job_id, owner).await {
                    Ok(true) => tracing::info!(%job_id, "stopping: reconcile job given back"),
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(%job_id, error = %err, "stopping: reconcile job not given back; its lease will run out")
                    }
                }
                return;
            }
            Ok(JobStep::Continue) => {}
            Ok(JobStep::Done) => {
                tracing::info!(%job_id, "reconcile job done");
                return;
            }
            Ok(JobStep::Lost) => {
                tracing::warn!(%job_id, "reconcile job lease ran out; another worker has it");
                return;
            }
            Err(err) => {
                let error = err.to_string();
                match store
                    .fail_reconcile_job_step(job_id, owner, &error, RETRY_FAILED_STEP)
                    .await
                {
                    Ok(Some(JobState::Failed)) => tracing::error!(%job_id, error, "reconcile job failed"),
                    Ok(_) => tracing::warn!(%job_id, error, "reconcile job step failed; retrying"),
                    Err(again) => {
                        tracing::warn!(%job_id, error, %again, "reconcile job step failed; its lease will run out")
                    }
                }
                return;
            }
        }
    }
}
