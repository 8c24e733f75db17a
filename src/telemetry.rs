//! OpenTelemetry traces, through the tracing ecosystem's own crates
//! (`tracing-opentelemetry` over the OTLP exporter of `opentelemetry-otlp`).
//!
//! With `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! set, every request is a span (route, status, parent, queue) with the
//! statements beneath it, joined to the caller's trace by its W3C
//! `traceparent` header, and exported over OTLP/HTTP; the other standard
//! variables (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_TRACES_SAMPLER`, `OTEL_SDK_DISABLED`,
//! ...) apply as the SDK reads them. Unset, no layer is installed: no span
//! beyond what the logs already had is built, and nothing is exported.
//!
//! A claimed child whose registration carried a `traceparent` gets a span of
//! its own in that trace (`child claimed`, one per child, not one per
//! batch), and the worker is handed that span's context, so its work nests
//! under the claim in the producer's trace.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether spans are exported (set once, at start).
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether this process exports traces.
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// Whether the standard variables ask for OTLP trace export.
pub fn wanted() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|v| v.eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// The exporting tracer provider, kept to flush what is left at exit.
pub struct Exporter(SdkTracerProvider);

impl Exporter {
    /// Sends the spans still buffered, and stops.
    pub fn shutdown(self) {
        if let Err(err) = self.0.shutdown() {
            eprintln!("OpenTelemetry: spans not all exported at exit: {err}");
        }
    }
}

/// Builds the OTLP pipeline from the standard variables: the provider (to
/// keep and shut down at exit) and the tracer for the tracing layer.
pub fn exporter() -> anyhow::Result<(Exporter, opentelemetry_sdk::trace::SdkTracer)> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .build()?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name("child-ledger");
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("child-ledger");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    EXPORTING.store(true, Ordering::Relaxed);
    Ok((Exporter(provider), tracer))
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct One<'a>(&'a str);

impl Extractor for One<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        (key == "traceparent").then_some(self.0)
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent"]
    }
}

#[derive(Default)]
struct Written(Option<String>);

impl Injector for Written {
    fn set(&mut self, key: &str, value: String) {
        if key == "traceparent" {
            self.0 = Some(value);
        }
    }
}

/// Joins a request's span to the caller's trace (its `traceparent` header).
pub fn join_caller(span: &tracing::Span, headers: &HeaderMap) {
    if !exporting() || !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
}

/// A span in the trace of `traceparent` (a child of it), made by `make`,
/// ended at once; what to hand on: that span's own `traceparent`. Without
/// export, `traceparent` as it is.
pub fn span_under(traceparent: &str, make: impl FnOnce() -> tracing::Span) -> String {
    if !exporting() {
        return traceparent.to_owned();
    }
    let span = make();
    let parent = TraceContextPropagator::new().extract(&One(traceparent));
    if span.set_parent(parent).is_err() {
        return traceparent.to_owned();
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return traceparent.to_owned();
    }
    let mut written = Written::default();
    TraceContextPropagator::new().inject_context(&context, &mut written);
    written.0.unwrap_or_else(|| traceparent.to_owned())
}

/// Links the current span to the trace of `traceparent` (an outcome to the
/// claim it reports on).
pub fn link_current(traceparent: &str) {
    if !exporting() {
        return;
    }
    let context = TraceContextPropagator::new().extract(&One(traceparent));
    let linked = context.span().span_context().clone();
    if linked.is_valid() {
        tracing::Span::current().add_link(linked);
    }
}

/// Installs the log subscriber: text, or JSON lines when `json`, the `RUST_LOG` filter
/// (default `info`), written to stdout, in colour only when that is a
/// terminal (a log file or a pipe gets no escape codes). With the
/// standard `OTEL_*` variables asking for it, spans are exported over
/// OTLP too (`telemetry`); the exporter is returned, to flush at exit.
pub fn init_tracing(json: bool) -> Option<Exporter> {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
    if !wanted() {
        // The filter for the whole subscriber, as a plain log set-up has
        // it: as a per-layer filter, `info,tower_http=debug` dropped
        // events (a response's line, "ledger ready") on Postgres.
        let registry = tracing_subscriber::registry().with(filter);
        let plain = tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal());
        if json {
            registry.with(plain.json()).init();
        } else {
            registry.with(plain).init();
        }
        return None;
    }
    let log: Boxed = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let mut layers: Vec<Boxed> = vec![log];
    let exporter = match exporter() {
        Ok((exporter, tracer)) => {
            // Every span, the statements' (trace level) too: a per-layer
            // filter here left spans made in some handlers out of the
            // export (tracing-opentelemetry could not give their context).
            // Started when first needed, not when entered: a request span is named
            // after its route once routing knows it (`api::guard`).
            // No code location, thread or busy/idle times per span:
            // nobody reads them on a request, and each cost its share.
            let layer = tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_context_activation(false)
                .with_location(false)
                .with_threads(false)
                .with_tracked_inactivity(false);
            layers.push(layer.boxed());
            Some(exporter)
        }
        Err(err) => {
            eprintln!("OpenTelemetry export not started: {err}");
            None
        }
    };
    tracing_subscriber::registry().with(layers).init();
    if exporter.is_some() {
        tracing::info!("exporting traces over OTLP (OTEL_* variables)");
    }
    exporter
}
