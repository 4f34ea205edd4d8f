//! The scheduler function: wires configuration, clients and the handler.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::batch::Coalescing;
use sas_aws::dynamo::DynamoStore;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::settings::{Env, agent_queue_variable, reporter_name};
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::SystemClock;
use sas_aws::waits::DynamoWaits;
use sas_aws::{clients, telemetry};
use sas_engine::ports::Destination;
use sas_engine::services::Scheduler;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let env = Env::process();
    let config = env.engine_config()?;
    let (workflow, agents) = env.workflow()?;
    let (state_table, orders_table) = (env.required("STATE_TABLE")?, env.required("ORDERS_TABLE")?);
    let bus = env.required("EVENT_BUS_NAME")?;
    let waits_table = env.required("QUEUE_WAITS_TABLE")?;
    let linger = env.send_linger()?;
    let mut urls = QueueUrls::default();
    for agent in &agents {
        urls = urls
            .with(Destination::Agent(agent.clone()), env.required(&agent_queue_variable(agent))?);
    }

    let sdk = clients::sdk_config().await;
    let (dynamodb, sqs, events) =
        (clients::dynamodb(&sdk), clients::sqs(&sdk), clients::eventbridge(&sdk));
    clients::warm_up(async {
        tokio::join!(
            clients::touch_table(&dynamodb, &state_table),
            clients::touch_bus(&events, &bus)
        );
    })
    .await;

    // LockedBy names the instance: this execution environment, for as long as it lives.
    let owner = reporter_name("scheduler");
    let scheduler = Scheduler::new(
        DynamoStore::new(dynamodb.clone(), state_table, orders_table),
        Coalescing::new(SqsOutbox::new(sqs, urls), linger),
        EventBridgeBus::new(events, bus),
        SystemClock,
        DynamoWaits::new(dynamodb, waits_table),
        config,
        workflow,
        owner,
    );
    let scheduler = &scheduler;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(sas_scheduler::handle(scheduler, event.payload).await)
    }))
    .await
}
