//! `remote-sim`: runs the simulated remote service. Inside Lambda (when
//! `AWS_LAMBDA_RUNTIME_API` is set) it answers a function URL; elsewhere it listens on
//! `--listen` and prints one line, `listening on http://ADDR`, to stdout once bound, so a
//! harness can start it on port 0 and read the port. Logs go to stderr.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use sas_remote_sim::{App, ArrivedAt, FaultConfig, router};
use tracing_subscriber::EnvFilter;

/// A simulated remote business service with an effect ledger and fault knobs.
#[derive(Debug, Parser)]
#[command(name = "remote-sim", version, after_long_help = HELP)]
struct Args {
    /// Address to listen on when not in Lambda; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Fault configuration (JSON: {"default": {...}, "actions": {"charge-payment": {...}}}).
    #[arg(long, env = "FAULTS")]
    faults: Option<String>,
}

/// What `--help` tells after the options: the service's answers, endpoints and knobs.
const HELP: &str = "\
What it answers:
  POST /actions/{action}, with an Idempotency-Key header and a JSON body
  {\"order_id\", \"direction\": \"do\"|\"undo\", \"outputs\"}: any action is accepted.
    200 {\"ref\": \"<action>-<n>\"}  applied (n numbers the service's effects, from 1); an
                                 undo of nothing applied adds \"noop\": true
    200 + x-replayed: true     the same key again: the first answer, applied once
    422 {\"error\", \"permanent\": true}  refused for good (permanent_rate), nothing applied
    409 {\"error\", \"permanent\": true}  a do after its undo: cancelled
    429 + Retry-After: 1       throttled (throttle_rate, max_per_second), nothing applied
    503                        transient fault, outage, or an answer lost after applying
    400                        no Idempotency-Key, or a body that is not the above

Other endpoints:
  GET /faults, PUT /faults     the fault configuration (PUT replaces it; 400 if invalid)
  GET /ledger                  every effect applied, by key, with its applications
  GET /ledger/{key}            one effect (404 if none)
  GET /stats                   calls by outcome, and the most in one second (busiest_second),
                               over all actions and for each; the ledger's size; the most
                               applications of a key
  GET /stats/keys              the same, for every key that met a fault
  POST /reset                  empties the ledger and the statistics
  GET /health                  200

Fault knobs (--faults or FAULTS, or PUT /faults), as
  {\"default\": {...}, \"actions\": {\"<action>\": {...}}}; an action names only what differs:
  latency_ms, latency_jitter_ms      added to every call (at most 15 minutes together)
  transient_rate, throttle_rate      chance of a 503 or a 429, nothing applied
  max_per_second                     calls of the action taken in one second; the others
                                     get 429, nothing applied (a partner's rate limit)
  permanent_rate, permanent_undo     chance a new key is refused for good (and its undos too)
  denied                             every new key gets 403, undos too (a grant or credentials
                                     refused: the service answers, it is not down)
  lost_answer_rate                   chance a call applies, then answers 503
  outages: [{\"start_s\", \"end_s\"}]    windows, in seconds since start, of 503 to every call
  seed                               seed of every random decision (the same calls, the
                                     same faults)
  output_bytes                       bytes of a document each new effect answers beside
                                     its reference (at most 1 MiB)
  forget_keys                        a repeated key applies again (to show a check failing)
  hold_while: \"<file>\"               while the file exists, the action's calls wait before
                                     answering, their effect applied and their key written
                                     to <file>.held; other calls are served meanwhile

Inside Lambda (AWS_LAMBDA_RUNTIME_API set) it answers its function URL instead of --listen.";

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let in_lambda = std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let config = match args.faults.as_deref().map(FaultConfig::from_json).transpose() {
        Ok(config) => config.unwrap_or_default(),
        Err(e) => {
            eprintln!("remote-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if in_lambda {
        // One execution environment keeps the one ledger. On AWS it serves one invocation at
        // a time, as its reserved concurrency of one does. Where it may poll for several at
        // once (AWS_LAMBDA_MAX_CONCURRENCY, set by the local stack), it answers that many
        // calls side by side, as a real service would, each with its own latency: the ledger
        // is updated under a lock, released before the latency is waited out.
        let at_once = std::env::var("AWS_LAMBDA_MAX_CONCURRENCY")
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1);
        let app = router(App::new(config).serving_at_once(at_once));
        lambda_http::run_concurrent(lambda_http::service_fn(move |request| {
            invoke(app.clone(), request)
        }))
        .await
    } else {
        serve(&args.listen, router(App::new(config))).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remote-sim: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One invocation of the function URL, answered by the router with its body in full (the
/// runtime sends answers across its polling tasks, so they must be shareable).
async fn invoke(
    app: axum::Router,
    request: lambda_http::Request,
) -> Result<lambda_http::Response<lambda_http::Body>, lambda_http::Error> {
    use lambda_http::RequestExt;
    use lambda_http::request::RequestContext;
    use tower::ServiceExt;
    let arrived = match request.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(context)) if context.time_epoch > 0 => {
            let ms = u64::try_from(context.time_epoch).unwrap_or(0);
            Some(ArrivedAt(std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)))
        }
        _ => None,
    };
    let (mut parts, body) = request.into_parts();
    if let Some(arrived) = arrived {
        parts.extensions.insert(arrived);
    }
    let request = axum::http::Request::from_parts(parts, axum::body::Body::from(body.to_vec()));
    let (parts, body) = app.oneshot(request).await?.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX).await?.to_vec();
    let body = match String::from_utf8(bytes) {
        Ok(text) => lambda_http::Body::Text(text),
        Err(e) => lambda_http::Body::Binary(e.into_bytes()),
    };
    Ok(lambda_http::Response::from_parts(parts, body))
}

async fn serve(listen: &str, app: axum::Router) -> Result<(), lambda_http::Error> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    // The one line on stdout; flushed at once because a harness is waiting for it.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on http://{addr}")?;
    stdout.flush()?;
    axum::serve(listener, app).await?;
    Ok(())
}
