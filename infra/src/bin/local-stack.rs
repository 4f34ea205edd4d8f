//! `local-stack`: runs the whole system on this machine, with no AWS account and no Docker.
//!
//! `local-stack up` creates every table, queue, bus and rule of `template.yaml` on an AWS API
//! emulator (moto, installed into `.venv` and started on a free port, or any endpoint given
//! with `--endpoint` or `AWS_ENDPOINT_URL`), runs each function as its real binary, and
//! emulates its event sources: SQS mappings, the supervisor's schedule, the HTTP API on
//! 127.0.0.1:3000 and the simulated remote service's function URL. A page on 127.0.0.1:3001
//! shows the run as it goes: orders by state, time to terminal, queue depths, alerts, dead
//! letters, and each order's timeline.
//!
//! `local-stack demo` does the same, then submits orders while the remote services misbehave,
//! follows them to the end, and prints a summary; it exits 0 only if every order reached a
//! terminal state with no remote effect applied twice and every failed order raised its alert,
//! and no function made a call its policy in the template does not allow. It writes the same
//! page, with everything it shows embedded, to `demo-report.html` in the target directory.
//!
//! Every function's AWS calls are checked against its policy: `up` logs each refused call on
//! stderr as it happens, and reports when it stops the permissions no call used.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use sas_infra::access::issuer::LocalIssuer;
use sas_infra::access::jwt;
use sas_infra::demo::{self, Chaos, DEMO_FAULTS};
use sas_infra::emulation::aws::{Clients, Endpoints};
use sas_infra::emulation::emulator::workspace_root;
use sas_infra::emulation::local::{LocalStack, Options};
use sas_infra::emulation::proxy::FaultRule;
use sas_infra::observe::view::Observer;

#[derive(Debug, Parser)]
#[command(
    name = "local-stack",
    version,
    about = "Run the Scheduler Agent Supervisor system locally"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write `template.yaml` with its agents' loop expanded, for tools that take no loops
    /// (`sam local start-api`; see the README).
    Expand {
        /// Where to write it (JSON).
        #[arg(long, short, default_value = "target/template-expanded.json")]
        output: std::path::PathBuf,
    },
    /// Create the resources, start every function and event source, and run until Ctrl-C.
    Up {
        #[command(flatten)]
        stack: StackArgs,
        /// Fault knobs of the simulated remote service (JSON; see `remote-sim --help`).
        #[arg(long)]
        faults: Option<String>,
        /// Run the supervisor's schedule this many times faster than the template's rate.
        #[arg(long, default_value_t = 1.0)]
        speed: f64,
        /// Port on 127.0.0.1 of the page that shows the run (0: any free port).
        #[arg(long, default_value_t = 3001)]
        view_port: u16,
    },
    /// Rebuild, and have the stack that `up` runs start again every function whose build or
    /// settings changed (a new workflow version, an agent's code), on the same emulator and
    /// simulated service: the orders in flight go on, each on its own workflow version.
    Reload {
        /// Use the binaries as they are instead of running `cargo build` first.
        #[arg(long)]
        no_build: bool,
    },
    /// Run the stack under load while the remote services misbehave, then summarise.
    Demo {
        #[command(flatten)]
        stack: StackArgs,
        /// Orders to submit.
        #[arg(long, default_value_t = 300)]
        orders: usize,
        /// Submit at most this many orders a second (default: as fast as 8 clients can).
        #[arg(long)]
        rate: Option<f64>,
        /// Fault knobs of the simulated remote service (default: transient faults, lost
        /// answers, latency, an outage from 5 s to 15 s, some payments declined).
        #[arg(long, default_value = DEMO_FAULTS)]
        faults: String,
        /// Run the supervisor's schedule this many times faster than the template's rate.
        #[arg(long, default_value_t = 60.0)]
        speed: f64,
        /// Give up on the orders this many seconds after the last one was accepted, and on
        /// submitting this many seconds after the start (default: 600, or half a second per
        /// order if that is longer).
        #[arg(long)]
        limit: Option<u64>,
        /// Show every function's logs.
        #[arg(long)]
        logs: bool,
        /// Kill a random function process with SIGKILL this often (seconds), from the start
        /// until 30 s after the last order is accepted; processes restart as Lambda would.
        #[arg(long, value_name = "SECONDS")]
        kill_every: Option<f64>,
        /// Seed of the choice of the processes killed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Measure each function's processor time, per invocation and per message, on release
    /// binaries: the reference workflow without faults, twice (batches gathered for 0 s, then
    /// for 1 s), then how long each invocation lasts on AWS by memory size.
    Durations {
        #[command(flatten)]
        stack: StackArgs,
        /// Orders of each run.
        #[arg(long, default_value_t = 300)]
        orders: usize,
        /// Orders a second.
        #[arg(long, default_value_t = 10.0)]
        rate: f64,
        /// Write what was measured to this file (`cost-model` reads `infra/durations.json`).
        #[arg(long)]
        write: Option<std::path::PathBuf>,
    },
    /// Put an event on the bus of the stack that `up` runs, as another service would: the
    /// workflows whose `starts` match it start an order each. Prints the event's id and the
    /// orders it starts.
    PutEvent {
        /// The event's source (`crm`); the stack's own, `sas.orders`, starts nothing.
        #[arg(long)]
        source: String,
        /// The event's detail-type (`TenantSignedUp`).
        #[arg(long)]
        detail_type: String,
        /// The event's detail, a JSON object.
        #[arg(long, default_value = "{}")]
        detail: String,
    },
    /// Print a token of the local JWT issuer, for a stack run with `--parameter ApiAuth=JWT`
    /// (send it as `Authorization: Bearer <token>`).
    Token {
        /// The token's issuer (`iss`): the stack's JwtIssuer to be taken.
        #[arg(long)]
        issuer: String,
        /// The token's audience (`aud`): one of the stack's JwtAudience to be taken.
        #[arg(long)]
        audience: String,
        /// Whom the token names (`sub`): the caller who owns the orders it submits.
        #[arg(long)]
        subject: String,
        /// Minutes the token stays valid.
        #[arg(long, default_value_t = 60)]
        minutes: i64,
    },
    /// Serve an OpenID Connect issuer on loopback until Ctrl-C, for a stack run with
    /// `--parameter ApiAuth=JWT --parameter JwtIssuer=<its URL>`: its sign-in page (any user,
    /// any groups, no password) is where that stack's console (`Console=true`) signs users in.
    Issuer {
        /// Port on 127.0.0.1.
        #[arg(long, default_value_t = 3001)]
        port: u16,
    },
}

#[derive(Clone, Debug, Args)]
struct StackArgs {
    /// AWS API endpoint to use instead of starting moto (LocalStack, a moto already running).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint: Option<String>,
    /// Start one moto server for every service, instead of one for DynamoDB and another for
    /// SQS and EventBridge.
    #[arg(long)]
    one_emulator: bool,
    /// Port of the HTTP API on 127.0.0.1.
    #[arg(long, default_value_t = 3000)]
    port: u16,
    /// Most processes per function.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    /// A template parameter, as NAME=VALUE (repeatable).
    #[arg(long = "parameter", value_parser = key_value)]
    parameters: Vec<(String, String)>,
    /// The managed policy of the template that a caller of the HTTP API holds, as
    /// ACCESS_KEY_ID=POLICY (repeatable; POLICY `none` grants nothing). Without it, a key that
    /// begins with `ops` holds OperatorPolicy, one that begins with `read` ReadOnlyPolicy, one
    /// that begins with `answer` AnswererPolicy, and any other ClientPolicy.
    #[arg(long = "caller", value_parser = key_value)]
    callers: Vec<(String, String)>,
    /// Use the binaries as they are instead of running `cargo build` first.
    #[arg(long)]
    no_build: bool,
    /// Lambda's account-wide quota of concurrent executions, shared by the stack's functions:
    /// an invocation beyond it is throttled, and retried as Lambda retries it (default: none).
    #[arg(long)]
    account_concurrency: Option<usize>,
    /// A fault the AWS proxy injects once the stack is up, as a JSON rule (repeatable), e.g.
    /// '{"service":"dynamodb","operation":"PutItem on StateTable","caller":"SchedulerFunction","every":2,"fault":{"kind":"throttle"}}'
    /// (more: `PUT /_proxy/faults` on the AWS endpoint).
    #[arg(long = "wire-fault", value_parser = wire_fault)]
    wire_faults: Vec<FaultRule>,
}

fn wire_fault(s: &str) -> Result<FaultRule, String> {
    serde_json::from_str(s).map_err(|e| format!("not a fault rule: {e}"))
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

/// The functions that run the engine and so read the workflow.
const ENGINE_FUNCTIONS: [&str; 4] =
    ["SubmissionFunction", "SchedulerFunction", "SupervisorFunction", "StatusFunction"];

/// The demo's settings, from its command line.
struct DemoRun {
    orders: usize,
    rate: Option<f64>,
    limit: Duration,
    logs: bool,
    chaos: Option<Chaos>,
    /// The workflows its stack runs (`WORKFLOW_JSON`): the demo's several, unless given.
    workflows: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut view_port = None;
    let (stack_args, overrides, speed, demo) = match Cli::parse().command {
        Command::Up { stack, faults, speed, view_port: port } => {
            view_port = Some(port);
            show_warnings();
            (stack, faults.map(|f| remote_faults(&f)).into_iter().collect::<Vec<_>>(), speed, None)
        }
        Command::Expand { output } => return expand(&output),
        Command::Reload { no_build } => return reload(no_build).await,
        Command::PutEvent { source, detail_type, detail } => {
            return put_event(&source, &detail_type, &detail).await;
        }
        Command::Token { issuer, audience, subject, minutes } => {
            let now = chrono::Utc::now();
            let ttl = chrono::Duration::minutes(minutes);
            println!("{}", jwt::mint(&jwt::claims(&issuer, &audience, &subject, now, ttl)));
            return ExitCode::SUCCESS;
        }
        Command::Issuer { port } => {
            let issuer = match LocalIssuer::start_on(port).await {
                Ok(issuer) => issuer,
                Err(e) => return fail(format!("the issuer's port {port}: {e}")),
            };
            println!("issuer: {} (Ctrl-C stops it)", issuer.url());
            let _ = tokio::signal::ctrl_c().await;
            return ExitCode::SUCCESS;
        }
        Command::Durations { stack, orders, rate, write } => {
            return measure_durations(stack, orders, rate, write.as_deref()).await;
        }
        Command::Demo { stack, orders, rate, faults, speed, limit, logs, kill_every, seed } => {
            let demo = match demo_run(orders, rate, limit, logs, kill_every, seed) {
                Ok(demo) => demo,
                Err(e) => return fail(e),
            };
            (stack, vec![remote_faults(&faults)], speed, Some(demo))
        }
    };
    let root = workspace_root();
    let Some(bin_dir) = bin_dir() else {
        return fail("cannot tell where this program is");
    };
    if !stack_args.no_build && !build(&root, &bin_dir) {
        return fail("building the function binaries failed");
    }
    let (options, wire_faults) =
        options(stack_args, &root, &bin_dir, overrides, speed, demo.as_ref());
    let mut stack = match LocalStack::up(&options).await {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    stack.proxy.faults.set(wire_faults);
    print_stack(&stack);
    let observer = match view_port {
        Some(port) => match watch(&stack, port).await {
            Ok((observer, url)) => {
                println!("local-stack: the run, live, at {url}");
                Some(observer)
            }
            Err(e) => return fail(e),
        },
        // The demo's report is written from its own observer, started below.
        None => None,
    };
    for f in &stack.functions {
        println!(
            "local-stack: {} runs {} ({} process(es))",
            f.spec.logical_id,
            f.spec.binary,
            f.processes.len()
        );
    }
    if let Some(demo) = demo {
        return run_demo(&stack, demo, &bin_dir).await;
    }
    print_how_to(&stack);
    write_sam_env_vars(&options, &stack, &bin_dir);
    let control = match Control::start(&bin_dir, &stack).await {
        Ok(control) => control,
        Err(e) => return fail(e),
    };
    run_until_stopped(&mut stack, control).await;
    drop(observer);
    println!("local-stack: stopping");
    print!("{}", stack.access());
    drop(stack);
    ExitCode::SUCCESS
}

/// How to run the stack as `args` say, with the demo's parameters and workflows if it is one;
/// and the wire faults to inject once it is up.
fn options(
    args: StackArgs,
    root: &std::path::Path,
    bin_dir: &std::path::Path,
    mut overrides: Vec<(String, String, String)>,
    speed: f64,
    demo: Option<&DemoRun>,
) -> (Options, Vec<FaultRule>) {
    let mut parameters: HashMap<String, String> = HashMap::new();
    if let Some(demo) = demo {
        parameters.extend(demo::demo_parameters());
        let workflows = demo.workflows.clone().unwrap_or_else(demo::demo_workflows);
        overrides.extend(
            ENGINE_FUNCTIONS.map(|f| (f.to_owned(), "WORKFLOW_JSON".to_owned(), workflows.clone())),
        );
    }
    parameters.extend(args.parameters);
    let options = Options {
        template: root.join("template.yaml"),
        endpoint: args.endpoint,
        split_emulators: !args.one_emulator,
        bin_dir: bin_dir.to_path_buf(),
        api_port: args.port,
        schedule_speed: speed,
        max_instances: args.instances.max(1),
        account_concurrency: args.account_concurrency,
        stack_name: "local".into(),
        region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        parameters,
        overrides,
        callers: args.callers,
        show_logs: demo.is_none_or(|d| d.logs),
    };
    (options, args.wire_faults)
}

/// Prints `e` as this program's error, and fails.
fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("local-stack: {e}");
    ExitCode::FAILURE
}

/// What the stack itself has to say (a request the gateway refused, and why), on stderr beside
/// the functions' logs. The demo keeps its output to its report.
fn show_warnings() {
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// `local-stack expand`: writes the template with its loops expanded to `output`.
fn expand(output: &std::path::Path) -> ExitCode {
    let expanded = sas_infra::emulation::template::Template::expanded_document(
        &workspace_root().join("template.yaml"),
    );
    let written = expanded.map_err(|e| e.to_string()).and_then(|document| {
        let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
        std::fs::write(output, text + "\n").map_err(|e| e.to_string())
    });
    match written {
        Ok(()) => {
            println!("local-stack: wrote {}", output.display());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The demo's settings from its arguments, or what is wrong with them.
fn demo_run(
    orders: usize,
    rate: Option<f64>,
    limit: Option<u64>,
    logs: bool,
    kill_every: Option<f64>,
    seed: u64,
) -> Result<DemoRun, String> {
    if rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err("--rate must be a positive number".into());
    }
    let chaos = match kill_every {
        Some(s) if s.is_finite() && s > 0.0 => {
            Some(Chaos { every: Duration::from_secs_f64(s), seed })
        }
        Some(s) => return Err(format!("--kill-every must be a positive number, not {s}")),
        None => None,
    };
    let limit = Duration::from_secs(limit.unwrap_or(600.max(orders as u64 / 2)));
    Ok(DemoRun { orders, rate, limit, logs, chaos, workflows: None })
}

/// `local-stack durations`: runs the reference workflow without faults on a stack whose
/// batching windows are 0 s, then on one whose windows are 1 s, sums what each kind of
/// function did and the processor time it took, and fits each kind's time per invocation and
/// per message (see `sas_infra::tools::durations`).
async fn measure_durations(
    args: StackArgs,
    orders: usize,
    rate: f64,
    write: Option<&std::path::Path>,
) -> ExitCode {
    use sas_infra::tools::durations::{self, Measured, Run, Sample};
    if !(rate.is_finite() && rate > 0.0) {
        return fail("--rate must be a positive number");
    }
    let root = workspace_root();
    let Some(bin_dir) = bin_dir() else {
        return fail("cannot tell where this program is");
    };
    if !bin_dir.ends_with("release") {
        return fail(
            "processor time is measured on release binaries: cargo run --release -p sas-infra --bin local-stack -- durations",
        );
    }
    if !args.no_build && !build(&root, &bin_dir) {
        return fail("building the function binaries failed");
    }
    let mut runs = Vec::new();
    for window in ["0", "1"] {
        let mut args = args.clone();
        args.no_build = true;
        args.parameters.extend(
            ["SchedulerBatchingWindowSeconds", "AgentBatchingWindowSeconds"]
                .map(|p| (p.to_owned(), window.to_owned())),
        );
        let parameters: BTreeMap<String, String> = args.parameters.iter().cloned().collect();
        let limit = Duration::from_secs(600);
        let demo = DemoRun {
            orders,
            rate: Some(rate),
            limit,
            logs: false,
            chaos: None,
            workflows: Some(demo::demo_workflow()),
        };
        let (options, _) =
            options(args, &root, &bin_dir, vec![remote_faults("{}")], 60.0, Some(&demo));
        let stack = match LocalStack::up(&options).await {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        let starts = match environment_starts(&stack, Duration::from_secs(60)).await {
            Ok(starts) => starts,
            Err(e) => return fail(e),
        };
        let started = std::time::Instant::now();
        let summary = match demo::run(&stack, orders, Some(rate), limit, None).await {
            Ok(summary) => summary,
            Err(e) => return fail(e),
        };
        let seconds = started.elapsed().as_secs_f64();
        drop(stack);
        if summary.processed != orders || !summary.passed() {
            print!("{}", summary.text);
            return fail(format!(
                "{} of the {orders} orders were processed: what was measured is not a run without faults",
                summary.processed
            ));
        }
        let mut by_kind: BTreeMap<String, Sample> = BTreeMap::new();
        for u in &summary.uses {
            let Some(kind) = durations::kind_of(&u.binary) else { continue };
            let s = by_kind.entry(kind.to_owned()).or_default();
            s.invocations += u.invocations;
            s.records += u.records;
            s.cpu_seconds += u.cpu_seconds;
        }
        for (kind, (environments, seconds)) in starts {
            let s = by_kind.entry(kind).or_default();
            s.environments += environments;
            s.init_cpu_seconds += seconds;
        }
        if by_kind.values().all(|s| s.cpu_seconds == 0.0) {
            return fail("this machine does not say what processor time its processes take");
        }
        println!(
            "durations: windows of {window} s, {orders} orders at {rate} a second, {seconds:.0} s:"
        );
        for (kind, s) in &by_kind {
            println!(
                "  {kind}: {} invocations, {:.2} messages each, {:.2} ms of processor time each; {} environments, {:.1} ms each to start",
                s.invocations,
                s.records as f64 / (s.invocations.max(1)) as f64,
                1000.0 * s.cpu_seconds / (s.invocations.max(1)) as f64,
                s.environments,
                1000.0 * s.init_cpu_seconds / (s.environments.max(1)) as f64
            );
        }
        runs.push(Run { parameters, orders, rate, seconds, by_kind });
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let command = format!(
        "cargo run --release -p sas-infra --bin local-stack -- durations --orders {orders} --rate {rate}"
    );
    let machine = format!("{cores} cores, {}", std::env::consts::ARCH);
    let measured = Measured::from_runs(&command, &machine, runs);
    print!("{}", durations::render(&measured));
    if let Some(path) = write {
        let text = serde_json::to_string_pretty(&measured).unwrap_or_default() + "\n";
        if let Err(e) = std::fs::write(path, text) {
            return fail(format!("{}: {e}", path.display()));
        }
        println!("durations: written to {}", path.display());
    }
    ExitCode::SUCCESS
}

/// What was not created, and where the stack's AWS API and HTTP API are.
fn print_stack(stack: &LocalStack) {
    // One line per reason: the API alone is a dozen resources.
    let mut skipped: BTreeMap<(bool, &str), Vec<&str>> = BTreeMap::new();
    for (id, kind, why) in &stack.stack.skipped {
        if !kind.starts_with("AWS::Serverless::") {
            // `<resource>.<property>`: a resource created, one of its properties not as on AWS.
            let property = id.contains('.');
            skipped.entry((property, why.as_str())).or_default().push(id.as_str());
        }
    }
    for ((property, why), ids) in skipped {
        let what = if property { "not as on AWS" } else { "not created locally" };
        println!("local-stack: {what} ({why}): {}", ids.join(", "));
    }
    println!("local-stack: AWS API at {} (a proxy in front of moto)", stack.endpoint);
    println!(
        "local-stack: each function signs with its logical id as access key id, and the proxy checks its calls against its policy in the template (what it found: curl {}{})",
        stack.endpoint,
        sas_infra::emulation::proxy::ACCESS_PATH
    );
    println!("local-stack: HTTP API at {}", stack.api_url);
}

/// Runs the demo on `stack`, writes its report next to the binaries in `bin_dir`, and prints
/// its summary; succeeds only if the demo passed.
async fn run_demo(stack: &LocalStack, demo: DemoRun, bin_dir: &std::path::Path) -> ExitCode {
    let observer = match Observer::start(stack).await {
        Ok(o) => o,
        Err(e) => return fail(e),
    };
    let DemoRun { orders, rate, limit, chaos, .. } = demo;
    let outcome = demo::run(stack, orders, rate, limit, chaos).await;
    // Next to the binaries: `target/demo-report.html` for a debug build.
    let report = bin_dir.parent().unwrap_or(bin_dir).join("demo-report.html");
    let written = std::fs::write(&report, observer.report().await);
    match outcome {
        Ok(summary) => {
            print!("{}", summary.text);
            match written {
                Ok(()) => println!("report: {}\n", report.display()),
                Err(e) => println!("report: not written to {}: {e}\n", report.display()),
            }
            if summary.passed() {
                println!("demo: passed");
                ExitCode::SUCCESS
            } else {
                println!("demo: FAILED");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// How to look into the running stack and use it: commands to copy.
fn print_how_to(stack: &LocalStack) {
    let endpoint = &stack.endpoint;
    for (what, command) in [
        (
            "scan the state table",
            format!(
                "aws --endpoint-url {endpoint} dynamodb scan --table-name {}",
                stack.stack.reference("StateTable").unwrap_or_default()
            ),
        ),
        (
            "peek the scheduler queue",
            format!(
                "aws --endpoint-url {endpoint} sqs receive-message --visibility-timeout 0 --queue-url {}",
                stack.stack.reference("SchedulerQueue").unwrap_or_default()
            ),
        ),
        (
            "read the alerts",
            format!(
                "aws --endpoint-url {endpoint} sqs receive-message --max-number-of-messages 10 --queue-url {}",
                stack.stack.reference("AlertsQueue").unwrap_or_default()
            ),
        ),
        (
            "read the steps waiting for an answer from outside, with their tokens",
            format!(
                "aws --endpoint-url {endpoint} sqs receive-message --max-number-of-messages 10 --queue-url {}",
                stack.stack.reference("CallbacksQueue").unwrap_or_default()
            ),
        ),
    ] {
        println!("local-stack: {what}: {command}");
    }
    let api = &stack.api_url;
    let secret = sas_infra::access::sigv4::LOCAL_SECRET_KEY;
    let region = &stack.stack.context.region;
    println!(
        "local-stack: submit an order (signed as the client `me`, which holds ClientPolicy): curl --aws-sigv4 'aws:amz:{region}:execute-api' --user 'me:{secret}' -X POST {api}/orders -H 'content-type: application/json' -H 'Idempotency-Key: my-first-order' -d '<order JSON, see the README>'"
    );
    println!(
        "local-stack: answer a step that waits for the outside world (signed as `answerer`, which holds AnswererPolicy): curl --aws-sigv4 'aws:amz:{region}:execute-api' --user 'answerer:{secret}' -X POST {api}/orders/<order id>/steps/<step>/complete -H 'content-type: application/json' -d '{{\"token\": \"<its token>\"}}'"
    );
    println!(
        "local-stack: operate it (an access key id names the caller, and one that begins with `ops` holds OperatorPolicy; the secret key is always `{secret}`): SAS_API_URL={api} AWS_ACCESS_KEY_ID=ops AWS_SECRET_ACCESS_KEY={secret} cargo run -q -p sas-cli -- list"
    );
    if let Some(url) = stack
        .stack
        .context
        .attributes
        .get(&("RemoteSimFunctionUrl".to_owned(), "FunctionUrl".to_owned()))
        .and_then(|v| v.as_str())
    {
        println!(
            "local-stack: read what the simulated service did (each effect with its key and the second it took effect), and its calls by outcome: curl --aws-sigv4 'aws:amz:{region}:lambda' --user 'ops:{secret}' {url}ledger (or {url}stats)"
        );
        println!(
            "local-stack: change the simulated service's faults: curl --aws-sigv4 'aws:amz:{region}:lambda' --user 'ops:{secret}' -X PUT {url}faults -H 'content-type: application/json' -d '{{}}'"
        );
    }
}

/// Writes the `--env-vars` file that points `sam local` at `stack`, next to the binaries in
/// `bin_dir`, and says how to use it.
fn write_sam_env_vars(options: &Options, stack: &LocalStack, bin_dir: &std::path::Path) {
    // For those with Docker: the functions under `sam local`, against this stack.
    let env_vars = bin_dir.parent().unwrap_or(bin_dir).join("sam-env-vars.json");
    match sas_infra::emulation::sam_local::write_env_vars(&options.template, stack, &env_vars) {
        Ok(()) => println!(
            "local-stack: sam local against this stack (after `sam build`; on Linux, where the container must share the host's loopback): sam local invoke SchedulerFunction -e functions/scheduler/events/start.json --env-vars {} --docker-network host (or `sam local start-api --env-vars {} --docker-network host --port 3001`)",
            env_vars.display(),
            env_vars.display()
        ),
        Err(e) => eprintln!("local-stack: {e}"),
    }
}

/// Starts observing `stack` and serves its page on `port`; returns the page's URL.
async fn watch(stack: &LocalStack, port: u16) -> Result<(Observer, String), String> {
    let mut observer = Observer::start(stack).await.map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("the view's port {port}: {e}"))?;
    let url = listener
        .local_addr()
        .map(|a| format!("http://{a}/"))
        .map_err(|e| format!("the view's port: {e}"))?;
    observer.serve(listener);
    Ok((observer, url))
}

fn remote_faults(faults: &str) -> (String, String, String) {
    ("RemoteSimFunction".to_owned(), "FAULTS".to_owned(), faults.to_owned())
}

/// Where the function binaries are: beside this one, in the same target directory (whatever
/// CARGO_TARGET_DIR or cargo's configuration says) and profile.
fn bin_dir() -> Option<std::path::PathBuf> {
    std::env::current_exe().ok().and_then(|p| p.parent().map(std::path::Path::to_path_buf))
}

/// Builds every binary of the workspace into `bin_dir` (a profile folder of a target directory).
fn build(root: &std::path::Path, bin_dir: &std::path::Path) -> bool {
    let mut cargo =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    // The whole workspace, so features resolve as they do for `cargo test --workspace` and
    // the binaries are not rebuilt between the two.
    cargo.current_dir(root).args(["build", "--workspace", "--bins"]);
    if let Some(target) = bin_dir.parent() {
        cargo.arg("--target-dir").arg(target);
    }
    if bin_dir.ends_with("release") {
        cargo.arg("--release");
    }
    cargo.status().is_ok_and(|s| s.success())
}

/// Where `up` says how to reach it, next to the binaries in `bin_dir`: `target/local-stack.json`
/// for a debug build.
fn control_file(bin_dir: &std::path::Path) -> std::path::PathBuf {
    bin_dir.parent().unwrap_or(bin_dir).join("local-stack.json")
}

/// The running stack's control: `POST /reload` on loopback, its address in the control file
/// for as long as the stack runs.
struct Control {
    file: std::path::PathBuf,
    requests: tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<Result<String, String>>>,
}

impl Control {
    async fn start(bin_dir: &std::path::Path, stack: &LocalStack) -> Result<Control, String> {
        use axum::routing::post;
        let (sender, requests) = tokio::sync::mpsc::channel(1);
        let app = axum::Router::new().route(
            "/reload",
            post(move || {
                let sender = sender.clone();
                async move {
                    let (reply, replied) = tokio::sync::oneshot::channel();
                    let outcome = match sender.send(reply).await {
                        Ok(()) => replied.await.unwrap_or_else(|_| Err("the stack stopped".into())),
                        Err(_) => Err("the stack is stopping".into()),
                    };
                    match outcome {
                        Ok(text) => (axum::http::StatusCode::OK, text),
                        Err(e) => (axum::http::StatusCode::CONFLICT, e),
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the control port: {e}"))?;
        let address = listener.local_addr().map_err(|e| format!("the control port: {e}"))?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let file = control_file(bin_dir);
        let about = serde_json::json!({
            "pid": std::process::id(),
            "control": format!("http://{address}"),
            // What `put-event` needs: where EventBridge answers, and the stack's bus.
            "endpoint": stack.endpoint,
            "region": stack.stack.context.region,
            "bus": stack.stack.reference("EventBus"),
            "api": stack.api_url,
        });
        std::fs::write(&file, about.to_string())
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        println!(
            "local-stack: after changing a workflow or an agent, `cargo run -p sas-infra --bin local-stack -- reload` rebuilds and starts again what changed; the orders in flight go on"
        );
        Ok(Control { file, requests })
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Serves reloads of `stack` until Ctrl-C or SIGTERM.
async fn run_until_stopped(stack: &mut LocalStack, mut control: Control) {
    let stop = stopped();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
            Some(reply) = control.requests.recv() => {
                println!("local-stack: reloading");
                let outcome = stack.reload(stack.options().clone()).await;
                let outcome = outcome.map(|r| r.to_string()).map_err(|e| e.to_string());
                match &outcome {
                    Ok(text) => print!("{}", text.lines().map(|l| format!("local-stack: {l}\n")).collect::<String>()),
                    Err(e) => println!("local-stack: reload failed: {e}"),
                }
                let _ = reply.send(outcome);
            }
        }
    }
}

/// The folder of this program's binaries, and what the control file of the stack `up` runs
/// there says, or why there is none.
fn running_stack() -> Result<(std::path::PathBuf, serde_json::Value), String> {
    let bin_dir = bin_dir().ok_or("cannot tell where this program is")?;
    let file = control_file(&bin_dir);
    let about = std::fs::read_to_string(&file)
        .ok()
        .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
        .ok_or_else(|| format!(
            "no local stack is running here ({} is missing): start one with `cargo run -p sas-infra --bin local-stack -- up`",
            file.display()
        ))?;
    Ok((bin_dir, about))
}

async fn put_event(source: &str, detail_type: &str, detail: &str) -> ExitCode {
    let about = match running_stack() {
        Ok((_, about)) => about,
        Err(e) => return fail(e),
    };
    let detail: serde_json::Value = match serde_json::from_str(detail) {
        Ok(value @ serde_json::Value::Object(_)) => value,
        _ => return fail("--detail must be a JSON object"),
    };
    let (Some(endpoint), Some(region), Some(bus)) =
        (about["endpoint"].as_str(), about["region"].as_str(), about["bus"].as_str())
    else {
        return fail("the running stack does not say where its bus is: start it again with `up`");
    };
    let clients = Clients::new(&Endpoints::single(endpoint), region).await;
    let entry = aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
        .event_bus_name(bus)
        .source(source)
        .detail_type(detail_type)
        .detail(detail.to_string())
        .build();
    let put = match clients.events.put_events().entries(entry).send().await {
        Ok(put) => put,
        Err(e) => return fail(aws_sdk_eventbridge::error::DisplayErrorContext(e).to_string()),
    };
    let Some(id) = put.entries().first().and_then(|e| e.event_id()) else {
        return fail(format!("the bus took no event: {put:?}"));
    };
    println!("local-stack: event {id} put on {bus}");
    // Which orders it starts, as the scheduler will tell.
    let event = serde_json::json!({"id": id, "source": source, "detail-type": detail_type,
                                   "detail": detail});
    let catalogue = match sas_aws::settings::built_in_catalogue() {
        Ok(catalogue) => catalogue,
        Err(e) => return fail(e.to_string()),
    };
    let api = about["api"].as_str().unwrap_or("http://127.0.0.1:3000");
    let secret = sas_infra::access::sigv4::LOCAL_SECRET_KEY;
    let started = sas_infra::tools::workflows::started_by(&catalogue, &event);
    for (workflow, outcome) in &started {
        match outcome {
            Ok(order) => println!(
                "local-stack: it starts order {order} of {workflow}; see it with: SAS_API_URL={api} AWS_ACCESS_KEY_ID=ops AWS_SECRET_ACCESS_KEY={secret} cargo run -q -p sas-cli -- show {order}"
            ),
            // The scheduler refuses it the same way, and the event ends in its dead-letter
            // queue.
            Err(why) => println!(
                "local-stack: it starts no order of {workflow}: {why}; the event will end in the scheduler's dead-letter queue (`sas dlq peek scheduler`)"
            ),
        }
    }
    let none = started.is_empty();
    if none {
        println!("local-stack: no workflow's starts match it: it starts nothing");
    }
    ExitCode::SUCCESS
}

/// `local-stack reload`: builds, then asks the stack that `up` runs to reload.
async fn reload(no_build: bool) -> ExitCode {
    let root = workspace_root();
    let (bin_dir, about) = match running_stack() {
        Ok(running) => running,
        Err(e) => return fail(e),
    };
    let Some(control) = about["control"].as_str() else {
        return fail("the running stack's control file names no control address");
    };
    if !no_build && !build(&root, &bin_dir) {
        return fail("building the function binaries failed; the stack runs as it was");
    }
    let answer = reqwest::Client::new().post(format!("{control}/reload")).send().await;
    match answer {
        Ok(answer) => {
            let ok = answer.status().is_success();
            let text = answer.text().await.unwrap_or_default();
            if ok {
                print!(
                    "{}",
                    text.lines().map(|l| format!("local-stack: {l}\n")).collect::<String>()
                );
                ExitCode::SUCCESS
            } else {
                fail(format!("reload failed: {text}"))
            }
        }
        Err(e) => fail(format!(
            "the stack at {control} does not answer ({e}); if it stopped, start it again with `cargo run -p sas-infra --bin local-stack -- up`"
        )),
    }
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Waits, at most `limit`, until every process of `stack`'s functions has started (made its
/// first call for an invocation, none having been made yet); then, by kind of function, its
/// processes and the processor time they took to start.
async fn environment_starts(
    stack: &LocalStack,
    limit: Duration,
) -> Result<BTreeMap<String, (u64, f64)>, String> {
    use sas_infra::observe::cpu;
    use sas_infra::tools::durations;
    let deadline = std::time::Instant::now() + limit;
    while stack.functions.iter().any(|f| f.api.polls() < f.processes.len() as u64) {
        if std::time::Instant::now() > deadline {
            return Err(format!("the functions' processes did not all start within {limit:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut starts: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for f in &stack.functions {
        let Some(kind) = durations::kind_of(&f.spec.binary) else { continue };
        for process in &f.processes {
            let taken = process
                .pid()
                .and_then(cpu::run_time)
                .ok_or("this machine does not say what processor time its processes take")?;
            let s = starts.entry(kind.to_owned()).or_default();
            s.0 += 1;
            s.1 += taken.as_secs_f64();
        }
    }
    Ok(starts)
}
