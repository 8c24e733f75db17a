//! Claims on Postgres: the lease pick, extend, release, retry and the sweep
//! of expired leases.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::outcomes::BUMP_PARENTS;
use super::{PgStore, rows};
use crate::ledger::{Child, ClaimRequest, ClaimScope, ParentId};
use crate::store::rows::Leased;
use crate::store::{ChildRef, StoreResult, retry_transient, sql};

/// The claim statement: one pick that locks the lowest claimable sequences,
/// skipping rows another claimer holds, and the `UPDATE` that leases them.
/// Binds: `$1` scope key, `$2` limit, `$3` claim id, `$4` worker, `$5` lease
/// seconds, and for a parent `$6` the floor.
fn claim_statement(pick: &str) -> String {
    format!(
        "WITH picked AS ({pick}) \
         UPDATE child c SET state = 'in_flight', attempts = c.attempts + 1, previous_claim_id = c.claim_id, \
             claim_id = $3, \
             claimed_by = $4, lease_expires_at = now() + make_interval(secs => $5), available_at = NULL \
         FROM picked WHERE c.parent_id = picked.parent_id AND c.sequence = picked.sequence \
         RETURNING c.parent_id, c.sequence, c.key, c.payload, c.attempts, c.previous_attempt, \
             c.lease_expires_at, picked.queue"
    )
}

/// The claim statement of a parent-scoped claim (see `claim_statement`).
pub static PARENT_CLAIM: LazyLock<String> = LazyLock::new(|| {
    claim_statement(
        "SELECT c.parent_id, c.sequence, p.queue FROM parent p JOIN child c ON c.parent_id = p.parent_id \
         WHERE p.parent_id = $1 AND p.decomposed_at IS NOT NULL \
           AND c.state = 'pending' AND c.sequence >= $6 \
           AND (c.available_at IS NULL OR c.available_at <= now()) \
         ORDER BY c.sequence LIMIT $2 FOR UPDATE OF c SKIP LOCKED",
    )
});

/// The claim statement of a queue claim (see `claim_statement`).
pub static QUEUE_CLAIM: LazyLock<String> = LazyLock::new(|| {
    claim_statement(
        "SELECT c.parent_id, c.sequence, p.queue FROM parent p \
         CROSS JOIN LATERAL ( \
             SELECT c.parent_id, c.sequence FROM child c \
             WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
               AND (c.available_at IS NULL OR c.available_at <= now()) \
             ORDER BY c.sequence LIMIT $2 FOR UPDATE OF c SKIP LOCKED) c \
         WHERE p.queue = $1 AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL \
         ORDER BY p.position LIMIT $2",
    )
});

impl PgStore {
    /// Leases up to `limit` claimable children of the request's scope, from
    /// sequence `floor` up for a parent-scoped claim.
    pub async fn claim(&self, request: &ClaimRequest, limit: i64, floor: i64) -> StoreResult<Leased> {
        let (sql, scope_key) = match &request.scope {
            ClaimScope::Parent(parent_id) => (&*PARENT_CLAIM, parent_id.as_str()),
            ClaimScope::Queue(queue) => (&*QUEUE_CLAIM, queue.as_str()),
        };
        let rows = retry_transient!({
            let mut query = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(scope_key)
                .bind(limit)
                .bind(request.claim_id)
                .bind(request.worker.as_deref())
                .bind(request.lease_seconds as f64)
                // Never a cached generic plan: one prepared while `child` was small
                // would seq-scan it once it is big. Planning with the real values
                // costs ~0.05 ms and always finds the pending index.
                .persistent(false);
            if let ClaimScope::Parent(_) = request.scope {
                query = query.bind(floor);
            }
            query.fetch_all(&self.pool).await.map_err(Into::into)
        })?;
        Ok(Leased::from_rows(rows.iter().map(rows::claimed_child))?)
    }

    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<(u64, Option<DateTime<Utc>>)> {
        let (extended, expires): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
            "WITH extended AS ( \
                 UPDATE child SET lease_expires_at = now() + make_interval(secs => $2) \
                 WHERE claim_id = $1 AND state = 'in_flight' AND lease_expires_at > now() \
                 RETURNING lease_expires_at) \
             SELECT count(*), max(lease_expires_at) FROM extended",
        )
        .bind(claim_id)
        .bind(lease_seconds as f64)
        .fetch_one(&self.pool)
        .await?;
        Ok((extended as u64, expires))
    }

    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> StoreResult<u64> {
        let (parents, sequences): (Vec<&str>, Vec<i64>) = children
            .unwrap_or_default()
            .iter()
            .map(|c| (c.parent_id.as_str(), c.sequence))
            .unzip();
        let released: i64 = sqlx::query_scalar(
            "WITH released AS ( \
                 UPDATE child SET state = 'pending', previous_attempt = 'released', lease_expires_at = NULL, \
                     available_at = CASE WHEN $3 > 0 THEN now() + make_interval(secs => $3) END \
                 WHERE claim_id = $1 AND state = 'in_flight' \
                   AND ($2 OR (parent_id, sequence) IN (SELECT * FROM unnest($4::text[], $5::bigint[]))) \
                 RETURNING 1) \
             SELECT count(*) FROM released",
        )
        .bind(claim_id)
        .bind(children.is_none())
        .bind(delay_seconds as f64)
        .bind(&parents)
        .bind(&sequences)
        .fetch_one(&self.pool)
        .await?;
        Ok(released as u64)
    }

    /// Returns a held child to pending; whether it did, and the child after.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<(bool, Option<Child>)> {
        let retried = sqlx::query(sql::RETRY_HELD)
            .bind(parent_id.as_str())
            .bind(sequence)
            .execute(&self.pool)
            .await?
            .rows_affected();
        Ok((retried == 1, self.child(parent_id, sequence).await?))
    }

    /// Moves up to `batch` children whose lease ran out, in `scope` or
    /// everywhere. Returns how many, and the parents whose last child this failed.
    pub async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> StoreResult<(u64, Vec<ParentId>)> {
        let (scope_filter, scope_key) = match scope {
            None => ("", None),
            Some(ClaimScope::Parent(parent_id)) => ("AND c.parent_id = $2", Some(parent_id.as_str())),
            Some(ClaimScope::Queue(queue)) => (
                "AND c.parent_id IN (SELECT parent_id FROM parent WHERE queue = $2 AND completed_at IS NULL)",
                Some(queue.as_str()),
            ),
        };
        // Exhausted children fail (and count), `hold` parents keep theirs held,
        // the rest become claimable again; all remember the attempt expired.
        let rows: Vec<(Option<String>, i64)> = retry_transient!(
            sqlx::query_as(AssertSqlSafe(format!(
                "WITH expired AS ( \
                     SELECT c.parent_id, c.sequence FROM child c \
                     WHERE c.state = 'in_flight' AND c.lease_expires_at <= now() {scope_filter} \
                     ORDER BY c.lease_expires_at LIMIT $1 FOR UPDATE OF c SKIP LOCKED), \
                 moved AS ( \
                     UPDATE child c SET \
                         state = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts THEN 'failed' \
                                      WHEN p.expired_lease = 'hold' THEN 'held' ELSE 'pending' END, \
                         reason = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                                       THEN 'attempts exhausted' ELSE c.reason END, \
                         terminal_at = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                                            THEN now() ELSE c.terminal_at END, \
                         previous_attempt = 'expired' \
                     FROM expired e, parent p \
                     WHERE c.parent_id = e.parent_id AND c.sequence = e.sequence AND p.parent_id = c.parent_id \
                     RETURNING c.parent_id, c.state), \
                 deltas AS ( \
                     SELECT parent_id, 0 AS processed, count(*) AS failed, 0 AS skipped \
                     FROM moved WHERE state = 'failed' GROUP BY parent_id), \
                 {BUMP_PARENTS} \
                 SELECT NULL, count(*) FROM moved \
                 UNION ALL SELECT parent_id, 0 FROM bumped WHERE completed",
                BUMP_PARENTS = BUMP_PARENTS.as_str()
            )))
            .bind(batch)
            .bind(scope_key)
            .fetch_all(&self.pool)
            .await
            .map_err(Into::into)
        )?;
        let mut moved = 0;
        let mut completed = Vec::new();
        for (parent_id, count) in rows {
            match parent_id {
                None => moved = count as u64,
                Some(parent_id) => completed.push(ParentId::from_ledger(parent_id)),
            }
        }
        Ok((moved, completed))
    }
}
