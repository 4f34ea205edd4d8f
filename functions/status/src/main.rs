//! The status function: the two tables it reads, and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_aws::clients;
use sas_aws::settings::Env;
use sas_aws::wiring::Wiring;
use sas_engine::services::StatusService;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let wiring = Wiring::start("status").await;
    let tables = Env::process().tables()?;
    clients::warm_up(clients::touch_table(wiring.dynamodb(), &tables.state)).await;

    let bucket = Env::process().get("PAYLOAD_BUCKET");
    let status = StatusService::new(wiring.store(&tables)).keeping(wiring.payloads(bucket));
    let (status, wiring) = (&status, &wiring);
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(wiring.invocation(sas_status::handle(status, request)).await)
    }))
    .await
}
