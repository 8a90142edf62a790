//! Multi-node jobs (gangs): what each rank is told, and how the ranks' ends become the job's.
//! Pure — the store carries the verdicts out (`store/sql/events.rs`, `store/sql/plans.rs`).
//!
//! A gang is one attempt per node, ranks `0..nodes`, all in one pool, placed together by the
//! planner (all or none). Each rank is its own lease (fenced like any attempt); the rank-0
//! attempt's id is the gang's key (`attempts.gang_lead`, the job's `current_attempt`).
//!
//! The rules:
//! - Every rank gets `SWITCHYARD_NODE_RANK`, `SWITCHYARD_NUM_NODES`, `SWITCHYARD_NODE_IPS`
//!   (the nodes' addresses in rank order, newline separated) and `SWITCHYARD_GPUS_PER_NODE`,
//!   and what `torchrun` reads: `MASTER_ADDR` (rank 0's address), `MASTER_PORT` (a port the
//!   broker keeps for the gang), `NODE_RANK` and `WORLD_SIZE` (one process per GPU: nodes ×
//!   GPUs per node).
//! - The job succeeds when every rank exited 0 (rank 0 included); until then it runs.
//! - A rank that fails (or is cancelled) ends the job so: the other ranks are stopped (the
//!   checkpoint signal, then the grace period).
//! - A rank that is preempted, lost or interrupted sends the whole gang back to the queue:
//!   the other ranks are stopped too, and the job is placed again as a gang.

use switchyard_core::JobState;

/// The variables the broker sets on a gang's ranks; a job's own `env` may not set them.
pub const ENV: [&str; 8] = [
    "SWITCHYARD_NODE_RANK",
    "SWITCHYARD_NUM_NODES",
    "SWITCHYARD_NODE_IPS",
    "SWITCHYARD_GPUS_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "WORLD_SIZE",
];

/// The ports the broker hands out as `MASTER_PORT`, one per live gang (torchrun's default
/// port first).
pub const MASTER_PORTS: std::ops::Range<u16> = 29_500..30_500;

/// The lowest port of [`MASTER_PORTS`] no live gang holds; `None` when all are held.
pub fn master_port(held: &[u16]) -> Option<u16> {
    MASTER_PORTS.clone().find(|p| !held.contains(p))
}

/// What rank `rank` of a gang is told: `addresses` are the gang's nodes in rank order.
pub fn env(
    rank: u32,
    addresses: &[String],
    gpus_per_node: u32,
    master_port: u16,
) -> Vec<(String, String)> {
    let nodes = addresses.len() as u32;
    let master = addresses.first().cloned().unwrap_or_default();
    vec![
        ("SWITCHYARD_NODE_RANK".into(), rank.to_string()),
        ("SWITCHYARD_NUM_NODES".into(), nodes.to_string()),
        ("SWITCHYARD_NODE_IPS".into(), addresses.join("\n")),
        ("SWITCHYARD_GPUS_PER_NODE".into(), gpus_per_node.to_string()),
        ("MASTER_ADDR".into(), master),
        ("MASTER_PORT".into(), master_port.to_string()),
        ("NODE_RANK".into(), rank.to_string()),
        (
            "WORLD_SIZE".into(),
            (u64::from(nodes) * u64::from(gpus_per_node)).to_string(),
        ),
    ]
}

/// What a rank's end does to its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankEnd {
    /// Other ranks still run: the job runs on (its reason says who it waits for).
    Wait { reason: String },
    /// The job ends in `state` with `reason`; the ranks still live are stopped.
    End { state: JobState, reason: String },
}

/// Rank `rank` (on `node`) finished in `state` (what the lease rule made of its report:
/// succeeded, failed or cancelled, with `reason`); `others_live` ranks still hold their
/// lease.
pub fn on_finished(
    rank: u32,
    node: &str,
    state: JobState,
    reason: Option<&str>,
    others_live: u32,
) -> RankEnd {
    match state {
        JobState::Succeeded if others_live > 0 => RankEnd::Wait {
            reason: format!(
                "rank {rank} exited 0; waiting for {others_live} other rank{}",
                if others_live == 1 { "" } else { "s" }
            ),
        },
        JobState::Succeeded => RankEnd::End {
            state,
            reason: "every rank exited 0".into(),
        },
        _ => {
            let why = reason.unwrap_or(state.as_str());
            RankEnd::End {
                state,
                reason: if others_live > 0 {
                    format!("rank {rank} on {node}: {why}; the other ranks were stopped")
                } else {
                    format!("rank {rank} on {node}: {why}")
                },
            }
        }
    }
}

/// Why the other ranks stop when rank `rank` (on `node`) went back to the queue
/// (preempted, lost, interrupted): `why` is that rank's reason.
pub fn requeue_reason(rank: u32, node: &str, why: &str) -> String {
    format!("rank {rank} on {node} stopped ({why}): the whole gang goes back to the queue")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_is_told_its_place_and_the_master() {
        let ips = vec!["10.0.0.5".to_string(), "10.0.0.9".to_string()];
        let env: std::collections::BTreeMap<_, _> = env(1, &ips, 4, 29_501).into_iter().collect();
        assert_eq!(env["SWITCHYARD_NODE_RANK"], "1");
        assert_eq!(env["NODE_RANK"], "1");
        assert_eq!(env["SWITCHYARD_NUM_NODES"], "2");
        assert_eq!(env["SWITCHYARD_NODE_IPS"], "10.0.0.5\n10.0.0.9");
        assert_eq!(env["SWITCHYARD_GPUS_PER_NODE"], "4");
        assert_eq!(env["MASTER_ADDR"], "10.0.0.5");
        assert_eq!(env["MASTER_PORT"], "29501");
        assert_eq!(env["WORLD_SIZE"], "8");
        assert_eq!(env.len(), ENV.len());
        assert!(env.keys().all(|k| ENV.contains(&k.as_str())));
    }

    #[test]
    fn the_master_port_is_the_lowest_free_one() {
        assert_eq!(master_port(&[]), Some(29_500));
        assert_eq!(master_port(&[29_500, 29_502]), Some(29_501));
        let all: Vec<u16> = MASTER_PORTS.collect();
        assert_eq!(master_port(&all), None);
    }

    #[test]
    fn the_job_succeeds_only_when_the_last_rank_exits_0() {
        assert!(matches!(
            on_finished(0, "n0", JobState::Succeeded, None, 1),
            RankEnd::Wait { reason } if reason.contains("waiting for 1 other rank")
        ));
        assert_eq!(
            on_finished(1, "n1", JobState::Succeeded, None, 0),
            RankEnd::End {
                state: JobState::Succeeded,
                reason: "every rank exited 0".into()
            }
        );
    }

    #[test]
    fn a_failed_rank_fails_the_job_and_stops_the_others() {
        let RankEnd::End { state, reason } =
            on_finished(1, "n1", JobState::Failed, Some("exit code 3"), 2)
        else {
            panic!("a failure ends the job");
        };
        assert_eq!(state, JobState::Failed);
        assert_eq!(
            reason,
            "rank 1 on n1: exit code 3; the other ranks were stopped"
        );
        assert!(matches!(
            on_finished(0, "n0", JobState::Cancelled, None, 0),
            RankEnd::End {
                state: JobState::Cancelled,
                ..
            }
        ));
    }
}
