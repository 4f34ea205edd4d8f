//! The functions a template declares, as a local runner needs them: which binary, with which
//! environment (globals merged, references resolved to the provisioned resources), timeout,
//! memory, and event sources (SQS mappings, schedules, HTTP API routes).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::Error;
use crate::provision::Stack;
use crate::template::{Template, scalar_string};

/// Lambda's default timeout, when neither the function nor the globals set one.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
const DEFAULT_MEMORY_MB: u32 = 128;

/// One function of the template.
#[derive(Clone, Debug, PartialEq)]
pub struct FunctionSpec {
    pub logical_id: String,
    /// The cargo binary that is the function's `bootstrap`.
    pub binary: String,
    pub environment: BTreeMap<String, String>,
    pub timeout: Duration,
    pub memory_mb: u32,
    pub reserved_concurrency: Option<u32>,
    /// Whether it is reached through a function URL.
    pub function_url: bool,
    pub events: Vec<EventSource>,
}

/// What invokes a function.
#[derive(Clone, Debug, PartialEq)]
pub enum EventSource {
    /// An SQS event source mapping.
    Sqs {
        name: String,
        queue_arn: String,
        batch_size: u32,
        batching_window: Duration,
        max_concurrency: Option<u32>,
        report_batch_item_failures: bool,
    },
    /// An EventBridge schedule (`rate(...)` or `cron(...)`).
    Schedule { name: String, expression: String },
    /// An HTTP API route, and its authorizer (`AWS_IAM`) if it has one.
    HttpApi { name: String, method: String, path: String, authorizer: Option<String> },
}

/// Every function of `template` whose condition holds, resolved against `stack`.
pub fn functions(template: &Template, stack: &Stack) -> Result<Vec<FunctionSpec>, Error> {
    let globals = stack.eval(template.globals.get("Function").unwrap_or(&Value::Null))?;
    let mut out = Vec::new();
    for (id, resource) in template.of_kind("AWS::Serverless::Function") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        let p = stack.eval(&resource.properties)?;
        let bad = |m: &str| Error::Template(format!("{id}: {m}"));
        let binary = resource
            .metadata
            .pointer("/BuildProperties/Binary")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("no Metadata.BuildProperties.Binary names its binary"))?
            .to_owned();
        let setting = |key: &str| p.get(key).or_else(|| globals.get(key));
        let number = |key: &str| {
            setting(key)
                .map(scalar_string)
                .transpose()
                .map(|v| v.and_then(|s| s.parse::<u64>().ok()))
        };
        let mut environment = BTreeMap::new();
        for source in
            [globals.pointer("/Environment/Variables"), p.pointer("/Environment/Variables")]
                .into_iter()
                .flatten()
        {
            for (k, v) in source.as_object().into_iter().flatten() {
                environment.insert(k.clone(), scalar_string(v)?);
            }
        }
        let mut events = Vec::new();
        for (name, event) in p.get("Events").and_then(Value::as_object).into_iter().flatten() {
            let props = event.get("Properties").cloned().unwrap_or(Value::Null);
            let text = |k: &str| props.get(k).map(scalar_string).transpose();
            match event.get("Type").and_then(Value::as_str) {
                Some("SQS") => events.push(EventSource::Sqs {
                    name: name.clone(),
                    queue_arn: text("Queue")?.ok_or_else(|| bad("SQS event without Queue"))?,
                    batch_size: text("BatchSize")?.and_then(|v| v.parse().ok()).unwrap_or(10),
                    batching_window: Duration::from_secs(
                        text("MaximumBatchingWindowInSeconds")?
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0),
                    ),
                    max_concurrency: props
                        .pointer("/ScalingConfig/MaximumConcurrency")
                        .map(scalar_string)
                        .transpose()?
                        .and_then(|v| v.parse().ok()),
                    report_batch_item_failures: props
                        .get("FunctionResponseTypes")
                        .and_then(Value::as_array)
                        .is_some_and(|t| t.iter().any(|v| v == "ReportBatchItemFailures")),
                }),
                Some("Schedule") | Some("ScheduleV2") => events.push(EventSource::Schedule {
                    name: name.clone(),
                    expression: text("Schedule")?
                        .or(text("ScheduleExpression")?)
                        .ok_or_else(|| bad("schedule without an expression"))?,
                }),
                Some("HttpApi") => events.push(EventSource::HttpApi {
                    name: name.clone(),
                    method: text("Method")?.unwrap_or_else(|| "ANY".into()).to_ascii_uppercase(),
                    path: text("Path")?.unwrap_or_else(|| "/".into()),
                    authorizer: props
                        .pointer("/Auth/Authorizer")
                        .map(scalar_string)
                        .transpose()?
                        .filter(|a| a != "NONE"),
                }),
                other => {
                    return Err(bad(&format!(
                        "event {name} of type {other:?} is not supported locally"
                    )));
                }
            }
        }
        out.push(FunctionSpec {
            logical_id: id.to_owned(),
            binary,
            environment,
            timeout: number("Timeout")?.map_or(DEFAULT_TIMEOUT, Duration::from_secs),
            memory_mb: number("MemorySize")?
                .and_then(|m| u32::try_from(m).ok())
                .unwrap_or(DEFAULT_MEMORY_MB),
            reserved_concurrency: number("ReservedConcurrentExecutions")?
                .and_then(|m| u32::try_from(m).ok()),
            function_url: p.get("FunctionUrlConfig").is_some(),
            events,
        });
    }
    Ok(out)
}

/// A schedule's period: `rate(N minute|minutes|hour|hours|day|days)`. Cron expressions are not
/// emulated.
pub fn rate(expression: &str) -> Option<Duration> {
    let inner = expression.strip_prefix("rate(")?.strip_suffix(')')?;
    let (n, unit) = inner.trim().split_once(' ')?;
    let n: u64 = n.parse().ok()?;
    let seconds = match unit.trim() {
        "minute" | "minutes" => 60,
        "hour" | "hours" => 3600,
        "day" | "days" => 86_400,
        _ => return None,
    };
    Some(Duration::from_secs(n * seconds))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::provision::{Options, dry_run};

    fn template() -> Template {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../template.yaml");
        Template::load(&path).unwrap()
    }

    #[test]
    fn the_template_declares_every_function_with_its_sources_and_environment() {
        let t = template();
        let options = Options {
            stack_name: "local".into(),
            region: "us-east-1".into(),
            parameters: HashMap::new(),
            attributes: HashMap::from([(
                ("RemoteSimFunctionUrl".into(), "FunctionUrl".into()),
                Value::String("http://127.0.0.1:9999/".into()),
            )]),
        };
        let stack = dry_run(&t, &options).unwrap();
        let fns = functions(&t, &stack).unwrap();
        let by_id = |id: &str| fns.iter().find(|f| f.logical_id == id).unwrap();

        let scheduler = by_id("SchedulerFunction");
        assert_eq!(scheduler.binary, "scheduler");
        assert_eq!(scheduler.events.len(), 2);
        assert!(scheduler.events.iter().all(|e| matches!(
            e,
            EventSource::Sqs { report_batch_item_failures: true, batch_size: 10, .. }
        )));
        assert_eq!(scheduler.environment["STATE_TABLE"], stack.reference("StateTable").unwrap());
        assert_eq!(scheduler.environment["RUST_LOG"], "info", "globals are merged in");

        let agent = by_id("PaymentAgentFunction");
        assert_eq!((agent.binary.as_str(), agent.timeout), ("agent", Duration::from_secs(90)));
        assert_eq!(
            agent.environment["SERVICE_URL"], "http://127.0.0.1:9999/",
            "the simulated service by default"
        );

        let submission = by_id("SubmissionFunction");
        assert_eq!(
            submission.events,
            [EventSource::HttpApi {
                name: "PostOrder".into(),
                method: "POST".into(),
                path: "/orders".into(),
                authorizer: None,
            }]
        );
        let admin = by_id("AdminFunction");
        assert!(admin.events.len() >= 6);
        assert!(
            admin.events.iter().all(
                |e| matches!(e, EventSource::HttpApi { authorizer: Some(a), .. } if a == "AWS_IAM")
            ),
            "every admin route is behind IAM"
        );
        let supervisor = by_id("SupervisorFunction");
        assert!(
            matches!(&supervisor.events[..], [EventSource::Schedule { expression, .. }] if rate(expression) == Some(Duration::from_secs(60)))
        );
        assert_eq!(by_id("RemoteSimFunction").reserved_concurrency, Some(1));
        assert!(by_id("RemoteSimFunction").function_url && !scheduler.function_url);
    }

    #[test]
    fn rates_are_read() {
        assert_eq!(rate("rate(5 minutes)"), Some(Duration::from_secs(300)));
        assert_eq!(rate("rate(1 hour)"), Some(Duration::from_secs(3600)));
        assert_eq!(rate("cron(0 12 * * ? *)"), None);
    }
}
