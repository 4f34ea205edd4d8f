//! Queue depths from SQS: `GetQueueAttributes` on every queue, read together. SQS's counts are
//! approximate (they may lag a minute behind), which is all the door and the supervisor need:
//! whether messages are piling up, not how many exactly.

use aws_sdk_sqs::Client;
use aws_sdk_sqs::types::QueueAttributeName;
use futures_util::future::try_join_all;
use sas_engine::Result;
use sas_engine::ports::{Depth, Destination, QueueDepths};

use crate::errors::classify;

const SERVICE: &str = "sqs";

/// The [`QueueDepths`] port on SQS, for the queues it is given.
#[derive(Clone, Debug)]
pub struct SqsDepths {
    client: Client,
    queues: Vec<(Destination, String)>,
}

impl SqsDepths {
    /// `queues`: each destination with its queue URL.
    pub fn new(client: Client, queues: Vec<(Destination, String)>) -> Self {
        SqsDepths { client, queues }
    }
}

impl QueueDepths for SqsDepths {
    async fn depths(&self) -> Result<Vec<(Destination, Depth)>> {
        try_join_all(self.queues.iter().map(|(dest, url)| async move {
            let out = self
                .client
                .get_queue_attributes()
                .queue_url(url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesDelayed)
                .send()
                .await
                .map_err(|e| classify(SERVICE, e))?;
            let count = |name: QueueAttributeName| {
                out.attributes()
                    .and_then(|a| a.get(&name))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let depth = Depth {
                waiting: count(QueueAttributeName::ApproximateNumberOfMessages),
                in_flight: count(QueueAttributeName::ApproximateNumberOfMessagesNotVisible),
                delayed: count(QueueAttributeName::ApproximateNumberOfMessagesDelayed),
            };
            Ok((dest.clone(), depth))
        }))
        .await
    }
}
