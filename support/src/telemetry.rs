//! Logging and tracing set-up shared by the agent and the broker.
//!
//! Logs go to stderr as text or, on request, JSON lines. Traces: when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, `tracing`
//! spans are also exported over OTLP/HTTP (protobuf) in batches, with `service.name` set to
//! the process's role; otherwise nothing is exported and the helpers below are no-ops.
//!
//! A job's trace crosses processes as a W3C `traceparent` string: the broker records the one
//! of the submit span with the job, hands it to the agent in the lease, and parents the spans
//! of placement, launch, run and report on it, so one trace shows the job's whole life.

use std::collections::HashMap;
use std::sync::OnceLock;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

static ENABLED: OnceLock<bool> = OnceLock::new();

/// Flushes and stops the trace exporter when dropped: keep it alive for the whole `main`.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends what is still buffered; safe to call more than once.
    pub fn flush(&self) {
        if let Some(p) = &self.provider {
            let _ = p.force_flush();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Whether spans are being exported (an OTLP endpoint is configured).
pub fn enabled() -> bool {
    ENABLED.get().copied().unwrap_or(false)
}

fn endpoint_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()))
}

/// Installs the global subscriber: `RUST_LOG` (else `default_filter`) filters; logs to stderr,
/// as JSON lines when `json`; spans over OTLP when the standard `OTEL_EXPORTER_OTLP_*`
/// variables name an endpoint. Call once, at the start of `main`, outside the async runtime.
pub fn init(service: &'static str, json: bool, default_filter: &str) -> Telemetry {
    init_with(
        service,
        json,
        default_filter,
        endpoint_configured().then_some(Exporter::FromEnv),
    )
}

/// Where spans go.
pub enum Exporter {
    /// The standard `OTEL_EXPORTER_OTLP_*` variables.
    FromEnv,
    /// This OTLP/HTTP traces URL (`http://host:4318/v1/traces`).
    Url(String),
}

/// [`init`] with the exporter chosen by the caller (`None`: logs only).
pub fn init_with(
    service: &'static str,
    json: bool,
    default_filter: &str,
    exporter: Option<Exporter>,
) -> Telemetry {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().with_filter(filter()).boxed()
    } else {
        fmt.with_filter(filter()).boxed()
    };
    let provider = if let Some(target) = exporter {
        let builder = opentelemetry_otlp::SpanExporter::builder().with_http();
        let builder = match target {
            Exporter::FromEnv => builder,
            Exporter::Url(url) => builder.with_endpoint(url),
        };
        match builder.build() {
            Ok(exporter) => Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name(service)
                            .build(),
                    )
                    .build(),
            ),
            Err(e) => {
                eprintln!("{service}: OTLP exporter not started: {e}");
                None
            }
        }
    } else {
        None
    };
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer(service))
            .with_filter(filter())
    });
    let _ = ENABLED.set(provider.is_some());
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(otel)
        .try_init();
    Telemetry { provider }
}

/// The W3C `traceparent` of `span`, when spans are exported and it has a valid context.
pub fn traceparent(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent")
}

/// Makes `span` a child of the remote span named by `traceparent` (ignored when malformed or
/// when nothing is exported).
pub fn set_parent(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(tp) = traceparent.filter(|_| enabled()) else {
        return;
    };
    let carrier = HashMap::from([("traceparent".to_string(), tp.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}
