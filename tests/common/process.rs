//! The service as a real process (the built `child-ledger` binary), for tests
//! that kill, restart or signal it, or cut its database away.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// A free TCP port on 127.0.0.1 (bound, then released for the caller).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Sends a signal (`"TERM"`, `"KILL"`) to a process.
pub fn signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([format!("-{name}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// One service process on a fixed port; it can be killed and started again
/// on the same port with the same arguments.
pub struct ServiceProcess {
    pub name: String,
    pub port: u16,
    pub base: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl ServiceProcess {
    /// Starts `child-ledger --listen 127.0.0.1:<free port> --database-url <url> <extra>`
    /// without waiting: call `ready()` or `wait_for()` (the database may be down on purpose).
    pub async fn start(name: &str, database_url: &str, extra: &[&str]) -> Self {
        Self::start_with_env(name, database_url, extra, &[]).await
    }

    /// As `start`, with extra environment variables (e.g. `RUST_LOG`).
    pub async fn start_with_env(name: &str, database_url: &str, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("child-ledger-{name}-{}.log", uuid::Uuid::new_v4()));
        let mut args = vec![
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--database-url".to_owned(),
            database_url.to_owned(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let mut process = Self {
            name: name.to_owned(),
            port,
            base: format!("http://127.0.0.1:{port}"),
            args,
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            log,
            child: None,
        };
        process.spawn();
        process
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_child-ledger"))
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("LEDGER_TEST_SERVICE_LOG").unwrap_or_else(|_| "info".to_owned()),
            )
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start child-ledger");
        self.child = Some(child);
    }

    /// Waits until the process answers `path` with a 200, up to `timeout`.
    pub async fn wait_for(&self, path: &str, timeout: Duration) -> Duration {
        let client = reqwest::Client::new();
        let started = Instant::now();
        loop {
            let ok = client
                .get(format!("{}{path}", self.base))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < timeout,
                "{} did not answer {path} within {timeout:?}; log:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn ready(&self) {
        self.wait_for("/readyz", Duration::from_secs(60)).await;
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().and_then(Child::id).expect("running")
    }

    /// SIGKILL, and wait for the process to be gone.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// SIGTERM, and the exit status within `timeout`.
    pub async fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(child.id().expect("running"), "TERM");
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = child.start_kill();
                panic!(
                    "{} did not exit within {timeout:?} of SIGTERM; log:\n{}",
                    self.name,
                    self.log_text()
                );
            }
        }
    }

    /// The exit status of a process expected to exit by itself within `timeout`.
    pub async fn exited(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("running");
        match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => {
                self.child = None;
                status.unwrap()
            }
            Err(_) => panic!("{} still runs after {timeout:?}; log:\n{}", self.name, self.log_text()),
        }
    }

    /// Starts the process again on the same port, with the same arguments.
    pub async fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        self.spawn();
        self.wait_for("/healthz", Duration::from_secs(30)).await;
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}
