//! What the services gateway routes by: every live service's running replicas that reported
//! where they listen.

use super::*;

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
