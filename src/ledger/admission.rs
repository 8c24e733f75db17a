//! Claim admission: how many children a claim may take under its queue's and
//! its key's limits, when to come back when it may take none, and the
//! backoff of a child handed out again. The store reads the limits and what
//! is in flight under a lock and asks these rules.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ids::QueueName;

/// Limits on one queue or one flow key; `null` = no limit. (Shown inside
/// other objects: requests send `SetLimits`.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FlowLimits {
    /// Children with a live lease at most.
    #[schema(minimum = 0)]
    pub max_in_flight: Option<i64>,
    /// Children claimed per second (a token bucket refilled at this rate).
    #[schema(minimum = 0.001)]
    pub per_second: Option<f64>,
    /// The bucket's size: children claimable at once after a pause. Default:
    /// `per_second`, and at least 1.
    #[schema(minimum = 1)]
    pub burst: Option<f64>,
}

impl FlowLimits {
    pub fn any(&self) -> bool {
        self.max_in_flight.is_some() || self.per_second.is_some()
    }

    /// The bucket's size when a rate is set.
    pub fn bucket_size(&self) -> Option<f64> {
        self.per_second.map(|rate| self.burst.unwrap_or(rate.max(1.0)))
    }
}

/// One gate a claim passes: a queue's or a key's limits, what is in flight
/// under them now, and its bucket as last written.
#[derive(Debug, Clone, Copy, Default)]
pub struct Gate {
    pub limits: FlowLimits,
    pub in_flight: i64,
    /// The earliest expiry of a live lease under this gate.
    pub earliest_expiry: Option<DateTime<Utc>>,
    /// Tokens left when last written (`None`: a full bucket).
    pub tokens: Option<f64>,
    pub refilled_at: Option<DateTime<Utc>>,
}

impl Gate {
    /// Tokens in the bucket at `now` (`None` without a rate).
    pub fn tokens_at(&self, now: DateTime<Utc>) -> Option<f64> {
        let size = self.limits.bucket_size()?;
        let rate = self.limits.per_second?;
        let Some(tokens) = self.tokens else {
            return Some(size);
        };
        let elapsed = self
            .refilled_at
            .map(|at| (now - at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6)
            .unwrap_or(f64::MAX)
            .max(0.0);
        Some((tokens + elapsed * rate).min(size))
    }

    /// How many children this gate lets a claim take at `now`.
    pub fn room(&self, now: DateTime<Utc>) -> i64 {
        let slots = self
            .limits
            .max_in_flight
            .map(|max| (max - self.in_flight).max(0))
            .unwrap_or(i64::MAX);
        let tokens = self
            .tokens_at(now)
            .map(|t| t.floor().max(0.0) as i64)
            .unwrap_or(i64::MAX);
        slots.min(tokens)
    }

    /// When this gate will let one more child through, if it lets none now:
    /// the next token, or the earliest lease to run out (an outcome or a
    /// release may free a slot sooner).
    pub fn next_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let mut at: Option<DateTime<Utc>> = None;
        if let (Some(tokens), Some(rate)) = (self.tokens_at(now), self.limits.per_second)
            && tokens < 1.0
        {
            let wait = ((1.0 - tokens) / rate * 1e6).ceil() as i64;
            at = Some(now + Duration::microseconds(wait));
        }
        if let Some(max) = self.limits.max_in_flight
            && self.in_flight >= max
        {
            let expiry = self.earliest_expiry.unwrap_or(now).max(now);
            at = Some(at.map_or(expiry, |a| a.max(expiry)));
        }
        at
    }

    /// The bucket after `taken` children at `now`: what to write back.
    pub fn spent(&self, taken: i64, now: DateTime<Utc>) -> Option<f64> {
        self.tokens_at(now).map(|t| t - taken as f64)
    }
}

/// A queue's limits, and what is used under them now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueLimits {
    pub queue: QueueName,
    /// The queue's own limits, over all its parents.
    #[serde(flatten)]
    pub limits: FlowLimits,
    /// The limits of each flow key of the queue, unless the key has its own.
    pub per_key: FlowLimits,
    /// Children of the queue with a live lease now.
    pub in_flight: i64,
    /// Tokens left in the queue's bucket now; `null` without `per_second`.
    pub tokens: Option<f64>,
    /// Keys with children in flight, or with limits of their own (most in
    /// flight first, 100 at most).
    pub keys: Vec<KeyLimits>,
}

/// One flow key's limits, and what is used under them now.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KeyLimits {
    pub flow_key: String,
    /// The limits that apply to the key: its own, or the queue's `per_key`.
    #[serde(flatten)]
    pub limits: FlowLimits,
    /// Whether the key has limits of its own (`PUT .../keys/{flow_key}/limits`).
    pub overridden: bool,
    /// Children of the key with a live lease now.
    pub in_flight: i64,
    /// Tokens left in the key's bucket now; `null` without `per_second`.
    pub tokens: Option<f64>,
}

/// What one flow key holds in flight now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct KeyUsage {
    pub flow_key: String,
    /// Its children with a live lease.
    pub in_flight: i64,
}

/// The order in which a queue's claims serve its parents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClaimOrder {
    /// Least recently served parent first: a small parent never waits
    /// behind a big one (the default).
    #[default]
    Fair,
    /// Oldest parent first, a short claim filled from the next: parents
    /// complete in the order they came.
    Oldest,
}

impl ClaimOrder {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fair => "fair",
            Self::Oldest => "oldest",
        }
    }
}

/// A queue's settings.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct QueueSettings {
    pub queue: QueueName,
    pub order: ClaimOrder,
}

/// When and against what a parent's children may be claimed, as registered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ParentAdmission {
    /// No child of the parent is claimable before this moment; `null`: none.
    pub not_before: Option<DateTime<Utc>>,
    /// The tenant, account or remote host its children count against (the
    /// queue's per-key limits); `null`: none.
    #[schema(example = "tenant-42")]
    pub flow_key: Option<String>,
    /// How long a child handed out again waits first; `null`: no wait.
    pub retry_backoff: Option<RetryBackoff>,
}

/// Whether `key` is a flow key: 1-128 of `[A-Za-z0-9._:-]`; why not.
pub fn check_flow_key(key: &str) -> Result<(), &'static str> {
    if key.is_empty() || key.len() > 128 {
        return Err("must be 1-128 characters");
    }
    if !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b)) {
        return Err("may hold only A-Z, a-z, 0-9, '.', '_', ':' and '-'");
    }
    if super::ids::only_dots(key) {
        return Err("is made only of dots: clients and proxies that normalise paths rewrite such a segment");
    }
    Ok(())
}

/// Which gate held a claim back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldBy {
    Queue,
    Key,
}

/// What admission lets one lane claim take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    pub allowed: i64,
    /// Set when a limit allowed fewer than wanted.
    pub held_by: Option<HeldBy>,
    /// When a claim held back to nothing may find room.
    pub next_available_at: Option<DateTime<Utc>>,
}

/// How many of `want` children the queue's and the key's gates let through at `now`.
pub fn admit(want: i64, queue: Option<&Gate>, key: Option<&Gate>, now: DateTime<Utc>) -> Admitted {
    let queue_room = queue.map_or(i64::MAX, |g| g.room(now));
    let key_room = key.map_or(i64::MAX, |g| g.room(now));
    let allowed = want.min(queue_room).min(key_room).max(0);
    let held_by = if allowed >= want {
        None
    } else if queue_room <= key_room {
        Some(HeldBy::Queue)
    } else {
        Some(HeldBy::Key)
    };
    let next_available_at = if allowed == 0 && want > 0 {
        [queue, key]
            .into_iter()
            .flatten()
            .filter(|g| g.room(now) == 0)
            .filter_map(|g| g.next_at(now))
            .max()
    } else {
        None
    };
    Admitted {
        allowed,
        held_by,
        next_available_at,
    }
}

/// The backoff of a child handed out again: exponential from `initial_seconds`,
/// doubling per attempt, at most `max_seconds`, with full jitter (a random
/// delay between 0 and that).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBackoff {
    #[schema(minimum = 0, maximum = 86400)]
    pub initial_seconds: f64,
    #[schema(minimum = 0, maximum = 86400)]
    pub max_seconds: f64,
}

impl RetryBackoff {
    /// The longest delay after `attempts` attempts ended (1 = the first):
    /// what `store::sql::backoff_seconds` computes before its jitter.
    pub fn ceiling(&self, attempts: i32) -> f64 {
        let doublings = (attempts.max(1) - 1).min(30);
        (self.initial_seconds * f64::from(1u32 << doublings)).min(self.max_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + seconds, 0).unwrap()
    }

    #[test]
    fn a_cap_lets_through_what_is_free() {
        let gate = Gate {
            limits: FlowLimits {
                max_in_flight: Some(10),
                ..FlowLimits::default()
            },
            in_flight: 7,
            earliest_expiry: Some(at(30)),
            ..Gate::default()
        };
        assert_eq!(admit(5, Some(&gate), None, at(0)).allowed, 3);
        let full = Gate { in_flight: 10, ..gate };
        let held = admit(5, Some(&full), None, at(0));
        assert_eq!((held.allowed, held.held_by), (0, Some(HeldBy::Queue)));
        assert_eq!(held.next_available_at, Some(at(30)));
    }

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let gate = Gate {
            limits: FlowLimits {
                per_second: Some(2.0),
                burst: Some(5.0),
                ..FlowLimits::default()
            },
            tokens: Some(0.5),
            refilled_at: Some(at(0)),
            ..Gate::default()
        };
        assert_eq!(gate.room(at(0)), 0);
        assert_eq!(
            admit(3, None, Some(&gate), at(0)).next_available_at,
            Some(at(0) + Duration::milliseconds(250))
        );
        assert_eq!(gate.room(at(1)), 2);
        assert_eq!(gate.room(at(100)), 5);
        assert_eq!(gate.spent(2, at(1)), Some(0.5));
        let fresh = Gate { tokens: None, ..gate };
        assert_eq!(fresh.room(at(0)), 5);
    }

    #[test]
    fn the_tighter_gate_holds_the_claim() {
        let queue = Gate {
            limits: FlowLimits {
                max_in_flight: Some(100),
                ..FlowLimits::default()
            },
            in_flight: 10,
            ..Gate::default()
        };
        let key = Gate {
            limits: FlowLimits {
                max_in_flight: Some(2),
                ..FlowLimits::default()
            },
            in_flight: 1,
            ..Gate::default()
        };
        let admitted = admit(50, Some(&queue), Some(&key), at(0));
        assert_eq!((admitted.allowed, admitted.held_by), (1, Some(HeldBy::Key)));
        assert_eq!(admit(50, None, None, at(0)).allowed, 50);
    }

    #[test]
    fn backoff_doubles_up_to_its_ceiling() {
        let backoff = RetryBackoff {
            initial_seconds: 1.0,
            max_seconds: 300.0,
        };
        assert_eq!(backoff.ceiling(1), 1.0);
        assert_eq!(backoff.ceiling(4), 8.0);
        assert_eq!(backoff.ceiling(20), 300.0);
        assert_eq!(backoff.ceiling(i32::MAX), 300.0);
    }
}
