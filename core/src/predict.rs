//! Runtime prediction from history: how long a job will run, as a p50 and a p90, learned from
//! the runs that ended before it.
//!
//! Pure, like the rest of the crate: the caller feeds each ended run ([`Predictor::observe`])
//! and asks for a prediction ([`Predictor::predict`]); the broker persists the sketches
//! ([`Predictor::entries`], [`Predictor::load`]), the simulator keeps one in memory.
//!
//! # Keys and fallbacks
//!
//! A run is recorded under five keys, finest first ([`Level`]):
//!
//! 1. (team, user, job name, command, GPUs) ([`Level::Command`]);
//! 2. (team, user, job name) ([`Level::Name`]);
//! 3. (team, user) ([`Level::User`]);
//! 4. (team) ([`Level::Team`]);
//! 5. every run ([`Level::Global`]).
//!
//! A prediction starts from the coarsest level that has runs and moves finer: at each finer
//! level with `n` runs its own quantiles weigh `n / (n + SHRINK_K)` against what the coarser
//! levels gave, blended in log space ([`SHRINK_K`] = 5: a key's own history counts half once it
//! has five runs). So a new command by a known user starts near that user's usual runtimes and
//! moves to its own as it runs.
//!
//! # Calibrating the user's estimate
//!
//! Each run that came with an estimate (`requested_s`) also records `actual / requested` under
//! (team, user). A job that gives an estimate is predicted as that estimate times the user's
//! ratio quantiles (p50 and p90 of the ratio), shrunk toward 1 (trust the estimate) with the
//! same weight `n / (n + SHRINK_K)` and clamped to [`MIN_RATIO`]..[`MAX_RATIO`]: a user who asks
//! for ten times what they use gets about a tenth of what they ask. When the job's own command
//! has history too, the two are blended in log space by that command's weight. In Switchyard
//! `estimated_runtime_s` is a hint, not a kill limit (a job runs past it), so a prediction is
//! not capped at the estimate: a user who under-asks gets more.
//!
//! With neither history nor an estimate the prediction is [`DEFAULT_RUNTIME_S`] for both
//! quantiles, as before prediction existed ([`Source::Default`]).
//!
//! # What is observed
//!
//! The caller decides. The broker records an attempt that **succeeded**, with its whole
//! runtime: a failed, cancelled or preempted run says how long until it broke, not how long
//! the work takes (its runtime is censored), and counting it would pull predictions down. The
//! simulator feeds every job's final runtime.
//!
//! # Sketches and memory
//!
//! Per key, a [`Sketch`]: a sparse histogram over log-spaced buckets of ratio [`GAMMA`] = 1.04,
//! so a quantile read back is within 2 % of a value in the sample (the bucket's geometric
//! middle). A sketch has at most ~900 buckets (1e-6 to 1e9), and in practice a handful.
//! Sketches merge by adding counts. When a sketch reaches [`DECAY_AT`] runs its counts are
//! halved, so recent runs weigh more and counts stay small. The predictor holds at most
//! [`MAX_KEYS`] runtime keys and as many ratio keys; past that, the eighth least recently
//! updated are dropped (the coarse levels are updated by every run of theirs, so they stay).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::{DEFAULT_RUNTIME_S, JobSpec};

/// Bucket ratio of a [`Sketch`]: bucket `i` holds values in `[GAMMA^i, GAMMA^(i+1))`.
pub const GAMMA: f64 = 1.04;
/// Smallest and largest values a sketch tells apart; others are clamped to them.
const MIN_VALUE: f64 = 1e-6;
const MAX_VALUE: f64 = 1e9;
/// A key with `n` runs weighs `n / (n + SHRINK_K)` against the coarser levels.
pub const SHRINK_K: f64 = 5.0;
/// A sketch's counts halve when it reaches this many runs.
pub const DECAY_AT: u32 = 1024;
/// Most keys kept per map (runtimes, ratios).
pub const MAX_KEYS: usize = 20_000;
/// The calibrated estimate is at least this fraction of the estimate...
pub const MIN_RATIO: f64 = 0.001;
/// ...and at most this multiple of it.
pub const MAX_RATIO: f64 = 10.0;

/// A mergeable quantile sketch of positive values: counts over log-spaced buckets. See the
/// module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sketch {
    /// Runs counted (the sum of the counts).
    pub n: u32,
    /// `(bucket, count)`, by bucket, counts above zero.
    pub buckets: Vec<(i16, u32)>,
}

fn bucket_of(x: f64) -> i16 {
    let x = if x.is_finite() { x } else { MAX_VALUE };
    let x = x.clamp(MIN_VALUE, MAX_VALUE);
    // Within i16: ln(1e9) / ln(1.04) ≈ 528.
    (x.ln() / GAMMA.ln()).floor() as i16
}

fn bucket_mid(b: i16) -> f64 {
    GAMMA.powf(f64::from(b) + 0.5)
}

impl Sketch {
    /// Counts one value.
    pub fn add(&mut self, x: f64) {
        let b = bucket_of(x);
        match self.buckets.binary_search_by_key(&b, |&(k, _)| k) {
            Ok(i) => self.buckets[i].1 = self.buckets[i].1.saturating_add(1),
            Err(i) => self.buckets.insert(i, (b, 1)),
        }
        self.n = self.n.saturating_add(1);
        if self.n >= DECAY_AT {
            self.halve();
        }
    }

    /// Adds another sketch's counts.
    pub fn merge(&mut self, other: &Sketch) {
        for &(b, c) in &other.buckets {
            match self.buckets.binary_search_by_key(&b, |&(k, _)| k) {
                Ok(i) => self.buckets[i].1 = self.buckets[i].1.saturating_add(c),
                Err(i) => self.buckets.insert(i, (b, c)),
            }
        }
        self.n = self
            .buckets
            .iter()
            .map(|&(_, c)| c)
            .fold(0, u32::saturating_add);
        while self.n >= DECAY_AT {
            self.halve();
        }
    }

    fn halve(&mut self) {
        for (_, c) in &mut self.buckets {
            *c /= 2;
        }
        self.buckets.retain(|&(_, c)| c > 0);
        self.n = self.buckets.iter().map(|&(_, c)| c).sum();
    }

    /// The `q` quantile (0..=1, nearest rank) within [`GAMMA`]'s error; `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * f64::from(self.n)).ceil() as u32).max(1);
        let mut seen = 0u32;
        for &(b, c) in &self.buckets {
            seen = seen.saturating_add(c);
            if seen >= rank {
                return Some(bucket_mid(b));
            }
        }
        self.buckets.last().map(|&(b, _)| bucket_mid(b))
    }

    /// Whether the sketch's shape is sound (sorted distinct buckets, `n` their sum): for
    /// sketches read back from storage.
    pub fn is_valid(&self) -> bool {
        self.buckets.windows(2).all(|w| w[0].0 < w[1].0)
            && self.buckets.iter().all(|&(_, c)| c > 0)
            && u64::from(self.n) == self.buckets.iter().map(|&(_, c)| u64::from(c)).sum::<u64>()
    }
}

/// How specific a runtime key is; finest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    /// Team, user, job name, command and GPUs.
    Command,
    /// Team, user and job name.
    Name,
    /// Team and user.
    User,
    /// Team.
    Team,
    /// Every run.
    Global,
}

impl Level {
    pub const ALL: [Level; 5] = [
        Level::Command,
        Level::Name,
        Level::User,
        Level::Team,
        Level::Global,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Command => "command",
            Level::Name => "name",
            Level::User => "user",
            Level::Team => "team",
            Level::Global => "global",
        }
    }
}

/// What a prediction is keyed by.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct JobKey {
    pub team: String,
    /// Who runs the job; empty when unknown (then the user level is the team's runs without
    /// one). The broker passes the job's project: jobs carry no submitter.
    pub user: String,
    pub name: String,
    /// The command, or a stable digest of it ([`JobKey::from_spec`] takes the digest).
    pub command: String,
    pub gpus: u32,
}

impl JobKey {
    /// The key of `spec` submitted by `user`; the command is reduced to a 64-bit FNV-1a digest
    /// (stable across builds and machines) of its arguments.
    pub fn from_spec(spec: &JobSpec, user: &str) -> JobKey {
        JobKey {
            team: spec.team.clone(),
            user: user.to_string(),
            name: spec.name.clone(),
            command: command_digest(&spec.command),
            gpus: spec
                .resources
                .gpus
                .saturating_mul(spec.resources.nodes.max(1)),
        }
    }

    /// The storage key of this job's sketch at `level`: `level|part|part…`, with `|` and `\`
    /// in parts escaped by `\`.
    pub fn storage_key(&self, level: Level) -> String {
        let gpus = self.gpus.to_string();
        let parts: &[&str] = match level {
            Level::Command => &[&self.team, &self.user, &self.name, &self.command, &gpus],
            Level::Name => &[&self.team, &self.user, &self.name],
            Level::User => &[&self.team, &self.user],
            Level::Team => &[&self.team],
            Level::Global => &[],
        };
        join_key(level.as_str(), parts)
    }

    /// The storage key of the user's `actual / requested` ratio sketch.
    pub fn ratio_key(&self) -> String {
        join_key("ratio", &[&self.team, &self.user])
    }
}

fn join_key(head: &str, parts: &[&str]) -> String {
    let mut s = String::from(head);
    for p in parts {
        s.push('|');
        for ch in p.chars() {
            if ch == '|' || ch == '\\' {
                s.push('\\');
            }
            s.push(ch);
        }
    }
    s
}

/// A 64-bit FNV-1a digest of the command's arguments (each followed by a NUL), in hex.
pub fn command_digest(command: &[String]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for arg in command {
        for &b in arg.as_bytes().iter().chain(std::iter::once(&0u8)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// Where a prediction came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Source {
    /// Past runs: the finest level that had any, and its run count (coarser levels shrunk
    /// into it).
    History { level: Level, runs: u32 },
    /// The job's estimate scaled by the user's `actual / requested` history.
    Calibrated {
        requested_s: i64,
        /// The ratio applied for the p50 (after shrinkage).
        ratio_p50: f64,
        /// Runs with an estimate the ratio was learnt from.
        runs: u32,
    },
    /// The job's estimate as given: no history to calibrate it with.
    UserEstimate { requested_s: i64 },
    /// Neither history nor an estimate: [`DEFAULT_RUNTIME_S`].
    Default,
}

/// A predicted runtime.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// Median runtime, seconds: what costs are judged at.
    pub p50_s: i64,
    /// 90th percentile, seconds (≥ `p50_s`): what deadlines are judged at.
    pub p90_s: i64,
    pub source: Source,
    /// Whose runs, for [`Prediction::explain`]: "of `train` by alice in team ml".
    pub about: String,
}

/// "45 s", "23 min", "2.1 h", "3.5 d".
pub fn short_duration(secs: i64) -> String {
    let s = secs.max(0);
    if s < 60 {
        format!("{s} s")
    } else if s < 3600 {
        format!("{} min", (s + 30) / 60)
    } else if s < 48 * 3600 {
        format!("{:.1} h", s as f64 / 3600.0)
    } else {
        format!("{:.1} d", s as f64 / 86_400.0)
    }
}

impl Prediction {
    /// One line: "p50 23 min, p90 2.1 h from 41 past runs of `train` by alice in team ml".
    pub fn explain(&self) -> String {
        let (p50, p90) = (short_duration(self.p50_s), short_duration(self.p90_s));
        match &self.source {
            Source::History { runs, .. } => {
                format!(
                    "p50 {p50}, p90 {p90} from {runs} past run{} {}",
                    plural(*runs),
                    self.about
                )
            }
            Source::Calibrated {
                requested_s,
                ratio_p50,
                runs,
            } => format!(
                "p50 {p50}, p90 {p90}: the {} estimated, scaled by {} (what {runs} past run{} \
                 {} used of their estimates)",
                short_duration(*requested_s),
                format_ratio(*ratio_p50),
                plural(*runs),
                self.about
            ),
            Source::UserEstimate { requested_s } => format!(
                "{} as estimated; no past runs {} to calibrate it",
                short_duration(*requested_s),
                self.about
            ),
            Source::Default => format!(
                "{} assumed: no estimate and no past runs",
                short_duration(self.p50_s)
            ),
        }
    }
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn format_ratio(r: f64) -> String {
    if r >= 0.1 {
        format!("{r:.2}")
    } else {
        format!("{r:.3}")
    }
}

/// One key's sketch and when it was last updated (the predictor's own counter).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    sketch: Sketch,
    seq: u64,
}

/// Runtime history and the predictions made from it. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Predictor {
    /// Runtime sketches (seconds) by [`JobKey::storage_key`], and ratio sketches by
    /// [`JobKey::ratio_key`].
    sketches: BTreeMap<String, Entry>,
    seq: u64,
}

impl Predictor {
    pub fn new() -> Predictor {
        Predictor::default()
    }

    /// The sketch keys one ended run updates, each with the value it records: its runtime under
    /// each [`Level`], and `actual / requested` under the user's ratio key when it gave an
    /// estimate. [`Predictor::observe`] adds exactly these; the broker adds them to the
    /// stored sketches.
    pub fn observations(
        key: &JobKey,
        requested_s: Option<i64>,
        actual_s: i64,
    ) -> Vec<(String, f64)> {
        let actual = actual_s.max(1) as f64;
        let mut out: Vec<(String, f64)> = Level::ALL
            .iter()
            .map(|&l| (key.storage_key(l), actual))
            .collect();
        if let Some(req) = requested_s.filter(|&r| r > 0) {
            out.push((key.ratio_key(), actual / req as f64));
        }
        out
    }

    /// Records one ended run of `key` that asked for `requested_s` and ran `actual_s`.
    pub fn observe(&mut self, key: &JobKey, requested_s: Option<i64>, actual_s: i64) {
        for (k, v) in Predictor::observations(key, requested_s, actual_s) {
            self.seq += 1;
            let seq = self.seq;
            let e = self.sketches.entry(k).or_default();
            e.sketch.add(v);
            e.seq = seq;
        }
        self.bound();
    }

    /// Replaces the sketch stored under `key` (from storage). An invalid sketch is ignored
    /// and `false` returned.
    pub fn load(&mut self, key: String, sketch: Sketch) -> bool {
        if !sketch.is_valid() {
            return false;
        }
        self.seq += 1;
        self.sketches.insert(
            key,
            Entry {
                sketch,
                seq: self.seq,
            },
        );
        self.bound();
        true
    }

    /// The sketch stored under `key`.
    pub fn sketch(&self, key: &str) -> Option<&Sketch> {
        self.sketches.get(key).map(|e| &e.sketch)
    }

    /// Every stored `(key, sketch)`, by key.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &Sketch)> {
        self.sketches.iter().map(|(k, e)| (k.as_str(), &e.sketch))
    }

    /// Keys stored.
    pub fn len(&self) -> usize {
        self.sketches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sketches.is_empty()
    }

    /// Drops the least recently updated eighth when over the bound (runtime and ratio keys
    /// together: at most `2 × MAX_KEYS`).
    fn bound(&mut self) {
        let cap = 2 * MAX_KEYS;
        if self.sketches.len() <= cap {
            return;
        }
        let mut seqs: Vec<u64> = self.sketches.values().map(|e| e.seq).collect();
        let drop = self.sketches.len() - cap + cap / 8;
        let (_, &mut cut, _) = seqs.select_nth_unstable(drop - 1);
        self.sketches.retain(|_, e| e.seq > cut);
    }

    /// The history-only estimate: quantiles `q` (log space) shrunk from the coarsest level to
    /// the finest, with the finest level that has runs and its count.
    fn history(&self, key: &JobKey, qs: [f64; 2]) -> Option<([f64; 2], Level, u32)> {
        let mut acc: Option<[f64; 2]> = None;
        let mut finest = None;
        for &level in Level::ALL.iter().rev() {
            let Some(s) = self.sketch(&key.storage_key(level)).filter(|s| s.n > 0) else {
                continue;
            };
            let own = qs.map(|q| s.quantile(q).unwrap_or(1.0).ln());
            acc = Some(match acc {
                None => own,
                Some(coarse) => {
                    let w = shrink_weight(s.n);
                    [0, 1].map(|i| w * own[i] + (1.0 - w) * coarse[i])
                }
            });
            finest = Some((level, s.n));
        }
        let (level, n) = finest?;
        Some((acc?, level, n))
    }

    /// The prediction for a job of `key` that gives the estimate `requested_s` (`None`: none).
    pub fn predict(&self, key: &JobKey, requested_s: Option<i64>) -> Prediction {
        let requested_s = requested_s.filter(|&r| r > 0);
        let history = self.history(key, [0.5, 0.9]);
        let user_about = by(key);
        let Some(req) = requested_s else {
            return match history {
                Some((logs, level, runs)) => {
                    finish(logs, Source::History { level, runs }, about(key, level))
                }
                None => Prediction {
                    p50_s: DEFAULT_RUNTIME_S,
                    p90_s: DEFAULT_RUNTIME_S,
                    source: Source::Default,
                    about: String::new(),
                },
            };
        };
        let req_log = (req as f64).ln();
        // The estimate scaled by the user's ratio, shrunk toward 1.
        let ratio = self.sketch(&key.ratio_key()).filter(|s| s.n > 0);
        let (calibrated, source) = match ratio {
            Some(s) => {
                let w = shrink_weight(s.n);
                let r = [0.5, 0.9].map(|q| {
                    (w * s.quantile(q).unwrap_or(1.0).ln()).clamp(MIN_RATIO.ln(), MAX_RATIO.ln())
                });
                (
                    [req_log + r[0], req_log + r[1]],
                    Source::Calibrated {
                        requested_s: req,
                        ratio_p50: r[0].exp(),
                        runs: s.n,
                    },
                )
            }
            None => (
                [req_log, req_log],
                Source::UserEstimate { requested_s: req },
            ),
        };
        // The job's own command's history, where it has one, by its weight.
        match history {
            Some((logs, Level::Command, runs)) => {
                let w = shrink_weight(runs);
                let blended = [0, 1].map(|i| w * logs[i] + (1.0 - w) * calibrated[i]);
                if w >= 0.5 {
                    finish(
                        blended,
                        Source::History {
                            level: Level::Command,
                            runs,
                        },
                        about(key, Level::Command),
                    )
                } else {
                    finish(blended, source, user_about)
                }
            }
            _ => finish(calibrated, source, user_about),
        }
    }
}

fn shrink_weight(n: u32) -> f64 {
    let n = f64::from(n);
    n / (n + SHRINK_K)
}

/// "by alice in team ml", or "in team ml" for an unknown (empty) user.
fn by(key: &JobKey) -> String {
    if key.user.is_empty() {
        format!("in team {}", key.team)
    } else {
        format!("by {} in team {}", key.user, key.team)
    }
}

fn about(key: &JobKey, level: Level) -> String {
    match level {
        Level::Command => format!(
            "of `{}` (this command, {} GPU{}) {}",
            key.name,
            key.gpus,
            plural(key.gpus),
            by(key)
        ),
        Level::Name => format!("of `{}` {}", key.name, by(key)),
        Level::User => by(key),
        Level::Team => format!("in team {}", key.team),
        Level::Global => "of any team".to_string(),
    }
}

/// Seconds from log-space quantiles, at least 1 s, with p90 ≥ p50.
fn finish(logs: [f64; 2], source: Source, about: String) -> Prediction {
    let secs = |l: f64| {
        let s = l.exp().round();
        if s.is_finite() {
            (s as i64).clamp(1, MAX_VALUE as i64)
        } else {
            MAX_VALUE as i64
        }
    };
    let p50_s = secs(logs[0]);
    Prediction {
        p50_s,
        p90_s: secs(logs[1]).max(p50_s),
        source,
        about,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(user: &str, name: &str, command: &str) -> JobKey {
        JobKey {
            team: "ml".into(),
            user: user.into(),
            name: name.into(),
            command: command.into(),
            gpus: 4,
        }
    }

    /// A deterministic pseudo-random stream in (0, 1).
    fn uniforms(seed: u64) -> impl Iterator<Item = f64> {
        let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        std::iter::repeat_with(move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        })
    }

    fn exact_quantile(sorted: &[f64], q: f64) -> f64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).max(1);
        sorted[rank - 1]
    }

    #[test]
    fn quantiles_are_within_the_sketch_error_on_known_distributions() {
        // Uniform 60..7200 s and log-uniform 1 s..1e6 s.
        let dists: [Box<dyn Fn(f64) -> f64>; 2] = [
            Box::new(|u| 60.0 + u * 7140.0),
            Box::new(|u| (u * 1e6f64.ln()).exp()),
        ];
        for (i, f) in dists.iter().enumerate() {
            let mut s = Sketch::default();
            let mut xs: Vec<f64> = uniforms(i as u64 + 1).take(1000).map(f).collect();
            // Under DECAY_AT, so nothing is forgotten.
            for &x in &xs {
                s.add(x);
            }
            xs.sort_by(f64::total_cmp);
            for q in [0.1, 0.5, 0.9, 0.99] {
                let exact = exact_quantile(&xs, q);
                let got = s.quantile(q).expect("non-empty");
                let err = (got / exact - 1.0).abs();
                assert!(
                    err <= GAMMA.sqrt() - 1.0 + 1e-9,
                    "dist {i} q {q}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn sketches_merge_and_decay_and_stay_small() {
        let mut a = Sketch::default();
        let mut b = Sketch::default();
        for (i, u) in uniforms(7).take(600).enumerate() {
            if i % 2 == 0 { &mut a } else { &mut b }.add(1.0 + u * 1e5);
        }
        let mut m = a.clone();
        m.merge(&b);
        assert_eq!(m.n, 600);
        assert!(m.is_valid());
        // Decay: counts halve at DECAY_AT, so n stays below it.
        let mut big = Sketch::default();
        for u in uniforms(9).take(10_000) {
            big.add(1.0 + u * 1e5);
        }
        assert!(
            big.n < DECAY_AT && big.n >= DECAY_AT / 2 - 300,
            "n {}",
            big.n
        );
        assert!(big.buckets.len() <= 300, "{} buckets", big.buckets.len());
        assert!(big.is_valid());
        assert_eq!(Sketch::default().quantile(0.5), None);
    }

    #[test]
    fn no_history_and_no_estimate_is_the_default_and_an_estimate_is_trusted() {
        let p = Predictor::new();
        let k = key("alice", "train", "c1");
        let d = p.predict(&k, None);
        assert_eq!(
            (d.p50_s, d.p90_s, &d.source),
            (DEFAULT_RUNTIME_S, DEFAULT_RUNTIME_S, &Source::Default)
        );
        assert_eq!(d.explain(), "1.0 h assumed: no estimate and no past runs");
        let e = p.predict(&k, Some(7200));
        assert_eq!((e.p50_s, e.p90_s), (7200, 7200));
        assert_eq!(e.source, Source::UserEstimate { requested_s: 7200 });
    }

    #[test]
    fn a_key_falls_back_to_coarser_levels_and_shrinks_toward_them() {
        let mut p = Predictor::new();
        // Alice's other command runs an hour; 30 runs.
        for _ in 0..30 {
            p.observe(&key("alice", "train", "c1"), None, 3600);
        }
        // A new command of hers: her name level (same name) answers.
        let fresh = p.predict(&key("alice", "train", "c2"), None);
        assert_eq!(
            fresh.source,
            Source::History {
                level: Level::Name,
                runs: 30
            }
        );
        assert!((fresh.p50_s - 3600).abs() <= 72, "{}", fresh.p50_s);
        // Bob, same team, never ran: the team level.
        let bob = p.predict(&key("bob", "eval", "c9"), None);
        assert_eq!(
            bob.source,
            Source::History {
                level: Level::Team,
                runs: 30
            }
        );
        assert!(
            bob.explain().contains("from 30 past runs in team ml"),
            "{}",
            bob.explain()
        );
        // One 10-minute run of c2: shrunk toward the hour (weight 1/6), not 10 min.
        p.observe(&key("alice", "train", "c2"), None, 600);
        let one = p.predict(&key("alice", "train", "c2"), None);
        assert_eq!(
            one.source,
            Source::History {
                level: Level::Command,
                runs: 1
            }
        );
        assert!(one.p50_s > 2000 && one.p50_s < 3600, "{}", one.p50_s);
        // Many runs: its own.
        for _ in 0..200 {
            p.observe(&key("alice", "train", "c2"), None, 600);
        }
        let many = p.predict(&key("alice", "train", "c2"), None);
        assert!(many.p50_s > 600 && many.p50_s < 700, "{}", many.p50_s);
        assert_eq!(
            many.explain(),
            "p50 10 min, p90 11 min from 201 past runs of `train` (this command, 4 GPUs) by \
             alice in team ml"
        );
    }

    #[test]
    fn p90_follows_the_spread_of_runtimes() {
        let mut p = Predictor::new();
        let k = key("alice", "sweep", "c");
        for u in uniforms(3).take(500) {
            // 10 min to 3 h, log-uniform.
            p.observe(&k, None, (600.0 * (u * 18f64.ln()).exp()) as i64);
        }
        let pr = p.predict(&k, None);
        let p50 = 600.0 * (0.5 * 18f64.ln()).exp();
        let p90 = 600.0 * (0.9 * 18f64.ln()).exp();
        assert!(
            (pr.p50_s as f64 / p50 - 1.0).abs() < 0.1,
            "{} vs {p50}",
            pr.p50_s
        );
        assert!(
            (pr.p90_s as f64 / p90 - 1.0).abs() < 0.1,
            "{} vs {p90}",
            pr.p90_s
        );
    }

    #[test]
    fn a_user_who_asks_ten_times_what_they_use_gets_a_tenth() {
        let mut p = Predictor::new();
        // Alice asks for 10 h and runs 1 h, over many different commands.
        for i in 0..50 {
            p.observe(
                &key("alice", &format!("job{i}"), &format!("c{i}")),
                Some(36_000),
                3600,
            );
        }
        let k = key("alice", "new", "fresh");
        let pr = p.predict(&k, Some(20 * 3600));
        let Source::Calibrated {
            ratio_p50, runs, ..
        } = pr.source.clone()
        else {
            panic!("{:?}", pr.source)
        };
        assert_eq!(runs, 50);
        // Shrunk toward 1 by 50/55 in log space: 0.1^(50/55) ≈ 0.123.
        assert!(ratio_p50 > 0.1 && ratio_p50 < 0.13, "{ratio_p50}");
        assert!(pr.p50_s > 7200 && pr.p50_s < 9000, "{}", pr.p50_s);
        assert!(
            pr.explain().contains("the 20.0 h estimated, scaled by"),
            "{}",
            pr.explain()
        );
        // Bob, who asks for what he uses, is trusted.
        for i in 0..50 {
            p.observe(
                &key("bob", &format!("job{i}"), &format!("c{i}")),
                Some(3600),
                3600,
            );
        }
        let b = p.predict(&key("bob", "new", "fresh"), Some(7200));
        assert!((b.p50_s - 7200).abs() <= 150, "{}", b.p50_s);
        // Carol under-asks by 100×: capped at MAX_RATIO.
        for i in 0..50 {
            p.observe(
                &key("carol", &format!("j{i}"), &format!("c{i}")),
                Some(60),
                6000,
            );
        }
        let c = p.predict(&key("carol", "new", "fresh"), Some(60));
        assert_eq!(c.p50_s, (60.0 * MAX_RATIO) as i64);
    }

    #[test]
    fn an_estimate_blends_with_the_commands_own_history() {
        let mut p = Predictor::new();
        let k = key("alice", "train", "c1");
        for _ in 0..45 {
            p.observe(&k, Some(3600), 3600);
        }
        // She now asks for 10 h for the same command: the command's 45 runs weigh 0.9.
        let pr = p.predict(&k, Some(36_000));
        assert_eq!(
            pr.source,
            Source::History {
                level: Level::Command,
                runs: 45
            }
        );
        assert!(pr.p50_s > 3600 && pr.p50_s < 5000, "{}", pr.p50_s);
    }

    #[test]
    fn serde_round_trip_keeps_predictions() {
        let mut p = Predictor::new();
        for (i, u) in uniforms(5).take(300).enumerate() {
            let k = key(if i % 2 == 0 { "a|b" } else { "c\\d" }, "n", "c");
            p.observe(&k, Some(4000), (100.0 + u * 5000.0) as i64);
        }
        let json = serde_json::to_string(&p).expect("serialises");
        let back: Predictor = serde_json::from_str(&json).expect("parses");
        assert_eq!(back, p);
        // And through the per-key entries the broker stores.
        let mut loaded = Predictor::new();
        for (k, s) in p.entries() {
            assert!(loaded.load(k.to_string(), s.clone()));
        }
        let k = key("a|b", "n", "c");
        assert_eq!(loaded.predict(&k, Some(4000)), p.predict(&k, Some(4000)));
        // Escaped parts keep keys apart.
        assert_ne!(
            key("a|b", "n", "c").storage_key(Level::User),
            JobKey {
                team: "ml|a".into(),
                ..key("b", "n", "c")
            }
            .storage_key(Level::User)
        );
        let bad = Sketch {
            n: 3,
            buckets: vec![(1, 1)],
        };
        assert!(!loaded.load("x".into(), bad));
    }

    #[test]
    fn memory_stays_bounded() {
        let mut p = Predictor::new();
        for i in 0..(MAX_KEYS + 2000) {
            p.observe(&key(&format!("u{i}"), "n", "c"), Some(100), 50);
        }
        // Each run touches up to 4 new keys (command, name, user, ratio).
        assert!(p.len() <= 2 * MAX_KEYS, "{}", p.len());
        // The most recent user and the shared levels are kept.
        let last = key(&format!("u{}", MAX_KEYS + 1999), "n", "c");
        assert!(p.sketch(&last.storage_key(Level::Command)).is_some());
        assert!(p.sketch(&last.storage_key(Level::Team)).is_some());
        assert!(p.sketch(&last.storage_key(Level::Global)).is_some());
    }

    #[test]
    fn command_digest_is_stable_and_separates_arguments() {
        let a = command_digest(&["python".into(), "train.py".into()]);
        assert_eq!(a, command_digest(&["python".into(), "train.py".into()]));
        assert_ne!(a, command_digest(&["pythontrain.py".into()]));
        assert_eq!(a.len(), 16);
        assert_eq!(short_duration(1380), "23 min");
        assert_eq!(short_duration(7560), "2.1 h");
    }
}
