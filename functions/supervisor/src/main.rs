//! The supervisor function: wires configuration, clients and the handler. Invoked by an
//! EventBridge schedule; the event's content is not used.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::depths::SqsDepths;
use sas_aws::dynamo::DynamoStore;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::settings::Env;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::SystemClock;
use sas_aws::waits::DynamoWaits;
use sas_aws::{clients, telemetry};
use sas_engine::load::Gauges;
use sas_engine::ports::Destination;
use sas_engine::services::Supervisor;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let env = Env::process();
    let config = env.engine_config()?;
    let (workflow, agents) = env.workflow()?;
    let (state_table, orders_table) = (env.required("STATE_TABLE")?, env.required("ORDERS_TABLE")?);
    let (queue, bus) = (env.required("SCHEDULER_QUEUE_URL")?, env.required("EVENT_BUS_NAME")?);
    let (queues, waits_table) = (env.queues(&agents)?, env.required("QUEUE_WAITS_TABLE")?);

    let sdk = clients::sdk_config().await;
    let (dynamodb, sqs, events) =
        (clients::dynamodb(&sdk), clients::sqs(&sdk), clients::eventbridge(&sdk));
    let store = DynamoStore::new(dynamodb.clone(), state_table, orders_table);
    let load = Gauges {
        waits: DynamoWaits::new(dynamodb, waits_table),
        depths: SqsDepths::new(sqs.clone(), queues),
    };
    let supervisor = Supervisor::new(
        store.clone(),
        store,
        SqsOutbox::new(sqs, QueueUrls::default().with(Destination::Scheduler, queue)),
        EventBridgeBus::new(events, bus),
        SystemClock,
        load,
        config,
        workflow,
    );
    let supervisor = &supervisor;
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        sas_supervisor::handle(supervisor).await.map_err(Error::from)
    }))
    .await
}
