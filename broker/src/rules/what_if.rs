//! What-if: a team's recorded jobs (the last 30 days) replayed through `core::sim` under its
//! current policies and under a draft, every rule applied as the live planner applies it
//! (allow-lists, prices, spot, burst, windows, ceilings, hard budgets, on-prem rates), on the
//! pools the broker has now. The handler (`http/api/policies.rs`) reads the store; this builds
//! the world and the draft set from what it read, and runs the two replays. A draft with a
//! `utilization` rule also gets [`waste`]: the recorded attempts the rule would have acted on
//! (from `gpu_waste`'s bounded per-attempt history, not from the replay).

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use switchyard_core as core;
use switchyard_core::sim::{
    self, Decisions, Scheduler, SimConfig, SimJob, SimPool, SimResult, Switchyard, View, World,
};
use switchyard_core::{Money, Pool, PoolId, Region, Snapshot, TeamPolicy, Timestamp};
use switchyard_protocol::api::{
    DayCost, PolicyBody, QueueDelay, WasteAction, WhatIfChange, WhatIfOutcome, WhatIfReport,
    WhatIfWaste, WhatIfWasted,
};

use crate::clock;
use crate::rules::policy::{policy_to_core, priced_for};
use crate::store::{JobRecord, NodeRecord, PolicyRecord, WasteRow};

/// Jobs replayed by a what-if: the team's last 30 days, at most this many.
pub const WHAT_IF_MAX_JOBS: i64 = 5_000;
pub const WHAT_IF_DAYS: i64 = 30;

/// The live world a what-if replays against: the catalogue, the nodes that joined, and which
/// pools the broker can launch in now.
#[derive(Clone, Debug)]
pub struct WhatIfWorld {
    pub team: String,
    pub project: Option<String>,
    pub regions: Vec<Region>,
    pub pools: Vec<Pool>,
    /// Healthy nodes per pool.
    pub node_counts: HashMap<PoolId, u32>,
    /// Pools with a provider that can launch there (and bursting on).
    pub can_launch: HashSet<PoolId>,
}

/// Spot interruptions assumed per node-hour in a what-if (the planner's default figure).
const WHAT_IF_SPOT_INTERRUPTIONS_PER_HOUR: f64 = 0.02;

impl WhatIfWorld {
    /// The simulated world, with the on-prem rates of `records` applied. On-prem (static)
    /// pools keep their fleet (`node_limit`, or the nodes that joined if more); cloud pools the
    /// broker cannot launch in keep only the nodes they have.
    fn sim_world(&self, records: &[PolicyRecord]) -> World {
        let pools = self
            .pools
            .iter()
            .filter_map(|p| {
                let mut pool = priced_for(p, records, &self.team, self.project.as_deref());
                let have = self.node_counts.get(&p.id).copied().unwrap_or(0);
                let fixed_nodes = if !p.launchable {
                    p.node_limit.max(have)
                } else if self.can_launch.contains(&p.id) {
                    0
                } else {
                    pool.launchable = false;
                    have
                };
                if !pool.launchable && fixed_nodes == 0 {
                    return None;
                }
                let interruptions_per_hour = if pool.launchable && pool.spot_per_hour.is_some() {
                    WHAT_IF_SPOT_INTERRUPTIONS_PER_HOUR
                } else {
                    0.0
                };
                Some(SimPool {
                    pool,
                    fixed_nodes,
                    interruptions_per_hour,
                })
            })
            .collect();
        World {
            regions: self.regions.clone(),
            pools,
        }
    }
}

impl WhatIfWorld {
    /// The world from what the store holds: the catalogue, the healthy nodes that joined
    /// (revoked ones left out), and the pools `can_launch` says a provider can launch in now.
    pub fn new(
        team: String,
        project: Option<String>,
        regions: Vec<Region>,
        pools: Vec<Pool>,
        nodes: &[NodeRecord],
        can_launch: impl Fn(&Pool) -> bool,
    ) -> WhatIfWorld {
        let mut node_counts: HashMap<PoolId, u32> = HashMap::new();
        for n in nodes.iter().filter(|n| n.healthy && !n.revoked) {
            *node_counts.entry(n.pool.clone()).or_insert(0) += 1;
        }
        let can_launch = pools
            .iter()
            .filter(|p| p.launchable && can_launch(p))
            .map(|p| p.id.clone())
            .collect();
        WhatIfWorld {
            team,
            project,
            regions,
            pools,
            node_counts,
            can_launch,
        }
    }
}

/// The jobs a what-if replays: those submitted at or after `since`, of `project` when given.
pub fn replayed_jobs(
    jobs: Vec<JobRecord>,
    since: Timestamp,
    project: Option<&str>,
) -> Vec<JobRecord> {
    jobs.into_iter()
        .filter(|j| j.submitted_at >= since)
        .filter(|j| project.is_none() || j.spec.project.as_deref() == project)
        .collect()
}

/// The team's policy set with `draft` in place of the policy of `project` (team-wide when
/// `None`): what the draft run replays under.
pub fn drafted(
    current: &[PolicyRecord],
    team: &str,
    project: Option<&str>,
    draft: PolicyBody,
    now: Timestamp,
    actor: String,
) -> Vec<PolicyRecord> {
    let mut set: Vec<PolicyRecord> = current
        .iter()
        .filter(|r| r.project.as_deref() != project)
        .cloned()
        .collect();
    set.push(PolicyRecord {
        team: team.to_string(),
        project: project.map(str::to_string),
        version: 0,
        body: draft,
        updated_at: now,
        updated_by: actor,
    });
    set
}

/// Switchyard's scheduler with a policy set in every snapshot, the windows converted for each
/// simulated day (the engine's snapshot carries no policies of its own), and hard budgets kept
/// as the live broker keeps them: what a budget has left in its period is its amount less the
/// estimates of the work started (or launched for) in that period, each taken when the planner
/// commits it, so a job whose estimate does not fit is held exactly as the live planner holds
/// it.
struct WithPolicies<'a> {
    records: &'a [PolicyRecord],
    day: Option<i64>,
    policies: Vec<TeamPolicy>,
    /// What each record's hard budget has committed, per period (keyed by the period's start).
    committed: HashMap<(usize, Timestamp), Money>,
    /// Launches in flight: what each reserved until its job starts (then its attempt does).
    launching: HashMap<core::JobId, Vec<(usize, Timestamp, Money)>>,
    /// Past this instant the scheduler decides nothing more, so the engine winds down fast,
    /// and the run is reported as given up.
    deadline: Instant,
    gave_up: bool,
    inner: Switchyard,
}

impl<'a> WithPolicies<'a> {
    fn new(records: &'a [PolicyRecord], deadline: Instant) -> WithPolicies<'a> {
        WithPolicies {
            records,
            day: None,
            policies: Vec::new(),
            committed: HashMap::new(),
            launching: HashMap::new(),
            deadline,
            gave_up: false,
            inner: Switchyard::default(),
        }
    }

    /// The hard budget of record `i` and its period at `now`, if it has one that applies.
    fn hard_budget(&self, i: usize, now: Timestamp) -> Option<(Money, Timestamp)> {
        let rule = self.records[i].body.budget.as_ref()?;
        if rule.enforcement != switchyard_protocol::api::Enforcement::Hard {
            return None;
        }
        let (start, _) = crate::rules::budget::period_window(rule, now)?;
        Some((crate::rules::budget::amount(rule), start))
    }

    /// Takes the round's commitments from the budgets that cover their jobs.
    fn commit(&mut self, view: &View<'_>) {
        if self.inner.committed().is_empty() || self.records.iter().all(|r| r.body.budget.is_none())
        {
            return;
        }
        let specs: HashMap<core::JobId, &core::JobSpec> = view
            .snapshot
            .queued
            .iter()
            .map(|q| (q.id, &q.spec))
            .collect();
        for c in self.inner.committed().to_vec() {
            if let Some(reserved) = self.launching.remove(&c.job) {
                for (i, start, cost) in reserved {
                    if let Some(m) = self.committed.get_mut(&(i, start)) {
                        *m = Money(m.micros().saturating_sub(cost.micros()));
                    }
                }
            }
            let Some(spec) = specs.get(&c.job) else {
                continue;
            };
            let mut taken = Vec::new();
            for i in 0..self.records.len() {
                let r = &self.records[i];
                let covers = r.team == spec.team
                    && (r.project.is_none() || r.project.as_deref() == spec.project.as_deref());
                if !covers {
                    continue;
                }
                if let Some((_, start)) = self.hard_budget(i, view.now) {
                    let m = self.committed.entry((i, start)).or_insert(Money::ZERO);
                    *m = Money(m.micros().saturating_add(c.estimated_cost.micros()));
                    taken.push((i, start, c.estimated_cost));
                }
            }
            if c.launch {
                self.launching.insert(c.job, taken);
            }
        }
    }
}

impl Scheduler for WithPolicies<'_> {
    fn name(&self) -> &str {
        "switchyard"
    }

    fn decide(&mut self, view: &View<'_>) -> Decisions {
        if self.gave_up || Instant::now() > self.deadline {
            self.gave_up = true;
            return Decisions::default();
        }
        let day = view.now.millis().div_euclid(86_400_000);
        if self.day != Some(day) {
            self.day = Some(day);
            self.policies = self
                .records
                .iter()
                .map(|r| policy_to_core(r, view.now))
                .collect();
        }
        if self.policies.is_empty() {
            return self.inner.decide(view);
        }
        for i in 0..self.records.len() {
            self.policies[i].remaining_budget =
                self.hard_budget(i, view.now).map(|(amount, start)| {
                    let used = self.committed.get(&(i, start)).copied().unwrap_or_default();
                    Money(amount.micros().saturating_sub(used.micros()))
                });
        }
        let snapshot = Snapshot {
            policies: self.policies.clone(),
            ..view.snapshot.clone()
        };
        let decisions = self.inner.decide(&View {
            now: view.now,
            snapshot: &snapshot,
            provisioning: view.provisioning,
        });
        self.commit(view);
        decisions
    }
}

/// The recorded jobs as the simulator takes them, in submission order: submitted when they
/// were, running as long as they ran (or as estimated, when they never finished), the planner
/// told their users' estimates as it was live. Jobs
/// cancelled before they ever started are left out. Each comes with its record.
fn sim_jobs(jobs: &[JobRecord]) -> Vec<(SimJob, &JobRecord)> {
    let mut out: Vec<(SimJob, &JobRecord)> = jobs
        .iter()
        .filter(|j| !(j.state == core::JobState::Cancelled && j.started_at.is_none()))
        .map(|j| {
            let ran = match (j.started_at, j.finished_at) {
                (Some(s), Some(f)) if f > s => Some(f.secs_since(s).max(1)),
                _ => None,
            };
            let sim = SimJob {
                submit: j.submitted_at,
                runtime_s: ran.unwrap_or_else(|| j.spec.runtime_s()),
                // The planner decided (budgets, deadlines) on the user's estimate, live.
                estimate_s: Some(j.spec.runtime_s()),
                spec: j.spec.clone(),
                measured: true,
            };
            (sim, j)
        })
        .collect();
    out.sort_by_key(|(s, j)| (s.submit, j.id));
    out
}

const DAY_MS: i64 = 86_400_000;

/// `r`'s charges per UTC day, from day `first` to day `last` (both as days since the epoch).
fn cost_per_day(r: &SimResult, first: i64, last: i64) -> Vec<DayCost> {
    let mut days: Vec<i64> = vec![0; usize::try_from(last - first + 1).unwrap_or(0)];
    for (at, cost) in &r.timeline {
        let d = at.millis().div_euclid(DAY_MS) - first;
        if let Some(slot) = usize::try_from(d).ok().and_then(|d| days.get_mut(d)) {
            *slot = slot.saturating_add(cost.micros());
        }
    }
    days.iter()
        .enumerate()
        .map(|(i, micros)| DayCost {
            day: clock::to_datetime(Timestamp((first + i as i64) * DAY_MS))
                .format("%Y-%m-%d")
                .to_string(),
            cost_usd: Money(*micros).as_dollars(),
        })
        .collect()
}

fn outcome(r: &SimResult, first_day: i64, last_day: i64) -> WhatIfOutcome {
    let report = crate::simulate::report::scheduler_report(r, 0.0, 0.0);
    WhatIfOutcome {
        total_cost_usd: report.total_cost_usd,
        deadline_met_fraction: report.deadline_met_fraction,
        queue_delay_s: QueueDelay {
            p50: report.queue_delay_s.p50,
            p99: report.queue_delay_s.p99,
        },
        held_jobs: r.jobs.iter().filter(|j| j.first_start.is_none()).count() as u32,
        cost_per_day: cost_per_day(r, first_day, last_day),
    }
}

/// Most jobs listed as changed in a what-if.
pub const WHAT_IF_MAX_CHANGES: usize = 200;

/// The jobs the draft treats differently, the biggest cost differences first.
fn changes(
    jobs: &[(SimJob, &JobRecord)],
    current: &SimResult,
    draft: &SimResult,
) -> Vec<WhatIfChange> {
    let mut out: Vec<(i64, WhatIfChange)> = jobs
        .iter()
        .zip(current.jobs.iter().zip(&draft.jobs))
        .filter_map(|((_, record), (c, d))| {
            let change = match (c.first_start, d.first_start) {
                (Some(_), None) => "held",
                (None, Some(_)) => "released",
                (None, None) => return None,
                (Some(_), Some(_)) if c.first_pool != d.first_pool => "moved",
                (Some(_), Some(_)) if c.cost != d.cost => "cost",
                _ => return None,
            };
            let delta = (d.cost.micros() - c.cost.micros()).abs();
            Some((
                delta,
                WhatIfChange {
                    job_id: record.id.0,
                    name: record.spec.name.clone(),
                    project: record.spec.project.clone(),
                    change: change.to_string(),
                    current_pool: c.first_pool.as_ref().map(ToString::to_string),
                    draft_pool: d.first_pool.as_ref().map(ToString::to_string),
                    current_cost_usd: c.cost.as_dollars(),
                    draft_cost_usd: d.cost.as_dollars(),
                },
            ))
        })
        .collect();
    // Held and released first (they matter most), then by cost difference.
    out.sort_by_key(|(delta, c)| (!matches!(c.change.as_str(), "held" | "released"), -delta));
    out.truncate(WHAT_IF_MAX_CHANGES);
    out.into_iter().map(|(_, c)| c).collect()
}

/// Replays `jobs` on `world` under the `current` policies and under the `draft` set (each the
/// team's whole set: team-wide and projects), every rule of both applied as the live planner
/// applies it (allow-lists, prices, spot, burst, windows, ceilings, hard budgets, on-prem
/// rates). Synchronous and CPU-bound: run it off the async threads. `None` when the two runs
/// did not finish by `deadline` (a long, congested history makes every planning round slow).
pub fn what_if(
    world: &WhatIfWorld,
    jobs: &[JobRecord],
    current: &[PolicyRecord],
    draft: &[PolicyRecord],
    deadline: Instant,
) -> Option<WhatIfReport> {
    let jobs = sim_jobs(jobs);
    let Some(first) = jobs.first().map(|(j, _)| j.submit) else {
        let empty = WhatIfOutcome {
            total_cost_usd: 0.0,
            deadline_met_fraction: 1.0,
            queue_delay_s: QueueDelay { p50: 0.0, p99: 0.0 },
            held_jobs: 0,
            cost_per_day: Vec::new(),
        };
        return Some(WhatIfReport {
            jobs: 0,
            current: empty.clone(),
            draft: empty,
            changes: Vec::new(),
            waste: None,
        });
    };
    let sim_jobs: Vec<SimJob> = jobs.iter().map(|(j, _)| j.clone()).collect();
    let cfg = SimConfig {
        measure_from: first,
        ..SimConfig::default()
    };
    let run = |records: &[PolicyRecord]| {
        let mut scheduler = WithPolicies::new(records, deadline);
        let result = sim::run(&world.sim_world(records), &sim_jobs, &cfg, &mut scheduler);
        (!scheduler.gave_up).then_some(result)
    };
    let current = run(current)?;
    let draft = run(draft)?;
    let first_day = first.millis().div_euclid(DAY_MS);
    let last_charge = |r: &SimResult| r.timeline.iter().map(|(t, _)| t.millis()).max();
    let last_day = last_charge(&current)
        .max(last_charge(&draft))
        .map_or(first_day, |t| t.div_euclid(DAY_MS))
        .max(first_day);
    Some(WhatIfReport {
        jobs: sim_jobs.len() as u32,
        current: outcome(&current, first_day, last_day),
        draft: outcome(&draft, first_day, last_day),
        changes: changes(&jobs, &current, &draft),
        waste: None,
    })
}

/// Recorded attempts a what-if's waste answer looks at, at most.
pub const WHAT_IF_MAX_WASTE_ROWS: i64 = 20_000;
/// Attempts listed in a what-if's waste answer, at most.
pub const WHAT_IF_MAX_WASTED: usize = 200;

/// What a draft `utilization` rule would have done to the recorded attempts `rows` (the
/// team's, or the draft's project's, over the what-if period): those whose longest recorded
/// idle stretch meets the window (their priority not exempt), with the GPU-hours and dollars
/// the rule frees at least — the stretch past the window, at the attempt's hourly rate.
/// Answered from `gpu_waste`'s bounded history (`core::waste::would_fire`): certain for a
/// listed attempt; a stretch whose activity lay between two recorded thresholds, or one broken
/// by a single busy sample, is not seen; and it cannot say *when* in the attempt the stretch
/// was (so not what the attempt would have cost had it been requeued and run again).
pub fn waste(rule: &core::waste::UtilizationRule, rows: &[WasteRow]) -> WhatIfWaste {
    let judged_at = core::waste::RECORDED_THRESHOLDS
        .iter()
        .copied()
        .filter(|t| *t <= rule.min_gpu_utilization_pct)
        .max();
    let mut would: Vec<WhatIfWasted> = rows
        .iter()
        .filter(|r| rule.applies_to(r.priority))
        .filter_map(|r| {
            let freed_ms = core::waste::would_fire(rule, &r.history, r.gpus)?;
            let longest = r
                .history
                .iter()
                .find(|h| Some(h.threshold_pct) == judged_at)
                .map_or(0, |h| h.longest_idle_ms);
            let gpu_hours = freed_ms as f64 / 3_600_000.0;
            // The attempt's hourly rate is for all its GPUs.
            let usd = r.hourly_rate_micros.map_or(0.0, |rate| {
                rate as f64 / 1e6 * gpu_hours / f64::from(r.gpus.max(1))
            });
            Some(WhatIfWasted {
                job_id: r.job.0,
                name: r.name.clone(),
                project: r.project.clone(),
                priority: crate::http::api::waste::wire_priority(r.priority),
                gpus: r.gpus,
                longest_idle_s: longest / 1000,
                gpu_hours_freed: gpu_hours,
                usd_freed: usd,
            })
        })
        .collect();
    would.sort_by(|a, b| b.gpu_hours_freed.total_cmp(&a.gpu_hours_freed));
    let gpu_hours_freed = would.iter().map(|w| w.gpu_hours_freed).sum();
    let usd_freed = would.iter().map(|w| w.usd_freed).sum();
    would.truncate(WHAT_IF_MAX_WASTED);
    WhatIfWaste {
        action: match rule.action {
            core::waste::WasteAction::Notify => WasteAction::Notify,
            core::waste::WasteAction::Stop => WasteAction::Stop,
            core::waste::WasteAction::Requeue => WasteAction::Requeue,
        },
        judged_at_pct: judged_at.map(u32::from),
        attempts_recorded: u32::try_from(rows.len()).unwrap_or(u32::MAX),
        would_act: would,
        gpu_hours_freed,
        usd_freed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::tests::record;

    /// One on-prem node of 8 H100s at $2 per GPU-hour, and no cloud.
    fn onprem_world() -> WhatIfWorld {
        let pool = Pool {
            id: PoolId::new("onprem:dc/h100"),
            region: core::RegionId::new("onprem:dc"),
            provider: "onprem".into(),
            instance_type: "h100".into(),
            gpu_model: "H100".into(),
            gpus_per_node: 8,
            gpu_memory_gb: 80,
            vcpus: 0,
            memory_gb: 0,
            on_demand_per_hour: Money(16_000_000),
            spot_per_hour: None,
            node_limit: 1,
            launchable: false,
            boot_time_s: 0,
            price_updated_at: Timestamp(0),
            recent_capacity_failures: 0,
            marginal_per_hour: None,
        };
        WhatIfWorld {
            team: "ml".into(),
            project: None,
            regions: Vec::new(),
            pools: vec![pool],
            node_counts: HashMap::new(),
            can_launch: HashSet::new(),
        }
    }

    /// `n` one-GPU jobs of team ml submitted a minute apart on 2026-12-02, each of which ran
    /// for `ran_s`.
    fn ran_jobs(n: i64, ran_s: i64) -> Vec<JobRecord> {
        let spec: core::JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "team": "ml", "project": null, "command": ["x"], "env": {},
            "resources": {"gpus": 1, "gpu_models": [], "min_gpu_memory_gb": 0, "cpus": 0,
                          "memory_gb": 0, "nodes": 1},
            "estimated_runtime_s": ran_s, "deadline": null, "priority": "normal",
            "spot": "allowed", "max_price_per_hour": null, "regions": [], "data": null,
            "kind": "batch", "max_latency_ms": null
        }))
        .expect("a core spec");
        let day = 1_796_169_600; // 2026-12-02T00:00:00Z
        (0..n)
            .map(|i| JobRecord {
                id: core::JobId(uuid::Uuid::now_v7()),
                spec: spec.clone(),
                spec_json: String::new(),
                state: core::JobState::Succeeded,
                submitted_at: Timestamp::from_secs(day + i * 60),
                started_at: Some(Timestamp::from_secs(day + i * 60)),
                finished_at: Some(Timestamp::from_secs(day + i * 60 + ran_s)),
                exit_code: Some(0),
                reason: None,
                cancel_requested: false,
                attempts: 1,
                version: 0,
                explanation_json: None,
                placement: None,
                cost: Money::ZERO,
            })
            .collect()
    }

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    #[test]
    fn a_what_if_past_its_deadline_gives_up() {
        let world = onprem_world();
        let jobs = ran_jobs(3, 1800);
        let report = what_if(&world, &jobs, &[], &[], later()).expect("finishes in time");
        assert_eq!(report.jobs, 3);
        // Half an hour each (what they ran, not the estimate) at $2 per GPU-hour billed: in
        // cash, what the company pays, the pool's default marginal cost, a fifth of that.
        assert!(
            (report.current.total_cost_usd - 0.6).abs() < 1e-3,
            "{report:?}"
        );
        assert_eq!(report.current, report.draft);
        assert!(report.changes.is_empty());
        assert_eq!(
            report.current.cost_per_day,
            vec![DayCost {
                day: "2026-12-02".into(),
                cost_usd: 0.6
            }]
        );
        assert_eq!(what_if(&world, &jobs, &[], &[], Instant::now()), None);
    }

    #[test]
    fn a_draft_hard_budget_holds_what_does_not_fit_and_lists_it() {
        let world = onprem_world();
        // $2 each billed ($0.40 in cash); a $3 hard budget this month (on the bill) fits one.
        let jobs = ran_jobs(3, 3600);
        let draft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 3.0, "period": "month", "enforcement": "hard"}
            }))
            .expect("a budget"),
        );
        let report =
            what_if(&world, &jobs, &[], std::slice::from_ref(&draft), later()).expect("in time");
        assert_eq!(report.current.held_jobs, 0, "{report:?}");
        assert_eq!(report.draft.held_jobs, 2, "{report:?}");
        assert!(
            (report.draft.total_cost_usd - 0.4).abs() < 1e-3,
            "{report:?}"
        );
        let held: Vec<&str> = report.changes.iter().map(|c| c.change.as_str()).collect();
        assert_eq!(held, ["held", "held"]);
        assert_eq!(report.changes[0].draft_pool, None);
        assert_eq!(
            report.changes[0].current_pool.as_deref(),
            Some("onprem:dc/h100")
        );
        // The same budget as the current policy: held there too, and nothing changes.
        let report = what_if(
            &world,
            &jobs,
            std::slice::from_ref(&draft),
            std::slice::from_ref(&draft),
            later(),
        )
        .expect("in time");
        assert_eq!(report.current.held_jobs, 2);
        assert!(report.changes.is_empty());
        // A soft budget only alerts.
        let soft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 3.0, "period": "month", "enforcement": "soft"}
            }))
            .expect("a budget"),
        );
        let report = what_if(&world, &jobs, &[], &[soft], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 0);
    }

    #[test]
    fn a_draft_budget_judges_jobs_by_their_estimates_as_the_live_planner_did() {
        // Estimated at an hour ($2), finished in a second: live, a one-cent hard budget held
        // it on its estimate, and so does the replay.
        let mut jobs = ran_jobs(1, 1);
        jobs[0].spec.estimated_runtime_s = Some(3600);
        let draft = record(
            serde_json::from_value(serde_json::json!({
                "budget": {"amount_usd": 0.01, "period": "month", "enforcement": "hard"}
            }))
            .expect("a budget"),
        );
        let report = what_if(&onprem_world(), &jobs, &[], &[draft], later()).expect("in time");
        assert_eq!(report.current.held_jobs, 0, "{report:?}");
        assert_eq!(report.draft.held_jobs, 1, "{report:?}");
        assert_eq!(report.changes[0].change, "held");
    }

    #[test]
    fn a_draft_provider_allow_list_is_replayed() {
        let world = onprem_world();
        let jobs = ran_jobs(2, 600);
        let aws_only = record(
            serde_json::from_value(serde_json::json!({"allowed_providers": ["aws"]}))
                .expect("a body"),
        );
        let report = what_if(&world, &jobs, &[], &[aws_only], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 2, "{report:?}");
        assert_eq!(report.draft.total_cost_usd, 0.0);
        let onprem_only = record(
            serde_json::from_value(serde_json::json!({"allowed_providers": ["onprem"]}))
                .expect("a body"),
        );
        let report = what_if(&world, &jobs, &[], &[onprem_only], later()).expect("in time");
        assert_eq!(report.draft.held_jobs, 0, "{report:?}");
    }
}
