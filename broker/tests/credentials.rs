//! A cloud whose credentials check failed at start (`serve`'s `add_cloud`): its pools are
//! unlaunchable — the scheduler plans no launch there, a job that must burst goes to another
//! cloud or waits — and `GET /pools` says why.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_broker::app::{ProviderSet, catalogue_from_config};
use switchyard_broker::clock::Clock;
use switchyard_core::PoolId;
use switchyard_providers::Offers;
use switchyard_providers::fake::FakeProvider;

const REVOKED: &str = "not authorised: key revoked";

/// Every pool as `GET /pools` shows it, by id.
async fn pool(app: &TestApp, id: &str) -> Value {
    let r = app
        .call(Method::GET, "/api/v1/pools", Some(&app.admin), None)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    r.body["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} missing: {}", r.body))
}

/// [`spawn_two_clouds`]' pools, each behind its own fake provider: [`CHEAP`] behind
/// `fake-aws`, whose credentials check failed, [`DEAR`] behind `fake-gcp`, whose worked.
async fn spawn_one_cloud_revoked() -> (TestApp, Arc<FakeProvider>, Arc<FakeProvider>) {
    let slot: Arc<Mutex<Vec<Arc<FakeProvider>>>> = Arc::default();
    let out = slot.clone();
    let clock = Clock::system();
    let now = clock.now();
    let app = TestApp::spawn_with_clock(
        clock,
        |c| {
            c.burst_enabled = true;
            c.lease_ttl_s = 600;
            c.idle_ttl_s = 1;
            c.min_billed_s = 0;
            c.regions.push(cloud_region("aws:test-east"));
            c.regions.push(cloud_region("gcp:test-west"));
            c.pools.push(cloud_pool(CHEAP, "aws:test-east", 4.0));
            c.pools.push(cloud_pool(DEAR, "gcp:test-west", 5.0));
        },
        move |config| {
            let offers = catalogue_from_config(config, now).unwrap();
            let mut set = ProviderSet::default();
            for (name, pool, check) in [
                ("fake-aws", CHEAP, Err(REVOKED.to_string())),
                ("fake-gcp", DEAR, Ok(())),
            ] {
                let (region, pools): (Vec<_>, Vec<_>) = offers
                    .iter()
                    .flat_map(|(r, ps)| ps.iter().map(move |p| (r.clone(), p.clone())))
                    .filter(|(_, p)| p.id.as_str() == pool)
                    .unzip();
                let fake = Arc::new(FakeProvider::new(
                    name,
                    Offers {
                        regions: region,
                        pools,
                    },
                ));
                set.add(fake.clone(), [PoolId(pool.into())]);
                set.set_credentials(name, check);
                slot.lock().unwrap().push(fake);
            }
            set
        },
    )
    .await;
    let mut fakes = std::mem::take(&mut *out.lock().unwrap());
    let gcp = fakes.pop().unwrap();
    let aws = fakes.pop().unwrap();
    (app, aws, gcp)
}

/// The cheaper cloud's credentials failed: the job that must burst launches in the dearer one,
/// never in the cheaper, and `GET /pools` names the reason for the cheaper pool only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_must_burst_skips_the_cloud_whose_credentials_failed() {
    let (app, aws, gcp) = spawn_one_cloud_revoked().await;

    let cheap = pool(&app, CHEAP).await;
    assert_eq!(cheap["launchable"], true, "{cheap}");
    assert_eq!(
        cheap["unlaunchable_reason"],
        format!("credentials check failed: {REVOKED}"),
        "{cheap}"
    );
    let dear = pool(&app, DEAR).await;
    assert_eq!(dear["launchable"], true, "{dear}");
    assert!(dear.get("unlaunchable_reason").is_none(), "{dear}");

    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent("burst")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Cheaper by $1 per GPU-hour, the revoked cloud would win if it could launch.
    eventually(
        "a launch in the cloud whose credentials work",
        20,
        async || gcp.launches().into_iter().find(|l| l.pool.as_str() == DEAR),
    )
    .await;
    assert!(aws.launches().is_empty(), "{:?}", aws.launches());
    assert_eq!(app.job(&dev, &id).await.body["state"], "provisioning");
    let launched: Vec<_> = instances(&app)
        .await
        .into_iter()
        .map(|i| i["pool"].clone())
        .collect();
    assert_eq!(launched, vec![Value::from(DEAR)]);
}

/// The only cloud's credentials failed: the job that must burst waits, and nothing is
/// launched, round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_cloud_revoked_a_job_that_must_burst_waits() {
    let (app, fake) = spawn_with_fake_checked(Clock::system(), Err(REVOKED.into()), |c| {
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CHEAP, "aws:test-east", 4.0));
    })
    .await;
    let cheap = pool(&app, CHEAP).await;
    assert_eq!(
        cheap["unlaunchable_reason"],
        format!("credentials check failed: {REVOKED}"),
        "{cheap}"
    );

    let dev = app.token("developer", Some("ml")).await;
    let id = app.submit(&dev, urgent("waits")).await.body["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Planned (a round explained it), and not as a launch.
    let explained = eventually("a round that planned the job", 20, async || {
        let r = app
            .call(
                Method::GET,
                &format!("/api/v1/jobs/{id}/placement"),
                Some(&dev),
                None,
            )
            .await;
        (r.status == StatusCode::OK).then_some(r.body)
    })
    .await;
    assert_ne!(explained["outcome"]["decision"], "launch", "{explained}");
    // Later rounds launch nothing either.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fake.launches().is_empty(), "{:?}", fake.launches());
    assert!(instances(&app).await.is_empty());
    assert_eq!(app.job(&dev, &id).await.body["state"], "queued");
}

/// With working credentials the same pool shows no reason: the reason is the failed check,
/// not the pool.
#[tokio::test]
async fn a_pool_whose_credentials_worked_shows_no_reason() {
    let (app, _fake) = spawn_with_fake_checked(Clock::system(), Ok(()), |c| {
        c.regions.push(cloud_region("aws:test-east"));
        c.pools.push(cloud_pool(CHEAP, "aws:test-east", 4.0));
    })
    .await;
    let cheap = pool(&app, CHEAP).await;
    assert_eq!(cheap["launchable"], true, "{cheap}");
    assert!(cheap.get("unlaunchable_reason").is_none(), "{cheap}");
}
