//! Logging: structured JSON lines (what CloudWatch Logs Insights queries), or plain text with
//! `LOG_FORMAT=text` for a terminal. The level comes from `RUST_LOG` (default `info`).
//!
//! Metrics: the engine's (see `sas_engine::metrics`) printed in CloudWatch's embedded metric
//! format, which CloudWatch turns into metrics as it ingests the logs: no API call, no extra
//! permission. Each function's metrics carry its role as the `Function` dimension.

use std::io::Write;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if std::env::var("LOG_FORMAT").is_ok_and(|f| f == "text") {
        use std::io::IsTerminal;
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_target(false)
            .without_time()
            .with_ansi(std::io::stdout().is_terminal())
            .init();
    } else {
        init_json(filter, std::io::stdout);
    }
}

/// Installs the subscriber that prints what a deployed function prints, JSON lines, to
/// `writer`: the cost model counts their bytes with the same format.
pub fn init_json<W>(filter: EnvFilter, writer: W)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_writer(writer)
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        // Lambda stamps every line itself; a second timestamp is noise.
        .without_time()
        .init();
}

/// The recorder's collector, once installed.
static COLLECTOR: OnceLock<&'static metrics_cloudwatch_embedded::Collector> = OnceLock::new();

/// Installs the recorder that prints metrics in the embedded metric format under `namespace`,
/// with `function` as a dimension of every metric. `None` if a recorder is already installed.
///
/// Metrics are printed when each invocation ends ([`print_metrics`]), and at once after a write
/// that ended an order, so that the count of ended orders is lost only if the process dies in
/// the instant between the write and the print (see `sas_engine::metrics::print_ends_at_once`).
pub fn metrics(
    namespace: &str,
    function: &str,
) -> Option<&'static metrics_cloudwatch_embedded::Collector> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .with_dimension("Function", function.to_owned())
        .init()
        .ok()?;
    let _ = COLLECTOR.set(collector);
    sas_engine::metrics::describe();
    sas_engine::metrics::print_ends_at_once(print_metrics);
    Some(collector)
}

/// Prints the metrics recorded since the last print as one block of embedded-metric lines,
/// written at once so that no log line lands in the middle of one.
pub fn print_metrics() {
    let Some(collector) = COLLECTOR.get() else { return };
    let mut lines = Vec::new();
    if collector.flush(&mut lines).is_ok() && !lines.is_empty() {
        let _ = std::io::stdout().lock().write_all(&lines);
    }
}
