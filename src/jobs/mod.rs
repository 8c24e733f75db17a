//! Background loops every replica runs beside the HTTP server.

mod pruner;
mod reaper;
mod reconcile_jobs;
mod webhook_client;
mod webhooks;
mod work_listener;

pub use pruner::prune_complete_parents;
pub use reaper::reap_expired_leases;
pub use reconcile_jobs::{ReconcileJobOptions, work_reconcile_jobs};
pub use webhook_client::{ANSWER_BYTES, Resolve, SystemResolver};
pub use webhooks::{QUEUE_HEADER, WebhookSender, send_webhooks};
pub use work_listener::listen_for_work;
