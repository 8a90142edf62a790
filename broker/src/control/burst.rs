//! The burst controller: makes the instances the scheduler asked for exist, and no others.
//!
//! Level-triggered and idempotent: each pass reads the instances table and the providers'
//! listings, not the event that woke it, and closes the gap —
//! - `requested` → launch through the pool's provider (one enrolment token per instance; the
//!   instance id is the provider's idempotency key, so a retried launch starts one machine);
//!   capacity or quota errors back the pool off and send the job back to the planner, which
//!   picks the next feasible region; throttling and transient errors retry with backoff;
//!   every provider call is bounded by `provider_call_timeout_ms`, and the launches of one
//!   pass run side by side, so one hanging call delays nobody else's;
//! - a launch whose answer was lost (a timeout or an error after the provider did the work) is
//!   not a second machine: the retry uses the same key, and before giving an instance up after
//!   such a failure the controller looks for it by its tag and adopts it if it exists;
//! - `booting` past the boot timeout → terminated, its job re-planned;
//! - `ready` on a node with a sticky unhealthy GPU (a fatal XID or uncorrectable ECC errors,
//!   `rules/health.rs`; an overheat clears itself and is waited out) → replaced: the node
//!   drains and the instance becomes `draining`; once no work is left on it (requeued by the
//!   health rules or finished) it is terminated, and the planner launches a fresh one for
//!   whatever waits ([`replace_sick`]);
//! - `ready` with nothing running → idle; idle past the TTL (and past the provider's minimum
//!   billed time, which is paid anyway) → terminated, its lifetime cost written to the ledger;
//! - the orphan reaper: every tagged instance a provider lists that the broker does not know
//!   (or knows as ended) is terminated, and so is a second machine under a known key; one it
//!   still thinks it is launching is adopted (its launch answer was lost); every live instance
//!   the provider no longer has is marked gone and its work requeued. A failed terminate is
//!   retried on the next pass: an instance is marked ended only once its provider confirmed
//!   the terminate (or no longer lists it).
//!
//! It never decides what to launch: that is the planner's job.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use switchyard_core::Timestamp;
use switchyard_providers::{LaunchRequest, ProviderError};

use crate::control::scheduler::SchedulerEvent;
use crate::http::api::tokens::issue_enrolment_token;
use crate::state::App;
use crate::store::{InstanceRecord, InstanceState, LaunchFailure, StoreError};

/// How often providers are listed for orphans and vanished instances.
const REAP_EVERY: Duration = Duration::from_secs(5);
/// How long one provider call may take before it counts as a transient failure.
fn call_timeout(app: &App) -> Duration {
    Duration::from_millis(app.config.provider_call_timeout_ms.max(1))
}

/// The controller loop, for the life of the process; it acts only while this replica leads.
/// A pass runs when the scheduler asks for launches, every second, and when a manual clock
/// moves.
pub async fn run(app: App) {
    let mut last_reap: Option<Instant> = None;
    let mut moves = app.clock.moves();
    loop {
        if !app.leadership.is_leader() {
            app.leadership.until_leader().await;
            // A new leader looks at everything at once, orphans included.
            last_reap = None;
        }
        let reap = last_reap.is_none_or(|t| t.elapsed() >= REAP_EVERY);
        if reap {
            last_reap = Some(Instant::now());
        }
        match reconcile(&app, reap).await {
            Ok(true) => app.scheduler.send(SchedulerEvent::InstancesChanged),
            Ok(false) => {}
            Err(e @ StoreError::Fenced { .. }) => {
                app.leadership.step_down(app.store.as_ref(), &e.to_string());
            }
            Err(e) => tracing::error!(error = %e, "burst reconcile failed"),
        }
        tokio::select! {
            _ = app.burst.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = moves.next() => {}
        }
    }
}

/// One pass. Returns whether anything the scheduler mirrors changed.
pub async fn reconcile(app: &App, reap: bool) -> Result<bool, StoreError> {
    let now = app.clock.now();
    let instances = app.store.instances(false).await?;
    let busy: HashSet<String> = app
        .store
        .live_attempts()
        .await?
        .into_iter()
        .map(|a| a.node.to_string())
        .collect();
    // Nodes of live instances with a sticky GPU mark, and its reason: those are replaced.
    let sick: HashMap<String, String> = if instances.iter().any(|i| {
        matches!(i.state, InstanceState::Ready | InstanceState::Draining) && i.node.is_some()
    }) {
        app.store
            .nodes()
            .await?
            .into_iter()
            .filter_map(|n| {
                crate::rules::health::first_sticky(&n.gpu_marks)
                    .map(|m| (n.id.to_string(), m.reason.clone()))
            })
            .collect()
    } else {
        HashMap::new()
    };
    let mut changed = false;
    // Launches side by side: a provider call that hangs until its timeout holds up no other.
    let launches = instances
        .iter()
        .filter(|i| i.state == InstanceState::Requested && i.next_attempt_at <= now)
        .map(|inst| async move {
            let span = tracing::info_span!("instance.launch", instance.id = %inst.id, pool.id = %inst.pool);
            if let Some(job) = inst.for_job {
                crate::trace::join_job(app, &span, job).await;
            }
            tracing::Instrument::instrument(launch(app, inst), span).await
        });
    for launched in futures::future::join_all(launches).await {
        changed |= launched?;
    }
    for inst in &instances {
        changed |= match inst.state {
            InstanceState::Requested => false,
            InstanceState::Booting => {
                let booting_for = inst.launched_at.map_or(0, |t| now.secs_since(t));
                if booting_for >= app.config.boot_timeout_s as i64 {
                    tracing::warn!(instance.id = %inst.id, pool.id = %inst.pool, booting_for_s = booting_for, "boot timeout");
                    end(
                        app,
                        inst,
                        Some("boot timeout: the agent never enrolled"),
                        true,
                    )
                    .await?
                } else {
                    false
                }
            }
            InstanceState::Ready | InstanceState::Draining => {
                match inst
                    .node
                    .as_ref()
                    .and_then(|n| Some((n, sick.get(n.as_str())?)))
                {
                    Some((node, reason)) => replace_sick(app, inst, node, reason, &busy).await?,
                    None => idle_check(app, inst, &busy, now).await?,
                }
            }
            InstanceState::Terminated => false,
        };
    }
    if reap {
        changed |= reap_orphans(app).await?;
    }
    Ok(changed)
}

async fn launch(app: &App, inst: &InstanceRecord) -> Result<bool, StoreError> {
    let now = app.clock.now();
    let Some(provider) = app.providers.for_pool(&inst.pool) else {
        let failure = LaunchFailure::GiveUp {
            pool_backoff_until: None,
        };
        app.store
            .instance_launch_failed(&inst.id, "no provider launches this pool", failure, now)
            .await?;
        return Ok(true);
    };
    let ttl = (app.config.boot_timeout_s as i64).max(60) + 300;
    let (token, record) = issue_enrolment_token(&inst.pool, Some(&inst.id), ttl, now);
    app.store.insert_enrolment_token(&record).await?;
    let audit =
        crate::http::api::audit::system_enrolment("system:burst", &inst.pool, &inst.id, &record);
    app.store.append_audit(&audit).await?;
    let request = LaunchRequest {
        pool: inst.pool.clone(),
        market: inst.market,
        instance_key: inst.id.clone(),
        enrolment_token: token,
        broker_url: app.config.public_url(),
    };
    let started = Instant::now();
    let timeout = call_timeout(app);
    let result = match tokio::time::timeout(timeout, provider.launch(&request)).await {
        Ok(r) => r,
        Err(_) => Err(ProviderError::Transient(format!(
            "launch took longer than {} ms",
            timeout.as_millis()
        ))),
    };
    let launch_ms = started.elapsed().as_millis() as u64;
    match result {
        Ok(info) => {
            tracing::info!(instance.id = %inst.id, pool.id = %inst.pool, provider = provider.name(), provider_id = %info.provider_id, launch_ms, "instance launched");
            app.store
                .instance_launched(&inst.id, &info.provider_id, app.clock.now())
                .await?;
            Ok(false)
        }
        Err(e) => {
            let attempts = inst.launch_attempts + 1;
            let next = match &e {
                ProviderError::Capacity { .. } | ProviderError::Quota { .. } => {
                    LaunchFailure::GiveUp {
                        pool_backoff_until: Some(now.plus_secs(app.config.pool_backoff_s as i64)),
                    }
                }
                ProviderError::Throttled(_) | ProviderError::Transient(_)
                    if attempts < app.config.launch_attempts =>
                {
                    // 1 s, 2 s, 4 s… capped at a minute.
                    let delay = 1i64 << attempts.min(6);
                    LaunchFailure::RetryAt(now.plus_secs(delay))
                }
                _ => LaunchFailure::GiveUp {
                    pool_backoff_until: None,
                },
            };
            let give_up = matches!(next, LaunchFailure::GiveUp { .. });
            // A failure after an earlier ambiguous one (or an ambiguous one itself: a timeout,
            // a 5xx) may hide a machine that started anyway. Before giving the instance up —
            // which sends its job back to the planner and so to a second machine — look for it
            // by its tag, and adopt it if it is there.
            let ambiguous = inst.launch_attempts > 0
                || matches!(e, ProviderError::Transient(_) | ProviderError::Throttled(_));
            if give_up
                && ambiguous
                && let Ok(Some(found)) = find_by_key(app, provider.as_ref(), &inst.id).await
            {
                tracing::warn!(instance.id = %inst.id, pool.id = %inst.pool, provider_id = %found.provider_id, error = %e, "launch reported a failure but the instance exists; adopting it");
                app.store
                    .instance_launched(&inst.id, &found.provider_id, app.clock.now())
                    .await?;
                return Ok(false);
            }
            tracing::warn!(instance.id = %inst.id, pool.id = %inst.pool, error = %e, attempts, next = ?next, "launch failed");
            app.store
                .instance_launch_failed(&inst.id, &e.to_string(), next, now)
                .await?;
            Ok(give_up)
        }
    }
}

/// The live instance `provider` lists under `instance_key`, if any (`None` when listing fails).
/// The live machine tagged with `instance_key`, if the provider lists one; `Err` when the list
/// could not be read (failed or timed out), which is not the same as "not there".
async fn find_by_key(
    app: &App,
    provider: &dyn switchyard_providers::Provider,
    instance_key: &str,
) -> Result<Option<switchyard_providers::InstanceInfo>, ()> {
    match tokio::time::timeout(call_timeout(app), provider.list()).await {
        Ok(Ok(listed)) => Ok(listed.into_iter().find(|i| {
            i.instance_key == instance_key
                && i.state != switchyard_providers::InstanceState::Terminated
        })),
        Ok(Err(e)) => {
            tracing::warn!(provider = provider.name(), error = %e, "listing instances failed");
            Err(())
        }
        Err(_) => {
            tracing::warn!(provider = provider.name(), "listing instances timed out");
            Err(())
        }
    }
}

async fn idle_check(
    app: &App,
    inst: &InstanceRecord,
    busy: &HashSet<String>,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let Some(node) = &inst.node else {
        return Ok(false);
    };
    if busy.contains(node.as_str()) {
        if inst.idle_since.is_some() {
            app.store.set_instance_idle(&inst.id, None).await?;
        }
        return Ok(false);
    }
    let Some(idle_since) = inst.idle_since else {
        app.store.set_instance_idle(&inst.id, Some(now)).await?;
        return Ok(false);
    };
    let idle_until = idle_since.plus_secs(app.config.idle_ttl_s as i64);
    // An instance whose agent enrolled before its launch answer came back (it was lost) has no
    // launch time; it has been paid for since it was ready at the latest.
    let paid_until = inst
        .launched_at
        .or(inst.ready_at)
        .unwrap_or(now)
        .plus_secs(app.config.min_billed_s as i64);
    if now < idle_until.max(paid_until) {
        return Ok(false);
    }
    let idle_s = now.secs_since(idle_since);
    tracing::info!(instance.id = %inst.id, idle_s, "instance idle past its TTL; terminating");
    end(
        app,
        inst,
        Some(&format!("idle: no job for {idle_s} s")),
        false,
    )
    .await
}

/// An instance whose node has a sick GPU: drained (idempotent), then terminated once nothing
/// runs on it, without waiting for the idle TTL: nothing should run there again.
async fn replace_sick(
    app: &App,
    inst: &InstanceRecord,
    node: &switchyard_core::NodeId,
    reason: &str,
    busy: &HashSet<String>,
) -> Result<bool, StoreError> {
    let drained = app
        .store
        .drain_for_replacement(&inst.id, node, app.clock.now())
        .await?;
    if drained {
        tracing::warn!(instance.id = %inst.id, node.id = %node, reason,
            "instance has a sick GPU: draining it for replacement");
    }
    if busy.contains(node.as_str()) {
        return Ok(drained);
    }
    let ended = end(app, inst, Some(&format!("replaced: {reason}")), true).await?;
    Ok(drained || ended)
}

/// Terminates at the provider first, then records the end: an instance is never marked ended
/// while it may still be running (and billing).
async fn end(
    app: &App,
    inst: &InstanceRecord,
    reason: Option<&str>,
    error: bool,
) -> Result<bool, StoreError> {
    let provider = app.providers.for_pool(&inst.pool);
    // No provider id: the launch answer was lost and the agent enrolled anyway. The machine is
    // found by its tag.
    let provider_id = match (&inst.provider_id, &provider) {
        (Some(id), _) => Some(id.clone()),
        (None, Some(p)) if inst.ready_at.is_some() => {
            match find_by_key(app, p.as_ref(), &inst.id).await {
                Ok(found) => found.map(|i| i.provider_id),
                Err(()) => {
                    tracing::warn!(instance.id = %inst.id, "cannot list the provider to find the instance; will retry");
                    return Ok(false);
                }
            }
        }
        (None, _) => None,
    };
    if let (Some(provider_id), Some(provider)) = (&provider_id, &provider) {
        match tokio::time::timeout(call_timeout(app), provider.terminate(provider_id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(instance.id = %inst.id, error = %e, "terminate failed; will retry");
                return Ok(false);
            }
            Err(_) => {
                tracing::warn!(instance.id = %inst.id, "terminate timed out; will retry");
                return Ok(false);
            }
        }
    }
    let ended = app
        .store
        .end_instance(
            &inst.id,
            reason,
            error,
            app.config.min_billed_s as i64,
            app.clock.now(),
        )
        .await?;
    if ended {
        tracing::info!(instance.id = %inst.id, pool.id = %inst.pool, reason = reason.unwrap_or(""), "instance terminated");
        if let Some(node) = &inst.node {
            app.agents.wake(node);
        }
    }
    Ok(ended)
}

/// Terminates tagged instances the broker does not know; ends known ones the provider lost.
async fn reap_orphans(app: &App) -> Result<bool, StoreError> {
    let all = app.store.instances(true).await?;
    let known: HashMap<&str, &InstanceRecord> = all.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut changed = false;
    for provider in app.providers.all() {
        let listed = match tokio::time::timeout(call_timeout(app), provider.list()).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                tracing::warn!(provider = provider.name(), error = %e, "listing instances failed");
                continue;
            }
            Err(_) => continue,
        };
        let mut seen = HashSet::new();
        for info in &listed {
            seen.insert(info.provider_id.as_str());
            if info.state == switchyard_providers::InstanceState::Terminated {
                continue;
            }
            let orphan = match known.get(info.instance_key.as_str()) {
                None => true,
                Some(k)
                    if k.state == InstanceState::Requested
                        || (k.provider_id.is_none() && k.state != InstanceState::Terminated) =>
                {
                    // The launch happened but its answer was lost (the agent may even have
                    // enrolled already): adopt the machine rather than start another.
                    tracing::warn!(instance.id = %k.id, provider_id = %info.provider_id, "adopting an instance whose launch answer was lost");
                    app.store
                        .instance_launched(&k.id, &info.provider_id, app.clock.now())
                        .await?;
                    changed = true;
                    false
                }
                // A second machine under a live instance's key (a retried launch that an API
                // without idempotency tokens ran twice): not the one the broker uses.
                Some(k) => {
                    k.state == InstanceState::Terminated
                        || k.provider_id
                            .as_deref()
                            .is_some_and(|p| p != info.provider_id)
                }
            };
            if orphan {
                tracing::warn!(provider = provider.name(), provider_id = %info.provider_id, instance.key = %info.instance_key, "terminating an instance the broker does not own");
                match tokio::time::timeout(call_timeout(app), provider.terminate(&info.provider_id))
                    .await
                {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(provider_id = %info.provider_id, error = %e, "orphan terminate failed; will retry");
                    }
                    Err(_) => {
                        tracing::warn!(provider_id = %info.provider_id, "orphan terminate timed out; will retry");
                    }
                }
            }
        }
        for inst in all.iter().filter(|i| {
            matches!(
                i.state,
                InstanceState::Booting | InstanceState::Ready | InstanceState::Draining
            )
        }) {
            let Some(pid) = &inst.provider_id else {
                continue;
            };
            let ours = app
                .providers
                .for_pool(&inst.pool)
                .is_some_and(|p| std::ptr::addr_eq(p.as_ref(), provider.as_ref()));
            if ours && !seen.contains(pid.as_str()) {
                tracing::warn!(instance.id = %inst.id, provider_id = %pid, "the provider no longer has this instance");
                changed |= app
                    .store
                    .end_instance(
                        &inst.id,
                        Some("gone: the provider no longer lists it"),
                        true,
                        app.config.min_billed_s as i64,
                        app.clock.now(),
                    )
                    .await?;
            }
        }
    }
    Ok(changed)
}
