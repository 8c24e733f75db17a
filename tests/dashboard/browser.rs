//! A headless Chromium driven through chromedriver's W3C WebDriver HTTP
//! API with reqwest: just what the dashboard test needs (find, click, type,
//! read what is visible, screenshots), and a guard that ends chromedriver and
//! the browser even when the test fails.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::process::free_port;

/// Where `chromium` and `chromedriver` are.
pub struct BrowserTools {
    chromium: PathBuf,
    chromedriver: PathBuf,
}

impl BrowserTools {
    /// The two programs (`CHROMIUM` and `CHROMEDRIVER` name them, else the
    /// `PATH`); `None` after a loud skip message, or a panic where they are
    /// required.
    pub fn find() -> Option<Self> {
        let chromium = program("CHROMIUM", &["chromium", "chromium-browser", "google-chrome"]);
        let chromedriver = program("CHROMEDRIVER", &["chromedriver"]);
        if let (Some(chromium), Some(chromedriver)) = (&chromium, &chromedriver) {
            return Some(Self {
                chromium: chromium.clone(),
                chromedriver: chromedriver.clone(),
            });
        }
        let missing = [
            ("chromium", chromium.is_none()),
            ("chromedriver", chromedriver.is_none()),
        ]
        .iter()
        .filter(|(_, missing)| *missing)
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(" and ");
        let required = ["CI", "LEDGER_REQUIRE_POSTGRES"]
            .iter()
            .any(|var| std::env::var(var).is_ok_and(|v| v == "1" || v == "true"));
        let message = format!(
            "{missing} not found: the dashboard browser test needs Debian's `chromium` and \
             `chromedriver` (apt-get install -y chromium chromium-driver)"
        );
        assert!(
            !required,
            "{message} (required under CI=true or LEDGER_REQUIRE_POSTGRES=1)"
        );
        let _ = writeln!(
            std::io::stderr(),
            "\n*** {message}: the dashboard test is SKIPPED. ***\n"
        );
        None
    }
}

/// An executable named by `var`, or the first of `names` on the `PATH`.
fn program(var: &str, names: &[&str]) -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(var) {
        return Some(PathBuf::from(path)).filter(|path| path.is_file());
    }
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

/// chromedriver in its own process group with a private browser profile.
/// Dropped (also when a test fails), it kills that group and any browser
/// process still using the profile, and removes the profile.
struct Driver {
    process: std::process::Child,
    profile: PathBuf,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.process.id());
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.process.kill();
        let _ = self.process.wait();
        // A browser that left the group is still known by its profile.
        let profile = self.profile.to_string_lossy().into_owned();
        for pid in processes_mentioning(&profile) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The processes whose command line contains `needle`.
fn processes_mentioning(needle: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| String::from_utf8_lossy(&cmdline).contains(needle))
        })
        .collect()
}

/// One WebDriver session: a headless Chromium window.
pub struct Browser {
    http: reqwest::Client,
    session: String,
    _driver: Driver,
}

/// The W3C name of an element reference in a WebDriver answer.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
pub const WAIT: Duration = Duration::from_secs(20);

/// A WebDriver command that failed: its W3C `error` code and message.
struct WebDriverError {
    error: String,
    message: String,
}

impl std::fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.error, self.message)
    }
}

impl Browser {
    pub async fn start(tools: &BrowserTools) -> Self {
        use std::os::unix::process::CommandExt;
        let port = free_port();
        let profile = std::env::temp_dir().join(format!("child-ledger-chromium-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&profile).unwrap();
        let process = std::process::Command::new(&tools.chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("start chromedriver");
        let driver = Driver { process, profile };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let root = format!("http://127.0.0.1:{port}");
        let ready = Instant::now();
        loop {
            let status = http.get(format!("{root}/status")).send().await;
            if let Ok(status) = status
                && let Ok(body) = status.json::<Value>().await
                && body["value"]["ready"] == json!(true)
            {
                break;
            }
            assert!(ready.elapsed() < WAIT, "chromedriver did not answer on port {port}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:loggingPrefs": {"browser": "ALL"},
            "goog:chromeOptions": {
                "binary": tools.chromium,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-dev-shm-usage",
                    "--disable-gpu",
                    "--no-first-run",
                    "--disable-extensions",
                    "--disable-background-networking",
                    "--hide-scrollbars",
                    "--lang=en-US",
                    "--force-device-scale-factor=1",
                    "--window-size=1400,1500",
                    format!("--user-data-dir={}", driver.profile.display()),
                ],
            },
        }}});
        let answer = http
            .post(format!("{root}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("new WebDriver session");
        let body: Value = answer.json().await.expect("new session answer");
        let session = body["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no WebDriver session: {body}"))
            .to_owned();
        Self {
            http,
            session: format!("{root}/session/{session}"),
            _driver: driver,
        }
    }

    /// One WebDriver command; its `value`, or its error.
    async fn command(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value, WebDriverError> {
        let mut request = self.http.request(method, format!("{}{path}", self.session));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let answer = request.send().await.map_err(|err| WebDriverError {
            error: "transport".to_owned(),
            message: err.to_string(),
        })?;
        let ok = answer.status().is_success();
        let body: Value = answer.json().await.unwrap_or(Value::Null);
        let value = body.get("value").cloned().unwrap_or(Value::Null);
        if ok {
            return Ok(value);
        }
        Err(WebDriverError {
            error: value["error"].as_str().unwrap_or("unknown").to_owned(),
            message: value["message"].as_str().unwrap_or_default().to_owned(),
        })
    }

    async fn must(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        self.command(method, path, body)
            .await
            .unwrap_or_else(|err| panic!("WebDriver {path}: {err}"))
    }

    pub async fn goto(&self, url: &str) {
        self.must(Method::POST, "/url", Some(json!({ "url": url }))).await;
    }

    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.must(
            Method::POST,
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// The text a person sees in the first element matching `css` (empty
    /// when there is none or it is hidden).
    pub async fn text(&self, css: &str) -> String {
        let text = self
            .script(
                "const e = document.querySelector(arguments[0]); \
                 return e && e.checkVisibility() ? e.innerText : '';",
                json!([css]),
            )
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Waits until the visible text of `css` satisfies `ok`, and returns it.
    pub async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let started = Instant::now();
        loop {
            let text = self.text(css).await;
            if ok(&text) {
                return text;
            }
            if started.elapsed() > WAIT {
                let page = self.text("body").await;
                let console = self.console().await;
                panic!(
                    "{css} never showed what was expected; it shows {text:?}\nthe page:\n{page}\nits console:\n{console}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the rows matching `css` name the parents `ok` expects.
    pub async fn wait_rows(&self, css: &str, ok: impl Fn(&[String]) -> bool) {
        let started = Instant::now();
        loop {
            let rows = self
                .script(
                    "return [...document.querySelectorAll(arguments[0])].map(r => r.dataset.parent || '');",
                    json!([css]),
                )
                .await;
            let rows: Vec<String> = serde_json::from_value(rows).unwrap_or_default();
            if ok(&rows) {
                return;
            }
            assert!(
                started.elapsed() < WAIT,
                "{css} never listed the expected rows: {rows:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the parent's fact `name` (e.g. "Pending") reads `value`.
    pub async fn wait_fact(&self, name: &str, value: &str) {
        let script = "const dt = [...document.querySelectorAll('#detail-facts dt')] \
                      .find(d => d.textContent === arguments[0]); \
                      return dt ? dt.nextElementSibling.textContent : null;";
        let started = Instant::now();
        loop {
            let shown = self.script(script, json!([name])).await;
            if shown == json!(value) {
                return;
            }
            assert!(started.elapsed() < WAIT, "{name} shows {shown}, not {value}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn find(&self, css: &str) -> Result<String, WebDriverError> {
        let found = self
            .command(
                Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("not an element reference: {found}"))
            .to_owned())
    }

    /// Clicks the element as a person would (WebDriver scrolls to it and
    /// refuses a hidden or covered one), once it is there; an element that the
    /// page redrew between finding and clicking is found again.
    pub async fn click(&self, css: &str) {
        self.on_element(css, |id| (format!("/element/{id}/click"), json!({})))
            .await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, |id| (format!("/element/{id}/value"), json!({ "text": text })))
            .await;
    }

    async fn on_element(&self, css: &str, command: impl Fn(&str) -> (String, Value)) {
        let started = Instant::now();
        loop {
            let result = match self.find(css).await {
                Ok(id) => {
                    let (path, body) = command(&id);
                    self.command(Method::POST, &path, Some(body)).await.map(drop)
                }
                Err(err) => Err(err),
            };
            match result {
                Ok(()) => return,
                Err(err)
                    if started.elapsed() < WAIT
                        && matches!(
                            err.error.as_str(),
                            "no such element" | "stale element reference" | "element not interactable"
                        ) => {}
                Err(err) => panic!("could not use {css}: {err}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the whole page (its `html` element: as tall as what it shows).
    pub async fn screenshot(&self, path: &Path) {
        self.script("window.scrollTo(0, 0)", json!([])).await;
        let page = self.find("html").await.unwrap_or_else(|err| panic!("no page: {err}"));
        let png = self
            .must(Method::GET, &format!("/element/{page}/screenshot"), None)
            .await;
        let png = base64_decode(png.as_str().expect("a base64 screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
        std::fs::write(path, png).unwrap();
    }

    /// What the page wrote to its console (chromedriver's log extension).
    async fn console(&self) -> String {
        match self
            .command(Method::POST, "/se/log", Some(json!({"type": "browser"})))
            .await
        {
            Ok(Value::Array(entries)) => entries
                .iter()
                .map(|e| {
                    format!(
                        "{} {}",
                        e["level"].as_str().unwrap_or("?"),
                        e["message"].as_str().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("\n"),
            Ok(other) => other.to_string(),
            Err(err) => format!("(no console log: {err})"),
        }
    }

    pub async fn quit(&self) {
        let _ = self.command(Method::DELETE, "", None).await;
    }
}

/// Standard base64 (the screenshot), without a crate for it.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let digits: Vec<u8> = text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let bits = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, c)| acc | (value(*c) << (18 - 6 * i)));
        let bytes = bits.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes_padded_and_unpadded_text() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGVsbG8h"), b"hello!");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode(""), b"");
}
