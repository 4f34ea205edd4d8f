//! What the end-to-end tests on the local stack share: the function binaries built as they
//! ship, the fast reference workflow, the simulated services' fault knobs, and a stack started
//! with them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use sas_infra::access::sigv4::{LAMBDA, local_signer};
use sas_infra::demo::with_budgets;
use sas_infra::emulation::emulator::{Moto, workspace_root};
use sas_infra::emulation::local::{LocalStack, Options};

/// The reference workflow with budgets of 2 s, so that a killed step's lease runs out in
/// seconds rather than minutes.
pub static FAST_WORKFLOW: LazyLock<String> =
    LazyLock::new(|| with_budgets(sas_workflows::order_fulfilment(), 2));

/// The functions that run the engine, and so read the workflow.
pub const ENGINE_FUNCTIONS: [&str; 5] = [
    "SubmissionFunction",
    "SchedulerFunction",
    "SupervisorFunction",
    "StatusFunction",
    "AdminFunction",
];

/// The simulated services as the tests start them: sound, 20 ms a call.
pub const SOUND: &str = r#"{"default":{"latency_ms":20}}"#;

/// The target directory a test was built in (`target_tmpdir` is its `CARGO_TARGET_TMPDIR`),
/// wherever CARGO_TARGET_DIR or cargo's configuration put it. The function binaries are built
/// there too: `cargo test` does not hold its lock while its tests run, and a second target
/// directory would build the AWS SDK a second time (gigabytes on a fresh machine).
pub fn target_dir(target_tmpdir: &Path) -> PathBuf {
    target_tmpdir.parent().map_or_else(|| workspace_root().join("target"), Path::to_path_buf)
}

/// Builds the function binaries (and `sas`) from the code they ship with, and returns their
/// folder. The test targets are named too so that cargo resolves the dependencies' features as
/// `cargo test` did (the dev-dependencies add tokio's `test-util`): otherwise tokio, and the SDK
/// and all else above it, would be built a second time with other features.
pub fn build_binaries(target_tmpdir: &Path) -> PathBuf {
    let target = target_dir(target_tmpdir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .current_dir(workspace_root())
        .args(["build", "--workspace", "--bins", "--tests", "--quiet", "--target-dir"])
        .arg(&target)
        .status()
        .unwrap();
    assert!(status.success(), "building the function binaries failed");
    target.join("debug")
}

/// Environment overrides: the fast workflow for the engine's functions, `faults` for the
/// simulated services.
pub fn overrides(faults: &str) -> Vec<(String, String, String)> {
    overrides_running(&FAST_WORKFLOW, faults)
}

/// As [`overrides`], with `workflow` (JSON) for the engine's functions.
pub fn overrides_running(workflow: &str, faults: &str) -> Vec<(String, String, String)> {
    ENGINE_FUNCTIONS
        .iter()
        .map(|f| ((*f).to_owned(), "WORKFLOW_JSON".to_owned(), workflow.to_owned()))
        .chain([("RemoteSimFunction".to_owned(), "FAULTS".to_owned(), faults.to_owned())])
        .collect()
}

/// Sets the simulated services' faults (their function URL takes signed requests only).
pub async fn put_faults(http: &reqwest::Client, stack: &LocalStack, faults: &str) {
    let url = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap();
    let request = http
        .put(format!("{url}faults"))
        .header("content-type", "application/json")
        .body(faults.to_owned());
    let signer = local_signer("e2e-tester", &stack.stack.context.region, LAMBDA);
    let answer = signer.send(http, request).await.unwrap();
    assert!(answer.status().is_success(), "PUT faults: {}", answer.status());
}

/// What the simulated service counted of the calls it was sent (its `GET /stats`), for a
/// failure to tell what reached it.
pub async fn sim_stats(http: &reqwest::Client, stack: &LocalStack) -> String {
    let url = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap();
    let signer = local_signer("e2e-tester", &stack.stack.context.region, LAMBDA);
    match signer.send(http, http.get(format!("{url}stats"))).await {
        Ok(answer) => answer.text().await.unwrap_or_else(|e| format!("(unreadable: {e})")),
        Err(e) => format!("(no answer: {e})"),
    }
}

/// A stack on the shared moto server with the fast workflow, the simulated services' faults,
/// policies scaled down from minutes to seconds (`failure_threshold` expired leases of a step
/// before its order is compensated), and `parameters` on top. The function binaries are built
/// beside `target_tmpdir`, the test binary's `CARGO_TARGET_TMPDIR`.
pub async fn start_stack(
    target_tmpdir: &Path,
    name: &str,
    faults: &str,
    failure_threshold: u32,
    parameters: &[(&str, &str)],
) -> LocalStack {
    let setup = Setup::default();
    start_stack_within(target_tmpdir, name, faults, failure_threshold, parameters, setup).await
}

/// What a stack may change from [`start_stack`]'s.
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    /// The account's limit of concurrent executions; none by default.
    pub quota: Option<usize>,
    /// The workflow the engine runs (JSON); [`FAST_WORKFLOW`] by default.
    pub workflow: &'a str,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup { quota: None, workflow: &FAST_WORKFLOW }
    }
}

/// As [`start_stack`], set up as `setup` says.
pub async fn start_stack_within(
    target_tmpdir: &Path,
    name: &str,
    faults: &str,
    failure_threshold: u32,
    parameters: &[(&str, &str)],
    setup: Setup<'_>,
) -> LocalStack {
    let target_tmpdir = target_tmpdir.to_owned();
    let bin_dir =
        tokio::task::spawn_blocking(move || build_binaries(&target_tmpdir)).await.unwrap();
    let options = Options {
        template: workspace_root().join("template.yaml"),
        endpoint: Some(Moto::shared().endpoint.clone()),
        split_emulators: false,
        bin_dir,
        api_port: 0,
        // The supervisor's one-minute rate, every second.
        schedule_speed: 60.0,
        max_instances: 2,
        account_concurrency: setup.quota,
        stack_name: format!("{name}-{}", std::process::id()),
        region: "us-east-1".into(),
        parameters: HashMap::from([
            ("ClaimGraceSeconds".to_owned(), "1".to_owned()),
            ("RetryWaitBaseSeconds".to_owned(), "1".to_owned()),
            ("RetryWaitMaxSeconds".to_owned(), "2".to_owned()),
            ("FailureThreshold".to_owned(), failure_threshold.to_string()),
        ])
        .into_iter()
        .chain(parameters.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())))
        .collect(),
        overrides: overrides_running(setup.workflow, faults),
        callers: Vec::new(),
        show_logs: std::env::var_os("LOCAL_STACK_LOGS").is_some(),
    };
    LocalStack::up(&options).await.unwrap()
}
