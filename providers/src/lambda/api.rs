//! The Lambda Cloud API as the provider uses it: typed requests and answers of the five
//! operations (`listInstanceTypes`, `launchInstance`, `terminateInstance`, `listInstances`,
//! `getInstance` in Lambda's OpenAPI document), one HTTP attempt each — retries belong to
//! [`crate::retry::Backoff`] — and the client-side launch rate limit.

use super::error::{Failure, from_answer, from_transport};
use crate::failure::Class;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A Lambda answer's `data` envelope.
#[derive(Deserialize)]
struct Data<T> {
    data: T,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Region {
    pub name: String,
    #[serde(default)]
    pub description: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceTypeSpecs {
    pub vcpus: u32,
    pub memory_gib: u32,
    pub gpus: u32,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceType {
    pub name: String,
    pub price_cents_per_hour: i64,
    pub specs: InstanceTypeSpecs,
}

/// One entry of `GET /instance-types`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceTypesItem {
    pub instance_type: InstanceType,
    pub regions_with_capacity_available: Vec<Region>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct InstanceTypeRef {
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Tag {
    pub key: String,
    pub value: String,
}

/// An instance as `GET /instances` describes it (the fields Switchyard reads).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Instance {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// `booting`, `active`, `unhealthy`, `terminating`, `terminated`, `preempted`.
    pub status: String,
    pub region: Region,
    pub instance_type: InstanceTypeRef,
    #[serde(default)]
    pub tags: Vec<Tag>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RequestedTag {
    pub key: String,
    pub value: String,
}

/// `POST /instance-operations/launch` (`InstanceLaunchRequest`). The document has no
/// `quantity` field (older docs showed one): one request launches one instance.
#[derive(Clone, Serialize, PartialEq)]
pub struct LaunchBody {
    pub region_name: String,
    pub instance_type_name: String,
    pub ssh_key_names: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub file_system_names: Vec<String>,
    pub name: String,
    /// The bootstrap script, as plain text (cloud-init user-data; at most 1 MB).
    pub user_data: String,
    pub tags: Vec<RequestedTag>,
}

impl std::fmt::Debug for LaunchBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchBody")
            .field("region_name", &self.region_name)
            .field("instance_type_name", &self.instance_type_name)
            .field("name", &self.name)
            .field(
                "user_data",
                &format_args!("<{} bytes>", self.user_data.len()),
            )
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct LaunchAnswer {
    instance_ids: Vec<String>,
}

#[derive(Serialize)]
struct TerminateBody<'a> {
    instance_ids: [&'a str; 1],
}

/// The user-data limit of `InstanceLaunchRequest.user_data`.
pub const MAX_USER_DATA_BYTES: usize = 1_000_000;

/// One HTTP client bound to one endpoint and API key.
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

impl Client {
    /// `base` is the API's base URL (`…/api/v1`); every request times out after `timeout`.
    pub fn new(base: &str, api_key: &str, timeout: Duration) -> Result<Client, String> {
        let mut auth = HeaderValue::from_str(&format!("Bearer {api_key}"))
            .map_err(|_| "the API key cannot be sent in a header".to_string())?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, auth);
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Client {
            http,
            base: base.trim_end_matches('/').to_string(),
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, Failure> {
        let answer = request.send().await.map_err(|e| from_transport(&e))?;
        let status = answer.status().as_u16();
        let body = answer.text().await.map_err(|e| from_transport(&e))?;
        if !(200..300).contains(&status) {
            return Err(from_answer(status, &body));
        }
        serde_json::from_str::<Data<T>>(&body)
            .map(|d| d.data)
            .map_err(|e| Failure::new(Class::Transient, format!("unreadable answer: {e}")))
    }

    pub async fn instance_types(&self) -> Result<BTreeMap<String, InstanceTypesItem>, Failure> {
        self.call(self.http.get(format!("{}/instance-types", self.base)))
            .await
    }

    /// Every instance of the account (Lambda's list is not paginated).
    pub async fn instances(&self) -> Result<Vec<Instance>, Failure> {
        self.call(self.http.get(format!("{}/instances", self.base)))
            .await
    }

    /// The launched instance's id.
    pub async fn launch(&self, body: &LaunchBody) -> Result<String, Failure> {
        let answer: LaunchAnswer = self
            .call(
                self.http
                    .post(format!("{}/instance-operations/launch", self.base))
                    .json(body),
            )
            .await?;
        answer
            .instance_ids
            .into_iter()
            .next()
            .ok_or_else(|| Failure::new(Class::Transient, "the launch answer names no instance"))
    }

    pub async fn terminate(&self, id: &str) -> Result<(), Failure> {
        let _: serde_json::Value = self
            .call(
                self.http
                    .post(format!("{}/instance-operations/terminate", self.base))
                    .json(&TerminateBody { instance_ids: [id] }),
            )
            .await?;
        Ok(())
    }
}

/// Lambda's limit on launch requests, kept on this side: launches are spaced at least
/// `interval` apart, and one that would wait longer than `max_wait` for its turn is refused
/// (as throttled) instead of queueing.
#[derive(Debug)]
pub struct LaunchLimiter {
    interval: Duration,
    max_wait: Duration,
    next: Mutex<Option<Instant>>,
}

impl LaunchLimiter {
    pub fn new(interval: Duration, max_wait: Duration) -> LaunchLimiter {
        LaunchLimiter {
            interval,
            max_wait,
            next: Mutex::new(None),
        }
    }

    /// How long a launch asked for now would wait for its slot.
    pub fn wait_ahead(&self) -> Duration {
        let now = Instant::now();
        self.next
            .lock()
            .ok()
            .and_then(|n| *n)
            .map_or(Duration::ZERO, |n| n.saturating_duration_since(now))
    }

    /// Whether a launch asked for now would wait longer than it may.
    pub fn over_max_wait(&self) -> bool {
        self.wait_ahead() > self.max_wait
    }

    /// Takes the next launch slot and waits for it.
    pub async fn acquire(&self) -> Result<(), Failure> {
        let now = Instant::now();
        let at = {
            let mut next = self
                .next
                .lock()
                .map_err(|_| Failure::new(Class::Transient, "launch limiter poisoned"))?;
            let at = next.map_or(now, |n| n.max(now));
            if at.duration_since(now) > self.max_wait {
                return Err(Failure::new(
                    Class::Throttled,
                    format!(
                        "the next launch slot is {:?} away (launches are spaced {:?} apart)",
                        at.duration_since(now),
                        self.interval
                    ),
                ));
            }
            *next = Some(at + self.interval);
            at
        };
        tokio::time::sleep_until(at.into()).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn launches_are_spaced_and_a_long_wait_is_refused() {
        let limiter = LaunchLimiter::new(Duration::from_millis(60), Duration::from_millis(150));
        let started = Instant::now();
        let mut at = Vec::new();
        for _ in 0..3 {
            limiter.acquire().await.expect("a slot");
            at.push(started.elapsed());
        }
        assert!(at[0] < Duration::from_millis(30), "{at:?}");
        assert!(at[1] >= Duration::from_millis(60), "{at:?}");
        assert!(at[2] >= Duration::from_millis(120), "{at:?}");
        assert!(limiter.wait_ahead() > Duration::from_millis(20));
        assert!(!limiter.over_max_wait());

        // Four callers at once: the slots are 0, 60, 120 ms away; a fourth would wait 180 ms.
        let limiter = LaunchLimiter::new(Duration::from_millis(60), Duration::from_millis(150));
        let results = futures_join(&limiter).await;
        let refused: Vec<_> = results.iter().filter(|r| r.is_err()).collect();
        assert_eq!(refused.len(), 1, "{results:?}");
        assert!(
            refused
                .iter()
                .all(|r| matches!(r, Err(f) if f.class == Class::Throttled))
        );
    }

    async fn futures_join(limiter: &LaunchLimiter) -> Vec<Result<(), Failure>> {
        let (a, b, c, d) = tokio::join!(
            limiter.acquire(),
            limiter.acquire(),
            limiter.acquire(),
            limiter.acquire()
        );
        vec![a, b, c, d]
    }

    #[test]
    fn a_launch_bodys_debug_form_leaves_the_user_data_out() {
        let body = LaunchBody {
            region_name: "us-east-1".into(),
            instance_type_name: "gpu_1x_a10".into(),
            ssh_key_names: vec!["k".into()],
            file_system_names: vec![],
            name: "sy-c-k".into(),
            user_data: "SWITCHYARD_ENROL_TOKEN=\"s3cr3t\"".into(),
            tags: vec![],
        };
        let shown = format!("{body:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        let json = serde_json::to_value(&body).expect("json");
        assert!(json.get("file_system_names").is_none());
        assert!(json.get("quantity").is_none());
    }
}
