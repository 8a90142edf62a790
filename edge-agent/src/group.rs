//! A job's process group: each job runs as the leader of its own group, so the agent can signal
//! everything the job started (`killpg`), tell when all of it is gone, and list its members.
//! Linux-specific (reads `/proc`); zombies count as gone, since they hold no resources and are
//! reaped by whoever inherited them.

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use std::time::Duration;
use tokio::time::Instant;

const POLL: Duration = Duration::from_millis(50);
/// How long to wait for SIGKILLed members to disappear before reporting anyway.
const KILL_SETTLE: Duration = Duration::from_secs(2);

/// How a group ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Termination {
    /// Nothing was left to signal.
    AlreadyGone,
    /// Everything exited within the grace period after SIGTERM.
    Terminated,
    /// Something outlived the grace period and was sent SIGKILL.
    Killed,
}

/// SIGTERM to the group, then SIGKILL to whatever is left after `grace`.
pub async fn terminate(pgid: u32, grace: Duration) -> Termination {
    let Ok(raw) = i32::try_from(pgid) else {
        return Termination::AlreadyGone;
    };
    let group = Pid::from_raw(raw);
    if raw <= 1 || killpg(group, Signal::SIGTERM).is_err() || !is_alive(pgid) {
        return Termination::AlreadyGone;
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        tokio::time::sleep(POLL.min(deadline - Instant::now())).await;
        if !is_alive(pgid) {
            return Termination::Terminated;
        }
    }
    let _ = killpg(group, Signal::SIGKILL);
    // SIGKILL is delivered asynchronously: a member asleep in the kernel dies when it is next
    // scheduled. Wait (bounded) until none is left, so "stopped" means the processes are gone.
    let settle = Instant::now() + KILL_SETTLE;
    while is_alive(pgid) && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Termination::Killed
}

/// True while a member of the group that is not a zombie exists.
pub fn is_alive(pgid: u32) -> bool {
    let Ok(raw) = i32::try_from(pgid) else {
        return false;
    };
    match killpg(Pid::from_raw(raw), None) {
        Err(Errno::ESRCH) => false,
        // The group exists: make sure it is not only zombies waiting for a reaper.
        _ => members(pgid).map_or(true, |m| !m.is_empty()),
    }
}

/// The live (non-zombie) members of a process group, from `/proc`.
pub fn members(pgid: u32) -> std::io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit between listing and reading: skip it.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((state, group)) = parse_stat(&stat)
            && group == pgid
            && state != 'Z'
            && state != 'X'
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// True when the process exists and is not a zombie.
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| parse_stat(&s))
        .is_some_and(|(state, _)| state != 'Z' && state != 'X')
}

/// (state, process group) from a `/proc/PID/stat` line; the command name may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> Option<(char, u32)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let mut fields = after.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines() {
        assert_eq!(parse_stat("42 (sleep) S 1 42 42 0 -1"), Some(('S', 42)));
        assert_eq!(parse_stat("43 (a (b) c) Z 1 40 40 0"), Some(('Z', 40)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_group_is_alive_and_unknown_group_is_not() {
        let own = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .map(|(_, g)| g);
        let Some(own) = own else {
            panic!("cannot read /proc/self/stat")
        };
        assert!(is_alive(own));
        assert!(!is_alive(u32::try_from(i32::MAX).unwrap_or(0)));
    }
}
