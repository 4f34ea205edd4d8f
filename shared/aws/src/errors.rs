//! Turning SDK errors into the engine's errors: retryable or not, source kept.

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use sas_engine::Error;

/// Error codes that mean "slow down" or "try again", across DynamoDB, SQS and EventBridge.
const RETRYABLE_CODES: &[&str] = &[
    "ThrottlingException",
    "Throttling",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "TransactionConflictException",
    "TransactionInProgressException",
    "InternalServerError",
    "InternalFailure",
    "InternalError",
    "ServiceUnavailable",
    "RequestThrottled",
    "KmsThrottled",
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
            e.raw().status().is_server_error()
                || e.err().code().is_some_and(|code| RETRYABLE_CODES.contains(&code))
        }
        _ => false,
    };
    // DisplayErrorContext prints the whole chain, including the service's message.
    let source = aws_sdk_dynamodb::error::DisplayErrorContext(err).to_string();
    if retryable { Error::unavailable(service, source) } else { Error::rejected(service, source) }
}
