//! An agent function: its settings, the ports they name, and the handler. One binary serves
//! every agent; its settings say which service it wraps and how it authenticates there.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use sas_agent::settings::{Auth, Settings};
use sas_aws::batch::Coalescing;
use sas_aws::clients;
use sas_aws::http::{HttpRemote, ServiceAuth};
use sas_aws::settings::{Env, reporter_name};
use sas_aws::signing::SigV4;
use sas_aws::sqs::QueueUrls;
use sas_aws::system::{Jitter, SystemClock};
use sas_aws::wiring::Wiring;
use sas_engine::AgentName;
use sas_engine::load::WaitReporter;
use sas_engine::ports::Destination;
use sas_engine::services::Agent;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let s = Settings::from_env(&Env::process())?;
    let wiring = Wiring::start(&format!("agent-{}", s.name)).await;
    clients::warm_up(clients::touch_queue(wiring.sqs(), &s.reply_queue)).await;

    let auth = service_auth(&wiring, &s.auth).await?;
    let remote = HttpRemote::new(&s.service_url, s.call_timeout)?.with_auth(auth);
    let own = Destination::Agent(AgentName::new(&s.name));
    let queues = QueueUrls::default()
        .with(Destination::Replies, s.reply_queue)
        .with(own.clone(), s.own_queue);
    let waits = WaitReporter::new(
        wiring.waits(&s.waits_table),
        reporter_name(&format!("agent-{}", s.name)),
        s.config.claim_grace,
    );
    let agent = Agent::new(
        remote,
        Coalescing::new(wiring.outbox(queues), s.linger),
        SystemClock,
        Jitter::default(),
        s.config.agent_retry,
        own,
        waits,
    );
    tracing::info!(agent = %s.name, service_url = %s.service_url, auth = ?s.auth, "agent ready");
    let (agent, wiring) = (&agent, &wiring);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, Error>(wiring.invocation(sas_agent::handle(agent, event.payload)).await)
    }))
    .await
}

/// The credentials calls to the service carry; a secret is read here, once.
async fn service_auth(wiring: &Wiring, auth: &Auth) -> Result<ServiceAuth, Error> {
    let sdk = wiring.sdk();
    Ok(match auth {
        Auth::None => ServiceAuth::None,
        Auth::SigV4 { signing_name } => ServiceAuth::SigV4(
            SigV4::from_config(sdk, signing_name)
                .ok_or("SERVICE_AUTH=sigv4 needs AWS credentials and a region to sign with")?,
        ),
        Auth::Bearer { secret_arn } => {
            ServiceAuth::bearer(&clients::secret_text(sdk, secret_arn).await?)?
        }
        Auth::ApiKey { secret_arn } => {
            ServiceAuth::header("x-api-key", &clients::secret_text(sdk, secret_arn).await?)?
        }
    })
}
