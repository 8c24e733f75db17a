//! OpenTelemetry: the service, run as the binary with the standard `OTEL_*`
//! variables, exports OTLP/HTTP to a real receiver (built here on the
//! OpenTelemetry protobuf types). One producer's registration, two workers'
//! claims and their outcomes share the producer's trace id, nested as a user
//! reads them: producer → registration request, producer → child claimed
//! (one per claim and trace) → the worker's own span → the outcome request.
//! A batch of outcomes of children of several traces links to each. The
//! example workers (Python, Node, TypeScript) log each claimed child's
//! `traceparent` and send it with the outcome post that reports it.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::examples::examples;
use common::process::ServiceProcess;
use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// An OTLP/HTTP trace receiver on a free port: every span it was sent.
async fn receiver() -> (String, Arc<Mutex<Vec<Span>>>) {
    let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
    let kept = Arc::clone(&spans);
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
                let mut kept = kept.lock().unwrap();
                for resource in request.resource_spans {
                    for scope in resource.scope_spans {
                        kept.extend(scope.spans);
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{address}"), spans)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            V::StringValue(s) => Some(s.clone()),
            V::IntValue(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        })
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

async fn one_trace_from_producer_to_outcomes(backend: Backend) {
    let (endpoint, spans) = receiver().await;
    let db = TestDatabase::new(backend).await;
    let mut service = ServiceProcess::start_with_env(
        "otel",
        &db.url,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "ledger-under-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    service.ready().await;
    let http = reqwest::Client::new();
    let base = service.base.clone();

    // The producer registers inside its own span.
    let producer = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    let r = http
        .put(format!("{base}/v1/parents/T-1"))
        .header("traceparent", &producer)
        .json(&json!({"queue": "traced", "children": children(2)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);

    // Two workers each claim one child, do it in a span of their own under
    // the handed context, and send that span with their outcome.
    let mut handed = Vec::new();
    for (n, worker) in ["worker-a", "worker-b"].iter().enumerate() {
        let claim: Value = http
            .post(format!("{base}/v1/queues/traced/claims"))
            .json(&json!({"limit": 1, "worker": worker}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let child = &claim["children"][0];
        let traceparent = child["traceparent"]
            .as_str()
            .expect("a traceparent on the claimed child")
            .to_owned();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts[1], TRACE, "{traceparent}");
        assert_ne!(parts[2], PRODUCER_SPAN, "the claim's own span, under the producer's");
        let worker_span = format!("{:016x}", 0xa1a1_0000_0000_0000u64 + n as u64);
        let r = http
            .post(format!("{base}/v1/parents/T-1/children/{}/outcome", child["sequence"]))
            .header("traceparent", format!("00-{TRACE}-{worker_span}-01"))
            .json(&json!({"outcome": "processed", "claim_id": claim["claim_id"]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        handed.push((parts[2].to_owned(), worker_span, child["sequence"].as_i64().unwrap()));
    }

    // Stopping flushes what is buffered.
    let status = service.terminate(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}");
    let spans = spans.lock().unwrap().clone();
    let in_trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let described: Vec<String> = in_trace
        .iter()
        .map(|s| format!("{} {} <- {}", s.name, hex(&s.span_id), hex(&s.parent_span_id)))
        .collect();

    let registration = in_trace
        .iter()
        .find(|s| s.name == "PUT /v1/parents/{parent_id}")
        .unwrap_or_else(|| panic!("no registration span in {described:#?}"));
    assert_eq!(hex(&registration.parent_span_id), PRODUCER_SPAN, "{described:#?}");
    assert_eq!(attribute(registration, "parent_id").as_deref(), Some("T-1"));
    assert_eq!(
        attribute(registration, "http.response.status_code").as_deref(),
        Some("201")
    );
    for (claim_span, worker_span, sequence) in &handed {
        let claimed = in_trace
            .iter()
            .find(|s| hex(&s.span_id) == *claim_span)
            .unwrap_or_else(|| panic!("no span {claim_span} in {described:#?}"));
        assert_eq!(claimed.name, "child claimed");
        assert_eq!(hex(&claimed.parent_span_id), PRODUCER_SPAN, "{described:#?}");
        // One span per claim and trace context: this claim handed out one child.
        assert_eq!(attribute(claimed, "children").as_deref(), Some("1"));
        assert_eq!(attribute(claimed, "first_sequence"), Some(sequence.to_string()));
        assert_eq!(attribute(claimed, "last_sequence"), Some(sequence.to_string()));
        assert!(attribute(claimed, "worker").is_some_and(|w| w.starts_with("worker-")));
        let outcome = in_trace
            .iter()
            .find(|s| hex(&s.parent_span_id) == *worker_span)
            .unwrap_or_else(|| panic!("no outcome under worker span {worker_span} in {described:#?}"));
        assert_eq!(outcome.name, "POST /v1/parents/{parent_id}/children/{sequence}/outcome");
        assert_eq!(attribute(outcome, "http.response.status_code").as_deref(), Some("200"));
    }
    // The statements run beneath the requests.
    let registration_id = &registration.span_id;
    assert!(
        spans
            .iter()
            .any(|s| &s.parent_span_id == registration_id && s.name.starts_with("statement")),
        "no statement under the registration: {described:#?}"
    );
    eprintln!("{backend:?}: one trace, {} spans: {described:#?}", in_trace.len());
}

both_stores!(one_trace_from_producer_to_outcomes);

/// One batch of outcomes for children of three producers' traces: the
/// batch's span links to each trace (the `traceparent` of each item), once.
async fn a_batch_links_to_each_childs_trace(backend: Backend) {
    let (endpoint, spans) = receiver().await;
    let db = TestDatabase::new(backend).await;
    let mut service = ServiceProcess::start_with_env(
        "otel-links",
        &db.url,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    service.ready().await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let traces: Vec<String> = (1..=3u128).map(|n| format!("{:032x}", 0x1111_0000 + n)).collect();
    for (n, trace) in traces.iter().enumerate() {
        let r = http
            .put(format!("{base}/v1/parents/L-{n}"))
            .header("traceparent", format!("00-{trace}-{PRODUCER_SPAN}-01"))
            .json(&json!({"queue": "linked", "children": children(2)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let claim: Value = http
        .post(format!("{base}/v1/queues/linked/claims"))
        .json(&json!({"limit": 100, "worker": "batcher"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items: Vec<Value> = claim["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json!({"parent_id": c["parent_id"], "sequence": c["sequence"], "outcome": "processed",
                   "claim_id": claim["claim_id"], "traceparent": c["traceparent"]})
        })
        .collect();
    assert_eq!(items.len(), 6, "{claim}");
    let r = http
        .post(format!("{base}/v1/outcomes"))
        .json(&json!({"outcomes": items}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // A traceparent that is not one is refused, naming the item.
    let r = http
        .post(format!("{base}/v1/outcomes"))
        .json(
            &json!({"outcomes": [{"parent_id": "L-0", "sequence": 0, "outcome": "processed",
                                     "claim_id": claim["claim_id"], "traceparent": "00-nope"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["field"], "outcomes[0].traceparent", "{body}");

    let status = service.terminate(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}");
    let spans = spans.lock().unwrap().clone();
    let batch = spans
        .iter()
        .find(|s| s.name == "POST /v1/outcomes" && !s.links.is_empty())
        .unwrap_or_else(|| panic!("no linked batch span among {} spans", spans.len()));
    let mut linked: Vec<String> = batch.links.iter().map(|l| hex(&l.trace_id)).collect();
    linked.sort();
    assert_eq!(linked, traces, "one link per trace");
    eprintln!("otel[{backend:?}]: one batch linked to {} traces", linked.len());
}

both_stores!(a_batch_links_to_each_childs_trace);

/// Each example worker drains a queue of its own whose parent a producer
/// registered in its trace: every child it was handed is logged with its
/// `traceparent`, and the outcome post that reports the child nests under
/// the `child claimed` span of the claim that handed it out (the worker sent
/// it as the header).
async fn example_workers_hand_the_trace_on(backend: Backend) {
    const CHILDREN: usize = 6;
    let (endpoint, spans) = receiver().await;
    let db = TestDatabase::new(backend).await;
    let mut service = ServiceProcess::start_with_env(
        "otel-examples",
        &db.url,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    )
    .await;
    service.ready().await;
    let http = reqwest::Client::new();
    let base = service.base.clone();
    let dir = std::env::temp_dir().join(format!("child-ledger-otel-examples-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let examples = examples(&dir).await;
    let mut logged = Vec::new();
    for (n, example) in examples.iter().enumerate() {
        let lang = example.lang;
        let trace = format!("{:032x}", 0x7ace_0000_u128 + n as u128);
        let queue = format!("traced-{lang}");
        let r = http
            .put(format!("{base}/v1/parents/W-{lang}"))
            .header("traceparent", format!("00-{trace}-{PRODUCER_SPAN}-01"))
            .json(&json!({"queue": queue, "children": children(CHILDREN)}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let run = tokio::process::Command::new(example.program)
            .arg(&example.script)
            .args(["--url", base.as_str(), "--queue", queue.as_str(), "--exit-when-empty"])
            .args([
                "--worker",
                &format!("{lang}-traced"),
                "--limit",
                "4",
                "--batch-size",
                "10",
            ])
            .env_remove("LEDGER_TOKEN")
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(Duration::from_secs(60), run)
            .await
            .unwrap_or_else(|_| panic!("the {lang} worker did not finish within 60 s"))
            .unwrap_or_else(|e| panic!("cannot start {} for the {lang} worker: {e}", example.program));
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(output.status.success(), "{lang}: {}\n{stderr}", output.status);
        // What the worker logged: the traceparent of each child it was handed.
        let handed: Vec<String> = stderr
            .lines()
            .filter_map(|line| line.split_once("traceparent ").map(|(_, t)| t.trim().to_owned()))
            .collect();
        assert_eq!(handed.len(), CHILDREN, "{lang} logged {handed:?}:\n{stderr}");
        logged.push((lang, trace, handed));
    }

    let status = service.terminate(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}");
    let spans = spans.lock().unwrap().clone();
    for (lang, trace, handed) in &logged {
        let in_trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == *trace).collect();
        let described: Vec<String> = in_trace
            .iter()
            .map(|s| format!("{} {} <- {}", s.name, hex(&s.span_id), hex(&s.parent_span_id)))
            .collect();
        let claimed: Vec<String> = in_trace
            .iter()
            .filter(|s| s.name == "child claimed")
            .map(|s| hex(&s.span_id))
            .collect();
        // A span per claim of the trace's children (the worker claims a few
        // at a time), each child handed one of them.
        assert!(
            !claimed.is_empty() && claimed.len() < CHILDREN,
            "{lang}: {described:#?}"
        );
        for traceparent in handed {
            let parts: Vec<&str> = traceparent.split('-').collect();
            assert_eq!(parts.len(), 4, "{lang}: {traceparent}");
            assert_eq!(parts[1], trace, "{lang}: {traceparent}");
            assert!(
                claimed.iter().any(|c| c == parts[2]),
                "{lang}: {traceparent} names no claim span"
            );
            let outcome = in_trace
                .iter()
                .find(|s| hex(&s.parent_span_id) == parts[2])
                .unwrap_or_else(|| panic!("{lang}: no outcome post under {traceparent} in {described:#?}"));
            assert_eq!(outcome.name, "POST /v1/outcomes", "{lang}: {described:#?}");
            assert_eq!(attribute(outcome, "http.response.status_code").as_deref(), Some("200"));
        }
    }
    let langs: Vec<&str> = logged.iter().map(|(lang, ..)| *lang).collect();
    eprintln!("{backend:?}: {langs:?} each sent {CHILDREN} outcomes in their children's trace context");
    let _ = std::fs::remove_dir_all(&dir);
}

both_stores!(example_workers_hand_the_trace_on);
