//! What every agent reads from its environment at cold start, whatever its service: its name
//! (`AGENT_NAME`), its own queue (found by its name, where a request kept back by a passing
//! cause is sent again), the reply queue, the wait reports' table, the services' health table,
//! its service's declared limits, the engine's tunables, the send linger and the payload
//! bucket.

use std::sync::Arc;
use std::time::Duration;

use sas_aws::settings::Env;
use sas_engine::config::EngineConfig;
use sas_engine::pace::Limits;
use sas_engine::{AgentName, Result};

/// An agent's settings, read once at cold start; [`crate::run`] hands them to the service's
/// builder beside the [`crate::Wiring`].
#[derive(Clone, Debug)]
pub struct AgentSettings {
    /// The engine's tunables (retries, budgets), from the stack's parameters.
    pub config: Arc<EngineConfig>,
    /// The agent's name, its entry in the template's list (`AGENT_NAME`).
    pub name: String,
    /// Where replies go (`REPLY_QUEUE_URL`).
    pub reply_queue: String,
    /// The agent's own request queue, found by its name (`AGENT_QUEUE_URL_PREFIX` + name).
    pub own_queue: String,
    /// The table the queues' waits are reported to (`QUEUE_WAITS_TABLE`).
    pub waits_table: String,
    /// Where its service's health is kept (`SERVICES_TABLE`).
    pub services_table: String,
    /// What its service accepts: its entries in `SERVICE_RATES` and `SERVICE_CONCURRENCY`.
    pub limits: Limits,
    /// How long a reply may wait for others to share a send (`SEND_LINGER_MS`).
    pub linger: Duration,
    /// Where large inputs and outputs are kept (`PAYLOAD_BUCKET`); none: an output larger
    /// than a message carries is too large.
    pub payload_bucket: Option<String>,
}

impl AgentSettings {
    /// Reads the settings from `env`; a missing variable is named in the error.
    pub fn from_env(env: &Env) -> Result<AgentSettings> {
        let name = env.required("AGENT_NAME")?;
        let config = env.engine_config()?;
        Ok(AgentSettings {
            limits: config.limits_of(&name),
            config,
            own_queue: env.agent_queue(&AgentName::new(&name))?,
            reply_queue: env.required("REPLY_QUEUE_URL")?,
            waits_table: env.required("QUEUE_WAITS_TABLE")?,
            services_table: env.required("SERVICES_TABLE")?,
            linger: env.send_linger()?,
            payload_bucket: env.get("PAYLOAD_BUCKET"),
            name,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_finds_its_own_queue_by_its_name_and_a_missing_one_is_named() {
        let env = |extra: &[(&'static str, &'static str)]| {
            let base = [
                ("AGENT_NAME", "payment"),
                ("REPLY_QUEUE_URL", "https://q/replies"),
                ("QUEUE_WAITS_TABLE", "waits"),
                ("SERVICES_TABLE", "services"),
            ];
            Env::from_pairs(base.into_iter().chain(extra.iter().copied()))
        };
        let s =
            AgentSettings::from_env(&env(&[("AGENT_QUEUE_URL_PREFIX", "https://q/st-")])).unwrap();
        assert_eq!((s.name.as_str(), s.own_queue.as_str()), ("payment", "https://q/st-payment"));
        let missing = AgentSettings::from_env(&env(&[])).unwrap_err().to_string();
        assert!(missing.contains("AGENT_QUEUE_URL_PREFIX"), "{missing}");
    }
}
