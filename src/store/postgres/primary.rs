//! Following the primary among the hosts of a multi-host URL while the
//! service runs (a failover: Multi-AZ, Patroni, pg_auto_failover).
//!
//! `follow` watches the host in use, on a connection of its own: once a
//! second, and at once when a statement anywhere in this process lost its
//! connection or met a read-only host (`store::error::DATABASE_LOST`).
//! When the host no longer answers, or answers read-only, it searches the
//! hosts in order for a writable one (`Hosts::pick`), points the pool at it
//! (`Pool::set_connect_options`), and retires every connection opened
//! before (`keeps`, the pool's `before_acquire`). The work listener
//! connects again too (`renewed`). Meanwhile statements fail as
//! unavailable: 503 with `Retry-After`, never 500, and a read-only answer
//! is never retried on the same host. With one host (a managed database's
//! DNS name, which a failover moves), the search is a new connection to
//! that name.

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnectionMetadata;
use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection as _, PgConnection, PgPool};
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
    /// Counts the times the pool's connections were renewed, on another
    /// host or the same one back (the work listener connects again).
    renewed: watch::Sender<u64>,
}

impl Primary {
    pub fn new(hosts: Hosts, current: String) -> Self {
        Self {
            hosts,
            current: Mutex::new(current),
            retire_before: Mutex::new(None),
            problem: Mutex::new(None),
            renewed: watch::Sender::new(0),
        }
    }

    /// Whether there is anything to follow: a writable host wanted (one
    /// host too: behind one DNS name, a managed failover moves the name).
    pub fn follows(&self) -> bool {
        self.hosts.read_write
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

    /// Changes each time the pool's connections are renewed.
    pub fn renewed(&self) -> watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    /// Watches the host in use and moves `pool` to the writable host when it
    /// is lost (see the module comment). `options` makes a one-host URL into
    /// the pool's connect options. The check runs on a connection of its
    /// own, so a pool busy with requests never looks like a lost host. Runs
    /// for the life of the pool.
    pub async fn follow(&self, pool: PgPool, options: impl Fn(&str) -> anyhow::Result<PgConnectOptions> + Send) {
        let current = self.current.lock().expect("host lock").clone();
        let mut watch = match options(&current) {
            Ok(options) => PgConnection::connect_with(&options).await.ok(),
            Err(_) => None,
        };
        loop {
            tokio::select! {
                _ = DATABASE_LOST.notified() => {}
                _ = tokio::time::sleep(CHECK_EVERY) => {}
            }
            if pool.is_closed() {
                return;
            }
            let read_only_seen = READ_ONLY_SEEN.swap(false, Ordering::Relaxed);
            if let Some(conn) = watch.as_mut() {
                if !read_only_seen && writable(conn).await {
                    self.set_problem(None);
                    continue;
                }
                watch = None;
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
            let connected = match options(&found) {
                Ok(options) => PgConnection::connect_with(&options)
                    .await
                    .map(|conn| (conn, options))
                    .map_err(anyhow::Error::from),
                Err(err) => Err(err),
            };
            let (conn, found_options) = match connected {
                Ok(connected) => connected,
                Err(err) => {
                    self.set_problem(Some(format!("{}: {err:#}", Hosts::host_of(&found))));
                    continue;
                }
            };
            let moved = found != *self.current.lock().expect("host lock");
            if moved {
                pool.set_connect_options(found_options);
                *self.current.lock().expect("host lock") = found;
            }
            // Every connection opened so far is on the old host, or came
            // back broken or read-only: none is handed out again, and the
            // work listener connects again.
            *self.retire_before.lock().expect("retire lock") = Some(Instant::now());
            self.renewed.send_modify(|n| *n += 1);
            if moved {
                tracing::warn!(
                    host = self.host(),
                    "following the primary: the ledger is on another host now"
                );
            } else if self.problem().is_some() {
                tracing::info!(host = self.host(), "the database host answers as writable again");
            }
            watch = Some(conn);
            self.set_problem(None);
        }
    }

    fn set_problem(&self, why: Option<String>) {
        *self.problem.lock().expect("problem lock") = why;
    }
}

/// Whether the host answers on `conn` and accepts writes.
async fn writable(conn: &mut PgConnection) -> bool {
    let check = sqlx::raw_sql(WRITABLE).fetch_one(conn);
    match tokio::time::timeout(CHECK_TIMEOUT, check).await {
        Ok(Ok(row)) => sqlx::Row::try_get::<bool, _>(&row, 0).unwrap_or(false),
        _ => false,
    }
}
