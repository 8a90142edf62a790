//! What one gateway saw since its last report, per service and per replica and second, and
//! the reports it has made that the broker has not yet acknowledged.
//!
//! Every [`REPORT_EVERY`] the gateway closes what it has into a numbered batch of
//! [`TrafficSecond`] rows (with each replica's requests in flight now) and sends every batch
//! not yet acknowledged, oldest first. A batch keeps its number when it is sent again, so the
//! broker takes each row once; one that could not be delivered for [`KEEP_UNSENT`] batches is
//! dropped (the broker was away ten minutes: the autoscaler's windows are shorter).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use switchyard_core::{JobId, Timestamp};
use switchyard_protocol::gateway::TrafficSecond;
use uuid::Uuid;

use super::traffic::{BUCKETS, bucket_of};

/// How often a gateway reports.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);
/// Unacknowledged batches kept for the next try.
pub const KEEP_UNSENT: usize = 600;
/// Rows one report carries at most (a backlog goes in several).
pub const MAX_ROWS: usize = 5_000;

#[derive(Default)]
struct Acc {
    requests: u64,
    errors: u64,
    latency_us: u64,
    queue_peak: u64,
    /// Empty until the first request.
    hist: Vec<u64>,
}

struct Held {
    now: u64,
    since: Instant,
    busy_us: u64,
    /// The most requests at the gateway at once since the last report: held, plus waiting
    /// in the queue when one joined it.
    peak: u64,
}

impl Held {
    fn new(at: Instant) -> Held {
        Held {
            now: 0,
            since: at,
            busy_us: 0,
            peak: 0,
        }
    }
}

impl Held {
    /// Adds the holding up to `at`.
    fn settle(&mut self, at: Instant) {
        let us =
            u64::try_from(at.saturating_duration_since(self.since).as_micros()).unwrap_or(u64::MAX);
        self.busy_us = self.busy_us.saturating_add(self.now.saturating_mul(us));
        self.since = at;
    }
}

#[derive(Default)]
struct Inner {
    /// Per service, per replica (`None`: the whole service), per second.
    open: HashMap<(Uuid, Option<JobId>, i64), Acc>,
    /// Replicas whose last report said something was in flight: the next says when it is 0.
    busy: HashMap<(Uuid, JobId), u64>,
    /// Per service, requests held on its replicas now, since when that count holds, the
    /// microseconds of holding summed since the last report, and the most requests at the
    /// gateway at once since then.
    held: HashMap<Uuid, Held>,
    next_batch: u64,
    unsent: VecDeque<(u64, Vec<TrafficSecond>)>,
}

/// A gateway's meter: cheap to update from every request.
#[derive(Default)]
pub struct Meter {
    inner: Mutex<Inner>,
}

fn second_of(now: Timestamp) -> i64 {
    now.millis().div_euclid(1000)
}

impl Meter {
    /// One request answered (or failed) after `latency`; `replica` when it reached one.
    pub fn record(
        &self,
        service: Uuid,
        replica: Option<JobId>,
        now: Timestamp,
        latency: Duration,
        error: bool,
    ) {
        let at = second_of(now);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let bucket = bucket_of(latency);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let keys = [
            Some((service, None, at)),
            replica.map(|r| (service, Some(r), at)),
        ];
        for key in keys.into_iter().flatten() {
            let acc = inner.open.entry(key).or_default();
            acc.requests += 1;
            acc.errors += u64::from(error);
            acc.latency_us = acc.latency_us.saturating_add(us);
            if acc.hist.is_empty() {
                acc.hist = vec![0; BUCKETS];
            }
            acc.hist[bucket] += 1;
        }
    }

    /// A request of `service` was dispatched to a replica: it holds it until [`Meter::ended`].
    pub fn began(&self, service: Uuid) {
        self.hold(service, true);
    }

    /// A request of `service` let its replica go (its answer streamed through, or it failed).
    pub fn ended(&self, service: Uuid) {
        self.hold(service, false);
    }

    fn hold(&self, service: Uuid, began: bool) {
        let at = Instant::now();
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = inner.held.entry(service).or_insert_with(|| Held::new(at));
        held.settle(at);
        if began {
            held.now += 1;
            // A request dispatched at once arrived to an empty queue (the queue is served
            // first): what is at the gateway is what is held. One dispatched from the queue
            // only moves, and `now` is then a lower bound the queue's own count has passed.
            held.peak = held.peak.max(held.now);
        } else {
            held.now = held.now.saturating_sub(1);
        }
    }

    /// `depth` requests wait in the service's queue now (one just joined it): with the ones
    /// held, that many are at the gateway at once.
    pub fn queued(&self, service: Uuid, now: Timestamp, depth: usize) {
        let depth = u64::try_from(depth).unwrap_or(u64::MAX);
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let acc = inner
            .open
            .entry((service, None, second_of(now)))
            .or_default();
        acc.queue_peak = acc.queue_peak.max(depth);
        let held = inner
            .held
            .entry(service)
            .or_insert_with(|| Held::new(Instant::now()));
        held.peak = held.peak.max(held.now.saturating_add(depth));
    }

    /// Closes what was seen into a new batch, with `in_flight` (service, replica, requests in
    /// flight now) on the replicas' rows; returns every batch not yet acknowledged, oldest
    /// first, at most [`MAX_ROWS`] rows.
    pub fn close(&self, now: Timestamp, in_flight: &[(Uuid, JobId, usize)]) -> Vec<TrafficSecond> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let batch = inner.next_batch;
        inner.next_batch += 1;
        let at = second_of(now);
        let mut rows: HashMap<(Uuid, Option<JobId>, i64), TrafficSecond> = inner
            .open
            .drain()
            .map(|((service, replica, second), mut acc)| {
                while acc.hist.last() == Some(&0) {
                    acc.hist.pop();
                }
                let row = TrafficSecond {
                    service,
                    replica: replica.map(|r| r.0),
                    second,
                    batch,
                    requests: acc.requests,
                    errors: acc.errors,
                    latency_sum_us: acc.latency_us,
                    buckets: acc.hist,
                    queue_peak: acc.queue_peak,
                    in_flight: 0,
                    busy_us: 0,
                    peak_in_system: 0,
                };
                ((service, replica, second), row)
            })
            .collect();
        // Each replica's requests in flight now, on its row of this second (made when it had
        // none), and a last 0 for one that had some at the last report.
        let mut busy = HashMap::new();
        for &(service, job, n) in in_flight {
            if n > 0 {
                busy.insert((service, job), n as u64);
            }
        }
        let mut report = |service: Uuid, job: JobId, n: u64| {
            rows.entry((service, Some(job), at))
                .or_insert_with(|| TrafficSecond {
                    service,
                    replica: Some(job.0),
                    second: at,
                    batch,
                    requests: 0,
                    errors: 0,
                    latency_sum_us: 0,
                    buckets: Vec::new(),
                    queue_peak: 0,
                    in_flight: 0,
                    busy_us: 0,
                    peak_in_system: 0,
                })
                .in_flight = n;
        };
        let replicas: Vec<(Uuid, JobId)> = busy.keys().chain(inner.busy.keys()).copied().collect();
        for (service, job) in replicas {
            report(
                service,
                job,
                busy.get(&(service, job)).copied().unwrap_or(0),
            );
        }
        // Each service's holding since the last report and its peak at the gateway (at least
        // what is still held: it was there at the start of the next report's span too), on
        // its row of this second.
        let instant = Instant::now();
        let mut held: Vec<(Uuid, u64, u64)> = Vec::new();
        inner.held.retain(|service, h| {
            h.settle(instant);
            let peak = h.peak.max(h.now);
            if h.busy_us > 0 || peak > 0 {
                held.push((*service, h.busy_us, peak));
                h.busy_us = 0;
            }
            h.peak = h.now;
            h.now > 0
        });
        for (service, busy_us, peak) in held {
            let row = rows
                .entry((service, None, at))
                .or_insert_with(|| TrafficSecond {
                    service,
                    replica: None,
                    second: at,
                    batch,
                    requests: 0,
                    errors: 0,
                    latency_sum_us: 0,
                    buckets: Vec::new(),
                    queue_peak: 0,
                    in_flight: 0,
                    busy_us: 0,
                    peak_in_system: 0,
                });
            row.busy_us = busy_us;
            row.peak_in_system = peak;
        }
        inner.busy = busy;
        let mut rows: Vec<TrafficSecond> = rows.into_values().collect();
        rows.sort_by_key(|r| (r.second, r.service, r.replica));
        if !rows.is_empty() {
            inner.unsent.push_back((batch, rows));
        }
        while inner.unsent.len() > KEEP_UNSENT {
            if let Some((dropped, rows)) = inner.unsent.pop_front() {
                tracing::warn!(
                    batch = dropped,
                    rows = rows.len(),
                    "the broker has not taken a gateway report for ten minutes; dropping it"
                );
            }
        }
        let mut out = Vec::new();
        for (_, rows) in &inner.unsent {
            if out.len() + rows.len() > MAX_ROWS && !out.is_empty() {
                break;
            }
            out.extend(rows.iter().cloned());
        }
        out
    }

    /// The broker committed every row of the batches up to `through` (the largest batch
    /// number among the rows it took).
    pub fn acknowledged(&self, through: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        while inner.unsent.front().is_some_and(|(b, _)| *b <= through) {
            inner.unsent.pop_front();
        }
    }

    /// Batches waiting for the broker.
    pub fn unsent(&self) -> usize {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.unsent.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SVC: Uuid = Uuid::from_u128(1);
    const JOB: JobId = JobId(Uuid::from_u128(2));

    #[test]
    fn a_batch_keeps_its_rows_until_acknowledged() {
        let m = Meter::default();
        let t = Timestamp(10_500);
        m.record(SVC, Some(JOB), t, Duration::from_millis(3), false);
        m.record(SVC, None, t, Duration::from_millis(1), true);
        m.queued(SVC, t, 4);
        let first = m.close(t, &[(SVC, JOB, 2)]);
        assert_eq!(first.len(), 2);
        let all = first.iter().find(|r| r.replica.is_none()).unwrap();
        assert_eq!((all.requests, all.errors, all.queue_peak), (2, 1, 4));
        assert_eq!(all.buckets.iter().sum::<u64>(), 2);
        let one = first.iter().find(|r| r.replica.is_some()).unwrap();
        assert_eq!((one.requests, one.in_flight, one.second), (1, 2, 10));
        // Not acknowledged: sent again with the next batch, same number.
        let second = m.close(Timestamp(11_500), &[]);
        assert_eq!(second.len(), 3, "{second:?}");
        assert!(second.iter().take(2).all(|r| r.batch == 0));
        // The replica that had requests in flight is said to have none now.
        let zero = second.iter().find(|r| r.batch == 1).unwrap();
        assert_eq!(
            (zero.replica, zero.in_flight, zero.requests),
            (Some(JOB.0), 0, 0)
        );
        m.acknowledged(1);
        assert_eq!(m.unsent(), 0);
        assert!(m.close(Timestamp(12_500), &[]).is_empty());
    }

    #[test]
    fn the_time_requests_hold_replicas_is_summed_per_service() {
        let m = Meter::default();
        m.began(SVC);
        m.began(SVC);
        std::thread::sleep(Duration::from_millis(20));
        m.ended(SVC);
        m.ended(SVC);
        let rows = m.close(Timestamp(10_500), &[]);
        let all = rows
            .iter()
            .find(|r| r.replica.is_none())
            .expect("the service's row");
        // Two requests held for at least 20 ms each.
        assert!(all.busy_us >= 40_000, "{}", all.busy_us);
        assert_eq!(all.requests, 0);
        // Nothing held since: no row.
        m.acknowledged(all.batch);
        assert!(m.close(Timestamp(11_500), &[]).is_empty());
    }

    fn peak(rows: &[TrafficSecond]) -> u64 {
        rows.iter()
            .find(|r| r.replica.is_none())
            .map_or(0, |r| r.peak_in_system)
    }

    #[test]
    fn the_peak_at_the_gateway_counts_held_and_queued_requests_per_report() {
        let m = Meter::default();
        let t = Timestamp(10_500);
        // Three dispatched at once, then two join the queue: five at the gateway at once,
        // though never more than three are held.
        for _ in 0..3 {
            m.began(SVC);
        }
        m.queued(SVC, t, 1);
        m.queued(SVC, t, 2);
        // One ends and a queued one takes its place (a move, not an arrival), then all end.
        m.ended(SVC);
        m.began(SVC);
        for _ in 0..3 {
            m.ended(SVC);
        }
        let rows = m.close(t, &[]);
        assert_eq!(peak(&rows), 5);
        let all = rows.iter().find(|r| r.replica.is_none()).unwrap();
        assert_eq!(all.queue_peak, 2);
        m.acknowledged(all.batch);
        // The next report counts from what is held at its start: two still held over a
        // second with no arrival are two at once; when they end, nothing more is reported.
        m.began(SVC);
        m.began(SVC);
        m.acknowledged(peak_batch(&m.close(Timestamp(11_500), &[])));
        let rows = m.close(Timestamp(12_500), &[]);
        assert_eq!(peak(&rows), 2);
        m.acknowledged(peak_batch(&rows));
        m.ended(SVC);
        m.ended(SVC);
        let rows = m.close(Timestamp(13_500), &[]);
        assert_eq!(peak(&rows), 2, "held at the start of the span");
        m.acknowledged(peak_batch(&rows));
        assert!(m.close(Timestamp(14_500), &[]).is_empty());
    }

    fn peak_batch(rows: &[TrafficSecond]) -> u64 {
        rows.iter().map(|r| r.batch).max().unwrap()
    }
}
