//! `sas`: the operators' command line. It finds the orders that need attention, shows one with
//! its timeline, cancels, pauses, resumes or redrives orders one by one or by filter, and
//! lists, peeks at and moves back dead letters, all through the stack's admin API; and it
//! measures a stack by offering it orders through its order routes (`sas load`).
//!
//! Exit status: 0 when everything asked for was done (or had been done before), 1 when an
//! order refused a command or a call failed, 2 for a usage error.

mod client;
mod console;
mod load;
mod render;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use client::{Api, CliError};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Value, json};

/// Orders on one page of the admin API's listing, the most it gives.
const PAGE: usize = 100;

#[derive(Debug, Parser)]
#[command(
    name = "sas",
    version,
    about = "Operate the order system: find orders that need attention, read their timeline, cancel, pause, resume or redrive them, and move dead letters back.",
    after_help = "Credentials come from the standard AWS chain (AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, roles); the caller needs the stack's OperatorPolicy."
)]
struct Cli {
    /// Base URL of the stack's HTTP API: its `ApiUrl` output, or the local stack's URL.
    #[arg(long, env = "SAS_API_URL", global = true)]
    api: Option<String>,
    /// Region to sign for (default: the AWS chain's, else the one in the API URL).
    #[arg(long, global = true)]
    region: Option<String>,
    /// Readable tables, or the API's JSON for scripts.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    output: Format,
    #[command(subcommand)]
    command: Verb,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
enum Verb {
    /// Serve the console, every verb of `sas` in a web page, on 127.0.0.1; its calls are signed
    /// here with your credentials, which the page never sees.
    Console {
        /// The port to listen on (0: any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// List orders that need attention, newest first.
    List {
        #[command(flatten)]
        filter: Filter,
        /// Most orders to list.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Show one order: its state, cause, steps, what is left to undo, and its timeline.
    Show {
        order_id: String,
        /// Read its stored input and outputs back whole, rather than show their references.
        #[arg(long)]
        whole: bool,
    },
    /// Find orders by a value of their input, as their workflow's `search_key` reads it (a
    /// customer id, say), ended ones included, newest first.
    Find {
        value: String,
        /// Only orders of this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// Most orders to list.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Stop orders: what they did is undone in reverse order; they end Cancelled.
    Cancel(Act),
    /// Hold orders after the step in flight, until resumed.
    Pause(Act),
    /// Let paused orders go on from where they stopped.
    Resume(Act),
    /// Take note of processed orders whose step's failure was only reported: they leave the
    /// `reported` list (recorded with who you are and why).
    Acknowledge(Act),
    /// Undo processed orders: each step done is undone by its compensation, last first; they
    /// end Cancelled, or in Error with what has no undo left to you.
    Undo(Act),
    /// Run failed orders again from the step that failed (or, with --compensation, retry
    /// their failed undos).
    Redrive {
        #[command(flatten)]
        act: Act,
        /// Retry the undos that failed instead of going forward.
        #[arg(long)]
        compensation: bool,
    },
    /// Ask the stack to give one command to every order a listing holds, as counted now: the
    /// supervisor gives it a minute's worth at a time, at the pace held orders resume, and
    /// reports what each order made of it. Without --yes, only counts them.
    Bulk {
        #[command(subcommand)]
        action: BulkAction,
    },
    /// Complete a step that waits for an answer from outside, on behalf of the party that
    /// did not answer (recorded with who you are and why).
    Complete {
        order_id: String,
        step: String,
        /// Why; kept on the order's timeline with who answered.
        #[arg(long)]
        reason: String,
        /// The step's output, as JSON (default `{}`).
        #[arg(long)]
        output_json: Option<String>,
    },
    /// Refuse a step that waits for an answer from outside, on behalf of that party: the step
    /// fails as its workflow says (the order is undone, or the failure reported).
    Refuse {
        order_id: String,
        step: String,
        /// Why; kept on the step and the order's timeline with who refused.
        #[arg(long)]
        reason: String,
    },
    /// Each service: open, or held as a whole or one action at a time (since when, why, by
    /// whom; probed, if its agent held it, and what the probes last met), and how many orders
    /// wait for each hold.
    Services,
    /// The concurrency keys with orders running: how many run and wait, since when; with a
    /// key, its running orders and its line, first to start first.
    Keys {
        /// One key (`<group>/<value>`, as `sas keys` lists them).
        key: Option<String>,
        /// Most keys, or most orders of the line, to show.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Hold a service by hand (a maintenance window), or one of its actions: its agent calls
    /// it no more and its orders wait, without failing, until it is released (recorded with
    /// who you are and why).
    Hold {
        /// The agent of the service.
        agent: String,
        /// Hold only this action of the service (a step's name, or an undo's action).
        #[arg(long)]
        action: Option<String>,
        #[arg(long)]
        reason: String,
    },
    /// Release a held service, whoever held it, with every action held (or only `--action`):
    /// the orders that waited go on, at the stack's pace.
    Release {
        /// The agent of the service.
        agent: String,
        /// Release only this action's hold.
        #[arg(long)]
        action: Option<String>,
        #[arg(long)]
        reason: String,
    },
    /// Dead-letter queues: messages no handler could process.
    Dlq {
        #[command(subcommand)]
        command: Dlq,
    },
    /// Offer the stack orders at a rate (or a ramp), each arriving on time however the stack
    /// answers, follow them to their end, and report throughput, latency percentiles, the
    /// door's refusals and the API requests an order took. Exits 1 if an order was not
    /// accepted, did not end, or ended other than Processed.
    Load(LoadArgs),
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Orders a second (at the start, with --ramp-to).
    #[arg(long)]
    rate: f64,
    /// Orders a second at the end: the rate changes evenly from --rate to this.
    #[arg(long)]
    ramp_to: Option<f64>,
    /// How long orders arrive: 30s, 5m.
    #[arg(long, value_parser = parse_age, default_value = "30s")]
    duration: u64,
    /// How long after the last arrival orders are followed to their end.
    #[arg(long, value_parser = parse_age, default_value = "2m")]
    drain: u64,
    /// The workflow (the stack's default if not given).
    #[arg(long)]
    workflow: Option<String>,
    /// Each order's JSON body; `{{i}}` becomes the order's number, `{{run}}` the run's id.
    #[arg(long, conflicts_with = "input_file")]
    input: Option<String>,
    /// The same, read from a file.
    #[arg(long)]
    input_file: Option<std::path::PathBuf>,
    /// A bearer token for a stack whose API takes JWTs (ApiAuth JWT); without it, requests are
    /// signed with AWS credentials.
    #[arg(long, env = "SAS_JWT", hide_env_values = true)]
    jwt: Option<String>,
    /// The run's id, which names its idempotency keys (default: a new one): the same id sent
    /// again offers the same orders, which the stack does not take twice.
    #[arg(long)]
    run_id: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Dlq {
    /// Each dead-letter queue with the messages it holds.
    List,
    /// Show up to 10 messages of a queue and what each was for (they stay where they are).
    Peek {
        /// scheduler, replies, or an agent's name (`sas dlq list` names them all).
        queue: String,
        #[arg(long, default_value_t = 10)]
        limit: usize,
    },
    /// Move a queue's messages back to the queue they came from.
    Redrive {
        queue: String,
        /// Why; logged by the stack with who moved them.
        #[arg(long)]
        reason: String,
    },
}

/// Which orders a listing or a bulk command selects.
#[derive(Clone, Debug, Args)]
struct Filter {
    /// failed (in Error), paused, in-flight (Pending or Processing), reported (Processed with
    /// a step's failure only reported, until acknowledged), or awaiting-answer (in flight, a
    /// step waiting for an answer from outside).
    #[arg(value_enum, default_value = "failed")]
    list: Listing,
    /// In flight for at least this long (for in-flight): 90s, 15m, 2h, 3d.
    #[arg(long, value_parser = parse_age)]
    older_than: Option<u64>,
    /// Only orders that failed (or are paused) at this step.
    #[arg(long)]
    step: Option<String>,
    /// Only orders whose failure is of this kind: step_rejected, step_timed_out, ...
    #[arg(long)]
    cause: Option<String>,
    /// Only orders of this workflow (any version).
    #[arg(long)]
    workflow: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Listing {
    Failed,
    Paused,
    InFlight,
    Reported,
    AwaitingAnswer,
}

/// What `sas bulk` does.
#[derive(Debug, Subcommand)]
enum BulkAction {
    /// Cancel every order the listing holds.
    Cancel(BulkAsk),
    /// Pause every order the listing holds.
    Pause(BulkAsk),
    /// Resume every order the listing holds.
    Resume(BulkAsk),
    /// Acknowledge every order the listing holds.
    Acknowledge(BulkAsk),
    /// Undo every order the listing holds.
    Undo(BulkAsk),
    /// Redrive every order the listing holds (--compensation: retry their failed undos).
    Redrive {
        #[command(flatten)]
        ask: BulkAsk,
        #[arg(long)]
        compensation: bool,
    },
    /// The latest bulk commands, newest first.
    Jobs,
    /// One bulk command and what each order made of it so far.
    Show { id: String },
}

/// A bulk command as asked for.
#[derive(Debug, Args)]
struct BulkAsk {
    #[command(flatten)]
    filter: Filter,
    /// Why; kept in each order's timeline with who gave the command.
    #[arg(long)]
    reason: String,
    /// Ask for it (without it, the orders are only counted).
    #[arg(long)]
    yes: bool,
    /// The bulk command's id: asked again with the same id and filter, it is the same command
    /// (default: a new one, printed).
    #[arg(long)]
    command_id: Option<String>,
    /// How long to follow its report, in seconds, before leaving it to go on (`sas bulk show
    /// <id>` follows it then); 0 returns once it is asked for.
    #[arg(long, default_value_t = 600)]
    wait: u64,
}

/// A command for some orders: named by id, or selected by a filter.
#[derive(Debug, Args)]
struct Act {
    /// The orders, by id. Without ids, --select chooses them.
    order_ids: Vec<String>,
    /// Why; kept in each order's timeline with who gave the command.
    #[arg(long)]
    reason: String,
    /// Select the orders by filter instead of by id: failed, paused, in-flight, reported or
    /// awaiting-answer.
    #[arg(long, value_enum, conflicts_with = "order_ids")]
    select: Option<Listing>,
    /// Select the orders waiting in this concurrency key's line, first in line first.
    #[arg(long, conflicts_with_all = ["order_ids", "select"])]
    key: Option<String>,
    /// With --select in-flight: only orders in flight for at least this long (90s, 15m, 2h, 3d).
    #[arg(long, value_parser = parse_age, requires = "select")]
    older_than: Option<u64>,
    /// With --select: only orders that failed (or are paused) at this step.
    #[arg(long, requires = "select")]
    step: Option<String>,
    /// With --select: only orders whose failure is of this kind.
    #[arg(long, requires = "select")]
    cause: Option<String>,
    /// With --select: only orders of this workflow (any version).
    #[arg(long, requires = "select")]
    workflow: Option<String>,
    /// Act on the orders a filter selects (without it, they are only listed).
    #[arg(long)]
    yes: bool,
    /// Most orders a filter may select.
    #[arg(long, default_value_t = 1000)]
    max: usize,
    /// Commands per second, at most.
    #[arg(long, default_value_t = 5.0)]
    rate: f64,
    /// The command's id: the same id sent again is applied once per order (default: a new one
    /// per run; pass the printed one to repeat a run safely).
    #[arg(long)]
    command_id: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sas: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    let base = cli.api.clone().ok_or_else(|| {
        CliError::Usage(
            "the API URL is needed: --api URL or SAS_API_URL (the stack's ApiUrl output)".into(),
        )
    })?;
    let json_out = cli.output == Format::Json;
    if let Verb::Load(args) = cli.command {
        let token = args.jwt.clone();
        let api = Api::connect_as(&base, cli.region.clone(), token).await?;
        return offer(api, args, json_out).await;
    }
    let api = Api::connect(&base, cli.region.clone()).await?;
    if let Verb::Console { port } = cli.command {
        let console = console::Console::bind(api, port).await?;
        println!("sas console: {} (open it in a browser; Ctrl-C stops it)", console.url());
        console.serve().await?;
        return Ok(ExitCode::SUCCESS);
    }
    match cli.command {
        Verb::List { filter, limit } => {
            let orders = select(&api, &filter, limit).await?;
            if json_out {
                print_json(&json!({ "orders": orders }));
            } else if orders.is_empty() {
                println!("no orders");
            } else {
                print!("{}", order_table(&orders));
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Show { order_id, whole } => {
            let values = if whole { "whole" } else { "references" };
            let view = api.get(&format!("/admin/orders/{order_id}?values={values}")).await?;
            if json_out {
                print_json(&view);
            } else {
                print!("{}", render::order(&view));
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Find { value, workflow, limit } => {
            let (orders, keys) = find(&api, &value, workflow.as_deref(), limit).await?;
            if json_out {
                print_json(&json!({ "orders": orders, "search_keys": keys }));
            } else if orders.is_empty() {
                println!("no orders found by {value:?} ({})", render::search_keys(&keys));
            } else {
                print!("{}", render::found(&orders));
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Bulk { action } => bulk(&api, action, json_out).await,
        Verb::Cancel(act) => command(&api, "cancel", false, act, json_out).await,
        Verb::Pause(act) => command(&api, "pause", false, act, json_out).await,
        Verb::Resume(act) => command(&api, "resume", false, act, json_out).await,
        Verb::Acknowledge(act) => command(&api, "acknowledge", false, act, json_out).await,
        Verb::Undo(act) => command(&api, "undo", false, act, json_out).await,
        Verb::Redrive { act, compensation } => {
            command(&api, "redrive", compensation, act, json_out).await
        }
        Verb::Complete { order_id, step, reason, output_json } => {
            let output = match output_json.as_deref().map(serde_json::from_str::<Value>) {
                None => json!({}),
                Some(Ok(output)) => output,
                Some(Err(e)) => {
                    return Err(CliError::Usage(format!("--output-json is not JSON: {e}")));
                }
            };
            let body = json!({ "reason": reason, "output": output });
            answer(&api, &order_id, &step, "complete", &body, json_out).await
        }
        Verb::Refuse { order_id, step, reason } => {
            let body = json!({ "reason": reason });
            answer(&api, &order_id, &step, "refuse", &body, json_out).await
        }
        Verb::Keys { key, limit } => {
            let path = match &key {
                Some(key) => format!("/admin/keys?key={}&limit={limit}", encode(key)),
                None => format!("/admin/keys?limit={limit}"),
            };
            let answer = api.get(&path).await?;
            if json_out {
                print_json(&answer);
            } else if key.is_some() {
                print!("{}", render::key(&answer));
            } else {
                print!("{}", render::keys(&answer));
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Services => {
            let answer = api.get("/admin/services").await?;
            if json_out {
                print_json(&answer);
            } else {
                print!("{}", render::services(&answer));
            }
            Ok(ExitCode::SUCCESS)
        }
        Verb::Hold { agent, action, reason } => {
            service_command(&api, &agent, action.as_deref(), "hold", &reason, json_out).await
        }
        Verb::Release { agent, action, reason } => {
            service_command(&api, &agent, action.as_deref(), "release", &reason, json_out).await
        }
        Verb::Dlq { command } => dead_letters(&api, command, json_out).await,
        Verb::Load(_) | Verb::Console { .. } => unreachable!("handled above"),
    }
}

/// `sas load`: runs the plan `args` describe and prints its report.
async fn offer(api: Api, args: LoadArgs, json_out: bool) -> Result<ExitCode, CliError> {
    let input = match (args.input, args.input_file) {
        (Some(text), _) => text,
        (None, Some(path)) => std::fs::read_to_string(&path)
            .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?,
        (None, None) => {
            return Err(CliError::Usage("an order body is needed: --input or --input-file".into()));
        }
    };
    let probe = input.replace("{{i}}", "0").replace("{{run}}", "run");
    if let Err(e) = serde_json::from_str::<Value>(&probe) {
        return Err(CliError::Usage(format!("the order body is not JSON: {e}")));
    }
    let positive = |r: f64| r.is_finite() && r >= 0.0;
    if !positive(args.rate) || !args.ramp_to.is_none_or(positive) || args.duration == 0 {
        return Err(CliError::Usage(
            "--rate and --ramp-to are orders a second, 0 or more, and --duration at least 1s"
                .into(),
        ));
    }
    let plan = load::Plan {
        workflow: args.workflow,
        input,
        rate: args.rate,
        ramp_to: args.ramp_to,
        duration: Duration::from_secs(args.duration),
        drain: Duration::from_secs(args.drain),
        run: args.run_id.unwrap_or_else(|| format!("load-{}", uuid::Uuid::new_v4().simple())),
    };
    let report = load::run(std::sync::Arc::new(api), plan).await?;
    if json_out {
        print_json(&report);
    } else {
        print!("{}", load::render(&report));
    }
    let processed = report.pointer("/ended/Processed").and_then(Value::as_u64).unwrap_or(0);
    let all = report["offered"].as_u64().unwrap_or(0);
    Ok(if processed == all { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Holds or releases (`verb`) the service of `agent`, or only its `action`.
async fn service_command(
    api: &Api,
    agent: &str,
    action: Option<&str>,
    verb: &str,
    reason: &str,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    let path = format!("/admin/services/{}/{verb}", encode(agent));
    let mut body = json!({ "reason": reason });
    if let Some(action) = action {
        body["action"] = json!(action);
    }
    let answer = api.post(&path, &body).await?;
    if json_out {
        print_json(&answer);
    } else {
        print!("{}", render::service_change(&answer["service"], action, verb));
    }
    Ok(ExitCode::SUCCESS)
}

/// Answers step `step` of order `id` (`verb`: complete or refuse) for the party outside.
async fn answer(
    api: &Api,
    id: &str,
    step: &str,
    verb: &str,
    body: &Value,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    let path = format!("/admin/orders/{}/steps/{}/{verb}", encode(id), encode(step));
    let (result, code) = match api.post(&path, body).await {
        Ok(done) => (done, ExitCode::SUCCESS),
        Err(CliError::Api { status, message, body, .. }) => {
            let error = body.get("error").cloned().unwrap_or_else(|| json!({ "message": message }));
            (json!({ "order_id": id, "status": status, "error": error }), ExitCode::FAILURE)
        }
        Err(e) => return Err(e),
    };
    if json_out {
        print_json(&result);
    } else {
        println!("{}", describe_result(id, &result));
    }
    Ok(code)
}

/// A listing's query string: its name and filters.
fn filter_query(filter: &Filter) -> String {
    let mut query = format!("list={}", listing_name(filter.list));
    if let Some(age) = filter.older_than {
        query.push_str(&format!("&older_than={age}"));
    }
    for (name, value) in
        [("step", &filter.step), ("cause", &filter.cause), ("workflow", &filter.workflow)]
    {
        if let Some(v) = value {
            query.push_str(&format!("&{name}={}", encode(v)));
        }
    }
    query
}

/// `sas bulk`: counts a listing, asks the stack for a bulk command on what it holds, and
/// follows its report; or shows the bulk commands.
async fn bulk(api: &Api, action: BulkAction, json_out: bool) -> Result<ExitCode, CliError> {
    let (verb, compensation, ask) = match action {
        BulkAction::Jobs => {
            let jobs = api.get("/admin/bulk").await?;
            if json_out {
                print_json(&jobs);
            } else {
                for job in jobs["jobs"].as_array().into_iter().flatten() {
                    println!("{}", render::bulk_job(job));
                }
            }
            return Ok(ExitCode::SUCCESS);
        }
        BulkAction::Show { id } => {
            let job = api.get(&format!("/admin/bulk/{}", encode(&id))).await?;
            return Ok(report(&job["job"], json_out));
        }
        BulkAction::Cancel(ask) => ("cancel", false, ask),
        BulkAction::Pause(ask) => ("pause", false, ask),
        BulkAction::Resume(ask) => ("resume", false, ask),
        BulkAction::Acknowledge(ask) => ("acknowledge", false, ask),
        BulkAction::Undo(ask) => ("undo", false, ask),
        BulkAction::Redrive { ask, compensation } => ("redrive", compensation, ask),
    };
    let filter = &ask.filter;
    let counts = api.get(&format!("/admin/counts?{}", filter_query(filter))).await?;
    let counted = &counts[listing_name(filter.list).replace('-', "_")];
    let orders = counted["orders"].as_u64().unwrap_or(0);
    let at_most = if counted["exact"] == json!(false) { "at most " } else { "" };
    if counted["capped"] == json!(true) {
        return Err(CliError::Usage(format!(
            "more than {orders} orders match: narrow the filter (one bulk command takes {orders})"
        )));
    }
    if !ask.yes {
        if json_out {
            print_json(&json!({ "count": counted, "asked": false }));
        } else {
            println!(
                "{at_most}{orders} orders match; nothing was changed. Add --yes to ask the stack to {verb} them."
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut wanted = json!({ "list": listing_name(filter.list) });
    for (name, value) in
        [("step", &filter.step), ("cause", &filter.cause), ("workflow", &filter.workflow)]
    {
        if let Some(v) = value {
            wanted[name] = json!(v);
        }
    }
    if let Some(age) = filter.older_than {
        wanted["older_than_s"] = json!(age);
    }
    let id = ask.command_id.clone().unwrap_or_else(|| {
        format!("bulk-{verb}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
    });
    let body = json!({
        "command": verb, "compensation": compensation, "filter": wanted,
        "reason": ask.reason, "command_id": id, "expect": orders,
    });
    let job = match api.post("/admin/bulk", &body).await {
        Ok(answer) => answer["job"].clone(),
        // The listing changed since it was counted: nothing was asked for.
        Err(CliError::Api { status: 409, message, .. }) => {
            return Err(CliError::Usage(format!("{message}; nothing was asked for")));
        }
        Err(e) => return Err(e),
    };
    if !json_out {
        println!("bulk command {id}: {verb} {at_most}{orders} orders, asked for");
    }
    let mut job = job;
    let deadline = std::time::Instant::now() + Duration::from_secs(ask.wait);
    while job["finished"] != json!(true) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(2)).await;
        job = api.get(&format!("/admin/bulk/{}", encode(&id))).await?["job"].clone();
    }
    if job["finished"] != json!(true) && !json_out {
        println!("it goes on in the stack: sas bulk show {id}");
    }
    Ok(report(&job, json_out))
}

/// Prints a bulk command's report; fails if any order refused it.
fn report(job: &Value, json_out: bool) -> ExitCode {
    if json_out {
        print_json(job);
    } else {
        print!("{}", render::bulk_report(job));
    }
    if job["tally"]["refused"].as_u64().unwrap_or(0) > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The orders a filter selects, page after page, up to `max`.
async fn select(api: &Api, filter: &Filter, max: usize) -> Result<Vec<Value>, CliError> {
    let query = filter_query(filter);
    Ok(paged(api, &format!("/admin/orders?{query}"), max).await?.0)
}

/// The orders found by `value` (of `workflow` alone, if given), page after page, up to `max`,
/// and the search key each workflow declares.
async fn find(
    api: &Api,
    value: &str,
    workflow: Option<&str>,
    max: usize,
) -> Result<(Vec<Value>, Value), CliError> {
    let mut route = format!("/admin/search?key={}", encode(value));
    if let Some(workflow) = workflow {
        route.push_str(&format!("&workflow={}", encode(workflow)));
    }
    let (orders, last) = paged(api, &route, max).await?;
    Ok((orders, last["search_keys"].clone()))
}

/// The orders `route` (a path and its query) lists, page after page, up to `max`, and the
/// last page read.
async fn paged(api: &Api, route: &str, max: usize) -> Result<(Vec<Value>, Value), CliError> {
    let (mut orders, mut page) = (Vec::new(), Value::Null);
    let mut after: Option<String> = None;
    while orders.len() < max {
        let limit = (max - orders.len()).min(PAGE);
        let mut path = format!("{route}&limit={limit}");
        if let Some(cursor) = &after {
            path.push_str(&format!("&after={}", encode(cursor)));
        }
        page = api.get(&path).await?;
        orders.extend(page["orders"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    orders.truncate(max);
    Ok((orders, page))
}

async fn command(
    api: &Api,
    verb: &str,
    compensation: bool,
    act: Act,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    if !(act.rate > 0.0 && act.rate <= 50.0) {
        return Err(CliError::Usage("--rate must be above 0 and at most 50 per second".into()));
    }
    let Some(ids) = orders_to_act_on(api, verb, &act, json_out).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let command_id = act
        .command_id
        .clone()
        .unwrap_or_else(|| format!("{verb}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]));
    let mut body = json!({ "command_id": command_id, "reason": act.reason });
    if compensation {
        body["compensation"] = Value::Bool(true);
    }
    let interval = Duration::from_secs_f64(1.0 / act.rate);
    let mut results = Vec::new();
    let mut failed = 0;
    for (n, id) in ids.iter().enumerate() {
        if n > 0 {
            tokio::time::sleep(interval).await;
        }
        let outcome = api.post(&format!("/admin/orders/{}/{verb}", encode(id)), &body).await;
        let result = match outcome {
            Ok(done) => done,
            Err(CliError::Api { status, message, body, .. }) => {
                failed += 1;
                json!({ "order_id": id, "status": status, "error": body.get("error").cloned()
                        .unwrap_or_else(|| json!({ "message": message })) })
            }
            Err(e) => {
                failed += 1;
                json!({ "order_id": id, "error": { "message": e.to_string() } })
            }
        };
        if !json_out {
            println!("{}", describe_result(id, &result));
        }
        results.push(result);
    }
    if json_out {
        print_json(&json!({ "command_id": command_id, "results": results }));
    } else {
        println!(
            "{verb}: {} of {} orders done (command id {command_id}).",
            ids.len() - failed,
            ids.len()
        );
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// The orders `act` names, or those it selects; `None` when a selection was only listed
/// (without `--yes`), and so nothing is to be done.
async fn orders_to_act_on(
    api: &Api,
    verb: &str,
    act: &Act,
    json_out: bool,
) -> Result<Option<Vec<String>>, CliError> {
    if let Some(key) = &act.key {
        return waiting_for(api, verb, key, act, json_out).await;
    }
    let Some(list) = act.select else {
        if act.order_ids.is_empty() {
            return Err(CliError::Usage(format!(
                "name the orders to {verb}, or select them with --select or --key"
            )));
        }
        return Ok(Some(act.order_ids.clone()));
    };
    let filter = Filter {
        list,
        older_than: act.older_than,
        step: act.step.clone(),
        cause: act.cause.clone(),
        workflow: act.workflow.clone(),
    };
    let orders = select(api, &filter, act.max).await?;
    if !act.yes {
        if json_out {
            print_json(&json!({ "orders": orders, "acted": false }));
        } else {
            print!("{}", order_table(&orders));
            println!(
                "{} orders selected; nothing was changed. Add --yes to {verb} them.",
                orders.len()
            );
        }
        return Ok(None);
    }
    Ok(Some(orders.iter().filter_map(|o| o["order_id"].as_str().map(str::to_owned)).collect()))
}

/// The orders waiting in `key`'s line, first in line first; listed only, without --yes.
async fn waiting_for(
    api: &Api,
    verb: &str,
    key: &str,
    act: &Act,
    json_out: bool,
) -> Result<Option<Vec<String>>, CliError> {
    let limit = act.max.clamp(1, 1000);
    let view = api.get(&format!("/admin/keys?key={}&limit={limit}", encode(key))).await?;
    let waiting = view["waiting"].as_array().cloned().unwrap_or_default();
    if !act.yes {
        if json_out {
            print_json(&json!({ "orders": waiting, "acted": false }));
        } else {
            print!("{}", render::key(&view));
            println!(
                "{} orders wait for {key}; nothing was changed. Add --yes to {verb} them.",
                waiting.len()
            );
        }
        return Ok(None);
    }
    Ok(Some(waiting.iter().filter_map(|o| o["order_id"].as_str().map(str::to_owned)).collect()))
}

fn describe_result(id: &str, result: &Value) -> String {
    if let Some(error) = result.get("error") {
        let state = error.get("state").and_then(Value::as_str);
        let code = error.get("code").and_then(Value::as_str).unwrap_or("error");
        let message = error.get("message").and_then(Value::as_str).unwrap_or_default();
        return match state {
            Some(state) => format!("{id}  refused ({code}, {state}): {message}"),
            None => format!("{id}  failed ({code}): {message}"),
        };
    }
    let applied = match result["applied"].as_str() {
        Some("before") => "already applied",
        _ => "applied",
    };
    let state = result["process_state"].as_str().unwrap_or("-");
    match result["waiting"].as_str() {
        Some(waiting) => {
            format!("{id}  {applied}: {state}, {waiting} waits for the step in flight")
        }
        None => format!("{id}  {applied}: now {state}"),
    }
}

async fn dead_letters(api: &Api, command: Dlq, json_out: bool) -> Result<ExitCode, CliError> {
    match command {
        Dlq::List => dlq_list(api, json_out).await,
        Dlq::Peek { queue, limit } => dlq_peek(api, &queue, limit, json_out).await,
        Dlq::Redrive { queue, reason } => dlq_redrive(api, &queue, &reason, json_out).await,
    }
}

/// `sas dlq list`: each dead-letter queue's depth and its latest move back.
async fn dlq_list(api: &Api, json_out: bool) -> Result<ExitCode, CliError> {
    let answer = api.get("/admin/dead-letters").await?;
    if json_out {
        print_json(&answer);
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = answer["queues"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|q| {
            let task = q.get("move_task").map_or_else(
                || "-".to_owned(),
                |t| format!("{} ({} moved)", render::cell(t, "status"), t["moved"]),
            );
            vec![
                render::cell(q, "queue"),
                q["messages"].to_string(),
                q["in_flight"].to_string(),
                task,
            ]
        })
        .collect();
    print!("{}", render::table(&["queue", "messages", "in flight", "last move"], &rows));
    Ok(ExitCode::SUCCESS)
}

/// `sas dlq peek`: what each message of `queue` was for, without taking it.
async fn dlq_peek(
    api: &Api,
    queue: &str,
    limit: usize,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    let answer = api.get(&format!("/admin/dead-letters/{}?limit={limit}", encode(queue))).await?;
    if json_out {
        print_json(&answer);
        return Ok(ExitCode::SUCCESS);
    }
    let messages = answer["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    if messages.is_empty() {
        println!("no messages in {queue}");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<Vec<String>> = messages
        .iter()
        .map(|m| {
            let what = match m.get("undecodable").and_then(Value::as_str) {
                Some(why) => format!("unreadable: {why}"),
                None => {
                    [render::cell(m, "kind"), render::cell(m, "step"), render::cell(m, "direction")]
                        .into_iter()
                        .filter(|s| s != "-")
                        .collect::<Vec<_>>()
                        .join(" ")
                }
            };
            vec![
                render::cell(m, "order_id"),
                what,
                m["attempt"].as_u64().map_or("-".into(), |a| a.to_string()),
                m["receive_count"].to_string(),
                render::cell(m, "sent_at"),
            ]
        })
        .collect();
    print!("{}", render::table(&["order", "message", "attempt", "receives", "sent"], &rows));
    Ok(ExitCode::SUCCESS)
}

/// `sas dlq redrive`: moves `queue`'s messages back, by SQS's move task where it has one.
async fn dlq_redrive(
    api: &Api,
    queue: &str,
    reason: &str,
    json_out: bool,
) -> Result<ExitCode, CliError> {
    let path = format!("/admin/dead-letters/{}/redrive", encode(queue));
    let mut moved = 0;
    loop {
        let answer = api.post(&path, &json!({ "reason": reason })).await?;
        if answer["method"] == "move_task" {
            if json_out {
                print_json(&answer);
            } else {
                println!(
                    "{queue}: SQS is moving the messages back (task {}); `sas dlq list` shows its progress.",
                    render::cell(&answer, "task_handle")
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        moved += answer["moved"].as_u64().unwrap_or(0);
        if answer["more"] != Value::Bool(true) {
            break;
        }
    }
    if json_out {
        print_json(&json!({ "queue": queue, "method": "copy", "moved": moved }));
    } else {
        println!("{queue}: {moved} messages moved back to their queue.");
    }
    Ok(ExitCode::SUCCESS)
}

fn order_table(orders: &[Value]) -> String {
    let rows: Vec<Vec<String>> = orders
        .iter()
        .map(|o| {
            vec![
                render::cell(o, "order_id"),
                render::workflow(o),
                render::cell(o, "since"),
                render::cell(o, "step"),
                render::cell(o, "cause"),
            ]
        })
        .collect();
    render::table(&["order", "workflow", "since", "step", "cause"], &rows)
}

fn listing_name(list: Listing) -> &'static str {
    match list {
        Listing::Failed => "failed",
        Listing::Paused => "paused",
        Listing::InFlight => "in-flight",
        Listing::Reported => "reported",
        Listing::AwaitingAnswer => "awaiting-answer",
    }
}

fn print_json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

/// What stays as it is in a URL component: the unreserved characters of RFC 3986.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

pub(crate) fn encode(s: &str) -> String {
    utf8_percent_encode(s, UNRESERVED).to_string()
}

/// An age: whole seconds, or a number with s, m, h or d.
fn parse_age(s: &str) -> Result<u64, String> {
    let (number, unit) = match s.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((i, _)) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 =
        number.parse().map_err(|_| format!("{s:?} is not an age such as 90s, 15m, 2h or 3d"))?;
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{s:?}: the unit must be s, m, h or d")),
    };
    Ok(n * scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_read_with_their_unit() {
        assert_eq!(parse_age("90"), Ok(90));
        assert_eq!(parse_age("15m"), Ok(900));
        assert_eq!(parse_age("2h"), Ok(7200));
        assert_eq!(parse_age("3d"), Ok(259_200));
        assert!(parse_age("2w").is_err() && parse_age("h").is_err());
    }

    #[test]
    fn url_components_are_encoded() {
        assert_eq!(encode("1700000000000.ab-c"), "1700000000000.ab-c");
        assert_eq!(encode("a b/c"), "a%20b%2Fc");
    }

    #[test]
    fn the_command_line_parses() {
        let cli = Cli::try_parse_from([
            "sas",
            "--api",
            "http://x",
            "redrive",
            "--select",
            "failed",
            "--step",
            "ship",
            "--reason",
            "carrier back",
            "--yes",
            "--compensation",
        ])
        .unwrap();
        let Verb::Redrive { act, compensation } = cli.command else { panic!() };
        assert!(compensation && act.yes && act.order_ids.is_empty());
        assert!(Cli::try_parse_from(["sas", "cancel", "o-1"]).is_err(), "a reason is required");
        assert!(
            Cli::try_parse_from(["sas", "cancel", "o-1", "--reason", "x", "--select", "failed"])
                .is_err(),
            "ids or a filter, not both"
        );
        let cli = Cli::try_parse_from([
            "sas",
            "-o",
            "json",
            "complete",
            "o-1",
            "review",
            "--reason",
            "checked",
            "--output-json",
            "{}",
        ])
        .unwrap();
        let Verb::Complete { step, output_json, .. } = cli.command else { panic!() };
        assert_eq!((step.as_str(), output_json.as_deref()), ("review", Some("{}")));
        // Every argument of every verb is well formed (clap checks this only when asked).
        <Cli as clap::CommandFactory>::command().debug_assert();
    }
}
