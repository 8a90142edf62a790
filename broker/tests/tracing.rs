//! One job, one trace: with an OTLP endpoint configured, the spans of a job's submit,
//! placement, launch and run (in the agent, joined through the lease's `traceparent`) and
//! report all reach the collector in one trace, each a child of the submit span; the agent's
//! launch ends before its run starts, and the report follows the run. The collector is a real
//! OTLP/HTTP endpoint in this process that decodes the exporter's protobuf.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_agent::AgentArgs;
use switchyard_support::telemetry::{self, Exporter};

#[derive(Clone, Debug)]
struct SeenSpan {
    name: String,
    service: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    job_id: Option<String>,
    start_ns: u64,
    end_ns: u64,
}

type Seen = Arc<Mutex<Vec<SeenSpan>>>;

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
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| r.attributes.iter())
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| string_value(kv.value.as_ref()))
                            .unwrap_or_default();
                        for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                            let job_id = span
                                .attributes
                                .iter()
                                .find(|kv| kv.key == "job.id")
                                .and_then(|kv| string_value(kv.value.as_ref()));
                            seen.push(SeenSpan {
                                name: span.name,
                                service: service.clone(),
                                trace_id: span.trace_id,
                                span_id: span.span_id,
                                parent_span_id: span.parent_span_id,
                                job_id,
                                start_ns: span.start_time_unix_nano,
                                end_ns: span.end_time_unix_nano,
                            });
                        }
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
    let addr = rx.recv().unwrap();
    format!("http://{addr}/v1/traces")
}

fn string_value(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> Option<String> {
    match v?.value.as_ref()? {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

#[test]
fn a_jobs_spans_from_submit_to_report_form_one_trace() {
    let seen: Seen = Arc::default();
    let url = collector(seen.clone());
    let telemetry = telemetry::init_with("switchyard", false, "info", Some(Exporter::Url(url)));
    assert!(telemetry::enabled());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let job_id = rt.block_on(async {
        let app = TestApp::spawn().await;
        let r = app
            .call(
                Method::POST,
                "/api/v1/enrolment-tokens",
                Some(&app.admin),
                Some(json!({"pool": POOL})),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        // A real agent, in this process: its spans go to the same exporter.
        let mut args = AgentArgs::new(app.url.parse().unwrap());
        args.enrol_token = Some(r.body["token"].as_str().unwrap().parse().unwrap());
        args.fake_gpus = vec!["4xH100-80GB".parse().unwrap()];
        args.name = Some("traced".into());
        args.poll_wait_s = 1;
        args.grace_s = 1;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(switchyard_agent::run_until(args, async {
            let _ = stopped.await;
        }));

        let dev = app.token("developer", Some("ml")).await;
        let mut spec = job_spec("ml");
        spec["command"] = json!(["sh", "-c", "echo traceparent=$TRACEPARENT"]);
        let r = app.submit(&dev, spec).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        let id = r.body["id"].as_str().unwrap().to_string();
        let job = app
            .wait_for_job(&dev, &id, Duration::from_secs(30), |j| {
                j["state"] == "succeeded" || j["state"] == "failed"
            })
            .await;
        assert_eq!(job["state"], "succeeded", "{job}");
        // The job itself sees the trace context (for its own instrumentation).
        let logs = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs/{id}/logs"),
                Some(&dev),
                None,
            )
            .await;
        let out = logs.body.to_string();
        assert!(out.contains("traceparent=00-"), "{out}");
        let _ = stop.send(());
        agent.await.unwrap().unwrap();
        id
    });
    drop(rt);
    telemetry.flush();

    let spans = seen.lock().unwrap().clone();
    let of_job: Vec<&SeenSpan> = spans
        .iter()
        .filter(|s| s.job_id.as_deref() == Some(job_id.as_str()))
        .collect();
    let find = |name: &str| {
        of_job
            .iter()
            .find(|s| s.name == name)
            .copied()
            .unwrap_or_else(|| panic!("no {name} span for the job among {of_job:#?}"))
    };
    let submit = find("job.submit");
    assert_eq!(submit.service, "switchyard");
    assert_eq!(submit.trace_id.len(), 16);
    for name in ["job.place", "job.launch", "job.run", "job.report"] {
        let span = find(name);
        assert_eq!(span.trace_id, submit.trace_id, "{name} is in another trace");
        assert_eq!(
            span.parent_span_id, submit.span_id,
            "{name} is not a child of the submit span"
        );
    }
    // In order: the lease taken and the process spawned, then the run, then its report. (The
    // placement and the launch are not compared: an agent's poll may take the committed lease
    // before the scheduler opens the placement's span.)
    let (place, launch, run, report) = (
        find("job.place"),
        find("job.launch"),
        find("job.run"),
        find("job.report"),
    );
    assert!(submit.start_ns <= place.start_ns, "placed before submitted");
    assert!(
        submit.start_ns <= launch.start_ns,
        "launched before submitted"
    );
    assert!(
        launch.end_ns <= run.start_ns,
        "the run began before the launch ended: {launch:?} {run:?}"
    );
    assert!(run.start_ns <= report.start_ns, "reported before it ran");
}
