//! Console sessions through the real router: sign-in sets the cookies (and a bad token sets
//! none), the session cookie authenticates API reads, cookie writes need the CSRF token while
//! bearer writes do not, logout and expiry end the session, and the console's pages carry the
//! security headers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use reqwest::header::{COOKIE, SET_COOKIE};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use switchyard_broker::http::auth::{SESSION_PREFIX, hash_token, new_token};
use switchyard_broker::store::ConsoleSessionRecord;
use switchyard_core::Timestamp;

/// A signed-in browser: its two cookies.
struct Browser {
    session: String,
    csrf: String,
}

impl Browser {
    fn cookie(&self) -> String {
        format!("sy_session={}; sy_csrf={}", self.session, self.csrf)
    }
}

fn set_cookies(res: &reqwest::Response) -> Vec<String> {
    res.headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

fn cookie_value(set_cookies: &[String], name: &str) -> Option<String> {
    set_cookies.iter().find_map(|c| {
        let (pair, _) = c.split_once(';').unwrap_or((c, ""));
        let (k, v) = pair.split_once('=')?;
        (k == name).then(|| v.to_string())
    })
}

async fn login(app: &TestApp, token: &str) -> Browser {
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({ "token": token }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let cookies = set_cookies(&res);
    Browser {
        session: cookie_value(&cookies, "sy_session").unwrap(),
        csrf: cookie_value(&cookies, "sy_csrf").unwrap(),
    }
}

/// A request authenticated by the browser's cookies only, with `csrf` as `X-CSRF-Token`.
async fn with_cookie(
    app: &TestApp,
    browser: &Browser,
    method: Method,
    path: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut req = app
        .http
        .request(method, format!("{}{path}", app.url))
        .header(COOKIE, browser.cookie());
    if let Some(c) = csrf {
        req = req.header("X-CSRF-Token", c);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn sign_in_with_a_bad_token_is_401_and_sets_no_cookie() {
    let app = TestApp::spawn().await;
    for token in [
        "sya_0000000000000000000000000000000000000000000000000000000000000000",
        "not-a-token",
        "",
    ] {
        let res = app
            .http
            .post(format!("{}/console/login", app.url))
            .json(&json!({ "token": token }))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "token {token:?}");
        assert!(set_cookies(&res).is_empty(), "token {token:?}");
    }
    // Unknown fields are rejected like everywhere else.
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({ "token": app.admin, "remember": true }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert!(set_cookies(&res).is_empty());
}

#[tokio::test]
async fn sign_in_sets_a_strict_http_only_session_cookie_and_a_csrf_cookie() {
    let app = TestApp::spawn().await;
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .json(&json!({ "token": app.admin }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let cookies = set_cookies(&res);
    let body: Value = res.json().await.unwrap();
    assert_eq!(body["role"], "admin");
    let session = cookies
        .iter()
        .find(|c| c.starts_with("sy_session="))
        .unwrap();
    let csrf = cookies.iter().find(|c| c.starts_with("sy_csrf=")).unwrap();
    for c in [session, csrf] {
        assert!(c.contains("SameSite=Strict"), "{c}");
        assert!(c.contains("Path=/"), "{c}");
        // Served over plain HTTP here: a Secure cookie would never come back.
        assert!(!c.contains("Secure"), "{c}");
    }
    assert!(session.contains("HttpOnly"), "{session}");
    assert!(
        !csrf.contains("HttpOnly"),
        "the page's script must read {csrf}"
    );
    // The session id is never the API token itself.
    assert!(!session.contains(&app.admin));

    // A plain form post (no script) is sent back to the page with the same cookies.
    let res = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{}/console/login", app.url))
        .form(&[("token", app.admin.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SEE_OTHER, "{:?}", res.headers());
    let cookies = set_cookies(&res);
    assert!(cookie_value(&cookies, "sy_session").is_some());
    assert!(cookie_value(&cookies, "sy_csrf").is_some());

    // Another site cannot sign a browser in.
    let res = app
        .http
        .post(format!("{}/console/login", app.url))
        .header("Origin", "https://evil.example")
        .json(&json!({ "token": app.admin }))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert!(set_cookies(&res).is_empty());
}

#[tokio::test]
async fn the_session_cookie_authenticates_reads_and_keeps_the_tokens_role() {
    let app = TestApp::spawn().await;
    let browser = login(&app, &app.admin).await;
    let (status, body) = with_cookie(&app, &browser, Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["jobs"].is_array());
    let (status, body) =
        with_cookie(&app, &browser, Method::GET, "/console/session", None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (&body["signed_in"], &body["role"]),
        (&json!(true), &json!("admin"))
    );

    // A developer's session sees only the developer's team and may not act as admin.
    let dev = app.token("developer", Some("ml")).await;
    let dev_browser = login(&app, &dev).await;
    let (status, body) = with_cookie(
        &app,
        &dev_browser,
        Method::GET,
        "/console/session",
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["role"].as_str(), body["team"].as_str()),
        (Some("developer"), Some("ml"))
    );
    let (status, body) = with_cookie(
        &app,
        &dev_browser,
        Method::POST,
        "/api/v1/tokens",
        Some(&dev_browser.csrf),
        Some(json!({"role": "admin"})),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "forbidden");

    // No cookie, no bearer: 401. A bad bearer does not fall back to the cookie.
    let res = app
        .http
        .get(format!("{}/api/v1/jobs", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let res = app
        .http
        .get(format!("{}/api/v1/jobs", app.url))
        .header(COOKIE, browser.cookie())
        .bearer_auth("sya_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    // A made-up session id is 401 too.
    let forged = Browser {
        session: new_token(SESSION_PREFIX),
        csrf: browser.csrf.clone(),
    };
    let (status, _) = with_cookie(&app, &forged, Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn cookie_writes_need_the_sessions_csrf_token_and_bearer_writes_do_not() {
    let app = TestApp::spawn().await;
    let browser = login(&app, &app.admin).await;
    let other = login(&app, &app.admin).await;
    for csrf in [None, Some("wrong"), Some(other.csrf.as_str()), Some("")] {
        let (status, body) = with_cookie(
            &app,
            &browser,
            Method::POST,
            "/api/v1/jobs",
            csrf,
            Some(job_spec("ml")),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "csrf {csrf:?}: {body}");
        assert_eq!(body["error"]["code"], "csrf", "csrf {csrf:?}");
    }
    assert_eq!(app.job_count().await, 0, "a refused write stored nothing");
    let (status, body) = with_cookie(
        &app,
        &browser,
        Method::POST,
        "/api/v1/jobs",
        Some(&browser.csrf),
        Some(job_spec("ml")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Bearer requests carry no CSRF token.
    let r = app.submit(&app.admin, job_spec("ml")).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.body);
    assert_eq!(app.job_count().await, 2);
}

#[tokio::test]
async fn logout_revokes_the_session() {
    let app = TestApp::spawn().await;
    let browser = login(&app, &app.admin).await;
    let (status, body) =
        with_cookie(&app, &browser, Method::POST, "/console/logout", None, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "csrf");
    let (status, _) = with_cookie(&app, &browser, Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a refused logout leaves the session alive"
    );

    let res = app
        .http
        .post(format!("{}/console/logout", app.url))
        .header(COOKIE, browser.cookie())
        .header("X-CSRF-Token", &browser.csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let cleared = set_cookies(&res);
    assert_eq!(cookie_value(&cleared, "sy_session").as_deref(), Some(""));
    assert!(
        cleared.iter().all(|c| c.contains("Max-Age=0")),
        "{cleared:?}"
    );
    let (status, _) = with_cookie(&app, &browser, Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, body) =
        with_cookie(&app, &browser, Method::GET, "/console/session", None, None).await;
    assert_eq!(
        (status, &body["signed_in"]),
        (StatusCode::OK, &json!(false))
    );
}

#[tokio::test]
async fn an_expired_session_is_401() {
    let app = TestApp::spawn().await;
    let browser = login(&app, &app.admin).await;
    // Reuse the admin token's id for a session that ended a minute ago.
    let (live, token) = app
        .app
        .store
        .console_session(&hash_token(&browser.session))
        .await
        .unwrap()
        .unwrap();
    assert!(live.revoked_at.is_none());
    let id = new_token(SESSION_PREFIX);
    let now = app.app.clock.now();
    app.app
        .store
        .insert_console_session(&ConsoleSessionRecord {
            id_hash: hash_token(&id),
            api_token_id: token.id,
            csrf_token: "c".into(),
            created_at: Timestamp(now.millis() - 13 * 3600 * 1000),
            expires_at: Timestamp(now.millis() - 60_000),
            revoked_at: None,
        })
        .await
        .unwrap();
    let expired = Browser {
        session: id,
        csrf: "c".into(),
    };
    let (status, body) = with_cookie(&app, &expired, Method::GET, "/api/v1/jobs", None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["code"], "unauthorized");
    let (status, body) =
        with_cookie(&app, &expired, Method::GET, "/console/session", None, None).await;
    assert_eq!(
        (status, &body["signed_in"]),
        (StatusCode::OK, &json!(false))
    );
}

#[tokio::test]
async fn the_console_is_served_with_security_headers() {
    let app = TestApp::spawn().await;
    for (path, content_type) in [
        ("/", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/style.css", "text/css"),
        ("/console/favicon.svg", "image/svg+xml"),
    ] {
        let res = app
            .http
            .get(format!("{}{path}", app.url))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let h = res.headers();
        let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        assert!(header("content-type").starts_with(content_type), "{path}");
        assert!(
            header("content-security-policy").contains("default-src 'self'"),
            "{path}"
        );
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header("referrer-policy"), "no-referrer", "{path}");
    }
    let page = app
        .http
        .get(&app.url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("/console/app.js"));
    // Nothing inline (the CSP would block it) and nothing from elsewhere.
    assert!(
        !page.contains("<script>") && !page.contains("style="),
        "inline code in the page"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "external URL in the page"
    );
}
