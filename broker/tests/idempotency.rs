//! `Idempotency-Key` on `POST /api/v1/jobs` through the real router: a retry returns the job
//! the first request made (200), the same key with another spec is refused (422, nothing
//! stored), keys live in their team's scope, and a malformed key is refused (400, naming it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::http::StatusCode;
use common::*;
use serde_json::{Value, json};

async fn post(app: &TestApp, token: &str, key: Option<&str>, spec: &Value) -> (StatusCode, Value) {
    let mut req = app
        .http
        .post(format!("{}/api/v1/jobs", app.url))
        .bearer_auth(token)
        .json(spec);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_retry_with_the_same_key_returns_the_first_job_and_another_spec_is_refused() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let spec = job_spec("ml");
    let (status, first) = post(&app, &ml, Some("retry-1"), &spec).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    // The same spec, written differently (field order), is the same request.
    let reordered =
        json!({"resources": {"gpus": 1}, "command": ["true"], "team": "ml", "name": "t"});
    let (status, again) = post(&app, &ml, Some("retry-1"), &reordered).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    let mut other = spec.clone();
    other["name"] = json!("other");
    let (status, refused) = post(&app, &ml, Some("retry-1"), &other).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
    assert_eq!(refused["error"]["code"], "idempotency_key_reused");
    assert_eq!(refused["error"]["field"], "Idempotency-Key");
    assert_eq!(app.job_count().await, 1);
    // Without a key every request is a new job.
    assert_eq!(post(&app, &ml, None, &spec).await.0, StatusCode::CREATED);
    assert_eq!(post(&app, &ml, None, &spec).await.0, StatusCode::CREATED);
    assert_eq!(app.job_count().await, 3);
}

#[tokio::test]
async fn keys_are_scoped_to_the_tokens_team() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let ml2 = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    let (s1, a) = post(&app, &ml, Some("shared"), &job_spec("ml")).await;
    let (s2, b) = post(&app, &cv, Some("shared"), &job_spec("cv")).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::CREATED));
    assert_ne!(a["id"], b["id"]);
    // Another token of the same team shares the team's keys.
    let (s3, c) = post(&app, &ml2, Some("shared"), &job_spec("ml")).await;
    assert_eq!(s3, StatusCode::OK, "{c}");
    assert_eq!(c["id"], a["id"]);
}

#[tokio::test]
async fn a_malformed_key_is_refused_and_nothing_is_stored() {
    let app = TestApp::spawn().await;
    let ml = app.token("developer", Some("ml")).await;
    let long = "k".repeat(256);
    for key in ["", "has space", "tab\there", long.as_str(), "ünïcode"] {
        let (status, body) = post(&app, &ml, Some(key), &job_spec("ml")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{key:?}: {body}");
        assert_eq!(body["error"]["field"], "Idempotency-Key", "{body}");
    }
    assert_eq!(app.job_count().await, 0);
}
