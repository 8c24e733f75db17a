//! The Postgres ledger: shared by many service replicas. Claims are one
//! statement with `FOR UPDATE SKIP LOCKED`; every terminal transition is a
//! guarded `UPDATE` whose row count decides who won.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use super::{ChildRef, ParentFilter, PoolStats, StoreOptions, parse_column};
use crate::error::{ApiError, ApiResult};
use crate::ledger::projection::{self, DerivedProjection, StoredProjection, Tally};
use crate::ledger::{
    Appended, Child, ChildState, Claim, ClaimRequest, ClaimScope, ClaimedChild, Conflict, NewChild, OpenCounts,
    Outcome, OutcomeStatus, OutcomeWrite, Parent, ParentId, ParentRow, QueueName, ReconcileReport, Registration,
    idempotency_key,
};

/// The `LISTEN`/`NOTIFY` channel on which replicas wake each other's waiting claims.
const WORK_CHANNEL: &str = "child_ledger_work";

#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

/// Parent columns plus its open counts, read from the partial indexes.
const PARENT_SELECT: &str = "SELECT p.parent_id, p.queue, p.payload, p.max_attempts, p.expired_lease, \
    p.total, p.processed, p.failed, p.skipped, p.created_at, p.decomposed_at, p.completed_at, p.position, \
    (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending') AS open_pending, \
    (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'in_flight') AS open_in_flight, \
    (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'held') AS open_held \
    FROM parent p";

const CHILD_COLUMNS: &str = "parent_id, sequence, key, state, payload, attempts, claim_id, claimed_by, \
    lease_expires_at, previous_attempt, available_at, reason, result, outcome_attempt, terminal_at, conflicts";

const TERMINAL_TALLY: &str = "SELECT count(*) AS total, \
    count(*) FILTER (WHERE state = 'processed') AS processed, \
    count(*) FILTER (WHERE state = 'failed') AS failed, \
    count(*) FILTER (WHERE state = 'skipped') AS skipped \
    FROM child WHERE parent_id = $1";

/// SQLSTATEs after which the whole transaction may simply be run again.
fn is_transient(err: &ApiError) -> bool {
    match err {
        ApiError::Internal(e) => e
            .downcast_ref::<sqlx::Error>()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .is_some_and(|code| code == "40P01" || code == "40001"),
        _ => false,
    }
}

/// Runs a transaction body again when Postgres aborted it as a deadlock
/// victim or serialization failure: such an abort wrote nothing.
macro_rules! retry_transient {
    ($body:expr) => {{
        let mut tries = 0;
        loop {
            match $body {
                Err(err) if tries < 5 && is_transient(&err) => tries += 1,
                other => break other,
            }
        }
    }};
}

impl PgStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        let connect: PgConnectOptions = url.parse()?;
        let pool = PgPoolOptions::new()
            // One more than requests may use: the work listener holds one
            // connection for the life of the process.
            .max_connections(options.max_connections + 1)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(Self { pool })
    }

    pub async fn migrate(&self) -> anyhow::Result<()> {
        sqlx::migrate!("./migrations/postgres").run(&self.pool).await?;
        Ok(())
    }

    pub async fn ping(&self) -> ApiResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        vec![PoolStats {
            name: "postgres",
            size: self.pool.size(),
            idle: self.pool.num_idle() as u32,
            max: self.pool.options().get_max_connections(),
        }]
    }

    pub async fn queue_of(&self, parent_id: &ParentId) -> ApiResult<QueueName> {
        let queue: Option<String> = sqlx::query_scalar("SELECT queue FROM parent WHERE parent_id = $1")
            .bind(parent_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        queue
            .map(QueueName::from_ledger)
            .ok_or_else(|| ApiError::NotFound(format!("no parent {parent_id}")))
    }

    /// One notification per call, however many children it concerns.
    pub async fn notify_work(&self) -> ApiResult<()> {
        sqlx::query("SELECT pg_notify($1, '')")
            .bind(WORK_CHANNEL)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn listen_for_work(&self) -> ApiResult<PgListener> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(WORK_CHANNEL).await?;
        Ok(listener)
    }

    pub async fn register(&self, reg: &Registration) -> ApiResult<(bool, Parent)> {
        let mut tx = self.pool.begin().await?;
        let skipped = reg.children.iter().filter(|c| c.skip.is_some()).count() as i64;
        let total = reg.children.len() as i64;
        let created = sqlx::query(
            "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                                 total, skipped, decomposed_at, completed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, \
                     CASE WHEN $9 THEN now() END, CASE WHEN $9 AND $8 >= $7 THEN now() END) \
             ON CONFLICT (parent_id) DO NOTHING",
        )
        .bind(reg.parent_id.as_str())
        .bind(reg.queue.as_str())
        .bind(reg.payload.as_ref().map(sqlx::types::Json))
        .bind(reg.max_attempts)
        .bind(reg.expired_lease.as_str())
        .bind(&reg.fingerprint)
        .bind(total)
        .bind(skipped)
        .bind(reg.decomposed)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !created {
            drop(tx);
            let fingerprint: Option<String> = sqlx::query_scalar("SELECT fingerprint FROM parent WHERE parent_id = $1")
                .bind(reg.parent_id.as_str())
                .fetch_optional(&self.pool)
                .await?;
            return match fingerprint {
                Some(stored) if stored == reg.fingerprint => Ok((false, self.parent(&reg.parent_id, false).await?)),
                _ => Err(ApiError::RegistrationConflict(format!(
                    "parent {} is already registered with different content (queue, payload, settings or children)",
                    reg.parent_id
                ))),
            };
        }
        insert_children(&mut tx, &reg.parent_id, &reg.children, false).await?;
        tx.commit().await?;
        self.refresh_statistics(total).await?;
        Ok((true, self.parent(&reg.parent_id, false).await?))
    }

    /// Keeps the planner's picture of `child` fresh after a bulk write, so the
    /// first claims after a big registration use the pending index instead of a
    /// plan chosen for an empty table.
    async fn refresh_statistics(&self, rows_written: i64) -> ApiResult<()> {
        if rows_written < 10_000 {
            return Ok(());
        }
        let estimated: i64 =
            sqlx::query_scalar("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = 'child'")
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0);
        if projection::needs_fresh_statistics(rows_written, estimated) {
            sqlx::query("ANALYZE child").execute(&self.pool).await?;
        }
        Ok(())
    }

    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> ApiResult<Appended> {
        let mut tx = self.pool.begin().await?;
        lock_decomposing_parent(&mut tx, parent_id).await?;
        let (inserted, inserted_skipped) = insert_children(&mut tx, parent_id, children, true).await?;
        let differing = differing_sequences(&mut tx, parent_id, children).await?;
        if !differing.is_empty() {
            return Err(ApiError::ChildrenConflict {
                detail: format!(
                    "{} sequence(s) already exist in parent {parent_id} with different content; nothing was written",
                    differing.len()
                ),
                sequences: differing,
            });
        }
        sqlx::query("UPDATE parent SET total = total + $2, skipped = skipped + $3 WHERE parent_id = $1")
            .bind(parent_id.as_str())
            .bind(inserted as i64)
            .bind(inserted_skipped)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.refresh_statistics(inserted as i64).await?;
        Ok(Appended {
            inserted,
            existing: children.len() as u64 - inserted,
        })
    }

    pub async fn seal(&self, parent_id: &ParentId, total: i64) -> ApiResult<Parent> {
        let mut tx = self.pool.begin().await?;
        let decomposed: Option<bool> =
            sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = $1 FOR UPDATE")
                .bind(parent_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let decomposed = decomposed.ok_or_else(|| not_found_parent(parent_id))?;
        let (below, beyond): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE sequence < $2), count(*) FILTER (WHERE sequence >= $2) \
             FROM child WHERE parent_id = $1",
        )
        .bind(parent_id.as_str())
        .bind(total)
        .fetch_one(&mut *tx)
        .await?;
        if below != total || beyond != 0 {
            let first: Option<i64> =
                sqlx::query_scalar("SELECT min(sequence) FROM child WHERE parent_id = $1 AND sequence < $2")
                    .bind(parent_id.as_str())
                    .bind(total)
                    .fetch_one(&mut *tx)
                    .await?;
            let gaps: Vec<(i64, Option<i64>)> = sqlx::query_as(
                "SELECT sequence, next FROM ( \
                     SELECT sequence, lead(sequence) OVER (ORDER BY sequence) AS next \
                     FROM child WHERE parent_id = $1 AND sequence < $2) runs \
                 WHERE next IS NULL OR next > sequence + 1 ORDER BY sequence LIMIT $3",
            )
            .bind(parent_id.as_str())
            .bind(total)
            .bind(projection::SEAL_REPORT_LIMIT as i64 + 1)
            .fetch_all(&mut *tx)
            .await?;
            let extra: Vec<i64> = sqlx::query_scalar(
                "SELECT sequence FROM child WHERE parent_id = $1 AND sequence >= $2 ORDER BY sequence LIMIT $3",
            )
            .bind(parent_id.as_str())
            .bind(total)
            .bind(projection::SEAL_REPORT_LIMIT as i64)
            .fetch_all(&mut *tx)
            .await?;
            return Err(ApiError::SealMismatch {
                total,
                missing: projection::missing_sequences(total, first, &gaps),
                extra,
            });
        }
        if !decomposed {
            let rows = tally(&mut tx, parent_id).await?;
            sqlx::query(
                "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, decomposed_at = now(), \
                     completed_at = CASE WHEN $6 THEN now() END \
                 WHERE parent_id = $1",
            )
            .bind(parent_id.as_str())
            .bind(rows.total)
            .bind(rows.processed)
            .bind(rows.failed)
            .bind(rows.skipped)
            .bind(rows.is_complete(true))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.parent(parent_id, false).await
    }

    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> ApiResult<Parent> {
        let row = sqlx::query(AssertSqlSafe(format!("{PARENT_SELECT} WHERE p.parent_id = $1")))
            .bind(parent_id.as_str())
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| not_found_parent(parent_id))?;
        Ok(parent_from_row(&row, include_payload)?)
    }

    /// Up to `fetch` parents matching `filter`, with their list positions.
    pub async fn list_parents(&self, filter: &ParentFilter, fetch: i64) -> ApiResult<Vec<(i64, Parent)>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "{PARENT_SELECT} \
             WHERE ($1::text IS NULL OR p.queue = $1) \
               AND ($2::text IS NULL \
                    OR ($2 = 'decomposing' AND p.decomposed_at IS NULL) \
                    OR ($2 = 'active' AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL) \
                    OR ($2 = 'complete' AND p.completed_at IS NOT NULL)) \
               AND ($3::bigint IS NULL OR p.position > $3) \
               AND (NOT $4 OR (p.decomposed_at IS NOT NULL AND p.completed_at IS NULL AND EXISTS ( \
                    SELECT 1 FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
                      AND (c.available_at IS NULL OR c.available_at <= now())))) \
             ORDER BY p.position LIMIT $5"
        )))
        .bind(filter.queue.as_ref().map(QueueName::as_str))
        .bind(filter.state.map(|s| s.as_str()))
        .bind(filter.after_position)
        .bind(filter.resumable)
        .bind(fetch)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get::<i64, _>("position")?, parent_from_row(row, false)?)))
            .collect()
    }

    pub async fn children(
        &self,
        parent_id: &ParentId,
        state: Option<ChildState>,
        after: Option<i64>,
        fetch: i64,
    ) -> ApiResult<Vec<Child>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {CHILD_COLUMNS} FROM child \
             WHERE parent_id = $1 AND ($2::text IS NULL OR state = $2) AND ($3::bigint IS NULL OR sequence > $3) \
             ORDER BY sequence LIMIT $4"
        )))
        .bind(parent_id.as_str())
        .bind(state.map(ChildState::as_str))
        .bind(after)
        .bind(fetch)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(child_from_row).collect::<Result<Vec<_>, _>>()?)
    }

    pub async fn parent_exists(&self, parent_id: &ParentId) -> ApiResult<()> {
        let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM parent WHERE parent_id = $1")
            .bind(parent_id.as_str())
            .fetch_optional(&self.pool)
            .await?;
        found.map(|_| ()).ok_or_else(|| not_found_parent(parent_id))
    }

    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        fetch_child(&self.pool, parent_id, sequence).await
    }

    pub async fn claim(&self, request: &ClaimRequest, limit: i64, floor: i64) -> ApiResult<Claim> {
        // The pick is one statement: lock the lowest claimable sequences, skipping
        // rows another claimer holds, and lease them in the same UPDATE.
        let pick = match &request.scope {
            ClaimScope::Parent(_) => {
                "SELECT c.parent_id, c.sequence FROM child c \
                 WHERE c.parent_id = $1 AND c.state = 'pending' AND c.sequence >= $6 \
                   AND (c.available_at IS NULL OR c.available_at <= now()) \
                   AND EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = $1 AND p.decomposed_at IS NOT NULL) \
                 ORDER BY c.sequence LIMIT $2 FOR UPDATE OF c SKIP LOCKED"
            }
            ClaimScope::Queue(_) => {
                "SELECT c.parent_id, c.sequence FROM parent p \
                 CROSS JOIN LATERAL ( \
                     SELECT c.parent_id, c.sequence FROM child c \
                     WHERE c.parent_id = p.parent_id AND c.state = 'pending' \
                       AND (c.available_at IS NULL OR c.available_at <= now()) \
                     ORDER BY c.sequence LIMIT $2 FOR UPDATE OF c SKIP LOCKED) c \
                 WHERE p.queue = $1 AND p.decomposed_at IS NOT NULL AND p.completed_at IS NULL \
                 ORDER BY p.position LIMIT $2"
            }
        };
        let scope_key = match &request.scope {
            ClaimScope::Parent(parent_id) => parent_id.as_str(),
            ClaimScope::Queue(queue) => queue.as_str(),
        };
        let sql = format!(
            "WITH picked AS ({pick}) \
             UPDATE child c SET state = 'in_flight', attempts = c.attempts + 1, previous_claim_id = c.claim_id, \
                 claim_id = $3, \
                 claimed_by = $4, lease_expires_at = now() + make_interval(secs => $5), available_at = NULL \
             FROM picked WHERE c.parent_id = picked.parent_id AND c.sequence = picked.sequence \
             RETURNING c.parent_id, c.sequence, c.key, c.payload, c.attempts, c.previous_attempt, \
                 c.lease_expires_at"
        );
        let rows = retry_transient!({
            let mut query = sqlx::query(AssertSqlSafe(sql.clone()))
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
            query.fetch_all(&self.pool).await.map_err(ApiError::from)
        })?;
        if rows.is_empty()
            && let ClaimScope::Parent(parent_id) = &request.scope
        {
            self.parent_exists(parent_id).await?;
        }
        let mut lease_expires_at = None;
        let mut children = Vec::with_capacity(rows.len());
        for row in &rows {
            lease_expires_at = Some(row.try_get::<DateTime<Utc>, _>("lease_expires_at")?);
            let parent_id: String = row.try_get("parent_id")?;
            let sequence: i64 = row.try_get("sequence")?;
            let previous: Option<String> = row.try_get("previous_attempt")?;
            children.push(ClaimedChild {
                idempotency_key: idempotency_key(&parent_id, sequence),
                parent_id: ParentId::from_ledger(parent_id),
                sequence,
                key: row.try_get("key")?,
                payload: row.try_get("payload")?,
                attempt: row.try_get("attempts")?,
                previous_attempt: previous.as_deref().map(parse_column).transpose()?,
            });
        }
        Ok(Claim {
            claim_id: request.claim_id,
            lease_expires_at,
            children,
        })
    }

    pub async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> ApiResult<(u64, Option<DateTime<Utc>>)> {
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

    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> ApiResult<u64> {
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

    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        let retried = sqlx::query(
            "UPDATE child SET state = 'pending', available_at = NULL \
             WHERE parent_id = $1 AND sequence = $2 AND state = 'held'",
        )
        .bind(parent_id.as_str())
        .bind(sequence)
        .execute(&self.pool)
        .await?
        .rows_affected();
        let child = self.child(parent_id, sequence).await?;
        match (retried, child.state) {
            (1, _) | (_, ChildState::Pending) => Ok(child),
            _ => Err(ApiError::RetryConflict { child: Box::new(child) }),
        }
    }

    pub async fn record_outcomes(&self, writes: &[OutcomeWrite]) -> ApiResult<Vec<OutcomeStatus>> {
        let parents: Vec<&str> = writes.iter().map(|w| w.parent_id.as_str()).collect();
        let sequences: Vec<i64> = writes.iter().map(|w| w.sequence).collect();
        let outcomes: Vec<&str> = writes.iter().map(|w| w.outcome.as_str()).collect();
        let reasons: Vec<Option<&str>> = writes.iter().map(|w| w.reason.as_deref()).collect();
        let results: Vec<Option<String>> = writes.iter().map(|w| w.result.as_ref().map(Value::to_string)).collect();
        let claims: Vec<Option<Uuid>> = writes.iter().map(|w| w.claim_id).collect();

        // Child transitions and the parent counters move in one statement, run
        // as its own transaction: the hot parent row is locked only while the
        // statement runs, never across a round trip to COMMIT. The guarded
        // UPDATE only touches non-terminal rows, so its RETURNING is exactly
        // the set of writes that won.
        let applied: Vec<(String, i64)> = retry_transient!(
            sqlx::query_as(
                "WITH input AS ( \
                     SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::uuid[]) \
                         AS u(parent_id, sequence, outcome, reason, result, claim_id)), \
                 applied AS ( \
                     UPDATE child c SET state = u.outcome, reason = u.reason, result = u.result::jsonb, \
                         terminal_at = now(), \
                         outcome_attempt = CASE WHEN c.attempts > 0 AND (u.claim_id IS NULL OR u.claim_id = c.claim_id) \
                                                THEN c.attempts \
                                                WHEN u.claim_id = c.previous_claim_id THEN c.attempts - 1 END \
                     FROM input u JOIN parent p ON p.parent_id = u.parent_id AND p.decomposed_at IS NOT NULL \
                     WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence \
                       AND c.state IN ('pending', 'in_flight', 'held') \
                     RETURNING c.parent_id, c.sequence, c.state), \
                 deltas AS ( \
                     SELECT parent_id, count(*) FILTER (WHERE state = 'processed') AS processed, \
                         count(*) FILTER (WHERE state = 'failed') AS failed, \
                         count(*) FILTER (WHERE state = 'skipped') AS skipped \
                     FROM applied GROUP BY parent_id), \
                 bumped AS ( \
                     UPDATE parent p SET processed = p.processed + d.processed, failed = p.failed + d.failed, \
                         skipped = p.skipped + d.skipped, \
                         completed_at = CASE WHEN p.completed_at IS NULL AND p.processed + d.processed + p.failed \
                             + d.failed + p.skipped + d.skipped >= p.total THEN now() ELSE p.completed_at END \
                     FROM deltas d WHERE p.parent_id = d.parent_id) \
                 SELECT parent_id, sequence FROM applied",
            )
            .bind(&parents)
            .bind(&sequences)
            .bind(&outcomes)
            .bind(&reasons)
            .bind(&results)
            .bind(&claims)
            .fetch_all(&self.pool)
            .await
            .map_err(ApiError::from)
        )?;

        let mut statuses = vec![OutcomeStatus::Applied; writes.len()];
        if applied.len() < writes.len() {
            let won: std::collections::HashSet<(&str, i64)> = applied.iter().map(|(p, s)| (p.as_str(), *s)).collect();
            let losers: Vec<&OutcomeWrite> = writes
                .iter()
                .filter(|w| !won.contains(&(w.parent_id.as_str(), w.sequence)))
                .collect();
            let mut losing = retry_transient!(self.classify_losers(&losers).await)?.into_iter();
            for (status, write) in statuses.iter_mut().zip(writes) {
                if !won.contains(&(write.parent_id.as_str(), write.sequence)) {
                    *status = losing.next().unwrap_or(OutcomeStatus::NotFound);
                }
            }
        }
        Ok(statuses)
    }

    /// Why each write that did not win lost, logging the conflicting ones in
    /// the child's conflict log, in one transaction.
    async fn classify_losers(&self, losers: &[&OutcomeWrite]) -> ApiResult<Vec<OutcomeStatus>> {
        let parents: Vec<&str> = losers.iter().map(|w| w.parent_id.as_str()).collect();
        let sequences: Vec<i64> = losers.iter().map(|w| w.sequence).collect();
        let mut tx = self.pool.begin().await?;
        let found: Vec<(String, i64, Option<bool>, Option<String>)> = sqlx::query_as(
            "SELECT u.parent_id, u.sequence, p.decomposed_at IS NOT NULL, c.state \
             FROM unnest($1::text[], $2::bigint[]) AS u(parent_id, sequence) \
             LEFT JOIN parent p ON p.parent_id = u.parent_id \
             LEFT JOIN child c ON c.parent_id = u.parent_id AND c.sequence = u.sequence",
        )
        .bind(&parents)
        .bind(&sequences)
        .fetch_all(&mut *tx)
        .await?;
        let found: HashMap<(String, i64), (Option<bool>, Option<String>)> =
            found.into_iter().map(|(p, s, d, st)| ((p, s), (d, st))).collect();
        let mut statuses = Vec::with_capacity(losers.len());
        for write in losers {
            let (decomposed, state) = found
                .get(&(write.parent_id.to_string(), write.sequence))
                .cloned()
                .unwrap_or((None, None));
            let status = match (decomposed, state) {
                (None, _) | (_, None) => OutcomeStatus::NotFound,
                (Some(false), _) => OutcomeStatus::NotDecomposed,
                (Some(true), Some(state)) if state == write.outcome.as_str() => OutcomeStatus::Duplicate,
                (Some(true), Some(_)) => OutcomeStatus::Conflict,
            };
            if status == OutcomeStatus::Conflict {
                log_conflict(&mut tx, write).await?;
            }
            statuses.push(status);
        }
        tx.commit().await?;
        Ok(statuses)
    }

    pub async fn reconcile(&self, parent_id: &ParentId, dry_run: bool) -> ApiResult<ReconcileReport> {
        let mut tx = self.pool.begin().await?;
        // Locking the parent row first orders this repair with concurrent
        // outcome writes, which bump the counters after their child rows.
        let row = sqlx::query(
            "SELECT total, processed, failed, skipped, completed_at, decomposed_at IS NOT NULL AS decomposed \
             FROM parent WHERE parent_id = $1 FOR UPDATE",
        )
        .bind(parent_id.as_str())
        .fetch_optional(&mut *tx)
        .await?
        .ok_or_else(|| not_found_parent(parent_id))?;
        let stored = StoredProjection {
            total: row.try_get("total")?,
            processed: row.try_get("processed")?,
            failed: row.try_get("failed")?,
            skipped: row.try_get("skipped")?,
            completed_at: row.try_get("completed_at")?,
        };
        let derived = DerivedProjection::from_rows(tally(&mut tx, parent_id).await?, row.try_get("decomposed")?);
        let changes = projection::diff(&stored, &derived);
        let apply = !dry_run && !changes.is_empty();
        if apply {
            let completion = match projection::completion_repair(&stored, &derived) {
                projection::CompletionRepair::Keep => "completed_at",
                projection::CompletionRepair::Set => "now()",
                projection::CompletionRepair::Clear => "NULL",
            };
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE parent SET total = $2, processed = $3, failed = $4, skipped = $5, completed_at = {completion} \
                 WHERE parent_id = $1"
            )))
            .bind(parent_id.as_str())
            .bind(derived.total)
            .bind(derived.processed)
            .bind(derived.failed)
            .bind(derived.skipped)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(ReconcileReport {
            parent_id: parent_id.clone(),
            dry_run,
            applied: apply,
            stored,
            derived,
            changes,
        })
    }

    /// One page of the reconcile sweep: the parents after `after` whose stored
    /// projection disagrees with their rows, read without locks.
    pub(crate) async fn drift_candidates(
        &self,
        queue: Option<&QueueName>,
        after: i64,
        page: i64,
    ) -> ApiResult<(super::DriftPage, Option<i64>)> {
        let rows: Vec<super::DriftRow> = sqlx::query_as(
            "SELECT p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
                 p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, \
                 coalesce(t.total, 0) AS rows_total, coalesce(t.processed, 0) AS rows_processed, \
                 coalesce(t.failed, 0) AS rows_failed, coalesce(t.skipped, 0) AS rows_skipped \
             FROM parent p \
             LEFT JOIN LATERAL ( \
                 SELECT count(*) AS total, count(*) FILTER (WHERE state = 'processed') AS processed, \
                     count(*) FILTER (WHERE state = 'failed') AS failed, \
                     count(*) FILTER (WHERE state = 'skipped') AS skipped \
                 FROM child c WHERE c.parent_id = p.parent_id) t ON true \
             WHERE p.position > $1 AND ($2::text IS NULL OR p.queue = $2) \
             ORDER BY p.position LIMIT $3",
        )
        .bind(after)
        .bind(queue.map(QueueName::as_str))
        .bind(page)
        .fetch_all(&self.pool)
        .await?;
        Ok(super::drift_page(rows, page))
    }

    pub async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> ApiResult<u64> {
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
        let moved: i64 = retry_transient!(
            sqlx::query_scalar(AssertSqlSafe(format!(
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
                 failures AS ( \
                     SELECT parent_id, count(*) AS n FROM moved WHERE state = 'failed' GROUP BY parent_id), \
                 bumped AS ( \
                     UPDATE parent p SET failed = p.failed + f.n, \
                         completed_at = CASE WHEN p.completed_at IS NULL \
                             AND p.processed + p.failed + f.n + p.skipped >= p.total THEN now() ELSE p.completed_at END \
                     FROM failures f WHERE p.parent_id = f.parent_id) \
                 SELECT count(*) FROM moved"
            )))
            .bind(batch)
            .bind(scope_key)
            .fetch_one(&self.pool)
            .await
            .map_err(ApiError::from)
        )?;
        Ok(moved as u64)
    }

    pub async fn execute_raw(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned())).execute(&self.pool).await?;
        Ok(())
    }

    pub async fn count_raw(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await?)
    }
}

fn not_found_parent(parent_id: &ParentId) -> ApiError {
    ApiError::NotFound(format!("no parent {parent_id}"))
}

/// Locks a parent for an append; it must exist and still be decomposing.
async fn lock_decomposing_parent(tx: &mut Transaction<'_, Postgres>, parent_id: &ParentId) -> ApiResult<()> {
    let decomposed: Option<bool> =
        sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = $1 FOR UPDATE")
            .bind(parent_id.as_str())
            .fetch_optional(&mut **tx)
            .await?;
    match decomposed {
        None => Err(not_found_parent(parent_id)),
        Some(true) => Err(ApiError::ParentDecomposed(parent_id.to_string())),
        Some(false) => Ok(()),
    }
}

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

/// The first sequences (at most 100) whose stored content differs from the
/// appended one: while a parent decomposes its rows are untouched, so key,
/// payload and skip reason are the whole content.
async fn differing_sequences(
    tx: &mut Transaction<'_, Postgres>,
    parent_id: &ParentId,
    children: &[NewChild],
) -> ApiResult<Vec<i64>> {
    let mut differing = Vec::new();
    for chunk in children.chunks(super::WRITE_CHUNK) {
        let (sequences, keys, payloads, skips) = child_arrays(chunk);
        let found: Vec<i64> = sqlx::query_scalar(
            "SELECT u.sequence FROM unnest($2::bigint[], $3::text[], $4::text[], $5::text[]) \
                 AS u(sequence, key, payload, skip) \
             JOIN child c ON c.parent_id = $1 AND c.sequence = u.sequence \
             WHERE c.key IS DISTINCT FROM u.key OR c.payload <> u.payload::jsonb \
                OR c.reason IS DISTINCT FROM u.skip OR (c.state = 'skipped') <> (u.skip IS NOT NULL) \
             ORDER BY u.sequence LIMIT 100",
        )
        .bind(parent_id.as_str())
        .bind(&sequences)
        .bind(&keys)
        .bind(&payloads)
        .bind(&skips)
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

/// Writes children in one statement from arrays (never one INSERT per child).
/// With `idempotent`, sequences already present are left alone. Returns how
/// many rows were written and how many of those were skipped children.
async fn insert_children(
    tx: &mut Transaction<'_, Postgres>,
    parent_id: &ParentId,
    children: &[NewChild],
    idempotent: bool,
) -> ApiResult<(u64, i64)> {
    let (mut inserted, mut skipped) = (0, 0);
    for chunk in children.chunks(super::WRITE_CHUNK) {
        let (i, s) = insert_chunk(tx, parent_id, chunk, idempotent).await?;
        inserted += i;
        skipped += s;
    }
    Ok((inserted, skipped))
}

async fn insert_chunk(
    tx: &mut Transaction<'_, Postgres>,
    parent_id: &ParentId,
    children: &[NewChild],
    idempotent: bool,
) -> ApiResult<(u64, i64)> {
    let (sequences, keys, payloads, skips) = child_arrays(children);
    let on_conflict = if idempotent {
        "ON CONFLICT (parent_id, sequence) DO NOTHING"
    } else {
        ""
    };
    let (inserted, skipped): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
        "WITH inserted AS ( \
             INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at) \
             SELECT $1, u.sequence, u.key, u.payload::jsonb, \
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
    .map_err(|err| match err.as_database_error().and_then(|e| e.constraint()) {
        Some("child_key") => ApiError::DuplicateKey(format!(
            "a child key in this request is already used by another sequence of parent {parent_id}"
        )),
        _ => ApiError::from(err),
    })?;
    Ok((inserted as u64, skipped))
}

async fn tally(tx: &mut Transaction<'_, Postgres>, parent_id: &ParentId) -> ApiResult<Tally> {
    let (total, processed, failed, skipped): (i64, i64, i64, i64) = sqlx::query_as(TERMINAL_TALLY)
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

/// Keeps a losing outcome write in the child's conflict log.
async fn log_conflict(tx: &mut Transaction<'_, Postgres>, write: &OutcomeWrite) -> ApiResult<()> {
    sqlx::query(
        "UPDATE child SET conflicts = coalesce(conflicts, '[]'::jsonb) || jsonb_build_array(jsonb_build_object( \
             'outcome', $3::text, 'reason', $4::text, 'claim_id', $5::uuid, \
             'attempt', CASE WHEN $5::uuid = claim_id THEN attempts WHEN $5::uuid = previous_claim_id THEN attempts - 1 END, \
             'at', now())) \
         WHERE parent_id = $1 AND sequence = $2",
    )
    .bind(write.parent_id.as_str())
    .bind(write.sequence)
    .bind(write.outcome.as_str())
    .bind(write.reason.as_deref())
    .bind(write.claim_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn fetch_child<'e, E>(executor: E, parent_id: &ParentId, sequence: i64) -> ApiResult<Child>
where
    E: sqlx::PgExecutor<'e>,
{
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {CHILD_COLUMNS} FROM child WHERE parent_id = $1 AND sequence = $2"
    )))
    .bind(parent_id.as_str())
    .bind(sequence)
    .fetch_optional(executor)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no child {sequence} in parent {parent_id}")))?;
    Ok(child_from_row(&row)?)
}

fn parent_from_row(row: &PgRow, include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.try_get("parent_id")?),
        queue: QueueName::from_ledger(row.try_get("queue")?),
        payload: row.try_get("payload")?,
        max_attempts: row.try_get("max_attempts")?,
        expired_lease: parse_column(row.try_get("expired_lease")?)?,
        total: row.try_get("total")?,
        processed: row.try_get("processed")?,
        failed: row.try_get("failed")?,
        skipped: row.try_get("skipped")?,
        created_at: row.try_get("created_at")?,
        decomposed_at: row.try_get("decomposed_at")?,
        completed_at: row.try_get("completed_at")?,
    };
    let open = OpenCounts {
        pending: row.try_get("open_pending")?,
        in_flight: row.try_get("open_in_flight")?,
        held: row.try_get("open_held")?,
    };
    Ok(parent.into_parent(open, include_payload))
}

fn child_from_row(row: &PgRow) -> Result<Child, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let state: ChildState = parse_column(row.try_get("state")?)?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    let conflicts: Option<sqlx::types::Json<Vec<Conflict>>> = row.try_get("conflicts")?;
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        state,
        payload: row.try_get("payload")?,
        attempts: row.try_get("attempts")?,
        claim_id: row.try_get("claim_id")?,
        claimed_by: row.try_get("claimed_by")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
        available_at: row.try_get("available_at")?,
        outcome: Outcome::from_state(state),
        reason: row.try_get("reason")?,
        result: row.try_get("result")?,
        outcome_attempt: row.try_get("outcome_attempt")?,
        terminal_at: row.try_get("terminal_at")?,
        conflicts: conflicts.map(|c| c.0).unwrap_or_default(),
    })
}
