//! Applying a scheduler's actions to the world: assignments, launches (with their spot
//! interruption drawn at launch) and preemptions, each checked first (an assignment needs a
//! ready node with the GPUs it names free, as many as the job asks for, and spot allowed if
//! the node is spot); an invalid action changes nothing. A gang (`resources.nodes` > 1) is
//! all or none: one assignment names all its nodes, in one pool, and one launch asks for all
//! of them, refused unless the pool's quota has room for every one.

use super::{Engine, Event, JobState, job_index};
use crate::domain::{GpuSet, JobId, Market, NodeId, SpotRule};
use crate::sim::Action;

impl Engine<'_> {
    /// Applies one action; false when it is invalid and ignored.
    pub(super) fn act(&mut self, action: Action, now: i64) -> bool {
        match action {
            Action::Assign { job, node, gpus } => self.assign(job, &[(node, gpus)], now),
            Action::AssignGang { job, nodes } => self.assign(job, &nodes, now),
            Action::Launch {
                pool,
                market,
                for_job,
            } => {
                let (Some(&p), Some(j)) = (
                    self.pool_by_id.get(&pool),
                    job_index(for_job, self.jobs.len()),
                ) else {
                    return false;
                };
                let sp = &self.world.pools[p];
                let spot_ok = market == Market::OnDemand || sp.pool.spot_per_hour.is_some();
                let nodes = self.jobs_in[j].spec.resources.nodes.max(1);
                if !sp.pool.launchable
                    || !spot_ok
                    || nodes > 1
                    || self.live_per_pool[p] >= sp.pool.node_limit
                    || self.jobs[j].state != JobState::Queued
                {
                    return false;
                }
                self.launch(p, market, j, now);
                true
            }
            Action::LaunchGang {
                pool,
                market,
                for_job,
            } => {
                let (Some(&p), Some(j)) = (
                    self.pool_by_id.get(&pool),
                    job_index(for_job, self.jobs.len()),
                ) else {
                    return false;
                };
                let sp = &self.world.pools[p];
                let spot_ok = market == Market::OnDemand || sp.pool.spot_per_hour.is_some();
                let nodes = self.jobs_in[j].spec.resources.nodes.max(1);
                let room = sp.pool.node_limit.saturating_sub(self.live_per_pool[p]);
                if !sp.pool.launchable
                    || !spot_ok
                    || room < nodes
                    || self.jobs[j].state != JobState::Queued
                {
                    return false;
                }
                for _ in 0..nodes {
                    self.launch(p, market, j, now);
                }
                true
            }
            Action::Preempt { job } => {
                let Some(j) = job_index(job, self.jobs.len()) else {
                    return false;
                };
                if !matches!(self.jobs[j].state, JobState::Running { .. }) {
                    return false;
                }
                self.stop(j, now, false);
                self.out.preemptions += 1;
                true
            }
        }
    }

    /// Launches one node of pool `p` on `market` for job `j`, ready after the pool's boot time
    /// (a spot one with its interruption drawn now).
    fn launch(&mut self, p: usize, market: Market, j: usize, now: i64) {
        let sp = &self.world.pools[p];
        let node = self.add_node(p, market, now);
        self.out.burst_instances += 1;
        self.nodes[node].for_job = Some(j);
        let node_id = self.nodes[node].id.clone();
        if let Some(old) = self.provisioning.insert(self.jobs[j].id, node_id)
            && let Some(&o) = self.node_by_id.get(&old)
        {
            self.nodes[o].for_job = None;
        }
        let boot_ms = i64::from(sp.pool.boot_time_s) * 1000;
        self.push(now + boot_ms, Event::Ready(node));
        if market == Market::Spot {
            let hours = self.rng.exponential(sp.interruptions_per_hour);
            if hours.is_finite() && hours < 1.0e6 {
                let at = now + (hours * 3_600_000.0).ceil() as i64;
                self.push(at.max(now + 1), Event::Interrupt(node));
            }
        }
    }

    /// Starts job `j` on `parts` (one per node, rank 0 first) when they are valid: the job is
    /// queued and asks for that many nodes; the nodes are distinct, ready and of one pool, each
    /// with the GPUs named free and as many as the job asks for, and none spot unless the job
    /// allows spot.
    fn assign(&mut self, job: JobId, parts: &[(NodeId, GpuSet)], now: i64) -> bool {
        let Some(j) = job_index(job, self.jobs.len()) else {
            return false;
        };
        let spec = &self.jobs_in[j].spec;
        if self.jobs[j].state != JobState::Queued
            || parts.len() != spec.resources.nodes.max(1) as usize
        {
            return false;
        }
        let mut found: Vec<(usize, GpuSet)> = Vec::with_capacity(parts.len());
        for (node, gpus) in parts {
            let Some(&n) = self.node_by_id.get(node) else {
                return false;
            };
            let nr = &self.nodes[n];
            // A job that never runs on spot is not put on a spot node.
            let never_spot = spec.spot == SpotRule::Never && nr.market == Market::Spot;
            let other_pool = found
                .first()
                .is_some_and(|&(f, _)| self.nodes[f].pool != nr.pool);
            if !nr.ready
                || nr.released
                || gpus.len() != spec.resources.gpus
                || !gpus.is_subset(nr.free)
                || never_spot
                || other_pool
                || found.iter().any(|&(f, _)| f == n)
            {
                return false;
            }
            found.push((n, *gpus));
        }
        self.start(j, &found, now);
        true
    }
}
