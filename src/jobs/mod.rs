//! Background loops every replica runs beside the HTTP server.

mod reaper;
mod work_listener;

pub use reaper::reap_expired_leases;
pub use work_listener::listen_for_work;
