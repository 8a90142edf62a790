//! The world the authorization matrix (`tests/authz_matrix.rs`) runs in: one token per role,
//! all of team [`OWN`]; a finished job, a policy with a budget and ledger spend for [`OWN`] and
//! for [`OTHER`]; and the concrete request (URL and body) for each route of the matrix.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

use super::{POOL, TestApp, events, eventually, job_spec, work};

/// The team every role's token belongs to.
pub const OWN: &str = "ml";
/// Another team, with data of its own.
pub const OTHER: &str = "cv";
pub const ROLES: [&str; 4] = ["admin", "infra", "finance", "developer"];

/// Whose data a request of the matrix is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Own,
    Other,
}

impl Scope {
    pub fn team(self) -> &'static str {
        match self {
            Scope::Own => OWN,
            Scope::Other => OTHER,
        }
    }
}

pub struct World {
    /// `(role, token)`, in the order of [`ROLES`], all of team [`OWN`].
    pub tokens: Vec<(&'static str, String)>,
    /// A finished job (with output, a placement explanation and ledger spend) per team.
    pub own_job: String,
    pub other_job: String,
}

impl World {
    pub fn token(&self, role: &str) -> &str {
        &self
            .tokens
            .iter()
            .find(|(r, _)| *r == role)
            .unwrap_or_else(|| panic!("no token for role {role}"))
            .1
    }

    pub fn job(&self, scope: Scope) -> &str {
        match scope {
            Scope::Own => &self.own_job,
            Scope::Other => &self.other_job,
        }
    }
}

/// The policy every team gets (a budget, so that `/budgets` lists it).
pub fn policy_body() -> Value {
    json!({"budget": {"amount_usd": 1000000, "period": "month"}})
}

/// Builds the world on `app` (on a manual clock): tokens, policies, and one job per team run to
/// completion by a hand-played agent (started, one line of output, finished a second later on
/// the broker's clock, so that the ledger has spend for both teams).
pub async fn world(app: &TestApp) -> World {
    let mut tokens = Vec::new();
    for role in ROLES {
        tokens.push((role, app.token(role, Some(OWN)).await));
    }
    for team in [OWN, OTHER] {
        let r = app
            .call(
                Method::PUT,
                &format!("/api/v1/policies/{team}"),
                Some(&app.admin),
                Some(policy_body()),
            )
            .await;
        assert!(r.status.is_success(), "policy of {team}: {}", r.body);
    }
    let agent = app.agent(4).await;
    let mut ids = Vec::new();
    for team in [OWN, OTHER] {
        let r = app.submit(&app.admin, job_spec(team)).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        ids.push(r.body["id"].as_str().unwrap().to_string());
    }
    let mut attempts = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while attempts.len() < ids.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the world's jobs were not leased"
        );
        let w = work(app, &agent, 1).await;
        for lease in w["leases"].as_array().unwrap() {
            if !attempts.contains(&lease["attempt"]) {
                attempts.push(lease["attempt"].clone());
            }
        }
    }
    let started: Vec<Value> = attempts
        .iter()
        .map(|a| json!({"type": "started", "attempt": a, "pid": 7}))
        .chain(attempts.iter().map(
            |a| json!({"type": "log", "attempt": a, "seq": 0, "stream": "stdout", "data": "hi\n"}),
        ))
        .collect();
    let results = events(app, &agent, Value::Array(started)).await;
    assert!(results.iter().all(|s| s == "accepted"), "{results:?}");
    app.advance(Duration::from_secs(1));
    let finished: Vec<Value> = attempts
        .iter()
        .map(|a| {
            json!({"type": "finished", "attempt": a, "exit_code": 0, "signal": null,
                   "error": null, "stopped": false})
        })
        .collect();
    let results = events(app, &agent, Value::Array(finished)).await;
    assert!(results.iter().all(|s| s == "accepted"), "{results:?}");
    for team in [OWN, OTHER] {
        eventually(&format!("ledger spend of {team}"), 20, async || {
            let r = app
                .call(
                    Method::GET,
                    &format!("/api/v1/spend?team={team}"),
                    Some(&app.admin),
                    None,
                )
                .await;
            (r.status == StatusCode::OK && r.body["total_usd"].as_f64().unwrap_or(0.0) > 0.0)
                .then_some(())
        })
        .await;
    }
    for id in &ids {
        eventually("a placement explanation", 20, async || {
            let r = app
                .call(
                    Method::GET,
                    &format!("/api/v1/jobs/{id}/placement"),
                    Some(&app.admin),
                    None,
                )
                .await;
            (r.status == StatusCode::OK).then_some(())
        })
        .await;
    }
    World {
        tokens,
        own_job: ids[0].clone(),
        other_job: ids[1].clone(),
    }
}

/// A queued job of `scope`'s team, for a request that uses it up (cancel).
pub async fn fresh_job(app: &TestApp, scope: Scope) -> String {
    let r = app.submit(&app.admin, job_spec(scope.team())).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// A service spec of `team` with a name no other cell uses; no replicas (`min` 0), so that the
/// matrix's services take no GPU from its jobs.
pub fn service_spec(team: &str) -> Value {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    json!({
        "name": format!("svc-{n}"), "team": team, "command": ["sleep", "3600"],
        "resources": {"gpus": 1}, "replicas": {"min": 0, "max": 1}
    })
}

/// A new service of the scope's team, made by the admin; its id.
pub async fn fresh_service(app: &TestApp, scope: Scope) -> String {
    let r = app
        .call(
            Method::POST,
            "/api/v1/services",
            Some(&app.admin),
            Some(service_spec(scope.team())),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    r.body["id"].as_str().unwrap().to_string()
}

/// Pool ids contain `/`: as a path segment it is sent as `%2F`.
pub fn pool_segment() -> String {
    POOL.replace('/', "%2F")
}

/// The concrete request of route `path` (as the matrix names it) for `scope`: the URL and the
/// body. Panics for a route it does not know, so that a new row needs a recipe here.
pub async fn request_for(
    app: &TestApp,
    world: &World,
    method: &Method,
    path: &str,
    scope: Scope,
) -> (String, Option<Value>) {
    let team = scope.team();
    let job = world.job(scope);
    match (method.as_str(), path) {
        ("POST", "/api/v1/jobs") => (path.into(), Some(job_spec(team))),
        ("GET", "/api/v1/jobs") => (format!("{path}?team={team}&limit=500"), None),
        ("GET", "/api/v1/jobs/{id}") => (format!("/api/v1/jobs/{job}"), None),
        ("POST", "/api/v1/jobs/{id}/cancel") => {
            let fresh = fresh_job(app, scope).await;
            (format!("/api/v1/jobs/{fresh}/cancel"), None)
        }
        ("GET", "/api/v1/jobs/{id}/logs") => (format!("/api/v1/jobs/{job}/logs"), None),
        ("GET", "/api/v1/jobs/{id}/placement") => (format!("/api/v1/jobs/{job}/placement"), None),
        ("GET", "/api/v1/pools") | ("GET", "/api/v1/regions") | ("GET", "/api/v1/instances") => {
            (path.into(), None)
        }
        ("GET", "/api/v1/nodes/{id}")
        | ("POST", "/api/v1/nodes/{id}/drain")
        | ("POST", "/api/v1/nodes/{id}/undrain") => {
            // Any node: every role may read every node; infra and admin drain any.
            let nodes = app.app.store.nodes().await.unwrap();
            let node = nodes
                .first()
                .map_or("none".to_string(), |n| n.id.to_string());
            (path.replace("{id}", &node), None)
        }
        ("GET", "/api/v1/nodes") => (path.into(), None),
        ("PATCH", "/api/v1/pools/{id}") => (
            format!("/api/v1/pools/{}", pool_segment()),
            Some(json!({"node_limit": 4})),
        ),
        ("POST", "/api/v1/tokens") => (
            path.into(),
            Some(json!({"role": "developer", "team": team})),
        ),
        ("POST", "/api/v1/enrolment-tokens") => (path.into(), Some(json!({"pool": POOL}))),
        ("GET", "/api/v1/tokens") | ("GET", "/api/v1/agent-tokens") => (path.into(), None),
        ("DELETE", "/api/v1/tokens/{id}") => {
            // A fresh token of the scope's team, so that no cell revokes a caller's token.
            let r = app
                .call(
                    Method::POST,
                    "/api/v1/tokens",
                    Some(&app.admin),
                    Some(json!({"role": "developer", "team": team})),
                )
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
            (
                format!("/api/v1/tokens/{}", r.body["id"].as_str().unwrap()),
                None,
            )
        }
        ("DELETE", "/api/v1/agent-tokens/{node}") => {
            // A fresh node (agent tokens belong to no team).
            let node = app.agent(1).await.node;
            (format!("/api/v1/agent-tokens/{node}"), None)
        }
        ("GET", "/api/v1/policies") => (path.into(), None),
        ("GET", "/api/v1/policies/{team}") => (format!("/api/v1/policies/{team}"), None),
        ("PUT", "/api/v1/policies/{team}") => {
            (format!("/api/v1/policies/{team}"), Some(policy_body()))
        }
        ("POST", "/api/v1/policies/{team}/what-if") => (
            format!("/api/v1/policies/{team}/what-if"),
            Some(policy_body()),
        ),
        ("GET", "/api/v1/audit") => (path.into(), None),
        ("GET", "/api/v1/spend") => (format!("{path}?group_by=team&team={team}"), None),
        ("GET", "/api/v1/budgets") => (path.into(), None),
        ("GET", "/api/v1/waste") => (path.into(), None),
        ("GET", "/metrics") => (path.into(), None),
        ("POST", "/api/v1/services") => (path.into(), Some(service_spec(team))),
        ("GET", "/api/v1/services") => {
            fresh_service(app, scope).await;
            (format!("{path}?team={team}"), None)
        }
        ("GET", "/api/v1/services/{id}") | ("DELETE", "/api/v1/services/{id}") => {
            let id = fresh_service(app, scope).await;
            (format!("/api/v1/services/{id}"), None)
        }
        ("PUT", "/api/v1/services/{id}") => {
            let id = fresh_service(app, scope).await;
            let mut spec = service_spec(team);
            let current = app
                .call(
                    Method::GET,
                    &format!("/api/v1/services/{id}"),
                    Some(&app.admin),
                    None,
                )
                .await;
            spec["name"] = current.body["name"].clone();
            spec["env"] = json!({"VERSION": "2"});
            (format!("/api/v1/services/{id}"), Some(spec))
        }
        ("GET", "/api/v1/services/{id}/events") => {
            let id = fresh_service(app, scope).await;
            (format!("/api/v1/services/{id}/events"), None)
        }
        ("POST", "/api/v1/services/{id}/tokens") | ("GET", "/api/v1/services/{id}/tokens") => {
            let id = fresh_service(app, scope).await;
            let body = (method.as_str() == "POST").then(|| json!({"name": "matrix"}));
            (format!("/api/v1/services/{id}/tokens"), body)
        }
        ("DELETE", "/api/v1/services/{id}/tokens/{token_id}") => {
            let id = fresh_service(app, scope).await;
            let r = app
                .call(
                    Method::POST,
                    &format!("/api/v1/services/{id}/tokens"),
                    Some(&app.admin),
                    Some(json!({})),
                )
                .await;
            assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
            let token = r.body["id"].as_str().unwrap();
            (format!("/api/v1/services/{id}/tokens/{token}"), None)
        }
        ("GET", "/api/v1/gateway/routes") => (path.into(), None),
        ("POST", "/api/v1/gateway/reports") => (
            path.into(),
            Some(json!({"gateway": format!("matrix/{team}"), "seconds": []})),
        ),
        _ => panic!(
            "no request recipe for {method} {path}: add one to request_for in tests/common/authz.rs"
        ),
    }
}

/// For a list route: whether its answer shows anything of `team`.
pub fn shows_team(path: &str, body: &Value, team: &str) -> bool {
    let (items, key) = match path {
        "/api/v1/jobs" => (&body["jobs"], "team"),
        "/api/v1/policies" => (&body["policies"], "team"),
        "/api/v1/budgets" => (&body["budgets"], "team"),
        "/api/v1/spend" => (&body["rows"], "team"),
        "/api/v1/services" => (&body["services"], "team"),
        _ => panic!("{path} is not a list route the matrix knows"),
    };
    items
        .as_array()
        .unwrap_or_else(|| panic!("{path}: no list in {body}"))
        .iter()
        .any(|item| item[key] == team)
}
