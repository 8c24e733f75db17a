//! Reconcile: compare a parent's stored projection with its rows, show the
//! difference and repair it. When they disagree, the rows win.

use super::{Db, Store, StoreError, StoreResult, Tx, dispatch, in_tx};
use crate::access::QueueScope;
use crate::ledger::projection::{self, CompletionRepair, DerivedProjection};
use crate::ledger::{ParentId, QueueName, ReconcileReport, SweepReport};

/// How many parents the reconcile sweep reads per page.
const SWEEP_PAGE: i64 = 500;

impl Store {
    pub async fn reconcile(&self, parent_id: &ParentId, dry_run: bool) -> StoreResult<ReconcileReport> {
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
        }
        tx.commit().await?;
        if apply && completion == CompletionRepair::Set {
            self.completed(std::slice::from_ref(parent_id));
        }
        Ok(ReconcileReport {
            parent_id: parent_id.clone(),
            dry_run,
            applied: apply,
            stored,
            derived,
            changes,
        })
    }

    /// Reconciles every parent (or one queue's) within `within`, a page at a time.
    pub async fn reconcile_sweep(
        &self,
        queue: Option<&QueueName>,
        within: &QueueScope,
        dry_run: bool,
    ) -> StoreResult<SweepReport> {
        let mut report = SweepReport {
            dry_run,
            checked: 0,
            drifted: 0,
            repaired: 0,
            parents: Vec::new(),
        };
        let mut after = 0;
        loop {
            let page = dispatch!(self, s => s.drift_page(queue, within, after, SWEEP_PAGE).await)?;
            report.checked += page.checked;
            for parent_id in page.drifted {
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
                Some(position) => after = position,
                None => break,
            }
        }
        Ok(report)
    }
}
