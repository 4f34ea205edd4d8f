//! `remote-sim`: runs the simulated remote service. Inside Lambda (when
//! `AWS_LAMBDA_RUNTIME_API` is set) it answers a function URL; elsewhere it listens on
//! `--listen` and prints one line, `listening on http://ADDR`, to stdout once bound, so a
//! harness can start it on port 0 and read the port. Logs go to stderr.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use sas_remote_sim::{App, FaultConfig, router};
use tracing_subscriber::EnvFilter;

/// A simulated remote business service with an effect ledger and fault knobs.
#[derive(Debug, Parser)]
#[command(name = "remote-sim", version)]
struct Args {
    /// Address to listen on when not in Lambda; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Fault configuration (JSON: {"default": {...}, "actions": {"charge-payment": {...}}}).
    #[arg(long, env = "FAULTS")]
    faults: Option<String>,
}

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
    let app = router(App::new(config));

    let result =
        if in_lambda { lambda_http::run(app).await } else { serve(&args.listen, app).await };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remote-sim: {e}");
            ExitCode::FAILURE
        }
    }
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
