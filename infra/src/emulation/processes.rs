//! Running a function's real binary as local processes: the environment Lambda would give it
//! (the template's variables, plus the Runtime API address and the standard `AWS_LAMBDA_*`
//! variables), its output prefixed with its name, and a restart whenever it exits, as Lambda
//! replaces a crashed execution environment. Lines in the embedded metric format go to the
//! stack's [`Metrics`] instead, as CloudWatch takes them out of a function's logs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tracing::warn;

use crate::observe::dead_letters::DeadLetters;
use crate::observe::metrics::Metrics;

/// Pause before restarting a process that exited, so a binary that cannot start does not spin.
const RESTART_DELAY: Duration = Duration::from_millis(500);

/// How to start one process.
#[derive(Clone, Debug)]
pub struct ProcessSpec {
    /// Shown in front of every line it prints (`[SchedulerFunction#1]`).
    pub label: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub environment: BTreeMap<String, String>,
    /// Whether its output is copied to ours (prefixed), or dropped.
    pub echo: bool,
    /// Where its metric lines go, if anywhere.
    pub metrics: Option<Metrics>,
    /// What its log lines tell about messages that failed, if anyone listens.
    pub dead_letters: Option<DeadLetters>,
    /// Where a panic it prints is kept, if anyone listens.
    pub panics: Option<Panics>,
    /// Where its latest lines are kept, if anyone reads them.
    pub logs: Option<Logs>,
}

/// Lines kept of each function's output: enough to read what it said about the latest
/// orders, bounded however long the stack runs.
const KEPT_LINES: usize = 2_000;

/// The latest lines each function printed, as text, by function (every process of it
/// together): what its log in CloudWatch would say.
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<std::collections::HashMap<String, std::collections::VecDeque<String>>>>);

impl Logs {
    /// The lines `function` printed, oldest first (at most the latest few thousand).
    pub fn of(&self, function: &str) -> Vec<String> {
        let logs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        logs.get(function).map(|lines| lines.iter().cloned().collect()).unwrap_or_default()
    }

    fn note(&self, label: &str, line: &str) {
        // A process's label is its function's logical id and its number: `F#2`.
        let function = label.split_once('#').map_or(label, |(f, _)| f);
        let mut logs = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let lines = logs.entry(function.to_owned()).or_default();
        if lines.len() == KEPT_LINES {
            lines.pop_front();
        }
        lines.push_back(as_text(line));
    }
}

/// The panics the processes printed (Rust's `thread '...' panicked at ...` line), each behind
/// its process's label: a function must never panic, however it is stopped.
#[derive(Clone, Debug, Default)]
pub struct Panics(Arc<Mutex<Vec<String>>>);

impl Panics {
    pub fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn note(&self, label: &str, line: &str) {
        if line.contains("panicked at") {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(format!("[{label}] {line}"));
        }
    }
}

/// A process kept running until the handle is dropped.
#[derive(Debug)]
pub struct Managed {
    pid: Arc<Mutex<Option<u32>>>,
    restarts: Arc<AtomicU32>,
    /// The environment each (re)start gets; a change takes effect at the next start.
    environment: Arc<Mutex<BTreeMap<String, String>>>,
    /// Set while the process is ended to be replaced: it starts again at once, quietly.
    replacing: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Managed {
    /// Starts `spec` and restarts it whenever it exits.
    pub fn start(spec: ProcessSpec) -> Managed {
        let pid = Arc::new(Mutex::new(None));
        let restarts = Arc::new(AtomicU32::new(0));
        let environment = Arc::new(Mutex::new(spec.environment.clone()));
        let replacing = Arc::new(AtomicBool::new(false));
        let (pid_slot, counter, env) = (pid.clone(), restarts.clone(), environment.clone());
        let replaced = replacing.clone();
        let task = tokio::spawn(async move {
            let mut spec = spec;
            loop {
                spec.environment = env.lock().unwrap_or_else(|e| e.into_inner()).clone();
                match spawn(&spec) {
                    Ok(mut child) => {
                        *pid_slot.lock().unwrap_or_else(|e| e.into_inner()) = child.id();
                        let status = child.wait().await;
                        *pid_slot.lock().unwrap_or_else(|e| e.into_inner()) = None;
                        if replaced.swap(false, Ordering::Relaxed) {
                            counter.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        println!("[{}] exited ({}); restarting", spec.label, describe(status));
                    }
                    Err(e) => warn!(label = %spec.label, error = %e, "cannot start"),
                }
                counter.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(RESTART_DELAY).await;
            }
        });
        Managed { pid, restarts, environment, replacing, task }
    }

    /// Ends the process and starts it again at once with `environment` (and the program's
    /// file as it is now): for a process that holds no invocation, so that nothing is lost.
    pub fn replace(&self, environment: BTreeMap<String, String>) {
        *self.environment.lock().unwrap_or_else(|e| e.into_inner()) = environment;
        if let Some(pid) = self.pid() {
            self.replacing.store(true, Ordering::Relaxed);
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }

    /// The current process id, if it is running.
    pub fn pid(&self) -> Option<u32> {
        *self.pid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many times it was (re)started after the first start.
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        // Aborting the task drops the child, which `kill_on_drop` ends.
        self.task.abort();
    }
}

fn describe(status: std::io::Result<std::process::ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    }
}

fn spawn(spec: &ProcessSpec) -> std::io::Result<Child> {
    let read = spec.echo
        || spec.metrics.is_some()
        || spec.dead_letters.is_some()
        || spec.panics.is_some()
        || spec.logs.is_some();
    let output = || if read { Stdio::piped() } else { Stdio::null() };
    let mut child = Command::new(&spec.program)
        .args(&spec.args)
        .envs(&spec.environment)
        .stdin(Stdio::null())
        .stdout(output())
        .stderr(output())
        .kill_on_drop(true)
        .spawn()?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(read_lines(out, spec.clone()));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(read_lines(err, spec.clone()));
    }
    Ok(child)
}

/// Reads a process's output a line at a time: metric lines to the metrics, the others to the
/// dead-letter reasons and to our output behind its label (if it is echoed), a JSON log line
/// shown as text.
async fn read_lines(stream: impl AsyncRead + Unpin, spec: ProcessSpec) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if spec.metrics.as_ref().is_some_and(|m| m.ingest(&line)) {
            continue;
        }
        if let Some(d) = &spec.dead_letters {
            d.note_log(&line);
        }
        if let Some(p) = &spec.panics {
            p.note(&spec.label, &line);
        }
        if let Some(logs) = &spec.logs {
            logs.note(&spec.label, &line);
        }
        if spec.echo {
            println!("[{}] {}", spec.label, as_text(&line));
        }
    }
}

/// A JSON log line as a line of text: level, message, then its fields and its span's;
/// anything else as it is.
fn as_text(line: &str) -> String {
    use serde_json::Value;
    let Some(Value::Object(map)) =
        line.starts_with('{').then(|| serde_json::from_str(line).ok()).flatten()
    else {
        return line.to_owned();
    };
    let show = |v: &Value| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out = format!(
        "{:>5} {}",
        map.get("level").map(show).unwrap_or_default(),
        map.get("message").map(show).unwrap_or_default()
    );
    for (k, v) in &map {
        if !matches!(k.as_str(), "level" | "message" | "span" | "spans" | "target") {
            out.push_str(&format!(" {k}={}", show(v)));
        }
    }
    if let Some(Value::Object(span)) = map.get("span") {
        for (k, v) in span {
            if k != "name" {
                out.push_str(&format!(" {k}={}", show(v)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_log_line_is_shown_as_text() {
        let line = r#"{"level":"WARN","error":"boom","message":"will be retried","span":{"message_id":"m","name":"message"}}"#;
        assert_eq!(as_text(line), " WARN will be retried error=boom message_id=m");
        assert_eq!(as_text("plain"), "plain");
    }

    #[tokio::test]
    async fn a_process_that_exits_is_started_again() {
        let spec = ProcessSpec {
            label: "blip".into(),
            program: "sh".into(),
            args: vec!["-c".into(), "echo \"hello $GREETING\"; sleep 0.1".into()],
            environment: BTreeMap::from([("GREETING".into(), "world".into())]),
            echo: true,
            metrics: None,
            dead_letters: None,
            panics: None,
            logs: None,
        };
        let managed = Managed::start(spec);
        tokio::time::sleep(Duration::from_millis(1_800)).await;
        assert!(managed.restarts() >= 2, "restarted {} times", managed.restarts());
    }

    #[tokio::test]
    async fn a_panic_printed_by_a_process_is_kept_with_its_label() {
        let panics = Panics::default();
        let spec = ProcessSpec {
            label: "f#1".into(),
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "echo fine; echo \"thread 'main' panicked at src/main.rs:1:1:\" >&2; sleep 5"
                    .into(),
            ],
            environment: BTreeMap::new(),
            echo: false,
            metrics: None,
            dead_letters: None,
            panics: Some(panics.clone()),
            logs: None,
        };
        let _managed = Managed::start(spec);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while panics.seen().is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(panics.seen(), ["[f#1] thread 'main' panicked at src/main.rs:1:1:"]);
    }
}
