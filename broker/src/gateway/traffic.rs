//! What the gateways saw, per service and per replica: requests, errors and a latency
//! histogram per second, kept for the last [`KEEP_S`] seconds. The service view, the
//! autoscaler and the reconciler (requests in flight on a draining replica) read it.
//!
//! It is filled one way only: from the gateways' reports as the store holds them
//! ([`load`] reads the new rows every [`LOAD_EVERY`] on every broker, so the leader sees the
//! traffic of every gateway, whichever broker took its report). The in-process gateway
//! reports through the store too.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::{JobId, Timestamp};
use switchyard_protocol::gateway::TrafficSecond;
use uuid::Uuid;

use crate::state::App;

/// Seconds of history kept.
pub const KEEP_S: i64 = 600;

/// Latency buckets: bucket `i` holds latencies up to `FIRST_US × GROWTH^i` microseconds
/// (100 µs to about 80 s, 12 % apart, so a quantile is read within 12 %).
pub const BUCKETS: usize = 120;
const FIRST_US: f64 = 100.0;
const GROWTH: f64 = 1.12;

/// A gateway's in-flight figure older than this is not counted (the gateway went away).
pub const IN_FLIGHT_FRESH_S: i64 = 5;
/// How often each broker reads new report rows.
pub const LOAD_EVERY: Duration = Duration::from_secs(1);
/// How far back each read looks again behind the last one: a row committed late (a slow
/// transaction on another broker) is still seen; rows seen before are skipped.
const LOAD_OVERLAP_MS: i64 = 15_000;

/// The histogram bucket of `latency` (see `TrafficSecond::buckets`).
pub fn bucket_of(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_US {
        return 0;
    }
    let i = ((us / FIRST_US).ln() / GROWTH.ln()).ceil();
    (i as usize).min(BUCKETS - 1)
}

/// The upper bound of bucket `i`, in milliseconds.
pub fn bucket_upper_ms(i: usize) -> f64 {
    FIRST_US * GROWTH.powi(i as i32) / 1000.0
}

#[derive(Clone)]
struct Second {
    at: i64,
    requests: u64,
    errors: u64,
    /// The sum of the latencies, in microseconds.
    latency_us: u64,
    /// The most requests that waited in the service's queue at once during the second.
    queued: u64,
    /// Microseconds requests held replicas during the second.
    busy_us: u64,
    /// The most requests at the gateways at once (held and queued) during the second.
    peak: u64,
    hist: Box<[u32; BUCKETS]>,
}

impl Second {
    fn new(at: i64) -> Second {
        Second {
            at,
            requests: 0,
            errors: 0,
            latency_us: 0,
            queued: 0,
            busy_us: 0,
            peak: 0,
            hist: Box::new([0; BUCKETS]),
        }
    }
}

#[derive(Default)]
struct Series {
    seconds: VecDeque<Second>,
}

impl Series {
    /// The second `at`, in order among the others (reports of several gateways arrive in
    /// any order), forgetting what is older than [`KEEP_S`] before the newest.
    fn second(&mut self, at: i64) -> &mut Second {
        let i = match self.seconds.binary_search_by_key(&at, |s| s.at) {
            Ok(i) => i,
            Err(i) => {
                self.seconds.insert(i, Second::new(at));
                i
            }
        };
        let newest = self.seconds.back().map_or(at, |s| s.at);
        let mut i = i;
        while self
            .seconds
            .front()
            .is_some_and(|s| s.at <= newest - KEEP_S)
            && i > 0
        {
            self.seconds.pop_front();
            i -= 1;
        }
        &mut self.seconds[i]
    }

    /// Adds one report row's figures to its second (queue peaks and peaks at the gateway of
    /// several gateways add up: each has its own queue and its own callers; a gateway reports
    /// each second once, its report period being at least a second).
    fn add(&mut self, row: &TrafficSecond) {
        let s = self.second(row.second);
        s.requests += row.requests;
        s.errors += row.errors;
        s.latency_us = s.latency_us.saturating_add(row.latency_sum_us);
        s.queued += row.queue_peak;
        s.busy_us = s.busy_us.saturating_add(row.busy_us);
        s.peak = s.peak.saturating_add(row.peak_in_system);
        for (h, n) in s.hist.iter_mut().zip(row.buckets.iter()) {
            *h = h.saturating_add(u32::try_from(*n).unwrap_or(u32::MAX));
        }
    }

    fn record(&mut self, at: i64, latency: Duration, error: bool) {
        let s = self.second(at);
        s.requests += 1;
        s.errors += u64::from(error);
        s.latency_us += u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        s.hist[bucket_of(latency)] += 1;
    }

    fn queued(&mut self, at: i64, depth: u64) {
        let s = self.second(at);
        s.queued = s.queued.max(depth);
    }

    fn window(&self, now: i64, window_s: i64) -> Window {
        let mut w = Window {
            window_s,
            ..Window::default()
        };
        let mut hist = [0u64; BUCKETS];
        let mut latency_us = 0u64;
        let mut queued = 0u64;
        let mut busy_us = 0u64;
        let mut peaks = Vec::with_capacity(usize::try_from(window_s.max(1)).unwrap_or(0));
        for s in self
            .seconds
            .iter()
            .filter(|s| s.at > now - window_s && s.at <= now)
        {
            peaks.push(s.peak);
            w.requests += s.requests;
            w.errors += s.errors;
            latency_us = latency_us.saturating_add(s.latency_us);
            queued += s.queued;
            busy_us = busy_us.saturating_add(s.busy_us);
            for (h, n) in hist.iter_mut().zip(s.hist.iter()) {
                *h += u64::from(*n);
            }
        }
        let total: u64 = hist.iter().sum();
        let quantile = |q: f64| -> Option<f64> {
            if total == 0 {
                return None;
            }
            let rank = (q * total as f64).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (i, n) in hist.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return Some(bucket_upper_ms(i));
                }
            }
            Some(bucket_upper_ms(BUCKETS - 1))
        };
        w.p50_ms = quantile(0.50);
        w.p95_ms = quantile(0.95);
        w.p99_ms = quantile(0.99);
        w.rps = w.requests as f64 / window_s.max(1) as f64;
        w.mean_ms = (w.requests > 0).then(|| latency_us as f64 / 1000.0 / w.requests as f64);
        w.queued_mean = queued as f64 / window_s.max(1) as f64;
        w.in_flight_mean = busy_us as f64 / 1e6 / window_s.max(1) as f64;
        // A second with no row had nobody at the gateway: its peak is 0.
        peaks.resize(
            usize::try_from(window_s.max(1))
                .unwrap_or(1)
                .max(peaks.len()),
            0,
        );
        peaks.sort_unstable();
        w.peaks = peaks;
        w
    }
}

/// Traffic over a window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Window {
    pub window_s: i64,
    pub requests: u64,
    pub errors: u64,
    pub rps: f64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The mean latency.
    pub mean_ms: Option<f64>,
    /// The queue's depth (its peak in each second), averaged over the window's seconds.
    pub queued_mean: f64,
    /// Requests in service on replicas (dispatch to last byte), averaged over the window.
    pub in_flight_mean: f64,
    /// Each second's peak of requests at the gateways at once (held and queued), ascending,
    /// one per second of the window (0 for a second nobody was there).
    pub peaks: Vec<u64>,
}

impl Window {
    /// The `q` quantile (nearest rank) of the seconds' peaks at the gateways: in that share
    /// of the window's seconds, never more requests were there at once. 0 for no seconds.
    pub fn peak_quantile(&self, q: f64) -> f64 {
        if self.peaks.is_empty() || q.is_nan() {
            return 0.0;
        }
        let n = self.peaks.len();
        let rank = ((q.clamp(0.0, 1.0) * n as f64).ceil() as usize).clamp(1, n);
        self.peaks[rank - 1] as f64
    }
}

#[derive(Default)]
struct ServiceSeries {
    all: Series,
    replicas: HashMap<JobId, Series>,
}

/// A gateway's latest in-flight figure for a replica: (second, report number, requests).
type InFlightSeen = (i64, u64, usize);

/// A service's traffic since this broker started, for `/metrics` (counters and a histogram
/// only ever grow).
#[derive(Clone, Debug, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub errors: u64,
    pub latency_sum_us: u64,
    /// Requests per latency bucket ([`bucket_upper_ms`]).
    pub hist: Vec<u64>,
}

impl Default for Totals {
    fn default() -> Totals {
        Totals {
            requests: 0,
            errors: 0,
            latency_sum_us: 0,
            hist: vec![0; BUCKETS],
        }
    }
}

/// Filled from the gateways' reports ([`Traffic::apply`]); read by the API, the autoscaler
/// and the reconciler.
#[derive(Default)]
pub struct Traffic {
    services: Mutex<HashMap<Uuid, ServiceSeries>>,
    totals: Mutex<HashMap<Uuid, Totals>>,
    /// Per replica, per gateway: its latest in-flight figure.
    in_flight: Mutex<HashMap<JobId, HashMap<String, InFlightSeen>>>,
}

impl Traffic {
    /// Requests replica `job` has in flight: the sum over gateways of their latest report,
    /// leaving out gateways silent for [`IN_FLIGHT_FRESH_S`] (see [`Traffic::forget_stale`]).
    pub fn in_flight(&self, job: JobId) -> usize {
        let m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&job)
            .map_or(0, |by_gateway| by_gateway.values().map(|(_, _, n)| n).sum())
    }

    /// Each service's traffic since this broker started.
    pub fn totals(&self) -> HashMap<Uuid, Totals> {
        self.totals
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// One row of `gateway`'s report.
    pub fn apply(&self, gateway: &str, row: &TrafficSecond) {
        if row.replica.is_none() {
            let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
            let t = totals.entry(row.service).or_default();
            t.requests += row.requests;
            t.errors += row.errors;
            t.latency_sum_us = t.latency_sum_us.saturating_add(row.latency_sum_us);
            for (h, n) in t.hist.iter_mut().zip(row.buckets.iter()) {
                *h = h.saturating_add(*n);
            }
        }
        {
            let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
            let s = services.entry(row.service).or_default();
            match row.replica {
                None => s.all.add(row),
                Some(job) => s.replicas.entry(JobId(job)).or_default().add(row),
            }
        }
        if let Some(job) = row.replica {
            let mut m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            let seen = m
                .entry(JobId(job))
                .or_default()
                .entry(gateway.to_string())
                .or_insert((i64::MIN, 0, 0));
            if (row.second, row.batch) >= (seen.0, seen.1) {
                *seen = (
                    row.second,
                    row.batch,
                    usize::try_from(row.in_flight).unwrap_or(usize::MAX),
                );
            }
        }
    }

    /// Forgets in-flight figures of gateways that have not reported for
    /// [`IN_FLIGHT_FRESH_S`] before `now`, and series with nothing in the kept history.
    pub fn forget_stale(&self, now: Timestamp) {
        let now_s = now.millis().div_euclid(1000);
        let mut m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        for by_gateway in m.values_mut() {
            by_gateway.retain(|_, (at, _, _)| *at > now_s - IN_FLIGHT_FRESH_S);
        }
        m.retain(|_, by_gateway| !by_gateway.is_empty());
        drop(m);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let old = |s: &Series| s.seconds.back().is_none_or(|b| b.at <= now_s - KEEP_S);
        for s in services.values_mut() {
            s.replicas.retain(|_, r| !old(r));
        }
        services.retain(|_, s| !(old(&s.all) && s.replicas.is_empty()));
    }

    /// One request answered (or failed) after `latency`; `replica` when it reached one. For
    /// tests and replays: the gateways' traffic arrives through [`Traffic::apply`].
    pub fn record(
        &self,
        service: Uuid,
        replica: Option<JobId>,
        now: Timestamp,
        latency: Duration,
        error: bool,
    ) {
        let at = now.millis().div_euclid(1000);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let s = services.entry(service).or_default();
        s.all.record(at, latency, error);
        if let Some(job) = replica {
            s.replicas
                .entry(job)
                .or_default()
                .record(at, latency, error);
        }
    }

    /// `depth` requests wait in the service's queue now. For tests and replays, like
    /// [`Traffic::record`].
    pub fn queued(&self, service: Uuid, now: Timestamp, depth: usize) {
        let at = now.millis().div_euclid(1000);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let s = services.entry(service).or_default();
        s.all.queued(at, u64::try_from(depth).unwrap_or(u64::MAX));
    }

    /// Requests held replicas of `service` for `busy` in all during the second of `now`. For
    /// tests and replays, like [`Traffic::record`].
    pub fn busy(&self, service: Uuid, now: Timestamp, busy: Duration) {
        let at = now.millis().div_euclid(1000);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let s = services.entry(service).or_default();
        let second = s.all.second(at);
        second.busy_us = second
            .busy_us
            .saturating_add(u64::try_from(busy.as_micros()).unwrap_or(u64::MAX));
    }

    /// At most `n` requests were at the gateway at once during the second of `now` (it keeps
    /// the most it is told). For tests and replays, like [`Traffic::record`].
    pub fn in_system(&self, service: Uuid, now: Timestamp, n: u64) {
        let at = now.millis().div_euclid(1000);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let s = services.entry(service).or_default();
        let second = s.all.second(at);
        second.peak = second.peak.max(n);
    }

    /// The service's traffic over the last `window_s` seconds up to `now`.
    pub fn service(&self, service: Uuid, now: Timestamp, window_s: i64) -> Window {
        let services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        services
            .get(&service)
            .map(|s| s.all.window(now.millis().div_euclid(1000), window_s))
            .unwrap_or(Window {
                window_s,
                ..Window::default()
            })
    }

    /// One replica's traffic over the window.
    pub fn replica(&self, service: Uuid, job: JobId, now: Timestamp, window_s: i64) -> Window {
        let services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        services
            .get(&service)
            .and_then(|s| s.replicas.get(&job))
            .map(|s| s.window(now.millis().div_euclid(1000), window_s))
            .unwrap_or(Window {
                window_s,
                ..Window::default()
            })
    }
}

/// A report row as the loader knows it: gateway, service, replica, second, report number.
type RowKey = (String, Uuid, Option<Uuid>, i64, u64);

/// Reads the gateways' new report rows into `app.traffic` every [`LOAD_EVERY`], on every
/// broker (the view on any of them, the autoscaler and the reconciler on the leader). The
/// first read takes the whole kept history, so a restarted broker has its windows at once.
pub async fn load(app: App) {
    let mut since = Timestamp(app.clock.now().millis() - KEEP_S * 1000);
    let mut seen: HashSet<RowKey> = HashSet::new();
    let mut seen_at: VecDeque<(Timestamp, RowKey)> = VecDeque::new();
    loop {
        let now = app.clock.now();
        match app.store.gateway_reports_since(since).await {
            Ok(rows) => {
                for r in rows {
                    let s = &r.second;
                    let key = (r.gateway.clone(), s.service, s.replica, s.second, s.batch);
                    if seen.insert(key.clone()) {
                        app.traffic.apply(&r.gateway, s);
                        seen_at.push_back((r.received_at, key));
                    }
                }
                // Look again a little behind this read next time; forget what is behind that.
                since = Timestamp((now.millis() - LOAD_OVERLAP_MS).max(since.millis()));
                while seen_at.front().is_some_and(|(at, _)| *at <= since) {
                    if let Some((_, key)) = seen_at.pop_front() {
                        seen.remove(&key);
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "reading gateway reports failed"),
        }
        app.traffic.forget_stale(now);
        tokio::time::sleep(LOAD_EVERY).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_read_within_a_bucket() {
        let t = Traffic::default();
        let svc = Uuid::from_u128(1);
        // 90 fast requests, 10 slow ones, over two seconds.
        for i in 0..100u64 {
            let ms = if i < 90 { 10 } else { 400 };
            let now = Timestamp(1_000_000 + (i as i64 % 2) * 1000);
            t.record(svc, None, now, Duration::from_millis(ms), i == 99);
        }
        let w = t.service(svc, Timestamp(1_001_500), 30);
        assert_eq!((w.requests, w.errors), (100, 1));
        let p50 = w.p50_ms.unwrap();
        let p95 = w.p95_ms.unwrap();
        assert!((10.0..11.3).contains(&p50), "{p50}");
        assert!((400.0..448.1).contains(&p95), "{p95}");
        assert!((w.rps - 100.0 / 30.0).abs() < 1e-9);
    }

    #[test]
    fn the_window_forgets_what_is_older() {
        let t = Traffic::default();
        let svc = Uuid::from_u128(1);
        t.record(svc, None, Timestamp(0), Duration::from_millis(5), false);
        t.record(
            svc,
            None,
            Timestamp(40_000),
            Duration::from_millis(5),
            false,
        );
        assert_eq!(t.service(svc, Timestamp(40_000), 30).requests, 1);
        assert_eq!(t.service(svc, Timestamp(40_000), 60).requests, 2);
        assert_eq!(t.service(Uuid::from_u128(2), Timestamp(0), 30).p95_ms, None);
    }

    fn row(
        second: i64,
        batch: u64,
        replica: Option<u128>,
        requests: u64,
        in_flight: u64,
    ) -> TrafficSecond {
        TrafficSecond {
            service: Uuid::from_u128(1),
            replica: replica.map(Uuid::from_u128),
            second,
            batch,
            requests,
            errors: 0,
            latency_sum_us: requests * 1000,
            buckets: if requests > 0 {
                vec![0, 0, requests]
            } else {
                Vec::new()
            },
            queue_peak: 0,
            in_flight,
            busy_us: 0,
            peak_in_system: 0,
        }
    }

    #[test]
    fn the_window_reads_a_quantile_of_the_seconds_peaks() {
        let t = Traffic::default();
        let svc = Uuid::from_u128(1);
        // Over 20 s: 17 seconds with peaks 1..=17 (reported by two gateways, which add up),
        // one with a burst of 90, two with nobody at the gateway (no row).
        for i in 1..=17u64 {
            let mut a = row(1_000 + i as i64, 0, None, 0, 0);
            a.peak_in_system = i - i / 2;
            t.apply("a", &a);
            let mut b = row(1_000 + i as i64, 0, None, 0, 0);
            b.peak_in_system = i / 2;
            t.apply("b", &b);
        }
        t.in_system(svc, Timestamp(1_018_200), 90);
        t.in_system(svc, Timestamp(1_018_700), 40);
        let w = t.service(svc, Timestamp(1_020_000), 20);
        assert_eq!(w.peaks.len(), 20);
        assert_eq!(&w.peaks[..3], &[0, 0, 1]);
        // Nearest rank: the 19th of 20 for p95 is 17, the 20th (the burst) for p99.
        assert_eq!(w.peak_quantile(0.95), 17.0);
        assert_eq!(w.peak_quantile(0.99), 90.0);
        assert_eq!(w.peak_quantile(0.5), 8.0);
        assert_eq!(Window::default().peak_quantile(0.95), 0.0);
    }

    #[test]
    fn reports_of_several_gateways_add_up_in_any_order() {
        let t = Traffic::default();
        let job = JobId(Uuid::from_u128(7));
        // A later second first, then an earlier one from another gateway.
        t.apply("a", &row(1_000, 3, None, 4, 0));
        t.apply("b", &row(998, 0, None, 6, 0));
        t.apply("a", &row(1_000, 3, Some(7), 4, 2));
        t.apply("b", &row(998, 0, Some(7), 6, 1));
        let w = t.service(Uuid::from_u128(1), Timestamp(1_000_500), 30);
        assert_eq!(w.requests, 10);
        assert_eq!(t.totals()[&Uuid::from_u128(1)].requests, 10);
        // In flight: each gateway's latest figure, summed.
        assert_eq!(t.in_flight(job), 3);
        t.apply("a", &row(1_001, 4, Some(7), 0, 0));
        assert_eq!(t.in_flight(job), 1);
        // An older row arriving late does not undo a newer figure.
        t.apply("a", &row(999, 2, Some(7), 0, 5));
        assert_eq!(t.in_flight(job), 1);
        // A gateway silent for longer than IN_FLIGHT_FRESH_S no longer counts.
        t.forget_stale(Timestamp((998 + IN_FLIGHT_FRESH_S) * 1000));
        assert_eq!(t.in_flight(job), 0);
    }
}
