//! A FAKE of the Lambda Cloud API (`/api/v1`), in process, on 127.0.0.1. It is not Lambda: it
//! follows Lambda's published OpenAPI document (`tests/data/apis/lambda-openapi.json`, version
//! 1.10.0) for the operations Switchyard uses — `GET /instance-types`, `GET /instances`,
//! `GET /instances/{id}`, `POST /instance-operations/launch`, `POST
//! /instance-operations/terminate` — with the document's paths, request and answer bodies
//! (`{"data": …}`) and error bodies (`{"error": {"code", "message", "suggestion"}}`).
//!
//! Every request is checked against the document (the operation exists, its query names are
//! declared, its JSON body validates); a request that does not is recorded
//! ([`FakeCloud::invalid_requests`]) and answered 400 `global/invalid-parameters`. The rules the
//! document states in prose are enforced too: exactly one SSH key, user data of at most 1 MB,
//! and one launch request per `launch_min_interval` (Lambda: one per 12 s), answered 429.
//!
//! Where the document is silent the fake chooses, and says so here: a 429 carries a plain-text
//! body (the document defines no 429 body); an instance is `booting` for
//! [`Fault::SlowOperations`]'s duration (else until it is first read) and then `active`;
//! a terminated instance leaves the list at once. The document's general limit of one request
//! per second is not enforced (the suite's retries would only slow down); the launch limit is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::openapi::{Direction, Spec};
use super::{FakeCloud, Fault, Faults, boot};
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_providers::Catalogue;

/// Lambda's OpenAPI document, as published (see `tests/data/apis/README.md`).
pub const OPENAPI: &str = include_str!("../../data/apis/lambda-openapi.json");

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct FakeOptions {
    /// The API key the fake accepts (as `Bearer <key>`, or Basic `<key>:`).
    pub api_key: String,
    /// The SSH keys the account has.
    pub ssh_keys: Vec<String>,
    /// Run each launched instance's user data in a boot sandbox.
    pub run_bootstrap: bool,
    /// Least time between two launch requests; a closer one is answered 429.
    pub launch_min_interval: Duration,
    /// Catalogue instance types this "Lambda" no longer offers (they are not in
    /// `/instance-types`, and launching them is answered `global/object-does-not-exist`).
    pub retired_types: Vec<String>,
    /// Prices (US cents per hour) that differ from the catalogue's, by instance type: what a
    /// live price refresh must pick up.
    pub prices_cents: BTreeMap<String, i64>,
}

impl Default for FakeOptions {
    fn default() -> Self {
        FakeOptions {
            api_key: "fake-lambda-api-key".into(),
            ssh_keys: vec!["switchyard".into()],
            run_bootstrap: false,
            launch_min_interval: Duration::from_millis(50),
            retired_types: Vec::new(),
            prices_cents: BTreeMap::new(),
        }
    }
}

struct FakeInstance {
    id: String,
    name: String,
    region: String,
    instance_type: String,
    ssh_key_names: Vec<String>,
    file_system_names: Vec<String>,
    tags: Vec<Value>,
    user_data: Option<String>,
    /// `booting` until then.
    active_at: Instant,
    ip: String,
}

/// An instance's boot sandbox, kept after power-off so a test can read what the script wrote.
struct Sandbox {
    instance: boot::Instance,
    powered_off: bool,
}

#[derive(Default)]
struct Inner {
    faults: Faults,
    instances: BTreeMap<String, FakeInstance>,
    invalid: Vec<String>,
    last_launch: Option<Instant>,
    launches: u64,
    next_id: u64,
}

struct State {
    options: FakeOptions,
    spec: Spec,
    catalogue: Catalogue,
    base_url: String,
    inner: Mutex<Inner>,
    sandboxes: Mutex<BTreeMap<String, Sandbox>>,
    boot_errors: Mutex<BTreeMap<String, String>>,
    requests: AtomicU64,
}

/// A running fake Lambda; it stops (and powers its sandboxes off) when dropped.
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
pub async fn start(options: FakeOptions) -> FakeHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    let state = Arc::new(State {
        options,
        spec: Spec::from_value(serde_json::from_str(OPENAPI).expect("Lambda's OpenAPI document")),
        catalogue: Catalogue::bundled().expect("catalogue"),
        base_url: format!("http://{addr}"),
        inner: Mutex::new(Inner::default()),
        sandboxes: Mutex::new(BTreeMap::new()),
        boot_errors: Mutex::new(BTreeMap::new()),
        requests: AtomicU64::new(0),
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
    /// The server's root URL (`http://127.0.0.1:PORT`).
    pub fn url(&self) -> String {
        self.state.base_url.clone()
    }

    /// The provider's `api_endpoint`: the root with `/api/v1`.
    pub fn api_endpoint(&self) -> String {
        format!("{}/api/v1", self.state.base_url)
    }

    /// The API key the fake accepts.
    pub fn api_key(&self) -> &str {
        &self.state.options.api_key
    }

    /// The user data (the bootstrap script) an instance was launched with.
    pub fn user_data(&self, id: &str) -> Option<String> {
        let inner = self.state.inner.lock().unwrap();
        inner.instances.get(id).and_then(|i| i.user_data.clone())
    }

    /// The name an instance was launched with.
    pub fn instance_name(&self, id: &str) -> Option<String> {
        let inner = self.state.inner.lock().unwrap();
        inner.instances.get(id).map(|i| i.name.clone())
    }

    /// The instance as `GET /instances/{id}` shows it.
    pub fn instance(&self, id: &str) -> Option<Value> {
        let inner = self.state.inner.lock().unwrap();
        inner
            .instances
            .get(id)
            .map(|i| instance_json(&self.state, i, Instant::now()))
    }

    /// How many launch requests the fake accepted.
    pub fn launches(&self) -> u64 {
        self.state.inner.lock().unwrap().launches
    }

    /// The sandbox root of an instance that ran its bootstrap (kept after power-off).
    pub fn sandbox_root(&self, id: &str) -> Option<PathBuf> {
        let sandboxes = self.state.sandboxes.lock().unwrap();
        sandboxes.get(id).map(|s| s.instance.root().to_path_buf())
    }

    /// Whether the agent an instance's bootstrap started is running.
    pub fn agent_running(&self, id: &str) -> bool {
        let sandboxes = self.state.sandboxes.lock().unwrap();
        sandboxes
            .get(id)
            .is_some_and(|s| !s.powered_off && s.instance.agent_running())
    }

    /// Whether the instance's sandbox was powered off (by terminate or vanish).
    pub fn powered_off(&self, id: &str) -> bool {
        let sandboxes = self.state.sandboxes.lock().unwrap();
        sandboxes.get(id).is_some_and(|s| s.powered_off)
    }

    /// Why an instance's bootstrap failed, if it did.
    pub fn boot_error(&self, id: &str) -> Option<String> {
        self.state.boot_errors.lock().unwrap().get(id).cloned()
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
        if removed.is_some() {
            power_off(&self.state, provider_id);
        }
    }

    fn live_instances(&self) -> Vec<String> {
        self.state
            .inner
            .lock()
            .unwrap()
            .instances
            .keys()
            .cloned()
            .collect()
    }

    fn invalid_requests(&self) -> Vec<String> {
        self.state.inner.lock().unwrap().invalid.clone()
    }

    fn requests(&self) -> u64 {
        self.state.requests.load(Ordering::SeqCst)
    }
}

/// Powers an instance's sandbox off, off the async threads (it waits for the agent to stop).
fn power_off(state: &Arc<State>, id: &str) {
    let state = state.clone();
    let id = id.to_string();
    let work = move || {
        let mut sandboxes = state.sandboxes.lock().unwrap();
        if let Some(s) = sandboxes.get_mut(&id)
            && !s.powered_off
        {
            s.instance.power_off(Duration::from_secs(2));
            s.powered_off = true;
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(work);
        }
        Err(_) => work(),
    }
}

/// `{"error": {...}}` with the status the document gives the code.
fn error(status: StatusCode, code: &str, message: &str, suggestion: Option<&str>) -> Response {
    let mut body = json!({"code": code, "message": message});
    if let Some(s) = suggestion {
        body["suggestion"] = json!(s);
    }
    (status, axum::Json(json!({ "error": body }))).into_response()
}

fn data(value: Value) -> Response {
    (StatusCode::OK, axum::Json(json!({ "data": value }))).into_response()
}

fn authorized(state: &State, headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let key = &state.options.api_key;
    if value.strip_prefix("Bearer ") == Some(key.as_str()) {
        return true;
    }
    // Lambda also takes `Basic <key>` (and its base64 form with a colon, which this fake,
    // without a base64 decoder, does not model).
    value.strip_prefix("Basic ") == Some(key.as_str())
}

async fn handle(
    state: Arc<State>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    let path = uri.path().to_string();
    let query: Vec<String> = uri
        .query()
        .map(|q| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| p.split('=').next().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    let hang = state.inner.lock().unwrap().faults.hang;
    if let Some(d) = hang {
        tokio::time::sleep(d).await;
    }

    // The published description: the operation, its query, its body.
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                return invalid(
                    &state,
                    &method,
                    &path,
                    vec![format!("body is not JSON: {e}")],
                );
            }
        }
    };
    let names: Vec<&str> = query.iter().map(String::as_str).collect();
    let template =
        match state
            .spec
            .check_request(method.as_str(), &path, &names, json_body.as_ref())
        {
            Ok(t) => t,
            Err(errors) => {
                if state.spec.operation(method.as_str(), &path).is_none() {
                    let mut inner = state.inner.lock().unwrap();
                    inner.invalid.push(format!(
                        "{method} {path}: no such operation in the description"
                    ));
                    return error(
                        StatusCode::NOT_FOUND,
                        "global/not-found",
                        "The requested resource was not found.",
                        None,
                    );
                }
                return invalid(&state, &method, &path, errors);
            }
        };

    {
        let mut inner = state.inner.lock().unwrap();
        if inner.faults.unauthorized || !authorized(&state, &headers) {
            return error(
                StatusCode::UNAUTHORIZED,
                "global/invalid-api-key",
                "API key was invalid, expired, or deleted.",
                Some("Check your API key or create a new one, then try again."),
            );
        }
        if inner.faults.throttle > 0 {
            inner.faults.throttle -= 1;
            return (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests").into_response();
        }
    }
    let body = json_body.unwrap_or(Value::Null);
    match (method.as_str(), template.as_str()) {
        ("GET", "/api/v1/instance-types") => instance_types(&state),
        ("GET", "/api/v1/instances") => {
            let inner = state.inner.lock().unwrap();
            let now = Instant::now();
            let list: Vec<Value> = inner
                .instances
                .values()
                .map(|i| instance_json(&state, i, now))
                .collect();
            data(Value::Array(list))
        }
        ("GET", "/api/v1/instances/{id}") => {
            let id = path.rsplit('/').next().unwrap_or_default();
            let inner = state.inner.lock().unwrap();
            match inner.instances.get(id) {
                Some(i) => data(instance_json(&state, i, Instant::now())),
                None => not_found_instance(),
            }
        }
        ("POST", "/api/v1/instance-operations/launch") => launch(&state, &body).await,
        ("POST", "/api/v1/instance-operations/terminate") => terminate(&state, &body),
        _ => {
            let mut inner = state.inner.lock().unwrap();
            inner.invalid.push(format!(
                "{method} {path}: not an operation this fake serves"
            ));
            error(
                StatusCode::NOT_FOUND,
                "global/not-found",
                "The requested resource was not found.",
                None,
            )
        }
    }
}

/// Records a request outside the description and answers it as Lambda does bad input.
fn invalid(state: &State, method: &Method, path: &str, errors: Vec<String>) -> Response {
    let why = errors.join("; ");
    state
        .inner
        .lock()
        .unwrap()
        .invalid
        .push(format!("{method} {path}: {why}"));
    error(
        StatusCode::BAD_REQUEST,
        "global/invalid-parameters",
        &format!("Invalid request data: {why}"),
        None,
    )
}

fn not_found_instance() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "global/object-does-not-exist",
        "Specified instance does not exist.",
        None,
    )
}

fn region_description(region: &str) -> String {
    format!("Lambda region {region}")
}

/// The catalogue's Lambda offers, minus the retired types: type → (entry per region).
fn offered(state: &State) -> BTreeMap<&str, Vec<&switchyard_providers::CatalogueEntry>> {
    let mut types: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for e in state.catalogue.entries().iter().filter(|e| {
        e.provider == "lambda" && !state.options.retired_types.contains(&e.instance_type)
    }) {
        types.entry(e.instance_type.as_str()).or_default().push(e);
    }
    types
}

fn instance_type_json(state: &State, e: &switchyard_providers::CatalogueEntry) -> Value {
    let cents = state
        .options
        .prices_cents
        .get(&e.instance_type)
        .copied()
        .unwrap_or_else(|| (e.on_demand_per_hour.as_dollars() * 100.0).round() as i64);
    json!({
        "name": e.instance_type,
        "description": format!("{}x {} ({} GB)", e.gpu_count, e.gpu_model, e.gpu_memory_gb),
        "gpu_description": format!("{} ({} GB)", e.gpu_model, e.gpu_memory_gb),
        "price_cents_per_hour": cents,
        "specs": {"vcpus": e.vcpus, "memory_gib": e.memory_gb, "storage_gib": 512, "gpus": e.gpu_count},
    })
}

fn instance_types(state: &State) -> Response {
    let capacity = !state.inner.lock().unwrap().faults.capacity;
    let mut out = serde_json::Map::new();
    for (name, entries) in offered(state) {
        let regions: Vec<Value> = if capacity {
            entries
                .iter()
                .map(|e| json!({"name": e.region, "description": region_description(&e.region)}))
                .collect()
        } else {
            Vec::new()
        };
        out.insert(
            name.to_string(),
            json!({"instance_type": instance_type_json(state, entries[0]), "regions_with_capacity_available": regions}),
        );
    }
    data(Value::Object(out))
}

fn instance_json(state: &State, i: &FakeInstance, now: Instant) -> Value {
    let status = if now < i.active_at {
        "booting"
    } else {
        "active"
    };
    let entry = state
        .catalogue
        .find("lambda", &i.region, &i.instance_type)
        .map(|e| instance_type_json(state, e))
        .unwrap_or_else(|| json!({"name": i.instance_type}));
    let available = json!({"available": status == "active"});
    json!({
        "id": i.id,
        "name": i.name,
        "ip": i.ip,
        "private_ip": "10.0.2.100",
        "status": status,
        "ssh_key_names": i.ssh_key_names,
        "file_system_names": i.file_system_names,
        "region": {"name": i.region, "description": region_description(&i.region)},
        "instance_type": entry,
        "hostname": i.ip.replace('.', "-"),
        "actions": {
            "migrate": {"available": false, "reason_code": "vm-has-not-launched"},
            "rebuild": available,
            "restart": available,
            "cold_reboot": available,
            "terminate": {"available": true},
        },
        "tags": i.tags,
    })
}

async fn launch(state: &Arc<State>, body: &Value) -> Response {
    let text = |k: &str| {
        body.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let strings = |k: &str| -> Vec<String> {
        body.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let region = text("region_name");
    let instance_type = text("instance_type_name");
    let ssh_keys = strings("ssh_key_names");
    let user_data = body
        .get("user_data")
        .and_then(Value::as_str)
        .map(String::from);
    let (id, lose, script_gpus) = {
        let mut inner = state.inner.lock().unwrap();
        // The documented rate limit: one launch request per interval.
        let now = Instant::now();
        if inner
            .last_launch
            .is_some_and(|t| now.duration_since(t) < state.options.launch_min_interval)
        {
            return (StatusCode::TOO_MANY_REQUESTS, "Too Many Requests").into_response();
        }
        inner.last_launch = Some(now);
        // Rules the document states in prose.
        if ssh_keys.len() != 1 {
            let why = format!(
                "ssh_key_names has {} keys; exactly one must be given",
                ssh_keys.len()
            );
            inner.invalid.push(format!("POST launch: {why}"));
            return error(
                StatusCode::BAD_REQUEST,
                "global/invalid-parameters",
                &why,
                None,
            );
        }
        if user_data.as_ref().is_some_and(|u| u.len() > 1_000_000) {
            let why = "user_data exceeds 1MB".to_string();
            inner.invalid.push(format!("POST launch: {why}"));
            return error(
                StatusCode::BAD_REQUEST,
                "global/invalid-parameters",
                &why,
                None,
            );
        }
        drop(inner);
        let offered = offered(state);
        let entry = offered
            .get(instance_type.as_str())
            .and_then(|entries| entries.iter().find(|e| e.region == region).copied());
        let Some(entry) = entry else {
            return error(
                StatusCode::NOT_FOUND,
                "global/object-does-not-exist",
                &format!("Instance type {instance_type:?} is not available in region {region:?}."),
                Some("Check the instance type and region names."),
            );
        };
        if !state.options.ssh_keys.contains(&ssh_keys[0]) {
            return error(
                StatusCode::NOT_FOUND,
                "global/object-does-not-exist",
                &format!("SSH key {:?} does not exist.", ssh_keys[0]),
                Some("Add the SSH key first."),
            );
        }
        let mut inner = state.inner.lock().unwrap();
        if inner.faults.capacity {
            return error(
                StatusCode::BAD_REQUEST,
                "instance-operations/launch/insufficient-capacity",
                "Not enough capacity to fulfill launch request.",
                Some("Try a different region or instance type."),
            );
        }
        if inner.faults.quota {
            return error(
                StatusCode::BAD_REQUEST,
                "global/quota-exceeded",
                "Quota exceeded.",
                Some("Contact Support to increase your quota."),
            );
        }
        inner.next_id += 1;
        let n = inner.next_id;
        let id = format!(
            "{:016x}{:016x}",
            0x5ec0_0000_0000_0000_u64 | n,
            n.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        );
        let tags: Vec<Value> = body
            .get("tags")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let active_at = now + inner.faults.slow.unwrap_or(Duration::ZERO);
        inner.instances.insert(
            id.clone(),
            FakeInstance {
                id: id.clone(),
                name: text("name"),
                region: region.clone(),
                instance_type: instance_type.clone(),
                ssh_key_names: ssh_keys.clone(),
                file_system_names: strings("file_system_names"),
                tags,
                user_data: user_data.clone(),
                active_at,
                ip: format!("198.51.100.{}", n % 250 + 2),
            },
        );
        inner.launches += 1;
        let lose = std::mem::take(&mut inner.faults.lose_next_launch);
        (id, lose, format!("{}x{}", entry.gpu_count, entry.gpu_model))
    };
    if state.options.run_bootstrap
        && let Some(script) = user_data
    {
        let id2 = id.clone();
        let st = state.clone();
        tokio::task::spawn_blocking(move || {
            match boot::Instance::boot(&script, Some(&script_gpus)) {
                Ok(instance) => {
                    st.sandboxes.lock().unwrap().insert(
                        id2,
                        Sandbox {
                            instance,
                            powered_off: false,
                        },
                    );
                }
                Err(e) => {
                    st.boot_errors.lock().unwrap().insert(id2, e.to_string());
                }
            }
        });
    }
    if lose {
        // The work is done; the answer is lost: the status line goes out, then the
        // connection breaks before any body.
        let broken = futures::stream::once(async {
            Err::<Bytes, std::io::Error>(std::io::Error::other("answer lost (fault)"))
        });
        return (StatusCode::OK, Body::from_stream(broken)).into_response();
    }
    data(json!({ "instance_ids": [id] }))
}

fn terminate(state: &Arc<State>, body: &Value) -> Response {
    let ids: Vec<String> = body
        .get("instance_ids")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let mut inner = state.inner.lock().unwrap();
    if ids.iter().any(|id| !inner.instances.contains_key(id)) {
        return not_found_instance();
    }
    let now = Instant::now();
    let mut terminated = Vec::new();
    for id in &ids {
        if let Some(i) = inner.instances.remove(id) {
            let mut v = instance_json(state, &i, now);
            v["status"] = json!("terminating");
            terminated.push(v);
        }
    }
    drop(inner);
    for id in &ids {
        power_off(state, id);
    }
    data(json!({ "terminated_instances": terminated }))
}

/// Checks an answer body against the document's schema for `method path` and `status`.
pub fn check_answer(
    spec: &Spec,
    method: &str,
    path: &str,
    status: u16,
    body: &Value,
) -> Result<(), Vec<String>> {
    let op = spec
        .operation(method, path)
        .ok_or_else(|| vec![format!("{method} {path}: no operation")])?;
    let schema = op
        .raw
        .pointer(&format!(
            "/responses/{status}/content/application~1json/schema"
        ))
        .ok_or_else(|| vec![format!("{method} {path}: no {status} answer")])?;
    spec.validate(schema, body, Direction::Response)
}

/// The document the fake follows, parsed.
pub fn spec() -> Spec {
    Spec::from_value(serde_json::from_str(OPENAPI).expect("Lambda's OpenAPI document"))
}
