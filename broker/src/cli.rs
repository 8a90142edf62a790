//! The `switchyard` client commands: submit, jobs, job, logs, cancel, pools, token create. They
//! talk to a broker over REST with a bearer token from `--token`, `SWITCHYARD_TOKEN`, or the
//! `admin.token` file that `switchyard up` writes.
//!
//! What they print comes from other people (job names, teams, output): every field is passed
//! through [`printable`], which escapes control characters and bidirectional overrides, so a
//! name cannot move the cursor, ring the bell or reverse the line in the reader's terminal
//! (`logs` is the exception: it is the job's own output, byte for byte). Output goes through
//! [`out!`], which returns an error instead of panicking when stdout is a closed pipe
//! (`switchyard jobs | head -1`); `main` ends quietly on that error ([`is_broken_pipe`]).

use anyhow::{Context, bail};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_protocol::api::{
    AuditList, BudgetList, CreateToken, ErrorBody, InstanceList, JobList, JobSpec, JobView,
    LogPage, LogStream, PolicyBody, PolicyView, PoolList, Role, TokenCreated, TokenList, TokenView,
};

/// `println!` that returns the write error (a closed pipe) instead of panicking.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
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
    let text = serde_json::to_string_pretty(value)?;
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
    Ok(out)
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
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
            .pool_idle_timeout(switchyard_agent::client::POOL_IDLE_TIMEOUT);
        if let Some(path) = ca_cert {
            builder = builder.tls_certs_only(switchyard_agent::client::read_ca(path)?);
        }
        let http = builder.build().context("building the HTTP client")?;
        Ok(Client {
            http,
            base: url.trim_end_matches('/').to_string(),
            token,
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

pub async fn submit(c: &Client, file: &Path) -> anyhow::Result<()> {
    let spec = read_spec(file)?;
    // A fresh key per submit; its retries reuse it, so a lost answer never makes a second job.
    let key = uuid::Uuid::now_v7().to_string();
    let job: JobView = c
        .call_with(Method::POST, "/jobs", Some(&spec), Some(&key))
        .await?;
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

pub async fn jobs(c: &Client, filters: JobFilters, json: bool) -> anyhow::Result<()> {
    let mut query = vec![("limit", filters.limit.to_string())];
    for (key, value) in [
        ("state", filters.state),
        ("team", filters.team),
        ("priority", filters.priority),
        ("name", filters.name),
    ] {
        if let Some(v) = value {
            query.push((key, v));
        }
    }
    let list: JobList = c
        .call(
            Method::GET,
            &format!("/jobs?{}", encode_query(&query)),
            None,
        )
        .await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<36}  {:<20}  {:<12}  {:<10}  {:>4}  {:<28}",
        "ID",
        "NAME",
        "TEAM",
        "STATE",
        "EXIT",
        "PLACEMENT"
    );
    for j in list.jobs {
        out!(
            "{:<36}  {:<20}  {:<12}  {:<10}  {:>4}  {:<28}",
            j.id,
            truncate(&printable(&j.name), 20),
            truncate(&printable(&j.team), 12),
            state_name(&j),
            j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            j.placement
                .as_ref()
                .map(|p| format!("{} {:?}", printable(&p.node), p.gpus))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// `k=v&…` with each value percent-encoded (a job name may hold spaces or `&`).
fn encode_query(pairs: &[(&str, String)]) -> String {
    let mut url = reqwest::Url::parse("http://query.invalid/").expect("a constant URL");
    url.query_pairs_mut().extend_pairs(pairs);
    url.query().unwrap_or_default().to_string()
}

/// USD as money: cents, and a fraction of a cent where it matters (`$0.0145`, `$5.03`,
/// `-$1,204.50`).
pub fn money(usd: f64) -> String {
    let sign = if usd < 0.0 { "-" } else { "" };
    let abs = usd.abs();
    let cents_only = abs >= 1.0 || ((abs * 100.0).round() - abs * 100.0).abs() < 1e-9;
    let text = if cents_only {
        format!("{abs:.2}")
    } else {
        format!("{abs:.4}")
    };
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    let mut grouped = String::new();
    for (i, ch) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(ch);
    }
    format!("{sign}${grouped}.{frac}")
}

fn state_name(j: &JobView) -> String {
    serde_json::to_value(j.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

pub async fn job(c: &Client, id: &str) -> anyhow::Result<()> {
    let job: Value = c.call(Method::GET, &format!("/jobs/{id}"), None).await?;
    out!("{}", json_text(&job)?);
    Ok(())
}

pub async fn logs(c: &Client, id: &str, follow: bool) -> anyhow::Result<()> {
    use std::io::Write;
    let mut after = 0;
    loop {
        let page: LogPage = c
            .call(Method::GET, &format!("/jobs/{id}/logs?after={after}"), None)
            .await?;
        let mut out = std::io::stdout().lock();
        let mut err = std::io::stderr().lock();
        for e in &page.entries {
            match e.stream {
                LogStream::Stdout => out.write_all(e.text.as_bytes())?,
                LogStream::Stderr => err.write_all(e.text.as_bytes())?,
                LogStream::System => {
                    writeln!(err, "[switchyard] {}", printable(e.text.trim_end()))?
                }
            }
        }
        out.flush()?;
        after = page.next_after;
        if !follow || page.complete {
            return Ok(());
        }
        if page.entries.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

pub async fn cancel(c: &Client, id: &str) -> anyhow::Result<()> {
    let job: JobView = c
        .call(Method::POST, &format!("/jobs/{id}/cancel"), None)
        .await?;
    out!("{} {}", job.id, state_name(&job));
    Ok(())
}

pub async fn pools(c: &Client, json: bool) -> anyhow::Result<()> {
    let list: PoolList = c.call(Method::GET, "/pools", None).await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<40}  {:<10}  {:>5}  {:>9}  {:>10}  {:>10}  {:>7}",
        "POOL",
        "GPU",
        "NODES",
        "GPUS FREE",
        "$/GPU-H",
        "SPOT",
        "LAT MS"
    );
    for p in list.pools {
        out!(
            "{:<40}  {:<10}  {:>5}  {:>9}  {:>10.4}  {:>10}  {:>7}",
            truncate(&printable(&p.id), 40),
            printable(&p.gpu_model),
            p.nodes,
            format!("{}/{}", p.gpus_free, p.gpus_total),
            p.price_per_gpu_hour,
            p.spot_price_per_gpu_hour
                .map(|s| format!("{s:.4}"))
                .unwrap_or_else(|| "-".into()),
            p.latency_ms
        );
    }
    Ok(())
}

/// `switchyard instances`: every cloud instance the broker launched, newest first.
pub async fn instances(c: &Client, json: bool) -> anyhow::Result<()> {
    let list: InstanceList = c.call(Method::GET, "/instances", None).await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<36}  {:<28}  {:<11}  {:<9}  {:>10}  {:>10}  {:<20}",
        "INSTANCE",
        "POOL",
        "STATE",
        "MARKET",
        "$/HOUR",
        "COST",
        "PROVIDER ID"
    );
    for i in &list.instances {
        out!(
            "{:<36}  {:<28}  {:<11}  {:<9}  {:>10}  {:>10}  {:<20}",
            printable(&i.id),
            truncate(&printable(&i.pool), 28),
            printable(&i.state),
            printable(&i.market),
            money(i.hourly_price_usd),
            money(i.cost_usd),
            printable(i.provider_id.as_deref().unwrap_or("-"))
        );
    }
    Ok(())
}

/// `switchyard budgets`: each budget's period, amount, spent, committed and what is left.
pub async fn budgets(c: &Client, json: bool) -> anyhow::Result<()> {
    let list: BudgetList = c.call(Method::GET, "/budgets", None).await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<24}  {:<10}  {:>12}  {:>12}  {:>12}  {:>12}  {:<8}  {:<10}",
        "TEAM/PROJECT",
        "ENDS",
        "AMOUNT",
        "SPENT",
        "COMMITTED",
        "LEFT",
        "KIND",
        "ALERTS"
    );
    for b in &list.budgets {
        let who = match &b.project {
            Some(p) => format!("{}/{}", b.team, p),
            None => b.team.clone(),
        };
        let kind = serde_json::to_value(b.enforcement)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let alerts: Vec<String> = b
            .alerts_crossed
            .iter()
            .map(|a| format!("{:.0}%", a * 100.0))
            .collect();
        out!(
            "{:<24}  {:<10}  {:>12}  {:>12}  {:>12}  {:>12}  {:<8}  {:<10}",
            truncate(&printable(&who), 24),
            b.period_end.format("%Y-%m-%d"),
            money(b.amount_usd),
            money(b.spent_usd),
            money(b.committed_usd),
            money(b.remaining_usd),
            kind,
            if alerts.is_empty() {
                "-".to_string()
            } else {
                alerts.join(",")
            }
        );
    }
    Ok(())
}

/// `switchyard audit`: the newest audit entries, optionally about one target.
pub async fn audit(
    c: &Client,
    target: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let mut query = vec![("limit", limit.to_string())];
    if let Some(t) = target {
        query.push(("target", t));
    }
    let list: AuditList = c
        .call(
            Method::GET,
            &format!("/audit?{}", encode_query(&query)),
            None,
        )
        .await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<20}  {:<28}  {:<24}  {:<40}",
        "AT (UTC)",
        "ACTOR",
        "ACTION",
        "TARGET"
    );
    for e in &list.entries {
        out!(
            "{:<20}  {:<28}  {:<24}  {:<40}",
            e.at.format("%Y-%m-%d %H:%M:%S"),
            truncate(&printable(&e.actor), 28),
            truncate(&printable(&e.action), 24),
            truncate(&printable(&e.target), 40)
        );
    }
    Ok(())
}

/// `switchyard token list`: API tokens (never their secrets), admin only.
pub async fn token_list(c: &Client, json: bool) -> anyhow::Result<()> {
    let list: TokenList = c.call(Method::GET, "/tokens", None).await?;
    if printed_as_json(json, &list)? {
        return Ok(());
    }
    out!(
        "{:<36}  {:<10}  {:<16}  {:<24}  {:<20}  {:<7}",
        "ID",
        "ROLE",
        "TEAM",
        "NAME",
        "CREATED (UTC)",
        "REVOKED"
    );
    for t in &list.tokens {
        out!(
            "{:<36}  {:<10}  {:<16}  {:<24}  {:<20}  {:<7}",
            t.id,
            crate::store::role_name(t.role),
            truncate(&printable(t.team.as_deref().unwrap_or("-")), 16),
            truncate(&printable(t.name.as_deref().unwrap_or("-")), 24),
            t.created_at.format("%Y-%m-%d %H:%M:%S"),
            if t.revoked { "yes" } else { "no" }
        );
    }
    Ok(())
}

/// `switchyard token revoke ID`: the token stops working at its next request.
pub async fn token_revoke(c: &Client, id: &str, json: bool) -> anyhow::Result<()> {
    let view: TokenView = c
        .call(Method::DELETE, &format!("/tokens/{id}"), None)
        .await?;
    if json {
        out!("{}", json_text(&view)?);
    } else {
        out!("{} revoked", view.id);
    }
    Ok(())
}

pub async fn token_create(c: &Client, role: Role, team: Option<String>) -> anyhow::Result<()> {
    let body = serde_json::to_value(CreateToken {
        role,
        team,
        name: None,
    })?;
    let created: TokenCreated = c.call(Method::POST, "/tokens", Some(&body)).await?;
    out!("{}", printable(&created.token));
    Ok(())
}

fn policy_path(team: &str, project: Option<&str>) -> String {
    let mut path = format!("/policies/{team}");
    if let Some(p) = project {
        path.push_str(&format!("?project={p}"));
    }
    path
}

/// Prints the current policy of a team (or project) as JSON, with its version.
pub async fn policy_get(c: &Client, team: &str, project: Option<&str>) -> anyhow::Result<()> {
    let view: PolicyView = c
        .call(Method::GET, &policy_path(team, project), None)
        .await?;
    out!("{}", json_text(&view)?);
    Ok(())
}

/// Reads a policy from a `.toml` or `.json` file (the REST body's fields) and saves it as a new
/// version.
pub async fn policy_set(
    c: &Client,
    team: &str,
    file: &Path,
    project: Option<&str>,
) -> anyhow::Result<()> {
    let body = read_doc(file)?;
    let _: PolicyBody = serde_json::from_value(body.clone())
        .with_context(|| format!("{} is not a valid policy", file.display()))?;
    let view: PolicyView = c
        .call(Method::PUT, &policy_path(team, project), Some(&body))
        .await?;
    out!(
        "policy of {}{} saved: version {}",
        printable(&view.team),
        view.project
            .map(|p| format!("/{}", printable(&p)))
            .unwrap_or_default(),
        view.version
    );
    Ok(())
}

/// What `switchyard spend` asks for.
pub struct SpendArgs {
    pub group_by: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub bucket: Option<String>,
    pub team: Option<String>,
}

/// Prints spend from the ledger as a table, or the broker's CSV as it comes.
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
    let report: switchyard_protocol::api::SpendReport =
        serde_json::from_str(&text).with_context(|| format!("unexpected response from {url}"))?;
    let bucketed = report.rows.iter().any(|r| r.bucket_start.is_some());
    let key_name = printable(&report.group_by).to_uppercase();
    if bucketed {
        out!("{:<20}  {:<40}  {:>14}", "BUCKET", key_name, "USD");
    } else {
        out!("{:<40}  {:>14}", key_name, "USD");
    }
    for row in &report.rows {
        let key = row
            .key
            .get(&report.group_by)
            .cloned()
            .flatten()
            .unwrap_or_else(|| "-".into());
        let key = printable(&key);
        match row.bucket_start {
            Some(b) => out!(
                "{:<20}  {:<40}  {:>14}",
                b.format("%Y-%m-%d %H:%M"),
                truncate(&key, 40),
                money(row.amount_usd)
            ),
            None => out!("{:<40}  {:>14}", truncate(&key, 40), money(row.amount_usd)),
        }
    }
    let width = if bucketed { 78 } else { 56 };
    out!("{}", "-".repeat(width));
    if bucketed {
        out!(
            "{:<20}  {:<40}  {:>14}",
            "",
            "TOTAL",
            money(report.total_usd)
        );
    } else {
        out!("{:<40}  {:>14}", "TOTAL", money(report.total_usd));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

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
    fn a_broken_pipe_is_recognised_through_context() {
        let e = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing the table");
        assert!(is_broken_pipe(&e));
        assert!(!is_broken_pipe(&anyhow::anyhow!("other")));
    }
}
