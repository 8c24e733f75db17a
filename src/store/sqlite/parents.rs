//! Parents on SQLite: register, append, the seal's statements, and reads.

use std::sync::LazyLock;

use serde_json::value::RawValue;
use sqlx::AssertSqlSafe;

use super::{SqliteStore, SqliteTx, now, rows};
use crate::ledger::budget::largest_payload;
use crate::ledger::{NewChild, ParentId, Registration};
use crate::store::{StoreError, StoreResult, sql, steps};

static REGISTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                             total, skipped, priority, child_bytes, created_at, decomposed_at, completed_at, \
                             webhook_url) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?10, ?11, {now}, CASE WHEN ?9 THEN {now} END, \
                 CASE WHEN {complete} THEN {now} END, ?12) \
         ON CONFLICT (parent_id) DO NOTHING RETURNING completed_at IS NOT NULL",
        now = now!(),
        complete = sql::complete("?9", "?8", "?7")
    )
});

steps::shared_reads!(
    SqliteStore,
    sqlx::Sqlite,
    readers,
    now!(),
    sql::within_sqlite,
    rows::time_param
);

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

steps::seal_steps!(SqliteTx, now!());

/// Children as one compact JSON array of `[sequence, key, payload, skip]`, so a
/// whole chunk is written by one statement reading `json_each`.
fn children_json(children: &[NewChild]) -> String {
    let rows: Vec<(i64, Option<&str>, &serde_json::value::RawValue, Option<&str>)> = children
        .iter()
        .map(|c| (c.sequence, c.key.as_deref(), &*c.payload, c.skip.as_deref()))
        .collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned())
}

/// The first sequences of a chunk (at most 100) whose stored content differs
/// from the appended one.
pub(in crate::store) async fn differing_sequences(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    chunk: &[NewChild],
) -> StoreResult<Vec<i64>> {
    Ok(sqlx::query_scalar(
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
    .await?)
}

/// Writes the parent row of a registration; `None` when the id is taken
/// (nothing written), else whether it completed at once.
pub(in crate::store) async fn insert_parent(tx: &mut SqliteTx, reg: &Registration) -> StoreResult<Option<bool>> {
    let skipped = reg.children.iter().filter(|c| c.skip.is_some()).count() as i64;
    Ok(sqlx::query_scalar(AssertSqlSafe(REGISTER.as_str()))
        .bind(reg.parent_id.as_str())
        .bind(reg.queue.as_str())
        .bind(reg.payload.as_deref().map(RawValue::get))
        .bind(reg.max_attempts)
        .bind(reg.expired_lease.as_str())
        .bind(&reg.fingerprint)
        .bind(reg.children.len() as i64)
        .bind(skipped)
        .bind(reg.decomposed)
        .bind(reg.priority)
        .bind(largest_payload(&reg.children))
        .bind(reg.webhook_url.as_deref())
        .fetch_optional(&mut **tx)
        .await?)
}

/// Writes one chunk of children in one statement reading `json_each`. With
/// `idempotent`, sequences already present are left alone. Returns how many
/// rows were written and how many were skipped children.
pub(in crate::store) async fn insert_chunk(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    chunk: &[NewChild],
    idempotent: bool,
) -> StoreResult<(u64, i64)> {
    let on_conflict = if idempotent {
        "ON CONFLICT (parent_id, sequence) DO NOTHING"
    } else {
        ""
    };
    let states: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at, changed_at) \
         SELECT ?1, value ->> 0, value ->> 1, value -> 2, \
             CASE WHEN value ->> 3 IS NULL THEN 'pending' ELSE 'skipped' END, value ->> 3, \
             CASE WHEN value ->> 3 IS NULL THEN NULL ELSE {now} END, {now} \
         FROM json_each(?2) WHERE true {on_conflict} RETURNING state",
        now = now!()
    )))
    .bind(parent_id.as_str())
    .bind(children_json(chunk))
    .fetch_all(&mut **tx)
    .await
    .map_err(|err| StoreError::from_child_insert(err, parent_id))?;
    let skipped = states.iter().filter(|s| *s == "skipped").count() as i64;
    Ok((states.len() as u64, skipped))
}

/// Skips every non-terminal child of a parent with `reason` (see
/// `Store::cancel`). Returns how many, and how many of them were in flight
/// and held.
pub(in crate::store) async fn skip_open_children(
    tx: &mut SqliteTx,
    parent_id: &ParentId,
    reason: &str,
) -> StoreResult<(i64, i64, i64)> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE child SET state = 'skipped', reason = ?2, terminal_at = {now}, changed_at = {now}, \
                 settled_from = state \
             WHERE parent_id = ?1 AND state IN ('pending', 'in_flight', 'held') RETURNING settled_from",
            now = now!()
        )
    });
    let from: Vec<String> = sqlx::query_scalar(AssertSqlSafe(SQL.as_str()))
        .bind(parent_id.as_str())
        .bind(reason)
        .fetch_all(&mut **tx)
        .await?;
    let count = |state: &str| from.iter().filter(|s| *s == state).count() as i64;
    Ok((from.len() as i64, count("in_flight"), count("held")))
}

/// Whether a parent is complete, `None` when missing (the write transaction
/// holds SQLite's one write lock).
pub(in crate::store) async fn lock_complete(tx: &mut SqliteTx, parent_id: &ParentId) -> StoreResult<Option<bool>> {
    Ok(sqlx::query_scalar(crate::store::lifecycle::PARENT_COMPLETE)
        .bind(parent_id.as_str())
        .fetch_optional(&mut **tx)
        .await?)
}

crate::store::lifecycle::cancel_steps!(SqliteTx, now!());

crate::store::lifecycle::lifecycle_steps!(
    SqliteStore,
    now!(),
    "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-' || $1 || ' seconds')"
);
