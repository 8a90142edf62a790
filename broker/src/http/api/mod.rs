//! The HTTP surface: every route in one place. REST under `/api/v1` (documented in
//! `/openapi.json`, generated from the handlers), the agent protocol under `/agent/v1`, probes,
//! and the console at `/`.

pub mod audit;
pub mod budgets;
pub mod catalogue;
pub mod gateway;
pub mod instances;
pub mod jobs;
pub mod nodes;
mod openapi;
pub mod policies;
pub mod services;
pub mod spend;
pub mod tokens;
pub mod waste;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use switchyard_protocol::api::Health;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::agent_api;
use crate::http::error::ApiError;
use crate::state::App;

#[derive(OpenApi)]
#[openapi(
    info(title = "Switchyard", description = "Multi-cloud GPU federation broker: REST API."),
    modifiers(&BearerAuth),
    tags(
        (name = "jobs", description = "Submit, watch and cancel jobs"),
        (name = "services", description = "Inference services: replicas behind a gateway endpoint, autoscaled; deploy, update, delete, events"),
        (name = "catalogue", description = "Pools and regions with price, latency and capacity"),
        (name = "auth", description = "API, enrolment and agent tokens: create, list, revoke"),
        (name = "policies", description = "Team cost policies, what-if simulation and the audit log"),
        (name = "spend", description = "The ledger: spend by team, project, region, provider or pool; budgets"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The REST API and its OpenAPI document, both from the same handler list.
pub fn api() -> (Router<App>, utoipa::openapi::OpenApi) {
    let (router, mut doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(jobs::submit, jobs::list))
        .routes(routes!(jobs::get))
        .routes(routes!(jobs::cancel))
        .routes(routes!(jobs::logs))
        .routes(routes!(jobs::placement))
        .routes(routes!(services::create, services::list))
        .routes(routes!(services::get, services::update, services::delete))
        .routes(routes!(services::events))
        .routes(routes!(gateway::create_token, gateway::list_tokens))
        .routes(routes!(gateway::revoke_token))
        .routes(routes!(gateway::routes))
        .routes(routes!(gateway::report))
        .routes(routes!(catalogue::pools))
        .routes(routes!(catalogue::regions))
        .routes(routes!(instances::list))
        .routes(routes!(nodes::list))
        .routes(routes!(nodes::get))
        .routes(routes!(nodes::drain))
        .routes(routes!(nodes::undrain))
        .routes(routes!(tokens::create, tokens::list))
        .routes(routes!(tokens::revoke))
        .routes(routes!(tokens::list_agent))
        .routes(routes!(tokens::revoke_agent))
        .routes(routes!(tokens::create_enrolment))
        .routes(routes!(policies::list))
        .routes(routes!(policies::get, policies::put))
        .routes(routes!(policies::what_if))
        .routes(routes!(audit::list))
        .routes(routes!(catalogue::patch_pool))
        .routes(routes!(spend::report))
        .routes(routes!(budgets::list))
        .routes(routes!(waste::report))
        .split_for_parts();
    doc.servers = Some(vec![utoipa::openapi::Server::new("/api/v1")]);
    openapi::complete(&mut doc);
    (router, doc)
}

pub fn router(app: App) -> Router {
    let (api, doc) = api();
    let doc_json = serde_json::to_value(&doc).unwrap_or_default();
    let limits = std::sync::Arc::new(crate::http::limits::Limits::from_config(&app.config));
    let hsts = app.config.public_url().starts_with("https://");
    Router::new()
        .nest("/api/v1", api)
        .nest("/agent/v1", agent_api::router(app.clone()))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route(
            "/openapi.json",
            get(move || {
                let doc = doc_json.clone();
                async move { Json(doc) }
            }),
        )
        .merge(crate::http::console::router())
        .fallback(not_found)
        // Innermost first: axum's own extractor limit, then the hostile-input guard (rate,
        // body size and time), then the security headers on everything, then the trace.
        .layer(DefaultBodyLimit::max(limits.largest_body()))
        .layer(axum::middleware::from_fn_with_state(
            limits,
            crate::http::limits::guard,
        ))
        .layer(axum::middleware::map_response_with_state(
            hsts,
            crate::http::limits::security_headers,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(app)
}

async fn healthz() -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        replica: None,
        leader: None,
        epoch: None,
    })
}

/// Ready when the database answers; says whether this replica leads.
async fn readyz(State(app): State<App>) -> impl IntoResponse {
    match app.store.regions().await {
        Ok(_) => (
            StatusCode::OK,
            Json(Health {
                status: "ready".into(),
                replica: Some(app.leadership.replica().to_string()),
                leader: Some(app.leadership.is_leader()),
                epoch: app.leadership.epoch(),
            }),
        )
            .into_response(),
        Err(e) => ApiError::Unavailable(format!("database: {e}")).into_response(),
    }
}

/// Prometheus exposition. Needs an `admin`, `infra` or `finance` token (Prometheus's
/// `authorization` scrape setting): the figures name teams and what they spend.
async fn metrics(
    State(app): State<App>,
    caller: crate::http::auth::Caller,
) -> Result<Response, ApiError> {
    use switchyard_protocol::api::Role;
    caller.require(&[Role::Admin, Role::Infra, Role::Finance])?;
    let body = app
        .metrics
        .render(app.store.as_ref(), &app.traffic, app.clock.now())
        .await?;
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            crate::http::metrics::CONTENT_TYPE,
        )],
        body,
    )
        .into_response())
}

async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::NotFound(format!("route {}", uri.path()))
}
