//! What the scheduler reads from its environment, all of it at cold start.

use std::time::Duration;

use sas_aws::settings::{Engine, Env, Tables};
use sas_aws::sqs::QueueUrls;
use sas_engine::Result;
use sas_engine::ports::Destination;

#[derive(Clone, Debug)]
pub struct Settings {
    pub engine: Engine,
    pub tables: Tables,
    pub bus: String,
    pub waits_table: String,
    /// How long a request may wait for others to share a send (`SEND_LINGER_MS`).
    pub linger: Duration,
    /// Each agent's request queue, and its own two queues (`SCHEDULER_QUEUE_URL`,
    /// `REPLY_QUEUE_URL`), where a message kept back by a passing cause is sent again.
    pub queues: QueueUrls,
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        let engine = env.engine()?;
        let mut queues = QueueUrls::default()
            .with(Destination::Scheduler, env.required("SCHEDULER_QUEUE_URL")?)
            .with(Destination::Replies, env.required("REPLY_QUEUE_URL")?);
        for agent in &engine.agents {
            queues = queues.with(Destination::Agent(agent.clone()), env.agent_queue(agent)?);
        }
        Ok(Settings {
            tables: env.tables()?,
            bus: env.required("EVENT_BUS_NAME")?,
            waits_table: env.required("QUEUE_WAITS_TABLE")?,
            linger: env.send_linger()?,
            queues,
            engine,
        })
    }
}
