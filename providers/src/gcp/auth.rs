//! Service-account auth: the key file's private key signs a JWT (RS256, on aws-lc-rs through
//! `jsonwebtoken`) that is exchanged at the key's `token_uri` for an OAuth access token
//! (the JWT bearer grant, RFC 7523). The token is cached and reused until shortly before it
//! expires; a 401 from the API drops it so the next call fetches a new one.

use crate::failure::{Class, Failure};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;

/// The OAuth scope the provider asks for.
pub const COMPUTE_SCOPE: &str = "https://www.googleapis.com/auth/compute";
/// The grant type of the token exchange.
pub const JWT_BEARER_GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// How long the signed assertion is valid (Google accepts at most an hour).
const ASSERTION_LIFETIME_S: u64 = 3600;

/// The fields of a service-account JSON key file the provider uses. The private key never
/// appears in `Debug` output.
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    #[serde(rename = "type")]
    pub kind: String,
    pub client_email: String,
    pub private_key: String,
    pub private_key_id: String,
    pub token_uri: String,
}

impl fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .field("private_key_id", &self.private_key_id)
            .field("private_key", &"<redacted>")
            .field("token_uri", &self.token_uri)
            .finish()
    }
}

impl ServiceAccountKey {
    /// Reads and checks a key file; the error says what is wrong with it (never its contents).
    pub fn load(path: &str) -> Result<(ServiceAccountKey, EncodingKey), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("credentials_file {path:?}: cannot read it: {e}"))?;
        ServiceAccountKey::parse(&text).map_err(|e| format!("credentials_file {path:?}: {e}"))
    }

    /// Parses the JSON of a key file and its PEM private key.
    pub fn parse(text: &str) -> Result<(ServiceAccountKey, EncodingKey), String> {
        let key: ServiceAccountKey = serde_json::from_str(text).map_err(|e| {
            // serde_json's message names the field and position, never the values.
            format!("not a service-account JSON key: {e}")
        })?;
        if key.kind != "service_account" {
            return Err(format!(
                "type is {:?}, expected \"service_account\"",
                key.kind
            ));
        }
        if !key.client_email.contains('@') {
            return Err("client_email is not an email address".into());
        }
        if !(key.token_uri.starts_with("https://") || key.token_uri.starts_with("http://")) {
            return Err("token_uri is not an http(s) URL".into());
        }
        let signer = EncodingKey::from_rsa_pem(key.private_key.as_bytes())
            .map_err(|e| format!("private_key is not a PEM RSA private key ({e})"))?;
        Ok((key, signer))
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
}

#[derive(Deserialize)]
struct OAuthError {
    #[serde(default)]
    error: String,
    #[serde(default)]
    error_description: String,
}

struct Cached {
    token: String,
    refresh_at: Instant,
}

/// Fetches and caches access tokens for one service account.
pub struct TokenSource {
    key: ServiceAccountKey,
    signer: EncodingKey,
    http: reqwest::Client,
    cached: Mutex<Option<Cached>>,
}

impl fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenSource")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl TokenSource {
    pub fn new(key: ServiceAccountKey, signer: EncodingKey, http: reqwest::Client) -> TokenSource {
        TokenSource {
            key,
            signer,
            http,
            cached: Mutex::new(None),
        }
    }

    /// A valid access token: the cached one, or a new one from the token endpoint (one
    /// attempt: the API call that needs the token is retried as a whole by its backoff).
    pub async fn token(&self) -> Result<String, Failure> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && Instant::now() < c.refresh_at
        {
            return Ok(c.token.clone());
        }
        let (token, lifetime) = self.fetch().await?;
        // Refresh a little before expiry: a minute, or a quarter of a short lifetime.
        let margin = (lifetime / 4).min(Duration::from_secs(60));
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at: Instant::now() + lifetime.saturating_sub(margin),
        });
        Ok(token)
    }

    /// Forgets the cached token (the API refused it).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }

    /// The signed JWT assertion.
    fn assertion(&self) -> Result<String, Failure> {
        let iat = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let claims = Claims {
            iss: &self.key.client_email,
            scope: COMPUTE_SCOPE,
            aud: &self.key.token_uri,
            iat,
            exp: iat + ASSERTION_LIFETIME_S,
        };
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(self.key.private_key_id.clone());
        jsonwebtoken::encode(&header, &claims, &self.signer)
            .map_err(|e| Failure::new(Class::Auth, format!("signing the token request: {e}")))
    }

    async fn fetch(&self) -> Result<(String, Duration), Failure> {
        let assertion = self.assertion()?;
        let response = self
            .http
            .post(&self.key.token_uri)
            .form(&[
                ("grant_type", JWT_BEARER_GRANT),
                ("assertion", assertion.as_str()),
            ])
            .send()
            .await
            .map_err(|e| super::error::transport("token exchange", &e))?;
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|e| super::error::transport("token exchange", &e))?;
        if !(200..300).contains(&status) {
            let err: OAuthError = serde_json::from_slice(&body).unwrap_or(OAuthError {
                error: String::new(),
                error_description: format!("HTTP {status}"),
            });
            let class = match status {
                429 => Class::Throttled,
                s if s >= 500 => Class::Transient,
                _ => Class::Auth,
            };
            return Err(Failure {
                class,
                code: (!err.error.is_empty()).then_some(err.error),
                message: format!("token exchange refused: {}", err.error_description),
            });
        }
        let answer: TokenAnswer = serde_json::from_slice(&body).map_err(|e| {
            Failure::new(
                Class::Transient,
                format!("token exchange: unreadable answer: {e}"),
            )
        })?;
        let lifetime = Duration::from_secs(answer.expires_in.unwrap_or(3600).max(1));
        tracing::debug!(
            gcp.client_email = %self.key.client_email,
            expires_in_s = lifetime.as_secs(),
            "fetched a GCE access token"
        );
        Ok((answer.access_token, lifetime))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_that_does_not_parse_is_refused_with_the_reason() {
        for (text, expected) in [
            ("not json", "not a service-account JSON key"),
            (
                r#"{"type":"authorized_user","client_email":"a@b","private_key":"x","private_key_id":"1","token_uri":"https://t"}"#,
                "expected \"service_account\"",
            ),
            (
                r#"{"type":"service_account","client_email":"a@b","private_key":"x","private_key_id":"1"}"#,
                "token_uri",
            ),
            (
                r#"{"type":"service_account","client_email":"a@b","private_key":"x","private_key_id":"1","token_uri":"https://t"}"#,
                "private_key is not a PEM RSA private key",
            ),
        ] {
            let err = ServiceAccountKey::parse(text).err().unwrap_or_default();
            assert!(err.contains(expected), "{text}: {err}");
            assert!(!err.contains("\"x\""), "{err}");
        }
    }

    #[test]
    fn the_debug_form_leaves_the_private_key_out() {
        let key = ServiceAccountKey {
            kind: "service_account".into(),
            client_email: "sa@p.iam.gserviceaccount.com".into(),
            private_key: "-----BEGIN PRIVATE KEY-----secret".into(),
            private_key_id: "k1".into(),
            token_uri: "https://oauth2.example/token".into(),
        };
        let shown = format!("{key:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
