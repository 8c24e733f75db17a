//! Completion webhooks, end to end: the real service as a process, a real
//! HTTP receiver in this test process, and the signature checked by an
//! independent implementation (Python's `hmac`), with each queue's own
//! secret. Where a webhook may go (SSRF) is tested with the sender in this
//! process and a resolver the test scripts. On both stores.

mod common;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use child_ledger::config::Limits;
use child_ledger::jobs::{Resolve, WebhookSender};
use child_ledger::ledger::webhook::{AllowHosts, RetrySchedule, WebhookSecret};
use common::process::{ServiceProcess, free_port};
use common::*;
use serde_json::{Value, json};

/// The signing secret of every test: `whsec_` and base64 of 32 bytes.
const SECRET: &str = "whsec_c2VjcmV0LWtleS1mb3ItY2hpbGQtbGVkZ2VyLXRlc3Rz";

/// What the receiver answers, in turn, for one path; past the script, 200.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Holds the request until the sender gives up on it.
    Hang,
}

/// One request the receiver got.
#[derive(Clone, Debug)]
struct Hit {
    path: String,
    /// The `Host` header: the URL's host name, whatever address was reached.
    host: String,
    /// The `child-ledger-queue` header.
    queue: String,
    id: String,
    timestamp: String,
    signature: String,
    body: String,
    at: Instant,
}

#[derive(Default)]
struct Inbox {
    hits: Mutex<Vec<Hit>>,
    scripts: Mutex<HashMap<String, VecDeque<Answer>>>,
}

/// A webhook receiver on 127.0.0.1 (or another loopback address): `POST /hook/{name}`.
struct Receiver {
    ip: IpAddr,
    port: u16,
    inbox: Arc<Inbox>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl Receiver {
    /// A receiver that is not listening yet (`listen` starts it on `port`).
    fn on(port: u16) -> Self {
        Self::on_address(IpAddr::from([127, 0, 0, 1]), port)
    }

    fn on_address(ip: IpAddr, port: u16) -> Self {
        Self {
            ip,
            port,
            inbox: Arc::default(),
            server: None,
        }
    }

    async fn start() -> Self {
        let mut receiver = Self::on(free_port());
        receiver.listen().await;
        receiver
    }

    async fn listen(&mut self) {
        async fn hook(
            State(inbox): State<Arc<Inbox>>,
            Path(name): Path<String>,
            headers: HeaderMap,
            body: String,
        ) -> StatusCode {
            let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
            inbox.hits.lock().unwrap().push(Hit {
                path: name.clone(),
                host: header("host"),
                queue: header(child_ledger::jobs::QUEUE_HEADER),
                id: header("webhook-id"),
                timestamp: header("webhook-timestamp"),
                signature: header("webhook-signature"),
                body,
                at: Instant::now(),
            });
            let answer = inbox
                .scripts
                .lock()
                .unwrap()
                .get_mut(&name)
                .and_then(VecDeque::pop_front);
            match answer {
                Some(Answer::Hang) => {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    StatusCode::OK
                }
                Some(Answer::Status(code)) => StatusCode::from_u16(code).unwrap(),
                None => StatusCode::OK,
            }
        }
        let router = axum::Router::new()
            .route("/hook/{name}", axum::routing::post(hook))
            .with_state(Arc::clone(&self.inbox));
        let listener = tokio::net::TcpListener::bind((self.ip, self.port)).await.unwrap();
        self.server = Some(tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        }));
    }

    fn script(&self, name: &str, answers: &[Answer]) {
        self.inbox
            .scripts
            .lock()
            .unwrap()
            .insert(name.to_owned(), answers.iter().copied().collect());
    }

    fn url(&self, name: &str) -> String {
        format!("http://127.0.0.1:{}/hook/{name}", self.port)
    }

    fn hits(&self) -> Vec<Hit> {
        self.inbox.hits.lock().unwrap().clone()
    }

    fn hits_for(&self, name: &str) -> Vec<Hit> {
        self.hits().into_iter().filter(|h| h.path == name).collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

/// The service's flags for webhooks to `receiver_port`: short retries, quick polls.
fn webhook_flags(receiver_port: u16, schedule: &str) -> Vec<String> {
    [
        "--webhook-allow-hosts",
        &format!("127.0.0.1:{receiver_port}"),
        "--webhook-secret",
        SECRET,
        "--webhook-retry-schedule-ms",
        schedule,
        "--webhook-poll-ms",
        "100",
        "--webhook-timeout-ms",
        "1500",
        "--reap-interval-ms",
        "100",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

async fn start_service(name: &str, db: &TestDatabase, flags: &[String]) -> ServiceProcess {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let service = ServiceProcess::start(name, &db.url, &flags).await;
    service.ready().await;
    service
}

async fn send(method: reqwest::Method, url: String, body: Option<Value>) -> (StatusCode, Value) {
    let client = reqwest::Client::new();
    let mut request = client.request(method, url).timeout(Duration::from_secs(30));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("request");
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

async fn put(base: &str, path: &str, body: Value) -> (StatusCode, Value) {
    send(reqwest::Method::PUT, format!("{base}{path}"), Some(body)).await
}

async fn post(base: &str, path: &str, body: Value) -> (StatusCode, Value) {
    send(reqwest::Method::POST, format!("{base}{path}"), Some(body)).await
}

async fn get(base: &str, path: &str) -> (StatusCode, Value) {
    send(reqwest::Method::GET, format!("{base}{path}"), None).await
}

/// Registers `parent` with `n` children and a webhook to `url`, claims them
/// all and records them processed: it completes through the outcome statement.
async fn complete_by_outcomes(base: &str, parent: &str, n: usize, url: Option<&str>) {
    let mut body = json!({"queue": "hooks", "children": children(n)});
    if let Some(url) = url {
        body["webhook_url"] = json!(url);
    }
    let (status, reply) = put(base, &format!("/v1/parents/{parent}"), body).await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let (status, claim) = post(base, &format!("/v1/parents/{parent}/claims"), json!({"limit": 1000})).await;
    assert_eq!(status, StatusCode::OK, "{claim}");
    let claim_id = claim["claim_id"].as_str().unwrap();
    let outcomes: Vec<Value> = claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"parent_id": parent, "sequence": c["sequence"], "outcome": "processed", "claim_id": claim_id}))
        .collect();
    let (status, reply) = post(base, "/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
}

/// A parent redriven from another's failed children completes and sends its
/// own event (to the webhook it took from the old parent), naming itself.
async fn a_redriven_parent_sends_its_own_event(backend: Backend) {
    let receiver = Receiver::start().await;
    let db = TestDatabase::new(backend).await;
    let service = start_service("redrive-hooks", &db, &webhook_flags(receiver.port, "200,200,200")).await;
    let base = service.base.as_str();
    let url = receiver.url("redo");
    let (status, _) = put(
        base,
        "/v1/parents/R-src",
        json!({"queue": "hooks", "children": children(3), "webhook_url": url}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (_, claim) = post(base, "/v1/parents/R-src/claims", json!({"limit": 3})).await;
    let outcomes: Vec<Value> = (0..3)
        .map(|s| {
            json!({"parent_id": "R-src", "sequence": s, "outcome": if s == 1 { "failed" } else { "processed" },
                        "reason": "timeout", "claim_id": claim["claim_id"]})
        })
        .collect();
    let (status, _) = post(base, "/v1/outcomes", json!({"outcomes": outcomes})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, redriven) = post(base, "/v1/parents/R-src/redrive", json!({"into": "R-src-r1"})).await;
    assert_eq!(status, StatusCode::CREATED, "{redriven}");
    assert_eq!(redriven["parent"]["webhook_url"], url);
    let (_, claim) = post(base, "/v1/parents/R-src-r1/claims", json!({"limit": 10})).await;
    assert_eq!(claim["children"][0]["sequence"], 0, "{claim}");
    let outcome = json!({"outcomes": [{"parent_id": "R-src-r1", "sequence": 0, "outcome": "processed",
                                       "claim_id": claim["claim_id"]}]});
    let (status, _) = post(base, "/v1/outcomes", outcome).await;
    assert_eq!(status, StatusCode::OK);
    eventually("both events delivered", Duration::from_secs(30), || async {
        (receiver.hits_for("redo").len() == 2).then_some(())
    })
    .await;
    let mut parents: Vec<String> = receiver
        .hits_for("redo")
        .iter()
        .map(|hit| {
            serde_json::from_str::<Value>(&hit.body).unwrap()["data"]["parent_id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    parents.sort();
    assert_eq!(parents, ["R-src", "R-src-r1"]);
}

/// Polls `check` every 50 ms until it returns `Some`, failing after `deadline`.
async fn eventually<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> (T, Duration)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await {
            return (value, started.elapsed());
        }
        assert!(started.elapsed() < deadline, "{what}: not within {deadline:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The parent's deliveries once its latest is in `state`.
async fn deliveries_in(base: &str, parent: &str, state: &str, deadline: Duration) -> (Vec<Value>, Duration) {
    eventually(&format!("{parent} delivery {state}"), deadline, || async {
        let (status, reply) = get(base, &format!("/v1/parents/{parent}/deliveries")).await;
        assert_eq!(status, StatusCode::OK, "{reply}");
        let deliveries = reply["deliveries"].as_array().cloned().unwrap_or_default();
        (deliveries.last().is_some_and(|d| d["state"] == state)).then_some(deliveries)
    })
    .await
}

/// The secret `child-ledger webhook secret --queue Q` prints for `queue`.
fn queue_secret(queue: &str) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_child-ledger"))
        .args(["webhook", "secret", "--queue", queue])
        .env("LEDGER_WEBHOOK_SECRET", SECRET)
        .output()
        .expect("run child-ledger webhook secret");
    assert!(output.status.success(), "{output:?}");
    let secret = String::from_utf8(output.stdout).unwrap().trim().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    secret
}

/// Python's `hmac` and `base64`, the way a receiver checks a signature;
/// `derive` also derives each queue's secret from the master one as the
/// README says (HKDF-SHA256), independently of the service.
const PYTHON_VERIFIER: &str = r#"
import base64, hashlib, hmac, json, sys

def key_of(whsec):
    return base64.b64decode(whsec[len("whsec_"):])

def verifies(key, hit):
    signed = (hit["id"] + "." + hit["timestamp"] + "." + hit["body"]).encode()
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    given = [s.split(",", 1)[1] for s in hit["signature"].split(" ") if s.startswith("v1,")]
    return any(hmac.compare_digest(expected, g) for g in given)

def queue_key(master, queue):
    prk = hmac.new(b"child-ledger/webhook-queue-secret/v1", master, hashlib.sha256).digest()
    return hmac.new(prk, queue.encode() + b"\x01", hashlib.sha256).digest()

mode, secret = sys.argv[1], sys.argv[2]
out = []
for hit in json.load(sys.stdin):
    if mode == "derive":
        queue = json.loads(hit["body"])["data"]["queue"]
        key = queue_key(key_of(secret), queue)
        out.append({"verified": verifies(key, hit), "by_master": verifies(key_of(secret), hit),
                    "queue": queue, "secret": "whsec_" + base64.b64encode(key).decode()})
    else:
        out.append({"verified": verifies(key_of(secret), hit)})
print(json.dumps(out))
"#;

fn run_python(mode: &str, secret: &str, hits: &[Hit]) -> Vec<Value> {
    let input: Vec<Value> = hits
        .iter()
        .map(|h| json!({"id": h.id, "timestamp": h.timestamp, "signature": h.signature, "body": h.body}))
        .collect();
    let mut child = std::process::Command::new("python3")
        .args(["-c", PYTHON_VERIFIER, mode, secret])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on the PATH");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Verifies every hit's signature with its queue's secret, derived in
/// Python from the master secret; that secret must be the one the CLI
/// prints, the `child-ledger-queue` header must name the queue, and the
/// master secret itself must verify none. Returns how many verified.
fn verify_in_python(hits: &[Hit]) -> usize {
    let checked = run_python("derive", SECRET, hits);
    let mut cli: HashMap<String, String> = HashMap::new();
    for (hit, check) in hits.iter().zip(&checked) {
        let queue = check["queue"].as_str().unwrap();
        assert_eq!(hit.queue, queue, "the queue header names the event's queue");
        let printed = cli.entry(queue.to_owned()).or_insert_with(|| queue_secret(queue));
        assert_eq!(
            check["secret"],
            printed.as_str(),
            "the CLI prints the documented derivation"
        );
        assert_eq!(
            check["by_master"], false,
            "an event verifies only with its queue's secret"
        );
    }
    checked.iter().filter(|c| c["verified"] == true).count()
}

/// Exactly one event per completion, whichever statement completes the
/// parent (outcome batch, registration, lease expiry), none without a
/// `webhook_url`, none for a repeated batch; each delivered once, signed.
async fn one_event_per_completion(backend: Backend) {
    let receiver = Receiver::start().await;
    let db = TestDatabase::new(backend).await;
    let service = start_service("hooks", &db, &webhook_flags(receiver.port, "200,200,200")).await;
    let base = service.base.as_str();

    // Outside the allowed hosts: 422 naming the field, nothing written.
    let (status, problem) = put(
        base,
        "/v1/parents/H-evil",
        json!({"children": children(1), "webhook_url": "http://169.254.169.254/latest"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{problem}");
    assert_eq!(problem["field"], "webhook_url");

    for i in 0..3 {
        complete_by_outcomes(
            base,
            &format!("H-out-{i}"),
            20,
            Some(&receiver.url(&format!("out-{i}"))),
        )
        .await;
    }
    // The same batch again changes nothing, and writes no second event.
    let (_, claim) = get(base, "/v1/parents/H-out-0/children").await;
    let again: Vec<Value> = claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| json!({"parent_id": "H-out-0", "sequence": c["sequence"], "outcome": "processed"}))
        .collect();
    let (status, _) = post(base, "/v1/outcomes", json!({"outcomes": again})).await;
    assert_eq!(status, StatusCode::OK);
    // Complete at registration: every child skipped.
    let skipped: Vec<Value> = (0..3).map(|i| json!({"payload": i, "skip": "invalid"})).collect();
    let (status, reply) = put(
        base,
        "/v1/parents/H-reg",
        json!({"queue": "hooks", "children": skipped, "webhook_url": receiver.url("reg")}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    assert_eq!(reply["webhook_url"], receiver.url("reg"));
    // The same registration with another webhook_url is different content.
    let (status, _) = put(
        base,
        "/v1/parents/H-reg",
        json!({"queue": "hooks", "children": skipped, "webhook_url": receiver.url("other")}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    // Complete by lease expiry: one attempt allowed, a 1 s lease run out.
    let (status, _) = put(
        base,
        "/v1/parents/H-lease",
        json!({"queue": "hooks", "children": children(2), "max_attempts": 1, "webhook_url": receiver.url("lease")}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = post(base, "/v1/parents/H-lease/claims", json!({"lease_seconds": 1})).await;
    assert_eq!(status, StatusCode::OK);
    // Complete by crossing a tolerance: one failure of three, none tolerated.
    let (status, _) = put(
        base,
        "/v1/parents/H-fail",
        json!({"queue": "hooks", "children": children(3), "tolerated_failures": {"count": 0},
               "webhook_url": receiver.url("fail")}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, claimed) = post(base, "/v1/parents/H-fail/claims", json!({"limit": 1})).await;
    assert_eq!(status, StatusCode::OK);
    let failed = json!({"outcomes": [{"parent_id": "H-fail", "sequence": 0, "outcome": "failed",
                                      "claim_id": claimed["claim_id"]}]});
    let (status, _) = post(base, "/v1/outcomes", failed).await;
    assert_eq!(status, StatusCode::OK);
    // No webhook_url: no event.
    complete_by_outcomes(base, "H-none", 5, None).await;

    let names = ["out-0", "out-1", "out-2", "reg", "lease", "fail"];
    let (_, took) = eventually("every event delivered", Duration::from_secs(30), || async {
        let mut all = true;
        for parent in ["H-out-0", "H-out-1", "H-out-2", "H-reg", "H-lease", "H-fail"] {
            let (_, reply) = get(base, &format!("/v1/parents/{parent}/deliveries")).await;
            all &= reply["deliveries"][0]["state"] == "delivered";
        }
        all.then_some(())
    })
    .await;

    let hits = receiver.hits();
    let mut per_path: BTreeMap<&str, usize> = BTreeMap::new();
    for hit in &hits {
        *per_path.entry(hit.path.as_str()).or_default() += 1;
    }
    assert_eq!(per_path.len(), names.len(), "{per_path:?}");
    assert!(per_path.values().all(|n| *n == 1), "each delivered once: {per_path:?}");
    let ids: std::collections::HashSet<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids.len(), names.len(), "one distinct webhook-id per completion");
    let store = db.store().await;
    assert_eq!(store.count_raw("SELECT count(*) FROM webhook_event").await.unwrap(), 6);
    let (_, none) = get(base, "/v1/parents/H-none/deliveries").await;
    assert_eq!(none["deliveries"], json!([]));

    // The body, and the signature by an independent implementation.
    let out0 = &receiver.hits_for("out-0")[0];
    let body: Value = serde_json::from_str(&out0.body).unwrap();
    let (_, parent) = get(base, "/v1/parents/H-out-0").await;
    assert_eq!(body["type"], "parent.completed");
    assert_eq!(body["data"]["parent_id"], "H-out-0");
    assert_eq!(body["data"]["queue"], "hooks");
    assert_eq!(body["data"]["counts"]["processed"], 20);
    assert_eq!(body["data"]["verdict"], "succeeded");
    let fail: Value = serde_json::from_str(&receiver.hits_for("fail")[0].body).unwrap();
    assert_eq!(fail["data"]["verdict"], "failed", "{fail}");
    assert_eq!(fail["data"]["counts"]["skipped"], 2, "{fail}");
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(body["data"]["completed_at"].as_str().unwrap()).unwrap(),
        chrono::DateTime::parse_from_rfc3339(parent["completed_at"].as_str().unwrap()).unwrap()
    );
    assert!(out0.id.starts_with("msg_"));
    let verified = verify_in_python(&hits);
    assert_eq!(verified, hits.len(), "Python verified every signature");
    let (_, deliveries) = get(base, "/v1/parents/H-out-0/deliveries").await;
    let delivery = &deliveries["deliveries"][0];
    assert_eq!(delivery["webhook_id"], out0.id.as_str());
    assert_eq!(delivery["attempts"][0]["status_code"], 200);

    // Reconcile re-completes a parent whose completion was cleared by hand:
    // a second completion, a second event with its own id.
    store
        .execute_raw("UPDATE parent SET completed_at = NULL WHERE parent_id = 'H-out-1'")
        .await
        .unwrap();
    let (status, report) = post(base, "/v1/parents/H-out-1/reconcile", json!({"dry_run": false})).await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["applied"], true, "{report}");
    let (deliveries, _) = eventually("the re-completion delivered", Duration::from_secs(20), || async {
        let (_, reply) = get(base, "/v1/parents/H-out-1/deliveries").await;
        let deliveries = reply["deliveries"].as_array().cloned().unwrap_or_default();
        (deliveries.len() == 2 && deliveries.iter().all(|d| d["state"] == "delivered")).then_some(deliveries)
    })
    .await;
    let again = receiver.hits_for("out-1");
    assert_eq!(again.len(), 2);
    assert_ne!(again[0].id, again[1].id);
    assert_eq!(deliveries[1]["webhook_id"], again[1].id.as_str());

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("child_ledger_webhook_deliveries_total{status=\"delivered\"} 7"),
        "{metrics}"
    );
    assert!(metrics.contains("child_ledger_webhook_outbox_backlog 0"), "{metrics}");
    eprintln!(
        "webhooks[{backend:?}]: 6 completions (3 outcome batches, 1 registration, 1 lease expiry, 1 tolerance crossed) -> \
         {} events, {} requests, {} distinct ids, {verified} signatures verified by Python; all delivered in {took:?}; \
         a reconcile re-completion sent a 2nd event with a new id",
        6,
        hits.len(),
        ids.len()
    );
}

/// A receiver answering 500 twice gets the same id, the same body and a valid
/// signature on all three attempts, spaced by the schedule; one that never
/// answers 2xx is given up after the schedule, and a redelivery sends the same id.
async fn retries_keep_the_id(backend: Backend) {
    let receiver = Receiver::start().await;
    receiver.script("flaky", &[Answer::Status(500), Answer::Status(500)]);
    receiver.script("down", &[Answer::Status(503); 4]);
    let db = TestDatabase::new(backend).await;
    let service = start_service("retries", &db, &webhook_flags(receiver.port, "300,300,300")).await;
    let base = service.base.as_str();

    complete_by_outcomes(base, "R-flaky", 3, Some(&receiver.url("flaky"))).await;
    complete_by_outcomes(base, "R-down", 3, Some(&receiver.url("down"))).await;
    let (deliveries, _) = deliveries_in(base, "R-flaky", "delivered", Duration::from_secs(20)).await;
    let attempts = deliveries[0]["attempts"].as_array().unwrap();
    let codes: Vec<&Value> = attempts.iter().map(|a| &a["status_code"]).collect();
    assert_eq!(codes, [&json!(500), &json!(500), &json!(200)]);
    assert!(attempts[0]["next_attempt_at"].is_string() && attempts[0]["error"].is_string());
    assert!(attempts[2]["next_attempt_at"].is_null() && attempts[2]["error"].is_null());

    let flaky = receiver.hits_for("flaky");
    assert_eq!(flaky.len(), 3);
    assert!(flaky.iter().all(|h| h.id == flaky[0].id && h.body == flaky[0].body));
    assert_eq!(deliveries[0]["webhook_id"], flaky[0].id.as_str());
    let gaps: Vec<Duration> = flaky.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(gaps.iter().all(|g| *g >= Duration::from_millis(250)), "{gaps:?}");
    assert_eq!(verify_in_python(&flaky), 3);

    // 1 attempt + 3 retries, all 503: given up.
    let (deliveries, _) = deliveries_in(base, "R-down", "failed", Duration::from_secs(20)).await;
    assert_eq!(deliveries[0]["attempts"].as_array().unwrap().len(), 4);
    assert_eq!(receiver.hits_for("down").len(), 4);
    // Queued again by an admin: the same id, delivered now.
    let (status, reply) = post(base, "/v1/parents/R-down/deliveries/redeliver", json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{reply}");
    let (deliveries, _) = deliveries_in(base, "R-down", "delivered", Duration::from_secs(20)).await;
    let down = receiver.hits_for("down");
    assert_eq!(down.len(), 5);
    assert!(down.iter().all(|h| h.id == down[0].id));
    assert_eq!(deliveries.len(), 1);
    let (status, _) = post(base, "/v1/parents/R-missing/deliveries/redeliver", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    eprintln!(
        "webhooks[{backend:?}]: 500, 500, 200 under one id {} with gaps {gaps:?}; \
         given up after 4 attempts, redelivered under the same id",
        flaky[0].id
    );
}

/// SIGKILL while an attempt is in flight (after the completion committed,
/// before any delivery): the restarted service delivers it, same id, once
/// the dead attempt's lease has run out.
async fn delivered_after_sigkill(backend: Backend) {
    let receiver = Receiver::start().await;
    receiver.script("killed", &[Answer::Hang]);
    let db = TestDatabase::new(backend).await;
    let mut service = start_service("killed", &db, &webhook_flags(receiver.port, "300,300,300")).await;
    let base = service.base.clone();
    complete_by_outcomes(&base, "K-1", 10, Some(&receiver.url("killed"))).await;
    eventually(
        "the first attempt reaches the receiver",
        Duration::from_secs(20),
        || async { (!receiver.hits_for("killed").is_empty()).then_some(()) },
    )
    .await;
    service.kill().await;
    let killed_at = Instant::now();
    let store = db.store().await;
    assert_eq!(
        store.count_raw("SELECT count(*) FROM webhook_attempt").await.unwrap(),
        0,
        "the killed attempt was never recorded"
    );
    service.restart().await;
    service.ready().await;
    let (deliveries, _) = deliveries_in(&base, "K-1", "delivered", Duration::from_secs(30)).await;
    let took = killed_at.elapsed();
    let hits = receiver.hits_for("killed");
    assert_eq!(hits.len(), 2, "the hung attempt and the one after the restart");
    assert_eq!(hits[0].id, hits[1].id);
    assert_eq!(verify_in_python(&hits), 2);
    let attempts = deliveries[0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["attempt"], 2);
    assert_eq!(attempts[0]["status_code"], 200);
    eprintln!(
        "webhooks[{backend:?}]: killed mid-attempt; delivered by the restarted service {took:?} after the kill (lease 3 s)"
    );
}

/// Two replicas; the one that completed a parent is killed in the middle of
/// its attempt. The other, still running, sends the event again, same id,
/// once the dead attempt's lease has run out, and records it as the
/// event's only attempt (the killed one was never recorded).
async fn another_replica_sends_after_a_kill(backend: Backend) {
    let receiver = Receiver::start().await;
    receiver.script("handover", &[Answer::Hang]);
    let db = TestDatabase::new(backend).await;
    // An attempt times out after 5 s (its lease: 10 s), long enough for the
    // second replica to start before the first is killed mid-attempt.
    let mut flags = webhook_flags(receiver.port, "300,300,300");
    let timeout = flags.iter().position(|f| f == "--webhook-timeout-ms").unwrap() + 1;
    flags[timeout] = "5000".to_owned();
    let mut first = start_service("handover-first", &db, &flags).await;
    complete_by_outcomes(&first.base, "KH-1", 10, Some(&receiver.url("handover"))).await;
    eventually(
        "the first replica's attempt reaches the receiver",
        Duration::from_secs(20),
        || async { (!receiver.hits_for("handover").is_empty()).then_some(()) },
    )
    .await;
    // Only the first replica runs yet: the hung attempt is its own.
    let second = start_service("handover-second", &db, &flags).await;
    first.kill().await;
    let killed_at = Instant::now();
    let (deliveries, _) = deliveries_in(&second.base, "KH-1", "delivered", Duration::from_secs(30)).await;
    let took = killed_at.elapsed();
    let hits = receiver.hits_for("handover");
    assert_eq!(hits.len(), 2, "the hung attempt and the other replica's");
    assert_eq!(hits[0].id, hits[1].id);
    let attempts = deliveries[0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["attempt"], 2);
    assert_eq!(attempts[0]["status_code"], 200);
    let store = db.store().await;
    assert_eq!(
        store
            .count_raw("SELECT count(DISTINCT sender) FROM webhook_attempt")
            .await
            .unwrap(),
        1
    );
    eprintln!(
        "webhooks[{backend:?}]: the sending replica killed mid-attempt; the other delivered {took:?} after the kill (lease 10 s)"
    );
}

/// The receiver is down (nothing listens) for several attempts; once it
/// listens, the event arrives with its id.
async fn delivered_after_receiver_outage(backend: Backend) {
    let mut receiver = Receiver::on(free_port());
    let db = TestDatabase::new(backend).await;
    let service = start_service(
        "outage",
        &db,
        &webhook_flags(
            receiver.port,
            "200,200,200,200,200,200,200,200,200,200,200,200,200,200,200",
        ),
    )
    .await;
    let base = service.base.as_str();
    complete_by_outcomes(base, "O-1", 5, Some(&receiver.url("outage"))).await;
    let (failed, down_for) = eventually("three refused attempts", Duration::from_secs(20), || async {
        let (_, reply) = get(base, "/v1/parents/O-1/deliveries").await;
        let attempts = reply["deliveries"][0]["attempts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (attempts.len() >= 3).then_some(attempts)
    })
    .await;
    assert!(
        failed
            .iter()
            .all(|a| a["status_code"].is_null() && a["error"].is_string()),
        "{failed:?}"
    );
    receiver.listen().await;
    let (deliveries, took) = deliveries_in(base, "O-1", "delivered", Duration::from_secs(20)).await;
    let hits = receiver.hits_for("outage");
    assert_eq!(hits.len(), 1);
    assert_eq!(deliveries[0]["webhook_id"], hits[0].id.as_str());
    let attempts = deliveries[0]["attempts"].as_array().unwrap();
    eprintln!(
        "webhooks[{backend:?}]: receiver down {down_for:?} ({} refused attempts, e.g. {}); delivered {took:?} after it listened, attempt {}",
        attempts.len() - 1,
        failed[0]["error"],
        attempts.last().unwrap()["attempt"]
    );
}

/// Two replicas on one database: every attempt is made by one of them only.
/// Each receiver path answers 500 once, so every event takes two attempts,
/// which either replica may make; no id is ever received more than twice.
async fn replicas_never_share_an_attempt(backend: Backend) {
    const PARENTS: usize = 24;
    let receiver = Receiver::start().await;
    for i in 0..PARENTS {
        receiver.script(&format!("p{i}"), &[Answer::Status(500)]);
    }
    let db = TestDatabase::new(backend).await;
    let flags = webhook_flags(receiver.port, "100,100,100");
    let a = start_service("replica-a", &db, &flags).await;
    let b = start_service("replica-b", &db, &flags).await;
    let completions = (0..PARENTS).map(|i| {
        let base = if i % 2 == 0 { a.base.clone() } else { b.base.clone() };
        let url = receiver.url(&format!("p{i}"));
        async move { complete_by_outcomes(&base, &format!("D-{i}"), 10, Some(&url)).await }
    });
    futures::future::join_all(completions).await;
    let (_, took) = eventually("every event delivered", Duration::from_secs(30), || async {
        let store = db.store().await;
        let delivered = store
            .count_raw("SELECT count(*) FROM webhook_event WHERE state = 'delivered'")
            .await
            .unwrap();
        (delivered == PARENTS as i64).then_some(())
    })
    .await;
    let hits = receiver.hits();
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for hit in &hits {
        *per_id.entry(hit.id.as_str()).or_default() += 1;
    }
    assert_eq!(per_id.len(), PARENTS);
    assert!(
        per_id.values().all(|n| *n == 2),
        "each id: one 500, one 200: {per_id:?}"
    );
    let store = db.store().await;
    assert_eq!(
        store.count_raw("SELECT count(*) FROM webhook_attempt").await.unwrap(),
        2 * PARENTS as i64
    );
    assert_eq!(
        store
            .count_raw("SELECT count(*) FROM webhook_event WHERE attempts <> 2")
            .await
            .unwrap(),
        0,
        "no attempt was claimed twice"
    );
    let senders = store
        .count_raw("SELECT count(DISTINCT sender) FROM webhook_attempt")
        .await
        .unwrap();
    // Each replica sends its own completions at once, so both sent.
    assert_eq!(senders, 2, "attempts recorded by {senders} replica(s)");
    eprintln!(
        "webhooks[{backend:?}]: 2 replicas, {PARENTS} events, {} requests at the receiver (2 per id), \
         {} attempts recorded by {senders} replica(s), all delivered in {took:?}",
        hits.len(),
        2 * PARENTS
    );
}

/// A cancel completes its parent, and the completion is delivered once,
/// signed, with the skipped children counted.
async fn a_cancel_fires_the_webhook(backend: Backend) {
    let receiver = Receiver::start().await;
    let db = TestDatabase::new(backend).await;
    let service = start_service("hooks-cancel", &db, &webhook_flags(receiver.port, "200,200,200")).await;
    let base = service.base.as_str();
    let (status, reply) = put(
        base,
        "/v1/parents/H-cancel",
        json!({"queue": "hooks", "children": children(4), "webhook_url": receiver.url("cancel")}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let (status, reply) = post(base, "/v1/parents/H-cancel/cancel", json!({"reason": "withdrawn"})).await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    let (hits, took) = eventually("the cancel's event", Duration::from_secs(20), || async {
        let hits = receiver.hits_for("cancel");
        (!hits.is_empty()).then_some(hits)
    })
    .await;
    // A second cancel completes nothing new: still one event.
    let (status, _) = post(base, "/v1/parents/H-cancel/cancel", json!({"reason": "again"})).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let hits_after = receiver.hits_for("cancel");
    let body: Value = serde_json::from_str(&hits[0].body).unwrap();
    println!(
        "a cancelled parent's event arrived {took:?} after the cancel; {} request(s) in all",
        hits_after.len()
    );
    assert_eq!(hits_after.len(), 1, "{hits_after:?}");
    assert_eq!(body["type"], "parent.completed", "{body}");
    assert_eq!(body["data"]["parent_id"], "H-cancel", "{body}");
    assert_eq!(body["data"]["counts"]["skipped"], 4, "{body}");
    assert_eq!(verify_in_python(&hits_after), 1);
}

/// A producer of queue `a` points a parent at queue `b`'s receiver: the
/// event arrives, but it does not verify with `b`'s secret (it is signed
/// with `a`'s), while `b`'s own events do. The secrets are the CLI's.
async fn a_receiver_of_one_queue_rejects_another_queues_events(backend: Backend) {
    let receiver = Receiver::start().await;
    let db = TestDatabase::new(backend).await;
    let service = start_service("hooks-tenants", &db, &webhook_flags(receiver.port, "200")).await;
    let base = service.base.as_str();
    let skipped = json!([{"skip": "nothing to do"}]);
    for (parent, queue) in [("T-a", "a"), ("T-b", "b")] {
        let (status, reply) = put(
            base,
            &format!("/v1/parents/{parent}"),
            json!({"queue": queue, "children": skipped, "webhook_url": receiver.url("b-receiver")}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
    }
    let (hits, _) = eventually("both events", Duration::from_secs(20), || async {
        let hits = receiver.hits_for("b-receiver");
        (hits.len() == 2).then_some(hits)
    })
    .await;
    let b_secret = queue_secret("b");
    assert_ne!(b_secret, queue_secret("a"));
    assert_ne!(b_secret, SECRET);
    let verdicts = run_python("with", &b_secret, &hits);
    for (hit, verdict) in hits.iter().zip(&verdicts) {
        let body: Value = serde_json::from_str(&hit.body).unwrap();
        let queue = body["data"]["queue"].as_str().unwrap();
        assert_eq!(
            verdict["verified"],
            queue == "b",
            "queue {queue}'s event against queue b's secret"
        );
        assert_eq!(hit.queue, queue);
    }
    assert_eq!(verify_in_python(&hits), 2, "each verifies with its own queue's secret");
    eprintln!("webhooks[{backend:?}]: queue a's event sent to queue b's receiver fails b's secret; b's own passes");
}

/// A receiver on an allowed host answers 200 with an endless body, to four
/// events at once: the sender reads a few KiB of each and hangs up, and the
/// service's peak memory barely moves.
async fn a_huge_answer_is_not_read(backend: Backend) {
    const ANSWER: u64 = 256 * 1024 * 1024;
    const EVENTS: usize = 4;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let written = Arc::new(Mutex::new(Vec::new()));
    let answers = Arc::clone(&written);
    let receiver = tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            let answers = Arc::clone(&answers);
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut head = Vec::new();
                let mut buf = [0u8; 8192];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: {ANSWER}\r\n\r\n"
                );
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let block = vec![b'x'; 1 << 20];
                let mut sent = 0u64;
                while sent < ANSWER && stream.write_all(&block).await.is_ok() {
                    sent += block.len() as u64;
                }
                answers.lock().unwrap().push(sent);
            });
        }
    });
    let db = TestDatabase::new(backend).await;
    let service = start_service("hooks-huge", &db, &webhook_flags(port, "60000")).await;
    let base = service.base.as_str();
    let peak_before = peak_rss_kib(service.pid());
    for i in 0..EVENTS {
        let (status, reply) = put(
            base,
            &format!("/v1/parents/HUGE-{i}"),
            json!({"queue": "hooks", "children": [{"skip": "x"}], "webhook_url": format!("http://127.0.0.1:{port}/hook")}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{reply}");
    }
    let (sent, took) = eventually("every answer cut off", Duration::from_secs(60), || async {
        let sent = written.lock().unwrap().clone();
        (sent.len() == EVENTS).then_some(sent)
    })
    .await;
    for i in 0..EVENTS {
        let (deliveries, _) = deliveries_in(base, &format!("HUGE-{i}"), "delivered", Duration::from_secs(20)).await;
        assert_eq!(deliveries[0]["attempts"][0]["status_code"], 200);
    }
    let peak_after = peak_rss_kib(service.pid());
    receiver.abort();
    eprintln!(
        "webhooks[{backend:?}]: {EVENTS} answers of {} MiB each: the receiver got {:?} MiB in before the sender hung up \
         ({took:?}); peak RSS {} -> {} MiB",
        ANSWER >> 20,
        sent.iter().map(|s| s >> 20).collect::<Vec<_>>(),
        peak_before / 1024,
        peak_after / 1024
    );
    assert!(
        sent.iter().all(|s| *s < 64 * 1024 * 1024),
        "each answer is dropped after a few KiB (what was written is socket buffers): {sent:?}"
    );
    assert!(
        peak_after < peak_before + 48 * 1024,
        "peak RSS grew from {peak_before} KiB to {peak_after} KiB"
    );
}

/// The process's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<pid>/status (Linux)");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// A resolver whose answers the test scripts: each call takes the next
/// answer of the script, and repeats the last one once it runs out.
#[derive(Debug, Default)]
struct ScriptedResolver {
    script: Mutex<VecDeque<IpAddr>>,
    last: Mutex<Option<IpAddr>>,
    asked: AtomicUsize,
}

impl ScriptedResolver {
    fn answering(ips: &[&str]) -> Arc<Self> {
        let resolver = Arc::new(Self::default());
        resolver.set(ips);
        resolver
    }

    fn set(&self, ips: &[&str]) {
        *self.script.lock().unwrap() = ips.iter().map(|ip| ip.parse().unwrap()).collect();
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

impl Resolve for ScriptedResolver {
    fn resolve<'a>(
        &'a self,
        _host: &'a str,
        port: u16,
    ) -> futures::future::BoxFuture<'a, std::io::Result<Vec<SocketAddr>>> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut last = self.last.lock().unwrap();
        if let Some(next) = self.script.lock().unwrap().pop_front() {
            *last = Some(next);
        }
        let answer = last.map(|ip| SocketAddr::new(ip, port));
        Box::pin(async move {
            answer
                .map(|a| vec![a])
                .ok_or_else(|| std::io::Error::other("no answer scripted"))
        })
    }
}

/// The service in this process, with `allow` as its allowed webhook hosts;
/// its sender is started by `start_sender`, with the test's resolver.
struct InProcess {
    base: String,
    state: child_ledger::AppState,
    allow: String,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _db: TestDatabase,
}

impl InProcess {
    async fn start(backend: Backend, allow: &str) -> Self {
        let db = TestDatabase::new(backend).await;
        let store = child_ledger::store::Store::connect(&db.url).await.unwrap();
        store.migrate().await.unwrap();
        let limits = Limits {
            webhook_allow_hosts: AllowHosts::parse(allow).unwrap(),
            ..Limits::default()
        };
        let state = child_ledger::AppState::new(store, limits);
        let router = child_ledger::app(state.clone(), Duration::from_secs(60));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Self {
            base,
            state,
            allow: allow.to_owned(),
            tasks: vec![server],
            _db: db,
        }
    }

    fn start_sender(&mut self, resolver: Arc<ScriptedResolver>) {
        let sender = WebhookSender {
            secret: WebhookSecret::parse(SECRET).unwrap(),
            allow: AllowHosts::parse(&self.allow).unwrap(),
            schedule: RetrySchedule::parse("200,200").unwrap(),
            poll: Duration::from_millis(100),
            timeout: Duration::from_millis(1500),
            resolver,
        };
        self.tasks.push(tokio::spawn(child_ledger::jobs::send_webhooks(
            self.state.clone(),
            sender,
        )));
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// A name that resolved to a public address when the parent was registered
/// resolves to 127.0.0.1 when the event is sent (DNS rebinding): the sender
/// checks the address it got at send time and does not connect, attempt
/// after attempt; the service listening on 127.0.0.1 is never reached.
async fn a_name_rebound_to_loopback_is_not_reached(backend: Backend) {
    let internal = Receiver::start().await;
    let allow = format!("hooks.example.test:{}", internal.port);
    let mut app = InProcess::start(backend, &allow).await;
    let resolver = ScriptedResolver::answering(&["93.184.216.34"]);
    let url = format!("http://hooks.example.test:{}/hook/rebound", internal.port);
    let (status, reply) = put(
        &app.base,
        "/v1/parents/REBOUND",
        json!({"queue": "hooks", "children": [{"skip": "x"}], "webhook_url": url}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    // The name's answer changes before the send.
    resolver.set(&["127.0.0.1"]);
    app.start_sender(Arc::clone(&resolver));
    let (deliveries, _) = deliveries_in(&app.base, "REBOUND", "failed", Duration::from_secs(20)).await;
    let attempts = deliveries[0]["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 3, "{attempts:?}");
    for attempt in attempts {
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(
            attempt["status_code"].is_null() && error.contains("127.0.0.1 is loopback"),
            "{attempt}"
        );
    }
    assert!(
        internal.hits().is_empty(),
        "127.0.0.1 was reached: {:?}",
        internal.hits()
    );
    assert_eq!(resolver.asked(), 3, "resolved once per attempt");
    eprintln!(
        "webhooks[{backend:?}]: rebound to 127.0.0.1: 3 attempts refused ({})",
        attempts[0]["error"]
    );
}

/// The sender connects to the address it checked, not to whatever a second
/// lookup of the name says: the resolver alternates between an allowed
/// address (127.0.0.2, named in the allow list) and 127.0.0.1 (not), one
/// answer per lookup. Every connection goes to 127.0.0.2, with the URL's
/// host name in `Host`; the lookup that answered 127.0.0.1 connected nowhere.
async fn the_checked_address_is_the_one_connected_to(backend: Backend) {
    let port = free_port();
    let mut allowed = Receiver::on_address(IpAddr::from([127, 0, 0, 2]), port);
    allowed.listen().await;
    let mut internal = Receiver::on(port);
    internal.listen().await;
    let allow = format!("hooks.example.test:{port}, 127.0.0.2:{port}");
    let mut app = InProcess::start(backend, &allow).await;
    let resolver = ScriptedResolver::answering(&["127.0.0.2", "127.0.0.1", "127.0.0.2"]);
    app.start_sender(Arc::clone(&resolver));
    let url = format!("http://hooks.example.test:{port}/hook/pinned");
    let (status, reply) = put(
        &app.base,
        "/v1/parents/PINNED",
        json!({"queue": "hooks", "children": [{"skip": "x"}], "webhook_url": url}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    deliveries_in(&app.base, "PINNED", "delivered", Duration::from_secs(20)).await;
    // Again: the next lookup answers 127.0.0.1 (refused), the one after 127.0.0.2.
    let (status, _) = post(&app.base, "/v1/parents/PINNED/deliveries/redeliver", json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let (deliveries, _) = eventually(
        "redelivered after a refused attempt",
        Duration::from_secs(20),
        || async {
            let (_, reply) = get(&app.base, "/v1/parents/PINNED/deliveries").await;
            let delivery = reply["deliveries"][0].clone();
            (delivery["state"] == "delivered" && delivery["attempts"].as_array().is_some_and(|a| a.len() == 3))
                .then_some(delivery)
        },
    )
    .await;
    let errors: Vec<&Value> = deliveries["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| &a["error"])
        .collect();
    assert!(errors[0].is_null() && errors[2].is_null(), "{errors:?}");
    assert!(
        errors[1].as_str().unwrap().contains("127.0.0.1 is loopback"),
        "{errors:?}"
    );
    let hits = allowed.hits_for("pinned");
    assert_eq!(hits.len(), 2);
    assert!(
        hits.iter().all(|h| h.host == format!("hooks.example.test:{port}")),
        "{hits:?}"
    );
    assert!(
        internal.hits().is_empty(),
        "127.0.0.1 was reached: {:?}",
        internal.hits()
    );
    assert_eq!(resolver.asked(), 3, "one lookup per attempt");
    eprintln!(
        "webhooks[{backend:?}]: 3 lookups (127.0.0.2, 127.0.0.1, 127.0.0.2): 2 deliveries to 127.0.0.2, none to 127.0.0.1"
    );
}

/// URLs that parsers read differently are refused at registration, naming
/// the field, and nothing is written.
async fn ambiguous_urls_are_refused_at_registration(backend: Backend) {
    let db = TestDatabase::new(backend).await;
    let flags = [
        "--webhook-allow-hosts",
        "127.0.0.1, hooks.example.test",
        "--webhook-secret",
        SECRET,
    ]
    .map(String::from);
    let service = start_service("hooks-ambiguous", &db, &flags).await;
    let base = service.base.as_str();
    for url in [
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0x7f.1/",
        "http://017700000001/",
        "http://127.1/",
        "http://h\\@127.0.0.1/",
        "http://hooks\u{ff0e}example\u{ff0e}test/",
        " http://hooks.example.test/",
        "http://hooks.example.test/#x",
        "http://u@hooks.example.test/",
    ] {
        let (status, problem) = put(
            base,
            "/v1/parents/AMBIGUOUS",
            json!({"children": [{"skip": "x"}], "webhook_url": url}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url:?}: {problem}");
        assert_eq!(problem["field"], "webhook_url", "{url:?}");
    }
    let (status, _) = get(base, "/v1/parents/AMBIGUOUS").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, reply) = put(
        base,
        "/v1/parents/PLAIN",
        json!({"children": [{"skip": "x"}], "webhook_url": "http://127.0.0.1/"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
}

/// An allowed name that resolves to a loopback address (`localhost`) is not
/// connected to: loopback is reached only when the allow list names the
/// address itself.
async fn an_allowed_name_resolving_to_loopback_is_refused(backend: Backend) {
    let receiver = Receiver::start().await;
    let db = TestDatabase::new(backend).await;
    let allow = format!("localhost:{}", receiver.port);
    let flags = [
        "--webhook-allow-hosts",
        &allow,
        "--webhook-secret",
        SECRET,
        "--webhook-retry-schedule-ms",
        "100",
        "--webhook-poll-ms",
        "100",
    ]
    .map(String::from);
    let service = start_service("hooks-localhost", &db, &flags).await;
    let base = service.base.as_str();
    let url = format!("http://localhost:{}/hook/local", receiver.port);
    let (status, reply) = put(
        base,
        "/v1/parents/LOCAL",
        json!({"children": [{"skip": "x"}], "webhook_url": url}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{reply}");
    let (deliveries, _) = deliveries_in(base, "LOCAL", "failed", Duration::from_secs(20)).await;
    let error = deliveries[0]["attempts"][0]["error"].as_str().unwrap().to_owned();
    assert!(error.contains("loopback"), "{error}");
    assert!(receiver.hits().is_empty(), "{:?}", receiver.hits());
}

both_stores!(
    a_cancel_fires_the_webhook,
    a_receiver_of_one_queue_rejects_another_queues_events,
    a_huge_answer_is_not_read,
    a_name_rebound_to_loopback_is_not_reached,
    the_checked_address_is_the_one_connected_to,
    ambiguous_urls_are_refused_at_registration,
    an_allowed_name_resolving_to_loopback_is_refused,
    one_event_per_completion,
    a_redriven_parent_sends_its_own_event,
    retries_keep_the_id,
    delivered_after_sigkill,
    another_replica_sends_after_a_kill,
    delivered_after_receiver_outage,
    replicas_never_share_an_attempt,
);
