//! Least privilege, checked on every local run: each function's permissions as `template.yaml`
//! grants them, what each AWS API request needs, and the verdict IAM would give.
//!
//! A function's permissions are those of its role, evaluated against the provisioned stack (so
//! their ARNs are the ones the requests name). A role the template declares
//! (`Role: {Fn::GetAtt: [<role>, Arn]}`) grants its inline policies and nothing else. A role SAM
//! makes grants the function's `Policies` plus what SAM attaches by itself that the local stack
//! exercises: for a function with an SQS event source, the managed policy
//! `AWSLambdaSQSQueueExecutionRole`, which allows `sqs:ReceiveMessage`, `sqs:DeleteMessage` and
//! `sqs:GetQueueAttributes` on every queue (`*`), as the pollers need. (SAM also attaches logs
//! and X-Ray on `*`, which no function code calls through the proxy.)
//!
//! Evaluation is IAM's for identity-based policies: an explicit `Deny` wins, then any `Allow`;
//! otherwise the request is denied. Actions match case-insensitively, resources
//! case-sensitively, both with the wildcards `*` and `?`; an `Allow` may hold DynamoDB's
//! requests of one item to partition keys (`ForAllValues:StringLike` or `StringEquals` on
//! `dynamodb:LeadingKeys`), read from the request with the table's key schema in the template.
//! What cannot be evaluated exactly is refused when the policies are read, never skipped:
//! managed policies, SAM policy templates, any other condition (but on an `Allow` of services no
//! local request reaches), `NotAction` and `NotResource` in an `Allow`, a role given by ARN, a
//! permissions boundary. A request is mapped
//! to every (action, resource ARN) pair IAM authorises it by (a transaction by its item
//! actions, a batch by its single action); a request that cannot be mapped is denied.
//!
//! [`Access`] applies this to live requests: it knows each function by the access key id its
//! processes sign with (the function's logical id), records every denial and every grant a
//! call used, and so can tell at the end which grants no call needed.
//!
//! By concern: reading the template's policies (`read`), what a request on the wire is
//! (`wire`), mapping it to what it needs (`needs`, with the REST-JSON services' routes in
//! `rest`), IAM's verdict (`verdict`), and the live check with its report (`checks`).

mod checks;
mod needs;
mod read;
mod rest;
#[cfg(test)]
mod tests;
mod verdict;
mod wire;

pub use checks::{Access, AccessReport, Cause, Denial, Grant};
pub use needs::{Unmapped, needs, operation};
pub use read::{Policies, Scope, policies, read_document};
pub use rest::maps as speaks_rest_json;
pub use verdict::{Condition, Decision, Effect, Need, Origin, Permissions, Statement, wildcard};
pub use wire::{AwsRequest, Protocol, form_pairs};

/// The services whose requests the proxy maps, and so checks.
const PROXY_SERVICES: [&str; 8] =
    ["dynamodb", "sqs", "events", "secretsmanager", "s3", "sns", "scheduler", "lambda"];
