//! SDK clients for a local stack: which endpoint serves each service, and clients of the
//! services the template's resources live in, pointed there, with the region and credentials every emulator accepts (any access
//! key id, the secret key `local`). Everything that talks to an emulator (provisioning, the
//! demo, the tools, the tests) builds its clients here, as the stack itself
//! ([`STACK_ACCESS_KEY_ID`]) or on behalf of a function (its logical id, which the local
//! stack's proxy checks against that function's policy).

use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::config::Credentials;

use crate::access::sigv4::LOCAL_SECRET_KEY;

/// The endpoint of each service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub dynamodb: String,
    /// SQS and EventBridge share an endpoint: the event bus delivers to queues, which only
    /// works inside one emulator. S3 is served there too.
    pub sqs_and_events: String,
}

impl Endpoints {
    /// Every service on one endpoint.
    pub fn single(url: &str) -> Endpoints {
        Endpoints { dynamodb: url.to_owned(), sqs_and_events: url.to_owned() }
    }
}

/// The access key id of the stack's own clients: no function's, so the proxy lets their
/// requests through unchecked.
pub const STACK_ACCESS_KEY_ID: &str = "local";

/// A client of each service.
#[derive(Clone, Debug)]
pub struct Clients {
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub events: aws_sdk_eventbridge::Client,
    /// Path-style (`<endpoint>/<bucket>/<key>`), as a local endpoint needs.
    pub s3: aws_sdk_s3::Client,
    pub xray: aws_sdk_xray::Client,
}

impl Clients {
    /// Clients for `endpoints` in `region`, as the stack itself.
    pub async fn new(endpoints: &Endpoints, region: &str) -> Clients {
        Clients::signing_as(endpoints, region, STACK_ACCESS_KEY_ID).await
    }

    /// Clients for `endpoints` in `region` that sign with `access_key_id`: a function's logical
    /// id to act on its behalf.
    pub async fn signing_as(endpoints: &Endpoints, region: &str, access_key_id: &str) -> Clients {
        let credentials =
            Credentials::new(access_key_id, LOCAL_SECRET_KEY, None, None, "local-stack");
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(region.to_owned()))
            .credentials_provider(credentials)
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
            s3: aws_sdk_s3::Client::from_conf(
                aws_sdk_s3::config::Builder::from(&sdk)
                    .endpoint_url(&endpoints.sqs_and_events)
                    .force_path_style(true)
                    .build(),
            ),
            xray: aws_sdk_xray::Client::from_conf(
                aws_sdk_xray::config::Builder::from(&sdk)
                    .endpoint_url(&endpoints.sqs_and_events)
                    .build(),
            ),
        }
    }
}
