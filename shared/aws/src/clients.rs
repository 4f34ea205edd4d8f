//! SDK clients, built once per cold start from the standard AWS environment.

use std::future::Future;
use std::time::Duration;

use aws_config::{BehaviorVersion, SdkConfig};
use tracing::debug;

/// Loads region, credentials and endpoint (`AWS_ENDPOINT_URL` included) the standard way.
pub async fn sdk_config() -> SdkConfig {
    aws_config::load_defaults(BehaviorVersion::latest()).await
}

pub fn dynamodb(config: &SdkConfig) -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::new(config)
}

/// The text of a Secrets Manager secret's current version. Errors name the secret, never its
/// value.
pub async fn secret_text(config: &SdkConfig, secret_id: &str) -> Result<String, String> {
    let answer = aws_sdk_secretsmanager::Client::new(config)
        .get_secret_value()
        .secret_id(secret_id)
        .send()
        .await
        .map_err(|e| {
            format!(
                "reading secret {secret_id}: {}",
                aws_sdk_secretsmanager::error::DisplayErrorContext(e)
            )
        })?;
    answer
        .secret_string()
        .map(str::to_owned)
        .ok_or_else(|| format!("secret {secret_id} holds no text"))
}

pub fn sqs(config: &SdkConfig) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(config)
}

pub fn eventbridge(config: &SdkConfig) -> aws_sdk_eventbridge::Client {
    aws_sdk_eventbridge::Client::new(config)
}

/// Longest a cold start waits for its warm-up calls.
const WARM_UP_LIMIT: Duration = Duration::from_secs(2);

/// Runs cheap calls during init so that the TLS handshakes (and credential resolution) happen
/// before the first event, not during it. A failed warm-up only costs that head start, so its
/// outcome is logged at debug level and otherwise ignored.
pub async fn warm_up(calls: impl Future<Output = ()>) {
    if tokio::time::timeout(WARM_UP_LIMIT, calls).await.is_err() {
        debug!("warm-up calls did not finish in time");
    }
}

/// A warm-up call that reads a table's description.
pub async fn touch_table(client: &aws_sdk_dynamodb::Client, table: &str) {
    let result = client.describe_table().table_name(table).send().await;
    debug!(table, ok = result.is_ok(), "warm-up");
}

/// A warm-up call that reads one queue attribute.
pub async fn touch_queue(client: &aws_sdk_sqs::Client, url: &str) {
    let result = client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout)
        .send()
        .await;
    debug!(url, ok = result.is_ok(), "warm-up");
}

/// A warm-up call that describes the event bus.
pub async fn touch_bus(client: &aws_sdk_eventbridge::Client, bus: &str) {
    let result = client.describe_event_bus().name(bus).send().await;
    debug!(bus, ok = result.is_ok(), "warm-up");
}
