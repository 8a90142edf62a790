//! What the schedulers are told a job will run, and how wrong that is.
//!
//! A live scheduler never knows a job's true runtime. The replay gives each one what it could
//! know (DESIGN.md, "Estimates are data"):
//!
//! - **user**: the runtime the user asked for. A trace that records it (Blue Waters'
//!   `wall_time`, SWF's requested time) gives it per job; for one that does not (Philly,
//!   Helios), it is drawn from the scenario's `[estimates]` noise model, our stated
//!   assumption: `requested = runtime × overask`, `ln overask ~ Normal(ln median_overask,
//!   sigma)`, rounded up to whole `round_up_s`. The defaults are Blue Waters' own GPU jobs
//!   (runtime ÷ requested: p50 0.086, p90 1.0, so a median over-ask of 11.6× and one job in
//!   ten running past its request: `sigma = ln 11.6 / 1.2816 = 1.91`), with requests in
//!   whole minutes. The peers (`cheapest`, `fifo-burst`) are told this.
//! - **predicted**: Switchyard's runtime prediction (`switchyard_core::predict`), learnt
//!   online as jobs end in the replay, keyed by the trace's user, job name and GPUs, and
//!   calibrating each user's requests by their history: cost judged at the p50, deadlines at
//!   the p90. This is the `switchyard` the report's headline figures are about.
//! - **oracle**: the true runtime (`switchyard-oracle`): what the prediction could at best
//!   reach, reported beside it.
//!
//! The error of each source against the truth is measured on the measured jobs' first
//! estimate (at arrival, before anything about the job is known): the median absolute
//! percentage error, the share of jobs under-predicted and the 90th percentile of the
//! under-prediction (`max(0, 1 − told ÷ actual)`: the share of the run not foreseen).

use super::trace::TraceJob;
use anyhow::bail;
use serde::{Deserialize, Serialize};
use switchyard_core::predict::{JobKey, Predictor, command_digest};
use switchyard_core::sim::rng::SplitMix64;
use switchyard_core::sim::{Estimator, SimJob, Told};

/// The noise model for traces without the users' requests (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EstimatesScenario {
    /// The median of `requested ÷ runtime`.
    pub median_overask: f64,
    /// The standard deviation of `ln(requested ÷ runtime)`.
    pub sigma: f64,
    /// Requests are rounded up to whole multiples of this (0: not rounded).
    pub round_up_s: i64,
}

impl Default for EstimatesScenario {
    fn default() -> Self {
        EstimatesScenario {
            median_overask: 11.6,
            sigma: 1.91,
            round_up_s: 60,
        }
    }
}

impl EstimatesScenario {
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(self.median_overask.is_finite() && self.median_overask > 0.0) {
            bail!(
                "estimates.median_overask must be above 0, not {}",
                self.median_overask
            );
        }
        if !(self.sigma.is_finite() && (0.0..=10.0).contains(&self.sigma)) {
            bail!(
                "estimates.sigma must be between 0 and 10, not {}",
                self.sigma
            );
        }
        if self.round_up_s < 0 {
            bail!(
                "estimates.round_up_s must be 0 or more, not {}",
                self.round_up_s
            );
        }
        Ok(())
    }

    /// What each trace job's user asked for: the trace's request where it has one, else a
    /// draw from the noise model (one draw per job whatever the outcome, from its own
    /// seeded stream, so one job's draw never shifts another's). Also whether any was drawn.
    pub fn requested(&self, seed: u64, trace: &[TraceJob], jobs: &[SimJob]) -> (Vec<i64>, bool) {
        let mut rng = SplitMix64::stream(seed, 4);
        let mut drawn = false;
        let out = trace
            .iter()
            .zip(jobs)
            .map(|(t, j)| {
                let (u1, u2) = (rng.next_f64(), rng.next_f64());
                if let Some(r) = t.requested_s.filter(|&r| r > 0) {
                    // A folded job's runtime was stretched to keep its GPU-hours: so is its
                    // request.
                    return scale(r, j.runtime_s, t.runtime_s);
                }
                drawn = true;
                // Box–Muller: a standard normal from two uniforms.
                let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let overask = (self.median_overask.ln() + self.sigma * z).exp();
                let raw = (j.runtime_s.max(1) as f64 * overask).min(1e15).ceil() as i64;
                let r = match self.round_up_s {
                    0 => raw,
                    step => (raw.saturating_add(step - 1) / step).saturating_mul(step),
                };
                r.max(1)
            })
            .collect();
        (out, drawn)
    }
}

/// `requested × stretched ÷ original`, the request of a job whose runtime the scenario
/// stretched (folded multi-node jobs).
fn scale(requested: i64, stretched: i64, original: i64) -> i64 {
    if stretched == original || original <= 0 {
        return requested;
    }
    let r = i128::from(requested) * i128::from(stretched) / i128::from(original);
    i64::try_from(r).unwrap_or(i64::MAX).max(1)
}

/// Tells each job its [`SimJob::estimate_s`] (the truth without one), and records it.
#[derive(Debug)]
pub struct Given {
    pub told: Vec<Option<Told>>,
}

impl Given {
    pub fn new(n: usize) -> Given {
        Given {
            told: vec![None; n],
        }
    }
}

impl Estimator for Given {
    fn estimate(&mut self, index: usize, job: &SimJob) -> Told {
        let t = switchyard_core::sim::AsGiven.estimate(index, job);
        self.told[index] = Some(t);
        t
    }
}

/// Switchyard's prediction, learnt as the replay's jobs end (see the module docs).
#[derive(Debug)]
pub struct Predicting {
    predictor: Predictor,
    keys: Vec<JobKey>,
    pub told: Vec<Option<Told>>,
}

impl Predicting {
    /// `trace` and `jobs` side by side, as [`super::scenario::Scenario::jobs`] made them.
    pub fn new(trace: &[TraceJob], jobs: &[SimJob]) -> Predicting {
        let command = command_digest(&[]);
        let keys = trace
            .iter()
            .zip(jobs)
            .map(|(t, j)| JobKey {
                team: j.spec.team.clone(),
                user: t.user.clone(),
                name: t.name.clone().unwrap_or_default(),
                command: command.clone(),
                gpus: j
                    .spec
                    .resources
                    .gpus
                    .saturating_mul(j.spec.resources.nodes.max(1)),
            })
            .collect();
        Predicting {
            predictor: Predictor::new(),
            keys,
            told: vec![None; jobs.len()],
        }
    }
}

impl Estimator for Predicting {
    fn estimate(&mut self, index: usize, job: &SimJob) -> Told {
        let p = self.predictor.predict(&self.keys[index], job.estimate_s);
        let t = Told {
            runtime_s: p.p50_s.max(1),
            deadline_runtime_s: p.p90_s.max(p.p50_s).max(1),
        };
        self.told[index] = Some(t);
        t
    }

    fn finished(&mut self, index: usize, job: &SimJob) {
        self.predictor
            .observe(&self.keys[index], job.estimate_s, job.runtime_s.max(1));
    }
}

/// How far what a scheduler was told is from the truth (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ErrorStats {
    /// Measured jobs with an estimate and a runtime above 0.
    pub jobs: usize,
    /// Median of `|told − actual| ÷ actual`.
    pub median_abs_pct_error: f64,
    /// Share of those jobs told less than they ran.
    pub under_predicted_share: f64,
    /// 90th percentile of `max(0, 1 − told ÷ actual)`.
    pub p90_under_prediction: f64,
    /// Median of `told ÷ actual`.
    pub median_ratio: f64,
}

/// [`ErrorStats`] of the cost runtimes in `told` over the measured jobs.
pub fn error_stats(jobs: &[SimJob], told: &[Option<Told>]) -> ErrorStats {
    let mut ape = Vec::new();
    let mut under = Vec::new();
    let mut ratio = Vec::new();
    for (j, t) in jobs.iter().zip(told) {
        let (Some(t), true) = (t, j.measured && j.runtime_s > 0) else {
            continue;
        };
        let actual = j.runtime_s as f64;
        let r = t.runtime_s as f64 / actual;
        ape.push((r - 1.0).abs());
        under.push((1.0 - r).max(0.0));
        ratio.push(r);
    }
    let n = ape.len();
    if n == 0 {
        return ErrorStats::default();
    }
    let q = |v: &mut Vec<f64>, q: f64| {
        v.sort_by(f64::total_cmp);
        v[((n - 1) as f64 * q).round() as usize]
    };
    ErrorStats {
        jobs: n,
        median_abs_pct_error: q(&mut ape, 0.5),
        under_predicted_share: under.iter().filter(|&&u| u > 0.0).count() as f64 / n as f64,
        p90_under_prediction: q(&mut under, 0.9),
        median_ratio: q(&mut ratio, 0.5),
    }
}

/// The estimates part of the report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EstimatesReport {
    /// Whether the users' requests were drawn from the noise model (the trace has none).
    pub requests_drawn: bool,
    /// The noise model, when it was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise_model: Option<EstimatesScenario>,
    /// What the users asked for, against the truth (`switchyard-user` and the peers were told
    /// this).
    pub user: ErrorStats,
    /// Switchyard's p50 prediction, against the truth (`switchyard`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted: Option<ErrorStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(runtime_s: i64) -> SimJob {
        let s = super::super::scenario::Scenario {
            start_day: Some(0.0),
            ..Default::default()
        };
        s.jobs(&[trace_job(runtime_s, None)]).remove(0)
    }

    fn trace_job(runtime_s: i64, requested_s: Option<i64>) -> TraceJob {
        TraceJob {
            line: 2,
            submit_s: 0,
            gpus: 1,
            nodes: 1,
            runtime_s,
            status: "Pass".into(),
            user: "u1".into(),
            name: None,
            requested_s,
        }
    }

    /// The noise model's draws have the median over-ask and the share running past their
    /// request it states; a trace's own request is kept.
    #[test]
    fn the_noise_model_draws_what_it_states() {
        let m = EstimatesScenario {
            round_up_s: 0,
            ..EstimatesScenario::default()
        };
        let n = 20_000;
        let trace: Vec<_> = (0..n).map(|_| trace_job(1000, None)).collect();
        let jobs: Vec<_> = (0..n).map(|_| job(1000)).collect();
        let (req, drawn) = m.requested(7, &trace, &jobs);
        assert!(drawn);
        let mut ratios: Vec<f64> = req.iter().map(|&r| r as f64 / 1000.0).collect();
        ratios.sort_by(f64::total_cmp);
        let median = ratios[n / 2];
        assert!(
            (median / 11.6 - 1.0).abs() < 0.05,
            "median over-ask {median}"
        );
        let past = ratios.iter().filter(|&&r| r < 1.0).count() as f64 / n as f64;
        assert!((past - 0.10).abs() < 0.01, "share under-asked {past}");
        let (req, drawn) = m.requested(7, &[trace_job(1000, Some(5000))], &[job(1000)]);
        assert_eq!((req, drawn), (vec![5000], false));
    }

    #[test]
    fn error_stats_measure_what_was_told() {
        let jobs = vec![job(100), job(100), job(100), job(100)];
        let told: Vec<_> = [50, 100, 200, 400]
            .into_iter()
            .map(|r| {
                Some(Told {
                    runtime_s: r,
                    deadline_runtime_s: r,
                })
            })
            .collect();
        let e = error_stats(&jobs, &told);
        assert_eq!(e.jobs, 4);
        assert_eq!(e.under_predicted_share, 0.25);
        assert_eq!(e.p90_under_prediction, 0.5);
        // |r − 1|: 0.5, 0, 1, 3 → the rounded-index median is the third, 1.0.
        assert_eq!(e.median_abs_pct_error, 1.0);
    }

    #[test]
    fn bad_noise_models_are_refused_naming_the_key() {
        for (m, key) in [
            (
                EstimatesScenario {
                    median_overask: 0.0,
                    ..Default::default()
                },
                "estimates.median_overask",
            ),
            (
                EstimatesScenario {
                    sigma: f64::NAN,
                    ..Default::default()
                },
                "estimates.sigma",
            ),
            (
                EstimatesScenario {
                    round_up_s: -1,
                    ..Default::default()
                },
                "estimates.round_up_s",
            ),
        ] {
            let err = m.validate().expect_err(key);
            assert!(err.to_string().contains(key), "{err}");
        }
    }
}
