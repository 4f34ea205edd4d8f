//! What the supervisor reads from its environment, all of it at cold start: what submission
//! reads, since both start orders and weigh the queues' load, the services' health table, and
//! its own schedule.

use std::time::Duration;

use sas_aws::settings::{Env, Starter};
use sas_engine::starts::{MIN_LOOK_BACK, Schedule, look_back};
use sas_engine::{Error, Result};

/// The supervisor's settings: a starter's, and the services' health table.
#[derive(Clone, Debug)]
pub struct Settings {
    pub starter: Starter,
    /// Each service's health (`SERVICES_TABLE`).
    pub services_table: String,
    /// How far back each sweep looks for the schedules' times: from its own schedule
    /// (`SWEEP_SCHEDULE`, an EventBridge rate or cron), [`MIN_LOOK_BACK`] without one.
    pub look_back: Duration,
}

impl Settings {
    pub fn from_env(env: &Env) -> Result<Settings> {
        Ok(Settings {
            starter: Starter::from_env(env)?,
            services_table: env.required("SERVICES_TABLE")?,
            look_back: match env.get("SWEEP_SCHEDULE") {
                None => MIN_LOOK_BACK,
                Some(sweep) => {
                    let sweep = Schedule::parse(&sweep, None)
                        .map_err(|e| Error::Config(format!("SWEEP_SCHEDULE: {e}")))?;
                    let now = sas_engine::ports::Clock::now(&sas_aws::system::SystemClock);
                    look_back(&sweep, now)
                }
            },
        })
    }
}
