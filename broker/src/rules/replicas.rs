//! How many replicas of a service to start and which to stop, given the replicas it has: the
//! rule the services reconciler (`control/services.rs`) carries out. Pure.
//!
//! - A deleted service stops every replica.
//! - Replicas of the current spec version are brought to the desired count: the missing ones
//!   are started; extra ones are stopped, those not ready first, then the newest.
//! - A rolling update: replicas of an older version keep serving until enough of the new
//!   version are ready. Old ones are stopped only as far as the new version's ready replicas
//!   cover the desired count, so the service never has fewer ready replicas than it had (or
//!   than desired) because of the update. Old ones not ready go first.
//! - Job ids are UUIDv7, in the order the jobs were created: "newest" and "oldest" are by id.
//! - A replica already being stopped (its job's cancel requested) counts for nothing: it
//!   finishes its in-flight work and ends.

use std::cmp::Reverse;
use switchyard_core::{JobId, NodeId, Timestamp};

/// A live replica (its job not finished) as the reconciler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub job: JobId,
    pub version: i64,
    /// Its readiness probe passes (reported by its agent).
    pub ready: bool,
    /// Already being stopped.
    pub stopping: bool,
    /// The node it was placed on (`None`: not placed yet).
    pub node: Option<NodeId>,
    /// Placed on capacity bought for the burst (a cloud region), not the company's own: the
    /// first to go in a scale-down.
    pub burst: bool,
    /// Its node is going away (a spot interruption notice, a drain): it is replaced like a
    /// replica of an old version — it serves until its replacement is ready, then drains.
    pub doomed: bool,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Replicas of the current version to start.
    pub start: u32,
    /// Replicas to stop, each with why.
    pub stop: Vec<(JobId, &'static str)>,
}

/// Failed replicas of a version within [`CRASH_WINDOW_MS`] before starting new ones is held
/// back: from the [`CRASH_FREE`]th failure on, the next start waits `5 s × 2^(n − 3)` after the
/// last failure, at most [`CRASH_MAX_WAIT_MS`].
pub const CRASH_FREE: usize = 3;
pub const CRASH_WINDOW_MS: i64 = 10 * 60 * 1000;
pub const CRASH_FIRST_WAIT_MS: i64 = 5_000;
pub const CRASH_MAX_WAIT_MS: i64 = 5 * 60 * 1000;

/// Until when starting replicas waits, given when the current version's replicas failed (ended
/// on their own, `failed`) and the time now; `None`: start now. A version whose replicas keep
/// crashing is restarted ever more slowly, not every second.
pub fn crash_backoff(failed_at: &[Timestamp], now: Timestamp) -> Option<Timestamp> {
    let recent: Vec<Timestamp> = failed_at
        .iter()
        .copied()
        .filter(|t| now.millis() - t.millis() <= CRASH_WINDOW_MS)
        .collect();
    if recent.len() < CRASH_FREE {
        return None;
    }
    let last = recent.iter().max()?;
    let doublings = u32::try_from(recent.len() - CRASH_FREE)
        .unwrap_or(u32::MAX)
        .min(16);
    let wait = CRASH_FIRST_WAIT_MS
        .saturating_mul(1i64 << doublings)
        .min(CRASH_MAX_WAIT_MS);
    let until = Timestamp(last.millis().saturating_add(wait));
    (until > now).then_some(until)
}

/// A replica whose probe has failed (its agent reports it not ready, after the probe's own
/// failure threshold) this long after it had been ready is replaced.
pub const UNREADY_REPLACE_MS: i64 = 10_000;
/// A replica never ready this long after it began running is replaced (a model that never
/// loads, a server that never listens).
pub const STARTUP_TIMEOUT_MS: i64 = 10 * 60 * 1000;

/// What the reconciler has seen of a running replica's readiness (in the leader's memory: a
/// new leader starts the clocks again, which only delays a replacement).
#[derive(Clone, Debug, PartialEq)]
pub struct Health {
    pub running_since: Timestamp,
    pub ready_ever: bool,
    pub unready_since: Option<Timestamp>,
}

impl Health {
    pub fn new(now: Timestamp) -> Health {
        Health {
            running_since: now,
            ready_ever: false,
            unready_since: None,
        }
    }

    /// Its agent's latest report at `now`.
    pub fn observe(&mut self, ready: bool, now: Timestamp) {
        if ready {
            self.ready_ever = true;
            self.unready_since = None;
        } else if self.ready_ever && self.unready_since.is_none() {
            self.unready_since = Some(now);
        }
    }

    /// Why the replica is to be replaced at `now`, if it is.
    pub fn verdict(&self, now: Timestamp) -> Option<String> {
        match self.unready_since {
            Some(since) if now.millis() - since.millis() >= UNREADY_REPLACE_MS => Some(format!(
                "its readiness probe has failed for {} s",
                (now.millis() - since.millis()) / 1000
            )),
            _ if !self.ready_ever
                && now.millis() - self.running_since.millis() >= STARTUP_TIMEOUT_MS =>
            {
                Some(format!(
                    "not ready {} minutes after it started",
                    STARTUP_TIMEOUT_MS / 60_000
                ))
            }
            _ => None,
        }
    }
}

/// Of `count` replicas to start, how many must never take spot so that at least
/// `min_on_demand` stay on on-demand capacity: `on_demand` live replicas are on it already (or
/// bound for it).
pub fn on_demand_starts(count: u32, min_on_demand: u32, on_demand: u32) -> u32 {
    min_on_demand.saturating_sub(on_demand).min(count)
}

/// How a service with `replicas.min ≥ 2` spreads over nodes: while every ready replica is on
/// one node, one replica more than desired runs (a surge of one, as in a rolling update), kept
/// off that node; once it is ready elsewhere, the count falls back to the desired one and the
/// replica stopped is one on the crowded node ([`decide`]'s order). New replicas are kept off
/// the node while every placed replica is on it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spread {
    /// Replicas above the desired count now.
    pub surge: u32,
    /// The node replicas not yet placed are kept off.
    pub avoid: Option<NodeId>,
}

pub fn spread(min: u32, desired: u32, live: &[Seen]) -> Spread {
    if min < 2 || desired < 2 {
        return Spread::default();
    }
    let active: Vec<&Seen> = live.iter().filter(|r| !r.stopping).collect();
    let one_node = |nodes: Vec<&NodeId>| -> Option<NodeId> {
        let first = *nodes.first()?;
        nodes.iter().all(|n| *n == first).then(|| first.clone())
    };
    let placed = one_node(active.iter().filter_map(|r| r.node.as_ref()).collect());
    let ready = one_node(
        active
            .iter()
            .filter(|r| r.ready)
            .filter_map(|r| r.node.as_ref())
            .collect(),
    );
    Spread {
        surge: u32::from(ready.is_some()),
        avoid: placed,
    }
}

pub const WHY_DELETED: &str = "the service was deleted";
pub const WHY_SCALE_DOWN: &str = "scaled down";
pub const WHY_REPLACED: &str = "replaced by the new spec version";
pub const WHY_RECLAIMED: &str =
    "its node is going away (spot interruption notice or drain): replaced, then drained";

/// What to start and stop. `spreads`: the service keeps its replicas on two nodes at least
/// ([`spread`]), so a scale-down keeps them apart before it keeps them cheap.
pub fn decide(version: i64, desired: u32, deleted: bool, spreads: bool, live: &[Seen]) -> Decision {
    let active = live.iter().filter(|r| !r.stopping);
    if deleted {
        return Decision {
            start: 0,
            stop: active.map(|r| (r.job, WHY_DELETED)).collect(),
        };
    }
    let (mut current, mut old): (Vec<&Seen>, Vec<&Seen>) =
        active.partition(|r| r.version == version && !r.doomed);
    let desired_n = desired as usize;
    let mut decision = Decision::default();
    if current.len() < desired_n {
        decision.start = u32::try_from(desired_n - current.len()).unwrap_or(u32::MAX);
    } else if current.len() > desired_n {
        // Not ready first; then, for a service that spreads, those on the node with the most
        // of them (it stays spread); then those on burst capacity (the company's own is paid
        // for anyway); then those on the node with the most of them; then the newest.
        let nodes: Vec<Option<NodeId>> = current.iter().map(|c| c.node.clone()).collect();
        let crowd = |r: &Seen| {
            r.node.as_ref().map_or(0, |n| {
                nodes.iter().filter(|c| c.as_ref() == Some(n)).count()
            })
        };
        let key = |r: &Seen| {
            let crowd = crowd(r);
            let spreading = if spreads { crowd } else { 0 };
            (
                r.ready,
                Reverse(spreading),
                Reverse(r.burst),
                Reverse(crowd),
                Reverse(r.job.0),
            )
        };
        current.sort_by_cached_key(|r| key(r));
        let extra = current.len() - desired_n;
        decision
            .stop
            .extend(current.drain(..extra).map(|r| (r.job, WHY_SCALE_DOWN)));
    }
    let current_ready = current.iter().filter(|r| r.ready).count();
    let keep_old = desired_n.saturating_sub(current_ready).min(old.len());
    // Old ones not ready go first, then the oldest.
    old.sort_by(|a, b| a.ready.cmp(&b.ready).then(a.job.0.cmp(&b.job.0)));
    let stop_old = old.len() - keep_old;
    decision.stop.extend(old.iter().take(stop_old).map(|r| {
        let why = if r.version == version {
            WHY_RECLAIMED
        } else {
            WHY_REPLACED
        };
        (r.job, why)
    }));
    decision
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use uuid::Uuid;

    /// Replica `n`, created at `created` (its id orders by that, as UUIDv7 ids do).
    fn r(n: u128, version: i64, ready: bool, created: u128) -> Seen {
        Seen {
            job: JobId(Uuid::from_u128((created << 16) | n)),
            version,
            ready,
            stopping: false,
            node: None,
            burst: false,
            doomed: false,
        }
    }

    fn stopped(d: &Decision) -> Vec<u128> {
        d.stop.iter().map(|(j, _)| j.0.as_u128() & 0xffff).collect()
    }

    #[test]
    fn missing_replicas_are_started() {
        assert_eq!(decide(1, 3, false, false, &[]).start, 3);
        let d = decide(1, 3, false, false, &[r(1, 1, true, 0)]);
        assert_eq!((d.start, d.stop.len()), (2, 0));
    }

    #[test]
    fn a_scale_down_stops_the_not_ready_then_the_newest() {
        let live = [
            r(1, 1, true, 10),
            r(2, 1, false, 5),
            r(3, 1, true, 30),
            r(4, 1, true, 20),
        ];
        let d = decide(1, 2, false, false, &live);
        assert_eq!(d.start, 0);
        assert_eq!(stopped(&d), [2, 3]);
        assert!(d.stop.iter().all(|(_, why)| *why == WHY_SCALE_DOWN));
    }

    #[test]
    fn replicas_being_stopped_count_for_nothing() {
        let mut going = r(1, 1, true, 0);
        going.stopping = true;
        let d = decide(1, 1, false, false, &[going]);
        assert_eq!((d.start, d.stop.len()), (1, 0));
    }

    #[test]
    fn a_replica_whose_node_goes_away_serves_until_its_replacement_is_ready() {
        let doomed = Seen {
            doomed: true,
            ..r(1, 1, true, 0)
        };
        // The notice: a replacement starts; the doomed replica keeps serving.
        let d = decide(1, 2, false, false, &[doomed.clone(), r(2, 1, true, 1)]);
        assert_eq!((d.start, d.stop.len()), (1, 0));
        // The replacement starts but is not ready yet: nothing more changes.
        let starting = [doomed.clone(), r(2, 1, true, 1), r(3, 1, false, 2)];
        assert_eq!(decide(1, 2, false, false, &starting), Decision::default());
        // Ready: the doomed replica drains, and says why.
        let ready = [doomed, r(2, 1, true, 1), r(3, 1, true, 2)];
        let d = decide(1, 2, false, false, &ready);
        assert_eq!(d.start, 0);
        assert_eq!(stopped(&d), vec![1]);
        assert_eq!(d.stop[0].1, WHY_RECLAIMED);
    }

    #[test]
    fn a_rolling_update_keeps_old_replicas_until_new_ones_are_ready() {
        // Two old replicas serving; the new version just deployed.
        let old = [r(1, 1, true, 0), r(2, 1, true, 1)];
        let d = decide(2, 2, false, false, &old);
        assert_eq!((d.start, stopped(&d)), (2, vec![]));
        // One new replica ready: one old one goes, the oldest.
        let live = [
            old[0].clone(),
            old[1].clone(),
            r(3, 2, true, 5),
            r(4, 2, false, 6),
        ];
        let d = decide(2, 2, false, false, &live);
        assert_eq!((d.start, stopped(&d)), (0, vec![1]));
        assert_eq!(d.stop[0].1, WHY_REPLACED);
        // Both new ones ready: every old one goes.
        let live = [
            old[0].clone(),
            old[1].clone(),
            r(3, 2, true, 5),
            r(4, 2, true, 6),
        ];
        assert_eq!(stopped(&decide(2, 2, false, false, &live)), [1, 2]);
    }

    #[test]
    fn an_old_replica_that_is_not_ready_goes_first_in_an_update() {
        let live = [r(1, 1, true, 0), r(2, 1, false, 1), r(3, 2, true, 5)];
        assert_eq!(stopped(&decide(2, 2, false, false, &live)), [2]);
    }

    #[test]
    fn a_deleted_service_stops_everything_and_starts_nothing() {
        let mut going = r(3, 1, true, 0);
        going.stopping = true;
        let d = decide(
            2,
            4,
            true,
            false,
            &[r(1, 1, true, 0), r(2, 2, false, 1), going],
        );
        assert_eq!((d.start, stopped(&d)), (0, vec![1, 2]));
        assert!(d.stop.iter().all(|(_, why)| *why == WHY_DELETED));
    }

    #[test]
    fn crashing_replicas_are_restarted_ever_more_slowly() {
        let t = |s: i64| Timestamp(s * 1000);
        // Two failures: start at once.
        assert_eq!(crash_backoff(&[t(0), t(10)], t(11)), None);
        // The third: 5 s after it; the fourth: 10 s after it.
        assert_eq!(crash_backoff(&[t(0), t(10), t(20)], t(21)), Some(t(25)));
        assert_eq!(crash_backoff(&[t(0), t(10), t(20)], t(25)), None);
        assert_eq!(
            crash_backoff(&[t(0), t(10), t(20), t(30)], t(31)),
            Some(t(40))
        );
        // Never more than 5 minutes.
        let many: Vec<Timestamp> = (0..40).map(t).collect();
        assert_eq!(crash_backoff(&many, t(40)), Some(t(39 + 300)));
        // Failures older than 10 minutes are forgotten.
        assert_eq!(crash_backoff(&[t(0), t(1), t(2)], t(700)), None);
    }

    #[test]
    fn a_replica_unready_for_long_is_replaced() {
        let t = |s: i64| Timestamp(s * 1000);
        let mut h = Health::new(t(0));
        h.observe(false, t(5));
        assert_eq!(h.verdict(t(100)), None, "starting: not yet");
        h.observe(true, t(120));
        h.observe(false, t(130));
        assert_eq!(h.verdict(t(139)), None);
        assert!(h.verdict(t(140)).unwrap().contains("failed for 10 s"));
        // Ready again: the clock stops.
        h.observe(true, t(141));
        assert_eq!(h.verdict(t(500)), None);
        // Never ready: replaced after the start-up timeout.
        let h = Health::new(t(0));
        assert_eq!(h.verdict(t(599)), None);
        assert!(h.verdict(t(600)).unwrap().contains("not ready 10 minutes"));
    }

    #[test]
    fn new_replicas_keep_the_on_demand_minimum() {
        assert_eq!(on_demand_starts(3, 1, 0), 1);
        assert_eq!(on_demand_starts(3, 2, 1), 1);
        assert_eq!(on_demand_starts(3, 1, 1), 0);
        assert_eq!(on_demand_starts(1, 4, 0), 1);
    }

    fn on(mut r: Seen, node: &str) -> Seen {
        r.node = Some(NodeId(node.into()));
        r
    }

    #[test]
    fn a_service_on_one_node_surges_one_replica_onto_another() {
        let n1 = || NodeId("n1".into());
        // Two ready on n1: one more, kept off n1.
        let live = [on(r(1, 1, true, 0), "n1"), on(r(2, 1, true, 1), "n1")];
        let s = spread(2, 2, &live);
        assert_eq!(
            s,
            Spread {
                surge: 1,
                avoid: Some(n1())
            }
        );
        assert_eq!(decide(1, 2 + s.surge, false, true, &live).start, 1);
        // It waits for a place (or starts elsewhere, not yet ready): still one more.
        let mut live3 = live.to_vec();
        live3.push(r(3, 1, false, 2));
        assert_eq!(spread(2, 2, &live3).surge, 1);
        assert_eq!(decide(1, 3, false, true, &live3), Decision::default());
        live3[2] = on(r(3, 1, false, 2), "n2");
        let s = spread(2, 2, &live3);
        assert_eq!((s.surge, s.avoid), (1, None));
        // Ready on n2: back to two, and the one stopped is the newest on n1.
        live3[2] = on(r(3, 1, true, 2), "n2");
        assert_eq!(spread(2, 2, &live3), Spread::default());
        assert_eq!(stopped(&decide(1, 2, false, true, &live3)), [2]);
        // A service with min 1 is left where it is.
        assert_eq!(spread(1, 2, &live), Spread::default());
    }

    #[test]
    fn a_scale_down_stops_burst_replicas_before_the_companys_own() {
        let mut cloud = on(r(1, 1, true, 0), "c1");
        cloud.burst = true;
        let live = [
            cloud,
            on(r(2, 1, true, 5), "n1"),
            on(r(3, 1, true, 6), "n2"),
        ];
        assert_eq!(stopped(&decide(1, 2, false, false, &live)), [1]);
        // A service that spreads keeps two nodes first: here any one keeps two.
        assert_eq!(stopped(&decide(1, 2, false, true, &live)), [1]);
        let crowded = [on(r(1, 1, true, 0), "n1"), on(r(2, 1, true, 1), "n1"), {
            let mut c = on(r(3, 1, true, 2), "c1");
            c.burst = true;
            c
        }];
        // Spreading: one of n1's goes (n1 and c1 remain); otherwise the burst one.
        assert_eq!(stopped(&decide(1, 2, false, true, &crowded)), [2]);
        assert_eq!(stopped(&decide(1, 2, false, false, &crowded)), [3]);
    }

    #[test]
    fn zero_desired_stops_every_current_replica() {
        let d = decide(1, 0, false, false, &[r(1, 1, true, 0), r(2, 1, true, 1)]);
        assert_eq!((d.start, stopped(&d)), (0, vec![2, 1]));
    }
}
