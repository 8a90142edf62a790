//! The autoscaler's rule: how many replicas a service wants, from what its gateways measured.
//! Pure; the services reconciler (`control/services.rs`) feeds it each pass, the simulator and
//! the services bench feed it simulated traffic — the same code decides in all three.
//!
//! **Signals** (each a replica count, with the reason in words):
//! - *rate*: `⌈rps / target_rps_per_replica⌉`;
//! - *load*: `⌈A / max_concurrency_per_replica⌉` replicas for the requests at the gateway at
//!   once, `A`, held on replicas (dispatch to the answer's last byte, so a streamed answer
//!   counts for as long as it holds its replica) plus those waiting in the queue. A request
//!   waits, and so risks the latency target, only when it arrives while every replica is at
//!   its bound: with room for the [`PEAK_QUANTILE`] (95 %) quantile of the span's per-second
//!   peaks of `A` (`Measured::span_peak`, reported by the gateways), in 95 % of seconds nobody
//!   waits at all, and in the rest only the excess over the room does — so the share of
//!   requests that wait stays under the 5 % a p95 target allows, whatever the arrivals'
//!   burstiness. A mean cannot say that: bursts shorter than the 90 s a replica takes to
//!   start are invisible in it, and no reaction catches them; only room sized to the bursts
//!   already seen does. `A` is at least its mean (less room than the mean number present is
//!   a queue that grows without bound). Reports without peaks (an older gateway) fall back to
//!   the mean — the gateways' integral, or Little's law `rps × mean latency` without it —
//!   with the headroom of Poisson arrivals: in an M/G/∞ system the number present is
//!   Poisson, whose 95th percentile is about `mean + 1.645 √mean`. A queue that holds (its
//!   mean depth) asks for at least enough replicas to serve it as well;
//! - *latency*: p95 above `target_p95_latency_ms` asks for `ready × p95 / target` (at least one
//!   more, at most twice as many), but only when the replicas are busy (requests queue, or they
//!   run at least half their concurrency bound): when a replica alone is slower than the
//!   target, more replicas would not help, and the reason says so. (No band below the target
//!   holds the ready count: the load signal lets the count fall only when the bursts seen
//!   fit in fewer replicas, so a fall does not bring the queueing that makes latency.);
//! - *schedule*: the schedule's minimum now (`rules/service.rs`).
//!
//! The recommendation is the largest signal, clamped to `replicas.min..=replicas.max`.
//!
//! **Delays** ([`Scaler`]): the desired count rises to a recommendation only once every
//! recommendation over the last `scale_up_delay_s` was at least that high (the signal held),
//! and falls only once every one over the last `scale_down_delay_s` was below it (to the
//! highest of them) — so a short spike adds nothing and a short lull removes nothing. The
//! schedule's minimum and the replica bounds apply at once. Latency and load are read only over
//! the time since the ready count last changed (at least [`MIN_SPAN_S`]): seconds measured with
//! fewer replicas say nothing about the replicas there are now.
//!
//! The history of recommendations lives in the leader's memory: a new leader waits one delay
//! before it moves the count (the count itself is stored with the service).

use std::collections::VecDeque;
use switchyard_core::Timestamp;
use switchyard_protocol::api::ServiceSpec;

use crate::rules::service::{self, DEFAULT_WINDOW_S};

/// Defaults of the delays (seconds).
pub const DEFAULT_UP_DELAY_S: i64 = 15;
pub const DEFAULT_DOWN_DELAY_S: i64 = 120;
/// The quantile of the per-second peaks at the gateway the load signal makes room for: the
/// latency target is a p95, so 95 % of seconds must see no request wait (see the module's
/// documentation).
pub const PEAK_QUANTILE: f64 = 0.95;
/// The standard normal's 95th percentile: the Poisson headroom of the fallback without peaks.
const Z_95: f64 = 1.6449;
/// The shortest span latency and load are read over, in seconds.
pub const MIN_SPAN_S: i64 = 5;
/// Fewer requests than this in the span say nothing about latency.
pub const MIN_REQUESTS: u64 = 20;

/// What the rule needs of a service's spec, as numbers.
#[derive(Clone, Debug, PartialEq)]
pub struct Targets {
    pub min: u32,
    pub max: u32,
    pub p95_ms: Option<f64>,
    pub rps_per_replica: Option<f64>,
    pub max_concurrency: Option<f64>,
    pub window_s: i64,
    pub up_delay_s: i64,
    pub down_delay_s: i64,
}

impl Targets {
    pub fn of(spec: &ServiceSpec) -> Targets {
        let (min, max) = service::replica_range(spec);
        let s = spec.scaling.as_ref();
        Targets {
            min,
            max,
            p95_ms: s
                .and_then(|s| s.target_p95_latency_ms)
                .map(|v| v as f64)
                .filter(|v| *v > 0.0),
            rps_per_replica: s
                .and_then(|s| s.target_rps_per_replica)
                .filter(|v| *v > 0.0),
            max_concurrency: s
                .and_then(|s| s.max_concurrency_per_replica)
                .map(|v| v as f64)
                .filter(|v| *v > 0.0),
            window_s: s
                .and_then(|s| s.window_s)
                .unwrap_or(DEFAULT_WINDOW_S)
                .max(1),
            up_delay_s: s
                .and_then(|s| s.scale_up_delay_s)
                .unwrap_or(DEFAULT_UP_DELAY_S)
                .max(0),
            down_delay_s: s
                .and_then(|s| s.scale_down_delay_s)
                .unwrap_or(DEFAULT_DOWN_DELAY_S)
                .max(0),
        }
    }

    /// Whether any traffic signal is configured (else only `min` and the schedule count).
    pub fn scales(&self) -> bool {
        self.p95_ms.is_some() || self.rps_per_replica.is_some() || self.max_concurrency.is_some()
    }
}

/// What the gateways measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Measured {
    /// Over the service's window.
    pub rps: f64,
    /// Over the span since the ready count last changed: requests, p95, mean latency, the
    /// rate, and the queue's mean depth.
    pub span_requests: u64,
    pub span_rps: f64,
    pub span_p95_ms: Option<f64>,
    pub span_mean_ms: Option<f64>,
    pub span_queued: f64,
    /// Requests held on replicas, on average over the span (0: not reported).
    pub span_in_flight: f64,
    /// The [`PEAK_QUANTILE`] quantile of the span's per-second peaks of requests at the
    /// gateways at once, held and queued (0: not reported).
    pub span_peak: f64,
    /// Replicas ready now.
    pub ready: u32,
}

/// A recommendation: a replica count and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Recommendation {
    pub n: u32,
    pub reason: String,
}

fn ceil_u32(x: f64) -> u32 {
    if x.is_finite() && x > 0.0 {
        x.ceil().min(u32::MAX as f64) as u32
    } else {
        0
    }
}

/// Which signal wants the most replicas now, clamped to the bounds. `schedule` is the
/// schedule's minimum now, with its reason.
pub fn recommend(t: &Targets, m: &Measured, schedule: Option<(u32, String)>) -> Recommendation {
    let mut best = Recommendation {
        n: t.min,
        reason: format!("replicas.min: at least {}", t.min),
    };
    let mut consider = |n: u32, reason: String| {
        if n > best.n {
            best = Recommendation { n, reason };
        }
    };
    if let Some((n, reason)) = schedule {
        consider(n, reason);
    }
    if let Some(per) = t.rps_per_replica {
        let n = ceil_u32(m.rps / per);
        consider(
            n,
            format!("{:.1} req/s at a target of {per} per replica: {n}", m.rps),
        );
    }
    let (in_service, in_system) = if m.span_in_flight > 0.0 || m.span_requests == 0 {
        (m.span_in_flight, m.span_in_flight + m.span_queued)
    } else {
        // Little's law on latencies counted from the arrival at the gateway: queueing is in
        // it; what is served at once is the rest.
        let in_system = m.span_rps * m.span_mean_ms.unwrap_or(0.0) / 1000.0;
        ((in_system - m.span_queued).max(0.0), in_system)
    };
    if let Some(conc) = t.max_concurrency {
        if m.span_peak > 0.0 {
            let at_once = m.span_peak.max(in_system);
            let n = ceil_u32(at_once / conc);
            consider(
                n,
                format!(
                    "{at_once:.0} requests at the gateway at once (p95 of the seconds' peaks; \
                     {in_system:.1} on average) at {conc} per replica: {n}"
                ),
            );
        } else {
            let at_once = in_system + Z_95 * in_system.max(0.0).sqrt();
            let n = ceil_u32(at_once / conc);
            consider(
                n,
                format!(
                    "{in_system:.1} requests at the gateway on average, {at_once:.1} with \
                     Poisson bursts, at {conc} per replica: {n}"
                ),
            );
        }
        if m.span_queued >= 0.5 {
            let n = m.ready.saturating_add(ceil_u32(m.span_queued / conc));
            consider(
                n,
                format!(
                    "{:.1} requests queued on {} ready replicas of {conc} each: {n}",
                    m.span_queued, m.ready
                ),
            );
        }
    }
    if let (Some(target), Some(p95)) = (t.p95_ms, m.span_p95_ms)
        && m.span_requests >= MIN_REQUESTS
        && m.ready > 0
    {
        let ready = m.ready;
        if p95 > target {
            let per_replica = in_service / f64::from(ready);
            let busy =
                m.span_queued >= 0.5 || t.max_concurrency.is_none_or(|c| per_replica >= c / 2.0);
            if busy {
                let n = ceil_u32(f64::from(ready) * (p95 / target).min(2.0)).max(ready + 1);
                consider(
                    n,
                    format!("p95 {p95:.0} ms above the {target:.0} ms target: {n}"),
                );
            } else {
                consider(
                    ready,
                    format!(
                        "p95 {p95:.0} ms above the {target:.0} ms target, but the replicas are \
                         not busy ({per_replica:.1} in flight each): more would not help; \
                         holding {ready}"
                    ),
                );
            }
        }
    }
    let bounded = best.n.clamp(t.min, t.max.max(t.min));
    if bounded < best.n {
        best.reason = format!("{} (replicas.max: at most {bounded})", best.reason);
    }
    best.n = bounded;
    best
}

/// One service's recent recommendations, and when its ready count last changed.
#[derive(Clone, Debug, Default)]
pub struct Scaler {
    history: VecDeque<(Timestamp, Recommendation)>,
    ready: Option<(u32, Timestamp)>,
}

impl Scaler {
    /// Seconds the latency and load signals are read over at `now`, given the ready count:
    /// since it last changed, within `MIN_SPAN_S..=window_s`.
    pub fn span_s(&mut self, t: &Targets, ready: u32, now: Timestamp) -> i64 {
        match self.ready {
            Some((n, _)) if n == ready => {}
            _ => self.ready = Some((ready, now)),
        }
        let since = self.ready.map_or(now, |(_, at)| at);
        ((now.millis() - since.millis()) / 1000).clamp(MIN_SPAN_S, t.window_s.max(MIN_SPAN_S))
    }

    /// Takes the recommendation at `now` and says the desired count (and why) given the
    /// current one; `None`: keep it.
    pub fn step(
        &mut self,
        t: &Targets,
        rec: Recommendation,
        current: u32,
        schedule_min: u32,
        now: Timestamp,
    ) -> Option<Recommendation> {
        let keep_ms = 1000 * t.up_delay_s.max(t.down_delay_s);
        self.history.push_back((now, rec.clone()));
        // Keep the newest entry older than the longest delay: it says the signal held since.
        while self.history.len() >= 2 && now.millis() - self.history[1].0.millis() >= keep_ms {
            self.history.pop_front();
        }
        let floor = t.min.max(schedule_min.min(t.max));
        if current < floor {
            return Some(Recommendation {
                n: floor,
                reason: if schedule_min > t.min {
                    rec.reason
                } else {
                    format!("replicas.min: at least {}", t.min)
                },
            });
        }
        if current > t.max.max(t.min) {
            return Some(Recommendation {
                n: t.max.max(t.min),
                reason: format!("replicas.max: at most {}", t.max),
            });
        }
        if rec.n > current {
            let held = self.held(now, t.up_delay_s)?;
            let n = held.iter().map(|r| r.n).min()?;
            (n > current).then(|| Recommendation {
                n,
                reason: format!("{} (for {} s)", rec.reason, t.up_delay_s),
            })
        } else if rec.n < current {
            let held = self.held(now, t.down_delay_s)?;
            let top = held.iter().max_by_key(|r| r.n)?;
            (top.n < current).then(|| Recommendation {
                n: top.n.max(floor),
                reason: format!("{} (for {} s)", top.reason, t.down_delay_s),
            })
        } else {
            None
        }
    }

    /// The recommendations over the last `delay_s`, if the history reaches that far back.
    fn held(&self, now: Timestamp, delay_s: i64) -> Option<Vec<&Recommendation>> {
        let from = now.millis() - 1000 * delay_s;
        let oldest = self.history.front()?;
        if oldest.0.millis() > from {
            return None;
        }
        // The entry in force at `from` (the newest not after it) and every later one.
        let start = self
            .history
            .iter()
            .rposition(|(at, _)| at.millis() <= from)
            .unwrap_or(0);
        Some(self.history.iter().skip(start).map(|(_, r)| r).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn targets() -> Targets {
        Targets {
            min: 1,
            max: 8,
            p95_ms: Some(300.0),
            rps_per_replica: Some(20.0),
            max_concurrency: Some(8.0),
            window_s: 30,
            up_delay_s: 15,
            down_delay_s: 120,
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp(1_000_000 + s * 1000)
    }

    fn rec(n: u32) -> Recommendation {
        Recommendation {
            n,
            reason: format!("wants {n}"),
        }
    }

    #[test]
    fn the_rate_signal_divides_by_the_target() {
        let m = Measured {
            rps: 95.0,
            ready: 2,
            ..Measured::default()
        };
        let r = recommend(&targets(), &m, None);
        assert_eq!(r.n, 5);
        assert!(r.reason.contains("95.0 req/s"), "{}", r.reason);
    }

    #[test]
    fn the_load_signal_counts_what_is_at_the_gateway_and_the_queue() {
        // Without the gateway's integral or peaks (an older report), Little's law: 40 req/s ×
        // 0.8 s = 32 at the gateway (12 of them queued); with Poisson bursts 32 + 1.645 √32 =
        // 41.3, over 8 per replica: 6.
        let m = Measured {
            rps: 0.0,
            span_rps: 40.0,
            span_mean_ms: Some(800.0),
            span_queued: 12.0,
            span_requests: 400,
            span_p95_ms: Some(200.0),
            span_in_flight: 0.0,
            span_peak: 0.0,
            ready: 3,
        };
        let mut t = targets();
        t.rps_per_replica = None;
        let r = recommend(&t, &m, None);
        assert_eq!(r.n, 6, "{}", r.reason);
        assert!(
            r.reason
                .contains("32.0 requests at the gateway on average, 41.3 with"),
            "{}",
            r.reason
        );
        // A queue before its requests' latencies are known: one more replica per 8 queued.
        let m = Measured {
            span_queued: 20.0,
            ready: 2,
            ..Measured::default()
        };
        let r = recommend(&t, &m, None);
        assert_eq!(r.n, 5, "{}", r.reason);
        assert!(r.reason.contains("20.0 requests queued"), "{}", r.reason);
    }

    #[test]
    fn the_load_signal_reads_the_requests_held_when_reported() {
        // Streamed answers: 10 req/s whose first byte comes after 0.2 s but which hold their
        // replica 5 s: 50 held, not 2 (61.6 with Poisson bursts).
        let mut t = targets();
        t.rps_per_replica = None;
        let m = Measured {
            span_rps: 10.0,
            span_mean_ms: Some(200.0),
            span_in_flight: 50.0,
            span_requests: 100,
            ready: 2,
            ..Measured::default()
        };
        let r = recommend(&t, &m, None);
        assert_eq!(r.n, 8, "{}", r.reason);
        assert!(
            r.reason.starts_with("50.0 requests at the gateway"),
            "{}",
            r.reason
        );
    }

    #[test]
    fn the_load_signal_makes_room_for_the_bursts_the_gateways_saw() {
        let mut t = targets();
        t.rps_per_replica = None;
        t.max_concurrency = Some(16.0);
        // The same 40 requests at the gateway on average; steady arrivals peak at 44 in 95 %
        // of seconds, bursty ones at 100.
        let steady = Measured {
            span_in_flight: 40.0,
            span_requests: 400,
            span_rps: 20.0,
            span_peak: 44.0,
            ready: 3,
            ..Measured::default()
        };
        let r = recommend(&t, &steady, None);
        assert_eq!(r.n, 3, "{}", r.reason);
        let bursty = Measured {
            span_peak: 100.0,
            ..steady.clone()
        };
        let r = recommend(&t, &bursty, None);
        assert_eq!(r.n, 7, "{}", r.reason);
        assert!(
            r.reason
                .starts_with("100 requests at the gateway at once (p95 of the seconds' peaks"),
            "{}",
            r.reason
        );
        // A peak below the mean (a report that lost seconds) never asks for less than the mean.
        let low = Measured {
            span_peak: 10.0,
            ..steady
        };
        assert_eq!(recommend(&t, &low, None).n, 3);
    }

    #[test]
    fn latency_above_target_on_busy_replicas_scales_up() {
        let mut t = targets();
        t.rps_per_replica = None;
        t.max_concurrency = Some(16.0);
        // 2 ready, 60 req/s × 0.3 s = 18 in flight: 9 each, busy; p95 450 over 300.
        let m = Measured {
            span_rps: 60.0,
            span_mean_ms: Some(300.0),
            span_p95_ms: Some(450.0),
            span_requests: 600,
            ready: 2,
            ..Measured::default()
        };
        let r = recommend(&t, &m, None);
        assert_eq!(r.n, 3, "{}", r.reason);
        assert!(r.reason.starts_with("p95 450 ms above the 300 ms target"));
    }

    #[test]
    fn latency_above_target_on_idle_replicas_holds() {
        let mut t = targets();
        t.rps_per_replica = None;
        // 2 ready, 1 req/s × 2 s = 2 in flight: one each; a request alone takes 2 s.
        let m = Measured {
            span_rps: 1.0,
            span_mean_ms: Some(2000.0),
            span_p95_ms: Some(2500.0),
            span_requests: 30,
            ready: 2,
            ..Measured::default()
        };
        let r = recommend(&t, &m, None);
        assert_eq!(r.n, 2);
        assert!(r.reason.contains("more would not help"), "{}", r.reason);
    }

    #[test]
    fn too_few_requests_say_nothing_about_latency() {
        let m = Measured {
            span_p95_ms: Some(5000.0),
            span_requests: 3,
            ready: 2,
            ..Measured::default()
        };
        assert_eq!(recommend(&targets(), &m, None).n, 1);
    }

    #[test]
    fn the_schedule_and_the_bounds_count() {
        let m = Measured {
            rps: 1000.0,
            ready: 1,
            ..Measured::default()
        };
        let r = recommend(&targets(), &m, None);
        assert_eq!(r.n, 8);
        assert!(
            r.reason.ends_with(": 50 (replicas.max: at most 8)"),
            "{}",
            r.reason
        );
        let quiet = Measured::default();
        let r = recommend(&targets(), &quiet, Some((4, "schedule: at least 4".into())));
        assert_eq!((r.n, r.reason.as_str()), (4, "schedule: at least 4"));
    }

    #[test]
    fn a_rise_waits_for_the_signal_to_hold() {
        let t = targets();
        let mut s = Scaler::default();
        assert_eq!(s.step(&t, rec(1), 1, 0, at(0)), None);
        // Wants 4 from second 1: nothing until it has held 15 s.
        for i in 1..16 {
            assert_eq!(s.step(&t, rec(4), 1, 0, at(i)), None, "second {i}");
        }
        let up = s.step(&t, rec(4), 1, 0, at(16)).unwrap();
        assert_eq!(up.n, 4);
        assert!(up.reason.contains("for 15 s"), "{}", up.reason);
    }

    #[test]
    fn a_spike_adds_nothing_and_a_held_rise_takes_the_lowest_level() {
        let t = targets();
        // Wants 3 most seconds, but 1 every tenth: never held for 15 s.
        let mut s = Scaler::default();
        for i in 0..60 {
            let wanted = if i % 10 == 0 { 1 } else { 3 };
            assert_eq!(s.step(&t, rec(wanted), 1, 0, at(i)), None, "second {i}");
        }
        // A spike to 6 at second 1, then 3: at least 3 held for 15 s by second 16.
        let mut s = Scaler::default();
        s.step(&t, rec(1), 1, 0, at(0));
        s.step(&t, rec(6), 1, 0, at(1));
        for i in 2..16 {
            assert_eq!(s.step(&t, rec(3), 1, 0, at(i)), None, "second {i}");
        }
        assert_eq!(s.step(&t, rec(3), 1, 0, at(16)).map(|r| r.n), Some(3));
    }

    #[test]
    fn a_fall_waits_longer_and_keeps_the_highest_level() {
        let t = targets();
        let mut s = Scaler::default();
        for i in 0..120 {
            let wanted = if i == 60 { 4 } else { 2 };
            assert_eq!(s.step(&t, rec(wanted), 5, 0, at(i)), None, "second {i}");
        }
        // At 120 s the history reaches back: the highest in the last 120 s is 4.
        assert_eq!(s.step(&t, rec(2), 5, 0, at(120)).map(|r| r.n), Some(4));
        // Once the 4 is older than 120 s, 2.
        for i in 121..181 {
            s.step(&t, rec(2), 4, 0, at(i));
        }
        assert_eq!(s.step(&t, rec(2), 4, 0, at(181)).map(|r| r.n), Some(2));
    }

    #[test]
    fn the_floor_applies_at_once() {
        let t = targets();
        let mut s = Scaler::default();
        let r = s
            .step(&t, rec(4), 1, 4, at(0))
            .expect("the schedule raises the floor");
        assert_eq!(r.n, 4);
        let mut t2 = targets();
        t2.max = 3;
        assert_eq!(s.step(&t2, rec(3), 5, 0, at(1)).map(|r| r.n), Some(3));
    }

    #[test]
    fn the_span_restarts_when_the_ready_count_changes() {
        let t = targets();
        let mut s = Scaler::default();
        assert_eq!(s.span_s(&t, 2, at(0)), MIN_SPAN_S);
        assert_eq!(s.span_s(&t, 2, at(12)), 12);
        assert_eq!(s.span_s(&t, 2, at(100)), 30);
        assert_eq!(s.span_s(&t, 3, at(101)), MIN_SPAN_S);
    }
}
