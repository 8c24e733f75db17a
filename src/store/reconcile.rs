//! Reconcile: compare a parent's stored projection with its rows, show the
//! difference and repair it. When they disagree, the rows win.

use super::{Db, Store, StoreError, StoreResult, Tx, dispatch, in_tx};
use crate::access::QueueScope;
use crate::ledger::projection::{self, CompletionRepair, DerivedProjection};
use crate::ledger::{ParentId, QueueName, ReconcileReport, SweepReport};

/// How many parents the reconcile sweep reads per statement.
const SWEEP_PAGE: i64 = 500;

/// A drifted parent to count in a background job, in the same transaction
/// that repairs it (see `reconcile_jobs`).
pub(super) struct JobMark<'a> {
    pub job_id: uuid::Uuid,
    pub owner: &'a str,
    pub position: i64,
}

impl Store {
    pub async fn reconcile(&self, parent_id: &ParentId, dry_run: bool) -> StoreResult<ReconcileReport> {
        self.reconcile_marked(parent_id, dry_run, None)
            .await?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))
    }

    /// Reconciles one parent; with a `mark`, a drift is also counted in that
    /// job, or (`None`) nothing is written when the job's lease was lost.
    pub(super) async fn reconcile_marked(
        &self,
        parent_id: &ParentId,
        dry_run: bool,
        mark: Option<JobMark<'_>>,
    ) -> StoreResult<Option<ReconcileReport>> {
        let mut tx = self.begin().await?;
        let (stored, decomposed) = in_tx!(&mut tx, reconcile::lock_projection(parent_id))?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))?;
        let rows = in_tx!(&mut tx, parents::tally(parent_id))?;
        let open = in_tx!(&mut tx, reconcile::open_tally(parent_id))?;
        let derived = DerivedProjection::from_rows(rows, open, decomposed);
        let changes = projection::diff(&stored, &derived);
        let apply = !dry_run && !changes.is_empty();
        let completion = projection::completion_repair(&stored, &derived);
        if apply {
            in_tx!(&mut tx, reconcile::repair(parent_id, &rows, open, completion))?;
            if completion == CompletionRepair::Set {
                super::webhooks::enqueue_completed(&mut tx, std::slice::from_ref(parent_id)).await?;
            }
        }
        let report = ReconcileReport {
            parent_id: parent_id.clone(),
            dry_run,
            applied: apply,
            stored,
            derived,
            changes,
        };
        if let Some(mark) = mark
            && !report.changes.is_empty()
        {
            let json = serde_json::to_string(&report).expect("a report serializes");
            let counted = in_tx!(&mut tx, reconcile_jobs::record_drift(&mark, apply, &json))?;
            if !counted {
                // Rolled back: the job is another worker's now, or this parent was counted already.
                return Ok(None);
            }
        }
        tx.commit().await?;
        if apply && completion == CompletionRepair::Set {
            self.completed(std::slice::from_ref(parent_id));
        }
        Ok(Some(report))
    }

    /// Reconciles at most `limit` parents (or one queue's) within `within`,
    /// those after position `after`; the report's `next_cursor` is the
    /// position to go on from, `None` once the last parent was checked.
    pub async fn reconcile_sweep(
        &self,
        queue: Option<&QueueName>,
        within: &QueueScope,
        dry_run: bool,
        after: i64,
        limit: i64,
    ) -> StoreResult<SweepReport> {
        let mut report = SweepReport {
            dry_run,
            checked: 0,
            drifted: 0,
            repaired: 0,
            parents: Vec::new(),
            next_cursor: None,
        };
        let mut after = after;
        let mut left = limit;
        loop {
            let page = dispatch!(self, s => s.drift_page(queue, within, after, left.min(SWEEP_PAGE)).await)?;
            report.checked += page.checked;
            left -= page.checked as i64;
            for (parent_id, _) in page.drifted {
                // Re-derived under the parent's lock: a concurrent outcome may have
                // closed the gap since the page was read.
                let one = self.reconcile(&parent_id, dry_run).await?;
                if one.changes.is_empty() {
                    continue;
                }
                report.drifted += 1;
                report.repaired += u64::from(one.applied);
                report.parents.push(one);
            }
            match page.next {
                Some(position) if left > 0 => after = position,
                Some(position) => {
                    report.next_cursor = Some(position.to_string());
                    break;
                }
                None => break,
            }
        }
        Ok(report)
    }

    /// How many parents (of one queue) within `within` a sweep would check:
    /// the length of the command line's progress bar.
    pub async fn count_parents(&self, queue: Option<&QueueName>, within: &QueueScope) -> StoreResult<u64> {
        dispatch!(self, s => s.count_parents(queue, within).await)
    }
}
