//! A **fake** of Google Compute Engine (REST API v1) and of Google's OAuth token endpoint, for
//! tests. It is not GCE: it follows the published Compute Engine discovery document checked in
//! at `tests/data/apis/gce-compute-v1.json` (an excerpt; see that folder's README) and models
//! only what Switchyard's GCE provider relies on:
//!
//! - `POST /token`: the JWT bearer grant. The assertion's RS256 signature is checked with the
//!   public half of the test service-account key, and its claims (`iss`, `aud` = this token
//!   URI, `scope`, `iat`, `exp` at most an hour later); the access tokens it issues expire
//!   after [`Options::token_lifetime`], and the API refuses expired or unknown ones (401).
//! - `instances.insert` (with `requestId` deduplication and `alreadyExists` on a second
//!   instance of one name), `instances.get`, `instances.delete`, `instances.aggregatedList`
//!   (with a label `filter` and `pageToken` pagination, at most [`Options::page_size`] per
//!   page), `zoneOperations.get`. Inserts and deletes are zone operations that are `RUNNING`
//!   for [`Options::operation_time`] (or the injected slow time) and then `DONE`, with
//!   `error.errors[].code` when they failed.
//! - Error answers have GCE's body: `{"error": {"code", "message", "errors": [{"domain",
//!   "reason", "message"}]}}`.
//!
//! Every request is validated against the discovery document: the path must match a kept
//! method's path template under `/compute/v1/` with its HTTP method, every query parameter must
//! be the method's or a global one (with its type), and a JSON body must validate against the
//! method's request schema (types, enums, required-for-this-method properties, no unknown
//! properties, no `[Output Only]` properties). Path parameter patterns are not checked (no
//! regex engine here); names are checked by hand where GCE's rules matter (instance names,
//! labels). What fails is answered with GCE's 400 and recorded for
//! [`FakeCloud::invalid_requests`].
//!
//! With [`Options::run_bootstrap`], a created instance runs its `startup-script` metadata in a
//! [`boot`](super::boot) sandbox with the machine type's GPUs from the bundled catalogue;
//! deleting it (or [`FakeCloud::vanish`]) powers it off.
//!
//! Provider ids are `{zone}/{instance name}`, as the provider writes them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::boot;
use super::{FakeCloud, Fault, Faults};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_providers::Catalogue;

/// The discovery document excerpt the fake validates against.
pub const DISCOVERY: &str = include_str!("../../data/apis/gce-compute-v1.json");
/// The throwaway test service-account key file (its `token_uri` is a placeholder).
pub const TEST_KEY_FILE: &str = include_str!("../../data/apis/gce-test-service-account.json");
/// The public half of the test key.
pub const TEST_PUBLIC_KEY: &str = include_str!("../../data/apis/gce-test-key.pub.pem");

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The one project that exists.
    pub project: String,
    /// Run each created instance's startup script in a boot sandbox.
    pub run_bootstrap: bool,
    /// At most this many instances per aggregatedList page (small, so pagination is used).
    pub page_size: usize,
    /// Lifetime of the access tokens the token endpoint issues (`expires_in`).
    pub token_lifetime: Duration,
    /// How long an insert or delete operation runs before it is `DONE`.
    pub operation_time: Duration,
    /// Zones that are always out of capacity (inserts there fail with
    /// `ZONE_RESOURCE_POOL_EXHAUSTED`), besides [`Fault::Capacity`], which empties every zone.
    pub stockout_zones: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            project: "switchyard-test".into(),
            run_bootstrap: false,
            page_size: 2,
            token_lifetime: Duration::from_secs(3600),
            operation_time: Duration::from_millis(30),
            stockout_zones: Vec::new(),
        }
    }
}

const OP_INSERT: &str = "insert";
const OP_DELETE: &str = "delete";

struct FakeInstance {
    zone: String,
    /// The resource as GCE shows it (the inserted body plus output fields).
    resource: Value,
    script: Option<String>,
    sandbox: Option<boot::Instance>,
    boot_error: Option<String>,
    deleting: bool,
}

struct FakeOp {
    name: String,
    zone: String,
    kind: &'static str,
    instance: String,
    id: u64,
    inserted: String,
    done_at: Instant,
    /// (code, message, HTTP status) when the operation fails.
    error: Option<(&'static str, String, u16)>,
    applied: bool,
}

#[derive(Default)]
struct Inner {
    faults: Faults,
    instances: BTreeMap<String, FakeInstance>,
    operations: HashMap<String, FakeOp>,
    request_ids: HashMap<String, String>,
    tokens: HashMap<String, Instant>,
    invalid: Vec<String>,
    next_id: u64,
}

struct State {
    options: Options,
    spec: Value,
    catalogue: Catalogue,
    base_url: String,
    inner: Mutex<Inner>,
    requests: AtomicU64,
    tokens_issued: AtomicU64,
    key_id: String,
    client_email: String,
}

/// A running fake GCE; stops when dropped.
pub struct FakeHandle {
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts the fake on 127.0.0.1 (a free port).
pub async fn start(options: Options) -> FakeHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let key: Value = serde_json::from_str(TEST_KEY_FILE).expect("test key");
    let state = Arc::new(State {
        options,
        spec: serde_json::from_str(DISCOVERY).expect("discovery document"),
        catalogue: Catalogue::bundled().expect("catalogue"),
        base_url: format!("http://{addr}"),
        inner: Mutex::new(Inner::default()),
        requests: AtomicU64::new(0),
        tokens_issued: AtomicU64::new(0),
        key_id: key["private_key_id"].as_str().unwrap_or_default().into(),
        client_email: key["client_email"].as_str().unwrap_or_default().into(),
    });
    let app_state = state.clone();
    let app = axum::Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let state = app_state.clone();
            async move { handle(state, method, uri, headers, body).await }
        },
    );
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    FakeHandle { state, task }
}

impl FakeHandle {
    /// The API endpoint (`api_endpoint` of the provider's config).
    pub fn url(&self) -> String {
        self.state.base_url.clone()
    }

    /// The token endpoint (`token_uri` of the key file).
    pub fn token_uri(&self) -> String {
        format!("{}/token", self.state.base_url)
    }

    pub fn project(&self) -> &str {
        &self.state.options.project
    }

    /// Writes the test service-account key, pointed at this fake's token endpoint, into `dir`.
    pub fn write_credentials(&self, dir: &Path) -> PathBuf {
        let mut key: Value = serde_json::from_str(TEST_KEY_FILE).expect("test key");
        key["token_uri"] = json!(self.token_uri());
        let path = dir.join("gce-service-account.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&key).expect("json")).expect("write key");
        path
    }

    /// How many access tokens the token endpoint has issued.
    pub fn tokens_issued(&self) -> u64 {
        self.state.tokens_issued.load(Ordering::SeqCst)
    }

    /// The instance resource as the API shows it (the inserted body with output fields).
    pub fn instance(&self, provider_id: &str) -> Option<Value> {
        let inner = self.state.inner.lock().unwrap();
        inner.instances.get(provider_id).map(|i| i.resource.clone())
    }

    /// The startup script an instance was given.
    pub fn script(&self, provider_id: &str) -> Option<String> {
        let inner = self.state.inner.lock().unwrap();
        inner
            .instances
            .get(provider_id)
            .and_then(|i| i.script.clone())
    }

    /// The sandbox root of an instance that ran its bootstrap.
    pub fn sandbox_root(&self, provider_id: &str) -> Option<PathBuf> {
        let inner = self.state.inner.lock().unwrap();
        inner
            .instances
            .get(provider_id)
            .and_then(|i| i.sandbox.as_ref())
            .map(|s| s.root().to_path_buf())
    }

    /// Whether the agent an instance's bootstrap started is running.
    pub fn agent_running(&self, provider_id: &str) -> bool {
        let inner = self.state.inner.lock().unwrap();
        inner
            .instances
            .get(provider_id)
            .and_then(|i| i.sandbox.as_ref())
            .is_some_and(|s| s.agent_running())
    }

    /// Why an instance's bootstrap failed, if it did.
    pub fn boot_error(&self, provider_id: &str) -> Option<String> {
        let inner = self.state.inner.lock().unwrap();
        inner
            .instances
            .get(provider_id)
            .and_then(|i| i.boot_error.clone())
    }
}

impl FakeCloud for FakeHandle {
    fn inject(&self, fault: Fault) {
        self.state.inner.lock().unwrap().faults.inject(fault);
    }

    fn clear_faults(&self) {
        self.state.inner.lock().unwrap().faults = Faults::default();
    }

    fn vanish(&self, provider_id: &str) {
        let removed = self
            .state
            .inner
            .lock()
            .unwrap()
            .instances
            .remove(provider_id);
        if let Some(i) = removed {
            power_off(i);
        }
    }

    fn live_instances(&self) -> Vec<String> {
        let mut inner = self.state.inner.lock().unwrap();
        tick(&mut inner);
        inner.instances.keys().cloned().collect()
    }

    fn invalid_requests(&self) -> Vec<String> {
        self.state.inner.lock().unwrap().invalid.clone()
    }

    fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }
}

/// Powers a removed instance off, off the async threads (the sandbox waits for its agent).
fn power_off(instance: FakeInstance) {
    if let Some(sandbox) = instance.sandbox {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(move || drop(sandbox));
            }
            Err(_) => drop(sandbox),
        }
    }
}

/// Applies the operations that are due: inserted instances run, deleted ones go.
fn tick(inner: &mut Inner) {
    let now = Instant::now();
    let mut due: Vec<(&'static str, String, bool)> = Vec::new();
    for op in inner.operations.values_mut() {
        if !op.applied && op.done_at <= now {
            op.applied = true;
            due.push((op.kind, op.instance.clone(), op.error.is_none()));
        }
    }
    for (kind, id, ok) in due {
        match (kind, ok) {
            (OP_INSERT, true) => {
                if let Some(i) = inner.instances.get_mut(&id)
                    && !i.deleting
                {
                    i.resource["status"] = json!("RUNNING");
                }
            }
            (OP_DELETE, _) => {
                if let Some(i) = inner.instances.remove(&id) {
                    power_off(i);
                }
            }
            _ => {}
        }
    }
}

/// GCE's error answer.
fn gce_error(status: StatusCode, reason: &str, message: &str) -> Response {
    let domain = match reason {
        "rateLimitExceeded" | "quotaExceeded" => "usageLimits",
        _ => "global",
    };
    let mut err = json!({
        "code": status.as_u16(),
        "message": message,
        "errors": [{ "message": message, "domain": domain, "reason": reason }],
    });
    if status == StatusCode::UNAUTHORIZED {
        err["errors"][0]["location"] = json!("Authorization");
        err["errors"][0]["locationType"] = json!("header");
        err["status"] = json!("UNAUTHENTICATED");
    }
    (status, axum::Json(json!({ "error": err }))).into_response()
}

fn oauth_error(error: &str, description: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": error, "error_description": description })),
    )
        .into_response()
}

/// The payload of a lost answer: the connection task unwinds and the socket is dropped.
struct LostAnswer;

async fn handle(
    state: Arc<State>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let (hang, throttled) = {
        let mut inner = state.inner.lock().unwrap();
        let throttled = inner.faults.throttle > 0;
        if throttled {
            inner.faults.throttle -= 1;
        }
        (inner.faults.hang, throttled)
    };
    if let Some(d) = hang {
        tokio::time::sleep(d).await;
    }
    if throttled {
        return gce_error(
            StatusCode::TOO_MANY_REQUESTS,
            "rateLimitExceeded",
            "Rate Limit Exceeded",
        );
    }
    if uri.path() == "/token" {
        return token(&state, &method, &headers, &body);
    }
    let unauthorized = state.inner.lock().unwrap().faults.unauthorized;
    if unauthorized {
        return gce_error(
            StatusCode::UNAUTHORIZED,
            "authError",
            "Request had invalid authentication credentials.",
        );
    }
    let call = match validate(&state, &method, &uri, &body) {
        Ok(call) => call,
        Err(why) => {
            let line = format!("{method} {uri}: {why}");
            state.inner.lock().unwrap().invalid.push(line);
            return gce_error(StatusCode::BAD_REQUEST, "invalid", &why);
        }
    };
    // The bearer token must be one the token endpoint issued and still valid.
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    {
        let inner = state.inner.lock().unwrap();
        let valid = bearer
            .as_ref()
            .and_then(|t| inner.tokens.get(t))
            .is_some_and(|exp| Instant::now() < *exp);
        if !valid {
            drop(inner);
            return gce_error(
                StatusCode::UNAUTHORIZED,
                "authError",
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
            );
        }
    }
    if call.params.get("project") != Some(&state.options.project) {
        return gce_error(
            StatusCode::NOT_FOUND,
            "notFound",
            &format!(
                "The resource 'projects/{}' was not found",
                call.params.get("project").cloned().unwrap_or_default()
            ),
        );
    }
    match call.method_id.as_str() {
        "compute.instances.insert" => insert(&state, &call).await,
        "compute.instances.get" => get_instance(&state, &call),
        "compute.instances.delete" => delete(&state, &call),
        "compute.instances.aggregatedList" => aggregated_list(&state, &call),
        "compute.zoneOperations.get" => get_operation(&state, &call),
        other => gce_error(
            StatusCode::NOT_IMPLEMENTED,
            "notImplemented",
            &format!("{other} is not modelled by the fake"),
        ),
    }
}

// ---------------------------------------------------------------- the token endpoint

fn token(state: &State, method: &Method, headers: &HeaderMap, body: &Bytes) -> Response {
    let reject = |why: String, description: &str| {
        state
            .inner
            .lock()
            .unwrap()
            .invalid
            .push(format!("POST /token: {why}"));
        oauth_error("invalid_grant", description)
    };
    if method != Method::POST {
        return reject(format!("method {method}"), "Method not allowed");
    }
    let form_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form_type {
        return reject("not a form body".into(), "Bad Request");
    }
    if state.inner.lock().unwrap().faults.unauthorized {
        // A revoked or deleted key: Google answers invalid_grant.
        return oauth_error("invalid_grant", "Invalid JWT Signature.");
    }
    let form: HashMap<String, String> = match serde_urlencoded_pairs(body) {
        Some(f) => f,
        None => return reject("unreadable form".into(), "Bad Request"),
    };
    if form.get("grant_type").map(String::as_str)
        != Some(switchyard_providers::gcp::JWT_BEARER_GRANT)
    {
        return reject(
            format!("grant_type {:?}", form.get("grant_type")),
            "Invalid grant_type",
        );
    }
    let Some(assertion) = form.get("assertion") else {
        return reject(
            "no assertion".into(),
            "Missing required parameter: assertion",
        );
    };
    let key = match DecodingKey::from_rsa_pem(TEST_PUBLIC_KEY.as_bytes()) {
        Ok(k) => k,
        Err(e) => panic!("test public key: {e}"),
    };
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_audience(&[format!("{}/token", state.base_url)]);
    validation.set_issuer(&[state.client_email.as_str()]);
    validation.set_required_spec_claims(&["exp", "iat", "iss", "aud"]);
    let decoded = match jsonwebtoken::decode::<Value>(assertion, &key, &validation) {
        Ok(d) => d,
        Err(e) => return reject(format!("assertion: {e}"), "Invalid JWT Signature."),
    };
    if decoded.header.kid.as_deref() != Some(state.key_id.as_str()) {
        return reject(
            format!("kid {:?}", decoded.header.kid),
            "Invalid JWT Signature.",
        );
    }
    let claims = decoded.claims;
    let scope = claims["scope"].as_str().unwrap_or_default();
    if !scope
        .split(' ')
        .any(|s| s == switchyard_providers::gcp::COMPUTE_SCOPE)
    {
        return reject(format!("scope {scope:?}"), "Invalid OAuth scope");
    }
    let (iat, exp) = (
        claims["iat"].as_u64().unwrap_or(0),
        claims["exp"].as_u64().unwrap_or(0),
    );
    let now = chrono::Utc::now().timestamp() as u64;
    if exp <= iat || exp - iat > 3600 || iat > now + 60 {
        return reject(
            format!("iat {iat} exp {exp} (now {now})"),
            "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe.",
        );
    }
    let n = state.tokens_issued.fetch_add(1, Ordering::SeqCst) + 1;
    let token = format!("ya29.fake-{n}");
    state
        .inner
        .lock()
        .unwrap()
        .tokens
        .insert(token.clone(), Instant::now() + state.options.token_lifetime);
    axum::Json(json!({
        "access_token": token,
        "expires_in": state.options.token_lifetime.as_secs().max(1),
        "token_type": "Bearer",
    }))
    .into_response()
}

/// `a=b&c=d` with percent-decoding and `+` as space.
fn serde_urlencoded_pairs(body: &[u8]) -> Option<HashMap<String, String>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut out = HashMap::new();
    for pair in text.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.insert(percent_decode(k)?, percent_decode(v)?);
    }
    Some(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).ok()
}

// ---------------------------------------------------------------- validation

/// A request that matched a method of the discovery document.
struct Call {
    method_id: String,
    params: HashMap<String, String>,
    query: HashMap<String, String>,
    body: Option<Value>,
}

fn validate(state: &State, method: &Method, uri: &Uri, body: &Bytes) -> Result<Call, String> {
    let spec = &state.spec;
    let service_path = spec["servicePath"].as_str().unwrap_or("compute/v1/");
    let path = uri
        .path()
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(service_path))
        .ok_or_else(|| format!("the path is not under /{service_path}"))?;
    let segments: Vec<&str> = path.split('/').collect();
    let mut path_matched = false;
    let mut found = None;
    for resource in spec["resources"].as_object().into_iter().flatten() {
        for (_, m) in resource.1["methods"].as_object().into_iter().flatten() {
            let template: Vec<&str> = m["path"].as_str().unwrap_or_default().split('/').collect();
            if template.len() != segments.len() {
                continue;
            }
            let mut params = HashMap::new();
            let ok = template.iter().zip(&segments).all(|(t, s)| {
                if let Some(name) = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')) {
                    params.insert(name.to_owned(), percent_decode(s).unwrap_or_default());
                    !s.is_empty()
                } else {
                    t == s
                }
            });
            if !ok {
                continue;
            }
            path_matched = true;
            if m["httpMethod"].as_str() == Some(method.as_str()) {
                found = Some((m, params));
            }
        }
    }
    let (m, params) = found.ok_or_else(|| {
        if path_matched {
            format!("no method {method} on this path")
        } else {
            "no method has this path".to_string()
        }
    })?;
    let method_id = m["id"].as_str().unwrap_or_default().to_owned();
    let mut query = HashMap::new();
    for pair in uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (
            percent_decode(k).ok_or("bad query encoding")?,
            percent_decode(v).ok_or("bad query encoding")?,
        );
        let p = m["parameters"]
            .get(&k)
            .filter(|p| p["location"] == "query")
            .or_else(|| spec["parameters"].get(&k))
            .ok_or_else(|| format!("unknown query parameter {k:?} for {method_id}"))?;
        check_scalar(p, &Value::String(v.clone()), true).map_err(|e| format!("query {k}: {e}"))?;
        query.insert(k, v);
    }
    let body = match m["request"]["$ref"].as_str() {
        Some(schema) => {
            let value: Value =
                serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
            let mut errors = Vec::new();
            check(
                spec,
                &json!({ "$ref": schema }),
                &value,
                "body",
                &method_id,
                &mut errors,
            );
            if !errors.is_empty() {
                return Err(errors.join("; "));
            }
            Some(value)
        }
        None if body.is_empty() => None,
        None => return Err(format!("{method_id} takes no body")),
    };
    Ok(Call {
        method_id,
        params,
        query,
        body,
    })
}

/// A scalar (a JSON value, or a query string when `from_query`) against its schema.
fn check_scalar(schema: &Value, value: &Value, from_query: bool) -> Result<(), String> {
    let kind = schema["type"].as_str().unwrap_or("any");
    let text = value.as_str();
    let ok = match kind {
        "string" => {
            let Some(s) = text else {
                return Err(format!("expected a string, got {value}"));
            };
            if let Some(options) = schema["enum"].as_array()
                && !options.iter().any(|o| o.as_str() == Some(s))
            {
                return Err(format!("{s:?} is not one of {options:?}"));
            }
            match schema["format"].as_str() {
                Some("int64" | "uint64") => s.parse::<i128>().is_ok(),
                _ => true,
            }
        }
        "integer" if from_query => text.is_some_and(|s| s.parse::<i64>().is_ok()),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => {
            value.is_number() || (from_query && text.is_some_and(|s| s.parse::<f64>().is_ok()))
        }
        "boolean" if from_query => matches!(text, Some("true" | "false")),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{value} is not a valid {kind}"))
    }
}

/// Validates `value` against `schema` (a discovery schema), collecting errors.
fn check(
    spec: &Value,
    schema: &Value,
    value: &Value,
    at: &str,
    method_id: &str,
    errors: &mut Vec<String>,
) {
    if let Some(name) = schema["$ref"].as_str() {
        match spec["schemas"].get(name) {
            Some(s) => return check(spec, s, value, at, method_id, errors),
            None => {
                errors.push(format!("{at}: schema {name} is not in the excerpt"));
                return;
            }
        }
    }
    match schema["type"].as_str() {
        Some("object") => {
            let Some(object) = value.as_object() else {
                errors.push(format!("{at}: expected an object"));
                return;
            };
            let properties = schema["properties"].as_object();
            for (key, v) in object {
                match properties.and_then(|p| p.get(key)) {
                    Some(p) => {
                        if p["description"]
                            .as_str()
                            .is_some_and(|d| d.starts_with("[Output Only]"))
                        {
                            errors.push(format!("{at}.{key} is output only"));
                        }
                        check(spec, p, v, &format!("{at}.{key}"), method_id, errors);
                    }
                    None => match schema.get("additionalProperties") {
                        Some(extra) => {
                            check(spec, extra, v, &format!("{at}.{key}"), method_id, errors)
                        }
                        None => errors.push(format!("{at}: unknown property {key:?}")),
                    },
                }
            }
            for (key, p) in properties.into_iter().flatten() {
                let required = p["annotations"]["required"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|m| m.as_str() == Some(method_id)));
                if required && !object.contains_key(key) {
                    errors.push(format!("{at}.{key} is required by {method_id}"));
                }
            }
        }
        Some("array") => {
            let Some(items) = value.as_array() else {
                errors.push(format!("{at}: expected an array"));
                return;
            };
            for (i, v) in items.iter().enumerate() {
                check(
                    spec,
                    &schema["items"],
                    v,
                    &format!("{at}[{i}]"),
                    method_id,
                    errors,
                );
            }
        }
        _ => {
            if let Err(e) = check_scalar(schema, value, false) {
                errors.push(format!("{at}: {e}"));
            }
        }
    }
}

/// GCE's resource name rule `[a-z]([-a-z0-9]{0,61}[a-z0-9])?`.
fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && !n.ends_with('-')
}

/// GCE's label rules: keys start with a lowercase letter; keys and values are lowercase
/// letters, digits, `_` and `-`, at most 63 characters.
fn valid_labels(labels: &Value) -> Result<(), String> {
    for (k, v) in labels.as_object().into_iter().flatten() {
        let ok = |s: &str| {
            s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        };
        let v = v.as_str().unwrap_or_default();
        if !ok(k) || !k.starts_with(|c: char| c.is_ascii_lowercase()) || !ok(v) {
            return Err(format!("label {k:?}={v:?} breaks GCE's label rules"));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------- the methods

fn zone_url(state: &State, zone: &str) -> String {
    format!(
        "{}/compute/v1/projects/{}/zones/{zone}",
        state.base_url, state.options.project
    )
}

fn operation_json(state: &State, op: &FakeOp) -> Value {
    let done = Instant::now() >= op.done_at;
    let mut v = json!({
        "kind": "compute#operation",
        "id": op.id.to_string(),
        "name": op.name,
        "zone": zone_url(state, &op.zone),
        "operationType": op.kind,
        "targetLink": format!("{}/instances/{}", zone_url(state, &op.zone), op.instance.rsplit('/').next().unwrap_or_default()),
        "targetId": op.id.to_string(),
        "status": if done { "DONE" } else { "RUNNING" },
        "user": state.client_email,
        "progress": if done { 100 } else { 0 },
        "insertTime": op.inserted,
        "startTime": op.inserted,
        "selfLink": format!("{}/operations/{}", zone_url(state, &op.zone), op.name),
    });
    if done {
        v["endTime"] = json!(chrono::Utc::now().to_rfc3339());
        if let Some((code, message, status)) = &op.error {
            v["error"] = json!({ "errors": [{ "code": code, "message": message }] });
            v["httpErrorStatusCode"] = json!(status);
            v["httpErrorMessage"] = json!(
                StatusCode::from_u16(*status)
                    .ok()
                    .and_then(|s| s.canonical_reason())
                    .unwrap_or("ERROR")
                    .to_uppercase()
            );
        }
    }
    v
}

fn new_op(
    state: &State,
    inner: &mut Inner,
    zone: &str,
    kind: &'static str,
    instance: &str,
    error: Option<(&'static str, String, u16)>,
) -> String {
    inner.next_id += 1;
    let id = 7_000_000_000_000_000_000u64 + inner.next_id;
    let name = format!("operation-{}-{id:x}", chrono::Utc::now().timestamp_millis());
    let run_for = inner.faults.slow.unwrap_or(state.options.operation_time);
    inner.operations.insert(
        name.clone(),
        FakeOp {
            name: name.clone(),
            zone: zone.to_owned(),
            kind,
            instance: instance.to_owned(),
            id,
            inserted: chrono::Utc::now().to_rfc3339(),
            done_at: Instant::now() + run_for,
            error,
            applied: false,
        },
    );
    name
}

async fn insert(state: &Arc<State>, call: &Call) -> Response {
    let zone = call.params.get("zone").cloned().unwrap_or_default();
    let body = call.body.clone().unwrap_or(Value::Null);
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    let reject = |why: String| {
        state
            .inner
            .lock()
            .unwrap()
            .invalid
            .push(format!("instances.insert in {zone}: {why}"));
        gce_error(StatusCode::BAD_REQUEST, "invalid", &why)
    };
    if !valid_name(&name) {
        return reject(format!("Invalid value for field 'resource.name': {name:?}"));
    }
    for labels in [
        &body["labels"],
        &body["disks"][0]["initializeParams"]["labels"],
    ] {
        if let Err(e) = valid_labels(labels) {
            return reject(e);
        }
    }
    let machine_type = body["machineType"].as_str().unwrap_or_default();
    let (mt_zone, mt) = match machine_type
        .rsplit_once("/machineTypes/")
        .map(|(z, mt)| (z.rsplit('/').next().unwrap_or_default(), mt))
    {
        Some(x) => x,
        None => {
            return reject(format!(
                "Invalid value for field 'resource.machineType': {machine_type:?}"
            ));
        }
    };
    if mt_zone != zone {
        return reject(format!(
            "Invalid value for field 'resource.machineType': {machine_type:?} is not in zone {zone}"
        ));
    }
    let region = zone
        .rsplit_once('-')
        .map(|(r, _)| r)
        .unwrap_or_default()
        .to_owned();
    let entry = state.catalogue.find("gcp", &region, mt).cloned();
    let Some(entry) = entry else {
        // An unknown machine type is GCE's 400, not a malformed request.
        return gce_error(
            StatusCode::BAD_REQUEST,
            "invalid",
            &format!(
                "Invalid value for field 'resource.machineType': '{machine_type}'. Machine type with name '{mt}' does not exist in zone '{zone}'."
            ),
        );
    };
    if body["disks"].as_array().is_none_or(|d| d.is_empty())
        || body["networkInterfaces"]
            .as_array()
            .is_none_or(|n| n.is_empty())
    {
        return reject("an instance needs a boot disk and a network interface".into());
    }
    let script = body["metadata"]["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|i| i["key"] == "startup-script")
        .and_then(|i| i["value"].as_str())
        .map(str::to_owned);
    let provider_id = format!("{zone}/{name}");
    let request_id = call.query.get("requestId").cloned();

    let (op_name, created, lose) = {
        let mut inner = state.inner.lock().unwrap();
        tick(&mut inner);
        if let Some(op) = request_id.as_ref().and_then(|r| inner.request_ids.get(r)) {
            // A retried request: the same operation.
            let op = &inner.operations[op];
            return axum::Json(operation_json(state, op)).into_response();
        }
        if inner.instances.contains_key(&provider_id) {
            drop(inner);
            return gce_error(
                StatusCode::CONFLICT,
                "alreadyExists",
                &format!(
                    "The resource 'projects/{}/zones/{zone}/instances/{name}' already exists",
                    state.options.project
                ),
            );
        }
        let error = if inner.faults.capacity || state.options.stockout_zones.contains(&zone) {
            Some((
                "ZONE_RESOURCE_POOL_EXHAUSTED",
                format!(
                    "The zone 'projects/{}/zones/{zone}' does not have enough resources available to fulfill the request. Try a different zone, or try again later.",
                    state.options.project
                ),
                503,
            ))
        } else if inner.faults.quota {
            Some((
                "QUOTA_EXCEEDED",
                format!("Quota 'NVIDIA_GPUS' exceeded. Limit: 0.0 in region {region}."),
                403,
            ))
        } else {
            None
        };
        let created = error.is_none();
        if created {
            inner.next_id += 1;
            let mut resource = body.clone();
            resource["kind"] = json!("compute#instance");
            resource["id"] = json!((1_000_000_000_000u64 + inner.next_id).to_string());
            resource["status"] = json!("PROVISIONING");
            resource["zone"] = json!(zone_url(state, &zone));
            resource["machineType"] =
                json!(format!("{}/machineTypes/{mt}", zone_url(state, &zone)));
            resource["selfLink"] = json!(format!("{}/instances/{name}", zone_url(state, &zone)));
            resource["creationTimestamp"] = json!(chrono::Utc::now().to_rfc3339());
            resource["metadata"]["kind"] = json!("compute#metadata");
            resource["metadata"]["fingerprint"] = json!("ZmFrZQ==");
            inner.instances.insert(
                provider_id.clone(),
                FakeInstance {
                    zone: zone.clone(),
                    resource,
                    script: script.clone(),
                    sandbox: None,
                    boot_error: None,
                    deleting: false,
                },
            );
        }
        let op = new_op(state, &mut inner, &zone, OP_INSERT, &provider_id, error);
        if let Some(r) = request_id {
            inner.request_ids.insert(r, op.clone());
        }
        let lose = created && std::mem::take(&mut inner.faults.lose_next_launch);
        (op, created, lose)
    };
    if created && state.options.run_bootstrap {
        let gpus = format!("{}x{}", entry.gpu_count, entry.gpu_model);
        let text = script.clone().unwrap_or_default();
        let booted = tokio::task::spawn_blocking(move || boot::Instance::boot(&text, Some(&gpus)))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(|r| r);
        let mut inner = state.inner.lock().unwrap();
        match (inner.instances.get_mut(&provider_id), booted) {
            (Some(i), Ok(sandbox)) => i.sandbox = Some(sandbox),
            (Some(i), Err(e)) => i.boot_error = Some(format!("{e:#}")),
            (None, Ok(sandbox)) => drop(sandbox),
            (None, Err(_)) => {}
        }
    }
    if lose {
        // The work is done; the answer is lost: unwind the connection task without a response
        // (resume_unwind runs no panic hook, so this is quiet).
        std::panic::resume_unwind(Box::new(LostAnswer));
    }
    let inner = state.inner.lock().unwrap();
    axum::Json(operation_json(state, &inner.operations[&op_name])).into_response()
}

fn not_found(state: &State, zone: &str, what: &str, name: &str) -> Response {
    gce_error(
        StatusCode::NOT_FOUND,
        "notFound",
        &format!(
            "The resource 'projects/{}/zones/{zone}/{what}/{name}' was not found",
            state.options.project
        ),
    )
}

fn get_instance(state: &State, call: &Call) -> Response {
    let zone = call.params.get("zone").cloned().unwrap_or_default();
    let name = call.params.get("instance").cloned().unwrap_or_default();
    let mut inner = state.inner.lock().unwrap();
    tick(&mut inner);
    match inner.instances.get(&format!("{zone}/{name}")) {
        Some(i) => axum::Json(i.resource.clone()).into_response(),
        None => not_found(state, &zone, "instances", &name),
    }
}

fn delete(state: &State, call: &Call) -> Response {
    let zone = call.params.get("zone").cloned().unwrap_or_default();
    let name = call.params.get("instance").cloned().unwrap_or_default();
    let id = format!("{zone}/{name}");
    let mut inner = state.inner.lock().unwrap();
    tick(&mut inner);
    let request_id = call.query.get("requestId").cloned();
    if let Some(op) = request_id.as_ref().and_then(|r| inner.request_ids.get(r)) {
        return axum::Json(operation_json(state, &inner.operations[op])).into_response();
    }
    let Some(instance) = inner.instances.get_mut(&id) else {
        drop(inner);
        return not_found(state, &zone, "instances", &name);
    };
    instance.deleting = true;
    instance.resource["status"] = json!("STOPPING");
    let op = new_op(state, &mut inner, &zone, OP_DELETE, &id, None);
    if let Some(r) = request_id {
        inner.request_ids.insert(r, op.clone());
    }
    axum::Json(operation_json(state, &inner.operations[&op])).into_response()
}

fn get_operation(state: &State, call: &Call) -> Response {
    let zone = call.params.get("zone").cloned().unwrap_or_default();
    let name = call.params.get("operation").cloned().unwrap_or_default();
    let mut inner = state.inner.lock().unwrap();
    tick(&mut inner);
    match inner.operations.get(&name).filter(|op| op.zone == zone) {
        Some(op) => axum::Json(operation_json(state, op)).into_response(),
        None => not_found(state, &zone, "operations", &name),
    }
}

/// One `field = "value"` or `field != "value"` term of a list filter.
struct Term {
    field: String,
    equal: bool,
    value: String,
}

/// GCE list filters as Switchyard writes them: `(a = "x") (b != "y")` (AND), or one bare
/// term; fields `name`, `status`, `labels.KEY`.
fn parse_filter(filter: &str) -> Result<Vec<Term>, String> {
    let filter = filter.trim();
    let groups: Vec<&str> = if filter.starts_with('(') {
        let mut out = Vec::new();
        let mut rest = filter;
        while !rest.is_empty() {
            let inner = rest.strip_prefix('(').ok_or("expected '('")?;
            let end = inner.find(')').ok_or("unbalanced parentheses")?;
            out.push(&inner[..end]);
            rest = inner[end + 1..].trim_start();
        }
        out
    } else if filter.is_empty() {
        Vec::new()
    } else {
        vec![filter]
    };
    groups
        .into_iter()
        .map(|g| {
            let (field, equal, value) = if let Some((f, v)) = g.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = g.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("no operator in {g:?}"));
            };
            let field = field.trim();
            if !(field == "name" || field == "status" || field.starts_with("labels.")) {
                return Err(format!("field {field:?} is not modelled"));
            }
            let value = value.trim();
            let value = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            Ok(Term {
                field: field.to_owned(),
                equal,
                value: value.to_owned(),
            })
        })
        .collect()
}

fn matches(resource: &Value, terms: &[Term]) -> bool {
    terms.iter().all(|t| {
        let actual = match t.field.strip_prefix("labels.") {
            Some(label) => resource["labels"][label].as_str(),
            None => resource[t.field.as_str()].as_str(),
        };
        (actual == Some(t.value.as_str())) == t.equal
    })
}

fn aggregated_list(state: &State, call: &Call) -> Response {
    let terms = match parse_filter(call.query.get("filter").map_or("", String::as_str)) {
        Ok(t) => t,
        Err(e) => {
            return gce_error(
                StatusCode::BAD_REQUEST,
                "invalid",
                &format!("Invalid value for field 'filter': {e}"),
            );
        }
    };
    let max = call
        .query
        .get("maxResults")
        .and_then(|m| m.parse::<usize>().ok())
        .unwrap_or(500)
        .min(500);
    let page_size = max.min(state.options.page_size).max(1);
    let offset = match call.query.get("pageToken") {
        None => 0,
        Some(t) => match t
            .strip_prefix("page-")
            .and_then(|n| n.parse::<usize>().ok())
        {
            Some(n) => n,
            None => {
                return gce_error(
                    StatusCode::BAD_REQUEST,
                    "invalid",
                    "Invalid value for field 'pageToken'",
                );
            }
        },
    };
    let mut inner = state.inner.lock().unwrap();
    tick(&mut inner);
    let all: Vec<&FakeInstance> = inner
        .instances
        .values()
        .filter(|i| matches(&i.resource, &terms))
        .collect();
    let page: Vec<&&FakeInstance> = all.iter().skip(offset).take(page_size).collect();
    let mut items: Map<String, Value> = Map::new();
    for i in &page {
        let scope = items
            .entry(format!("zones/{}", i.zone))
            .or_insert_with(|| json!({ "instances": [] }));
        if let Some(list) = scope["instances"].as_array_mut() {
            list.push(i.resource.clone());
        }
    }
    let mut answer = json!({
        "kind": "compute#instanceAggregatedList",
        "id": format!("projects/{}/aggregated/instances", state.options.project),
        "items": items,
        "selfLink": format!("{}/compute/v1/projects/{}/aggregated/instances", state.base_url, state.options.project),
    });
    if offset + page_size < all.len() {
        answer["nextPageToken"] = json!(format!("page-{}", offset + page_size));
    }
    axum::Json(answer).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_parse_as_the_provider_writes_them() {
        let t = parse_filter(r#"(labels.switchyard-cluster = "c1") (labels.k != "x")"#).unwrap();
        assert_eq!(t.len(), 2);
        let r = json!({ "labels": { "switchyard-cluster": "c1", "k": "y" } });
        assert!(matches(&r, &t));
        assert!(!matches(
            &json!({ "labels": { "switchyard-cluster": "c2" } }),
            &t
        ));
        assert!(parse_filter("cpuPlatform = x").is_err());
    }

    #[test]
    fn bodies_are_checked_against_the_discovery_document() {
        let spec: Value = serde_json::from_str(DISCOVERY).unwrap();
        let mut errors = Vec::new();
        let body = json!({
            "name": "sy-a",
            "machineType": "zones/us-central1-a/machineTypes/g2-standard-4",
            "scheduling": { "provisioningModel": "CHEAP" },
            "metadata": { "items": [{ "key": "startup-script" }] },
            "status": "RUNNING",
            "colour": "blue",
        });
        check(
            &spec,
            &json!({ "$ref": "Instance" }),
            &body,
            "body",
            "compute.instances.insert",
            &mut errors,
        );
        let all = errors.join("\n");
        for expected in [
            "body.scheduling.provisioningModel: \"CHEAP\" is not one of",
            "body.metadata.items[0].value is required",
            "body.status is output only",
            "unknown property \"colour\"",
        ] {
            assert!(all.contains(expected), "{expected} not in\n{all}");
        }
    }
}
