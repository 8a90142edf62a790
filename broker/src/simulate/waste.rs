//! The waste rule on a simulated trace (issue 28): how many GPU-hours and dollars a
//! `utilization` rule ("stop a job whose GPUs stay under T % for W") would free, and how many jobs
//! it would stop wrongly, when jobs use their GPUs as assumed below. `switchyard simulate
//! --waste` (or a `[waste]` scenario section) adds it to the report.
//!
//! # Our assumption: how busy each job keeps its GPUs
//!
//! Traces record when jobs ran, not how busy their GPUs were, so each trace job is given a
//! utilisation profile drawn from the scenario's seed (one stream per job, so a job's profile
//! does not depend on the others). The shares are ours, not measured; change them in `[waste]`:
//!
//! | kind | default share | profile |
//! |---|---|---|
//! | busy | the rest (50 %) | steady, level uniform in 60–95 % |
//! | light | 10 % (`light_share`) | working but light (a small model on a big GPU, an input-bound pipeline): steady, level uniform in 12–35 % |
//! | phased | 30 % (`phased_share`) | busy (60–95 %) with idle phases at 0–5 % (data loading, evaluation, checkpointing): busy stretches exponential with mean `busy_phase_mean_min` (45 min), idle phases exponential with mean `idle_phase_mean_min` (6 min), at most 4 h |
//! | stuck | 10 % (`stuck_share`) | busy (60–95 %) until a point uniform in 10–90 % of its run, then stuck at a level uniform in 0–12 % to its end: a hung collective, a dataloader waiting for ever; the story's "six hours at 10 %" |
//!
//! Each sample adds noise uniform in ±`noise_pct` (5 points) and is clamped to 0–100 %.
//!
//! # The replay
//!
//! A job's run is its true runtime as placed by the Switchyard replay (the first scheduler
//! replayed when Switchyard was not), sampled every `sample_s` (60 s: the broker's heartbeats
//! are 10 s apart, a minute's resolution changes no verdict worth a window of 30 min or more).
//! The samples go through the broker's own judge ([`switchyard_core::waste::Judge`], the job's
//! activity as the mean over its GPUs: every GPU of a job follows its profile), once per rule.
//! The rule stops the job at the first sample where the window is met. From there:
//!
//! - **freed**: the GPU-hours of the rest of its run (its GPUs × the time it would still have
//!   run), and their dollars at the price the job paid where it ran (its cost in the replay ÷ its
//!   GPU-hours: on-prem at the internal rate, cloud at its market's price);
//! - **wrongly stopped**: a job stopped that was not stuck at that moment (a light or phased
//!   job, or a stuck one before it got stuck). What the rule took from such jobs is counted
//!   apart (`cut_*`), not as freed: it was work, and is lost.
//!
//! Stuck GPU-hours (the waste there is to find) and the share of them freed are reported beside.
//! Only measured jobs that finished count (warm-up jobs are left out, as in the other figures).

use anyhow::bail;
use serde::{Deserialize, Serialize};
use switchyard_core::sim::SimJob;
use switchyard_core::sim::rng::SplitMix64;
use switchyard_core::sim::{JobOutcome, SimResult};
use switchyard_core::waste::Judge;

/// The `[waste]` scenario section: the assumed profiles and the rules replayed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WasteScenario {
    pub stuck_share: f64,
    pub phased_share: f64,
    pub light_share: f64,
    pub busy_phase_mean_min: f64,
    pub idle_phase_mean_min: f64,
    pub noise_pct: f64,
    pub sample_s: i64,
    pub rules: Vec<RuleSpec>,
}

/// One rule to replay: a threshold and a window, as a team policy's `utilization` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub min_gpu_utilization_pct: u8,
    pub window_s: u32,
}

impl Default for WasteScenario {
    fn default() -> Self {
        let rule = |pct, window_s| RuleSpec {
            min_gpu_utilization_pct: pct,
            window_s,
        };
        WasteScenario {
            stuck_share: 0.10,
            phased_share: 0.30,
            light_share: 0.10,
            busy_phase_mean_min: 45.0,
            idle_phase_mean_min: 6.0,
            noise_pct: 5.0,
            sample_s: 60,
            rules: vec![
                rule(10, 1800),
                rule(10, 7200),
                rule(20, 1800),
                rule(20, 7200),
            ],
        }
    }
}

impl WasteScenario {
    /// Refuses values out of range, naming the field.
    pub fn validate(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("waste.stuck_share", self.stuck_share),
            ("waste.phased_share", self.phased_share),
            ("waste.light_share", self.light_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                bail!("{name} must be in [0, 1], not {v}");
            }
        }
        let sum = self.stuck_share + self.phased_share + self.light_share;
        if sum > 1.0 + 1e-9 {
            bail!("waste.stuck_share + phased_share + light_share must be at most 1, not {sum}");
        }
        for (name, v) in [
            ("waste.busy_phase_mean_min", self.busy_phase_mean_min),
            ("waste.idle_phase_mean_min", self.idle_phase_mean_min),
        ] {
            if !(v.is_finite() && v > 0.0) {
                bail!("{name} must be a positive number of minutes, not {v}");
            }
        }
        if !(self.noise_pct.is_finite() && (0.0..=50.0).contains(&self.noise_pct)) {
            bail!("waste.noise_pct must be in [0, 50], not {}", self.noise_pct);
        }
        if !(1..=3600).contains(&self.sample_s) {
            bail!(
                "waste.sample_s must be 1 to 3600 seconds, not {}",
                self.sample_s
            );
        }
        if self.rules.is_empty() {
            bail!("waste.rules must name at least one rule");
        }
        for r in &self.rules {
            if !(1..=100).contains(&r.min_gpu_utilization_pct) {
                bail!(
                    "waste.rules.min_gpu_utilization_pct must be 1 to 100, not {}",
                    r.min_gpu_utilization_pct
                );
            }
            if r.window_s == 0 {
                bail!("waste.rules.window_s must be at least 1 second");
            }
        }
        Ok(())
    }
}

/// A job's kind of use (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Busy,
    Light,
    Phased,
    Stuck,
}

/// A job's utilisation over its run: piecewise constant levels (before noise).
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    pub kind: Kind,
    /// (from second, level %), sorted, the first from 0.
    pub segments: Vec<(i64, f64)>,
    /// When a stuck job got stuck (seconds into its run).
    pub stuck_from_s: Option<i64>,
    /// The seed of its per-sample noise.
    noise_seed: u64,
}

/// Idle phases last at most this long (a long evaluation; longer than the 2 h window, so the
/// cap alone does not keep a phase from meeting it).
const MAX_IDLE_PHASE_S: f64 = 4.0 * 3600.0;

/// Draws job `index`'s profile for a run of `runtime_s`, from the scenario's `seed`.
pub fn profile(p: &WasteScenario, seed: u64, index: u64, runtime_s: i64) -> Profile {
    let mut rng = SplitMix64::stream(seed ^ 0x5741_5354_4500_0028, index);
    let draw = rng.next_f64();
    let kind = if draw < p.stuck_share {
        Kind::Stuck
    } else if draw < p.stuck_share + p.phased_share {
        Kind::Phased
    } else if draw < p.stuck_share + p.phased_share + p.light_share {
        Kind::Light
    } else {
        Kind::Busy
    };
    let busy = rng.uniform(60.0, 95.0);
    let mut segments = vec![(0, busy)];
    let mut stuck_from_s = None;
    match kind {
        Kind::Busy => {}
        Kind::Light => segments[0].1 = rng.uniform(12.0, 35.0),
        Kind::Stuck => {
            let at = (rng.uniform(0.1, 0.9) * runtime_s as f64) as i64;
            segments.push((at, rng.uniform(0.0, 12.0)));
            stuck_from_s = Some(at);
        }
        Kind::Phased => {
            let mut t = 0.0;
            loop {
                t += rng.exponential(1.0 / (p.busy_phase_mean_min * 60.0));
                if t >= runtime_s as f64 {
                    break;
                }
                let idle = rng
                    .exponential(1.0 / (p.idle_phase_mean_min * 60.0))
                    .min(MAX_IDLE_PHASE_S);
                segments.push((t as i64, rng.uniform(0.0, 5.0)));
                t += idle;
                if t >= runtime_s as f64 {
                    break;
                }
                segments.push((t as i64, busy));
            }
        }
    }
    Profile {
        kind,
        segments,
        stuck_from_s,
        noise_seed: rng.next_u64(),
    }
}

impl Profile {
    /// The level at `t_s` seconds into the run, before noise.
    pub fn level_at(&self, t_s: i64) -> f64 {
        let i = self.segments.partition_point(|(from, _)| *from <= t_s);
        self.segments[i.saturating_sub(1)].1
    }

    /// Whether the job is stuck at `t_s` (a stop from then on frees waste, not work).
    pub fn stuck_at(&self, t_s: i64) -> bool {
        self.stuck_from_s.is_some_and(|s| t_s >= s)
    }
}

/// One job's replay under one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replayed {
    /// Seconds into the run when the rule stopped it.
    pub stopped_at_s: Option<i64>,
    /// GPU-seconds under the threshold, as the judge accrued them.
    pub idle_gpu_s: i64,
}

/// Replays a job's samples every `sample_s` over `runtime_s` through the broker's judge.
pub fn replay(
    profile: &Profile,
    runtime_s: i64,
    gpus: u32,
    rule: &RuleSpec,
    sample_s: i64,
    noise_pct: f64,
) -> Replayed {
    let mut judge = Judge::new(
        rule.min_gpu_utilization_pct,
        i64::from(rule.window_s) * 1000,
        3 * sample_s * 1000,
    );
    let mut noise = SplitMix64::new(profile.noise_seed);
    let mut t = 0;
    while t < runtime_s {
        let level = profile.level_at(t) + noise.uniform(-noise_pct, noise_pct);
        let verdict = judge.observe(t * 1000, Some(level.clamp(0.0, 100.0)), gpus);
        if verdict.window_met {
            return Replayed {
                stopped_at_s: Some(t),
                idle_gpu_s: judge.idle_gpu_ms / 1000,
            };
        }
        t += sample_s;
    }
    Replayed {
        stopped_at_s: None,
        idle_gpu_s: judge.idle_gpu_ms / 1000,
    }
}

/// What one rule did over the trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleReport {
    pub min_gpu_utilization_pct: u8,
    pub window_s: u32,
    pub jobs_stopped: u64,
    /// Stopped while stuck: the rule's purpose.
    pub stuck_jobs_stopped: u64,
    /// Stopped although not stuck then (light, phased, or stuck later).
    pub jobs_wrongly_stopped: u64,
    /// The wrong stops by the job's kind (`stuck`: stopped before it got stuck).
    pub wrongly_stopped_by_kind: std::collections::BTreeMap<String, u64>,
    pub freed_gpu_hours: f64,
    pub freed_usd: f64,
    /// Freed ÷ the stuck GPU-hours of all jobs.
    pub freed_share_of_stuck: f64,
    /// What the wrong stops took from working jobs (lost work, not a saving).
    pub cut_gpu_hours: f64,
    pub cut_usd: f64,
    /// GPU-hours the judge counted under the threshold until the stop (or the end).
    pub idle_gpu_hours_seen: f64,
}

/// The waste section of the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WasteReport {
    /// The scheduler whose placement priced the jobs.
    pub placed_by: String,
    pub jobs: u64,
    pub jobs_by_kind: std::collections::BTreeMap<String, u64>,
    pub gpu_hours: f64,
    pub usd: f64,
    /// GPU-hours and dollars of stuck jobs after they got stuck: the waste there is to find.
    pub stuck_gpu_hours: f64,
    pub stuck_usd: f64,
    pub rules: Vec<RuleReport>,
    pub assumption: WasteScenario,
}

/// Replays every rule over every measured job that finished in `result` (which ran `jobs`).
pub fn report(p: &WasteScenario, seed: u64, jobs: &[SimJob], result: &SimResult) -> WasteReport {
    let mut out = WasteReport {
        placed_by: result.scheduler.clone(),
        rules: p
            .rules
            .iter()
            .map(|r| RuleReport {
                min_gpu_utilization_pct: r.min_gpu_utilization_pct,
                window_s: r.window_s,
                ..RuleReport::default()
            })
            .collect(),
        assumption: p.clone(),
        ..WasteReport::default()
    };
    for (index, (job, outcome)) in jobs.iter().zip(&result.jobs).enumerate() {
        let Some(usd_per_gpu_s) = priced(job, outcome) else {
            continue;
        };
        let gpus = job.spec.resources.gpus * job.spec.resources.nodes.max(1);
        let runtime_s = job.runtime_s;
        let prof = profile(p, seed, index as u64, runtime_s);
        out.jobs += 1;
        let kind = format!("{:?}", prof.kind).to_lowercase();
        *out.jobs_by_kind.entry(kind.clone()).or_default() += 1;
        let gpu_s = |s: i64| s as f64 * f64::from(gpus);
        out.gpu_hours += gpu_s(runtime_s) / 3600.0;
        out.usd += gpu_s(runtime_s) * usd_per_gpu_s;
        if let Some(from) = prof.stuck_from_s {
            let stuck = gpu_s(runtime_s - from);
            out.stuck_gpu_hours += stuck / 3600.0;
            out.stuck_usd += stuck * usd_per_gpu_s;
        }
        for (rule, r) in p.rules.iter().zip(&mut out.rules) {
            let run = replay(&prof, runtime_s, gpus, rule, p.sample_s, p.noise_pct);
            r.idle_gpu_hours_seen += run.idle_gpu_s as f64 / 3600.0;
            let Some(at) = run.stopped_at_s else {
                continue;
            };
            r.jobs_stopped += 1;
            let rest = gpu_s(runtime_s - at);
            if prof.stuck_at(at) {
                r.stuck_jobs_stopped += 1;
                r.freed_gpu_hours += rest / 3600.0;
                r.freed_usd += rest * usd_per_gpu_s;
            } else {
                r.jobs_wrongly_stopped += 1;
                *r.wrongly_stopped_by_kind.entry(kind.clone()).or_default() += 1;
                r.cut_gpu_hours += rest / 3600.0;
                r.cut_usd += rest * usd_per_gpu_s;
            }
        }
    }
    for r in &mut out.rules {
        r.freed_share_of_stuck = if out.stuck_gpu_hours > 0.0 {
            r.freed_gpu_hours / out.stuck_gpu_hours
        } else {
            0.0
        };
    }
    out
}

/// The dollars a GPU-second of this job cost where it ran; `None` for a warm-up job, one that
/// did not finish, or one with no GPU time.
fn priced(job: &SimJob, outcome: &JobOutcome) -> Option<f64> {
    if !outcome.measured || outcome.finish.is_none() || outcome.submit != job.submit {
        return None;
    }
    let gpus = job.spec.resources.gpus * job.spec.resources.nodes.max(1);
    let gpu_s = job.runtime_s as f64 * f64::from(gpus);
    (gpu_s > 0.0).then(|| outcome.cost.as_dollars() / gpu_s)
}

/// The report's waste table in Markdown (printed by `simulate` and ready for BENCHMARKS).
pub fn table(r: &WasteReport) -> String {
    let mut s = format!(
        "waste rule replayed on {} jobs placed by {} ({:.0} GPU-h, ${:.2}); stuck after they \
         got stuck: {:.0} GPU-h, ${:.2}\n\n\
         | rule | jobs stopped | stuck jobs stopped (of {}) | wrongly stopped (light / phased / \
         stuck before) | GPU-h freed | $ freed | share of stuck GPU-h | GPU-h cut from working \
         jobs | $ cut |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        r.jobs,
        r.placed_by,
        r.gpu_hours,
        r.usd,
        r.stuck_gpu_hours,
        r.stuck_usd,
        r.jobs_by_kind.get("stuck").copied().unwrap_or(0)
    );
    for x in &r.rules {
        let by = |k: &str| x.wrongly_stopped_by_kind.get(k).copied().unwrap_or(0);
        s.push_str(&format!(
            "| under {} % for {} | {} | {} | {} ({} / {} / {}) | {:.0} | {:.2} | {:.1} % | {:.0} | \
             {:.2} |\n",
            x.min_gpu_utilization_pct,
            switchyard_core::waste::human_duration(x.window_s),
            x.jobs_stopped,
            x.stuck_jobs_stopped,
            x.jobs_wrongly_stopped,
            by("light"),
            by("phased"),
            by("stuck"),
            x.freed_gpu_hours,
            x.freed_usd,
            x.freed_share_of_stuck * 100.0,
            x.cut_gpu_hours,
            x.cut_usd
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(pct: u8, window_s: u32) -> RuleSpec {
        RuleSpec {
            min_gpu_utilization_pct: pct,
            window_s,
        }
    }

    #[test]
    fn profiles_follow_the_stated_shares_and_are_seeded() {
        let p = WasteScenario::default();
        let n = 20_000;
        let mut counts = std::collections::BTreeMap::new();
        for i in 0..n {
            let prof = profile(&p, 42, i, 36_000);
            assert_eq!(prof, profile(&p, 42, i, 36_000), "same seed, same profile");
            *counts.entry(prof.kind).or_insert(0u64) += 1;
            match prof.kind {
                Kind::Stuck => {
                    let from = prof.stuck_from_s.expect("stuck has a start");
                    assert!((3600..=32_400).contains(&from), "{from}");
                    assert!(prof.level_at(from - 1) >= 60.0);
                    assert!(prof.level_at(from) < 12.0);
                    assert!(prof.stuck_at(from) && !prof.stuck_at(from - 1));
                }
                Kind::Light => assert!((12.0..35.0).contains(&prof.level_at(0))),
                Kind::Busy => assert_eq!(prof.segments.len(), 1),
                Kind::Phased => {
                    assert!(prof.stuck_from_s.is_none());
                    assert!(prof.segments.windows(2).all(|w| w[0].0 <= w[1].0));
                }
            }
        }
        let share = |k| counts.get(&k).copied().unwrap_or(0) as f64 / n as f64;
        assert!((share(Kind::Stuck) - 0.10).abs() < 0.01, "{counts:?}");
        assert!((share(Kind::Phased) - 0.30).abs() < 0.015, "{counts:?}");
        assert!((share(Kind::Light) - 0.10).abs() < 0.01, "{counts:?}");
        assert!((share(Kind::Busy) - 0.50).abs() < 0.015, "{counts:?}");
        // Another seed, other profiles.
        assert!((0..100).any(|i| profile(&p, 43, i, 36_000) != profile(&p, 42, i, 36_000)));
    }

    #[test]
    fn phased_idle_phases_average_what_the_scenario_says() {
        let p = WasteScenario {
            phased_share: 1.0,
            stuck_share: 0.0,
            light_share: 0.0,
            ..WasteScenario::default()
        };
        let prof = profile(&p, 7, 0, 10_000_000);
        let (mut idle_s, mut phases) = (0i64, 0u32);
        for w in prof.segments.windows(2) {
            if w[0].1 < 6.0 {
                idle_s += w[1].0 - w[0].0;
                phases += 1;
            }
        }
        let mean_min = idle_s as f64 / f64::from(phases) / 60.0;
        assert!(
            (5.0..7.0).contains(&mean_min),
            "{mean_min} min over {phases}"
        );
    }

    /// The story: busy for 4 h, then stuck at under 10 % for 6 h. A 30-minute rule at 10 %
    /// stops it 30 minutes into the stuck stretch; a busy job is never stopped.
    #[test]
    fn replay_stops_a_stuck_job_after_the_window() {
        let stuck = Profile {
            kind: Kind::Stuck,
            segments: vec![(0, 80.0), (14_400, 3.0)],
            stuck_from_s: Some(14_400),
            noise_seed: 1,
        };
        let run = replay(&stuck, 36_000, 8, &rule(10, 1800), 60, 2.0);
        assert_eq!(run.stopped_at_s, Some(14_400 + 1800));
        assert_eq!(run.idle_gpu_s, 1800 * 8);
        let busy = Profile {
            kind: Kind::Busy,
            segments: vec![(0, 80.0)],
            stuck_from_s: None,
            noise_seed: 1,
        };
        assert_eq!(
            replay(&busy, 36_000, 8, &rule(10, 1800), 60, 5.0).stopped_at_s,
            None
        );
        // A 20-minute evaluation phase: stopped by a 10-minute window, not by 30 minutes.
        let phased = Profile {
            kind: Kind::Phased,
            segments: vec![(0, 80.0), (3600, 2.0), (4800, 80.0)],
            stuck_from_s: None,
            noise_seed: 1,
        };
        assert_eq!(
            replay(&phased, 36_000, 1, &rule(10, 600), 60, 1.0).stopped_at_s,
            Some(3600 + 600)
        );
        assert_eq!(
            replay(&phased, 36_000, 1, &rule(10, 1800), 60, 1.0).stopped_at_s,
            None
        );
    }

    #[test]
    fn bad_sections_name_the_field() {
        let bad = [
            WasteScenario {
                stuck_share: 1.5,
                ..WasteScenario::default()
            },
            WasteScenario {
                stuck_share: 0.6,
                phased_share: 0.6,
                ..WasteScenario::default()
            },
            WasteScenario {
                sample_s: 0,
                ..WasteScenario::default()
            },
            WasteScenario {
                rules: vec![rule(0, 60)],
                ..WasteScenario::default()
            },
        ];
        let fields = [
            "waste.stuck_share",
            "waste.stuck_share",
            "waste.sample_s",
            "waste.rules.min_gpu_utilization_pct",
        ];
        for (b, f) in bad.iter().zip(fields) {
            let e = b.validate().expect_err("refused").to_string();
            assert!(e.contains(f), "{e}");
        }
        WasteScenario::default()
            .validate()
            .expect("the defaults are valid");
    }
}
