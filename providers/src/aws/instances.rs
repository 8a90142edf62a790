//! EC2 instances as Switchyard sees them: the tags that mark ours, the `DescribeInstances`
//! queries that find them, the mapping of an EC2 instance to an [`InstanceInfo`], the
//! idempotency client token, and `TerminateInstances`.

use super::error::{Class, Failure, classify};
use crate::retry::Backoff;
use crate::{INSTANCE_TAG, InstanceInfo, InstanceState};
use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{Filter, Instance, InstanceLifecycleType, InstanceStateName};
use sha2::{Digest, Sha256};
use switchyard_core::{Market, PoolId};

pub const CLUSTER_TAG: &str = "switchyard:cluster";
pub const POOL_TAG: &str = "switchyard:pool";

/// States of an instance that still exists (costs money or may come back).
pub(crate) const LIVE_STATES: [&str; 5] =
    ["pending", "running", "stopping", "stopped", "shutting-down"];

/// EC2's idempotency token for a launch: derived from the cluster and the instance key, so
/// a retried or repeated launch of one key is one instance, and two clusters in one account
/// never collide. EC2 takes at most 64 ASCII characters; this is 51.
pub(crate) fn client_token(cluster: &str, instance_key: &str) -> String {
    let digest = Sha256::new()
        .chain_update(cluster.as_bytes())
        .chain_update([0u8])
        .chain_update(instance_key.as_bytes())
        .finalize();
    format!("sy-{}", &hex::encode(digest)[..48])
}

/// The instance as a provider reports it; `None` without an instance id. An instance that
/// lost its Switchyard tags still shows (with an empty key), so the reaper can end it.
pub(crate) fn info_of(instance: &Instance, region: &str) -> Option<InstanceInfo> {
    let id = instance.instance_id()?;
    let tag = |key: &str| {
        instance
            .tags()
            .iter()
            .find(|t| t.key() == Some(key))
            .and_then(|t| t.value())
    };
    let pool = match (tag(POOL_TAG), instance.instance_type()) {
        (Some(pool), _) => PoolId::new(pool),
        (None, Some(t)) => {
            crate::catalogue::pool_id(&crate::catalogue::region_id("aws", region), t.as_str())
        }
        (None, None) => PoolId::new(format!("aws:{region}/unknown")),
    };
    let market = match instance.instance_lifecycle() {
        Some(InstanceLifecycleType::Spot) => Market::Spot,
        _ => Market::OnDemand,
    };
    Some(InstanceInfo {
        provider_id: id.to_owned(),
        instance_key: tag(INSTANCE_TAG).unwrap_or_default().to_owned(),
        pool,
        market,
        state: state_of(instance.state().and_then(|s| s.name())),
    })
}

/// pending → Pending; running → Running; everything on its way out or stopped → Terminated
/// (no agent will run there; a stopped instance is still listed so the reaper can end it).
pub(crate) fn state_of(name: Option<&InstanceStateName>) -> InstanceState {
    match name {
        Some(InstanceStateName::Pending) => InstanceState::Pending,
        Some(InstanceStateName::Running) => InstanceState::Running,
        _ => InstanceState::Terminated,
    }
}

pub(crate) fn filter(name: &str, values: &[&str]) -> Filter {
    values
        .iter()
        .fold(Filter::builder().name(name), |b, v| b.values(*v))
        .build()
}

/// Every live instance matching `filters` in the client's region, all pages.
pub(crate) async fn describe(
    client: &Client,
    backoff: &Backoff,
    filters: &[Filter],
) -> Result<Vec<Instance>, Failure> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = backoff
            .run("DescribeInstances", || async {
                client
                    .describe_instances()
                    .set_filters(Some(filters.to_vec()))
                    .filters(filter("instance-state-name", &LIVE_STATES))
                    .max_results(1000)
                    .set_next_token(token.clone())
                    .send()
                    .await
                    .map_err(classify)
            })
            .await?;
        out.extend(
            page.reservations()
                .iter()
                .flat_map(|r| r.instances().iter().cloned()),
        );
        token = page
            .next_token()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// Ends one instance in the client's region. `Ok(false)`: EC2 does not know it here.
pub(crate) async fn terminate(
    client: &Client,
    backoff: &Backoff,
    instance_id: &str,
) -> Result<bool, Failure> {
    let result = backoff
        .run("TerminateInstances", || async {
            client
                .terminate_instances()
                .instance_ids(instance_id)
                .send()
                .await
                .map_err(classify)
        })
        .await;
    match result {
        Ok(_) => Ok(true),
        Err(f) if f.class == Class::NotFound => Ok(false),
        Err(f) => Err(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{InstanceState as Ec2State, Tag};

    #[test]
    fn client_tokens_are_short_stable_and_per_cluster() {
        let long_key = "k".repeat(500);
        let t = client_token("prod", &long_key);
        assert!(t.len() <= 64 && t.is_ascii());
        assert_eq!(t, client_token("prod", &long_key));
        assert_ne!(t, client_token("staging", &long_key));
        assert_ne!(client_token("prod", "a"), client_token("prod", "b"));
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(client_token("ab", "c"), client_token("a", "bc"));
    }

    #[test]
    fn instances_map_from_tags_and_lifecycle() {
        let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build();
        let instance = Instance::builder()
            .instance_id("i-123")
            .instance_type("g5.xlarge".into())
            .instance_lifecycle(InstanceLifecycleType::Spot)
            .state(Ec2State::builder().name(InstanceStateName::Running).build())
            .tags(tag(CLUSTER_TAG, "prod"))
            .tags(tag(INSTANCE_TAG, "key-1"))
            .build();
        let info = info_of(&instance, "us-east-1").expect("info");
        assert_eq!(info.provider_id, "i-123");
        assert_eq!(info.instance_key, "key-1");
        assert_eq!(info.pool, PoolId::new("aws:us-east-1/g5.xlarge"));
        assert_eq!(info.market, Market::Spot);
        assert_eq!(info.state, InstanceState::Running);

        for (name, state) in [
            (InstanceStateName::Pending, InstanceState::Pending),
            (InstanceStateName::Stopped, InstanceState::Terminated),
            (InstanceStateName::ShuttingDown, InstanceState::Terminated),
        ] {
            assert_eq!(state_of(Some(&name)), state);
        }
    }
}
