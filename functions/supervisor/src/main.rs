//! The supervisor function: its settings, the ports they name, and the handler. Invoked by an
//! EventBridge schedule; the event's content is not used.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::health::DynamoServiceBook;
use sas_aws::settings::Env;
use sas_aws::sqs::QueueUrls;
use sas_aws::system::SystemClock;
use sas_aws::trace::TraceIds;
use sas_aws::wiring::Wiring;
use sas_engine::payload::NoPayloads;
use sas_engine::ports::Destination;
use sas_engine::services::{Ports, Starter, Supervisor};
use sas_supervisor::settings::Settings;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let wiring = Wiring::start("supervisor").await;
    // What the supervisor sends is about orders in trouble (a lease or a deadline ran out, a
    // hold ended) or started by a schedule: few, and each worth its trace.
    sas_aws::trace::keep_every_send();
    let Settings { starter: s, services_table, look_back } = Settings::from_env(&Env::process())?;
    let store = wiring.store(&s.tables);
    let book = DynamoServiceBook::new(wiring.dynamodb().clone(), services_table);
    let ports = Ports {
        store: store.clone(),
        outbox: wiring.outbox(QueueUrls::default().with(Destination::Scheduler, s.scheduler_queue)),
        bus: wiring.bus(&s.bus),
        clock: SystemClock,
        config: s.engine.config,
        catalogue: s.engine.catalogue,
        payloads: NoPayloads,
    };
    // A schedule's order is let in whatever the queues' load: one order a time.
    let starter = Starter::unmetered(ports.clone(), TraceIds);
    let supervisor = Supervisor::new(ports, store, wiring.gauges(&s.waits_table, s.queues));
    let (supervisor, wiring, book, starter) = (&supervisor, &wiring, &book, &starter);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<serde_json::Value>| async move {
        // On the heap: a sweep's future, with the services' tending, is a large one.
        let swept = Box::pin(sas_supervisor::handle(supervisor, book, starter, look_back));
        wiring.invocation(swept).await.map_err(Error::from)
    }))
    .await
}
