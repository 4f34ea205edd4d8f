//! Configuration of a function, read once at cold start from its environment.
//!
//! Names of resources come from the template (`STATE_TABLE`, `SCHEDULER_QUEUE_URL`, ...); the
//! engine's tunables are read by [`EngineConfig::from_lookup`] with their documented defaults.
//! A missing variable is an error that names it, so a misconfigured function fails its first
//! invocation with a clear message instead of misbehaving later.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::ports::Destination;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, Error, Result};
use sas_workflows::WorkflowFile;

use crate::dead_letters::DeadLetterQueue;

/// A source of settings: the process environment, or a map in tests.
#[derive(Clone, Debug, Default)]
pub struct Env {
    overrides: Option<HashMap<String, String>>,
}

impl Env {
    /// Reads the process environment.
    pub fn process() -> Self {
        Env { overrides: None }
    }

    /// Reads only the given pairs (for tests).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        Env {
            overrides: Some(pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()),
        }
    }

    pub fn get(&self, name: &str) -> Option<String> {
        match &self.overrides {
            Some(map) => map.get(name).cloned(),
            None => std::env::var(name).ok(),
        }
        .filter(|v| !v.is_empty())
    }

    pub fn required(&self, name: &str) -> Result<String> {
        self.get(name)
            .ok_or_else(|| Error::Config(format!("environment variable {name} is not set")))
    }

    /// The engine's tunables.
    pub fn engine_config(&self) -> Result<Arc<EngineConfig>> {
        EngineConfig::from_lookup(|k| self.get(k)).map(Arc::new)
    }

    /// The workflows the stack runs and the agents their steps name: every workflow file
    /// built in from `shared/workflows/` (see [`built_in_catalogue`]), or `WORKFLOW_JSON` where
    /// set, one workflow or a list of them (the tests and the demo shorten budgets with it).
    /// That every agent is deployed is checked before a deploy (`check-workflows`, and the
    /// suite), and at cold start by the functions that reach the agents' queues.
    pub fn catalogue(&self) -> Result<(Arc<Catalogue>, Vec<AgentName>)> {
        let catalogue = match self.get("WORKFLOW_JSON") {
            Some(json) => {
                let value: serde_json::Value = serde_json::from_str(&json)
                    .map_err(|e| Error::InvalidWorkflow(format!("WORKFLOW_JSON: {e}")))?;
                let list = match value {
                    serde_json::Value::Array(list) => list,
                    one => vec![one],
                };
                let workflows = list
                    .iter()
                    .map(|w| {
                        let json = w.to_string();
                        Workflow::from_json(&json, &Workflow::agents_in(&json))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Catalogue::new(workflows)?
            }
            None => built_in_catalogue()?,
        };
        let agents = catalogue.agents();
        Ok((Arc::new(catalogue), agents))
    }
}

/// The workflows a stack runs: every file of `shared/workflows/`, each version kept.
pub fn built_in_catalogue() -> Result<Catalogue> {
    let workflows = sas_workflows::FILES
        .iter()
        .map(|file| load_workflow_file(file, &Workflow::agents_in(file.json)))
        .collect::<Result<Vec<_>>>()?;
    Catalogue::new(workflows)
}

/// One workflow file, checked against the deployed `agents`; an error names the file, and the
/// field where the file has one wrong.
pub fn load_workflow_file(file: &WorkflowFile, agents: &[AgentName]) -> Result<Workflow> {
    load_workflow(file.path, file.name, file.json, agents)
}

pub use sas_engine::workflow::load_file as load_workflow;

/// The tables every engine function reads: `STATE_TABLE`, `ORDERS_TABLE` and `KEYS_TABLE`.
#[derive(Clone, Debug)]
pub struct Tables {
    pub state: String,
    pub orders: String,
    /// The concurrency keys' places and lines.
    pub keys: String,
}

/// What every function that runs workflows reads: the engine's tunables, the workflows and
/// the agents they use.
#[derive(Clone, Debug)]
pub struct Engine {
    pub config: Arc<EngineConfig>,
    pub catalogue: Arc<Catalogue>,
    pub agents: Vec<AgentName>,
}

impl Env {
    pub fn tables(&self) -> Result<Tables> {
        Ok(Tables {
            state: self.required("STATE_TABLE")?,
            orders: self.required("ORDERS_TABLE")?,
            keys: self.required("KEYS_TABLE")?,
        })
    }

    pub fn engine(&self) -> Result<Engine> {
        let (catalogue, agents) = self.catalogue()?;
        Ok(Engine { config: self.engine_config()?, catalogue, agents })
    }
}

/// What the functions that start orders and weigh the queues' load read (submission and the
/// supervisor): the engine and its tables, the scheduler queue orders start on, the bus, every
/// queue (whose depth the door reads, and which tells the supervisor a late message from a
/// lost one), and the table of the consumers' wait reports.
#[derive(Clone, Debug)]
pub struct Starter {
    pub engine: Engine,
    pub tables: Tables,
    pub scheduler_queue: String,
    pub bus: String,
    pub queues: Vec<(Destination, String)>,
    pub waits_table: String,
    /// Where large inputs are stored (`PAYLOAD_BUCKET`); none: every input is kept inline.
    pub payload_bucket: Option<String>,
}

impl Starter {
    pub fn from_env(env: &Env) -> Result<Starter> {
        let engine = env.engine()?;
        Ok(Starter {
            tables: env.tables()?,
            scheduler_queue: env.required("SCHEDULER_QUEUE_URL")?,
            bus: env.required("EVENT_BUS_NAME")?,
            queues: env.queues(&engine.agents)?,
            waits_table: env.required("QUEUE_WAITS_TABLE")?,
            payload_bucket: env.get("PAYLOAD_BUCKET"),
            engine,
        })
    }
}

impl Env {
    /// Every queue of the system with its URL: `SCHEDULER_QUEUE_URL`, `REPLY_QUEUE_URL`, and
    /// each agent's (see [`Env::agent_queue`]).
    pub fn queues(&self, agents: &[AgentName]) -> Result<Vec<(Destination, String)>> {
        let mut queues = vec![
            (Destination::Scheduler, self.required("SCHEDULER_QUEUE_URL")?),
            (Destination::Replies, self.required("REPLY_QUEUE_URL")?),
        ];
        for agent in agents {
            queues.push((Destination::Agent(agent.clone()), self.agent_queue(agent)?));
        }
        Ok(queues)
    }

    /// An agent's request queue: named `<stack id>_agent_<agent>` by the template, so its URL
    /// is `AGENT_QUEUE_URL_PREFIX` and the agent's name. A loop declares each agent, and cannot
    /// list them all in another function's settings: the name is what they share.
    pub fn agent_queue(&self, agent: &AgentName) -> Result<String> {
        Ok(format!("{}{}", self.required(AGENT_QUEUE_URL_PREFIX)?, agent.as_str()))
    }
}

/// The variable that, followed by an agent's name, makes the URL of its request queue.
pub const AGENT_QUEUE_URL_PREFIX: &str = "AGENT_QUEUE_URL_PREFIX";

/// The variable that, followed by an agent's name, makes the URL of its dead-letter queue.
pub const AGENT_DEAD_LETTERS_URL_PREFIX: &str = "AGENT_DEAD_LETTERS_URL_PREFIX";

impl Env {
    /// Every dead-letter queue with the queue it serves, named as operators name them
    /// (`scheduler`, `replies`, the agent's name): `DEAD_LETTER_QUEUE_SCHEDULER` and
    /// `DEAD_LETTER_QUEUE_REPLIES`, and for an agent [`AGENT_DEAD_LETTERS_URL_PREFIX`]
    /// followed by its name.
    pub fn dead_letter_queues(&self, agents: &[AgentName]) -> Result<Vec<DeadLetterQueue>> {
        let mut out = Vec::new();
        for (destination, source_url) in self.queues(agents)? {
            let name = match &destination {
                Destination::Scheduler => "scheduler".to_owned(),
                Destination::Replies => "replies".to_owned(),
                Destination::Agent(agent) => agent.as_str().to_owned(),
            };
            let url = match &destination {
                Destination::Agent(agent) => {
                    format!("{}{}", self.required(AGENT_DEAD_LETTERS_URL_PREFIX)?, agent.as_str())
                }
                _ => self.required(&format!("DEAD_LETTER_QUEUE_{}", name.to_ascii_uppercase()))?,
            };
            out.push(DeadLetterQueue { url, name, source_url });
        }
        Ok(out)
    }
}

/// A name for this process in the reports it makes: its role and a fresh id, since every
/// execution environment keeps its own figures.
pub fn reporter_name(role: &str) -> String {
    format!("{role}/{}", uuid::Uuid::new_v4())
}

/// Default of `SEND_LINGER_MS`.
pub const DEFAULT_SEND_LINGER_MS: u64 = 100;
/// Largest `SEND_LINGER_MS` accepted: a message must not wait long enough to matter to a lease.
const MAX_SEND_LINGER_MS: u64 = 1000;

impl Env {
    /// How long a message sent while a batch is handled may wait for the batch's other messages
    /// to share a `SendMessageBatch` with them (`SEND_LINGER_MS`).
    pub fn send_linger(&self) -> Result<Duration> {
        let Some(v) = self.get("SEND_LINGER_MS") else {
            return Ok(Duration::from_millis(DEFAULT_SEND_LINGER_MS));
        };
        match v.parse::<u64>() {
            Ok(ms) if ms <= MAX_SEND_LINGER_MS => Ok(Duration::from_millis(ms)),
            _ => Err(Error::Config(format!(
                "SEND_LINGER_MS={v:?} must be a number of milliseconds from 0 to {MAX_SEND_LINGER_MS}"
            ))),
        }
    }
}

impl Env {
    /// `agent`'s value in the list `variable` of `agent=value` entries separated by commas
    /// (how the template passes one setting per agent), if it has one: the template gives each
    /// agent only its own entry, `agent=` where it has none.
    pub fn entry(&self, variable: &str, agent: &str) -> Result<Option<String>> {
        let list = self.get(variable).unwrap_or_default();
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let Some((name, value)) = item.split_once('=') else {
                return Err(Error::Config(format!(
                    "{variable}: {item:?} is not an agent=value entry"
                )));
            };
            if name.trim() == agent {
                let value = value.trim();
                return Ok((!value.is_empty()).then(|| value.to_owned()));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workflow_file_s_errors_name_the_file_and_the_field() {
        let agents = ["inventory", "payment", "shipping"].map(AgentName::new);
        let file = |name, json| WorkflowFile { name, path: "shared/workflows/x.json", json };
        let cases = [
            (
                file(
                    "w",
                    r#"{"name":"w","steps":[{"name":"a","agent":"payment","budget_seconds":"30"}]}"#,
                ),
                "shared/workflows/x.json: steps[0].budget_seconds: invalid type",
            ),
            (
                file("w", r#"{"name":"w","steps":[{"name":"a","agent":"fax"}]}"#),
                "shared/workflows/x.json: w: step \"a\" names agent \"fax\", which is not deployed",
            ),
            (
                file("x", r#"{"name":"w","steps":[{"name":"a","agent":"payment"}]}"#),
                "shared/workflows/x.json: name: the workflow is named \"w\", and its file must be named after it (w.json, or w.v1.json for an older version kept)",
            ),
            (
                file(
                    "w",
                    r#"{"name":"w","steps":[{"name":"a","agent":"payment"}],"input_schema":{"type":"nope"}}"#,
                ),
                "shared/workflows/x.json: w: input_schema is not a JSON Schema",
            ),
        ];
        for (f, expected) in cases {
            let err = load_workflow_file(&f, &agents).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
        // An older version is kept in a file named after the workflow and its version.
        let kept =
            file("w.v2", r#"{"name":"w","version":2,"steps":[{"name":"a","agent":"payment"}]}"#);
        assert_eq!(load_workflow_file(&kept, &agents).unwrap().version(), 2);
    }

    #[test]
    fn a_workflow_with_a_concurrency_key_runs_and_one_whose_key_cannot_resolve_is_refused() {
        let keyed = r#"{"name":"w","steps":[{"name":"a","agent":"payment"}],
            "input_schema":{"type":"object","properties":{"customer_id":{"type":"string"}}},
            "concurrency":{"key":"/input/customer_id","limit":1}}"#;
        let (catalogue, _) = Env::from_pairs([("WORKFLOW_JSON", keyed)]).catalogue().unwrap();
        assert_eq!(catalogue.current("w").unwrap().concurrency().unwrap().limit, 1);
        let unresolved = keyed.replace("/input/customer_id", "/input/account");
        let err = Env::from_pairs([("WORKFLOW_JSON", unresolved.as_str())]).catalogue();
        let err = err.unwrap_err().to_string();
        assert!(err.contains("concurrency") && err.contains("no property \"account\""), "{err}");
    }

    #[test]
    fn every_workflow_file_loads_and_the_stack_runs_them_all() {
        let catalogue = built_in_catalogue().unwrap();
        assert_eq!(catalogue.names().len(), sas_workflows::FILES.len(), "one version each");
        assert!(catalogue.current("order-fulfilment").is_some());
        // Whether the template deploys their agents is `check-workflows`' to say.
        let agents = catalogue.agents();
        assert!(agents.iter().any(|a| a.as_str() == "ledger"), "{agents:?}");
    }

    #[test]
    fn missing_variables_are_named() {
        let env = Env::from_pairs([("STATE_TABLE", "")]);
        let err = env.required("STATE_TABLE").unwrap_err().to_string();
        assert!(err.contains("STATE_TABLE"), "{err}");
    }

    #[test]
    fn agents_come_from_the_workflow_and_their_queues_from_their_names() {
        let env = Env::from_pairs([
            ("AGENT_QUEUE_URL_PREFIX", "https://sqs.r.amazonaws.com/1/id_agent_"),
            ("AGENT_DEAD_LETTERS_URL_PREFIX", "https://sqs.r.amazonaws.com/1/id_dlq_"),
            ("SCHEDULER_QUEUE_URL", "https://q/s"),
            ("REPLY_QUEUE_URL", "https://q/r"),
            ("DEAD_LETTER_QUEUE_SCHEDULER", "https://q/sd"),
            ("DEAD_LETTER_QUEUE_REPLIES", "https://q/rd"),
        ]);
        let (catalogue, agents) = env.catalogue().unwrap();
        assert!(agents.len() >= 3, "{agents:?}");
        assert_eq!(catalogue.for_new_order(None).unwrap().name(), "order-fulfilment");
        let dead = env.dead_letter_queues(&agents).unwrap();
        let payment = dead.iter().find(|q| q.name == "payment").unwrap();
        assert_eq!(payment.source_url, "https://sqs.r.amazonaws.com/1/id_agent_payment");
        assert_eq!(payment.url, "https://sqs.r.amazonaws.com/1/id_dlq_payment");
        let missing = Env::from_pairs([]).agent_queue(&agents[0]).unwrap_err().to_string();
        assert!(missing.contains("AGENT_QUEUE_URL_PREFIX"), "{missing}");
    }

    #[test]
    fn the_send_linger_is_bounded() {
        let linger = |v: &str| Env::from_pairs([("SEND_LINGER_MS", v)]).send_linger();
        assert_eq!(Env::from_pairs([]).send_linger().unwrap(), Duration::from_millis(100));
        assert_eq!(linger("0").unwrap(), Duration::ZERO);
        assert_eq!(linger("1000").unwrap(), Duration::from_secs(1));
        for bad in ["1001", "-1", "fast"] {
            assert!(linger(bad).unwrap_err().to_string().contains("SEND_LINGER_MS"), "{bad}");
        }
    }
}
