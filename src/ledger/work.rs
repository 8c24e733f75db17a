//! Work that became claimable: what a statement that frees children tells
//! the claims waiting for them (here and, through `NOTIFY`, on other replicas).

use serde::{Deserialize, Serialize};

use super::{Parent, ParentId, ParentState, QueueName};

/// Children that became claimable: in `queue` (every queue when `None`), of
/// `parent` when it is known, `children` of them at most.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    #[serde(rename = "q", default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueName>,
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentId>,
    #[serde(rename = "n")]
    pub children: u64,
}

impl Work {
    /// `children` of one parent of `queue`.
    pub fn of_parent(queue: QueueName, parent: ParentId, children: u64) -> Self {
        Self {
            queue: Some(queue),
            parent: Some(parent),
            children,
        }
    }

    /// What a parent just registered or sealed makes claimable: its pending
    /// children, once it is decomposed.
    pub fn of_registered(parent: &Parent) -> Self {
        let children = match parent.state {
            ParentState::Active => parent.counts.pending.max(0) as u64,
            ParentState::Decomposing | ParentState::Complete => 0,
        };
        Self::of_parent(parent.queue.clone(), parent.parent_id.clone(), children)
    }

    /// `children` of the parents of `queue`.
    pub fn in_queue(queue: QueueName, children: u64) -> Self {
        Self {
            queue: Some(queue),
            parent: None,
            children,
        }
    }

    /// Up to `children` in each queue, wherever they are (expired leases).
    pub fn anywhere(children: u64) -> Self {
        Self {
            queue: None,
            parent: None,
            children,
        }
    }

    /// Unknown work: every waiter looks again (after a missed notification).
    pub fn unknown() -> Self {
        Self::anywhere(u64::MAX)
    }
}
