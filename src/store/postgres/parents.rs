//! Children on Postgres: written in bulk from arrays, compared with an
//! append, and skipped by a cancel.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::AssertSqlSafe;

use super::PgTx;
use crate::ledger::{NewChild, ParentId};
use crate::store::backend::{ChildChunk, ChildWrites, Inserted, Settled};
use crate::store::{StoreError, StoreResult, sql};

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

#[async_trait]
impl ChildWrites for PgTx {
    // A cancel locks the parent's lane before its children, as every
    // statement that moves open children does (see `lane_claim`).
    /// While a parent decomposes its rows are untouched, so key, payload and
    /// skip reason are the whole content.
    async fn differing_sequences(&mut self, parent_id: &ParentId, chunk: &[NewChild]) -> StoreResult<Vec<i64>> {
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
        .fetch_all(&mut **self)
        .await?)
    }

    /// From arrays, in one statement, which counts the reasons of the
    /// children it skips (`child_reason`; an update counts those it makes
    /// failed or skipped itself: see `count_reasons`).
    async fn insert_children(&mut self, chunk: ChildChunk<'_>) -> StoreResult<Inserted> {
        let ChildChunk {
            parent_id,
            children: chunk,
            idempotent,
        } = chunk;
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
             {on_conflict} RETURNING state, reason), \
         reasons AS ( \
             INSERT INTO child_reason AS r (parent_id, state, reason_null, reason, n) \
             SELECT $1, 'skipped', false, reason, count(*) FROM inserted WHERE state = 'skipped' \
             GROUP BY reason ORDER BY reason \
             ON CONFLICT (parent_id, state, reason_null, md5(reason)) DO UPDATE SET n = r.n + excluded.n) \
         SELECT count(*), count(*) FILTER (WHERE state = 'skipped') FROM inserted"
        )))
        .bind(parent_id.as_str())
        .bind(&sequences)
        .bind(&keys)
        .bind(&payloads)
        .bind(&skips)
        .fetch_one(&mut **self)
        .await
        .map_err(|err| StoreError::from_child_insert(err, parent_id))?;
        Ok(Inserted {
            rows: inserted as u64,
            skipped,
        })
    }

    async fn skip_open_children(&mut self, parent_id: &ParentId, reason: &str) -> StoreResult<Settled> {
        let (children, from_in_flight, from_held) = sqlx::query_as(SKIP_OPEN.as_str())
            .bind(parent_id.as_str())
            .bind(reason)
            .fetch_one(&mut **self)
            .await?;
        Ok(Settled {
            children,
            from_in_flight,
            from_held,
        })
    }
}

/// Skips every open child of parent `$1` with reason `$2`, its lane locked
/// first (the lock's row is the lane as it is now: its floor says which
/// children are in flight), then its leases (`leases`: as every writer of a
/// leased child locks them, see `APPLY_OUTCOMES`), ending the attempts of
/// those in flight as an outcome does; then its leases go. A child that
/// looks in flight but no lease lists was recorded processed without its
/// row rewritten, and stays so. Counts them (by reason too), and those that
/// were in flight or held.
static SKIP_OPEN: LazyLock<String> = LazyLock::new(|| {
    let leased = sql::leased("(SELECT floor FROM turn)", "EXISTS (SELECT 1 FROM turn)");
    let holder = format!(
        "(SELECT h.claim_id FROM leases h WHERE h.lo <= c.sequence AND h.hi >= c.sequence AND {} LIMIT 1)",
        (super::POSTGRES.lease_holds)("h", "c.sequence")
    );
    let view = sql::ClaimView::of(&leased, &holder);
    format!(
        "WITH turn AS (SELECT floor FROM lane WHERE parent_id = $1 FOR UPDATE), \
         leases AS MATERIALIZED ( \
             SELECT l.claim_id, l.lo, l.hi, l.sequences FROM claim_lease l \
             WHERE l.parent_id = $1 AND (SELECT count(*) FROM turn) >= 0 ORDER BY l.claim_id FOR NO KEY UPDATE), \
         cancelled AS ( \
             UPDATE child c SET state = 'skipped', reason = $2, terminal_at = now(), changed_at = now(), \
                 settled_from = CASE WHEN {leased} THEN 'in_flight' ELSE c.state END, \
                 attempts = {attempts}, claim_id = {claim}, previous_claim_id = {previous}, available_at = NULL \
             WHERE c.parent_id = $1 AND c.state IN ('pending', 'held') AND (SELECT count(*) FROM leases) >= 0 \
               AND NOT ({leased} AND {holder} IS NULL) \
             RETURNING c.parent_id, c.state, c.reason, c.settled_from), \
         {reasons}, \
         ended AS (DELETE FROM claim_lease WHERE parent_id = $1 AND (SELECT count(*) FROM cancelled) >= 0) \
         SELECT count(*), count(*) FILTER (WHERE settled_from = 'in_flight'), \
             count(*) FILTER (WHERE settled_from = 'held') FROM cancelled",
        attempts = view.attempts,
        claim = view.claim_id,
        previous = view.previous_claim_id,
        reasons = super::count_reasons("cancelled")
    )
});
