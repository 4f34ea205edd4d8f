//! Each function of the local stack started as its real binary, and wired to what it needs:
//! its Runtime API, its processes' environment, and its event sources (SQS mappings,
//! schedules, routes of the HTTP API, its function URL).

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{Options, REMOTE_SERVICE, RunningFunction, network};
use crate::Error;
use crate::access::callers::Callers;
use crate::access::sigv4;
use crate::emulation::aws::{Clients, Endpoints};
use crate::emulation::functions::{EventSource, FunctionSpec, RouteAuth, rate};
use crate::emulation::gateway::{self, Authorizer, Route, Throttle};
use crate::emulation::processes::{Logs, Managed, Panics, ProcessSpec};
use crate::emulation::provision::Stack;
use crate::emulation::proxy::Proxy;
use crate::emulation::runtime_api::{AccountConcurrency, RuntimeApi};
use crate::emulation::sources::{self, SqsMapping};
use crate::observe::dead_letters::{DeadLetters, Redrive};
use crate::observe::metrics::Metrics;

/// Calls the simulated service answers side by side on the local stack: at least as many as
/// the agents send it at once at the defaults (batches of 10, two at a time per agent, for up
/// to six agents).
const SIM_CALLS_AT_ONCE: &str = "128";

/// What every function of the stack is wired to as it starts.
pub(super) struct Wiring<'a> {
    pub(super) options: &'a Options,
    pub(super) stack: &'a Stack,
    /// The proxy's URL: the AWS API as the functions see it.
    pub(super) endpoint: &'a str,
    pub(super) proxy: &'a Proxy,
    /// Where the event source mappings send their requests.
    pub(super) pollers: Endpoints,
    /// The HTTP API's throttling limits (rate, burst), if it has them.
    pub(super) throttle: Option<(f64, f64)>,
    pub(super) metrics: &'a Metrics,
    pub(super) dead_letters: &'a DeadLetters,
    pub(super) panics: &'a Panics,
    pub(super) logs: &'a Logs,
    pub(super) redrives: &'a [Redrive],
    pub(super) account: Option<&'a AccountConcurrency>,
    pub(super) callers: Arc<Callers>,
}

impl Wiring<'_> {
    /// Starts `spec`'s processes behind a Runtime API of their own, and its event sources: SQS
    /// mappings and schedules as `tasks`, HTTP API routes into `routes`, and its function URL on
    /// `url_listener` if it has one.
    pub(super) async fn start(
        &self,
        mut spec: FunctionSpec,
        url_listener: Option<TcpListener>,
        routes: &mut Vec<Route>,
        tasks: &mut Vec<JoinHandle<()>>,
    ) -> Result<RunningFunction, Error> {
        let options = self.options;
        with_overrides(&mut spec, &options.overrides);
        let program = options.bin_dir.join(&spec.binary);
        if !program.exists() {
            return Err(Error::Local(format!(
                "{}: binary {} not found (build it with `cargo build --bins`)",
                spec.logical_id,
                program.display()
            )));
        }
        let mut api =
            RuntimeApi::start(&spec.logical_id, &options.region).await.map_err(network)?;
        if let Some(account) = self.account.filter(|_| spec.logical_id != REMOTE_SERVICE) {
            api = api.within(account.clone());
        }
        let instances = spec
            .reserved_concurrency
            .map_or(options.max_instances, |r| r as usize)
            .clamp(1, options.max_instances.max(1));
        let processes = (1..=instances).map(|n| self.process(&spec, &program, &api, n)).collect();
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
                    let mapping = self.sqs_mapping(
                        &spec,
                        queue_arn,
                        *batch_size,
                        *batching_window,
                        *report_batch_item_failures,
                    )?;
                    let limit = match max_concurrency {
                        Some(m) if (*m as usize) < instances => {
                            Arc::new(Semaphore::new(*m as usize))
                        }
                        _ => limit.clone(),
                    };
                    let sqs = Clients::signing_as(&self.pollers, &options.region, &spec.logical_id)
                        .await
                        .sqs;
                    tasks.push(sources::poll_sqs(sqs, mapping, api.clone(), limit));
                }
                EventSource::Schedule { expression, .. } => {
                    tasks.push(self.schedule(&spec, expression, &api)?);
                }
                EventSource::HttpApi { method, path, authorizer, .. } => {
                    routes.push(self.route(&spec, method, path, authorizer.as_ref(), &api));
                }
            }
        }
        if let Some(listener) = url_listener {
            let route = self.function_url(&spec, &api);
            tasks.push(tokio::spawn(async move {
                gateway::serve(listener, vec![route]).await;
            }));
        }
        let binary = fingerprint(&program);
        Ok(RunningFunction { spec, api, processes, binary })
    }

    /// The `n`th process of `spec`, started.
    fn process(
        &self,
        spec: &FunctionSpec,
        program: &std::path::Path,
        api: &RuntimeApi,
        n: usize,
    ) -> Managed {
        let at = Reached { endpoint: self.endpoint };
        let mut process = process_spec(spec, program, api, at, &self.options.region, n);
        process.echo = self.options.show_logs;
        process.metrics = Some(self.metrics.clone());
        process.dead_letters = Some(self.dead_letters.clone());
        process.panics = Some(self.panics.clone());
        process.logs = Some(self.logs.clone());
        Managed::start(process)
    }

    /// The mapping of an SQS event source of `spec` on `queue_arn`, with what its queue's
    /// redrive policy says.
    fn sqs_mapping(
        &self,
        spec: &FunctionSpec,
        queue_arn: &str,
        batch_size: u32,
        batching_window: Duration,
        report_batch_item_failures: bool,
    ) -> Result<SqsMapping, Error> {
        let queue_url = queue_url(self.stack, queue_arn)?;
        let redrive = self.redrives.iter().find(|r| r.queue_url == queue_url);
        Ok(SqsMapping {
            function: spec.logical_id.clone(),
            queue_url: queue_url.clone(),
            queue_arn: queue_arn.to_owned(),
            batch_size: i32::try_from(batch_size).unwrap_or(10),
            batching_window,
            report_batch_item_failures,
            timeout: spec.timeout,
            region: self.options.region.clone(),
            max_receive_count: redrive.map(|r| r.max_receive_count),
            visibility_timeout: redrive.map_or(Duration::from_secs(30), |r| r.visibility_timeout),
            dead_letters: Some(self.dead_letters.clone()),
        })
    }

    /// `spec`'s schedule, run `schedule_speed` times faster than its rate.
    fn schedule(
        &self,
        spec: &FunctionSpec,
        expression: &str,
        api: &RuntimeApi,
    ) -> Result<JoinHandle<()>, Error> {
        let period = rate(expression).ok_or_else(|| {
            Error::Template(format!(
                "{}: schedule {expression:?} is not a rate() the local stack can run",
                spec.logical_id
            ))
        })?;
        let period = period.div_f64(self.options.schedule_speed.max(0.001));
        Ok(sources::schedule(
            spec.logical_id.clone(),
            api.clone(),
            period,
            spec.timeout,
            self.options.region.clone(),
        ))
    }

    /// A route of the HTTP API to `spec`.
    fn route(
        &self,
        spec: &FunctionSpec,
        method: &str,
        path: &str,
        authorizer: Option<&RouteAuth>,
        api: &RuntimeApi,
    ) -> Route {
        Route {
            method: method.to_owned(),
            path: path.to_owned(),
            authorizer: authorizer
                .map(|a| gateway_authorizer(a, &self.options.region, sigv4::EXECUTE_API)),
            function: api.clone(),
            timeout: spec.timeout.min(Duration::from_secs(30)),
            // Each route has a bucket of its own, as in API Gateway.
            throttle: self.throttle.map(|(rate, burst)| Throttle::new(rate, burst)),
            invoked: None,
            callers: Some(self.callers.clone()),
        }
    }

    /// The one route of `spec`'s function URL: everything, to it.
    fn function_url(&self, spec: &FunctionSpec, api: &RuntimeApi) -> Route {
        Route {
            method: "ANY".into(),
            path: "/{proxy+}".into(),
            function: api.clone(),
            timeout: spec.timeout,
            throttle: None,
            authorizer: spec
                .function_url
                .clone()
                .flatten()
                .map(|a| gateway_authorizer(&a, &self.options.region, sigv4::LAMBDA)),
            invoked: self
                .proxy
                .access
                .clone()
                .zip(self.stack.attribute(&spec.logical_id, "Arn"))
                .map(|(access, function_arn)| gateway::Invoked { access, function_arn }),
            callers: None,
        }
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

/// `spec` with the environment `overrides` (function, name, value) set for it.
pub(super) fn with_overrides(spec: &mut FunctionSpec, overrides: &[(String, String, String)]) {
    for (id, name, value) in overrides {
        if *id == spec.logical_id {
            spec.environment.insert(name.clone(), value.clone());
        }
    }
}

/// What a program's file holds, in brief: two builds that wrote the same bytes have the same
/// fingerprint, whatever their times. `None` if it cannot be read.
pub(super) fn fingerprint(program: &std::path::Path) -> Option<u64> {
    use std::hash::Hasher;
    use std::io::Read;
    let mut file = std::fs::File::open(program).ok()?;
    let mut hasher = std::hash::DefaultHasher::new();
    let mut buffer = vec![0; 1 << 20];
    loop {
        match file.read(&mut buffer).ok()? {
            0 => return Some(hasher.finish()),
            n => hasher.write(&buffer[..n]),
        }
    }
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

/// Where a function's process reaches the stack: the AWS API (X-Ray's included).
#[derive(Clone, Copy, Debug)]
pub(super) struct Reached<'a> {
    pub(super) endpoint: &'a str,
}

pub(super) fn process_spec(
    spec: &FunctionSpec,
    program: &std::path::Path,
    api: &RuntimeApi,
    at: Reached<'_>,
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
        ("AWS_ENDPOINT_URL", at.endpoint.to_owned()),
        ("AWS_REGION", region.to_owned()),
        ("AWS_DEFAULT_REGION", region.to_owned()),
        // Credentials of its own: the proxy knows the function by its access key id.
        ("AWS_ACCESS_KEY_ID", name.clone()),
        ("AWS_SECRET_ACCESS_KEY", sigv4::LOCAL_SECRET_KEY.to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ] {
        environment.insert(k.to_owned(), v);
    }
    if let Ok(path) = std::env::var("PATH") {
        environment.insert("PATH".into(), path);
    }
    if spec.logical_id == REMOTE_SERVICE {
        // The simulated service's one environment polls for several invocations at once (as a
        // Lambda Managed Instance would) and answers them side by side, as the services it
        // stands for do: two steps sent at once take the time of the slower one, and a call
        // it holds open for a test holds up none of the others.
        environment.insert("AWS_LAMBDA_MAX_CONCURRENCY".into(), SIM_CALLS_AT_ONCE.into());
    }
    ProcessSpec {
        label: format!("{name}#{n}"),
        program: program.to_owned(),
        args: Vec::new(),
        environment,
        echo: true,
        metrics: None,
        dead_letters: None,
        panics: None,
        logs: None,
    }
}
