//! Live refresh of the catalogue's EC2 pools: spot prices (`DescribeSpotPriceHistory`) and
//! instance facts (`DescribeInstanceTypes`). The merge rules are pure functions over plain
//! records ([`fresh_spot_prices`], [`refresh_pool`]) so they are tested without EC2; the fetches
//! below them only translate SDK types into those records.
//!
//! A spot price older than the configured maximum age is ignored (moto answers a placeholder
//! from 2006; real EC2 reports the price in force, with the time it last changed, so an old
//! record there means a quiet market — the age bound keeps a dead feed from freezing prices).

use super::error::{Failure, classify};
use crate::retry::Backoff;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::types::{InstanceType, InstanceTypeInfo, RiProductDescription};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use switchyard_core::{Money, Pool, Timestamp};

/// One spot price record as EC2 reports it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SpotRecord {
    pub instance_type: String,
    pub zone: String,
    pub price: Money,
    pub at: Timestamp,
}

/// A spot price to use for an instance type: the lowest over zones, and when it was set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpotQuote {
    pub price: Money,
    pub at: Timestamp,
}

/// What `DescribeInstanceTypes` says about a type, in the catalogue's units (GiB rounded down,
/// as the catalogue was generated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InstanceFacts {
    pub gpus: u32,
    pub gpu_memory_gb: u32,
    pub vcpus: u32,
    pub memory_gb: u32,
}

/// The latest record per (type, zone), dropped when older than `max_age` at `now`, then the
/// lowest price over the zones per type.
pub(crate) fn fresh_spot_prices(
    records: &[SpotRecord],
    now: Timestamp,
    max_age: Duration,
) -> BTreeMap<String, SpotQuote> {
    let max_age_ms = i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
    let oldest = Timestamp::from_millis(now.0.saturating_sub(max_age_ms));
    let mut latest: BTreeMap<(&str, &str), &SpotRecord> = BTreeMap::new();
    for r in records {
        let slot = latest
            .entry((r.instance_type.as_str(), r.zone.as_str()))
            .or_insert(r);
        if r.at > slot.at {
            *slot = r;
        }
    }
    let mut quotes: BTreeMap<String, SpotQuote> = BTreeMap::new();
    for r in latest.into_values().filter(|r| r.at >= oldest) {
        let quote = SpotQuote {
            price: r.price,
            at: r.at,
        };
        quotes
            .entry(r.instance_type.clone())
            .and_modify(|q| {
                if (quote.price, quote.at) < (q.price, q.at) {
                    *q = quote;
                }
            })
            .or_insert(quote);
    }
    quotes
}

/// Applies a fresh spot quote (it wins over the catalogue) and the API's instance facts to a
/// pool built from the catalogue. Without a quote the catalogue price and its time are kept.
pub(crate) fn refresh_pool(
    pool: &mut Pool,
    quote: Option<&SpotQuote>,
    facts: Option<&InstanceFacts>,
) {
    if let Some(q) = quote {
        pool.spot_per_hour = Some(q.price);
        pool.price_updated_at = q.at;
    }
    if let Some(f) = facts {
        pool.gpus_per_node = f.gpus;
        pool.gpu_memory_gb = f.gpu_memory_gb;
        pool.vcpus = f.vcpus;
        pool.memory_gb = f.memory_gb;
    }
}

/// Instance facts from one `DescribeInstanceTypes` entry; `None` for a type without GPUs.
pub(crate) fn facts_of(info: &InstanceTypeInfo) -> Option<InstanceFacts> {
    let gpu = info.gpu_info()?;
    let gpus: i64 = gpu
        .gpus()
        .iter()
        .filter_map(|g| g.count())
        .map(i64::from)
        .sum();
    let per_gpu_mib = gpu
        .gpus()
        .iter()
        .filter_map(|g| g.memory_info().and_then(|m| m.size_in_mib()))
        .max()?;
    Some(InstanceFacts {
        gpus: u32::try_from(gpus).ok().filter(|n| *n > 0)?,
        gpu_memory_gb: u32::try_from(per_gpu_mib / 1024).ok()?,
        vcpus: u32::try_from(info.v_cpu_info()?.default_v_cpus()?).ok()?,
        memory_gb: u32::try_from(info.memory_info()?.size_in_mib()? / 1024).ok()?,
    })
}

/// Pages of spot price history are bounded: one page per type and zone is the normal answer.
const MAX_SPOT_PAGES: usize = 20;

/// Current Linux spot prices of `types` in the client's region. `StartTime = now` asks EC2 for
/// the price in force now in each zone (one record each) rather than the whole history.
pub(crate) async fn spot_records(
    client: &Client,
    backoff: &Backoff,
    types: &[String],
    now: Timestamp,
) -> Result<Vec<SpotRecord>, Failure> {
    let mut records = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_SPOT_PAGES {
        let page = backoff
            .run("DescribeSpotPriceHistory", || async {
                client
                    .describe_spot_price_history()
                    .set_instance_types(Some(
                        types
                            .iter()
                            .map(|t| InstanceType::from(t.as_str()))
                            .collect(),
                    ))
                    .product_descriptions("Linux/UNIX")
                    .product_descriptions("Linux/UNIX (Amazon VPC)")
                    .start_time(aws_sdk_ec2::primitives::DateTime::from_millis(now.0))
                    .max_results(1000)
                    .set_next_token(token.clone())
                    .send()
                    .await
                    .map_err(classify)
            })
            .await?;
        for p in page.spot_price_history() {
            let linux = p.product_description().is_some_and(|d| {
                matches!(
                    d,
                    RiProductDescription::LinuxUnix | RiProductDescription::LinuxUnixAmazonVpc
                )
            });
            let record = (|| {
                Some(SpotRecord {
                    instance_type: p.instance_type()?.as_str().to_owned(),
                    zone: p.availability_zone()?.to_owned(),
                    price: Money::from_dollars(p.spot_price()?.parse::<f64>().ok()?)?,
                    at: Timestamp::from_millis(p.timestamp()?.to_millis().ok()?),
                })
            })();
            if let (true, Some(r)) = (linux, record) {
                records.push(r);
            }
        }
        token = page
            .next_token()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    Ok(records)
}

/// GPU instance facts of `types`. A region that does not know one of them answers
/// `InvalidInstanceType` for the whole batch; then each type is asked alone and the unknown
/// ones are skipped (they keep their catalogue facts).
pub(crate) async fn instance_facts(
    client: &Client,
    backoff: &Backoff,
    types: &[String],
) -> Result<HashMap<String, InstanceFacts>, Failure> {
    let mut facts = HashMap::new();
    for chunk in types.chunks(100) {
        match describe_types(client, backoff, chunk).await {
            Ok(found) => facts.extend(found),
            Err(f) if f.code.as_deref() == Some("InvalidInstanceType") => {
                for t in chunk {
                    match describe_types(client, backoff, std::slice::from_ref(t)).await {
                        Ok(found) => facts.extend(found),
                        Err(f) if f.code.as_deref() == Some("InvalidInstanceType") => {
                            tracing::warn!(instance.type = %t, "EC2 does not know this instance type in this region: its pool keeps the catalogue's facts, and a launch there will be refused");
                        }
                        Err(f) => return Err(f),
                    }
                }
            }
            Err(f) => return Err(f),
        }
    }
    Ok(facts)
}

async fn describe_types(
    client: &Client,
    backoff: &Backoff,
    types: &[String],
) -> Result<Vec<(String, InstanceFacts)>, Failure> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let page = backoff
            .run("DescribeInstanceTypes", || async {
                client
                    .describe_instance_types()
                    .set_instance_types(Some(
                        types
                            .iter()
                            .map(|t| InstanceType::from(t.as_str()))
                            .collect(),
                    ))
                    .set_next_token(token.clone())
                    .send()
                    .await
                    .map_err(classify)
            })
            .await?;
        for info in page.instance_types() {
            if let (Some(t), Some(f)) = (info.instance_type(), facts_of(info)) {
                out.push((t.as_str().to_owned(), f));
            }
        }
        token = page
            .next_token()
            .filter(|t| !t.is_empty())
            .map(str::to_owned);
        if token.is_none() {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY_MS: i64 = 24 * 3600 * 1000;

    fn record(t: &str, zone: &str, dollars: f64, at_ms: i64) -> SpotRecord {
        SpotRecord {
            instance_type: t.into(),
            zone: zone.into(),
            price: Money::from_dollars(dollars).expect("price"),
            at: Timestamp::from_millis(at_ms),
        }
    }

    fn money(d: f64) -> Money {
        Money::from_dollars(d).expect("price")
    }

    #[test]
    fn latest_record_per_zone_then_cheapest_zone() {
        let now = 100 * DAY_MS;
        let records = [
            // zone a: the newer record (0.60) replaces the older, cheaper one.
            record("g5.xlarge", "us-east-1a", 0.30, now - 3 * DAY_MS),
            record("g5.xlarge", "us-east-1a", 0.60, now - DAY_MS),
            record("g5.xlarge", "us-east-1b", 0.50, now - 2 * DAY_MS),
            record("p5.48xlarge", "us-east-1a", 20.0, now - DAY_MS),
        ];
        let quotes = fresh_spot_prices(
            &records,
            Timestamp::from_millis(now),
            Duration::from_secs(7 * 86_400),
        );
        assert_eq!(
            quotes.get("g5.xlarge"),
            Some(&SpotQuote {
                price: money(0.50),
                at: Timestamp::from_millis(now - 2 * DAY_MS)
            })
        );
        assert_eq!(
            quotes.get("p5.48xlarge").map(|q| q.price),
            Some(money(20.0))
        );
    }

    #[test]
    fn stale_records_are_ignored() {
        let now = 1_790_000_000_000; // 2026
        // moto's placeholder: 0.00001, dated 2006.
        let moto = record("g5.xlarge", "us-east-1a", 0.00001, 1_136_214_245_999);
        let quotes = fresh_spot_prices(
            &[moto],
            Timestamp::from_millis(now),
            Duration::from_secs(7 * 86_400),
        );
        assert!(quotes.is_empty());
    }

    #[test]
    fn a_fresh_quote_wins_over_the_catalogue_and_no_quote_keeps_it() {
        let catalogue = crate::Catalogue::bundled().expect("catalogue");
        let entry = catalogue
            .find("aws", "us-east-1", "g5.xlarge")
            .expect("g5.xlarge");
        let priced_at = Timestamp::from_millis(DAY_MS);
        let base = crate::catalogue::pool_from_entry(entry, 180, 4, priced_at);

        let mut kept = base.clone();
        refresh_pool(&mut kept, None, None);
        assert_eq!(kept, base);

        let mut fresh = base.clone();
        let quote = SpotQuote {
            price: money(0.4242),
            at: Timestamp::from_millis(2 * DAY_MS),
        };
        let facts = InstanceFacts {
            gpus: 1,
            gpu_memory_gb: 22,
            vcpus: 4,
            memory_gb: 16,
        };
        refresh_pool(&mut fresh, Some(&quote), Some(&facts));
        assert_eq!(fresh.spot_per_hour, Some(money(0.4242)));
        assert_eq!(fresh.price_updated_at, quote.at);
        assert_eq!(fresh.on_demand_per_hour, base.on_demand_per_hour);
        assert_eq!(
            (
                fresh.gpus_per_node,
                fresh.gpu_memory_gb,
                fresh.vcpus,
                fresh.memory_gb
            ),
            (1, 22, 4, 16)
        );
    }
}
