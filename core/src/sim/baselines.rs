//! The peers' strategies, implemented as faithfully as the simulated world allows. Neither
//! knows deadlines or waits on purpose; both see the same pools and pay the same prices.
//!
//! **`cheapest`** — what SkyPilot (`sky launch` / managed jobs) and dstack do: a job runs on
//! on-prem capacity if some node has its GPUs free *now* (SkyPilot's Kubernetes / dstack's SSH
//! fleet as the first, zero-price "cloud"), else on an idle, already running cloud node that
//! fits (dstack reuses idle fleet instances; a spot one only for a job that allows spot), else
//! it launches at once the cheapest offer that
//! can host it — the cheapest node-hour price × runtime plus egress, spot when the job allows
//! spot (`use_spot`) — among all allowed pools with quota left. It never waits for capacity to
//! free; it retries each round when every pool is at quota.
//!
//! **`fifo-burst`** — Slurm with power-saving cloud nodes (`SuspendProgram`/`ResumeProgram`,
//! cloud nodes resumed for pending jobs) or Kueue with an on-prem flavour and a
//! ProvisioningRequest flavour: jobs are scheduled in submission order onto on-prem nodes
//! (best-effort FIFO: a job that does not fit does not block smaller ones behind it, like Slurm's
//! backfill or Kueue's `BestEffortFIFO`); a job that does not fit may run on an already powered
//! up, idle cloud node at once (a spot one only if it allows spot); a job that has waited longer than the threshold (default
//! 10 min, Slurm's `ResumeTimeout`-style knob / Kueue's admission wait) gets the cheapest cloud
//! node launched for it. Idle cloud nodes are suspended after the idle TTL (`SuspendTime`).
//!
//! Both pick nodes by best fit (fewest GPUs left over), ties by pool price and node id, so
//! results never depend on input order. A gang (`resources.nodes` = N > 1) takes N such nodes
//! in one pool or waits (Slurm allocates a multi-node job within one partition, all at once;
//! SkyPilot's `num_nodes` and dstack's cluster fleets put every node in one region), and when
//! it bursts it launches N nodes of one pool together.

use super::{Action, Decisions, Scheduler, View};
use crate::domain::{GpuSet, Market, QueuedJob, SpotRule};
use crate::money::Money;
use crate::placement::hard_constraint;
use std::collections::HashMap;

/// Default wait before `fifo-burst` bursts a job.
pub const DEFAULT_BURST_AFTER_S: i64 = 600;

/// The on-prem-first, cheapest-offer-at-once peer (SkyPilot, dstack).
#[derive(Debug, Default)]
pub struct Cheapest;

/// The FIFO on-prem, burst-after-a-wait peer (Slurm power save, Kueue provisioning).
#[derive(Debug)]
pub struct FifoBurst {
    pub burst_after_s: i64,
}

impl Default for FifoBurst {
    fn default() -> Self {
        FifoBurst {
            burst_after_s: DEFAULT_BURST_AFTER_S,
        }
    }
}

impl Scheduler for Cheapest {
    fn name(&self) -> &str {
        "cheapest"
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        fifo_round(view, |_| true)
    }
}

impl Scheduler for FifoBurst {
    fn name(&self) -> &str {
        "fifo-burst"
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        let after_ms = self.burst_after_s.max(0) * 1000;
        let now = view.now;
        let mut d = fifo_round(view, |job| {
            now.millis() - job.submitted_at.millis() >= after_ms
        });
        d.wake_at = view
            .snapshot
            .queued
            .iter()
            .map(|j| j.submitted_at.plus_millis(after_ms))
            .filter(|&t| t > now)
            .min();
        d
    }
}

/// A node with GPUs free, as a round sees it.
struct Free {
    node: usize,
    pool: usize,
    /// Its free GPUs, by index.
    free: GpuSet,
    /// Bought on spot: only jobs that allow spot run there.
    spot: bool,
    /// Price per GPU-hour on the node's market: the tie-breaker between nodes that fit.
    gpu_price: Money,
}

/// One round shared by both peers: submission order; on-prem free capacity, then idle cloud
/// capacity, then — for jobs `may_burst` allows — the cheapest launch.
fn fifo_round(view: &View<'_>, may_burst: impl Fn(&QueuedJob) -> bool) -> Decisions {
    let snap = view.snapshot;
    let pool_ix: HashMap<_, usize> = snap
        .pools
        .iter()
        .enumerate()
        .map(|(i, p)| (&p.id, i))
        .collect();
    let mut onprem = Vec::new();
    let mut cloud = Vec::new();
    let mut pool_size = vec![0u32; snap.pools.len()];
    for (node, n) in snap.nodes.iter().enumerate() {
        let Some(&pool) = pool_ix.get(&n.pool) else {
            continue;
        };
        pool_size[pool] += 1;
        if !n.healthy || n.draining || n.free_gpus.is_empty() {
            continue;
        }
        let p = &snap.pools[pool];
        let free = Free {
            node,
            pool,
            free: n.free_gpus,
            spot: n.market == Market::Spot,
            gpu_price: p.price_per_gpu_hour(n.market),
        };
        if p.launchable {
            cloud.push(free)
        } else {
            onprem.push(free)
        }
    }
    let mut queue: Vec<&QueuedJob> = snap.queued.iter().collect();
    queue.sort_by_key(|j| (j.submitted_at, j.id));
    let mut actions = Vec::new();
    for job in queue {
        let spot_ok = job.spec.spot != SpotRule::Never;
        let ok = |f: &Free| {
            (spot_ok || !f.spot) && hard_constraint(&snap.pools[f.pool], &job.spec).is_none()
        };
        let (gpus, nodes) = (job.spec.resources.gpus, job.spec.resources.nodes.max(1));
        if nodes > 1 {
            let taken = take_best_fit_gang(&mut onprem, gpus, nodes, ok)
                .or_else(|| take_best_fit_gang(&mut cloud, gpus, nodes, ok));
            if let Some(parts) = taken {
                actions.push(Action::AssignGang {
                    job: job.id,
                    nodes: parts
                        .into_iter()
                        .map(|(node, gpus)| (snap.nodes[node].id.clone(), gpus))
                        .collect(),
                });
                continue;
            }
        } else if let Some((node, gpus)) =
            take_best_fit(&mut onprem, gpus, ok).or_else(|| take_best_fit(&mut cloud, gpus, ok))
        {
            actions.push(Action::Assign {
                job: job.id,
                node: snap.nodes[node].id.clone(),
                gpus,
            });
            continue;
        }
        if view.is_provisioning(job.id) || !may_burst(job) {
            continue;
        }
        if let Some((pool, market)) = cheapest_offer(view, job, &pool_size) {
            pool_size[pool] += nodes;
            let (pool, for_job) = (snap.pools[pool].id.clone(), job.id);
            actions.push(if nodes > 1 {
                Action::LaunchGang {
                    pool,
                    market,
                    for_job,
                }
            } else {
                Action::Launch {
                    pool,
                    market,
                    for_job,
                }
            });
        }
    }
    Decisions {
        actions,
        wake_at: None,
    }
}

/// Takes `gpus` on the best-fitting node of `free` that `ok` allows (its lowest free GPUs);
/// returns the node and the GPUs.
fn take_best_fit(
    free: &mut [Free],
    gpus: u32,
    ok: impl Fn(&Free) -> bool,
) -> Option<(usize, GpuSet)> {
    let best = free
        .iter_mut()
        .filter(|f| f.free.len() >= gpus && ok(f))
        .min_by_key(|f| (f.free.len() - gpus, f.gpu_price, f.node))?;
    let taken = best.free.lowest(gpus);
    best.free = best.free.difference(taken);
    Some((best.node, taken))
}

/// Takes `gpus` on each of `nodes` nodes of one pool for a gang, the pool's best-fitting nodes
/// (Slurm's best fit, `--nodes=N` within one partition): the pool whose chosen nodes leave the
/// fewest GPUs over, ties by price and lowest node. Returns each node and its GPUs, or nothing
/// when no pool has `nodes` nodes that fit.
fn take_best_fit_gang(
    free: &mut [Free],
    gpus: u32,
    nodes: u32,
    ok: impl Fn(&Free) -> bool,
) -> Option<Vec<(usize, GpuSet)>> {
    let mut fits: Vec<usize> = (0..free.len())
        .filter(|&i| free[i].free.len() >= gpus && ok(&free[i]))
        .collect();
    fits.sort_by_key(|&i| {
        let f = &free[i];
        (f.pool, f.free.len() - gpus, f.gpu_price, f.node)
    });
    let n = nodes as usize;
    let best = fits
        .chunk_by(|&a, &b| free[a].pool == free[b].pool)
        .filter(|group| group.len() >= n)
        .map(|group| &group[..n])
        .min_by_key(|chosen| {
            let left: u32 = chosen.iter().map(|&i| free[i].free.len() - gpus).sum();
            (left, free[chosen[0]].gpu_price, free[chosen[0]].node)
        })?
        .to_vec();
    Some(
        best.into_iter()
            .map(|i| {
                let taken = free[i].free.lowest(gpus);
                free[i].free = free[i].free.difference(taken);
                (free[i].node, taken)
            })
            .collect(),
    )
}

/// The cheapest launchable pool for the job with quota left (for all of a gang's nodes): node
/// price × nodes × runtime plus egress; ties by pool id.
fn cheapest_offer(view: &View<'_>, job: &QueuedJob, pool_size: &[u32]) -> Option<(usize, Market)> {
    let snap = view.snapshot;
    let runtime_s = job.spec.runtime_s();
    let data = job.spec.data.as_ref();
    let nodes = job.spec.resources.nodes.max(1);
    snap.pools
        .iter()
        .enumerate()
        .filter(|(i, p)| {
            p.launchable
                && pool_size[*i].saturating_add(nodes) <= p.node_limit
                && hard_constraint(p, &job.spec).is_none()
        })
        .map(|(i, p)| {
            let market = p.cheapest_market(job.spec.spot);
            let egress = data
                .filter(|d| d.region != p.region)
                .and_then(|d| snap.regions.iter().find(|r| r.id == d.region))
                .map_or(Money::ZERO, |r| {
                    r.egress_per_gb
                        .saturating_mul(i64::from(data.map_or(0, |d| d.size_gb)))
                });
            let boot = i64::from(p.boot_time_s);
            let cost = p
                .price_per_hour(market)
                .saturating_mul(i64::from(nodes))
                .per_hour_for_secs(runtime_s + boot)
                + egress;
            ((cost, &p.id), (i, market))
        })
        .min_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, choice)| choice)
}
