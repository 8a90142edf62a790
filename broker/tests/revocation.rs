//! Revoking credentials, and what enrolment tokens are: an API token revoked by an admin
//! authenticates nothing from the next request on (its console sessions end too); an agent
//! token revoked by infra gets 401 in the one error shape on every agent route, its node's
//! work is requeued, and a real agent stops; the lists never show a secret; every revocation
//! is audited. Enrolment tokens are one-time, expire (15 minutes unless asked otherwise) and,
//! when minted for a launched instance, enrol that instance only while it boots.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use std::time::Duration;
use switchyard_broker::http::auth::hash_token;

async fn audit_actions(app: &TestApp, action: &str) -> Vec<serde_json::Value> {
    let r = app
        .call(
            Method::GET,
            "/api/v1/audit?limit=500",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == action)
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_revoked_api_token_is_refused_from_its_next_request_on() {
    let app = TestApp::spawn().await;
    let dev = app.token("developer", Some("ml")).await;
    assert_eq!(
        app.submit(&dev, job_spec("ml")).await.status,
        StatusCode::CREATED
    );

    // The list names it without its secret or hash.
    let r = app
        .call(Method::GET, "/api/v1/tokens", Some(&app.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let text = r.body.to_string();
    assert!(!text.contains(&dev) && !text.contains(&hash_token(&dev)));
    assert!(!text.contains(&app.admin) && !text.contains(&hash_token(&app.admin)));
    let tokens = r.body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 2, "{text}");
    let entry = tokens.iter().find(|t| t["role"] == "developer").unwrap();
    assert_eq!(entry["team"], "ml");
    assert_eq!(entry["revoked"], false);
    let id = entry["id"].as_str().unwrap().to_string();

    // A console session signed in with it.
    let login = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({"token": dev}))
        .send()
        .await
        .unwrap();
    assert!(login.status().is_success(), "{}", login.status());
    let cookie = login
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|c| c.starts_with("sy_session="))
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let by_cookie = async || {
        app.http
            .get(format!("{}/api/v1/jobs", app.url))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap()
            .status()
    };
    assert_eq!(by_cookie().await, StatusCode::OK);

    let r = app
        .call(
            Method::DELETE,
            &format!("/api/v1/tokens/{id}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["revoked"], true);
    // The very next request is refused, in the one error shape; so is the session.
    let r = app
        .call(Method::GET, "/api/v1/jobs", Some(&dev), None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.body);
    assert_eq!(r.error_code(), "unauthorized");
    assert_eq!(by_cookie().await, StatusCode::UNAUTHORIZED);
    // Nor can it sign in again.
    let login = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({"token": dev}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), StatusCode::UNAUTHORIZED);

    // Listed as revoked; revoking again changes nothing and is not audited twice.
    let r = app
        .call(Method::GET, "/api/v1/tokens", Some(&app.admin), None)
        .await;
    let entry = r.body["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(entry["revoked"], true);
    let again = app
        .call(
            Method::DELETE,
            &format!("/api/v1/tokens/{id}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(again.status, StatusCode::OK);
    let audited = audit_actions(&app, "token.revoke").await;
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["target"], format!("token:{id}"));
    assert!(audited[0]["actor"].as_str().unwrap().starts_with("admin:"));
    assert_eq!(audited[0]["after"]["revoked"], true);
    assert!(!audited[0].to_string().contains(&dev));

    // Unknown ids, and ids that are not ids, are 404.
    for bad in [uuid::Uuid::now_v7().to_string(), "not-an-id".into()] {
        let r = app
            .call(
                Method::DELETE,
                &format!("/api/v1/tokens/{bad}"),
                Some(&app.admin),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{bad}: {}", r.body);
    }
    // The admin's own token still works.
    let r = app
        .call(Method::GET, "/api/v1/tokens", Some(&app.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn a_revoked_agent_token_gets_401_everywhere_and_its_work_is_requeued() {
    let app = TestApp::spawn_with(|c| c.lease_ttl_s = 600, |_| Default::default()).await;
    let infra = app.token("infra", None).await;
    let agent = app.agent(4).await;
    let id = app.submit(&app.admin, job_spec("ml")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let leased = eventually("a lease", 20, async || {
        let w = work(&app, &agent, 1).await;
        w["leases"].as_array().unwrap().first().cloned()
    })
    .await;
    let started = events(
        &app,
        &agent,
        json!([{"type": "started", "attempt": leased["attempt"], "pid": 7}]),
    )
    .await;
    assert_eq!(started, ["accepted"]);

    let r = app
        .call(Method::GET, "/api/v1/agent-tokens", Some(&infra), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(!r.body.to_string().contains(&agent.token));
    assert!(!r.body.to_string().contains(&hash_token(&agent.token)));
    let listed = r.body["agent_tokens"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["node"], agent.node.as_str());

    // Infra revokes it: the job it ran goes back to the queue.
    let r = app
        .call(
            Method::DELETE,
            &format!("/api/v1/agent-tokens/{}", agent.node),
            Some(&infra),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["requeued"], json!([id]));

    // Every agent route now answers 401 in the one error shape.
    for (m, path, body) in [
        (
            Method::POST,
            "/agent/v1/heartbeat",
            Some(
                json!({"inventory": {"gpus": [], "cpus": 1, "memory_mb": 1, "simulated": true},
                        "running": []}),
            ),
        ),
        (Method::GET, "/agent/v1/work?wait_s=0", None),
        (
            Method::POST,
            "/agent/v1/events",
            Some(json!({"events": []})),
        ),
    ] {
        let r = app.call(m.clone(), path, Some(&agent.token), body).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{m} {path}: {}", r.body);
        assert_eq!(r.error_code(), "unauthorized", "{m} {path}: {}", r.body);
    }
    // The job is placed again, on another node.
    let other = app.agent(4).await;
    let job = app
        .wait_for_job(&app.admin, &id, Duration::from_secs(20), |j| {
            j["state"] == "placed"
        })
        .await;
    assert_eq!(job["placement"]["node"], other.node.as_str());
    // Gone from the list; a second revocation is 404; the first one is audited.
    let r = app
        .call(Method::GET, "/api/v1/agent-tokens", Some(&app.admin), None)
        .await;
    let listed = r.body["agent_tokens"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["node"], other.node.as_str());
    let r = app
        .call(
            Method::DELETE,
            &format!("/api/v1/agent-tokens/{}", agent.node),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.body);
    let audited = audit_actions(&app, "agent_token.revoke").await;
    assert_eq!(audited.len(), 1, "{audited:?}");
    assert_eq!(audited[0]["target"], format!("node:{}", agent.node));
    assert!(audited[0]["actor"].as_str().unwrap().starts_with("infra:"));
}

/// A real agent whose token is revoked learns it from its next call and stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_agent_stops_when_its_token_is_revoked() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let r = app
        .call(
            Method::POST,
            "/api/v1/enrolment-tokens",
            Some(&app.admin),
            Some(json!({"pool": POOL})),
        )
        .await;
    let mut args = switchyard_agent::AgentArgs::new(app.url.parse().unwrap());
    args.enrol_token = Some(r.body["token"].as_str().unwrap().parse().unwrap());
    args.fake_gpus = vec!["1xH100".parse().unwrap()];
    args.poll_wait_s = 1;
    args.state_dir = Some(dir.path().to_path_buf());
    let agent = tokio::spawn(switchyard_agent::run_until(
        args,
        std::future::pending::<()>(),
    ));
    let node = eventually("the agent enrolled", 20, async || {
        let r = app
            .call(Method::GET, "/api/v1/agent-tokens", Some(&app.admin), None)
            .await;
        r.body["agent_tokens"]
            .as_array()
            .unwrap()
            .first()
            .map(|t| t["node"].as_str().unwrap().to_string())
    })
    .await;
    let r = app
        .call(
            Method::DELETE,
            &format!("/api/v1/agent-tokens/{node}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let ended = tokio::time::timeout(Duration::from_secs(10), agent)
        .await
        .expect("the agent stops")
        .unwrap();
    let err = ended.unwrap_err();
    assert!(
        matches!(
            err.downcast_ref::<switchyard_agent::AgentError>(),
            Some(switchyard_agent::AgentError::TokenRevoked { .. })
        ),
        "{err:#}"
    );
}

#[tokio::test]
async fn enrolment_tokens_are_one_time_and_expire() {
    let app = TestApp::spawn_manual().await;
    let create = async |ttl: Option<i64>| {
        let mut body = json!({"pool": POOL});
        if let Some(t) = ttl {
            body["ttl_s"] = json!(t);
        }
        let r = app
            .call(
                Method::POST,
                "/api/v1/enrolment-tokens",
                Some(&app.admin),
                Some(body),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
        r.body
    };
    let register = async |token: &str| {
        app.call(
            Method::POST,
            "/agent/v1/register",
            Some(token),
            Some(register_body(1)),
        )
        .await
    };
    // The default lifetime is 15 minutes.
    let t = create(None).await;
    let expires: chrono::DateTime<chrono::Utc> = t["expires_at"].as_str().unwrap().parse().unwrap();
    let now = switchyard_broker::clock::to_datetime(app.app.clock.now());
    assert_eq!((expires - now).num_seconds(), 900);
    // One use only.
    let token = t["token"].as_str().unwrap();
    assert_eq!(register(token).await.status, StatusCode::CREATED);
    let again = register(token).await;
    assert_eq!(again.status, StatusCode::FORBIDDEN, "{}", again.body);
    assert!(
        again.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already used")
    );
    // Expired: refused.
    let short = create(Some(1)).await;
    app.advance(Duration::from_millis(1_200));
    let late = register(short["token"].as_str().unwrap()).await;
    assert_eq!(late.status, StatusCode::FORBIDDEN, "{}", late.body);
    assert!(
        late.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
    // Made up: refused.
    let bogus = register(&format!("sye_{}", "0".repeat(64))).await;
    assert_eq!(bogus.status, StatusCode::FORBIDDEN, "{}", bogus.body);
}

/// A token minted for a launched instance enrols that instance (and no other) while it
/// boots; once the broker gave the instance up, the token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_enrolment_token_binds_to_its_instance_while_it_boots() {
    let (app, fake) = spawn_with_fake(|c| {
        c.boot_timeout_s = 1;
        c.idle_ttl_s = 1;
        c.min_billed_s = 0;
        c.regions.push(cloud_region("aws:test-1"));
        c.pools.push(cloud_pool("aws:test-1/p5", "aws:test-1", 3.0));
    })
    .await;
    let deadline =
        switchyard_broker::clock::to_datetime(app.app.clock.now().plus_secs(3600)).to_rfc3339();
    let spec = json!({"name": "burst", "team": "ml", "command": ["true"],
        "resources": {"gpus": 2, "gpu_models": ["H100"]}, "estimated_runtime_s": 600,
        "deadline": deadline, "spot": "never"});
    let id = app.submit(&app.admin, spec).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    let first = eventually("a first launch", 20, async || {
        fake.launches().first().cloned()
    })
    .await;
    // Nobody enrols it in time: it is terminated and a second instance requested.
    let second = eventually("a second launch", 20, async || {
        fake.launches()
            .into_iter()
            .find(|l| l.instance_key != first.instance_key)
    })
    .await;
    eventually("the first instance terminated", 20, async || {
        instances(&app)
            .await
            .iter()
            .any(|i| i["id"] == first.instance_key.as_str() && i["state"] == "terminated")
            .then_some(())
    })
    .await;
    // The dead instance's token enrols nothing.
    let r = app
        .call(
            Method::POST,
            "/agent/v1/register",
            Some(&first.enrolment_token),
            Some(register_body(8)),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no longer booting")
    );
    // The live one's token enrols its own instance, and the job lands there.
    let agent = app.agent_with_token(&second.enrolment_token, 8).await;
    let all = instances(&app).await;
    let mine = all
        .iter()
        .find(|i| i["id"] == second.instance_key.as_str())
        .unwrap();
    assert_eq!(mine["state"], "ready", "{mine}");
    assert_eq!(mine["node"], agent.node.as_str(), "{mine}");
    let job = app
        .wait_for_job(&app.admin, &id, Duration::from_secs(10), |j| {
            j["state"] == "placed"
        })
        .await;
    assert_eq!(job["placement"]["node"], agent.node.as_str());
}
