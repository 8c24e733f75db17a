//! Parents on Postgres: register, append, the seal's statements, and reads.

use std::sync::LazyLock;

use serde_json::value::RawValue;
use sqlx::AssertSqlSafe;

use super::{PgStore, PgTx, rows};
use crate::ledger::budget::largest_payload;
use crate::ledger::{NewChild, ParentId, Registration};
use crate::store::{StoreError, StoreResult, sql, steps};

/// The parent row of a registration; no row back when the id is taken.
static REGISTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                             total, skipped, priority, child_bytes, decomposed_at, completed_at, webhook_url) \
         VALUES ($1, $2, $3::json, $4, $5, $6, $7, $8, $10, $11, CASE WHEN $9 THEN now() END, \
                 CASE WHEN {} THEN now() END, $12) \
         ON CONFLICT (parent_id) DO NOTHING RETURNING completed_at IS NOT NULL",
        sql::complete("$9", "$8", "$7")
    )
});

steps::shared_reads!(
    PgStore,
    sqlx::Postgres,
    pool,
    "now()",
    sql::within_postgres,
    rows::time_param
);

/// Locks a parent row; whether it is decomposed, `None` when it is missing.
pub(in crate::store) async fn lock_decomposed(tx: &mut PgTx, parent_id: &ParentId) -> StoreResult<Option<bool>> {
    Ok(
        sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = $1 FOR UPDATE")
            .bind(parent_id.as_str())
            .fetch_optional(&mut **tx)
            .await?,
    )
}

steps::seal_steps!(PgTx, "now()");

type ChildArrays<'a> = (Vec<i64>, Vec<Option<&'a str>>, Vec<&'a str>, Vec<Option<&'a str>>);

fn child_arrays(children: &[NewChild]) -> ChildArrays<'_> {
    let mut arrays = (
        Vec::with_capacity(children.len()),
        Vec::with_capacity(children.len()),
        Vec::with_capacity(children.len()),
        Vec::with_capacity(children.len()),
    );
    for child in children {
        arrays.0.push(child.sequence);
        arrays.1.push(child.key.as_deref());
        arrays.2.push(child.payload.get());
        arrays.3.push(child.skip.as_deref());
    }
    arrays
}

/// The first sequences of a chunk (at most 100) whose stored content differs
/// from the appended one: while a parent decomposes its rows are untouched, so
/// key, payload and skip reason are the whole content.
pub(in crate::store) async fn differing_sequences(
    tx: &mut PgTx,
    parent_id: &ParentId,
    chunk: &[NewChild],
) -> StoreResult<Vec<i64>> {
    let (sequences, keys, payloads, skips) = child_arrays(chunk);
    Ok(sqlx::query_scalar(
        "SELECT u.sequence FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[]) \
             AS u(sequence, key, payload, skip) \
         JOIN child c ON c.parent_id = $1 AND c.sequence = u.sequence \
         WHERE c.key IS DISTINCT FROM u.key OR c.payload::jsonb <> u.payload::jsonb \
            OR c.reason IS DISTINCT FROM u.skip OR (c.state = 'skipped') <> (u.skip IS NOT NULL) \
         ORDER BY u.sequence LIMIT 100",
    )
    .bind(parent_id.as_str())
    .bind(&sequences)
    .bind(&keys)
    .bind(&payloads)
    .bind(&skips)
    .fetch_all(&mut **tx)
    .await?)
}

/// Writes the parent row of a registration; `None` when the id is taken
/// (nothing written), else whether it completed at once.
pub(in crate::store) async fn insert_parent(tx: &mut PgTx, reg: &Registration) -> StoreResult<Option<bool>> {
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

/// Writes one chunk of children from arrays in one statement (never one
/// INSERT per child). With `idempotent`, sequences already present are left
/// alone. Returns how many rows were written and how many were skipped children.
pub(in crate::store) async fn insert_chunk(
    tx: &mut PgTx,
    parent_id: &ParentId,
    chunk: &[NewChild],
    idempotent: bool,
) -> StoreResult<(u64, i64)> {
    let on_conflict = if idempotent {
        "ON CONFLICT (parent_id, sequence) DO NOTHING"
    } else {
        ""
    };
    let (sequences, keys, payloads, skips) = child_arrays(chunk);
    let (inserted, skipped): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "WITH inserted AS ( \
             INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at) \
             SELECT $1, u.sequence, u.key, u.payload::json, \
                 CASE WHEN u.skip IS NULL THEN 'pending' ELSE 'skipped' END, u.skip, \
                 CASE WHEN u.skip IS NULL THEN NULL ELSE now() END \
             FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[]) AS u(sequence, key, payload, skip) \
             {on_conflict} RETURNING state) \
         SELECT count(*), count(*) FILTER (WHERE state = 'skipped') FROM inserted"
    )))
    .bind(parent_id.as_str())
    .bind(&sequences)
    .bind(&keys)
    .bind(&payloads)
    .bind(&skips)
    .fetch_one(&mut **tx)
    .await
    .map_err(|err| StoreError::from_child_insert(err, parent_id))?;
    Ok((inserted as u64, skipped))
}

/// Skips every non-terminal child of a parent with `reason` (see
/// `Store::cancel`). Returns how many, and how many of them were in flight
/// and held.
pub(in crate::store) async fn skip_open_children(
    tx: &mut PgTx,
    parent_id: &ParentId,
    reason: &str,
) -> StoreResult<(i64, i64, i64)> {
    Ok(sqlx::query_as(
        "WITH cancelled AS ( \
             UPDATE child c SET state = 'skipped', reason = $2, terminal_at = now(), changed_at = now(), \
                 settled_from = c.state \
             WHERE c.parent_id = $1 AND c.state IN ('pending', 'in_flight', 'held') \
             RETURNING c.settled_from) \
         SELECT count(*), count(*) FILTER (WHERE settled_from = 'in_flight'), \
             count(*) FILTER (WHERE settled_from = 'held') FROM cancelled",
    )
    .bind(parent_id.as_str())
    .bind(reason)
    .fetch_one(&mut **tx)
    .await?)
}

/// Locks a parent row after its children; whether it is complete, `None` when missing.
pub(in crate::store) async fn lock_complete(tx: &mut PgTx, parent_id: &ParentId) -> StoreResult<Option<bool>> {
    static SQL: LazyLock<String> = LazyLock::new(|| format!("{} FOR UPDATE", crate::store::lifecycle::PARENT_COMPLETE));
    Ok(sqlx::query_scalar(AssertSqlSafe(SQL.as_str()))
        .bind(parent_id.as_str())
        .fetch_optional(&mut **tx)
        .await?)
}

crate::store::lifecycle::cancel_steps!(PgTx, "now()");

crate::store::lifecycle::lifecycle_steps!(PgStore, "now()", "now() - make_interval(secs => $1)");
