//! Turning SDK errors into the engine's errors (retryable or not, source kept), and into an
//! agent's faults: passing (worth another try, and in a row a sign the service is down) or a
//! refusal (the step's own failure, which no retry mends and which holds nothing).

use std::time::Duration;

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use sas_engine::Error;
use sas_engine::ports::RemoteFault;

/// Error codes that mean "slow down": the service throttled the call.
const THROTTLING_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "RequestThrottledException",
    "SlowDown",
    "KmsThrottled",
];

/// Error codes that mean "try again", across AWS services, whatever the HTTP status they come
/// with (several come with a 400).
const PASSING_CODES: &[&str] = &[
    "TransactionConflictException",
    "TransactionInProgressException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "ServiceUnavailable",
    "RequestTimeout",
    "RequestTimeoutException",
    "PriorRequestNotComplete",
    "ExpiredToken",
    "ExpiredTokenException",
    "IDPCommunicationError",
];

/// Classifies an SDK error: connection problems, timeouts, throttling and 5xx are retryable;
/// everything else (validation, permissions, missing resources) is not.
pub(crate) fn classify<E>(service: &'static str, err: SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let retryable = match &err {
        SdkError::TimeoutError(_) | SdkError::DispatchFailure(_) | SdkError::ResponseError(_) => {
            true
        }
        SdkError::ServiceError(e) => {
            let code = e.err().code();
            e.raw().status().is_server_error()
                || code.is_some_and(|c| THROTTLING_CODES.contains(&c) || PASSING_CODES.contains(&c))
        }
        _ => false,
    };
    // DisplayErrorContext prints the whole chain, including the service's message.
    let source = DisplayErrorContext(err).to_string();
    if retryable { Error::unavailable(service, source) } else { Error::rejected(service, source) }
}

/// The fault a call to an AWS service (`service`, as the fault names it: `S3`, `DynamoDB`)
/// met, as an agent reports it:
///
/// - [`RemoteFault::Throttled`] for a 429 or a throttling code (`ThrottlingException`,
///   `SlowDown`, `ProvisionedThroughputExceededException`...), with the `Retry-After` it
///   asked for, if any;
/// - [`RemoteFault::Transient`] for a timeout, a connection that failed, an answer that could
///   not be read, a 5xx, a 408, or a code that means "try again" (`TransactionConflict`,
///   `RequestTimeout`, `ExpiredToken`...): the agent tries again within the step's budget,
///   and such faults in a row hold the action;
/// - [`RemoteFault::Permanent`] for every other answer of the service (access denied, a
///   validation error, a missing resource, a failed condition: any other 4xx) and a request
///   the SDK could not build: the step fails at once with this cause, and its workflow
///   decides what follows; a refusal never holds a service, since the service answered.
///
/// The fault names the service's code and message (an access denied names the action and the
/// resource), and without them the SDK's whole chain of causes.
pub fn remote_fault<E>(service: &str, err: SdkError<E, HttpResponse>) -> RemoteFault
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let answered = match &err {
        SdkError::ServiceError(e) => {
            let raw = e.raw();
            let retry_after = raw
                .headers()
                .get("retry-after")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            Some((raw.status().as_u16(), e.err().code().map(str::to_owned), retry_after))
        }
        _ => None,
    };
    let built = !matches!(err, SdkError::ConstructionFailure(_));
    let reason = match (&err, &answered) {
        (SdkError::ServiceError(e), Some((_, Some(code), _))) => {
            format!("{service}: {code} {}", e.err().message().unwrap_or_default())
        }
        _ => format!("{service}: {}", DisplayErrorContext(err)),
    };
    let Some((status, code, retry_after)) = answered else {
        return if built { RemoteFault::Transient(reason) } else { RemoteFault::Permanent(reason) };
    };
    let code = code.as_deref();
    let throttled = status == 429 || code.is_some_and(|c| THROTTLING_CODES.contains(&c));
    if throttled || (status == 503 && retry_after.is_some()) {
        return RemoteFault::Throttled { reason, retry_after };
    }
    if status >= 500 || status == 408 || code.is_some_and(|c| PASSING_CODES.contains(&c)) {
        return RemoteFault::Transient(reason);
    }
    RemoteFault::Permanent(reason)
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::error::ErrorMetadata;
    use aws_sdk_dynamodb::operation::put_item::PutItemError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;

    use super::*;

    fn answered(status: u16, code: &str, retry_after: Option<&str>) -> RemoteFault {
        let meta = ErrorMetadata::builder().code(code).message("as the service said").build();
        let mut raw = HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
        if let Some(after) = retry_after {
            raw.headers_mut().insert("retry-after", after.to_owned());
        }
        remote_fault("S3", SdkError::service_error(PutItemError::generic(meta), raw))
    }

    #[test]
    fn a_denial_a_validation_error_or_another_4xx_is_the_step_s_own_failure() {
        for (status, code) in [
            (403, "AccessDenied"),
            (400, "ValidationException"),
            (404, "NoSuchBucket"),
            (409, "BucketNotEmpty"),
            (400, "ConditionalCheckFailedException"),
        ] {
            let fault = answered(status, code, None);
            assert_eq!(fault, RemoteFault::Permanent(format!("S3: {code} as the service said")));
        }
        let unbuilt = SdkError::<PutItemError, HttpResponse>::construction_failure("no bucket");
        assert!(matches!(remote_fault("S3", unbuilt), RemoteFault::Permanent(_)));
    }

    #[test]
    fn throttling_5xx_timeouts_and_lost_connections_pass() {
        let throttled = |fault| matches!(fault, RemoteFault::Throttled { .. });
        assert!(throttled(answered(429, "TooManyRequestsException", None)));
        assert!(throttled(answered(400, "ThrottlingException", None)));
        assert!(throttled(answered(400, "ProvisionedThroughputExceededException", None)));
        assert_eq!(
            answered(503, "SlowDown", Some("2")),
            RemoteFault::Throttled {
                reason: "S3: SlowDown as the service said".into(),
                retry_after: Some(Duration::from_secs(2)),
            }
        );
        for (status, code) in [
            (500, "InternalError"),
            (503, "ServiceUnavailable"),
            (400, "TransactionConflictException"),
            (400, "RequestTimeout"),
            (408, "Whatever"),
        ] {
            assert!(matches!(answered(status, code, None), RemoteFault::Transient(_)), "{code}");
        }
        let timeout = SdkError::<PutItemError, HttpResponse>::timeout_error("read timed out");
        assert!(matches!(remote_fault("S3", timeout), RemoteFault::Transient(_)));
    }
}
