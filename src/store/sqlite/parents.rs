//! Parents on SQLite: register, append, the seal's statements, and reads.

use std::sync::LazyLock;

use serde_json::Value;
use sqlx::{AssertSqlSafe, Row};

use super::{SqliteStore, SqliteTx, now, rows};
use crate::ledger::projection::Tally;
use crate::ledger::{Child, ChildState, NewChild, Parent, ParentId, QueueName, Registration};
use crate::store::rows::{Inserted, SealCensus, SealReport};
use crate::store::{ParentFilter, StoreError, StoreResult, WRITE_CHUNK, sql};

static REGISTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                             total, skipped, created_at, decomposed_at, completed_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, {now}, CASE WHEN ?9 THEN {now} END, \
                 CASE WHEN {complete} THEN {now} END) \
         RETURNING completed_at IS NOT NULL",
        now = now!(),
        complete = sql::complete("?9", "?8", "?7")
    )
});

impl SqliteStore {
    /// Writes a new parent and its children in one transaction, unless the id is taken.
    pub async fn register(&self, reg: &Registration) -> StoreResult<Inserted> {
        let mut tx = self.begin().await?;
        let existing: Option<String> = sqlx::query_scalar(sql::PARENT_FINGERPRINT)
            .bind(reg.parent_id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if existing.is_some() {
            return Ok(Inserted::Taken { fingerprint: existing });
        }
        let skipped = reg.children.iter().filter(|c| c.skip.is_some()).count() as i64;
        let total = reg.children.len() as i64;
        let completed: bool = sqlx::query_scalar(AssertSqlSafe(REGISTER.as_str()))
            .bind(reg.parent_id.as_str())
            .bind(reg.queue.as_str())
            .bind(reg.payload.as_ref().map(Value::to_string))
            .bind(reg.max_attempts)
            .bind(reg.expired_lease.as_str())
            .bind(&reg.fingerprint)
            .bind(total)
            .bind(skipped)
            .bind(reg.decomposed)
            .fetch_one(&mut *tx)
            .await?;
        insert_children(&mut tx, &reg.parent_id, &reg.children, false).await?;
        tx.commit().await?;
        Ok(Inserted::Created { completed })
    }

    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        match lock_decomposed(&mut tx, parent_id).await? {
            None => return Err(StoreError::ParentNotFound(parent_id.clone())),
            Some(true) => return Err(StoreError::ParentDecomposed(parent_id.clone())),
            Some(false) => {}
        }
        let (inserted, inserted_skipped) = insert_children(&mut tx, parent_id, children, true).await?;
        let differing = differing_sequences(&mut tx, parent_id, children).await?;
        if !differing.is_empty() {
            return Err(StoreError::ChildrenConflict {
                parent_id: parent_id.clone(),
                sequences: differing,
            });
        }
        sqlx::query("UPDATE parent SET total = total + ?2, skipped = skipped + ?3 WHERE parent_id = ?1")
            .bind(parent_id.as_str())
            .bind(inserted as i64)
            .bind(inserted_skipped)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(inserted)
    }

    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> StoreResult<Option<Parent>> {
        let row = sqlx::query(AssertSqlSafe(sql::PARENT_BY_ID.as_str()))
            .bind(parent_id.as_str())
            .fetch_optional(&self.readers)
            .await?;
        Ok(row.map(|row| rows::parent(&row, include_payload)).transpose()?)
    }

    /// Up to `fetch` parents matching `filter`, with their list positions.
    pub async fn list_parents(&self, filter: &ParentFilter, fetch: i64) -> StoreResult<Vec<(i64, Parent)>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "{select} \
             WHERE (?1 IS NULL OR p.queue = ?1) \
               AND (?2 IS NULL \
                    OR (?2 = 'decomposing' AND p.decomposed_at IS NULL) \
                    OR (?2 = 'active' AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL) \
                    OR (?2 = 'complete' AND p.completed_at IS NOT NULL)) \
               AND (?3 IS NULL OR p.position > ?3) \
               AND (NOT ?4 OR (p.decomposed_at IS NOT NULL AND p.completed_at IS NULL AND EXISTS ( \
                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
                      AND (c.available_at IS NULL OR c.available_at <= {now})))) \
             ORDER BY p.position LIMIT ?5",
            select = sql::PARENT_SELECT,
            now = now!()
        )))
        .bind(filter.queue.as_ref().map(QueueName::as_str))
        .bind(filter.state.map(|s| s.as_str()))
        .bind(filter.after_position)
        .bind(filter.resumable)
        .bind(fetch)
        .fetch_all(&self.readers)
        .await?;
        Ok(rows
            .iter()
            .map(|row| Ok((row.try_get::<i64, _>("position")?, rows::parent(row, false)?)))
            .collect::<Result<_, sqlx::Error>>()?)
    }

    pub async fn children(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        fetch: i64,
    ) -> StoreResult<Vec<Child>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM child c \
             WHERE c.parent_id = ?1 AND (?2 IS NULL OR c.state = ?2) AND (?3 IS NULL OR c.sequence > ?3) \
             ORDER BY c.sequence LIMIT ?4",
            sql::CHILD_COLUMNS
        )))
        .bind(parent_id.as_str())
        .bind(state.map(ChildState::as_str))
        .bind(after)
        .bind(fetch)
        .fetch_all(&self.readers)
        .await?;
        Ok(rows.iter().map(rows::child).collect::<Result<Vec<_>, _>>()?)
    }

    pub async fn parent_exists(&self, parent_id: &ParentId) -> StoreResult<bool> {
        let found: Option<i32> = sqlx::query_scalar(sql::PARENT_EXISTS)
            .bind(parent_id.as_str())
            .fetch_optional(&self.readers)
            .await?;
        Ok(found.is_some())
    }

    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<Option<Child>> {
        child(&self.readers, parent_id, sequence).await
    }
}

pub(super) async fn child<'e>(
    executor: impl sqlx::SqliteExecutor<'e>,
    parent_id: &ParentId,
    sequence: i64,
) -> StoreResult<Option<Child>> {
    let row = sqlx::query(AssertSqlSafe(sql::CHILD_BY_KEY.as_str()))
        .bind(parent_id.as_str())
        .bind(sequence)
        .fetch_optional(executor)
        .await?;
    Ok(row.map(|row| rows::child(&row)).transpose()?)
}

/// Whether a parent is decomposed, `None` when it is missing. The write
/// transaction already holds SQLite's one write lock.
pub(in crate::store) async fn lock_decomposed(tx: &mut SqliteTx, parent_id: &ParentId) -> StoreResult<Option<bool>> {
    Ok(
        sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = $1")
            .bind(parent_id.as_str())
            .fetch_optional(&mut **tx)
            .await?,
    )
}

pub(in crate::store) async fn seal_census(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    total: i64,
) -> StoreResult<SealCensus> {
    let (below, beyond): (i64, i64) = sqlx::query_as(sql::SEAL_CENSUS)
        .bind(parent_id.as_str())
        .bind(total)
        .fetch_one(&mut **tx)
        .await?;
    Ok(SealCensus { below, beyond })
}

pub(in crate::store) async fn seal_report(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    total: i64,
    limit: i64,
) -> StoreResult<SealReport> {
    let first = sqlx::query_scalar(sql::SEAL_FIRST)
        .bind(parent_id.as_str())
        .bind(total)
        .fetch_one(&mut **tx)
        .await?;
    let gaps = sqlx::query_as(sql::SEAL_GAPS)
        .bind(parent_id.as_str())
        .bind(total)
        .bind(limit + 1)
        .fetch_all(&mut **tx)
        .await?;
    let extra = sqlx::query_scalar(sql::SEAL_EXTRA)
        .bind(parent_id.as_str())
        .bind(total)
        .bind(limit)
        .fetch_all(&mut **tx)
        .await?;
    Ok(SealReport { first, gaps, extra })
}

pub(in crate::store) async fn tally(tx: &mut SqliteTx, parent_id: &ParentId) -> StoreResult<Tally> {
    let (total, processed, failed, skipped) = sqlx::query_as(sql::TERMINAL_TALLY)
        .bind(parent_id.as_str())
        .fetch_one(&mut **tx)
        .await?;
    Ok(Tally {
        total,
        processed,
        failed,
        skipped,
    })
}

/// Marks a parent decomposed with the projection of its rows, complete or not.
pub(in crate::store) async fn mark_decomposed(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    rows: &Tally,
    complete: bool,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "UPDATE parent SET total = ?2, processed = ?3, failed = ?4, skipped = ?5, decomposed_at = ",
        now!(),
        ", completed_at = CASE WHEN ?6 THEN ",
        now!(),
        " END WHERE parent_id = ?1"
    ))
    .bind(parent_id.as_str())
    .bind(rows.total)
    .bind(rows.processed)
    .bind(rows.failed)
    .bind(rows.skipped)
    .bind(complete)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Children as one compact JSON array of `[sequence, key, payload, skip]`, so a
/// whole chunk is written by one statement reading `json_each`.
fn children_json(children: &[NewChild]) -> String {
    let rows: Vec<(i64, Option<&str>, &serde_json::value::RawValue, Option<&str>)> = children
        .iter()
        .map(|c| (c.sequence, c.key.as_deref(), &*c.payload, c.skip.as_deref()))
        .collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned())
}

/// The first sequences (at most 100) whose stored content differs from the
/// appended one.
async fn differing_sequences(tx: &mut SqliteTx, parent_id: &ParentId, children: &[NewChild]) -> StoreResult<Vec<i64>> {
    let mut differing = Vec::new();
    for chunk in children.chunks(WRITE_CHUNK) {
        let found: Vec<i64> = sqlx::query_scalar(
            // CROSS JOIN keeps json_each as the outer loop: one primary-key
            // lookup per appended child, never a scan of the parent's children.
            "SELECT c.sequence FROM json_each(?2) j \
                 CROSS JOIN child c ON c.parent_id = ?1 AND c.sequence = j.value ->> 0 \
                 WHERE c.key IS NOT (j.value ->> 1) OR c.payload <> (j.value -> 2) \
                    OR c.reason IS NOT (j.value ->> 3) OR (c.state = 'skipped') <> ((j.value ->> 3) IS NOT NULL) \
                 ORDER BY c.sequence LIMIT 100",
        )
        .bind(parent_id.as_str())
        .bind(children_json(chunk))
        .fetch_all(&mut **tx)
        .await?;
        differing.extend(found);
        if differing.len() >= 100 {
            differing.truncate(100);
            break;
        }
    }
    Ok(differing)
}

/// Writes children in statements of `WRITE_CHUNK` read from `json_each`. With
/// `idempotent`, sequences already present are left alone. Returns how many
/// rows were written and how many were skipped children.
async fn insert_children(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    children: &[NewChild],
    idempotent: bool,
) -> StoreResult<(u64, i64)> {
    let on_conflict = if idempotent {
        "ON CONFLICT (parent_id, sequence) DO NOTHING"
    } else {
        ""
    };
    let (mut inserted, mut skipped) = (0, 0);
    for chunk in children.chunks(WRITE_CHUNK) {
        let states: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at) \
             SELECT ?1, value ->> 0, value ->> 1, value -> 2, \
                 CASE WHEN value ->> 3 IS NULL THEN 'pending' ELSE 'skipped' END, value ->> 3, \
                 CASE WHEN value ->> 3 IS NULL THEN NULL ELSE {now} END \
             FROM json_each(?2) WHERE true {on_conflict} RETURNING state",
            now = now!()
        )))
        .bind(parent_id.as_str())
        .bind(children_json(chunk))
        .fetch_all(&mut **tx)
        .await
        .map_err(|err| StoreError::from_child_insert(err, parent_id))?;
        inserted += states.len() as u64;
        skipped += states.iter().filter(|s| *s == "skipped").count() as i64;
    }
    Ok((inserted, skipped))
}
