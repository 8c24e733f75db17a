//! Domain types and pure rules of the ledger: no I/O lives here.

pub mod admission;
pub mod allow_hosts;
pub mod budget;
pub mod events;
pub mod fingerprint;
pub mod ids;
pub mod model;
pub mod outcome;
pub mod projection;
pub mod queue;
pub mod reconcile;
pub mod redrive;
pub mod results;
pub mod scope;
pub mod state;
pub mod trace;
pub mod verdict;
pub mod webhook;
pub mod work;

pub use events::Changes;
pub use ids::{ParentId, QueueName, idempotency_key};
pub use model::*;
pub use queue::{Queue, QueueParents, Throughput};
pub use reconcile::{JobState, ReconcileJob, ReconcileReport, SweepReport};
pub use scope::QueueScope;
pub use state::{ChildState, ExpiredLease, Outcome, ParentState, PreviousAttempt};
pub use verdict::{Tolerance, Verdict};
pub use work::Work;
