//! Waste: a job that holds GPUs without using them (issue 28).
//!
//! Pure, like the rest of `core`: readings and times are arguments, nothing is read or stored
//! here. The broker's leader loop (`broker/src/control/waste.rs`) and the simulator feed the same
//! [`Judge`], so a stop can be replayed.
//!
//! # How busy is one GPU ([`gpu_activity_pct`])
//!
//! - **Profiling SM activity where present** (`DCGM_FI_PROF_SM_ACTIVE`, NVML GPM): the fraction
//!   of time warps were resident on the SMs, averaged over SMs. It is the honest measure: one
//!   small kernel a second barely moves it.
//! - **Else the driver's utilisation** (`nvidia-smi`'s `utilization.gpu`,
//!   `DCGM_FI_DEV_GPU_UTIL`): the fraction of the sample period in which *any* kernel ran. It
//!   over-states work (one tiny kernel per sample reads as busy, dcgm-exporter#341), so without
//!   profiling the rule is looser: it can miss waste, it does not invent it.
//! - **Memory used can prove idleness, never activity.** A caching allocator (PyTorch's) keeps
//!   its memory while the job waits on a lock, a dataloader or a human, so "memory full" says
//!   nothing about work. But a GPU with (almost) nothing resident — under
//!   [`EMPTY_MEMORY_PCT`] of its memory, less than a CUDA context takes — runs nothing, whatever
//!   its utilisation reads: it counts as 0 %. This is the story's "GPUs at 10 % memory use" case
//!   when the job never even opened the device.
//! - Neither utilisation nor profiling present: no reading (`None`). **No data is not
//!   idleness.**
//!
//! # Judged per job over its GPUs ([`activity_pct`])
//!
//! The job's activity is the **mean** of its GPUs' activity. It is the share of what the job
//! holds that it uses, which is what waste is (GPU-hours paid for and not used). The busiest GPU
//! would let a job that uses one of its eight GPUs hold the other seven for ever; the least busy
//! (dstack's "any GPU under the threshold") would stop a pipeline or parameter-server job whose
//! one lightly used GPU is by design. A GPU without a reading is left out of the mean; a job with
//! no reading on any GPU has no activity (`None`).
//!
//! # The window ([`Judge`])
//!
//! A job is idle when its activity is under the rule's threshold; the rule fires when it has
//! been idle for the whole window. A stretch starts at the first idle sample (not at the busy one
//! before it) and is broken by a busy sample, by a sample with no reading, or by a gap between
//! samples longer than the judge's `max_gap_ms` (3 × the heartbeat interval in the broker): a
//! node that stops reporting has not shown that its job is idle. Idle GPU-time accrues only
//! between two idle samples no further apart than `max_gap_ms`.
//!
//! A judge can [`Judge::resume`] a stretch recorded earlier (the broker stores each job's
//! last sample and the start of its stretch), so a new leader carries on where the last left.
//!
//! # History for what-if ([`History`])
//!
//! Per attempt the broker keeps, for each of a few fixed thresholds ([`RECORDED_THRESHOLDS`]),
//! the longest idle stretch and the idle GPU-time: ten numbers, whatever the attempt's length.
//! It answers "would a rule with threshold T and window W have fired on this attempt" exactly
//! for a recorded T and conservatively (using the nearest recorded threshold below T) for
//! others; it cannot say *when* in the attempt the stretch was, nor replay a rule whose window
//! was met by a stretch interrupted by one busy sample.

use crate::domain::Priority;

/// A GPU with less than this share of its memory in use holds nothing that could run: it counts
/// as idle whatever its utilisation reads.
pub const EMPTY_MEMORY_PCT: f64 = 1.0;

/// Thresholds (percent) under which each attempt's idle stretches are recorded for what-if.
pub const RECORDED_THRESHOLDS: [u8; 5] = [5, 10, 20, 30, 50];

/// The threshold used to measure idle GPU-hours for a team that has no utilisation rule (only
/// measured and shown; nothing is done).
pub const DEFAULT_MEASURE_PCT: u8 = 10;

/// What the rule does when a job has been idle for its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WasteAction {
    /// Audit entry and event; the job keeps running.
    Notify,
    /// Cancel the job with the reason.
    Stop,
    /// Stop this attempt and queue the job again with the reason.
    Requeue,
}

impl WasteAction {
    pub fn as_str(self) -> &'static str {
        match self {
            WasteAction::Notify => "notify",
            WasteAction::Stop => "stop",
            WasteAction::Requeue => "requeue",
        }
    }

    /// The action [`WasteAction::as_str`] names, if `s` is one.
    pub fn parse(s: &str) -> Option<WasteAction> {
        [WasteAction::Notify, WasteAction::Stop, WasteAction::Requeue]
            .into_iter()
            .find(|a| a.as_str() == s)
    }

    /// The past tense, for a job's reason: "stopped", "requeued", "notified".
    pub fn done(self) -> &'static str {
        match self {
            WasteAction::Notify => "notified",
            WasteAction::Stop => "stopped",
            WasteAction::Requeue => "requeued",
        }
    }
}

/// A team policy's `utilization` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UtilizationRule {
    /// A job whose activity is under this (percent, 1–100) is idle.
    pub min_gpu_utilization_pct: u8,
    /// How long it must stay idle before the action.
    pub window_s: u32,
    pub action: WasteAction,
    /// Jobs of these priorities are never acted on (their idle time is still measured).
    pub exempt_priorities: Vec<Priority>,
}

impl UtilizationRule {
    /// Whether the rule may act on a job of this priority.
    pub fn applies_to(&self, priority: Priority) -> bool {
        !self.exempt_priorities.contains(&priority)
    }

    pub fn window_ms(&self) -> i64 {
        i64::from(self.window_s) * 1000
    }

    /// The reason written on the job when the rule acts, e.g. "GPUs under 10 % for 30 min
    /// (policy ml v3): stopped".
    pub fn reason(&self, policy: &str, version: i64) -> String {
        format!(
            "GPUs under {} % for {} (policy {policy} v{version}): {}",
            self.min_gpu_utilization_pct,
            human_duration(self.window_s),
            self.action.done()
        )
    }
}

/// "30 min", "2 h", "90 s", "1 h 30 min".
pub fn human_duration(secs: u32) -> String {
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    let mut parts = Vec::new();
    if h > 0 {
        parts.push(format!("{h} h"));
    }
    if m > 0 {
        parts.push(format!("{m} min"));
    }
    if s > 0 || parts.is_empty() {
        parts.push(format!("{s} s"));
    }
    parts.join(" ")
}

/// One GPU's latest reading, as plain numbers (core does not know the wire types).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GpuReading {
    /// The driver's utilisation, percent.
    pub utilization_pct: Option<f64>,
    /// Profiling SM activity, percent, where the GPU and driver give it.
    pub sm_active_pct: Option<f64>,
    pub memory_used_mb: Option<u64>,
    pub memory_total_mb: Option<u64>,
}

/// How busy one GPU is, percent (0–100), or `None` when it gives no usable reading. See the
/// module docs for why.
pub fn gpu_activity_pct(r: &GpuReading) -> Option<f64> {
    let measured = r
        .sm_active_pct
        .filter(|v| v.is_finite())
        .or(r.utilization_pct.filter(|v| v.is_finite()))?
        .clamp(0.0, 100.0);
    if let (Some(used), Some(total)) = (r.memory_used_mb, r.memory_total_mb)
        && total > 0
        && (used as f64) * 100.0 / (total as f64) < EMPTY_MEMORY_PCT
    {
        return Some(0.0);
    }
    Some(measured)
}

/// A job's activity over its GPUs: the mean of those with a reading; `None` if none has one.
pub fn activity_pct(gpus: &[GpuReading]) -> Option<f64> {
    let (sum, n) = gpus
        .iter()
        .filter_map(gpu_activity_pct)
        .fold((0.0, 0u32), |(s, n), a| (s + a, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// What one sample told the [`Judge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Verdict {
    /// The job is under the threshold now.
    pub idle: bool,
    /// How long the current idle stretch has lasted (0 when not idle).
    pub idle_for_ms: i64,
    /// The stretch has lasted the whole window (only meaningful with a window).
    pub window_met: bool,
    /// Idle GPU-milliseconds this sample added.
    pub accrued_gpu_ms: i64,
}

/// One job's idle stretch under one threshold, fed one sample at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct Judge {
    threshold_pct: f64,
    window_ms: i64,
    max_gap_ms: i64,
    last_at: Option<i64>,
    idle_since: Option<i64>,
    /// Idle GPU-milliseconds accrued since the judge was made.
    pub idle_gpu_ms: i64,
    /// The longest idle stretch seen, milliseconds.
    pub longest_idle_ms: i64,
}

impl Judge {
    /// A judge for "under `threshold_pct` for `window_ms`", where samples further apart than
    /// `max_gap_ms` break a stretch.
    pub fn new(threshold_pct: u8, window_ms: i64, max_gap_ms: i64) -> Judge {
        Judge {
            threshold_pct: f64::from(threshold_pct),
            window_ms,
            max_gap_ms,
            last_at: None,
            idle_since: None,
            idle_gpu_ms: 0,
            longest_idle_ms: 0,
        }
    }

    /// A judge that carries on a stretch recorded earlier (by another leader, before a
    /// restart): its last sample was at `last_at_ms`, and the job had been idle since
    /// `idle_since_ms` (`None`: it was not idle). The next sample continues the stretch if it
    /// comes within `max_gap_ms` of `last_at_ms`.
    pub fn resume(
        threshold_pct: u8,
        window_ms: i64,
        max_gap_ms: i64,
        last_at_ms: i64,
        idle_since_ms: Option<i64>,
    ) -> Judge {
        let mut j = Judge::new(threshold_pct, window_ms, max_gap_ms);
        j.last_at = Some(last_at_ms);
        j.idle_since = idle_since_ms.filter(|s| *s <= last_at_ms);
        j
    }

    /// A judge for a rule.
    pub fn for_rule(rule: &UtilizationRule, max_gap_ms: i64) -> Judge {
        Judge::new(rule.min_gpu_utilization_pct, rule.window_ms(), max_gap_ms)
    }

    pub fn threshold_pct(&self) -> f64 {
        self.threshold_pct
    }

    /// Feed one sample: at `at_ms`, the job's activity (`None`: no reading) over `gpus` GPUs. A
    /// sample older than the last one is ignored.
    pub fn observe(&mut self, at_ms: i64, activity: Option<f64>, gpus: u32) -> Verdict {
        if self.last_at.is_some_and(|last| at_ms < last) {
            return self.verdict(self.last_at.unwrap_or(at_ms), 0);
        }
        let contiguous = self
            .last_at
            .is_some_and(|last| at_ms - last <= self.max_gap_ms);
        let idle = activity.is_some_and(|a| a < self.threshold_pct);
        let mut accrued = 0;
        match (idle, self.idle_since, self.last_at) {
            (true, Some(_), Some(last)) if contiguous => {
                accrued = (at_ms - last).saturating_mul(i64::from(gpus));
            }
            (true, _, _) => self.idle_since = Some(at_ms),
            (false, _, _) => self.idle_since = None,
        }
        self.last_at = Some(at_ms);
        self.idle_gpu_ms = self.idle_gpu_ms.saturating_add(accrued);
        let verdict = self.verdict(at_ms, accrued);
        self.longest_idle_ms = self.longest_idle_ms.max(verdict.idle_for_ms);
        verdict
    }

    fn verdict(&self, at_ms: i64, accrued: i64) -> Verdict {
        let idle_for_ms = self.idle_since.map_or(0, |s| (at_ms - s).max(0));
        Verdict {
            idle: self.idle_since.is_some(),
            idle_for_ms,
            window_met: self.idle_since.is_some() && idle_for_ms >= self.window_ms,
            accrued_gpu_ms: accrued,
        }
    }
}

/// One attempt's idle record under each of [`RECORDED_THRESHOLDS`], for what-if.
#[derive(Clone, Debug, PartialEq)]
pub struct History {
    judges: Vec<Judge>,
}

/// What [`History`] keeps for one threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Recorded {
    pub threshold_pct: u8,
    pub longest_idle_ms: i64,
    pub idle_gpu_ms: i64,
}

impl History {
    pub fn new(max_gap_ms: i64) -> History {
        History {
            judges: RECORDED_THRESHOLDS
                .iter()
                .map(|&t| Judge::new(t, i64::MAX, max_gap_ms))
                .collect(),
        }
    }

    pub fn observe(&mut self, at_ms: i64, activity: Option<f64>, gpus: u32) {
        for j in &mut self.judges {
            j.observe(at_ms, activity, gpus);
        }
    }

    /// What has been recorded, one entry per [`RECORDED_THRESHOLDS`].
    pub fn recorded(&self) -> Vec<Recorded> {
        RECORDED_THRESHOLDS
            .iter()
            .zip(&self.judges)
            .map(|(&t, j)| Recorded {
                threshold_pct: t,
                longest_idle_ms: j.longest_idle_ms,
                idle_gpu_ms: j.idle_gpu_ms,
            })
            .collect()
    }
}

/// Would `rule` have fired on an attempt with this record? Uses the highest recorded threshold
/// at or under the rule's (a stretch under a lower threshold is also under the rule's, so a
/// "yes" is certain; a "no" may miss a stretch between the two thresholds). `None` when the
/// rule's threshold is under every recorded one: the record cannot say.
///
/// Returns the GPU-milliseconds the rule would have freed at least: the stretch past the window,
/// times the GPUs (`gpus`).
pub fn would_fire(rule: &UtilizationRule, recorded: &[Recorded], gpus: u32) -> Option<i64> {
    let r = recorded
        .iter()
        .filter(|r| r.threshold_pct <= rule.min_gpu_utilization_pct)
        .max_by_key(|r| r.threshold_pct)?;
    let past = r.longest_idle_ms - rule.window_ms();
    (past >= 0).then(|| past.saturating_mul(i64::from(gpus)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: i64 = 30_000;

    fn util(u: f64) -> GpuReading {
        GpuReading {
            utilization_pct: Some(u),
            memory_used_mb: Some(20_000),
            memory_total_mb: Some(80_000),
            ..GpuReading::default()
        }
    }

    #[test]
    fn profiling_wins_over_utilisation() {
        let r = GpuReading {
            sm_active_pct: Some(3.0),
            ..util(100.0)
        };
        assert_eq!(gpu_activity_pct(&r), Some(3.0));
        assert_eq!(gpu_activity_pct(&util(40.0)), Some(40.0));
    }

    #[test]
    fn empty_memory_is_idle_full_memory_is_not_work() {
        let empty = GpuReading {
            memory_used_mb: Some(100),
            ..util(90.0)
        };
        assert_eq!(gpu_activity_pct(&empty), Some(0.0));
        let cached = GpuReading {
            memory_used_mb: Some(79_000),
            ..util(0.0)
        };
        assert_eq!(gpu_activity_pct(&cached), Some(0.0));
    }

    #[test]
    fn no_reading_is_none_not_idle() {
        assert_eq!(gpu_activity_pct(&GpuReading::default()), None);
        assert_eq!(activity_pct(&[]), None);
        assert_eq!(
            activity_pct(&[GpuReading::default(), util(30.0)]),
            Some(30.0)
        );
    }

    #[test]
    fn mean_over_gpus() {
        let mut gpus = vec![util(0.0); 7];
        gpus.push(util(80.0));
        assert_eq!(activity_pct(&gpus), Some(10.0));
    }

    #[test]
    fn fires_after_the_window_not_before() {
        let mut j = Judge::new(10, 60_000, GAP);
        assert!(!j.observe(0, Some(5.0), 2).window_met);
        assert!(!j.observe(10_000, Some(5.0), 2).window_met);
        assert!(!j.observe(40_000, Some(5.0), 2).window_met);
        let v = j.observe(60_000, Some(5.0), 2);
        assert!(v.window_met);
        assert_eq!(v.idle_for_ms, 60_000);
        assert_eq!(j.idle_gpu_ms, 120_000);
    }

    #[test]
    fn busy_sample_resets() {
        let mut j = Judge::new(10, 60_000, GAP);
        j.observe(0, Some(5.0), 1);
        j.observe(20_000, Some(5.0), 1);
        j.observe(40_000, Some(50.0), 1);
        assert!(!j.observe(60_000, Some(5.0), 1).window_met);
        assert!(!j.observe(80_000, Some(5.0), 1).window_met);
        assert!(!j.observe(100_000, Some(5.0), 1).window_met);
        assert!(j.observe(120_000, Some(5.0), 1).window_met);
        assert_eq!(j.longest_idle_ms, 60_000);
    }

    #[test]
    fn a_gap_breaks_the_window() {
        let mut j = Judge::new(10, 60_000, GAP);
        j.observe(0, Some(0.0), 1);
        j.observe(20_000, Some(0.0), 1);
        // Silence for 40 s (> 30 s): the stretch starts again here.
        let v = j.observe(60_000, Some(0.0), 1);
        assert!(!v.window_met);
        assert_eq!(v.idle_for_ms, 0);
        assert_eq!(v.accrued_gpu_ms, 0);
        assert_eq!(j.idle_gpu_ms, 20_000);
        // No reading also breaks it.
        j.observe(80_000, None, 1);
        assert_eq!(j.observe(100_000, Some(0.0), 1).idle_for_ms, 0);
    }

    #[test]
    fn a_resumed_judge_carries_on_the_stretch() {
        let mut j = Judge::resume(10, 60_000, GAP, 50_000, Some(0));
        let v = j.observe(60_000, Some(1.0), 1);
        assert!(v.window_met);
        assert_eq!(v.accrued_gpu_ms, 10_000);
        // Too late for the stretch: it starts again.
        let mut j = Judge::resume(10, 60_000, GAP, 50_000, Some(0));
        let v = j.observe(90_000, Some(1.0), 1);
        assert_eq!(v.idle_for_ms, 0);
    }

    #[test]
    fn old_samples_are_ignored() {
        let mut j = Judge::new(10, 60_000, GAP);
        j.observe(10_000, Some(0.0), 1);
        j.observe(20_000, Some(0.0), 1);
        let v = j.observe(5_000, Some(90.0), 1);
        assert!(v.idle);
        assert_eq!(j.idle_gpu_ms, 10_000);
    }

    #[test]
    fn history_and_would_fire() {
        let mut h = History::new(GAP);
        for i in 0..=10 {
            h.observe(i * 10_000, Some(15.0), 4);
        }
        let rec = h.recorded();
        let under20 = rec.iter().find(|r| r.threshold_pct == 20).copied();
        assert_eq!(under20.map(|r| r.longest_idle_ms), Some(100_000));
        assert_eq!(
            rec.iter()
                .find(|r| r.threshold_pct == 10)
                .map(|r| r.longest_idle_ms),
            Some(0)
        );
        let rule = |pct, window_s| UtilizationRule {
            min_gpu_utilization_pct: pct,
            window_s,
            action: WasteAction::Stop,
            exempt_priorities: vec![Priority::Critical],
        };
        assert_eq!(would_fire(&rule(25, 60), &rec, 4), Some(160_000));
        assert_eq!(would_fire(&rule(10, 60), &rec, 4), None);
        assert_eq!(would_fire(&rule(25, 200), &rec, 4), None);
        assert_eq!(would_fire(&rule(3, 60), &rec, 4), None);
        assert!(!rule(25, 60).applies_to(Priority::Critical));
        assert!(rule(25, 60).applies_to(Priority::Low));
    }

    #[test]
    fn reason_reads_well() {
        let r = UtilizationRule {
            min_gpu_utilization_pct: 10,
            window_s: 1800,
            action: WasteAction::Stop,
            exempt_priorities: vec![],
        };
        assert_eq!(
            r.reason("ml", 3),
            "GPUs under 10 % for 30 min (policy ml v3): stopped"
        );
        assert_eq!(human_duration(5400), "1 h 30 min");
        assert_eq!(WasteAction::parse("requeue"), Some(WasteAction::Requeue));
    }
}
