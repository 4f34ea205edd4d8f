//! The local stack: everything `template.yaml` declares, running on this machine against an
//! AWS API emulator. Resources are created from the template; each function runs as its real
//! binary behind a local Runtime API, with the environment the template gives it; SQS event
//! source mappings, schedules, the HTTP API and function URLs are emulated.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sas_engine::ports::Random;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::Error;
use crate::aws::{Clients, Endpoints};
use crate::callers::Callers;
use crate::dead_letters::{self, DeadLetters};
use crate::emulator::Moto;
use crate::functions::{EventSource, FunctionSpec, RouteAuth, functions, rate};
use crate::gateway::{self, Authorizer, Route, Throttle};
use crate::metrics::Metrics;
use crate::policy::{self, Access, AccessReport};
use crate::processes::{Managed, ProcessSpec};
use crate::provision::{Options as ProvisionOptions, Stack, provision};
use crate::proxy::{Proxy, Upstreams};
use crate::runtime_api::{AccountConcurrency, RuntimeApi};
use crate::sigv4;
use crate::sources::{self, SqsMapping};
use crate::template::Template;
use crate::traces::Traces;

/// The simulated remote service's function: part of the stack, but not of the system under test.
pub const REMOTE_SERVICE: &str = "RemoteSimFunction";

/// The parameter that reserves one instance for the simulated service.
pub const SIM_RESERVATION: &str = "RemoteSimReservedConcurrency";

/// How to run the stack.
#[derive(Clone, Debug)]
pub struct Options {
    pub template: PathBuf,
    /// An AWS API endpoint to use; `None` starts moto.
    pub endpoint: Option<String>,
    /// When starting moto: one server for DynamoDB and another for SQS and EventBridge, so
    /// that the two halves of the load each get a Python interpreter (and a core) of their own.
    pub split_emulators: bool,
    /// Where the function binaries are (a cargo target directory's profile folder).
    pub bin_dir: PathBuf,
    /// Port of the HTTP API on 127.0.0.1.
    pub api_port: u16,
    /// How much faster than their template rate schedules fire.
    pub schedule_speed: f64,
    /// Most processes per function (a function's reserved concurrency, if lower, wins).
    pub max_instances: usize,
    /// The account's quota of concurrent executions, shared by the stack's functions (not the
    /// simulated service, which stands for the outside world); `None` for no quota.
    pub account_concurrency: Option<usize>,
    pub stack_name: String,
    pub region: String,
    /// Template parameter values.
    pub parameters: HashMap<String, String>,
    /// Environment variables added to (or replacing) one function's: (logical id, name, value).
    pub overrides: Vec<(String, String, String)>,
    /// Managed policies of the template given to callers of the HTTP API: (access key id,
    /// policy). Others hold the default of [`crate::callers`].
    pub callers: Vec<(String, String)>,
    /// Whether the functions' logs are shown, each line behind the function's name.
    pub show_logs: bool,
}

/// A function and its processes.
#[derive(Debug)]
pub struct RunningFunction {
    pub spec: FunctionSpec,
    pub api: RuntimeApi,
    pub processes: Vec<Managed>,
}

/// The running stack; dropping it stops everything.
#[derive(Debug)]
pub struct LocalStack {
    /// The AWS API as the functions see it: the proxy, which serves every service.
    pub endpoint: String,
    /// The emulators behind the proxy, for tools that must not be counted.
    pub emulators: Endpoints,
    pub api_url: String,
    pub stack: Stack,
    pub functions: Vec<RunningFunction>,
    /// The proxy's call counts, fault rules and access checks.
    pub proxy: Proxy,
    /// What the functions' metric lines reported.
    pub metrics: Metrics,
    /// What reached a dead-letter queue, and why.
    pub dead_letters: DeadLetters,
    /// The trace segments the functions sent.
    pub traces: Traces,
    /// The account's concurrency quota, if one is emulated, and its throttles.
    pub account: Option<AccountConcurrency>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for LocalStack {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl LocalStack {
    /// Kills one running function process with SIGKILL, chosen with `random`, as a crash of its
    /// execution environment; the simulated remote service, which stands for the outside world,
    /// is spared. Returns the function's logical id and the process id, if any was running.
    pub fn kill_random(&self, random: &impl Random) -> Option<(String, u32)> {
        let candidates: Vec<(&str, u32)> = self
            .functions
            .iter()
            .filter(|f| f.spec.logical_id != REMOTE_SERVICE)
            .flat_map(|f| {
                f.processes.iter().filter_map(|p| Some((f.spec.logical_id.as_str(), p.pid()?)))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let pick = ((random.unit() * candidates.len() as f64) as usize).min(candidates.len() - 1);
        let (function, pid) = candidates[pick];
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .is_ok_and(|s| s.success());
        killed.then(|| (function.to_owned(), pid))
    }

    /// Invocations of any function that got no answer in time (see
    /// [`RuntimeApi::unanswered`]).
    pub fn unanswered(&self) -> u64 {
        self.functions.iter().map(|f| f.api.unanswered()).sum()
    }

    /// A deploy that changes one setting of `function` (a new workflow version, say): its
    /// processes start again with `name` set to `value`.
    pub fn redeploy(&self, function: &str, name: &str, value: &str) -> Result<(), Error> {
        let running = self
            .functions
            .iter()
            .find(|f| f.spec.logical_id == function)
            .ok_or_else(|| Error::Local(format!("no function {function}")))?;
        for process in &running.processes {
            process.redeploy(name, value);
        }
        Ok(())
    }

    /// How many times function processes were started again after exiting or being killed.
    pub fn restarts(&self) -> u32 {
        self.functions.iter().flat_map(|f| f.processes.iter().map(Managed::restarts)).sum()
    }

    /// What the proxy's access checks found so far: the calls each function's policy refused,
    /// and the grants of the template no call used. Its `Display` is a short report.
    pub fn access(&self) -> AccessReport {
        self.proxy.access.as_ref().map(Access::report).unwrap_or_default()
    }

    /// Appends the access report in brief to `report`; an error naming the denials if any call was
    /// denied, so that a run that needed a permission the template does not grant fails.
    pub fn check_access(&self, report: &mut String) -> Result<(), Error> {
        let access = self.access();
        report.push_str(&access.brief());
        if access.denials.is_empty() {
            Ok(())
        } else {
            Err(Error::Local(format!(
                "the functions' policies refused calls they made (template.yaml lacks a permission):\n{access}"
            )))
        }
    }

    /// Creates the resources and starts every function and event source.
    pub async fn up(options: &Options) -> Result<LocalStack, Error> {
        let emulators = match &options.endpoint {
            Some(e) => Endpoints::single(e),
            None if options.split_emulators => {
                Endpoints { dynamodb: start_moto()?, sqs_and_events: start_moto()? }
            }
            None => Endpoints::single(&start_moto()?),
        };
        let clients = Clients::new(&emulators, &options.region).await;
        let template = Template::load(&options.template)?;
        let io = |e: std::io::Error| Error::Local(format!("local network: {e}"));

        // Function URLs must be known before the environments that point at them are resolved.
        let mut url_listeners = HashMap::new();
        let mut attributes = HashMap::new();
        for (id, resource) in template.of_kind("AWS::Serverless::Function") {
            if resource.properties.get("FunctionUrlConfig").is_some() {
                let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
                let url = format!("http://{}/", listener.local_addr().map_err(io)?);
                attributes
                    .insert((format!("{id}Url"), "FunctionUrl".to_owned()), Value::String(url));
                url_listeners.insert(id.to_owned(), listener);
            }
        }
        let mut parameters = options.parameters.clone();
        // The simulated service keeps its ledger of keys in one process's memory; a laptop has
        // no account quota to spare the reservation from, so it is on unless asked otherwise.
        parameters.entry(SIM_RESERVATION.to_owned()).or_insert_with(|| "true".to_owned());
        let provision_options = ProvisionOptions {
            stack_name: options.stack_name.clone(),
            region: options.region.clone(),
            parameters,
            attributes,
        };
        let stack = provision(&template, &clients, &provision_options).await?;
        let callers = Arc::new(Callers::read(&template, &stack, &options.callers)?);

        let mut running = Vec::new();
        let mut tasks = Vec::new();
        let metrics = Metrics::default();
        let dead_letters = DeadLetters::new(true);
        let redrives = dead_letters::redrives(&template, &stack)?;
        // Straight to the emulator: watching is not the system's cost.
        tasks.push(dead_letters.watch(clients.sqs.clone(), redrives.clone()));
        let traces = Traces::default();
        let account = options.account_concurrency.map(AccountConcurrency::new);
        let daemon = tokio::net::UdpSocket::bind("127.0.0.1:0").await.map_err(io)?;
        let daemon_address = daemon.local_addr().map_err(io)?.to_string();
        tasks.push(traces.listen(daemon));
        // Every function signs with an access key of its own, checked against its policy.
        let access = Access::new(policy::policies(&template, &stack)?);
        let proxy = Proxy::new(Upstreams {
            default: emulators.sqs_and_events.clone(),
            by_service: HashMap::from([
                ("dynamodb".to_owned(), emulators.dynamodb.clone()),
                ("sqs".to_owned(), emulators.sqs_and_events.clone()),
                ("eventbridge".to_owned(), emulators.sqs_and_events.clone()),
            ]),
        })
        .with_access(access);
        let listener = TcpListener::bind("127.0.0.1:0").await.map_err(io)?;
        let endpoint = format!("http://{}", listener.local_addr().map_err(io)?);
        let serving = proxy.clone();
        tasks.push(tokio::spawn(async move {
            let _ = serving.serve(listener).await;
        }));
        // The event source mappings poll through the proxy like the functions, on their behalf:
        // on AWS their receives and deletes are billed too, and allowed by the function's role.
        let pollers = Endpoints::single(&endpoint);
        let throttle = api_throttle(&template, &stack)?;
        let mut routes = Vec::new();
        for mut spec in functions(&template, &stack)? {
            for (id, name, value) in &options.overrides {
                if *id == spec.logical_id {
                    spec.environment.insert(name.clone(), value.clone());
                }
            }
            let program = options.bin_dir.join(&spec.binary);
            if !program.exists() {
                return Err(Error::Local(format!(
                    "{}: binary {} not found (build it with `cargo build --bins`)",
                    spec.logical_id,
                    program.display()
                )));
            }
            let mut api = RuntimeApi::start(&spec.logical_id, &options.region).await.map_err(io)?;
            if let Some(account) = account.as_ref().filter(|_| spec.logical_id != REMOTE_SERVICE) {
                api = api.within(account.clone());
            }
            let instances = spec
                .reserved_concurrency
                .map_or(options.max_instances, |r| r as usize)
                .clamp(1, options.max_instances.max(1));
            let processes = (1..=instances)
                .map(|n| {
                    let mut process =
                        process_spec(&spec, &program, &api, &endpoint, &options.region, n);
                    process.echo = options.show_logs;
                    process.metrics = Some(metrics.clone());
                    process.dead_letters = Some(dead_letters.clone());
                    process
                        .environment
                        .insert("AWS_XRAY_DAEMON_ADDRESS".into(), daemon_address.clone());
                    Managed::start(process)
                })
                .collect();
            // Invocations beyond the running processes would only queue: admit as many at once.
            let limit = Arc::new(Semaphore::new(instances));
            for event in &spec.events {
                match event {
                    EventSource::Sqs {
                        queue_arn,
                        batch_size,
                        batching_window,
                        report_batch_item_failures,
                        max_concurrency,
                        ..
                    } => {
                        let queue_url = queue_url(&stack, queue_arn)?;
                        let redrive = redrives.iter().find(|r| r.queue_url == queue_url);
                        let limit = match max_concurrency {
                            Some(m) if (*m as usize) < instances => {
                                Arc::new(Semaphore::new(*m as usize))
                            }
                            _ => limit.clone(),
                        };
                        let mapping = SqsMapping {
                            function: spec.logical_id.clone(),
                            queue_url: queue_url.clone(),
                            queue_arn: queue_arn.clone(),
                            batch_size: i32::try_from(*batch_size).unwrap_or(10),
                            batching_window: *batching_window,
                            report_batch_item_failures: *report_batch_item_failures,
                            timeout: spec.timeout,
                            region: options.region.clone(),
                            max_receive_count: redrive.map(|r| r.max_receive_count),
                            visibility_timeout: redrive
                                .map_or(Duration::from_secs(30), |r| r.visibility_timeout),
                            dead_letters: Some(dead_letters.clone()),
                        };
                        let sqs = Clients::signing_as(&pollers, &options.region, &spec.logical_id)
                            .await
                            .sqs;
                        tasks.push(sources::poll_sqs(sqs, mapping, api.clone(), limit));
                    }
                    EventSource::Schedule { expression, .. } => {
                        let period = rate(expression).ok_or_else(|| {
                            Error::Template(format!("{}: schedule {expression:?} is not a rate() the local stack can run", spec.logical_id))
                        })?;
                        let period = period.div_f64(options.schedule_speed.max(0.001));
                        tasks.push(sources::schedule(
                            spec.logical_id.clone(),
                            api.clone(),
                            period,
                            spec.timeout,
                            options.region.clone(),
                        ));
                    }
                    EventSource::HttpApi { method, path, authorizer, .. } => routes.push(Route {
                        method: method.clone(),
                        path: path.clone(),
                        authorizer: authorizer
                            .as_ref()
                            .map(|a| gateway_authorizer(a, &options.region, sigv4::EXECUTE_API)),
                        function: api.clone(),
                        timeout: spec.timeout.min(Duration::from_secs(30)),
                        // Each route has a bucket of its own, as in API Gateway.
                        throttle: throttle.map(|(rate, burst)| Throttle::new(rate, burst)),
                        invoked: None,
                        callers: Some(callers.clone()),
                    }),
                }
            }
            if let Some(listener) = url_listeners.remove(&spec.logical_id) {
                let route = Route {
                    method: "ANY".into(),
                    path: "/{proxy+}".into(),
                    function: api.clone(),
                    timeout: spec.timeout,
                    throttle: None,
                    authorizer: spec
                        .function_url
                        .clone()
                        .flatten()
                        .map(|a| gateway_authorizer(&a, &options.region, sigv4::LAMBDA)),
                    invoked: proxy
                        .access
                        .clone()
                        .zip(stack.attribute(&spec.logical_id, "Arn"))
                        .map(|(access, function_arn)| gateway::Invoked { access, function_arn }),
                    callers: None,
                };
                tasks.push(tokio::spawn(async move {
                    gateway::serve(listener, vec![route]).await;
                }));
            }
            running.push(RunningFunction { spec, api, processes });
        }
        let listener = TcpListener::bind(("127.0.0.1", options.api_port)).await.map_err(io)?;
        let api_url = format!("http://{}", listener.local_addr().map_err(io)?);
        tasks.push(tokio::spawn(async move {
            gateway::serve(listener, routes).await;
        }));
        Ok(LocalStack {
            endpoint,
            emulators,
            api_url,
            stack,
            functions: running,
            proxy,
            metrics,
            dead_letters,
            traces,
            account,
            tasks,
        })
    }
}

/// How the gateway checks a route's callers.
fn gateway_authorizer(auth: &RouteAuth, region: &str, service: &str) -> Authorizer {
    match auth {
        RouteAuth::Iam => {
            Authorizer::Iam { region: region.to_owned(), service: service.to_owned() }
        }
        RouteAuth::Jwt { issuer, audience } => {
            Authorizer::Jwt { issuer: issuer.clone(), audience: audience.clone() }
        }
        RouteAuth::Other(kind) => Authorizer::Unsupported(kind.clone()),
    }
}

/// The HTTP API's throttling limits (rate, burst) from the `DefaultRouteSettings` of its SAM
/// declaration or of its stage.
fn api_throttle(template: &Template, stack: &Stack) -> Result<Option<(f64, f64)>, Error> {
    let Some((id, api)) = template
        .of_kind("AWS::Serverless::HttpApi")
        .chain(template.of_kind("AWS::ApiGatewayV2::Stage"))
        .next()
    else {
        return Ok(None);
    };
    let settings =
        stack.eval(api.properties.get("DefaultRouteSettings").unwrap_or(&Value::Null))?;
    let number = |key: &str| -> Result<Option<f64>, Error> {
        settings
            .get(key)
            .map(|v| {
                crate::template::scalar_string(v)?
                    .parse::<f64>()
                    .map_err(|_| Error::Template(format!("{id}: {key} is not a number")))
            })
            .transpose()
    };
    match (number("ThrottlingRateLimit")?, number("ThrottlingBurstLimit")?) {
        (Some(rate), Some(burst)) => Ok(Some((rate, burst))),
        (None, None) => Ok(None),
        _ => Err(Error::Template(format!("{id}: set both throttling limits, or neither"))),
    }
}

/// Starts a moto server that lives as long as this process (leaking it ties its lifetime to
/// ours), and returns its endpoint.
fn start_moto() -> Result<String, Error> {
    let moto: &'static Moto = Box::leak(Box::new(Moto::start().map_err(Error::Local)?));
    Ok(moto.endpoint.clone())
}

fn queue_url(stack: &Stack, arn: &str) -> Result<String, Error> {
    stack
        .context
        .attributes
        .iter()
        .find(|((_, attribute), value)| attribute == "Arn" && value.as_str() == Some(arn))
        .and_then(|((id, _), _)| stack.reference(id))
        .ok_or_else(|| Error::Local(format!("no queue with ARN {arn} was created")))
}

fn process_spec(
    spec: &FunctionSpec,
    program: &std::path::Path,
    api: &RuntimeApi,
    endpoint: &str,
    region: &str,
    n: usize,
) -> ProcessSpec {
    let mut environment = spec.environment.clone();
    let name = spec.logical_id.clone();
    for (k, v) in [
        ("AWS_LAMBDA_RUNTIME_API", api.address()),
        ("AWS_LAMBDA_FUNCTION_NAME", name.clone()),
        ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", spec.memory_mb.to_string()),
        ("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST".to_owned()),
        ("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{name}")),
        ("AWS_LAMBDA_LOG_STREAM_NAME", format!("local/{n}")),
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_REGION", region.to_owned()),
        ("AWS_DEFAULT_REGION", region.to_owned()),
        // Credentials of its own: the proxy knows the function by its access key id.
        ("AWS_ACCESS_KEY_ID", name.clone()),
        ("AWS_SECRET_ACCESS_KEY", crate::sigv4::LOCAL_SECRET_KEY.to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ] {
        environment.insert(k.to_owned(), v);
    }
    if let Ok(path) = std::env::var("PATH") {
        environment.insert("PATH".into(), path);
    }
    ProcessSpec {
        label: format!("{name}#{n}"),
        program: program.to_owned(),
        args: Vec::new(),
        environment,
        echo: true,
        metrics: None,
        dead_letters: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::{local_dry_run, project_template};

    fn stack(parameters: &[(&str, &str)]) -> (Template, Stack) {
        let template = project_template();
        let stack = local_dry_run(&template, parameters);
        (template, stack)
    }

    #[test]
    fn the_api_is_throttled_as_its_parameters_say() {
        let (template, s) = stack(&[]);
        assert_eq!(api_throttle(&template, &s).unwrap(), Some((200.0, 400.0)), "the defaults");
        let (template, s) =
            stack(&[("ApiThrottlingRateLimit", "5"), ("ApiThrottlingBurstLimit", "9")]);
        assert_eq!(api_throttle(&template, &s).unwrap(), Some((5.0, 9.0)));
    }
}
