//! An agent function: wires configuration, clients and the handler. One binary serves every
//! agent; `AGENT_NAME` and `SERVICE_URL` say which service this deployment wraps, and
//! `SERVICE_AUTH` how it authenticates there (in any case): `sigv4` (signed for `SERVICE_SIGNING_NAME`, by
//! default `lambda` for function URLs and `execute-api` otherwise), `bearer` or `api-key` (the
//! text of the secret `SERVICE_SECRET_ARN`, read once per cold start), or `none`.

use std::time::Duration;

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_aws::batch::Coalescing;
use sas_aws::http::{HttpRemote, ServiceAuth};
use sas_aws::settings::{Env, reporter_name};
use sas_aws::signing::SigV4;
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

    let auth = service_auth(&env, &sdk, &service_url).await?;
    let remote = HttpRemote::new(&service_url, Duration::from_millis(timeout_ms))?.with_auth(auth);
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
    tracing::info!(agent = %name, %service_url, auth = %env.get("SERVICE_AUTH").unwrap_or_default(), "agent ready");
    let agent = &agent;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(sas_agent::handle(agent, event.payload).await)
    }))
    .await
}

/// How calls to the service authenticate, from `SERVICE_AUTH` and its companions.
async fn service_auth(
    env: &Env,
    sdk: &aws_config::SdkConfig,
    service_url: &str,
) -> Result<ServiceAuth, Error> {
    let secret = || async {
        let arn = env.required("SERVICE_SECRET_ARN")?;
        sas_aws::clients::secret_text(sdk, &arn).await.map_err(Error::from)
    };
    // The template passes its parameter's spelling (SIGV4, API_KEY, ...).
    let kind = env.get("SERVICE_AUTH").unwrap_or_default().to_ascii_lowercase().replace('_', "-");
    Ok(match kind.as_str() {
        "none" | "" => ServiceAuth::None,
        "sigv4" => {
            let name = env.get("SERVICE_SIGNING_NAME").unwrap_or_else(|| {
                let function_url = service_url.contains(".lambda-url.");
                if function_url { "lambda" } else { "execute-api" }.to_owned()
            });
            ServiceAuth::SigV4(
                SigV4::from_config(sdk, &name)
                    .ok_or("SERVICE_AUTH=sigv4 needs AWS credentials and a region to sign with")?,
            )
        }
        "bearer" => ServiceAuth::bearer(&secret().await?)?,
        "api-key" => ServiceAuth::header("x-api-key", &secret().await?)?,
        other => {
            return Err(format!(
                "SERVICE_AUTH={other:?} is not one of sigv4, bearer, api-key, none"
            )
            .into());
        }
    })
}
