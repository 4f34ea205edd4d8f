//! The functions a template declares, as a local runner needs them: which binary, with which
//! environment (globals merged, references resolved to the provisioned resources), timeout,
//! memory, and event sources (SQS mappings, schedules, HTTP API routes). Routes are read both
//! from SAM's `HttpApi` events and from API Gateway's own `AWS::ApiGatewayV2::Route` resources
//! (with their integrations and authorizers).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use crate::Error;
use crate::emulation::provision::Stack;
use crate::emulation::template::{Resource, Template, scalar_string};

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
    /// How its function URL is authenticated (`None`: no URL; `Some(None)`: `AuthType: NONE`).
    pub function_url: Option<Option<RouteAuth>>,
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
    /// An HTTP API route, and its authorizer if it has one.
    HttpApi { name: String, method: String, path: String, authorizer: Option<RouteAuth> },
}

/// Who may call a route.
#[derive(Clone, Debug, PartialEq)]
pub enum RouteAuth {
    /// `AWS_IAM`: SigV4-signed requests.
    Iam,
    /// `JWT`: bearer tokens of `issuer` for one of `audience`.
    Jwt { issuer: String, audience: Vec<String> },
    /// Any other kind, named as the template names it.
    Other(String),
}

impl RouteAuth {
    fn named(kind: &str) -> Option<RouteAuth> {
        match kind {
            "NONE" => None,
            "AWS_IAM" => Some(RouteAuth::Iam),
            other => Some(RouteAuth::Other(other.to_owned())),
        }
    }
}

/// Every function of `template` whose condition holds, resolved against `stack`.
pub fn functions(template: &Template, stack: &Stack) -> Result<Vec<FunctionSpec>, Error> {
    let globals = stack.eval(template.globals.get("Function").unwrap_or(&Value::Null))?;
    let mut out = Vec::new();
    for (id, resource) in template.of_kind("AWS::Serverless::Function") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        out.push(function(id, resource, &globals, stack)?);
    }
    for (function, route) in api_routes(template, stack)? {
        match out.iter_mut().find(|f| f.logical_id == function) {
            Some(f) => f.events.push(route),
            None => {
                return Err(Error::Template(format!(
                    "a route integrates {function}, which is not a function of the template"
                )));
            }
        }
    }
    Ok(out)
}

/// The function `id` declares, its settings its own or else the `globals`'.
fn function(
    id: &str,
    resource: &Resource,
    globals: &Value,
    stack: &Stack,
) -> Result<FunctionSpec, Error> {
    let p = stack.eval(&resource.properties)?;
    let bad = |m: &str| Error::Template(format!("{id}: {m}"));
    // A loop's function may find its binary in a mapping (Fn::FindInMap).
    let binary = resource
        .metadata
        .pointer("/BuildProperties/Binary")
        .map(|b| stack.eval(b))
        .transpose()?
        .and_then(|b| b.as_str().map(str::to_owned))
        .ok_or_else(|| bad("no Metadata.BuildProperties.Binary names its binary"))?;
    let setting = |key: &str| p.get(key).or_else(|| globals.get(key));
    let number = |key: &str| {
        setting(key).map(scalar_string).transpose().map(|v| v.and_then(|s| s.parse::<u64>().ok()))
    };
    let mut environment = BTreeMap::new();
    for source in [globals.pointer("/Environment/Variables"), p.pointer("/Environment/Variables")]
        .into_iter()
        .flatten()
    {
        for (k, v) in source.as_object().into_iter().flatten() {
            environment.insert(k.clone(), scalar_string(v)?);
        }
    }
    let mut events = Vec::new();
    for (name, event) in p.get("Events").and_then(Value::as_object).into_iter().flatten() {
        events.push(event_source(id, name, event)?);
    }
    Ok(FunctionSpec {
        logical_id: id.to_owned(),
        binary,
        environment,
        timeout: number("Timeout")?.map_or(DEFAULT_TIMEOUT, Duration::from_secs),
        memory_mb: number("MemorySize")?
            .and_then(|m| u32::try_from(m).ok())
            .unwrap_or(DEFAULT_MEMORY_MB),
        reserved_concurrency: number("ReservedConcurrentExecutions")?
            .and_then(|m| u32::try_from(m).ok()),
        function_url: p
            .get("FunctionUrlConfig")
            .map(|url| {
                let kind = url.get("AuthType").map(scalar_string).transpose()?;
                Ok::<_, Error>(RouteAuth::named(kind.as_deref().unwrap_or("AWS_IAM")))
            })
            .transpose()?,
        events,
    })
}

/// Event `name` of function `id`, from its SAM declaration.
fn event_source(id: &str, name: &str, event: &Value) -> Result<EventSource, Error> {
    let bad = |m: &str| Error::Template(format!("{id}: {m}"));
    let props = event.get("Properties").cloned().unwrap_or(Value::Null);
    let text = |k: &str| props.get(k).map(scalar_string).transpose();
    Ok(match event.get("Type").and_then(Value::as_str) {
        Some("SQS") => EventSource::Sqs {
            name: name.to_owned(),
            queue_arn: text("Queue")?.ok_or_else(|| bad("SQS event without Queue"))?,
            batch_size: text("BatchSize")?.and_then(|v| v.parse().ok()).unwrap_or(10),
            batching_window: Duration::from_secs(
                text("MaximumBatchingWindowInSeconds")?.and_then(|v| v.parse().ok()).unwrap_or(0),
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
        },
        Some("Schedule") | Some("ScheduleV2") => EventSource::Schedule {
            name: name.to_owned(),
            expression: text("Schedule")?
                .or(text("ScheduleExpression")?)
                .ok_or_else(|| bad("schedule without an expression"))?,
        },
        Some("HttpApi") => EventSource::HttpApi {
            name: name.to_owned(),
            method: text("Method")?.unwrap_or_else(|| "ANY".into()).to_ascii_uppercase(),
            path: text("Path")?.unwrap_or_else(|| "/".into()),
            authorizer: props
                .pointer("/Auth/Authorizer")
                .map(scalar_string)
                .transpose()?
                .and_then(|a| RouteAuth::named(&a)),
        },
        other => {
            return Err(bad(&format!("event {name} of type {other:?} is not supported locally")));
        }
    })
}

/// The `AWS::ApiGatewayV2::Route` resources whose condition holds, each with the logical id of
/// the function its integration invokes.
fn api_routes(template: &Template, stack: &Stack) -> Result<Vec<(String, EventSource)>, Error> {
    let mut out = Vec::new();
    for (id, resource) in template.of_kind("AWS::ApiGatewayV2::Route") {
        if !stack.context.holds(resource.condition.as_deref()) {
            continue;
        }
        let bad = |m: &str| Error::Template(format!("{id}: {m}"));
        let p = stack.eval(&resource.properties)?;
        let text = |v: &Value, k: &str| v.get(k).map(scalar_string).transpose();
        let key = text(&p, "RouteKey")?.ok_or_else(|| bad("no RouteKey"))?;
        let (method, path) = match key.as_str() {
            "$default" => ("ANY".to_owned(), "/{proxy+}".to_owned()),
            key => key
                .split_once(' ')
                .map(|(m, p)| (m.to_ascii_uppercase(), p.to_owned()))
                .ok_or_else(|| bad(&format!("route key {key:?} is not METHOD /path")))?,
        };
        let target = text(&p, "Target")?.ok_or_else(|| bad("no Target"))?;
        let integration = target
            .strip_prefix("integrations/")
            .and_then(|r| by_ref(template, stack, "AWS::ApiGatewayV2::Integration", r))
            .ok_or_else(|| bad(&format!("target {target:?} is no integration of the template")))?;
        let uri = text(&stack.eval(&integration.properties)?, "IntegrationUri")?
            .ok_or_else(|| bad("its integration has no IntegrationUri"))?;
        let function = template
            .of_kind("AWS::Serverless::Function")
            .map(|(f, _)| f)
            .find(|f| stack.attribute(f, "Arn").as_deref() == Some(uri.as_str()))
            .ok_or_else(|| bad(&format!("its integration invokes {uri}, not a function")))?;
        let kind = text(&p, "AuthorizationType")?.unwrap_or_else(|| "NONE".into());
        let authorizer = match kind.as_str() {
            "JWT" => {
                let reference = text(&p, "AuthorizerId")?
                    .ok_or_else(|| bad("a JWT route without an AuthorizerId"))?;
                Some(jwt_authorizer(template, stack, id, &reference)?)
            }
            other => RouteAuth::named(other),
        };
        out.push((
            function.to_owned(),
            EventSource::HttpApi { name: id.to_owned(), method, path, authorizer },
        ));
    }
    Ok(out)
}

/// The resource of type `kind` whose `Ref`, as resolved in this stack, is `reference`.
fn by_ref<'t>(
    template: &'t Template,
    stack: &Stack,
    kind: &'t str,
    reference: &str,
) -> Option<&'t Resource> {
    template
        .of_kind(kind)
        .find(|(id, _)| stack.reference(id).as_deref() == Some(reference))
        .map(|(_, r)| r)
}

/// The JWT authorizer that route `id` names by `reference`, with its issuer and audience.
fn jwt_authorizer(
    template: &Template,
    stack: &Stack,
    id: &str,
    reference: &str,
) -> Result<RouteAuth, Error> {
    let bad = |m: &str| Error::Template(format!("{id}: {m}"));
    let authorizer = by_ref(template, stack, "AWS::ApiGatewayV2::Authorizer", reference)
        .ok_or_else(|| bad(&format!("authorizer {reference:?} is not declared")))?;
    let config = stack.eval(&authorizer.properties)?;
    let issuer = config
        .pointer("/JwtConfiguration/Issuer")
        .map(scalar_string)
        .transpose()?
        .unwrap_or_default();
    let audience: Vec<String> = match config.pointer("/JwtConfiguration/Audience") {
        Some(Value::Array(list)) => list.iter().map(scalar_string).collect::<Result<_, _>>()?,
        Some(one) => vec![scalar_string(one)?],
        None => Vec::new(),
    };
    let audience: Vec<String> = audience.into_iter().filter(|a| !a.is_empty()).collect();
    if issuer.is_empty() || audience.is_empty() {
        return Err(bad(
            "a JWT authorizer needs an issuer and an audience (JwtIssuer and JwtAudience)",
        ));
    }
    Ok(RouteAuth::Jwt { issuer, audience })
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
    use super::*;
    use crate::emulation::provision::{local_dry_run, project_template};

    #[test]
    fn the_template_s_defaults_are_the_engine_s() {
        // The engine's policy has one set of defaults: what the functions read from a stack
        // deployed at the template's defaults is what the engine assumes without them.
        let t = project_template();
        let stack = local_dry_run(&t, &[]);
        for f in functions(&t, &stack).unwrap() {
            let read = sas_engine::config::EngineConfig::from_lookup(|k| {
                f.environment.get(k).filter(|v| !v.is_empty()).cloned()
            })
            .unwrap();
            assert_eq!(read, sas_engine::config::EngineConfig::default(), "{}", f.logical_id);
            assert!(f.environment.contains_key("FAILURE_THRESHOLD"), "{}", f.logical_id);
        }
    }

    #[test]
    fn the_template_declares_every_function_with_its_sources_and_environment() {
        let t = project_template();
        let stack = local_dry_run(&t, &[]);
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

        let agent = by_id("paymentAgentFunction");
        assert_eq!((agent.binary.as_str(), agent.timeout), ("agent", Duration::from_secs(90)));
        assert_eq!(agent.environment["AGENT_NAME"], "payment");
        assert_eq!(
            agent.environment["SIMULATED_SERVICE_URL"], "http://127.0.0.1:9999/",
            "the simulated service by default"
        );
        assert_eq!(
            agent.environment["AGENT_QUEUE_URL_PREFIX"].clone() + "payment",
            stack.reference("paymentQueue").unwrap(),
            "every function finds an agent's queue by its name"
        );

        let submission = by_id("SubmissionFunction");
        assert_eq!(
            submission.events,
            [
                EventSource::HttpApi {
                    name: "OrderAnswerRoute".into(),
                    method: "POST".into(),
                    path: "/orders/{id}/steps/{step}/{answer}".into(),
                    authorizer: Some(RouteAuth::Iam),
                },
                EventSource::HttpApi {
                    name: "OrdersPostRoute".into(),
                    method: "POST".into(),
                    path: "/orders".into(),
                    authorizer: Some(RouteAuth::Iam),
                }
            ],
            "orders are submitted and steps answered through IAM by default"
        );
        let admin = by_id("AdminFunction");
        // Every admin route is one route; the console's page is another, with Console only.
        assert_eq!(admin.events.len(), 1, "{:?}", admin.events);
        assert!(
            admin.events.iter().all(|e| matches!(
                e,
                EventSource::HttpApi { authorizer: Some(RouteAuth::Iam), .. }
            )),
            "every admin route is behind IAM"
        );
        let supervisor = by_id("SupervisorFunction");
        assert!(
            matches!(&supervisor.events[..], [EventSource::Schedule { expression, .. }] if rate(expression) == Some(Duration::from_secs(60)))
        );
        // Off at the defaults, so that a new account with 10 concurrent executions can deploy.
        assert_eq!(by_id("RemoteSimFunction").reserved_concurrency, None);
        let reserving = local_dry_run(&t, &[(crate::emulation::local::SIM_RESERVATION, "true")]);
        let sim = functions(&t, &reserving).unwrap();
        let sim = sim.iter().find(|f| f.logical_id == "RemoteSimFunction").unwrap();
        assert_eq!(sim.reserved_concurrency, Some(1));
        let own_services = local_dry_run(
            &t,
            &[
                (
                    "ServiceUrls",
                    "inventory=https://inventory.example,payment=https://payment.example,shipping=https://shipping.example",
                ),
                ("ServiceRates", "shipping=20,payment=5"),
            ],
        );
        let deployed = functions(&t, &own_services).unwrap();
        assert!(
            deployed.iter().all(|f| f.logical_id != "RemoteSimFunction"),
            "every agent has a service of its own: the simulated one is not deployed"
        );
        // Each agent holds its own entries of the per-agent lists only (`<agent>=` where it
        // has none); the supervisor holds every agent's limits.
        let env = |id: &str, key: &str| {
            let f = deployed.iter().find(|f| f.logical_id == id).unwrap();
            f.environment.get(key).cloned().unwrap_or_default()
        };
        assert_eq!(env("paymentAgentFunction", "SERVICE_URLS"), "payment=https://payment.example");
        assert_eq!(env("paymentAgentFunction", "SERVICE_RATES"), "payment=5");
        assert_eq!(env("shippingAgentFunction", "SERVICE_RATES"), "shipping=20");
        assert_eq!(env("inventoryAgentFunction", "SERVICE_RATES"), "inventory=");
        assert_eq!(env("ledgerAgentFunction", "SERVICE_URLS"), "ledger=");
        assert_eq!(env("SupervisorFunction", "SERVICE_RATES"), "shipping=20,payment=5");
        assert_eq!(env("SchedulerFunction", "SERVICE_RATES"), "");
        assert_eq!(by_id("RemoteSimFunction").function_url, Some(Some(RouteAuth::Iam)));
        assert_eq!(scheduler.function_url, None);
    }

    /// The authorizer of the order routes and of the admin routes under `parameters`.
    fn order_and_admin_auth(
        parameters: &[(&str, &str)],
    ) -> Result<(Option<RouteAuth>, Option<RouteAuth>), Error> {
        let t = project_template();
        let fns = functions(&t, &local_dry_run(&t, parameters))?;
        // One route per path and method, whichever of its resources the parameters choose.
        let auth = |id: &str, route: &str| {
            let routes: Vec<_> = fns
                .iter()
                .flat_map(|f| f.events.iter().map(move |e| (f, e)))
                .filter_map(|(f, e)| match e {
                    EventSource::HttpApi { method, path, authorizer, .. }
                        if f.logical_id == id && format!("{method} {path}") == route =>
                    {
                        Some(authorizer.clone())
                    }
                    _ => None,
                })
                .collect();
            assert_eq!(routes.len(), 1, "{route} under {parameters:?}");
            routes[0].clone()
        };
        Ok((
            auth("StatusFunction", "GET /orders/{id}"),
            auth("AdminFunction", "ANY /admin/{proxy+}"),
        ))
    }

    #[test]
    fn the_order_routes_take_the_authorizer_the_parameters_choose() {
        let (orders, admin) = order_and_admin_auth(&[]).unwrap();
        assert_eq!((orders, admin.clone()), (Some(RouteAuth::Iam), Some(RouteAuth::Iam)));

        let jwt = [
            ("ApiAuth", "JWT"),
            ("JwtIssuer", "https://issuer.example"),
            ("JwtAudience", "orders, web"),
        ];
        let (orders, admin) = order_and_admin_auth(&jwt).unwrap();
        assert_eq!(
            orders,
            Some(RouteAuth::Jwt {
                issuer: "https://issuer.example".into(),
                audience: vec!["orders".into(), "web".into()],
            })
        );
        assert_eq!(admin, Some(RouteAuth::Iam), "operators always sign");

        let (orders, admin) = order_and_admin_auth(&[("ApiAuth", "NONE")]).unwrap();
        assert_eq!((orders, admin), (None, Some(RouteAuth::Iam)));

        let no_issuer = order_and_admin_auth(&[("ApiAuth", "JWT"), ("JwtAudience", "orders")]);
        assert!(
            matches!(&no_issuer, Err(Error::Template(m)) if m.contains("JwtIssuer")),
            "{no_issuer:?}"
        );
    }

    #[test]
    fn rates_are_read() {
        assert_eq!(rate("rate(5 minutes)"), Some(Duration::from_secs(300)));
        assert_eq!(rate("rate(1 hour)"), Some(Duration::from_secs(3600)));
        assert_eq!(rate("cron(0 12 * * ? *)"), None);
    }
}
