//! The waste loop (issue 28): jobs that hold GPUs without using them, found from heartbeats and
//! acted on by their team's `utilization` rule. Leader only, every heartbeat interval (and when
//! a manual clock moves).
//!
//! Each pass, for every running job (a gang's ranks together, keyed by its rank-0 attempt):
//! - **A sample** is the job's GPUs' latest readings in their nodes' inventories (the store's
//!   `nodes.inventory_json`), at the time of the oldest of those heartbeats; a job whose
//!   heartbeats have not moved since the last pass gives no new sample.
//! - **Its activity** is `switchyard_core::waste::activity_pct` (profiling SM activity where
//!   present, else utilisation; a GPU with nothing resident is idle; the mean over the job's
//!   GPUs), fed to a [`Judge`] under the rule's threshold (10 % for a team without a rule:
//!   measured, never acted on) and to a [`History`] for what-if. A gap longer than 3 × the
//!   heartbeat interval breaks an idle stretch: no data is not idleness.
//! - **Durably**, per job (`gpu_waste`, `store/sql/waste.rs`): the idle GPU-time the judge
//!   accrued (added, so it only grows: `switchyard_gpu_wasted_hours_total{team}`), the history,
//!   the current stretch.
//! - **When the window is met** and the rule applies (a team or project `utilization` rule, the
//!   job's priority not exempt, the job not a service replica — a service's idle replicas are
//!   the autoscaler's to remove), the rule acts **once** per attempt: `notify` → a
//!   `gpu_waste.notify` audit entry (listed for admin, finance and infra); `stop` → the job is
//!   cancelled and ends with the reason; `requeue` → the attempt is stopped as a preemption is
//!   and the job queued again with the reason. Every action writes the audit entry and the
//!   job's `reason`, e.g. "GPUs under 10 % for 30 min (policy ml v3): stopped".
//!
//! The judges live in memory, resumed from the store when a leader first sees a job: the stored
//! last sample and start of the idle stretch (`Judge::resume`) carry the stretch on across a
//! leader change or a restart if the next sample comes within the gap limit (else it starts
//! again, which only delays an action by up to a window). What-if's per-threshold stretches
//! restart (their longest so far is kept); idle GPU-time already accrued is in the store and is
//! not counted twice; an action already taken is not taken again (`gpu_waste.action`).

use std::collections::HashMap;
use std::time::Duration;

use switchyard_core::waste::{
    self, DEFAULT_MEASURE_PCT, GpuReading, History, Judge, Recorded, UtilizationRule, WasteAction,
};
use switchyard_core::{AttemptId, JobId, Timestamp};
use switchyard_protocol::agent::{AttemptRef, Inventory};

use crate::control::scheduler::SchedulerEvent;
use crate::rules::policy::utilization_rule;
use crate::state::App;
use crate::store::{
    CancelOutcome, NewAuditEntry, PolicyRecord, StoreError, WasteRank, WasteRow, WasteWrite,
    merge_history,
};

/// One job's state between passes.
struct Tracked {
    judge: Judge,
    /// The rule (threshold, window) the judge was made for: a changed policy starts it again.
    judged_as: (u8, i64),
    history: History,
    /// The history the store held when this leader began judging the job (an earlier leader's):
    /// what is written is it merged with this leader's ([`merge_history`]).
    stored: Vec<Recorded>,
    last_sample: Option<Timestamp>,
    acted: bool,
}

/// The loop's memory: one entry per running job. Lost on leader change (see the module docs).
#[derive(Default)]
pub struct Waste {
    jobs: HashMap<AttemptId, Tracked>,
}

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pass {
    /// Jobs given a new sample.
    pub sampled: usize,
    /// The actions taken: the job, the action, the reason.
    pub acted: Vec<(JobId, WasteAction, String)>,
}

/// The waste loop: a pass every heartbeat interval (and when a manual clock moves), on the
/// leader only, for the life of the process.
pub async fn run(app: App) {
    let every = Duration::from_secs(app.config.heartbeat_interval_s.max(1));
    let mut interval = tokio::time::interval(every);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut moves = app.clock.moves();
    let mut state = Waste::default();
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = moves.next() => {}
        }
        if !app.leadership.is_leader() {
            // A deposed leader's judges are stale by the time it leads again.
            state = Waste::default();
            continue;
        }
        match state.pass(&app).await {
            Ok(_) => {}
            Err(e @ StoreError::Fenced { .. }) => {
                app.leadership.step_down(app.store.as_ref(), &e.to_string());
            }
            Err(e) => tracing::error!(error = %e, "waste pass failed; retrying next interval"),
        }
    }
}

/// The rule that governs a job of `team` and `project`: the project's policy when it has a
/// `utilization` section, else the team-wide one's. With the policy's name and version.
fn rule_for<'a>(
    policies: &'a [PolicyRecord],
    team: &str,
    project: Option<&str>,
) -> Option<(UtilizationRule, &'a PolicyRecord)> {
    let with_rule = |p: &&PolicyRecord| p.team == team && p.body.utilization.is_some();
    policies
        .iter()
        .filter(with_rule)
        .find(|p| project.is_some() && p.project.as_deref() == project)
        .or_else(|| {
            policies
                .iter()
                .filter(with_rule)
                .find(|p| p.project.is_none())
        })
        .and_then(|p| Some((utilization_rule(&p.body)?, p)))
}

/// The readings of `gpus` in a node's inventory (JSON as stored); a GPU missing from it, or an
/// inventory that does not parse, gives no reading.
pub fn readings(inventory_json: &str, gpus: &[u32]) -> Vec<GpuReading> {
    let Ok(inv) = serde_json::from_str::<Inventory>(inventory_json) else {
        return vec![GpuReading::default(); gpus.len()];
    };
    gpus.iter()
        .map(|i| {
            inv.gpus
                .iter()
                .find(|g| g.index == *i)
                .map(|g| GpuReading {
                    utilization_pct: g.utilization_pct.map(f64::from),
                    sm_active_pct: g.profiling.as_ref().and_then(|p| p.sm_active_pct),
                    memory_used_mb: g.memory_used_mb,
                    memory_total_mb: Some(g.memory_mb).filter(|m| *m > 0),
                })
                .unwrap_or_default()
        })
        .collect()
}

/// The name a policy is called by in a reason: `ml`, or `ml/vision` for a project's.
fn policy_name(p: &PolicyRecord) -> String {
    match &p.project {
        Some(project) => format!("{}/{project}", p.team),
        None => p.team.clone(),
    }
}

impl Waste {
    /// One pass over every running job; see the module docs.
    pub async fn pass(&mut self, app: &App) -> Result<Pass, StoreError> {
        let max_gap_ms = i64::try_from(app.config.heartbeat_interval_s)
            .unwrap_or(i64::MAX / 3000)
            .saturating_mul(3000);
        let ranks = app.store.waste_ranks().await?;
        let policies = app.store.policies().await?;
        let mut jobs: Vec<(AttemptId, Vec<&WasteRank>)> = Vec::new();
        for r in &ranks {
            match jobs.last_mut() {
                Some((key, group)) if *key == r.key => group.push(r),
                _ => jobs.push((r.key, vec![r])),
            }
        }
        // Jobs no longer running are forgotten.
        let running: std::collections::HashSet<AttemptId> =
            jobs.iter().map(|(key, _)| *key).collect();
        self.jobs.retain(|k, _| running.contains(k));
        let mut out = Pass::default();
        let mut writes = Vec::new();
        let mut actions = Vec::new();
        for (key, group) in &jobs {
            let Some(lead) = group.first() else { continue };
            let Some(at) = group.iter().map(|r| r.last_heartbeat).min() else {
                continue;
            };
            // A heartbeat from before a rank started read GPUs its job had not touched yet:
            // not a sample of the job (it would start an idle stretch before the job ran).
            if group.iter().any(|r| r.last_heartbeat < r.started_at) {
                continue;
            }
            let found = rule_for(&policies, &lead.team, lead.project.as_deref());
            let (threshold, window_ms) = found
                .as_ref()
                .map_or((DEFAULT_MEASURE_PCT, i64::MAX), |(r, _)| {
                    (r.min_gpu_utilization_pct, r.window_ms())
                });
            if !self.jobs.contains_key(key) {
                let row = app.store.waste_row(*key).await?;
                let acted = row.as_ref().is_some_and(|r| r.action.is_some());
                // An earlier leader's stretch goes on (if the next sample is near enough).
                let judge = match &row {
                    Some(r) => Judge::resume(
                        threshold,
                        window_ms,
                        max_gap_ms,
                        r.last_sample_at.millis(),
                        r.idle_since.map(|t| t.millis()),
                    ),
                    None => Judge::new(threshold, window_ms, max_gap_ms),
                };
                let stored = row.map(|r| r.history).unwrap_or_default();
                self.jobs.insert(
                    *key,
                    Tracked {
                        judge,
                        judged_as: (threshold, window_ms),
                        history: History::new(max_gap_ms),
                        stored,
                        last_sample: None,
                        acted,
                    },
                );
            }
            let Some(t) = self.jobs.get_mut(key) else {
                continue;
            };
            if t.judged_as != (threshold, window_ms) {
                t.judge = Judge::new(threshold, window_ms, max_gap_ms);
                t.judged_as = (threshold, window_ms);
            }
            if t.last_sample == Some(at) {
                continue;
            }
            t.last_sample = Some(at);
            out.sampled += 1;
            let readings: Vec<GpuReading> = group
                .iter()
                .flat_map(|r| readings(&r.inventory_json, &r.gpus))
                .collect();
            let gpus = u32::try_from(readings.len()).unwrap_or(u32::MAX);
            let activity = waste::activity_pct(&readings);
            let verdict = t.judge.observe(at.millis(), activity, gpus);
            t.history.observe(at.millis(), activity, gpus);
            let history = merge_history(&t.stored, &t.history.recorded());
            let mut row = WasteRow {
                key: *key,
                job: lead.job,
                team: lead.team.clone(),
                project: lead.project.clone(),
                name: lead.name.clone(),
                priority: lead.priority,
                gpus,
                hourly_rate_micros: group
                    .iter()
                    .map(|r| r.hourly_rate_micros)
                    .sum::<Option<i64>>(),
                started_at: group.iter().map(|r| r.started_at).min().unwrap_or(at),
                last_sample_at: at,
                idle_since: verdict
                    .idle
                    .then(|| Timestamp(at.millis() - verdict.idle_for_ms)),
                activity_pct: activity,
                idle_gpu_ms: verdict.accrued_gpu_ms,
                history,
                action: None,
                action_at: None,
                reason: None,
            };
            if let Some((rule, policy)) = &found
                && verdict.window_met
                && !t.acted
                && !lead.service
                && rule.applies_to(lead.priority)
            {
                let reason = rule.reason(&policy_name(policy), policy.version);
                t.acted = true;
                row.action = Some(rule.action.as_str().to_string());
                row.action_at = Some(app.clock.now());
                row.reason = Some(reason.clone());
                actions.push((
                    lead.job,
                    *key,
                    rule.action,
                    reason,
                    activity,
                    verdict.idle_for_ms,
                ));
            }
            writes.push(WasteWrite { row });
        }
        // The record first: an action is taken once even if carrying it out fails below.
        app.store.record_waste(&writes).await?;
        let now = app.clock.now();
        for (job, key, action, reason, activity, idle_for_ms) in actions {
            self.act(app, job, key, action, &reason, activity, idle_for_ms, now)
                .await?;
            out.acted.push((job, action, reason));
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    async fn act(
        &self,
        app: &App,
        job: JobId,
        key: AttemptId,
        action: WasteAction,
        reason: &str,
        activity: Option<f64>,
        idle_for_ms: i64,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let Some(record) = app.store.job(job).await? else {
            return Ok(());
        };
        tracing::warn!(job.id = %job, team = %record.spec.team, action = action.as_str(), %reason,
            "GPU waste rule acting");
        let after = serde_json::json!({
            "action": action.as_str(),
            "reason": reason,
            "team": record.spec.team,
            "project": record.spec.project,
            "job": job.to_string(),
            "attempt": key.to_string(),
            "activity_pct": activity,
            "idle_for_s": idle_for_ms / 1000,
        });
        app.store
            .append_audit(&NewAuditEntry {
                at: now,
                actor: "system".into(),
                action: format!("gpu_waste.{}", action.as_str()),
                target: format!("job:{job}"),
                before_json: None,
                after_json: Some(after.to_string()),
            })
            .await?;
        match action {
            WasteAction::Notify => app.store.note_waste(job, reason).await?,
            WasteAction::Stop => match app.store.stop_for_waste(job, reason, now).await? {
                CancelOutcome::Cancelled { withdrawn } => {
                    app.scheduler.send(SchedulerEvent::JobRemoved(job));
                    for (_, node) in &withdrawn {
                        app.agents.wake(node);
                    }
                }
                CancelOutcome::Stopping { nodes, withdrawn } => {
                    for node in nodes.iter().chain(withdrawn.iter().map(|(_, n)| n)) {
                        app.agents.wake(node);
                    }
                }
                CancelOutcome::NotFound | CancelOutcome::AlreadyFinished(_) => {}
            },
            WasteAction::Requeue => {
                let stopping: Vec<(switchyard_core::NodeId, AttemptRef)> = app
                    .store
                    .preempt_attempts(&[(key, reason.to_string())])
                    .await?;
                for (node, _) in &stopping {
                    app.agents.wake(node);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::policy::tests::record;
    use switchyard_protocol::api::{PolicyBody, UtilizationRule as WireRule, WasteAction as Wire};

    #[test]
    fn a_projects_rule_wins_over_its_teams() {
        let body = |pct, action| PolicyBody {
            utilization: Some(WireRule {
                min_gpu_utilization_pct: pct,
                window_s: 600,
                action,
                exempt_priorities: vec![],
            }),
            ..PolicyBody::default()
        };
        let team = record(body(10, Wire::Notify));
        let mut cv = record(body(30, Wire::Stop));
        cv.project = Some("cv".into());
        cv.version = 4;
        let mut other = record(body(50, Wire::Requeue));
        other.team = "infra".into();
        let policies = [other, team, cv];
        let (rule, p) = rule_for(&policies, "ml", Some("cv")).expect("cv's rule");
        assert_eq!(
            (rule.min_gpu_utilization_pct, rule.action),
            (30, WasteAction::Stop)
        );
        assert_eq!((policy_name(p), p.version), ("ml/cv".to_string(), 4));
        let (rule, p) = rule_for(&policies, "ml", Some("nlp")).expect("the team's rule");
        assert_eq!(rule.min_gpu_utilization_pct, 10);
        assert_eq!(policy_name(p), "ml");
        assert!(rule_for(&policies, "vision", None).is_none());
    }

    #[test]
    fn readings_come_from_the_attempts_gpus() {
        let inv = serde_json::json!({
            "gpus": [
                {"index": 0, "uuid": "a", "model": "H100", "memory_mb": 80000,
                 "memory_used_mb": 40000, "utilization_pct": 90},
                {"index": 1, "uuid": "b", "model": "H100", "memory_mb": 80000,
                 "memory_used_mb": 40000, "utilization_pct": 90,
                 "profiling": {"sm_active_pct": 4.0}}
            ],
            "cpus": 8, "memory_mb": 1000, "simulated": true
        })
        .to_string();
        let r = readings(&inv, &[1, 3]);
        assert_eq!(r.len(), 2);
        assert_eq!(waste::gpu_activity_pct(&r[0]), Some(4.0));
        assert_eq!(waste::gpu_activity_pct(&r[1]), None);
        assert_eq!(waste::activity_pct(&readings(&inv, &[0, 1])), Some(47.0));
        assert_eq!(readings("not json", &[0]), vec![GpuReading::default()]);
    }
}
