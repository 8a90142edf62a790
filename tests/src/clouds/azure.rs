//! A **fake** of Azure Resource Manager for the Azure provider's tests: Microsoft.Compute
//! virtual machines, Microsoft.Network network interfaces, the Microsoft Entra token endpoint
//! and the Retail Prices API, in process (axum on 127.0.0.1:0). It is not Azure: it follows
//! the published API description (the `azure-*` excerpts of Azure/azure-rest-api-specs under
//! `tests/data/apis/`, see its README) for request paths, api-versions and bodies, and ARM's
//! conventions for what the description leaves out: `Azure-AsyncOperation` operations
//! (`InProgress` → `Succeeded` / `Failed` with `error.code`), `nextLink` pagination (a small
//! page size, `$skiptoken`), `{"error": {"code", "message"}}` bodies, 401s for bad tokens, 429s
//! with `Retry-After`, 204 for deleting what is not there.
//!
//! Every ARM request is checked against the description with [`super::openapi`]: the method
//! and path must be an operation of it, the `api-version` its version, the query parameters
//! declared, the body valid. The fake reads the description more strictly than ARM: every
//! object is closed (a property the excerpt does not list is an error; a property whose schema
//! the excerpt left out fails as an unresolved `$ref`). Enums follow the description
//! (`modelAsString` ones are open). A request that fails is recorded
//! ([`FakeCloud::invalid_requests`]) and answered with ARM's 400.
//!
//! The model: a NIC must exist (and be free) before a VM names it; a VM creates its OS disk;
//! deleting a VM deletes its NIC and disk when their `deleteOption` is `Delete`; Azure refuses
//! to delete a NIC a VM still uses. [`FakeCloud::live_instances`] lists VMs by name and their
//! NICs and disks as `nic:<name>` and `disk:<name>`, so a leak shows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::openapi::{Direction, Spec};
use super::{FakeCloud, Fault, Faults, boot};
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use switchyard_providers::Catalogue;

/// The Microsoft.Compute api-version of the checked-in description.
pub const COMPUTE_API_VERSION: &str = "2024-07-01";
/// The Microsoft.Network api-version of the checked-in description.
pub const NETWORK_API_VERSION: &str = "2024-05-01";

const COMPUTE_SPEC: &str = include_str!("../../data/apis/azure-compute-2024-07-01-excerpt.json");
const NETWORK_SPEC: &str = include_str!("../../data/apis/azure-network-2024-05-01-excerpt.json");

/// How the fake behaves.
#[derive(Clone, Debug)]
pub struct FakeOptions {
    pub tenant_id: String,
    pub client_id: String,
    /// The secret the token endpoint accepts.
    pub client_secret: String,
    pub subscription_id: String,
    pub resource_group: String,
    /// VMs per `VirtualMachines_List` page (`nextLink` for the rest).
    pub page_size: usize,
    /// Items per Retail Prices page (`NextPageLink` for the rest).
    pub price_page_size: usize,
    /// How long an asynchronous operation takes when no fault slows it.
    pub operation_delay: Duration,
    /// Extra time a VM creation takes (a slow allocation; NIC operations stay quick).
    pub vm_create_delay: Duration,
    /// `expires_in` of the tokens issued; they stop working after it.
    pub token_lifetime: Duration,
    /// Retail prices are the catalogue's times this.
    pub price_factor: f64,
    /// A created VM runs the bootstrap script from its `customData` in a [`boot`] sandbox.
    pub run_bootstrap: bool,
}

impl Default for FakeOptions {
    fn default() -> Self {
        FakeOptions {
            tenant_id: "00000000-0000-0000-0000-0000000000aa".into(),
            client_id: "00000000-0000-0000-0000-0000000000bb".into(),
            client_secret: "fake-azure-client-secret".into(),
            subscription_id: "00000000-0000-0000-0000-000000000001".into(),
            resource_group: "switchyard-test".into(),
            page_size: 2,
            price_page_size: 3,
            operation_delay: Duration::from_millis(100),
            vm_create_delay: Duration::ZERO,
            token_lifetime: Duration::from_secs(3600),
            price_factor: 1.0,
            run_bootstrap: false,
        }
    }
}

impl FakeOptions {
    /// The resource id of a subnet of this subscription (any vnet and subnet name is taken).
    pub fn subnet_id(&self, vnet: &str, subnet: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/virtualNetworks/{vnet}/subnets/{subnet}",
            self.subscription_id, self.resource_group
        )
    }
}

struct Vm {
    location: String,
    body: Value,
    vm_id: String,
    ready_at: Instant,
    /// Why the creation fails (capacity), once `ready_at` passes.
    failure: Option<(String, String)>,
    deleting_at: Option<Instant>,
    nic: String,
    nic_delete: bool,
    disk: String,
    disk_delete: bool,
    script: String,
    instance: Option<boot::Instance>,
}

struct Nic {
    location: String,
    body: Value,
    ready_at: Instant,
    deleting_at: Option<Instant>,
    vm: Option<String>,
}

struct Op {
    started: Instant,
    done_at: Instant,
    failure: Option<(String, String)>,
}

#[derive(Default)]
struct State {
    tokens: BTreeMap<String, Instant>,
    vms: BTreeMap<String, Vm>,
    nics: BTreeMap<String, Nic>,
    disks: BTreeMap<String, ()>,
    ops: BTreeMap<String, Op>,
    faults: Faults,
    invalid: Vec<String>,
    requests: u64,
    token_requests: u64,
    log: Vec<String>,
    next_id: u64,
}

struct Shared {
    options: FakeOptions,
    base: String,
    compute: Spec,
    network: Spec,
    catalogue: Catalogue,
    state: Mutex<State>,
}

/// A running fake; the server stops when it is dropped.
pub struct FakeHandle {
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for FakeHandle {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Starts a fake on 127.0.0.1 with a port of its own.
pub async fn start(options: FakeOptions) -> FakeHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the fake Azure");
    let addr = listener.local_addr().expect("local address");
    let shared = Arc::new(Shared {
        options,
        base: format!("http://{addr}"),
        compute: strict_spec(COMPUTE_SPEC),
        network: strict_spec(NETWORK_SPEC),
        catalogue: Catalogue::bundled().expect("catalogue"),
        state: Mutex::new(State::default()),
    });
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(shared.clone());
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    FakeHandle { shared, server }
}

/// The description, read as the fake reads it: every object schema closed (ARM's models list
/// every property; one the excerpt does not know is a mistake of ours, not an extension).
fn strict_spec(text: &str) -> Spec {
    fn close(schema: &mut Value) {
        let Some(o) = schema.as_object_mut() else {
            return;
        };
        if let Some(Value::Object(props)) = o.get_mut("properties") {
            props.values_mut().for_each(close);
            if !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(v) = o.get_mut(key) {
                close(v);
            }
        }
        if let Some(Value::Array(all)) = o.get_mut("allOf") {
            all.iter_mut().for_each(close);
        }
    }
    let mut doc: Value = serde_json::from_str(text).expect("the Azure excerpt parses");
    if let Some(Value::Object(defs)) = doc.get_mut("definitions") {
        defs.values_mut().for_each(close);
    }
    Spec::from_value(doc)
}

impl FakeHandle {
    /// `http://127.0.0.1:PORT`: the authority host, the ARM endpoint and the prices endpoint.
    pub fn url(&self) -> String {
        self.shared.base.clone()
    }

    pub fn options(&self) -> &FakeOptions {
        &self.shared.options
    }

    /// A provider configuration for this fake (locations `eastus` and `westeurope`, cluster
    /// `contract`, tight timeouts and retry delays), with the client secret written to
    /// `secret_file` and the agent installed as `agent` says.
    pub fn provider_config(
        &self,
        secret_file: &std::path::Path,
        agent: switchyard_providers::azure::AgentInstall,
    ) -> switchyard_providers::azure::AzureConfig {
        use switchyard_providers::azure::{
            AzureConfig, ImageConfig, LocationSettings, RetrySettings,
        };
        let o = &self.shared.options;
        std::fs::write(secret_file, format!("{}\n", o.client_secret)).expect("write the secret");
        let subnet = LocationSettings {
            subnet_id: o.subnet_id("gpu", "default"),
        };
        AzureConfig {
            tenant_id: o.tenant_id.clone(),
            client_id: o.client_id.clone(),
            client_secret_file: secret_file.to_path_buf(),
            subscription_id: o.subscription_id.clone(),
            resource_group: o.resource_group.clone(),
            locations: vec!["eastus".into(), "westeurope".into()],
            cluster: "contract".into(),
            authority_host: self.url(),
            arm_endpoint: self.url(),
            prices_endpoint: self.url(),
            image: ImageConfig {
                publisher: Some("Canonical".into()),
                offer: Some("ubuntu-24_04-lts".into()),
                sku: Some("server".into()),
                version: None,
                id: None,
            },
            per_location: [
                ("eastus".to_owned(), subnet.clone()),
                ("westeurope".to_owned(), subnet),
            ]
            .into(),
            admin_username: "switchyard".into(),
            ssh_public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFAKE test@switchyard".into(),
            vm_sizes: Vec::new(),
            os_disk_type: "StandardSSD_LRS".into(),
            boot_time_s: 60,
            node_limit: 4,
            latency_ms: 40,
            egress_per_gb_usd: 0.087,
            request_timeout_s: 1,
            operation_timeout_s: 2,
            poll_interval_ms: 50,
            retry: RetrySettings {
                max_attempts: 3,
                base_delay_ms: 10,
                max_delay_ms: 50,
            },
            agent,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// The bootstrap script a VM was given (its decoded `customData`).
    pub fn script(&self, vm: &str) -> Option<String> {
        self.state().vms.get(vm).map(|v| v.script.clone())
    }

    /// The `VirtualMachines_CreateOrUpdate` body a VM was created with.
    pub fn vm_request(&self, vm: &str) -> Option<Value> {
        self.state().vms.get(vm).map(|v| v.body.clone())
    }

    /// The `NetworkInterfaces_CreateOrUpdate` body of a NIC.
    pub fn nic_request(&self, nic: &str) -> Option<Value> {
        self.state().nics.get(nic).map(|n| n.body.clone())
    }

    /// The sandbox root of a VM that ran its bootstrap (`run_bootstrap`).
    pub fn boot_root(&self, vm: &str) -> Option<PathBuf> {
        let st = self.state();
        let v = st.vms.get(vm)?;
        v.instance.as_ref().map(|i| i.root().to_path_buf())
    }

    /// Whether the agent a VM's bootstrap started still runs.
    pub fn agent_running(&self, vm: &str) -> bool {
        let st = self.state();
        st.vms
            .get(vm)
            .and_then(|v| v.instance.as_ref())
            .is_some_and(boot::Instance::agent_running)
    }

    /// Tokens issued by the token endpoint.
    pub fn token_requests(&self) -> u64 {
        self.state().token_requests
    }

    /// `METHOD /path?query` of every request received, in order.
    pub fn request_log(&self) -> Vec<String> {
        self.state().log.clone()
    }
}

impl FakeCloud for FakeHandle {
    fn inject(&self, fault: Fault) {
        self.state().faults.inject(fault);
    }

    fn clear_faults(&self) {
        self.state().faults = Faults::default();
    }

    fn vanish(&self, provider_id: &str) {
        let mut st = self.state();
        st.settle();
        // A spot eviction with evictionPolicy Delete: the VM goes, and with it what it would
        // take on a delete.
        if let Some(vm) = st.vms.remove(provider_id) {
            st.drop_vm_resources(vm);
        }
    }

    fn live_instances(&self) -> Vec<String> {
        let mut st = self.state();
        st.settle();
        let mut live: Vec<String> = st.vms.keys().cloned().collect();
        live.extend(st.nics.keys().map(|n| format!("nic:{n}")));
        live.extend(st.disks.keys().map(|d| format!("disk:{d}")));
        live
    }

    fn invalid_requests(&self) -> Vec<String> {
        self.state().invalid.clone()
    }

    fn requests(&self) -> u64 {
        self.state().requests
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    /// Applies what time did: finished deletions remove their resources.
    fn settle(&mut self) {
        let now = Instant::now();
        let gone: Vec<String> = self
            .vms
            .iter()
            .filter(|(_, v)| v.deleting_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for name in gone {
            if let Some(vm) = self.vms.remove(&name) {
                self.drop_vm_resources(vm);
            }
        }
        self.nics
            .retain(|_, n| n.deleting_at.is_none_or(|t| t > now));
    }

    /// What goes with a deleted VM: its NIC and disk when their deleteOption says so.
    fn drop_vm_resources(&mut self, mut vm: Vm) {
        if let Some(mut i) = vm.instance.take() {
            i.power_off(Duration::from_secs(2));
        }
        if vm.nic_delete {
            self.nics.remove(&vm.nic);
        } else if let Some(n) = self.nics.get_mut(&vm.nic) {
            n.vm = None;
        }
        if vm.disk_delete {
            self.disks.remove(&vm.disk);
        }
    }

    fn new_op(&mut self, done_at: Instant, failure: Option<(String, String)>) -> String {
        self.next_id += 1;
        let id = format!("{:08x}-0000-4000-8000-{:012x}", self.next_id, self.next_id);
        self.ops.insert(
            id.clone(),
            Op {
                started: Instant::now(),
                done_at,
                failure,
            },
        );
        id
    }
}

fn arm_error(status: StatusCode, code: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": code, "message": message}})),
    )
        .into_response()
}

fn json_response(status: StatusCode, body: Value, headers: &[(&'static str, String)]) -> Response {
    let mut r = (status, axum::Json(body)).into_response();
    for (k, v) in headers {
        if let Ok(v) = HeaderValue::from_str(v) {
            r.headers_mut().insert(*k, v);
        }
    }
    r
}

fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    uri.query().map(url_decode_pairs).unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    axum::extract::State(fake): axum::extract::State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let (hang, throttled, unauthorized) = {
        let mut st = fake.lock();
        st.requests += 1;
        st.log.push(format!(
            "{method} {}",
            uri.path_and_query().map_or(path.as_str(), |p| p.as_str())
        ));
        let throttled = st.faults.throttle > 0;
        if throttled {
            st.faults.throttle -= 1;
        }
        (st.faults.hang, throttled, st.faults.unauthorized)
    };
    if let Some(d) = hang {
        tokio::time::sleep(d).await;
    }
    if throttled {
        let mut r = arm_error(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "The request is being throttled (fake fault).",
        );
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
        return r;
    }
    let o = &fake.options;
    if method == Method::POST && path == format!("/{}/oauth2/v2.0/token", o.tenant_id) {
        return token(&fake, &headers, &body, unauthorized);
    }
    if method == Method::POST && path.ends_with("/oauth2/v2.0/token") {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "invalid_request", "error_description": "AADSTS90002: Tenant not found."})),
        )
            .into_response();
    }
    if method == Method::GET && path == "/api/retail/prices" {
        return prices(&fake, &uri);
    }
    // ARM: a valid bearer token first.
    let bearer = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    if unauthorized {
        return arm_error(
            StatusCode::UNAUTHORIZED,
            "AuthenticationFailed",
            "Authentication failed (fake fault: revoked credentials).",
        );
    }
    {
        let st = fake.lock();
        match bearer.as_deref().and_then(|b| st.tokens.get(b)) {
            None => {
                return arm_error(
                    StatusCode::UNAUTHORIZED,
                    "InvalidAuthenticationToken",
                    "The access token is invalid.",
                );
            }
            Some(expiry) if *expiry <= Instant::now() => {
                return arm_error(
                    StatusCode::UNAUTHORIZED,
                    "ExpiredAuthenticationToken",
                    "The access token expiry UTC time is earlier than current UTC time.",
                );
            }
            Some(_) => {}
        }
    }
    let segments: Vec<&str> = path.split('/').collect();
    // /subscriptions/{s}/providers/Microsoft.X/locations/{l}/operations/{id}: ARM's
    // operation status resource (a convention, not in the description).
    if method == Method::GET
        && segments.len() == 9
        && segments[1] == "subscriptions"
        && segments[5] == "locations"
        && segments[7] == "operations"
    {
        return operation(&fake, segments[8]);
    }
    let query = query_pairs(&uri);
    let (spec, version) = if path.contains("/providers/Microsoft.Network/") {
        (&fake.network, NETWORK_API_VERSION)
    } else {
        (&fake.compute, COMPUTE_API_VERSION)
    };
    let json_body: Option<Value> = if body.is_empty() {
        None
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => Some(v),
            Err(e) => {
                let why = format!("{method} {path}: the body is not JSON: {e}");
                fake.lock().invalid.push(why.clone());
                return arm_error(StatusCode::BAD_REQUEST, "InvalidRequestContent", &why);
            }
        }
    };
    // `$skiptoken` is in nextLinks the fake made (ARM's convention; the description's
    // nextLink is an opaque URL).
    let names: Vec<&str> = query
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| *k != "$skiptoken")
        .collect();
    let mut problems = Vec::new();
    if !query
        .iter()
        .any(|(k, v)| k == "api-version" && v == version)
    {
        problems.push(format!("api-version must be {version}"));
    }
    let op_id = match spec.operation(method.as_str(), &path) {
        None => {
            problems.push("no such operation in the description".into());
            None
        }
        Some(op) => {
            if let Err(e) = op.check_query(names.iter().copied()) {
                problems.extend(e);
            }
            match (op.body_schema, &json_body) {
                (Some(schema), Some(b)) => {
                    if let Err(e) = spec.validate(schema, b, Direction::Request) {
                        problems.extend(e);
                    }
                }
                (Some(_), None) if op.body_required => problems.push("the body is missing".into()),
                (None, Some(_)) => problems.push("this operation takes no body".into()),
                _ => {}
            }
            op.raw
                .get("operationId")
                .and_then(Value::as_str)
                .map(|id| (id.to_owned(), op.path_params.clone()))
        }
    };
    if !problems.is_empty() {
        let why = format!("{method} {path}: {}", problems.join("; "));
        fake.lock().invalid.push(why.clone());
        return arm_error(StatusCode::BAD_REQUEST, "InvalidRequestContent", &why);
    }
    let Some((op_id, params)) = op_id else {
        return arm_error(StatusCode::BAD_REQUEST, "InvalidRequest", "no operation");
    };
    let p = |k: &str| params.get(k).cloned().unwrap_or_default();
    if p("subscriptionId") != o.subscription_id {
        return arm_error(
            StatusCode::NOT_FOUND,
            "SubscriptionNotFound",
            "The subscription could not be found.",
        );
    }
    if p("resourceGroupName") != o.resource_group {
        return arm_error(
            StatusCode::NOT_FOUND,
            "ResourceGroupNotFound",
            &format!(
                "Resource group '{}' could not be found.",
                p("resourceGroupName")
            ),
        );
    }
    let body = json_body.unwrap_or(Value::Null);
    match op_id.as_str() {
        "VirtualMachines_Get" => get_vm(&fake, &p("vmName")),
        "VirtualMachines_List" => list_vms(&fake, &query),
        "VirtualMachines_CreateOrUpdate" => put_vm(&fake, &p("vmName"), body).await,
        "VirtualMachines_Delete" => delete_vm(&fake, &p("vmName")),
        "NetworkInterfaces_CreateOrUpdate" => put_nic(&fake, &p("networkInterfaceName"), body),
        "NetworkInterfaces_Delete" => delete_nic(&fake, &p("networkInterfaceName")),
        other => arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            &format!("the fake does not serve {other}"),
        ),
    }
}

fn token(fake: &Shared, headers: &HeaderMap, body: &Bytes, unauthorized: bool) -> Response {
    let o = &fake.options;
    let oauth = |status: StatusCode, error: &str, description: &str| {
        (
            status,
            axum::Json(json!({"error": error, "error_description": description})),
        )
            .into_response()
    };
    let form_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form_type {
        return oauth(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "AADSTS900144: The request body must be form-encoded.",
        );
    }
    let form: BTreeMap<String, String> = url_decode_pairs(&String::from_utf8_lossy(body))
        .into_iter()
        .collect();
    let field = |k: &str| form.get(k).map(String::as_str).unwrap_or("");
    if field("grant_type") != "client_credentials" {
        return oauth(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "AADSTS70003: The app requested an unsupported grant type.",
        );
    }
    if unauthorized
        || field("client_id") != o.client_id
        || field("client_secret") != o.client_secret
    {
        return oauth(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "AADSTS7000215: Invalid client secret provided.",
        );
    }
    if field("scope") != format!("{}/.default", fake.base) {
        return oauth(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            "AADSTS70011: The provided value for the input parameter 'scope' is not valid.",
        );
    }
    let mut st = fake.lock();
    st.token_requests += 1;
    st.next_id += 1;
    let value = format!("fake-arm-token-{}-{}", st.next_id, uuid_like(st.next_id));
    st.tokens
        .insert(value.clone(), Instant::now() + o.token_lifetime);
    let secs = o.token_lifetime.as_secs();
    (
        StatusCode::OK,
        axum::Json(json!({
            "token_type": "Bearer",
            "expires_in": secs,
            "ext_expires_in": secs,
            "access_token": value,
        })),
    )
        .into_response()
}

fn uuid_like(n: u64) -> String {
    format!("{:016x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

fn operation(fake: &Shared, id: &str) -> Response {
    let st = fake.lock();
    let Some(op) = st.ops.get(id) else {
        return arm_error(StatusCode::NOT_FOUND, "NotFound", "No such operation.");
    };
    let age = op.started.elapsed().as_millis();
    let mut body = json!({
        "name": id,
        "startTime": format!("2026-01-01T00:00:00.{age:03}Z"),
    });
    if Instant::now() < op.done_at {
        body["status"] = json!("InProgress");
    } else if let Some((code, message)) = &op.failure {
        body["status"] = json!("Failed");
        body["error"] = json!({"code": code, "message": message});
    } else {
        body["status"] = json!("Succeeded");
    }
    json_response(StatusCode::OK, body, &[])
}

fn vm_id_path(o: &FakeOptions, name: &str) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
        o.subscription_id, o.resource_group
    )
}

fn nic_id_path(o: &FakeOptions, name: &str) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Network/networkInterfaces/{name}",
        o.subscription_id, o.resource_group
    )
}

/// A VM as ARM answers it: the request's model plus the read-only fields.
fn vm_view(o: &FakeOptions, name: &str, vm: &Vm) -> Value {
    let now = Instant::now();
    let state = if vm.deleting_at.is_some() {
        "Deleting"
    } else if now < vm.ready_at {
        "Creating"
    } else if vm.failure.is_some() {
        "Failed"
    } else {
        "Succeeded"
    };
    let mut v = vm.body.clone();
    v["id"] = json!(vm_id_path(o, name));
    v["name"] = json!(name);
    v["type"] = json!("Microsoft.Compute/virtualMachines");
    v["location"] = json!(vm.location);
    if let Some(p) = v.get_mut("properties").and_then(Value::as_object_mut) {
        p.insert("provisioningState".into(), json!(state));
        p.insert("vmId".into(), json!(vm.vm_id));
        // ARM never returns customData.
        if let Some(os) = p.get_mut("osProfile").and_then(Value::as_object_mut) {
            os.remove("customData");
        }
    }
    v
}

fn get_vm(fake: &Shared, name: &str) -> Response {
    let mut st = fake.lock();
    st.settle();
    match st.vms.get(name) {
        Some(vm) => json_response(StatusCode::OK, vm_view(&fake.options, name, vm), &[]),
        None => not_found(&fake.options, "Microsoft.Compute/virtualMachines", name),
    }
}

fn not_found(o: &FakeOptions, kind: &str, name: &str) -> Response {
    arm_error(
        StatusCode::NOT_FOUND,
        "ResourceNotFound",
        &format!(
            "The Resource '{kind}/{name}' under resource group '{}' was not found.",
            o.resource_group
        ),
    )
}

fn list_vms(fake: &Shared, query: &[(String, String)]) -> Response {
    let mut st = fake.lock();
    st.settle();
    let skip: usize = query
        .iter()
        .find(|(k, _)| k == "$skiptoken")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let size = fake.options.page_size.max(1);
    let all: Vec<Value> = st
        .vms
        .iter()
        .map(|(n, v)| vm_view(&fake.options, n, v))
        .collect();
    let page: Vec<Value> = all.iter().skip(skip).take(size).cloned().collect();
    let mut body = json!({ "value": page });
    if skip + size < all.len() {
        body["nextLink"] = json!(format!(
            "{}/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API_VERSION}&$skiptoken={}",
            fake.base,
            fake.options.subscription_id,
            fake.options.resource_group,
            skip + size
        ));
    }
    json_response(StatusCode::OK, body, &[])
}

fn async_headers(
    fake: &Shared,
    namespace: &str,
    location: &str,
    op: &str,
) -> Vec<(&'static str, String)> {
    let url = format!(
        "{}/subscriptions/{}/providers/{namespace}/locations/{location}/operations/{op}?api-version={}",
        fake.base,
        fake.options.subscription_id,
        if namespace == "Microsoft.Network" {
            NETWORK_API_VERSION
        } else {
            COMPUTE_API_VERSION
        }
    );
    vec![("azure-asyncoperation", url), ("retry-after", "0".into())]
}

async fn put_vm(fake: &Arc<Shared>, name: &str, body: Value) -> Response {
    let o = &fake.options;
    let location = body["location"].as_str().unwrap_or("").to_owned();
    let props = &body["properties"];
    let size = props
        .pointer("/hardwareProfile/vmSize")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let Some(entry) = fake.catalogue.find("azure", &location, &size).cloned() else {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidParameter",
            &format!("The value {size} provided for the VM size is not valid in {location}."),
        );
    };
    let custom = props
        .pointer("/osProfile/customData")
        .and_then(Value::as_str)
        .unwrap_or("");
    let script = match base64_decode(custom) {
        Some(b) if b.len() <= 65_535 => String::from_utf8_lossy(&b).into_owned(),
        _ => {
            return arm_error(
                StatusCode::BAD_REQUEST,
                "InvalidParameter",
                "customData must be base-64 of at most 65535 bytes.",
            );
        }
    };
    let nic_ref = props
        .pointer("/networkProfile/networkInterfaces/0")
        .cloned()
        .unwrap_or(Value::Null);
    let nic_id = nic_ref["id"].as_str().unwrap_or("").to_owned();
    let nic_name = nic_id.rsplit('/').next().unwrap_or("").to_owned();
    let disk = props
        .pointer("/storageProfile/osDisk/name")
        .and_then(Value::as_str)
        .map_or_else(|| format!("{name}_OsDisk_1"), str::to_owned);
    let (slow, lose) = {
        let mut st = fake.lock();
        st.settle();
        if let Some(vm) = st.vms.get(name) {
            if vm.deleting_at.is_some() {
                return arm_error(
                    StatusCode::CONFLICT,
                    "AnotherOperationInProgress",
                    "The VM is being deleted.",
                );
            }
            // Create-or-update of the same VM: the operation ends with the creation.
            let (ready, failure) = (vm.ready_at, vm.failure.clone());
            let view = vm_view(o, name, vm);
            let op = st.new_op(ready, failure);
            let lose = std::mem::take(&mut st.faults.lose_next_launch);
            drop(st);
            if lose {
                lose_answer();
            }
            return json_response(
                StatusCode::OK,
                view,
                &async_headers(fake, "Microsoft.Compute", &location, &op),
            );
        }
        if nic_id != nic_id_path(o, &nic_name) {
            return arm_error(
                StatusCode::BAD_REQUEST,
                "InvalidResourceReference",
                &format!("Resource {nic_id} referenced by the VM is not in this resource group."),
            );
        }
        match st.nics.get(&nic_name) {
            None => {
                return arm_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidResourceReference",
                    &format!("Resource {nic_id} referenced by resource {name} was not found."),
                );
            }
            Some(n) if n.deleting_at.is_some() || n.location != location => {
                return arm_error(
                    StatusCode::BAD_REQUEST,
                    "InvalidResourceReference",
                    &format!(
                        "Network interface {nic_name} is being deleted or in another location."
                    ),
                );
            }
            Some(n) if n.vm.as_deref().is_some_and(|v| v != name) => {
                return arm_error(
                    StatusCode::BAD_REQUEST,
                    "NicInUse",
                    &format!("Network interface {nic_name} is used by another VM."),
                );
            }
            Some(_) => {}
        }
        if st.faults.quota {
            return arm_error(
                StatusCode::CONFLICT,
                "QuotaExceeded",
                &format!(
                    "Operation could not be completed as it results in exceeding approved {size} Family Cores quota (fake fault)."
                ),
            );
        }
        let slow = st.faults.slow;
        let lose = std::mem::take(&mut st.faults.lose_next_launch);
        (slow, lose)
    };
    let failure = fake.lock().faults.capacity.then(|| {
        (
            "AllocationFailed".to_owned(),
            "Allocation failed. We do not have sufficient capacity for the requested VM size in this region (fake fault).".to_owned(),
        )
    });
    let instance = if o.run_bootstrap && failure.is_none() {
        let gpus = format!("{}x{}", entry.gpu_count, entry.gpu_model);
        let s = script.clone();
        match tokio::task::spawn_blocking(move || boot::Instance::boot(&s, Some(&gpus))).await {
            Ok(Ok(i)) => Some(i),
            Ok(Err(e)) => {
                fake.lock()
                    .invalid
                    .push(format!("VM {name}: the bootstrap script failed: {e}"));
                None
            }
            Err(e) => panic!("boot task: {e}"),
        }
    } else {
        None
    };
    let now = Instant::now();
    let ready_at = now + o.operation_delay + o.vm_create_delay + slow.unwrap_or_default();
    let mut st = fake.lock();
    let nic_delete = nic_ref
        .pointer("/properties/deleteOption")
        .and_then(Value::as_str)
        == Some("Delete");
    let disk_delete = props
        .pointer("/storageProfile/osDisk/deleteOption")
        .and_then(Value::as_str)
        == Some("Delete");
    if let Some(n) = st.nics.get_mut(&nic_name) {
        n.vm = Some(name.to_owned());
    }
    st.disks.insert(disk.clone(), ());
    st.next_id += 1;
    let vm = Vm {
        location: location.clone(),
        body,
        vm_id: uuid_like(st.next_id),
        ready_at,
        failure: failure.clone(),
        deleting_at: None,
        nic: nic_name,
        nic_delete,
        disk,
        disk_delete,
        script,
        instance,
    };
    let view = vm_view(o, name, &vm);
    st.vms.insert(name.to_owned(), vm);
    let op = st.new_op(ready_at, failure);
    drop(st);
    if lose {
        lose_answer();
    }
    json_response(
        StatusCode::CREATED,
        view,
        &async_headers(fake, "Microsoft.Compute", &location, &op),
    )
}

/// Drops the connection without an answer: the handler's task unwinds (no panic message),
/// and hyper closes the connection.
fn lose_answer() -> ! {
    std::panic::resume_unwind(Box::new("fake Azure: the launch answer is lost"))
}

fn delete_vm(fake: &Shared, name: &str) -> Response {
    let mut st = fake.lock();
    st.settle();
    let slow = st.faults.slow.unwrap_or_default();
    let done = Instant::now() + fake.options.operation_delay + slow;
    let Some(vm) = st.vms.get_mut(name) else {
        return StatusCode::NO_CONTENT.into_response();
    };
    let location = vm.location.clone();
    if vm.deleting_at.is_none() {
        vm.deleting_at = Some(done);
        if let Some(mut i) = vm.instance.take() {
            i.power_off(Duration::from_secs(2));
        }
    }
    let done = vm.deleting_at.unwrap_or(done);
    let op = st.new_op(done, None);
    drop(st);
    let mut headers = async_headers(fake, "Microsoft.Compute", &location, &op);
    headers.push(("location", headers[0].1.clone()));
    json_response(StatusCode::ACCEPTED, Value::Null, &headers)
}

fn put_nic(fake: &Shared, name: &str, body: Value) -> Response {
    let o = &fake.options;
    let location = body["location"].as_str().unwrap_or("").to_owned();
    let subnet = body
        .pointer("/properties/ipConfigurations/0/properties/subnet/id")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !subnet.starts_with("/subscriptions/") || !subnet.contains("/subnets/") {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "InvalidResourceReference",
            &format!("Subnet {subnet:?} is not a subnet resource id."),
        );
    }
    let mut st = fake.lock();
    st.settle();
    let slow = st.faults.slow.unwrap_or_default();
    let ready_at = Instant::now() + o.operation_delay + slow;
    let status = if let Some(n) = st.nics.get_mut(name) {
        if n.deleting_at.is_some() {
            return arm_error(
                StatusCode::CONFLICT,
                "AnotherOperationInProgress",
                "The network interface is being deleted.",
            );
        }
        n.body = body.clone();
        StatusCode::OK
    } else {
        st.nics.insert(
            name.to_owned(),
            Nic {
                location: location.clone(),
                body: body.clone(),
                ready_at,
                deleting_at: None,
                vm: None,
            },
        );
        StatusCode::CREATED
    };
    let ready = st.nics.get(name).map_or(ready_at, |n| n.ready_at);
    let op = st.new_op(ready, None);
    drop(st);
    let mut view = body;
    view["id"] = json!(nic_id_path(o, name));
    view["name"] = json!(name);
    view["type"] = json!("Microsoft.Network/networkInterfaces");
    view["properties"]["provisioningState"] = json!("Updating");
    json_response(
        status,
        view,
        &async_headers(fake, "Microsoft.Network", &location, &op),
    )
}

fn delete_nic(fake: &Shared, name: &str) -> Response {
    let mut st = fake.lock();
    st.settle();
    let slow = st.faults.slow.unwrap_or_default();
    let done = Instant::now() + fake.options.operation_delay + slow;
    let Some(n) = st.nics.get_mut(name) else {
        return StatusCode::NO_CONTENT.into_response();
    };
    if let Some(vm) = &n.vm {
        return arm_error(
            StatusCode::BAD_REQUEST,
            "NicInUse",
            &format!("Network Interface {name} is used by existing resource {vm}."),
        );
    }
    let location = n.location.clone();
    let done = *n.deleting_at.get_or_insert(done);
    let op = st.new_op(done, None);
    drop(st);
    json_response(
        StatusCode::ACCEPTED,
        Value::Null,
        &async_headers(fake, "Microsoft.Network", &location, &op),
    )
}

/// `GET /api/retail/prices?$filter=…`: the catalogue's Azure entries named by the filter's
/// `armRegionName eq '…'` and `armSkuName eq '…'` terms, as Linux and Windows pay-as-you-go
/// and Spot meters, `NextPageLink`-paginated with `$skip`.
fn prices(fake: &Shared, uri: &Uri) -> Response {
    let query = query_pairs(uri);
    let get = |k: &str| query.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let Some(filter) = get("$filter") else {
        fake.lock()
            .invalid
            .push("GET /api/retail/prices without $filter".into());
        return (StatusCode::BAD_REQUEST, "missing $filter").into_response();
    };
    let terms = |field: &str| -> Vec<String> {
        let pat = format!("{field} eq '");
        filter
            .match_indices(&pat)
            .filter_map(|(i, _)| {
                let rest = &filter[i + pat.len()..];
                rest.find('\'').map(|end| rest[..end].to_owned())
            })
            .collect()
    };
    let regions = terms("armRegionName");
    let skus = terms("armSkuName");
    let mut items = Vec::new();
    for e in fake.catalogue.entries().iter().filter(|e| {
        e.provider == "azure" && regions.contains(&e.region) && skus.contains(&e.instance_type)
    }) {
        let short = e
            .instance_type
            .trim_start_matches("Standard_")
            .replace('_', " ");
        let od = e.on_demand_per_hour.as_dollars() * fake.options.price_factor;
        let mut meters = vec![
            (short.clone(), "Virtual Machines Series", od),
            (short.clone(), "Virtual Machines Series Windows", od * 1.5),
        ];
        if let Some(s) = e.spot_per_hour {
            let s = s.as_dollars() * fake.options.price_factor;
            meters.push((format!("{short} Spot"), "Virtual Machines Series", s));
            meters.push((
                format!("{short} Low Priority"),
                "Virtual Machines Series",
                s / 2.0,
            ));
        }
        for (sku, product, price) in meters {
            items.push(json!({
                "currencyCode": "USD", "tierMinimumUnits": 0.0,
                "retailPrice": price, "unitPrice": price,
                "armRegionName": e.region, "location": e.region,
                "effectiveStartDate": "2026-01-01T00:00:00Z",
                "meterName": sku, "productName": product, "skuName": sku,
                "serviceName": "Virtual Machines", "serviceFamily": "Compute",
                "unitOfMeasure": "1 Hour", "type": "Consumption",
                "isPrimaryMeterRegion": true, "armSkuName": e.instance_type,
            }));
        }
    }
    let skip: usize = get("$skip").and_then(|s| s.parse().ok()).unwrap_or(0);
    let size = fake.options.price_page_size.max(1);
    let page: Vec<Value> = items.iter().skip(skip).take(size).cloned().collect();
    let next = (skip + size < items.len()).then(|| {
        let mut url =
            reqwest::Url::parse(&format!("{}/api/retail/prices", fake.base)).expect("url");
        url.query_pairs_mut()
            .append_pair("api-version", &get("api-version").unwrap_or_default())
            .append_pair("$filter", &filter)
            .append_pair("$skip", &(skip + size).to_string());
        url.to_string()
    });
    json_response(
        StatusCode::OK,
        json!({
            "BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail",
            "Items": page, "NextPageLink": next, "Count": page.len(),
        }),
        &[],
    )
}

/// Standard base64 (RFC 4648, with padding), as ARM reads `customData`.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (n, chunk) in bytes.chunks(4).enumerate() {
        let last = n + 1 == bytes.len() / 4;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut acc = 0u32;
        for &c in &chunk[..4 - pad] {
            acc = (acc << 6) | value(c)?;
        }
        acc <<= 6 * pad as u32;
        let three = [(acc >> 16) as u8, (acc >> 8) as u8, acc as u8];
        out.extend_from_slice(&three[..3 - pad]);
    }
    Some(out)
}
