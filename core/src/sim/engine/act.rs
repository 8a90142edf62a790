//! Applying a scheduler's actions to the world: assignments, launches (with their spot
//! interruption drawn at launch) and preemptions, each checked first (an assignment needs a
//! ready node with the GPUs it names free, as many as the job asks for, and spot allowed if
//! the node is spot); an invalid action changes nothing.

use super::{Engine, Event, JobState, job_index};
use crate::domain::{Market, SpotRule};
use crate::sim::Action;

impl Engine<'_> {
    /// Applies one action; false when it is invalid and ignored.
    pub(super) fn act(&mut self, action: Action, now: i64) -> bool {
        match action {
            Action::Assign { job, node, gpus } => {
                let (Some(j), Some(&n)) =
                    (job_index(job, self.jobs.len()), self.node_by_id.get(&node))
                else {
                    return false;
                };
                let spec = &self.jobs_in[j].spec;
                let nr = &self.nodes[n];
                // A job that never runs on spot is not put on a spot node.
                let never_spot = spec.spot == SpotRule::Never && nr.market == Market::Spot;
                if self.jobs[j].state != JobState::Queued
                    || !nr.ready
                    || nr.released
                    || gpus.len() != spec.resources.gpus
                    || !gpus.is_subset(nr.free)
                    || never_spot
                {
                    return false;
                }
                self.start(j, n, gpus, now);
                true
            }
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
                if !sp.pool.launchable
                    || !spot_ok
                    || self.live_per_pool[p] >= sp.pool.node_limit
                    || self.jobs[j].state != JobState::Queued
                {
                    return false;
                }
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
}
