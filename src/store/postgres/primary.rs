//! Following the primary among the hosts of a multi-host URL while the
//! service runs (a failover: Multi-AZ, Patroni, pg_auto_failover).
//!
//! `follow` watches the host in use: once a second, and at once when a
//! statement anywhere in this process lost its connection or met a
//! read-only host (`store::error::DATABASE_LOST`). When the host no longer
//! answers, or answers read-only, it searches the hosts in order for a
//! writable one (`Hosts::pick`), points the pool at it
//! (`Pool::set_connect_options`), and retires every connection opened
//! before (`keeps`, the pool's `before_acquire`). The work listener moves
//! too (`moved`). Meanwhile statements fail as unavailable: 503 with
//! `Retry-After`, never 500, and a read-only answer is never retried on
//! the same host. A URL with one host has nothing to search: sqlx's pool
//! reconnects to it by itself.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::PgPool;
use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::watch;

use super::hosts::{Hosts, WRITABLE};
use crate::store::error::{DATABASE_LOST, READ_ONLY_SEEN};

/// How often the host in use is checked when nothing failed.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// How long the check may take before the host counts as lost.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The host in use, and why the store cannot be used now (for `/readyz`).
#[derive(Debug)]
pub(super) struct Primary {
    hosts: Hosts,
    /// The one-host URL the pool connects to.
    current: Mutex<String>,
    /// Connections opened before this are not handed out again.
    retire_before: Mutex<Option<Instant>>,
    /// Why no writable host is in use, while the search goes on.
    problem: Mutex<Option<String>>,
    /// Counts the moves to another host (the work listener follows).
    moved: watch::Sender<u64>,
}

impl Primary {
    pub fn new(hosts: Hosts, current: String) -> Self {
        Self {
            hosts,
            current: Mutex::new(current),
            retire_before: Mutex::new(None),
            problem: Mutex::new(None),
            moved: watch::Sender::new(0),
        }
    }

    /// Whether there is anything to follow: several hosts, a writable one wanted.
    pub fn follows(&self) -> bool {
        self.hosts.urls.len() > 1 && self.hosts.read_write
    }

    /// `host:port` in use now.
    pub fn host(&self) -> String {
        Hosts::host_of(&self.current.lock().expect("host lock")).to_owned()
    }

    /// Why the store cannot be used now; `None` while on a writable host.
    pub fn problem(&self) -> Option<String> {
        self.problem.lock().expect("problem lock").clone()
    }

    /// Whether a pooled connection may be handed out: it was opened on the
    /// host in use now.
    pub fn keeps(&self, meta: &PoolConnectionMetadata) -> bool {
        match *self.retire_before.lock().expect("retire lock") {
            Some(since) => meta.age <= since.elapsed(),
            None => true,
        }
    }

    /// Changes each time the pool moves to another host.
    pub fn moved(&self) -> watch::Receiver<u64> {
        self.moved.subscribe()
    }

    /// Watches the host in use and moves `pool` to the writable host when it
    /// is lost (see the module comment). `options` makes a one-host URL into
    /// the pool's connect options. Runs for the life of the pool.
    pub async fn follow(&self, pool: PgPool, options: impl Fn(&str) -> anyhow::Result<PgConnectOptions> + Send) {
        loop {
            tokio::select! {
                _ = DATABASE_LOST.notified() => {}
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            if pool.is_closed() {
                return;
            }
            let read_only_seen = READ_ONLY_SEEN.swap(false, Ordering::Relaxed);
            if !read_only_seen && writable(&pool).await {
                self.set_problem(None);
                continue;
            }
            let found = match self.hosts.pick().await {
                Ok(url) => url,
                Err(err) => {
                    let why = format!("{err:#}");
                    if self.problem().as_deref() != Some(why.as_str()) {
                        tracing::warn!(
                            error = why,
                            "the database host in use is lost; searching for the primary"
                        );
                    }
                    self.set_problem(Some(why));
                    continue;
                }
            };
            let moved = found != *self.current.lock().expect("host lock");
            if moved {
                match options(&found) {
                    Ok(options) => pool.set_connect_options(options),
                    Err(err) => {
                        self.set_problem(Some(format!("{err:#}")));
                        continue;
                    }
                }
                *self.current.lock().expect("host lock") = found;
            }
            // Every connection opened so far is on the old host, or came
            // back broken or read-only: none is handed out again.
            *self.retire_before.lock().expect("retire lock") = Some(Instant::now());
            if moved {
                self.moved.send_modify(|n| *n += 1);
                tracing::warn!(
                    host = self.host(),
                    "following the primary: the ledger is on another host now"
                );
            }
            self.set_problem(None);
        }
    }

    fn set_problem(&self, why: Option<String>) {
        *self.problem.lock().expect("problem lock") = why;
    }
}

/// Whether the pool's host answers and accepts writes.
async fn writable(pool: &PgPool) -> bool {
    let check = sqlx::raw_sql(WRITABLE).fetch_one(pool);
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(row)) => sqlx::Row::try_get::<bool, _>(&row, 0).unwrap_or(false),
        _ => false,
    }
}
