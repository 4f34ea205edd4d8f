//! The submission function: wires configuration, clients and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_aws::depths::SqsDepths;
use sas_aws::dynamo::DynamoStore;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::settings::Env;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::{SystemClock, UuidIds};
use sas_aws::waits::DynamoWaits;
use sas_aws::{clients, telemetry};
use sas_engine::load::Gauges;
use sas_engine::ports::Destination;
use sas_engine::services::Submission;

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
    clients::warm_up(async {
        tokio::join!(
            clients::touch_table(&dynamodb, &state_table),
            clients::touch_queue(&sqs, &queue),
            clients::touch_bus(&events, &bus)
        );
    })
    .await;

    let load = Gauges {
        waits: DynamoWaits::new(dynamodb.clone(), waits_table),
        depths: SqsDepths::new(sqs.clone(), queues),
    };
    let submission = Submission::new(
        DynamoStore::new(dynamodb, state_table, orders_table),
        SqsOutbox::new(sqs, QueueUrls::default().with(Destination::Scheduler, queue)),
        EventBridgeBus::new(events, bus),
        SystemClock,
        UuidIds,
        load,
        config,
        workflow,
    );
    let submission = &submission;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(sas_submission::handle(submission, request).await)
    }))
    .await
}
