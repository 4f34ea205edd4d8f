//! The admin function: its settings, the ports they name, and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_admin::Admin;
use sas_admin::settings::Settings;
use sas_aws::clients;
use sas_aws::dead_letters::DeadLetters;
use sas_aws::health::DynamoServiceBook;
use sas_aws::settings::Env;
use sas_aws::sqs::QueueUrls;
use sas_aws::system::SystemClock;
use sas_aws::wiring::Wiring;
use sas_engine::ports::Destination;
use sas_engine::services::{Keyring, Operator, Ports, ServiceDesk, StatusService};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let wiring = Wiring::start("admin").await;
    // An operator's command is about an order someone is looking at: keep its trace.
    sas_aws::trace::keep_every_send();
    let s = Settings::from_env(&Env::process())?;
    clients::warm_up(clients::touch_table(wiring.dynamodb(), &s.tables.state)).await;
    let store = wiring.store(&s.tables);
    let actions = s.engine.catalogue.actions();
    // An order's stored values, read back when an operator asks for them whole; an output
    // given by an operator's answer is stored as an agent's would be.
    let payloads = wiring.payloads(Env::process().get("PAYLOAD_BUCKET"));
    let admin = Admin {
        status: StatusService::new(store.clone()).keeping(payloads.clone()),
        operator: Operator::new(Ports {
            store: store.clone(),
            outbox: wiring
                .outbox(QueueUrls::default().with(Destination::Scheduler, s.scheduler_queue)),
            bus: wiring.bus(&s.bus),
            clock: SystemClock,
            config: s.engine.config.clone(),
            catalogue: s.engine.catalogue.clone(),
            payloads,
        }),
        finder: store.clone(),
        clock: SystemClock,
        desk: ServiceDesk {
            book: DynamoServiceBook::new(wiring.dynamodb().clone(), s.services_table),
            index: store.clone(),
            clock: SystemClock,
            agents: s.engine.agents.clone(),
            limits: s.engine.config.limits.clone(),
            actions,
        },
        keyring: Keyring::new(store),
        catalogue: s.engine.catalogue,
        console: s.console.map(|c| sas_admin::console::ConsoleSite::new(c, s.identity_endpoint)),
        shards: s.engine.config.index_shards,
        dead_letters: DeadLetters::new(wiring.sqs().clone(), s.dead_letter_queues),
    };
    let (admin, wiring) = (&admin, &wiring);
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(wiring.invocation(sas_admin::handle(admin, request)).await)
    }))
    .await
}
