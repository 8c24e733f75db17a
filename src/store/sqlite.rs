//! The embedded SQLite ledger. Every write goes through one connection, in a
//! transaction that takes the write lock up front (`BEGIN IMMEDIATE`), so two
//! claimers can never take the same child and no writer ever sees "database is
//! locked"; reads use their own pool and, in WAL mode, never wait for writes.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{AssertSqlSafe, Row, Sqlite, SqlitePool, Transaction};
use uuid::Uuid;

use super::{ChildRef, ParentFilter, PoolStats, StoreOptions, parse_column};
use crate::error::{ApiError, ApiResult};
use crate::ledger::projection::{self, DerivedProjection, StoredProjection, Tally};
use crate::ledger::{
    Appended, Child, ChildState, Claim, ClaimRequest, ClaimScope, ClaimedChild, Conflict, NewChild, OpenCounts,
    Outcome, OutcomeStatus, OutcomeWrite, Parent, ParentId, ParentRow, QueueName, ReconcileReport, Registration,
    idempotency_key,
};

/// The database clock, as RFC 3339 UTC text with milliseconds.
macro_rules! now {
    () => {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
    ($modifier:literal) => {
        concat!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ", $modifier, ")")
    };
}

#[derive(Debug, Clone)]
pub struct SqliteStore {
    /// One connection: SQLite has one writer at a time anyway, and queueing in
    /// the pool instead of in SQLite's lock means no "database is locked".
    writer: SqlitePool,
    readers: SqlitePool,
}

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
    FROM child WHERE parent_id = ?1";

/// How long a write waits for its turn: for the writer connection, and for
/// SQLite's file lock when another process writes the same file.
const WRITER_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl SqliteStore {
    pub async fn connect(url: &str, options: &StoreOptions) -> anyhow::Result<Self> {
        let connect = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // An acknowledged outcome must survive a power cut, not only a crash.
            .synchronous(SqliteSynchronous::Full)
            // Within this process one writer connection takes turns; another
            // process on the same file is waited for as long as a writer
            // queues here, so a lock is waited out, never answered as an error.
            .busy_timeout(WRITER_WAIT)
            .foreign_keys(true);
        // Writers queue here behind the one connection; a 100,000-child
        // registration holds it for seconds, which is no outage.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.acquire_timeout.max(WRITER_WAIT))
            .connect_with(connect.clone())
            .await?;
        let readers = SqlitePoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        Ok(Self { writer, readers })
    }

    async fn begin(&self) -> ApiResult<Transaction<'static, Sqlite>> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    pub async fn migrate(&self) -> anyhow::Result<()> {
        sqlx::migrate!("./migrations/sqlite").run(&self.writer).await?;
        Ok(())
    }

    pub async fn ping(&self) -> ApiResult<()> {
        sqlx::query("SELECT 1").execute(&self.readers).await?;
        Ok(())
    }

    pub fn pool_stats(&self) -> Vec<PoolStats> {
        [("sqlite_writer", &self.writer), ("sqlite_readers", &self.readers)]
            .into_iter()
            .map(|(name, pool)| PoolStats {
                name,
                size: pool.size(),
                idle: pool.num_idle() as u32,
                max: pool.options().get_max_connections(),
            })
            .collect()
    }

    pub async fn queue_of(&self, parent_id: &ParentId) -> ApiResult<QueueName> {
        let queue: Option<String> = sqlx::query_scalar("SELECT queue FROM parent WHERE parent_id = ?1")
            .bind(parent_id.as_str())
            .fetch_optional(&self.readers)
            .await?;
        queue
            .map(QueueName::from_ledger)
            .ok_or_else(|| ApiError::NotFound(format!("no parent {parent_id}")))
    }

    pub async fn register(&self, reg: &Registration) -> ApiResult<(bool, Parent)> {
        let mut tx = self.begin().await?;
        let existing: Option<String> = sqlx::query_scalar("SELECT fingerprint FROM parent WHERE parent_id = ?1")
            .bind(reg.parent_id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        if let Some(stored) = existing {
            drop(tx);
            if stored != reg.fingerprint {
                return Err(ApiError::RegistrationConflict(format!(
                    "parent {} is already registered with different content (queue, payload, settings or children)",
                    reg.parent_id
                )));
            }
            return Ok((false, self.parent(&reg.parent_id, false).await?));
        }
        let skipped = reg.children.iter().filter(|c| c.skip.is_some()).count() as i64;
        let total = reg.children.len() as i64;
        sqlx::query(concat!(
            "INSERT INTO parent (parent_id, queue, payload, max_attempts, expired_lease, fingerprint, \
                                 total, skipped, created_at, decomposed_at, completed_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ",
            now!(),
            ", CASE WHEN ?9 THEN ",
            now!(),
            " END, CASE WHEN ?9 AND ?8 >= ?7 THEN ",
            now!(),
            " END)"
        ))
        .bind(reg.parent_id.as_str())
        .bind(reg.queue.as_str())
        .bind(reg.payload.as_ref().map(Value::to_string))
        .bind(reg.max_attempts)
        .bind(reg.expired_lease.as_str())
        .bind(&reg.fingerprint)
        .bind(total)
        .bind(skipped)
        .bind(reg.decomposed)
        .execute(&mut *tx)
        .await?;
        insert_children(&mut tx, &reg.parent_id, &reg.children, false).await?;
        tx.commit().await?;
        Ok((true, self.parent(&reg.parent_id, false).await?))
    }

    pub async fn append(&self, parent_id: &ParentId, children: &[NewChild]) -> ApiResult<Appended> {
        let mut tx = self.begin().await?;
        let decomposed: Option<bool> =
            sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = ?1")
                .bind(parent_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        match decomposed {
            None => return Err(not_found_parent(parent_id)),
            Some(true) => return Err(ApiError::ParentDecomposed(parent_id.to_string())),
            Some(false) => {}
        }
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
        sqlx::query("UPDATE parent SET total = total + ?2, skipped = skipped + ?3 WHERE parent_id = ?1")
            .bind(parent_id.as_str())
            .bind(inserted as i64)
            .bind(inserted_skipped)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Appended {
            inserted,
            existing: children.len() as u64 - inserted,
        })
    }

    pub async fn seal(&self, parent_id: &ParentId, total: i64) -> ApiResult<Parent> {
        let mut tx = self.begin().await?;
        let decomposed: Option<bool> =
            sqlx::query_scalar("SELECT decomposed_at IS NOT NULL FROM parent WHERE parent_id = ?1")
                .bind(parent_id.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        let decomposed = decomposed.ok_or_else(|| not_found_parent(parent_id))?;
        let (below, beyond): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE sequence < ?2), count(*) FILTER (WHERE sequence >= ?2) \
             FROM child WHERE parent_id = ?1",
        )
        .bind(parent_id.as_str())
        .bind(total)
        .fetch_one(&mut *tx)
        .await?;
        if below != total || beyond != 0 {
            let first: Option<i64> =
                sqlx::query_scalar("SELECT min(sequence) FROM child WHERE parent_id = ?1 AND sequence < ?2")
                    .bind(parent_id.as_str())
                    .bind(total)
                    .fetch_one(&mut *tx)
                    .await?;
            let gaps: Vec<(i64, Option<i64>)> = sqlx::query_as(
                "SELECT sequence, next FROM ( \
                     SELECT sequence, lead(sequence) OVER (ORDER BY sequence) AS next \
                     FROM child WHERE parent_id = ?1 AND sequence < ?2) \
                 WHERE next IS NULL OR next > sequence + 1 ORDER BY sequence LIMIT ?3",
            )
            .bind(parent_id.as_str())
            .bind(total)
            .bind(projection::SEAL_REPORT_LIMIT as i64 + 1)
            .fetch_all(&mut *tx)
            .await?;
            let extra: Vec<i64> = sqlx::query_scalar(
                "SELECT sequence FROM child WHERE parent_id = ?1 AND sequence >= ?2 ORDER BY sequence LIMIT ?3",
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
            .bind(rows.is_complete(true))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        self.parent(parent_id, false).await
    }

    pub async fn parent(&self, parent_id: &ParentId, include_payload: bool) -> ApiResult<Parent> {
        let row = sqlx::query(AssertSqlSafe(format!("{PARENT_SELECT} WHERE p.parent_id = ?1")))
            .bind(parent_id.as_str())
            .fetch_optional(&self.readers)
            .await?
            .ok_or_else(|| not_found_parent(parent_id))?;
        Ok(parent_from_row(&row, include_payload)?)
    }

    /// Up to `fetch` parents matching `filter`, with their list positions.
    pub async fn list_parents(&self, filter: &ParentFilter, fetch: i64) -> ApiResult<Vec<(i64, Parent)>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "{PARENT_SELECT} \
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
            now = now!()
        )))
        .bind(filter.queue.as_ref().map(QueueName::as_str))
        .bind(filter.state.map(|s| s.as_str()))
        .bind(filter.after_position)
        .bind(filter.resumable)
        .bind(fetch)
        .fetch_all(&self.readers)
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
             WHERE parent_id = ?1 AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR sequence > ?3) \
             ORDER BY sequence LIMIT ?4"
        )))
        .bind(parent_id.as_str())
        .bind(state.map(ChildState::as_str))
        .bind(after)
        .bind(fetch)
        .fetch_all(&self.readers)
        .await?;
        Ok(rows.iter().map(child_from_row).collect::<Result<Vec<_>, _>>()?)
    }

    pub async fn parent_exists(&self, parent_id: &ParentId) -> ApiResult<()> {
        let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM parent WHERE parent_id = ?1")
            .bind(parent_id.as_str())
            .fetch_optional(&self.readers)
            .await?;
        found.map(|_| ()).ok_or_else(|| not_found_parent(parent_id))
    }

    pub async fn child(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        fetch_child(&self.readers, parent_id, sequence).await
    }

    pub async fn claim(&self, request: &ClaimRequest, limit: i64, floor: i64) -> ApiResult<Claim> {
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
             RETURNING parent_id, sequence, key, payload, attempts, previous_attempt, lease_expires_at",
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
                payload: json_column(row, "payload")?.unwrap_or(Value::Null),
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

    pub async fn release(&self, claim_id: Uuid, children: Option<&[ChildRef]>, delay_seconds: i64) -> ApiResult<u64> {
        let named: Vec<(&str, i64)> = children
            .unwrap_or_default()
            .iter()
            .map(|c| (c.parent_id.as_str(), c.sequence))
            .collect();
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
        .bind(serde_json::to_string(&named).map_err(anyhow::Error::from)?)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(released)
    }

    pub async fn retry(&self, parent_id: &ParentId, sequence: i64) -> ApiResult<Child> {
        let mut tx = self.begin().await?;
        let retried = sqlx::query(
            "UPDATE child SET state = 'pending', available_at = NULL \
             WHERE parent_id = ?1 AND sequence = ?2 AND state = 'held'",
        )
        .bind(parent_id.as_str())
        .bind(sequence)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let child = fetch_child(&mut *tx, parent_id, sequence).await?;
        tx.commit().await?;
        match (retried, child.state) {
            (1, _) | (_, ChildState::Pending) => Ok(child),
            _ => Err(ApiError::RetryConflict { child: Box::new(child) }),
        }
    }

    pub async fn record_outcomes(&self, writes: &[OutcomeWrite]) -> ApiResult<Vec<OutcomeStatus>> {
        let input = outcomes_json(writes);
        let mut tx = self.begin().await?;
        // The guarded UPDATE only touches non-terminal rows of decomposed
        // parents: what it returns is exactly the set of writes that won.
        let applied: Vec<(String, i64, String)> = sqlx::query_as(concat!(
            "UPDATE child AS c SET state = j.outcome, reason = j.reason, result = j.result, terminal_at = ",
            now!(),
            ", outcome_attempt = CASE WHEN c.attempts > 0 AND (j.claim_id IS NULL OR j.claim_id = c.claim_id) \
                                      THEN c.attempts \
                                      WHEN j.claim_id = c.previous_claim_id THEN c.attempts - 1 END \
             FROM (SELECT value ->> 0 AS parent_id, value ->> 1 AS sequence, value ->> 2 AS outcome, \
                          value ->> 3 AS reason, \
                          CASE WHEN json_type(value, '$[4]') = 'null' THEN NULL ELSE value -> 4 END AS result, \
                          value ->> 5 AS claim_id \
                   FROM json_each(?1)) AS j \
             WHERE c.parent_id = j.parent_id AND c.sequence = j.sequence \
               AND c.state IN ('pending', 'in_flight', 'held') \
               AND EXISTS (SELECT 1 FROM parent p WHERE p.parent_id = j.parent_id AND p.decomposed_at IS NOT NULL) \
             RETURNING parent_id, sequence, state"
        ))
        .bind(&input)
        .fetch_all(&mut *tx)
        .await?;

        let mut deltas: BTreeMap<&str, Tally> = BTreeMap::new();
        for (parent_id, _, state) in &applied {
            let delta = deltas.entry(parent_id.as_str()).or_default();
            match state.as_str() {
                "processed" => delta.processed += 1,
                "failed" => delta.failed += 1,
                _ => delta.skipped += 1,
            }
        }
        for (parent_id, delta) in &deltas {
            bump_parent(&mut tx, parent_id, delta).await?;
        }

        let mut statuses = vec![OutcomeStatus::Applied; writes.len()];
        if applied.len() < writes.len() {
            let won: std::collections::HashSet<(&str, i64)> =
                applied.iter().map(|(p, s, _)| (p.as_str(), *s)).collect();
            let found: Vec<(i64, Option<bool>, Option<String>)> = sqlx::query_as(
                "SELECT j.key, p.decomposed_at IS NOT NULL, c.state FROM json_each(?1) j \
                 LEFT JOIN parent p ON p.parent_id = j.value ->> 0 \
                 LEFT JOIN child c ON c.parent_id = j.value ->> 0 AND c.sequence = j.value ->> 1",
            )
            .bind(&input)
            .fetch_all(&mut *tx)
            .await?;
            let found: HashMap<i64, (Option<bool>, Option<String>)> =
                found.into_iter().map(|(i, d, s)| (i, (d, s))).collect();
            for (i, write) in writes.iter().enumerate() {
                if won.contains(&(write.parent_id.as_str(), write.sequence)) {
                    continue;
                }
                statuses[i] = match found.get(&(i as i64)).cloned().unwrap_or((None, None)) {
                    (None, _) | (_, None) => OutcomeStatus::NotFound,
                    (Some(false), _) => OutcomeStatus::NotDecomposed,
                    (Some(true), Some(state)) if state == write.outcome.as_str() => OutcomeStatus::Duplicate,
                    (Some(true), Some(_)) => OutcomeStatus::Conflict,
                };
                if statuses[i] == OutcomeStatus::Conflict {
                    log_conflict(&mut tx, write).await?;
                }
            }
        }
        tx.commit().await?;
        Ok(statuses)
    }

    pub async fn reconcile(&self, parent_id: &ParentId, dry_run: bool) -> ApiResult<ReconcileReport> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(
            "SELECT total, processed, failed, skipped, completed_at, decomposed_at IS NOT NULL AS decomposed \
             FROM parent WHERE parent_id = ?1",
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
                projection::CompletionRepair::Set => now!(),
                projection::CompletionRepair::Clear => "NULL",
            };
            sqlx::query(AssertSqlSafe(format!(
                "UPDATE parent SET total = ?2, processed = ?3, failed = ?4, skipped = ?5, completed_at = {completion} \
                 WHERE parent_id = ?1"
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

    pub(crate) async fn drift_candidates(
        &self,
        queue: Option<&QueueName>,
        after: i64,
        page: i64,
    ) -> ApiResult<(super::DriftPage, Option<i64>)> {
        let rows: Vec<super::DriftRow> = sqlx::query_as(
            "SELECT p.parent_id, p.position, p.total, p.processed, p.failed, p.skipped, \
                 p.completed_at IS NOT NULL AS completed, p.decomposed_at IS NOT NULL AS decomposed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id) AS rows_total, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'processed') \
                     AS rows_processed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'failed') \
                     AS rows_failed, \
                 (SELECT count(*) FROM child c WHERE c.parent_id = p.parent_id AND c.state = 'skipped') \
                     AS rows_skipped \
             FROM parent p WHERE p.position > ?1 AND (?2 IS NULL OR p.queue = ?2) \
             ORDER BY p.position LIMIT ?3",
        )
        .bind(after)
        .bind(queue.map(QueueName::as_str))
        .bind(page)
        .fetch_all(&self.readers)
        .await?;
        Ok(super::drift_page(rows, page))
    }

    pub async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> ApiResult<u64> {
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
        for (parent_id, delta) in &failures {
            bump_parent(&mut tx, parent_id, delta).await?;
        }
        tx.commit().await?;
        Ok(moved.len() as u64)
    }

    pub async fn execute_raw(&self, sql: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    pub async fn count_raw(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.readers)
            .await?)
    }
}

fn not_found_parent(parent_id: &ParentId) -> ApiError {
    ApiError::NotFound(format!("no parent {parent_id}"))
}

/// Children as one compact JSON array of `[sequence, key, payload, skip]`, so a
/// whole registration is written by one statement reading `json_each`.
fn children_json(children: &[NewChild]) -> String {
    let rows: Vec<(i64, Option<&str>, &serde_json::value::RawValue, Option<&str>)> = children
        .iter()
        .map(|c| (c.sequence, c.key.as_deref(), &*c.payload, c.skip.as_deref()))
        .collect();
    serde_json::to_string(&rows).unwrap_or_else(|_| "[]".to_owned())
}

/// Outcome writes as one JSON array of
/// `[parent_id, sequence, outcome, reason, result, claim_id]` for `json_each`.
fn outcomes_json(writes: &[OutcomeWrite]) -> String {
    let rows: Vec<_> = writes
        .iter()
        .map(|w| {
            serde_json::json!([
                w.parent_id.as_str(),
                w.sequence,
                w.outcome.as_str(),
                w.reason,
                w.result,
                w.claim_id.map(|c| c.to_string())
            ])
        })
        .collect();
    Value::Array(rows).to_string()
}

/// The first sequences (at most 100) whose stored content differs from the
/// appended one.
async fn differing_sequences(
    tx: &mut Transaction<'_, Sqlite>,
    parent_id: &ParentId,
    children: &[NewChild],
) -> ApiResult<Vec<i64>> {
    let mut differing = Vec::new();
    for chunk in children.chunks(super::WRITE_CHUNK) {
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

async fn insert_children(
    tx: &mut Transaction<'_, Sqlite>,
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
    tx: &mut Transaction<'_, Sqlite>,
    parent_id: &ParentId,
    children: &[NewChild],
    idempotent: bool,
) -> ApiResult<(u64, i64)> {
    let on_conflict = if idempotent {
        "ON CONFLICT (parent_id, sequence) DO NOTHING"
    } else {
        ""
    };
    let states: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "INSERT INTO child (parent_id, sequence, key, payload, state, reason, terminal_at) \
         SELECT ?1, value ->> 0, value ->> 1, value -> 2, \
             CASE WHEN value ->> 3 IS NULL THEN 'pending' ELSE 'skipped' END, value ->> 3, \
             CASE WHEN value ->> 3 IS NULL THEN NULL ELSE {now} END \
         FROM json_each(?2) WHERE true {on_conflict} RETURNING state",
        now = now!()
    )))
    .bind(parent_id.as_str())
    .bind(children_json(children))
    .fetch_all(&mut **tx)
    .await
    .map_err(|err| {
        let message = err
            .as_database_error()
            .map(|e| e.message().to_owned())
            .unwrap_or_default();
        if message.contains("child.parent_id, child.key") {
            ApiError::DuplicateKey(format!(
                "a child key in this request is already used by another sequence of parent {parent_id}"
            ))
        } else {
            ApiError::from(err)
        }
    })?;
    let skipped = states.iter().filter(|s| *s == "skipped").count() as i64;
    Ok((states.len() as u64, skipped))
}

async fn tally(tx: &mut Transaction<'_, Sqlite>, parent_id: &ParentId) -> ApiResult<Tally> {
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

/// Adds terminal counts to a parent's projection, completing it when the last
/// child went terminal.
async fn bump_parent(tx: &mut Transaction<'_, Sqlite>, parent_id: &str, delta: &Tally) -> ApiResult<()> {
    sqlx::query(concat!(
        "UPDATE parent SET processed = processed + ?2, failed = failed + ?3, skipped = skipped + ?4, \
             completed_at = CASE WHEN completed_at IS NULL AND decomposed_at IS NOT NULL \
                 AND processed + ?2 + failed + ?3 + skipped + ?4 >= total THEN ",
        now!(),
        " ELSE completed_at END WHERE parent_id = ?1"
    ))
    .bind(parent_id)
    .bind(delta.processed)
    .bind(delta.failed)
    .bind(delta.skipped)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn log_conflict(tx: &mut Transaction<'_, Sqlite>, write: &OutcomeWrite) -> ApiResult<()> {
    sqlx::query(concat!(
        "UPDATE child SET conflicts = json_insert(coalesce(conflicts, '[]'), '$[#]', json_object( \
             'outcome', ?3, 'reason', ?4, 'claim_id', ?5, \
             'attempt', CASE WHEN ?5 = claim_id THEN attempts WHEN ?5 = previous_claim_id THEN attempts - 1 END, \
             'at', ",
        now!(),
        ")) WHERE parent_id = ?1 AND sequence = ?2"
    ))
    .bind(write.parent_id.as_str())
    .bind(write.sequence)
    .bind(write.outcome.as_str())
    .bind(write.reason.as_deref())
    .bind(write.claim_id.map(|c| c.to_string()))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn fetch_child<'e, E>(executor: E, parent_id: &ParentId, sequence: i64) -> ApiResult<Child>
where
    E: sqlx::SqliteExecutor<'e>,
{
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT {CHILD_COLUMNS} FROM child WHERE parent_id = ?1 AND sequence = ?2"
    )))
    .bind(parent_id.as_str())
    .bind(sequence)
    .fetch_optional(executor)
    .await?
    .ok_or_else(|| ApiError::NotFound(format!("no child {sequence} in parent {parent_id}")))?;
    Ok(child_from_row(&row)?)
}

/// Reads a JSON text column.
fn json_column(row: &SqliteRow, column: &str) -> Result<Option<Value>, sqlx::Error> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| serde_json::from_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
        .transpose()
}

fn uuid_column(row: &SqliteRow, column: &str) -> Result<Option<Uuid>, sqlx::Error> {
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| Uuid::parse_str(&t).map_err(|e| sqlx::Error::Decode(e.into())))
        .transpose()
}

fn parent_from_row(row: &SqliteRow, include_payload: bool) -> Result<Parent, sqlx::Error> {
    let parent = ParentRow {
        parent_id: ParentId::from_ledger(row.try_get("parent_id")?),
        queue: QueueName::from_ledger(row.try_get("queue")?),
        payload: json_column(row, "payload")?,
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

fn child_from_row(row: &SqliteRow) -> Result<Child, sqlx::Error> {
    let parent_id: String = row.try_get("parent_id")?;
    let sequence: i64 = row.try_get("sequence")?;
    let state: ChildState = parse_column(row.try_get("state")?)?;
    let previous: Option<String> = row.try_get("previous_attempt")?;
    let conflicts: Vec<Conflict> = match json_column(row, "conflicts")? {
        Some(value) => serde_json::from_value(value).map_err(|e| sqlx::Error::Decode(e.into()))?,
        None => Vec::new(),
    };
    Ok(Child {
        idempotency_key: idempotency_key(&parent_id, sequence),
        parent_id: ParentId::from_ledger(parent_id),
        sequence,
        key: row.try_get("key")?,
        state,
        payload: json_column(row, "payload")?.unwrap_or(Value::Null),
        attempts: row.try_get("attempts")?,
        claim_id: uuid_column(row, "claim_id")?,
        claimed_by: row.try_get("claimed_by")?,
        lease_expires_at: row.try_get("lease_expires_at")?,
        previous_attempt: previous.as_deref().map(parse_column).transpose()?,
        available_at: row.try_get("available_at")?,
        outcome: Outcome::from_state(state),
        reason: row.try_get("reason")?,
        result: json_column(row, "result")?,
        outcome_attempt: row.try_get("outcome_attempt")?,
        terminal_at: row.try_get("terminal_at")?,
        conflicts,
    })
}
