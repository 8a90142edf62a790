//! The shipped Grafana dashboard (`deploy/grafana/switchyard.json`) reads only metrics the
//! broker exports. Every panel's PromQL is parsed (Grafana's `$__rate_interval` and `$__range`
//! replaced by durations), every metric it selects is collected, and `switchyard up` is run until
//! its `/metrics` has them: a job holding GPUs under a team with a budget and a utilisation rule,
//! a simulated GPU with an injected XID error, and a cloud instance. A metric the dashboard names that the broker does
//! not export (a typo, a renamed series) fails the test, as does a query that does not parse.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use promql_parser::parser::{self, Expr};
use serde_json::{Value, json};
use switchyard_tests::*;

/// The dashboard's queries, with Grafana's variables as Prometheus would see them.
fn queries(dashboard: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            out.push(
                expr.replace("$__rate_interval", "2m")
                    .replace("$__range", "6h"),
            );
        }
    }
    out
}

/// Every metric name a PromQL expression selects.
fn selected(expr: &Expr, names: &mut BTreeSet<String>) {
    match expr {
        Expr::VectorSelector(vs) => {
            names.insert(vs.name.clone().expect("a selector by metric name"));
        }
        Expr::MatrixSelector(ms) => {
            names.insert(ms.vs.name.clone().expect("a selector by metric name"));
        }
        Expr::Aggregate(a) => {
            selected(&a.expr, names);
            if let Some(p) = &a.param {
                selected(p, names);
            }
        }
        Expr::Unary(u) => selected(&u.expr, names),
        Expr::Binary(b) => {
            selected(&b.lhs, names);
            selected(&b.rhs, names);
        }
        Expr::Paren(p) => selected(&p.expr, names),
        Expr::Subquery(s) => selected(&s.expr, names),
        Expr::Call(c) => c.args.args.iter().for_each(|a| selected(a, names)),
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// Names with at least one sample in an exposition (a histogram's `_bucket`, `_sum` and
/// `_count`, a counter's `_total`, as Prometheus stores them).
fn sampled(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn every_dashboard_query_parses_and_names_switchyard_or_dcgm_metrics() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/switchyard.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut names = BTreeSet::new();
    for q in queries(&dashboard) {
        let expr = parser::parse(&q).unwrap_or_else(|e| panic!("{q}: {e}"));
        selected(&expr, &mut names);
    }
    assert!(names.len() >= 15, "{names:?}");
    for n in &names {
        assert!(
            n.starts_with("switchyard_") || n.starts_with("DCGM_FI_"),
            "the dashboard reads {n}, which is neither Switchyard's nor dcgm-exporter's"
        );
    }
}

/// Every metric the dashboard reads has samples on `switchyard up` once it has a job on GPUs,
/// a budget, a utilisation rule that found idle GPU-hours, a sick GPU and a cloud instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_reads_is_in_metrics_after_a_run_on_up() {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/switchyard.json"),
    )
    .unwrap();
    let dashboard: Value = serde_json::from_str(&text).unwrap();
    let mut wanted = BTreeSet::new();
    for q in queries(&dashboard) {
        selected(&parser::parse(&q).unwrap(), &mut wanted);
    }

    // Agent 2's last GPU raises XID 48 (a double-bit ECC error) 20 s after it starts: its
    // node then has an unhealthy GPU, and the XID and ECC series have something to say.
    let up = Up::start(
        &["--fake-gpu-fault", "2/3:xid=48@20s", "--boot-delay", "1s"],
        8,
    )
    .await;
    // Team ml: a monthly budget and a rule that counts GPUs under 50 % for a minute as idle.
    let (status, body) = up
        .send(
            reqwest::Method::PUT,
            "/api/v1/policies/ml",
            Some(json!({
                "budget": {"amount_usd": 1000, "period": "month", "enforcement": "soft"},
                "utilization": {"min_gpu_utilization_pct": 50, "window_s": 60,
                                "action": "notify"}})),
        )
        .await;
    assert!(status == 200 || status == 201, "{status} {body}");
    // A job that holds two GPUs at 5 %, and one that must burst to the local cloud.
    let idle = up
        .submit(
            json!({"name": "stuck", "team": "ml", "command": ["sleep", "600"],
                       "resources": {"gpus": 2}, "regions": ["onprem:local-dc1"],
                       "estimated_runtime_s": 600, "expected_gpu_utilization": 5}),
        )
        .await;
    up.job_where(&idle, 60, |j| j["state"] == "running").await;
    let burst = up
        .submit(
            json!({"name": "burst", "team": "ml", "command": ["sleep", "600"],
                       "resources": {"gpus": 8}, "estimated_runtime_s": 600}),
        )
        .await;

    let metrics = || async {
        up.http
            .get(format!("{}/metrics", up.url))
            .bearer_auth(&up.token)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    // Every name the dashboard reads has samples, and the panels would show this run: the
    // stuck job's idle GPU-hours, the XID and the sick GPU, the stuck job on its GPUs.
    let mut missing = Vec::new();
    let mut exposition = String::new();
    let found = tokio::time::timeout(Duration::from_secs(240), async {
        loop {
            exposition = metrics().await;
            let have = sampled(&exposition);
            missing = wanted
                .iter()
                .filter(|w| !have.contains(*w))
                .cloned()
                .collect::<Vec<_>>();
            let shows_the_run = positive(
                &exposition,
                "switchyard_gpu_wasted_hours_total",
                "team=\"ml\"",
            ) && positive(&exposition, "DCGM_FI_DEV_XID_ERRORS", "gpu=\"3\"")
                && positive(
                    &exposition,
                    "switchyard_gpu_allocated",
                    &format!("job_id=\"{idle}\""),
                )
                && exposition
                    .lines()
                    .any(|l| l.starts_with("switchyard_gpu_healthy{") && l.ends_with(" 0"));
            if missing.is_empty() && shows_the_run {
                return;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    })
    .await;
    assert!(
        found.is_ok(),
        "the dashboard reads metrics /metrics never had: {missing:?}\nburst job: {}\n{exposition}",
        up.get(&format!("/api/v1/jobs/{burst}")).await
    );
}

/// Some sample of `name` whose labels contain `label` is above zero.
fn positive(exposition: &str, name: &str, label: &str) -> bool {
    exposition.lines().any(|l| {
        l.starts_with(name)
            && l[name.len()..].starts_with('{')
            && l.contains(label)
            && l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v > 0.0)
    })
}
