//! A multi-node job on `switchyard up`, with real processes: two ranks on two on-prem agents
//! find each other through `MASTER_ADDR`/`MASTER_PORT` and exchange a message over TCP; the
//! job succeeds when both exit 0. A rank that fails fails the job and stops the other rank.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Value, json};
use switchyard_tests::*;

/// Rank 0 listens on MASTER_PORT and answers; every other rank connects to MASTER_ADDR, says
/// hello and prints the answer. Each prints what it got.
const RENDEZVOUS: &str = r#"
import os, socket, sys, time
rank = int(os.environ["SWITCHYARD_NODE_RANK"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
n = os.environ["SWITCHYARD_NUM_NODES"]
if rank == 0:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(8)
    s.settimeout(60)
    c, _ = s.accept()
    got = c.recv(200).decode()
    c.sendall(b"welcome from rank 0")
    print("rank 0 got: " + got, flush=True)
else:
    deadline = time.time() + 60
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                sys.exit("rank %d: no master at %s:%d" % (rank, addr, port))
            time.sleep(0.1)
    c.sendall(("hello from rank %d of %s" % (rank, n)).encode())
    print("rank %d got: %s" % (rank, c.recv(200).decode()), flush=True)
"#;

fn gang(name: &str, command: Value) -> Value {
    json!({"name": name, "team": "ml", "command": command,
           "resources": {"gpus": 1, "nodes": 2}, "regions": ["onprem:local-dc1"],
           "estimated_runtime_s": 60})
}

fn logs_text(logs: &Value) -> String {
    logs["entries"]
        .as_array()
        .map(|e| e.iter().filter_map(|x| x["text"].as_str()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ranks_on_up_meet_over_tcp_through_master_addr() {
    // `up`'s two on-prem agents, four GPUs each.
    let up = Up::start(&[], 8).await;
    let id = up
        .submit(gang("rendezvous", json!(["python3", "-c", RENDEZVOUS])))
        .await;
    let job = up
        .job_where(&id, 90, |j| {
            j["state"] == "succeeded" || j["state"] == "failed"
        })
        .await;
    let logs = up.get(&format!("/api/v1/jobs/{id}/logs")).await;
    let text = logs_text(&logs);
    assert_eq!(job["state"], "succeeded", "{job}\n{text}");
    assert_eq!(job["reason"], "every rank exited 0", "{job}");
    assert_eq!(job["attempts"], 2, "{job}");
    assert!(
        text.contains("rank 0 got: hello from rank 1 of 2"),
        "{text}"
    );
    assert!(text.contains("rank 1 got: welcome from rank 0"), "{text}");

    // Rank 1 fails at once; rank 0 would sleep for minutes: it is stopped, and the job fails
    // with rank 1's exit code and says so.
    let id = up
        .submit(gang(
            "one-fails",
            json!([
                "sh",
                "-c",
                "if [ \"$SWITCHYARD_NODE_RANK\" = 1 ]; then exit 7; fi; exec sleep 600"
            ]),
        ))
        .await;
    let job = up
        .job_where(&id, 60, |j| {
            j["state"] == "succeeded" || j["state"] == "failed"
        })
        .await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 7, "{job}");
    assert!(
        job["reason"].as_str().is_some_and(
            |r| r.starts_with("rank 1 on ") && r.ends_with("the other ranks were stopped")
        ),
        "{job}"
    );
    // Rank 0's sleep is gone and its GPUs are free again: all 8 on-prem GPUs.
    eventually(
        "the stopped rank's GPUs back",
        std::time::Duration::from_secs(60),
        || async {
            let pools = up.get("/api/v1/pools").await;
            let onprem = pools["pools"]
                .as_array()?
                .iter()
                .find(|p| p["provider"] == "onprem")?
                .clone();
            (onprem["gpus_free"] == 8).then_some(())
        },
    )
    .await;
}
