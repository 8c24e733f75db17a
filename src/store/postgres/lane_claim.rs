//! The lane claim on Postgres: one parent's lane taken in turn, its lowest
//! claimable children leased in one statement, and, in a limited queue,
//! admission (`store::admission`) after the claim or, where limits bind,
//! before it. Every statement that locks rows locks rows of one parent,
//! except, in a limited queue, its `flow_limit` rows (its own and its key's).

use std::collections::BTreeSet;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use uuid::Uuid;

use super::{POSTGRES, PgStore, PgTx};
use crate::ledger::admission::HeldBy;
use crate::ledger::{ParentId, QueueName};
use crate::store::admission::Admission;
use crate::store::backend::LaneClaimParams;
use crate::store::error::retry_transient;
use crate::store::reports::{LaneAsk, LaneClaim, LaneTurn};
use crate::store::{StoreError, StoreResult};

/// Takes a claim's turn on parent `$1`'s lane: locks its row, waiting for
/// the claim of the same parent ahead of it (or, with `SKIP LOCKED`, passing
/// a lane another claim holds), if it is in queue `$2` (NULL: any) and that
/// queue is not paused. Returns its queue, its floor, whether it has
/// given-back children that are due, its parent's trace context and flow
/// key, when its `not_before` is still ahead, and whether its queue has
/// limits (`store::admission`). Every statement that moves a lane's
/// children locks the lane first: the statement that follows it in the
/// transaction sees all they did (a statement's snapshot is taken when it
/// starts, so the claim is a statement of its own after the lock).
fn take_lane(lock: &str) -> String {
    format!(
        "SELECT queue, floor, coalesce(ready_at <= now(), false) AS due, traceparent, children_traced, flow_key, \
             CASE WHEN not_before > now() THEN not_before END AS wait_until, \
             (SELECT f.limited FROM flow_limit f WHERE f.queue = lane.queue AND f.flow_key = '') AS limited \
         FROM lane \
         WHERE parent_id = $1 AND ($2::text IS NULL OR lane.queue = $2) \
           AND NOT EXISTS (SELECT 1 FROM queue_pause qp WHERE qp.queue = lane.queue) {lock}"
    )
}

/// The lane lock that waits for its turn (see `take_lane`).
static TAKE_LANE: LazyLock<String> = LazyLock::new(|| take_lane("FOR UPDATE"));

/// The lane lock that passes a lane another claim holds (see `take_lane`).
static TAKE_LANE_SKIP: LazyLock<String> = LazyLock::new(|| take_lane("FOR UPDATE SKIP LOCKED"));

/// A claim on one parent's lane, its turn taken (`TAKE_LANE`): leases the
/// lowest claimable sequences from the floor `$6` up (and given-back children
/// that are due when `$7`, earliest due first), records the lease, then moves
/// the floor past what it took and stamps the lane served.
///
/// A child handed out from the floor up is not written at all (migration
/// 0014): the lease row names it and the floor passes it, which is what makes
/// it in flight. Only a given-back child is written, to clear its
/// `available_at`. The floor read one row past the limit is the next floor.
/// Each child is read once: what the claim hands out comes with the row that
/// picked it (every part of the statement sees one snapshot, so `taken`'s
/// write would not show in a second read either; reading the children again
/// by key cost three index pages per child, a third of the claim's time).
///
/// Each part has one index that serves it in order (the primary key from the
/// floor, `child_delayed` by due time), so the plan is the same whatever the
/// statistics say, and a cached generic plan is safe. Rows are looked up on
/// both key columns. Binds: `$1` parent id, `$2` how many in all, then one
/// array element per ask (claims that share the statement): `$3` claim ids,
/// `$4` workers, `$5` lease seconds, `$11` the first child (1-based) it
/// takes; `$6` the floor, `$7` whether given-back children are due, `$8` the
/// lane's queue, `$9` the parent's `traceparent` and `$10` whether children
/// have their own (each is then looked up), `$12` its flow key, `$13` when
/// admission let the claim through (its lease's `claimed_at`; NULL: now). A child finds its ask by
/// `width_bucket` over `$11` (a binary search of a short array; indexing an
/// array of one text per child walked it from the start for every child).
pub static LANE_CLAIM: &str = "WITH fresh AS ( \
         SELECT c.sequence, false AS returned, c.key, c.payload, c.attempts, c.previous_attempt FROM child c \
         WHERE c.parent_id = $1 AND c.sequence >= $6 AND c.state = 'pending' AND c.available_at IS NULL \
         ORDER BY c.sequence LIMIT $2 + 1), \
     due AS ( \
         SELECT c.sequence, true AS returned, c.key, c.payload, c.attempts, c.previous_attempt FROM child c \
         WHERE $7 AND c.parent_id = $1 AND c.state = 'pending' AND c.available_at <= now() \
         ORDER BY c.available_at LIMIT $2), \
     picked AS ( \
         SELECT p.sequence, p.returned, p.key, p.payload, p.attempts, p.previous_attempt, \
             width_bucket(row_number() OVER (ORDER BY p.sequence), $11::bigint[]) AS ask \
         FROM (SELECT * FROM fresh UNION ALL SELECT * FROM due ORDER BY sequence LIMIT $2) p), \
     taken AS ( \
         UPDATE child c SET available_at = NULL FROM picked k \
         WHERE k.returned AND c.parent_id = $1 AND c.sequence = k.sequence RETURNING c.sequence), \
     leased AS ( \
         SELECT k.sequence, k.key, k.payload, k.attempts + 1 AS attempts, k.previous_attempt, \
             ($3::uuid[])[k.ask] AS claim_id, ($4::text[])[k.ask] AS worker, \
             now() + make_interval(secs => ($5::float8[])[k.ask]) AS lease_expires_at \
         FROM picked k \
         WHERE (SELECT count(*) FROM taken) >= 0), \
     lease AS ( \
         INSERT INTO claim_lease (claim_id, parent_id, sequences, expires_at, claimed_at, worker, open, lo, hi, \
             queue, flow_key) \
         SELECT claim_id, $1, \
             CASE WHEN count(*) = max(sequence) - min(sequence) + 1 THEN NULL \
                  ELSE array_agg(sequence ORDER BY sequence) END, \
             max(lease_expires_at), coalesce($13::timestamptz, statement_timestamp()), max(worker), count(*), \
             min(sequence), max(sequence), $8, $12 \
         FROM leased GROUP BY claim_id \
         ON CONFLICT (claim_id, parent_id) DO UPDATE SET \
             sequences = coalesce(claim_lease.sequences, \
                                  ARRAY(SELECT generate_series(claim_lease.lo, claim_lease.hi))) \
                 || coalesce(excluded.sequences, ARRAY(SELECT generate_series(excluded.lo, excluded.hi))), \
             expires_at = greatest(claim_lease.expires_at, excluded.expires_at), \
             open = claim_lease.open + excluded.open, \
             lo = least(claim_lease.lo, excluded.lo), hi = greatest(claim_lease.hi, excluded.hi)), \
     moved AS ( \
         UPDATE lane l SET \
             floor = (SELECT min(f.sequence) FROM fresh f \
                      WHERE f.sequence NOT IN (SELECT sequence FROM picked WHERE NOT returned)), \
             ready_at = CASE WHEN $7 THEN ( \
                      SELECT min(c.available_at) FROM child c \
                      WHERE c.parent_id = $1 AND c.state = 'pending' AND c.available_at IS NOT NULL \
                        AND c.sequence NOT IN (SELECT sequence FROM picked WHERE returned)) ELSE l.ready_at END, \
             served = CASE WHEN EXISTS (SELECT 1 FROM picked) THEN nextval('lane_served') ELSE l.served END, \
             claimed = l.claimed + (SELECT count(*) FROM leased) \
         WHERE l.parent_id = $1) \
     SELECT $1::text AS parent_id, sequence, key, payload, attempts, previous_attempt, lease_expires_at, claim_id, \
         $8::text AS queue, \
         coalesce((SELECT t.traceparent FROM trace_context t \
                   WHERE $10 AND t.parent_id = $1 AND t.sequence = leased.sequence), $9::text) AS traceparent \
     FROM leased";

/// The claimable lanes of a queue in serving order, each way a queue may
/// order them (`store::claims::QUEUE_LANES` as Postgres runs it).
pub static QUEUE_LANES: LazyLock<[&'static str; 4]> =
    LazyLock::new(|| std::array::from_fn(|i| crate::store::claims::QUEUE_LANES.of(&POSTGRES, i)));

/// What a lane claim's transaction came to.
enum Taken {
    /// Nothing: a limit (which one) or a `not_before` (when to come back) held it back, or the lane had nothing.
    HeldBack(Option<HeldBy>, Option<DateTime<Utc>>),
    /// The claim statement's rows, for the asks as admitted; whether its
    /// commit did not wait for its flush (a limited queue's claim), and when
    /// then its leases must say they were made.
    Rows(
        Vec<sqlx::postgres::PgRow>,
        Vec<LaneAsk>,
        Option<HeldBy>,
        Option<Unflushed>,
    ),
    /// Admitted after it took its children, the claim took more than it
    /// may: rolled back, to be admitted first.
    Overshot,
}

/// A lane as its turn read it (`TAKE_LANE`).
#[derive(sqlx::FromRow)]
struct TakenLane {
    queue: String,
    floor: Option<i64>,
    due: bool,
    traceparent: Option<String>,
    children_traced: bool,
    flow_key: Option<String>,
    wait_until: Option<DateTime<Utc>>,
    limited: Option<bool>,
}

/// A claim committed without waiting for its flush: `PgStore::durable`
/// waits for it before the claim is answered.
struct Unflushed {
    /// When a rate let it through, for a claim admitted after it took its
    /// children: its leases say so (they said when they were taken).
    metered_at: Option<DateTime<Utc>>,
}

/// Rewrites the lease rows of claims `$1` on parent `$2` (stamped made at
/// `$3` when given), in a transaction of its own that waits for its flush
/// (every commit's does, `synchronous_commit` being on): the flush takes the
/// log up to this commit, past the claim's own commit before it. An update
/// that finds no row writes nothing and flushes nothing: fewer rows than
/// leases means the claim's commit may have been lost (the server crashed
/// or was replaced before its flush), and the claim is not answered.
const FLUSHED: &str = "UPDATE claim_lease SET claimed_at = coalesce($3, claimed_at) \
    WHERE claim_id = ANY($1) AND parent_id = $2";

impl PgStore {
    /// Leases children of one parent for each ask, in one transaction: the
    /// lane's turn (`TAKE_LANE`), then one statement (`LANE_CLAIM`) that
    /// hands the lowest sequences to the first ask, and so on. In a limited
    /// queue the claim is admitted after it took its children, and rolled
    /// back to be admitted first when it took more than it may (`Binding`).
    pub(super) async fn lane_claim(&self, lane: LaneClaimParams<'_>) -> StoreResult<Vec<LaneClaim>> {
        let LaneClaimParams {
            parent_id,
            queue,
            asks,
            turn,
        } = lane;
        let queue = queue.map(QueueName::as_str);
        let take: &'static str = match turn {
            LaneTurn::Wait => TAKE_LANE.as_str(),
            LaneTurn::Skip => TAKE_LANE_SKIP.as_str(),
        };
        let mut taken = None;
        for admit_first in [false, true] {
            taken = retry_transient(|| self.lane_transaction(parent_id, queue, take, asks, admit_first)).await?;
            if !matches!(taken, Some(Taken::Overshot)) {
                break;
            }
        }
        if let Some(Taken::Rows(rows, _, _, Some(unflushed))) = &taken
            && !rows.is_empty()
        {
            self.durable(rows, parent_id, unflushed).await?;
        }
        match taken {
            None | Some(Taken::Overshot) => Ok(asks.iter().map(|_| LaneClaim::default()).collect()),
            Some(Taken::HeldBack(held_by, next)) => Ok(LaneClaim::held_back(asks, held_by, next)),
            Some(Taken::Rows(rows, admitted, held_by, _)) => {
                let mut claims = LaneClaim::taken_from_rows(&admitted, &rows)?;
                for claim in &mut claims {
                    claim.held_by = held_by;
                }
                Ok(claims)
            }
        }
    }

    /// One lane claim's transaction. In a limited queue that did not bind
    /// lately (`Binding`), the claim takes its children first and takes the
    /// queue's turn only to count them (`Admission::read` with them as its
    /// own): the turn no longer spans the claim statement, which kept the
    /// queue's claims in single file. When it took more than it may, it rolls
    /// back (`Taken::Overshot`) and, called again with `admit_first`, is
    /// admitted before it takes any.
    async fn lane_transaction(
        &self,
        parent_id: &ParentId,
        queue: Option<&str>,
        take: &'static str,
        asks: &[LaneAsk],
        admit_first: bool,
    ) -> StoreResult<Option<Taken>> {
        let want: i64 = asks.iter().map(|a| a.limit).sum();
        let mut tx = self.held_tx().await?;
        let lane: Option<TakenLane> = sqlx::query_as(self.pool.sql(take))
            .bind(parent_id.as_str())
            .bind(queue)
            .fetch_optional(&mut *tx)
            .await?;
        let Some(lane) = lane else {
            tx.commit().await?;
            return Ok(None);
        };
        if lane.wait_until.is_some() {
            tx.commit().await?;
            return Ok(Some(Taken::HeldBack(None, lane.wait_until)));
        }
        if lane.floor.is_none() && !lane.due {
            tx.commit().await?;
            return Ok(Some(Taken::HeldBack(None, None)));
        }
        let queue = lane.queue.as_str();
        let flow_key = lane.flow_key.as_deref();
        if lane.limited == Some(true) && !admit_first && !self.bound.lately(queue, flow_key) {
            let rows = self.lane_rows(&mut tx, parent_id, &lane, asks, want, None).await?;
            let taken = rows.len() as i64;
            if taken == 0 {
                tx.commit().await?;
                return Ok(Some(Taken::Rows(rows, asks.to_vec(), None, None)));
            }
            let admission = Admission::read(&mut tx, queue, flow_key, lane.limited, taken, taken).await?;
            if admission.allowed(taken) < taken {
                tx.rollback().await?;
                if let Some(held_by) = admission.admitted.and_then(|a| a.held_by) {
                    self.bound.note(queue, flow_key, held_by);
                }
                return Ok(Some(Taken::Overshot));
            }
            admission.spend(&mut tx, queue, flow_key, taken).await?;
            tx.commit().await?;
            let unflushed = admission.unflushed().then(|| Unflushed {
                metered_at: admission.metered().then(|| admission.admitted_at()).flatten(),
            });
            return Ok(Some(Taken::Rows(rows, asks.to_vec(), None, unflushed)));
        }
        let admission = Admission::read(&mut tx, queue, flow_key, lane.limited, want, 0).await?;
        let allowed = admission.allowed(want);
        let held_by = admission.admitted.and_then(|a| a.held_by);
        if let Some(held_by) = held_by {
            self.bound.note(queue, flow_key, held_by);
        }
        if allowed == 0 {
            admission.spend(&mut tx, queue, flow_key, 0).await?;
            tx.commit().await?;
            return Ok(Some(Taken::HeldBack(
                held_by,
                admission.admitted.and_then(|a| a.next_available_at),
            )));
        }
        let asks = LaneClaim::admitted_asks(asks, allowed);
        let rows = self
            .lane_rows(&mut tx, parent_id, &lane, &asks, allowed, admission.admitted_at())
            .await?;
        admission.spend(&mut tx, queue, flow_key, rows.len() as i64).await?;
        tx.commit().await?;
        let unflushed = admission.unflushed().then_some(Unflushed { metered_at: None });
        Ok(Some(Taken::Rows(rows, asks, held_by, unflushed)))
    }

    /// Runs `LANE_CLAIM` for `asks` (`allowed` children in all) on a lane
    /// whose turn the transaction holds.
    async fn lane_rows(
        &self,
        tx: &mut PgTx,
        parent_id: &ParentId,
        lane: &TakenLane,
        asks: &[LaneAsk],
        allowed: i64,
        admitted_at: Option<DateTime<Utc>>,
    ) -> StoreResult<Vec<sqlx::postgres::PgRow>> {
        let claims: Vec<Uuid> = asks.iter().map(|a| a.claim_id).collect();
        let workers: Vec<Option<&str>> = asks.iter().map(|a| a.worker.as_deref()).collect();
        let leases: Vec<f64> = asks.iter().map(|a| a.lease_seconds as f64).collect();
        let firsts: Vec<i64> = asks
            .iter()
            .scan(1, |next, a| {
                let first = *next;
                *next += a.limit;
                Some(first)
            })
            .collect();
        Ok(sqlx::query(self.pool.sql(LANE_CLAIM))
            .bind(parent_id.as_str())
            .bind(allowed)
            .bind(&claims)
            .bind(&workers)
            .bind(&leases)
            .bind(lane.floor)
            .bind(lane.due)
            .bind(&lane.queue)
            .bind(&lane.traceparent)
            .bind(lane.children_traced)
            .bind(&firsts)
            .bind(&lane.flow_key)
            .bind(admitted_at)
            .fetch_all(&mut **tx)
            .await?)
    }

    /// Returns once a claim committed without waiting for its flush
    /// (`store::admission::LOCK_QUEUE`) is on disk, its leases (one per
    /// claim among `rows`) found: the answer to a claim is durable, as every
    /// answer is. Leases not found: `Unavailable` (the worker claims again).
    async fn durable(&self, rows: &[PgRow], parent_id: &ParentId, unflushed: &Unflushed) -> StoreResult<()> {
        let claims: BTreeSet<Uuid> = rows.iter().map(|r| r.try_get("claim_id")).collect::<Result<_, _>>()?;
        let claims: Vec<Uuid> = claims.into_iter().collect();
        let found = sqlx::query(FLUSHED)
            .bind(&claims)
            .bind(parent_id.as_str())
            .bind(unflushed.metered_at)
            .execute(&self.pool)
            .await?
            .rows_affected();
        if found < claims.len() as u64 {
            return Err(StoreError::Unavailable(sqlx::Error::Protocol(format!(
                "{found} of the {} leases of a claim on {parent_id} were found after its commit: \
                 the commit was lost before its flush",
                claims.len()
            ))));
        }
        Ok(())
    }
}
