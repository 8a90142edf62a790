//! A fake cloud's "instance": the bootstrap script the provider sent (EC2/Lambda user-data, a
//! GCE startup-script, Azure customData) run by bash in a sandbox directory that the script
//! treats as `/` (`SWITCHYARD_BOOT_ROOT`), with a `systemctl` stand-in that starts the unit's
//! `ExecStart` with its `EnvironmentFile`, as systemd would. A real `switchyard-agent` then
//! enrols with the broker using the token the script carried.
//!
//! The test's provider config installs the agent with
//! `install_command = "ln -s /path/to/switchyard-agent \"$R/usr/local/bin/switchyard-agent\""`
//! (see [`install_command`]). The machine's "hardware" — its simulated GPUs — comes from the
//! fake cloud's instance type, in `SWITCHYARD_FAKE_GPUS`, not from the script.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The `systemctl` of a sandbox: `enable --now UNIT` starts the unit's command in a process
/// group of its own, with the unit's environment file, logging to `$ROOT/agent.log`.
const SYSTEMCTL: &str = r#"#!/bin/bash
set -euo pipefail
root="$SWITCHYARD_BOOT_ROOT"
echo "$*" >> "$root/systemctl.log"
if [ "${1:-}" = "enable" ] && [ "${2:-}" = "--now" ]; then
  unit="$root/etc/systemd/system/$3"
  env_file="$(sed -n 's/^EnvironmentFile=//p' "$unit")"
  exec_start="$(sed -n 's/^ExecStart=//p' "$unit")"
  (
    set -a
    . "$env_file"
    set +a
    exec setsid "$exec_start" >> "$root/agent.log" 2>&1 < /dev/null
  ) &
  echo $! > "$root/agent.pid"
fi
"#;

/// The `install_command` that puts `agent` where the bootstrap's unit starts it.
pub fn install_command(agent: &Path) -> String {
    format!(
        "ln -sf {} \"$R/usr/local/bin/switchyard-agent\"",
        agent.display()
    )
}

/// One booted sandbox instance; its agent (and everything under it) is killed on drop.
pub struct Instance {
    root: tempfile::TempDir,
    agent_pid: Option<i32>,
}

impl Instance {
    /// Runs `script` to the end (cloud-init does the same) and returns the instance. `gpus` is
    /// the machine's hardware as the agent's `--fake-gpus` takes it (`8xH100`), if any.
    pub fn boot(script: &str, gpus: Option<&str>) -> anyhow::Result<Instance> {
        let root = tempfile::tempdir()?;
        let shim = root.path().join(".shim");
        std::fs::create_dir_all(&shim)?;
        let systemctl = shim.join("systemctl");
        std::fs::write(&systemctl, SYSTEMCTL)?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))?;
        for dir in ["usr/local/bin", "etc/systemd/system"] {
            std::fs::create_dir_all(root.path().join(dir))?;
        }
        let path = format!(
            "{}:{}",
            shim.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-c")
            .arg(script)
            .env("SWITCHYARD_BOOT_ROOT", root.path())
            .env("PATH", path)
            .env_remove("SWITCHYARD_FAKE_GPUS");
        if let Some(g) = gpus {
            cmd.env("SWITCHYARD_FAKE_GPUS", g);
        }
        let out = cmd.output()?;
        if !out.status.success() {
            anyhow::bail!(
                "the bootstrap script failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let pid = std::fs::read_to_string(root.path().join("agent.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok());
        Ok(Instance {
            root,
            agent_pid: pid,
        })
    }

    /// The sandbox directory (the instance's `/`).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The agent's log.
    pub fn agent_log(&self) -> PathBuf {
        self.root.path().join("agent.log")
    }

    /// Whether the agent the script started is still running.
    pub fn agent_running(&self) -> bool {
        self.agent_pid
            .is_some_and(|p| nix::sys::signal::kill(Pid::from_raw(p), None).is_ok())
    }

    /// Powers the instance off: SIGTERM to the agent's process group, SIGKILL after `grace`.
    pub fn power_off(&mut self, grace: Duration) {
        let Some(pid) = self.agent_pid.take() else {
            return;
        };
        let group = Pid::from_raw(pid);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline && killpg(group, None).is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = killpg(group, Signal::SIGKILL);
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.power_off(Duration::from_secs(2));
    }
}
