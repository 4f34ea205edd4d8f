//! What the supervisor reads from its environment, all of it at cold start: what submission
//! reads, since both start orders and weigh the queues' load, and the services' health table.

use sas_aws::settings::{Env, Starter};
use sas_engine::Result;

/// The supervisor's settings: a starter's, and the services' health table.
#[derive(Clone, Debug)]
pub struct Settings {
    pub starter: Starter,
    /// Each service's health (`SERVICES_TABLE`).
    pub services_table: String,
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        Ok(Settings {
            starter: Starter::from_env(env)?,
            services_table: env.required("SERVICES_TABLE")?,
        })
    }
}
