//! Team policies through the real router: validation naming the field, versions and
//! `If-Match`, the append-only audit log, who may do what, submit-time enforcement, what-if,
//! and infra's pool edits.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::time::Duration;

const CLOUD: &str = "aws:test-east/p5";
/// `POOL` with its `/` escaped for a path segment.
const POOL_PATH: &str = "/api/v1/pools/onprem:test-dc%2Fh100x4";

/// The test on-prem pool plus a launchable AWS pool of 8-GPU nodes, served by a fake provider.
async fn with_cloud() -> TestApp {
    let (app, _fake) = spawn_with_fake(|c| {
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CLOUD, "aws:test-east", 1.0));
    })
    .await;
    app
}

async fn put(
    app: &TestApp,
    token: &str,
    path: &str,
    if_match: Option<&str>,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    let mut req = app
        .http
        .put(format!("{}/api/v1/policies/{path}", app.url))
        .bearer_auth(token)
        .json(&body);
    if let Some(v) = if_match {
        req = req.header("if-match", v);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let etag = res
        .headers()
        .get("etag")
        .map(|v| v.to_str().unwrap().to_string());
    let text = res.text().await.unwrap();
    (
        status,
        etag,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn audit(app: &TestApp, query: &str) -> Vec<Value> {
    let r = app
        .call(
            Method::GET,
            &format!("/api/v1/audit{query}"),
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["entries"].as_array().unwrap().clone()
}

#[tokio::test]
async fn invalid_policies_name_the_field_and_store_nothing() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let month = |extra: Value| {
        let mut b = json!({"amount_usd": 100, "period": "month"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        json!({ "budget": b })
    };
    let window = |w: Value| json!({ "windows": [w] });
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "negative budget",
            month(json!({"amount_usd": -1})),
            400,
            "budget.amount_usd",
        ),
        (
            "budget as text",
            month(json!({"amount_usd": "lots"})),
            400,
            "budget.amount_usd",
        ),
        (
            "unknown period",
            month(json!({"period": "fortnight"})),
            400,
            "budget.period",
        ),
        (
            "custom without from",
            month(json!({"period": "custom", "to": "2026-12-31T00:00:00Z"})),
            400,
            "budget.from",
        ),
        (
            "custom ends before it starts",
            month(
                json!({"period": "custom", "from": "2026-12-10T00:00:00Z", "to": "2026-12-01T00:00:00Z"}),
            ),
            400,
            "budget.to",
        ),
        (
            "from on a month",
            month(json!({"from": "2026-12-10T00:00:00Z"})),
            400,
            "budget.from",
        ),
        (
            "alert over 1",
            month(json!({"alert_at": [0.5, 1.5]})),
            400,
            "budget.alert_at[1]",
        ),
        (
            "alert at 0",
            month(json!({"alert_at": [0]})),
            400,
            "budget.alert_at[0]",
        ),
        (
            "unknown enforcement",
            month(json!({"enforcement": "strict"})),
            400,
            "budget.enforcement",
        ),
        (
            "unknown budget field",
            month(json!({"cap": 3})),
            400,
            "budget.cap",
        ),
        (
            "zero max price",
            json!({"max_price_per_gpu_hour": 0}),
            400,
            "max_price_per_gpu_hour",
        ),
        (
            "unknown provider",
            json!({"allowed_providers": ["onprem", "gcp"]}),
            422,
            "allowed_providers[1]",
        ),
        (
            "empty provider list",
            json!({"allowed_providers": []}),
            400,
            "allowed_providers",
        ),
        (
            "unknown region",
            json!({"allowed_regions": ["aws:mars-1"]}),
            422,
            "allowed_regions[0]",
        ),
        (
            "unknown spot rule",
            json!({"spot": "sometimes"}),
            400,
            "spot",
        ),
        ("burst as text", json!({"burst": "yes"}), 400, "burst"),
        (
            "unknown time zone",
            window(json!({"from": "20:00", "to": "08:00", "tz": "Mars/Olympus"})),
            400,
            "windows[0].tz",
        ),
        (
            "bad start",
            window(json!({"from": "8pm", "to": "08:00", "tz": "UTC"})),
            400,
            "windows[0].from",
        ),
        (
            "bad end",
            window(json!({"from": "20:00", "to": "25:00", "tz": "UTC"})),
            400,
            "windows[0].to",
        ),
        (
            "unknown priority",
            window(json!({"priority": "urgent", "from": "20:00", "to": "08:00"})),
            400,
            "windows[0].priority",
        ),
        (
            "unknown ceiling",
            json!({"priority_ceiling": "max"}),
            400,
            "priority_ceiling",
        ),
        (
            "negative on-prem rate",
            json!({"onprem_rates": {"H100": -1}}),
            400,
            "onprem_rates.H100",
        ),
        (
            "unknown GPU model rate",
            json!({"onprem_rates": {"Z9000": 1}}),
            422,
            "onprem_rates.Z9000",
        ),
        (
            "unknown objective",
            json!({"objective": "cheapest"}),
            400,
            "objective",
        ),
        (
            "unknown top-level field",
            json!({"colour": "red"}),
            400,
            "colour",
        ),
    ];
    for (what, body, status, field) in cases {
        let (got, _, body) = put(&app, &finance, "ml", None, body).await;
        assert_eq!(got.as_u16(), status, "{what}: {body}");
        assert_eq!(body["error"]["field"], field, "{what}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(field),
            "{what}: the message names the field: {body}"
        );
    }
    let r = app
        .call(Method::GET, "/api/v1/policies/ml", Some(&finance), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(audit(&app, "?target=policy:ml").await.is_empty());
}

#[tokio::test]
async fn every_put_is_a_new_version_and_a_stale_if_match_changes_nothing() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let v1 = json!({
        "budget": {"amount_usd": 5000, "period": "month", "enforcement": "hard", "alert_at": [0.5, 0.9]},
        "max_price_per_gpu_hour": 4.0, "allowed_providers": ["onprem"], "allowed_regions": null,
        "spot": "allowed", "burst": true, "objective": "team",
        "windows": [{"priority": "low", "from": "20:00", "to": "08:00", "tz": "Asia/Shanghai"}]
    });
    let (status, etag, body) = put(&app, &finance, "ml", None, v1.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(etag.as_deref(), Some("\"1\""));
    assert_eq!(body["version"], 1);
    assert_eq!(body["policy"]["objective"], "team");
    assert_eq!(body["team"], "ml");
    assert_eq!(body["project"], Value::Null);
    assert_eq!(body["policy"]["budget"]["amount_usd"], 5000.0);
    assert_eq!(body["policy"]["windows"][0]["tz"], "Asia/Shanghai");
    assert!(body["updated_by"].as_str().unwrap().starts_with("finance:"));

    let v2 = json!({"budget": {"amount_usd": 6000, "period": "month"}});
    let (status, etag, body) = put(&app, &finance, "ml", Some("\"1\""), v2.clone()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(etag.as_deref(), Some("\"2\""));
    assert_eq!(body["version"], 2);

    // Someone read version 1 and saves over version 2: refused, nothing written.
    let (status, _, body) = put(&app, &finance, "ml", Some("\"1\""), json!({"burst": false})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    let res = app
        .http
        .get(format!("{}/api/v1/policies/ml", app.url))
        .bearer_auth(&finance)
        .send()
        .await
        .unwrap();
    assert_eq!(res.headers()["etag"], "\"2\"");
    let current: Value = res.json().await.unwrap();
    assert_eq!(current["version"], 2);
    assert_eq!(current["policy"]["budget"]["amount_usd"], 6000.0);
    assert_eq!(current["policy"]["budget"]["enforcement"], "hard");
    assert_eq!(current["policy"].get("windows"), None);
    assert_eq!(audit(&app, "?target=policy:ml").await.len(), 2);

    // Without If-Match every PUT is a new version; a project's policy has versions of its own.
    let (status, _, body) = put(&app, &finance, "ml", None, json!({"spot": "never"})).await;
    assert_eq!(
        (status, body["version"].clone()),
        (StatusCode::OK, json!(3))
    );
    let (status, _, body) = put(
        &app,
        &finance,
        "ml?project=vision",
        Some("\"0\""),
        json!({"burst": false}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        (body["version"].clone(), body["project"].clone()),
        (json!(1), json!("vision"))
    );
    let (status, _, _) = put(
        &app,
        &finance,
        "ml?project=vision",
        Some("\"0\""),
        json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _, body) = put(&app, &finance, "ml", Some("garbage"), json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "If-Match");

    let r = app
        .call(Method::GET, "/api/v1/policies", Some(&finance), None)
        .await;
    let list = r.body["policies"].as_array().unwrap();
    assert_eq!(list.len(), 2, "{}", r.body);
    assert_eq!(
        (list[0]["project"].clone(), list[0]["version"].clone()),
        (Value::Null, json!(3))
    );
    assert_eq!(list[1]["project"], "vision");
}

#[tokio::test]
async fn every_change_is_audited_and_the_log_cannot_be_rewritten() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let infra = app.token("infra", None).await;
    put(
        &app,
        &finance,
        "ml",
        None,
        json!({"budget": {"amount_usd": 10, "period": "week"}}),
    )
    .await;
    put(
        &app,
        &finance,
        "ml",
        None,
        json!({"budget": {"amount_usd": 20, "period": "week"}}),
    )
    .await;
    let r = app
        .call(
            Method::PATCH,
            POOL_PATH,
            Some(&infra),
            Some(json!({"node_limit": 9})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);

    let entries = audit(&app, "").await;
    let actions: Vec<&str> = entries
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    // Newest first: the pool edit, two policy versions, then the two tokens this test made.
    assert_eq!(
        actions,
        [
            "pool.patch",
            "policy.put",
            "policy.put",
            "token.create",
            "token.create"
        ],
        "{entries:?}"
    );
    let latest = &entries[1];
    assert_eq!(latest["target"], "policy:ml");
    assert!(latest["actor"].as_str().unwrap().starts_with("finance:"));
    assert_eq!(latest["before"]["budget"]["amount_usd"], 10.0);
    assert_eq!(latest["after"]["budget"]["amount_usd"], 20.0);
    assert_eq!(entries[2]["before"], Value::Null);
    assert_eq!(entries[3]["after"]["role"], "infra");
    assert!(entries[3]["actor"].as_str().unwrap().starts_with("admin:"));
    assert_eq!(entries[0]["before"]["node_limit"], 4);
    assert_eq!(entries[0]["after"]["node_limit"], 9);

    // Paging: a cursor continues where the page ended.
    let r = app
        .call(Method::GET, "/api/v1/audit?limit=2", Some(&finance), None)
        .await;
    assert_eq!(r.body["entries"].as_array().unwrap().len(), 2);
    let cursor = r.body["next_cursor"].as_str().unwrap().to_string();
    let rest = audit(&app, &format!("?limit=10&cursor={cursor}")).await;
    assert_eq!(rest.len(), 3);
    assert_eq!(rest[0]["id"], entries[2]["id"]);

    // Filters: by actor, by action, by time (RFC 3339; a bad time names its parameter).
    let finance_actor = latest["actor"].as_str().unwrap();
    let by_actor = audit(&app, &format!("?actor={finance_actor}")).await;
    assert_eq!(by_actor.len(), 2, "{by_actor:?}");
    assert!(by_actor.iter().all(|e| e["actor"] == finance_actor));
    // A role alone matches its actors: the two policy puts by finance.
    assert_eq!(audit(&app, "?actor=finance").await, by_actor);
    assert!(audit(&app, "?actor=financ").await.is_empty());
    let by_action = audit(&app, "?action=token.create").await;
    assert_eq!(by_action.len(), 2, "{by_action:?}");
    let newest = entries[0]["at"].as_str().unwrap();
    let since_newest = audit(&app, &format!("?from={}", newest.replace('+', "%2B"))).await;
    assert!(since_newest.iter().any(|e| e["id"] == entries[0]["id"]));
    assert!(
        since_newest.len() < entries.len(),
        "from= keeps only the entries at or after it: {since_newest:?}"
    );
    let before_all = audit(&app, "?to=2000-01-01T00:00:00Z").await;
    assert!(before_all.is_empty(), "{before_all:?}");
    let r = app
        .call(
            Method::GET,
            "/api/v1/audit?from=yesterday",
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(
        (r.status, r.error_field()),
        (StatusCode::BAD_REQUEST, "from")
    );

    // The database itself refuses to change or remove audit rows (and past policy versions).
    for sql in [
        "UPDATE audit_log SET actor = 'nobody'",
        "DELETE FROM audit_log",
        "UPDATE policy_versions SET body_json = '{}'",
        "DELETE FROM policy_versions",
    ] {
        let err = common::execute_raw(&app.app.config, sql).await.unwrap_err();
        assert!(err.contains("append-only"), "{sql}: {err}");
    }
    assert_eq!(audit(&app, "").await, entries);
}

#[tokio::test]
async fn roles_decide_who_reads_and_writes_policies() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let infra = app.token("infra", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let body = json!({"burst": false});
    for (who, token, want) in [
        ("developer", &dev, StatusCode::FORBIDDEN),
        ("infra", &infra, StatusCode::FORBIDDEN),
        ("finance", &finance, StatusCode::CREATED),
        ("admin", &app.admin, StatusCode::OK),
    ] {
        let (status, _, b) = put(&app, token, "ml", None, body.clone()).await;
        assert_eq!(status, want, "{who} PUT: {b}");
    }
    put(&app, &finance, "cv", None, body.clone()).await;

    // Developers read their own team's policy only; another team's is absent to them.
    let get = |token: String, path: &'static str| {
        let app = &app;
        async move { app.call(Method::GET, path, Some(&token), None).await }
    };
    assert_eq!(
        get(dev.clone(), "/api/v1/policies/ml").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(dev.clone(), "/api/v1/policies/cv").await.status,
        StatusCode::NOT_FOUND
    );
    let mine = get(dev.clone(), "/api/v1/policies").await;
    let teams: Vec<&str> = mine.body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["team"].as_str().unwrap())
        .collect();
    assert_eq!(teams, ["ml"]);
    let all = get(infra.clone(), "/api/v1/policies").await;
    assert_eq!(all.body["policies"].as_array().unwrap().len(), 2);
    assert_eq!(
        get(infra.clone(), "/api/v1/policies/cv").await.status,
        StatusCode::OK
    );

    // The audit log: admin, finance and infra.
    assert_eq!(
        get(dev.clone(), "/api/v1/audit").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get(infra.clone(), "/api/v1/audit").await.status,
        StatusCode::OK
    );
    assert_eq!(
        get(finance.clone(), "/api/v1/audit").await.status,
        StatusCode::OK
    );

    // What-if: finance and admin.
    for (token, want) in [
        (&dev, StatusCode::FORBIDDEN),
        (&infra, StatusCode::FORBIDDEN),
        (&finance, StatusCode::OK),
    ] {
        let r = app
            .call(
                Method::POST,
                "/api/v1/policies/ml/what-if",
                Some(token),
                Some(json!({})),
            )
            .await;
        assert_eq!(r.status, want, "{}", r.body);
    }

    // Pools: infra and admin edit them.
    for (token, want) in [
        (&dev, StatusCode::FORBIDDEN),
        (&finance, StatusCode::FORBIDDEN),
        (&infra, StatusCode::OK),
        (&app.admin, StatusCode::OK),
    ] {
        let r = app
            .call(
                Method::PATCH,
                POOL_PATH,
                Some(token),
                Some(json!({"launchable": false})),
            )
            .await;
        assert_eq!(r.status, want, "{}", r.body);
    }
    let r = app
        .call(Method::GET, "/api/v1/policies/ml", None, None)
        .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn submissions_the_policy_never_allows_are_refused_naming_the_rule() {
    let app = with_cloud().await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let other = app.token("developer", Some("cv")).await;
    let (status, _, body) = put(
        &app,
        &finance,
        "ml",
        None,
        json!({"allowed_providers": ["onprem"], "priority_ceiling": "normal"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let job = |extra: Value| {
        let mut spec = job_spec("ml");
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        spec
    };
    // The job asks only for a region the policy forbids.
    let r = app
        .submit(&dev, job(json!({"regions": ["aws:test-east"]})))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.error_code(), "policy_violation");
    assert_eq!(r.error_field(), "regions");
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("allowed_providers") && msg.contains("team ml"),
        "{msg}"
    );
    // Only the cloud has 8-GPU nodes, and the policy allows only on-prem.
    let r = app
        .submit(&dev, job(json!({"resources": {"gpus": 8}})))
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.error_code(), "policy_violation");
    assert_eq!(r.error_field(), "regions");
    // Another team has no policy: the same job is accepted.
    let mut spec = job_spec("cv");
    spec["resources"]["gpus"] = json!(8);
    assert_eq!(app.submit(&other, spec).await.status, StatusCode::CREATED);
    // A priority over the ceiling is capped, not refused.
    let r = app.submit(&dev, job(json!({"priority": "critical"}))).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // A price ceiling below every allowed pool ($2/GPU-hour on-prem).
    put(
        &app,
        &finance,
        "ml",
        None,
        json!({"allowed_providers": ["onprem"], "max_price_per_gpu_hour": 1.5}),
    )
    .await;
    let r = app.submit(&dev, job(json!({}))).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.error_field(), "max_price_per_hour");
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_price_per_gpu_hour")
    );
    // A project's policy applies on top of the team's.
    put(&app, &finance, "ml", None, json!({})).await;
    put(
        &app,
        &finance,
        "ml?project=vision",
        None,
        json!({"allowed_regions": ["aws:test-east"]}),
    )
    .await;
    let r = app
        .submit(
            &dev,
            job(json!({"project": "vision", "regions": ["onprem:test-dc"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("project ml/vision")
    );
    assert_eq!(
        app.submit(&dev, job(json!({"regions": ["onprem:test-dc"]})))
            .await
            .status,
        StatusCode::CREATED
    );
}

/// A broker whose only 8-GPU pool is AWS p5.48xlarge in us-east-1 from the bundled catalogue:
/// $55.04/h on demand ($6.88 per GPU-hour), $20.0775/h on spot (about $2.51 per GPU-hour).
async fn with_spot_pool() -> TestApp {
    TestApp::spawn_with(
        |c| c.catalogue_regions.push(aws_p5_catalogue(2)),
        |_| switchyard_broker::app::ProviderSet::default(),
    )
    .await
}

#[tokio::test]
async fn a_spot_rule_that_leaves_only_spot_capacity_out_of_reach_is_refused_at_submit() {
    let app = with_spot_pool().await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let cv = app.token("developer", Some("cv")).await;
    let pools = app
        .call(Method::GET, "/api/v1/pools", Some(&finance), None)
        .await;
    let p5 = pools.body["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["gpus_per_node"] == 8)
        .unwrap_or_else(|| panic!("no 8-GPU pool: {}", pools.body))
        .clone();
    assert!(
        p5["spot_price_per_gpu_hour"].as_f64().unwrap() < 3.0
            && p5["price_per_gpu_hour"].as_f64().unwrap() > 6.0,
        "{p5}"
    );
    // Eight GPUs within $30 an hour: only p5 on spot ($20.08/h) can run it.
    let job = |team: &str| {
        json!({"name": "big", "team": team, "command": ["true"], "resources": {"gpus": 8},
               "spot": "allowed", "max_price_per_hour": 30.0})
    };
    let (status, _, body) = put(&app, &finance, "ml", None, json!({"spot": "never"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let r = app.submit(&dev, job("ml")).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.error_code(), "policy_violation", "{}", r.body);
    assert_eq!(r.error_field(), "spot", "{}", r.body);
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("team ml") && msg.to_lowercase().contains("caps spot at never"),
        "{msg}"
    );
    // Nothing was stored.
    let list = app
        .call(Method::GET, "/api/v1/jobs?team=ml", Some(&dev), None)
        .await;
    assert!(
        list.body["jobs"].as_array().unwrap().is_empty(),
        "{}",
        list.body
    );
    // The same job for a team without that rule is accepted.
    let r = app.submit(&cv, job("cv")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);

    // The policy's own price ceiling: $3 per GPU-hour is within reach on spot only, and the
    // policy says never.
    let (status, _, body) = put(
        &app,
        &finance,
        "ml",
        None,
        json!({"spot": "never", "max_price_per_gpu_hour": 3.0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r = app
        .submit(
            &dev,
            json!({"name": "big", "team": "ml", "command": ["true"], "resources": {"gpus": 8}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(
        (r.error_code(), r.error_field()),
        ("policy_violation", "spot"),
        "{}",
        r.body
    );
    let msg = r.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("max_price_per_gpu_hour") && msg.contains("spot is never"),
        "{msg}"
    );

    // Allowing spot lets both through.
    let (status, _, body) = put(
        &app,
        &finance,
        "ml",
        None,
        json!({"spot": "allowed", "max_price_per_gpu_hour": 3.0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let r = app.submit(&dev, job("ml")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    let r = app
        .submit(
            &dev,
            json!({"name": "big", "team": "ml", "command": ["true"], "resources": {"gpus": 8},
                   "spot": "allowed"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
}

#[tokio::test]
async fn what_if_replays_the_team_jobs_under_the_draft() {
    let app = with_cloud().await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    // Nothing recorded yet: nothing to replay.
    let r = app
        .call(
            Method::POST,
            "/api/v1/policies/ml/what-if",
            Some(&finance),
            Some(json!({})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["jobs"], 0);

    // Two 8-GPU jobs only the cloud can run, and two small ones on-prem can.
    for gpus in [8, 8, 1, 1] {
        let mut spec = job_spec("ml");
        spec["resources"]["gpus"] = json!(gpus);
        spec["estimated_runtime_s"] = json!(3600);
        assert_eq!(app.submit(&dev, spec).await.status, StatusCode::CREATED);
    }
    let draft = json!({"allowed_providers": ["onprem"]});
    let r = app
        .call(
            Method::POST,
            "/api/v1/policies/ml/what-if",
            Some(&finance),
            Some(draft.clone()),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let (current, draft_out) = (&r.body["current"], &r.body["draft"]);
    assert_eq!(r.body["jobs"], 4);
    assert_eq!(current["held_jobs"], 0, "{}", r.body);
    assert_eq!(draft_out["held_jobs"], 2, "{}", r.body);
    let (c, d) = (
        current["total_cost_usd"].as_f64().unwrap(),
        draft_out["total_cost_usd"].as_f64().unwrap(),
    );
    // Two cloud hours of an 8-GPU node at $1/GPU-hour at least, against on-prem only.
    assert!(c > d + 15.0, "current {c} draft {d}: {}", r.body);
    // What-if totals are cash: on-prem at its marginal cost, a fifth of the $2 billed.
    assert!(
        d >= 0.8 - 1e-6,
        "two on-prem GPU-hours at $2 billed, $0.40 cash: {d}"
    );
    assert_eq!(current["deadline_met_fraction"], 1.0);
    assert_eq!(draft_out["deadline_met_fraction"], 0.5);
    for k in ["p50", "p99"] {
        assert!(current["queue_delay_s"][k].is_number());
    }
    // An invalid draft is refused like a PUT; nothing is saved either way.
    let r = app
        .call(
            Method::POST,
            "/api/v1/policies/ml/what-if",
            Some(&finance),
            Some(json!({"allowed_regions": ["x:y"]})),
        )
        .await;
    assert_eq!(
        (r.status, r.error_field()),
        (StatusCode::UNPROCESSABLE_ENTITY, "allowed_regions[0]")
    );
    let r = app
        .call(Method::GET, "/api/v1/policies/ml", Some(&finance), None)
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pool_edits_are_audited_visible_and_planned_with() {
    let (app, _fake) = spawn_with_fake(|c| {
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CLOUD, "aws:test-east", 1.0));
    })
    .await;
    let infra = app.token("infra", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let r = app
        .call(
            Method::PATCH,
            POOL_PATH,
            Some(&infra),
            Some(json!({"node_limit": 8, "price_per_gpu_hour": 3.5})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["node_limit"], 8);
    assert_eq!(r.body["price_per_gpu_hour"], 3.5);
    let pools = app
        .call(Method::GET, "/api/v1/pools", Some(&dev), None)
        .await;
    let pool = pools.body["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == POOL)
        .unwrap()
        .clone();
    assert_eq!(
        (
            pool["node_limit"].clone(),
            pool["price_per_gpu_hour"].clone()
        ),
        (json!(8), json!(3.5))
    );
    let entries = audit(&app, &format!("?target=pool:{}", POOL.replace('/', "%2F"))).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["action"], "pool.patch");
    assert_eq!(entries[0]["before"]["price_per_gpu_hour"], 2.0);
    assert_eq!(entries[0]["after"]["price_per_gpu_hour"], 3.5);

    for (body, status, field) in [
        (json!({"colour": 1}), 400, "colour"),
        (json!({"price_per_gpu_hour": -1}), 400, "price_per_gpu_hour"),
        (json!({"node_limit": -1}), 400, "node_limit"),
    ] {
        let r = app
            .call(Method::PATCH, POOL_PATH, Some(&infra), Some(body))
            .await;
        assert_eq!(
            (r.status.as_u16(), r.error_field()),
            (status, field),
            "{}",
            r.body
        );
    }
    let r = app
        .call(
            Method::PATCH,
            "/api/v1/pools/aws:nowhere%2Fx",
            Some(&infra),
            Some(json!({"launchable": true})),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // The scheduler plans with the edit from its next round: a cloud pool closed to launches
    // gets none; reopened, the waiting job bursts.
    let cloud_path = format!("/api/v1/pools/{}", CLOUD.replace('/', "%2F"));
    let r = app
        .call(
            Method::PATCH,
            &cloud_path,
            Some(&infra),
            Some(json!({"launchable": false})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let mut spec = job_spec("ml");
    spec["resources"]["gpus"] = json!(8);
    let r = app.submit(&dev, spec).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        instances(&app).await.is_empty(),
        "no launch in a closed pool"
    );
    let r = app
        .call(
            Method::PATCH,
            &cloud_path,
            Some(&infra),
            Some(json!({"launchable": true})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    eventually("a burst once the pool reopens", 10, async || {
        let list = instances(&app).await;
        (!list.is_empty()).then_some(())
    })
    .await;
}

/// Two costs (issue 29): finance sets an owned pool's marginal cost (and only that); the pools
/// API shows what a GPU-hour costs in cash beside the internal rate, the default fifth until
/// then; a cloud pool's cash cost is its price, so a marginal cost there is refused.
#[tokio::test]
async fn finance_sets_an_owned_pools_marginal_cost_and_the_pools_api_shows_the_cash_rate() {
    let (app, _fake) = spawn_with_fake(|c| {
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CLOUD, "aws:test-east", 1.0));
    })
    .await;
    let finance = app.token("finance", None).await;
    let dev = app.token("developer", Some("ml")).await;
    let pool_of = async |id: &str| {
        let pools = app
            .call(Method::GET, "/api/v1/pools", Some(&dev), None)
            .await;
        pools.body["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == id)
            .unwrap()
            .clone()
    };
    // $2.00 internal rate: $0.40 in cash by default; the cloud pool's cash is its price.
    let onprem = pool_of(POOL).await;
    assert_eq!(
        (
            onprem["cash_per_gpu_hour"].clone(),
            onprem["marginal_set"].clone()
        ),
        (json!(0.4), json!(false))
    );
    assert_eq!(pool_of(CLOUD).await["cash_per_gpu_hour"], 1.0);

    let r = app
        .call(
            Method::PATCH,
            POOL_PATH,
            Some(&finance),
            Some(json!({"marginal_usd_per_gpu_hour": 0.25})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["cash_per_gpu_hour"], 0.25);
    assert_eq!(r.body["price_per_gpu_hour"], 2.0, "the internal rate stays");
    let onprem = pool_of(POOL).await;
    assert_eq!(
        (
            onprem["cash_per_gpu_hour"].clone(),
            onprem["marginal_set"].clone()
        ),
        (json!(0.25), json!(true))
    );
    let entries = audit(&app, &format!("?target=pool:{}", POOL.replace('/', "%2F"))).await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0]["before"]["marginal_usd_per_gpu_hour"],
        json!(null)
    );
    assert_eq!(entries[0]["after"]["marginal_usd_per_gpu_hour"], 0.25);

    let cloud_path = format!("/api/v1/pools/{}", CLOUD.replace('/', "%2F"));
    for (path, token, body, status, field) in [
        (
            POOL_PATH.to_string(),
            &finance,
            json!({"marginal_usd_per_gpu_hour": -0.1}),
            400,
            Some("marginal_usd_per_gpu_hour"),
        ),
        (
            cloud_path.clone(),
            &finance,
            json!({"marginal_usd_per_gpu_hour": 0.1}),
            400,
            Some("marginal_usd_per_gpu_hour"),
        ),
        // Finance's own field only; infra's stay infra's.
        (
            POOL_PATH.to_string(),
            &finance,
            json!({"marginal_usd_per_gpu_hour": 0.1, "node_limit": 9}),
            403,
            None,
        ),
        (
            POOL_PATH.to_string(),
            &dev,
            json!({"marginal_usd_per_gpu_hour": 0.1}),
            403,
            None,
        ),
    ] {
        let r = app
            .call(Method::PATCH, &path, Some(token), Some(body))
            .await;
        assert_eq!(r.status.as_u16(), status, "{}", r.body);
        if let Some(field) = field {
            assert_eq!(r.error_field(), field, "{}", r.body);
        }
    }
    // Nothing refused changed anything.
    assert_eq!(pool_of(POOL).await["cash_per_gpu_hour"], 0.25);
    assert_eq!(pool_of(POOL).await["node_limit"], onprem["node_limit"]);
}

#[tokio::test]
async fn the_openapi_document_lists_the_policy_routes() {
    let app = TestApp::spawn().await;
    let doc = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(doc.status, StatusCode::OK);
    let paths = &doc.body["paths"];
    for (path, method) in [
        ("/policies", "get"),
        ("/policies/{team}", "get"),
        ("/policies/{team}", "put"),
        ("/policies/{team}/what-if", "post"),
        ("/audit", "get"),
        ("/pools/{id}", "patch"),
    ] {
        assert!(
            paths[path][method].is_object(),
            "openapi lacks {method} {path}"
        );
    }
    for schema in [
        "PolicyBody",
        "PolicyView",
        "AuditList",
        "WhatIfReport",
        "PoolPatch",
    ] {
        assert!(
            doc.body["components"]["schemas"][schema].is_object(),
            "openapi lacks {schema}"
        );
    }
}

#[tokio::test]
async fn the_cli_sets_a_policy_from_toml_and_reads_it_back() {
    let app = TestApp::spawn().await;
    let finance = app.token("finance", None).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ml.toml");
    std::fs::write(
        &file,
        r#"
max_price_per_gpu_hour = 4.0
allowed_providers = ["onprem"]

[budget]
amount_usd = 500
period = "month"
alert_at = [0.5, 0.9]

[[windows]]
priority = "low"
from = "20:00"
to = "08:00"
tz = "Asia/Shanghai"
"#,
    )
    .unwrap();
    let client = switchyard_broker::cli::Client::new(&app.url, finance.clone()).unwrap();
    switchyard_broker::cli::policy_set(&client, "ml", &file, None)
        .await
        .unwrap();
    switchyard_broker::cli::policy_get(&client, "ml", None)
        .await
        .unwrap();
    let r = app
        .call(Method::GET, "/api/v1/policies/ml", Some(&finance), None)
        .await;
    assert_eq!(r.body["version"], 1);
    assert_eq!(r.body["policy"]["budget"]["amount_usd"], 500.0);
    assert_eq!(r.body["policy"]["windows"][0]["tz"], "Asia/Shanghai");
    // A typo is caught before anything is sent.
    std::fs::write(&file, "max_price_per_gpu_hr = 4.0\n").unwrap();
    let err = switchyard_broker::cli::policy_set(&client, "ml", &file, None)
        .await
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("max_price_per_gpu_hr"),
        "{err:#}"
    );
}
