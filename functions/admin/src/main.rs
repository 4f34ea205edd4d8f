//! The admin function: wires configuration, clients and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_admin::Admin;
use sas_aws::dead_letters::DeadLetters;
use sas_aws::dynamo::DynamoStore;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::settings::Env;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::SystemClock;
use sas_aws::{clients, telemetry};
use sas_engine::ports::Destination;
use sas_engine::services::{Operator, StatusService};

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let env = Env::process();
    let config = env.engine_config()?;
    let (workflow, agents) = env.workflow()?;
    let (state_table, orders_table) = (env.required("STATE_TABLE")?, env.required("ORDERS_TABLE")?);
    let (queue, bus) = (env.required("SCHEDULER_QUEUE_URL")?, env.required("EVENT_BUS_NAME")?);
    let dead_letter_queues = env.dead_letter_queues(&agents)?;

    let sdk = clients::sdk_config().await;
    let (dynamodb, sqs, events) =
        (clients::dynamodb(&sdk), clients::sqs(&sdk), clients::eventbridge(&sdk));
    clients::warm_up(clients::touch_table(&dynamodb, &state_table)).await;
    let store = DynamoStore::new(dynamodb, state_table, orders_table);
    let admin = Admin {
        status: StatusService::new(store.clone()),
        operator: Operator::new(
            store.clone(),
            SqsOutbox::new(sqs.clone(), QueueUrls::default().with(Destination::Scheduler, queue)),
            EventBridgeBus::new(events, bus),
            SystemClock,
            config.clone(),
            workflow,
        ),
        finder: store,
        clock: SystemClock,
        shards: config.index_shards,
        dead_letters: DeadLetters::new(sqs, dead_letter_queues),
    };
    let admin = &admin;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(sas_admin::handle(admin, request).await)
    }))
    .await
}
