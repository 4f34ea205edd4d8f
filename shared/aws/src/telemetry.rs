//! Logging: structured JSON lines (what CloudWatch Logs Insights queries), or plain text with
//! `LOG_FORMAT=text` for a terminal. The level comes from `RUST_LOG` (default `info`).
//!
//! Metrics: the engine's (see `sas_engine::metrics`) printed in CloudWatch's embedded metric
//! format, which CloudWatch turns into metrics as it ingests the logs: no API call, no extra
//! permission. Each function's metrics carry its role as the `Function` dimension.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Call once, first thing in `main`.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    if std::env::var("LOG_FORMAT").is_ok_and(|f| f == "text") {
        use std::io::IsTerminal;
        builder.without_time().with_ansi(std::io::stdout().is_terminal()).init();
    } else {
        // Lambda stamps every line itself; a second timestamp is noise.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .without_time()
            .init();
    }
}

/// Installs the recorder that prints metrics in the embedded metric format under `namespace`,
/// with `function` as a dimension of every metric. `None` if a recorder is already installed.
pub fn metrics(
    namespace: &str,
    function: &str,
) -> Option<&'static metrics_cloudwatch_embedded::Collector> {
    let collector = metrics_cloudwatch_embedded::Builder::new()
        .cloudwatch_namespace(namespace.to_owned())
        .with_dimension("Function", function.to_owned())
        .init()
        .ok()?;
    sas_engine::metrics::describe();
    Some(collector)
}
