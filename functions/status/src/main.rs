//! The status function: wires configuration, clients and the handler.

use lambda_http::{Error, Request, service_fn};
use sas_aws::dynamo::DynamoStore;
use sas_aws::settings::Env;
use sas_aws::{clients, telemetry};
use sas_engine::services::StatusService;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let env = Env::process();
    let (state_table, orders_table) = (env.required("STATE_TABLE")?, env.required("ORDERS_TABLE")?);
    let sdk = clients::sdk_config().await;
    let dynamodb = clients::dynamodb(&sdk);
    clients::warm_up(clients::touch_table(&dynamodb, &state_table)).await;

    let status = StatusService::new(DynamoStore::new(dynamodb, state_table, orders_table));
    let status = &status;
    lambda_http::run(service_fn(move |request: Request| async move {
        Ok::<_, Error>(sas_status::handle(status, request).await)
    }))
    .await
}
