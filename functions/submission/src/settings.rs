//! What submission reads from its environment, all of it at cold start.

use sas_aws::settings::{Engine, Env, Tables};
use sas_engine::Result;
use sas_engine::ports::Destination;

#[derive(Clone, Debug)]
pub struct Settings {
    pub engine: Engine,
    pub tables: Tables,
    pub scheduler_queue: String,
    pub bus: String,
    /// Every queue, whose depth the door reads.
    pub queues: Vec<(Destination, String)>,
    pub waits_table: String,
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        let engine = env.engine()?;
        Ok(Settings {
            tables: env.tables()?,
            scheduler_queue: env.required("SCHEDULER_QUEUE_URL")?,
            bus: env.required("EVENT_BUS_NAME")?,
            queues: env.queues(&engine.agents)?,
            waits_table: env.required("QUEUE_WAITS_TABLE")?,
            engine,
        })
    }
}
