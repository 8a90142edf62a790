//! The services gateway as its own process's code (`gateway::standalone`, as `switchyard
//! gateway` runs it) against a real broker: routes from `GET /gateway/routes`, callers checked
//! against the routes' token hashes (team, admin and invoke tokens: 401, 403, 200), reports
//! that reach the service view and the in-flight count the reconciler reads, routing that goes
//! on while the broker is away, and the report endpoint's validation. The replica is a small
//! HTTP server in this process, registered through the store as its agent would report it.
//! On SQLite, or on PostgreSQL with `SWITCHYARD_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/gateway.rs"]
mod support;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::{deploy, replica};
use switchyard_broker::gateway::{StandaloneOptions, standalone};
use switchyard_core::JobId;
use tokio::net::TcpListener;

/// A TCP relay to the broker that can be cut (`down`: open connections are dropped and new
/// ones refused) and restored.
struct Relay {
    url: String,
    down: Arc<AtomicBool>,
}

async fn relay(to: &str) -> Relay {
    let target = to.trim_start_matches("http://").to_string();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let down = Arc::new(AtomicBool::new(false));
    let flag = down.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                return;
            };
            if flag.load(Ordering::SeqCst) {
                continue; // dropped: refused
            }
            let target = target.clone();
            let flag = flag.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                    return;
                };
                let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                tokio::pin!(copy);
                loop {
                    tokio::select! {
                        _ = &mut copy => return,
                        () = tokio::time::sleep(Duration::from_millis(50)) => {
                            if flag.load(Ordering::SeqCst) {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Relay { url, down }
}

/// Starts a standalone gateway against `broker` with `token`; returns its base URL.
async fn gateway(broker: &str, token: &str, region: Option<&str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let opts = StandaloneOptions {
        broker: broker.to_string(),
        token: token.to_string(),
        region: region.map(str::to_string),
        ca_cert: None,
    };
    tokio::spawn(standalone(opts, listener, std::future::pending()));
    url
}

async fn call(http: &reqwest::Client, url: &str, token: Option<&str>) -> (u16, String) {
    let mut req = http.get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test]
async fn a_standalone_gateway_routes_checks_callers_and_reports() {
    let app = TestApp::spawn().await;
    let agent = app.agent(4).await;
    let port = replica().await;
    let (id, job) = deploy(&app, &agent, "echo", port).await;
    let (other, _) = deploy(&app, &agent, "other", replica().await).await;
    let infra = app.token("infra", None).await;
    let gw = gateway(&app.url, &infra, Some("onprem:test-dc")).await;
    let echo = format!("{gw}/svc/ml/echo/");
    let http = reqwest::Client::new();

    // The admin's token gets through once the gateway has read its routes.
    eventually("an answer through the gateway", 20, async || {
        let (status, body) = call(&http, &echo, Some(&app.admin)).await;
        (status == 200).then_some(body)
    })
    .await;
    // No token: 401; a bogus one: 401; another team's: 403; the team's own: 200.
    assert_eq!(call(&http, &echo, None).await.0, 401);
    assert_eq!(call(&http, &echo, Some("sya_nonsense")).await.0, 401);
    let cv = app.token("developer", Some("cv")).await;
    let ml = app.token("developer", Some("ml")).await;
    // A token made after the gateway's last refresh is known from its next one.
    eventually("the new tokens known", 10, async || {
        (call(&http, &echo, Some(&ml)).await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(call(&http, &echo, Some(&cv)).await.0, 403);

    // An invoke token: this service only. Developers may not issue one.
    let path = format!("/api/v1/services/{id}/tokens");
    let r = app
        .call(Method::POST, &path, Some(&ml), Some(json!({})))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    let r = app
        .call(
            Method::POST,
            &path,
            Some(&app.admin),
            Some(json!({"name": "chat frontend"})),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let invoke = r.body["token"].as_str().unwrap().to_string();
    let token_id = r.body["id"].as_str().unwrap().to_string();
    assert!(invoke.starts_with("syi_"), "{invoke}");
    let listed = app.call(Method::GET, &path, Some(&app.admin), None).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.body["tokens"][0]["name"], "chat frontend");
    assert!(
        !listed.body.to_string().contains(&invoke),
        "a secret listed"
    );
    eventually("the invoke token accepted", 10, async || {
        (call(&http, &echo, Some(&invoke)).await.0 == 200).then_some(())
    })
    .await;
    assert_eq!(
        call(&http, &format!("{gw}/svc/ml/other/"), Some(&invoke))
            .await
            .0,
        403
    );
    // Not a token of the API.
    let r = app
        .call(Method::GET, "/api/v1/services", Some(&invoke), None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = app
        .call(
            Method::DELETE,
            &format!("{path}/{token_id}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["revoked"], true);
    eventually("the revoked invoke token refused", 10, async || {
        (call(&http, &echo, Some(&invoke)).await.0 == 401).then_some(())
    })
    .await;
    let _ = other;

    // What the gateway saw reaches the service's view through its reports.
    for _ in 0..20 {
        assert_eq!(call(&http, &echo, Some(&ml)).await.0, 200);
    }
    let view = eventually("the calls in the service's traffic", 15, async || {
        let v = app
            .call(
                Method::GET,
                &format!("/api/v1/services/{id}"),
                Some(&app.admin),
                None,
            )
            .await;
        (v.body["traffic"]["requests"].as_u64().unwrap_or(0) >= 20).then_some(v.body)
    })
    .await;
    assert!(view["traffic"]["p95_ms"].as_f64().is_some(), "{view}");
    assert!(view["replicas"][0]["rps"].as_f64().unwrap() > 0.0, "{view}");

    // A request in flight shows in the count the reconciler reads, and goes when it ends.
    let job = JobId(job.parse().unwrap());
    let slow = {
        let http = http.clone();
        let url = format!("{gw}/svc/ml/echo/slow");
        let ml = ml.clone();
        tokio::spawn(async move { call(&http, &url, Some(&ml)).await })
    };
    eventually("one request in flight", 5, async || {
        (app.app.traffic.in_flight(job) == 1).then_some(())
    })
    .await;
    assert_eq!(slow.await.unwrap(), (200, "slow".to_string()));
    eventually("nothing in flight", 5, async || {
        (app.app.traffic.in_flight(job) == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_gateway_keeps_routing_while_the_broker_is_away() {
    let app = TestApp::spawn().await;
    let agent = app.agent(4).await;
    let (id, _) = deploy(&app, &agent, "echo", replica().await).await;
    let relay = relay(&app.url).await;
    let gw = gateway(&relay.url, &app.admin, None).await;
    let echo = format!("{gw}/svc/ml/echo/");
    let http = reqwest::Client::new();
    eventually("an answer through the gateway", 20, async || {
        (call(&http, &echo, Some(&app.admin)).await.0 == 200).then_some(())
    })
    .await;

    // The broker is away: the last routes stay, calls go on; what they were is reported
    // once the broker is back (nothing was lost meanwhile).
    relay.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for _ in 0..10 {
        assert_eq!(call(&http, &echo, Some(&app.admin)).await.0, 200);
    }
    let seen = |v: &Value| v["traffic"]["requests"].as_u64().unwrap_or(0);
    let before = app
        .call(
            Method::GET,
            &format!("/api/v1/services/{id}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert!(seen(&before.body) < 11, "{}", before.body["traffic"]);
    relay.down.store(false, Ordering::SeqCst);
    eventually("the calls made while away, reported", 20, async || {
        let v = app
            .call(
                Method::GET,
                &format!("/api/v1/services/{id}"),
                Some(&app.admin),
                None,
            )
            .await;
        (seen(&v.body) >= 11).then_some(())
    })
    .await;
}

#[tokio::test]
async fn reports_are_checked_and_taken_once() {
    let app = TestApp::spawn().await;
    let now_s = app.app.clock.now().millis() / 1000;
    let service = uuid::Uuid::now_v7();
    let row = |patch: Value| {
        let mut r = json!({
            "service": service, "second": now_s, "batch": 0, "requests": 2, "errors": 1,
            "latency_sum_us": 3000, "buckets": [0, 1, 1], "queue_peak": 0, "in_flight": 0,
        });
        for (k, v) in patch.as_object().unwrap() {
            r[k] = v.clone();
        }
        json!({"gateway": "test/gw", "seconds": [r]})
    };
    let post = |token: String, body: Value| {
        let app = &app;
        async move {
            app.call(
                Method::POST,
                "/api/v1/gateway/reports",
                Some(&token),
                Some(body),
            )
            .await
        }
    };
    let admin = app.admin.clone();
    let r = post(admin.clone(), row(json!({}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["accepted"], 1);
    // The same row again (a retry whose answer was lost): taken once.
    let r = post(admin.clone(), row(json!({}))).await;
    assert_eq!(r.body["accepted"], 0, "{}", r.body);
    for (patch, field) in [
        (json!({"errors": 3}), "seconds[0].errors"),
        (json!({"buckets": [5]}), "seconds[0].buckets"),
        (json!({"second": now_s - 3600}), "seconds[0].second"),
        (json!({"in_flight": 2}), "seconds[0].in_flight"),
    ] {
        let r = post(admin.clone(), row(patch.clone())).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{patch}: {}",
            r.body
        );
        assert_eq!(r.error_field(), field, "{}", r.body);
    }
    let r = post(admin.clone(), json!({"gateway": "", "seconds": []})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(r.error_field(), "gateway");
    let dev = app.token("developer", Some("ml")).await;
    assert_eq!(post(dev.clone(), row(json!({}))).await.status, 403);
    let r = app
        .call(Method::GET, "/api/v1/gateway/routes", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // The stored row reaches the broker's windows.
    eventually("the report in the traffic", 10, async || {
        let w = app.app.traffic.service(service, app.app.clock.now(), 30);
        (w.requests == 2 && w.errors == 1).then_some(())
    })
    .await;
}

#[tokio::test]
async fn metrics_show_each_services_traffic_and_replicas() {
    let app = TestApp::spawn().await;
    let agent = app.agent(4).await;
    let (id, _) = deploy(&app, &agent, "echo", replica().await).await;
    let now_s = app.app.clock.now().millis() / 1000;
    // Two requests, one failed: 0.1 and 0.12 ms; then one of 1.5 s (bucket 85: up to 1.53 s).
    let report = json!({"gateway": "test/gw", "seconds": [
        {"service": id, "second": now_s - 1, "batch": 0, "requests": 2, "errors": 1,
         "latency_sum_us": 220, "buckets": [0, 1, 1]},
        {"service": id, "second": now_s, "batch": 1, "requests": 1, "errors": 0,
         "latency_sum_us": 1_500_000,
         "buckets": (0..86).map(|i| u64::from(i == 85)).collect::<Vec<_>>()},
    ]});
    let r = app
        .call(
            Method::POST,
            "/api/v1/gateway/reports",
            Some(&app.admin),
            Some(report),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let labels = format!("{{service=\"{id}\",team=\"ml\",name=\"echo\"}}");
    let with = |name: &str, le: Option<&str>| match le {
        Some(le) => format!("{name}{{le=\"{le}\",service=\"{id}\",team=\"ml\",name=\"echo\"}} "),
        None => format!("{name}{labels} "),
    };
    let text = eventually("the report in /metrics", 10, async || {
        let res = app
            .http
            .get(format!("{}/metrics", app.url))
            .bearer_auth(&app.admin)
            .send()
            .await
            .unwrap();
        let text = res.text().await.unwrap();
        text.contains(&format!(
            "{}3",
            with("switchyard_service_requests_total", None)
        ))
        .then_some(text)
    })
    .await;
    for line in [
        format!("{}1", with("switchyard_service_request_errors_total", None)),
        format!(
            "{}3",
            with("switchyard_service_latency_seconds_count", None)
        ),
        format!(
            "{}2",
            with("switchyard_service_latency_seconds_bucket", Some("0.005"))
        ),
        format!(
            "{}2",
            with("switchyard_service_latency_seconds_bucket", Some("1.0"))
        ),
        format!(
            "{}3",
            with("switchyard_service_latency_seconds_bucket", Some("2.5"))
        ),
        format!(
            "{}3",
            with("switchyard_service_latency_seconds_bucket", Some("+Inf"))
        ),
        format!("{}1", with("switchyard_service_desired_replicas", None)),
        format!("{}1", with("switchyard_service_ready_replicas", None)),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in:\n{}",
            text.lines()
                .filter(|l| l.contains("switchyard_service_"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Two brokers on one database (PostgreSQL in production; here also SQLite): a report taken by
/// one reaches the other's traffic windows and in-flight counts, so the leader's autoscaler
/// sees every gateway whichever broker it reported to.
#[tokio::test]
async fn a_report_taken_by_one_broker_reaches_the_other() {
    let a = TestApp::spawn().await;
    let url = a.app.config.database_url();
    let b = TestApp::spawn_with(
        |c| c.database_url = Some(url),
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await;
    let now_s = a.app.clock.now().millis() / 1000;
    let service = uuid::Uuid::now_v7();
    let job = uuid::Uuid::now_v7();
    let report = json!({"gateway": "eu/gw-1", "seconds": [
        {"service": service, "second": now_s, "batch": 0, "requests": 5, "errors": 0,
         "latency_sum_us": 5000, "buckets": [5]},
        {"service": service, "replica": job, "second": now_s, "batch": 0, "requests": 5,
         "errors": 0, "latency_sum_us": 5000, "buckets": [5], "in_flight": 2},
    ]});
    // Broker b takes it (with a's admin token: the tokens are the database's).
    let r = b
        .call(
            Method::POST,
            "/api/v1/gateway/reports",
            Some(&a.admin),
            Some(report),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["accepted"], 2);
    for app in [&a, &b] {
        eventually("the report in both brokers' windows", 10, async || {
            let w = app.app.traffic.service(service, app.app.clock.now(), 30);
            (w.requests == 5 && app.app.traffic.in_flight(JobId(job)) == 2).then_some(())
        })
        .await;
    }
}
