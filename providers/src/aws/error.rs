//! EC2 failures, classified: an SDK error becomes a [`Failure`] (what kind, whether a retry can
//! help, EC2's code and message), and a `Failure` becomes a [`ProviderError`] at the edge of the
//! provider. Classification is by EC2's error code (`ProvideErrorMetadata::code`), never by
//! message text; the table is in [`class_of_code`].

pub(crate) use crate::failure::{Class, Failure};
use aws_sdk_ec2::config::http::HttpResponse;
use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

/// Classifies an EC2 error code; `status` is the HTTP status of the answer.
pub(crate) fn class_of_code(code: &str, status: u16) -> Class {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientFreeAddressesInSubnet"
        | "SpotMaxPriceTooLow"
        | "Unsupported" => Class::Capacity,
        "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "InsufficientInstanceQuota" => Class::Quota,
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "TooManyRequestsException" => Class::Throttled,
        "AuthFailure"
        | "UnauthorizedOperation"
        | "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "ExpiredToken"
        | "RequestExpired"
        | "OptInRequired"
        | "Blocked" => Class::Auth,
        "InvalidInstanceID.NotFound" => Class::NotFound,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" | "Unavailable" => {
            Class::Transient
        }
        _ if status >= 500 || status == 429 => Class::Transient,
        _ if status == 401 || status == 403 => Class::Auth,
        _ => Class::Rejected,
    }
}

/// Classifies one failed SDK call.
pub(crate) fn classify<E>(err: SdkError<E, HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::ServiceError(ctx) => {
            let status = ctx.raw().status().as_u16();
            let code = err.code().map(str::to_owned);
            let message = err
                .message()
                .map(str::to_owned)
                .unwrap_or_else(|| format!("HTTP {status}"));
            let class = code
                .as_deref()
                .map_or_else(|| class_of_code("", status), |c| class_of_code(c, status));
            Failure {
                class,
                code,
                message,
            }
        }
        SdkError::TimeoutError(_) => Failure::new(Class::Transient, "request timed out"),
        SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => Failure::new(
            Class::Transient,
            aws_sdk_ec2::error::DisplayErrorContext(&err).to_string(),
        ),
        _ => Failure::new(
            Class::Rejected,
            aws_sdk_ec2::error::DisplayErrorContext(&err).to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProviderError;
    use switchyard_core::PoolId;

    #[test]
    fn codes_map_to_classes() {
        let cases = [
            ("InsufficientInstanceCapacity", 500, Class::Capacity),
            ("InsufficientCapacity", 400, Class::Capacity),
            ("SpotMaxPriceTooLow", 400, Class::Capacity),
            ("InstanceLimitExceeded", 400, Class::Quota),
            ("VcpuLimitExceeded", 400, Class::Quota),
            ("MaxSpotInstanceCountExceeded", 400, Class::Quota),
            ("RequestLimitExceeded", 503, Class::Throttled),
            ("Throttling", 400, Class::Throttled),
            ("AuthFailure", 401, Class::Auth),
            ("UnauthorizedOperation", 403, Class::Auth),
            ("InvalidInstanceID.NotFound", 400, Class::NotFound),
            ("InternalError", 500, Class::Transient),
            ("SomethingNew", 503, Class::Transient),
            ("SomethingNew", 403, Class::Auth),
            ("InvalidAMIID.NotFound", 400, Class::Rejected),
        ];
        for (code, status, class) in cases {
            assert_eq!(class_of_code(code, status), class, "{code} {status}");
        }
    }

    #[test]
    fn only_throttling_and_transient_failures_are_retried() {
        assert!(Failure::new(Class::Throttled, "").retryable());
        assert!(Failure::new(Class::Transient, "").retryable());
        for class in [Class::Capacity, Class::Quota, Class::Auth, Class::Rejected] {
            assert!(!Failure::new(class, "").retryable(), "{class:?}");
        }
    }

    #[test]
    fn provider_errors_name_the_pool_and_keep_the_code() {
        let pool = PoolId::new("aws:us-east-1/g5.xlarge");
        let failure = Failure {
            class: Class::Capacity,
            code: Some("InsufficientInstanceCapacity".into()),
            message: "none left".into(),
        };
        match failure.into_provider_error(Some(&pool)) {
            ProviderError::Capacity { pool: p, message } => {
                assert_eq!(p, pool);
                assert_eq!(message, "InsufficientInstanceCapacity: none left");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
