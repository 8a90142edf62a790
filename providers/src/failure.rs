//! A failed cloud API call, classified the same way for every provider: what kind (capacity,
//! quota, throttled…), whether a retry can help, and the cloud's own code and message. Each
//! provider maps its cloud's codes to a [`Class`]; a [`Failure`] becomes a [`ProviderError`] at
//! the provider's edge.

use crate::ProviderError;
use switchyard_core::PoolId;

/// What kind of failure, as far as the burst controller is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// The pool has no capacity now: back off the pool, fail over to another region.
    Capacity,
    /// An account limit: back off longer; another region may have room.
    Quota,
    /// The cloud is rate-limiting us: retried here, then reported.
    Throttled,
    /// Credentials are missing, wrong, or lack permission.
    Auth,
    /// The resource does not exist (an instance already gone).
    NotFound,
    /// A network failure, a timeout or a 5xx: retried here, then reported.
    Transient,
    /// The cloud refused the request itself (bad AMI, bad subnet…): retrying cannot help.
    Rejected,
}

/// One classified failure of one API call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub class: Class,
    /// The cloud's error code, when the service answered.
    pub code: Option<String>,
    pub message: String,
}

impl Failure {
    pub fn new(class: Class, message: impl Into<String>) -> Failure {
        Failure {
            class,
            code: None,
            message: message.into(),
        }
    }

    /// Whether another attempt of the same call can succeed.
    pub fn retryable(&self) -> bool {
        matches!(self.class, Class::Throttled | Class::Transient)
    }

    /// `Code: message`, or the message alone.
    pub fn detail(&self) -> String {
        match &self.code {
            Some(code) => format!("{code}: {}", self.message),
            None => self.message.clone(),
        }
    }

    /// The provider-level error; `pool` is named in capacity and quota errors.
    pub fn into_provider_error(self, pool: Option<&PoolId>) -> ProviderError {
        let detail = self.detail();
        let pool = || pool.cloned().unwrap_or_else(|| PoolId::new("unknown"));
        match self.class {
            Class::Capacity => ProviderError::Capacity {
                pool: pool(),
                message: detail,
            },
            Class::Quota => ProviderError::Quota {
                pool: pool(),
                message: detail,
            },
            Class::Throttled => ProviderError::Throttled(detail),
            Class::Auth => ProviderError::Auth(detail),
            Class::Rejected => ProviderError::Rejected(detail),
            Class::NotFound | Class::Transient => ProviderError::Transient(detail),
        }
    }
}
