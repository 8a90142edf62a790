//! `model-emulator`: a stand-in for an LLM inference server, to run as a Switchyard service
//! replica in tests and benches where no GPU or model is at hand. It listens on
//! `127.0.0.1:$PORT` (the port the agent gives a replica) and answers OpenAI-style completions
//! after the time [`ServingModel`] says a GPU would take: a prefill proportional to the prompt,
//! then one decode step per generated token, slower as the batch grows. At most `slots`
//! requests are in service at once; the rest wait inside the replica, as on a real GPU server.
//!
//! The model's constants are our own assumption (see `core/src/serving.rs`); every one can be
//! set by flag or environment, and `--speedup 60` runs all times 60× faster so a bench can
//! replay a day in minutes. `--instant` answers at once: for measuring what sits in front.
//!
//! Routes:
//! - `GET /health` — 200 when ready; 503 before `--ready-after`, after `--unready-after`, or
//!   always with `--fail-health` (for readiness tests).
//! - `POST /v1/completions` — `{"prompt_tokens": N | "prompt": "text", "max_tokens": M,
//!   "stream": bool}` (other OpenAI fields are accepted and ignored; a prompt's tokens are
//!   counted as its words). Answers a JSON completion with `usage` and `timings`, or, with
//!   `stream`, server-sent events, one per batch of tokens as they are decoded, then `[DONE]`.
//! - `GET /stats` — requests in service, waiting, the most ever in service at once, served:
//!   what tests count concurrency by.
//!
//! Usage as a replica: `"command": ["/path/to/model-emulator", "--speedup", "10"]`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Parser;
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use switchyard_core::serving::{ServingModel, TimeCompression};
use tokio::sync::{Mutex, Semaphore, mpsc};

/// The most tokens a prompt may have: a long context window.
const MAX_PROMPT_TOKENS: u64 = 131_072;
/// The most tokens a request may ask to generate.
const MAX_OUTPUT_TOKENS: u64 = 32_768;
/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;
/// A streamed response sends a chunk at most this often (wall time): tokens decoded in between
/// go out together, as servers batch their flushes.
const STREAM_CHUNK_WALL: Duration = Duration::from_millis(10);

#[derive(Parser, Debug)]
#[command(
    name = "model-emulator",
    about = "An LLM inference server's timing without the model"
)]
struct Args {
    /// The port to listen on (a Switchyard replica gets it in $PORT).
    #[arg(long, env = "PORT")]
    port: u16,
    /// The address to listen on.
    #[arg(long, env = "EMULATOR_HOST", default_value = "127.0.0.1")]
    host: String,
    /// Prefill microseconds per prompt token.
    #[arg(long, env = "EMULATOR_PREFILL_US_PER_TOKEN", default_value_t = ServingModel::DEFAULT.prefill_us_per_token)]
    prefill_us_per_token: u64,
    /// Decode microseconds per generated token, alone on the GPU.
    #[arg(long, env = "EMULATOR_DECODE_US_PER_TOKEN", default_value_t = ServingModel::DEFAULT.decode_us_per_token)]
    decode_us_per_token: u64,
    /// Extra decode microseconds per token for each other request in the batch.
    #[arg(long, env = "EMULATOR_DECODE_GROWTH_US_PER_PEER", default_value_t = ServingModel::DEFAULT.decode_growth_us_per_peer)]
    decode_growth_us_per_peer: u64,
    /// Fixed microseconds per request.
    #[arg(long, env = "EMULATOR_BASE_US", default_value_t = ServingModel::DEFAULT.base_us)]
    base_us: u64,
    /// Requests in service at once; the rest wait.
    #[arg(long, env = "EMULATOR_SLOTS", default_value_t = ServingModel::DEFAULT.slots, value_parser = clap::value_parser!(u32).range(1..))]
    slots: u32,
    /// Run every model time this many times faster.
    #[arg(long, env = "EMULATOR_SPEEDUP", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    speedup: u32,
    /// Answer at once: every model time is zero (slots still bound concurrency).
    #[arg(long, env = "EMULATOR_INSTANT")]
    instant: bool,
    /// `/health` answers 503 for this many seconds after start (a model loading).
    #[arg(long, env = "EMULATOR_READY_AFTER_S", default_value_t = 0.0)]
    ready_after_s: f64,
    /// `/health` answers 503 from this many seconds after start on (a replica going bad).
    #[arg(long, env = "EMULATOR_UNREADY_AFTER_S")]
    unready_after_s: Option<f64>,
    /// `/health` always answers 503.
    #[arg(long, env = "EMULATOR_FAIL_HEALTH")]
    fail_health: bool,
}

/// The replica: its model, its slots and its counters.
struct Emulator {
    model: ServingModel,
    compression: TimeCompression,
    /// One permit per slot: a request holds one from the start of its service to its end.
    slots: Semaphore,
    /// Prefill is compute-bound and gains nothing from batching: one prefill at a time.
    prefill: Mutex<()>,
    in_service: AtomicU32,
    waiting: AtomicU32,
    max_in_service: AtomicU32,
    served: AtomicU64,
    started: Instant,
    ready_after: Duration,
    unready_after: Option<Duration>,
    fail_health: bool,
}

/// Counts a request in service until dropped (also when its client goes away mid-stream).
struct InService<'a>(&'a Emulator);

impl Drop for InService<'_> {
    fn drop(&mut self) {
        self.0.in_service.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One completion request, validated.
#[derive(Debug, Clone, Copy)]
struct Completion {
    prompt_tokens: u32,
    max_tokens: u32,
    stream: bool,
}

/// What a finished (or finishing) request reports about its time, in wall milliseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Timings {
    queued_ms: f64,
    prefill_ms: f64,
    decode_ms: f64,
    running_at_start: u32,
}

/// A refused request, answered in Switchyard's one error shape
/// `{"error": {"code", "message", "field"?}}`.
#[derive(Debug)]
struct Refusal {
    status: StatusCode,
    code: &'static str,
    message: String,
    field: Option<&'static str>,
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut err = json!({"code": self.code, "message": self.message});
        if let Some(f) = self.field {
            err["field"] = json!(f);
        }
        (self.status, Json(json!({ "error": err }))).into_response()
    }
}

/// 400: the body is not a JSON object.
fn malformed(message: String) -> Refusal {
    Refusal {
        status: StatusCode::BAD_REQUEST,
        code: "malformed",
        message,
        field: None,
    }
}

/// 422: `field` is wrong.
fn invalid(field: &'static str, message: String) -> Refusal {
    Refusal {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        code: "invalid_request",
        message,
        field: Some(field),
    }
}

/// A non-negative integer field up to `max`, or the 422 naming it.
fn count_field(body: &Value, field: &'static str, max: u64) -> Result<Option<u32>, Refusal> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n <= max => Ok(Some(n as u32)),
            _ => Err(invalid(
                field,
                format!("{field} must be an integer from 0 to {max}"),
            )),
        },
    }
}

fn parse_completion(bytes: &[u8]) -> Result<Completion, Refusal> {
    let body: Value = serde_json::from_slice(bytes)
        .map_err(|e| malformed(format!("the body is not JSON: {e}")))?;
    if !body.is_object() {
        return Err(malformed("the body must be a JSON object".into()));
    }
    let prompt_tokens = match (
        count_field(&body, "prompt_tokens", MAX_PROMPT_TOKENS)?,
        body.get("prompt"),
    ) {
        (Some(n), _) => n,
        (None, Some(Value::String(text))) => {
            let words = text.split_whitespace().count() as u64;
            if words > MAX_PROMPT_TOKENS {
                return Err(invalid(
                    "prompt",
                    format!("the prompt has {words} tokens, more than {MAX_PROMPT_TOKENS}"),
                ));
            }
            words as u32
        }
        (None, Some(_)) => return Err(invalid("prompt", "prompt must be a string".into())),
        (None, None) => {
            return Err(invalid(
                "prompt",
                "give prompt (a string) or prompt_tokens (a count)".into(),
            ));
        }
    };
    let max_tokens =
        count_field(&body, "max_tokens", MAX_OUTPUT_TOKENS)?.unwrap_or(DEFAULT_MAX_TOKENS);
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream", "stream must be true or false".into())),
    };
    Ok(Completion {
        prompt_tokens,
        max_tokens,
        stream,
    })
}

impl Emulator {
    fn wall(&self, model_us: u64) -> Duration {
        Duration::from_micros(self.compression.wall_us(model_us))
    }

    async fn pause(&self, model_us: u64) {
        let d = self.wall(model_us);
        if !d.is_zero() {
            tokio::time::sleep(d).await;
        }
    }

    /// Serves one request: waits for a slot, prefills, then decodes `max_tokens` tokens,
    /// calling `on_tokens` with each batch of tokens as it is done. Stops early (and frees its
    /// slot) when `on_tokens` returns false: the client went away.
    async fn serve<F>(&self, req: Completion, mut on_tokens: F) -> Timings
    where
        F: FnMut(u32) -> bool,
    {
        let arrived = Instant::now();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        // The semaphore is never closed, so acquiring only fails if it were: then serve anyway.
        let permit = self.slots.acquire().await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        let running = self.in_service.fetch_add(1, Ordering::SeqCst) + 1;
        let _counted = InService(self);
        self.max_in_service.fetch_max(running, Ordering::SeqCst);
        let mut t = Timings {
            queued_ms: arrived.elapsed().as_secs_f64() * 1e3,
            running_at_start: running,
            ..Timings::default()
        };

        let prefill_started = Instant::now();
        let prefill_us = self
            .model
            .base_us
            .saturating_add(self.model.prefill_us(req.prompt_tokens));
        if !self.wall(prefill_us).is_zero() {
            let _one_at_a_time = self.prefill.lock().await;
            self.pause(prefill_us).await;
        }
        t.prefill_ms = prefill_started.elapsed().as_secs_f64() * 1e3;

        let decode_started = Instant::now();
        let mut left = req.max_tokens;
        while left > 0 {
            // The batch is whoever is in service now: decode steps slow as it grows.
            let step_us = self
                .model
                .decode_step_us(self.in_service.load(Ordering::SeqCst));
            let step_wall = self.wall(step_us);
            let per_chunk = if step_wall.is_zero() {
                left
            } else {
                (STREAM_CHUNK_WALL.as_micros() / step_wall.as_micros().max(1)).max(1) as u32
            };
            let n = per_chunk.min(left);
            self.pause(step_us.saturating_mul(u64::from(n))).await;
            left -= n;
            if !on_tokens(n) {
                break;
            }
        }
        t.decode_ms = decode_started.elapsed().as_secs_f64() * 1e3;
        self.served.fetch_add(1, Ordering::SeqCst);
        drop(permit);
        t
    }

    fn healthy(&self) -> bool {
        let up = self.started.elapsed();
        !self.fail_health
            && up >= self.ready_after
            && self.unready_after.is_none_or(|after| up < after)
    }
}

fn completion_body(req: Completion, generated: u32, t: Timings, speedup: u32) -> Value {
    json!({
        "object": "text_completion",
        "model": "switchyard-model-emulator",
        "choices": [{"index": 0, "text": " tok".repeat(generated as usize), "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": req.prompt_tokens,
            "completion_tokens": generated,
            "total_tokens": u64::from(req.prompt_tokens) + u64::from(generated),
        },
        "timings": {
            "queued_ms": t.queued_ms,
            "prefill_ms": t.prefill_ms,
            "decode_ms": t.decode_ms,
            "total_ms": t.queued_ms + t.prefill_ms + t.decode_ms,
            "running_at_start": t.running_at_start,
            "speedup": speedup,
        },
    })
}

async fn completions(State(emu): State<Arc<Emulator>>, body: Bytes) -> Response {
    let req = match parse_completion(&body) {
        Ok(r) => r,
        Err(refusal) => return refusal.into_response(),
    };
    let speedup = emu.compression.factor();
    if !req.stream {
        let mut generated = 0;
        let t = emu
            .serve(req, |n| {
                generated += n;
                true
            })
            .await;
        return Json(completion_body(req, generated, t, speedup)).into_response();
    }
    // Streaming: the request is served in a task of its own that sends each batch of tokens
    // as an event; a client that goes away closes the channel and ends the task.
    let (tx, rx) = mpsc::channel::<Event>(16);
    tokio::spawn(async move {
        let mut generated = 0;
        let chunk_tx = tx.clone();
        let t = emu
            .serve(req, |n| {
                generated += n;
                let chunk = json!({
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": " tok".repeat(n as usize), "finish_reason": null}],
                    "tokens": n,
                });
                // A full channel means a slow reader: the tokens wait, as they would on a
                // server's socket buffer. Only a closed channel (gone client) stops it.
                match chunk_tx.try_send(Event::default().data(chunk.to_string())) {
                    Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => true,
                    Err(mpsc::error::TrySendError::Closed(_)) => false,
                }
            })
            .await;
        let mut last = completion_body(req, generated, t, speedup);
        last["choices"][0]["text"] = json!("");
        let _ = tx.send(Event::default().data(last.to_string())).await;
        let _ = tx.send(Event::default().data("[DONE]")).await;
    });
    let events = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(events).into_response()
}

async fn health(State(emu): State<Arc<Emulator>>) -> Response {
    if emu.healthy() {
        (StatusCode::OK, "ok").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn stats(State(emu): State<Arc<Emulator>>) -> Json<Value> {
    Json(json!({
        "in_service": emu.in_service.load(Ordering::SeqCst),
        "waiting": emu.waiting.load(Ordering::SeqCst),
        "max_in_service": emu.max_in_service.load(Ordering::SeqCst),
        "served": emu.served.load(Ordering::SeqCst),
        "slots": emu.model.slots,
    }))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = term => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn seconds(s: f64, flag: &str) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| anyhow::anyhow!("{flag}: {s} is not a duration"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let model = if args.instant {
        ServingModel::instant(args.slots)
    } else {
        ServingModel {
            prefill_us_per_token: args.prefill_us_per_token,
            decode_us_per_token: args.decode_us_per_token,
            decode_growth_us_per_peer: args.decode_growth_us_per_peer,
            base_us: args.base_us,
            slots: args.slots,
        }
    };
    let compression = TimeCompression::new(args.speedup)
        .ok_or_else(|| anyhow::anyhow!("--speedup must be at least 1"))?;
    let emu = Arc::new(Emulator {
        model,
        compression,
        slots: Semaphore::new(args.slots as usize),
        prefill: Mutex::new(()),
        in_service: AtomicU32::new(0),
        waiting: AtomicU32::new(0),
        max_in_service: AtomicU32::new(0),
        served: AtomicU64::new(0),
        started: Instant::now(),
        ready_after: seconds(args.ready_after_s, "--ready-after-s")?,
        unready_after: args
            .unready_after_s
            .map(|s| seconds(s, "--unready-after-s"))
            .transpose()?,
        fail_health: args.fail_health,
    });
    let app = Router::new()
        .route("/health", get(health))
        .route("/stats", get(stats))
        .route("/v1/completions", post(completions))
        .with_state(emu);
    let addr = format!("{}:{}", args.host, args.port);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!(
        "model-emulator listening on {addr}: {model:?}, speedup {}",
        args.speedup
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    Ok(())
}
