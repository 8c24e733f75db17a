//! Claim admission as the store runs it: inside a lane claim's transaction,
//! after its lane's turn, the limits of the lane's queue and flow key are
//! read and what is in flight under them is counted; the claim takes what
//! `ledger::admission::admit` allows, then spends the buckets and stamps its
//! key served. The count comes before the claim statement (SQLite; Postgres
//! where limits bind lately, see `Binding`) or after it, its own leases then
//! counted as its own (Postgres elsewhere): a claim that took more than it
//! may rolls back.
//!
//! Exact across replicas: a claim in a limited queue locks the queue's
//! `flow_limit` row before it counts (SQLite's writes take turns already),
//! so the count, a statement of its own after the lock, sees every claim
//! that came before it, committed. What is in flight is the sum of
//! `claim_lease.open` over leases that have not run out: an outcome, a
//! release or an expiry frees a slot without a write here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::backend::Row;
use super::backend::Transaction;
use super::statement::{Sql, Statement};
use super::{Store, StoreResult};
use crate::ledger::admission::{Admitted, ClaimOrder, FlowLimits, Gate, HeldBy, KeyLimits, QueueLimits, admit};
use crate::ledger::{QueueName, Work};

/// Takes a limited queue's turn: locks its row. The transaction's commit
/// then releases the row without waiting for its flush (on Postgres): the
/// claims of a limited queue take turns on it, and waiting for the disk
/// inside each turn kept them in single file for as long (limits that never
/// bind cost 0.85-0.88 of a burn-down without limits, against 0.90-0.91, in
/// a quick A/B; `benches/RESULTS.md`).
/// The claim is answered only once it is flushed (`Admission::unflushed`).
/// Another claim may count its lease before that: after a crash that lost
/// it, that claim took less than it could have, never more.
static LOCK_QUEUE: Sql = Sql::new(|d| {
    format!(
        "SELECT {} FROM flow_limit WHERE queue = $1 AND flow_key = ''{}",
        d.unflushed_commit.unwrap_or("1"),
        d.for_update
    )
});

/// The limits of queue `$1` and of its key `$2` (its own when it overrides
/// them, else the queue's per-key ones), their buckets, and what is in
/// flight under each now.
static GATES: Sql = Sql::new(|d| {
    format!(
        "SELECT q.max_in_flight, q.per_second, q.burst, q.tokens AS queue_tokens, q.refilled_at AS queue_refilled_at, \
             CASE WHEN k.overridden THEN k.max_in_flight ELSE q.key_max_in_flight END AS key_max_in_flight, \
             CASE WHEN k.overridden THEN k.per_second ELSE q.key_per_second END AS key_per_second, \
             CASE WHEN k.overridden THEN k.burst ELSE q.key_burst END AS key_burst, \
             k.tokens AS key_tokens, k.refilled_at AS key_refilled_at, \
             u.queue_in_flight, u.queue_expiry, u.key_in_flight, u.key_expiry, {now} AS now \
         FROM flow_limit q LEFT JOIN flow_limit k ON k.queue = q.queue AND k.flow_key = $2, \
             (SELECT coalesce(sum(l.open), 0) AS queue_in_flight, min(l.expires_at) AS queue_expiry, \
                  coalesce(sum(CASE WHEN l.flow_key = $2 THEN l.open ELSE 0 END), 0) AS key_in_flight, \
                  min(CASE WHEN l.flow_key = $2 THEN l.expires_at END) AS key_expiry \
              FROM claim_lease l WHERE l.queue = $1 AND l.expires_at > {now}) u \
         WHERE q.queue = $1 AND q.flow_key = ''",
        now = d.statement_now
    )
});

/// After a lane claim in queue `$1`: its own row (when `$2` is '') and
/// its key's row (`$3`; NULL: none) write their buckets (`$4` the queue's,
/// `$5` the key's; NULL: as they are), refilled at `$6` (never earlier than
/// they were: a bucket refills once for each moment); the key's row, or
/// the queue's own when `$7` (a lane without a key: those take their turn
/// as one key), is stamped served after every other row of the queue
/// (`Dialect::flow_served`).
static SPEND: Sql = Sql::new(|d| {
    format!(
        "UPDATE flow_limit SET \
             tokens = coalesce(CASE WHEN flow_key = '' THEN $4 ELSE $5 END, tokens), \
             refilled_at = CASE WHEN (CASE WHEN flow_key = '' THEN $4 ELSE $5 END) IS NULL OR refilled_at >= $6 \
                 THEN refilled_at ELSE $6 END, \
             served = CASE WHEN flow_key <> '' OR $7 THEN {} ELSE served END \
         WHERE queue = $1 AND (flow_key = $2 OR flow_key = $3)",
        d.flow_served
    )
});

/// A lane's place under its queue's limits: read by `Admission::read`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Admission {
    pub admitted: Option<Admitted>,
    queue: Option<Gate>,
    key: Option<Gate>,
    now: Option<DateTime<Utc>>,
    /// The queue has `flow_limit` rows: its keys take turns.
    flow_rows: bool,
    /// The transaction's commit will not wait for its flush (`LOCK_QUEUE`).
    unflushed: bool,
}

impl Admission {
    /// How many of `want` children a claim on a lane of `queue` (with
    /// `flow_key`) may take. `flow_rows` is what its lane's read said of the
    /// queue's own `flow_limit` row: none (`None`), or whether the queue has
    /// limits. Locks the queue's turn when it has. `own`: children this
    /// transaction leased already under the queue (a claim admitted after it
    /// took them), counted by the read but not against the claim.
    pub async fn read(
        tx: &mut dyn Transaction,
        queue: &str,
        flow_key: Option<&str>,
        flow_rows: Option<bool>,
        want: i64,
        own: i64,
    ) -> StoreResult<Self> {
        if flow_rows != Some(true) {
            return Ok(Self {
                flow_rows: flow_rows.is_some(),
                ..Self::default()
            });
        }
        let d = tx.dialect();
        tx.execute(Statement::new(LOCK_QUEUE.of(d)).text(queue)).await?;
        let unflushed = d.unflushed_commit.is_some();
        let rows = tx
            .fetch(Statement::new(GATES.of(d)).text(queue).text(flow_key.unwrap_or("")))
            .await?;
        let Some(row) = rows.first() else {
            return Ok(Self {
                flow_rows: true,
                unflushed,
                ..Self::default()
            });
        };
        let queue_gate = gate_of(row, "", "queue_", own)?;
        let key_gate = gate_of(row, "key_", "key_", own)?;
        let now = row.time("now")?;
        let queue_gate = queue_gate.limits.any().then_some(queue_gate);
        let key_gate = flow_key.and(key_gate.limits.any().then_some(key_gate));
        Ok(Self {
            admitted: Some(admit(want, queue_gate.as_ref(), key_gate.as_ref(), now)),
            queue: queue_gate,
            key: key_gate,
            now: Some(now),
            flow_rows: true,
            unflushed,
        })
    }

    /// When a limited queue's claim was let through: the time its buckets
    /// were read at, what its lease says it was made at.
    pub fn admitted_at(&self) -> Option<DateTime<Utc>> {
        self.now
    }

    /// Whether the transaction's commit will not wait for its flush: what it
    /// answers must wait for it (Postgres' `durable`).
    pub fn unflushed(&self) -> bool {
        self.unflushed
    }

    /// How many children the claim may take.
    pub fn allowed(&self, want: i64) -> i64 {
        self.admitted.map_or(want, |a| a.allowed)
    }

    /// Whether a rate meters the claim: its lease must say when the bucket
    /// was read (`admitted_at`).
    pub fn metered(&self) -> bool {
        [&self.queue, &self.key]
            .into_iter()
            .flatten()
            .any(|gate| gate.limits.per_second.is_some())
    }

    /// After the claim took `taken` children: spends the buckets, and stamps
    /// the lane's key (or, for a lane without one, its queue's own row)
    /// served, in one statement.
    pub async fn spend(
        &self,
        tx: &mut dyn Transaction,
        queue: &str,
        flow_key: Option<&str>,
        taken: i64,
    ) -> StoreResult<()> {
        let spent = |gate: &Option<Gate>| match (gate, self.now) {
            (Some(gate), Some(now)) if taken > 0 => gate.spent(taken, now),
            _ => None,
        };
        let queue_tokens = spent(&self.queue);
        let keyless = self.flow_rows && flow_key.is_none();
        let own_row = queue_tokens.is_some() || keyless;
        if !own_row && flow_key.is_none() {
            return Ok(());
        }
        let d = tx.dialect();
        tx.execute(
            Statement::new(SPEND.of(d))
                .text(queue)
                .text(own_row.then_some(""))
                .text(flow_key)
                .float(queue_tokens)
                .float(spent(&self.key))
                .time(self.now)
                .bool(keyless),
        )
        .await?;
        Ok(())
    }
}

/// Queue `$1`'s own row, with the database clock.
static QUEUE_ROW: Sql = Sql::new(|d| {
    format!(
        "SELECT max_in_flight, per_second, burst, key_max_in_flight, key_per_second, key_burst, tokens, refilled_at, \
             (SELECT coalesce(sum(l.open), 0) FROM claim_lease l WHERE l.queue = $1 AND l.expires_at > {now}) \
                 AS in_flight, \
             {now} AS now \
         FROM flow_limit WHERE queue = $1 AND flow_key = ''",
        now = d.now
    )
});

/// Queue `$1`'s keys with children in flight or limits of their own (key
/// `$2` alone when given), most in flight first, 100 at most.
static KEY_ROWS: Sql = Sql::new(|d| {
    format!(
        "SELECT k.flow_key, k.overridden, k.max_in_flight, k.per_second, k.burst, k.tokens, k.refilled_at, \
             coalesce(u.in_flight, 0) AS in_flight \
         FROM flow_limit k LEFT JOIN ( \
             SELECT l.flow_key, sum(l.open) AS in_flight FROM claim_lease l \
             WHERE l.queue = $1 AND l.expires_at > {now} AND l.flow_key IS NOT NULL GROUP BY l.flow_key) u \
             ON u.flow_key = k.flow_key \
         WHERE k.queue = $1 AND k.flow_key <> '' \
           AND CASE WHEN $2 = '' THEN k.overridden OR u.in_flight > 0 ELSE k.flow_key = $2 END \
         ORDER BY coalesce(u.in_flight, 0) DESC, k.flow_key LIMIT 100",
        now = d.now
    )
});

/// Sets queue `$1`'s own limits (`$2`-`$4`) and its keys' (`$5`-`$7`).
const SET_QUEUE: &str = "INSERT INTO flow_limit (queue, flow_key, max_in_flight, per_second, burst, \
        key_max_in_flight, key_per_second, key_burst) VALUES ($1, '', $2, $3, $4, $5, $6, $7) \
    ON CONFLICT (queue, flow_key) DO UPDATE SET max_in_flight = excluded.max_in_flight, \
        per_second = excluded.per_second, burst = excluded.burst, key_max_in_flight = excluded.key_max_in_flight, \
        key_per_second = excluded.key_per_second, key_burst = excluded.key_burst";

/// The queue's own row, as it is when it has none yet.
const QUEUE_ROW_EXISTS: &str = "INSERT INTO flow_limit (queue, flow_key) VALUES ($1, '') \
    ON CONFLICT (queue, flow_key) DO NOTHING";

/// Gives key `$2` of queue `$1` limits of its own (`$3`-`$5`; `$6` false:
/// none, it follows the queue's `per_key` again).
const SET_KEY: &str = "INSERT INTO flow_limit (queue, flow_key, max_in_flight, per_second, burst, overridden) \
    VALUES ($1, $2, $3, $4, $5, $6) \
    ON CONFLICT (queue, flow_key) DO UPDATE SET max_in_flight = excluded.max_in_flight, \
        per_second = excluded.per_second, burst = excluded.burst, overridden = excluded.overridden";

/// Whether queue `$1` has any limit: what its claims' lanes read to know
/// whether to take the queue's turn.
const MARK_LIMITED: &str = "UPDATE flow_limit SET limited = ( \
        max_in_flight IS NOT NULL OR per_second IS NOT NULL \
        OR key_max_in_flight IS NOT NULL OR key_per_second IS NOT NULL \
        OR EXISTS (SELECT 1 FROM flow_limit k WHERE k.queue = $1 AND k.flow_key <> '' AND k.overridden \
                   AND (k.max_in_flight IS NOT NULL OR k.per_second IS NOT NULL))) \
    WHERE queue = $1 AND flow_key = ''";

/// Queue `$1`'s order.
const ORDER: &str = "SELECT claim_order FROM queue_setting WHERE queue = $1";

/// Sets queue `$1`'s order.
const SET_ORDER: &str = "INSERT INTO queue_setting (queue, claim_order) VALUES ($1, $2) \
    ON CONFLICT (queue) DO UPDATE SET claim_order = excluded.claim_order";

/// The limits columns of a row, those of `prefix` (`""` or `"key_"`).
fn limits_of(row: &Row, prefix: &str) -> Result<FlowLimits, sqlx::Error> {
    Ok(FlowLimits {
        max_in_flight: row.opt_int32(&format!("{prefix}max_in_flight"))?.map(i64::from),
        per_second: row.opt_float(&format!("{prefix}per_second"))?,
        burst: row.opt_float(&format!("{prefix}burst"))?,
    })
}

/// A gate as `GATES` reads it: its limits' columns named with `limits`,
/// its usage's with `usage`; `own` of what is in flight is the claim's own.
fn gate_of(row: &Row, limits: &str, usage: &str, own: i64) -> Result<Gate, sqlx::Error> {
    Ok(Gate {
        limits: limits_of(row, limits)?,
        in_flight: row.int(&format!("{usage}in_flight"))? - own,
        earliest_expiry: row.opt_time(&format!("{usage}expiry"))?,
        tokens: row.opt_float(&format!("{usage}tokens"))?,
        refilled_at: row.opt_time(&format!("{usage}refilled_at"))?,
    })
}

impl Store {
    /// A queue's limits, what is in flight under them and its buckets now.
    pub async fn queue_limits(&self, queue: &QueueName) -> StoreResult<QueueLimits> {
        let row = self
            .fetch_optional(Statement::new(self.sql(&QUEUE_ROW)).text(queue.as_str()))
            .await?;
        let Some(row) = row else {
            return Ok(QueueLimits {
                queue: queue.clone(),
                limits: FlowLimits::default(),
                per_key: FlowLimits::default(),
                in_flight: self.in_flight(queue).await?,
                tokens: None,
                keys: Vec::new(),
            });
        };
        let now = row.time("now")?;
        let limits = limits_of(&row, "")?;
        let per_key = limits_of(&row, "key_")?;
        let gate = Gate {
            limits,
            tokens: row.opt_float("tokens")?,
            refilled_at: row.opt_time("refilled_at")?,
            ..Gate::default()
        };
        let keys = self.key_rows(queue, None, per_key, now).await?;
        Ok(QueueLimits {
            queue: queue.clone(),
            limits,
            per_key,
            in_flight: row.int("in_flight")?,
            tokens: gate.tokens_at(now),
            keys,
        })
    }

    /// Children of a queue with a live lease now.
    async fn in_flight(&self, queue: &QueueName) -> StoreResult<i64> {
        static IN_FLIGHT: Sql = Sql::new(|d| {
            format!(
                "SELECT coalesce(sum(open), 0) AS in_flight FROM claim_lease WHERE queue = $1 AND expires_at > {}",
                d.now
            )
        });
        let row = self
            .fetch_optional(Statement::new(self.sql(&IN_FLIGHT)).text(queue.as_str()))
            .await?;
        Ok(row.map(|row| row.int("in_flight")).transpose()?.unwrap_or(0))
    }

    /// The keys `KEY_ROWS` reads, their limits those of `per_key` unless their own.
    async fn key_rows(
        &self,
        queue: &QueueName,
        key: Option<&str>,
        per_key: FlowLimits,
        now: DateTime<Utc>,
    ) -> StoreResult<Vec<KeyLimits>> {
        let rows = self
            .db
            .fetch(
                Statement::new(self.sql(&KEY_ROWS))
                    .text(queue.as_str())
                    .text(key.unwrap_or("")),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let overridden = row.bool("overridden")?;
                let limits = if overridden { limits_of(row, "")? } else { per_key };
                let gate = Gate {
                    limits,
                    tokens: row.opt_float("tokens")?,
                    refilled_at: row.opt_time("refilled_at")?,
                    ..Gate::default()
                };
                Ok(KeyLimits {
                    flow_key: row.text("flow_key")?,
                    limits,
                    overridden,
                    in_flight: row.int("in_flight")?,
                    tokens: gate.tokens_at(now),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Sets a queue's own limits and its keys' (every replica's next claim honours them).
    pub async fn set_queue_limits(
        &self,
        queue: &QueueName,
        limits: FlowLimits,
        per_key: FlowLimits,
    ) -> StoreResult<()> {
        let mut tx = self.db.begin().await?;
        tx.execute(
            Statement::new(SET_QUEUE)
                .text(queue.as_str())
                .int32(limits.max_in_flight.map(|n| n as i32))
                .float(limits.per_second)
                .float(limits.burst)
                .int32(per_key.max_in_flight.map(|n| n as i32))
                .float(per_key.per_second)
                .float(per_key.burst),
        )
        .await?;
        tx.execute(Statement::new(MARK_LIMITED).text(queue.as_str())).await?;
        tx.commit().await?;
        self.signal_work(Work::in_queue(queue.clone(), 1));
        Ok(())
    }

    /// One key's limits: its own (`Some`), or the queue's `per_key` again (`None`).
    pub async fn set_key_limits(&self, queue: &QueueName, key: &str, limits: Option<FlowLimits>) -> StoreResult<()> {
        let mut tx = self.db.begin().await?;
        tx.execute(Statement::new(QUEUE_ROW_EXISTS).text(queue.as_str()))
            .await?;
        let own = limits.unwrap_or_default();
        tx.execute(
            Statement::new(SET_KEY)
                .text(queue.as_str())
                .text(key)
                .int32(own.max_in_flight.map(|n| n as i32))
                .float(own.per_second)
                .float(own.burst)
                .bool(limits.is_some()),
        )
        .await?;
        tx.execute(Statement::new(MARK_LIMITED).text(queue.as_str())).await?;
        tx.commit().await?;
        self.signal_work(Work::in_queue(queue.clone(), 1));
        Ok(())
    }

    /// One key's limits and what is used under them now.
    pub async fn key_limits(&self, queue: &QueueName, key: &str) -> StoreResult<KeyLimits> {
        let queue_limits = self.queue_limits(queue).await?;
        let now = Utc::now();
        let found = self.key_rows(queue, Some(key), queue_limits.per_key, now).await?;
        Ok(found.into_iter().next().unwrap_or_else(|| KeyLimits {
            flow_key: key.to_owned(),
            limits: queue_limits.per_key,
            overridden: false,
            in_flight: 0,
            tokens: Gate {
                limits: queue_limits.per_key,
                ..Gate::default()
            }
            .tokens_at(now),
        }))
    }

    /// A queue's order of parents.
    pub async fn claim_order(&self, queue: &QueueName) -> StoreResult<ClaimOrder> {
        let row = self.fetch_optional(Statement::new(ORDER).text(queue.as_str())).await?;
        Ok(match row.map(|row| row.text("claim_order")).transpose()?.as_deref() {
            Some("oldest") => ClaimOrder::Oldest,
            _ => ClaimOrder::Fair,
        })
    }

    /// Sets a queue's order of parents.
    pub async fn set_claim_order(&self, queue: &QueueName, order: ClaimOrder) -> StoreResult<()> {
        self.db
            .execute(Statement::new(SET_ORDER).text(queue.as_str()).text(order.as_str()))
            .await?;
        Ok(())
    }
}

/// The queues and keys whose limits held a claim back in the last second,
/// on this replica: a claim there is admitted before it takes children;
/// elsewhere it takes them first and is admitted after, so that the queue's
/// turn lasts only for the count (see `store::postgres::lane_claim`). A guess
/// about cost, never about what is allowed: either way the count decides.
#[derive(Debug, Default)]
pub(crate) struct Binding(Mutex<HashMap<(String, String), Instant>>);

impl Binding {
    /// How long a limit that held a claim back is taken to bind.
    const LATELY: Duration = Duration::from_secs(1);
    /// Entries kept at most before the old ones go.
    const MOST: usize = 10_000;

    /// Whether the queue's own limits (or its key's) held a claim back lately.
    pub fn lately(&self, queue: &str, flow_key: Option<&str>) -> bool {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let recent = |key: &str| {
            held.get(&(queue.to_owned(), key.to_owned()))
                .is_some_and(|at| at.elapsed() < Self::LATELY)
        };
        recent("") || flow_key.is_some_and(recent)
    }

    /// Notes that `held_by` held back a claim on a lane of `queue` with `flow_key`.
    pub fn note(&self, queue: &str, flow_key: Option<&str>, held_by: HeldBy) {
        let key = match held_by {
            HeldBy::Queue => "",
            HeldBy::Key => flow_key.unwrap_or(""),
        };
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() >= Self::MOST {
            held.retain(|_, at| at.elapsed() < Self::LATELY);
        }
        held.insert((queue.to_owned(), key.to_owned()), Instant::now());
    }
}
