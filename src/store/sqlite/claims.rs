//! Claims on SQLite: the lease pick, extend, release, retry and the sweep of
//! expired leases.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::outcomes::bump_parents;
use super::{SqliteStore, now, parents, rows};
use crate::ledger::projection::Tally;
use crate::ledger::{Child, ClaimRequest, ClaimScope, ParentId};
use crate::store::rows::Leased;
use crate::store::{ChildRef, StoreResult, sql};

impl SqliteStore {
    /// Leases up to `limit` claimable children of the request's scope, from
    /// sequence `floor` up for a parent-scoped claim.
    pub async fn claim(&self, request: &ClaimRequest, limit: i64, floor: i64) -> StoreResult<Leased> {
        let pick = match &request.scope {
            ClaimScope::Parent(_) => concat!(
                "SELECT c.parent_id, c.sequence FROM child c \
                 WHERE c.parent_id = ?1 AND c.state = 'pending' AND c.sequence >= ?6 \
                   AND (c.available_at IS NULL OR c.available_at <= ",
                now!(),
                ") AND EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = ?1 AND p.decomposed_at IS NOT NULL) \
                 ORDER BY c.sequence LIMIT ?2"
            ),
            ClaimScope::Queue(_) => concat!(
                "SELECT c.parent_id, c.sequence FROM parent p JOIN child c ON c.parent_id = p.parent_id \
                 WHERE p.queue = ?1 AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL \
                   AND c.state = 'pending' AND (c.available_at IS NULL OR c.available_at <= ",
                now!(),
                ") ORDER BY p.position, c.sequence LIMIT ?2"
            ),
        };
        let scope_key = match &request.scope {
            ClaimScope::Parent(parent_id) => parent_id.as_str(),
            ClaimScope::Queue(queue) => queue.as_str(),
        };
        let mut tx = self.begin().await?;
        let mut query = sqlx::query(AssertSqlSafe(format!(
            "UPDATE child SET state = 'in_flight', attempts = attempts + 1, previous_claim_id = claim_id, \
                 claim_id = ?3, claimed_by = ?4, \
                 lease_expires_at = {lease}, available_at = NULL \
             WHERE (parent_id, sequence) IN ({pick}) \
             RETURNING parent_id, sequence, key, payload, attempts, previous_attempt, lease_expires_at, \
                 (SELECT queue FROM parent p WHERE p.parent_id = child.parent_id) AS queue",
            lease = now!(" ?5 ")
        )))
        .bind(scope_key)
        .bind(limit)
        .bind(request.claim_id.to_string())
        .bind(request.worker.as_deref())
        .bind(format!("+{} seconds", request.lease_seconds));
        if let ClaimScope::Parent(_) = request.scope {
            query = query.bind(floor);
        }
        let rows = query.fetch_all(&mut *tx).await?;
        tx.commit().await?;
        Ok(Leased::from_rows(rows.iter().map(rows::claimed_child))?)
    }

    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<(u64, Option<DateTime<Utc>>)> {
        let mut tx = self.begin().await?;
        let rows: Vec<DateTime<Utc>> = sqlx::query_scalar(concat!(
            "UPDATE child SET lease_expires_at = ",
            now!(" ?2 "),
            " WHERE claim_id = ?1 AND state = 'in_flight' AND lease_expires_at > ",
            now!(),
            " RETURNING lease_expires_at"
        ))
        .bind(claim_id.to_string())
        .bind(format!("+{lease_seconds} seconds"))
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((rows.len() as u64, rows.into_iter().max()))
    }

    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> StoreResult<u64> {
        let named: Vec<(&str, i64)> = children
            .unwrap_or_default()
            .iter()
            .map(|c| (c.parent_id.as_str(), c.sequence))
            .collect();
        let named = serde_json::to_string(&named).unwrap_or_else(|_| "[]".to_owned());
        let mut tx = self.begin().await?;
        let released = sqlx::query(concat!(
            "UPDATE child SET state = 'pending', previous_attempt = 'released', lease_expires_at = NULL, \
                 available_at = CASE WHEN ?3 > 0 THEN ",
            now!(" '+' || ?3 || ' seconds' "),
            " END \
             WHERE claim_id = ?1 AND state = 'in_flight' \
               AND (?2 OR (parent_id, sequence) IN (SELECT value ->> 0, value ->> 1 FROM json_each(?4)))"
        ))
        .bind(claim_id.to_string())
        .bind(children.is_none())
        .bind(delay_seconds)
        .bind(named)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(released)
    }

    /// Returns a held child to pending; whether it did, and the child after.
    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<(bool, Option<Child>)> {
        let mut tx = self.begin().await?;
        let retried = sqlx::query(sql::RETRY_HELD)
            .bind(parent_id.as_str())
            .bind(sequence)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let child = parents::child_in(&mut *tx, parent_id, sequence).await?;
        tx.commit().await?;
        Ok((retried == 1, child))
    }

    /// Moves up to `batch` children whose lease ran out, in `scope` or
    /// everywhere. Returns how many, and the parents whose last child this failed.
    pub async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> StoreResult<(u64, Vec<ParentId>)> {
        let (scope_filter, scope_key) = match scope {
            None => ("", None),
            Some(ClaimScope::Parent(parent_id)) => ("AND parent_id = ?2", Some(parent_id.as_str())),
            Some(ClaimScope::Queue(queue)) => (
                "AND parent_id IN (SELECT parent_id FROM parent WHERE queue = ?2 AND completed_at IS NULL)",
                Some(queue.as_str()),
            ),
        };
        let mut tx = self.begin().await?;
        let moved: Vec<(String, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "UPDATE child AS c SET \
                 state = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts THEN 'failed' \
                              WHEN p.expired_lease = 'hold' THEN 'held' ELSE 'pending' END, \
                 reason = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                               THEN 'attempts exhausted' ELSE c.reason END, \
                 terminal_at = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                                    THEN {now} ELSE c.terminal_at END, \
                 previous_attempt = 'expired' \
             FROM parent p \
             WHERE p.parent_id = c.parent_id AND (c.parent_id, c.sequence) IN ( \
                 SELECT parent_id, sequence FROM child \
                 WHERE state = 'in_flight' AND lease_expires_at <= {now} {scope_filter} \
                 ORDER BY lease_expires_at LIMIT ?1) \
             RETURNING parent_id, state",
            now = now!()
        )))
        .bind(batch)
        .bind(scope_key)
        .fetch_all(&mut *tx)
        .await?;
        let mut failures: BTreeMap<&str, Tally> = BTreeMap::new();
        for (parent_id, _) in moved.iter().filter(|(_, state)| state == "failed") {
            failures.entry(parent_id.as_str()).or_default().failed += 1;
        }
        let completed = bump_parents(&mut tx, &failures).await?;
        tx.commit().await?;
        Ok((moved.len() as u64, completed))
    }
}
