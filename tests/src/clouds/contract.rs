//! The contract every [`Provider`] passes, against its fake cloud (GCE, Azure, Lambda) or
//! moto (EC2): launch, find again by tag, terminate, list, every error class, and no leak
//! under faults. One suite, so a provider cannot quietly do less than the others.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::{FakeCloud, Fault};
use std::time::{Duration, Instant};
use switchyard_core::{Market, PoolId};
use switchyard_providers::{InstanceInfo, InstanceState, LaunchRequest, Provider, ProviderError};

/// What the suite needs to know about the provider under test.
pub struct Setup<'a> {
    pub provider: &'a dyn Provider,
    pub cloud: &'a dyn FakeCloud,
    /// A pool the provider offers, on demand.
    pub pool: PoolId,
    /// A pool to launch spot in, where the cloud has spot (Lambda has none).
    pub spot_pool: Option<PoolId>,
    /// A pool in a configured region whose instance type the cloud does not have.
    pub unknown_type_pool: PoolId,
    /// The longest one provider call may take under [`Fault::SlowOperations`] and
    /// [`Fault::Hang`] (its request timeout and operation wait, with their retries).
    pub call_bound: Duration,
    /// Longer than `call_bound`: what the suite injects as slow operations and hangs.
    pub slow: Duration,
    /// Where the launched agents find the broker (the bootstrap carries it).
    pub broker_url: String,
}

fn request(setup: &Setup<'_>, key: &str, pool: &PoolId, market: Market) -> LaunchRequest {
    LaunchRequest {
        pool: pool.clone(),
        market,
        instance_key: key.into(),
        enrolment_token: format!("enrol-{key}"),
        broker_url: setup.broker_url.clone(),
    }
}

fn live_for<'a>(all: &'a [InstanceInfo], key: &str) -> Vec<&'a InstanceInfo> {
    all.iter()
        .filter(|i| i.instance_key == key && i.state != InstanceState::Terminated)
        .collect()
}

async fn list(setup: &Setup<'_>) -> Vec<InstanceInfo> {
    setup.provider.list().await.expect("list")
}

/// Runs the whole suite; panics with what broke.
pub async fn run(setup: Setup<'_>) {
    let p = setup.provider;
    let cloud = setup.cloud;
    let name = p.name().to_string();

    // Offers: the pool is offered, priced.
    let offers = p.offers().await.expect("offers");
    let offered = offers
        .pools
        .iter()
        .find(|o| o.id == setup.pool)
        .unwrap_or_else(|| panic!("{name}: {} is not offered", setup.pool));
    assert!(
        offered.on_demand_per_hour > switchyard_core::Money::ZERO,
        "{name}: {offered:?}"
    );

    // Launch, idempotent on the key; listed with its key, pool and market.
    let a = p
        .launch(&request(
            &setup,
            "contract-a",
            &setup.pool,
            Market::OnDemand,
        ))
        .await
        .expect("launch contract-a");
    assert_eq!(a.instance_key, "contract-a");
    assert_eq!(a.pool, setup.pool);
    assert_eq!(a.market, Market::OnDemand);
    assert_ne!(a.state, InstanceState::Terminated);
    assert!(
        cloud.live_instances().contains(&a.provider_id),
        "{name}: {a:?} not in the cloud"
    );
    let again = p
        .launch(&request(
            &setup,
            "contract-a",
            &setup.pool,
            Market::OnDemand,
        ))
        .await
        .expect("launch contract-a again");
    assert_eq!(
        again.provider_id, a.provider_id,
        "{name}: a second launch of one key"
    );
    let listed = list(&setup).await;
    let found = live_for(&listed, "contract-a");
    assert_eq!(found.len(), 1, "{name}: {listed:?}");
    assert_eq!(found[0].provider_id, a.provider_id);
    assert_eq!(found[0].pool, setup.pool);

    let mut launched = vec![a.provider_id.clone()];
    if let Some(spot) = &setup.spot_pool {
        let s = p
            .launch(&request(&setup, "contract-spot", spot, Market::Spot))
            .await
            .expect("launch spot");
        assert_eq!(s.market, Market::Spot, "{name}: {s:?}");
        let listed = list(&setup).await;
        let found = live_for(&listed, "contract-spot");
        assert_eq!(found.len(), 1, "{name}: {listed:?}");
        assert_eq!(found[0].market, Market::Spot);
        launched.push(s.provider_id);
    }

    // Throttling: a few 429s are retried inside the call; a storm is reported as throttled.
    cloud.inject(Fault::Throttle(2));
    let t = p
        .launch(&request(
            &setup,
            "contract-throttled",
            &setup.pool,
            Market::OnDemand,
        ))
        .await
        .expect("two 429s are retried");
    launched.push(t.provider_id);
    cloud.clear_faults();
    cloud.inject(Fault::Throttle(10_000));
    let storm = p
        .launch(&request(
            &setup,
            "contract-storm",
            &setup.pool,
            Market::OnDemand,
        ))
        .await;
    assert!(
        matches!(storm, Err(ProviderError::Throttled(_))),
        "{name}: a 429 storm gave {storm:?}"
    );
    cloud.clear_faults();
    assert!(live_for(&list(&setup).await, "contract-storm").is_empty());

    // Capacity and quota: classified, and nothing is left behind (an Azure NIC included).
    let before = cloud.live_instances();
    for (fault, key) in [
        (Fault::Capacity, "contract-capacity"),
        (Fault::Quota, "contract-quota"),
    ] {
        cloud.inject(fault.clone());
        let r = p
            .launch(&request(&setup, key, &setup.pool, Market::OnDemand))
            .await;
        cloud.clear_faults();
        match (&fault, &r) {
            (Fault::Capacity, Err(ProviderError::Capacity { pool, .. }))
            | (Fault::Quota, Err(ProviderError::Quota { pool, .. })) => {
                assert_eq!(pool, &setup.pool, "{name}: {r:?}");
            }
            _ => panic!("{name}: {fault:?} gave {r:?}"),
        }
        assert!(
            live_for(&list(&setup).await, key).is_empty(),
            "{name}: {key}"
        );
        eventually_equal(cloud, &before, &format!("{name}: after {fault:?}")).await;
    }

    // An instance type the cloud does not have: refused, not retried.
    let r = p
        .launch(&request(
            &setup,
            "contract-unknown",
            &setup.unknown_type_pool,
            Market::OnDemand,
        ))
        .await;
    assert!(
        matches!(
            r,
            Err(ProviderError::Rejected(_) | ProviderError::UnknownPool(_))
        ),
        "{name}: an unknown instance type gave {r:?}"
    );

    // Revoked credentials.
    cloud.inject(Fault::Unauthorized);
    let r = p.list().await;
    assert!(
        matches!(r, Err(ProviderError::Auth(_))),
        "{name}: a 401 gave {r:?}"
    );
    cloud.clear_faults();

    // A lost answer: the call fails, the instance exists, and the same key finds it again.
    cloud.inject(Fault::LoseNextLaunchAnswer);
    let lost = p
        .launch(&request(
            &setup,
            "contract-lost",
            &setup.pool,
            Market::OnDemand,
        ))
        .await;
    cloud.clear_faults();
    let listed = list(&setup).await;
    let found = live_for(&listed, "contract-lost");
    assert_eq!(
        found.len(),
        1,
        "{name}: after a lost answer ({lost:?}): {listed:?}"
    );
    let adopted = p
        .launch(&request(
            &setup,
            "contract-lost",
            &setup.pool,
            Market::OnDemand,
        ))
        .await
        .expect("relaunch after a lost answer");
    assert_eq!(
        adopted.provider_id, found[0].provider_id,
        "{name}: a second instance"
    );
    launched.push(adopted.provider_id);

    // Slow operations and hangs: every call is bounded, and at most one instance per key.
    for (fault, key) in [
        (Fault::SlowOperations(setup.slow), "contract-slow"),
        (Fault::Hang(setup.slow), "contract-hang"),
    ] {
        cloud.inject(fault.clone());
        let started = Instant::now();
        let r = p
            .launch(&request(&setup, key, &setup.pool, Market::OnDemand))
            .await;
        let took = started.elapsed();
        cloud.clear_faults();
        assert!(
            took <= setup.call_bound,
            "{name}: {fault:?}: the launch took {took:?} (bound {:?}): {r:?}",
            setup.call_bound
        );
        if let Err(e) = &r {
            assert!(
                matches!(e, ProviderError::Transient(_)),
                "{name}: {fault:?} gave {e:?}"
            );
        }
        // The hung request may still land; wait it out, then there is at most one.
        tokio::time::sleep(setup.slow.saturating_sub(took) + Duration::from_millis(200)).await;
        let listed = list(&setup).await;
        let found = live_for(&listed, key);
        assert!(found.len() <= 1, "{name}: {fault:?}: {listed:?}");
        launched.extend(found.iter().map(|i| i.provider_id.clone()));
    }

    // The cloud reclaims an instance: it leaves the list, and terminating it still succeeds.
    cloud.vanish(&launched[0]);
    let listed = list(&setup).await;
    assert!(
        !listed
            .iter()
            .any(|i| i.provider_id == launched[0] && i.state != InstanceState::Terminated),
        "{name}: a vanished instance is still listed: {listed:?}"
    );
    p.terminate(&launched[0])
        .await
        .expect("terminating a vanished instance");

    // Terminate everything (twice: the second is a no-op); nothing is left in the cloud.
    for i in list(&setup).await {
        p.terminate(&i.provider_id).await.expect("terminate");
        p.terminate(&i.provider_id).await.expect("terminate again");
    }
    eventually_equal(cloud, &[], &format!("{name}: after terminating everything")).await;
    let listed = list(&setup).await;
    assert!(
        listed.iter().all(|i| i.state == InstanceState::Terminated),
        "{name}: {listed:?}"
    );
    let invalid = cloud.invalid_requests();
    assert!(
        invalid.is_empty(),
        "{name}: requests outside the API description: {invalid:#?}"
    );
}

/// Waits (up to 30 s: deletes are asynchronous) until the cloud holds exactly `expected`.
async fn eventually_equal(cloud: &dyn FakeCloud, expected: &[String], what: &str) {
    let mut expected = expected.to_vec();
    expected.sort();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut live = cloud.live_instances();
        live.sort();
        if live == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the cloud holds {live:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
