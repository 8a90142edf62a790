//! What the gateway saw, per service and per replica: requests, errors and a latency histogram
//! per second, kept for the last [`KEEP_S`] seconds. The service view and the autoscaler read
//! windows of it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;
use switchyard_core::{JobId, Timestamp};
use uuid::Uuid;

/// Seconds of history kept.
pub const KEEP_S: i64 = 600;

/// Latency buckets: bucket `i` holds latencies up to `FIRST_US × GROWTH^i` microseconds
/// (100 µs to about 80 s, 12 % apart, so a quantile is read within 12 %).
const BUCKETS: usize = 120;
const FIRST_US: f64 = 100.0;
const GROWTH: f64 = 1.12;

fn bucket_of(latency: Duration) -> usize {
    let us = latency.as_secs_f64() * 1e6;
    if us <= FIRST_US {
        return 0;
    }
    let i = ((us / FIRST_US).ln() / GROWTH.ln()).ceil();
    (i as usize).min(BUCKETS - 1)
}

fn bucket_upper_ms(i: usize) -> f64 {
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
            hist: Box::new([0; BUCKETS]),
        }
    }
}

#[derive(Default)]
struct Series {
    seconds: VecDeque<Second>,
}

impl Series {
    /// The second `at` (a late report for an earlier second lands in the latest one: close
    /// enough), forgetting what is older than [`KEEP_S`].
    fn second(&mut self, at: i64) -> &mut Second {
        if self.seconds.back().is_none_or(|s| s.at < at) {
            self.seconds.push_back(Second::new(at));
        }
        while self.seconds.front().is_some_and(|s| s.at <= at - KEEP_S) {
            self.seconds.pop_front();
        }
        self.seconds
            .back_mut()
            .expect("a second was just pushed or is there")
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
        for s in self
            .seconds
            .iter()
            .filter(|s| s.at > now - window_s && s.at <= now)
        {
            w.requests += s.requests;
            w.errors += s.errors;
            latency_us = latency_us.saturating_add(s.latency_us);
            queued += s.queued;
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
}

#[derive(Default)]
struct ServiceSeries {
    all: Series,
    replicas: HashMap<JobId, Series>,
}

/// Shared by the gateway (writes) and the API, the autoscaler and the reconciler (read).
#[derive(Default)]
pub struct Traffic {
    services: Mutex<HashMap<Uuid, ServiceSeries>>,
    in_flight: Mutex<HashMap<JobId, usize>>,
}

impl Traffic {
    /// A request was sent to replica `job`.
    pub fn began(&self, job: JobId) {
        let mut m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        *m.entry(job).or_default() += 1;
    }

    /// A request to replica `job` is done (its answer streamed through, or it failed).
    pub fn ended(&self, job: JobId) {
        let mut m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&job) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&job);
            }
        }
    }

    /// Requests replica `job` has in flight through this gateway.
    pub fn in_flight(&self, job: JobId) -> usize {
        let m = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        m.get(&job).copied().unwrap_or(0)
    }

    /// One request answered (or failed) after `latency`; `replica` when it reached one.
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

    /// `depth` requests wait in the service's queue now.
    pub fn queued(&self, service: Uuid, now: Timestamp, depth: usize) {
        let at = now.millis().div_euclid(1000);
        let mut services = self.services.lock().unwrap_or_else(|e| e.into_inner());
        let s = services.entry(service).or_default();
        s.all.queued(at, u64::try_from(depth).unwrap_or(u64::MAX));
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
}
