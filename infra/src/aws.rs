//! SDK clients for a local stack: which endpoint serves each service, and clients of the three
//! services pointed there, with the region and the fixed credentials every emulator accepts.
//! Everything that talks to an emulator (provisioning, the demo, the tools, the tests) builds
//! its clients here.

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;

/// The endpoint of each service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub dynamodb: String,
    /// SQS and EventBridge share an endpoint: the event bus delivers to queues, which only
    /// works inside one emulator.
    pub sqs_and_events: String,
}

impl Endpoints {
    /// Every service on one endpoint.
    pub fn single(url: &str) -> Endpoints {
        Endpoints { dynamodb: url.to_owned(), sqs_and_events: url.to_owned() }
    }
}

/// A client of each service.
#[derive(Clone, Debug)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub events: aws_sdk_eventbridge::Client,
}

impl Clients {
    /// Clients for `endpoints` in `region`.
    pub async fn new(endpoints: &Endpoints, region: &str) -> Clients {
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region.to_owned()))
            .credentials_provider(Credentials::new("local", "local", None, None, "local"))
            .load()
            .await;
        Clients {
            dynamodb: aws_sdk_dynamodb::Client::from_conf(
                aws_sdk_dynamodb::config::Builder::from(&sdk)
                    .endpoint_url(&endpoints.dynamodb)
                    .build(),
            ),
            sqs: aws_sdk_sqs::Client::from_conf(
                aws_sdk_sqs::config::Builder::from(&sdk)
                    .endpoint_url(&endpoints.sqs_and_events)
                    .build(),
            ),
            events: aws_sdk_eventbridge::Client::from_conf(
                aws_sdk_eventbridge::config::Builder::from(&sdk)
                    .endpoint_url(&endpoints.sqs_and_events)
                    .build(),
            ),
        }
    }
}
