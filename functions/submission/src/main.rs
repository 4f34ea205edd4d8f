//! The submission function: its settings, the ports they name, and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_aws::clients;
use sas_aws::settings::Env;
use sas_aws::sqs::QueueUrls;
use sas_aws::system::SystemClock;
use sas_aws::trace::TraceIds;
use sas_aws::wiring::Wiring;
use sas_engine::ports::Destination;
use sas_engine::services::{Operator, Ports, Submission};
use sas_submission::settings::Settings;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let wiring = Wiring::start("submission").await;
    let s = Settings::from_env(&Env::process())?;
    clients::warm_up(async {
        tokio::join!(
            clients::touch_table(wiring.dynamodb(), &s.tables.state),
            clients::touch_queue(wiring.sqs(), &s.scheduler_queue),
            clients::touch_bus(wiring.eventbridge(), &s.bus)
        );
    })
    .await;

    let ports = || Ports {
        store: wiring.store(&s.tables),
        outbox: wiring
            .outbox(QueueUrls::default().with(Destination::Scheduler, s.scheduler_queue.clone())),
        bus: wiring.bus(&s.bus),
        clock: SystemClock,
        config: s.engine.config.clone(),
        catalogue: s.engine.catalogue.clone(),
        payloads: wiring.payloads(s.payload_bucket.clone()),
    };
    let answers = Operator::new(ports());
    let submission = Submission::new(ports(), TraceIds, wiring.gauges(&s.waits_table, s.queues));
    let (submission, answers, wiring) = (&submission, &answers, &wiring);
    lambda_http::run(service_fn(move |request: Request| async move {
        let response = sas_submission::route(submission, answers, request);
        Ok::<_, Error>(wiring.invocation(response).await)
    }))
    .await
}
