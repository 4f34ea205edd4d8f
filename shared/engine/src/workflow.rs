//! Workflows as data: an ordered list of steps, each run by an agent within a time budget,
//! optionally undone by a compensating action on the same agent, and either undoing the order
//! or only reported when it fails; a version; and the JSON Schema its orders' input must
//! satisfy.
//!
//! A workflow is loaded and validated once, at cold start. Everything that could make it fail
//! at run time (an agent nobody deployed, two steps with one name, an empty list, a budget no
//! agent could honour, a schema that is not one) is an error at load instead.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::fair::Fairness;
use crate::ids::{AgentName, Direction, Owner};
use crate::keys::{self, Concurrency, MAX_LIMIT as MAX_KEY_LIMIT, OnConflict};
use crate::order::{FieldError, Order, Rejection, token_at};
use crate::retry::WaitPolicy;
use crate::starts::{Pattern, Schedule, Start};

/// Shortest budget a step may have: below this an agent cannot make even one remote call.
pub const MIN_BUDGET: Duration = Duration::from_secs(1);
/// Longest budget a step may have: an agent runs in one Lambda invocation, capped at 15 minutes.
pub const MAX_BUDGET: Duration = Duration::from_secs(900);
/// Budget of a step or compensation that does not name one.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(30);
/// Most steps in a workflow; keeps a state record well under one DynamoDB write unit.
pub const MAX_STEPS: usize = 16;
/// Most expired leases a step may be given before it fails.
pub const MAX_EXPIRED_LEASES: u32 = 10;
/// The shortest `max_hold_seconds`: a hold shorter than a minute would undo orders for a
/// service's passing fault, which the leases' retries are for.
pub const MIN_HOLD: Duration = Duration::from_secs(60);
/// The longest `max_hold_seconds`: a day, as long as services are expected to remember keys.
pub const MAX_HOLD: Duration = Duration::from_secs(24 * 3600);
/// The longest a step may wait for a time: a year and a day.
pub const MAX_WAIT: Duration = Duration::from_secs(366 * 24 * 3600);
/// Most elements a step may run a child for ([`Fan`]): the parent's record holds only counts,
/// but the list of their outputs is one stored value.
pub const MAX_ELEMENTS: u32 = 10_000;
/// Longest value of a search key that finds an order, in bytes: it is the key of an index.
pub const MAX_SEARCH_VALUE_LEN: usize = 256;
/// Most elements of one step in flight at once: each running element is one number on the
/// parent's record, and one more writer of it.
pub const MAX_CONCURRENCY: u32 = 100;

/// A loaded, validated workflow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workflow {
    name: String,
    version: u32,
    steps: Vec<Step>,
    input: InputSchema,
    starts: Vec<Start>,
    concurrency: Option<Concurrency>,
    fairness: Fairness,
    /// Where the value operators find its orders by is in the input (`search_key`): the
    /// pointer relative to the input, and as written.
    search_key: Option<(String, String)>,
}

/// The JSON Schema of a workflow's input, compiled once.
#[derive(Clone)]
pub struct InputSchema {
    schema: Value,
    validator: Arc<jsonschema::Validator>,
}

impl InputSchema {
    fn compile(schema: Value) -> Result<InputSchema, String> {
        let validator = jsonschema::validator_for(&schema).map_err(|e| e.to_string())?;
        Ok(InputSchema { schema, validator: Arc::new(validator) })
    }

    /// The schema as written.
    pub fn schema(&self) -> &Value {
        &self.schema
    }
}

impl PartialEq for InputSchema {
    fn eq(&self, other: &Self) -> bool {
        self.schema == other.schema
    }
}

impl Eq for InputSchema {}

impl fmt::Debug for InputSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InputSchema({})", self.schema)
    }
}

/// The input a workflow without `input_schema` takes: any JSON object.
fn any_object() -> Value {
    serde_json::json!({"type": "object"})
}

/// One step of a workflow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// Unique within the workflow; the action the agent is asked to perform.
    pub name: String,
    /// What the step does: ask its agent, wait for a time, or wait for the outside world.
    pub work: Work,
    /// How long one attempt of the step may take: its CompleteBy is this far in the future.
    pub budget: Duration,
    pub compensation: Option<Compensation>,
    /// How many times its lease (or its undo's) may run out before the step fails; `None`:
    /// the stack's `FAILURE_THRESHOLD`.
    pub expired_leases: Option<u32>,
    /// The wait after its first expired lease, doubling with each further one; `None`: the
    /// stack's `RETRY_WAIT_BASE_SECONDS`.
    pub retry_wait: Option<Duration>,
    /// What its failure does to the order.
    pub on_failure: OnFailure,
    /// How long the step (or its undo) may wait for its service while the service is held,
    /// before that counts as its failure: its own `max_hold_seconds`, else its workflow's;
    /// `None`: the stack's `MAX_HOLD_SECONDS`.
    pub max_hold: Option<Duration>,
    /// The steps that must be done before it starts: by default the step above it in the file.
    pub depends_on: Vec<String>,
}

/// What a step does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Its agent performs it (and its undo, if it has one).
    Agent(AgentName),
    /// It waits, holding nothing but its lease, whose CompleteBy is the time to wake: a wait
    /// cannot fail, has nothing to undo, and an order that stops does not wait for it.
    Wait(Wait),
    /// It waits for a party outside the stack (a person's approval, a partner's webhook) to
    /// complete or refuse it with the token its announcement carries. Its budget is the
    /// timeout, which each heartbeat starts again; past it the step fails as its policy says.
    /// Nothing is sent for it and it has nothing to undo; an order that stops does not wait
    /// for it.
    Callback,
    /// It starts an order of another workflow (a child) and waits for its end: Processed
    /// completes the step with the child's outputs, Error or Cancelled fails it. Its budget is
    /// how long the child may take; past it the child is cancelled. Its undo is the child's
    /// own: a processed child is undone by its compensation.
    Child(Child),
}

/// The order a child step starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Child {
    /// The workflow it runs.
    pub workflow: String,
    /// The version it runs; `None`: the newest when the child starts, which it keeps.
    pub version: Option<u32>,
    /// Where its input is, as a JSON pointer into `{"input": <the order's input>, "outputs":
    /// {<step>: <its output>}}`: `/input` (the default), `/input/tenant`, `/outputs/<step>/id`.
    /// For a step over a list, where the list is: each element is one child's input.
    pub input: String,
    /// `Some` for a step that starts one child per element of the list at `input`.
    pub fan: Option<Fan>,
    /// For a step over a list whose child workflow is a single call of an agent: that call,
    /// which the step makes for each element on its own record rather than starting child
    /// orders (set by the catalogue, which knows the child workflow).
    pub inline: Option<Inline>,
}

/// The one step of a child workflow that a step over a list runs inline: each element is one
/// call of the step's agent under the element's own keys, and its undo one call of the
/// step's compensation, as the element's child order would have made them, without the
/// child's record, messages and index entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inline {
    /// The child's version a pass that starts now runs: the one its child orders would run.
    pub version: u32,
    /// The step of each version of the child that may run inline, by version: a pass runs
    /// the version it started with to its end.
    pub steps: BTreeMap<u32, Step>,
}

impl Inline {
    /// The step a pass that started on `version` runs.
    pub fn step(&self, version: u32) -> Option<&Step> {
        self.steps.get(&version)
    }
}

/// How a step runs a child for each element of a list: its output is the list of the
/// children's outputs, in order (`null` for an element that failed within the tolerance);
/// its undo undoes every child that was processed, and only those.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fan {
    /// Most children in flight at once, forward and while undoing.
    pub max_concurrency: u32,
    /// How many elements may fail before the step does.
    pub tolerance: Tolerance,
    /// Each element runs as a child order of its own even when the child workflow is one
    /// call of an agent ([`Inline`]): its own record, status events and timeline, at the
    /// price of an order.
    pub as_orders: bool,
}

impl Eq for Fan {}

/// How many elements of a list may fail before the step over it fails.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// This many.
    Count(u32),
    /// This share of the elements (0 to 1), rounded down.
    Share(f64),
}

impl Tolerance {
    /// The failures a list of `items` elements tolerates.
    pub fn allows(self, items: u32) -> u32 {
        match self {
            Tolerance::Count(n) => n,
            // Within 0..=1 (checked at load), so the product fits.
            Tolerance::Share(share) => (share * f64::from(items)).floor() as u32,
        }
    }
}

/// How long a waiting step waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// This long from when it starts.
    For(Duration),
    /// Until the time (RFC 3339) at this JSON pointer of the order's input: checked when the
    /// order is submitted, and kept on the record.
    Until(String),
}

/// What a step's failure (a refusal, its leases run out, an output too large) does to the
/// order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The order stops and every step done is undone, last first.
    #[default]
    Undo,
    /// The failure is recorded on the order and sent to the operators; the order goes on
    /// without it (a welcome email that could not be sent does not close the account).
    Report,
}

/// The action that undoes a step, run by the step's agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compensation {
    pub action: String,
    pub budget: Duration,
}

impl Step {
    /// How many times its lease may run out before it fails, the stack's `failure_threshold`
    /// unless the step says.
    pub fn lease_limit(&self, failure_threshold: u32) -> u32 {
        self.expired_leases.unwrap_or(failure_threshold)
    }

    /// The agent that performs the step; `None` for a step that waits.
    pub fn agent(&self) -> Option<&AgentName> {
        match &self.work {
            Work::Agent(agent) => Some(agent),
            Work::Wait(_) | Work::Callback | Work::Child(_) => None,
        }
    }

    /// How long the step waits after each expired lease before it is tried again: its own
    /// first wait if it has one, doubling up to the stack's cap (or its own first wait, if
    /// longer), else the stack's policy.
    pub fn waits(&self, stack: WaitPolicy) -> WaitPolicy {
        match self.retry_wait {
            Some(base) => WaitPolicy { base, max: stack.max.max(base) },
            None => stack,
        }
    }

    /// How long the step may wait for its held service, given the stack's default.
    pub fn max_hold(&self, stack: Duration) -> Duration {
        self.max_hold.unwrap_or(stack)
    }

    /// The remote action and budget for driving this step in `direction`; `None` when asked to
    /// undo a step that has no compensation, and for a step that waits.
    pub fn action(&self, direction: Direction) -> Option<(&str, Duration)> {
        if !matches!(self.work, Work::Agent(_)) {
            return None;
        }
        match direction {
            Direction::Do => Some((&self.name, self.budget)),
            Direction::Undo => self.compensation.as_ref().map(|c| (c.action.as_str(), c.budget)),
        }
    }
}

/// The JSON form of a workflow, as it is written in configuration.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WorkflowSpec {
    name: String,
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    input_schema: Option<Value>,
    /// The `max_hold_seconds` of its steps that name none.
    #[serde(default)]
    max_hold_seconds: Option<u64>,
    steps: Vec<StepSpec>,
    /// What starts its orders without a client.
    #[serde(default)]
    starts: Vec<StartSpec>,
    /// How many of its orders of one key may run at once.
    #[serde(default)]
    concurrency: Option<ConcurrencySpec>,
    /// Whose its orders are, and which go first, when tenants share the stack.
    #[serde(default)]
    fairness: Option<FairnessSpec>,
    /// The value of the input operators find its orders by (a customer, an account).
    #[serde(default)]
    search_key: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct FairnessSpec {
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    priority: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ConcurrencySpec {
    key: String,
    limit: u32,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    max_wait_seconds: Option<u64>,
    #[serde(default)]
    on_conflict: OnConflict,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum StartSpec {
    Event {
        pattern: Value,
        #[serde(default)]
        input: Option<String>,
    },
    Schedule {
        expression: String,
        #[serde(default)]
        timezone: Option<String>,
        #[serde(default)]
        input: Option<Value>,
    },
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct StepSpec {
    name: String,
    #[serde(default)]
    agent: Option<String>,
    #[serde(default)]
    wait: Option<WaitSpec>,
    #[serde(default)]
    callback: Option<CallbackSpec>,
    #[serde(default)]
    child: Option<ChildSpec>,
    #[serde(default)]
    each: Option<EachSpec>,
    #[serde(default)]
    budget_seconds: Option<u64>,
    #[serde(default)]
    compensation: Option<CompensationSpec>,
    #[serde(default)]
    expired_leases: Option<u32>,
    #[serde(default)]
    retry_wait_seconds: Option<u64>,
    #[serde(default)]
    on_failure: OnFailure,
    #[serde(default)]
    max_hold_seconds: Option<u64>,
    /// `None`: the step above it (none for the first).
    #[serde(default)]
    depends_on: Option<Vec<String>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct WaitSpec {
    #[serde(default)]
    seconds: Option<u64>,
    #[serde(default)]
    until: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct CallbackSpec {
    timeout_seconds: u64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct ChildSpec {
    workflow: String,
    #[serde(default)]
    version: Option<u32>,
    #[serde(default)]
    input: Option<String>,
    timeout_seconds: u64,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct EachSpec {
    items: String,
    workflow: String,
    #[serde(default)]
    version: Option<u32>,
    max_concurrency: u32,
    #[serde(default)]
    tolerance: Option<ToleranceSpec>,
    timeout_seconds: u64,
    #[serde(default)]
    as_orders: bool,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
enum ToleranceSpec {
    Count(u32),
    Share(f64),
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct CompensationSpec {
    action: String,
    #[serde(default)]
    budget_seconds: Option<u64>,
}

impl Workflow {
    /// Parses and validates a workflow. `agents` lists the agents that are deployed; a step
    /// naming any other is an error.
    pub fn from_json(json: &str, agents: &[AgentName]) -> Result<Workflow, Error> {
        // The path names the field at fault (`steps[1].budget_seconds`), as a reader of the file
        // needs it.
        let spec: WorkflowSpec =
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(json))
                .map_err(|e| match e.path().to_string().as_str() {
                    "." => Error::InvalidWorkflow(e.inner().to_string()),
                    path => Error::InvalidWorkflow(format!("{path}: {}", e.inner())),
                })?;
        let invalid = |msg: String| Error::InvalidWorkflow(format!("{}: {msg}", spec.name));

        check_name(&spec.name).map_err(|e| Error::InvalidWorkflow(format!("workflow name {e}")))?;
        if spec.steps.is_empty() {
            return Err(invalid("a workflow needs at least one step".into()));
        }
        if spec.steps.len() > MAX_STEPS {
            return Err(invalid(format!("at most {MAX_STEPS} steps are supported")));
        }
        let held = max_hold_of(spec.max_hold_seconds).map_err(invalid)?;
        let mut names = HashSet::new();
        let mut steps: Vec<Step> = Vec::with_capacity(spec.steps.len());
        for s in &spec.steps {
            if !names.insert(s.name.as_str()) {
                return Err(invalid(format!("step {:?} appears twice", s.name)));
            }
            let above = steps.last().map(|p| p.name.clone());
            let mut step = step_of(s, agents, above).map_err(invalid)?;
            if step.agent().is_some() {
                step.max_hold = step.max_hold.or(held);
            }
            steps.push(step);
        }
        let steps = in_dependency_order(steps).map_err(invalid)?;
        let version = spec.version.unwrap_or(1);
        if version == 0 {
            return Err(invalid("version must be 1 or more".into()));
        }
        let input = InputSchema::compile(spec.input_schema.unwrap_or_else(any_object))
            .map_err(|e| invalid(format!("input_schema is not a JSON Schema: {e}")))?;
        let concurrency = match &spec.concurrency {
            Some(c) => Some(
                concurrency_of(&spec.name, c, &input)
                    .map_err(|e| invalid(format!("concurrency: {e}")))?,
            ),
            None => None,
        };
        let fairness = match &spec.fairness {
            Some(f) => fairness_of(f, &input).map_err(|e| invalid(format!("fairness: {e}")))?,
            None => Fairness::default(),
        };
        let search_key = match &spec.search_key {
            Some(declared) => {
                let kinds = &["string", "integer"];
                let pointer =
                    input_property("search_key", declared, &input, kinds).map_err(invalid)?;
                Some((pointer, declared.clone()))
            }
            None => None,
        };
        let mut workflow = Workflow {
            name: spec.name.clone(),
            version,
            steps,
            input,
            starts: Vec::new(),
            concurrency,
            fairness,
            search_key,
        };
        for (i, start) in spec.starts.iter().enumerate() {
            let start =
                workflow.start_of(start).map_err(|e| invalid(format!("starts[{i}]: {e}")))?;
            workflow.starts.push(start);
        }
        // A child's input from a step's output needs that step done before the child starts.
        for s in workflow.steps() {
            if let Work::Child(child) = &s.work
                && let Some(from) = child.input.strip_prefix("/outputs/")
            {
                let from = from.split('/').next().unwrap_or_default();
                if !workflow.upstream(&s.name).contains(from) {
                    return Err(invalid(format!(
                        "step {:?} takes its child's input from {from:?}, which it does not depend on",
                        s.name
                    )));
                }
            }
        }
        Ok(workflow)
    }

    /// What starts its orders without a client, in the order the file declares them.
    pub fn starts(&self) -> &[Start] {
        &self.starts
    }

    /// A declared start, checked: its pattern or schedule, and a schedule's input against the
    /// workflow's schema.
    fn start_of(&self, spec: &StartSpec) -> Result<Start, String> {
        match spec {
            StartSpec::Event { pattern, input } => {
                let input = input.clone().unwrap_or_else(|| "/detail".to_owned());
                if !input.is_empty() && !input.starts_with('/') {
                    return Err(format!("event.input must be a JSON pointer, not {input:?}"));
                }
                Ok(Start::Event { pattern: Pattern::new(pattern)?, input })
            }
            StartSpec::Schedule { expression, timezone, input } => {
                let schedule = Schedule::parse(expression, timezone.as_deref())?;
                let input = input.clone().unwrap_or_else(|| Value::Object(Default::default()));
                let body = serde_json::to_vec(&input).unwrap_or_default();
                if body.len() > crate::payload::MAX_INLINE_INPUT_LEN {
                    return Err("a schedule's input is at most 4 KiB".into());
                }
                self.input(&body).map_err(|e| format!("the schedule's input: {e}"))?;
                Ok(Start::Schedule { schedule, input })
            }
        }
    }

    /// Decodes an order's input and checks it against the workflow's schema. Every problem is
    /// named by its JSON pointer (`/items/2/quantity`; the whole input is the empty pointer),
    /// without the value it was found in.
    pub fn input(&self, body: &[u8]) -> Result<Order, Rejection> {
        let value = strict::parse(body).map_err(|e| Rejection {
            errors: vec![FieldError {
                field: String::new(),
                reason: format!("malformed JSON: {e}"),
            }],
        })?;
        let errors: Vec<FieldError> = self
            .input
            .validator
            .iter_errors(&value)
            .map(|e| FieldError {
                field: e.instance_path().to_string(),
                reason: e.masked().to_string(),
            })
            .collect();
        if errors.is_empty() { Ok(Order(value)) } else { Err(Rejection { errors }) }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// How many orders of one key may run at once, if the workflow says.
    pub fn concurrency(&self) -> Option<&Concurrency> {
        self.concurrency.as_ref()
    }

    /// The concurrency key of an order with `input` (`None` for a workflow without one), or
    /// why its input has none.
    pub fn key_of(&self, input: &Value) -> Result<Option<String>, Rejection> {
        self.concurrency.as_ref().map(|c| c.key_of(input)).transpose()
    }

    /// The pointer into the input, as the file declares it, of the value operators find the
    /// workflow's orders by, if it declares one.
    pub fn search_key(&self) -> Option<&str> {
        self.search_key.as_ref().map(|(_, declared)| declared.as_str())
    }

    /// The value an order with `input` is found by ([`Workflow::search_key`]): a string or an
    /// integer of at most [`MAX_SEARCH_VALUE_LEN`] bytes. An input without one, or with one
    /// longer, is accepted all the same, and the order is found by its id alone.
    pub fn search_value(&self, input: &Value) -> Option<String> {
        let (pointer, _) = self.search_key.as_ref()?;
        let what = ("search key", "a search key");
        token_at(input, pointer, what, MAX_SEARCH_VALUE_LEN, String::new()).ok()
    }

    /// The group of an order with `input` submitted by `owner` ([`crate::fair`]), or why its
    /// input names no tenant.
    pub fn group_of(&self, input: &Value, owner: &Owner, asked: bool) -> Result<String, Rejection> {
        self.fairness.group_of(input, owner, asked)
    }

    pub fn input_schema(&self) -> &InputSchema {
        &self.input
    }

    /// The agents the steps of the workflow in `json` name, each once, in order of first use,
    /// read without checking anything else: for tools and tests that deploy whatever a
    /// workflow needs. Empty if `json` is not a workflow's shape.
    pub fn agents_in(json: &str) -> Vec<AgentName> {
        let spec: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let mut agents: Vec<AgentName> = Vec::new();
        let steps = spec["steps"].as_array().map(Vec::as_slice).unwrap_or_default();
        for agent in steps.iter().filter_map(|s| s["agent"].as_str()).map(AgentName::new) {
            if !agents.contains(&agent) {
                agents.push(agent);
            }
        }
        agents
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Its one step, if a step over a list may run it inline ([`Inline`]): an agent's call
    /// whose failure undoes the order (a reported failure would end the child processed
    /// without its effect), in a workflow with no concurrency key (whose places only child
    /// orders take).
    pub fn inline_step(&self) -> Option<&Step> {
        match self.steps.as_slice() {
            [step]
                if matches!(step.work, Work::Agent(_))
                    && step.on_failure == OnFailure::Undo
                    && self.concurrency.is_none() =>
            {
                Some(step)
            }
            _ => None,
        }
    }

    /// Sets what step `index` (over a list) runs inline.
    pub(crate) fn run_inline(&mut self, index: usize, inline: Inline) {
        if let Some(Work::Child(child)) = self.steps.get_mut(index).map(|s| &mut s.work) {
            child.inline = Some(inline);
        }
    }

    pub fn step(&self, index: usize) -> Option<&Step> {
        self.steps.get(index)
    }

    /// The step called `name`: records name their steps, so that a step is found whatever its
    /// place in the version the record runs.
    pub fn step_named(&self, name: &str) -> Option<&Step> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// The steps `name` depends on, directly or through others (none for a step the workflow
    /// does not have).
    pub fn upstream(&self, name: &str) -> HashSet<&str> {
        let mut found: HashSet<&str> = HashSet::new();
        let mut next: Vec<&str> = vec![name];
        while let Some(step) = next.pop().and_then(|n| self.step_named(n)) {
            for dependency in &step.depends_on {
                if found.insert(dependency.as_str()) {
                    next.push(dependency.as_str());
                }
            }
        }
        found
    }

    /// The steps that depend on `name`, directly or through others: undone before it.
    pub fn downstream(&self, name: &str) -> HashSet<&str> {
        self.steps
            .iter()
            .filter(|s| self.upstream(&s.name).contains(name))
            .map(|s| s.name.as_str())
            .collect()
    }

    /// The agents this workflow uses, each once, in order of first use.
    pub fn agents(&self) -> Vec<&AgentName> {
        let mut seen = Vec::new();
        for agent in self.steps.iter().filter_map(Step::agent) {
            if !seen.contains(&agent) {
                seen.push(agent);
            }
        }
        seen
    }

    /// When each step that waits until a time of the input wakes, for an order accepted at
    /// `now` with `input`; or why the input cannot say: the time is missing, is not an RFC 3339
    /// time, or is further than [`MAX_WAIT`] away.
    pub fn wakes(
        &self,
        input: &Value,
        now: crate::time::Timestamp,
    ) -> Result<Vec<(String, crate::time::Timestamp)>, Rejection> {
        let mut wakes = Vec::new();
        let mut errors = Vec::new();
        for step in &self.steps {
            let Work::Wait(Wait::Until(pointer)) = &step.work else { continue };
            let at = input.pointer(pointer).and_then(Value::as_str);
            let parsed = at.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            let reason = match parsed {
                None => format!(
                    "step {:?} waits until this time: an RFC 3339 time is needed",
                    step.name
                ),
                Some(t) => {
                    let t = crate::time::Timestamp::from_millis(t.timestamp_millis());
                    if t > now.plus(MAX_WAIT) {
                        format!("at most {} days ahead", MAX_WAIT.as_secs() / 86_400)
                    } else {
                        wakes.push((step.name.clone(), t));
                        continue;
                    }
                }
            };
            errors.push(FieldError { field: pointer.clone(), reason });
        }
        if errors.is_empty() { Ok(wakes) } else { Err(Rejection { errors }) }
    }
}

/// One step of a workflow file, checked against the deployed `agents`; `above` is the step
/// before it in the file, which it depends on unless it names its own dependencies.
fn step_of(s: &StepSpec, agents: &[AgentName], above: Option<String>) -> Result<Step, String> {
    check_name(&s.name).map_err(|e| format!("step name {e}"))?;
    let (work, budget) = match (&s.agent, &s.wait, &s.callback, &s.child, &s.each) {
        (Some(agent), None, None, None, None) => {
            let budget =
                parse_budget(s.budget_seconds).map_err(|e| format!("step {:?}: {e}", s.name))?;
            (Work::Agent(agent_of(&s.name, agent, agents)?), budget)
        }
        (None, Some(wait), None, None, None) => (Work::Wait(wait_of(s, wait)?), DEFAULT_BUDGET),
        (None, None, Some(callback), None, None) => {
            (Work::Callback, timeout_of(s, "callback", callback.timeout_seconds)?)
        }
        (None, None, None, Some(child), None) => {
            let timeout = timeout_of(s, "child", child.timeout_seconds)?;
            (Work::Child(child_of(s, child)?), timeout)
        }
        (None, None, None, None, Some(each)) => {
            let timeout = timeout_of(s, "each", each.timeout_seconds)?;
            (Work::Child(each_of(s, each)?), timeout)
        }
        _ => {
            return Err(format!(
                "step {:?} needs one of an agent, a wait, a callback, a child or an each",
                s.name
            ));
        }
    };
    let compensation = match &s.compensation {
        None => None,
        Some(c) => {
            check_name(&c.action)
                .map_err(|e| format!("compensation of {:?}: action {e}", s.name))?;
            if c.action == s.name {
                return Err(format!("step {:?} cannot compensate itself", s.name));
            }
            let budget = parse_budget(c.budget_seconds)
                .map_err(|e| format!("compensation of {:?}: {e}", s.name))?;
            Some(Compensation { action: c.action.clone(), budget })
        }
    };
    if s.expired_leases.is_some_and(|n| !(1..=MAX_EXPIRED_LEASES).contains(&n)) {
        return Err(format!(
            "step {:?}: expired_leases must be from 1 to {MAX_EXPIRED_LEASES}",
            s.name
        ));
    }
    // The wait rides on an SQS delivery delay, 15 minutes at most.
    if s.retry_wait_seconds.is_some_and(|w| w > MAX_BUDGET.as_secs()) {
        return Err(format!(
            "step {:?}: retry_wait_seconds must be from 0 to {}",
            s.name,
            MAX_BUDGET.as_secs()
        ));
    }
    Ok(Step {
        name: s.name.clone(),
        work,
        budget,
        compensation,
        expired_leases: s.expired_leases,
        retry_wait: s.retry_wait_seconds.map(Duration::from_secs),
        on_failure: s.on_failure,
        max_hold: max_hold_of(s.max_hold_seconds).map_err(|e| format!("step {:?}: {e}", s.name))?,
        depends_on: s.depends_on.clone().unwrap_or_else(|| above.into_iter().collect()),
    })
}

/// A `max_hold_seconds`, checked: a step held longer may be resumed after its service has
/// forgotten the keys of the calls made before the hold, so it stays within the day services
/// are expected to remember them (the stack's redrive window, by default).
fn max_hold_of(seconds: Option<u64>) -> Result<Option<Duration>, String> {
    let (least, most) = (MIN_HOLD.as_secs(), MAX_HOLD.as_secs());
    match seconds {
        None => Ok(None),
        Some(n) if (least..=most).contains(&n) => Ok(Some(Duration::from_secs(n))),
        Some(_) => Err(format!("max_hold_seconds must be from {least} to {most}")),
    }
}

/// The agent a step names, if it is deployed.
fn agent_of(step: &str, agent: &str, agents: &[AgentName]) -> Result<AgentName, String> {
    check_agent_name(agent).map_err(|e| format!("step {step:?}: agent {e}"))?;
    let name = AgentName::new(agent);
    if !agents.contains(&name) {
        let deployed: Vec<&str> = agents.iter().map(AgentName::as_str).collect();
        return Err(format!(
            "step {step:?} names agent {agent:?}, which is not deployed: name one of {}, or deploy it",
            deployed.join(", ")
        ));
    }
    Ok(name)
}

/// A step's wait: a number of seconds or a JSON pointer, and nothing an agent's step has.
fn wait_of(s: &StepSpec, wait: &WaitSpec) -> Result<Wait, String> {
    if s.budget_seconds.is_some()
        || s.compensation.is_some()
        || s.expired_leases.is_some()
        || s.retry_wait_seconds.is_some()
        || s.max_hold_seconds.is_some()
        || s.on_failure != OnFailure::Undo
    {
        return Err(format!(
            "step {:?} waits: it has no budget, compensation, expired_leases, retry_wait_seconds, max_hold_seconds or on_failure",
            s.name
        ));
    }
    let most = MAX_WAIT.as_secs();
    match (wait.seconds, &wait.until) {
        (Some(n), None) if (1..=most).contains(&n) => Ok(Wait::For(Duration::from_secs(n))),
        (Some(_), None) => Err(format!("step {:?}: wait.seconds must be from 1 to {most}", s.name)),
        (None, Some(pointer)) if pointer.starts_with('/') => Ok(Wait::Until(pointer.clone())),
        _ => Err(format!(
            "step {:?}: wait needs either seconds or until, a JSON pointer into the input such as \"/refund_at\"",
            s.name
        )),
    }
}

/// A callback's timeout, and nothing a step of an agent has but its failure policy.
/// The timeout of a step that waits for a `what` (a callback, a child), which is its budget.
fn timeout_of(s: &StepSpec, what: &str, seconds: u64) -> Result<Duration, String> {
    if s.budget_seconds.is_some()
        || s.compensation.is_some()
        || s.expired_leases.is_some()
        || s.retry_wait_seconds.is_some()
        || s.max_hold_seconds.is_some()
    {
        return Err(format!(
            "step {:?} waits for a {what}: its timeout is its budget, and it has no compensation, expired_leases, retry_wait_seconds or max_hold_seconds",
            s.name
        ));
    }
    let most = MAX_WAIT.as_secs();
    if !(1..=most).contains(&seconds) {
        return Err(format!("step {:?}: {what}.timeout_seconds must be from 1 to {most}", s.name));
    }
    Ok(Duration::from_secs(seconds))
}

/// A child step's order: its workflow's name (whether it is deployed is the catalogue's to
/// say), and where its input is.
fn child_of(s: &StepSpec, child: &ChildSpec) -> Result<Child, String> {
    let input = child.input.clone().unwrap_or_else(|| "/input".to_owned());
    let (workflow, version) = started(s, "child", &child.workflow, child.version)?;
    check_pointer(s, "child.input", &input)?;
    Ok(Child { workflow, version, input, fan: None, inline: None })
}

/// A step over a list: a child of `each.workflow` for each element at `each.items`.
fn each_of(s: &StepSpec, each: &EachSpec) -> Result<Child, String> {
    let (workflow, version) = started(s, "each", &each.workflow, each.version)?;
    check_pointer(s, "each.items", &each.items)?;
    if !(1..=MAX_CONCURRENCY).contains(&each.max_concurrency) {
        return Err(format!(
            "step {:?}: each.max_concurrency must be from 1 to {MAX_CONCURRENCY}",
            s.name
        ));
    }
    let tolerance = match each.tolerance {
        None => Tolerance::Count(0),
        Some(ToleranceSpec::Count(n)) => Tolerance::Count(n),
        Some(ToleranceSpec::Share(x)) if (0.0..=1.0).contains(&x) => Tolerance::Share(x),
        Some(ToleranceSpec::Share(_)) => {
            return Err(format!("step {:?}: each.tolerance.share must be from 0 to 1", s.name));
        }
    };
    let fan = Fan { max_concurrency: each.max_concurrency, tolerance, as_orders: each.as_orders };
    Ok(Child { workflow, version, input: each.items.clone(), fan: Some(fan), inline: None })
}

/// The workflow (and version) a step of kind `what` starts, checked as far as a file can be
/// alone: whether it is deployed is the catalogue's to say.
fn started(
    s: &StepSpec,
    what: &str,
    workflow: &str,
    version: Option<u32>,
) -> Result<(String, Option<u32>), String> {
    check_name(workflow).map_err(|e| format!("step {:?}: {what}.workflow {e}", s.name))?;
    if version == Some(0) {
        return Err(format!("step {:?}: {what}.version starts at 1", s.name));
    }
    Ok((workflow.to_owned(), version))
}

/// A workflow's `concurrency`, checked against its input schema: the key must be a property
/// the schema declares, as a string or an integer.
fn concurrency_of(
    workflow: &str,
    spec: &ConcurrencySpec,
    input: &InputSchema,
) -> Result<Concurrency, String> {
    if !(1..=MAX_KEY_LIMIT).contains(&spec.limit) {
        return Err(format!("limit must be from 1 to {MAX_KEY_LIMIT}, not {}", spec.limit));
    }
    let group = spec.group.clone().unwrap_or_else(|| workflow.to_owned());
    check_name(&group).map_err(|e| format!("group {e}"))?;
    let max_wait = match spec.max_wait_seconds {
        None => None,
        Some(n) if (1..=keys::MAX_WAIT.as_secs()).contains(&n) => Some(Duration::from_secs(n)),
        Some(_) => {
            return Err(format!("max_wait_seconds must be from 1 to {}", keys::MAX_WAIT.as_secs()));
        }
    };
    let pointer = input_property("key", &spec.key, input, &["string", "integer"])?;
    Ok(Concurrency {
        pointer,
        declared: spec.key.clone(),
        limit: spec.limit,
        group,
        max_wait,
        on_conflict: spec.on_conflict,
    })
}

/// The pointer relative to the input of `declared` (the field `field`, a pointer such as
/// `/input/customer_id`), which the input schema must declare as one of `kinds`.
fn input_property(
    field: &str,
    declared: &str,
    input: &InputSchema,
    kinds: &[&str],
) -> Result<String, String> {
    let Some(pointer) = declared.strip_prefix("/input").filter(|p| p.starts_with('/')) else {
        return Err(format!(
            "{field} must be a JSON pointer into the input such as \"/input/customer_id\", not \
             {declared:?}"
        ));
    };
    let root = input.schema();
    // A schema that is only a reference within the file stands for what it refers to.
    fn resolve<'a>(root: &'a Value, mut schema: &'a Value) -> &'a Value {
        for _ in 0..8 {
            let at = schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#'));
            match at.and_then(|at| root.pointer(at)) {
                Some(target) => schema = target,
                None => break,
            }
        }
        schema
    }
    let mut schema = resolve(root, root);
    for token in pointer.split('/').skip(1) {
        let name = token.replace("~1", "/").replace("~0", "~");
        match schema.get("properties").and_then(|p| p.get(&name)).map(|p| resolve(root, p)) {
            Some(inner) => schema = inner,
            None => {
                return Err(format!(
                    "{field} {declared:?}: the input_schema declares no property {name:?} there"
                ));
            }
        }
    }
    let declared_kinds: Vec<&str> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    if declared_kinds.is_empty() || declared_kinds.iter().any(|k| !kinds.contains(k)) {
        return Err(format!(
            "{field} {declared:?}: the input_schema must declare it {}",
            kinds
                .iter()
                .map(|k| if k.starts_with(['a', 'e', 'i', 'o', 'u']) {
                    format!("an {k}")
                } else {
                    format!("a {k}")
                })
                .collect::<Vec<_>>()
                .join(" or ")
        ));
    }
    Ok(pointer.to_owned())
}

/// A workflow's `fairness`, checked against its input schema.
fn fairness_of(spec: &FairnessSpec, input: &InputSchema) -> Result<Fairness, String> {
    let mut tenant = None;
    if let Some(t) = &spec.tenant {
        tenant = Some((input_property("tenant", t, input, &["string", "integer"])?, t.clone()));
    }
    let mut priority = None;
    if let Some(p) = &spec.priority {
        priority = Some((input_property("priority", p, input, &["boolean"])?, p.clone()));
    }
    Ok(Fairness { tenant, priority })
}

/// Checks that `pointer` (the field `field`) is a JSON pointer under `/input` or
/// `/outputs/<step>`.
fn check_pointer(s: &StepSpec, field: &str, pointer: &str) -> Result<(), String> {
    let root = pointer.split('/').nth(1).unwrap_or_default();
    let valid = pointer.starts_with('/')
        && match root {
            "input" => true,
            "outputs" => pointer.split('/').nth(2).is_some_and(|step| !step.is_empty()),
            _ => false,
        };
    if !valid {
        return Err(format!(
            "step {:?}: {field} must be a JSON pointer under /input or /outputs/<step>, not {pointer:?}",
            s.name
        ));
    }
    Ok(())
}

/// `steps` in an order that runs every step after the steps it depends on, keeping the file's
/// order where the dependencies leave a choice; or why no order can: a dependency on no step
/// of the workflow, or steps that wait on each other, and the steps after them that nothing
/// would ever start.
fn in_dependency_order(steps: Vec<Step>) -> Result<Vec<Step>, String> {
    let index: HashMap<&str, usize> =
        steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
    let mut needs: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    for step in &steps {
        let mut own = Vec::new();
        for dependency in &step.depends_on {
            let Some(&d) = index.get(dependency.as_str()) else {
                let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
                return Err(format!(
                    "step {:?} depends on {dependency:?}, which is not a step of this workflow: name one of {}",
                    step.name,
                    names.join(", ")
                ));
            };
            if dependency == &step.name {
                return Err(format!("step {:?} depends on itself", step.name));
            }
            if own.contains(&d) {
                return Err(format!(
                    "step {:?} names {dependency:?} twice in depends_on",
                    step.name
                ));
            }
            own.push(d);
        }
        needs.push(own);
    }
    let mut placed = vec![false; steps.len()];
    let mut order = Vec::with_capacity(steps.len());
    // The first step (in the file's order) whose dependencies are all placed goes next.
    while let Some(next) =
        (0..steps.len()).find(|&i| !placed[i] && needs[i].iter().all(|&d| placed[d]))
    {
        placed[next] = true;
        order.push(next);
    }
    if order.len() < steps.len() {
        return Err(unreachable_steps(&steps, &needs, &placed));
    }
    let mut steps: Vec<Option<Step>> = steps.into_iter().map(Some).collect();
    Ok(order.into_iter().filter_map(|i| steps[i].take()).collect())
}

/// Why the steps not `placed` can never start: the circle of steps waiting on each other, and
/// the steps that wait on them.
fn unreachable_steps(steps: &[Step], needs: &[Vec<usize>], placed: &[bool]) -> String {
    // Walking back through unplaced dependencies from any unplaced step must come round to a
    // step already walked: that loop is a circle.
    let start = placed.iter().position(|p| !p).unwrap_or_default();
    let mut path = vec![start];
    let circle = loop {
        let last = *path.last().unwrap_or(&start);
        let Some(&d) = needs[last].iter().find(|&&d| !placed[d]) else { break vec![last] };
        if let Some(at) = path.iter().position(|&p| p == d) {
            break path[at..].to_vec();
        }
        path.push(d);
    };
    let name = |i: usize| format!("{:?}", steps[i].name);
    let links: Vec<String> = circle
        .iter()
        .zip(circle.iter().cycle().skip(1))
        .map(|(&a, &b)| format!("{} on {}", name(a), name(b)))
        .collect();
    let others: Vec<String> =
        (0..steps.len()).filter(|i| !placed[*i] && !circle.contains(i)).map(name).collect();
    let mut why = format!(
        "steps depend on each other in a circle ({}), so none of them can start: remove one of these dependencies",
        links.join(", ")
    );
    if !others.is_empty() {
        why.push_str(&format!("; nothing would ever start {} either", others.join(", ")));
    }
    why
}

fn parse_budget(seconds: Option<u64>) -> Result<Duration, String> {
    let b = seconds.map_or(DEFAULT_BUDGET, Duration::from_secs);
    if b < MIN_BUDGET || b > MAX_BUDGET {
        return Err(format!(
            "budget must be between {} and {} seconds",
            MIN_BUDGET.as_secs(),
            MAX_BUDGET.as_secs()
        ));
    }
    Ok(b)
}

/// Names travel in messages, keys and URLs: keep them short and plain.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok { Ok(()) } else { Err(format!("{name:?} must be 1 to 40 of a-z, 0-9 and '-'")) }
}

/// An agent's name also names its resources in the template (`<agent>Queue`, the queue
/// `<stack id>_agent_<agent>`), where CloudFormation takes letters and digits only.
fn check_agent_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= MAX_AGENT_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be 1 to {MAX_AGENT_NAME} of a-z and 0-9, starting with a letter (it names the agent's resources in the template)"
        ))
    }
}

/// Longest agent name: its queues are named `<stack id>_dlq_<agent>` (a 36-character UUID),
/// which SQS takes up to 80 characters.
pub const MAX_AGENT_NAME: usize = 32;

/// The workflow in `json`, as a stack loads it from the file at `path` whose name without `.json` is `name`,
/// checked against the deployed `agents`; an error names the file, the field where the file has
/// one wrong, and what to do. A file is named after its workflow (`<name>.json`, the version
/// new orders take), or after its workflow and version (`<name>.v<version>.json`, an older
/// version kept for the orders that started on it).
pub fn load_file(
    path: &str,
    name: &str,
    json: &str,
    agents: &[AgentName],
) -> Result<Workflow, Error> {
    let in_file = |e: Error| match e {
        Error::InvalidWorkflow(why) => Error::InvalidWorkflow(format!("{path}: {why}")),
        other => other,
    };
    let workflow = Workflow::from_json(json, agents).map_err(in_file)?;
    let kept = format!("{}.v{}", workflow.name(), workflow.version());
    if workflow.name() != name && kept != name {
        return Err(Error::InvalidWorkflow(format!(
            "{path}: name: the workflow is named {:?}, and its file must be named after it ({}.json, or {kept}.json for an older version kept)",
            workflow.name(),
            workflow.name()
        )));
    }
    Ok(workflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agents() -> Vec<AgentName> {
        ["inventory", "payment", "shipping"].map(AgentName::new).to_vec()
    }

    #[test]
    fn the_fulfilment_workflow_loads() {
        let w = Workflow::from_json(sas_workflows::order_fulfilment(), &agents()).unwrap();
        assert_eq!(w.steps().len(), 3);
        assert_eq!(
            w.step(1).unwrap().action(Direction::Undo),
            Some(("refund-payment", Duration::from_secs(30)))
        );
        assert_eq!(w.step(2).unwrap().action(Direction::Undo), None);
        assert_eq!(w.agents().len(), 3);
        let named: Vec<String> = Workflow::agents_in(sas_workflows::order_fulfilment())
            .iter()
            .map(|a| a.as_str().to_owned())
            .collect();
        assert_eq!(named, ["inventory", "payment", "shipping"]);
        assert!(Workflow::agents_in("not json").is_empty());
    }

    /// A step's name and its `depends_on` (`None` leaves it out).
    type Spec<'a> = (&'a str, Option<&'a [&'a str]>);

    /// A workflow of `steps`, each on the payment agent.
    fn with_dependencies(steps: &[Spec<'_>]) -> Result<Workflow, Error> {
        let steps: Vec<Value> = steps
            .iter()
            .map(|(name, deps)| match deps {
                Some(deps) => {
                    serde_json::json!({"name": name, "agent": "payment", "depends_on": deps})
                }
                None => serde_json::json!({"name": name, "agent": "payment"}),
            })
            .collect();
        let json = serde_json::json!({"name": "w", "steps": steps}).to_string();
        Workflow::from_json(&json, &agents())
    }

    fn run_order(w: &Workflow) -> Vec<(&str, Vec<&str>)> {
        w.steps()
            .iter()
            .map(|s| (s.name.as_str(), s.depends_on.iter().map(String::as_str).collect()))
            .collect()
    }

    #[test]
    fn a_step_that_names_no_dependency_waits_for_the_step_above_it() {
        let w = with_dependencies(&[("a", None), ("b", None), ("c", None)]).unwrap();
        assert_eq!(run_order(&w), [("a", vec![]), ("b", vec!["a"]), ("c", vec!["b"])]);
        let reference = Workflow::from_json(sas_workflows::order_fulfilment(), &agents()).unwrap();
        let names: Vec<&str> = reference.steps().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["reserve-inventory", "charge-payment", "ship"]);
    }

    #[test]
    fn steps_run_after_what_they_depend_on_in_the_file_s_order_where_there_is_a_choice() {
        let w = with_dependencies(&[
            ("pay", Some(&["flight", "hotel"])),
            ("hotel", Some(&[])),
            ("flight", Some(&[])),
            ("confirm", None),
        ])
        .unwrap();
        assert_eq!(
            run_order(&w),
            [
                ("hotel", vec![]),
                ("flight", vec![]),
                ("pay", vec!["flight", "hotel"]),
                ("confirm", vec!["flight"]),
            ],
            "a step without depends_on waits for the step above it in the file"
        );
    }

    #[test]
    fn a_dependency_no_order_can_keep_is_refused_naming_the_steps() {
        let cases: [(&[Spec<'_>], &str); 5] = [
            (
                &[("a", None), ("b", Some(&["shipping"]))],
                r#"step "b" depends on "shipping", which is not a step of this workflow: name one of a, b"#,
            ),
            (&[("a", Some(&["a"]))], r#"step "a" depends on itself"#),
            (&[("a", None), ("b", Some(&["a", "a"]))], r#"step "b" names "a" twice in depends_on"#),
            (
                &[("a", Some(&["c"])), ("b", None), ("c", None)],
                r#"steps depend on each other in a circle ("a" on "c", "c" on "b", "b" on "a"), so none of them can start"#,
            ),
            (
                &[("a", Some(&[])), ("b", Some(&["c"])), ("c", Some(&["b"])), ("d", Some(&["c"]))],
                r#"("b" on "c", "c" on "b"), so none of them can start: remove one of these dependencies; nothing would ever start "d" either"#,
            ),
        ];
        for (steps, expected) in cases {
            let err = with_dependencies(steps).unwrap_err().to_string();
            assert!(err.contains(expected), "{steps:?}: {err}");
        }
    }

    /// A one-step workflow whose input needs a `tenant`, starting as `starts` says.
    fn with_starts(starts: Value) -> Result<Workflow, Error> {
        let json = serde_json::json!({"name": "w", "steps": [{"name": "a", "agent": "payment"}],
            "input_schema": {"type": "object", "required": ["tenant"]}, "starts": starts});
        Workflow::from_json(&json.to_string(), &agents())
    }

    #[test]
    fn a_workflow_declares_its_starts_by_event_and_by_schedule() {
        let w = with_starts(serde_json::json!([
            {"event": {"pattern": {"source": ["crm"], "detail-type": ["TenantSignedUp"]}}},
            {"event": {"pattern": {"source": ["billing"]}, "input": "/detail/account"}},
            {"schedule": {"expression": "cron(0 2 * * ? *)", "timezone": "Europe/Paris",
                          "input": {"tenant": "all"}}},
        ]))
        .unwrap();
        let [crate::starts::Start::Event { pattern, input }, second, third] = w.starts() else {
            panic!("{:?}", w.starts())
        };
        assert_eq!(input, "/detail");
        let event = serde_json::json!({"source": "crm", "detail-type": "TenantSignedUp"});
        assert!(pattern.matches(&event));
        assert!(
            matches!(second, crate::starts::Start::Event { input, .. } if input == "/detail/account")
        );
        let crate::starts::Start::Schedule { schedule, input } = third else { panic!("{third:?}") };
        assert_eq!(input, &serde_json::json!({"tenant": "all"}));
        // 02:00 in Paris is 01:00 UTC in winter: 2026-11-30T01:00:00Z.
        let at = crate::time::Timestamp::from_millis(1_796_000_400_000);
        assert_eq!(schedule.times(at.minus(Duration::from_secs(60)), at), [at]);
        assert!(with_starts(serde_json::json!([])).unwrap().starts().is_empty());
    }

    #[test]
    fn a_start_that_cannot_work_is_refused_at_load_naming_it() {
        let cases = [
            (
                serde_json::json!([{"event": {"pattern": {"source": [{"cidr": "10.0.0.0/24"}]}}}]),
                "starts[0]",
            ),
            (serde_json::json!([{"event": {"pattern": {}, "input": "detail"}}]), "JSON pointer"),
            (serde_json::json!([{"schedule": {"expression": "every day"}}]), "neither rate"),
            (
                serde_json::json!([{"schedule": {"expression": "rate(5 minutes)", "timezone": "Mars/Olympus",
                                               "input": {"tenant": "t"}}}]),
                "not a time zone",
            ),
            (
                serde_json::json!([{"schedule": {"expression": "rate(1 hour)"}}]),
                "the schedule's input",
            ),
            (
                serde_json::json!([{"schedule": {"expression": "rate(1 hour)",
                                               "input": {"tenant": "x".repeat(5000)}}}]),
                "at most 4 KiB",
            ),
            (serde_json::json!([{"webhook": {}}]), "starts"),
        ];
        for (starts, expected) in cases {
            let err = with_starts(starts.clone()).unwrap_err().to_string();
            assert!(err.contains(expected), "{starts}: {err}");
        }
    }

    fn with_concurrency(concurrency: serde_json::Value) -> Result<Workflow, Error> {
        let mut spec: Value = serde_json::from_str(sas_workflows::order_fulfilment()).unwrap();
        spec["concurrency"] = concurrency;
        Workflow::from_json(&spec.to_string(), &Workflow::agents_in(&spec.to_string()))
    }

    fn with_search_key(declared: &str) -> Result<Workflow, Error> {
        let mut spec: Value = serde_json::from_str(sas_workflows::order_fulfilment()).unwrap();
        spec["search_key"] = declared.into();
        Workflow::from_json(&spec.to_string(), &Workflow::agents_in(&spec.to_string()))
    }

    #[test]
    fn a_search_key_is_a_value_the_input_schema_declares_and_finds_orders_that_have_it() {
        let w = with_search_key("/input/customer_id").unwrap();
        assert_eq!(w.search_key(), Some("/input/customer_id"));
        let found = |input: Value| w.search_value(&input);
        assert_eq!(found(serde_json::json!({"customer_id": "c-1"})).as_deref(), Some("c-1"));
        assert_eq!(found(serde_json::json!({"customer_id": 42})).as_deref(), Some("42"));
        // An order without a value to find it by is accepted, and found by its id alone.
        assert_eq!(found(serde_json::json!({})), None);
        assert_eq!(found(serde_json::json!({"customer_id": ""})), None);
        let long = "c".repeat(MAX_SEARCH_VALUE_LEN + 1);
        assert_eq!(found(serde_json::json!({"customer_id": long})), None);
        let cases = [
            ("/customer_id", "a JSON pointer into the input"),
            ("/input/nickname", "declares no property \"nickname\""),
            ("/input/items", "must declare it a string or an integer"),
        ];
        for (declared, expected) in cases {
            let err = with_search_key(declared).unwrap_err().to_string();
            assert!(err.contains("search_key") && err.contains(expected), "{declared}: {err}");
        }
    }

    #[test]
    fn a_concurrency_key_is_read_from_the_input_as_its_schema_declares_it() {
        let w =
            with_concurrency(serde_json::json!({"key": "/input/customer_id", "limit": 1})).unwrap();
        let c = w.concurrency().unwrap();
        assert_eq!((c.limit, c.group.as_str(), c.max_wait), (1, "order-fulfilment", None));
        let input = serde_json::json!({"customer_id": "c-1"});
        assert_eq!(w.key_of(&input).unwrap().as_deref(), Some("order-fulfilment/c-1"));
        let err = w.key_of(&serde_json::json!({})).unwrap_err();
        assert_eq!(err.errors[0].field, "/customer_id");
        assert!(err.to_string().contains("concurrency.key"), "{err}");
        let shared = with_concurrency(serde_json::json!({
            "key": "/input/customer_id", "limit": 3, "group": "customer",
            "max_wait_seconds": 600, "on_conflict": "skip"
        }))
        .unwrap();
        let c = shared.concurrency().unwrap();
        assert_eq!(c.max_wait, Some(Duration::from_secs(600)));
        assert_eq!(c.on_conflict, OnConflict::Skip);
        assert_eq!(shared.key_of(&input).unwrap().as_deref(), Some("customer/c-1"));
        assert_eq!(with_starts(serde_json::json!([])).unwrap().key_of(&input).unwrap(), None);
    }

    #[test]
    fn a_concurrency_that_cannot_work_is_refused_at_load_naming_it() {
        let cases = [
            (serde_json::json!({"key": "/input/customer_id", "limit": 0}), "limit must be"),
            (serde_json::json!({"key": "/input/customer_id", "limit": 101}), "limit must be"),
            (serde_json::json!({"key": "customer_id", "limit": 1}), "JSON pointer into the input"),
            (serde_json::json!({"key": "/input/tenant", "limit": 1}), "no property \"tenant\""),
            (serde_json::json!({"key": "/input/ship_to", "limit": 1}), "a string or an integer"),
            (serde_json::json!({"key": "/input/items", "limit": 1}), "a string or an integer"),
            (
                serde_json::json!({"key": "/input/customer_id", "limit": 1, "group": "no space"}),
                "group",
            ),
            (
                serde_json::json!({"key": "/input/customer_id", "limit": 1, "max_wait_seconds": 0}),
                "max_wait_seconds",
            ),
            (
                serde_json::json!({"key": "/input/customer_id", "limit": 1, "on_conflict": "cancel"}),
                "on_conflict",
            ),
        ];
        for (concurrency, expected) in cases {
            let err = with_concurrency(concurrency.clone()).unwrap_err().to_string();
            assert!(err.contains(expected), "{concurrency}: {err}");
        }
    }

    #[test]
    fn fairness_names_a_tenant_and_a_priority_the_schema_declares() {
        let with_fairness = |fairness: serde_json::Value| {
            let mut spec: Value = serde_json::from_str(sas_workflows::order_fulfilment()).unwrap();
            spec["input_schema"]["properties"]["rush"] = serde_json::json!({"type": "boolean"});
            spec["fairness"] = fairness;
            Workflow::from_json(&spec.to_string(), &Workflow::agents_in(&spec.to_string()))
        };
        let w = with_fairness(
            serde_json::json!({"tenant": "/input/customer_id", "priority": "/input/rush"}),
        )
        .unwrap();
        let owner = Owner::anonymous();
        let input = serde_json::json!({"customer_id": "c-1", "rush": true});
        assert_eq!(w.group_of(&input, &owner, false).unwrap(), "c-1#priority");
        let input = serde_json::json!({"customer_id": "c-1"});
        assert_eq!(w.group_of(&input, &owner, false).unwrap(), "c-1");
        // Without fairness, the caller is the tenant.
        let plain = with_concurrency(serde_json::json!({"key": "/input/customer_id", "limit": 1}));
        assert_eq!(plain.unwrap().group_of(&input, &owner, false).unwrap(), "anonymous");
        let cases = [
            (serde_json::json!({"tenant": "customer_id"}), "JSON pointer into the input"),
            (serde_json::json!({"tenant": "/input/nobody"}), "no property \"nobody\""),
            (serde_json::json!({"tenant": "/input/items"}), "a string or an integer"),
            (serde_json::json!({"priority": "/input/customer_id"}), "a boolean"),
            (serde_json::json!({"weight": 2}), "unknown field"),
        ];
        for (fairness, expected) in cases {
            let err = with_fairness(fairness.clone()).unwrap_err().to_string();
            assert!(err.contains(expected) && err.contains("fairness"), "{fairness}: {err}");
        }
    }

    #[test]
    fn defaults_apply_to_missing_budgets() {
        let w = Workflow::from_json(
            r#"{"name":"w","steps":[{"name":"a","agent":"payment","compensation":{"action":"b"}}]}"#,
            &agents(),
        )
        .unwrap();
        assert_eq!(w.step(0).unwrap().budget, DEFAULT_BUDGET);
        assert_eq!(w.step(0).unwrap().compensation.as_ref().unwrap().budget, DEFAULT_BUDGET);
        assert_eq!(w.step(0).unwrap().on_failure, OnFailure::Undo);
        let reported =
            r#"{"name":"w","steps":[{"name":"a","agent":"payment","on_failure":"report"}]}"#;
        let w = Workflow::from_json(reported, &agents()).unwrap();
        assert_eq!(w.step(0).unwrap().on_failure, OnFailure::Report);
    }

    #[test]
    fn bad_workflows_fail_at_load_with_a_reason() {
        let cases = [
            (r#"{"name":"w","steps":[]}"#, "at least one step"),
            (r#"{"name":"w","steps":[{"name":"a","agent":"fax"}]}"#, "not deployed"),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment"},{"name":"a","agent":"payment"}]}"#,
                "twice",
            ),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","budget_seconds":0}]}"#,
                "budget",
            ),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","budget_seconds":901}]}"#,
                "budget",
            ),
            (r#"{"name":"w","steps":[{"name":"A B","agent":"payment"}]}"#, "step name"),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","compensation":{"action":"a"}}]}"#,
                "itself",
            ),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","retries":3}]}"#,
                "steps[0].retries: unknown field `retries`",
            ),
            (r#"{"name":"","steps":[{"name":"a","agent":"payment"}]}"#, "workflow name"),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","expired_leases":0}]}"#,
                "expired_leases must be from 1 to 10",
            ),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","expired_leases":11}]}"#,
                "expired_leases must be from 1 to 10",
            ),
            (
                r#"{"name":"w","steps":[{"name":"a","agent":"payment","on_failure":"ignore"}]}"#,
                "steps[0].on_failure: unknown variant `ignore`, expected `undo` or `report`",
            ),
        ];
        for (json, expected) in cases {
            let err = Workflow::from_json(json, &agents()).unwrap_err().to_string();
            assert!(err.contains(expected), "{json}: {err}");
        }
    }
}

/// JSON decoded as `serde_json` does, but for a name given twice in one object: `serde_json`
/// keeps the last value, another reader of the same body may keep the first, so such a body is
/// refused rather than read one way here and another way elsewhere.
mod strict {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
    use serde_json::{Map, Value};

    pub fn parse(body: &[u8]) -> Result<Value, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let value = Strict.deserialize(&mut de)?;
        de.end()?;
        Ok(value)
    }

    struct Strict;

    impl<'de> DeserializeSeed<'de> for Strict {
        type Value = Value;

        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Strict {
        type Value = Value;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }

        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }

        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }

        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }

        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_owned()))
        }

        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }

        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
            let mut out = Vec::new();
            while let Some(v) = seq.next_element_seed(Strict)? {
                out.push(v);
            }
            Ok(Value::Array(out))
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
            let mut out = Map::new();
            while let Some(key) = map.next_key::<String>()? {
                if out.contains_key(&key) {
                    return Err(de::Error::custom(format!(
                        "the name {key:?} appears twice in one object"
                    )));
                }
                let value = map.next_value_seed(Strict)?;
                out.insert(key, value);
            }
            Ok(Value::Object(out))
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn a_name_given_twice_is_refused_and_anything_else_reads_as_serde_json_reads_it() {
            let err = parse(br#"{"a":{"b":1,"b":2}}"#).unwrap_err().to_string();
            assert!(err.contains("\"b\" appears twice"), "{err}");
            for body in [&br#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}]}"#[..], b"12", b"\"s\""] {
                let ours = parse(body).unwrap();
                assert_eq!(ours, serde_json::from_slice::<Value>(body).unwrap());
            }
            assert!(parse(b"{} x").is_err());
            assert!(parse(&[b'['; 200]).is_err(), "serde_json's depth limit still holds");
        }
    }
}
