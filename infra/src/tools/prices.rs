//! AWS list prices for us-east-1, in US dollars per unit, as the cost model and the demo's
//! summary use them: one table, so that the two cannot disagree.

/// When the prices were read from AWS's pricing pages.
pub const AS_OF: &str = "2026-11-21";

/// One DynamoDB write request unit (on demand).
pub const DYNAMODB_WRU: f64 = 0.625e-6;
/// One DynamoDB read request unit (on demand): a strongly consistent read of up to 4 KB, or
/// two eventually consistent ones.
pub const DYNAMODB_RRU: f64 = 0.125e-6;
/// One SQS request (standard queue), of up to 10 messages.
pub const SQS_REQUEST: f64 = 0.40e-6;
/// One Lambda invocation.
pub const LAMBDA_REQUEST: f64 = 0.20e-6;
/// One GB-second of Lambda duration, on arm64.
pub const LAMBDA_GB_SECOND: f64 = 0.000_013_333_4;
/// One HTTP API request.
pub const HTTP_API_REQUEST: f64 = 1.00e-6;
/// One custom event put on an EventBridge bus.
pub const EVENTBRIDGE_EVENT: f64 = 1.00e-6;
/// One S3 request that writes or lists (PUT, COPY, POST, LIST), S3 Standard.
pub const S3_WRITE_REQUEST: f64 = 5.0e-6;
/// One S3 request that reads (GET, HEAD and the rest but DELETE, which is free).
pub const S3_READ_REQUEST: f64 = 0.40e-6;
/// One GB stored for a month in S3 Standard (the first 50 TB).
pub const S3_STORAGE_GB_MONTH: f64 = 0.023;
/// One GB of log data ingested by CloudWatch Logs (metric lines are log lines).
pub const CLOUDWATCH_LOGS_GB: f64 = 0.50;
/// CloudWatch Logs counts this many bytes with each log event besides its message.
pub const CLOUDWATCH_LOGS_EVENT_BYTES: f64 = 26.0;
/// One trace recorded by X-Ray.
pub const XRAY_TRACE: f64 = 5.0e-6;
/// One GB of a DynamoDB table (Standard class) stored for a month, items and indexes.
pub const DYNAMODB_STORAGE_GB_MONTH: f64 = 0.25;
/// One GB of a table's size for a month under point-in-time recovery (continuous backups).
pub const DYNAMODB_PITR_GB_MONTH: f64 = 0.20;
/// One Step Functions Standard state transition, for comparison.
pub const STEP_FUNCTIONS_TRANSITION: f64 = 25.0e-6;

/// `price` per unit, per million units: what a table of costs per million orders shows.
pub fn per_million(price: f64) -> f64 {
    price * 1e6
}
