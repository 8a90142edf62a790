//! The web console: one static page, its script and style sheet (all in `web/console/`,
//! embedded in the binary), and the session endpoints the page signs in with.
//!
//! - `GET /` — the page; `GET /console/app.js`, `/console/style.css`, `/console/favicon.svg`.
//! - `POST /console/login` — JSON `{"token": "sya_…"}` or a form field `token`: checks the token
//!   as the bearer path does, then sets `sy_session` (HttpOnly) and `sy_csrf` (readable by the
//!   script, which echoes it in `X-CSRF-Token` on every write). Both `SameSite=Strict; Path=/`,
//!   `Secure` when the broker serves TLS or its public URL is https.
//! - `GET /console/session` — who the session is (role, team), for the page after a reload.
//! - `POST /console/logout` — revokes the session (CSRF-checked) and clears the cookies.
//!
//! Every response here carries a strict CSP (`default-src 'self'`: the page has no inline
//! script or style and fetches nothing from elsewhere), `X-Frame-Options: DENY`,
//! `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.

use axum::Json;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, State};
use axum::http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, HOST, LOCATION, ORIGIN, REFERRER_POLICY,
    SET_COOKIE, X_CONTENT_TYPE_OPTIONS, X_FRAME_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use crate::clock;
use crate::http::auth::{self, CSRF_COOKIE, SESSION_COOKIE};
use crate::http::error::ApiError;
use crate::state::App;
use crate::store::role_name;

const INDEX_HTML: &str = include_str!("../../../web/console/index.html");
const APP_JS: &str = include_str!("../../../web/console/app.js");
const STYLE_CSS: &str = include_str!("../../../web/console/style.css");
const FAVICON_SVG: &str = include_str!("../../../web/console/favicon.svg");

pub const CSP: &str = "default-src 'self'; base-uri 'none'; form-action 'self'; \
                       frame-ancestors 'none'; object-src 'none'";

/// The console's routes, with the security headers on every response.
pub fn router() -> Router<App> {
    Router::new()
        .route("/", get(index))
        .route("/console/app.js", get(app_js))
        .route("/console/style.css", get(style_css))
        .route("/console/favicon.svg", get(favicon))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/session", get(session))
        .layer(axum::middleware::map_response(security_headers))
}

async fn security_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if !h.contains_key(CACHE_CONTROL) {
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    res
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [(CONTENT_TYPE, HeaderValue::from_static(content_type))],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

async fn favicon() -> Response {
    asset("image/svg+xml", FAVICON_SVG)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

/// A sign-in posted from another site would sign the victim's browser in as someone else:
/// when the browser says where the request comes from, it must be this host.
fn check_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("null");
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    let origin_host = origin.split_once("://").map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
        _ => Err(ApiError::Csrf(format!(
            "sign-in from origin {origin} is not accepted here"
        ))),
    }
}

fn cookie_header(app: &App, name: &str, value: &str, http_only: bool, max_age_s: i64) -> String {
    // Served over TLS (a public URL or not), or behind a proxy that terminates it: a cookie
    // without `Secure` would also be sent over plain http to the same host, where anyone on
    // the path reads the session.
    let secure = app.config.tls_cert.is_some() || app.config.public_url().starts_with("https://");
    format!(
        "{name}={value}; Path=/; SameSite=Strict; Max-Age={max_age_s}{}{}",
        if http_only { "; HttpOnly" } else { "" },
        if secure { "; Secure" } else { "" },
    )
}

fn set_cookies(res: &mut Response, cookies: [String; 2]) -> Result<(), ApiError> {
    for c in cookies {
        let value = HeaderValue::from_str(&c)
            .map_err(|e| ApiError::Internal(format!("cookie header: {e}")))?;
        res.headers_mut().append(SET_COOKIE, value);
    }
    res.headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(())
}

fn who(
    token: &crate::store::ApiTokenRecord,
    expires_at: switchyard_core::Timestamp,
) -> Json<serde_json::Value> {
    Json(json!({
        "signed_in": true,
        "role": role_name(token.role),
        "team": token.team,
        "name": token.name,
        "expires_at": clock::to_datetime(expires_at),
    }))
}

/// Signs in with an API token (JSON or form). JSON answers 200 with who signed in; a form
/// post is sent back to the page (303). A bad token answers 401 and sets no cookie.
async fn login(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    check_origin(&headers)?;
    let is_form = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let token = if is_form {
        let mut req = Request::new(Body::from(body));
        *req.headers_mut() = headers;
        // A GET would make the form extractor read the query string instead of the body.
        *req.method_mut() = Method::POST;
        axum::Form::<Login>::from_request(req, &())
            .await
            .map_err(|e| ApiError::invalid("token", e.body_text()))?
            .0
            .token
    } else {
        crate::http::json::parse::<Login>(&body)?.token
    };
    let record = auth::api_token(&app, token.trim()).await?;
    let (id, session) = auth::create_console_session(&app, &record).await?;
    let max_age = (session.expires_at.millis() - session.created_at.millis()) / 1000;
    let cookies = [
        cookie_header(&app, SESSION_COOKIE, &id, true, max_age),
        cookie_header(&app, CSRF_COOKIE, &session.csrf_token, false, max_age),
    ];
    let mut res = if is_form {
        (StatusCode::SEE_OTHER, [(LOCATION, "/#/overview")]).into_response()
    } else {
        who(&record, session.expires_at).into_response()
    };
    set_cookies(&mut res, cookies)?;
    Ok(res)
}

/// Who this browser is signed in as: `{"signed_in": false}` without a live session (a 200, so
/// that opening the page signed out logs no failed request in the browser's console).
async fn session(State(app): State<App>, headers: HeaderMap) -> Result<Response, ApiError> {
    match auth::console_session(&headers, &app).await {
        Ok(Some(s)) => Ok(who(&s.token, s.session.expires_at).into_response()),
        Ok(None) | Err(ApiError::Unauthorized) => {
            Ok(Json(json!({ "signed_in": false })).into_response())
        }
        Err(e) => Err(e),
    }
}

/// Revokes the session (the CSRF token must match) and clears both cookies.
async fn logout(
    State(app): State<App>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let s = auth::console_session(&headers, &app)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    auth::check_csrf(&method, &headers, &s)?;
    app.store
        .revoke_console_session(&s.session.id_hash, app.clock.now())
        .await?;
    let mut res = StatusCode::NO_CONTENT.into_response();
    set_cookies(
        &mut res,
        [
            cookie_header(&app, SESSION_COOKIE, "", true, 0),
            cookie_header(&app, CSRF_COOKIE, "", false, 0),
        ],
    )?;
    Ok(res)
}
