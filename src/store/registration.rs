//! Registration, appends and the seal: a parent's children are written
//! before anything can be claimed, in one transaction with the decomposed
//! mark, or appended in pages and sealed when exactly `0..total` are stored.

use super::backend::{ChildChunk, Inserted, Transaction};
use super::reports::{SealCensus, SealReport};
use super::statement::{Sql, Statement};
use super::{Store, StoreError, StoreResult, WRITE_CHUNK, sql};
use crate::ledger::budget::largest_payload;
use crate::ledger::projection::{self, SEAL_REPORT_LIMIT, Tally};
use crate::ledger::{Appended, Changes, NewChild, Parent, ParentId, Registration, Tolerance, Work};

/// How many differing sequences an append conflict names at most.
const DIFFERING_REPORTED: usize = 100;

/// The parent row of a registration; no row back when the id is taken.
static REGISTER: Sql = Sql::new(|d| {
    format!(
        "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                             total, skipped, priority, child_bytes, created_at, decomposed_at, completed_at, \
                             webhook_url, not_before, flow_key, backoff_initial, backoff_max, \
                             tolerated_count, tolerated_percent) \
         VALUES ($1, $2, {payload}, $4, $5, $6, $7, $8, $10, $11, {now}, CASE WHEN $9 THEN {now} END, \
                 CASE WHEN {complete} THEN {now} END, $12, $13, $14, $15, $16, $17, $18) \
         ON CONFLICT (parent_id) DO NOTHING RETURNING completed_at IS NOT NULL AS completed",
        payload = (d.json)("$3"),
        now = d.now,
        complete = sql::complete("$9", "$8", "$7")
    )
});

/// A parent row's lock; whether it is decomposed, no row when it is missing.
static LOCK_DECOMPOSED: Sql = Sql::new(|d| {
    format!(
        "SELECT decomposed_at IS NOT NULL AS decomposed FROM parent WHERE parent_id = $1{}",
        d.for_update
    )
});

/// Marks a parent decomposed with the projection of its rows, complete or not.
static MARK_DECOMPOSED: Sql = Sql::new(|d| {
    format!(
        "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, decomposed_at = {now}, \
             completed_at = CASE WHEN $6 THEN {now} END \
         WHERE parent_id = $1",
        now = d.now
    )
});

/// Opens the lane of a parent that was just decomposed: its queue claims may
/// start. `floor` is its lowest pending child without a delay (none when
/// some child has a `not_before`: see `DELAY_ALL`), `ready_at` its earliest
/// delayed one; its `not_before`, flow key and trace context (kept with its
/// registration and appends) go with it.
const OPEN_LANE: &str = "INSERT INTO lane (parent_id, queue, priority, position, child_bytes, floor, ready_at, \
        traceparent, children_traced, not_before, flow_key) \
    SELECT p.parent_id, p.queue, p.priority, p.position, p.child_bytes, \
        (SELECT min(c.sequence) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
          AND c.available_at IS NULL), \
        (SELECT min(c.available_at) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
          AND c.available_at IS NOT NULL), \
        (SELECT t.traceparent FROM trace_context t WHERE t.parent_id = p.parent_id AND t.sequence = -1), \
        EXISTS (SELECT 1 FROM trace_context t WHERE t.parent_id = p.parent_id AND t.sequence >= 0), \
        p.not_before, p.flow_key \
    FROM parent p WHERE p.parent_id = $1";

/// Gives children `$2` (JSON `[[sequence, time], ...]`) of parent `$1` their
/// own `not_before`, as their `available_at`.
static DELAY_CHILDREN: Sql = Sql::new(|d| {
    format!(
        "UPDATE child SET not_before = {at}, available_at = {at} \
         FROM ({pairs}) x WHERE child.parent_id = $1 AND child.sequence = x.n AND child.state = 'pending'",
        at = (d.as_time)("x.t"),
        pairs = (d.json_pairs)("$2")
    )
});

/// When some child of parent `$1` has its own `not_before`, every pending
/// child without one gets an `available_at` of now: all its children are
/// then handed out through `available_at` (earliest first), and its lane
/// opens without a floor. A child claimed early in sequence order could
/// otherwise sit above the floor and be read again from it.
static DELAY_ALL: Sql = Sql::new(|d| {
    format!(
        "UPDATE child SET available_at = {now} \
         WHERE parent_id = $1 AND state = 'pending' AND available_at IS NULL \
           AND EXISTS (SELECT 1 FROM child d WHERE d.parent_id = $1 AND d.not_before IS NOT NULL)",
        now = d.now
    )
});

/// The flow rows of a keyed parent's queue and key (see `store::admission`).
const FLOW_ROWS: &str = "INSERT INTO flow_limit (queue, flow_key) VALUES ($1, ''), ($1, $2) \
    ON CONFLICT (queue, flow_key) DO NOTHING";

/// Adds appended children (`$2`, of which `$3` skipped, the largest payload
/// `$4` bytes) to a parent's projection; `$5`: whether they came after every
/// sequence stored before (`parent.children_in_order`, migration 0016 on
/// Postgres, 0015 on SQLite).
const COUNT_APPENDED: &str = "UPDATE parent SET total = total + $2, skipped = skipped + $3, \
    child_bytes = CASE WHEN coalesce(child_bytes, 0) < $4 THEN $4 ELSE child_bytes END, \
    children_in_order = children_in_order AND $5 WHERE parent_id = $1";

/// The highest sequence a parent holds.
const TOP_SEQUENCE: &str = "SELECT max(sequence) AS top FROM child WHERE parent_id = $1";

/// A seal's census: stored sequences below `$2` and at or past it.
const SEAL_CENSUS: &str = "SELECT count(*) FILTER (WHERE sequence < $2) AS below, \
    count(*) FILTER (WHERE sequence >= $2) AS beyond FROM child WHERE parent_id = $1";

/// The lowest stored sequence below `$2`.
const SEAL_FIRST: &str = "SELECT min(sequence) AS first FROM child WHERE parent_id = $1 AND sequence < $2";

/// Stored sequences below `$2` that start a gap (or end the run), with the
/// next stored sequence: what `projection::missing_sequences` reads.
const SEAL_GAPS: &str = "SELECT sequence, next FROM ( \
        SELECT sequence, lead(sequence) OVER (ORDER BY sequence) AS next \
        FROM child WHERE parent_id = $1 AND sequence < $2) runs \
    WHERE next IS NULL OR next > sequence + 1 ORDER BY sequence LIMIT $3";

/// Stored sequences at or past `$2`.
const SEAL_EXTRA: &str =
    "SELECT sequence FROM child WHERE parent_id = $1 AND sequence >= $2 ORDER BY sequence LIMIT $3";

/// The projection derived from a parent's rows. Its processed children are
/// the rows that say so and those recorded without being rewritten: the
/// rows that look in flight, less those a lease lists (`sql::listed_in_flight`).
pub(super) static TERMINAL_TALLY: Sql = Sql::new(|d| {
    format!(
        "SELECT count(*) AS total, \
             count(*) FILTER (WHERE c.state = 'processed') + count(*) FILTER (WHERE {leased}) - {listed} \
                 AS processed, \
             count(*) FILTER (WHERE c.state = 'failed') AS failed, \
             count(*) FILTER (WHERE c.state = 'skipped') AS skipped \
         FROM child c LEFT JOIN lane ln ON ln.parent_id = c.parent_id WHERE c.parent_id = $1",
        leased = sql::leased("ln.floor", "ln.parent_id IS NOT NULL"),
        listed = sql::listed_in_flight(d, "$1")
    )
});

const PARENT_FINGERPRINT: &str = "SELECT fingerprint FROM parent WHERE parent_id = $1";

impl Store {
    /// Registers a parent with its children in one transaction. Returns whether
    /// this call created it (`false`: an identical registration already existed).
    pub async fn register(&self, registration: &Registration) -> StoreResult<(bool, Parent)> {
        let parent_id = &registration.parent_id;
        let mut tx = self.db.begin().await?;
        let skipped = registration.children.iter().filter(|c| c.skip.is_some()).count() as i64;
        let row = tx
            .fetch(
                Statement::new(self.sql(&REGISTER))
                    .text(parent_id.as_str())
                    .text(registration.queue.as_str())
                    .text(registration.payload.as_deref().map(|p| p.get()))
                    .int32(registration.max_attempts)
                    .text(registration.expired_lease.as_str())
                    .text(registration.fingerprint.as_str())
                    .int(registration.children.len() as i64)
                    .int(skipped)
                    .bool(registration.decomposed)
                    .int32(registration.priority)
                    .int(largest_payload(&registration.children))
                    .text(registration.webhook_url.as_deref())
                    .time(registration.admission.not_before)
                    .text(registration.admission.flow_key.as_deref())
                    .float(registration.admission.retry_backoff.map(|b| b.initial_seconds))
                    .float(registration.admission.retry_backoff.map(|b| b.max_seconds))
                    .int(Tolerance::columns(registration.tolerance).0)
                    .float(Tolerance::columns(registration.tolerance).1),
            )
            .await?
            .into_iter()
            .next();
        let Some(row) = row else {
            drop(tx);
            let stored = self
                .fetch_optional(Statement::new(PARENT_FINGERPRINT).text(parent_id.as_str()))
                .await?
                .map(|row| row.text("fingerprint"))
                .transpose()?;
            if stored.as_deref() != Some(&registration.fingerprint) {
                return Err(StoreError::RegistrationConflict(parent_id.clone()));
            }
            return Ok((false, self.parent(parent_id, false).await?));
        };
        let completed = row.bool("completed")?;
        let inserted = insert_children(&mut *tx, parent_id, &registration.children, false).await?;
        super::traces::keep(
            &mut *tx,
            self,
            parent_id,
            registration.traceparent.as_deref(),
            &registration.children,
        )
        .await?;
        if registration.decomposed {
            self.open_lane(
                &mut *tx,
                parent_id,
                registration.children.iter().any(|c| c.not_before.is_some()),
            )
            .await?;
        }
        let completed: &[ParentId] = if completed {
            std::slice::from_ref(parent_id)
        } else {
            &[]
        };
        self.commit_completing(tx, completed).await?;
        self.db.after_bulk_write(inserted.rows as i64).await?;
        let parent = self.parent(parent_id, false).await?;
        self.signal_change(Changes::of_parent_in(parent_id.clone(), parent.queue.clone()));
        self.signal_work(Work::of_registered(&parent));
        Ok((true, parent))
    }

    /// Appends children to a decomposing parent, idempotent per sequence: the
    /// same content again is a no-op, different content writes nothing.
    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> StoreResult<Appended> {
        let mut tx = self.db.begin().await?;
        match lock_decomposed(&mut *tx, parent_id).await? {
            None => return Err(StoreError::ParentNotFound(parent_id.clone())),
            Some(true) => return Err(StoreError::ParentDecomposed(parent_id.clone())),
            Some(false) => {}
        }
        let top = tx
            .fetch(Statement::new(TOP_SEQUENCE).text(parent_id.as_str()))
            .await?
            .first()
            .map(|row| row.opt_int("top"))
            .transpose()?
            .flatten();
        let inserted = insert_children(&mut *tx, parent_id, children, true).await?;
        let mut differing = Vec::new();
        for chunk in children.chunks(WRITE_CHUNK) {
            differing.extend(tx.differing_sequences(parent_id, chunk).await?);
            if differing.len() >= DIFFERING_REPORTED {
                differing.truncate(DIFFERING_REPORTED);
                break;
            }
        }
        if !differing.is_empty() {
            return Err(StoreError::ChildrenConflict {
                parent_id: parent_id.clone(),
                sequences: differing,
            });
        }
        super::traces::keep(&mut *tx, self, parent_id, None, children).await?;
        tx.execute(
            Statement::new(COUNT_APPENDED)
                .text(parent_id.as_str())
                .int(inserted.rows as i64)
                .int(inserted.skipped)
                .int(largest_payload(children))
                .bool(inserted.rows == 0 || (inserted.rows as usize == children.len() && follows(top, children))),
        )
        .await?;
        tx.commit().await?;
        self.parents_changed([parent_id]);
        self.db.after_bulk_write(inserted.rows as i64).await?;
        Ok(Appended {
            inserted: inserted.rows,
            existing: children.len() as u64 - inserted.rows,
        })
    }

    /// Marks a decomposing parent decomposed when exactly `0..total` are stored;
    /// a sealed parent is returned as it is.
    pub async fn seal(&self, parent_id: &ParentId, total: i64) -> StoreResult<Parent> {
        let mut tx = self.db.begin().await?;
        let decomposed = lock_decomposed(&mut *tx, parent_id)
            .await?
            .ok_or_else(|| StoreError::ParentNotFound(parent_id.clone()))?;
        let census = seal_census(&mut *tx, parent_id, total).await?;
        if !census.matches(total) {
            let report = seal_report(&mut *tx, parent_id, total, SEAL_REPORT_LIMIT as i64).await?;
            return Err(StoreError::SealMismatch {
                total,
                missing: projection::missing_sequences(total, report.first, &report.gaps),
                extra: report.extra,
            });
        }
        let mut completed = false;
        if !decomposed {
            let rows = tally(&mut *tx, parent_id).await?;
            completed = rows.is_complete(true);
            tx.execute(
                Statement::new(self.sql(&MARK_DECOMPOSED))
                    .text(parent_id.as_str())
                    .int(rows.total)
                    .int(rows.processed)
                    .int(rows.failed)
                    .int(rows.skipped)
                    .bool(completed),
            )
            .await?;
            self.open_lane(&mut *tx, parent_id, true).await?;
        }
        let completed: &[ParentId] = if completed {
            std::slice::from_ref(parent_id)
        } else {
            &[]
        };
        self.commit_completing(tx, completed).await?;
        let parent = self.parent(parent_id, false).await?;
        if !decomposed {
            self.signal_change(Changes::of_parent_in(parent_id.clone(), parent.queue.clone()));
            self.signal_work(Work::of_registered(&parent));
        }
        Ok(parent)
    }
}

impl Store {
    /// Opens a decomposed parent's lane (`OPEN_LANE`), its children all
    /// delayed first when some may have a `not_before` (`DELAY_ALL`), and the
    /// flow rows of its key.
    pub(super) async fn open_lane(
        &self,
        tx: &mut dyn Transaction,
        parent_id: &ParentId,
        delayed: bool,
    ) -> StoreResult<()> {
        if delayed {
            tx.execute(Statement::new(self.sql(&DELAY_ALL)).text(parent_id.as_str()))
                .await?;
        }
        let lane = tx
            .fetch(Statement::new(OPEN_LANE_KEYED.as_str()).text(parent_id.as_str()))
            .await?;
        if let Some(key) = lane.first().map(|row| row.opt_text("flow_key")).transpose()?.flatten() {
            let queue = lane[0].text("queue")?;
            tx.execute(Statement::new(FLOW_ROWS).text(queue.as_str()).text(key.as_str()))
                .await?;
        }
        Ok(())
    }
}

/// `OPEN_LANE`, saying the lane's queue and flow key.
static OPEN_LANE_KEYED: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| format!("{OPEN_LANE} RETURNING queue, flow_key"));

/// Whether appended `children` keep a parent's children in sequence order
/// after `top`, its highest sequence before: they come in ascending order
/// (so chunks written one after the other never go back) and above it.
fn follows(top: Option<i64>, children: &[NewChild]) -> bool {
    children.windows(2).all(|w| w[0].sequence < w[1].sequence)
        && children
            .first()
            .is_none_or(|first| top.is_none_or(|top| first.sequence > top))
}

/// Writes children in statements of `WRITE_CHUNK`.
async fn insert_children(
    tx: &mut dyn Transaction,
    parent_id: &ParentId,
    children: &[NewChild],
    idempotent: bool,
) -> StoreResult<Inserted> {
    let mut inserted = Inserted::default();
    for chunk in children.chunks(WRITE_CHUNK) {
        let written = tx
            .insert_children(ChildChunk {
                parent_id,
                children: chunk,
                idempotent,
            })
            .await?;
        inserted.rows += written.rows;
        inserted.skipped += written.skipped;
        let delayed: Vec<(i64, String)> = chunk
            .iter()
            .filter(|c| c.skip.is_none())
            .filter_map(|c| {
                c.not_before
                    .map(|at| (c.sequence, at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()))
            })
            .collect();
        if !delayed.is_empty() {
            let pairs = serde_json::to_string(&delayed).unwrap_or_else(|_| "[]".to_owned());
            let sql = DELAY_CHILDREN.of(tx.dialect());
            tx.execute(Statement::new(sql).text(parent_id.as_str()).text(pairs.as_str()))
                .await?;
        }
    }
    Ok(inserted)
}

/// Locks a parent row; whether it is decomposed, `None` when it is missing.
async fn lock_decomposed(tx: &mut dyn Transaction, parent_id: &ParentId) -> StoreResult<Option<bool>> {
    let rows = tx
        .fetch(Statement::new(LOCK_DECOMPOSED.of(tx.dialect())).text(parent_id.as_str()))
        .await?;
    Ok(rows.first().map(|row| row.bool("decomposed")).transpose()?)
}

/// Stored sequences below `total`, and at or past it.
async fn seal_census(tx: &mut dyn Transaction, parent_id: &ParentId, total: i64) -> StoreResult<SealCensus> {
    let rows = tx
        .fetch(Statement::new(SEAL_CENSUS).text(parent_id.as_str()).int(total))
        .await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    Ok(SealCensus {
        below: row.int("below")?,
        beyond: row.int("beyond")?,
    })
}

/// What a seal mismatch names, `limit` of each at most.
async fn seal_report(
    tx: &mut dyn Transaction,
    parent_id: &ParentId,
    total: i64,
    limit: i64,
) -> StoreResult<SealReport> {
    let first = tx
        .fetch(Statement::new(SEAL_FIRST).text(parent_id.as_str()).int(total))
        .await?
        .first()
        .map(|row| row.opt_int("first"))
        .transpose()?
        .flatten();
    let gaps = tx
        .fetch(
            Statement::new(SEAL_GAPS)
                .text(parent_id.as_str())
                .int(total)
                .int(limit + 1),
        )
        .await?
        .iter()
        .map(|row| Ok((row.int("sequence")?, row.opt_int("next")?)))
        .collect::<Result<_, sqlx::Error>>()?;
    let extra = tx
        .fetch(
            Statement::new(SEAL_EXTRA)
                .text(parent_id.as_str())
                .int(total)
                .int(limit),
        )
        .await?
        .iter()
        .map(|row| row.int("sequence"))
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(SealReport { first, gaps, extra })
}

/// The projection derived from a parent's rows.
pub(super) async fn tally(tx: &mut dyn Transaction, parent_id: &ParentId) -> StoreResult<Tally> {
    let rows = tx
        .fetch(Statement::new(TERMINAL_TALLY.of(tx.dialect())).text(parent_id.as_str()))
        .await?;
    let row = rows.first().ok_or(sqlx::Error::RowNotFound)?;
    Ok(Tally {
        total: row.int("total")?,
        processed: row.int("processed")?,
        failed: row.int("failed")?,
        skipped: row.int("skipped")?,
    })
}
