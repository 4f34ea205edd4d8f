//! `local-stack`: runs the whole system on this machine, with no AWS account and no Docker.
//!
//! `local-stack up` creates every table, queue, bus and rule of `template.yaml` on an AWS API
//! emulator (moto, installed into `.venv` and started on a free port, or any endpoint given
//! with `--endpoint` or `AWS_ENDPOINT_URL`), runs each function as its real binary, and
//! emulates its event sources: SQS mappings, the supervisor's schedule, the HTTP API on
//! 127.0.0.1:3000 and the simulated remote service's function URL.

use std::collections::HashMap;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use sas_infra::emulator::workspace_root;
use sas_infra::local::{LocalStack, Options};

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
    /// Create the resources, start every function and event source, and run until Ctrl-C.
    Up(Up),
}

#[derive(Debug, clap::Args)]
struct Up {
    /// AWS API endpoint to use instead of starting moto (LocalStack, a moto already running).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    endpoint: Option<String>,
    /// Port of the HTTP API on 127.0.0.1.
    #[arg(long, default_value_t = 3000)]
    port: u16,
    /// Run schedules this many times faster than the template's rate (the supervisor's sweep).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// Most processes per function.
    #[arg(long, default_value_t = 2)]
    instances: usize,
    /// Fault knobs of the simulated remote service (JSON; see `remote-sim --help`).
    #[arg(long)]
    faults: Option<String>,
    /// A template parameter, as NAME=VALUE (repeatable).
    #[arg(long = "parameter", value_parser = key_value)]
    parameters: Vec<(String, String)>,
    /// Use the binaries as they are instead of running `cargo build` first.
    #[arg(long)]
    no_build: bool,
    /// The cargo profile to build and run.
    #[arg(long, default_value = "debug")]
    profile: String,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

/// The function binaries the template names.
const BINARIES: [&str; 6] = [
    "sas-submission",
    "sas-status",
    "sas-scheduler",
    "sas-agent",
    "sas-supervisor",
    "sas-remote-sim",
];

#[tokio::main]
async fn main() -> ExitCode {
    let Cli { command: Command::Up(up) } = Cli::parse();
    let root = workspace_root();
    if !up.no_build {
        let mut cargo =
            std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cargo.current_dir(&root).args(["build", "--bins"]);
        if up.profile != "debug" {
            cargo.args(["--profile", &up.profile]);
        }
        for b in BINARIES {
            cargo.args(["-p", b]);
        }
        match cargo.status() {
            Ok(s) if s.success() => {}
            _ => {
                eprintln!("local-stack: building the function binaries failed");
                return ExitCode::FAILURE;
            }
        }
    }
    let profile_dir = if up.profile == "dev" { "debug".to_owned() } else { up.profile.clone() };
    let options = Options {
        template: root.join("template.yaml"),
        endpoint: up.endpoint,
        bin_dir: root.join("target").join(profile_dir),
        api_port: up.port,
        schedule_speed: up.speed,
        max_instances: up.instances.max(1),
        stack_name: "local".into(),
        region: std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into()),
        parameters: up.parameters.into_iter().collect::<HashMap<_, _>>(),
        overrides: up
            .faults
            .map(|f| ("RemoteSimFunction".to_owned(), "FAULTS".to_owned(), f))
            .into_iter()
            .collect(),
        show_logs: true,
    };
    let stack = match LocalStack::up(&options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("local-stack: {e}");
            return ExitCode::FAILURE;
        }
    };
    for (id, kind, why) in &stack.stack.skipped {
        if !kind.starts_with("AWS::Serverless::") {
            println!("local-stack: not created locally: {id} ({kind}): {why}");
        }
    }
    println!("local-stack: AWS API emulator at {}", stack.endpoint);
    println!("local-stack: HTTP API at {}", stack.api_url);
    for f in &stack.functions {
        println!(
            "local-stack: {} running as {} ({} process(es))",
            f.spec.logical_id,
            f.spec.binary,
            f.processes.len()
        );
    }
    if let Some(table) = stack.stack.reference("StateTable") {
        println!(
            "local-stack: try  aws --endpoint-url {} dynamodb scan --table-name {table}",
            stack.endpoint
        );
    }
    stopped().await;
    println!("local-stack: stopping");
    drop(stack);
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM.
async fn stopped() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
