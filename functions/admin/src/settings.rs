//! What the admin function reads from its environment, all of it at cold start.

use sas_aws::dead_letters::DeadLetterQueue;
use sas_aws::settings::{Engine, Env, Tables};
use sas_console::Setting;
use sas_engine::{Error, Result};

#[derive(Clone, Debug)]
pub struct Settings {
    pub engine: Engine,
    pub tables: Tables,
    pub scheduler_queue: String,
    pub bus: String,
    pub dead_letter_queues: Vec<DeadLetterQueue>,
    /// Each service's health (`SERVICES_TABLE`).
    pub services_table: String,
    /// Where the console's users sign in (`CONSOLE_SIGNIN`, JSON), when the stack serves its
    /// console.
    pub console: Option<Setting>,
    /// The identity pools' endpoint the console's page calls: the SDK's endpoint settings
    /// where an emulator stands in for AWS, else Cognito's in the region.
    pub identity_endpoint: String,
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        let engine = env.engine()?;
        Ok(Settings {
            tables: env.tables()?,
            scheduler_queue: env.required("SCHEDULER_QUEUE_URL")?,
            bus: env.required("EVENT_BUS_NAME")?,
            dead_letter_queues: env.dead_letter_queues(&engine.agents)?,
            services_table: env.required("SERVICES_TABLE")?,
            console: match env.get("CONSOLE_SIGNIN") {
                None => None,
                Some(json) => Some(serde_json::from_str(&json).map_err(|e| {
                    Error::Config(format!("CONSOLE_SIGNIN is not the console's sign-in: {e}"))
                })?),
            },

            identity_endpoint: env
                .get("AWS_ENDPOINT_URL_COGNITO_IDENTITY")
                .or_else(|| env.get("AWS_ENDPOINT_URL"))
                .unwrap_or_else(|| {
                    let region = env.get("AWS_REGION").unwrap_or_else(|| "us-east-1".into());
                    format!("https://cognito-identity.{region}.amazonaws.com/")
                }),
            engine,
        })
    }
}
