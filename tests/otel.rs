//! OpenTelemetry: the service, run as the binary with the standard `OTEL_*`
//! variables, exports OTLP/HTTP to a real receiver (built here on the
//! OpenTelemetry protobuf types). One producer's registration, two workers'
//! claims and their outcomes share the producer's trace id, nested as a user
//! reads them: producer → registration request, producer → child claimed
//! (one per child) → the worker's own span → the outcome request.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

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
        assert_eq!(attribute(claimed, "sequence"), Some(sequence.to_string()));
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
