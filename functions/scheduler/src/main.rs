//! The scheduler function: its settings, the ports they name, and the handler.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::batch::Coalescing;
use sas_aws::clients;
use sas_aws::settings::{Env, reporter_name};
use sas_aws::system::SystemClock;
use sas_aws::trace::TraceIds;
use sas_aws::wiring::Wiring;
use sas_engine::services::{Ports, Scheduler, Starter};
use sas_scheduler::settings::Settings;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let wiring = Wiring::start("scheduler").await;
    let s = Settings::from_env(&Env::process())?;
    clients::warm_up(async {
        tokio::join!(
            clients::touch_table(wiring.dynamodb(), &s.tables.state),
            clients::touch_bus(wiring.eventbridge(), &s.bus)
        );
    })
    .await;

    // LockedBy names the instance: this execution environment, for as long as it lives.
    let owner = reporter_name("scheduler");
    let ports = Ports {
        store: wiring.store(&s.tables),
        outbox: Coalescing::new(wiring.outbox(s.queues), s.linger),
        bus: wiring.bus(&s.bus),
        clock: SystemClock,
        config: s.engine.config,
        catalogue: s.engine.catalogue,
        // A child's input read from a stored value, a child's outputs kept for its parent.
        payloads: wiring.payloads(Env::process().get("PAYLOAD_BUCKET")),
    };
    // The bus's events start orders as a client's submission would, without its door.
    let starter = Starter::unmetered(ports.clone(), TraceIds);
    let scheduler = Scheduler::new(ports, wiring.waits(&s.waits_table), owner);
    let (scheduler, starter, wiring) = (&scheduler, &starter, &wiring);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        // On the heap: a batch's handler is a large future.
        let handled = Box::pin(sas_scheduler::handle(scheduler, starter, event.payload));
        Ok::<_, Error>(wiring.invocation(handled).await)
    }))
    .await
}
