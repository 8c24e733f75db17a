//! What live views are told: which parents and queues changed (here, and
//! through `NOTIFY` from other replicas), and the event ids a stream resumes
//! from (`Last-Event-ID`).
//!
//! Event ids are built from what the database holds, not from a counter in
//! one process, so a stream resumes on any replica, after any restart:
//! - a parent stream's `completed` event is named by the parent's incarnation
//!   (`created_at`) and its `completed_at`; a client that resumes with any
//!   other id is sent that `completed` again, so none is ever missed;
//! - a queue stream's ids carry the `completed_at` of the last completion it
//!   sent; a resume replays the queue's completions from a little before it
//!   (`REPLAY_MARGIN`), since a completion stamped earlier may commit later.

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use super::{Parent, ParentId, QueueName};

/// How long before the last completion a resumed queue stream replays
/// from: a transaction's clock is read at its start, so a completion may
/// commit after one stamped later. A completion within it may come twice.
pub const REPLAY_MARGIN_MICROS: i64 = 5_000_000;

/// Parents and queues whose live view may have changed; `all` when what
/// changed is not known (expired leases, a missed notification), and
/// `every_queue` when parents changed whose queues are not known here (an
/// outcome names its parent only): every queue's view is read again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Changes {
    #[serde(rename = "p", default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<ParentId>,
    #[serde(rename = "q", default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueName>,
    #[serde(rename = "e", default, skip_serializing_if = "std::ops::Not::not")]
    pub every_queue: bool,
    /// `queues` were paused or resumed.
    #[serde(rename = "u", default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    #[serde(rename = "a", default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

impl Changes {
    /// Everything may have changed.
    pub fn everything() -> Self {
        Self {
            all: true,
            ..Self::default()
        }
    }

    /// Parents whose queues are not known here.
    pub fn of_parents(parents: impl IntoIterator<Item = ParentId>) -> Self {
        let mut changes = Self::default();
        for parent in parents {
            if !changes.parents.contains(&parent) {
                changes.parents.push(parent);
            }
        }
        changes.every_queue = !changes.parents.is_empty();
        changes
    }

    /// A queue paused or resumed.
    pub fn of_pause(queue: QueueName) -> Self {
        Self {
            queues: vec![queue],
            paused: true,
            ..Self::default()
        }
    }

    /// One parent of a known queue.
    pub fn of_parent_in(parent: ParentId, queue: QueueName) -> Self {
        Self {
            parents: vec![parent],
            queues: vec![queue],
            ..Self::default()
        }
    }

    pub fn of_queue(queue: QueueName) -> Self {
        Self {
            queues: vec![queue],
            ..Self::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.all && self.parents.is_empty() && self.queues.is_empty()
    }

    /// Adds `other` to these, keeping each name once.
    pub fn merge(&mut self, other: Changes) {
        self.all |= other.all;
        self.every_queue |= other.every_queue;
        self.paused |= other.paused;
        for parent in other.parents {
            if !self.parents.contains(&parent) {
                self.parents.push(parent);
            }
        }
        for queue in other.queues {
            if !self.queues.contains(&queue) {
                self.queues.push(queue);
            }
        }
    }
}

fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// The id of a parent stream's `snapshot` and `progress` events: its
/// incarnation and how many children are terminal.
pub fn parent_event_id(parent: &Parent) -> String {
    let c = &parent.counts;
    format!("{}.{}", micros(parent.created_at), c.processed + c.failed + c.skipped)
}

/// The id of a parent's `completed` event; `None` while it is open.
pub fn completed_event_id(parent: &Parent) -> Option<String> {
    parent
        .completed_at
        .map(|at| format!("{}.c{}", micros(parent.created_at), micros(at)))
}

/// Whether a parent stream resumed from `last_event_id` still owes the
/// client this parent's `completed` event.
pub fn owes_completed(parent: &Parent, last_event_id: Option<&str>) -> bool {
    match completed_event_id(parent) {
        Some(id) => last_event_id != Some(id.as_str()),
        None => false,
    }
}

/// The id of a queue stream's events: the `completed_at` of the last
/// completion it sent (`None`: none yet).
pub fn queue_event_id(last_completed: Option<DateTime<Utc>>) -> String {
    format!("q{}", last_completed.map_or(0, micros))
}

/// Where a queue stream resumed from `last_event_id` replays completions
/// from (exclusive); `None` when the id is not one of a queue stream's (then
/// nothing is replayed: the client starts from the snapshot).
pub fn queue_replay_from(last_event_id: &str) -> Option<DateTime<Utc>> {
    let micros: i64 = last_event_id.strip_prefix('q')?.parse().ok()?;
    if micros <= 0 {
        return Some(DateTime::<Utc>::UNIX_EPOCH);
    }
    Utc.timestamp_micros(micros.saturating_sub(REPLAY_MARGIN_MICROS))
        .single()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::{Counts, ExpiredLease, ParentState};

    fn parent(completed: Option<i64>) -> Parent {
        Parent {
            parent_id: ParentId::parse("P-1").unwrap(),
            queue: QueueName::parse("q").unwrap(),
            state: if completed.is_some() {
                ParentState::Complete
            } else {
                ParentState::Active
            },
            complete: completed.is_some(),
            verdict: completed.map(|_| crate::ledger::Verdict::Succeeded),
            tolerated_failures: None,
            redrive_of: None,
            counts: Counts {
                total: 3,
                processed: 2,
                failed: 1,
                ..Counts::default()
            },
            max_attempts: None,
            expired_lease: ExpiredLease::Retry,
            priority: 0,
            webhook_url: None,
            admission: Default::default(),
            created_at: Utc.timestamp_micros(1_000).unwrap(),
            decomposed_at: None,
            completed_at: completed.map(|m| Utc.timestamp_micros(m).unwrap()),
            last_progress_at: None,
            payload: None,
        }
    }

    #[test]
    fn a_completed_event_is_owed_unless_it_was_the_last_one_seen() {
        let open = parent(None);
        assert!(!owes_completed(&open, None));
        let done = parent(Some(5_000));
        assert_eq!(completed_event_id(&done).as_deref(), Some("1000.c5000"));
        assert!(owes_completed(&done, None));
        assert!(owes_completed(&done, Some(&parent_event_id(&done))));
        assert!(owes_completed(&done, Some("999.c5000")), "another incarnation's");
        assert!(!owes_completed(&done, Some("1000.c5000")));
    }

    #[test]
    fn a_queue_stream_replays_from_a_margin_before_its_last_completion() {
        assert_eq!(queue_event_id(None), "q0");
        let at = Utc.timestamp_micros(10_000_000).unwrap();
        let id = queue_event_id(Some(at));
        assert_eq!(id, "q10000000");
        assert_eq!(
            queue_replay_from(&id),
            Some(Utc.timestamp_micros(10_000_000 - REPLAY_MARGIN_MICROS).unwrap())
        );
        assert_eq!(queue_replay_from("q0"), Some(DateTime::<Utc>::UNIX_EPOCH));
        assert_eq!(queue_replay_from("1000.c5000"), None);
        assert_eq!(queue_replay_from("qx"), None);
    }

    #[test]
    fn changes_merge_each_name_once() {
        let p = ParentId::parse("P-1").unwrap();
        let q = QueueName::parse("q").unwrap();
        let mut changes = Changes::of_parent_in(p.clone(), q.clone());
        changes.merge(Changes::of_parent_in(p.clone(), q.clone()));
        changes.merge(Changes::of_queue(q.clone()));
        assert_eq!(changes.parents, vec![p.clone()]);
        assert_eq!(changes.queues, vec![q]);
        assert!(!changes.all && !changes.every_queue);
        let text = serde_json::to_string(&changes).unwrap();
        assert_eq!(text, r#"{"p":["P-1"],"q":["q"]}"#);
        assert_eq!(serde_json::from_str::<Changes>(&text).unwrap(), changes);
        changes.merge(Changes::of_parents([p.clone(), p]));
        assert_eq!(changes.parents.len(), 1);
        assert!(changes.every_queue, "a parent of unknown queue dirties every queue");
        let text = serde_json::to_string(&changes).unwrap();
        assert_eq!(serde_json::from_str::<Changes>(&text).unwrap(), changes);
        assert!(Changes::default().is_empty());
    }
}
