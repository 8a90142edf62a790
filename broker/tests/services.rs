//! The services API (issue 26) through the real router: deploy, read, list, update, delete and
//! events; roles and other teams; every bad input refused with 422 naming the field, storing
//! nothing; a duplicate name is 409. And the store's service methods (replicas with their
//! attempts, the desired count and its events, the cost from the ledger). On SQLite, or on
//! PostgreSQL with `SWITCHYARD_TEST_PG_URL`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn chat(team: &str) -> Value {
    json!({
        "name": "chat", "team": team, "project": "assistant",
        "command": ["python3", "serve.py"],
        "env": {"MODEL": "small"},
        "resources": {"gpus": 1, "gpu_models": ["H100"]},
        "priority": "critical",
        "replicas": {"min": 1, "max": 4},
        "scaling": {"target_p95_latency_ms": 300, "target_rps_per_replica": 20.0,
                    "max_concurrency_per_replica": 8, "window_s": 30,
                    "scale_up_delay_s": 15, "scale_down_delay_s": 120},
        "schedule": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00",
                      "to": "20:00", "tz": "Asia/Shanghai", "min_replicas": 2}],
        "readiness": {"path": "/health", "period_s": 2, "timeout_s": 1, "failure_threshold": 3},
        "callers": [{"region": "onprem:test-dc", "share": 1.0}],
        "regions": [],
        "max_latency_ms": 40,
        "spot": {"rule": "allowed", "min_on_demand": 1},
        "max_price_per_hour": 20.0
    })
}

fn with(base: &Value, patch: Value) -> Value {
    let mut spec = base.clone();
    for (k, v) in patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

async fn post(app: &TestApp, token: &str, spec: Value) -> Response {
    app.call(Method::POST, "/api/v1/services", Some(token), Some(spec))
        .await
}

async fn get(app: &TestApp, token: &str, path: &str) -> Response {
    app.call(Method::GET, path, Some(token), None).await
}

async fn put(app: &TestApp, token: &str, id: &str, spec: Value) -> Response {
    app.call(
        Method::PUT,
        &format!("/api/v1/services/{id}"),
        Some(token),
        Some(spec),
    )
    .await
}

async fn delete(app: &TestApp, token: &str, id: &str) -> Response {
    app.call(
        Method::DELETE,
        &format!("/api/v1/services/{id}"),
        Some(token),
        None,
    )
    .await
}

/// The services `token` lists, as (team, name, spec_version).
async fn listed(app: &TestApp, token: &str) -> Vec<(String, String, i64)> {
    let r = get(app, token, "/api/v1/services").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["team"].as_str().unwrap().to_string(),
                s["name"].as_str().unwrap().to_string(),
                s["spec_version"].as_i64().unwrap(),
            )
        })
        .collect()
}

async fn event_kinds(app: &TestApp, token: &str, id: &str) -> Vec<String> {
    let r = get(app, token, &format!("/api/v1/services/{id}/events")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_string())
        .collect()
}

fn id_of(r: &Response) -> String {
    r.body["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_service_is_deployed_read_listed_updated_and_deleted() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;

    let created = post(&app, &dev, chat("ml")).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let v = &created.body;
    let id = id_of(&created);
    assert_eq!(v["name"], "chat");
    assert_eq!(v["team"], "ml");
    assert_eq!(v["project"], "assistant");
    assert_eq!(v["spec_version"], 1);
    // This broker runs no gateway (`gateway_listen` unset): no endpoint to call.
    assert_eq!(v["endpoint"], "");
    assert_eq!(v["state"], "deploying", "no replica is ready yet: {v}");
    // 1 by replicas.min, or 2 by the schedule on a Shanghai working day.
    let desired = v["desired_replicas"].as_u64().unwrap();
    let reason = v["desired_reason"].as_str().unwrap();
    assert!(
        (desired == 1 && reason == "replicas.min: at least 1")
            || (desired == 2 && reason == "schedule mon–fri 08:00–20:00 Asia/Shanghai: at least 2"),
        "{v}"
    );
    assert_eq!(v["cost_usd"], 0.0);
    assert_eq!(v["traffic"]["window_s"], 30);
    assert_eq!(v["traffic"]["requests"], 0);
    let spec = |v: &Value| {
        serde_json::from_value::<switchyard_protocol::api::ServiceSpec>(v.clone()).unwrap()
    };
    assert_eq!(
        spec(&v["spec"]),
        spec(&chat("ml")),
        "the spec comes back as deployed"
    );
    assert_eq!(v["spec"]["public"], false, "with its defaults");

    // Read, and listed.
    let r = get(&app, &dev, &format!("/api/v1/services/{id}")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["id"], id.as_str());
    assert_eq!(
        listed(&app, &dev).await,
        vec![("ml".into(), "chat".into(), 1)]
    );
    let r = get(&app, &dev, "/api/v1/services?name=chat").await;
    assert_eq!(r.body["services"].as_array().unwrap().len(), 1);
    let r = get(&app, &dev, "/api/v1/services?name=other").await;
    assert_eq!(r.body["services"].as_array().unwrap().len(), 0);
    assert_eq!(event_kinds(&app, &dev, &id).await[0], "deployed");

    // A new version.
    let v2 = with(
        &chat("ml"),
        json!({"env": {"MODEL": "large"}, "project": "assist-2"}),
    );
    let r = put(&app, &dev, &id, v2.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["spec_version"], 2);
    assert_eq!(r.body["spec"]["env"]["MODEL"], "large");
    assert_eq!(r.body["project"], "assist-2");
    assert!(
        event_kinds(&app, &dev, &id)
            .await
            .contains(&"updated".to_string())
    );
    // The same spec again is no new version.
    let r = put(&app, &dev, &id, v2.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["spec_version"], 2);
    // A compare-and-swap on a stale version is refused and changes nothing.
    let v3 = with(&v2, json!({"env": {"MODEL": "huge"}}));
    let r = app
        .http
        .put(format!("{}/api/v1/services/{id}", app.url))
        .bearer_auth(&dev)
        .header("If-Match", "\"1\"")
        .json(&v3)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let r = app
        .http
        .put(format!("{}/api/v1/services/{id}", app.url))
        .bearer_auth(&dev)
        .header("If-Match", "\"2\"")
        .json(&v3)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["etag"], "\"3\"");
    // Team and name stay.
    for (field, value) in [("team", "cv"), ("name", "chat2")] {
        let r = put(&app, &app.admin, &id, with(&v3, json!({field: value}))).await;
        assert_eq!(r.status.as_u16(), 422, "{}", r.body);
        assert_eq!(r.error_code(), "invalid_field");
        assert_eq!(r.error_field(), field);
    }
    assert_eq!(
        listed(&app, &dev).await,
        vec![("ml".into(), "chat".into(), 3)]
    );

    // Delete: 202, stopped; its replicas drain. Gone from the list (it has none), readable.
    let r = delete(&app, &dev, &id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.body);
    assert_eq!(r.body["state"], "stopped");
    assert_eq!(r.body["desired_replicas"], 0);
    assert_eq!(delete(&app, &dev, &id).await.status, StatusCode::CONFLICT);
    assert_eq!(
        put(&app, &dev, &id, v3.clone()).await.status,
        StatusCode::CONFLICT
    );
    let r = get(&app, &dev, &format!("/api/v1/services/{id}")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body["state"], "stopped");
    // Listed only while replicas drain, and then as stopped.
    let r = get(&app, &dev, "/api/v1/services").await;
    for s in r.body["services"].as_array().unwrap() {
        assert_eq!(s["state"], "stopped", "{s}");
    }
    let kinds = event_kinds(&app, &dev, &id).await;
    assert!(kinds.contains(&"deleted".to_string()), "{kinds:?}");
    // Events read on from an id, oldest first.
    let r = get(&app, &dev, &format!("/api/v1/services/{id}/events?limit=1")).await;
    let first = r.body["events"][0]["id"].as_i64().unwrap();
    assert_eq!(r.body["events"].as_array().unwrap().len(), 1);
    assert_eq!(r.body["events"][0]["kind"], "deployed");
    let r = get(
        &app,
        &dev,
        &format!("/api/v1/services/{id}/events?after={first}"),
    )
    .await;
    let ids: Vec<i64> = r.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert!(
        ids.len() >= 3 && ids.windows(2).all(|w| w[0] < w[1]) && ids[0] > first,
        "{ids:?}"
    );
    let r = get(&app, &dev, &format!("/api/v1/services/{id}/events?limit=0")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_field(), "limit");

    // The name is free again.
    let again = post(&app, &dev, chat("ml")).await;
    assert_eq!(again.status, StatusCode::CREATED, "{}", again.body);
    assert_ne!(id_of(&again), id);
}

#[tokio::test]
async fn a_name_taken_in_the_team_is_409_and_free_in_another() {
    let app = TestApp::spawn().await;
    let first = post(&app, &app.admin, chat("ml")).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.body);
    let again = post(
        &app,
        &app.admin,
        with(&chat("ml"), json!({"replicas": {"min": 2, "max": 2}})),
    )
    .await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert_eq!(again.error_code(), "conflict");
    let message = again.body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&id_of(&first)), "{message}");
    let other = post(&app, &app.admin, chat("cv")).await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.body);
    assert_eq!(
        listed(&app, &app.admin).await,
        vec![
            ("cv".into(), "chat".into(), 1),
            ("ml".into(), "chat".into(), 1)
        ]
    );
}

#[tokio::test]
async fn roles_and_other_teams() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    let finance = app.token("finance", None).await;
    let infra = app.token("infra", None).await;

    for token in [None, Some("sya_nope")] {
        let r = app.call(Method::GET, "/api/v1/services", token, None).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{token:?}");
    }
    let created = post(&app, &ml, chat("ml")).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let id = id_of(&created);
    let path = format!("/api/v1/services/{id}");

    // Another team's developer: 404 everywhere, an empty list, no deploying for ml.
    assert_eq!(get(&app, &cv, &path).await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        get(&app, &cv, &format!("{path}/events")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        put(&app, &cv, &id, chat("ml")).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(delete(&app, &cv, &id).await.status, StatusCode::NOT_FOUND);
    assert!(listed(&app, &cv).await.is_empty());
    let r = get(&app, &cv, "/api/v1/services?team=ml").await;
    assert_eq!(r.body["services"].as_array().unwrap().len(), 0);
    let r = post(&app, &cv, chat("ml")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    // Unknown and malformed ids are 404 too.
    let r = get(&app, &ml, "/api/v1/services/not-a-uuid").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.error_code(), "not_found");
    let r = get(
        &app,
        &ml,
        &format!("/api/v1/services/{}", uuid::Uuid::now_v7()),
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // Finance and infra read every team's, change nothing.
    for token in [&finance, &infra] {
        assert_eq!(get(&app, token, &path).await.status, StatusCode::OK);
        assert_eq!(listed(&app, token).await.len(), 1);
        let r = get(&app, token, "/api/v1/services?team=ml").await;
        assert_eq!(r.body["services"].as_array().unwrap().len(), 1);
        assert_eq!(
            post(&app, token, chat("ml")).await.status,
            StatusCode::FORBIDDEN
        );
        let v2 = with(&chat("ml"), json!({"env": {}}));
        assert_eq!(
            put(&app, token, &id, v2).await.status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(delete(&app, token, &id).await.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(
        listed(&app, &ml).await,
        vec![("ml".into(), "chat".into(), 1)]
    );

    // The admin deploys for any team and changes any.
    let r = post(&app, &app.admin, chat("cv")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(
        listed(&app, &cv).await,
        vec![("cv".into(), "chat".into(), 1)]
    );
    let r = put(&app, &app.admin, &id, with(&chat("ml"), json!({"env": {}}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(
        delete(&app, &app.admin, &id).await.status,
        StatusCode::ACCEPTED
    );
}

/// Every bad input is 422 with the field named (in `field` and in the message); nothing is
/// stored: the list and the existing service's version and events stay as they were.
#[tokio::test]
async fn bad_services_get_422_naming_the_field_and_store_nothing() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let good = post(&app, &dev, chat("ml")).await;
    assert_eq!(good.status, StatusCode::CREATED, "{}", good.body);
    let id = id_of(&good);
    let events_before = event_kinds(&app, &dev, &id).await;
    let before = listed(&app, &app.admin).await;
    // Another name, so that a POST is refused for what is wrong with it, not for the name.
    let base = with(&chat("ml"), json!({"name": "chat-b"}));
    let sched = |rule: Value| {
        let mut r = json!({"days": ["mon"], "from": "08:00", "to": "20:00", "tz": "UTC",
                           "min_replicas": 1});
        for (k, v) in rule.as_object().unwrap() {
            r[k] = v.clone();
        }
        json!({"schedule": [r]})
    };
    let ready = |probe: Value| {
        let mut r = json!({"path": "/health"});
        for (k, v) in probe.as_object().unwrap() {
            r[k] = v.clone();
        }
        json!({"readiness": r})
    };
    let scaling = |k: &str, v: Value| json!({"scaling": {k: v}});
    let inv = "invalid_field";
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "unknown key",
            with(&base, json!({"colour": "red"})),
            inv,
            "colour",
        ),
        (
            "unknown nested key",
            with(&base, json!({"replicas": {"min": 1, "max": 2, "avg": 1}})),
            inv,
            "replicas.avg",
        ),
        (
            "unknown scaling key",
            with(&base, scaling("target_qps", json!(3))),
            inv,
            "scaling.target_qps",
        ),
        (
            "missing command",
            json!({"name": "x", "team": "ml", "resources": {"gpus": 1}}),
            inv,
            "command",
        ),
        (
            "missing gpus",
            with(&base, json!({"resources": {"gpu_models": ["H100"]}})),
            inv,
            "resources.gpus",
        ),
        (
            "min > max",
            with(&base, json!({"replicas": {"min": 5, "max": 2}})),
            inv,
            "replicas.min",
        ),
        (
            "negative min",
            with(&base, json!({"replicas": {"min": -1, "max": 2}})),
            inv,
            "replicas.min",
        ),
        (
            "max 0",
            with(&base, json!({"replicas": {"min": 0, "max": 0}})),
            inv,
            "replicas.max",
        ),
        (
            "absurd max",
            with(&base, json!({"replicas": {"min": 1, "max": 1000}})),
            inv,
            "replicas.max",
        ),
        (
            "replicas as text",
            with(&base, json!({"replicas": {"min": "one", "max": 2}})),
            inv,
            "replicas.min",
        ),
        (
            "path without /",
            with(&base, ready(json!({"path": "health"}))),
            inv,
            "readiness.path",
        ),
        (
            "path with a space",
            with(&base, ready(json!({"path": "/a b"}))),
            inv,
            "readiness.path",
        ),
        (
            "period 0",
            with(&base, ready(json!({"period_s": 0}))),
            inv,
            "readiness.period_s",
        ),
        (
            "timeout 0",
            with(&base, ready(json!({"timeout_s": 0}))),
            inv,
            "readiness.timeout_s",
        ),
        (
            "timeout over period",
            with(&base, ready(json!({"period_s": 2, "timeout_s": 5}))),
            inv,
            "readiness.timeout_s",
        ),
        (
            "threshold 0",
            with(&base, ready(json!({"failure_threshold": 0}))),
            inv,
            "readiness.failure_threshold",
        ),
        (
            "shares not summing to 1",
            with(
                &base,
                json!({"callers": [{"region": "onprem:test-dc", "share": 0.9}]}),
            ),
            inv,
            "callers",
        ),
        (
            "negative share",
            with(
                &base,
                json!({"callers": [{"region": "onprem:test-dc", "share": 1.0},
                                           {"region": "onprem:test-dc", "share": -0.5}]}),
            ),
            inv,
            "callers[1].share",
        ),
        (
            "caller region twice",
            with(
                &base,
                json!({"callers": [{"region": "onprem:test-dc", "share": 0.5},
                                           {"region": "onprem:test-dc", "share": 0.5}]}),
            ),
            inv,
            "callers[1].region",
        ),
        (
            "unknown caller region",
            with(
                &base,
                json!({"callers": [{"region": "aws:mars-1", "share": 1.0}]}),
            ),
            inv,
            "callers[0].region",
        ),
        (
            "unknown region",
            with(&base, json!({"regions": ["aws:mars-1"]})),
            inv,
            "regions[0]",
        ),
        (
            "malformed region",
            with(&base, json!({"regions": ["nowhere"]})),
            inv,
            "regions",
        ),
        (
            "day not a day",
            with(&base, sched(json!({"days": ["monday"]}))),
            inv,
            "schedule[0].days[0]",
        ),
        (
            "no days",
            with(&base, sched(json!({"days": []}))),
            inv,
            "schedule[0].days",
        ),
        (
            "from not HH:MM",
            with(&base, sched(json!({"from": "8:00"}))),
            inv,
            "schedule[0].from",
        ),
        (
            "from 24:00",
            with(&base, sched(json!({"from": "24:00"}))),
            inv,
            "schedule[0].from",
        ),
        (
            "to not a time",
            with(&base, sched(json!({"to": "25:00"}))),
            inv,
            "schedule[0].to",
        ),
        (
            "tz not a zone",
            with(&base, sched(json!({"tz": "Mars/Olympus"}))),
            inv,
            "schedule[0].tz",
        ),
        (
            "schedule over max",
            with(&base, sched(json!({"min_replicas": 10}))),
            inv,
            "schedule[0].min_replicas",
        ),
        (
            "negative schedule minimum",
            with(&base, sched(json!({"min_replicas": -1}))),
            inv,
            "schedule[0].min_replicas",
        ),
        (
            "latency target 0",
            with(&base, scaling("target_p95_latency_ms", json!(0))),
            inv,
            "scaling.target_p95_latency_ms",
        ),
        (
            "negative rps",
            with(&base, scaling("target_rps_per_replica", json!(-1.0))),
            inv,
            "scaling.target_rps_per_replica",
        ),
        (
            "concurrency 0",
            with(&base, scaling("max_concurrency_per_replica", json!(0))),
            inv,
            "scaling.max_concurrency_per_replica",
        ),
        (
            "window 0",
            with(&base, scaling("window_s", json!(0))),
            inv,
            "scaling.window_s",
        ),
        (
            "negative delay",
            with(&base, scaling("scale_down_delay_s", json!(-5))),
            inv,
            "scaling.scale_down_delay_s",
        ),
        (
            "zero gpus",
            with(&base, json!({"resources": {"gpus": 0}})),
            inv,
            "resources.gpus",
        ),
        (
            "more gpus than any node",
            with(&base, json!({"resources": {"gpus": 8}})),
            "unsatisfiable",
            "resources.gpus",
        ),
        (
            "unknown gpu model",
            with(
                &base,
                json!({"resources": {"gpus": 1, "gpu_models": ["Z9000"]}}),
            ),
            "unsatisfiable",
            "resources.gpu_models",
        ),
        (
            "bad priority",
            with(&base, json!({"priority": "urgent"})),
            inv,
            "priority",
        ),
        (
            "bad spot rule",
            with(&base, json!({"spot": {"rule": "sometimes"}})),
            inv,
            "spot.rule",
        ),
        (
            "negative on-demand floor",
            with(
                &base,
                json!({"spot": {"rule": "allowed", "min_on_demand": -1}}),
            ),
            inv,
            "spot.min_on_demand",
        ),
        (
            "negative max price",
            with(&base, json!({"max_price_per_hour": -1.0})),
            inv,
            "max_price_per_hour",
        ),
        (
            "env PORT",
            with(&base, json!({"env": {"PORT": "80"}})),
            inv,
            "env.PORT",
        ),
        (
            "env GPUs",
            with(&base, json!({"env": {"CUDA_VISIBLE_DEVICES": "0"}})),
            inv,
            "env.CUDA_VISIBLE_DEVICES",
        ),
        (
            "bad env name",
            with(&base, json!({"env": {"1BAD": "x"}})),
            inv,
            "env.1BAD",
        ),
        (
            "name with a space",
            with(&base, json!({"name": "has space"})),
            inv,
            "name",
        ),
        (
            "name with a slash",
            with(&base, json!({"name": "a/b"})),
            inv,
            "name",
        ),
        (
            "empty command",
            with(&base, json!({"command": []})),
            inv,
            "command",
        ),
        (
            "latency 0",
            with(&base, json!({"max_latency_ms": 0})),
            inv,
            "max_latency_ms",
        ),
        (
            "bad team",
            with(&base, json!({"team": "has space"})),
            inv,
            "team",
        ),
    ];
    for (what, spec, code, field) in &cases {
        // A developer naming another team is refused before validation (403): the team's own
        // validity is checked with the admin's token.
        let token = if *what == "bad team" {
            &app.admin
        } else {
            &dev
        };
        let r = post(&app, token, spec.clone()).await;
        assert_eq!(r.status.as_u16(), 422, "{what}: {}", r.body);
        assert_eq!(r.error_code(), *code, "{what}: {}", r.body);
        assert_eq!(r.error_field(), *field, "{what}: {}", r.body);
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(field),
            "{what}: the message names the field: {message}"
        );
        // The same spec as a new version of the existing service (under its name) is refused
        // alike.
        if *what != "bad team" && *what != "missing command" {
            let as_update = with(spec, json!({"name": "chat"}));
            if *field != "name" {
                let r = put(&app, token, &id, as_update).await;
                assert_eq!(r.status.as_u16(), 422, "PUT {what}: {}", r.body);
                assert_eq!(r.error_field(), *field, "PUT {what}: {}", r.body);
            }
        }
    }

    // A policy that can never allow it: 422 policy_violation, naming the field.
    let r = app
        .call(
            Method::PUT,
            "/api/v1/policies/ml",
            Some(&app.admin),
            Some(json!({"max_price_per_gpu_hour": 0.5})),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.body);
    let r = post(&app, &dev, base.clone()).await;
    assert_eq!(r.status.as_u16(), 422, "{}", r.body);
    assert_eq!(r.error_code(), "policy_violation");
    assert_eq!(r.error_field(), "max_price_per_hour");

    // Malformed JSON stays 400.
    let r = app
        .raw(
            "/api/v1/services",
            &dev,
            "application/json",
            b"{\"name\": ".to_vec(),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_code(), "malformed_json");
    let r = app
        .raw("/api/v1/services", &dev, "text/plain", b"name = 1".to_vec())
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.error_code(), "unsupported_media_type");

    assert_eq!(
        listed(&app, &app.admin).await,
        before,
        "a refused input left a row"
    );
    let kinds = event_kinds(&app, &dev, &id).await;
    assert_eq!(kinds[..events_before.len()], events_before[..]);
    assert!(!kinds.contains(&"updated".to_string()), "{kinds:?}");
}

/// The store's service methods on their own: replicas with their current attempt (where it
/// runs, how it serves, whether it is ready), the desired count (a `scaled` event only when it
/// changes), free-form events, the cost from the ledger, and the lists.
#[tokio::test]
async fn the_store_reads_replicas_desired_counts_events_and_cost() {
    use switchyard_broker::rules::lease::AttemptState;
    use switchyard_broker::store::*;
    use switchyard_core::{
        AttemptId, JobId, JobState, Market, Money, Pool, PoolId, Region, RegionId, Timestamp,
    };
    use switchyard_protocol::agent::{AgentEvent, AttemptRef, ServeSpec};

    let dir = tempfile::tempdir().unwrap();
    let store = test_store(dir.path()).await;
    let config = test_config(dir.path());
    let region = Region {
        id: RegionId("onprem:dc".into()),
        provider: "onprem".into(),
        code: "dc".into(),
        latitude: None,
        longitude: None,
        egress_per_gb: Money::ZERO,
        latency_ms: 1,
        ingress_gbps: 10,
    };
    let pool = Pool {
        id: PoolId("onprem:dc/h100".into()),
        region: region.id.clone(),
        provider: "onprem".into(),
        instance_type: "h100".into(),
        gpu_model: "H100".into(),
        gpus_per_node: 4,
        gpu_memory_gb: 80,
        vcpus: 0,
        memory_gb: 0,
        on_demand_per_hour: Money(14_400_000),
        spot_per_hour: None,
        node_limit: 1,
        launchable: false,
        boot_time_s: 0,
        price_updated_at: Timestamp(0),
        recent_capacity_failures: 0,
        marginal_per_hour: None,
    };
    store.upsert_region(&region).await.unwrap();
    store.upsert_pool(&pool).await.unwrap();
    let t0 = Timestamp(1_800_000_000_000);
    let at = |ms: i64| Timestamp(t0.millis() + ms);

    let spec = chat("ml");
    let new = NewService {
        id: uuid::Uuid::now_v7(),
        team: "ml".into(),
        project: Some("assistant".into()),
        name: "chat".into(),
        spec_json: spec.to_string(),
        desired_replicas: 1,
        desired_reason: "replicas.min: at least 1".into(),
        created_at: t0,
    };
    let ServiceInsert::Inserted(record) = store.insert_service(&new).await.unwrap() else {
        panic!("not inserted");
    };
    assert_eq!(record.spec_version, 1);
    let dup = NewService {
        id: uuid::Uuid::now_v7(),
        ..new.clone()
    };
    assert_eq!(
        store.insert_service(&dup).await.unwrap(),
        ServiceInsert::NameTaken { existing: new.id }
    );
    let read = store.service(new.id).await.unwrap().unwrap();
    assert_eq!(read, record, "read back as written");
    assert_eq!(
        store.services(Some("ml")).await.unwrap(),
        vec![record.clone()]
    );
    assert!(store.services(Some("cv")).await.unwrap().is_empty());

    // Two replicas of version 1, one placed and started on a node.
    let wire: switchyard_protocol::api::ServiceSpec = serde_json::from_value(spec).unwrap();
    let replica = |v: i64| {
        let job = switchyard_broker::rules::service::replica_job_spec(&wire);
        NewJob {
            id: JobId(uuid::Uuid::now_v7()),
            spec: switchyard_broker::rules::convert::job_spec(&job, t0).unwrap(),
            spec_json: serde_json::to_string(&job).unwrap(),
            submitted_at: t0,
            trace_parent: None,
            replica: Some(ReplicaOf {
                service: new.id,
                version: v,
                serve: ServeSpec { readiness: None },
            }),
        }
    };
    let (r1, r2) = (replica(1), replica(1));
    store.insert_job(&r1).await.unwrap();
    store.insert_job(&r2).await.unwrap();
    let rows = store.service_replicas(new.id, t0).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r.attempt.is_none()
        && r.job_state == JobState::Queued
        && r.service_version == 1
        && !r.cancel_requested));

    let node = enrol_node(&store, &pool.id, t0).await;
    let attempt = AttemptId(uuid::Uuid::now_v7());
    store
        .commit_plan(
            &[NewAttempt {
                id: attempt,
                job: r1.id,
                job_version: 0,
                node: node.clone(),
                pool: pool.id.clone(),
                gpus: vec![0],
                market: Market::OnDemand,
                estimated_cost: Money(100_000),
                hourly_rate: Money(3_600_000),
                hourly_cash: Money(3_600_000),
                expected_end: Timestamp::MAX,
                rank: 0,
            }],
            &[],
            t0,
        )
        .await
        .unwrap();
    let aref = AttemptRef {
        job_id: r1.id.0,
        attempt_id: attempt.0,
        epoch: 1,
    };
    store
        .apply_events(
            &node,
            &[AgentEvent::Started {
                attempt: aref.clone(),
                pid: 1,
            }],
            at(1_000),
        )
        .await
        .unwrap();
    // The agent's report of where it serves and that its probe passes (the agent protocol's
    // part, written here by hand).
    execute_raw(
        &config,
        "UPDATE attempts SET serve_host = '127.0.0.1', serve_port = 41000, ready = TRUE",
    )
    .await
    .unwrap();
    let rows = store.service_replicas(new.id, t0).await.unwrap();
    let placed = rows.iter().find(|r| r.job == r1.id).unwrap();
    assert_eq!(placed.job_state, JobState::Running);
    let a = placed.attempt.as_ref().unwrap();
    assert_eq!(
        (
            a.attempt,
            a.state,
            &a.node,
            &a.pool,
            a.region.as_str(),
            a.market
        ),
        (
            attempt,
            AttemptState::Running,
            &node,
            &pool.id,
            "onprem:dc",
            Market::OnDemand
        )
    );
    assert_eq!(
        (a.serve_host.as_deref(), a.serve_port, a.ready),
        (Some("127.0.0.1"), Some(41000), true)
    );
    let view = switchyard_broker::rules::service::service_view(&read, &rows, Some("gw:1")).unwrap();
    assert_eq!(view.state, switchyard_protocol::api::ServiceState::Ready);
    assert_eq!(view.endpoint, "http://gw:1/svc/ml/chat/");
    assert_eq!(view.replicas.len(), 2);

    // Ten seconds charged to the running replica: the service's cost.
    assert_eq!(store.accrue_ledger(at(11_000), 0).await.unwrap(), 1);
    let cost = store.service(new.id).await.unwrap().unwrap().cost;
    assert_eq!(cost, Money(10_000));

    // The desired count: an event only when it changes.
    assert!(
        store
            .set_service_desired(
                new.id,
                3,
                "p95 412 ms above the 300 ms target for 15 s",
                at(2_000)
            )
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_service_desired(new.id, 3, "still slow", at(3_000))
            .await
            .unwrap()
    );
    let s = store.service(new.id).await.unwrap().unwrap();
    assert_eq!(
        (s.desired_replicas, s.desired_reason.as_str()),
        (3, "still slow")
    );
    let id = store
        .append_service_event(
            new.id,
            "replica_ready",
            "a replica is ready",
            Some("{\"n\":1}"),
            at(4_000),
        )
        .await
        .unwrap();
    let events = store.service_events(new.id, 0, 100).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["deployed", "scaled", "replica_ready"]);
    assert_eq!(
        events[1].message,
        "1 → 3 replicas: p95 412 ms above the 300 ms target for 15 s"
    );
    assert_eq!(events[2].id, id);
    assert_eq!(events[2].details_json.as_deref(), Some("{\"n\":1}"));
    assert_eq!(
        store.service_events(new.id, events[0].id, 1).await.unwrap(),
        vec![events[1].clone()]
    );

    // A compare-and-swap update.
    assert_eq!(
        store
            .update_service_spec(new.id, Some(5), None, "{}", at(5_000))
            .await
            .unwrap(),
        ServiceUpdate::Stale { current: 1 }
    );
    let ServiceUpdate::Updated(s) = store
        .update_service_spec(new.id, Some(1), Some("p2"), &read.spec_json, at(5_000))
        .await
        .unwrap()
    else {
        panic!("not updated");
    };
    assert_eq!(
        (s.spec_version, s.project.as_deref(), s.updated_at),
        (2, Some("p2"), at(5_000))
    );
    assert_eq!(s.cost, Money(10_000));
    assert_eq!(
        store
            .update_service_spec(uuid::Uuid::now_v7(), None, None, "{}", at(5_000))
            .await
            .unwrap(),
        ServiceUpdate::NotFound
    );

    // Deleted: desired 0, listed while a replica is live, a deleted service's spec is frozen.
    let ServiceDelete::Deleted(d) = store.delete_service(new.id, at(6_000)).await.unwrap() else {
        panic!("not deleted");
    };
    assert_eq!((d.desired_replicas, d.deleted_at), (0, Some(at(6_000))));
    assert_eq!(
        store.delete_service(new.id, at(7_000)).await.unwrap(),
        ServiceDelete::AlreadyDeleted(at(6_000))
    );
    assert_eq!(
        store
            .update_service_spec(new.id, None, None, "{}", at(7_000))
            .await
            .unwrap(),
        ServiceUpdate::Deleted
    );
    assert!(
        !store
            .set_service_desired(new.id, 2, "late", at(7_000))
            .await
            .unwrap()
    );
    assert_eq!(
        store.services(None).await.unwrap().len(),
        1,
        "draining: still listed"
    );
    // A new service may take the name at once.
    let next = NewService {
        id: uuid::Uuid::now_v7(),
        ..new.clone()
    };
    assert!(matches!(
        store.insert_service(&next).await.unwrap(),
        ServiceInsert::Inserted(_)
    ));

    // The replicas end: the one that ran finished (shown while recent), the queued one
    // cancelled; the deleted service leaves the list.
    store
        .apply_events(
            &node,
            &[AgentEvent::Finished {
                attempt: aref,
                exit_code: Some(1),
                signal: None,
                error: None,
                stopped: false,
                requeue: false,
                drained: false,
            }],
            at(20_000),
        )
        .await
        .unwrap();
    store.cancel_job(r2.id, at(20_000)).await.unwrap();
    let rows = store.service_replicas(new.id, at(20_000)).await.unwrap();
    assert_eq!(rows.len(), 2, "ended at the cut-off: shown");
    let failed = rows.iter().find(|r| r.job == r1.id).unwrap();
    assert_eq!(failed.job_state, JobState::Failed);
    assert_eq!(failed.finished_at, Some(at(20_000)));
    assert!(
        store
            .service_replicas(new.id, at(20_001))
            .await
            .unwrap()
            .is_empty()
    );
    let listed: Vec<uuid::Uuid> = store
        .services(None)
        .await
        .unwrap()
        .iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, vec![next.id]);
}

/// Enrols node `n1` of `pool` at `at`, straight through the store.
async fn enrol_node(
    store: &switchyard_broker::store::Store,
    pool: &switchyard_core::PoolId,
    at: switchyard_core::Timestamp,
) -> switchyard_core::NodeId {
    use switchyard_broker::store::{EnrolmentTokenRecord, NewNode};
    store
        .insert_enrolment_token(&EnrolmentTokenRecord {
            token_hash: "enrol".into(),
            pool: pool.clone(),
            instance: None,
            created_at: at,
            expires_at: at.plus_secs(3600),
        })
        .await
        .unwrap();
    let node = switchyard_core::NodeId("n1".into());
    store
        .register_node(
            "enrol",
            NewNode {
                id: node.clone(),
                address: None,
                token_hash: "agent".into(),
                hostname: "h".into(),
                gpus_total: 4,
                inventory_json: "{}".into(),
            },
            at,
        )
        .await
        .unwrap()
        .unwrap();
    node
}

#[tokio::test]
async fn replicas_that_may_take_spot_keep_the_on_demand_minimum() {
    let app = TestApp::spawn().await;
    let spec = with(
        &chat("ml"),
        json!({"replicas": {"min": 3, "max": 3}, "schedule": [],
               "spot": {"rule": "allowed", "min_on_demand": 1}}),
    );
    let r = post(&app, &app.admin, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let id = id_of(&r);
    // The reconciler starts three replicas: one never takes spot, the others may.
    let mut rules = Vec::new();
    for _ in 0..100 {
        let jobs = get(&app, &app.admin, "/api/v1/jobs?limit=100").await;
        rules = jobs.body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["spec"]["name"] == "chat")
            .map(|j| j["spec"]["spot"].as_str().unwrap_or("").to_string())
            .collect();
        if rules.len() >= 3 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    rules.sort();
    assert_eq!(rules, ["allowed", "allowed", "never"], "service {id}");
}
