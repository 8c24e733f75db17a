//! Claims on Postgres: the lane claim, extend, release, retry and the sweep
//! of expired leases. Every statement that locks rows locks rows of one parent.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::outcomes::BUMP_PARENTS;
use super::{POSTGRES, PgStore, PgTx};
use crate::ledger::{ClaimScope, ParentId, QueueName};
use crate::store::backend::{Claims, Expired, Extended, LaneClaimParams, Release};
use crate::store::error::retry_transient;
use crate::store::reports::{LaneClaim, LaneTurn};
use crate::store::{StoreResult, sql};

/// A claim on one parent's lane: lock the lane row (waiting for the claim of
/// the same parent ahead of it, or skipping a busy lane with `SKIP LOCKED`),
/// lease the lowest claimable sequences from its floor up (and delayed
/// children that are due, earliest due first), record the lease, then move
/// the floor past what it took and stamp the lane served. Every row it locks
/// belongs to parent `$1`. The last row (sequence NULL) says the lane was
/// there and taken.
///
/// The lane's lock is the claim's turn: claims of one parent take their
/// turns on it, so the children are picked without locking them first (no
/// `FOR UPDATE` of each child, which cost a WAL record per child). What the
/// statement's snapshot took for pending but another writer has since moved
/// (an outcome, a cancel) is passed over by the update's own `state`
/// guard. Every other statement that moves pending children locks the lane
/// first too (release, expiry, retry, cancel), so no two wait on each other.
///
/// Each part has one index that serves it in order (`child_pending` from the
/// floor, `child_delayed` by due time, the primary key for the update), so
/// the plan is the same whatever the statistics say, and a cached generic
/// plan is safe. The update joins the picked rows on both key columns and
/// names no parent of its own: with a constant `parent_id` the planner, whose
/// statistics may predate the parent and so expect one row of it, would walk
/// every child of the parent. Binds: `$1` parent id, `$2` how many in all,
/// then one array element per child: `$3` claim ids, `$4` workers, `$5` lease
/// seconds; `$6` the queue the lane must be in (or NULL).
fn lane_claim(lock: &str) -> String {
    format!(
        "WITH lane AS ( \
             SELECT queue, floor, ready_at <= now() AS due, (floor IS NOT NULL OR ready_at <= now()) AS open \
             FROM lane WHERE parent_id = $1 AND ($6::text IS NULL OR lane.queue = $6) \
               AND NOT EXISTS (SELECT 1 FROM queue_pause qp WHERE qp.queue = lane.queue) {lock}), \
         fresh AS ( \
             SELECT c.parent_id, c.sequence FROM child c \
             WHERE c.parent_id = $1 AND c.state = 'pending' AND c.available_at IS NULL \
               AND c.sequence >= (SELECT floor FROM lane) \
             ORDER BY c.sequence LIMIT $2), \
         due AS ( \
             SELECT c.parent_id, c.sequence FROM child c \
             WHERE c.parent_id = $1 AND c.state = 'pending' AND c.available_at <= now() AND (SELECT due FROM lane) \
             ORDER BY c.available_at LIMIT $2), \
         picked AS ( \
             SELECT p.*, row_number() OVER (ORDER BY p.sequence) AS rn \
             FROM (SELECT * FROM fresh UNION ALL SELECT * FROM due ORDER BY sequence LIMIT $2) p), \
         claimed AS ( \
             UPDATE child c SET state = 'in_flight', attempts = c.attempts + 1, previous_claim_id = c.claim_id, \
                 claim_id = ($3::uuid[])[picked.rn], claimed_by = ($4::text[])[picked.rn], \
                 lease_expires_at = now() + make_interval(secs => ($5::float8[])[picked.rn]), \
                 available_at = NULL, changed_at = now() \
             FROM picked WHERE c.parent_id = picked.parent_id AND c.sequence = picked.sequence \
               AND c.state = 'pending' \
             RETURNING c.parent_id, c.sequence, c.key, c.payload, c.attempts, c.previous_attempt, c.lease_expires_at, \
                 c.claim_id), \
         leased AS ( \
             INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at) \
             SELECT claim_id, $1, array_agg(sequence ORDER BY sequence), max(lease_expires_at), now() \
             FROM claimed GROUP BY claim_id \
             ON CONFLICT (claim_id, parent_id) DO UPDATE SET \
                 sequences = claim_lease.sequences || excluded.sequences, \
                 expires_at = greatest(claim_lease.expires_at, excluded.expires_at)), \
         moved AS ( \
             UPDATE lane l SET \
                 floor = (SELECT min(c.sequence) FROM child c \
                          WHERE c.parent_id = $1 AND c.state = 'pending' AND c.available_at IS NULL \
                            AND c.sequence >= (SELECT floor FROM lane) \
                            AND c.sequence NOT IN (SELECT sequence FROM picked)), \
                 ready_at = CASE WHEN (SELECT due FROM lane) THEN ( \
                          SELECT min(c.available_at) FROM child c \
                          WHERE c.parent_id = $1 AND c.state = 'pending' AND c.available_at IS NOT NULL \
                            AND c.sequence NOT IN (SELECT sequence FROM picked)) ELSE l.ready_at END, \
                 served = CASE WHEN EXISTS (SELECT 1 FROM picked) THEN nextval('lane_served') ELSE l.served END, \
                 claimed = l.claimed + (SELECT count(*) FROM claimed) \
             WHERE l.parent_id = $1 AND (SELECT open FROM lane)) \
         SELECT c.*, (SELECT queue FROM lane) AS queue FROM claimed c \
         UNION ALL SELECT $1, NULL, NULL, NULL, NULL, NULL, NULL, NULL, queue FROM lane"
    )
}

/// The lane claim that waits for its turn on the lane (see `lane_claim`).
pub static LANE_CLAIM: LazyLock<String> = LazyLock::new(|| lane_claim("FOR UPDATE"));

/// The lane claim that passes a lane another claim holds (see `lane_claim`).
pub(super) static LANE_CLAIM_SKIP: LazyLock<String> = LazyLock::new(|| lane_claim("FOR UPDATE SKIP LOCKED"));

/// The claimable lanes of a queue in serving order (`store::claims::QUEUE_LANES`
/// as Postgres runs it).
pub static QUEUE_LANES: LazyLock<&'static str> = LazyLock::new(|| crate::store::claims::QUEUE_LANES.of(&POSTGRES));

impl PgStore {
    /// The children this claim leased, by parent in id order (some may have
    /// been released or recorded since: the statements that follow check).
    async fn held_by_claim(tx: &mut PgTx, claim_id: Uuid) -> StoreResult<Vec<(String, Vec<i64>)>> {
        Ok(
            sqlx::query_as("SELECT parent_id, sequences FROM claim_lease WHERE claim_id = $1 ORDER BY parent_id")
                .bind(claim_id)
                .fetch_all(&mut **tx)
                .await?,
        )
    }
}

#[async_trait]
impl Claims for PgStore {
    /// Leases children of one parent for each ask, in one statement (see
    /// `lane_claim`): the lowest sequences to the first ask, and so on.
    async fn claim_lane(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>> {
        let LaneClaimParams {
            parent_id,
            queue,
            asks,
            turn,
        } = lane;
        let queue = queue.map(QueueName::as_str);
        let sql: &'static str = match turn {
            LaneTurn::Wait => LANE_CLAIM.as_str(),
            LaneTurn::Skip => LANE_CLAIM_SKIP.as_str(),
        };
        let total: i64 = asks.iter().map(|a| a.limit).sum();
        let mut claims = Vec::with_capacity(total as usize);
        let mut workers = Vec::with_capacity(total as usize);
        let mut leases = Vec::with_capacity(total as usize);
        for ask in asks {
            for _ in 0..ask.limit {
                claims.push(ask.claim_id);
                workers.push(ask.worker.as_deref());
                leases.push(ask.lease_seconds as f64);
            }
        }
        let (claims, workers, leases) = (&claims, &workers, &leases);
        let rows = retry_transient(|| async move {
            Ok(sqlx::query(self.pool.sql(sql))
                .bind(parent_id.as_str())
                .bind(total)
                .bind(claims)
                .bind(workers)
                .bind(leases)
                .bind(queue)
                .fetch_all(&self.pool)
                .await?)
        })
        .await?;
        Ok(LaneClaim::from_rows(asks, &rows)?)
    }

    /// Extends the live leases of a claim and its children's, in one statement.
    async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<Extended> {
        let (extended, expires): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
            "WITH leases AS ( \
                 UPDATE claim_lease SET expires_at = now() + make_interval(secs => $2) \
                 WHERE claim_id = $1 AND expires_at > now() RETURNING parent_id, sequences), \
             extended AS ( \
                 UPDATE child c SET lease_expires_at = now() + make_interval(secs => $2) \
                 FROM leases l \
                 WHERE c.parent_id = l.parent_id AND c.sequence = ANY (l.sequences) \
                   AND c.claim_id = $1 AND c.state = 'in_flight' AND c.lease_expires_at > now() \
                 RETURNING c.lease_expires_at) \
             SELECT count(*), max(lease_expires_at) FROM extended",
        )
        .bind(claim_id)
        .bind(lease_seconds as f64)
        .fetch_one(&self.pool)
        .await?;
        Ok(Extended {
            extended: extended as u64,
            lease_expires_at: expires,
        })
    }

    /// Returns a claim's children (all, or the named ones) to pending, parent
    /// by parent in one transaction, lowering each lane's floor (or, with a
    /// delay, its `ready_at`) to them; each lane is locked before its
    /// children, as a claim locks them.
    async fn release(&self, release: Release<'_>) -> StoreResult<Vec<(ParentId, u64)>> {
        let Release {
            claim_id,
            children,
            delay_seconds,
        } = release;
        let mut tx = self.held_tx().await?;
        let groups: Vec<(String, Vec<i64>)> = match children {
            None => Self::held_by_claim(&mut tx, claim_id).await?,
            Some(children) => {
                let mut named: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
                for c in children {
                    named.entry(c.parent_id.as_str()).or_default().push(c.sequence);
                }
                named.into_iter().map(|(p, s)| (p.to_owned(), s)).collect()
            }
        };
        let mut released = Vec::new();
        for (parent_id, sequences) in groups {
            let n: i64 = sqlx::query_scalar(
                "WITH turn AS (SELECT 1 FROM lane WHERE parent_id = $3 FOR UPDATE), \
                 released AS ( \
                     UPDATE child c SET state = 'pending', previous_attempt = 'released', lease_expires_at = NULL, \
                         available_at = CASE WHEN $5 > 0 THEN now() + make_interval(secs => $5) END, \
                         changed_at = now() \
                     FROM unnest($1::text[], $2::bigint[]) AS u(parent_id, sequence) \
                     WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence \
                       AND c.claim_id = $4 AND c.state = 'in_flight' AND (SELECT count(*) FROM turn) >= 0 \
                     RETURNING c.sequence, c.available_at), \
                 lowered AS ( \
                     UPDATE lane SET \
                         floor = least(floor, (SELECT min(sequence) FROM released WHERE available_at IS NULL)), \
                         ready_at = least(ready_at, (SELECT min(available_at) FROM released)), \
                         unclaimed = unclaimed + (SELECT count(*) FROM released) \
                     WHERE parent_id = $3 AND EXISTS (SELECT 1 FROM released)) \
                 SELECT count(*) FROM released",
            )
            .bind(vec![parent_id.as_str(); sequences.len()])
            .bind(&sequences)
            .bind(&parent_id)
            .bind(claim_id)
            .bind(delay_seconds as f64)
            .fetch_one(&mut *tx)
            .await?;
            if n > 0 {
                released.push((ParentId::from_ledger(parent_id), n as u64));
            }
        }
        tx.commit().await?;
        Ok(released)
    }

    /// Returns a held child to pending, and its lane's floor to it; whether it did.
    async fn retry_held(&self, parent_id: &ParentId, sequence: i64) -> StoreResult<bool> {
        let retried: bool = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH turn AS (SELECT 1 FROM lane WHERE parent_id = $1 FOR UPDATE), \
             retried AS ({} AND (SELECT count(*) FROM turn) >= 0 RETURNING sequence), \
             lowered AS ( \
                 UPDATE lane SET floor = least(floor, $2), held_out = held_out + 1 \
                 WHERE parent_id = $1 AND EXISTS (SELECT 1 FROM retried)) \
             SELECT EXISTS (SELECT 1 FROM retried)",
            sql::retry_held("now()")
        )))
        .bind(parent_id.as_str())
        .bind(sequence)
        .fetch_one(&self.pool)
        .await?;
        Ok(retried)
    }

    /// Moves the children of up to `batch` leases that ran out, in `scope` or
    /// everywhere: a read finds the leases, then one statement per parent
    /// moves their children. Returns how many moved, and the parents whose
    /// last child this failed.
    async fn expire_leases(&self, scope: Option<&ClaimScope>, batch: i64) -> StoreResult<Expired> {
        let (scope_filter, scope_key) = match scope {
            None => ("", None),
            Some(ClaimScope::Parent(parent_id)) => ("AND l.parent_id = $2", Some(parent_id.as_str())),
            Some(ClaimScope::Queue(queue)) => (
                "AND l.parent_id IN (SELECT parent_id FROM parent WHERE queue = $2 AND completed_at IS NULL)",
                Some(queue.as_str()),
            ),
        };
        let found_sql = format!(
            "SELECT parent_id, array_agg(claim_id) FROM ( \
                 SELECT l.parent_id, l.claim_id FROM claim_lease l \
                 WHERE l.expires_at <= now() {scope_filter} \
                 ORDER BY l.expires_at LIMIT $1) e \
             GROUP BY parent_id ORDER BY parent_id"
        );
        let found_sql = found_sql.as_str();
        let found: Vec<(String, Vec<Uuid>)> = retry_transient(|| async move {
            Ok(sqlx::query_as(AssertSqlSafe(found_sql))
                .bind(batch)
                .bind(scope_key)
                .fetch_all(&self.pool)
                .await?)
        })
        .await?;
        let more = found.iter().map(|(_, claims)| claims.len() as i64).sum::<i64>() >= batch;
        let mut moved = 0;
        let mut completed = Vec::new();
        for (parent_id, claims) in found {
            let (parent_id, claims) = (&parent_id, &claims);
            let rows: Vec<(Option<String>, i64)> = retry_transient(|| async move {
                Ok(sqlx::query_as(EXPIRE_IN_PARENT.as_str())
                    .bind(claims)
                    .bind(parent_id)
                    .fetch_all(&self.pool)
                    .await?)
            })
            .await?;
            for (parent_id, count) in rows {
                match parent_id {
                    None => moved += count as u64,
                    Some(parent_id) => completed.push(ParentId::from_ledger(parent_id)),
                }
            }
        }
        Ok(Expired { moved, completed, more })
    }
}

/// Moves the children of parent `$2` whose leases (of the claims `$1`) ran
/// out: exhausted ones fail (and count), `hold` parents keep theirs held,
/// the rest become claimable again and lower the lane's floor; all remember
/// the attempt expired. The lane is locked first, then the leases go (a
/// lease an extension renewed meanwhile stays, and so do its children), then
/// their children, waiting for any another statement holds (an outcome,
/// which may settle them first): the order of every statement that moves
/// them, so none waits on another in a circle.
static EXPIRE_IN_PARENT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH turn AS (SELECT 1 FROM lane WHERE parent_id = $2 FOR UPDATE), \
         gone AS ( \
             DELETE FROM claim_lease l WHERE l.parent_id = $2 AND l.claim_id = ANY ($1::uuid[]) \
               AND l.expires_at <= now() AND (SELECT count(*) FROM turn) >= 0 \
             RETURNING l.claim_id, l.sequences), \
         expired AS ( \
             SELECT c.parent_id, c.sequence FROM gone g \
             JOIN child c ON c.parent_id = $2 AND c.sequence = ANY (g.sequences) AND c.claim_id = g.claim_id \
             WHERE c.state = 'in_flight' AND c.lease_expires_at <= now() \
             FOR UPDATE OF c), \
         moved AS ( \
             UPDATE child c SET \
                 state = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts THEN 'failed' \
                              WHEN p.expired_lease = 'hold' THEN 'held' ELSE 'pending' END, \
                 reason = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                               THEN 'attempts exhausted' ELSE c.reason END, \
                 terminal_at = CASE WHEN p.max_attempts IS NOT NULL AND c.attempts >= p.max_attempts \
                                    THEN now() ELSE c.terminal_at END, \
                 previous_attempt = 'expired', changed_at = now() \
             FROM expired e, parent p \
             WHERE c.parent_id = e.parent_id AND c.sequence = e.sequence AND p.parent_id = e.parent_id \
             RETURNING c.parent_id, c.sequence, c.state), \
         deltas AS ( \
             SELECT parent_id, 0 AS processed, count(*) AS failed, 0 AS skipped, \
                 0 AS from_in_flight, 0 AS from_held \
             FROM moved WHERE state = 'failed' GROUP BY parent_id), \
         {bump}, \
         lowered AS ( \
             UPDATE lane SET floor = least(floor, (SELECT min(sequence) FROM moved WHERE state = 'pending')), \
                 unclaimed = unclaimed + (SELECT count(*) FROM moved), \
                 held_in = held_in + (SELECT count(*) FROM moved WHERE state = 'held') \
             WHERE parent_id = $2 AND EXISTS (SELECT 1 FROM moved)) \
         SELECT NULL, count(*) FROM moved \
         UNION ALL SELECT parent_id, 0 FROM bumped WHERE completed",
        bump = BUMP_PARENTS.as_str()
    )
});
