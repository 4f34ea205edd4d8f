//! The HTTP agent: the kit's agent on a service reached over HTTP. One binary serves every
//! such agent; its settings say which service it wraps and how it authenticates there.

use lambda_runtime::Error;
use sas_agent::settings::{Auth, Settings};
use sas_aws::clients;
use sas_aws::http::{HttpRemote, ServiceAuth};
use sas_aws::settings::Env;
use sas_aws::signing::SigV4;
use sas_aws::wiring::Wiring;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let s = Settings::from_env(&Env::process())?;
    sas_agent_kit::run(async |wiring, _| {
        let auth = service_auth(wiring, &s.auth).await?;
        tracing::info!(service_url = %s.service_url, auth = ?s.auth, "calling over HTTP");
        Ok(HttpRemote::new(&s.service_url, s.call_timeout)?.with_auth(auth))
    })
    .await
}

/// The credentials calls to the service carry; a secret is read here, once.
async fn service_auth(wiring: &Wiring, auth: &Auth) -> Result<ServiceAuth, Error> {
    let sdk = wiring.sdk();
    Ok(match auth {
        Auth::None => ServiceAuth::None,
        Auth::SigV4 { signing_name } => ServiceAuth::SigV4(
            SigV4::from_config(sdk, signing_name)
                .ok_or("SigV4 needs AWS credentials and a region to sign with")?,
        ),
        Auth::Bearer { secret_id } => {
            ServiceAuth::bearer(&clients::secret_text(sdk, secret_id).await?)?
        }
        Auth::ApiKey { secret_id } => {
            ServiceAuth::header("x-api-key", &clients::secret_text(sdk, secret_id).await?)?
        }
    })
}
