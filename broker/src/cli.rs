//! The `switchyard` client commands, one or more for each operation of the REST API: submit,
//! jobs, job, explain, logs, cancel, pools, pool set, regions, nodes, node, instances, budgets,
//! audit, tokens, enrolment and agent tokens, policies (get, set, list, what-if), spend, and
//! services (deploy, list, get, events, delete). They talk
//! to a broker over REST with a bearer token from `--token`, `SWITCHYARD_TOKEN`, or the
//! `admin.token` file that `switchyard up` writes.
//!
//! Each prints for people by default (aligned tables, money as [`money`], times with how long
//! ago they were) and, with `--json`, what the broker answered, as JSON (`logs`: one entry a
//! line). `logs --follow` exits with the job's exit code ([`exit_code_of`]).
//!
//! What they print comes from other people (job names, teams, output): every field is passed
//! through [`printable`], which escapes control characters and bidirectional overrides, so a
//! name cannot move the cursor, ring the bell or reverse the line in the reader's terminal
//! (`logs` is the exception: it is the job's own output, byte for byte). Output goes through
//! [`out!`], which returns an error instead of panicking when stdout is a closed pipe
//! (`switchyard jobs | head -1`); `main` ends quietly on that error ([`is_broken_pipe`]).

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use switchyard_protocol::api::{
    AgentTokenList, AgentTokenRevoked, AuditList, BudgetList, CreateEnrolmentToken, CreateToken,
    EnrolmentTokenCreated, ErrorBody, InstanceList, JobList, JobSpec, JobState, JobView, LogPage,
    LogStream, NodeDetail, NodeList, NodeState, PolicyBody, PolicyList, PolicyView, PoolList,
    PoolPatch, PoolView, QueueDelay, RegionList, ReplicaState, Role, ServiceEventList, ServiceList,
    ServiceSpec, ServiceState, ServiceView, TokenCreated, TokenList, TokenView,
};

/// `println!` that returns the write error (a closed pipe) instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}

/// A line for the reader on stderr (what a command is waiting for); a closed stderr is no
/// reason to stop.
fn note(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "[switchyard] {line}");
}

/// Whether `e` is a write to a closed pipe: the reader went away (`| head`), which is no
/// failure of the command.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `s` with every control character (C0, DEL, C1) and every bidirectional formatting
/// character (U+061C, U+200E–U+200F, U+202A–U+202E, U+2066–U+2069) written as `\u{…}`
/// (`\t`, `\n` and `\r` as such), so that text from the broker prints as what it is.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// With `--json`, prints `value` for machines and says so (`true`); the caller prints its
/// table otherwise.
fn printed_as_json<T: serde::Serialize>(json: bool, value: &T) -> anyhow::Result<bool> {
    if json {
        out!("{}", json_text(value)?);
    }
    Ok(json)
}

/// A character that must not reach a terminal as it is: a control character (C0, DEL, C1) or
/// a bidirectional formatting character.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}'
            | '\u{2066}'..='\u{2069}')
}

/// Pretty JSON for the terminal: JSON already escapes C0 controls; the rest (DEL, C1 and the
/// bidirectional overrides) are written as `\uXXXX` escapes, which read back as the same JSON.
fn json_text<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(terminal_safe_json(&serde_json::to_string_pretty(value)?))
}

/// [`json_text`] on one line (`logs --json`: one entry a line).
fn json_line<T: serde::Serialize>(value: &T) -> anyhow::Result<String> {
    Ok(terminal_safe_json(&serde_json::to_string(value)?))
}

fn terminal_safe_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        // Outside strings only JSON's own whitespace can occur, and inside them serde_json
        // escaped the C0 controls already.
        if needs_escape(c) && !matches!(c, '\n' | ' ') {
            out.push_str(&format!("\\u{:04x}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// `s` as one percent-encoded path segment (an id typed as `../tokens` stays one segment).
fn seg(s: &str) -> String {
    let dots = matches!(s, "." | "..");
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'~') || (b == b'.' && !dots) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
    /// `--json`: the commands print the broker's JSON instead of text for people.
    json: bool,
}

/// Finds the token: the flag or variable first, then `{data_dir}/admin.token`.
pub fn resolve_token(explicit: Option<String>, data_dir: &Path) -> anyhow::Result<String> {
    if let Some(t) = explicit.filter(|t| !t.trim().is_empty()) {
        return Ok(t.trim().to_string());
    }
    let path: PathBuf = data_dir.join("admin.token");
    std::fs::read_to_string(&path)
        .map(|t| t.trim().to_string())
        .with_context(|| {
            format!(
                "no token: pass --token, set SWITCHYARD_TOKEN, or run `switchyard up` here (it writes {})",
                path.display()
            )
        })
}

impl Client {
    pub fn new(url: &str, token: String) -> anyhow::Result<Client> {
        Client::with_ca(url, token, None)
    }

    /// A client that verifies an https broker against the CA certificates of the PEM file
    /// `ca_cert` only (`--ca-cert`, for a broker with a private CA), or the system's roots
    /// without one. Verification of the chain and of the host name is always on.
    pub fn with_ca(url: &str, token: String, ca_cert: Option<&Path>) -> anyhow::Result<Client> {
        let mut builder = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .pool_idle_timeout(switchyard_support::http::POOL_IDLE_TIMEOUT);
        if let Some(path) = ca_cert {
            builder = builder.tls_certs_only(
                switchyard_support::http::read_ca(path).map_err(anyhow::Error::msg)?,
            );
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(Client {
            http,
            base: url.trim_end_matches('/').to_string(),
            token,
            json: false,
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<T> {
        self.call_with(method, path, body, None).await
    }

    /// One request; with an idempotency key, also its retries: connection errors and 502,
    /// 503 and 504 are tried again (up to [`SUBMIT_TRIES`] times, backing off) with the same
    /// key, so that the broker creates the job once however many answers were lost.
    async fn call_with<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        idempotency_key: Option<&str>,
    ) -> anyhow::Result<T> {
        let url = format!("{}/api/v1{path}", self.base);
        let tries = if idempotency_key.is_some() {
            SUBMIT_TRIES
        } else {
            1
        };
        let mut delay = Duration::from_millis(250);
        let mut attempt = 1;
        let res = loop {
            let mut req = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token);
            if let Some(key) = idempotency_key {
                req = req.header("Idempotency-Key", key);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let retry_reason = match req.send().await {
                Ok(res) if !retryable(res.status()) || attempt >= tries => break res,
                Ok(res) => format!("{} {}", res.status().as_u16(), reason(res.status())),
                Err(e)
                    if attempt >= tries
                        || !(e.is_connect() || e.is_timeout() || e.is_request()) =>
                {
                    return Err(anyhow::Error::new(e))
                        .with_context(|| format!("cannot reach the broker at {}", self.base));
                }
                Err(e) => e.to_string(),
            };
            eprintln!(
                "switchyard: {retry_reason}; retrying in {} ms with the same idempotency key",
                delay.as_millis()
            );
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(4));
            attempt += 1;
        };
        let status = res.status();
        let bytes = res.bytes().await.context("reading the response")?;
        if !status.is_success() {
            let detail = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| format!("{} ({})", e.error.message, e.error.code))
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            bail!(
                "{} {}: {}",
                status.as_u16(),
                reason(status),
                printable(&detail)
            );
        }
        serde_json::from_slice(&bytes).with_context(|| format!("unexpected response from {url}"))
    }
}

/// How many times `submit` sends one job (the first try and its retries).
const SUBMIT_TRIES: u32 = 6;

/// Statuses that say the broker (or a proxy before it) could not answer now: worth a retry.
fn retryable(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

fn reason(s: StatusCode) -> &'static str {
    s.canonical_reason().unwrap_or("error")
}

impl Client {
    /// This client with its commands printing JSON (`--json`) or text for people.
    pub fn with_json(mut self, json: bool) -> Client {
        self.json = json;
        self
    }

    /// The broker's URL, as the client calls it.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `GET /api/v1{path}`, read as `T`.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        self.call(Method::GET, path, None).await
    }

    /// One request whose answer is printed as it came with `--json` (fields this client does
    /// not know included), and otherwise read as `T` for the caller to print (`Some`).
    async fn fetch<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Option<T>> {
        let value: Value = self.call(method, path, body).await?;
        if printed_as_json(self.json, &value)? {
            return Ok(None);
        }
        serde_json::from_value(value)
            .map(Some)
            .with_context(|| format!("unexpected response from {}/api/v1{path}", self.base))
    }
}

/// Reads a `.toml` or `.json` document as JSON.
fn read_doc(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(match path.extension().and_then(|e| e.to_str()) {
        Some("toml") => {
            let v: toml::Value =
                toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
            serde_json::to_value(v)?
        }
        _ => serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
    })
}

/// Reads a job spec from a `.toml` or `.json` file.
pub fn read_spec(path: &Path) -> anyhow::Result<Value> {
    let value = read_doc(path)?;
    // Check the shape here too, so typos are reported before anything is sent.
    let _: JobSpec = serde_json::from_value(value.clone())
        .with_context(|| format!("{} is not a valid job spec", path.display()))?;
    Ok(value)
}

/// An aligned table: each column as wide as its widest cell, two spaces between columns.
/// Columns whose name starts with `>` are right-aligned (numbers, money); the `>` is not shown.
struct Table {
    head: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[&str]) -> Table {
        Table {
            head: columns
                .iter()
                .map(|c| c.trim_start_matches('>').to_string())
                .collect(),
            right: columns.iter().map(|c| c.starts_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    /// One row; its cells are shown as they are (pass them through [`printable`] first).
    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn print(&self) -> anyhow::Result<()> {
        use std::io::Write as _;
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = self.head.iter().map(|h| width(h)).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(widths.len()) {
                widths[i] = widths[i].max(width(cell));
            }
        }
        let mut stdout = std::io::stdout().lock();
        for row in std::iter::once(&self.head).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(widths.len()) {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = " ".repeat(widths[i] - width(cell));
                if self.right[i] {
                    line.push_str(&pad);
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&pad);
                }
            }
            writeln!(stdout, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// A list's query string: `limit`, then each filter that is set.
fn filter_query<const N: usize>(limit: u32, filters: [(&str, Option<String>); N]) -> String {
    let mut pairs = vec![("limit", limit.to_string())];
    pairs.extend(filters.into_iter().filter_map(|(k, v)| Some((k, v?))));
    encode_query(&pairs)
}

/// `k=v&…` with each value percent-encoded (a job name may hold spaces or `&`).
fn encode_query(pairs: &[(&str, String)]) -> String {
    let mut url = reqwest::Url::parse("http://query.invalid/").expect("a constant URL");
    url.query_pairs_mut().extend_pairs(pairs);
    url.query().unwrap_or_default().to_string()
}

/// USD as money, in the one format of the console, the CLI and the broker's reasons
/// ([`switchyard_core::Money::usd_text`]): cents, and a fraction of a cent under a dollar where
/// it matters (`$0.0145`, `$5.03`, `-$1,204.50`); `-` for what is no amount.
pub fn money(usd: f64) -> String {
    switchyard_core::Money::from_dollars(usd)
        .map(switchyard_core::Money::usd_text)
        .unwrap_or_else(|| "-".into())
}

/// A length of time for people: `0s`, `0.4s`, `45s`, `3m 05s`, `2h 03m`, `3d 04h`.
pub fn span(secs: f64) -> String {
    if !secs.is_finite() {
        return "-".into();
    }
    let secs = secs.max(0.0);
    if secs < 10.0 {
        let text = format!("{secs:.1}");
        return format!("{}s", text.trim_end_matches(".0"));
    }
    // Saturates for absurd spans; rounded to the second shown.
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3_600 => format!("{}m {:02}s", s / 60, s % 60),
        3_600..86_400 => format!("{}h {:02}m", s / 3_600, s % 3_600 / 60),
        _ => format!("{}d {:02}h", s / 86_400, s % 86_400 / 3_600),
    }
}

/// How long ago `t` was (or how far off it is): `just now`, `42 s ago`, `3 min ago`, `5 h ago`,
/// `2 days ago`, `in 4 min`.
pub fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let d = (now - t).num_seconds();
    let n = d.unsigned_abs();
    let amount = match n {
        0..5 => return "just now".into(),
        5..60 => format!("{n} s"),
        60..3_600 => format!("{} min", n / 60),
        3_600..86_400 => format!("{} h", n / 3_600),
        86_400..172_800 => "1 day".into(),
        _ => format!("{} days", n / 86_400),
    };
    if d >= 0 {
        format!("{amount} ago")
    } else {
        format!("in {amount}")
    }
}

/// A time for people: `2025-12-05 08:26:01 UTC (3 min ago)`.
fn when(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    format!("{} ({})", t.format("%Y-%m-%d %H:%M:%S UTC"), ago(t, now))
}

/// Seconds from `a` to `b`.
fn secs_between(a: DateTime<Utc>, b: DateTime<Utc>) -> f64 {
    (b - a).num_milliseconds() as f64 / 1000.0
}

/// A time in the broker's JSON: RFC 3339 text, or milliseconds since the epoch.
fn time_of(v: &Value) -> Option<DateTime<Utc>> {
    match v {
        Value::String(s) => DateTime::parse_from_rfc3339(s)
            .ok()
            .map(|t| t.with_timezone(&Utc)),
        Value::Number(n) => DateTime::from_timestamp_millis(n.as_i64()?),
        _ => None,
    }
}

fn state_name(j: &JobView) -> String {
    enum_name(&j.state)
}

/// The wire name of a serde enum value (`on_demand`, `running`).
fn enum_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn finished(state: JobState) -> bool {
    matches!(
        state,
        JobState::Succeeded | JobState::Failed | JobState::Cancelled
    )
}

/// The state as people should read it: a live job whose cancel is pending says so.
fn shown_state(j: &JobView) -> String {
    if j.cancel_requested && !finished(j.state) {
        "cancel requested".into()
    } else {
        state_name(j)
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// An argv as a shell would take it back: words with spaces or quotes in single quotes.
fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.chars()
                    .all(|c| c.is_alphanumeric() || "-_./=:,@%+".contains(c));
            if plain {
                printable(a).into_owned()
            } else {
                format!("'{}'", printable(&a.replace('\'', "'\\''")))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// What a job asks for: `8 GPUs (H100 or A100-80GB) on each of 2 nodes`, `4 GPUs (google
/// accelerators)`.
fn resources_text(r: &switchyard_protocol::api::ResourceSpec) -> String {
    let mut text = format!("{} GPU{}", r.gpus, if r.gpus == 1 { "" } else { "s" });
    if !r.gpu_models.is_empty() {
        let models: Vec<String> = r
            .gpu_models
            .iter()
            .map(|m| printable(m).into_owned())
            .collect();
        text.push_str(&format!(" ({})", models.join(" or ")));
    } else if let Some(a) = &r.accelerator {
        text.push_str(&format!(" ({} accelerators)", printable(a)));
    }
    if let Some(n) = r.nodes.filter(|n| *n > 1) {
        text.push_str(&format!(" on each of {n} nodes"));
    }
    text
}

/// Not running and not ended: any placement it shows is a past attempt's.
fn back_in_queue(j: &JobView) -> bool {
    matches!(
        j.state,
        JobState::Queued | JobState::Held | JobState::Provisioning
    )
}

/// The `WHERE / WHY` column of `switchyard jobs`: where it runs (or ran), else why it waits. A
/// job back in the queue keeps its last placement; what it waits for is the news.
fn where_or_why(j: &JobView) -> String {
    let reason = || j.reason.as_deref().map(|r| truncate(&printable(r), 60));
    if back_in_queue(j) {
        reason()
    } else {
        placement_text(j).or_else(reason)
    }
    .unwrap_or_default()
}

/// Where a job runs: `pool, node N, GPUs 0,1 (spot)`.
fn placement_text(j: &JobView) -> Option<String> {
    j.placement.as_ref().map(|p| {
        let gpus: Vec<String> = p.gpus.iter().map(u32::to_string).collect();
        format!(
            "{}, node {}, GPUs {} ({})",
            printable(&p.pool),
            printable(&p.node),
            gpus.join(","),
            printable(&p.market)
        )
    })
}

/// A placement outcome (`{"decision": "wait", …}`) in words.
fn outcome_words(o: &Value, now: DateTime<Utc>) -> String {
    let text = |k: &str| printable(o[k].as_str().unwrap_or("?")).into_owned();
    match o["decision"].as_str() {
        Some("assigned") => format!("assigned to node {} in {}", text("node"), text("pool")),
        Some("wait") => match time_of(&o["expected_start"]) {
            Some(t) => format!(
                "waiting for capacity in {} that is cheaper than launching and still meets \
                 the deadline; expected to start {}",
                text("pool"),
                when(t, now)
            ),
            None => format!("waiting for capacity in {}", text("pool")),
        },
        Some("launch") => format!(
            "launching a {} node in {} for it",
            text("market").replace('_', "-"),
            text("pool")
        ),
        Some("hold") => format!("held: {}", text("reason")),
        Some(other) => printable(other).into_owned(),
        None => printable(&o.to_string()).into_owned(),
    }
}

/// What of an outcome matters for saying it again: not the times, which move every round,
/// nor the amounts in a reason (`needs $1.15, $0.01 left`), which move with prices.
fn outcome_key(o: &Value) -> String {
    ["decision", "pool", "node", "market", "reason"]
        .iter()
        .map(|k| {
            o[*k]
                .as_str()
                .unwrap_or_default()
                .chars()
                .filter(|c| !c.is_ascii_digit())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The outcome of a job's placement (`{"decision": …}`), when it has been planned.
async fn placement_outcome(c: &Client, id: &str) -> Option<Value> {
    c.get::<Value>(&format!("/jobs/{}/placement", seg(id)))
        .await
        .ok()
        .map(|p| p["outcome"].clone())
        .filter(Value::is_object)
}

/// `switchyard submit FILE`: prints the new job's id (with `--json`, the job).
pub async fn submit(c: &Client, file: &Path) -> anyhow::Result<()> {
    let spec = read_spec(file)?;
    // A fresh key per submit; its retries reuse it, so a lost answer never makes a second job.
    let key = uuid::Uuid::now_v7().to_string();
    let job: Value = c
        .call_with(Method::POST, "/jobs", Some(&spec), Some(&key))
        .await?;
    if printed_as_json(c.json, &job)? {
        return Ok(());
    }
    let job: JobView = serde_json::from_value(job).context("unexpected response to a submit")?;
    out!("{}", job.id);
    Ok(())
}

/// The filters of `switchyard jobs`.
pub struct JobFilters {
    pub state: Option<String>,
    pub team: Option<String>,
    pub priority: Option<String>,
    pub name: Option<String>,
    pub limit: u32,
}

/// `switchyard jobs`: newest first, one line each.
pub async fn jobs(c: &Client, filters: JobFilters) -> anyhow::Result<()> {
    let query = filter_query(
        filters.limit,
        [
            ("state", filters.state),
            ("team", filters.team),
            ("priority", filters.priority),
            ("name", filters.name),
        ],
    );
    let path = format!("/jobs?{query}");
    let Some(list) = c.fetch::<JobList>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&[
        "ID",
        "NAME",
        "TEAM",
        "STATE",
        "PRIORITY",
        "SUBMITTED",
        ">COST",
        ">EXIT",
        "WHERE / WHY",
    ]);
    for j in &list.jobs {
        let where_why = where_or_why(j);
        table.row(vec![
            j.id.to_string(),
            truncate(&printable(&j.name), 32),
            truncate(&printable(&j.team), 16),
            shown_state(j),
            enum_name(&j.priority),
            ago(j.submitted_at, now),
            money(j.cost_usd),
            j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            where_why,
        ]);
    }
    table.print()
}

/// `switchyard job ID`: the id and state first, then the rest as aligned fields.
pub async fn job(c: &Client, id: &str) -> anyhow::Result<()> {
    let path = format!("/jobs/{}", seg(id));
    let Some(j) = c.fetch::<JobView>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    // Why a live job is not running yet, from its placement (best effort: a job not planned
    // yet has none).
    let waiting = if matches!(
        j.state,
        JobState::Queued | JobState::Provisioning | JobState::Held
    ) {
        placement_outcome(c, id)
            .await
            .map(|o| outcome_words(&o, Utc::now()))
    } else {
        None
    };
    let now = Utc::now();
    let mut fields: Vec<(&str, String)> = vec![
        ("id", j.id.to_string()),
        ("state", {
            let mut s = state_name(&j);
            if j.cancel_requested && !finished(j.state) {
                s.push_str(" (cancel requested)");
            }
            s
        }),
    ];
    if let Some(w) = waiting {
        fields.push(("why", w));
    }
    if let Some(r) = &j.reason {
        fields.push(("reason", printable(r).into_owned()));
    }
    fields.push(("name", printable(&j.name).into_owned()));
    fields.push((
        "team",
        match &j.project {
            Some(p) => format!("{} (project {})", printable(&j.team), printable(p)),
            None => printable(&j.team).into_owned(),
        },
    ));
    fields.push((
        "priority",
        format!("{} ({})", enum_name(&j.priority), enum_name(&j.kind)),
    ));
    fields.push(("submitted", when(j.submitted_at, now)));
    let queued_until = j.started_at.or(j.finished_at).unwrap_or(now);
    let queued = span(secs_between(j.submitted_at, queued_until));
    fields.push((
        "queued",
        if j.started_at.is_none() && j.finished_at.is_none() {
            format!("{queued} so far")
        } else {
            queued
        },
    ));
    if let Some(started) = j.started_at {
        fields.push(("started", when(started, now)));
        let ran = span(secs_between(started, j.finished_at.unwrap_or(now)));
        fields.push((
            "ran",
            if j.finished_at.is_some() {
                ran
            } else {
                format!("{ran} so far")
            },
        ));
    }
    if let Some(f) = j.finished_at {
        fields.push(("finished", when(f, now)));
    }
    if let Some(code) = j.exit_code {
        fields.push(("exit code", code.to_string()));
    }
    if let Some(p) = placement_text(&j) {
        let label = if back_in_queue(&j) {
            "last placement"
        } else {
            "placement"
        };
        fields.push((label, p));
    }
    // A multi-node job: each rank's node, GPUs and state.
    for r in j.placement.iter().flat_map(|p| &p.ranks) {
        let gpus: Vec<String> = r.gpus.iter().map(u32::to_string).collect();
        let exit = r
            .exit_code
            .map(|c| format!(", exit {c}"))
            .unwrap_or_default();
        fields.push((
            "rank",
            format!(
                "{}: node {}, GPUs {}, {}{exit}",
                r.rank,
                printable(&r.node),
                gpus.join(","),
                printable(&r.state)
            ),
        ));
    }
    if j.attempts > 1 {
        fields.push(("attempts", j.attempts.to_string()));
    }
    fields.push((
        "cost",
        if finished(j.state) {
            money(j.cost_usd)
        } else {
            format!("{} so far", money(j.cost_usd))
        },
    ));
    fields.push(("resources", resources_text(&j.spec.resources)));
    if let Some(d) = j.spec.deadline {
        fields.push(("deadline", when(d, now)));
    }
    if let Some(s) = j.spec.estimated_runtime_s {
        fields.push(("estimate", span(s as f64)));
    }
    if let Some(p) = &j.runtime_prediction {
        fields.push(("predicted", printable(&p.explanation).into_owned()));
    }
    if let Some(m) = j.spec.max_price_per_hour {
        fields.push(("max price", format!("{}/hour", money(m))));
    }
    fields.push(("command", command_line(&j.spec.command)));
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in fields {
        out!("{k:<width$}  {v}");
    }
    Ok(())
}

/// `switchyard explain ID`: the placement decision and the candidates it weighed (and, for a
/// job that ran on a node launched for it, the round that chose to launch).
pub async fn explain(c: &Client, id: &str) -> anyhow::Result<()> {
    let path = format!("/jobs/{}/placement", seg(id));
    let Some(e) = c.fetch::<Value>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    print_round(&e, now)?;
    if let Some(launch) = e.get("launch_round").filter(|l| l.is_object()) {
        out!("");
        out!("the round that chose to launch a node:");
        print_round(launch, now)?;
    }
    Ok(())
}

fn print_round(e: &Value, now: DateTime<Utc>) -> anyhow::Result<()> {
    out!("decision  {}", outcome_words(&e["outcome"], now));
    if let Some(t) = time_of(&e["planned_at"]) {
        out!("planned   {}", when(t, now));
    }
    if let Some(p) = e["runtime_prediction"]["explanation"].as_str() {
        out!("runtime   {}", printable(p));
    }
    let candidates = e["candidates"].as_array().cloned().unwrap_or_default();
    if candidates.is_empty() {
        return Ok(());
    }
    out!("");
    let mut table = Table::new(&[
        "POOL", "KIND", "MARKET", "START", "FINISH", ">COST", "OUTCOME",
    ]);
    let at = |v: &Value| {
        time_of(v)
            .map(|t| format!("{} ({})", t.format("%m-%d %H:%M:%S"), ago(t, now)))
            .unwrap_or_default()
    };
    let text = |v: &Value| printable(v.as_str().unwrap_or_default()).into_owned();
    for cand in &candidates {
        let pool = match cand["node"].as_str() {
            Some(n) => format!("{} ({})", text(&cand["pool"]), printable(n)),
            None => text(&cand["pool"]),
        };
        table.row(vec![
            pool,
            text(&cand["kind"]),
            text(&cand["market"]),
            at(&cand["start"]),
            at(&cand["finish"]),
            cand["cost_usd"].as_f64().map(money).unwrap_or_default(),
            match &cand["rejected"] {
                Value::Null => "chosen".into(),
                r => rejection_words(r),
            },
        ]);
    }
    table.print()
}

/// A rejection (`"contended_capacity"`, `{"over_budget": {…}}`) as one line.
fn rejection_words(r: &Value) -> String {
    if let Some(message) = r.get("message").and_then(Value::as_str) {
        return printable(message).into_owned();
    }
    if let Some(code) = r.get("code").and_then(Value::as_str) {
        return printable(&code.replace('_', " ")).into_owned();
    }
    let words = match r {
        Value::String(s) => s.replace('_', " "),
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| match v {
                Value::Object(fields) if !fields.is_empty() => format!(
                    "{}: {}",
                    k.replace('_', " "),
                    fields
                        .iter()
                        .map(|(f, x)| format!(
                            "{} {}",
                            f.replace('_', " "),
                            match x {
                                Value::String(s) => s.clone(),
                                other => other.to_string(),
                            }
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Value::Null => k.replace('_', " "),
                other => format!("{}: {other}", k.replace('_', " ")),
            })
            .collect::<Vec<_>>()
            .join("; "),
        other => other.to_string(),
    };
    printable(&words).into_owned()
}

/// The exit status `logs --follow` ends with when the job was cancelled (as for a command
/// interrupted with Ctrl-C).
pub const EXIT_CANCELLED: u8 = 130;

/// The exit status for a finished job: 0 when it succeeded, its own exit code when it failed
/// with one (1 when it has none, or one a process cannot exit with), [`EXIT_CANCELLED`] when
/// it was cancelled.
pub fn exit_code_of(j: &JobView) -> u8 {
    match j.state {
        JobState::Failed => j
            .exit_code
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(1),
        JobState::Cancelled => EXIT_CANCELLED,
        _ => 0,
    }
}

/// `switchyard logs ID [--follow]`: the job's output, stdout to stdout, stderr and the agent's
/// notes to stderr (`--json`: every entry as one JSON line on stdout). Following, it says on
/// stderr what the job waits for (from its state and placement), once per change, and returns
/// the job's exit status ([`exit_code_of`]) when it has finished.
pub async fn logs(c: &Client, id: &str, follow: bool) -> anyhow::Result<u8> {
    use std::io::Write;
    let mut after = 0;
    let mut said: Option<String> = None;
    let mut checked: Option<Instant> = None;
    loop {
        let page: LogPage = c
            .get(&format!("/jobs/{}/logs?after={after}", seg(id)))
            .await?;
        {
            let mut out = std::io::stdout().lock();
            let mut err = std::io::stderr().lock();
            for e in &page.entries {
                if c.json {
                    writeln!(out, "{}", json_line(e)?)?;
                    continue;
                }
                match e.stream {
                    LogStream::Stdout => out.write_all(e.text.as_bytes())?,
                    // The job's own stderr, and the agent's notes: a closed stderr does not
                    // stop the output.
                    LogStream::Stderr => {
                        let _ = err.write_all(e.text.as_bytes());
                    }
                    LogStream::System => {
                        let _ = writeln!(err, "[switchyard] {}", printable(e.text.trim_end()));
                    }
                }
            }
            out.flush()?;
        }
        after = page.next_after;
        if !follow {
            return Ok(0);
        }
        if page.complete {
            let j: JobView = c.get(&format!("/jobs/{}", seg(id))).await?;
            note(&match (j.state, j.exit_code) {
                (JobState::Failed, Some(code)) => format!("failed with exit code {code}"),
                (JobState::Failed, None) => format!(
                    "failed: {}",
                    printable(j.reason.as_deref().unwrap_or("no exit code"))
                ),
                _ => state_name(&j),
            });
            return Ok(exit_code_of(&j));
        }
        if page.entries.is_empty() {
            if checked.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                say_what_it_waits_for(c, id, &mut said).await?;
                checked = Some(Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// One line on stderr on what a followed job is doing, when that changed since the last
/// (`said`): queued (and why, from its placement), held (and why), provisioning, placed,
/// running.
async fn say_what_it_waits_for(
    c: &Client,
    id: &str,
    said: &mut Option<String>,
) -> anyhow::Result<()> {
    let j: JobView = c.get(&format!("/jobs/{}", seg(id))).await?;
    let state = state_name(&j);
    let now = Utc::now();
    let (key, line) = match j.state {
        JobState::Queued | JobState::Provisioning => match placement_outcome(c, id).await {
            Some(o) => (
                format!("{state}|{}", outcome_key(&o)),
                format!("{state}: {}", outcome_words(&o, now)),
            ),
            None => (state.clone(), format!("{state}: not planned yet")),
        },
        JobState::Held => {
            // The job's reason is a code (`budget_exhausted`); its placement says it in words.
            let code = printable(j.reason.as_deref().unwrap_or("no reason given")).into_owned();
            let words = match placement_outcome(c, id).await {
                Some(o) if o["decision"] == "hold" => outcome_words(&o, now),
                _ => format!("held: {code}"),
            };
            (format!("held|{code}"), words)
        }
        JobState::Placed | JobState::Running => {
            let at = placement_text(&j).unwrap_or_default();
            let line = if j.state == JobState::Placed {
                format!("placed on {at}; starting")
            } else {
                format!("running on {at}")
            };
            (format!("{state}|{at}"), line)
        }
        _ => return Ok(()),
    };
    if said.as_deref() != Some(key.as_str()) {
        let line = if j.cancel_requested {
            format!("{line} (cancel requested)")
        } else {
            line
        };
        note(&line);
        *said = Some(key);
    }
    Ok(())
}

/// `switchyard cancel ID [--wait]`: asks the broker to cancel; prints `cancel requested` while
/// the job has not stopped, and (with `--wait`, polling) the state it ended in.
pub async fn cancel(c: &Client, id: &str, wait: bool) -> anyhow::Result<()> {
    let path = format!("/jobs/{}", seg(id));
    let answer: Value = c
        .call(Method::POST, &format!("{path}/cancel"), None)
        .await?;
    let mut j: JobView =
        serde_json::from_value(answer.clone()).context("unexpected response to a cancel")?;
    if !wait {
        if printed_as_json(c.json, &answer)? {
            return Ok(());
        }
        if finished(j.state) {
            out!("{} {}", j.id, state_name(&j));
        } else {
            out!("{} cancel requested", j.id);
        }
        return Ok(());
    }
    if !c.json && !finished(j.state) {
        out!("{} cancel requested", j.id);
    }
    let mut last = answer;
    while !finished(j.state) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = c.get(&path).await?;
        j = serde_json::from_value(last.clone()).context("unexpected job from the broker")?;
    }
    if printed_as_json(c.json, &last)? {
        return Ok(());
    }
    out!("{} {}", j.id, state_name(&j));
    Ok(())
}

/// `switchyard pools`: every pool, its GPUs, capacity and prices.
pub async fn pools(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c.fetch::<PoolList>(Method::GET, "/pools", None).await? else {
        return Ok(());
    };
    let mut table = Table::new(&[
        "POOL",
        "GPU",
        ">NODES",
        "CAPACITY",
        ">$/GPU-HOUR",
        ">CASH",
        ">SPOT",
        ">LATENCY",
    ]);
    for p in &list.pools {
        let mut capacity = Vec::new();
        if p.nodes > 0 {
            capacity.push(format!("{} of {} GPUs free", p.gpus_free, p.gpus_total));
        }
        if let (true, Some(why)) = (p.launchable, &p.unlaunchable_reason) {
            capacity.push(format!("not launchable now: {}", printable(why)));
        } else if p.launchable {
            capacity.push(format!(
                "launchable, up to {} node{}",
                p.node_limit,
                if p.node_limit == 1 { "" } else { "s" }
            ));
        }
        if capacity.is_empty() {
            capacity.push("no nodes".into());
        }
        table.row(vec![
            printable(&p.id).into_owned(),
            format!(
                "{}x {} {} GB",
                p.gpus_per_node,
                printable(&p.gpu_model),
                p.gpu_memory_gb
            ),
            p.nodes.to_string(),
            capacity.join("; "),
            money(p.price_per_gpu_hour),
            money(p.cash_per_gpu_hour),
            p.spot_price_per_gpu_hour
                .map(money)
                .unwrap_or_else(|| "-".into()),
            format!("{} ms", p.latency_ms),
        ]);
    }
    table.print()
}

/// `switchyard regions`: every region with its latency, egress price, pools and nodes.
pub async fn regions(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c.fetch::<RegionList>(Method::GET, "/regions", None).await? else {
        return Ok(());
    };
    let mut table = Table::new(&[
        "REGION",
        "PROVIDER",
        ">LATENCY",
        ">EGRESS $/GB",
        ">POOLS",
        ">NODES",
        "LOCATION",
    ]);
    for r in &list.regions {
        table.row(vec![
            printable(&r.id).into_owned(),
            printable(&r.provider).into_owned(),
            format!("{} ms", r.latency_ms),
            money(r.egress_per_gb_usd),
            r.pools.to_string(),
            r.nodes.to_string(),
            match (r.latitude, r.longitude) {
                (Some(lat), Some(lon)) => format!("{lat:.2}, {lon:.2}"),
                _ => "-".into(),
            },
        ]);
    }
    table.print()
}

/// `switchyard instances`: every cloud instance the broker launched, newest first.
pub async fn instances(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c
        .fetch::<InstanceList>(Method::GET, "/instances", None)
        .await?
    else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&[
        "INSTANCE",
        "POOL",
        "STATE",
        "MARKET",
        ">$/HOUR",
        ">UP",
        ">COST",
        "REQUESTED",
        "PROVIDER ID",
    ]);
    for i in &list.instances {
        let up = i
            .launched_at
            .map(|t| span(secs_between(t, i.ended_at.unwrap_or(now))))
            .unwrap_or_else(|| "-".into());
        table.row(vec![
            printable(&i.id).into_owned(),
            printable(&i.pool).into_owned(),
            printable(&i.state).into_owned(),
            printable(&i.market).into_owned(),
            money(i.hourly_price_usd),
            up,
            money(i.cost_usd),
            ago(i.requested_at, now),
            printable(i.provider_id.as_deref().unwrap_or("-")).into_owned(),
        ]);
    }
    table.print()
}

/// `switchyard budgets`: each budget's period, amount, spent, committed and what is left.
pub async fn budgets(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c.fetch::<BudgetList>(Method::GET, "/budgets", None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&[
        "TEAM/PROJECT",
        "PERIOD ENDS",
        ">AMOUNT",
        ">SPENT",
        ">COMMITTED",
        ">LEFT",
        "KIND",
        "ALERTS",
    ]);
    for b in &list.budgets {
        let who = match &b.project {
            Some(p) => format!("{}/{}", b.team, p),
            None => b.team.clone(),
        };
        let alerts: Vec<String> = b
            .alerts_crossed
            .iter()
            .map(|a| format!("{:.0}%", a * 100.0))
            .collect();
        table.row(vec![
            truncate(&printable(&who), 40),
            format!(
                "{} ({})",
                b.period_end.format("%Y-%m-%d"),
                ago(b.period_end, now)
            ),
            money(b.amount_usd),
            money(b.spent_usd),
            money(b.committed_usd),
            money(b.remaining_usd),
            enum_name(&b.enforcement),
            if alerts.is_empty() {
                "-".to_string()
            } else {
                alerts.join(",")
            },
        ]);
    }
    table.print()
}

/// The filters of `switchyard audit`.
pub struct AuditFilters {
    pub target: Option<String>,
    pub actor: Option<String>,
    pub action: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub limit: u32,
}

/// `switchyard audit`: the newest audit entries, by target, actor, action and time.
pub async fn audit(c: &Client, filters: AuditFilters) -> anyhow::Result<()> {
    let query = filter_query(
        filters.limit,
        [
            ("target", filters.target),
            ("actor", filters.actor),
            ("action", filters.action),
            ("from", filters.from),
            ("to", filters.to),
        ],
    );
    let path = format!("/audit?{query}");
    let Some(list) = c.fetch::<AuditList>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&["AT (UTC)", "AGO", "ACTOR", "ACTION", "TARGET"]);
    for e in &list.entries {
        table.row(vec![
            e.at.format("%Y-%m-%d %H:%M:%S").to_string(),
            ago(e.at, now),
            truncate(&printable(&e.actor), 32),
            truncate(&printable(&e.action), 32),
            truncate(&printable(&e.target), 60),
        ]);
    }
    table.print()
}

/// `switchyard token list`: API tokens (never their secrets), admin only.
pub async fn token_list(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c.fetch::<TokenList>(Method::GET, "/tokens", None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&["ID", "ROLE", "TEAM", "NAME", "CREATED", "REVOKED"]);
    for t in &list.tokens {
        table.row(vec![
            t.id.to_string(),
            crate::store::role_name(t.role).to_string(),
            truncate(&printable(t.team.as_deref().unwrap_or("-")), 24),
            truncate(&printable(t.name.as_deref().unwrap_or("-")), 32),
            ago(t.created_at, now),
            if t.revoked { "yes" } else { "no" }.to_string(),
        ]);
    }
    table.print()
}

/// `switchyard token revoke ID`: the token stops working at its next request.
pub async fn token_revoke(c: &Client, id: &str) -> anyhow::Result<()> {
    let path = format!("/tokens/{}", seg(id));
    let Some(view) = c.fetch::<TokenView>(Method::DELETE, &path, None).await? else {
        return Ok(());
    };
    out!("{} revoked", view.id);
    Ok(())
}

/// `switchyard token create`: prints the new token once (with `--json`, also its id, role and
/// team).
pub async fn token_create(
    c: &Client,
    role: Role,
    team: Option<String>,
    name: Option<String>,
) -> anyhow::Result<()> {
    let body = serde_json::to_value(CreateToken { role, team, name })?;
    let Some(created) = c
        .fetch::<TokenCreated>(Method::POST, "/tokens", Some(&body))
        .await?
    else {
        return Ok(());
    };
    out!("{}", printable(&created.token));
    Ok(())
}

/// `switchyard nodes`: every GPU node that is not revoked, its state and its unhealthy GPUs
/// with the reasons (`--json`: `{"nodes": [...]}` as `GET /nodes` answers).
pub async fn nodes(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c.fetch::<NodeList>(Method::GET, "/nodes", None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&[
        "NODE",
        "POOL",
        "HOST",
        ">GPUS",
        "HEALTH",
        "JOBS RUN AS",
        "LAST HEARTBEAT",
        "UNHEALTHY GPUS",
    ]);
    for n in &list.nodes {
        let sick: Vec<String> = n
            .gpus
            .iter()
            .flat_map(|g| g.reasons.iter().map(|r| printable(r).into_owned()))
            .collect();
        table.row(vec![
            printable(&n.id).into_owned(),
            printable(&n.pool).into_owned(),
            truncate(&printable(&n.hostname), 32),
            format!(
                "{}{}",
                n.gpus.len(),
                if n.simulated { " (simulated)" } else { "" }
            ),
            node_state(n.state).into(),
            if n.isolation {
                "own uid each"
            } else {
                "agent's user"
            }
            .into(),
            ago(n.last_heartbeat, now),
            if sick.is_empty() {
                "-".into()
            } else {
                sick.join("; ")
            },
        ]);
    }
    table.print()
}

fn node_state(state: NodeState) -> &'static str {
    match state {
        NodeState::Healthy => "healthy",
        NodeState::Lost => "lost",
        NodeState::Draining => "draining",
        NodeState::Revoked => "revoked",
    }
}

/// `switchyard nodes drain ID` / `nodes undrain ID` (infra, admin): stop new work on a node
/// (running work finishes), or take work again and clear its GPUs' health marks.
pub async fn node_drain(c: &Client, id: &str, drain: bool) -> anyhow::Result<()> {
    let verb = if drain { "drain" } else { "undrain" };
    let path = format!("/nodes/{}/{verb}", seg(id));
    let Some(n) = c.fetch::<NodeDetail>(Method::POST, &path, None).await? else {
        return Ok(());
    };
    if drain {
        out!(
            "{} draining: it takes no new work; {} job{} running finish",
            printable(&n.id),
            n.running.len(),
            if n.running.len() == 1 { "" } else { "s" }
        );
    } else {
        out!(
            "{} {}: it takes work again; its GPUs' health marks are cleared",
            printable(&n.id),
            node_state(n.state)
        );
    }
    Ok(())
}

/// `switchyard node ID`: one node, its GPUs as of the last heartbeat, and the jobs on them.
pub async fn node(c: &Client, id: &str) -> anyhow::Result<()> {
    let path = format!("/nodes/{}", seg(id));
    let Some(n) = c.fetch::<NodeDetail>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let state = if n.revoked {
        "revoked"
    } else if n.draining {
        "draining"
    } else if n.healthy {
        "healthy"
    } else {
        "unhealthy"
    };
    let fields = [
        ("id", printable(&n.id).into_owned()),
        ("state", state.to_string()),
        ("pool", printable(&n.pool).into_owned()),
        ("host", printable(&n.hostname).into_owned()),
        (
            "jobs run as",
            if n.isolation {
                "their own uid each, with a clean environment".into()
            } else {
                "the agent's own user (not isolated)".into()
            },
        ),
        ("registered", when(n.registered_at, now)),
        ("heartbeat", when(n.last_heartbeat, now)),
    ];
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in fields {
        out!("{k:<width$}  {v}");
    }
    out!("");
    let mut gpus = Table::new(&[
        ">GPU",
        "MODEL",
        ">MEMORY USED",
        ">UTILISATION",
        ">TEMPERATURE",
        ">POWER",
    ]);
    let or_dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    for g in &n.gpus {
        gpus.row(vec![
            g.index.to_string(),
            format!(
                "{}{}",
                printable(&g.model),
                if n.simulated { " (simulated)" } else { "" }
            ),
            format!(
                "{} / {} GB",
                or_dash(
                    g.memory_used_mb
                        .map(|m| format!("{:.1}", m as f64 / 1024.0))
                ),
                format!("{:.0}", g.memory_total_mb as f64 / 1024.0)
            ),
            or_dash(g.utilization_pct.map(|u| format!("{u}%"))),
            or_dash(g.temperature_c.map(|t| format!("{t} °C"))),
            or_dash(g.power_w.map(|w| format!("{w:.0} W"))),
        ]);
    }
    gpus.print()?;
    out!("");
    if n.running.is_empty() {
        out!("no jobs running");
    } else {
        let mut jobs = Table::new(&["JOB", "NAME", "TEAM", "GPUS", "STARTED"]);
        for j in &n.running {
            let gpus: Vec<String> = j.gpus.iter().map(u32::to_string).collect();
            jobs.row(vec![
                j.job_id.to_string(),
                truncate(
                    &printable(j.name.as_deref().unwrap_or("(another team's)")),
                    32,
                ),
                printable(&j.team).into_owned(),
                gpus.join(","),
                j.started_at
                    .map(|t| ago(t, now))
                    .unwrap_or_else(|| "starting".into()),
            ]);
        }
        jobs.print()?;
    }
    if let (Some(first), Some(last)) = (n.history.first(), n.history.last()) {
        out!(
            "telemetry: {} heartbeat samples from {} to {} (all of them with --json)",
            n.history.len(),
            first.at.format("%H:%M:%S"),
            last.at.format("%H:%M:%S UTC")
        );
    }
    Ok(())
}

/// What `switchyard pool set` changes; absent fields stay as they are.
pub struct PoolEdit {
    pub node_limit: Option<u32>,
    pub price_per_gpu_hour: Option<f64>,
    pub launchable: Option<bool>,
    pub marginal_per_gpu_hour: Option<f64>,
}

/// `switchyard pool set ID`: infra's edits to a pool (node limit, price, launchable) and
/// finance's (an owned pool's marginal cost).
pub async fn pool_set(c: &Client, id: &str, edit: PoolEdit) -> anyhow::Result<()> {
    let patch = PoolPatch {
        node_limit: edit.node_limit,
        price_per_gpu_hour: edit.price_per_gpu_hour,
        launchable: edit.launchable,
        marginal_usd_per_gpu_hour: edit.marginal_per_gpu_hour,
    };
    if patch == PoolPatch::default() {
        bail!(
            "nothing to change: pass --node-limit, --price-per-gpu-hour, --launchable or \
             --marginal-per-gpu-hour"
        );
    }
    let body = serde_json::to_value(&patch)?;
    let path = format!("/pools/{}", seg(id));
    let Some(p) = c
        .fetch::<PoolView>(Method::PATCH, &path, Some(&body))
        .await?
    else {
        return Ok(());
    };
    out!(
        "pool {}: up to {} node{}, {} per GPU-hour ({} in cash{}), {}",
        printable(&p.id),
        p.node_limit,
        if p.node_limit == 1 { "" } else { "s" },
        money(p.price_per_gpu_hour),
        money(p.cash_per_gpu_hour),
        if p.launchable || p.marginal_set {
            ""
        } else {
            ": the default fifth"
        },
        if p.launchable {
            "launchable"
        } else {
            "not launchable"
        }
    );
    Ok(())
}

/// `switchyard enrolment-token --pool P`: a one-time token for an agent to join the pool;
/// prints the token (when it expires on stderr).
pub async fn enrolment_token(c: &Client, pool: &str, ttl_s: Option<i64>) -> anyhow::Result<()> {
    let body = serde_json::to_value(CreateEnrolmentToken {
        pool: pool.to_string(),
        ttl_s,
    })?;
    let Some(created) = c
        .fetch::<EnrolmentTokenCreated>(Method::POST, "/enrolment-tokens", Some(&body))
        .await?
    else {
        return Ok(());
    };
    out!("{}", printable(&created.token));
    note(&format!(
        "one agent may enrol into {} with it until {}",
        printable(&created.pool),
        when(created.expires_at, Utc::now())
    ));
    Ok(())
}

/// `switchyard agent-token list`: the enrolled agents, one token per node (never the token).
pub async fn agent_token_list(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c
        .fetch::<AgentTokenList>(Method::GET, "/agent-tokens", None)
        .await?
    else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&[
        "NODE",
        "POOL",
        "HOST",
        "HEALTH",
        "REGISTERED",
        "LAST HEARTBEAT",
    ]);
    for t in &list.agent_tokens {
        table.row(vec![
            printable(&t.node).into_owned(),
            printable(&t.pool).into_owned(),
            truncate(&printable(&t.hostname), 32),
            if t.healthy { "healthy" } else { "unhealthy" }.into(),
            ago(t.registered_at, now),
            ago(t.last_heartbeat, now),
        ]);
    }
    table.print()
}

/// `switchyard agent-token revoke NODE`: the node leaves; its work goes back to the queue.
pub async fn agent_token_revoke(c: &Client, node: &str) -> anyhow::Result<()> {
    let path = format!("/agent-tokens/{}", seg(node));
    let Some(r) = c
        .fetch::<AgentTokenRevoked>(Method::DELETE, &path, None)
        .await?
    else {
        return Ok(());
    };
    out!("{} revoked", printable(&r.node));
    if !r.requeued.is_empty() {
        let ids: Vec<String> = r.requeued.iter().map(ToString::to_string).collect();
        out!(
            "{} job{} queued again: {}",
            ids.len(),
            if ids.len() == 1 { "" } else { "s" },
            ids.join(", ")
        );
    }
    Ok(())
}

fn policy_path(team: &str, project: Option<&str>, suffix: &str) -> String {
    let mut path = format!("/policies/{}{suffix}", seg(team));
    if let Some(p) = project {
        path.push_str(&format!("?{}", encode_query(&[("project", p.to_string())])));
    }
    path
}

/// `team` or `team/project`.
fn scope_name(team: &str, project: Option<&str>) -> String {
    match project {
        Some(p) => format!("{}/{}", printable(team), printable(p)),
        None => printable(team).into_owned(),
    }
}

/// Reads a policy from a `.toml` or `.json` file (the REST body's fields), checked here so
/// that a typo is reported before anything is sent.
fn read_policy(file: &Path) -> anyhow::Result<Value> {
    let body = read_doc(file)?;
    let _: PolicyBody = serde_json::from_value(body.clone())
        .with_context(|| format!("{} is not a valid policy", file.display()))?;
    Ok(body)
}

/// `switchyard policy get TEAM`: the version, who saved it when, then its rules as TOML (what
/// `policy set` takes).
pub async fn policy_get(c: &Client, team: &str, project: Option<&str>) -> anyhow::Result<()> {
    let path = policy_path(team, project, "");
    let Some(view) = c.fetch::<PolicyView>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    out!(
        "# policy of {}, version {}, saved {} by {}",
        scope_name(&view.team, view.project.as_deref()),
        view.version,
        when(view.updated_at, Utc::now()),
        printable(&view.updated_by)
    );
    let rules = match toml::to_string(&view.policy) {
        Ok(text) => text,
        Err(_) => json_text(&view.policy)?,
    };
    if rules.trim().is_empty() {
        out!("# no rules");
    } else {
        for line in rules.lines() {
            out!("{}", printable(line));
        }
    }
    Ok(())
}

/// `switchyard policy set TEAM FILE`: saves the file's policy as a new version.
pub async fn policy_set(
    c: &Client,
    team: &str,
    file: &Path,
    project: Option<&str>,
) -> anyhow::Result<()> {
    let body = read_policy(file)?;
    let path = policy_path(team, project, "");
    let Some(view) = c
        .fetch::<PolicyView>(Method::PUT, &path, Some(&body))
        .await?
    else {
        return Ok(());
    };
    out!(
        "policy of {} saved: version {}",
        scope_name(&view.team, view.project.as_deref()),
        view.version
    );
    Ok(())
}

/// `switchyard policy list`: the stored policies, each at its current version.
pub async fn policy_list(c: &Client) -> anyhow::Result<()> {
    let Some(list) = c
        .fetch::<PolicyList>(Method::GET, "/policies", None)
        .await?
    else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&["TEAM", "PROJECT", ">VERSION", "SAVED", "BY", "RULES"]);
    for p in &list.policies {
        let rules: Vec<String> = serde_json::to_value(&p.policy)
            .ok()
            .and_then(|v| v.as_object().map(|m| m.keys().cloned().collect()))
            .unwrap_or_default();
        table.row(vec![
            printable(&p.team).into_owned(),
            printable(p.project.as_deref().unwrap_or("-")).into_owned(),
            p.version.to_string(),
            ago(p.updated_at, now),
            truncate(&printable(&p.updated_by), 32),
            if rules.is_empty() {
                "-".into()
            } else {
                rules.join(", ")
            },
        ]);
    }
    table.print()
}

/// A what-if report as this client reads it: what newer brokers add (per-day costs, the jobs
/// that change) is optional, so that it reads older brokers' reports too.
#[derive(Debug, Deserialize)]
struct WhatIf {
    jobs: u32,
    current: WhatIfSide,
    draft: WhatIfSide,
    #[serde(default)]
    changes: Vec<WhatIfJob>,
}

#[derive(Debug, Deserialize)]
struct WhatIfSide {
    total_cost_usd: f64,
    deadline_met_fraction: f64,
    queue_delay_s: QueueDelay,
    held_jobs: u32,
    #[serde(default)]
    cost_per_day: Vec<WhatIfDay>,
}

#[derive(Debug, Deserialize)]
struct WhatIfDay {
    day: String,
    cost_usd: f64,
}

#[derive(Debug, Deserialize)]
struct WhatIfJob {
    job_id: String,
    name: String,
    change: String,
    current_pool: Option<String>,
    draft_pool: Option<String>,
    current_cost_usd: f64,
    draft_cost_usd: f64,
}

/// `switchyard policy what-if FILE --team T`: the team's recent jobs replayed under its current
/// policy and under the draft in FILE, side by side; the cost per day and the jobs the draft
/// treats differently when the broker reports them. Saves nothing.
pub async fn policy_what_if(
    c: &Client,
    team: &str,
    file: &Path,
    project: Option<&str>,
) -> anyhow::Result<()> {
    let body = read_policy(file)?;
    let path = policy_path(team, project, "/what-if");
    let Some(report) = c.fetch::<WhatIf>(Method::POST, &path, Some(&body)).await? else {
        return Ok(());
    };
    print_what_if(&report, &scope_name(team, project))
}

fn print_what_if(r: &WhatIf, scope: &str) -> anyhow::Result<()> {
    let (cur, draft) = (&r.current, &r.draft);
    out!(
        "what-if for {scope}: {} job{} of the last 30 days replayed under the current policy \
         and the draft",
        r.jobs,
        if r.jobs == 1 { "" } else { "s" }
    );
    out!("");
    let pct = |f: f64| format!("{:.1}%", f * 100.0);
    let signed_money = |d: f64| {
        if d.abs() < 0.000_05 {
            "same".to_string()
        } else if d > 0.0 {
            format!("+{}", money(d))
        } else {
            money(d)
        }
    };
    let signed = |d: f64, unit: &str| {
        if d.abs() < 0.05 {
            "same".to_string()
        } else {
            format!("{d:+.1}{unit}")
        }
    };
    let delay = |a: f64, b: f64| {
        if (b - a).abs() < 0.5 {
            "same".to_string()
        } else if b > a {
            format!("+{}", span(b - a))
        } else {
            format!("-{}", span(a - b))
        }
    };
    let mut table = Table::new(&["", ">CURRENT", ">DRAFT", ">CHANGE"]);
    table.row(vec![
        "total cost".into(),
        money(cur.total_cost_usd),
        money(draft.total_cost_usd),
        signed_money(draft.total_cost_usd - cur.total_cost_usd),
    ]);
    table.row(vec![
        "deadlines met".into(),
        pct(cur.deadline_met_fraction),
        pct(draft.deadline_met_fraction),
        signed(
            (draft.deadline_met_fraction - cur.deadline_met_fraction) * 100.0,
            " pts",
        ),
    ]);
    table.row(vec![
        "queue delay p50".into(),
        span(cur.queue_delay_s.p50),
        span(draft.queue_delay_s.p50),
        delay(cur.queue_delay_s.p50, draft.queue_delay_s.p50),
    ]);
    table.row(vec![
        "queue delay p99".into(),
        span(cur.queue_delay_s.p99),
        span(draft.queue_delay_s.p99),
        delay(cur.queue_delay_s.p99, draft.queue_delay_s.p99),
    ]);
    table.row(vec![
        "held jobs".into(),
        cur.held_jobs.to_string(),
        draft.held_jobs.to_string(),
        match i64::from(draft.held_jobs) - i64::from(cur.held_jobs) {
            0 => "same".into(),
            d => format!("{d:+}"),
        },
    ]);
    table.print()?;

    // Days with a cost under either policy, in order.
    let mut days: std::collections::BTreeMap<&str, (f64, f64)> = Default::default();
    for d in &cur.cost_per_day {
        days.entry(d.day.as_str()).or_default().0 += d.cost_usd;
    }
    for d in &draft.cost_per_day {
        days.entry(d.day.as_str()).or_default().1 += d.cost_usd;
    }
    days.retain(|_, (a, b)| *a != 0.0 || *b != 0.0);
    if !days.is_empty() {
        out!("");
        out!("cost per day (UTC):");
        let mut table = Table::new(&["DAY", ">CURRENT", ">DRAFT", ">CHANGE"]);
        for (day, (a, b)) in days {
            table.row(vec![
                printable(day).into_owned(),
                money(a),
                money(b),
                signed_money(b - a),
            ]);
        }
        table.print()?;
    }

    out!("");
    if r.changes.is_empty() {
        out!("no job is treated differently by the draft");
        return Ok(());
    }
    out!("jobs the draft treats differently ({}):", r.changes.len());
    let mut table = Table::new(&[
        "JOB",
        "NAME",
        "CHANGE",
        "CURRENT POOL",
        "DRAFT POOL",
        ">CURRENT COST",
        ">DRAFT COST",
    ]);
    let pool = |p: &Option<String>| match p {
        Some(p) => printable(p).into_owned(),
        None => "never starts".into(),
    };
    for ch in &r.changes {
        table.row(vec![
            printable(&ch.job_id).into_owned(),
            truncate(&printable(&ch.name), 32),
            printable(&ch.change).into_owned(),
            pool(&ch.current_pool),
            pool(&ch.draft_pool),
            money(ch.current_cost_usd),
            money(ch.draft_cost_usd),
        ]);
    }
    table.print()
}

/// What `switchyard spend` asks for.
pub struct SpendArgs {
    pub group_by: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub bucket: Option<String>,
    pub team: Option<String>,
}

/// Prints spend from the ledger as a table, as the broker's JSON (`--json`), or as its CSV
/// (`csv`).
pub async fn spend(c: &Client, args: &SpendArgs, csv: bool) -> anyhow::Result<()> {
    let mut query = vec![("group_by", args.group_by.clone())];
    for (name, value) in [
        ("from", &args.from),
        ("to", &args.to),
        ("bucket", &args.bucket),
        ("team", &args.team),
    ] {
        if let Some(v) = value {
            query.push((name, v.clone()));
        }
    }
    let url = format!("{}/api/v1/spend", c.base);
    let res = c
        .http
        .get(&url)
        .bearer_auth(&c.token)
        .header(
            reqwest::header::ACCEPT,
            if csv { "text/csv" } else { "application/json" },
        )
        .query(&query)
        .send()
        .await
        .with_context(|| format!("cannot reach the broker at {}", c.base))?;
    let status = res.status();
    let text = res.text().await.context("reading the response")?;
    if !status.is_success() {
        let detail = serde_json::from_str::<ErrorBody>(&text)
            .map(|e| format!("{} ({})", e.error.message, e.error.code))
            .unwrap_or(text);
        bail!(
            "{} {}: {}",
            status.as_u16(),
            reason(status),
            printable(&detail)
        );
    }
    if csv {
        // The broker's CSV as it came (its cells are neutralised there), minus terminal
        // controls.
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        for line in text.lines() {
            writeln!(stdout, "{}", printable(line))?;
        }
        return Ok(());
    }
    let value: Value =
        serde_json::from_str(&text).with_context(|| format!("unexpected response from {url}"))?;
    if printed_as_json(c.json, &value)? {
        return Ok(());
    }
    let report: switchyard_protocol::api::SpendReport =
        serde_json::from_value(value).with_context(|| format!("unexpected response from {url}"))?;
    let bucketed = report.rows.iter().any(|r| r.bucket_start.is_some());
    let key_name = printable(&report.group_by).to_uppercase();
    // What teams are billed (chargeback) and what the company paid in cash.
    let mut table = if bucketed {
        Table::new(&["BUCKET (UTC)", &key_name, ">BILLED", ">CASH"])
    } else {
        Table::new(&[&key_name, ">BILLED", ">CASH"])
    };
    for row in &report.rows {
        let key = row
            .key
            .get(&report.group_by)
            .cloned()
            .flatten()
            .unwrap_or_else(|| "-".into());
        // `instance_idle` as the ledger line it is: "instance idle".
        let key = if report.group_by == "usage" {
            key.replace('_', " ")
        } else {
            key
        };
        let key = truncate(&printable(&key), 60);
        let amounts = [money(row.amount_usd), money(row.cash_usd)];
        match row.bucket_start {
            Some(b) => table.row(
                [b.format("%Y-%m-%d %H:%M").to_string(), key]
                    .into_iter()
                    .chain(amounts)
                    .collect(),
            ),
            None if bucketed => {
                table.row([String::new(), key].into_iter().chain(amounts).collect())
            }
            None => table.row([key].into_iter().chain(amounts).collect()),
        }
    }
    let totals = [money(report.total_usd), money(report.total_cash_usd)];
    if bucketed {
        table.row(
            [String::new(), "TOTAL".into()]
                .into_iter()
                .chain(totals)
                .collect(),
        );
    } else {
        table.row(["TOTAL".to_string()].into_iter().chain(totals).collect());
    }
    table.print()?;
    if let Some(idle) = &report.owned_idle {
        out!(
            "owned GPUs idle: {:.2} GPU-hours, {} at the internal rate (a cost of ownership, in \
             neither total)",
            idle.gpu_hours,
            money(idle.usd)
        );
    }
    Ok(())
}

// ---- Services (issue 26) ----

/// Reads a service spec from a `.toml` or `.json` file, checked here so that a typo is
/// reported before anything is sent.
pub fn read_service(path: &Path) -> anyhow::Result<(Value, ServiceSpec)> {
    let value = read_doc(path)?;
    let spec: ServiceSpec = serde_json::from_value(value.clone())
        .with_context(|| format!("{} is not a valid service spec", path.display()))?;
    Ok((value, spec))
}

/// The services named `name` (of `team`, when given) that the caller sees: the live ones, or
/// when there are none the deleted ones still draining.
async fn services_named(
    c: &Client,
    name: &str,
    team: Option<&str>,
) -> anyhow::Result<Vec<ServiceView>> {
    let mut pairs = vec![("name", name.to_string())];
    if let Some(t) = team {
        pairs.push(("team", t.to_string()));
    }
    let list: ServiceList = c
        .get(&format!("/services?{}", encode_query(&pairs)))
        .await?;
    let (live, stopped): (Vec<ServiceView>, Vec<ServiceView>) = list
        .services
        .into_iter()
        .partition(|s| s.state != ServiceState::Stopped);
    Ok(if live.is_empty() { stopped } else { live })
}

/// The id of the service `name` names: an id as it is, else the one service of that name
/// (`--team` chooses among teams).
async fn service_id(c: &Client, name: &str, team: Option<&str>) -> anyhow::Result<String> {
    if uuid::Uuid::parse_str(name).is_ok() {
        return Ok(name.to_string());
    }
    let found = services_named(c, name, team).await?;
    match found.as_slice() {
        [] => bail!("no service named {:?}", printable(name)),
        [one] => Ok(one.id.to_string()),
        many => {
            let teams: Vec<String> = many
                .iter()
                .map(|s| printable(&s.team).into_owned())
                .collect();
            bail!(
                "several services are named {:?} (teams {}); pass --team",
                printable(name),
                teams.join(", ")
            )
        }
    }
}

/// Replicas of the current version that are ready.
fn ready_count(s: &ServiceView) -> usize {
    s.replicas
        .iter()
        .filter(|r| r.state == ReplicaState::Ready && r.spec_version == s.spec_version)
        .count()
}

/// `switchyard service deploy FILE`: creates the service, or deploys the file as a new
/// version of the team's service of that name.
pub async fn service_deploy(c: &Client, file: &Path) -> anyhow::Result<()> {
    let (body, spec) = read_service(file)?;
    let existing = services_named(c, &spec.name, Some(&spec.team))
        .await?
        .into_iter()
        .find(|s| s.state != ServiceState::Stopped);
    let (answer, before): (Value, Option<i64>) = match &existing {
        Some(s) => (
            c.call(
                Method::PUT,
                &format!("/services/{}", seg(&s.id.to_string())),
                Some(&body),
            )
            .await?,
            Some(s.spec_version),
        ),
        None => (c.call(Method::POST, "/services", Some(&body)).await?, None),
    };
    if printed_as_json(c.json, &answer)? {
        return Ok(());
    }
    let s: ServiceView =
        serde_json::from_value(answer).context("unexpected response to a deploy")?;
    let name = format!("{}/{}", printable(&s.team), printable(&s.name));
    match before {
        None => out!("{name}: deployed, version {} ({})", s.spec_version, s.id),
        Some(v) if v == s.spec_version => out!("{name}: unchanged, version {v}"),
        Some(v) => out!("{name}: version {} (was {v}), rolling out", s.spec_version),
    }
    out!("endpoint  {}", printable(&s.endpoint));
    Ok(())
}

/// `switchyard service list`: one line a service.
pub async fn service_list(c: &Client, team: Option<String>) -> anyhow::Result<()> {
    let path = match team {
        Some(t) => format!("/services?{}", encode_query(&[("team", t)])),
        None => "/services".to_string(),
    };
    let Some(list) = c.fetch::<ServiceList>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let mut table = Table::new(&[
        "NAME", "TEAM", "STATE", ">READY", ">VERSION", ">COST", "ENDPOINT",
    ]);
    for s in &list.services {
        table.row(vec![
            truncate(&printable(&s.name), 32),
            truncate(&printable(&s.team), 16),
            enum_name(&s.state),
            format!("{}/{}", ready_count(s), s.desired_replicas),
            s.spec_version.to_string(),
            money(s.cost_usd),
            printable(&s.endpoint).into_owned(),
        ]);
    }
    table.print()
}

/// `switchyard service get NAME`: the state and endpoint first, then the desired replicas and
/// why, each replica, traffic and cost.
pub async fn service_get(c: &Client, name: &str, team: Option<&str>) -> anyhow::Result<()> {
    let id = service_id(c, name, team).await?;
    let path = format!("/services/{}", seg(&id));
    let Some(s) = c.fetch::<ServiceView>(Method::GET, &path, None).await? else {
        return Ok(());
    };
    let now = Utc::now();
    let mut fields: Vec<(&str, String)> = vec![
        ("id", s.id.to_string()),
        ("state", enum_name(&s.state)),
        ("endpoint", printable(&s.endpoint).into_owned()),
        ("name", printable(&s.name).into_owned()),
        (
            "team",
            match &s.project {
                Some(p) => format!("{} (project {})", printable(&s.team), printable(p)),
                None => printable(&s.team).into_owned(),
            },
        ),
        ("version", s.spec_version.to_string()),
        (
            "replicas",
            format!(
                "{} ready of {} desired: {}",
                ready_count(&s),
                s.desired_replicas,
                printable(&s.desired_reason)
            ),
        ),
    ];
    let t = &s.traffic;
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0} ms"));
    fields.push((
        "traffic",
        format!(
            "{:.1} req/s, p50 {}, p95 {}, p99 {}, {} errors in {} requests over {} s",
            t.rps,
            ms(t.p50_ms),
            ms(t.p95_ms),
            ms(t.p99_ms),
            t.errors,
            t.requests,
            t.window_s
        ),
    ));
    fields.push(("cost", format!("{} so far", money(s.cost_usd))));
    fields.push(("created", when(s.created_at, now)));
    fields.push(("updated", when(s.updated_at, now)));
    fields.push(("command", command_line(&s.spec.command)));
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in fields {
        out!("{k:<width$}  {v}");
    }
    if !s.replicas.is_empty() {
        out!("");
        let mut table = Table::new(&[
            "JOB", ">VERSION", "STATE", "REGION", "POOL", "NODE", "MARKET", ">RPS", ">P95",
        ]);
        let text = |v: &Option<String>| v.as_deref().map(|s| printable(s).into_owned());
        for r in &s.replicas {
            table.row(vec![
                r.job_id.to_string(),
                r.spec_version.to_string(),
                enum_name(&r.state),
                text(&r.region).unwrap_or_else(|| "-".into()),
                text(&r.pool).unwrap_or_else(|| "-".into()),
                text(&r.node).unwrap_or_else(|| "-".into()),
                text(&r.market).unwrap_or_else(|| "-".into()),
                format!("{:.1}", r.rps),
                ms(r.p95_ms),
            ]);
        }
        table.print()?;
    }
    Ok(())
}

/// `switchyard service events NAME`: every scaling and placement decision, oldest first.
pub async fn service_events(c: &Client, name: &str, team: Option<&str>) -> anyhow::Result<()> {
    let id = service_id(c, name, team).await?;
    let path = format!("/services/{}/events?limit=1000", seg(&id));
    let Some(list) = c
        .fetch::<ServiceEventList>(Method::GET, &path, None)
        .await?
    else {
        return Ok(());
    };
    let now = Utc::now();
    let mut table = Table::new(&["AT", "KIND", "MESSAGE"]);
    for e in &list.events {
        table.row(vec![
            when(e.at, now),
            printable(&e.kind).into_owned(),
            printable(&e.message).into_owned(),
        ]);
    }
    table.print()
}

/// `switchyard service delete NAME`: its replicas drain, then stop.
pub async fn service_delete(c: &Client, name: &str, team: Option<&str>) -> anyhow::Result<()> {
    let id = service_id(c, name, team).await?;
    let path = format!("/services/{}", seg(&id));
    let Some(s) = c.fetch::<ServiceView>(Method::DELETE, &path, None).await? else {
        return Ok(());
    };
    out!(
        "{}/{}: deleted; its replicas drain, then stop",
        printable(&s.team),
        printable(&s.name)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn resources_say_models_else_the_accelerator_asked_for() {
        let spec = |v: serde_json::Value| -> switchyard_protocol::api::ResourceSpec {
            serde_json::from_value(v).unwrap()
        };
        assert_eq!(
            resources_text(&spec(serde_json::json!({"gpus": 1}))),
            "1 GPU"
        );
        assert_eq!(
            resources_text(&spec(
                serde_json::json!({"gpus": 4, "accelerator": "google"})
            )),
            "4 GPUs (google accelerators)"
        );
        assert_eq!(
            resources_text(&spec(serde_json::json!(
                {"gpus": 8, "gpu_models": ["H100", "MI300X"], "accelerator": "any", "nodes": 2}))),
            "8 GPUs (H100 or MI300X) on each of 2 nodes"
        );
    }

    #[test]
    fn a_requeued_job_shows_why_it_waits_not_where_it_ran() {
        let view = |state: &str| -> JobView {
            serde_json::from_value(serde_json::json!({
                "id": "01a248ff-eb69-7619-97a9-3c2264bd1cbb", "name": "train", "team": "ml",
                "project": null, "state": state, "priority": "normal", "kind": "batch",
                "submitted_at": "2026-12-06T01:00:00Z", "started_at": "2026-12-06T01:00:01Z",
                "finished_at": null, "exit_code": null,
                "reason": "GPU 0 fell off the bus (XID 79): requeued",
                "placement": {"region": "onprem:local-dc1", "pool": "onprem:local-dc1/sim",
                              "node": "onprem-1", "gpus": [0], "market": "on_demand"},
                "attempts": 1, "cancel_requested": false, "cost_usd": 0.0,
                "spec": {"name": "train", "team": "ml", "command": ["train"],
                         "resources": {"gpus": 1}}}))
            .expect("a job view")
        };
        assert_eq!(
            where_or_why(&view("queued")),
            "GPU 0 fell off the bus (XID 79): requeued"
        );
        assert_eq!(
            where_or_why(&view("running")),
            "onprem:local-dc1/sim, node onprem-1, GPUs 0 (on_demand)"
        );
    }

    #[test]
    fn printable_text_passes_as_it_is() {
        for s in ["resnet50-train", "ünïcode ok", "日本語", ""] {
            assert!(matches!(printable(s), std::borrow::Cow::Borrowed(_)), "{s}");
        }
    }

    #[test]
    fn control_and_bidi_characters_are_escaped() {
        let cases = [
            ("a\u{1b}[2Jb", "a\\u{1b}[2Jb"),
            ("bell\u{7}", "bell\\u{7}"),
            ("cr\rlf\ntab\t", "cr\\rlf\\ntab\\t"),
            ("nul\0", "nul\\u{0}"),
            ("del\u{7f}c1\u{9b}", "del\\u{7f}c1\\u{9b}"),
            ("rtl\u{202e}txt", "rtl\\u{202e}txt"),
            ("iso\u{2066}x\u{2069}", "iso\\u{2066}x\\u{2069}"),
        ];
        for (raw, shown) in cases {
            assert_eq!(printable(raw), shown, "{raw:?}");
        }
    }

    #[test]
    fn json_for_the_terminal_escapes_what_json_leaves_raw_and_reads_back_the_same() {
        let value = serde_json::json!({"name": "a\u{202e}b\u{1b}c\u{85}d", "n": 1});
        let text = json_text(&value).unwrap();
        assert!(
            !text.chars().any(|c| needs_escape(c) && c != '\n'),
            "{text}"
        );
        assert!(text.contains("\\u202e"), "{text}");
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back, value);
    }

    #[test]
    fn money_shows_cents_and_a_fraction_of_a_cent_where_it_matters() {
        for (usd, shown) in [
            (0.0145, "$0.0145"),
            (0.013334, "$0.0133"),
            (5.03, "$5.03"),
            (0.5, "$0.50"),
            (0.0, "$0.00"),
            (1204.5, "$1,204.50"),
            (-1204.5, "-$1,204.50"),
            (1_234_567.891, "$1,234,567.89"),
        ] {
            assert_eq!(money(usd), shown, "{usd}");
        }
    }

    #[test]
    fn money_is_the_brokers_one_format_and_no_amount_is_a_dash() {
        for (usd, shown) in [
            (0.0150, "$0.0150"),
            (0.546, "$0.5460"),
            (2.945, "$2.95"),
            (f64::NAN, "-"),
            (f64::INFINITY, "-"),
        ] {
            assert_eq!(money(usd), shown, "{usd}");
        }
    }

    #[test]
    fn spans_and_ages_read_as_people_say_them() {
        for (secs, shown) in [
            (0.0, "0s"),
            (0.44, "0.4s"),
            (3.0, "3s"),
            (45.2, "45s"),
            (185.0, "3m 05s"),
            (7_380.0, "2h 03m"),
            (273_600.0, "3d 04h"),
            (-5.0, "0s"),
        ] {
            assert_eq!(span(secs), shown, "{secs}");
        }
        let now = Utc::now();
        let secs = |s: i64| now - chrono::Duration::seconds(s);
        assert_eq!(ago(secs(2), now), "just now");
        assert_eq!(ago(secs(42), now), "42 s ago");
        assert_eq!(ago(secs(185), now), "3 min ago");
        assert_eq!(ago(secs(5 * 3_600 + 10), now), "5 h ago");
        assert_eq!(ago(secs(86_400 + 5), now), "1 day ago");
        assert_eq!(ago(secs(3 * 86_400), now), "3 days ago");
        assert_eq!(ago(secs(-240), now), "in 4 min");
    }

    fn job_in(state: JobState, exit_code: Option<i32>) -> JobView {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "team": "t", "command": ["true"], "resources": {"gpus": 1}
        }))
        .unwrap();
        JobView {
            id: uuid::Uuid::nil(),
            name: "j".into(),
            team: "t".into(),
            project: None,
            state,
            priority: switchyard_protocol::api::Priority::Normal,
            kind: switchyard_protocol::api::JobKind::Batch,
            submitted_at: Utc::now(),
            started_at: None,
            finished_at: None,
            exit_code,
            reason: None,
            placement: None,
            attempts: 1,
            cancel_requested: false,
            cost_usd: 0.0,
            spec,
            runtime_prediction: None,
        }
    }

    #[test]
    fn a_finished_job_gives_its_exit_status() {
        for (state, code, status) in [
            (JobState::Succeeded, Some(0), 0),
            (JobState::Failed, Some(3), 3),
            (JobState::Failed, None, 1),
            // Codes a process cannot exit with (a signal as negative, or 0 on a failure).
            (JobState::Failed, Some(-9), 1),
            (JobState::Failed, Some(0), 1),
            (JobState::Failed, Some(300), 1),
            (JobState::Cancelled, None, EXIT_CANCELLED),
            (JobState::Cancelled, Some(143), EXIT_CANCELLED),
        ] {
            assert_eq!(
                exit_code_of(&job_in(state, code)),
                status,
                "{state:?} {code:?}"
            );
        }
    }

    #[test]
    fn placement_outcomes_and_rejections_read_in_words() {
        let now = Utc::now();
        let hold = serde_json::json!({"decision": "hold", "reason": "over budget: needs $1.15"});
        assert_eq!(outcome_words(&hold, now), "held: over budget: needs $1.15");
        let wait = serde_json::json!({"decision": "wait", "pool": "p",
            "expected_start": (now + chrono::Duration::minutes(4)).timestamp_millis()});
        let words = outcome_words(&wait, now);
        assert!(words.starts_with("waiting for capacity in p"), "{words}");
        assert!(
            words.ends_with("(in 4 min)") || words.ends_with("(in 3 min)"),
            "{words}"
        );
        let launch =
            serde_json::json!({"decision": "launch", "pool": "aws:x", "market": "on_demand"});
        assert_eq!(
            outcome_words(&launch, now),
            "launching a on-demand node in aws:x for it"
        );
        // The same wait, a round later, is not said again; another pool is.
        let later = serde_json::json!({"decision": "wait", "pool": "p", "expected_start": 1});
        assert_eq!(outcome_key(&wait), outcome_key(&later));
        let elsewhere = serde_json::json!({"decision": "wait", "pool": "q"});
        assert_ne!(outcome_key(&wait), outcome_key(&elsewhere));
        let cheaper = serde_json::json!({"decision": "hold", "reason": "over budget: needs $0.15"});
        assert_eq!(outcome_key(&hold), outcome_key(&cheaper));

        let r = serde_json::json!({"code": "budget_exhausted", "message": "over budget"});
        assert_eq!(rejection_words(&r), "over budget");
        assert_eq!(
            rejection_words(&serde_json::json!("contended_capacity")),
            "contended capacity"
        );
        assert_eq!(
            rejection_words(&serde_json::json!({"over_budget": {"needed": 3}})),
            "over budget: needed 3"
        );
    }

    #[test]
    fn a_path_segment_stays_one_segment() {
        assert_eq!(seg("0193-ab_c~d.e"), "0193-ab_c~d.e");
        assert_eq!(seg("../tokens"), "..%2Ftokens");
        assert_eq!(seg(".."), "%2E%2E");
        assert_eq!(seg("a b?c#d"), "a%20b%3Fc%23d");
    }

    #[test]
    fn command_lines_quote_what_a_shell_would_split() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(command_line(&argv(&["echo", "a b"])), "echo 'a b'");
        assert_eq!(
            command_line(&argv(&["sh", "-c", "it's"])),
            "sh -c 'it'\\''s'"
        );
        assert_eq!(
            command_line(&argv(&["python", "train.py", "--lr=0.1"])),
            "python train.py --lr=0.1"
        );
        assert_eq!(command_line(&argv(&["x\u{1b}[2J"])), "'x\\u{1b}[2J'");
    }

    #[test]
    fn a_broken_pipe_is_recognised_through_context() {
        let e = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing the table");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
