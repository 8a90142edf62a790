//! The model emulator (`src/bin/model-emulator.rs`) as a replica would run it: on `$PORT`, with
//! its health route, its model's timing (checked with generous bounds only), its slots (checked
//! by counting requests in service, never by time), streaming and its refusals.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard_tests::{Proc, eventually, free_port};

struct Emulator {
    url: String,
    http: reqwest::Client,
    _proc: Proc,
    _dir: tempfile::TempDir,
}

impl Emulator {
    /// Starts the emulator with `args`, its port in `$PORT` as an agent gives it, and waits
    /// until it listens.
    async fn start(args: &[&str]) -> Emulator {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_model-emulator"));
        cmd.args(args).env("PORT", port.to_string());
        let proc = Proc::spawn("model-emulator", cmd, &dir.path().join("emulator.log")).unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        eventually("the emulator to listen", Duration::from_secs(10), || {
            let r = http.get(format!("{url}/stats")).send();
            async move { r.await.ok().map(|_| ()) }
        })
        .await;
        Emulator {
            url,
            http,
            _proc: proc,
            _dir: dir,
        }
    }

    async fn complete(&self, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/v1/completions", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    async fn stats(&self) -> Value {
        self.http
            .get(format!("{}/stats", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    async fn health(&self) -> u16 {
        self.http
            .get(format!("{}/health", self.url))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }
}

#[tokio::test]
async fn a_completion_takes_the_models_time_and_speedup_shortens_it() {
    // 1 ms fixed, 0.1 ms per prompt token, 20 ms per generated token, no batch growth:
    // 100 prompt tokens and 20 out are 1 + 10 + 400 = 411 ms of model time.
    let model = [
        "--base-us",
        "1000",
        "--prefill-us-per-token",
        "100",
        "--decode-us-per-token",
        "20000",
        "--decode-growth-us-per-peer",
        "0",
    ];
    let real = Emulator::start(&model).await;
    assert_eq!(real.health().await, 200);
    let started = Instant::now();
    let (status, body) = real
        .complete(json!({"prompt_tokens": 100, "max_tokens": 20}))
        .await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 100);
    assert_eq!(body["usage"]["completion_tokens"], 20);
    assert_eq!(
        body["choices"][0]["text"]
            .as_str()
            .unwrap()
            .split_whitespace()
            .count(),
        20
    );
    // Sleeps never end early; the upper bound is generous for a loaded machine.
    assert!(took >= Duration::from_millis(411), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        body["timings"]["decode_ms"].as_f64().unwrap() >= 400.0,
        "{body}"
    );

    // 10× faster: the same request's 4 s of decode take at least 0.4 s and well under 4 s.
    let fast = Emulator::start(&[&model[..], &["--speedup", "10"]].concat()).await;
    let started = Instant::now();
    let (status, body) = fast
        .complete(json!({"prompt": "a prompt of six words here", "max_tokens": 200}))
        .await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["prompt_tokens"], 6);
    assert_eq!(body["usage"]["completion_tokens"], 200);
    assert!(took >= Duration::from_millis(400), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // Instant: no model time at all, even for a long answer.
    let instant = Emulator::start(&["--instant"]).await;
    let started = Instant::now();
    let (status, body) = instant
        .complete(json!({"prompt_tokens": 4000, "max_tokens": 2000}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 2000);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_slots_requests_are_in_service_and_the_rest_wait() {
    // Two slots; each request decodes for a while (50 × 20 ms alone), long enough to count.
    let emu = Emulator::start(&["--slots", "2", "--base-us", "0", "--speedup", "1"]).await;
    let calls: Vec<_> = (0..6)
        .map(|_| {
            let http = emu.http.clone();
            let url = format!("{}/v1/completions", emu.url);
            tokio::spawn(async move {
                let r = http
                    .post(url)
                    .json(&json!({"prompt_tokens": 10, "max_tokens": 50}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    // All six arrive: two in service, four waiting inside the replica.
    let seen = eventually(
        "2 in service and 4 waiting",
        Duration::from_secs(20),
        || {
            let emu = &emu;
            async move {
                let s = emu.stats().await;
                (s["in_service"] == 2 && s["waiting"] == 4).then_some(s)
            }
        },
    )
    .await;
    assert_eq!(seen["slots"], 2);
    for call in calls {
        let (status, body) = call.await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body["timings"]["running_at_start"].as_u64().unwrap() <= 2);
    }
    let s = emu.stats().await;
    assert_eq!(s["served"], 6, "{s}");
    assert_eq!(s["max_in_service"], 2, "{s}");
    assert_eq!(
        (s["in_service"].clone(), s["waiting"].clone()),
        (json!(0), json!(0))
    );
}

#[tokio::test]
async fn a_streamed_completion_arrives_in_chunks_then_done() {
    let emu = Emulator::start(&["--speedup", "10"]).await;
    let r = emu
        .http
        .post(format!("{}/v1/completions", emu.url))
        .json(&json!({"prompt_tokens": 50, "max_tokens": 30, "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut chunks = 0;
    let mut r = r;
    let mut text = String::new();
    while let Some(bytes) = r.chunk().await.unwrap() {
        chunks += 1;
        text.push_str(std::str::from_utf8(&bytes).unwrap());
    }
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let data: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let streamed: u64 = data.iter().filter_map(|d| d["tokens"].as_u64()).sum();
    assert_eq!(streamed, 30, "{text}");
    // 30 tokens at 2 ms each go out as several batches, not one body at the end.
    assert!(data.len() >= 3, "{text}");
    assert!(chunks >= 2, "the response came in one piece: {text}");
    let summary = data.last().unwrap();
    assert_eq!(summary["usage"]["completion_tokens"], 30);
}

#[tokio::test]
async fn bad_requests_are_refused_naming_the_field() {
    let emu = Emulator::start(&["--instant"]).await;
    for (body, field) in [
        (json!({"max_tokens": 5}), "prompt"),
        (json!({"prompt": 12}), "prompt"),
        (json!({"prompt_tokens": -1}), "prompt_tokens"),
        (
            json!({"prompt_tokens": 10, "max_tokens": 1_000_000}),
            "max_tokens",
        ),
        (json!({"prompt_tokens": 10, "stream": "yes"}), "stream"),
    ] {
        let (status, err) = emu.complete(body.clone()).await;
        assert_eq!(status, 422, "{body} → {err}");
        assert_eq!(err["error"]["field"], field, "{body} → {err}");
        assert!(err["error"]["code"].is_string() && err["error"]["message"].is_string());
    }
    let r = emu
        .http
        .post(format!("{}/v1/completions", emu.url))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let err: Value = r.json().await.unwrap();
    assert!(err["error"]["message"].is_string(), "{err}");
}

#[tokio::test]
async fn health_follows_the_flags() {
    let failing = Emulator::start(&["--fail-health"]).await;
    assert_eq!(failing.health().await, 503);
    let going_bad = Emulator::start(&["--unready-after-s", "0.5"]).await;
    eventually("health to fail", Duration::from_secs(10), || async {
        (going_bad.health().await == 503).then_some(())
    })
    .await;
    let loading = Emulator::start(&["--ready-after-s", "0.5"]).await;
    eventually("health to pass", Duration::from_secs(10), || async {
        (loading.health().await == 200).then_some(())
    })
    .await;
}
