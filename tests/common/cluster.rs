//! Throwaway Postgres clusters for the tests that stop, kill or promote a
//! server: each in a temporary directory on a free port, never the shared
//! server. A primary with a streaming standby (`standby_of`) serves the
//! failover tests. When `initdb` cannot be found the tests fail under
//! `CI=true` or `LEDGER_REQUIRE_POSTGRES=1` and are skipped loudly otherwise.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::Connection;

use super::postgres_required;
use super::process::free_port;

/// The directory holding `initdb`, `pg_ctl` and `postgres`: the highest
/// `/usr/lib/postgresql/<version>/bin`, else wherever `initdb` is on `PATH`.
fn postgres_bin_dir() -> Option<PathBuf> {
    let version = |path: &Path| -> Vec<u64> {
        path.file_name()
            .and_then(|n| n.to_str())
            .map(|n| n.split('.').map(|part| part.parse().unwrap_or(0)).collect())
            .unwrap_or_default()
    };
    let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| dir.join("bin/initdb").is_file() && dir.join("bin/pg_ctl").is_file())
        .collect();
    installed.sort_by_key(|dir| version(dir));
    if let Some(dir) = installed.last() {
        return Some(dir.join("bin"));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A throwaway Postgres cluster in a temporary directory, on a free port.
/// Stopped (immediate) and removed on drop.
pub struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    /// initdb and postgres refuse to run as root: run them as `postgres`.
    as_postgres: bool,
}

impl PgCluster {
    /// Creates the cluster (not started). `None` (announced on stderr) when no
    /// Postgres installation is found and Postgres is not required.
    pub async fn init() -> Option<Self> {
        let Some(bin) = postgres_bin_dir() else {
            if postgres_required() {
                panic!(
                    "Postgres is required (LEDGER_REQUIRE_POSTGRES/CI) but no initdb was found \
                     in /usr/lib/postgresql/*/bin or on PATH"
                );
            }
            // Straight to stderr, past the test harness's capture: a skip is never silent.
            let _ = writeln!(
                std::io::stderr(),
                "\n*** initdb not found (/usr/lib/postgresql/*/bin, PATH): the tests with a server of their own are SKIPPED. \
                 Set LEDGER_REQUIRE_POSTGRES=1 to make that a failure. ***\n"
            );
            return None;
        };
        let cluster = Self::empty(bin);
        let data = cluster.data();
        cluster
            .run(
                "initdb",
                &["-D", &data, "--auth=trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
            )
            .await;
        Some(cluster)
    }

    /// A directory for a cluster and a free port, with nothing in it yet.
    fn empty(bin: PathBuf) -> Self {
        let dir = std::env::temp_dir().join(format!("child-ledger-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let cluster = Self {
            bin,
            dir,
            port: free_port(),
            as_postgres: running_as_root(),
        };
        if cluster.as_postgres {
            let chown = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&cluster.dir)
                .status()
                .expect("chown");
            assert!(chown.success(), "chown postgres {}", cluster.dir.display());
        }
        cluster
    }

    /// A streaming standby of this running cluster (`pg_basebackup -R`: it
    /// follows this one as its primary once started), not started.
    pub async fn standby_of(&self) -> Self {
        let standby = Self::empty(self.bin.clone());
        let port = self.port.to_string();
        standby
            .run(
                "pg_basebackup",
                &[
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-U",
                    "postgres",
                    "-D",
                    &standby.data(),
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                    "--checkpoint=fast",
                ],
            )
            .await;
        standby
    }

    /// Makes every commit wait for a standby's flush (`*`: any standby),
    /// or no longer (`''`), and waits until a standby is in that state.
    pub async fn synchronous_standbys(&self, names: &str) {
        let mut admin = self.connect("postgres").await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
        )))
        .execute(&mut admin)
        .await
        .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut admin)
            .await
            .unwrap();
        let wanted = if names.is_empty() { "async" } else { "sync" };
        let started = Instant::now();
        loop {
            let states: Vec<String> =
                sqlx::query_scalar("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")
                    .fetch_all(&mut admin)
                    .await
                    .unwrap();
            if states.iter().any(|s| s == wanted) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no {wanted} standby streaming within 30 s: {states:?}\n{}",
                self.server_log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the server as a lost host would be lost: SIGKILL to the
    /// postmaster and every backend, no shutdown checkpoint, nothing sent.
    pub fn kill(&self) {
        let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).expect("postmaster.pid");
        let pid = pid.lines().next().unwrap().trim().to_owned();
        let children = std::process::Command::new("pgrep")
            .args(["-P", &pid])
            .output()
            .expect("pgrep");
        let mut pids = vec![pid];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .split_whitespace()
                .map(str::to_owned),
        );
        let killed = std::process::Command::new("kill")
            .arg("-9")
            .args(&pids)
            .status()
            .expect("kill");
        assert!(killed.success(), "kill -9 {pids:?}");
    }

    /// Promotes a standby to primary, waiting until it accepts writes.
    pub async fn promote(&self) {
        self.run("pg_ctl", &["-D", &self.data(), "-w", "-t", "60", "promote"])
            .await;
    }

    pub fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    pub fn command(&self, program: &str) -> tokio::process::Command {
        let program = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = tokio::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            tokio::process::Command::new(program)
        };
        // The postgres user may not be allowed into the test's working directory.
        command.current_dir(&self.dir).kill_on_drop(true);
        command
    }

    pub async fn run(&self, program: &str, args: &[&str]) {
        let out = self.command(program).args(args).output().await.expect(program);
        assert!(
            out.status.success(),
            "{program} {args:?} failed ({}):\n{}{}\nserver log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.server_log()
        );
    }

    /// Starts the server and waits until it accepts connections.
    pub async fn start(&self) {
        let options = format!(
            "-k {} -c listen_addresses=127.0.0.1 -p {} -c fsync=off",
            self.dir.display(),
            self.port
        );
        let log = self.dir.join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-o",
                &options,
                "-w",
                "-t",
                "60",
                "start",
            ],
        )
        .await;
    }

    /// Stops the server (`fast`: sessions are ended, transactions rolled back).
    pub async fn stop(&self, mode: &str) {
        self.run("pg_ctl", &["-D", &self.data(), "-m", mode, "-w", "-t", "60", "stop"])
            .await;
    }

    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub async fn connect(&self, database: &str) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url(database))
            .await
            .unwrap_or_else(|e| panic!("connect to the throwaway cluster: {e}"))
    }

    pub async fn create_database(&self, name: &str) -> String {
        let mut admin = self.connect("postgres").await;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut admin)
            .await
            .unwrap();
        self.url(name)
    }

    pub fn server_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let mut command = if self.as_postgres {
            let mut command = std::process::Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(pg_ctl);
            command
        } else {
            std::process::Command::new(pg_ctl)
        };
        let _ = command
            .args(["-D", &self.data(), "-m", "immediate", "-w", "stop"])
            .current_dir(&self.dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
