//! The web console in a real headless Chromium over WebDriver (chromedriver + fantoccini),
//! against the real `switchyard` binary: sign in, set a hard budget on the policies page, see
//! the change in the audit log, watch a job submitted over REST beyond the budget be held with
//! `budget_exhausted`, try an unsaved draft in the what-if, raise the budget in the console and
//! watch the job run; and every page at desktop (1440 px) and phone (390 px) width, each with its
//! data, with no script errors (the browser's console log is proven readable first), budget
//! alerts in words, and the spend CSV download.
//!
//! Also: a bad policy edit is refused whole (every field error at once, nothing saved) and
//! leaving unsaved edits asks first, and the utilization rule (issue 28) is refused naming its
//! fields, then saved; a what-if under a tiny hard budget holds the job the live
//! broker held under it; a finished burst job's cost stays fixed while its instance idles.
//! The Services page shows real replicas by region, the charts it keeps since it opened, the
//! desired count's reason and the events, to an admin and (their team's only) to a developer.
//!
//! Screenshots of every page (both roles, 1440×900) land in `target/console-shots/` (or
//! `SWITCHYARD_SCREENSHOT_DIR`) on each run. Chromium and chromedriver come from Debian's `chromium` and
//! `chromium-driver` (`scripts/test.sh` installs them); when they are missing these tests fail
//! and say so, unless `SWITCHYARD_SKIP_BROWSER=1` asks to skip them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard_tests::*;

const WAIT: Duration = Duration::from_secs(20);

/// Chromium and chromedriver, or `None` when they are missing and skipping was asked for.
fn browser_binaries() -> Option<(PathBuf, PathBuf)> {
    let chromium = PathBuf::from(
        std::env::var("SWITCHYARD_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
    );
    let driver = PathBuf::from(
        std::env::var("SWITCHYARD_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into()),
    );
    let missing: Vec<String> = [&chromium, &driver]
        .iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if missing.is_empty() {
        return Some((chromium, driver));
    }
    if std::env::var("SWITCHYARD_SKIP_BROWSER").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED: browser test: {} missing and SWITCHYARD_SKIP_BROWSER=1",
            missing.join(", ")
        );
        return None;
    }
    panic!(
        "the console's browser tests need Chromium and chromedriver, missing: {}. Install them \
         with `apt-get install chromium chromium-driver` (scripts/test.sh does), point \
         SWITCHYARD_CHROMIUM / SWITCHYARD_CHROMEDRIVER at them, or set SWITCHYARD_SKIP_BROWSER=1 \
         to skip these tests",
        missing.join(", ")
    );
}

fn screenshot_dir() -> PathBuf {
    let dir = std::env::var_os("SWITCHYARD_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/console-shots")
        });
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A headless Chromium driven through chromedriver, on the console at `base`.
struct Browser {
    client: Client,
    base: String,
    driver_url: String,
    // Dropped after the client: chromedriver (and the browser it started) die with it.
    _driver: Proc,
    _dir: tempfile::TempDir,
}

impl Browser {
    async fn start(base: &str) -> Option<Browser> {
        let (chromium, driver_bin) = browser_binaries()?;
        // fantoccini's TLS stack and the rest of the workspace's bring two rustls providers.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cmd = Command::new(&driver_bin);
        cmd.arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1");
        let driver = Proc::spawn("chromedriver", cmd, &dir.path().join("chromedriver.log"))
            .expect("starting chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        eventually("chromedriver to listen", WAIT, || async {
            let r = http.get(format!("{url}/status")).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        let profile = dir.path().join("profile");
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--disable-quic",
                    "--no-first-run",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--window-size=1440,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        // The browser's console log, read through chromedriver's log endpoint where it has one.
        caps.insert("goog:loggingPrefs".into(), json!({"browser": "ALL"}));
        let client = ClientBuilder::rustls()
            .expect("TLS roots")
            .capabilities(caps)
            .connect(&url)
            .await
            .unwrap_or_else(|e| {
                let log = std::fs::read_to_string(dir.path().join("chromedriver.log"))
                    .unwrap_or_default();
                panic!("could not start a Chromium session: {e}\n{log}")
            });
        Some(Browser {
            client,
            base: base.to_string(),
            driver_url: url,
            _driver: driver,
            _dir: dir,
        })
    }

    /// Waits for an element matching `css`.
    async fn el(&self, css: &str) -> Element {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no element {css} within {WAIT:?}: {e}"))
    }

    async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client.execute(script, args).await.unwrap()
    }

    /// Polls `script` (a function body returning a value) until it returns something truthy.
    async fn until(&self, what: &str, timeout: Duration, script: &str, args: Vec<Value>) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.js(script, args.clone()).await;
            let truthy =
                !matches!(&v, Value::Null | Value::Bool(false)) && v != json!("") && v != json!(0);
            if truthy {
                return v;
            }
            if Instant::now() > deadline {
                let errors = self.errors().await;
                panic!(
                    "timed out after {timeout:?} waiting for {what} (script errors: {errors:?})"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Loads the console (a full page load).
    async fn load(&self, route: &str) {
        self.client
            .goto(&format!("{}/{route}", self.base))
            .await
            .unwrap();
    }

    /// Goes to `route` (`#/jobs`…) inside the page and waits until that page has rendered its
    /// data; returns the page's root.
    async fn open(&self, route: &str, page: &str) -> Element {
        self.js(
            "document.querySelectorAll('section.page').forEach(e => e.setAttribute('data-stale', '1'));
             if (location.hash === arguments[0]) { window.dispatchEvent(new HashChangeEvent('hashchange')); }
             else { location.hash = arguments[0]; }
             return true;",
            vec![json!(route)],
        )
        .await;
        self.ready(page).await
    }

    async fn ready(&self, page: &str) -> Element {
        let css = format!("[data-test=\"page-{page}\"]:not([data-stale])");
        let root = self.el(&css).await;
        let state = self
            .until(
                &format!("page {page} to load"),
                WAIT,
                "const e = document.querySelector(arguments[0]);
                 return e && e.getAttribute('data-state') !== 'loading' ? e.getAttribute('data-state') : null;",
                vec![json!(css)],
            )
            .await;
        if state != json!("ready") {
            let text = root.text().await.unwrap_or_default();
            panic!("page {page} did not render: {state} {text}");
        }
        root
    }

    async fn errors(&self) -> Vec<String> {
        let v = self
            .client
            .execute("return window.__syErrors || null;", vec![])
            .await
            .unwrap_or(Value::Null);
        match v {
            Value::Array(a) => a.iter().map(|e| e.to_string()).collect(),
            _ => vec!["window.__syErrors is missing: app.js did not run".into()],
        }
    }

    /// SEVERE entries of the browser's console (failed loads, uncaught errors, CSP reports)
    /// since the last call. Fails the test when chromedriver's log endpoint does not answer
    /// with a list: a silent log channel would let every "no console errors" check pass.
    async fn console_errors(&self) -> Vec<String> {
        let session = self.client.session_id().await.unwrap().unwrap();
        let res = reqwest::Client::new()
            .post(format!("{}/session/{session}/se/log", self.driver_url))
            .json(&json!({"type": "browser"}))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        assert!(
            status.is_success(),
            "chromedriver's browser log cannot be read ({status}): {body}"
        );
        let entries = body["value"]
            .as_array()
            .unwrap_or_else(|| panic!("chromedriver's browser log is not a list: {body}"));
        entries
            .iter()
            .filter(|e| e["level"] == "SEVERE")
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// Waits until the browser's console log shows an entry `expected` accepts, and fails on
    /// any other SEVERE entry meanwhile. Proves the log channel works before a test relies on
    /// it reading empty.
    async fn expect_logged(&self, what: &str, expected: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            let (seen, other): (Vec<String>, Vec<String>) = self
                .console_errors()
                .await
                .into_iter()
                .partition(|e| expected(e));
            assert!(other.is_empty(), "console errors besides {what}: {other:?}");
            if !seen.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what} never showed in the browser's console log within {WAIT:?}: the log \
                 channel the error checks read does not work"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Provokes one known console error (a request the broker refuses with 400) and waits to
    /// read it back: see [`Browser::expect_logged`].
    async fn probe_console_log(&self) {
        self.js(
            "fetch('/api/v1/jobs?limit=0', { credentials: 'same-origin' }).catch(() => {});
             return true;",
            vec![],
        )
        .await;
        self.expect_logged("the probe's refused request", |e| {
            e.contains("/api/v1/jobs?limit=0") && e.contains("400")
        })
        .await;
    }

    /// How many elements match `css`.
    async fn count(&self, css: &str) -> u64 {
        self.js(
            "return document.querySelectorAll(arguments[0]).length;",
            vec![json!(css)],
        )
        .await
        .as_u64()
        .unwrap()
    }

    /// The text of the first element matching `css`, or None.
    async fn text_of(&self, css: &str) -> Option<String> {
        self.js(
            "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
            vec![json!(css)],
        )
        .await
        .as_str()
        .map(str::to_string)
    }

    async fn assert_no_errors(&self, context: &str) {
        let mut errors = self.errors().await;
        errors.extend(self.console_errors().await);
        assert!(errors.is_empty(), "script errors {context}: {errors:?}");
    }

    async fn sign_in(&self, token: &str) {
        self.load("").await;
        let input = self.el("[data-test=login-token]").await;
        input.send_keys(token).await.unwrap();
        self.el("[data-test=login-submit]")
            .await
            .click()
            .await
            .unwrap();
        self.ready("overview").await;
    }

    async fn set_width(&self, width: u32, height: u32) {
        self.client.set_window_size(width, height).await.unwrap();
        let inner = self
            .until(
                "the window to resize",
                WAIT,
                "return window.innerWidth;",
                vec![],
            )
            .await;
        assert_eq!(inner, json!(width), "viewport width after resizing");
    }

    /// The page fits the window: nothing but the tables' own scrollers may be wider.
    async fn assert_fits(&self, context: &str) {
        let over = self
            .js(
                "const w = document.documentElement.clientWidth;
                 const wide = [...document.querySelectorAll('body *')].filter(e => {
                   if (e.closest('.table-wrap, pre, .nav')) return false;
                   const r = e.getBoundingClientRect();
                   return r.width > 0 && r.right > w + 1;
                 }).slice(0, 5).map(e => e.tagName + '.' + e.className + '[' + (e.getAttribute('data-test') || '') + ']');
                 return { scroll: document.documentElement.scrollWidth, width: w, wide };",
                vec![],
            )
            .await;
        assert!(
            over["scroll"].as_u64() <= over["width"].as_u64()
                && over["wide"].as_array().is_some_and(|a| a.is_empty()),
            "{context}: the page is wider than the window: {over}"
        );
    }

    /// A Chrome DevTools command through chromedriver.
    async fn cdp(&self, cmd: &str, params: Value) -> Value {
        let session = self.client.session_id().await.unwrap().unwrap();
        let res = reqwest::Client::new()
            .post(format!(
                "{}/session/{session}/goog/cdp/execute",
                self.driver_url
            ))
            .json(&json!({"cmd": cmd, "params": params}))
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body: Value = res.json().await.unwrap_or(Value::Null);
        assert!(status.is_success(), "CDP {cmd}: {status} {body}");
        body["value"].clone()
    }

    /// A PNG of the whole page: the viewport is stretched to the page's height for the shot.
    async fn screenshot(&self, name: &str, width: u32, height: u32) {
        let full = self
            .js(
                "return Math.ceil(document.documentElement.scrollHeight);",
                vec![],
            )
            .await
            .as_u64()
            .unwrap_or(height as u64)
            .clamp(height as u64, 6000);
        self.cdp(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": full, "deviceScaleFactor": 1, "mobile": false}),
        )
        .await;
        let png = self.client.screenshot().await;
        self.cdp("Emulation.clearDeviceMetricsOverride", json!({}))
            .await;
        let png = png.unwrap();
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
    }
}

/// A REST call with a bearer token.
async fn rest(
    url: &str,
    token: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new()
        .request(method, format!("{url}{path}"))
        .bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn put_policy(url: &str, token: &str, team: &str, body: Value) {
    let (status, res) = rest(
        url,
        token,
        reqwest::Method::PUT,
        &format!("/api/v1/policies/{team}"),
        Some(body),
    )
    .await;
    assert!(status == 200 || status == 201, "{status} {res}");
}

/// Sets the budget amount on the open policy form and saves; returns the status line.
async fn save_budget(b: &Browser, amount: &str) -> Element {
    let form = b.el("[data-test=policy-form][data-team=ml]").await;
    let enabled = form
        .find(Locator::Css("[data-test=\"field-budget.enabled\"]"))
        .await
        .unwrap();
    if enabled.prop("checked").await.unwrap().as_deref() != Some("true") {
        enabled.click().await.unwrap();
    }
    let input = form
        .find(Locator::Css("[data-test=\"field-budget.amount_usd\"]"))
        .await
        .unwrap();
    input.clear().await.unwrap();
    input.send_keys(amount).await.unwrap();
    form.find(Locator::Css("[data-test=\"field-budget.period\"]"))
        .await
        .unwrap()
        .select_by_value("month")
        .await
        .unwrap();
    form.find(Locator::Css("[data-test=\"field-budget.enforcement\"]"))
        .await
        .unwrap()
        .select_by_value("hard")
        .await
        .unwrap();
    form.find(Locator::Css("[data-test=policy-save]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    form
}

/// Waits for the jobs page to show job `id` in one of `states`; returns (state, reason).
async fn job_row_state(
    b: &Browser,
    id: &str,
    states: &[&str],
    timeout: Duration,
) -> (String, String) {
    let v = b
        .until(
            &format!("job {id} to show as {states:?} on the jobs page"),
            timeout,
            "const row = document.querySelector('[data-test=job-row][data-job-id=\"' + arguments[0] + '\"]');
             if (!row || !arguments[1].includes(row.getAttribute('data-state'))) return null;
             return [row.getAttribute('data-state'), row.querySelector('[data-test=job-reason]').textContent];",
            vec![json!(id), json!(states)],
        )
        .await;
    (
        v[0].as_str().unwrap().to_string(),
        v[1].as_str().unwrap().to_string(),
    )
}

/// Text shown to people carries no epoch milliseconds and no float noise: times are dates,
/// money is `$1.23` or `$0.0145`.
fn assert_no_raw_numbers(text: &str) {
    // Ids (UUIDs) and dates are hyphenated: they are not numbers.
    for token in text
        .split(|c: char| c.is_whitespace() || ",;:()[]$".contains(c))
        .filter(|t| !t.contains('-'))
    {
        let token = token.trim_end_matches('.');
        let (whole, frac) = token.split_once('.').unwrap_or((token, ""));
        if !whole.is_empty() && whole.chars().all(|c| c.is_ascii_digit()) {
            assert!(
                whole.len() < 11,
                "an epoch-millisecond-like number {token:?} in {text:?}"
            );
            assert!(
                !frac.chars().all(|c| c.is_ascii_digit()) || frac.len() <= 4,
                "a number with more than 4 decimals {token:?} in {text:?}"
            );
        }
    }
}

/// Dollars as the API writes them (a JSON number), in micro-dollars.
fn usd_micros(v: &Value) -> i64 {
    (v.as_f64().unwrap() * 1e6).round() as i64
}

/// `12.500000` (the CSV's exact dollars) in micro-dollars.
fn csv_micros(text: &str) -> i64 {
    let (whole, frac) = text.split_once('.').unwrap_or((text, "0"));
    let negative = whole.starts_with('-');
    let whole: i64 = whole.trim_start_matches('-').parse().unwrap();
    let frac: i64 = format!("{frac:0<6}")[..6].parse().unwrap();
    let m = whole * 1_000_000 + frac;
    if negative { -m } else { m }
}

/// The spend CSV grouped by `group` (`group,bucket_start?,amount_usd,cash_usd`): (key,
/// chargeback, cash) in micro-dollars per row, after checking the header.
fn parse_spend_csv(text: &str, group: &str) -> Vec<(String, i64, i64)> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("a CSV header").split(',').collect();
    assert_eq!(header.first(), Some(&group), "{text}");
    assert_eq!(
        header[header.len() - 2..],
        ["amount_usd", "cash_usd"],
        "{text}"
    );
    let rows: Vec<(String, i64, i64)> = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert_eq!(cells.len(), header.len(), "{l:?} in {text}");
            (
                cells[0].to_string(),
                csv_micros(cells[cells.len() - 2]),
                csv_micros(cells[cells.len() - 1]),
            )
        })
        .collect();
    assert!(!rows.is_empty(), "no rows: {text}");
    rows
}

/// Each page shows its data, not just its frame: rows where the new user's broker has them,
/// and the page's own words where it has none (no cloud instances after `switchyard up`).
async fn assert_page_data(b: &Browser, name: &str, context: &str) {
    let at_least = |css: &'static str, n: u64| async move {
        let have = b.count(css).await;
        assert!(have >= n, "{context}: {have} × {css}, want {n} or more");
    };
    match name {
        "overview" => {
            at_least("[data-test=budget-row]", 2).await;
            at_least("[data-test=util-row]", 1).await;
            at_least("[data-test=queue-row]", 4).await;
        }
        "catalogue" => {
            at_least("[data-test=pool-row]", 4).await;
            at_least("[data-test=pool-cash]", 4).await;
        }
        "jobs" => {
            at_least("[data-test=job-row]", 3).await;
            let states = b
                .js(
                    "return [...document.querySelectorAll('[data-test=job-row]')].map(r => r.getAttribute('data-state'));",
                    vec![],
                )
                .await;
            assert!(
                states.as_array().unwrap().iter().all(|s| s == "succeeded"),
                "{context}: {states}"
            );
        }
        "job-detail" => {
            let detail = b
                .text_of("[data-test=job-detail]")
                .await
                .unwrap_or_default();
            assert!(detail.contains("train-resnet"), "{context}: {detail}");
            at_least("[data-test=candidate-row]", 1).await;
            let cost = b
                .text_of("[data-test=detail-cost]")
                .await
                .unwrap_or_default();
            assert!(
                cost.starts_with('$') && cost != "$0.00",
                "{context}: cost {cost:?}"
            );
        }
        "policies" => {
            let amount = b
                .js(
                    "const e = document.querySelector('[data-test=policy-form][data-team=ml] [data-test=\"field-budget.amount_usd\"]');
                     return e ? e.value : null;",
                    vec![],
                )
                .await;
            assert_eq!(amount, json!("500"), "{context}");
            let version = b
                .text_of("[data-test=policy-version]")
                .await
                .unwrap_or_default();
            assert!(version.starts_with("version 1"), "{context}: {version:?}");
            let objective = b
                .js(
                    "const e = document.querySelector('[data-test=policy-form][data-team=ml] [data-test=\"field-objective\"]');
                     return e ? e.value : null;",
                    vec![],
                )
                .await;
            assert_eq!(objective, json!(""), "{context}: the default objective");
        }
        "spend" => {
            at_least("[data-test=spend-table-team] [data-test=spend-row]", 2).await;
            at_least("[data-test=spend-table-provider] [data-test=spend-row]", 1).await;
            let total = b
                .text_of("[data-test=spend-total] .value")
                .await
                .unwrap_or_default();
            assert!(
                total.starts_with('$')
                    && !total.trim_start_matches(['$', '0', '.', ',']).is_empty(),
                "{context}: total {total:?}"
            );
            // Two costs: cash beside the bill, and owned GPUs standing idle (an admin sees
            // every team, so the idle card is there).
            let cash = b
                .text_of("[data-test=spend-cash] .value")
                .await
                .unwrap_or_default();
            assert!(cash.starts_with('$'), "{context}: cash {cash:?}");
            let idle = b
                .text_of("[data-test=spend-owned-idle] .value")
                .await
                .unwrap_or_default();
            assert!(
                idle.starts_with('$') && idle.ends_with("GPU-h"),
                "{context}: owned idle {idle:?}"
            );
        }
        "instances" => {
            let rows = b.count("[data-test=instance-row]").await;
            if rows == 0 {
                let empty = b
                    .text_of("[data-test=instances-table-empty]")
                    .await
                    .unwrap_or_default();
                assert!(
                    empty.starts_with("No cloud instances"),
                    "{context}: neither instances nor the empty-state text: {empty:?}"
                );
            }
            let summary = b.text_of("[data-test=instances-summary]").await;
            assert!(summary.is_some(), "{context}");
        }
        "audit" => {
            at_least("[data-test=audit-row]", 2).await;
            at_least("[data-test=audit-row][data-action=\"policy.put\"]", 2).await;
        }
        "node" => {
            // Its GPUs, what runs on them, and the history charts (or words where simulated
            // GPUs report nothing: never zeros drawn for figures nobody reported).
            at_least("[data-test=node-gpu-row]", 1).await;
            // Each GPU's health (issue 28); an operator may drain the node.
            at_least("[data-test=node-gpu-health]", 1).await;
            at_least("[data-test=node-drain]", 1).await;
            at_least("[data-test=node-chart-panel]", 4).await;
            let unreported = b.count("[data-test=node-not-reported]").await;
            let charts = b.count("svg[data-test^=node-chart-]").await;
            let words = b.count("[data-test=node-chart-none]").await;
            assert!(
                charts + words == 4 && (unreported == 0 || charts == 0),
                "{context}: {charts} charts, {words} in words, {unreported}"
            );
            b.el("[data-test=node-jobs-table]").await;
        }
        other => panic!("no data check for page {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_set_in_the_console_holds_a_job_until_it_is_raised() {
    let mut broker = Broker::start().await;
    let Some(b) = Browser::start(&broker.url).await else {
        return;
    };
    broker.start_agent("console-a1", 4).await;

    // Sign in with the admin token.
    b.sign_in(&broker.admin).await;
    let who = b.el("[data-test=who]").await.text().await.unwrap();
    assert!(who.contains("admin"), "{who}");

    // The policies page: a bad amount is refused with a message next to the field.
    b.open("#/policies/ml", "policies").await;
    let form = save_budget(&b, "-5").await;
    let error = b
        .until(
            "the amount's error message",
            WAIT,
            "const e = document.querySelector('[data-test=\"error-budget.amount_usd\"]');
             return e && !e.hidden ? e.textContent : null;",
            vec![],
        )
        .await;
    assert!(
        error.as_str().unwrap().contains("at least 0"),
        "the error names the valid values: {error}"
    );
    b.screenshot("policies-validation", 1440, 900).await;
    // Refused in the page: nothing reached the broker.
    let (status, policy) = rest(
        &broker.url,
        &broker.admin,
        reqwest::Method::GET,
        "/api/v1/policies/ml",
        None,
    )
    .await;
    assert_eq!(status, 404, "nothing saved: {policy}");
    // The console log the error checks read must work: one known error shows in it.
    b.probe_console_log().await;
    b.assert_no_errors("after the refused save").await;

    // A $1 monthly hard budget for team ml.
    save_budget(&b, "1").await;
    let saved = b
        .until(
            "the policy to be saved",
            WAIT,
            "const s = document.querySelector('[data-test=policy-status]');
             return s && s.getAttribute('data-version');",
            vec![],
        )
        .await;
    assert_eq!(saved, json!("1"));
    assert!(
        form.find(Locator::Css("[data-test=\"error-budget.amount_usd\"]"))
            .await
            .unwrap()
            .prop("hidden")
            .await
            .unwrap()
            .as_deref()
            == Some("true"),
        "the old error is cleared"
    );
    let (_, policy) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(
        policy["policy"]["budget"]["amount_usd"],
        json!(1.0),
        "{policy}"
    );
    assert_eq!(
        policy["policy"]["budget"]["enforcement"], "hard",
        "{policy}"
    );
    b.screenshot("policies", 1440, 900).await;

    // The audit page shows who changed what.
    b.open("#/audit", "audit").await;
    let entry = b
        .until(
            "the policy.put audit entry",
            WAIT,
            "const r = [...document.querySelectorAll('[data-test=audit-row][data-action=\"policy.put\"]')]
               .find(r => r.getAttribute('data-target').includes('ml'));
             return r ? r.querySelector('[data-test=audit-actor]').textContent + ' | ' + r.textContent : null;",
            vec![],
        )
        .await;
    assert!(entry.as_str().unwrap().starts_with("admin"), "{entry}");
    assert!(entry.as_str().unwrap().contains("amount_usd"), "{entry}");
    b.screenshot("audit", 1440, 900).await;

    // A job whose estimate ($2: one H100 for an hour at $2/GPU-hour) is beyond the budget.
    let id = broker
        .submit(
            json!({"name": "over-budget", "team": "ml", "command": ["sleep", "2"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 3600}),
        )
        .await;
    b.open("#/jobs?team=ml", "jobs").await;
    let (_, reason) = job_row_state(&b, &id, &["held"], Duration::from_secs(30)).await;
    assert!(reason.contains("budget"), "{reason}");
    b.screenshot("jobs-held", 1440, 900).await;

    // Its detail page explains the hold, in words, with money as money.
    b.open(&format!("#/jobs/{id}"), "jobs").await;
    let detail = b.el("[data-test=job-detail]").await.text().await.unwrap();
    assert!(detail.contains("budget"), "{detail}");
    assert_no_raw_numbers(&detail);
    b.screenshot("job-detail-held", 1440, 900).await;

    // The overview says why it is held, in the broker's words, and links to the policy.
    b.open("#/overview", "overview").await;
    let held = b
        .until(
            "the held job's reason on the overview",
            WAIT,
            "const li = document.querySelector('[data-test=held-job][data-job-id=\"' + arguments[0] + '\"]');
             return li ? [li.querySelector('[data-test=held-reason]').textContent,
                          li.querySelector('[data-test=held-policy-link]').getAttribute('href')] : null;",
            vec![json!(id)],
        )
        .await;
    let (_, explained) = rest(
        &broker.url,
        &broker.admin,
        reqwest::Method::GET,
        &format!("/api/v1/jobs/{id}/placement"),
        None,
    )
    .await;
    let words = explained["outcome"]["reason"]
        .as_str()
        .unwrap_or_else(|| panic!("a held job's outcome has a reason: {explained}"));
    assert_eq!(held[0], json!(words.replace('_', " ")), "{explained}");
    assert!(held[0].as_str().unwrap().contains("budget"), "{held}");
    assert_eq!(held[1], json!("#/policies/ml"));
    b.screenshot("overview-held", 1440, 900).await;

    // Raise the budget in the console: the job runs.
    b.open("#/policies/ml", "policies").await;
    save_budget(&b, "100").await;
    b.until(
        "the raised budget to be saved",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-version') === '2';",
        vec![],
    )
    .await;
    // What-if on an unsaved draft: a price ceiling ($1 per GPU-hour) below the only pool's
    // $2 would leave the team's job unplaced. The simulator's current-vs-draft table shows it,
    // and nothing is saved.
    let max_price = b
        .el("[data-test=policy-form][data-team=ml] [data-test=field-max_price_per_gpu_hour]")
        .await;
    max_price.clear().await.unwrap();
    max_price.send_keys("1").await.unwrap();
    b.el("[data-test=whatif-run]").await.click().await.unwrap();
    let rows = b
        .until(
            "the what-if result",
            Duration::from_secs(60),
            "const rows = [...document.querySelectorAll('[data-test=whatif-table] [data-test=whatif-row]')];
             return rows.length ? rows.map(r => [r.getAttribute('data-metric'),
               r.querySelector('[data-test=whatif-current]').textContent,
               r.querySelector('[data-test=whatif-draft]').textContent]) : null;",
            vec![],
        )
        .await;
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 5, "{rows:?}");
    let held = rows
        .iter()
        .find(|r| r[0] == "held_jobs")
        .unwrap_or_else(|| panic!("no held-jobs row: {rows:?}"));
    assert_eq!(
        (held[1].as_str().unwrap(), held[2].as_str().unwrap()),
        ("0", "1"),
        "the draft's price ceiling holds the job, the current policy does not: {rows:?}"
    );
    let cost = rows.iter().find(|r| r[0] == "total_cost_usd").unwrap();
    assert_ne!(cost[1], cost[2], "{rows:?}");
    // The job the draft would hold is listed, and cost per day is drawn for both policies.
    b.until(
        "the held job in the what-if's list",
        WAIT,
        "return document.querySelector('[data-test=whatif-change][data-change=held][data-job-id=\"' + arguments[0] + '\"]') !== null;",
        vec![json!(id)],
    )
    .await;
    b.el("[data-test=whatif-chart] [data-test=whatif-line-current]")
        .await;
    b.el("[data-test=whatif-chart] [data-test=whatif-line-draft]")
        .await;
    b.screenshot("policies-whatif", 1440, 900).await;
    let (_, policy) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(
        policy["version"],
        json!(2),
        "the what-if saved nothing: {policy}"
    );
    assert!(
        policy["policy"]["max_price_per_gpu_hour"].is_null(),
        "the what-if saved nothing: {policy}"
    );
    // The draft is unsaved: leaving asks first, and discarding it goes on.
    b.js("location.hash = '#/jobs?team=ml'; return true;", vec![])
        .await;
    b.el("[data-test=unsaved-discard]")
        .await
        .click()
        .await
        .unwrap();
    b.ready("jobs").await;
    let (state, _) = job_row_state(
        &b,
        &id,
        &["placed", "running", "succeeded"],
        Duration::from_secs(30),
    )
    .await;
    assert_ne!(state, "held");
    broker
        .wait_state(&id, &["succeeded"], Duration::from_secs(30))
        .await;
    job_row_state(&b, &id, &["succeeded"], Duration::from_secs(15)).await;
    b.screenshot("jobs-released", 1440, 900).await;

    // Two versions in the audit log now.
    b.open("#/audit", "audit").await;
    b.until(
        "both policy versions in the audit log",
        WAIT,
        "return document.querySelectorAll('[data-test=audit-row][data-action=\"policy.put\"]').length >= 2;",
        vec![],
    )
    .await;
    b.assert_no_errors("during the budget flow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_renders_at_desktop_and_phone_width_without_script_errors() {
    // What a new user sees after `switchyard up`: two local agents, the bundled catalogue.
    let up = Up::start(&[], 8).await;
    let Some(b) = Browser::start(&up.url).await else {
        return;
    };
    put_policy(
        &up.url,
        &up.token,
        "ml",
        json!({"budget": {"amount_usd": 500, "period": "month", "enforcement": "hard", "alert_at": [0.5, 0.9]},
               "spot": "allowed", "burst": true,
               "windows": [{"priority": "low", "from": "20:00", "to": "08:00", "tz": "Asia/Shanghai"}]}),
    )
    .await;
    // A soft budget of one cent at an internal rate of a cent per GPU-second: the sweep below
    // crosses both of its alert thresholds within its first second.
    put_policy(
        &up.url,
        &up.token,
        "vision",
        json!({"budget": {"amount_usd": 0.01, "period": "week", "enforcement": "soft", "alert_at": [0.5, 0.9]},
               "onprem_rates": {"H100": 36.0}}),
    )
    .await;
    let mut ids = Vec::new();
    for (name, team, gpus, prio) in [
        ("train-resnet", "ml", 2, "normal"),
        ("eval", "ml", 1, "high"),
        ("sweep", "vision", 1, "low"),
    ] {
        ids.push(
            up.submit(
                json!({"name": name, "team": team, "command": ["sleep", "3"],
                             "resources": {"gpus": gpus}, "priority": prio,
                             "estimated_runtime_s": 600}),
            )
            .await,
        );
    }
    for id in &ids {
        up.job_where(id, 60, |j| j["state"] == "succeeded").await;
    }
    // A two-node job (its detail page lists its ranks, below).
    let gang = up
        .submit(json!({"name": "ddp", "team": "ml", "command": ["true"],
                       "resources": {"gpus": 1, "nodes": 2}, "regions": ["onprem:local-dc1"]}))
        .await;
    let done = up.job_where(&gang, 60, |j| j["state"] == "succeeded").await;
    // Every job has finished: the ledger is settled and the pages' figures stay put.
    let spend = eventually("the ledger to hold both teams' spend", WAIT, || async {
        let s = up.get("/api/v1/spend?group_by=team").await;
        let rows = s["rows"].as_array()?;
        (rows.len() >= 2 && rows.iter().all(|r| r["amount_usd"].as_f64() > Some(0.0))).then_some(s)
    })
    .await;
    eventually("vision's budget alerts", WAIT, || async {
        let budgets = up.get("/api/v1/budgets").await;
        let vision = budgets["budgets"]
            .as_array()?
            .iter()
            .find(|b| b["team"] == "vision")?
            .clone();
        (vision["alerts_crossed"] == json!([0.5, 0.9])).then_some(())
    })
    .await;

    b.sign_in(&up.token).await;
    // The console log the error checks below read must work: one known error shows in it.
    b.probe_console_log().await;
    let pools = up.get("/api/v1/pools").await;
    let node = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["node_list"].as_array().cloned().unwrap_or_default())
        .find(|n| n["healthy"] == true)
        .unwrap_or_else(|| panic!("a healthy node in {pools}"));
    let node_id = node["id"].as_str().unwrap().to_string();
    let node_route = format!("#/nodes/{node_id}");
    let pages = [
        ("overview", "#/overview"),
        ("catalogue", "#/catalogue"),
        ("jobs", "#/jobs"),
        ("job-detail", &*format!("#/jobs/{}", ids[0])),
        ("policies", "#/policies/ml"),
        ("spend", "#/spend"),
        ("instances", "#/instances"),
        ("audit", "#/audit"),
        ("node", &*node_route),
    ];
    for (width, height, label) in [(1440, 900, "desktop"), (390, 844, "phone")] {
        b.set_width(width, height).await;
        for (name, route) in pages {
            let page = match name {
                "job-detail" => "jobs",
                "node" => "nodes",
                other => other,
            };
            let root = b.open(route, page).await;
            let text = root.text().await.unwrap();
            assert!(!text.trim().is_empty(), "{name} at {label} is empty");
            assert_page_data(&b, name, &format!("{name} at {label}")).await;
            b.assert_fits(&format!("{name} at {label}")).await;
            b.screenshot(&format!("{name}-{label}"), width, height)
                .await;
            b.assert_no_errors(&format!("on {name} at {label}")).await;
        }
    }

    // Data shows where it should.
    b.set_width(1440, 900).await;

    // The overview: one "spent" figure per budget period (ml's month, vision's week, never
    // added up), and the spend trend with the budget line and a labelled linear forecast.
    b.open("#/overview", "overview").await;
    let spent = b
        .js(
            "return [...document.querySelectorAll('[data-test=card-spent]')].map(c => c.getAttribute('data-period')).sort();",
            vec![],
        )
        .await;
    assert_eq!(spent, json!(["month", "week"]), "{spent}");
    b.el("[data-test=trend][data-period=month] [data-test=chart-trend] [data-test=trend-budget]")
        .await;
    b.el("[data-test=trend][data-period=month] [data-test=trend-forecast]")
        .await;
    let label = b
        .text_of("[data-test=trend][data-period=month] [data-test=trend-forecast-label]")
        .await
        .unwrap_or_default();
    assert!(label.starts_with("forecast (linear): $"), "{label:?}");
    // Idle GPU-hours this month by team, from the waste rule's record (issue 28).
    b.el("[data-test=overview-waste] [data-test=waste-teams-table]")
        .await;

    // The catalogue counts live nodes from each pool's node list, and a launchable cloud pool
    // with none says what it may launch instead of "0 / 0".
    b.open("#/catalogue", "catalogue").await;
    let onprem = b
        .text_of("[data-test=pool-row][data-pool=\"onprem:local-dc1/sim-h100x4\"] [data-test=pool-node-count]")
        .await
        .unwrap_or_default();
    let healthy = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == "onprem:local-dc1/sim-h100x4")
        .map(|p| {
            p["node_list"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["healthy"] == true)
                .count()
        })
        .unwrap();
    assert_eq!(onprem, format!("{healthy} nodes"), "{pools}");
    let launchable = b
        .js(
            "return [...document.querySelectorAll('[data-test=pool-row]')]
               .map(r => r.querySelector('[data-test=pool-node-count]').textContent)
               .filter(t => t.startsWith('launchable, up to ')).length;",
            vec![],
        )
        .await;
    assert!(launchable.as_u64() > Some(0), "{launchable}");
    let zeros = b
        .js(
            "return [...document.querySelectorAll('[data-test=pool-free]')].filter(t => t.textContent === '0 / 0').length;",
            vec![],
        )
        .await;
    assert_eq!(zeros, json!(0), "no pool shows 0 / 0 free GPUs");
    // Its node list links to the node's page.
    b.el(&format!("[data-test=node-link][data-node=\"{node_id}\"]"))
        .await
        .click()
        .await
        .unwrap();
    b.ready("nodes").await;
    assert_eq!(
        b.text_of("[data-test=node-id]").await.as_deref(),
        Some(node_id.as_str())
    );

    // Job detail: times to the second, durations, the estimate, full node ids on hover.
    b.open(&format!("#/jobs/{}", ids[0]), "jobs").await;
    let times = b
        .js(
            "return ['submitted', 'started', 'finished', 'queued', 'ran', 'estimate']
               .map(k => document.querySelector('[data-test=detail-' + k + ']').textContent);",
            vec![],
        )
        .await;
    let t = |i: usize| times[i].as_str().unwrap().to_string();
    for i in 0..3 {
        assert!(
            t(i).len() == 23 && t(i).ends_with(" UTC") && t(i).as_bytes()[16] == b':',
            "a time to the second: {times}"
        );
    }
    assert!(t(3).ends_with(" s") && t(4).ends_with(" s"), "{times}");
    assert!(t(5).starts_with(" · estimate $"), "{times}");
    let node_ref = b
        .js(
            "const a = document.querySelector('[data-test=detail-runs-on] [data-test=node-ref]');
             return [a.getAttribute('title'), a.getAttribute('href')];",
            vec![],
        )
        .await;
    let placed = up.get(&format!("/api/v1/jobs/{}", ids[0])).await;
    assert_eq!(node_ref[0], placed["placement"]["node"], "{node_ref}");
    b.el("[data-test=detail-runs-on] [data-test=node-copy]")
        .await
        .click()
        .await
        .unwrap();
    b.until(
        "the node id to be copied",
        WAIT,
        "return window.__syCopied === arguments[0];",
        vec![placed["placement"]["node"].clone()],
    )
    .await;
    let detail = b.el("[data-test=job-detail]").await.text().await.unwrap();
    assert_no_raw_numbers(&detail);

    // A two-node job's detail lists each rank with its node.
    b.open(&format!("#/jobs/{gang}"), "jobs").await;
    let ranks = b
        .until(
            "the gang's ranks",
            WAIT,
            "const r = [...document.querySelectorAll('[data-test=detail-rank] [data-test=node-ref]')];
             return r.length === 2 ? r.map(a => a.getAttribute('title')) : null;",
            vec![],
        )
        .await;
    let nodes: Vec<Value> = done["placement"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["node"].clone())
        .collect();
    assert_eq!(ranks, json!(nodes), "{done}");

    // Audit: filters by actor, action and time.
    b.open("#/audit?action=policy.put", "audit").await;
    let actions = b
        .js(
            "return [...new Set([...document.querySelectorAll('[data-test=audit-row]')].map(r => r.getAttribute('data-action')))];",
            vec![],
        )
        .await;
    assert_eq!(actions, json!(["policy.put"]), "{actions}");
    let future = in_secs(3600);
    b.open(&format!("#/audit?from={future}"), "audit").await;
    assert_eq!(b.count("[data-test=audit-row]").await, 0);
    b.el("[data-test=audit-empty]").await;
    b.open("#/audit?actor=nobody-at-all", "audit").await;
    assert_eq!(b.count("[data-test=audit-row]").await, 0);
    b.open("#/audit?actor=admin", "audit").await;
    assert!(b.count("[data-test=audit-row]").await >= 2);
    b.screenshot("audit-filtered", 1440, 900).await;
    b.open("#/catalogue", "catalogue").await;
    let pools = b
        .js(
            "return document.querySelectorAll('[data-test=pool-row]').length;",
            vec![],
        )
        .await;
    assert!(
        pools.as_u64() > Some(3),
        "pools on the catalogue page: {pools}"
    );
    b.open("#/overview", "overview").await;
    let budgets = b
        .js("return [...document.querySelectorAll('[data-test=budget-row]')].map(r => r.getAttribute('data-team'));", vec![])
        .await;
    assert!(
        budgets.as_array().unwrap().contains(&json!("ml")),
        "{budgets}"
    );
    let util = b
        .js(
            "return document.querySelectorAll('[data-test=util-row]').length;",
            vec![],
        )
        .await;
    assert!(util.as_u64() >= Some(1), "{util}");
    // Budget alerts are spelled out, not only coloured: on the overview and the policy.
    assert_eq!(
        b.text_of("[data-test=budget-row][data-team=vision] [data-test=budget-alerts]")
            .await
            .as_deref(),
        Some("50%, 90% alerts crossed")
    );
    assert_eq!(
        b.count("[data-test=budget-row][data-team=ml] [data-test=budget-alerts]")
            .await,
        0,
        "ml's budget crossed no threshold"
    );
    b.open("#/policies/vision", "policies").await;
    let alerts = b
        .text_of("[data-test=policy-budget-alerts]")
        .await
        .unwrap_or_default();
    assert!(alerts.contains("50%, 90% alerts crossed"), "{alerts:?}");
    b.open("#/spend", "spend").await;
    b.el("[data-test=chart-team]").await;
    b.el("[data-test=chart-cumulative]").await;

    // The CSV download: the button's link carries the file the API wrote for this session.
    // The test keeps the blob the page makes and stops the download itself.
    b.js(
        "window.__syCsv = null;
         const blobs = new Map();
         const make = URL.createObjectURL;
         URL.createObjectURL = function (obj) {
           const url = make.call(URL, obj);
           if (obj instanceof Blob) blobs.set(url, obj.text());
           return url;
         };
         document.addEventListener('click', (ev) => {
           const a = ev.target.closest && ev.target.closest('a[data-test=spend-csv-link]');
           if (!a) return;
           ev.preventDefault();
           const got = { href: a.getAttribute('href'), download: a.getAttribute('download') };
           Promise.resolve(blobs.get(got.href)).then((t) => { got.text = t === undefined ? null : t; window.__syCsv = got; });
         }, true);
         return true;",
        vec![],
    )
    .await;
    b.el("[data-test=spend-csv-group]")
        .await
        .select_by_value("team")
        .await
        .unwrap();
    b.el("[data-test=spend-csv]").await.click().await.unwrap();
    let got = b
        .until("the CSV download", WAIT, "return window.__syCsv;", vec![])
        .await;
    assert!(got["href"].as_str().unwrap().starts_with("blob:"), "{got}");
    assert_eq!(got["download"], "switchyard-spend-by-team.csv");
    let downloaded = parse_spend_csv(got["text"].as_str().unwrap(), "team");
    let total: i64 = downloaded.iter().map(|(_, m, _)| m).sum();
    assert_eq!(
        total,
        usd_micros(&spend["total_usd"]),
        "the CSV's rows add up to the spend API's total: {downloaded:?} {spend}"
    );
    let cash: i64 = downloaded.iter().map(|(_, _, c)| c).sum();
    assert_eq!(
        cash,
        usd_micros(&spend["total_cash_usd"]),
        "and their cash to its cash total: {downloaded:?} {spend}"
    );
    for team in ["ml", "vision"] {
        assert!(
            downloaded.iter().any(|(k, m, _)| k == team && *m > 0),
            "{team} in the CSV: {downloaded:?}"
        );
    }
    // The same report over HTTP with the browser's session cookie (no bearer token).
    let cookies = b.client.get_all_cookies().await.unwrap();
    let session = cookies
        .iter()
        .find(|c| c.name() == "sy_session")
        .expect("the session cookie");
    assert_eq!(session.http_only(), Some(true), "{session:?}");
    let res = reqwest::Client::new()
        .get(format!("{}/api/v1/spend?group_by=team", up.url))
        .header("cookie", format!("sy_session={}", session.value()))
        .header("accept", "text/csv")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/csv"),
        "{:?}",
        res.headers()
    );
    let by_cookie = parse_spend_csv(&res.text().await.unwrap(), "team");
    assert_eq!(
        by_cookie.iter().map(|(_, m, _)| m).sum::<i64>(),
        usd_micros(&spend["total_usd"]),
        "{by_cookie:?}"
    );
    b.assert_no_errors("after downloading the CSV").await;

    // The jobs page filters by priority (through the API's `priority` parameter).
    b.open("#/jobs?priority=high", "jobs").await;
    let shown = b
        .js(
            "return [...document.querySelectorAll('[data-test=job-row]')].map(r => r.getAttribute('data-job-id'));",
            vec![],
        )
        .await;
    assert_eq!(shown, json!([ids[1]]), "high-priority jobs");

    // Infra's (and admin's) pool editor: the on-prem internal rate, saved and audited.
    b.open("#/catalogue", "catalogue").await;
    let pool = "onprem:local-dc1/sim-h100x4";
    edit_pool(&b, pool, "pool-price-input", "1.75", "pool-price", "$1.75").await;
    let (_, audit) = rest(
        &up.url,
        &up.token,
        reqwest::Method::GET,
        "/api/v1/audit",
        None,
    )
    .await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["action"] == "pool.patch"),
        "{audit}"
    );
    // Finance's figure beside it (issue 29): the pool's marginal cost, shown as its cash rate.
    edit_pool(&b, pool, "pool-marginal-input", "0.2", "pool-cash", "$0.20").await;
    b.assert_no_errors("after editing a pool").await;

    // A developer sees only their team and no editing controls.
    let (status, created) = rest(
        &up.url,
        &up.token,
        reqwest::Method::POST,
        "/api/v1/tokens",
        Some(json!({"role": "developer", "team": "ml", "name": "dev"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let dev = created["token"].as_str().unwrap().to_string();
    b.open("#/overview", "overview").await;
    b.el("[data-test=logout]").await.click().await.unwrap();
    b.el("[data-test=login-token]").await;
    b.sign_in(&dev).await;
    let nav = b.el("[data-test=nav]").await.text().await.unwrap();
    assert!(
        !nav.contains("Audit") && !nav.contains("Instances"),
        "{nav}"
    );
    b.open("#/jobs", "jobs").await;
    let teams = b
        .js("return [...document.querySelectorAll('[data-test=job-row]')].map(r => r.children[1].textContent);", vec![])
        .await;
    assert!(
        teams.as_array().unwrap().iter().all(|t| t == "ml"),
        "{teams}"
    );
    b.open("#/policies/ml", "policies").await;
    let controls = b
        .js("return document.querySelectorAll('[data-test=policy-save], [data-test=whatif-run]').length;", vec![])
        .await;
    assert_eq!(
        controls,
        json!(0),
        "a developer gets no policy editing controls"
    );
    b.screenshot("policies-developer", 1440, 900).await;
    // Another team's policy, and a page hidden from the role: said in words.
    b.open("#/policies/vision", "policies").await;
    let hidden = b
        .text_of("[data-test=not-visible]")
        .await
        .unwrap_or_default();
    assert!(hidden.contains("not visible to your role"), "{hidden:?}");
    assert!(
        !b.text_of("[data-test=page-policies]")
            .await
            .unwrap_or_default()
            .contains("no policy yet")
    );
    b.screenshot("policies-other-team-developer", 1440, 900)
        .await;
    for page in ["audit", "instances"] {
        b.open(&format!("#/{page}"), page).await;
        let hidden = b
            .text_of("[data-test=not-visible]")
            .await
            .unwrap_or_default();
        assert!(hidden.contains("not visible to your role"), "{hidden:?}");
        b.screenshot(&format!("{page}-developer"), 1440, 900).await;
    }
    // Every page a developer has, shot.
    for (name, route) in [
        ("overview", "#/overview"),
        ("catalogue", "#/catalogue"),
        ("jobs", "#/jobs"),
        ("job-detail", &*format!("#/jobs/{}", ids[0])),
        ("spend", "#/spend"),
        ("node", &*node_route),
    ] {
        let page = match name {
            "job-detail" => "jobs",
            "node" => "nodes",
            other => other,
        };
        b.open(route, page).await;
        b.screenshot(&format!("{name}-developer"), 1440, 900).await;
    }
    b.assert_no_errors("as a developer").await;
}

/// Opens `pool`'s editor on the catalogue page, types `value` into its `input` field, saves,
/// and waits for the pool's row to show `shown` in its `cell`.
async fn edit_pool(b: &Browser, pool: &str, input: &str, value: &str, cell: &str, shown: &str) {
    let row = b
        .el(&format!("[data-test=pool-row][data-pool=\"{pool}\"]"))
        .await;
    row.find(Locator::Css("[data-test=pool-edit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let field = b
        .el(&format!("[data-test=pool-editor] [data-test={input}]"))
        .await;
    field.clear().await.unwrap();
    field.send_keys(value).await.unwrap();
    b.el("[data-test=pool-save]").await.click().await.unwrap();
    b.until(
        &format!("{shown} in {pool}'s {cell}"),
        WAIT,
        "const r = document.querySelector('[data-test=pool-row][data-pool=\"' + arguments[0] + '\"] [data-test=' + arguments[1] + ']');
         return r && r.textContent === arguments[2];",
        vec![json!(pool), json!(cell), json!(shown)],
    )
    .await;
}

/// Types `text` into the field `path` of the open policy form, replacing what it held.
async fn type_into(b: &Browser, path: &str, text: &str) {
    let input = b
        .el(&format!(
            "[data-test=policy-form] [data-test=\"field-{path}\"]"
        ))
        .await;
    input.clear().await.unwrap();
    input.send_keys(text).await.unwrap();
}

/// The visible error texts next to the policy form's fields, by field.
async fn field_errors(b: &Browser) -> Value {
    b.js(
        "const out = {};
         for (const e of document.querySelectorAll('[data-test=policy-form] .field-error')) {
           if (e.hidden || !e.textContent) continue;
           const f = e.closest('[data-field]');
           out[f ? f.getAttribute('data-field') : '?'] = e.textContent;
         }
         return out;",
        vec![],
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_policy_edit_is_refused_whole_and_leaving_unsaved_edits_asks_first() {
    let broker = Broker::start().await;
    let Some(b) = Browser::start(&broker.url).await else {
        return;
    };
    let saved = json!({"budget": {"amount_usd": 500.0, "period": "month", "enforcement": "hard", "alert_at": [0.5, 0.9]},
                       "max_price_per_gpu_hour": 3.0, "allowed_providers": ["onprem"]});
    put_policy(&broker.url, &broker.admin, "ml", saved.clone()).await;
    b.sign_in(&broker.admin).await;
    b.probe_console_log().await;
    b.open("#/policies/ml", "policies").await;
    b.el("[data-test=policy-diff-empty]").await;

    // Three bad fields at once: each is flagged next to itself, with the valid values.
    type_into(&b, "budget.amount_usd", "-3").await;
    type_into(&b, "max_price_per_gpu_hour", "abc").await;
    type_into(&b, "allowed_providers", "awss").await;
    b.el("[data-test=policy-save]").await.click().await.unwrap();
    b.until(
        "the refusal",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-refused') === '3';",
        vec![],
    )
    .await;
    let errors = field_errors(&b).await;
    let text = |f: &str| errors[f].as_str().unwrap_or_default().to_string();
    assert!(text("budget.amount_usd").contains("at least 0"), "{errors}");
    assert!(
        text("max_price_per_gpu_hour").contains("\"abc\"")
            && text("max_price_per_gpu_hour").contains("more than 0"),
        "{errors}"
    );
    assert!(
        text("allowed_providers").contains("\"awss\"")
            && text("allowed_providers").contains("onprem"),
        "{errors}"
    );
    assert_eq!(errors.as_object().unwrap().len(), 3, "{errors}");
    // The draft's diff against the saved version shows what the save would change.
    let diff = b
        .until(
            "the draft's diff",
            WAIT,
            "const rows = [...document.querySelectorAll('[data-test=diff-row]')];
             return rows.length ? rows.map(r => r.getAttribute('data-field')).sort() : null;",
            vec![],
        )
        .await;
    assert_eq!(
        diff,
        json!([
            "allowed_providers",
            "budget.amount_usd",
            "max_price_per_gpu_hour"
        ]),
        "{diff}"
    );
    b.screenshot("policies-errors", 1440, 900).await;
    // What-if refuses the same draft, also without asking the broker.
    b.el("[data-test=whatif-run]").await.click().await.unwrap();
    b.until(
        "the what-if's refusal",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-refused') === '3';",
        vec![],
    )
    .await;
    // Nothing was saved: the same version and body over REST.
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(now["version"], json!(1), "{now}");
    assert_eq!(now["policy"], saved, "{now}");
    b.assert_no_errors("after the refused save").await;

    // Leaving with unsaved edits asks first: a reload or closing the tab, and in-app links.
    let blocked = b
        .js(
            "const e = new Event('beforeunload', { cancelable: true });
             window.dispatchEvent(e);
             return e.defaultPrevented;",
            vec![],
        )
        .await;
    assert_eq!(blocked, json!(true), "beforeunload is held back");
    b.el("[data-test=nav-jobs]").await.click().await.unwrap();
    b.el("[data-test=unsaved-bar]").await;
    assert_eq!(
        b.js("return location.hash;", vec![]).await,
        json!("#/policies/ml")
    );
    assert_eq!(b.count("[data-test=page-policies]").await, 1);
    b.screenshot("policies-unsaved", 1440, 900).await;
    b.el("[data-test=unsaved-stay]")
        .await
        .click()
        .await
        .unwrap();
    assert_eq!(b.count("[data-test=unsaved-bar]").await, 0);
    assert_eq!(
        b.js(
            "return document.querySelector('[data-test=\"field-max_price_per_gpu_hour\"]').value;",
            vec![]
        )
        .await,
        json!("abc"),
        "staying keeps the edits"
    );

    // Fixed: the diff shows the one change, and saving stores it with every other rule kept.
    type_into(&b, "budget.amount_usd", "500").await;
    type_into(&b, "max_price_per_gpu_hour", "2.5").await;
    type_into(&b, "allowed_providers", "onprem").await;
    let diff = b
        .until(
            "the diff of the fixed draft",
            WAIT,
            "const rows = [...document.querySelectorAll('[data-test=diff-row]')];
             return rows.length === 1 ? rows[0].getAttribute('data-field') + ': ' + rows[0].textContent : null;",
            vec![],
        )
        .await;
    assert!(
        diff.as_str()
            .unwrap()
            .starts_with("max_price_per_gpu_hour: ")
            && diff.as_str().unwrap().contains("3")
            && diff.as_str().unwrap().contains("2.5"),
        "{diff}"
    );
    b.el("[data-test=policy-save]").await.click().await.unwrap();
    b.until(
        "the fixed policy to be saved",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-version') === '2';",
        vec![],
    )
    .await;
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    let mut want = saved.clone();
    want["max_price_per_gpu_hour"] = json!(2.5);
    assert_eq!(now["policy"], want, "{now}");

    // The utilization rule (issue 28): off until ticked; bad values are refused next to their
    // fields; good ones are saved as the policy's `utilization` section.
    assert_eq!(
        b.js(
            "return document.querySelector('[data-test=\"field-utilization.enabled\"]').checked;",
            vec![]
        )
        .await,
        json!(false)
    );
    b.el("[data-test=\"field-utilization.enabled\"]")
        .await
        .click()
        .await
        .unwrap();
    type_into(&b, "utilization.min_gpu_utilization_pct", "0").await;
    type_into(&b, "utilization.window_s", "30").await;
    b.el("[data-test=policy-save]").await.click().await.unwrap();
    b.until(
        "the utilization rule's refusal",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-refused') === '2';",
        vec![],
    )
    .await;
    let errors = field_errors(&b).await;
    let text = |f: &str| errors[f].as_str().unwrap_or_default().to_string();
    assert!(
        text("utilization.min_gpu_utilization_pct").contains("1 to 100"),
        "{errors}"
    );
    assert!(
        text("utilization.window_s").contains("60 to 604800"),
        "{errors}"
    );
    type_into(&b, "utilization.min_gpu_utilization_pct", "20").await;
    type_into(&b, "utilization.window_s", "600").await;
    b.el("[data-test=policy-form] [data-test=\"field-utilization.action\"]")
        .await
        .select_by_value("stop")
        .await
        .unwrap();
    b.el("[data-test=\"field-utilization.exempt_priorities.critical\"]")
        .await
        .click()
        .await
        .unwrap();
    b.screenshot("policies-utilization", 1440, 900).await;
    b.el("[data-test=policy-save]").await.click().await.unwrap();
    b.until(
        "the utilization rule to be saved",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-version') === '3';",
        vec![],
    )
    .await;
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(
        now["policy"]["utilization"],
        json!({"min_gpu_utilization_pct": 20, "window_s": 600, "action": "stop",
               "exempt_priorities": ["critical"]}),
        "{now}"
    );
    assert_eq!(now["policy"]["max_price_per_gpu_hour"], json!(2.5), "{now}");
    // Its what-if says what the rule would have done (nothing recorded here: none acted on).
    b.el("[data-test=whatif-run]").await.click().await.unwrap();
    let summary = b
        .until(
            "the what-if's idle GPUs",
            WAIT,
            "const e = document.querySelector('[data-test=whatif-waste-summary]');
             return e ? e.textContent : null;",
            vec![],
        )
        .await;
    assert!(
        summary
            .as_str()
            .unwrap()
            .contains("would have been acted on (stop)"),
        "{summary}"
    );
    // Saved: leaving asks nothing.
    b.el("[data-test=nav-jobs]").await.click().await.unwrap();
    b.ready("jobs").await;
    assert_eq!(b.count("[data-test=unsaved-bar]").await, 0);

    // Edits, then leaving and discarding: the edits are dropped, nothing is saved.
    b.open("#/policies/ml", "policies").await;
    type_into(&b, "max_price_per_gpu_hour", "9").await;
    b.el("[data-test=nav-audit]").await.click().await.unwrap();
    b.el("[data-test=unsaved-discard]")
        .await
        .click()
        .await
        .unwrap();
    b.ready("audit").await;
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(now["version"], json!(3), "{now}");
    b.assert_no_errors("after leaving the policy page").await;

    // What placement minimises (issue 29): the team's own bill instead of the company's cash.
    b.open("#/policies/ml", "policies").await;
    b.el("[data-test=policy-form] [data-test=\"field-objective\"]")
        .await
        .select_by_value("team")
        .await
        .unwrap();
    b.el("[data-test=policy-save]").await.click().await.unwrap();
    b.until(
        "the objective to be saved",
        WAIT,
        "const s = document.querySelector('[data-test=policy-status]');
         return s && s.getAttribute('data-version') === '4';",
        vec![],
    )
    .await;
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/ml", None)
        .await;
    assert_eq!(now["policy"]["objective"], "team", "{now}");
    b.assert_no_errors("after choosing the objective").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_what_if_under_a_tiny_hard_budget_holds_what_the_live_broker_held() {
    let mut broker = Broker::start().await;
    let Some(b) = Browser::start(&broker.url).await else {
        return;
    };
    broker.start_agent("whatif-a1", 4).await;
    // Live: a one-cent hard budget holds team research's job (an hour on $2/GPU-hour).
    let tiny = json!({"budget": {"amount_usd": 0.01, "period": "month", "enforcement": "hard"}});
    put_policy(&broker.url, &broker.admin, "research", tiny).await;
    let id = broker
        .submit(
            json!({"name": "replayed", "team": "research", "command": ["sleep", "1"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 3600}),
        )
        .await;
    broker
        .wait_state(&id, &["held"], Duration::from_secs(30))
        .await;
    // Then the budget goes: the job runs and finishes.
    put_policy(
        &broker.url,
        &broker.admin,
        "research",
        json!({"max_price_per_gpu_hour": 100.0}),
    )
    .await;
    broker
        .wait_state(&id, &["succeeded"], Duration::from_secs(60))
        .await;

    // The console's what-if with that same budget as a draft holds that same job.
    b.sign_in(&broker.admin).await;
    b.open("#/policies/research", "policies").await;
    b.el("[data-test=\"field-budget.enabled\"]")
        .await
        .click()
        .await
        .unwrap();
    type_into(&b, "budget.amount_usd", "0.01").await;
    b.el("[data-test=policy-form] [data-test=\"field-budget.enforcement\"]")
        .await
        .select_by_value("hard")
        .await
        .unwrap();
    b.el("[data-test=whatif-run]").await.click().await.unwrap();
    let change = b
        .until(
            "the what-if's list of changed jobs",
            Duration::from_secs(60),
            "const t = document.querySelector('[data-test=whatif-changes]');
             if (!t) return null;
             return [...document.querySelectorAll('[data-test=whatif-change]')]
               .map(r => [r.getAttribute('data-job-id'), r.getAttribute('data-change')]);",
            vec![],
        )
        .await;
    assert!(
        change
            .as_array()
            .unwrap()
            .contains(&json!([id.clone(), "held"])),
        "the draft holds the job the live broker held: {change}; the what-if showed: {}",
        b.text_of("[data-test=whatif-result]")
            .await
            .unwrap_or_default()
    );
    let held = b
        .text_of("[data-test=whatif-row][data-metric=held_jobs] [data-test=whatif-draft]")
        .await;
    assert_eq!(held.as_deref(), Some("1"));
    b.el("[data-test=whatif-chart]").await;
    b.screenshot("policies-whatif-budget", 1440, 900).await;
    // Nothing saved.
    let (_, now) = broker
        .call(reqwest::Method::GET, "/api/v1/policies/research", None)
        .await;
    assert_eq!(now["version"], json!(2), "{now}");
    b.assert_no_errors("after the what-if").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_burst_jobs_cost_stays_fixed_while_its_instance_idles() {
    let up = Up::start(
        &[
            "--agents",
            "1",
            "--idle-ttl",
            "6s",
            "--boot-delay",
            "1s",
            "--billing-minimum",
            "0s",
        ],
        4,
    )
    .await;
    let Some(b) = Browser::start(&up.url).await else {
        return;
    };
    // On-prem full for two hours (as the planner sees it); a job due in 15 minutes bursts.
    let filler = up
        .submit(json!({"name": "filler", "team": "ml", "command": ["sleep", "3031"], "resources": {"gpus": 4},
                       "estimated_runtime_s": 7200, "regions": ["onprem:local-dc1"]}))
        .await;
    up.job_where(&filler, 30, |j| j["state"] == "running").await;
    let urgent = up
        .submit(json!({"name": "urgent", "team": "ml", "command": ["echo", "ran in the cloud"],
                       "resources": {"gpus": 1}, "estimated_runtime_s": 60, "deadline": in_secs(900)}))
        .await;
    let job = up
        .job_where(&urgent, 60, |j| {
            j["state"] == "succeeded" || j["state"] == "failed"
        })
        .await;
    assert_eq!(job["state"], "succeeded", "{job}");

    b.sign_in(&up.token).await;
    b.open(&format!("#/jobs/{urgent}"), "jobs").await;
    let first = b
        .until(
            "the job's cost",
            WAIT,
            "const e = document.querySelector('[data-test=detail-cost]'); return e && e.textContent;",
            vec![],
        )
        .await;
    let first = first.as_str().unwrap().to_string();
    assert!(first.starts_with('$'), "{first}");
    let rest_first = up.get(&format!("/api/v1/jobs/{urgent}")).await["cost_usd"].clone();
    // The round that chose to launch is shown, with dates (no epoch milliseconds).
    b.el("[data-test=launch-round] [data-test=launch-candidate-row]")
        .await;
    let detail = b.el("[data-test=job-detail]").await.text().await.unwrap();
    assert_no_raw_numbers(&detail);
    let estimate = b
        .text_of("[data-test=detail-estimate]")
        .await
        .unwrap_or_default();
    assert!(estimate.contains("estimate $"), "{estimate:?}");
    b.screenshot("job-detail-burst", 1440, 900).await;

    // The instance idles, then is released; the finished job's cost does not move.
    let inst = eventually(
        "the idle instance to end",
        Duration::from_secs(60),
        || async {
            let i = up
                .instances()
                .await
                .into_iter()
                .find(|i| i["for_job"] == urgent.as_str())?;
            (i["state"] == "terminated").then_some(i)
        },
    )
    .await;
    assert!(inst["cost_usd"].as_f64().unwrap() > 0.0, "{inst}");
    b.open(&format!("#/jobs/{urgent}"), "jobs").await;
    let later = b
        .until(
            "the job's cost again",
            WAIT,
            "const e = document.querySelector('[data-test=detail-cost]'); return e && e.textContent;",
            vec![],
        )
        .await;
    assert_eq!(
        later.as_str().unwrap(),
        first,
        "a finished job's cost stays fixed"
    );
    assert_eq!(
        up.get(&format!("/api/v1/jobs/{urgent}")).await["cost_usd"],
        rest_first
    );

    // The instance's idle and boot time is the team's own line on the Spend page.
    b.open("#/spend", "spend").await;
    let usage = b
        .until(
            "spend split by usage",
            WAIT,
            "const rows = [...document.querySelectorAll('[data-test=usage-row]')];
             return rows.length ? Object.fromEntries(rows.map(r => [r.getAttribute('data-key'),
               [r.children[0].textContent, r.querySelector('[data-test=usage-amount]').textContent]])) : null;",
            vec![],
        )
        .await;
    assert_eq!(usage["instance_idle"][0], "instance idle", "{usage}");
    assert_eq!(usage["instance_boot"][0], "instance boot", "{usage}");
    assert_ne!(usage["instance_idle"][1], "$0.00", "{usage}");
    b.screenshot("spend-usage", 1440, 900).await;

    // The instances page: the provider's own id, uptime and cost to date.
    b.open("#/instances?ended=1", "instances").await;
    let row = b
        .until(
            "the instance row",
            WAIT,
            "const r = document.querySelector('[data-test=instance-row][data-instance=\"' + arguments[0] + '\"]');
             return r ? [r.querySelector('[data-test=instance-provider-id]').textContent,
                         r.querySelector('[data-test=instance-uptime]').textContent,
                         r.querySelector('[data-test=instance-cost]').textContent] : null;",
            vec![inst["id"].clone()],
        )
        .await;
    assert_eq!(row[0], inst["provider_id"], "{row} {inst}");
    assert!(
        row[1].as_str().unwrap().ends_with(" s") || row[1].as_str().unwrap().ends_with(" min"),
        "{row}"
    );
    assert!(row[2].as_str().unwrap().starts_with('$'), "{row}");
    b.screenshot("instances-burst", 1440, 900).await;
    b.assert_no_errors("on the burst's pages").await;
}

/// A service replica: an HTTP server on `$PORT` that answers every GET with 200.
const REPLICA: &str = r#"
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"#;

/// Deploys a service over REST; returns its view.
async fn deploy(up: &Up, spec: Value) -> Value {
    let (status, created) = rest(
        &up.url,
        &up.token,
        reqwest::Method::POST,
        "/api/v1/services",
        Some(spec),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    created
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_services_page_shows_replicas_by_region_charts_and_events() {
    // One on-prem agent (4 GPUs): a service of five one-GPU replicas spills to a cloud region.
    let up = Up::start(&["--agents", "1", "--boot-delay", "1s"], 4).await;
    let Some(b) = Browser::start(&up.url).await else {
        return;
    };
    let replica = |name: &str, team: &str, min: i64| {
        json!({"name": name, "team": team, "command": ["python3", "-c", REPLICA],
               "resources": {"gpus": 1}, "priority": "high",
               "replicas": {"min": min, "max": min + 1},
               // Targets no test traffic comes near: the desired count stays at the minimum.
               "scaling": {"target_p95_latency_ms": 2000, "window_s": 20},
               "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 2}})
    };
    let chat = deploy(&up, replica("chat", "ml", 5)).await;
    let chat_id = chat["id"].as_str().unwrap().to_string();
    let mut edge_spec = replica("edge", "vision", 1);
    edge_spec["regions"] = json!(["lambda:us-east-1"]);
    let edge = deploy(&up, edge_spec).await;
    let edge_id = edge["id"].as_str().unwrap().to_string();
    let chat = eventually(
        "five ready replicas of chat",
        Duration::from_secs(90),
        || async {
            let s = up.get(&format!("/api/v1/services/{chat_id}")).await;
            let ready = s["replicas"]
                .as_array()?
                .iter()
                .filter(|r| r["state"] == "ready")
                .count();
            (ready == 5 && s["state"] == "ready").then_some(s)
        },
    )
    .await;
    let regions: std::collections::BTreeSet<&str> = chat["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["region"].as_str())
        .collect();
    assert!(regions.len() >= 2, "chat should span regions: {chat}");
    let reason = chat["desired_reason"].as_str().unwrap().to_string();
    assert!(reason.contains("at least 5"), "{reason}");
    eventually("edge ready", Duration::from_secs(60), || async {
        let s = up.get(&format!("/api/v1/services/{edge_id}")).await;
        (s["state"] == "ready").then_some(())
    })
    .await;

    // Calls through the gateway, a few a second, while the page watches.
    let endpoint = chat["endpoint"].as_str().unwrap().to_string();
    let caller = {
        let http = up.http.clone();
        let token = up.token.clone();
        tokio::spawn(async move {
            let mut ok = 0;
            for _ in 0..200 {
                if let Ok(r) = http.get(&endpoint).bearer_auth(&token).send().await {
                    ok += u32::from(r.status().is_success());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ok
        })
    };

    b.sign_in(&up.token).await;
    b.probe_console_log().await;
    let nav = b.el("[data-test=nav-services]").await;
    nav.click().await.unwrap();
    b.ready("services").await;

    // The list: both services (the admin sees every team), chat's replicas and why.
    let row = b
        .until(
            "chat's row with its five ready replicas",
            WAIT,
            "const r = document.querySelector('[data-test=service-row][data-service-id=\"' + arguments[0] + '\"]');
             if (!r || !r.querySelector('[data-test=service-replicas]').textContent.startsWith('5 / 5')) return null;
             return { state: r.getAttribute('data-state'), team: r.getAttribute('data-team'),
                      reason: r.querySelector('[data-test=service-reason]').textContent,
                      p95: r.querySelector('[data-test=service-p95]').textContent };",
            vec![json!(chat_id)],
        )
        .await;
    assert_eq!(row["state"], "ready", "{row}");
    assert_eq!(row["team"], "ml", "{row}");
    assert_eq!(row["reason"], json!(reason), "{row}");
    assert!(
        row["p95"].as_str().unwrap().ends_with("/ 2000 ms"),
        "p95 against its target: {row}"
    );
    assert_eq!(
        b.count(&format!(
            "[data-test=service-row][data-service-id=\"{edge_id}\"]"
        ))
        .await,
        1
    );
    b.screenshot("services-desktop", 1440, 900).await;

    // The detail: every replica under its region with its pool, node and market.
    b.el(&format!(
        "[data-test=service-row][data-service-id=\"{chat_id}\"] [data-test=service-link]"
    ))
    .await
    .click()
    .await
    .unwrap();
    b.ready("services").await;
    b.el(&format!(
        "[data-test=service-detail][data-service-id=\"{chat_id}\"]"
    ))
    .await;
    let shown = b
        .until(
            "five replica rows",
            WAIT,
            "const rows = [...document.querySelectorAll('[data-test=service-replica]')];
             if (rows.filter(r => r.getAttribute('data-state') === 'ready').length !== 5) return null;
             return rows.map(r => ({ id: r.getAttribute('data-job-id'),
               group: r.closest('[data-test=service-region]').getAttribute('data-region'),
               pool: r.querySelector('[data-test=replica-pool]').textContent,
               node: r.querySelector('[data-test=node-ref]').getAttribute('data-node') }));",
            vec![],
        )
        .await;
    let view = up.get(&format!("/api/v1/services/{chat_id}")).await;
    for r in view["replicas"].as_array().unwrap() {
        let row = shown
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == r["job_id"])
            .unwrap_or_else(|| panic!("replica {} not shown: {shown}", r["job_id"]));
        assert_eq!(row["group"], r["region"], "{row} {r}");
        assert_eq!(row["pool"], r["pool"], "{row} {r}");
        assert_eq!(row["node"], r["node"], "{row} {r}");
    }
    assert_eq!(
        b.count("[data-test=service-region]").await,
        regions.len() as u64,
        "one group per region: {regions:?}"
    );
    let desired = b
        .text_of("[data-test=service-desired-reason]")
        .await
        .unwrap_or_default();
    assert_eq!(desired, reason);
    assert_eq!(
        b.text_of("[data-test=service-endpoint]").await.as_deref(),
        view["endpoint"].as_str()
    );
    assert_eq!(
        b.text_of("[data-test=service-version]").await.as_deref(),
        Some("1")
    );

    // The charts: kept in the page since it opened, drawn as SVG, the p95 against its target.
    for chart in [
        "service-chart-rps",
        "service-chart-p95",
        "service-chart-replicas",
    ] {
        b.el(&format!("svg[data-test={chart}]")).await;
    }
    let target = b
        .js(
            "const l = document.querySelector('svg[data-test=service-chart-p95] [data-test=service-p95-target]');
             return l ? [l.getAttribute('data-value'), l.textContent] : null;",
            vec![],
        )
        .await;
    assert_eq!(target, json!(["2000", "target 2000 ms"]));
    let lines = b
        .until(
            "lines of several samples: rps, p95, desired and ready replicas",
            Duration::from_secs(30),
            "const pts = (chart, key) => { const p = document.querySelector('svg[data-test=' + chart + '] [data-test=service-line-' + key + ']');
               return p ? Number(p.getAttribute('data-points') || 1) : 0; };
             const v = { rps: pts('service-chart-rps', 'rps'), p95: pts('service-chart-p95', 'p95'),
               desired: pts('service-chart-replicas', 'desired'), ready: pts('service-chart-replicas', 'ready'),
               samples: Number(document.querySelector('svg[data-test=service-chart-rps]').getAttribute('data-samples')) };
             return Object.values(v).every(n => n >= 3) ? v : null;",
            vec![],
        )
        .await;
    // Every sample is one poll: the history grows while the page stays open.
    let later = b
        .until(
            "more samples",
            Duration::from_secs(15),
            "const n = Number(document.querySelector('svg[data-test=service-chart-rps]').getAttribute('data-samples'));
             return n > arguments[0] ? n : null;",
            vec![lines["samples"].clone()],
        )
        .await;
    assert!(
        later.as_u64() > lines["samples"].as_u64(),
        "{later} {lines}"
    );
    let legend = b
        .text_of("svg[data-test=service-chart-replicas] + .legend [data-test=legend-desired]")
        .await
        .unwrap_or_default();
    assert_eq!(legend, "desired 5");
    let note = b
        .text_of("[data-test=service-charts] h2")
        .await
        .unwrap_or_default();
    assert_eq!(note, "Since this page opened");

    // The events: every one the broker has, newest first.
    let events = up
        .get(&format!("/api/v1/services/{chat_id}/events?limit=1000"))
        .await;
    let mut want: Vec<i64> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    want.reverse();
    let shown = b
        .until(
            "the events, newest first",
            WAIT,
            "const ids = [...document.querySelectorAll('[data-test=service-event]')].map(r => Number(r.getAttribute('data-event-id')));
             return ids.length >= arguments[0] ? ids : null;",
            vec![json!(want.len())],
        )
        .await;
    let shown: Vec<i64> = serde_json::from_value(shown).unwrap();
    assert_eq!(&shown[shown.len() - want.len()..], &want[..]);
    assert!(shown.windows(2).all(|w| w[0] > w[1]), "{shown:?}");
    let kinds = b
        .js(
            "return [...document.querySelectorAll('[data-test=service-event]')].map(r => r.getAttribute('data-kind'));",
            vec![],
        )
        .await;
    for kind in ["deployed", "replica_started", "replica_ready"] {
        assert!(kinds.as_array().unwrap().contains(&json!(kind)), "{kinds}");
    }
    let text = b
        .el("[data-test=service-detail]")
        .await
        .text()
        .await
        .unwrap();
    assert_no_raw_numbers(&text);
    b.screenshot("service-detail-desktop", 1440, 900).await;
    b.set_width(390, 844).await;
    b.open(&format!("#/services/{chat_id}"), "services").await;
    b.el("svg[data-test=service-chart-p95]").await;
    b.assert_fits("the service at phone width").await;
    b.screenshot("service-detail-phone", 390, 844).await;
    b.open("#/services", "services").await;
    b.el("[data-test=service-row]").await;
    b.assert_fits("the services at phone width").await;
    b.screenshot("services-phone", 390, 844).await;
    b.set_width(1440, 900).await;
    b.assert_no_errors("on the services pages").await;
    assert!(
        caller.await.unwrap() > 100,
        "calls through the gateway failed"
    );

    // A developer of ml sees ml's service only, and another team's is not found.
    let (status, created) = rest(
        &up.url,
        &up.token,
        reqwest::Method::POST,
        "/api/v1/tokens",
        Some(json!({"role": "developer", "team": "ml", "name": "dev"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    b.el("[data-test=logout]").await.click().await.unwrap();
    b.el("[data-test=login-token]").await;
    b.sign_in(created["token"].as_str().unwrap()).await;
    b.open("#/services", "services").await;
    b.el(&format!(
        "[data-test=service-row][data-service-id=\"{chat_id}\"]"
    ))
    .await;
    let teams = b
        .js(
            "return [...document.querySelectorAll('[data-test=service-row]')].map(r => r.getAttribute('data-team'));",
            vec![],
        )
        .await;
    assert_eq!(teams, json!(["ml"]));
    b.screenshot("services-developer", 1440, 900).await;
    b.open(&format!("#/services/{edge_id}"), "services").await;
    let error = b
        .text_of("[data-test=service-error]")
        .await
        .unwrap_or_default();
    assert!(error.starts_with("No service"), "{error:?}");
    // The browser logs the refused read; nothing else may be logged meanwhile.
    b.expect_logged("the other team's service refused", |e| {
        e.contains(&edge_id) && e.contains("404")
    })
    .await;

    // The developer deletes the service from its page: it drains and reads stopped.
    b.open(&format!("#/services/{chat_id}"), "services").await;
    b.el("[data-test=service-delete]")
        .await
        .click()
        .await
        .unwrap();
    b.el("[data-test=service-delete-confirm]")
        .await
        .click()
        .await
        .unwrap();
    b.until(
        "the service to read stopped",
        WAIT,
        "const d = document.querySelector('[data-test=service-detail]'); return d && d.getAttribute('data-state') === 'stopped';",
        vec![],
    )
    .await;
    assert_eq!(
        up.get(&format!("/api/v1/services/{chat_id}")).await["state"],
        "stopped"
    );
    assert_eq!(b.count("[data-test=service-delete]").await, 0);
    b.assert_no_errors("as a developer on the services pages")
        .await;
}
