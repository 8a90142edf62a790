//! What the services gateway routes by: every live service's running replicas that reported
//! where they listen, and the tokens that may call them (hashes only); the invoke tokens an
//! admin issues per service; and the gateways' reports of what they saw, kept about ten
//! minutes, from which every broker fills its traffic windows.

use super::*;
use switchyard_protocol::gateway::{GatewayGrant, GrantScope, TrafficSecond};

/// One replica the gateway may send a service's requests to.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteRow {
    pub service: Uuid,
    pub team: String,
    pub name: String,
    /// The service's spec (its `public` flag and concurrency bound).
    pub spec_json: String,
    pub job: JobId,
    /// `host:port`, as its agent reported it.
    pub address: String,
    pub ready: bool,
    /// Being stopped (scaled down, replaced, deleted, preempted): no new requests.
    pub draining: bool,
    pub region: String,
}

/// A live service (not deleted) and whether it has a replica at all.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutedService {
    pub service: Uuid,
    pub team: String,
    pub name: String,
    pub spec_json: String,
}

impl Store {
    /// Every live service, and each of their replicas that runs and reported its address.
    pub async fn gateway_routes(&self) -> StoreResult<(Vec<RoutedService>, Vec<RouteRow>)> {
        let services = query(
            "SELECT id, team, name, spec_json FROM services WHERE deleted_at IS NULL \
             ORDER BY team COLLATE \"C\", name COLLATE \"C\"",
        )
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|r| {
            Ok(RoutedService {
                service: r.uuid("id")?,
                team: r.get("team")?,
                name: r.get("name")?,
                spec_json: r.get("spec_json")?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
        let rows = query(
            "SELECT s.id AS s_id, s.team, s.name, s.spec_json, j.id AS j_id, j.cancel_requested, \
             j.drain_at, \
             a.state AS a_state, a.serve_host, a.serve_port, a.ready, p.region_id \
             FROM services s JOIN jobs j ON j.service_id = s.id \
             JOIN attempts a ON a.id = j.current_attempt \
             LEFT JOIN pools p ON p.id = a.pool_id \
             WHERE s.deleted_at IS NULL AND j.state = 'running' \
             AND a.state IN ('running', 'preempting') AND a.serve_port IS NOT NULL \
             ORDER BY j.id",
        )
        .fetch_all(&self.db)
        .await?;
        let routes = rows
            .iter()
            .map(|r| {
                let host: Option<String> = r.get("serve_host")?;
                let port: i64 = r.get("serve_port")?;
                Ok(RouteRow {
                    service: r.uuid("s_id")?,
                    team: r.get("team")?,
                    name: r.get("name")?,
                    spec_json: r.get("spec_json")?,
                    job: JobId(r.uuid("j_id")?),
                    address: format!("{}:{port}", host.unwrap_or_else(|| "127.0.0.1".into())),
                    ready: r.get("ready")?,
                    draining: r.get::<bool>("cancel_requested")?
                        || r.time_opt("drain_at")?.is_some()
                        || r.get::<String>("a_state")? == "preempting",
                    region: r.get::<Option<String>>("region_id")?.unwrap_or_default(),
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        Ok((services, routes))
    }
}

/// A per-service invoke token (stored hashed; the token itself is shown once).
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceTokenRecord {
    pub id: Uuid,
    pub service: Uuid,
    pub token_hash: String,
    pub name: Option<String>,
    pub created_at: Timestamp,
    pub revoked: bool,
}

/// One row of a gateway's report as stored: which gateway sent it and when it was taken.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredReport {
    pub gateway: String,
    pub second: TrafficSecond,
    pub received_at: Timestamp,
}

fn service_token_from_row(r: &Row) -> StoreResult<ServiceTokenRecord> {
    Ok(ServiceTokenRecord {
        id: r.uuid("id")?,
        service: r.uuid("service_id")?,
        token_hash: r.get("token_hash")?,
        name: r.get("name")?,
        created_at: r.time("created_at")?,
        revoked: r.time_opt("revoked_at")?.is_some(),
    })
}

fn count(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn uncount(r: &Row, col: &str) -> StoreResult<u64> {
    let v: i64 = r.get(col)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("{col} is negative: {v}")))
}

impl Store {
    /// Every live token that may call services, by hash: admins' (every service), team
    /// tokens' (their team's) and invoke tokens' (their service's, while it lives).
    pub async fn gateway_grants(&self) -> StoreResult<Vec<GatewayGrant>> {
        let mut grants = Vec::new();
        for r in query(
            "SELECT token_hash, role, team FROM api_tokens WHERE revoked_at IS NULL ORDER BY id",
        )
        .fetch_all(&self.db)
        .await?
        {
            let role: String = r.get("role")?;
            let team: Option<String> = r.get("team")?;
            let scope = match (role.as_str(), team) {
                ("admin", _) => GrantScope::Admin,
                (_, Some(team)) => GrantScope::Team { team },
                (_, None) => continue,
            };
            grants.push(GatewayGrant {
                token_hash: r.get("token_hash")?,
                scope,
            });
        }
        for r in query(
            "SELECT t.token_hash, t.service_id FROM service_tokens t \
             JOIN services s ON s.id = t.service_id \
             WHERE t.revoked_at IS NULL AND s.deleted_at IS NULL ORDER BY t.id",
        )
        .fetch_all(&self.db)
        .await?
        {
            grants.push(GatewayGrant {
                token_hash: r.get("token_hash")?,
                scope: GrantScope::Service {
                    service: r.uuid("service_id")?,
                },
            });
        }
        Ok(grants)
    }

    pub async fn insert_service_token(&self, t: &ServiceTokenRecord) -> StoreResult<()> {
        query(
            "INSERT INTO service_tokens (id, service_id, token_hash, name, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(t.id)
        .bind(t.service)
        .bind(&t.token_hash)
        .bind(&t.name)
        .bind(t.created_at)
        .execute(&self.db)
        .await?;
        Ok(())
    }

    /// A service's invoke tokens, oldest first, revoked ones included.
    pub async fn service_tokens(&self, service: Uuid) -> StoreResult<Vec<ServiceTokenRecord>> {
        query("SELECT * FROM service_tokens WHERE service_id = $1 ORDER BY created_at, id")
            .bind(service)
            .fetch_all(&self.db)
            .await?
            .iter()
            .map(service_token_from_row)
            .collect()
    }

    /// Revokes invoke token `id` of `service`; returns it as it was before (`None`: no such
    /// token of that service).
    pub async fn revoke_service_token(
        &self,
        service: Uuid,
        id: Uuid,
        now: Timestamp,
    ) -> StoreResult<Option<ServiceTokenRecord>> {
        let mut tx = self.write_tx().await?;
        let Some(row) = query("SELECT * FROM service_tokens WHERE id = $1 AND service_id = $2")
            .bind(id)
            .bind(service)
            .fetch_optional(&mut tx)
            .await?
        else {
            return Ok(None);
        };
        let before = service_token_from_row(&row)?;
        query("UPDATE service_tokens SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL")
            .bind(id)
            .bind(now)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(Some(before))
    }

    /// Stores a gateway's report in one transaction and forgets rows taken before
    /// `forget_before`. A row already stored (a retried report) is taken once; returns how
    /// many rows were new.
    pub async fn insert_gateway_report(
        &self,
        gateway: &str,
        seconds: &[TrafficSecond],
        now: Timestamp,
        forget_before: Timestamp,
    ) -> StoreResult<u64> {
        let mut tx = self.write_tx().await?;
        let mut accepted = 0;
        for s in seconds {
            let buckets = serde_json::to_string(&s.buckets)
                .map_err(|e| StoreError::Corrupt(format!("encoding buckets: {e}")))?;
            let done = query(
                "INSERT INTO gateway_reports (gateway, service_id, replica, at_s, batch, \
                 requests, errors, latency_sum_us, queue_peak, in_flight, buckets, received_at, \
                 busy_us, peak_in_system) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                 ON CONFLICT (gateway, service_id, replica, at_s, batch) DO NOTHING",
            )
            .bind(gateway)
            .bind(s.service)
            .bind(s.replica.map_or_else(String::new, |r| r.to_string()))
            .bind(s.second)
            .bind(count(s.batch))
            .bind(count(s.requests))
            .bind(count(s.errors))
            .bind(count(s.latency_sum_us))
            .bind(count(s.queue_peak))
            .bind(count(s.in_flight))
            .bind(buckets)
            .bind(now)
            .bind(count(s.busy_us))
            .bind(count(s.peak_in_system))
            .execute(&mut tx)
            .await?;
            accepted += done.rows_affected();
        }
        query("DELETE FROM gateway_reports WHERE received_at < $1")
            .bind(forget_before)
            .execute(&mut tx)
            .await?;
        tx.commit().await?;
        Ok(accepted)
    }

    /// The report rows taken after `since`, in the order they were taken.
    pub async fn gateway_reports_since(&self, since: Timestamp) -> StoreResult<Vec<StoredReport>> {
        query(
            "SELECT * FROM gateway_reports WHERE received_at > $1 \
             ORDER BY received_at, gateway, batch, service_id, replica",
        )
        .bind(since)
        .fetch_all(&self.db)
        .await?
        .iter()
        .map(|r| {
            let replica: String = r.get("replica")?;
            let replica = if replica.is_empty() {
                None
            } else {
                Some(Uuid::parse_str(&replica).map_err(|e| {
                    StoreError::Corrupt(format!("gateway report replica {replica:?}: {e}"))
                })?)
            };
            let buckets: String = r.get("buckets")?;
            Ok(StoredReport {
                gateway: r.get("gateway")?,
                second: TrafficSecond {
                    service: r.uuid("service_id")?,
                    replica,
                    second: r.get("at_s")?,
                    batch: uncount(r, "batch")?,
                    requests: uncount(r, "requests")?,
                    errors: uncount(r, "errors")?,
                    latency_sum_us: uncount(r, "latency_sum_us")?,
                    buckets: serde_json::from_str(&buckets)
                        .map_err(|e| StoreError::Corrupt(format!("gateway report buckets: {e}")))?,
                    queue_peak: uncount(r, "queue_peak")?,
                    in_flight: uncount(r, "in_flight")?,
                    busy_us: uncount(r, "busy_us")?,
                    peak_in_system: uncount(r, "peak_in_system")?,
                },
                received_at: r.time("received_at")?,
            })
        })
        .collect()
    }
}
