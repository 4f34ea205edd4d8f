//! An agent function: wires configuration, clients and the handler. One binary serves every
//! agent; `AGENT_NAME` and `SERVICE_URL` say which service this deployment wraps.

use std::time::Duration;

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::batch::Coalescing;
use sas_aws::http::HttpRemote;
use sas_aws::settings::{Env, reporter_name};
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::{Jitter, SystemClock};
use sas_aws::waits::DynamoWaits;
use sas_aws::{clients, telemetry};
use sas_engine::AgentName;
use sas_engine::load::WaitReporter;
use sas_engine::ports::Destination;
use sas_engine::services::Agent;

/// Default cap on one call to the remote service.
const DEFAULT_CALL_TIMEOUT_MS: u64 = 10_000;

#[tokio::main]
async fn main() -> Result<(), Error> {
    telemetry::init();
    let env = Env::process();
    let config = env.engine_config()?;
    let name = env.required("AGENT_NAME")?;
    let service_url = env.required("SERVICE_URL")?;
    let replies = env.required("REPLY_QUEUE_URL")?;
    let timeout_ms = match env.get("CALL_TIMEOUT_MS") {
        Some(v) => v
            .parse()
            .map_err(|_| format!("CALL_TIMEOUT_MS={v:?} is not a number of milliseconds"))?,
        None => DEFAULT_CALL_TIMEOUT_MS,
    };
    let linger = env.send_linger()?;

    let waits_table = env.required("QUEUE_WAITS_TABLE")?;

    let sdk = clients::sdk_config().await;
    let (sqs, dynamodb) = (clients::sqs(&sdk), clients::dynamodb(&sdk));
    clients::warm_up(clients::touch_queue(&sqs, &replies)).await;

    let remote = HttpRemote::new(&service_url, Duration::from_millis(timeout_ms))?;
    let replies = QueueUrls::default().with(Destination::Replies, replies);
    let outbox = Coalescing::new(SqsOutbox::new(sqs, replies), linger);
    let waits = WaitReporter::new(
        DynamoWaits::new(dynamodb, waits_table),
        reporter_name(&format!("agent-{name}")),
        config.claim_grace,
    );
    let queue = Destination::Agent(AgentName::new(&name));
    let agent = Agent::new(
        remote,
        outbox,
        SystemClock,
        Jitter::default(),
        config.agent_retry,
        queue,
        waits,
    );
    tracing::info!(agent = %name, %service_url, "agent ready");
    let agent = &agent;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(sas_agent::handle(agent, event.payload).await)
    }))
    .await
}
