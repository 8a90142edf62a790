//! The authorization matrix: every REST route × every role × the caller's own team or another
//! team → the status it must answer (and, for lists, whether the other team's data shows).
//! Every token is of team `ml` (`OWN`); `cv` (`OTHER`) has a job, a policy and spend too.
//! A route in `/openapi.json` that the table lacks fails the test, and so does a row for a
//! route the document no longer has. Other kinds of credential (none, an agent token, an
//! enrolment token, a bogus one) get 401 on every row.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::authz::{OTHER, OWN, ROLES, Scope, World, request_for, shows_team, world};
use common::*;
use reqwest::{Method, StatusCode};
use std::collections::BTreeSet;

/// What one cell of the matrix expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    Status(u16),
    /// 200, and the team's data is in the list.
    Sees,
    /// 200, and nothing of the team is in the list.
    Blind,
}

const OK: Want = Want::Status(200);
const NEW: Want = Want::Status(201);
const ACC: Want = Want::Status(202);
const FORB: Want = Want::Status(403);
const GONE: Want = Want::Status(404);
const SEES: Want = Want::Sees;
const BLIND: Want = Want::Blind;

/// `(method, route, [admin own, admin other, infra own, infra other, finance own, finance
/// other, developer own, developer other])`. Routes as `/openapi.json` names them, under
/// `/api/v1`; `/metrics` is the one route outside it that needs a role.
#[rustfmt::skip]
const MATRIX: &[(&str, &str, [Want; 8])] = &[
    //                                                  admin         infra         finance       developer
    //                                                  own    other  own    other  own    other  own    other
    ("POST",  "/api/v1/jobs",                          [NEW,   NEW,   FORB,  FORB,  FORB,  FORB,  NEW,   FORB ]),
    ("GET",   "/api/v1/jobs",                          [SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  BLIND]),
    ("GET",   "/api/v1/jobs/{id}",                     [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("POST",  "/api/v1/jobs/{id}/cancel",              [ACC,   ACC,   FORB,  FORB,  FORB,  FORB,  ACC,   GONE ]),
    ("GET",   "/api/v1/jobs/{id}/logs",                [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("GET",   "/api/v1/jobs/{id}/placement",           [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("GET",   "/api/v1/pools",                         [OK,    OK,    OK,    OK,    OK,    OK,    OK,    OK   ]),
    ("PATCH", "/api/v1/pools/{id}",                    [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/regions",                       [OK,    OK,    OK,    OK,    OK,    OK,    OK,    OK   ]),
    ("GET",   "/api/v1/instances",                     [OK,    OK,    OK,    OK,    OK,    OK,    FORB,  FORB ]),
    ("GET",   "/api/v1/nodes",                         [OK,    OK,    OK,    OK,    OK,    OK,    OK,    OK   ]),
    ("GET",   "/api/v1/nodes/{id}",                    [OK,    OK,    OK,    OK,    OK,    OK,    OK,    OK   ]),
    ("POST",  "/api/v1/nodes/{id}/drain",              [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("POST",  "/api/v1/nodes/{id}/undrain",            [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("POST",  "/api/v1/tokens",                        [NEW,   NEW,   FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/tokens",                        [OK,    OK,    FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("DELETE","/api/v1/tokens/{id}",                   [OK,    OK,    FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/agent-tokens",                  [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("DELETE","/api/v1/agent-tokens/{node}",           [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("POST",  "/api/v1/enrolment-tokens",              [NEW,   NEW,   NEW,   NEW,   FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/policies",                      [SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  BLIND]),
    ("GET",   "/api/v1/policies/{team}",               [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("PUT",   "/api/v1/policies/{team}",               [OK,    OK,    FORB,  FORB,  OK,    OK,    FORB,  FORB ]),
    ("POST",  "/api/v1/policies/{team}/what-if",       [OK,    OK,    FORB,  FORB,  OK,    OK,    FORB,  FORB ]),
    ("GET",   "/api/v1/audit",                         [OK,    OK,    OK,    OK,    OK,    OK,    FORB,  FORB ]),
    ("GET",   "/api/v1/spend",                         [SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  BLIND]),
    ("GET",   "/api/v1/budgets",                       [SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  BLIND]),
    ("GET",   "/api/v1/waste",                         [OK,    OK,    OK,    OK,    OK,    OK,    FORB,  FORB ]),
    ("GET",   "/metrics",                              [OK,    OK,    OK,    OK,    OK,    OK,    FORB,  FORB ]),
    ("POST",  "/api/v1/services",                      [NEW,   NEW,   FORB,  FORB,  FORB,  FORB,  NEW,   FORB ]),
    ("GET",   "/api/v1/services",                      [SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  SEES,  BLIND]),
    ("GET",   "/api/v1/services/{id}",                 [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("PUT",   "/api/v1/services/{id}",                 [OK,    OK,    FORB,  FORB,  FORB,  FORB,  OK,    GONE ]),
    ("DELETE","/api/v1/services/{id}",                 [ACC,   ACC,   FORB,  FORB,  FORB,  FORB,  ACC,   GONE ]),
    ("GET",   "/api/v1/services/{id}/events",          [OK,    OK,    OK,    OK,    OK,    OK,    OK,    GONE ]),
    ("POST",  "/api/v1/services/{id}/tokens",          [NEW,   NEW,   FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/services/{id}/tokens",          [OK,    OK,    FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("DELETE","/api/v1/services/{id}/tokens/{token_id}", [OK,  OK,    FORB,  FORB,  FORB,  FORB,  FORB,  FORB ]),
    ("GET",   "/api/v1/gateway/routes",                [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
    ("POST",  "/api/v1/gateway/reports",               [OK,    OK,    OK,    OK,    FORB,  FORB,  FORB,  FORB ]),
];

fn method(name: &str) -> Method {
    name.parse().unwrap()
}

/// One request of the matrix; returns what went wrong, if anything.
async fn check(
    app: &TestApp,
    world: &World,
    (m, path): (&str, &str),
    role: &str,
    scope: Scope,
    want: Want,
) -> Option<String> {
    let m = method(m);
    let (url, body) = request_for(app, world, &m, path, scope).await;
    let r = app
        .call(m.clone(), &url, Some(world.token(role)), body)
        .await;
    let cell = format!("{m} {url} as {role} ({scope:?} team)");
    let expected_status = match want {
        Want::Status(s) => s,
        Want::Sees | Want::Blind => 200,
    };
    if r.status.as_u16() != expected_status {
        return Some(format!(
            "{cell}: {} instead of {expected_status}: {}",
            r.status, r.body
        ));
    }
    if !r.status.is_success() && r.body["error"]["code"].as_str().is_none() {
        return Some(format!("{cell}: not in the error shape: {}", r.body));
    }
    let team = scope.team();
    match want {
        Want::Sees if !shows_team(path, &r.body, team) => {
            Some(format!("{cell}: {team}'s data is missing: {}", r.body))
        }
        Want::Blind if shows_team(path, &r.body, team) => {
            Some(format!("{cell}: {team}'s data shows: {}", r.body))
        }
        _ => None,
    }
}

#[tokio::test]
async fn every_route_every_role_own_and_other_team() {
    let app = TestApp::spawn_manual().await;
    let world = world(&app).await;
    let mut failures = Vec::new();
    for &(m, path, wants) in MATRIX {
        for (r, role) in ROLES.iter().enumerate() {
            for (s, scope) in [Scope::Own, Scope::Other].into_iter().enumerate() {
                if let Some(f) = check(&app, &world, (m, path), role, scope, wants[r * 2 + s]).await
                {
                    failures.push(f);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} cells of the authorization matrix are wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // The developer's lists without a team filter hold their own team's data only.
    let dev = world.token("developer");
    for path in [
        "/api/v1/jobs",
        "/api/v1/policies",
        "/api/v1/budgets",
        "/api/v1/spend",
    ] {
        let r = app.call(Method::GET, path, Some(dev), None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.body);
        assert!(shows_team(path, &r.body, OWN), "{path}: {}", r.body);
        assert!(!shows_team(path, &r.body, OTHER), "{path}: {}", r.body);
    }
    // Spend grouped by something other than team adds up to the developer's team only.
    let total = |token: &str, q: &'static str| {
        let app = &app;
        let token = token.to_string();
        async move {
            let r = app
                .call(
                    Method::GET,
                    &format!("/api/v1/spend?{q}"),
                    Some(&token),
                    None,
                )
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.body);
            r.body["total_usd"].as_f64().unwrap()
        }
    };
    let own = total(&app.admin, "team=ml").await;
    let all = total(&app.admin, "group_by=region").await;
    assert!(all > own, "both teams spent: {all} vs {own}");
    assert_eq!(total(dev, "group_by=region").await, own);
    assert_eq!(total(dev, "group_by=pool").await, own);
}

/// Credentials that are not API tokens, or no credential at all, open no REST route.
#[tokio::test]
async fn every_route_refuses_what_is_not_an_api_token() {
    let app = TestApp::spawn().await;
    let agent = app.agent(1).await;
    let enrol = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&app.admin),
            Some(serde_json::json!({"pool": POOL})),
        )
        .await;
    let enrol = enrol.body["token"].as_str().unwrap().to_string();
    let world = World {
        tokens: Vec::new(),
        own_job: uuid::Uuid::now_v7().to_string(),
        other_job: uuid::Uuid::now_v7().to_string(),
    };
    let bogus = format!("sya_{}", "0".repeat(64));
    let mut failures = Vec::new();
    for &(m, path, _) in MATRIX {
        for token in [
            None,
            Some(agent.token.as_str()),
            Some(enrol.as_str()),
            Some(bogus.as_str()),
        ] {
            let m = method(m);
            // Cancel's recipe submits a job as admin; the id does not matter here.
            let (url, body) = if path == "/api/v1/jobs/{id}/cancel" {
                (format!("/api/v1/jobs/{}/cancel", world.own_job), None)
            } else {
                request_for(&app, &world, &m, path, Scope::Own).await
            };
            let r = app.call(m.clone(), &url, token, body).await;
            if r.status != StatusCode::UNAUTHORIZED || r.error_code() != "unauthorized" {
                let kind = token.map_or("no token".to_string(), |t| t[..4].to_string());
                failures.push(format!("{m} {url} with {kind}: {} {}", r.status, r.body));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // And an API token opens no agent route.
    for (m, path) in [
        (Method::POST, "/agent/v1/heartbeat"),
        (Method::GET, "/agent/v1/work?wait_s=0"),
        (Method::POST, "/agent/v1/events"),
    ] {
        let body = (m == Method::POST).then(|| serde_json::json!({"events": []}));
        let r = app.call(m.clone(), path, Some(&app.admin), body).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{m} {path}: {}", r.body);
    }
}

/// The table covers exactly the routes `/openapi.json` documents: a new route without a row
/// (or a row whose route is gone) fails here.
#[tokio::test]
async fn the_matrix_covers_every_documented_route() {
    let app = TestApp::spawn().await;
    let r = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(r.status, StatusCode::OK);
    let base = r.body["servers"][0]["url"].as_str().unwrap_or("");
    assert_eq!(base, "/api/v1");
    let mut documented = BTreeSet::new();
    for (path, item) in r.body["paths"].as_object().unwrap() {
        for m in ["get", "post", "put", "patch", "delete", "head", "options"] {
            if item.get(m).is_some() {
                documented.insert((m.to_ascii_uppercase(), format!("{base}{path}")));
            }
        }
    }
    let tabled: BTreeSet<(String, String)> = MATRIX
        .iter()
        .filter(|(_, path, _)| path.starts_with("/api/v1/"))
        .map(|(m, path, _)| (m.to_string(), path.to_string()))
        .collect();
    let missing: Vec<_> = documented.difference(&tabled).collect();
    let stale: Vec<_> = tabled.difference(&documented).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "routes in /openapi.json without a row in MATRIX: {missing:?}; rows for routes it no \
         longer has: {stale:?}"
    );
    assert_eq!(
        MATRIX.len(),
        tabled.len() + 1,
        "one row per route (and /metrics)"
    );
}
