//! AWS adapters for the engine's ports, and what every Lambda function of the system shares.
//!
//! The engine (`sas-engine`) decides; this crate talks to AWS. Each adapter implements one port
//! on the AWS SDK for Rust and turns the SDK's errors into the engine's: a failed condition or a
//! cancelled transaction becomes a typed outcome, throttling and 5xx responses become retryable
//! errors, anything else a permanent one. The SDK is configured once per cold start from the
//! standard environment (`AWS_ENDPOINT_URL`, `AWS_REGION`, credentials), so the same binaries run
//! on AWS and against a local emulator.
//!
//! # Layout
//!
//! - [`dynamo`]: the state store, the orders table and the expiry index.
//! - [`health`]: each service's record (open or held), kept by its agent.
//! - [`sqs`]: sending messages; [`batch`]: consuming an SQS batch with partial failures;
//!   [`depths`]: how many messages each queue holds.
//! - [`dead_letters`]: the dead-letter queues, read and moved back by operators.
//! - [`waits`]: the consumers' reports of how long messages waited, in a DynamoDB table.
//! - [`eventbridge`]: status events and alerts.
//! - [`payloads`]: large inputs and outputs, as objects in an S3 bucket.
//! - [`http`]: the remote service an agent calls; [`signing`]: SigV4 for outgoing requests.
//! - [`system`]: the real clock, ids and randomness.
//! - [`settings`]: configuration read from the environment; [`clients`]: SDK clients.
//! - [`api`]: the HTTP API's answers (statuses and JSON errors).
//! - [`telemetry`]: logs and metrics; [`wiring`]: what every function builds at cold start.

pub mod api;
pub mod batch;
pub mod clients;
pub mod dead_letters;
pub mod depths;
pub mod dynamo;
pub mod errors;
pub mod eventbridge;
pub mod health;
pub mod http;
pub mod payloads;
pub mod settings;
pub mod signing;
pub mod sqs;
pub mod system;
pub mod telemetry;
pub mod trace;
pub mod waits;
pub mod wiring;
