//! The `switchyard` client commands: submit, jobs, job, logs, cancel, pools, token create. They
//! talk to a broker over REST with a bearer token from `--token`, `SWITCHYARD_TOKEN`, or the
//! `admin.token` file that `switchyard up` writes.

use anyhow::{Context, bail};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;
use switchyard_protocol::api::{
    CreateToken, ErrorBody, JobList, JobSpec, JobView, LogPage, LogStream, PolicyBody, PolicyView,
    PoolList, Role, TokenCreated,
};

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
        let url = format!("{}/api/v1{path}", self.base);
        let mut req = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(b) = body {
            req = req.json(b);
        }
        let res = req
            .send()
            .await
            .with_context(|| format!("cannot reach the broker at {}", self.base))?;
        let status = res.status();
        let bytes = res.bytes().await.context("reading the response")?;
        if !status.is_success() {
            let detail = serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|e| format!("{} ({})", e.error.message, e.error.code))
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            bail!("{} {}: {detail}", status.as_u16(), reason(status));
        }
        serde_json::from_slice(&bytes).with_context(|| format!("unexpected response from {url}"))
    }
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
    let job: JobView = c.call(Method::POST, "/jobs", Some(&spec)).await?;
    println!("{}", job.id);
    Ok(())
}

pub async fn jobs(
    c: &Client,
    state: Option<String>,
    team: Option<String>,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let mut query = vec![format!("limit={limit}")];
    if let Some(s) = state {
        query.push(format!("state={s}"));
    }
    if let Some(t) = team {
        query.push(format!("team={t}"));
    }
    let list: JobList = c
        .call(Method::GET, &format!("/jobs?{}", query.join("&")), None)
        .await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<36}  {:<20}  {:<12}  {:<10}  {:>4}  {:<28}",
        "ID", "NAME", "TEAM", "STATE", "EXIT", "PLACEMENT"
    );
    for j in list.jobs {
        println!(
            "{:<36}  {:<20}  {:<12}  {:<10}  {:>4}  {:<28}",
            j.id,
            truncate(&j.name, 20),
            truncate(&j.team, 12),
            state_name(&j),
            j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            j.placement
                .as_ref()
                .map(|p| format!("{} {:?}", p.node, p.gpus))
                .unwrap_or_default()
        );
    }
    Ok(())
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
    println!("{}", serde_json::to_string_pretty(&job)?);
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
                LogStream::System => writeln!(err, "[switchyard] {}", e.text.trim_end())?,
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
    println!("{} {}", job.id, state_name(&job));
    Ok(())
}

pub async fn pools(c: &Client, json: bool) -> anyhow::Result<()> {
    let list: PoolList = c.call(Method::GET, "/pools", None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<40}  {:<10}  {:>5}  {:>9}  {:>10}  {:>10}  {:>7}",
        "POOL", "GPU", "NODES", "GPUS FREE", "$/GPU-H", "SPOT", "LAT MS"
    );
    for p in list.pools {
        println!(
            "{:<40}  {:<10}  {:>5}  {:>9}  {:>10.4}  {:>10}  {:>7}",
            truncate(&p.id, 40),
            p.gpu_model,
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

pub async fn token_create(c: &Client, role: Role, team: Option<String>) -> anyhow::Result<()> {
    let body = serde_json::to_value(CreateToken {
        role,
        team,
        name: None,
    })?;
    let created: TokenCreated = c.call(Method::POST, "/tokens", Some(&body)).await?;
    println!("{}", created.token);
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
    println!("{}", serde_json::to_string_pretty(&view)?);
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
    println!(
        "policy of {}{} saved: version {}",
        view.team,
        view.project.map(|p| format!("/{p}")).unwrap_or_default(),
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
        bail!("{} {}: {detail}", status.as_u16(), reason(status));
    }
    if csv {
        print!("{text}");
        return Ok(());
    }
    let report: switchyard_protocol::api::SpendReport =
        serde_json::from_str(&text).with_context(|| format!("unexpected response from {url}"))?;
    let bucketed = report.rows.iter().any(|r| r.bucket_start.is_some());
    let key_name = report.group_by.to_uppercase();
    if bucketed {
        println!("{:<20}  {:<40}  {:>14}", "BUCKET", key_name, "USD");
    } else {
        println!("{:<40}  {:>14}", key_name, "USD");
    }
    for row in &report.rows {
        let key = row
            .key
            .get(&report.group_by)
            .cloned()
            .flatten()
            .unwrap_or_else(|| "-".into());
        match row.bucket_start {
            Some(b) => println!(
                "{:<20}  {:<40}  {:>14.6}",
                b.format("%Y-%m-%d %H:%M"),
                truncate(&key, 40),
                row.amount_usd
            ),
            None => println!("{:<40}  {:>14.6}", truncate(&key, 40), row.amount_usd),
        }
    }
    let width = if bucketed { 78 } else { 56 };
    println!("{}", "-".repeat(width));
    if bucketed {
        println!("{:<20}  {:<40}  {:>14.6}", "", "TOTAL", report.total_usd);
    } else {
        println!("{:<40}  {:>14.6}", "TOTAL", report.total_usd);
    }
    Ok(())
}
