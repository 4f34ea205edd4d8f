//! State tables filled by hand, for the tools that measure what a read of them costs
//! (`sweep-cost`, `list-cost`): orders made as the engine makes them, written in batches.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, PutRequest, WriteRequest};
use sas_engine::config::EngineConfig;
use sas_engine::state::{ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::Workflow;
use sas_engine::{IdempotencyKey, OrderId, Timestamp};

type Error = Box<dyn std::error::Error>;

/// A new order of `workflow` under the plain idempotency key `key`, accepted at `at`.
pub fn new_order(
    key: &str,
    workflow: &Workflow,
    config: &EngineConfig,
    at: Timestamp,
) -> StateRecord {
    let id = OrderId::for_key(
        &IdempotencyKey::parse(key).unwrap_or_else(|_| unreachable!("keys are plain")),
    );
    let ctx = sas_engine::machine::Ctx { now: at, config, workflow, seed: 0 };
    sas_engine::machine::create(id, format!("corr-{key}"), &ctx).next
}

/// An order of `workflow` accepted at `at` and processed: every step done, out of the expiry
/// index, ended when it was accepted.
pub fn processed_order(
    key: &str,
    workflow: &Workflow,
    config: &EngineConfig,
    at: Timestamp,
) -> StateRecord {
    let mut r = new_order(key, workflow, config, at);
    r.process_state = ProcessState::Processed;
    r.complete_by = None;
    r.ended_at = Some(r.created_at);
    for s in &mut r.steps {
        s.status = StepStatus::Done;
        s.lease = None;
    }
    // As the engine would keep it, so that whatever reads it back takes it.
    debug_assert_eq!(r.check(), Ok(()));
    r
}

/// Writes `items` into `table`, 25 to a batch, again while DynamoDB leaves some unwritten.
pub async fn load(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    items: &[HashMap<String, AttributeValue>],
) -> Result<(), Error> {
    for chunk in items.chunks(25) {
        let mut writes = chunk
            .iter()
            .map(|item| {
                Ok(WriteRequest::builder()
                    .put_request(PutRequest::builder().set_item(Some(item.clone())).build()?)
                    .build())
            })
            .collect::<Result<Vec<_>, aws_sdk_dynamodb::error::BuildError>>()?;
        while !writes.is_empty() {
            let out = client.batch_write_item().request_items(table, writes).send().await?;
            writes = out.unprocessed_items.and_then(|mut u| u.remove(table)).unwrap_or_default();
        }
    }
    Ok(())
}

/// Now, from the machine's clock.
pub fn now() -> Timestamp {
    let since =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp::from_millis(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}
