//! Inference services end to end on `switchyard up`, with real agents and real replica
//! processes: deploy, readiness, a rolling update and a delete, each seen over REST.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use std::time::Duration;
use switchyard_tests::{Up, eventually};

/// A replica: an HTTP server on `$PORT` whose `/health` fails its first two probes, then
/// answers 200 with the replica's `VERSION`.
const REPLICA: &str = r#"
import http.server, os
seen = {"health": 0}
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health":
            seen["health"] += 1
            if seen["health"] <= 2:
                self.send_response(503); self.end_headers(); return
        body = os.environ.get("VERSION", "?").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"#;

fn spec(version: &str, min: i64) -> Value {
    json!({
        "name": "chat", "team": "ml",
        "command": ["python3", "-c", REPLICA],
        "env": {"VERSION": version},
        "resources": {"gpus": 1},
        "priority": "high",
        "replicas": {"min": min, "max": 4},
        "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 2}
    })
}

fn ready_versions(service: &Value) -> Vec<i64> {
    let mut v: Vec<i64> = service["replicas"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter(|r| r["state"] == "ready")
                .filter_map(|r| r["spec_version"].as_i64())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Where the service's ready replicas listen, from their `replica_ready` events.
async fn ready_endpoints(up: &Up, id: &str) -> Vec<String> {
    let service = up.get(&format!("/api/v1/services/{id}")).await;
    let ready: Vec<String> = service["replicas"]
        .as_array()
        .map(|rs| {
            rs.iter()
                .filter(|r| r["state"] == "ready")
                .filter_map(|r| r["job_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let events = up.get(&format!("/api/v1/services/{id}/events")).await;
    events["events"]
        .as_array()
        .map(|es| {
            es.iter()
                .filter(|e| e["kind"] == "replica_ready")
                .filter_map(|e| e["message"].as_str())
                .filter(|m| ready.iter().any(|j| m.contains(j.as_str())))
                .filter_map(|m| m.split(" at ").nth(1))
                .filter_map(|rest| rest.split(' ').next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_deploys_its_replicas_rolls_to_a_new_version_and_drains_on_delete() {
    let up = Up::start(&[], 8).await;
    let (status, created) = up
        .send(
            reqwest::Method::POST,
            "/api/v1/services",
            Some(spec("v1", 2)),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["desired_replicas"], 2);

    // Two replicas start; each becomes ready only once its probe passes; with `min` 2 they
    // end up on two nodes (one more starts off the node the first two share, if they do).
    let service = eventually(
        "two ready replicas of version 1, on two nodes",
        Duration::from_secs(60),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            let nodes: std::collections::BTreeSet<&str> = s["replicas"]
                .as_array()?
                .iter()
                .filter(|r| r["state"] == "ready")
                .filter_map(|r| r["node"].as_str())
                .collect();
            let all = s["replicas"].as_array()?.len();
            (ready_versions(&s) == [1, 1] && s["state"] == "ready" && nodes.len() == 2 && all == 2)
                .then_some(s.clone())
        },
    )
    .await;
    assert_eq!(
        service["replicas"].as_array().unwrap().len(),
        2,
        "{service}"
    );
    // They really listen where their agent said, and run version 1.
    let endpoints = ready_endpoints(&up, &id).await;
    assert_eq!(endpoints.len(), 2, "{endpoints:?}");
    for endpoint in &endpoints {
        let body = up
            .http
            .get(format!("http://{endpoint}/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "v1");
    }

    // Through the gateway: the team's (here the admin's) token gets an answer; no token, 401.
    let endpoint = service["endpoint"].as_str().unwrap().to_string();
    assert!(endpoint.ends_with("/svc/ml/chat/"), "{endpoint}");
    let call = {
        let http = up.http.clone();
        let endpoint = endpoint.clone();
        move |token: Option<String>| {
            let http = http.clone();
            let endpoint = endpoint.clone();
            async move {
                let mut req = http.get(&endpoint);
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                match req.send().await {
                    Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
                    Err(e) => (0, e.to_string()),
                }
            }
        }
    };
    assert_eq!(call(Some(up.token.clone())).await, (200, "v1".to_string()));
    assert_eq!(call(None).await.0, 401);

    // A new version rolls: new replicas start, old ones drain only as new ones are ready, so
    // at least the desired count stays ready all along, and callers see no failure.
    let caller = {
        let call = call.clone();
        let token = up.token.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let started = std::time::Instant::now();
            while started.elapsed() < Duration::from_secs(120) {
                let (status, body) = call(Some(token.clone())).await;
                let done = body == "v2";
                answers.push((status, body));
                if done && answers.iter().rev().take(20).all(|(_, b)| b == "v2") {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            answers
        })
    };
    let (status, updated) = up
        .send(
            reqwest::Method::PUT,
            &format!("/api/v1/services/{id}"),
            Some(spec("v2", 2)),
        )
        .await;
    assert_eq!(status, 200, "{updated}");
    assert_eq!(updated["spec_version"], 2);
    let fewest_ready = std::cell::Cell::new(usize::MAX);
    eventually(
        "two ready replicas of version 2 and no other",
        Duration::from_secs(90),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            let ready = ready_versions(&s);
            fewest_ready.set(fewest_ready.get().min(ready.len()));
            let others = s["replicas"]
                .as_array()
                .map(|rs| rs.iter().filter(|r| r["spec_version"] != 2).count())
                .unwrap_or(0);
            (ready == [2, 2] && others == 0).then_some(())
        },
    )
    .await;
    let fewest_ready = fewest_ready.get();
    // The gateway's figures show in the service: the calls above, their latency, no errors.
    let s = up.get(&format!("/api/v1/services/{id}")).await;
    assert!(
        s["traffic"]["requests"].as_u64().unwrap() > 10,
        "{}",
        s["traffic"]
    );
    assert_eq!(s["traffic"]["errors"], 0, "{}", s["traffic"]);
    assert!(
        s["traffic"]["p95_ms"].as_f64().is_some(),
        "{}",
        s["traffic"]
    );
    let answers = caller.await.unwrap();
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} calls failed during the update: {failed:?}",
        failed.len(),
        answers.len()
    );
    assert_eq!(answers.last().map(|(_, b)| b.as_str()), Some("v2"));
    assert!(
        fewest_ready >= 2,
        "the update left {fewest_ready} ready replicas at one point"
    );

    // Delete: every replica drains; the service reads stopped, then leaves the list.
    let (status, _) = up
        .send(
            reqwest::Method::DELETE,
            &format!("/api/v1/services/{id}"),
            None,
        )
        .await;
    assert_eq!(status, 202);
    eventually("no replica left", Duration::from_secs(60), || async {
        let list = up.get("/api/v1/services").await;
        let gone = list["services"]
            .as_array()
            .is_some_and(|s| s.iter().all(|s| s["id"] != id.as_str()));
        gone.then_some(())
    })
    .await;
    let events = up.get(&format!("/api/v1/services/{id}/events")).await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    for kind in [
        "deployed",
        "replica_started",
        "replica_ready",
        "updated",
        "replica_drained",
        "deleted",
    ] {
        assert!(kinds.contains(&kind), "no {kind} event in {kinds:?}");
    }
}

/// A replica whose `/health` fails once a file named after its port appears in `SICK_DIR`;
/// every answer says which port served it.
const SICKLY: &str = r#"
import http.server, os
port = int(os.environ["PORT"])
sick = os.path.join(os.environ["SICK_DIR"], str(port))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/health" and os.path.exists(sick):
            self.send_response(503); self.end_headers(); return
        body = str(port).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_fails_its_probe_gets_no_traffic_and_is_replaced() {
    use std::os::unix::fs::PermissionsExt;
    let up = Up::start(&[], 8).await;
    // Readable by the uids an agent running as root gives its jobs.
    let sick_dir = up.dir.path().join("sick");
    std::fs::create_dir_all(&sick_dir).unwrap();
    std::fs::set_permissions(&sick_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(up.dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let spec = json!({
        "name": "sickly", "team": "ml",
        "command": ["python3", "-c", SICKLY],
        "env": {"SICK_DIR": sick_dir.to_string_lossy()},
        "resources": {"gpus": 1},
        "replicas": {"min": 2, "max": 2},
        "readiness": {"path": "/health", "period_s": 1, "timeout_s": 1, "failure_threshold": 2}
    });
    let (status, created) = up
        .send(reqwest::Method::POST, "/api/v1/services", Some(spec))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let endpoint = created["endpoint"].as_str().unwrap().to_string();
    // Two ready replicas, spread over the two nodes, and no other.
    eventually(
        "two ready replicas on two nodes",
        Duration::from_secs(60),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            let replicas = s["replicas"].as_array()?;
            let nodes: std::collections::BTreeSet<&str> =
                replicas.iter().filter_map(|r| r["node"].as_str()).collect();
            (ready_versions(&s) == [1, 1] && replicas.len() == 2 && nodes.len() == 2).then_some(())
        },
    )
    .await;
    let endpoints = ready_endpoints(&up, &id).await;
    assert_eq!(endpoints.len(), 2, "{endpoints:?}");
    let sick_port = endpoints[0].rsplit(':').next().unwrap().to_string();
    let sick_job = {
        let s = up.get(&format!("/api/v1/services/{id}")).await;
        let events = up.get(&format!("/api/v1/services/{id}/events")).await;
        let line = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["message"].as_str())
            .find(|m| m.contains(&endpoints[0]))
            .unwrap()
            .to_string();
        s["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["job_id"].as_str())
            .find(|j| line.contains(j))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("no replica named in {line:?}"))
    };
    std::fs::write(sick_dir.join(&sick_port), b"").unwrap();

    // Once its agent reports it unready, the gateway sends it nothing: every answer comes
    // from the other replica, and none fails.
    eventually(
        "the sick replica reported unready",
        Duration::from_secs(30),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            s["replicas"]
                .as_array()?
                .iter()
                .any(|r| r["job_id"] == sick_job.as_str() && r["state"] != "ready")
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..40 {
        let r = up
            .http
            .get(&endpoint)
            .bearer_auth(&up.token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let port = r.text().await.unwrap();
        assert_ne!(port, sick_port, "the unready replica was sent a request");
    }

    // The reconciler replaces it: the sick one stops, a new one starts and is ready.
    eventually(
        "two ready replicas again, the sick one gone",
        Duration::from_secs(60),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            let replicas = s["replicas"].as_array()?;
            let gone = replicas.iter().all(|r| r["job_id"] != sick_job.as_str());
            (gone && ready_versions(&s) == [1, 1]).then_some(())
        },
    )
    .await;
    // Stopped as unhealthy, or — when its replacement (started to keep the service on two
    // nodes) was ready first — as the one replica too many, not ready.
    let events = up.get(&format!("/api/v1/services/{id}/events")).await;
    let replaced = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["message"].as_str())
        .any(|m| {
            m.contains(&format!("stopping replica {sick_job}"))
                && (m.contains("readiness probe has failed") || m.contains("scaled down"))
        });
    assert!(replaced, "{events}");
}
