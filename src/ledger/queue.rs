//! A queue as dashboards read it: what its parents hold, from their
//! projections, so the cost does not grow with its children.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Counts;
use super::ids::QueueName;

/// A queue's summary for dashboards (`GET /v1/queues`): what its parents hold,
/// read from their projections, so the cost does not grow with its children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Queue {
    pub queue: QueueName,
    /// Whether the queue is paused (`POST /v1/queues/{queue}/pause`): its
    /// claims, queue or parent, hand out nothing until it is resumed.
    pub paused: bool,
    pub parents: QueueParents,
    /// Its parents' children, by state.
    pub children: Counts,
    /// When its longest-waiting pending child became pending (registered,
    /// released, expired or retried); `null` when none is pending.
    pub oldest_pending_since: Option<DateTime<Utc>>,
    pub throughput: Throughput,
    /// Its flow keys with children in flight now, most first (20 at most;
    /// `GET /v1/queues/{queue}/limits` shows their limits). Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flow_keys: Vec<super::admission::KeyUsage>,
}

/// A queue's parents by state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct QueueParents {
    pub decomposing: i64,
    pub active: i64,
    pub complete: i64,
}

/// Outcomes recorded over the last minute, from the database (the same on
/// every replica): this minute's count plus the previous minute's, weighted
/// by how much of it the last 60 seconds still cover.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Throughput {
    pub processed_per_minute: f64,
    pub failed_per_minute: f64,
}

impl Throughput {
    /// `now` and `before` are counts of this minute and the previous one;
    /// `seconds` how far into this minute the clock is.
    pub fn over_last_minute(now: (i64, i64), before: (i64, i64), seconds: f64) -> Self {
        let weight = (1.0 - seconds.clamp(0.0, 60.0) / 60.0).max(0.0);
        Self {
            processed_per_minute: now.0 as f64 + before.0 as f64 * weight,
            failed_per_minute: now.1 as f64 + before.1 as f64 * weight,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throughput_slides_over_the_minute_boundary() {
        let at_start = Throughput::over_last_minute((0, 0), (600, 6), 0.0);
        assert_eq!(at_start.processed_per_minute, 600.0);
        let half = Throughput::over_last_minute((300, 0), (600, 6), 30.0);
        assert_eq!(half.processed_per_minute, 600.0);
        assert_eq!(half.failed_per_minute, 3.0);
        let end = Throughput::over_last_minute((600, 1), (600, 6), 60.0);
        assert_eq!(end.processed_per_minute, 600.0);
        assert_eq!(end.failed_per_minute, 1.0);
    }
}
