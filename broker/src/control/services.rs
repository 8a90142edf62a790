//! The services reconciler: keeps each service's replicas as the rules say (leader only,
//! level-triggered like the burst controller). Each pass, for every service, live or deleted
//! and still draining:
//!
//! 1. the desired count — the autoscaler's rule (`rules/autoscale.rs`) on what the gateways
//!    measured (`App::traffic`), the schedule's minimum and the replica bounds — kept on the
//!    service with its reason and a `scaled` event when it changes;
//! 2. what to start and stop (`rules/replicas.rs`: missing replicas started, extras drained,
//!    old versions replaced only as new ones are ready, everything drained on delete);
//! 3. carried out: a replica is a job of kind `service` (`NewJob::replica`), placed, leased,
//!    preempted and charged like any job. A replica is stopped in two steps, so that no
//!    request fails: first it drains (`jobs.drain_at`: the gateway sends it nothing new, within
//!    its route refresh), then, once the gateway has nothing in flight on it ([`DRAIN_SETTLE`]
//!    after the drain began at the earliest, [`DRAIN_TIMEOUT`] at the latest), its job is
//!    cancelled and its agent stops it with the checkpoint signal and the grace period. A
//!    replica that never served (not ready, nothing in flight) is cancelled at once.
//!
//! Every start and stop is a service event with its reason. A version whose replicas keep
//! failing is restarted ever more slowly (`rules/replicas.rs`, `crash_backoff`), with a
//! `replica_backoff` event per failure.

use std::collections::HashMap;
use std::time::Duration;
use switchyard_core::{JobId, JobState, Market, NodeId, Timestamp};
use switchyard_protocol::api::{ServiceSpec, SpotRule};
use uuid::Uuid;

use crate::control::scheduler::SchedulerEvent;
use crate::rules::autoscale::{self, Measured, Recommendation, Scaler, Targets};
use crate::rules::replicas::{self, Health, Seen};
use crate::rules::{convert, service};
use crate::state::App;
use crate::store::{
    CancelOutcome, NewJob, ReplicaOf, ServiceRecord, ServiceReplicaRow, StoreError,
};

/// How often the reconciler looks when nothing wakes it.
const EVERY: Duration = Duration::from_secs(1);
/// How long a draining replica is left before it may be stopped: the gateways learn of the
/// drain within a route refresh, and what they still had in flight on it reaches this broker's
/// traffic within a report and a read — [`crate::gateway::IN_FLIGHT_LAG`] in all.
pub const DRAIN_SETTLE: Duration = crate::gateway::IN_FLIGHT_LAG;
/// The longest a draining replica's requests in flight are waited for.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// What the reconciler remembers between passes (in the leader's memory only: a new leader
/// starts afresh, and waits one delay before it moves a count).
#[derive(Default)]
pub struct Memory {
    /// Per service, the failure its last `replica_backoff` event was about.
    backoffs: HashMap<Uuid, Option<Timestamp>>,
    /// Per service, the autoscaler's recent recommendations.
    scalers: HashMap<Uuid, Scaler>,
    /// Per running replica, its readiness over time.
    health: HashMap<JobId, Health>,
}

pub async fn run(app: App) {
    let mut moves = app.clock.moves();
    let mut memory = Memory::default();
    loop {
        if !app.leadership.is_leader() {
            app.leadership.until_leader().await;
            memory = Memory::default();
        }
        match reconcile(&app, &mut memory).await {
            Ok(()) => {}
            Err(e @ StoreError::Fenced { .. }) => {
                app.leadership.step_down(app.store.as_ref(), &e.to_string());
            }
            Err(e) => tracing::error!(error = %e, "services reconcile failed"),
        }
        tokio::select! {
            _ = app.services.notified() => {}
            _ = tokio::time::sleep(EVERY) => {}
            () = moves.next() => {}
        }
    }
}

/// One pass over every service.
pub async fn reconcile(app: &App, memory: &mut Memory) -> Result<(), StoreError> {
    let records = app.store.services(None).await?;
    memory.scalers.retain(|id, _| {
        records
            .iter()
            .any(|r| r.id == *id && r.deleted_at.is_none())
    });
    for record in records {
        if let Err(e) = reconcile_one(app, &record, memory).await {
            if matches!(e, StoreError::Fenced { .. }) {
                return Err(e);
            }
            tracing::error!(error = %e, service.id = %record.id, "reconciling a service failed");
        }
    }
    Ok(())
}

async fn reconcile_one(
    app: &App,
    record: &ServiceRecord,
    memory: &mut Memory,
) -> Result<(), StoreError> {
    let now = app.clock.now();
    let spec: ServiceSpec = serde_json::from_str(&record.spec_json)
        .map_err(|e| StoreError::Corrupt(format!("service {} spec: {e}", record.id)))?;
    let deleted = record.deleted_at.is_some();
    let since = Timestamp(now.millis() - replicas::CRASH_WINDOW_MS);
    let replicas = app.store.service_replicas(record.id, since).await?;
    let mut live: Vec<Seen> = replicas.iter().filter_map(seen).collect();
    // Replicas whose probe keeps failing are replaced: they count for nothing from now on, and
    // are stopped below.
    let mut unhealthy = Vec::new();
    for r in &replicas {
        let running =
            r.job_state == JobState::Running && !r.cancel_requested && r.drain_at.is_none();
        let Some(attempt) = r.attempt.as_ref().filter(|_| running) else {
            memory.health.remove(&r.job);
            continue;
        };
        let health = memory
            .health
            .entry(r.job)
            .or_insert_with(|| Health::new(now));
        health.observe(attempt.ready, now);
        if let Some(why) = health.verdict(now) {
            unhealthy.push((r.job, format!("{why}; a new replica replaces it")));
            if let Some(s) = live.iter_mut().find(|s| s.job == r.job) {
                s.stopping = true;
            }
        }
    }
    let desired = if deleted {
        0
    } else {
        let ready = live.iter().filter(|r| r.ready && !r.stopping).count();
        let scaler = memory.scalers.entry(record.id).or_default();
        let ready = u32::try_from(ready).unwrap_or(u32::MAX);
        match scale(app, record, &spec, scaler, ready, now) {
            Some(change) => {
                app.store
                    .set_service_desired(record.id, change.n, &change.reason, now)
                    .await?;
                change.n
            }
            None => record.desired_replicas,
        }
    };
    let backoffs = &mut memory.backoffs;
    // A service with `replicas.min ≥ 2` spreads over nodes: one replica more while all the
    // ready ones share a node, and replicas not yet placed kept off it (the planner reads
    // `App::spread`).
    let (min, _) = service::replica_range(&spec);
    let spread = replicas::spread(min, desired, &live);
    {
        let mut avoid = app.spread.lock().unwrap_or_else(|e| e.into_inner());
        for r in &replicas {
            let unplaced = live
                .iter()
                .any(|s| s.job == r.job && !s.stopping && s.node.is_none());
            match &spread.avoid {
                Some(node) if unplaced && !deleted => {
                    avoid.insert(r.job, vec![node.clone()]);
                }
                _ => {
                    avoid.remove(&r.job);
                }
            }
        }
    }
    let decision = replicas::decide(
        record.spec_version,
        desired.saturating_add(spread.surge),
        deleted,
        min >= 2,
        &live,
    );
    if decision.start > 0 {
        let failed_at: Vec<Timestamp> = replicas
            .iter()
            .filter(|r| r.service_version == record.spec_version && r.job_state == JobState::Failed)
            .filter_map(|r| r.finished_at)
            .collect();
        match replicas::crash_backoff(&failed_at, now) {
            None => {
                // Live replicas on on-demand capacity, or bound for it.
                let on_demand = replicas
                    .iter()
                    .filter(|r| live.iter().any(|s| s.job == r.job && !s.stopping))
                    .filter(|r| match &r.attempt {
                        Some(a) => a.market == Market::OnDemand,
                        None => r.on_demand_only,
                    })
                    .count();
                let on_demand = u32::try_from(on_demand).unwrap_or(u32::MAX);
                let starts = Starts {
                    count: decision.start,
                    on_demand,
                    avoid: spread.avoid.clone(),
                };
                start_replicas(app, record, &spec, starts).await?
            }
            Some(until) => {
                // Said once per failure, not on every pass of the wait.
                let last = failed_at.iter().max().copied();
                if last.is_some() && backoffs.insert(record.id, last) != Some(last) {
                    let message = format!(
                        "{} replicas of version {} failed in the last 10 minutes; the next \
                         starts at {}",
                        failed_at.len(),
                        record.spec_version,
                        crate::clock::to_datetime(until).to_rfc3339()
                    );
                    app.store
                        .append_service_event(record.id, "replica_backoff", &message, None, now)
                        .await?;
                }
            }
        }
    }
    let stops = decision
        .stop
        .iter()
        .map(|(job, why)| (*job, why.to_string()))
        .chain(unhealthy);
    for (job, why) in stops {
        let never_served = replicas
            .iter()
            .find(|r| r.job == job)
            .is_some_and(|r| !r.attempt.as_ref().is_some_and(|a| a.ready))
            && app.traffic.in_flight(job) == 0;
        if never_served {
            stop_replica(app, record.id, job, &why).await?;
        } else if app.store.drain_replica(job, now).await? {
            let message = format!("draining replica {job}: {why}; it gets no new requests");
            app.store
                .append_service_event(record.id, "replica_draining", &message, None, now)
                .await?;
        }
    }
    // Draining replicas whose requests are done (or took too long) stop now.
    for r in &replicas {
        let Some(since) = r
            .drain_at
            .filter(|_| !r.cancel_requested && seen(r).is_some())
        else {
            continue;
        };
        let waited =
            Duration::from_millis(u64::try_from(now.millis() - since.millis()).unwrap_or(0));
        let idle = app.traffic.in_flight(r.job) == 0;
        if waited >= DRAIN_TIMEOUT {
            stop_replica(
                app,
                record.id,
                r.job,
                "its requests in flight did not end in time",
            )
            .await?;
        } else if waited >= DRAIN_SETTLE && idle {
            stop_replica(app, record.id, r.job, "drained: nothing in flight").await?;
        }
    }
    Ok(())
}

/// The autoscaler's pass for one service: its rule on what the gateways measured; `Some`: a
/// new desired count and why.
fn scale(
    app: &App,
    record: &ServiceRecord,
    spec: &ServiceSpec,
    scaler: &mut Scaler,
    ready: u32,
    now: Timestamp,
) -> Option<Recommendation> {
    let t = Targets::of(spec);
    let span = scaler.span_s(&t, ready, now);
    let window = app.traffic.service(record.id, now, t.window_s);
    let recent = app.traffic.service(record.id, now, span);
    let measured = Measured {
        rps: window.rps,
        span_requests: recent.requests,
        span_rps: recent.rps,
        span_p95_ms: recent.p95_ms,
        span_mean_ms: recent.mean_ms,
        span_queued: recent.queued_mean,
        span_in_flight: recent.in_flight_mean,
        span_peak: recent.peak_quantile(autoscale::PEAK_QUANTILE),
        ready,
    };
    let schedule = service::schedule_minimum(spec, now);
    let schedule_min = schedule.as_ref().map_or(0, |(n, _)| *n);
    let rec = autoscale::recommend(&t, &measured, schedule);
    scaler.step(&t, rec, record.desired_replicas, schedule_min, now)
}

/// A replica the rule weighs: its job has not ended.
fn seen(r: &ServiceReplicaRow) -> Option<Seen> {
    if matches!(
        r.job_state,
        JobState::Succeeded | JobState::Failed | JobState::Cancelled
    ) {
        return None;
    }
    Some(Seen {
        job: r.job,
        version: r.service_version,
        ready: r.job_state == JobState::Running && r.attempt.as_ref().is_some_and(|a| a.ready),
        stopping: r.cancel_requested || r.drain_at.is_some(),
        node: r.attempt.as_ref().map(|a| a.node.clone()),
        // Region ids are `provider:code`; the company's own capacity is `onprem:…`.
        burst: r
            .attempt
            .as_ref()
            .is_some_and(|a| !a.region.is_empty() && !a.region.starts_with("onprem:")),
        doomed: r.attempt.as_ref().is_some_and(|a| a.node_draining),
    })
}

/// Replicas to start: how many, how many live ones are on on-demand capacity already, and the
/// node they are kept off (spreading).
struct Starts {
    count: u32,
    on_demand: u32,
    avoid: Option<NodeId>,
}

async fn start_replicas(
    app: &App,
    record: &ServiceRecord,
    spec: &ServiceSpec,
    starts: Starts,
) -> Result<(), StoreError> {
    let Starts {
        count,
        on_demand,
        avoid,
    } = starts;
    let now = app.clock.now();
    let wire = service::replica_job_spec(spec);
    // Replicas that may take spot keep `spot.min_on_demand` (default 1) on on-demand capacity.
    let must = match &spec.spot {
        Some(s) if s.rule != SpotRule::Never => {
            let min = u32::try_from(s.min_on_demand.unwrap_or(1)).unwrap_or(0);
            replicas::on_demand_starts(count, min, on_demand)
        }
        _ => 0,
    };
    let mut pinned = wire.clone();
    pinned.spot = Some(SpotRule::Never);
    let pinned_core = if must > 0 {
        convert::job_spec(&pinned, now).ok().map(|mut core| {
            core.callers = service::caller_shares(spec);
            core
        })
    } else {
        None
    };
    let pinned_json = serde_json::to_string(&pinned)
        .map_err(|e| StoreError::Corrupt(format!("replica spec: {e}")))?;
    // Validated when the service was deployed; a spec the job rules refuse now (a rule that
    // changed since) starts nothing and says why.
    let core = match convert::job_spec(&wire, now) {
        Ok(mut core) => {
            core.callers = service::caller_shares(spec);
            core
        }
        Err(e) => {
            let message = format!("cannot start replicas: {e}");
            app.store
                .append_service_event(record.id, "replica_refused", &message, None, now)
                .await?;
            return Ok(());
        }
    };
    let spec_json = serde_json::to_string(&wire)
        .map_err(|e| StoreError::Corrupt(format!("replica spec: {e}")))?;
    let mut started = Vec::new();
    for i in 0..count {
        let (core, spec_json) = match &pinned_core {
            Some(pinned) if i < must => (pinned, &pinned_json),
            _ => (&core, &spec_json),
        };
        let job = NewJob {
            id: JobId(Uuid::now_v7()),
            spec: core.clone(),
            spec_json: spec_json.clone(),
            submitted_at: now,
            trace_parent: None,
            replica: Some(ReplicaOf {
                service: record.id,
                version: record.spec_version,
                serve: service::serve_spec(spec),
            }),
        };
        app.store.insert_job(&job).await?;
        if let Some(node) = &avoid {
            // Before the scheduler hears of it: its first plan already keeps it off.
            app.spread
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(job.id, vec![node.clone()]);
        }
        if let Some(job) = app.store.job(job.id).await? {
            started.push(job.id);
            app.scheduler
                .send(SchedulerEvent::JobSubmitted(Box::new(job)));
        }
    }
    let ids: Vec<String> = started.iter().map(|j| j.to_string()).collect();
    let message = format!(
        "started {} replica{} of version {} ({})",
        started.len(),
        if started.len() == 1 { "" } else { "s" },
        record.spec_version,
        ids.join(", ")
    );
    app.store
        .append_service_event(record.id, "replica_started", &message, None, now)
        .await?;
    Ok(())
}

async fn stop_replica(app: &App, service: Uuid, job: JobId, why: &str) -> Result<(), StoreError> {
    let now = app.clock.now();
    match app.store.cancel_job(job, now).await? {
        CancelOutcome::Cancelled { .. } => app.scheduler.send(SchedulerEvent::JobRemoved(job)),
        CancelOutcome::Stopping { nodes, .. } => {
            for node in &nodes {
                app.agents.wake(node);
            }
        }
        CancelOutcome::NotFound | CancelOutcome::AlreadyFinished(_) => return Ok(()),
    }
    let message = format!("stopping replica {job}: {why}");
    app.store
        .append_service_event(service, "replica_drained", &message, None, now)
        .await?;
    Ok(())
}
