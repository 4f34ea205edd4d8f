//! `sam local`, as far as a machine without Docker gets: each function's real binary is invoked
//! with its sample event (`functions/<crate>/events/`) and with the environment that SAM CLI's
//! own code (`tests/sam_local.py`, SAM CLI from PyPI in `.venv-sam`) makes from the template and
//! the `--env-vars` file `local-stack up` writes; the binary runs behind a Runtime API, as in
//! SAM's container, against a running local stack. And the routes `sam local start-api` would
//! serve are the template's.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sas_infra::emulation::emulator::{python_with, workspace_root};
use sas_infra::emulation::functions::EventSource;
use sas_infra::emulation::local::LocalStack;
use sas_infra::emulation::runtime_api::RuntimeApi;
use sas_infra::emulation::sam_local::{ENDPOINT_VARIABLE, write_env_vars};
use sas_infra::emulation::template::Template;
use sas_tests::e2e::{SOUND, build_binaries, start_stack};
use serde_json::Value;

/// From 1.170, a release that has the language extensions module the loop test reads.
const SAM_CLI: &str = "aws-sam-cli>=1.170,<2";
const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");

/// Runs `tests/sam_local.py` with `args`, in an environment with nothing of this shell's.
fn sam_local(args: &[&str]) -> Value {
    let python = python_with(".venv-sam", &[SAM_CLI], "samcli").unwrap();
    let out = Command::new(python)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", std::env::temp_dir())
        .arg(workspace_root().join("tests/sam_local.py"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sample events of a function: those of its crate, and for an agent those of its agent.
fn sample_events(binary: &str, environment: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let folder = workspace_root().join("functions").join(binary).join("events");
    let mut events: Vec<PathBuf> = std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("{}: {e}", folder.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| match environment.get("AGENT_NAME") {
            Some(agent) => p.file_name().unwrap().to_string_lossy().starts_with(agent.as_str()),
            None => true,
        })
        .collect();
    events.sort();
    events
}

/// Invokes `program` once with `event` and the environment `sam local` gives it.
async fn invoke(
    name: &str,
    program: &Path,
    environment: &serde_json::Map<String, Value>,
    event: &Path,
) -> Value {
    let api = RuntimeApi::start(name, "us-east-1").await.unwrap();
    let mut child = Command::new(program)
        .env_clear()
        .envs(environment.iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned())))
        .env("AWS_LAMBDA_RUNTIME_API", api.address())
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("LOCAL_STACK_LOGS").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .spawn()
        .unwrap();
    let payload = std::fs::read_to_string(event).unwrap();
    let answer = api.invoke(payload, Duration::from_secs(30)).await;
    let _ = child.kill();
    let _ = child.wait();
    let answer = answer.unwrap_or_else(|e| panic!("{name} with {}: {e}", event.display()));
    serde_json::from_str(&answer).unwrap()
}

fn status_and_body(answer: &Value) -> (u64, Value) {
    let body = answer["body"].as_str().map_or(Value::Null, |b| serde_json::from_str(b).unwrap());
    (answer["statusCode"].as_u64().unwrap(), body)
}

/// The order the sample events follow: the one `post-order.json` submits.
fn sample_order() -> String {
    let path = workspace_root().join("functions/status/events/get-order.json");
    let event: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    event["pathParameters"]["id"].as_str().unwrap().to_owned()
}

async fn wait_until_processed(stack: &LocalStack, order: &str) -> String {
    let dynamodb =
        sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.dynamodb;
    let table = stack.stack.reference("StateTable").unwrap();
    let started = Instant::now();
    loop {
        let item = dynamodb
            .get_item()
            .table_name(&table)
            .key("OrderId", aws_sdk_dynamodb::types::AttributeValue::S(order.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item
            .unwrap_or_default();
        let state = item
            .get("ProcessState")
            .and_then(|v| v.as_s().ok())
            .cloned()
            .unwrap_or_else(|| "absent".into());
        if state == "Processed" || started.elapsed() > Duration::from_secs(120) {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The queues with a dead-letter queue that still hold a message (visible, in flight or
/// delayed), and the dead-letter queues that hold one, once the queues have had `within` to
/// drain. A message whose handling fails stays in its queue, hidden, and comes back after its
/// visibility timeout until SQS moves it to the dead-letter queue (minutes later): whatever is
/// left in a queue after less than its visibility timeout is a message that failed, and ends
/// in a dead-letter queue.
async fn left_in_queues(stack: &LocalStack, template: &Template, within: Duration) -> Vec<String> {
    use aws_sdk_sqs::types::QueueAttributeName::{
        ApproximateNumberOfMessages, ApproximateNumberOfMessagesDelayed,
        ApproximateNumberOfMessagesNotVisible,
    };
    let sqs = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.sqs;
    let redrives = sas_infra::observe::dead_letters::redrives(template, &stack.stack).unwrap();
    assert!(!redrives.is_empty(), "no queue with a dead-letter queue");
    let shortest = redrives.iter().map(|r| r.visibility_timeout).min().unwrap();
    assert!(within < shortest, "{within:?}: a failed message may come back within it");
    let started = Instant::now();
    loop {
        let mut left = Vec::new();
        for r in &redrives {
            for (id, url) in [(&r.queue, &r.queue_url), (&r.dead_letter_queue, &r.dead_letter_url)]
            {
                let attributes = sqs
                    .get_queue_attributes()
                    .queue_url(url)
                    .attribute_names(ApproximateNumberOfMessages)
                    .attribute_names(ApproximateNumberOfMessagesNotVisible)
                    .attribute_names(ApproximateNumberOfMessagesDelayed)
                    .send()
                    .await
                    .unwrap()
                    .attributes
                    .unwrap_or_default();
                let count: u64 = attributes.values().map(|v| v.parse::<u64>().unwrap()).sum();
                if count > 0 {
                    left.push(format!("{id}: {count} message(s) ({attributes:?})"));
                }
            }
        }
        if left.is_empty() || started.elapsed() > within {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_function_runs_its_sample_event_as_sam_local_invoke_would_against_the_local_stack() {
    let stack = start_stack(TARGET_TMPDIR.as_ref(), "sam-local", SOUND, 5, &[]).await;
    let bin_dir = build_binaries(TARGET_TMPDIR.as_ref());
    let template_path = workspace_root().join("template.yaml");
    let env_vars = Path::new(TARGET_TMPDIR).join("sam-env-vars.json");
    write_env_vars(&template_path, &stack, &env_vars).unwrap();
    let sam = sam_local(&["env", template_path.to_str().unwrap(), env_vars.to_str().unwrap()]);
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&env_vars).unwrap()).unwrap();

    // What SAM gives each function is what the local stack gives it: no declared variable is
    // left to SAM's own resolution, which names resources by their logical ids.
    for f in &stack.functions {
        let id = &f.spec.logical_id;
        let given = sam[id]["environment"].as_object().unwrap();
        for name in sam[id]["declared"].as_array().unwrap() {
            let name = name.as_str().unwrap();
            let expected = match name {
                ENDPOINT_VARIABLE => Some(&stack.endpoint),
                _ => f.spec.environment.get(name),
            };
            match expected {
                Some(value) => assert_eq!(given[name], value.as_str(), "{id}: {name}"),
                // Declared under a condition that is false here: absent on AWS too.
                None => assert!(file[id].get(name).is_none(), "{id}: {name}"),
            }
        }
    }

    // The sample order is submitted first (the other events follow it), then every other
    // function runs its events. The local stack's own functions run too, on the same queues.
    let order = sample_order();
    let submits = |f: &&sas_infra::emulation::local::RunningFunction| {
        f.spec.events.iter().any(|e| {
            matches!(e, EventSource::HttpApi { method, path, .. } if method == "POST" && path == "/orders")
        })
    };
    let order_of_calls: Vec<&str> = stack
        .functions
        .iter()
        .filter(submits)
        .chain(stack.functions.iter().filter(|f| !submits(f)))
        .map(|f| f.spec.logical_id.as_str())
        .collect();
    let mut invoked = Vec::new();
    for &id in &order_of_calls {
        let f = stack.functions.iter().find(|f| f.spec.logical_id == id).unwrap();
        let environment = sam[id]["environment"].as_object().unwrap();
        for event in sample_events(&f.spec.binary, &f.spec.environment) {
            let answer = invoke(id, &bin_dir.join(&f.spec.binary), environment, &event).await;
            let what = format!("{id} with {}", event.display());
            let is_queue = f.spec.events.iter().any(|e| matches!(e, EventSource::Sqs { .. }));
            if is_queue {
                let failures = &answer["batchItemFailures"];
                assert_eq!(failures, &Value::Array(vec![]), "{what}: {answer}");
            } else if answer.get("statusCode").is_some() {
                let (status, body) = status_and_body(&answer);
                match id {
                    "SubmissionFunction" => {
                        assert_eq!(status, 202, "{what}: {body}");
                        assert_eq!(body["order_id"], order.as_str(), "{what}: {body}");
                    }
                    "StatusFunction" => {
                        assert_eq!(status, 200, "{what}: {body}");
                        assert_eq!(body["order_id"], order.as_str(), "{what}: {body}");
                    }
                    _ => assert_eq!(status, 200, "{what}: {body}"),
                }
            }
            invoked.push(id);
        }
    }
    invoked.dedup();
    assert_eq!(invoked, order_of_calls, "a function without a sample event");
    assert_eq!(wait_until_processed(&stack, &order).await, "Processed");
    // Every message the sample events led to (the agents' replies among them) was taken: none
    // is left to fail again and end in a dead-letter queue.
    let template = Template::load(&template_path).unwrap();
    let left = left_in_queues(&stack, &template, Duration::from_secs(30)).await;
    assert!(left.is_empty(), "left to end in a dead-letter queue: {left:#?}");
}

/// The methods SAM CLI serves for an `ANY` route.
const ANY: [&str; 7] = ["DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"];

#[test]
fn sam_local_start_api_serves_the_routes_of_the_template() {
    let template_path = workspace_root().join("template.yaml");
    // SAM CLI 1.170's language extensions resolve the template's conditions as they expand it,
    // leaving the JWT authorizer without its API and the routes without their integrations, so
    // `sam local start-api` runs on the template with its loop expanded beforehand
    // (`local-stack expand`, as the README says).
    let expanded = Path::new(TARGET_TMPDIR).join("template-expanded.json");
    let document = Template::expanded_document(&template_path).unwrap();
    std::fs::write(&expanded, serde_json::to_string_pretty(&document).unwrap()).unwrap();
    let served = sam_local(&["routes", expanded.to_str().unwrap()]);
    let served: Vec<(String, String)> = served
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["function"].is_string(), "sam local start-api finds no function for {r}");
            assert_eq!(r["payload"], "2.0", "{r}");
            (r["route"].as_str().unwrap().to_owned(), r["function"].as_str().unwrap().to_owned())
        })
        .collect();
    // The routes as the local stack reads them from the same template, with every optional
    // route on: SAM CLI serves a route whatever its condition.
    let template = Template::load(&template_path).unwrap();
    let stack = sas_infra::emulation::provision::dry_run(
        &template,
        &sas_infra::emulation::provision::Options {
            stack_name: "sam".into(),
            region: "us-east-1".into(),
            parameters: [("Console".to_owned(), "true".to_owned())].into(),
            attributes: [(
                ("RemoteSimFunctionUrl".to_owned(), "FunctionUrl".to_owned()),
                Value::String("http://127.0.0.1:9/".into()),
            )]
            .into(),
        },
    )
    .unwrap();
    let mut routes: Vec<(String, String)> =
        sas_infra::emulation::functions::functions(&template, &stack)
            .unwrap()
            .into_iter()
            .flat_map(|f| {
                f.events.into_iter().filter_map(move |e| match e {
                    EventSource::HttpApi { method, path, .. } => {
                        Some((method, path, f.logical_id.clone()))
                    }
                    _ => None,
                })
            })
            .flat_map(|(method, path, function)| {
                // SAM CLI serves an `ANY` route as one route for each method it knows.
                let methods = match method.as_str() {
                    "ANY" => ANY.iter().map(|m| m.to_string()).collect(),
                    _ => vec![method],
                };
                methods.into_iter().map(move |m| (format!("{m} {path}"), function.clone()))
            })
            .collect();
    routes.sort();
    assert_eq!(served, routes);
}

/// A template of loops, nested and not, with their items in keys, `Ref`s, `Fn::Sub`s (one with
/// a pseudo parameter), `Fn::FindInMap` and `Fn::GetAtt` of a name made by `Fn::Sub`.
const LOOPS: &str = r#"{
 "Transform": ["AWS::LanguageExtensions", "AWS::Serverless-2016-10-31"],
 "Mappings": {"Agents": {"inventory": {"Url": "http://inventory"}, "payment": {"Url": "http://payment"}}},
 "Resources": {
  "Bus": {"Type": "AWS::Events::EventBus", "Properties": {"Name": {"Fn::Sub": "${AWS::StackName}-bus"}}},
  "Fn::ForEach::Agents": ["Agent", ["inventory", "payment"], {
   "${Agent}Queue": {"Type": "AWS::SQS::Queue", "Properties": {
     "QueueName": {"Fn::Sub": "${AWS::StackName}-${Agent}"},
     "Url": {"Fn::FindInMap": ["Agents", {"Ref": "Agent"}, "Url"]},
     "Tags": [{"Key": "agent", "Value": {"Ref": "Agent"}}]}},
   "&{Agent}Policy": {"Type": "AWS::IAM::Policy", "Properties": {
     "Queue": {"Fn::GetAtt": [{"Fn::Sub": "${Agent}Queue"}, "Arn"]},
     "Fn::ForEach::Levels": ["Level", ["warn", "page"], {
       "Threshold${Level}": {"Fn::Sub": "${Agent}-${Level}"}}]}}}]},
 "Outputs": {
  "Fn::ForEach::Urls": ["Agent", ["inventory", "payment"], {
   "${Agent}QueueArn": {"Value": {"Fn::GetAtt": [{"Fn::Sub": "${Agent}Queue"}, "Arn"]}}}]}
}"#;

#[test]
fn loops_expand_as_sam_cli_s_language_extensions_expand_them() {
    let path = Path::new(TARGET_TMPDIR).join("loops.json");
    std::fs::write(&path, LOOPS).unwrap();
    let theirs = sam_local(&["expand", path.to_str().unwrap(), "loops"]);
    let ours = Template::parse(LOOPS).unwrap();
    let ids = |t: &Template| t.resources.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>();
    let expanded = Template::parse(&theirs.to_string()).unwrap();
    assert_eq!(ids(&ours), ids(&expanded));
    assert_eq!(
        ours.outputs.keys().collect::<Vec<_>>(),
        expanded.outputs.keys().collect::<Vec<_>>()
    );
    // SAM CLI resolves some intrinsics and keeps others: both sides evaluated alike must agree.
    let mut ctx = sas_infra::emulation::template::Context::new(
        &ours,
        "loops",
        "us-east-1",
        &Default::default(),
    )
    .unwrap();
    for agent in ["inventory", "payment"] {
        let queue = format!("{agent}Queue");
        ctx.attributes.insert((queue.clone(), "Arn".into()), format!("arn:{agent}").into());
    }
    for (id, resource) in &ours.resources {
        let mine = ctx.eval(&resource.properties).unwrap();
        let sam = ctx.eval(&expanded.resource(id).unwrap().properties).unwrap();
        assert_eq!(mine, sam, "{id}");
    }
    let policy = ctx.eval(&ours.resource("paymentPolicy").unwrap().properties).unwrap();
    assert_eq!(
        policy,
        serde_json::json!({"Queue": "arn:payment", "Thresholdwarn": "payment-warn", "Thresholdpage": "payment-page"})
    );
    for (name, output) in &ours.outputs {
        assert_eq!(ctx.eval(output).unwrap(), ctx.eval(&expanded.outputs[name]).unwrap(), "{name}");
    }
}
