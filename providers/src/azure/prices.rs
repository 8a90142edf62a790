//! Live prices from the Azure Retail Prices API (`GET {prices_endpoint}/api/retail/prices`,
//! public, no credentials, OData `$filter`, `NextPageLink` pagination): the Linux
//! pay-as-you-go and Spot hourly meters of the offered sizes, one location at a time. Cached
//! for an hour; when the API fails the catalogue's prices stay (a warning is logged).

use super::client::{Arm, transport};
use super::error::{Class, Failure, class_of_code};
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use switchyard_core::{Money, Pool, PoolId, Timestamp};

/// The Retail Prices API version asked for.
pub const PRICES_API_VERSION: &str = "2023-01-01-preview";
/// How long fetched prices are used before the API is asked again.
const TTL: Duration = Duration::from_secs(3600);
/// Sizes per request (the `$filter` grows with each).
const SIZES_PER_QUERY: usize = 10;
/// Most pages one query follows.
const MAX_PAGES: usize = 50;

/// Hourly prices of one size in one location.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Quote {
    pub on_demand: Option<Money>,
    pub spot: Option<Money>,
}

/// (location, size) → quote.
pub(crate) type Quotes = HashMap<(String, String), Quote>;

#[derive(Default)]
pub(crate) struct PriceCache {
    cached: tokio::sync::Mutex<Option<(Instant, Quotes)>>,
}

impl PriceCache {
    /// Fresh quotes for every launchable size, from the cache or the API; empty on failure.
    pub async fn get(
        &self,
        arm: &Arm,
        endpoint: &str,
        launchable: &HashMap<PoolId, (String, String)>,
    ) -> Quotes {
        let mut cached = self.cached.lock().await;
        if let Some((at, quotes)) = cached.as_ref()
            && at.elapsed() < TTL
        {
            return quotes.clone();
        }
        let mut by_location: HashMap<&str, Vec<&str>> = HashMap::new();
        for (location, size) in launchable.values() {
            by_location.entry(location).or_default().push(size);
        }
        let mut quotes = Quotes::new();
        for (location, mut sizes) in by_location {
            sizes.sort_unstable();
            for chunk in sizes.chunks(SIZES_PER_QUERY) {
                match fetch(arm, endpoint, location, chunk).await {
                    Ok(found) => quotes.extend(found),
                    Err(f) => {
                        tracing::warn!(azure.location = location, error = %f.detail(),
                            "Azure retail prices unavailable, keeping the catalogue's");
                        return Quotes::new();
                    }
                }
            }
        }
        tracing::debug!(quotes = quotes.len(), "refreshed Azure retail prices");
        *cached = Some((Instant::now(), quotes.clone()));
        quotes
    }
}

/// The `$filter` of one query.
pub(crate) fn filter(location: &str, sizes: &[&str]) -> String {
    let skus: Vec<String> = sizes
        .iter()
        .map(|s| format!("armSkuName eq '{}'", s.replace('\'', "''")))
        .collect();
    format!(
        "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq '{}' and ({})",
        location.replace('\'', "''"),
        skus.join(" or ")
    )
}

async fn fetch(
    arm: &Arm,
    endpoint: &str,
    location: &str,
    sizes: &[&str],
) -> Result<Quotes, Failure> {
    let base = endpoint.trim_end_matches('/');
    let mut url = format!("{base}/api/retail/prices");
    let mut query = Some(vec![
        ("api-version".to_owned(), PRICES_API_VERSION.to_owned()),
        ("$filter".to_owned(), filter(location, sizes)),
    ]);
    let mut quotes = Quotes::new();
    for _ in 0..MAX_PAGES {
        let page = arm
            .backoff
            .run("RetailPrices", || page(arm, &url, query.as_deref()))
            .await?;
        if let Some(items) = page.get("Items").and_then(Value::as_array) {
            for item in items {
                add_item(&mut quotes, item);
            }
        }
        match page.get("NextPageLink").and_then(Value::as_str) {
            Some(next) if next.starts_with(base) && !next.is_empty() => {
                url = next.to_owned();
                query = None;
            }
            Some(next) if !next.is_empty() => {
                return Err(Failure::new(
                    Class::Rejected,
                    format!("NextPageLink {next:?} is not on prices_endpoint"),
                ));
            }
            _ => return Ok(quotes),
        }
    }
    Ok(quotes)
}

async fn page(arm: &Arm, url: &str, query: Option<&[(String, String)]>) -> Result<Value, Failure> {
    let mut request = arm.http().get(url).timeout(arm.request_timeout());
    if let Some(q) = query {
        request = request.query(q);
    }
    let response = request
        .send()
        .await
        .map_err(|e| transport("retail prices request", &e))?;
    let status = response.status().as_u16();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| transport("retail prices answer", &e))?;
    if !(200..300).contains(&status) {
        return Err(Failure::new(
            class_of_code("", status),
            format!("retail prices answered HTTP {status}"),
        ));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| Failure::new(Class::Transient, format!("retail prices answer: {e}")))
}

/// Takes one price item: Linux (no `Windows` in the product), hourly, USD, not Low Priority;
/// a `… Spot` SKU is the spot price. The lowest wins where meters repeat.
pub(crate) fn add_item(quotes: &mut Quotes, item: &Value) {
    let text = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or("");
    let (location, size, sku, product) = (
        text("armRegionName"),
        text("armSkuName"),
        text("skuName"),
        text("productName"),
    );
    if location.is_empty()
        || size.is_empty()
        || product.contains("Windows")
        || text("unitOfMeasure") != "1 Hour"
        || text("currencyCode") != "USD"
        || text("type") != "Consumption"
        || sku.ends_with("Low Priority")
    {
        return;
    }
    let Some(price) = item
        .get("retailPrice")
        .and_then(Value::as_f64)
        .and_then(Money::from_dollars)
        .filter(|m| *m > Money::ZERO)
    else {
        return;
    };
    let quote = quotes
        .entry((location.to_owned(), size.to_owned()))
        .or_default();
    let slot = if sku.ends_with(" Spot") {
        &mut quote.spot
    } else {
        &mut quote.on_demand
    };
    if slot.is_none_or(|p| price < p) {
        *slot = Some(price);
    }
}

/// Applies the quotes to the catalogue's pools.
pub(crate) fn apply(pools: &mut [Pool], quotes: &Quotes, now: Timestamp) {
    for pool in pools {
        let location = pool
            .region
            .as_str()
            .strip_prefix("azure:")
            .unwrap_or_default()
            .to_owned();
        let Some(q) = quotes.get(&(location, pool.instance_type.clone())) else {
            continue;
        };
        if let Some(p) = q.on_demand {
            pool.on_demand_per_hour = p;
            pool.price_updated_at = now;
        }
        if let Some(p) = q.spot {
            pool.spot_per_hour = Some(p);
            pool.price_updated_at = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(sku: &str, product: &str, price: f64) -> Value {
        json!({
            "currencyCode": "USD", "retailPrice": price, "unitPrice": price,
            "armRegionName": "eastus", "armSkuName": "Standard_NC24ads_A100_v4",
            "skuName": sku, "productName": product, "unitOfMeasure": "1 Hour",
            "type": "Consumption", "serviceName": "Virtual Machines",
        })
    }

    #[test]
    fn linux_on_demand_and_spot_meters_are_taken() {
        let mut q = Quotes::new();
        for i in [
            item(
                "NC24ads A100 v4",
                "Virtual Machines NCads A100 v4 Series",
                3.67,
            ),
            item(
                "NC24ads A100 v4 Spot",
                "Virtual Machines NCads A100 v4 Series",
                0.9,
            ),
            item(
                "NC24ads A100 v4 Low Priority",
                "Virtual Machines NCads A100 v4 Series",
                0.5,
            ),
            item(
                "NC24ads A100 v4",
                "Virtual Machines NCads A100 v4 Series Windows",
                4.5,
            ),
            item(
                "NC24ads A100 v4 Spot",
                "Virtual Machines NCads A100 v4 Series Windows",
                0.1,
            ),
        ] {
            add_item(&mut q, &i);
        }
        let got = q[&("eastus".to_owned(), "Standard_NC24ads_A100_v4".to_owned())];
        assert_eq!(got.on_demand, Money::from_dollars(3.67));
        assert_eq!(got.spot, Money::from_dollars(0.9));
    }

    #[test]
    fn the_filter_names_the_location_and_sizes() {
        assert_eq!(
            filter("eastus", &["A", "B"]),
            "serviceName eq 'Virtual Machines' and priceType eq 'Consumption' and armRegionName eq 'eastus' and (armSkuName eq 'A' or armSkuName eq 'B')"
        );
    }
}
