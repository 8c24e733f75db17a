//! PgBouncer in transaction-pooling mode in front of a Postgres, on a free
//! port, with Debian's defaults but for the mode (and, for the tests, a small
//! server pool: fewer server connections than the replicas' clients, so
//! clients really share them). Shared by the tests (through
//! `common::pgbouncer()`) and the benchmark (`#[path]`).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

pub struct PgBouncer {
    pub port: u16,
    dir: PathBuf,
    child: Child,
}

fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

fn pgbouncer_binary() -> Option<PathBuf> {
    ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|dir| dir.join("pgbouncer"))
                .find(|p| p.is_file())
        })
}

impl PgBouncer {
    /// Starts PgBouncer in front of the Postgres server of `postgres_url`
    /// (every database on it), with `server_pool` server connections per
    /// database (`None`: PgBouncer's default, 20). `Err` when it is not installed.
    pub async fn start(postgres_url: &str, server_pool: Option<u32>) -> Result<Self, String> {
        let binary = pgbouncer_binary().ok_or("pgbouncer is not installed (apt-get install pgbouncer)")?;
        let target: url::Url = postgres_url.parse().expect("a Postgres URL");
        let host = target.host_str().unwrap_or("127.0.0.1").to_owned();
        let pg_port = target.port().unwrap_or(5432);
        let user = if target.username().is_empty() {
            "postgres"
        } else {
            target.username()
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("child-ledger-pgbouncer-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let pool = server_pool.map_or(String::new(), |n| format!("default_pool_size = {n}\n"));
        let config = format!(
            "[databases]\n* = host={host} port={pg_port}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nauth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
             {pool}max_client_conn = 500\nlogfile = {dir}/pgbouncer.log\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).unwrap();
        std::fs::write(dir.join("userlist.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        let mut command = Command::new(binary);
        // PgBouncer refuses to run as root: it switches to `postgres`, which
        // must be able to write its log.
        if running_as_root() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            command.args(["-u", "postgres"]);
        }
        let child = command
            .arg(dir.join("pgbouncer.ini"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pgbouncer");
        let bouncer = Self { port, dir, child };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "pgbouncer did not listen on {port}; its log:\n{}",
                bouncer.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(bouncer)
    }

    /// `url` with its host and port replaced by this PgBouncer's.
    pub fn url_for(&self, url: &str) -> String {
        let mut url: url::Url = url.parse().expect("a Postgres URL");
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(self.port)).unwrap();
        url.to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
