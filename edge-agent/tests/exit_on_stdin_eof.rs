//! The real `switchyard-agent` binary with `--exit-on-stdin-eof`: the end of file on its stdin
//! (whoever started it is gone) is an orderly shutdown, as SIGTERM is; without the flag, a
//! closed stdin changes nothing.
#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An agent that cannot reach its broker (a port nothing listens on), so it stays in its
/// enrolment retries until it is told to stop.
fn agent(exit_on_eof: bool, stdin: Stdio) -> (Child, tempfile::NamedTempFile) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard-agent"));
    cmd.args(["--broker", &format!("http://127.0.0.1:{port}")])
        .args(["--fake-gpus", "1xL4", "--name", "eof-test"])
        .env("SWITCHYARD_ENROL_TOKEN", "enrol-me")
        .env("RUST_LOG", "info")
        .stdin(stdin)
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap());
    if exit_on_eof {
        cmd.arg("--exit-on-stdin-eof");
    }
    (cmd.spawn().unwrap(), log)
}

fn read(log: &tempfile::NamedTempFile) -> String {
    let mut s = String::new();
    log.reopen().unwrap().read_to_string(&mut s).unwrap();
    s
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn wait_started(log: &tempfile::NamedTempFile) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !read(log).contains("agent starting") {
        assert!(Instant::now() < deadline, "never started: {}", read(log));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn end_of_file_on_stdin_shuts_the_agent_down() {
    let (mut child, log) = agent(true, Stdio::piped());
    wait_started(&log);
    assert!(
        wait_exit(&mut child, Duration::from_millis(500)).is_none(),
        "exited with its stdin open: {}",
        read(&log)
    );
    drop(child.stdin.take());
    let status = wait_exit(&mut child, Duration::from_secs(5));
    let text = read(&log);
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {text}");
    assert!(text.contains("stdin closed"), "{text}");
}

#[test]
fn without_the_flag_a_closed_stdin_changes_nothing() {
    let (mut child, log) = agent(false, Stdio::null());
    wait_started(&log);
    let status = wait_exit(&mut child, Duration::from_secs(1));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    assert!(status.is_none(), "exited: {}", read(&log));
    let status = wait_exit(&mut child, Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{}", read(&log));
}
