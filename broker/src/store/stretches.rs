//! Who a cloud instance's time is charged to, stretch by stretch: pure.

use switchyard_core::{Money, Timestamp};

/// An attempt that ran on the instance's node from `start` to `end` (still running: `None`).
pub(crate) struct Occupant<O> {
    pub owner: O,
    pub start: Timestamp,
    pub end: Option<Timestamp>,
}

/// Splits `[from, until]` into stretches with one owner each — the occupant running at the
/// stretch's start, else `launched_for` — merged where the owner does not change. When
/// `from == until` (settling at the very time of the last pass) there is one empty stretch,
/// which carries only the minimum billed time.
pub(crate) fn stretches<'a, O: PartialEq>(
    occupants: &'a [Occupant<O>],
    launched_for: &'a O,
    from: Timestamp,
    until: Timestamp,
) -> Vec<(Timestamp, Timestamp, &'a O)> {
    let mut points = vec![from, until];
    for o in occupants {
        points.push(o.start.max(from).min(until));
        if let Some(end) = o.end {
            points.push(end.max(from).min(until));
        }
    }
    points.sort();
    points.dedup();
    let owner_at = |t: Timestamp| {
        occupants
            .iter()
            .find(|o| o.start <= t && o.end.is_none_or(|e| e > t))
            .map_or(launched_for, |o| &o.owner)
    };
    let mut out: Vec<(Timestamp, Timestamp, &O)> = Vec::new();
    for w in points.windows(2) {
        let (start, end) = (w[0], w[1]);
        let owner = owner_at(start);
        match out.last_mut() {
            Some(last) if last.2 == owner && last.1 == start => last.1 = end,
            _ => out.push((start, end, owner)),
        }
    }
    if out.is_empty() {
        out.push((until, until, owner_at(until)));
    }
    out
}

/// What a source accrues from `origin` to `t` at `rate` per hour: whole seconds, a started
/// second counted in full (a job that ran 300 ms pays for one second), rounded up to the
/// micro-dollar. Cumulative, so a source's entries (each `cost_to(end) − cost_to(start)`) add up
/// to exactly its rate × its billed time however many passes wrote them.
pub(crate) fn cost_to(rate: Money, origin: Timestamp, t: Timestamp) -> i64 {
    rate.per_hour_for_secs(t.billed_secs_since(origin)).micros()
}

/// The ledger kind of a cloud instance's time spent on a job.
pub(crate) const INSTANCE_JOB: &str = "instance";
/// The ledger kind of a cloud instance's time before its node was ready: the team's overhead.
pub(crate) const INSTANCE_BOOT: &str = "instance_boot";
/// The ledger kind of a cloud instance's time with its node ready and no job on it: the team's
/// overhead.
pub(crate) const INSTANCE_IDLE: &str = "instance_idle";

/// Each stretch labelled with its ledger kind: a job's time ([`INSTANCE_JOB`]), or, for the
/// stretches no job ran in (`is_job` false), boot time up to `ready_at` and idle time after it,
/// split there. Never ready (a launch that failed to join): all boot.
pub(crate) fn labelled<O>(
    stretches: Vec<(Timestamp, Timestamp, &O)>,
    is_job: impl Fn(&O) -> bool,
    ready_at: Option<Timestamp>,
) -> Vec<(Timestamp, Timestamp, &O, &'static str)> {
    let mut out = Vec::with_capacity(stretches.len() + 1);
    for (start, end, owner) in stretches {
        if is_job(owner) {
            out.push((start, end, owner, INSTANCE_JOB));
            continue;
        }
        match ready_at {
            Some(ready) if ready <= start => out.push((start, end, owner, INSTANCE_IDLE)),
            Some(ready) if ready < end => {
                out.push((start, ready, owner, INSTANCE_BOOT));
                out.push((ready, end, owner, INSTANCE_IDLE));
            }
            _ => out.push((start, end, owner, INSTANCE_BOOT)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp(s * 1000)
    }

    #[test]
    fn idle_time_goes_to_the_launching_job_and_runs_to_their_jobs() {
        let occ = vec![
            Occupant {
                owner: "a",
                start: t(10),
                end: Some(t(20)),
            },
            Occupant {
                owner: "b",
                start: t(20),
                end: None,
            },
        ];
        let s = stretches(&occ, &"launch", t(0), t(30));
        let got: Vec<(i64, i64, &str)> = s
            .iter()
            .map(|(a, b, o)| (a.0 / 1000, b.0 / 1000, **o))
            .collect();
        assert_eq!(got, vec![(0, 10, "launch"), (10, 20, "a"), (20, 30, "b")]);
    }

    #[test]
    fn one_owner_throughout_is_one_stretch_and_an_empty_window_one_empty_stretch() {
        let occ = vec![Occupant {
            owner: "a",
            start: t(0),
            end: None,
        }];
        let s = stretches(&occ, &"launch", t(5), t(50));
        assert_eq!(s.len(), 1);
        assert_eq!((s[0].0, s[0].1, *s[0].2), (t(5), t(50), "a"));
        let s = stretches(&occ, &"launch", t(50), t(50));
        assert_eq!((s[0].0, s[0].1, *s[0].2), (t(50), t(50), "a"));
    }

    #[test]
    fn time_without_a_job_is_boot_until_ready_then_idle() {
        let (job, none) = ("job", "");
        let s = vec![
            (t(0), t(30), &none),
            (t(30), t(40), &job),
            (t(40), t(50), &none),
        ];
        let got: Vec<(i64, i64, &str, &str)> = labelled(s, |o| !o.is_empty(), Some(t(20)))
            .iter()
            .map(|(a, b, o, k)| (a.0 / 1000, b.0 / 1000, **o, *k))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 20, "", INSTANCE_BOOT),
                (20, 30, "", INSTANCE_IDLE),
                (30, 40, "job", INSTANCE_JOB),
                (40, 50, "", INSTANCE_IDLE),
            ]
        );
        let never = labelled(vec![(t(0), t(9), &none)], |o| !o.is_empty(), None);
        assert_eq!(never[0].3, INSTANCE_BOOT);
        let at_ready = labelled(vec![(t(5), t(9), &none)], |o| !o.is_empty(), Some(t(5)));
        assert_eq!(at_ready[0].3, INSTANCE_IDLE);
    }
}
