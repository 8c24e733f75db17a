//! Claims on Postgres: extend, release, retry and the sweep of expired
//! leases; the lane claim is `lane_claim`. Every statement that locks rows locks rows of one parent.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use super::outcomes::BUMP_PARENTS;
use super::{PgStore, PgTx};
use crate::ledger::verdict::PARENT_FAILED;
use crate::ledger::{ClaimScope, ParentId};
use crate::store::backend::{Claims, Expired, Extended, LaneClaimParams, Outbox, Release};
use crate::store::error::retry_transient;
use crate::store::parents::close_skipping;
use crate::store::reports::LaneClaim;
use crate::store::{StoreResult, sql};

impl PgStore {
    /// The children this claim leased, by parent in id order (some may have
    /// been released or recorded since: the statements that follow check).
    async fn held_by_claim(tx: &mut PgTx, claim_id: Uuid) -> StoreResult<Vec<(String, Vec<i64>)>> {
        Ok(sqlx::query_as(AssertSqlSafe(format!(
            "SELECT parent_id, {} FROM claim_lease l WHERE claim_id = $1 ORDER BY parent_id",
            super::listed("l")
        )))
        .bind(claim_id)
        .fetch_all(&mut **tx)
        .await?)
    }
}

/// Gives parent `$3`'s claim `$4` children back (those of `$1`/`$2` it still
/// holds): each comes back through `available_at`, now or after `$5`
/// seconds, with the attempt counted as released; the lease lets go of them
/// (and goes when nothing is left in it), and the lane counts them and
/// learns the earliest due. Its lane is locked, and then its lease, as
/// every writer of a leased child locks it (see `APPLY_OUTCOMES`). Whether
/// the lease stays or goes is decided on its open count as locked (`lease`),
/// never as this statement's snapshot saw it: an outcome that committed
/// while this statement waited for the lock moved it, and on the older
/// count neither `kept` nor `closed` applied, leaving the lease holding a
/// released child.
static RELEASE_IN_PARENT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH lease AS ( \
         SELECT {listed} AS sequences, worker, open FROM claim_lease l WHERE claim_id = $4 AND parent_id = $3 \
         FOR NO KEY UPDATE), \
     released AS ( \
         UPDATE child c SET \
             available_at = now() + make_interval(secs => CASE WHEN $5 > 0 THEN $5 \
                 ELSE (SELECT {backoff} FROM parent p WHERE p.parent_id = $3) END), \
             previous_attempt = 'released', attempts = c.attempts + 1, previous_claim_id = c.claim_id, \
             claim_id = $4, claimed_by = (SELECT worker FROM lease), lease_expires_at = NULL, changed_at = now() \
         FROM unnest($1::text[], $2::bigint[]) AS u(parent_id, sequence) \
         WHERE c.parent_id = u.parent_id AND c.sequence = u.sequence \
           AND c.state = 'pending' AND c.available_at IS NULL AND c.sequence = ANY ((SELECT sequences FROM lease)::bigint[]) \
         RETURNING c.sequence, c.available_at), \
     kept AS ( \
         UPDATE claim_lease l SET \
             sequences = ARRAY(SELECT s FROM unnest({listed}) s WHERE s NOT IN (SELECT sequence FROM released)), \
             open = l.open - (SELECT count(*) FROM released) \
         WHERE l.claim_id = $4 AND l.parent_id = $3 AND (SELECT open FROM lease) > (SELECT count(*) FROM released)), \
     closed AS ( \
         DELETE FROM claim_lease l WHERE l.claim_id = $4 AND l.parent_id = $3 \
           AND (SELECT open FROM lease) <= (SELECT count(*) FROM released) AND EXISTS (SELECT 1 FROM released)), \
     lowered AS ( \
         UPDATE lane SET ready_at = least(ready_at, (SELECT min(available_at) FROM released)), \
             unclaimed = unclaimed + (SELECT count(*) FROM released) \
         WHERE parent_id = $3 AND EXISTS (SELECT 1 FROM released)) \
     SELECT count(*) FROM released",
        listed = super::listed("l"),
        backoff = sql::backoff_seconds(RANDOM, "p", "c.attempts + 1")
    )
});

/// Postgres' random fraction in [0, 1).
const RANDOM: &str = "random()";

/// Locks the lanes of the parents whose children claim `$1` leased, in id
/// order (the order a release takes them in).
const TAKE_CLAIM_LANES: &str = "SELECT parent_id FROM lane \
    WHERE parent_id IN (SELECT parent_id FROM claim_lease WHERE claim_id = $1) ORDER BY parent_id FOR UPDATE";

#[async_trait]
impl Claims for PgStore {
    /// Leases children of one parent for each ask, in one transaction: the
    /// lane's turn (`TAKE_LANE`), then one statement (`LANE_CLAIM`) that
    /// hands the lowest sequences to the first ask, and so on. In a limited
    /// queue the claim is admitted after it took its children, and rolled
    /// back to be admitted first when it took more than it may (`Binding`).
    async fn claim_lane(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>> {
        self.lane_claim(lane).await
    }

    /// Extends the live leases of a claim, its lanes locked (an expiry that
    /// holds one finishes first).
    async fn extend(&self, claim_id: Uuid, lease_seconds: i64) -> StoreResult<Extended> {
        let mut tx = self.held_tx().await?;
        sqlx::query(TAKE_CLAIM_LANES).bind(claim_id).execute(&mut *tx).await?;
        let (extended, expires): (i64, Option<DateTime<Utc>>) = sqlx::query_as(
            "WITH leases AS ( \
                 UPDATE claim_lease SET expires_at = now() + make_interval(secs => $2) \
                 WHERE claim_id = $1 AND expires_at > now() RETURNING open, expires_at) \
             SELECT coalesce(sum(open), 0)::bigint, max(expires_at) FROM leases",
        )
        .bind(claim_id)
        .bind(lease_seconds as f64)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Extended {
            extended: extended as u64,
            lease_expires_at: expires,
        })
    }

    /// Returns a claim's children (all, or the named ones) to pending, parent
    /// by parent in one transaction (`RELEASE_IN_PARENT`), each lane locked
    /// first.
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
            sqlx::query("SELECT 1 FROM lane WHERE parent_id = $1 FOR UPDATE")
                .bind(&parent_id)
                .execute(&mut *tx)
                .await?;
            let n: i64 = sqlx::query_scalar(RELEASE_IN_PARENT.as_str())
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

    /// Returns held children to pending, given back (due now); how many.
    async fn retry_held(&self, parent_id: &ParentId, sequence: Option<i64>) -> StoreResult<u64> {
        let retried: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "WITH turn AS (SELECT 1 FROM lane WHERE parent_id = $1 FOR UPDATE), \
             retried AS ({} AND (SELECT count(*) FROM turn) >= 0 RETURNING sequence), \
             lowered AS ( \
                 UPDATE lane SET ready_at = least(ready_at, now()), \
                     held_out = held_out + (SELECT count(*) FROM retried) \
                 WHERE parent_id = $1 AND EXISTS (SELECT 1 FROM retried)) \
             SELECT count(*) FROM retried",
            sql::retry_held("now()")
        )))
        .bind(parent_id.as_str())
        .bind(sequence)
        .fetch_one(&self.pool)
        .await?;
        Ok(retried as u64)
    }

    /// Moves the children of up to `batch` leases that ran out, in `scope` or
    /// everywhere: a read finds the leases, then for each parent a
    /// transaction locks its lane and moves their children. Returns how many
    /// moved, and the parents whose last child this failed.
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
                let mut tx = self.held_tx().await?;
                sqlx::query("SELECT 1 FROM lane WHERE parent_id = $1 FOR UPDATE")
                    .bind(parent_id)
                    .execute(&mut *tx)
                    .await?;
                let mut rows: Vec<(Option<String>, i64)> = sqlx::query_as(EXPIRE_IN_PARENT.as_str())
                    .bind(claims)
                    .bind(parent_id)
                    .fetch_all(&mut *tx)
                    .await?;
                // Children failed by exhausted attempts count against a
                // tolerance too: the expiry that crosses it ends the parent.
                if rows.iter().any(|(parent, n)| parent.is_some() && *n == CROSSED) {
                    rows.retain(|(parent, n)| parent.is_none() || *n != CROSSED);
                    let parent = ParentId::from_ledger(parent_id.clone());
                    let (_, completed) = close_skipping(&mut tx, &parent, PARENT_FAILED, false).await?;
                    if completed {
                        tx.enqueue_completed(std::slice::from_ref(&parent)).await?;
                        rows.push((Some(parent_id.clone()), 0));
                    }
                }
                tx.commit().await?;
                Ok(rows)
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

/// What `EXPIRE_IN_PARENT` says beside a parent whose tolerance it crossed.
const CROSSED: i64 = -1;

/// Ends the leases of claims `$1` on parent `$2` that ran out, its lane
/// locked: their children still held fail when their attempts are
/// exhausted (and count, by reason too), stay held for `hold` parents, and
/// otherwise come back through `available_at`; all remember the attempt
/// expired, and which claim made it. Then the leases go, and the lane counts
/// what ended. The leases are locked first, as every writer of a leased
/// child locks them (see `APPLY_OUTCOMES`): one that an outcome changed
/// meanwhile is read as it is now. The children are written after the
/// leases and before the parent: the order an outcome takes them in.
static EXPIRE_IN_PARENT: LazyLock<String> = LazyLock::new(|| {
    let exhausted = "p.max_attempts IS NOT NULL AND c.attempts + 1 >= p.max_attempts";
    format!(
        "WITH gone AS ( \
             SELECT l.claim_id, {listed} AS sequences, l.worker, l.expires_at FROM claim_lease l \
             WHERE l.parent_id = $2 AND l.claim_id = ANY ($1::uuid[]) AND l.expires_at <= now() \
             ORDER BY l.claim_id FOR NO KEY UPDATE), \
         moved AS ( \
             UPDATE child c SET \
                 state = CASE WHEN {exhausted} THEN 'failed' WHEN p.expired_lease = 'hold' THEN 'held' \
                              ELSE 'pending' END, \
                 available_at = CASE WHEN {exhausted} OR p.expired_lease = 'hold' THEN NULL \
                     ELSE now() + make_interval(secs => {backoff}) END, \
                 reason = CASE WHEN {exhausted} THEN 'attempts exhausted' ELSE c.reason END, \
                 terminal_at = CASE WHEN {exhausted} THEN now() ELSE c.terminal_at END, \
                 attempts = c.attempts + 1, previous_claim_id = c.claim_id, claim_id = g.claim_id, \
                 claimed_by = g.worker, lease_expires_at = g.expires_at, \
                 previous_attempt = 'expired', changed_at = now() \
             FROM gone g, parent p \
             WHERE c.parent_id = $2 AND c.sequence = ANY (g.sequences) AND p.parent_id = $2 \
               AND c.state = 'pending' AND c.available_at IS NULL \
             RETURNING c.parent_id, c.sequence, c.state, c.available_at, c.reason), \
         {reasons}, \
         ended AS ( \
             DELETE FROM claim_lease l USING gone g \
             WHERE l.claim_id = g.claim_id AND l.parent_id = $2 AND (SELECT count(*) FROM moved) >= 0), \
         deltas AS ( \
             SELECT parent_id, 0 AS processed, count(*) AS failed, 0 AS skipped, \
                 0 AS from_in_flight, 0 AS from_held \
             FROM moved WHERE state = 'failed' GROUP BY parent_id), \
         {bump}, \
         lowered AS ( \
             UPDATE lane SET ready_at = least(ready_at, (SELECT min(available_at) FROM moved)), \
                 unclaimed = unclaimed + (SELECT count(*) FROM moved), \
                 held_in = held_in + (SELECT count(*) FROM moved WHERE state = 'held') \
             WHERE parent_id = $2 AND EXISTS (SELECT 1 FROM moved)) \
         SELECT NULL, count(*) FROM moved \
         UNION ALL SELECT parent_id, 0 FROM bumped WHERE completed \
         UNION ALL SELECT parent_id, {CROSSED} FROM bumped WHERE crossed",
        bump = BUMP_PARENTS.as_str(),
        reasons = super::count_reasons("moved"),
        listed = super::listed("l"),
        backoff = sql::backoff_seconds(RANDOM, "p", "c.attempts + 1")
    )
});
