//! A request through the services gateway is a span when traces are exported: `gateway
//! request`, a child of the caller's `traceparent`, with the service, the replica and the
//! status; and the replica gets the span's own `traceparent` (same trace, the gateway's span as
//! parent). The collector is a real OTLP/HTTP endpoint in this process. Its own test binary:
//! the exporter is process-wide.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/gateway.rs"]
mod support;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use std::sync::{Arc, Mutex};
use switchyard_broker::gateway::{StandaloneOptions, standalone};
use switchyard_support::telemetry::{self, Exporter};

/// (name, trace id, span id, parent span id, attributes as text).
type SeenSpan = (String, Vec<u8>, Vec<u8>, Vec<u8>, Vec<(String, String)>);
type Seen = Arc<Mutex<Vec<SeenSpan>>>;

fn text(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// An OTLP/HTTP traces endpoint on its own thread and runtime; returns its URL.
fn collector(seen: Seen) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let route = axum::routing::post(move |body: axum::body::Bytes| {
                let seen = seen.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body.as_ref()).unwrap();
                    let mut seen = seen.lock().unwrap();
                    for span in req
                        .resource_spans
                        .into_iter()
                        .flat_map(|r| r.scope_spans)
                        .flat_map(|s| s.spans)
                    {
                        let attrs = span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                            .collect();
                        seen.push((
                            span.name,
                            span.trace_id,
                            span.span_id,
                            span.parent_span_id,
                            attrs,
                        ));
                    }
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                        Vec::<u8>::new(),
                    )
                }
            });
            let app = axum::Router::new().route("/v1/traces", route);
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{}/v1/traces", rx.recv().unwrap())
}

#[test]
fn a_gateway_request_is_a_span_and_the_replica_joins_its_trace() {
    let seen: Seen = Arc::default();
    let url = collector(seen.clone());
    let telemetry = telemetry::init_with("switchyard", false, "info", Some(Exporter::Url(url)));
    assert!(telemetry::enabled());
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (service, answer) = rt.block_on(async {
        let app = TestApp::spawn().await;
        let agent = app.agent(4).await;
        let (service, _) = support::deploy(&app, &agent, "echo", support::replica().await).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gw = format!("http://{}", listener.local_addr().unwrap());
        let opts = StandaloneOptions {
            broker: app.url.clone(),
            token: app.admin.clone(),
            region: None,
            ca_cert: None,
        };
        tokio::spawn(standalone(opts, listener, std::future::pending()));
        let http = reqwest::Client::new();
        let answer = eventually("an answer through the gateway", 20, async || {
            let r = http
                .get(format!("{gw}/svc/ml/echo/"))
                .bearer_auth(&app.admin)
                .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(r.text().await.unwrap())
        })
        .await;
        (service, answer)
    });
    telemetry.flush();
    drop(rt);

    // The replica got the same trace, under a span of the gateway's.
    let tp = answer.strip_prefix("hello ").unwrap();
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{answer}");
    assert_eq!(parts[1], trace_id, "{answer}");
    assert_ne!(parts[2], caller_span, "{answer}");

    let spans = seen.lock().unwrap().clone();
    let span = spans
        .iter()
        .find(|(name, _, id, _, attrs)| {
            name == "gateway request"
                && hex::encode(id) == parts[2]
                && attrs
                    .iter()
                    .any(|(k, v)| k == "http.response.status_code" && v == "200")
        })
        .unwrap_or_else(|| {
            panic!(
                "no gateway span of the answered request among {:?}",
                spans.iter().map(|s| &s.0).collect::<Vec<_>>()
            )
        });
    assert_eq!(hex::encode(&span.1), trace_id);
    assert_eq!(hex::encode(&span.3), caller_span);
    let attr = |k: &str| {
        span.4
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(attr("service.id"), Some(service));
    assert!(attr("replica").is_some(), "{:?}", span.4);
    assert!(attr("latency_ms").is_some(), "{:?}", span.4);
}
