//! Reconcile: compare a parent's stored projection with its rows, show the
//! difference and repair it. When they disagree, the rows win.

use super::backend::{DriftQuery, Transaction};
use super::parents::close_skipping;
use super::reconcile_jobs::{JobMark, record_drift};
use super::results::{Reasons, reason_counts, recount_reasons};
use super::statement::{Sql, Statement};
use super::{Store, StoreError, StoreResult, registration, sql};
use crate::ledger::projection::{self, CompletionRepair, DerivedProjection, Open, StoredProjection, Tally};
use crate::ledger::results::reasons_change;
use crate::ledger::verdict::PARENT_FAILED;
use crate::ledger::{ParentId, QueueName, QueueScope, ReconcileReport, SweepReport, Tolerance};

/// How many parents the reconcile sweep reads per statement.
const SWEEP_PAGE: i64 = 500;

/// A parent's stored projection for reconcile, locked (its open counts less
/// what outcomes settled; the lane's part is `LANE_OPEN`).
static STORED_PROJECTION: Sql = Sql::new(|d| {
    format!(
        "SELECT total, processed, failed, skipped, completed_at, settled_in_flight, settled_held, \
             decomposed_at IS NOT NULL AS decomposed, tolerated_count, tolerated_percent, \
             cancelled_at IS NOT NULL AS cancelled \
         FROM parent WHERE parent_id = $1{}",
        d.for_update
    )
});

/// A lane's part of its parent's open counts, locked before the parent: the
/// order of every statement that locks both (a lane, then its children, then
/// its parent).
static LANE_OPEN: Sql = Sql::new(|d| {
    format!(
        "SELECT claimed - unclaimed AS in_flight, held_in - held_out AS held FROM lane WHERE parent_id = $1{}",
        d.for_update
    )
});

/// A parent's in-flight and held children, counted over its rows (an
/// in-flight child's row is pending, below its lane's floor, and a lease
/// lists it: the lane is locked, so the floor holds still).
static OPEN_TALLY: Sql = Sql::new(|d| {
    format!(
        "SELECT {} AS in_flight, count(*) FILTER (WHERE c.state = 'held') AS held \
         FROM child c WHERE c.parent_id = $1",
        sql::listed_in_flight(d, "$1")
    )
});

/// Writes the derived projection over the stored one, with `completed_at`
/// kept, set or cleared.
fn repair(completed_at: &str) -> String {
    format!(
        "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, \
             settled_in_flight = 0, settled_held = 0, completed_at = {completed_at} WHERE parent_id = $1"
    )
}

static REPAIR_KEEP: Sql = Sql::new(|_| repair("completed_at"));
static REPAIR_SET: Sql = Sql::new(|d| repair(d.now));
static REPAIR_CLEAR: Sql = Sql::new(|_| repair("NULL"));

/// A lane's counters, from the counted children.
const REPAIR_LANE: &str =
    "UPDATE lane SET claimed = $2, unclaimed = 0, held_in = $3, held_out = 0 WHERE parent_id = $1";

/// A page of the reconcile sweep: parents after position `after`, at most
/// `limit`, of one queue (or every queue) within `within`.
#[derive(Debug, Clone, Copy)]
pub struct SweepQuery<'a> {
    pub queue: Option<&'a QueueName>,
    pub within: &'a QueueScope,
    /// Only report (`true`), or repair.
    pub dry_run: bool,
    pub after: i64,
    pub limit: i64,
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
        let mut tx = self.db.begin().await?;
        let (stored, locked) = lock_projection(&mut *tx, parent_id)
            .await?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))?;
        let rows = registration::tally(&mut *tx, parent_id).await?;
        let open = open_tally(&mut *tx, parent_id).await?;
        let derived = DerivedProjection::from_rows(rows, open, locked.decomposed).judged(
            locked.tolerance,
            locked.cancelled,
            locked.decomposed,
        );
        let mut changes = projection::diff(&stored, &derived);
        let kept = reason_counts(&mut *tx, parent_id, Reasons::Kept).await?;
        let counted = reason_counts(&mut *tx, parent_id, Reasons::Counted).await?;
        let reasons = reasons_change(&kept, &counted);
        let reasons_drifted = reasons.is_some();
        changes.extend(reasons);
        let apply = !dry_run && !changes.is_empty();
        let mut completion = projection::completion_repair(&stored, &derived);
        if apply {
            write_repair(&mut *tx, parent_id, &rows, open, completion).await?;
            if reasons_drifted {
                recount_reasons(&mut *tx, parent_id).await?;
            }
            if derived.ends_failed() {
                // The rows are past the tolerance with children still open:
                // end it as the outcome that crossed it would have.
                let (_, ended) = close_skipping(&mut *tx, parent_id, PARENT_FAILED, false).await?;
                if ended {
                    completion = CompletionRepair::Set;
                }
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
            if !record_drift(&mut *tx, &mark, apply, &json).await? {
                // Rolled back: the job is another worker's now, or this parent was counted already.
                return Ok(None);
            }
        }
        let completed: &[ParentId] = if apply && completion == CompletionRepair::Set {
            std::slice::from_ref(parent_id)
        } else {
            &[]
        };
        self.commit_completing(tx, completed).await?;
        if apply {
            self.parents_changed([parent_id]);
        }
        Ok(Some(report))
    }

    /// Reconciles at most `limit` parents (or one queue's) within `within`,
    /// those after position `after`; the report's `next_cursor` is the
    /// position to go on from, `None` once the last parent was checked.
    pub async fn reconcile_sweep(&self, sweep: SweepQuery<'_>) -> StoreResult<SweepReport> {
        let SweepQuery {
            queue,
            within,
            dry_run,
            after,
            limit,
        } = sweep;
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
            let page = self
                .db
                .drift_page(DriftQuery {
                    queue,
                    within,
                    after,
                    limit: left.min(SWEEP_PAGE),
                })
                .await?;
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
        static COUNT: Sql = Sql::new(|d| {
            format!(
                "SELECT count(*) AS parents FROM parent p WHERE ($1 IS NULL OR p.queue = $1) AND {}",
                (d.within)("$2")
            )
        });
        let scope = within.as_json();
        let rows = self
            .scan(
                Statement::new(self.sql(&COUNT))
                    .text(queue.map(QueueName::as_str))
                    .text(scope.as_deref()),
            )
            .await?;
        let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
        Ok(row.int("parents")? as u64)
    }
}

/// What the verdict of a parent under reconcile depends on besides its counts.
struct Locked {
    decomposed: bool,
    tolerance: Option<Tolerance>,
    cancelled: bool,
}

/// The stored projection under the lane's and then the parent's lock, `None`
/// when the parent is missing; with whether it is decomposed, its tolerance
/// and whether a cancel completed it.
async fn lock_projection(
    tx: &mut dyn Transaction,
    parent_id: &ParentId,
) -> StoreResult<Option<(StoredProjection, Locked)>> {
    let d = tx.dialect();
    let lane = tx
        .fetch(Statement::new(LANE_OPEN.of(d)).text(parent_id.as_str()))
        .await?;
    let rows = tx
        .fetch(Statement::new(STORED_PROJECTION.of(d)).text(parent_id.as_str()))
        .await?;
    let Some(row) = rows.first() else { return Ok(None) };
    let (lane_in_flight, lane_held) = match lane.first() {
        Some(lane) => (lane.int("in_flight")?, lane.int("held")?),
        None => (0, 0),
    };
    let stored = StoredProjection {
        total: row.int("total")?,
        processed: row.int("processed")?,
        failed: row.int("failed")?,
        skipped: row.int("skipped")?,
        in_flight: lane_in_flight - row.int("settled_in_flight")?,
        held: lane_held - row.int("settled_held")?,
        completed_at: row.opt_time("completed_at")?,
        verdict: None,
    };
    let locked = Locked {
        decomposed: row.bool("decomposed")?,
        tolerance: Tolerance::from_columns(row.opt_int("tolerated_count")?, row.opt_float("tolerated_percent")?),
        cancelled: row.bool("cancelled")?,
    };
    Ok(Some((stored.judged(locked.tolerance, locked.cancelled), locked)))
}

/// A parent's in-flight and held children, counted.
async fn open_tally(tx: &mut dyn Transaction, parent_id: &ParentId) -> StoreResult<Open> {
    let rows = tx
        .fetch(Statement::new(OPEN_TALLY.of(tx.dialect())).text(parent_id.as_str()))
        .await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    Ok(Open {
        in_flight: row.int("in_flight")?,
        held: row.int("held")?,
    })
}

/// Writes the derived projection and the counted open children over the stored ones.
async fn write_repair(
    tx: &mut dyn Transaction,
    parent_id: &ParentId,
    derived: &Tally,
    open: Open,
    completion: CompletionRepair,
) -> StoreResult<()> {
    let repair = match completion {
        CompletionRepair::Keep => &REPAIR_KEEP,
        CompletionRepair::Set => &REPAIR_SET,
        CompletionRepair::Clear => &REPAIR_CLEAR,
    };
    tx.execute(
        Statement::new(repair.of(tx.dialect()))
            .text(parent_id.as_str())
            .int(derived.total)
            .int(derived.processed)
            .int(derived.failed)
            .int(derived.skipped),
    )
    .await?;
    tx.execute(
        Statement::new(REPAIR_LANE)
            .text(parent_id.as_str())
            .int(open.in_flight)
            .int(open.held),
    )
    .await?;
    Ok(())
}

/// The drift scan's select list for parent `p` joined with its lane `l`,
/// beside the dialect's row counts (`rows_*` columns): with the failed and
/// skipped children its reason counts add up to (`reasons_*`), so a sweep
/// finds counts lost or doubled there too (a count moved from one reason to
/// another is found by reconciling the parent itself).
pub(super) fn drift_columns() -> String {
    let kept = |state: &str| {
        format!(
            "CAST(coalesce((SELECT sum(r.n) FROM child_reason r \
                 WHERE r.parent_id = p.parent_id AND r.state = '{state}'), 0) AS bigint) AS reasons_{state}"
        )
    };
    format!(
        "p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
         p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, {}, {}, {}",
        sql::OPEN_COUNTS.as_str(),
        kept("failed"),
        kept("skipped")
    )
}
