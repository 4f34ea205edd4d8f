//! Least privilege on the local stack: each function signs its AWS calls with credentials of
//! its own, and the stack's proxy checks every call against that function's policy in the
//! template, refusing what it does not allow as AWS would.
//!
//! - With `template.yaml` as it is, orders run to the end (one of them failed by an outage of
//!   the payment service, swept by the supervisor, and redriven by an operator once the service
//!   is back), the status and admin routes answer, and no call is refused; the permissions no
//!   call used are printed.
//! - With one permission taken out of a copy of the template (the scheduler's
//!   `dynamodb:PutItem` on the state table), the scheduler's first write is refused, the denial
//!   is reported with the function, action and resource (from Rust and at `/_proxy/access`),
//!   and the order never leaves Pending: no step request is ever sent.
//!
//! - With the ledger's `s3:PutObject` taken out, the statement's write is refused, and the
//!   ledger agent's own log says so: the action, the object, the role and the order.
//!
//! - With a fourth agent added to a copy of the template (one more entry in the agents' list)
//!   and a step using it added to the workflow, orders run through all four agents with no
//!   call refused: the new agent's queues, function, grants, alarms and dashboard all come from
//!   that one entry.
//!
//! The function binaries are built as `local_stack.rs` builds them, into the same folder. A
//! stack is a dozen processes: the tests here take turns.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use sas_infra::access::policy::{AccessReport, Cause};
use sas_infra::access::sigv4::{EXECUTE_API, local_signer};
use sas_infra::emulation::aws::Clients;
use sas_infra::emulation::emulator::{Moto, workspace_root};
use sas_infra::emulation::local::{LocalStack, Options};
use sas_infra::emulation::proxy::ACCESS_PATH;
use sas_infra::emulation::template::Template;
use sas_tests::e2e::{
    FAST_WORKFLOW, SOUND, build_binaries, overrides_running, put_faults, sim_stats,
};
use serde_json::Value;
use tokio::sync::Mutex;

/// The payment service answers every charge with 503.
const PAYMENT_OUTAGE: &str =
    r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"transient_rate":1.0}}}"#;
const PAYMENT_DECLINES: &str =
    r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"permanent_rate":1.0}}}"#;

const REGION: &str = "us-east-1";

/// One stack at a time.
static TURN: Mutex<()> = Mutex::const_new(());

/// A stack of `template` on the shared moto server, with the fast workflow and sound services;
/// with `sweeps`, the supervisor sweeps every second and an order fails after two expired
/// leases of a step, otherwise it does not sweep while a test runs.
async fn start(name: &str, template: PathBuf, sweeps: bool) -> LocalStack {
    start_running(name, template, sweeps, &FAST_WORKFLOW).await
}

/// As [`start`], the engine running `workflow` (JSON).
async fn start_running(name: &str, template: PathBuf, sweeps: bool, workflow: &str) -> LocalStack {
    let tmpdir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bin_dir = tokio::task::spawn_blocking(|| build_binaries(tmpdir)).await.unwrap();
    let options = Options {
        template,
        endpoint: Some(Moto::shared().endpoint.clone()),
        split_emulators: false,
        bin_dir,
        api_port: 0,
        schedule_speed: if sweeps { 60.0 } else { 1.0 },
        max_instances: 2,
        account_concurrency: None,
        stack_name: format!("{name}-{}", std::process::id()),
        region: REGION.into(),
        parameters: if sweeps {
            [
                ("ClaimGraceSeconds", "1"),
                ("RetryWaitBaseSeconds", "1"),
                ("RetryWaitMaxSeconds", "2"),
                ("FailureThreshold", "2"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
        } else {
            HashMap::new()
        },
        overrides: overrides_running(workflow, SOUND),
        callers: Vec::new(),
        show_logs: std::env::var_os("LOCAL_STACK_LOGS").is_some(),
    };
    LocalStack::up(&options).await.unwrap()
}

/// Submits an order as the client `lp-client` (signed, as the API's default authorizer wants)
/// and returns its id.
async fn submit(http: &reqwest::Client, stack: &LocalStack, key: &str) -> String {
    let body = r#"{"customer_id":"c-1","currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price":1250}],
                  "ship_to":{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}"#;
    submit_to(http, stack, "", key, body).await
}

/// As [`submit`], `body` to the workflow `query` names (`?workflow=...`, or nothing).
async fn submit_to(
    http: &reqwest::Client,
    stack: &LocalStack,
    query: &str,
    key: &str,
    body: &str,
) -> String {
    let body = body.to_owned();
    let signer = local_signer("lp-client", REGION, EXECUTE_API);
    let mut last = String::new();
    // The first requests may meet functions still starting.
    for _ in 0..20 {
        let request = http
            .post(format!("{}/orders{query}", stack.api_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.clone());
        match signer.send(http, request).await {
            Ok(r) if r.status() == 202 => {
                let v: Value = r.json().await.unwrap();
                return v["order_id"].as_str().unwrap().to_owned();
            }
            Ok(r) => last = format!("{}: {}", r.status(), r.text().await.unwrap_or_default()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("order {key} was never accepted; last answer {last}");
}

/// `GET path` on the HTTP API, signed as `caller`: its status and body.
async fn get(
    http: &reqwest::Client,
    stack: &LocalStack,
    caller: &str,
    path: &str,
) -> (u16, String) {
    let signer = local_signer(caller, REGION, EXECUTE_API);
    let answer = signer.send(http, http.get(format!("{}{path}", stack.api_url))).await.unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap_or_default())
}

/// `POST path` on the HTTP API with a JSON body, signed as `caller`: its status and body.
async fn post(
    http: &reqwest::Client,
    stack: &LocalStack,
    caller: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let signer = local_signer(caller, REGION, EXECUTE_API);
    let request = http
        .post(format!("{}{path}", stack.api_url))
        .header("content-type", "application/json")
        .body(body.to_owned());
    let answer = signer.send(http, request).await.unwrap();
    (answer.status().as_u16(), answer.text().await.unwrap_or_default())
}

/// Waits until every order is in `state`, for at most `seconds`.
async fn wait_for(stack: &LocalStack, ids: &[String], state: &str, seconds: u64) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        let mut states = Vec::new();
        for id in ids {
            states.push(process_state(stack, id).await);
        }
        if states.iter().all(|s| s.as_deref() == Some(state)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "orders not {state} in time: {states:?}\n{}",
            stack.access()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The order's process state as its record holds it, read straight from the emulator.
async fn process_state(stack: &LocalStack, id: &str) -> Option<String> {
    attribute(stack, id, "ProcessState").await
}

/// The hold the order waits for, if it is held: `<service>/<action>` for an action's.
async fn held_on(stack: &LocalStack, id: &str) -> Option<String> {
    attribute(stack, id, "HeldOn").await
}

/// A string attribute of the order's state item, read straight from the emulator.
async fn attribute(stack: &LocalStack, id: &str, name: &str) -> Option<String> {
    let clients = Clients::new(&stack.emulators, REGION).await;
    let item = clients
        .dynamodb
        .get_item()
        .table_name(stack.stack.reference("StateTable").unwrap())
        .key("OrderId", AttributeValue::S(id.to_owned()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item?;
    item.get(name).and_then(|v| v.as_s().ok()).cloned()
}

/// `template.yaml` with `old` replaced by `new` inside the resource `resource`, written where
/// a stack can be started from it.
fn template_without(resource: &str, old: &str, new: &str) -> PathBuf {
    let text = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    let header = format!("\n  {resource}:\n");
    let start = text.find(&header).unwrap_or_else(|| panic!("no {resource} in the template"))
        + header.len();
    // The resource ends where the next line at its indentation begins.
    let end = text[start..]
        .match_indices("\n  ")
        .map(|(i, _)| start + i)
        .find(|&i| text[i + 3..].starts_with(|c: char| c.is_ascii_alphanumeric()))
        .unwrap_or(text.len());
    let section = &text[start..end];
    assert_eq!(section.matches(old).count(), 1, "{resource} must hold {old:?} exactly once");
    let changed = format!("{}{}{}", &text[..start], section.replacen(old, new, 1), &text[end..]);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("least-privilege-{}-{resource}.yaml", std::process::id()));
    std::fs::write(&path, changed).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_run_to_the_end_with_no_call_refused() {
    let _turn = TURN.lock().await;
    let stack = start("lp-real", workspace_root().join("template.yaml"), true).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(submit(&http, &stack, &format!("lp-order-{i}")).await);
    }
    wait_for(&stack, &ids, "Processed", 90).await;
    // A key used again reads the order back.
    assert_eq!(submit(&http, &stack, "lp-order-0").await, ids[0]);
    // The routes that read: the submitter's own order, and the operators' views.
    assert_eq!(get(&http, &stack, "lp-client", &format!("/orders/{}", ids[0])).await.0, 200);
    for path in [
        "/admin/orders".to_owned(),
        "/admin/orders?list=in-flight".to_owned(),
        format!("/admin/orders/{}", ids[0]),
        "/admin/dead-letters".to_owned(),
    ] {
        let (status, body) = get(&http, &stack, "ops-lp", &path).await;
        assert_eq!(status, 200, "GET {path}: {body}");
    }

    // An outage holds an order, which waits for the payment service's charges and goes on,
    // untouched by anyone, once they answer again: the supervisor sends it as their probe.
    put_faults(&http, &stack, PAYMENT_OUTAGE).await;
    let held = vec![submit(&http, &stack, "lp-outage").await];
    let deadline = Instant::now() + Duration::from_secs(90);
    while held_on(&stack, &held[0]).await.as_deref() != Some("payment/charge-payment") {
        if Instant::now() >= deadline {
            panic!(
                "the order was never held: it is {:?}; the service counted {}\n{}",
                process_state(&stack, &held[0]).await,
                sim_stats(&http, &stack).await,
                stack.access()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    put_faults(&http, &stack, SOUND).await;
    wait_for(&stack, &held, "Processed", 150).await;

    // A refusal fails an order; once the service takes it again, an operator redrives it, and
    // the dead letters of a queue.
    put_faults(&http, &stack, PAYMENT_DECLINES).await;
    let failed = vec![submit(&http, &stack, "lp-declined").await];
    wait_for(&stack, &failed, "Error", 120).await;
    put_faults(&http, &stack, SOUND).await;
    let command = r#"{"command_id":"lp-redrive","reason":"payment service back"}"#;
    let path = format!("/admin/orders/{}/redrive", failed[0]);
    let (status, body) = post(&http, &stack, "ops-lp", &path, command).await;
    assert_eq!(status, 200, "POST {path}: {body}");
    wait_for(&stack, &failed, "Processed", 120).await;
    let path = "/admin/dead-letters/replies/redrive";
    let (status, body) =
        post(&http, &stack, "ops-lp", path, r#"{"reason":"replies lost to a bug now fixed"}"#)
            .await;
    assert_eq!(status, 200, "POST {path}: {body}");

    let access = stack.access();
    println!("{access}");
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
    // Every function of the stack calls AWS in such a run, but the simulated service, which
    // stands for the outside world.
    let callers = stack.functions.iter().map(|f| f.spec.logical_id.as_str());
    for function in callers.filter(|id| *id != sas_infra::emulation::local::REMOTE_SERVICE) {
        assert!(
            access.checked.get(function).copied().unwrap_or(0) > 0,
            "no call of {function} was checked:\n{access}"
        );
    }
    // The transaction of each submission used the PutItem grant on the state table.
    let state = stack.stack.attribute("StateTable", "Arn").unwrap();
    assert!(
        !access.unused.iter().any(|g| g.function == "SubmissionFunction"
            && g.action == "dynamodb:PutItem"
            && g.resource == state),
        "{access}"
    );
    let mut report = String::new();
    stack.check_access(&mut report).unwrap();
    assert!(report.contains("0 denied"), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_taken_out_of_the_template_is_refused_and_the_order_goes_no_further() {
    let _turn = TURN.lock().await;
    // The scheduler may still read the state table, but no longer write it.
    let template = template_without(
        "SchedulerFunctionRole",
        "                  - dynamodb:PutItem\n                  - dynamodb:BatchGetItem\n                Resource:\n                  Fn::GetAtt: [StateTable, Arn]\n",
        "                  - dynamodb:BatchGetItem\n                Resource:\n                  Fn::GetAtt: [StateTable, Arn]\n",
    );
    let stack = start("lp-denied", template, false).await;
    let http = reqwest::Client::new();
    let id = submit(&http, &stack, "lp-denied-1").await;

    let deadline = Instant::now() + Duration::from_secs(60);
    let mut access = stack.access();
    while access.denials.is_empty() {
        assert!(Instant::now() < deadline, "no denial was reported:\n{access}");
        tokio::time::sleep(Duration::from_millis(200)).await;
        access = stack.access();
    }
    // Time for anything that would follow the claim, were it allowed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let access = stack.access();
    println!("{access}");
    let state = stack.stack.attribute("StateTable", "Arn").unwrap();
    let denied: Vec<(&str, &str, &str, &str, &Cause)> = access
        .denials
        .iter()
        .map(|d| {
            (
                d.function.as_str(),
                d.operation.as_str(),
                d.action.as_str(),
                d.resource.as_str(),
                &d.cause,
            )
        })
        .collect();
    assert_eq!(
        denied,
        [("SchedulerFunction", "PutItem", "dynamodb:PutItem", state.as_str(), &Cause::NoAllow)],
        "{access}"
    );
    assert_eq!(
        access.denials[0].message(),
        format!(
            "User: arn:aws:sts::123456789012:assumed-role/SchedulerFunctionRole/SchedulerFunction is not authorized to perform: dynamodb:PutItem on resource: {state} because no identity-based policy allows the dynamodb:PutItem action"
        )
    );
    // Other processes read the same at the proxy's control path.
    let served: AccessReport = http
        .get(format!("{}{ACCESS_PATH}", stack.endpoint))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(served.denials.len(), 1);
    assert_eq!(
        (served.denials[0].function.as_str(), served.denials[0].action.as_str()),
        ("SchedulerFunction", "dynamodb:PutItem")
    );
    let mut report = String::new();
    let failed = stack.check_access(&mut report).unwrap_err().to_string();
    assert!(failed.contains("DENIED SchedulerFunction: dynamodb:PutItem"), "{failed}");

    // The order was accepted, and went no further: never claimed, no step ever requested.
    assert_eq!(process_state(&stack, &id).await.as_deref(), Some("Pending"));
    let sent: Vec<String> = stack
        .proxy
        .counts
        .snapshot()
        .into_keys()
        .filter(|(service, op)| service == "sqs" && op.starts_with("SendMessage"))
        .map(|(_, op)| op)
        .collect();
    assert_eq!(sent, ["SendMessageBatch to SchedulerQueue"], "only the start message was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refused_by_s3_says_why_in_its_log() {
    let _turn = TURN.lock().await;
    // The ledger may read statements, but no longer write them.
    let template = template_without(
        "ledgerAgentGrant",
        "            Action: s3:PutObject\n",
        "            Action: s3:GetObject\n",
    );
    let opening = sas_workflows::file("account-opening").unwrap().json;
    let workflows = format!("[{}]", sas_infra::demo::with_budgets(opening, 2));
    let stack = start_running("lp-s3", template, false, &workflows).await;
    let http = reqwest::Client::new();
    let body = r#"{"customer":{"name":"Ada","email":"ada@example.com"},"plan":"basic","initial_deposit":10}"#;
    let id = submit_to(&http, &stack, "?workflow=account-opening", "lp-s3-1", body).await;

    // The statement's write is refused, and the agent's log names the action, the object and
    // the role, beside the order it was for.
    let deadline = Instant::now() + Duration::from_secs(60);
    let said = loop {
        let lines = stack.logs.of("ledgerAgentFunction");
        if let Some(line) = lines.iter().find(|l| l.contains("AccessDenied")) {
            break line.clone();
        }
        assert!(Instant::now() < deadline, "the log never said why:\n{}", lines.join("\n"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let bucket = stack.stack.reference("LedgerStatementsBucket").unwrap();
    for needed in [
        "ledgerAgentFunctionRole/ledgerAgentFunction is not authorized to perform: s3:PutObject"
            .to_owned(),
        format!("on resource: arn:aws:s3:::{bucket}/statements/"),
        format!("order_id={id}"),
    ] {
        assert!(said.contains(&needed), "{needed:?} not in: {said}");
    }
    let access = stack.access();
    let denied: Vec<_> =
        access.denials.iter().map(|d| (d.function.as_str(), d.action.as_str())).collect();
    assert!(denied.iter().all(|d| *d == ("ledgerAgentFunction", "s3:PutObject")), "{access}");
    assert!(!denied.is_empty(), "{access}");
}

/// The line of `template.yaml` that lists its agents: the collection of its agents' loop.
fn agents_line(template: &str) -> String {
    let mut lines = template.lines().skip_while(|l| l.trim() != "Fn::ForEach::Agent:");
    let list = lines.nth(2).unwrap_or_else(|| panic!("no agents' loop in template.yaml"));
    assert!(list.trim_start().starts_with("- ["), "the loop's list: {list}");
    format!("{list}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fourth_agent_added_in_one_entry_runs_with_its_own_grants_alarms_and_dashboard() {
    let _turn = TURN.lock().await;
    let text = std::fs::read_to_string(workspace_root().join("template.yaml")).unwrap();
    let agents = agents_line(&text);
    assert_eq!(text.matches(&agents).count(), 1, "template.yaml lists its agents once");
    let text = text.replace(&agents, &agents.replace(']', ", email]"));
    let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("least-privilege-{}-email.yaml", std::process::id()));
    std::fs::write(&path, &text).unwrap();

    // Everything per agent follows from the entry.
    let template = Template::parse(&text).unwrap();
    for (id, kind) in [
        ("emailQueue", "AWS::SQS::Queue"),
        ("emailDeadLetterQueue", "AWS::SQS::Queue"),
        ("emailAgentFunction", "AWS::Serverless::Function"),
        ("emailAgentFunctionRole", "AWS::IAM::Role"),
        ("emailDeadLetterAlarm", "AWS::CloudWatch::Alarm"),
        ("emailBacklogAlarm", "AWS::CloudWatch::Alarm"),
        ("emailErrorRateAlarm", "AWS::CloudWatch::Alarm"),
        ("emailThrottlesAlarm", "AWS::CloudWatch::Alarm"),
        ("emailDashboard", "AWS::CloudWatch::Dashboard"),
    ] {
        let resource = template.resource(id).unwrap_or_else(|| panic!("no {id}"));
        assert_eq!(resource.kind, kind, "{id}");
    }
    // The alarms are named so that the topic policy lets them publish.
    let ctx =
        sas_infra::emulation::template::Context::new(&template, "st", REGION, &HashMap::new())
            .unwrap();
    let policy =
        serde_json::to_string(&template.resource("AlertsTopicPolicy").unwrap().properties).unwrap();
    assert!(policy.contains(":alarm:${AWS::StackName}.*"), "{policy}");
    for alarm in ["DeadLetter", "Backlog", "ErrorRate", "Throttles"] {
        let name =
            &template.resource(&format!("email{alarm}Alarm")).unwrap().properties["AlarmName"];
        let name = ctx.eval(name).unwrap();
        assert!(name.as_str().unwrap().starts_with("st.email."), "{name}");
    }
    let dashboard = &template.resource("emailDashboard").unwrap().properties["DashboardBody"];
    let body = serde_json::to_string(dashboard).unwrap();
    assert!(body.contains("Agent email: dead letters"), "{body}");
    assert!(body.contains(r#"["emailDeadLetterQueue","QueueName"]"#), "its own queues: {body}");

    // A step using it, at the end of the workflow: orders go through all four agents.
    let mut workflow: Value = serde_json::from_str(&FAST_WORKFLOW).unwrap();
    workflow["steps"].as_array_mut().unwrap().push(serde_json::json!(
        {"name": "send-confirmation", "agent": "email", "budget_seconds": 2}
    ));
    let stack = start_running("lp-email", path, false, &workflow.to_string()).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(submit(&http, &stack, &format!("lp-email-{i}")).await);
    }
    wait_for(&stack, &ids, "Processed", 90).await;
    for id in &ids {
        let (status, body) = get(&http, &stack, "ops-lp", &format!("/admin/orders/{id}")).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("send-confirmation"), "the order went through the new step: {body}");
    }

    let access = stack.access();
    println!("{access}");
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
    assert!(access.checked.get("emailAgentFunction").copied().unwrap_or(0) > 0, "{access}");
    // The scheduler sent to the new queue under the grant that covers every agent's queue by
    // its name: nothing about the new agent was added to the scheduler's role.
    let queue = stack.stack.attribute("emailQueue", "Arn").unwrap();
    let prefix = queue.strip_suffix("email").unwrap();
    assert!(prefix.ends_with("_agent_"), "{queue}");
    assert!(
        !access.unused.iter().any(|g| g.function == "SchedulerFunction"
            && g.action == "sqs:SendMessage"
            && g.resource == format!("{prefix}*")),
        "{access}"
    );
    assert!(template.resources.iter().all(|(id, _)| !id.starts_with("emailScheduler")));
}
