//! What the supervisor reads from its environment, all of it at cold start: the same as submission,
//! since both start orders and weigh the queues' load.

pub use sas_aws::settings::Starter as Settings;
