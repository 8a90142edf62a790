//! Test harness of the EC2 provider tests: a real `moto_server` on a loopback port (killed on
//! drop), an SDK client for checking what the provider did, and a fault-injecting HTTP proxy
//! that answers chosen EC2 actions with EC2's error XML and forwards everything else to moto.

use aws_sdk_ec2::Client;
use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_providers::aws::AwsConfig;

/// A `moto_server` process; killed when dropped.
pub struct Moto {
    child: Child,
    pub url: String,
}

impl Moto {
    /// Starts moto on a free loopback port and waits until EC2 answers (the first EC2 call of
    /// a fresh server is slow, so this makes it).
    pub async fn start() -> Moto {
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start moto_server ({e}): install it with `pip install 'moto[server]'` \
                     (scripts/test.sh does this when it is missing)"
                )
            });
        let moto = Moto {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let up = http
                .get(format!("{}/moto-api/", moto.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if up {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let warm_up = Instant::now();
        client(&moto.url)
            .describe_regions()
            .send()
            .await
            .expect("warm-up DescribeRegions");
        eprintln!("moto warm-up call: {} ms", warm_up.elapsed().as_millis());
        moto
    }

    /// Wipes every resource (`POST /moto-api/reset`).
    pub async fn reset(&self) {
        let status = reqwest::Client::new()
            .post(format!("{}/moto-api/reset", self.url))
            .send()
            .await
            .expect("reset moto")
            .status();
        assert!(status.is_success(), "moto reset: {status}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// An SDK client on `endpoint` (us-east-1, moto's test credentials), for checks.
pub fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_ec2::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "static"))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(conf)
}

/// The provider's config for tests: one region, a few GPU types, fast retries.
pub fn config(endpoint: &str, cluster: &str) -> AwsConfig {
    let text = format!(
        r#"
cluster = "{cluster}"
regions = ["us-east-1"]
instance_types = ["g4dn.xlarge", "g5.xlarge", "p4d.24xlarge"]
endpoint_url = "{endpoint}"
credentials = {{ access_key_id = "testing", secret_access_key = "testing" }}
image = {{ id = "ami-12c6146b" }}
request_timeout_s = 10

[retry]
max_attempts = 4
base_delay_ms = 5
max_delay_ms = 20

[agent]
download_url = "https://downloads.example.com/switchyard-agent"
env = {{ SWITCHYARD_INTERRUPTION_URL = "http://127.0.0.1:9/spot/instance-action" }}
"#
    );
    toml::from_str(&text).expect("test config")
}

/// An error answer for one EC2 action, given `remaining` times (then requests pass).
#[derive(Clone, Debug)]
pub struct Fault {
    pub code: &'static str,
    pub status: u16,
    pub remaining: u32,
}

#[derive(Default)]
struct ProxyState {
    faults: HashMap<String, Fault>,
    attempts: HashMap<String, u32>,
    /// Requests of an action to forward and then answer with a 500, as if the answer had
    /// been lost after EC2 did the work.
    lost: HashMap<String, u32>,
    /// Requests of an action to hold this long before forwarding them (moto then does the work
    /// whether or not the caller still waits), with how many are left.
    hung: HashMap<String, (Duration, u32)>,
}

/// A fault-injecting proxy in front of moto.
#[derive(Clone)]
pub struct Proxy {
    pub url: String,
    state: Arc<Mutex<ProxyState>>,
    _server: Arc<tokio::task::JoinHandle<()>>,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = (state.clone(), upstream.to_owned(), reqwest::Client::new());
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(Arc::new(shared));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let url = format!("http://{}", listener.local_addr().expect("proxy addr"));
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Proxy {
            url,
            state,
            _server: Arc::new(server),
        }
    }

    /// Answers `action` with `fault` for its next `fault.remaining` requests.
    pub fn fail(&self, action: &str, fault: Fault) {
        self.lock().faults.insert(action.to_owned(), fault);
    }

    /// Forwards the next `times` requests of `action` to moto (which does the work) and answers
    /// each with a 500 `InternalError` instead of moto's answer: a partial failure.
    pub fn lose_answers(&self, action: &str, times: u32) {
        self.lock().lost.insert(action.to_owned(), times);
    }

    /// Holds the next `times` requests of `action` for `delay`, then forwards them to moto,
    /// which does the work: a call that hangs past the caller's timeout and still takes effect.
    pub fn hang(&self, action: &str, delay: Duration, times: u32) {
        self.lock().hung.insert(action.to_owned(), (delay, times));
    }

    /// Forgets every fault and count.
    pub fn clear(&self) {
        *self.lock() = ProxyState::default();
    }

    /// Requests of `action` seen so far (failed and forwarded).
    pub fn attempts(&self, action: &str) -> u32 {
        self.lock().attempts.get(action).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ProxyState> {
        self.state.lock().expect("proxy state")
    }
}

type Shared = Arc<(Arc<Mutex<ProxyState>>, String, reqwest::Client)>;

async fn forward(State(shared): State<Shared>, request: Request) -> Response {
    let (state, upstream, http) = &*shared;
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 16 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let action = form_field(&body, "Action").unwrap_or_default();
    let (fault, lose, hang) = {
        let mut s = state.lock().expect("proxy state");
        let hang = match s.hung.get_mut(&action) {
            Some((delay, n)) if *n > 0 => {
                *n -= 1;
                Some(*delay)
            }
            _ => None,
        };
        *s.attempts.entry(action.clone()).or_default() += 1;
        let lose = match s.lost.get_mut(&action) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        };
        let fault = match s.faults.get_mut(&action) {
            Some(f) if f.remaining > 0 => {
                f.remaining -= 1;
                Some(f.clone())
            }
            _ => None,
        };
        (fault, lose, hang)
    };
    if let Some(delay) = hang {
        // In a task of its own, so it is forwarded even when the caller gave up and dropped
        // this request: the work happens regardless.
        let (http, upstream) = (http.clone(), upstream.clone());
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            pass(&http, &upstream, parts, body, false).await
        });
        return task
            .await
            .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
    }
    if let Some(f) = fault {
        let xml = format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{}</Code>\
             <Message>injected by the test proxy</Message></Error></Errors>\
             <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>",
            f.code
        );
        let status = StatusCode::from_u16(f.status).expect("status");
        return (status, [(header::CONTENT_TYPE, "text/xml")], xml).into_response();
    }
    pass(http, upstream, parts, body, lose).await
}

/// Forwards a request to moto; with `lose`, answers a 500 in place of moto's answer.
async fn pass(
    http: &reqwest::Client,
    upstream: &str,
    parts: axum::http::request::Parts,
    body: axum::body::Bytes,
    lose: bool,
) -> Response {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            headers.insert(name.clone(), value.clone());
        }
    }
    let answer = http
        .request(parts.method, format!("{upstream}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await;
    match answer {
        Ok(r) if lose => {
            // Moto did the work; the caller never hears of it.
            let _ = r.bytes().await;
            let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
                       <Code>InternalError</Code><Message>answer lost by the test proxy</Message>\
                       </Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID>\
                       </Response>";
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/xml")],
                xml,
            )
                .into_response()
        }
        Ok(r) => {
            let status = r.status();
            let content_type = r.headers().get(header::CONTENT_TYPE).cloned();
            let bytes = r.bytes().await.unwrap_or_default();
            let mut response = Response::new(Body::from(bytes));
            *response.status_mut() = status;
            if let Some(ct) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, ct);
            }
            response
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// One field of an `application/x-www-form-urlencoded` body (EC2 query protocol); action
/// names need no percent-decoding.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    std::str::from_utf8(body)
        .ok()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}
