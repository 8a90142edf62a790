//! EC2 for the contract suite: a real `moto_server` on a loopback port (killed on drop) behind a
//! fault proxy that maps each [`Fault`] onto EC2's own answers, so the EC2 provider passes the
//! same suite as the fake clouds. Unlike those, nothing here fakes EC2's API: moto answers every
//! request the proxy forwards.
//!
//! The EC2 provider's own tests (`providers/tests/aws_moto/harness.rs`) have a proxy of the same
//! kind, keyed by action and counted per action; this one injects the suite's [`Fault`]s. Like
//! `tests/tests/aws_e2e.rs`, it reads moto through EC2's query API: only the provider and its
//! own tests import the AWS SDK (ARCHITECTURE.md).
//!
//! What the proxy adds to moto: EC2's `ClientToken` idempotency. EC2 answers a `RunInstances`
//! whose client token it has seen with the first launch's reservation; moto ignores the token
//! and starts another machine. The provider relies on EC2's behaviour when it retries a launch
//! whose answer was lost or came too late, so the proxy replays the first answer for a token.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::{FakeCloud, Fault};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A fake-looking SigV4 header: moto checks none, but wants one to find the region.
const AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=testing/20261202/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=x";

/// The faults in force (they accumulate until cleared).
#[derive(Default)]
struct Faults {
    capacity: bool,
    quota: bool,
    throttle: u32,
    lose_next_launch: bool,
    slow_launch: Option<Duration>,
    hang: Option<Duration>,
    unauthorized: bool,
}

/// An answer as it goes back to the caller.
#[derive(Clone)]
struct Answer {
    status: StatusCode,
    content_type: Option<header::HeaderValue>,
    body: Bytes,
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let mut response = Response::new(Body::from(self.body));
        *response.status_mut() = self.status;
        if let Some(ct) = self.content_type {
            response.headers_mut().insert(header::CONTENT_TYPE, ct);
        }
        response
    }
}

struct Inner {
    moto_url: String,
    http: reqwest::Client,
    faults: Mutex<Faults>,
    requests: AtomicU64,
    /// `RunInstances` answers by client token (EC2's idempotency), one launch at a time.
    launches: tokio::sync::Mutex<HashMap<String, Answer>>,
    /// The region (from the request's SigV4 credential scope) of every `RunInstances` the
    /// proxy received, in order, whether a fault answered it or moto did.
    launch_regions: Mutex<Vec<String>>,
}

/// `moto_server` behind the fault proxy; [`MotoCloud::url`] is the endpoint to give the
/// provider. Moto is killed when this is dropped.
pub struct MotoCloud {
    child: Mutex<Child>,
    url: String,
    inner: Arc<Inner>,
    _server: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for MotoCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MotoCloud")
            .field("url", &self.url)
            .field("moto", &self.inner.moto_url)
            .finish_non_exhaustive()
    }
}

impl Drop for MotoCloud {
    fn drop(&mut self) {
        self._server.abort();
        if let Ok(mut child) = self.child.lock() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `moto_server` on a free loopback port (instance types validated, as EC2 does), waits
/// until EC2 answers, and puts the proxy in front of it.
pub async fn start() -> MotoCloud {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("moto_server")
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .env("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start moto_server ({e}): install it with `pip install 'moto[server]'` \
                 (scripts/test.sh does this when it is missing)"
            )
        });
    let moto_url = format!("http://127.0.0.1:{port}");
    let inner = Arc::new(Inner {
        moto_url: moto_url.clone(),
        http: reqwest::Client::new(),
        faults: Mutex::new(Faults::default()),
        requests: AtomicU64::new(0),
        launches: tokio::sync::Mutex::new(HashMap::new()),
        launch_regions: Mutex::new(Vec::new()),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the EC2 proxy");
    let url = format!("http://{}", listener.local_addr().expect("proxy address"));
    let app = axum::Router::new()
        .fallback(proxy)
        .with_state(inner.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let cloud = MotoCloud {
        child: Mutex::new(child),
        url,
        inner,
        _server: server,
    };
    // Moto's first EC2 call is slow (it loads its data): made here, not in a timed call.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if query(
            &cloud.inner.http,
            &moto_url,
            &[("Action", "DescribeRegions")],
        )
        .await
        .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cloud
}

impl MotoCloud {
    /// The proxy's endpoint, for the provider's `endpoint_url`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Moto itself, past the proxy.
    pub fn moto_url(&self) -> &str {
        &self.inner.moto_url
    }

    /// The region of every `RunInstances` the proxy received (one endpoint serves every region:
    /// the request's SigV4 credential scope names it), in order, faulted or forwarded.
    pub fn launch_regions(&self) -> Vec<String> {
        self.inner
            .launch_regions
            .lock()
            .expect("launch regions")
            .clone()
    }

    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.inner.faults.lock().expect("faults")
    }
}

impl FakeCloud for MotoCloud {
    fn inject(&self, fault: Fault) {
        let mut f = self.faults();
        match fault {
            Fault::Capacity => f.capacity = true,
            Fault::Quota => f.quota = true,
            Fault::Throttle(n) => f.throttle = f.throttle.saturating_add(n),
            Fault::LoseNextLaunchAnswer => f.lose_next_launch = true,
            Fault::SlowOperations(d) => f.slow_launch = Some(d),
            Fault::Hang(d) => f.hang = Some(d),
            Fault::Unauthorized => f.unauthorized = true,
        }
    }

    fn clear_faults(&self) {
        *self.faults() = Faults::default();
    }

    /// Terminates the instance in moto directly, not through the proxy.
    fn vanish(&self, provider_id: &str) {
        let url = self.inner.moto_url.clone();
        let id = provider_id.to_owned();
        on_own_runtime(async move {
            let http = reqwest::Client::new();
            query(
                &http,
                &url,
                &[("Action", "TerminateInstances"), ("InstanceId.1", &id)],
            )
            .await
            .unwrap_or_else(|e| panic!("vanish {id}: {e}"));
        });
    }

    /// Every instance moto holds that is not terminated (`DescribeInstances` past the proxy).
    fn live_instances(&self) -> Vec<String> {
        let url = self.inner.moto_url.clone();
        let xml = on_own_runtime(async move {
            let http = reqwest::Client::new();
            query(&http, &url, &[("Action", "DescribeInstances")])
                .await
                .expect("DescribeInstances in moto")
        });
        instances_in(&xml)
            .into_iter()
            .filter(|(_, state)| state != "terminated")
            .map(|(id, _)| id)
            .collect()
    }

    /// Always empty: no API description is checked here, because the requests reach moto,
    /// which parses and validates them as EC2 requests itself (and answers EC2's errors).
    fn invalid_requests(&self) -> Vec<String> {
        Vec::new()
    }

    /// Requests the proxy received (answered with a fault or forwarded).
    fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::SeqCst)
    }
}

/// Runs `work` on a runtime of its own on another thread: [`FakeCloud`]'s methods are
/// synchronous and are called from inside the test's runtime.
fn on_own_runtime<T: Send + 'static>(
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(work)
    })
    .join()
    .expect("the moto query thread")
}

/// One EC2 query-API call; the XML answer, or why it failed.
async fn query(
    http: &reqwest::Client,
    url: &str,
    params: &[(&str, &str)],
) -> Result<String, String> {
    let mut form: Vec<(&str, &str)> = vec![("Version", "2016-11-15")];
    form.extend_from_slice(params);
    let r = http
        .post(url)
        .header(header::AUTHORIZATION.as_str(), AUTHORIZATION)
        .form(&form)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let body = r.text().await.map_err(|e| e.to_string())?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(format!("{status}: {body}"))
    }
}

/// (instance id, state name) of every instance in a `DescribeInstances` answer.
fn instances_in(xml: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for chunk in xml.split("<instanceId>").skip(1) {
        let Some(id) = chunk.split("</instanceId>").next() else {
            continue;
        };
        let state = chunk
            .split("<instanceState>")
            .nth(1)
            .and_then(|s| s.split("<name>").nth(1))
            .and_then(|s| s.split("</name>").next())
            .unwrap_or("");
        if !out.iter().any(|(known, _)| known == id) {
            out.push((id.to_owned(), state.to_owned()));
        }
    }
    out
}

/// EC2's error answer.
fn ec2_error(status: StatusCode, code: &str, message: &str) -> Response {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
         <Message>{message}</Message></Error></Errors>\
         <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    );
    (status, [(header::CONTENT_TYPE, "text/xml")], xml).into_response()
}

/// What the proxy does with one request, decided when it arrives.
enum Plan {
    Error(StatusCode, &'static str, &'static str),
    Forward {
        hang: Option<Duration>,
        slow: Option<Duration>,
        lose: bool,
    },
}

async fn proxy(State(inner): State<Arc<Inner>>, request: Request) -> Response {
    inner.requests.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, 16 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let action = form_field(&body, "Action").unwrap_or_default();
    let launch = action == "RunInstances";
    if launch {
        let region = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(credential_region)
            .unwrap_or_default();
        inner
            .launch_regions
            .lock()
            .expect("launch regions")
            .push(region);
    }
    let plan = {
        let mut f = inner.faults.lock().expect("faults");
        if f.unauthorized {
            Plan::Error(
                StatusCode::UNAUTHORIZED,
                "AuthFailure",
                "AWS was not able to validate the provided access credentials",
            )
        } else if f.throttle > 0 {
            f.throttle -= 1;
            Plan::Error(
                StatusCode::SERVICE_UNAVAILABLE,
                "RequestLimitExceeded",
                "Request limit exceeded.",
            )
        } else if launch && f.capacity {
            Plan::Error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InsufficientInstanceCapacity",
                "We currently do not have sufficient capacity in the Availability Zone you requested.",
            )
        } else if launch && f.quota {
            Plan::Error(
                StatusCode::BAD_REQUEST,
                "InstanceLimitExceeded",
                "You have requested more instances than your current instance limit allows.",
            )
        } else {
            let lose = launch && std::mem::take(&mut f.lose_next_launch);
            Plan::Forward {
                hang: f.hang,
                slow: f.slow_launch.filter(|_| launch),
                lose,
            }
        }
    };
    let (hang, slow, lose) = match plan {
        Plan::Error(status, code, message) => return ec2_error(status, code, message),
        Plan::Forward { hang, slow, lose } => (hang, slow, lose),
    };
    // In a task of its own, so the work reaches moto even when the caller gave up on this
    // request (a timeout): EC2 carries out a call whose answer comes too late.
    let work = tokio::spawn({
        let inner = inner.clone();
        async move {
            if let Some(delay) = hang {
                tokio::time::sleep(delay).await;
            }
            if launch {
                run_instances(&inner, parts, body).await
            } else {
                forward(&inner, parts, body).await
            }
        }
    });
    let answer = work.await;
    if let Some(delay) = slow {
        // EC2's RunInstances is the slow part of an EC2 launch: moto's instances run at once.
        tokio::time::sleep(delay).await;
    }
    match answer {
        Ok(_) if lose => ec2_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "answer lost by the test proxy",
        ),
        Ok(Ok(answer)) => answer.into_response(),
        Ok(Err(e)) => (StatusCode::BAD_GATEWAY, e).into_response(),
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// `RunInstances` with EC2's client-token idempotency: a token seen before gets the first
/// successful answer again, and moto is not asked.
async fn run_instances(
    inner: &Inner,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Result<Answer, String> {
    let token = form_field(&body, "ClientToken").filter(|t| !t.is_empty());
    let mut launches = inner.launches.lock().await;
    if let Some(seen) = token.as_ref().and_then(|t| launches.get(t)) {
        return Ok(seen.clone());
    }
    let answer = forward(inner, parts, body).await?;
    if let Some(token) = token
        && answer.status.is_success()
    {
        launches.insert(token, answer.clone());
    }
    Ok(answer)
}

/// Forwards one request to moto.
async fn forward(
    inner: &Inner,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Result<Answer, String> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            headers.insert(name.clone(), value.clone());
        }
    }
    let r = inner
        .http
        .request(parts.method, format!("{}{path}", inner.moto_url))
        .headers(headers)
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = r.status();
    let content_type = r.headers().get(header::CONTENT_TYPE).cloned();
    let body = r.bytes().await.map_err(|e| e.to_string())?;
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// The region of a SigV4 `Authorization` header's credential scope
/// (`Credential=AKID/20261202/us-east-1/ec2/aws4_request`).
fn credential_region(authorization: &str) -> Option<String> {
    let scope = authorization.split("Credential=").nth(1)?;
    let scope = scope.split([',', ' ']).next()?;
    scope.split('/').nth(2).map(str::to_owned)
}

/// One field of an `application/x-www-form-urlencoded` body (EC2's query protocol); action
/// names and client tokens are compared as sent.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    std::str::from_utf8(body)
        .ok()?
        .split('&')
        .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instances_are_read_from_describe_instances() {
        let xml = "<reservationSet><item><instancesSet><item><instanceId>i-1</instanceId>\
                   <instanceState><code>16</code><name>running</name></instanceState></item>\
                   <item><instanceId>i-2</instanceId><instanceState><code>48</code>\
                   <name>terminated</name></instanceState></item></instancesSet></item>\
                   </reservationSet>";
        assert_eq!(
            instances_in(xml),
            vec![
                ("i-1".to_owned(), "running".to_owned()),
                ("i-2".to_owned(), "terminated".to_owned())
            ]
        );
        assert_eq!(
            form_field(b"Action=RunInstances&ClientToken=abc", "ClientToken"),
            Some("abc".into())
        );
        assert_eq!(
            credential_region(AUTHORIZATION),
            Some("us-east-1".to_owned())
        );
    }
}
