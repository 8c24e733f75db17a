//! Redrive: a new parent whose children are another parent's selected
//! children (keys and payloads), written by one `INSERT ... SELECT` in the
//! database, never a round trip per child; and the bulk retry of a parent's
//! held children.

use super::statement::{Dialect, Sql, Statement};
use super::{Store, StoreError, StoreResult, sql};
use crate::ledger::redrive::Redrive;
use crate::ledger::{Changes, Outcome, Parent, ParentId, Work};

/// The selection of parent `$2`'s children: states `$3` (processed), `$4`
/// (failed), `$5` (skipped), and reasons `$6` (a JSON array text; NULL: any).
fn selected(d: &Dialect) -> String {
    format!(
        "c.parent_id = $2 \
         AND (($3 AND ({state}) = 'processed') OR ($4 AND c.state = 'failed') OR ($5 AND c.state = 'skipped')) \
         AND ($6 IS NULL OR c.reason IN ({texts}))",
        state = sql::row_state(d),
        texts = (d.json_texts)("$6")
    )
}

/// How many children a redrive selects (`$1` unused, for the same numbering).
static COUNT_SELECTED: Sql = Sql::new(|d| {
    format!(
        "SELECT count(*) AS n FROM child c WHERE ($1 IS NULL OR true) AND {}",
        selected(d)
    )
});

/// The new parent `$1` from parent `$2`: its queue (`$7` unless NULL),
/// priority (`$8` unless NULL) and settings, fingerprint `$9`, decomposed
/// now and counted once its children are written; no row back when the id
/// is taken.
static REDRIVE_PARENT: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, total, skipped, \
             priority, child_bytes, created_at, decomposed_at, webhook_url, flow_key, backoff_initial, backoff_max, \
             tolerated_count, tolerated_percent, redrive_of) \
         SELECT $1, coalesce($7, p.queue), p.payload, p.max_attempts, p.expired_lease, $9, 0, 0, \
             coalesce($8, p.priority), p.child_bytes, {now}, {now}, p.webhook_url, p.flow_key, p.backoff_initial, \
             p.backoff_max, p.tolerated_count, p.tolerated_percent, p.parent_id \
         FROM parent p WHERE p.parent_id = $2 AND ($3 OR $4 OR $5 OR true) AND ($6 IS NULL OR true) \
         ON CONFLICT (parent_id) DO NOTHING RETURNING parent_id",
        now = d.now
    )
});

/// The selected children of `$2` as the children of `$1`, numbered from 0 in
/// their old sequence order, pending, each naming the child it was.
static REDRIVE_CHILDREN: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO child (parent_id, sequence, key, payload, state, changed_at, redrive_of_parent, \
             redrive_of_sequence) \
         SELECT $1, row_number() OVER (ORDER BY c.sequence) - 1, c.key, c.payload, 'pending', {now}, \
             c.parent_id, c.sequence \
         FROM child c WHERE {selected}",
        now = d.now,
        selected = selected(d)
    )
});

/// The new parent's total, complete at once when nothing was selected.
static COUNT_REDRIVEN: Sql = Sql::new(|d| {
    format!(
        "UPDATE parent SET total = $2, completed_at = CASE WHEN $2 = 0 THEN {now} END WHERE parent_id = $1",
        now = d.now
    )
});

const FINGERPRINT: &str = "SELECT fingerprint FROM parent WHERE parent_id = $1";

/// What a redrive did.
#[derive(Debug, Clone)]
pub struct Redriven {
    /// This call created the new parent (`false`: a dry run, or the same
    /// redrive was done before).
    pub created: bool,
    /// The children selected (a dry run), or the new parent's.
    pub children: i64,
    /// The new parent; `None` on a dry run.
    pub parent: Option<Parent>,
}

impl Store {
    /// How many children `redrive` selects; `ParentNotFound` for its source.
    pub async fn redrive_count(&self, redrive: &Redrive) -> StoreResult<i64> {
        self.require_parent(&redrive.from).await?;
        let reasons = reasons_json(redrive);
        let rows = self
            .scan(selection(self.sql(&COUNT_SELECTED), redrive, reasons.as_deref(), None))
            .await?;
        let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
        Ok(row.int("n")?)
    }

    /// Registers `redrive.into` from `redrive.from`'s selected children in
    /// one transaction; the same redrive again returns the parent it made.
    pub async fn redrive(&self, redrive: &Redrive) -> StoreResult<Redriven> {
        let fingerprint = redrive.fingerprint();
        let reasons = reasons_json(redrive);
        let mut tx = self.db.begin().await?;
        let created = tx
            .fetch(selection(
                self.sql(&REDRIVE_PARENT),
                redrive,
                reasons.as_deref(),
                Some(&fingerprint),
            ))
            .await?;
        if created.is_empty() {
            drop(tx);
            let stored = self
                .fetch_optional(Statement::new(FINGERPRINT).text(redrive.into.as_str()))
                .await?
                .map(|row| row.text("fingerprint"))
                .transpose()?;
            return match stored {
                // The source is missing (no parent was made from it).
                None => Err(StoreError::ParentNotFound(redrive.from.clone())),
                Some(stored) if stored == fingerprint => {
                    let parent = self.parent(&redrive.into, false).await?;
                    Ok(Redriven {
                        created: false,
                        children: parent.counts.total,
                        parent: Some(parent),
                    })
                }
                Some(_) => Err(StoreError::RegistrationConflict(redrive.into.clone())),
            };
        }
        let children = tx
            .execute(selection(
                self.sql(&REDRIVE_CHILDREN),
                redrive,
                reasons.as_deref(),
                None,
            ))
            .await? as i64;
        tx.execute(
            Statement::new(self.sql(&COUNT_REDRIVEN))
                .text(redrive.into.as_str())
                .int(children),
        )
        .await?;
        self.open_lane(&mut *tx, &redrive.into, false).await?;
        let completed: &[ParentId] = if children == 0 {
            std::slice::from_ref(&redrive.into)
        } else {
            &[]
        };
        self.commit_completing(tx, completed).await?;
        self.db.after_bulk_write(children).await?;
        let parent = self.parent(&redrive.into, false).await?;
        self.signal_change(Changes::of_parent_in(parent.parent_id.clone(), parent.queue.clone()));
        self.signal_work(Work::of_registered(&parent));
        Ok(Redriven {
            created: true,
            children,
            parent: Some(parent),
        })
    }

    /// Returns every held child of a parent to pending, as `retry` does one;
    /// how many. `ParentNotFound` when it is missing.
    pub async fn retry_all_held(&self, parent_id: &ParentId) -> StoreResult<u64> {
        let Some(queue) = self.queue_of(parent_id).await? else {
            return Err(StoreError::ParentNotFound(parent_id.clone()));
        };
        let retried = self.db.retry_held(parent_id, None).await?;
        if retried > 0 {
            self.signal_work(Work::of_parent(queue, parent_id.clone(), retried));
            self.parents_changed([parent_id]);
        }
        Ok(retried)
    }
}

/// The reasons a redrive selects, as the JSON array text its statements read.
fn reasons_json(redrive: &Redrive) -> Option<String> {
    redrive
        .reasons
        .as_ref()
        .map(|r| serde_json::to_string(r).expect("reasons serialize"))
}

/// A redrive statement's parameters: `$1` the new parent, `$2` the old,
/// `$3`-`$5` the states, `$6` the reasons, then the new parent's queue,
/// priority and fingerprint.
fn selection<'a>(
    sql: &'static str,
    redrive: &'a Redrive,
    reasons: Option<&'a str>,
    fingerprint: Option<&'a str>,
) -> Statement<'a> {
    let statement = Statement::new(sql)
        .text(redrive.into.as_str())
        .text(redrive.from.as_str())
        .bool(redrive.selects(Outcome::Processed))
        .bool(redrive.selects(Outcome::Failed))
        .bool(redrive.selects(Outcome::Skipped))
        .text(reasons);
    match fingerprint {
        None => statement,
        Some(fingerprint) => statement
            .text(redrive.queue.as_ref().map(|q| q.as_str()))
            .int32(redrive.priority)
            .text(fingerprint),
    }
}
