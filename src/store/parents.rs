//! Parents as readers see them (one, and the list), and cancel. Registration,
//! appends and the seal are in `registration.rs`.

use super::backend::Transaction;
use super::rows;
use super::statement::{Dialect, Sql, Statement};
use super::{Store, StoreError, StoreResult, sql};
use crate::ledger::{Parent, ParentId, ParentState, QueueName, QueueScope};

/// Filters of the parent list.
#[derive(Debug, Clone, Default)]
pub struct ParentFilter {
    pub queue: Option<QueueName>,
    pub state: Option<ParentState>,
    /// Only active parents with a child claimable now.
    pub resumable: bool,
    /// Only parents of these queues (a token's reach).
    pub within: QueueScope,
    /// List parents after this position (exclusive), in the list's order.
    pub after_position: Option<i64>,
    pub limit: i64,
    /// Only parents with a failed child, a held child or a logged conflict.
    pub has: Option<ParentHas>,
    /// Newest first instead of oldest first.
    pub newest: bool,
    pub created_after: Option<chrono::DateTime<chrono::Utc>>,
    pub created_before: Option<chrono::DateTime<chrono::Utc>>,
}

/// What a listed parent must have (`GET /v1/parents?has=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParentHas {
    /// A failed child.
    Failed,
    /// A held child (outcome unknown, waiting for a retry or an outcome).
    Held,
    /// A child with a logged conflict (a losing outcome write).
    Conflicts,
}

impl ParentHas {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Held => "held",
            Self::Conflicts => "conflicts",
        }
    }
}

/// One page of parents; `next_position` is set when more may follow.
#[derive(Debug, Clone)]
pub struct ParentPage {
    pub parents: Vec<Parent>,
    pub next_position: Option<i64>,
}

/// One parent with its open counts.
static PARENT_BY_ID: Sql = Sql::new(|_| format!("{} WHERE p.parent_id = $1", sql::PARENT_SELECT.as_str()));

const PARENT_QUEUE: &str = "SELECT queue FROM parent WHERE parent_id = $1";

/// The parent list in either order (see `ParentFilter`). The cursor `$3` is
/// always a bound (the first page's lies past every position): a generic
/// plan of `$3 IS NULL OR ...` could not start the position index's range
/// at it, so a page deep in a long list walked every parent before it.
fn list_parents(d: &Dialect, after: &str, order: &str) -> String {
    format!(
        "{select} \
         WHERE ($1 IS NULL OR p.queue = $1) \
           AND ($2 IS NULL \
                OR ($2 = 'decomposing' AND p.decomposed_at IS NULL) \
                OR ($2 = 'active' AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL) \
                OR ($2 = 'complete' AND p.completed_at IS NOT NULL)) \
           AND p.position {after} $3 \
           AND (NOT $4 OR (p.decomposed_at IS NOT NULL AND p.completed_at IS NULL \
                AND (l.floor IS NOT NULL OR l.ready_at <= {now}))) \
           AND {within} \
           AND ($7 IS NULL \
                OR ($7 = 'failed' AND p.failed > 0) \
                OR ($7 = 'held' AND EXISTS ( \
                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'held')) \
                OR ($7 = 'conflicts' AND EXISTS ( \
                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.conflict_count > 0))) \
           AND ($8 IS NULL OR p.created_at > $8) \
           AND ($9 IS NULL OR p.created_at < $9) \
         ORDER BY p.position {order} LIMIT $5",
        select = sql::PARENT_SELECT.as_str(),
        now = d.now,
        within = (d.within)("$6")
    )
}

static LIST_OLDEST: Sql = Sql::new(|d| list_parents(d, ">", "ASC"));
static LIST_NEWEST: Sql = Sql::new(|d| list_parents(d, "<", "DESC"));

/// A cancel's parent row: `$2` children skipped, of which `$3` were in
/// flight and `$4` held (counted as outcomes count them), sealed at what it
/// holds and complete.
static CLOSE_SKIPPED: Sql = Sql::new(|d| {
    format!(
        "UPDATE parent SET skipped = skipped + $2, settled_in_flight = settled_in_flight + $3, \
             settled_held = settled_held + $4, \
             last_progress_at = CASE WHEN $2 > 0 THEN {now} ELSE last_progress_at END, \
             cancelled_at = CASE WHEN $5 AND completed_at IS NULL THEN {now} ELSE cancelled_at END, \
             decomposed_at = coalesce(decomposed_at, {now}), completed_at = coalesce(completed_at, {now}) \
         WHERE parent_id = $1",
        now = d.now
    )
});

/// A cancelled or failed parent's lane: nothing left to claim.
const CLOSE_LANE: &str = "UPDATE lane SET floor = NULL, ready_at = NULL WHERE parent_id = $1";

/// Whether a parent is complete; no row when it is missing.
const PARENT_COMPLETE: &str = "SELECT completed_at IS NOT NULL AS complete FROM parent WHERE parent_id = $1";

/// The same, locking the row (after its children, as outcomes lock them).
static LOCK_COMPLETE: Sql = Sql::new(|d| format!("{PARENT_COMPLETE}{}", d.for_update));

/// Skips every open child of a parent with `reason`, then completes it
/// (sealed at what it holds, if it was still being decomposed; `cancelled`:
/// with verdict `cancelled`) and closes its lane, in transaction `tx`.
/// Children are locked before the parent row, as outcomes lock them.
/// Returns how many children it skipped, and whether this completed it.
/// A cancel, and the outcome that crossed a parent's tolerance.
pub(super) async fn close_skipping(
    tx: &mut (impl Transaction + ?Sized),
    parent_id: &ParentId,
    reason: &str,
    cancelled: bool,
) -> StoreResult<(i64, bool)> {
    let settled = tx.skip_open_children(parent_id, reason).await?;
    let dialect = tx.dialect();
    let row = tx
        .fetch(Statement::new(LOCK_COMPLETE.of(dialect)).text(parent_id.as_str()))
        .await?;
    let Some(row) = row.first() else {
        return Err(StoreError::ParentNotFound(parent_id.clone()));
    };
    let was_complete = row.bool("complete")?;
    tx.execute(
        Statement::new(CLOSE_SKIPPED.of(dialect))
            .text(parent_id.as_str())
            .int(settled.children)
            .int(settled.from_in_flight)
            .int(settled.from_held)
            .bool(cancelled),
    )
    .await?;
    tx.execute(Statement::new(CLOSE_LANE).text(parent_id.as_str())).await?;
    Ok((settled.children, !was_complete))
}

impl Store {
    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> StoreResult<Parent> {
        let rows = self
            .scan(Statement::new(self.sql(&PARENT_BY_ID)).text(parent_id.as_str()))
            .await?;
        match rows.first() {
            Some(row) => Ok(rows::parent(&**row, include_payload)?),
            None => Err(StoreError::ParentNotFound(parent_id.clone())),
        }
    }

    /// The queue of a parent, if it exists.
    pub async fn queue_of(&self, parent_id: &ParentId) -> StoreResult<Option<QueueName>> {
        let row = self
            .fetch_optional(Statement::new(PARENT_QUEUE).text(parent_id.as_str()))
            .await?;
        Ok(row
            .map(|row| row.text("queue"))
            .transpose()?
            .map(QueueName::from_ledger))
    }

    /// `ParentNotFound` unless the parent exists.
    pub(super) async fn require_parent(&self, parent_id: &ParentId) -> StoreResult<()> {
        match self.queue_of(parent_id).await? {
            Some(_) => Ok(()),
            None => Err(StoreError::ParentNotFound(parent_id.clone())),
        }
    }

    pub async fn list_parents(&self, filter: &ParentFilter) -> StoreResult<ParentPage> {
        let sql = if filter.newest { &LIST_NEWEST } else { &LIST_OLDEST };
        let scope = filter.within.as_json();
        // One row past the page says whether another page follows.
        let rows = self
            .scan(
                Statement::new(self.sql(sql))
                    .text(filter.queue.as_ref().map(QueueName::as_str))
                    .text(filter.state.map(|s| s.as_str()))
                    .int(
                        filter
                            .after_position
                            .unwrap_or(if filter.newest { i64::MAX } else { i64::MIN }),
                    )
                    .bool(filter.resumable)
                    .int(filter.limit + 1)
                    .text(scope.as_deref())
                    .text(filter.has.map(ParentHas::as_str))
                    .time(filter.created_after)
                    .time(filter.created_before),
            )
            .await?;
        let more = rows.len() as i64 > filter.limit;
        let mut parents = Vec::with_capacity(rows.len());
        let mut next_position = None;
        for row in rows.iter().take(filter.limit as usize) {
            next_position = Some(row.int("position")?);
            parents.push(rows::parent(&**row, false)?);
        }
        Ok(ParentPage {
            parents,
            next_position: next_position.filter(|_| more),
        })
    }

    /// Cancels a parent: every child not yet terminal becomes `skipped` with
    /// `reason`, in one transaction, and the parent (sealed at what it holds,
    /// if it was still being decomposed) completes. A holder's later outcome
    /// loses to it and is logged as a conflict. Children are locked before the
    /// parent row, as outcomes lock them. Returns how many children it skipped.
    pub async fn cancel(&self, parent_id: &ParentId, reason: &str) -> StoreResult<i64> {
        let mut tx = self.db.begin().await?;
        let (settled, completed) = close_skipping(&mut *tx, parent_id, reason, true).await?;
        let completed: &[ParentId] = if completed {
            std::slice::from_ref(parent_id)
        } else {
            &[]
        };
        self.commit_completing(tx, completed).await?;
        Ok(settled)
    }

    /// Whether a parent is complete, `None` when it is missing.
    pub(super) async fn parent_complete(&self, parent_id: &ParentId) -> StoreResult<Option<bool>> {
        let rows = self
            .scan(Statement::new(PARENT_COMPLETE).text(parent_id.as_str()))
            .await?;
        Ok(rows.first().map(|row| row.bool("complete")).transpose()?)
    }
}
