//! Leader failover on PostgreSQL that keeps an inference service up, with real processes: two
//! `switchyard serve` replicas on one database, two agents that know both, a standalone
//! `switchyard gateway` pointed at the follower, and a service of two `model-emulator`
//! replicas under a closed-loop load through the gateway. The leader is killed (-9); the
//! follower leads within 10 s, and not one call fails over the whole run. The new leader then
//! holds the same two ready replicas (none replaced), both keep serving, and its reconciler
//! acts: a delete through it drains the replicas to stopped while long requests still in
//! flight on them finish.
//!
//! Needs a PostgreSQL server: `SWITCHYARD_TEST_PG_URL=postgres://user@host:port`, which
//! `scripts/test.sh` sets for its PostgreSQL step (a throwaway cluster). Without it the test
//! says so and returns: replicas need PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use switchyard_tests::*;

/// The region of the harness's pool ([`broker_config`]): the gateway serves it.
const REGION: &str = "onprem:e2e-dc";

struct Replica {
    url: String,
    proc: Proc,
}

async fn ready(http: &reqwest::Client, url: &str) -> Option<Value> {
    let r = http.get(format!("{url}/readyz")).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

async fn leads(http: &reqwest::Client, url: &str) -> bool {
    ready(http, url).await.is_some_and(|h| h["leader"] == true)
}

/// A `switchyard serve` replica named `name` on `database_url`, ready to answer.
async fn start_replica(
    dir: &Path,
    http: &reqwest::Client,
    name: &str,
    database_url: &str,
) -> Replica {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let extra = format!("replica_name = \"{name}\"\ndatabase_url = \"{database_url}\"\n");
    let config = broker_config(port, &dir.join(format!("data-{name}")), &extra);
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(bin("switchyard"));
    cmd.arg("serve").arg("--config").arg(path);
    let proc = Proc::spawn(name, cmd, &dir.join(format!("{name}.log"))).unwrap();
    eventually(
        &format!("replica {name} to be ready"),
        Duration::from_secs(30),
        || ready(http, &url),
    )
    .await;
    Replica { url, proc }
}

/// The last 60 lines of every log in `dir`, for a failure's message.
fn dump(dir: &Path) -> String {
    let mut s = String::new();
    let mut logs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    for p in logs {
        let text = std::fs::read_to_string(&p).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(60).collect();
        s.push_str(&format!("--- {} (last 60 lines)\n", p.display()));
        for l in tail.iter().rev() {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// GET `path` on the broker at `url` as `token`; `Null` when it does not answer JSON.
async fn get(http: &reqwest::Client, url: &str, token: &str, path: &str) -> Value {
    match http
        .get(format!("{url}{path}"))
        .bearer_auth(token)
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// The service's ready replicas' job ids, sorted.
fn ready_jobs(service: &Value) -> Vec<String> {
    let mut jobs: Vec<String> = service["replicas"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter(|r| r["state"] == "ready")
                .filter_map(|r| r["job_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    jobs.sort();
    jobs
}

/// The service's events, oldest first: (id, kind, message).
async fn events(
    http: &reqwest::Client,
    url: &str,
    token: &str,
    id: &str,
) -> Vec<(i64, String, String)> {
    let v = get(
        http,
        url,
        token,
        &format!("/api/v1/services/{id}/events?limit=1000"),
    )
    .await;
    v["events"]
        .as_array()
        .map(|es| {
            es.iter()
                .map(|e| {
                    (
                        e["id"].as_i64().unwrap_or(0),
                        e["kind"].as_str().unwrap_or("").to_string(),
                        e["message"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where each ready replica listens (job id → `host:port`), from its `replica_ready` event
/// ("replica JOB on NODE at HOST:PORT is ready").
fn endpoints(events: &[(i64, String, String)]) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|(_, kind, _)| kind == "replica_ready")
        .filter_map(|(_, _, m)| {
            let job = m.strip_prefix("replica ")?.split(' ').next()?;
            let addr = m.split(" at ").nth(1)?.split(' ').next()?;
            Some((job.to_string(), addr.to_string()))
        })
        .collect()
}

/// How many requests the model emulator at `addr` has answered (`GET /stats`).
async fn served(http: &reqwest::Client, addr: &str) -> Option<u64> {
    let r = http.get(format!("http://{addr}/stats")).send().await.ok()?;
    r.json::<Value>().await.ok()?["served"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_keeps_a_service_answering_through_the_gateway() {
    let Some(server) = std::env::var("SWITCHYARD_TEST_PG_URL")
        .ok()
        .filter(|u| !u.is_empty())
    else {
        eprintln!("skipped: broker replicas need PostgreSQL (set SWITCHYARD_TEST_PG_URL)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let database_url = fresh_pg_database(&server, "sy_service_failover");

    let mut a = start_replica(dir.path(), &http, "a", &database_url).await;
    eventually("replica a to lead", Duration::from_secs(20), || async {
        leads(&http, &a.url).await.then_some(())
    })
    .await;
    let b = start_replica(dir.path(), &http, "b", &database_url).await;
    assert!(!leads(&http, &b.url).await, "two leaders");
    let admin = std::fs::read_to_string(dir.path().join("data-a/admin.token"))
        .unwrap()
        .trim()
        .to_string();

    // Two agents of four GPUs each that know both replicas: when the leader dies they carry on
    // with the other one, and the replicas they run with them.
    let brokers = format!("{},{}", a.url, b.url);
    let mut agents = Vec::new();
    for i in 0..2 {
        let r = http
            .post(format!("{}/api/v1/enrolment-tokens", b.url))
            .bearer_auth(&admin)
            .json(&json!({"pool": POOL}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let token = r.json::<Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_string();
        let name = format!("agent-{i}");
        let mut cmd = Command::new(bin("switchyard-agent"));
        cmd.args(["--broker", &brokers, "--name", &name])
            .args(["--fake-gpus", "4xH100-80GB"])
            .env("SWITCHYARD_ENROL_TOKEN", &token)
            .env("RUST_LOG", "info");
        let log = dir.path().join(format!("{name}.log"));
        agents.push(Proc::spawn(&name, cmd, &log).unwrap());
    }
    eventually(
        "the agents to register",
        Duration::from_secs(30),
        || async {
            let pools = get(&http, &b.url, &admin, "/api/v1/pools").await;
            let nodes = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["id"] == POOL)?["nodes"]
                .as_u64()?;
            (nodes >= 2).then_some(())
        },
    )
    .await;

    // The gateway takes one broker URL: the follower's, so that it outlives the leader.
    let gateway_port = free_port();
    let mut cmd = Command::new(bin("switchyard"));
    cmd.args(["gateway", "--broker", &b.url, "--region", REGION])
        .args(["--listen", &format!("127.0.0.1:{gateway_port}")])
        .env("SWITCHYARD_TOKEN", &admin);
    let _gateway = Proc::spawn("gateway", cmd, &dir.path().join("gateway.log")).unwrap();

    // The service, deployed through the leader: two replicas, no more.
    let emulator = bin("model-emulator");
    let r = http
        .post(format!("{}/api/v1/services", a.url))
        .bearer_auth(&admin)
        .json(&json!({
            "name": "chat", "team": "ml",
            "command": [emulator.to_string_lossy(), "--speedup", "20"],
            "resources": {"gpus": 1},
            "priority": "critical",
            "replicas": {"min": 2, "max": 2},
            "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 2},
            // A window longer than the run: the view counts every call's error, if any.
            "scaling": {"window_s": 600},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Two ready replicas on the two nodes, and no other (with `min` 2 the service spreads:
    // a third starts off the node the first two share, if they do, and one of those goes).
    let service = eventually(
        "two ready replicas on two nodes",
        Duration::from_secs(90),
        || async {
            let s = get(&http, &a.url, &admin, &format!("/api/v1/services/{id}")).await;
            let replicas = s["replicas"].as_array()?;
            let nodes: std::collections::BTreeSet<&str> = replicas
                .iter()
                .filter(|r| r["state"] == "ready")
                .filter_map(|r| r["node"].as_str())
                .collect();
            let spread = nodes.len() == 2 && replicas.len() == 2;
            (ready_jobs(&s).len() == 2 && s["state"] == "ready" && spread).then_some(s.clone())
        },
    )
    .await;
    let replicas = ready_jobs(&service);
    let before = events(&http, &a.url, &admin, &id).await;
    // Where the two replicas there are now listen (a replica stopped while the service spread
    // is left out).
    let addresses: Vec<(String, String)> = endpoints(&before)
        .into_iter()
        .filter(|(job, _)| replicas.contains(job))
        .collect();
    assert_eq!(addresses.len(), 2, "{before:?}");

    // Calls through the gateway, without pause.
    let t0 = Instant::now();
    let url = format!("http://127.0.0.1:{gateway_port}/svc/ml/chat/v1/completions");
    eventually(
        "an answer through the gateway",
        Duration::from_secs(30),
        || async {
            let r = http
                .post(&url)
                .bearer_auth(&admin)
                .json(&json!({"prompt_tokens": 10, "max_tokens": 1}))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;
    let load = Callers::start(
        &url,
        &admin,
        4,
        json!({"prompt_tokens": 200, "max_tokens": 40}),
        t0,
    );
    eventually("calls to flow", Duration::from_secs(30), || async {
        (load.ok() >= 50).then_some(())
    })
    .await;
    let mut served_at_kill = Vec::new();
    for (job, addr) in &addresses {
        served_at_kill.push((job.clone(), served(&http, addr).await.unwrap()));
    }
    let last_event_before = before.iter().map(|e| e.0).max().unwrap_or(0);

    // kill -9 the leader.
    let killed = Instant::now();
    let killed_at = t0.elapsed().as_secs_f64();
    let ok_at_kill = load.ok();
    a.proc.signal_group(Signal::SIGKILL);
    a.proc.wait_exit(Duration::from_secs(10)).unwrap();
    eventually(
        "replica b to lead after the leader died",
        Duration::from_secs(30),
        || async { leads(&http, &b.url).await.then_some(()) },
    )
    .await;
    let failover = killed.elapsed();
    eprintln!(
        "service failover: replica b leads {:.2} s after kill -9 of replica a",
        failover.as_secs_f64()
    );
    assert!(
        failover < Duration::from_secs(10),
        "the follower took {failover:?} to lead\n{}",
        dump(dir.path())
    );

    // Keep calling past the agents' lease TTL (10 s) under the new leader: a replica it took
    // for lost would be replaced, and calls to it would fail.
    let led = Instant::now();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let view = get(&http, &b.url, &admin, &format!("/api/v1/services/{id}")).await;
    for (job, addr) in &addresses {
        let at_kill = served_at_kill.iter().find(|(j, _)| j == job).unwrap().1;
        let now = served(&http, addr).await;
        assert!(
            now.is_some_and(|n| n > at_kill),
            "replica {job} at {addr} served nothing after the failover ({at_kill} before, {now:?} now)"
        );
    }
    let (ok, failures) = load.stop().await;
    eprintln!(
        "service failover: {ok} calls answered ({} after the kill), {} failed, over {:.1} s; \
         the kill at {killed_at:.1} s, {:.1} s under the new leader",
        ok - ok_at_kill,
        failures.len(),
        t0.elapsed().as_secs_f64(),
        led.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} of {} calls failed (kill at {killed_at:.1} s; first ones: {:?})\n{}",
        failures.len(),
        ok + failures.len() as u64,
        failures.iter().take(10).collect::<Vec<_>>(),
        dump(dir.path())
    );
    assert!(ok > ok_at_kill + 50, "{ok} calls, {ok_at_kill} at the kill");

    // The new leader's view: the same two replicas ready, none replaced, two desired, and the
    // gateway's figures (reported to it) without an error.
    assert_eq!(view["state"], "ready", "{view}");
    assert_eq!(view["desired_replicas"], 2, "{view}");
    assert_eq!(ready_jobs(&view), replicas, "{view}");
    assert_eq!(view["replicas"].as_array().map(Vec::len), Some(2), "{view}");
    assert_eq!(view["traffic"]["errors"], 0, "{}", view["traffic"]);
    assert!(
        view["traffic"]["requests"].as_u64().unwrap_or(0) > ok_at_kill,
        "{}",
        view["traffic"]
    );
    let after = events(&http, &b.url, &admin, &id).await;
    let since: Vec<_> = after
        .iter()
        .filter(|e| e.0 > last_event_before)
        .map(|e| (e.1.as_str(), e.2.as_str()))
        .collect();
    assert!(
        since.is_empty(),
        "the service changed across the failover: {since:?}"
    );

    // Delete through the new leader while a request of about 6 s is in flight on each
    // replica — longer than the drain's settle time (4 s): the replicas drain (nothing new,
    // what they have finishes; the gateway keeps counting a deleted service's requests in
    // flight until they end), then stop.
    let long: Vec<_> = (0..2)
        .map(|_| {
            let (http, url, admin) = (http.clone(), url.clone(), admin.clone());
            tokio::spawn(async move {
                let r = http
                    .post(&url)
                    .bearer_auth(&admin)
                    .json(&json!({"prompt_tokens": 100, "max_tokens": 6000}))
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await;
                let answer = match r {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.text().await.unwrap_or_default())
                    }
                    Err(e) => (0, e.to_string()),
                };
                (answer, Instant::now())
            })
        })
        .collect();
    eventually(
        "a long request in service on each replica",
        Duration::from_secs(10),
        || async {
            for (_, addr) in &addresses {
                let r = http.get(format!("http://{addr}/stats")).send().await.ok()?;
                let stats: Value = r.json().await.ok()?;
                if stats["in_service"].as_u64()? < 1 {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let r = http
        .delete(format!("{}/api/v1/services/{id}", b.url))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let deleted = Instant::now();
    let stopped = eventually(
        "the service drained to stopped",
        Duration::from_secs(90),
        || async {
            let s = get(&http, &b.url, &admin, &format!("/api/v1/services/{id}")).await;
            (s["state"] == "stopped" && s["replicas"].as_array().is_some_and(Vec::is_empty))
                .then_some(s)
        },
    )
    .await;
    eprintln!(
        "service failover: deleted through the new leader, drained to stopped in {:.1} s",
        deleted.elapsed().as_secs_f64()
    );
    for call in long {
        let ((status, body), ended) = call.await.unwrap();
        assert_eq!(status, 200, "a long request failed in the drain: {body}");
        assert!(ended > deleted, "a long request ended before the delete");
    }
    let after = events(&http, &b.url, &admin, &id).await;
    let kinds: Vec<&str> = after
        .iter()
        .filter(|e| e.0 > last_event_before)
        .map(|e| e.1.as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "replica_drained").count(),
        2,
        "{after:?}"
    );
    assert!(kinds.contains(&"deleted"), "{after:?}");
    assert!(!kinds.contains(&"replica_failed"), "{after:?}");
    for job in &replicas {
        let j = get(&http, &b.url, &admin, &format!("/api/v1/jobs/{job}")).await;
        assert_eq!(j["state"], "cancelled", "replica {job}: {j}\n{stopped}");
    }
    drop(agents);
    drop(b);
}
