//! A standalone services gateway (`switchyard gateway`, its own process) in front of
//! `switchyard up`, with real agents and a real replica process: calls go through it, its
//! reports reach the service's view, and after it is killed (-9) and started again calls
//! succeed once more and the service has lost nothing — the same ready replica, the traffic
//! seen before the restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::process::Command;
use std::time::Duration;
use switchyard_tests::{Proc, Up, bin, eventually, free_port};

/// A replica: an HTTP server on `$PORT` answering its `VERSION`.
const REPLICA: &str = r#"
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ.get("VERSION", "?").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"#;

fn start_gateway(up: &Up, port: u16, log: &str) -> Proc {
    let mut cmd = Command::new(bin("switchyard"));
    cmd.args(["gateway", "--broker", &up.url])
        .args(["--region", "onprem:local-dc1"])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("SWITCHYARD_TOKEN", &up.token);
    Proc::spawn("gateway", cmd, &up.dir.path().join(log)).unwrap()
}

async fn call(up: &Up, url: &str) -> (u16, String) {
    match up.http.get(url).bearer_auth(&up.token).send().await {
        Ok(r) => (r.status().as_u16(), r.text().await.unwrap_or_default()),
        Err(e) => (0, e.to_string()),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_gateway_restarts_without_losing_replica_state() {
    let up = Up::start(&[], 8).await;
    let r = up
        .http
        .post(format!("{}/api/v1/services", up.url))
        .bearer_auth(&up.token)
        .json(&json!({
            "name": "chat", "team": "ml",
            "command": ["python3", "-c", REPLICA],
            "env": {"VERSION": "v1"},
            "resources": {"gpus": 1},
            "replicas": {"min": 1, "max": 2},
            // A long window: the view keeps the calls from before the restart.
            "scaling": {"window_s": 600},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let service = eventually("a ready replica", Duration::from_secs(60), || async {
        let s = up.get(&format!("/api/v1/services/{id}")).await;
        (ready_jobs(&s).len() == 1).then_some(s)
    })
    .await;
    let replicas = ready_jobs(&service);

    let port = free_port();
    let mut gateway = start_gateway(&up, port, "gateway-1.log");
    let url = format!("http://127.0.0.1:{port}/svc/ml/chat/");
    eventually(
        "an answer through the standalone gateway",
        Duration::from_secs(30),
        || async { (call(&up, &url).await == (200, "v1".to_string())).then_some(()) },
    )
    .await;
    for _ in 0..10 {
        assert_eq!(call(&up, &url).await, (200, "v1".to_string()));
    }
    let requests = |s: &Value| s["traffic"]["requests"].as_u64().unwrap_or(0);
    eventually(
        "its reports in the view",
        Duration::from_secs(20),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            (requests(&s) >= 11).then_some(())
        },
    )
    .await;

    // Killed without a word: nothing answers on its port.
    gateway.signal_group(Signal::SIGKILL);
    gateway.wait_exit(Duration::from_secs(10)).unwrap();
    assert_eq!(call(&up, &url).await.0, 0);

    // Started again: it reads its routes from the broker and calls succeed.
    let _gateway = start_gateway(&up, port, "gateway-2.log");
    eventually(
        "an answer through the restarted gateway",
        Duration::from_secs(30),
        || async { (call(&up, &url).await == (200, "v1".to_string())).then_some(()) },
    )
    .await;
    for _ in 0..5 {
        assert_eq!(call(&up, &url).await, (200, "v1".to_string()));
    }
    // Nothing of the service was lost: the same ready replica, the traffic before the
    // restart and the calls after it.
    let s = eventually(
        "the calls after the restart in the view",
        Duration::from_secs(20),
        || async {
            let s = up.get(&format!("/api/v1/services/{id}")).await;
            (requests(&s) >= 17).then_some(s)
        },
    )
    .await;
    assert_eq!(ready_jobs(&s), replicas, "{s}");
    assert_eq!(s["state"], "ready", "{s}");
    assert_eq!(s["traffic"]["errors"], 0, "{}", s["traffic"]);
}
