//! One wiring path for every function: logging and metrics set up, the SDK configured once per
//! cold start, the engine's ports built on its clients, and each invocation's trace segments
//! sent and metrics printed when it ends. A function's `main` reads its settings, asks this for the ports it needs and
//! hands them to its service; nothing else is repeated between functions.

use std::future::Future;

use aws_config::SdkConfig;
use sas_engine::load::Gauges;
use sas_engine::ports::Destination;

use crate::depths::SqsDepths;
use crate::dynamo::DynamoStore;
use crate::eventbridge::EventBridgeBus;
use crate::payloads::S3Payloads;
use crate::settings::Tables;
use crate::sqs::{QueueUrls, SqsOutbox};
use crate::waits::DynamoWaits;
use crate::{clients, telemetry};

/// The namespace of the metrics, from `METRICS_NAMESPACE`; without it no metric is printed.
const NAMESPACE_VARIABLE: &str = "METRICS_NAMESPACE";

/// What a function is built from.
pub struct Wiring {
    sdk: SdkConfig,
    dynamodb: aws_sdk_dynamodb::Client,
    sqs: aws_sdk_sqs::Client,
    events: aws_sdk_eventbridge::Client,
    metrics: Option<&'static metrics_cloudwatch_embedded::Collector>,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring").field("metrics", &self.metrics.is_some()).finish_non_exhaustive()
    }
}

impl Wiring {
    /// Sets up logging and metrics for the function `role` (its metrics' `Function` dimension:
    /// `scheduler`, `agent-payment`, ...) and loads the SDK's configuration.
    pub async fn start(role: &str) -> Wiring {
        telemetry::init();
        let metrics = std::env::var(NAMESPACE_VARIABLE)
            .ok()
            .filter(|n| !n.is_empty())
            .and_then(|namespace| telemetry::metrics(&namespace, role));
        let sdk = clients::sdk_config().await;
        crate::trace::install(aws_sdk_xray::Client::new(&sdk));
        Wiring {
            dynamodb: clients::dynamodb(&sdk),
            sqs: clients::sqs(&sdk),
            events: clients::eventbridge(&sdk),
            sdk,
            metrics,
        }
    }

    /// The AWS SDK's configuration, loaded once at cold start: the region, the function's
    /// credentials and, where `AWS_ENDPOINT_URL` is set (the local stack, LocalStack), that
    /// endpoint. Build any other service's client from it
    /// (`aws_sdk_s3::config::Builder::from(wiring.sdk())`); an S3 client on an endpoint of
    /// one's own needs `force_path_style(true)`.
    pub fn sdk(&self) -> &SdkConfig {
        &self.sdk
    }

    /// A DynamoDB client on [`Wiring::sdk`].
    pub fn dynamodb(&self) -> &aws_sdk_dynamodb::Client {
        &self.dynamodb
    }

    /// An SQS client on [`Wiring::sdk`].
    pub fn sqs(&self) -> &aws_sdk_sqs::Client {
        &self.sqs
    }

    /// An EventBridge client on [`Wiring::sdk`].
    pub fn eventbridge(&self) -> &aws_sdk_eventbridge::Client {
        &self.events
    }

    /// The payload store in `bucket` (none: nothing is stored), on an S3 client addressed by
    /// path where the endpoint is one's own.
    pub fn payloads(&self, bucket: Option<String>) -> S3Payloads {
        let config = aws_sdk_s3::config::Builder::from(&self.sdk)
            .force_path_style(self.sdk.endpoint_url().is_some())
            .build();
        S3Payloads::new(aws_sdk_s3::Client::from_conf(config), bucket)
    }

    /// The state store over the state, orders and keys tables.
    pub fn store(&self, tables: &Tables) -> DynamoStore {
        DynamoStore::new(self.dynamodb.clone(), tables)
    }

    /// An outbox sending to `urls`.
    pub fn outbox(&self, urls: QueueUrls) -> SqsOutbox {
        SqsOutbox::new(self.sqs.clone(), urls)
    }

    /// The event bus `name`.
    pub fn bus(&self, name: &str) -> EventBridgeBus {
        EventBridgeBus::new(self.events.clone(), name.to_owned())
    }

    /// The consumers' wait reports, in `table`.
    pub fn waits(&self, table: &str) -> DynamoWaits {
        DynamoWaits::new(self.dynamodb.clone(), table.to_owned())
    }

    /// The queues' load: the wait reports in `waits_table` and the depths of `queues`.
    pub fn gauges(
        &self,
        waits_table: &str,
        queues: Vec<(Destination, String)>,
    ) -> Gauges<DynamoWaits, SqsDepths> {
        Gauges { waits: self.waits(waits_table), depths: SqsDepths::new(self.sqs.clone(), queues) }
    }

    /// Runs one invocation's work, then sends the trace segments it ended and prints the
    /// metrics it recorded.
    pub async fn invocation<T>(&self, work: impl Future<Output = T>) -> T {
        let out = work.await;
        crate::trace::flush().await;
        if self.metrics.is_some() {
            telemetry::print_metrics();
        }
        out
    }
}
