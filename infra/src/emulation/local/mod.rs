//! The local stack: everything `template.yaml` declares, running on this machine against an
//! AWS API emulator. Resources are created from the template; each function runs as its real
//! binary behind a local Runtime API, with the environment the template gives it; SQS event
//! source mappings, schedules, the HTTP API and function URLs are emulated.
//!
//! Here the stack is brought up as a whole and looked after; `wiring` starts each function
//! and connects its event sources.

mod wiring;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use sas_engine::ports::Random;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::Error;
use crate::access::callers::Callers;
use crate::access::policy::{self, Access, AccessReport};
use crate::emulation::aws::{Clients, Endpoints};
use crate::emulation::emulator::Moto;
use crate::emulation::functions::{FunctionSpec, functions};
use crate::emulation::gateway;
use crate::emulation::identity_pool::IdentityPool;
use crate::emulation::processes::{Logs, Managed, Panics};
use crate::emulation::provision::{Options as ProvisionOptions, Stack, provision};
use crate::emulation::proxy::{Proxy, Upstreams};
use crate::emulation::runtime_api::{AccountConcurrency, RuntimeApi};
use crate::emulation::template::Template;
use crate::observe::dead_letters::{self, DeadLetters};
use crate::observe::metrics::Metrics;
use crate::observe::traces::Traces;
use wiring::Wiring;

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
    /// policy). Others hold the default of [`crate::access::callers`].
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
    /// The fingerprint of the binary its processes run, as it was when they (re)started.
    binary: Option<u64>,
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
    /// The trace segments the functions sent to X-Ray.
    pub traces: Traces,
    /// The panics the functions printed, whatever their output is for.
    pub panics: Panics,
    /// The latest lines each function printed.
    pub logs: Logs,
    /// The account's concurrency quota, if one is emulated, and its throttles.
    pub account: Option<AccountConcurrency>,
    /// How it was started, and last reloaded.
    options: Options,
    tasks: Vec<JoinHandle<()>>,
}

/// What a reload did to each function.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reload {
    /// The functions started again, each with what changed (`build`, `environment`).
    pub restarted: Vec<(String, String)>,
    /// The functions whose grants (their role's policies in the template) changed: the AWS
    /// proxy decides their calls on the new ones from now on, without a restart.
    pub regranted: Vec<String>,
    /// The functions left running as they were, with nothing changed.
    pub unchanged: Vec<String>,
    /// What changed but was not applied, and why, each as a sentence.
    pub not_applied: Vec<String>,
}

impl std::fmt::Display for Reload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.restarted.is_empty() && self.regranted.is_empty() {
            writeln!(f, "nothing to restart: every function runs its current build and settings")?;
        }
        for function in &self.regranted {
            writeln!(f, "{function}: its grants changed: in force now")?;
        }
        for (function, what) in &self.restarted {
            writeln!(f, "{function}: started again ({what} changed)")?;
        }
        if !self.restarted.is_empty() && !self.unchanged.is_empty() {
            writeln!(f, "unchanged: {}", self.unchanged.join(", "))?;
        }
        for note in &self.not_applied {
            writeln!(f, "not applied: {note}")?;
        }
        Ok(())
    }
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

    /// How the stack was started (and last reloaded).
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Applies what changed since the stack started, as `options` now say (the same as at the
    /// start, for a plain reload): the template is read again, and each function whose binary
    /// or environment changed starts again on the same emulator and event sources. Its Runtime
    /// API first stops handing out invocations and lets the ones in flight end, so no lease is
    /// lost; invocations made meanwhile wait for the new processes. The simulated remote
    /// service is never restarted: it stands for the outside world, and keeps its ledger and
    /// ids. Resources, event sources and functions added or removed need `up` again, and are
    /// reported, not applied.
    pub async fn reload(&mut self, options: Options) -> Result<Reload, Error> {
        let template = Template::load(&options.template)?;
        let mut wanted = functions(&template, &self.stack).map_err(|e| {
            Error::Local(format!(
                "{e} (a reload restarts functions; resources added to the template need `local-stack up` again)"
            ))
        })?;
        let mut reload = Reload::default();
        // Grants apply to the calls to come, whatever else changes: the proxy checks each
        // call against the role's policies it holds.
        if let Some(access) = &self.proxy.access {
            match policy::policies(&template, &self.stack) {
                Ok(policies) => reload.regranted = access.replace(policies),
                Err(e) => reload.not_applied.push(format!(
                    "the functions' grants: {e} (`local-stack up` again creates what they name)"
                )),
            }
        }
        for running in &self.functions {
            if !wanted.iter().any(|w| w.logical_id == running.spec.logical_id) {
                reload.not_applied.push(format!(
                    "{} is no longer in the template; it runs until the stack is started again",
                    running.spec.logical_id
                ));
            }
        }
        let mut fingerprints: HashMap<PathBuf, Option<u64>> = HashMap::new();
        let mut changes = Vec::new();
        for spec in &mut wanted {
            wiring::with_overrides(spec, &options.overrides);
            let Some(at) = self.functions.iter().position(|f| f.spec.logical_id == spec.logical_id)
            else {
                reload.not_applied.push(format!(
                    "{} is new in the template: `local-stack up` again creates it and its event sources",
                    spec.logical_id
                ));
                continue;
            };
            let running = &self.functions[at];
            let program = options.bin_dir.join(&spec.binary);
            let binary = *fingerprints
                .entry(program.clone())
                .or_insert_with(|| wiring::fingerprint(&program));
            if binary.is_none() {
                return Err(Error::Local(format!(
                    "{}: binary {} not found (build it with `cargo build --bins`)",
                    spec.logical_id,
                    program.display()
                )));
            }
            let mut what = Vec::new();
            if binary != running.binary || spec.binary != running.spec.binary {
                what.push("build");
            }
            if spec.environment != running.spec.environment {
                what.push("environment");
            }
            let before = &running.spec;
            let rewired = spec.events != before.events
                || spec.timeout != before.timeout
                || spec.memory_mb != before.memory_mb
                || spec.reserved_concurrency != before.reserved_concurrency
                || spec.function_url != before.function_url;
            if rewired {
                reload.not_applied.push(format!(
                    "{}: its events, timeout, memory or concurrency changed; `local-stack up` again applies them",
                    spec.logical_id
                ));
            }
            if what.is_empty() {
                reload.unchanged.push(spec.logical_id.clone());
            } else if spec.logical_id == REMOTE_SERVICE {
                reload.not_applied.push(format!(
                    "{REMOTE_SERVICE}: its {} changed, but it keeps running as it was, with its ledger and ids (it stands for the outside world)",
                    what.join(" and ")
                ));
            } else {
                changes.push((at, spec.clone(), program, binary, what.join(" and ")));
            }
        }
        // Every changed function drains at once, so that they are down together and briefly.
        let drains: Vec<_> = changes
            .iter()
            .map(|(at, ..)| {
                let f = &self.functions[*at];
                let (api, limit) = (f.api.clone(), f.spec.timeout);
                tokio::spawn(async move { api.drain(limit).await })
            })
            .collect();
        for ((at, spec, program, binary, what), drain) in changes.into_iter().zip(drains) {
            let drained = drain.await.unwrap_or(false);
            let running = &mut self.functions[at];
            for (n, process) in running.processes.iter().enumerate() {
                let at = wiring::Reached { endpoint: &self.endpoint };
                let process_spec =
                    wiring::process_spec(&spec, &program, &running.api, at, &options.region, n + 1);
                process.replace(process_spec.environment);
            }
            running.api.resume();
            if !drained {
                reload.not_applied.push(format!(
                    "{}: an invocation was still running after its timeout and was cut short",
                    spec.logical_id
                ));
            }
            running.spec = spec;
            running.binary = binary;
            reload.restarted.push((running.spec.logical_id.clone(), what));
        }
        self.options = options;
        Ok(reload)
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

        // Function URLs must be known before the environments that point at them are resolved.
        let (mut url_listeners, attributes) = function_urls(&template).await?;
        let stack = provision(&template, &clients, &provision_options(options, attributes)).await?;
        let callers = Arc::new(Callers::read(&template, &stack, &options.callers)?);

        let mut tasks = Vec::new();
        let metrics = Metrics::default();
        let dead_letters = DeadLetters::new(true);
        let redrives = dead_letters::redrives(&template, &stack)?;
        // Straight to the emulator: watching is not the system's cost.
        tasks.push(dead_letters.watch(clients.sqs.clone(), redrives.clone()));
        let traces = Traces::new(clients.xray.clone());
        let panics = Panics::default();
        let logs = Logs::default();
        let account = options.account_concurrency.map(AccountConcurrency::new);
        // Every function signs with an access key of its own, checked against its policy.
        let access = Access::new(policy::policies(&template, &stack)?);
        let (proxy, endpoint) = start_proxy(&emulators, access, &mut tasks).await?;
        let wiring = Wiring {
            options,
            stack: &stack,
            endpoint: &endpoint,
            proxy: &proxy,
            // The event source mappings poll through the proxy like the functions, on their
            // behalf: on AWS their receives and deletes are billed too, and allowed by the
            // function's role.
            pollers: Endpoints::single(&endpoint),
            throttle: api_throttle(&template, &stack)?,
            metrics: &metrics,
            dead_letters: &dead_letters,
            panics: &panics,
            logs: &logs,
            redrives: &redrives,
            account: account.as_ref(),
            callers,
        };
        // A JWT stack's console gets its credentials from an identity pool: emulated, and
        // named to the functions as the SDK names an endpoint of its own to a service.
        let identity = match IdentityPool::read(&template, &stack)? {
            Some(pool) => {
                let (endpoint, task) = pool.serve().await?;
                tasks.push(task);
                Some(endpoint)
            }
            None => None,
        };
        let mut running = Vec::new();
        let mut routes = Vec::new();
        for mut spec in functions(&template, &stack)? {
            if let Some(identity) = &identity {
                spec.environment
                    .insert("AWS_ENDPOINT_URL_COGNITO_IDENTITY".into(), identity.clone());
            }
            let url_listener = url_listeners.remove(&spec.logical_id);
            running.push(wiring.start(spec, url_listener, &mut routes, &mut tasks).await?);
        }
        let listener = TcpListener::bind(("127.0.0.1", options.api_port)).await.map_err(network)?;
        let api_url = format!("http://{}", listener.local_addr().map_err(network)?);
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
            panics,
            logs,
            account,
            options: options.clone(),
            tasks,
        })
    }
}

/// A listener on loopback for each function with a function URL, and the URLs as the
/// template's `<id>Url.FunctionUrl` attributes.
async fn function_urls(
    template: &Template,
) -> Result<(HashMap<String, TcpListener>, HashMap<(String, String), Value>), Error> {
    let mut url_listeners = HashMap::new();
    let mut attributes = HashMap::new();
    for (id, resource) in template.of_kind("AWS::Serverless::Function") {
        if resource.properties.get("FunctionUrlConfig").is_some() {
            let listener = TcpListener::bind("127.0.0.1:0").await.map_err(network)?;
            let url = format!("http://{}/", listener.local_addr().map_err(network)?);
            attributes.insert((format!("{id}Url"), "FunctionUrl".to_owned()), Value::String(url));
            url_listeners.insert(id.to_owned(), listener);
        }
    }
    Ok((url_listeners, attributes))
}

/// How the stack is provisioned: as `options` say, with the function URLs' `attributes`.
fn provision_options(
    options: &Options,
    attributes: HashMap<(String, String), Value>,
) -> ProvisionOptions {
    let mut parameters = options.parameters.clone();
    // The simulated service keeps its ledger of keys in one process's memory; a laptop has
    // no account quota to spare the reservation from, so it is on unless asked otherwise.
    parameters.entry(SIM_RESERVATION.to_owned()).or_insert_with(|| "true".to_owned());
    // Locally, a batching window saves nothing (no bill) and only slows every hop: none
    // unless asked for.
    for window in ["SchedulerBatchingWindowSeconds", "AgentBatchingWindowSeconds"] {
        parameters.entry(window.to_owned()).or_insert_with(|| "0".to_owned());
    }
    ProvisionOptions {
        stack_name: options.stack_name.clone(),
        region: options.region.clone(),
        parameters,
        attributes,
    }
}

/// Starts the AWS proxy in front of `emulators`, checking calls with `access`; returns it and
/// its URL.
async fn start_proxy(
    emulators: &Endpoints,
    access: Access,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(Proxy, String), Error> {
    let proxy = Proxy::new(Upstreams {
        default: emulators.sqs_and_events.clone(),
        by_service: HashMap::from([
            ("dynamodb".to_owned(), emulators.dynamodb.clone()),
            ("sqs".to_owned(), emulators.sqs_and_events.clone()),
            ("eventbridge".to_owned(), emulators.sqs_and_events.clone()),
            ("s3".to_owned(), emulators.sqs_and_events.clone()),
        ]),
    })
    .with_access(access);
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(network)?;
    let endpoint = format!("http://{}", listener.local_addr().map_err(network)?);
    let serving = proxy.clone();
    tasks.push(tokio::spawn(async move {
        let _ = serving.serve(listener).await;
    }));
    Ok((proxy, endpoint))
}

/// A failure of the local network (a port, a socket).
fn network(e: std::io::Error) -> Error {
    Error::Local(format!("local network: {e}"))
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
                crate::emulation::template::scalar_string(v)?
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulation::provision::{local_dry_run, project_template};

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
