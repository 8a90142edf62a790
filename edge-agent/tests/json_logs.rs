//! The `switchyard-agent` binary logs JSON lines with `--json-logs` and text without: every
//! line it logs then parses as a JSON object with the level and the message; only the final
//! error, printed by `main` when the agent cannot go on, is plain text (as the broker's is).
#![allow(clippy::unwrap_used)]

use serde_json::Value;

/// The agent's stderr when it stops for want of an enrolment token (after logging its start).
fn stderr_of(flags: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard-agent"))
        .args(flags)
        .args(["--fake-gpus", "1xL4", "--broker", "http://127.0.0.1:9"])
        .env("RUST_LOG", "info")
        .env_remove("SWITCHYARD_ENROL_TOKEN")
        .env_remove("SWITCHYARD_STATE_DIR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8(out.stderr).unwrap()
}

#[test]
fn json_logs_are_one_json_object_a_line() {
    let stderr = stderr_of(&["--json-logs"]);
    let (logged, last) = {
        let lines: Vec<&str> = stderr.lines().collect();
        let (last, logged) = lines.split_last().unwrap();
        (logged.to_vec(), *last)
    };
    assert!(
        last.starts_with("switchyard-agent: no enrolment token"),
        "{stderr}"
    );
    assert!(!logged.is_empty(), "{stderr}");
    let lines: Vec<Value> = logged
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    for line in &lines {
        assert!(line["level"].is_string(), "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
        assert!(line["fields"]["message"].is_string(), "{line}");
    }
    let start = lines
        .iter()
        .find(|l| l["fields"]["message"] == "agent starting")
        .unwrap_or_else(|| panic!("{stderr}"));
    assert_eq!(start["level"], "INFO");
    assert_eq!(start["fields"]["brokers"], "http://127.0.0.1:9/");
}

#[test]
fn logs_are_text_by_default() {
    let stderr = stderr_of(&[]);
    let start = stderr
        .lines()
        .find(|l| l.contains("agent starting"))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(serde_json::from_str::<Value>(start).is_err(), "{start}");
    assert!(start.contains("INFO"), "{start}");
}
