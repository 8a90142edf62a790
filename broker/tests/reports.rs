//! What an agent reports and what a reader asks for, held to the protocol: a job's output
//! chunks are numbered from 0 without gaps (a chunk that skips a number is rejected, never
//! stored), and a log page cannot start before the first entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::http::{Method, StatusCode};
use common::*;
use serde_json::json;

#[tokio::test]
async fn a_log_chunk_that_skips_a_number_is_rejected_and_not_stored() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app.submit(&dev, job_spec("ml")).await;
    let job = r.body["id"].as_str().unwrap().to_string();
    let attempt = start_leased(&app, &agent, &job, 1).await;
    let chunk = |seq: u64, text: &str| json!({"type": "log", "attempt": attempt, "seq": seq, "stream": "stdout", "data": text});
    assert_eq!(
        events(&app, &agent, json!([chunk(0, "a\n")])).await,
        ["accepted"]
    );
    // 2 before 1: the chunk in between was never sent.
    assert_eq!(
        events(&app, &agent, json!([chunk(2, "c\n")])).await,
        ["rejected"]
    );
    let logs = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{job}/logs"),
            Some(&dev),
            None,
        )
        .await;
    let texts: Vec<&str> = logs.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["a\n"]);
    // A sequence number past what the store can hold is rejected too, not a failed batch.
    let huge = json!({"type": "log", "attempt": attempt, "seq": u64::MAX, "stream": "stdout",
                      "data": "x"});
    assert_eq!(events(&app, &agent, json!([huge])).await, ["rejected"]);
}

#[tokio::test]
async fn in_order_chunks_and_their_retries_are_accepted() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app.submit(&dev, job_spec("ml")).await;
    let job = r.body["id"].as_str().unwrap().to_string();
    let attempt = start_leased(&app, &agent, &job, 1).await;
    let chunk = |seq: u64| {
        json!({"type": "log", "attempt": attempt, "seq": seq, "stream": "stdout",
               "data": format!("{seq}\n")})
    };
    assert_eq!(
        events(&app, &agent, json!([chunk(0), chunk(1), chunk(2)])).await,
        ["accepted", "accepted", "accepted"]
    );
    // A batch sent again (its answer was lost) is acknowledged again, chunk by chunk.
    assert_eq!(
        events(&app, &agent, json!([chunk(1), chunk(2), chunk(3)])).await,
        ["duplicate", "duplicate", "accepted"]
    );
}

#[tokio::test]
async fn a_log_page_after_a_negative_offset_is_refused() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app.submit(&dev, job_spec("ml")).await;
    let job = r.body["id"].as_str().unwrap();
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/jobs/{job}/logs?after=-5"),
            Some(&dev),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.error_field(), "after");
}
