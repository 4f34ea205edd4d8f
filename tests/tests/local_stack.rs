//! End to end on the local stack: the real function binaries behind a local Runtime API, event
//! sources emulated, resources from `template.yaml` on moto.
//!
//! - Orders submitted over HTTP while function processes are killed with SIGKILL at random
//!   moments all end in a terminal state, with no remote effect applied twice.
//! - Orders failed by a long outage of the payment service are redriven with the `sas` CLI once
//!   it is back, and all end Processed with every effect applied exactly once.
//! - An order cancelled while its payment call is in flight ends Cancelled, with what was done
//!   undone.
//! - The API lets in only whom it should, in each of its three auth modes, and a refused
//!   request writes nothing; header values reach the function's own validation, and one HTTP
//!   does not allow gets the gateway's reason.
//! - A message that reaches a dead-letter queue is reported as it arrives, with its order and
//!   the error its function logged for it.
//! - Throttling delays orders and fails none: in an account with a small concurrency quota,
//!   with every write of the scheduler throttled for longer than the queues' receive counts
//!   would last, every order is processed and no message reaches a dead-letter queue.
//! - Two workflows run side by side, each with its own input schema: the reference one on
//!   its three HTTP agents, and account-opening on the ledger agent, written in Rust, which
//!   opens accounts in a DynamoDB table of its own through the AWS SDK, and on an HTTP agent.
//!   Each order keeps its workflow and version; a refusal after the account was opened closes
//!   it; an input its schema refuses gets the JSON pointer of the fault; no call is refused by
//!   the functions' policies.
//! - A reviewed order reserves the stock and charges the card at once, then waits for a
//!   review from outside, announced on the bus with a token: given, it ships; refused, or
//!   never given before its timeout, the stock is released and the card refunded; an operator
//!   answers with `sas complete`; another token, a client without the answerers' policy, and an
//!   answer after the end change nothing.
//! - A new version of a workflow is deployed while orders run: the functions start again on
//!   it, new orders take it, and the orders in flight finish on the version they started on.
//! - An order's input larger than a request carries, and a service's answer of 100 kB, are
//!   kept in the payload bucket: every call gets the whole input, shipping the whole answer,
//!   and the refund of an undone order is told it whole, while the records keep references;
//!   the status API shows the references, or the values whole when asked.
//! - A parent order starts two children side by side and is processed once both are, each
//!   child an order of its own linked to it both ways; a parent cancelled while a child's
//!   call is on the wire cancels the child, which undoes what it did.
//! - An event put on the stack's bus starts one order of the workflow whose pattern it
//!   matches, however often it is delivered, and one it does not match starts none; a
//!   schedule's every minute starts one order, from the few minutes before the stack came up
//!   on, with none missed.
//! - Orders of one customer, under `"concurrency": {"key": "/input/customer_id", "limit": 1}`,
//!   run one at a time in the order they were accepted, and every one is processed: no two of
//!   a customer overlap in the simulated service's ledger; a waiting order's view says where
//!   it stands, and `sas keys` lists the busy customers. (`SAME_KEY_ORDERS=200` runs the
//!   README's case of 200 orders over 20 customers; CI runs 40 over 4.)
//! - The API keeps its OpenAPI document: schemathesis (from PyPI, into `.venv-contract`)
//!   generates requests from it and checks every answer.
//!
//! The function binaries are built for it into `e2e` inside the target directory (a target
//! directory of its own: the one `cargo test` runs from stays locked while tests run). A stack is
//! a dozen processes: the tests here take turns.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Output;
use std::time::{Duration, Instant};

use sas_aws::signing::SigV4;
use sas_engine::memory::SplitMix;
use sas_infra::access::sigv4::{EXECUTE_API, LAMBDA, LOCAL_SECRET_KEY, local_signer};
use sas_infra::emulation::emulator::{python_with, workspace_root};
use sas_infra::emulation::functions::EventSource;
use sas_infra::emulation::local::LocalStack;
use sas_infra::emulation::proxy::{FaultRule, WireFault};
use sas_tests::e2e::{
    FAST_WORKFLOW, SOUND, Setup, put_faults, start_stack, start_stack_within, target_dir,
};
use sas_tests::effects::assert_effects_match;
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// What the contract check runs: the schemathesis release it is written against, and botocore,
/// whose SigV4 signer signs the admin requests (`tests/schemathesis_sigv4.py`).
const CONTRACT_TOOLS: [&str; 2] = ["schemathesis>=4.32,<5", "botocore>=1.34,<2"];

/// This test binary's scratch folder, beside which the function binaries are built.
const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");

/// The access key the tests' client signs orders with.
const CLIENT: &str = "e2e-client";

/// One stack at a time.
static TURN: Mutex<()> = Mutex::const_new(());

/// A stack on the shared moto server with the fast workflow, the simulated services' faults,
/// and policies scaled down from minutes to seconds (`failure_threshold` expired leases of a
/// step before its order is compensated).
async fn start(name: &str, faults: &str, failure_threshold: u32) -> LocalStack {
    start_with(name, faults, failure_threshold, &[]).await
}

/// As [`start`], with more template parameters.
async fn start_with(
    name: &str,
    faults: &str,
    failure_threshold: u32,
    parameters: &[(&str, &str)],
) -> LocalStack {
    start_stack(TARGET_TMPDIR.as_ref(), name, faults, failure_threshold, parameters).await
}

fn seed() -> u64 {
    std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20_261_121)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_finish_while_function_processes_are_killed() {
    let _turn = TURN.lock().await;
    let stack = start("e2e-kills", SOUND, 5).await;
    let http = reqwest::Client::new();

    // Kill a random function process (never the simulated remote service, which stands for
    // the outside world) every few hundred milliseconds while orders flow.
    let random = SplitMix::seeded(seed());
    let mut ids = Vec::new();
    let mut kills = 0;
    for i in 0..24 {
        let submitted = submit(&http, &stack.api_url, &format!("e2e-order-{i}")).await;
        ids.push(submitted);
        if i % 2 == 0 && stack.kill_random(&random).is_some() {
            kills += 1;
        }
        tokio::time::sleep(Duration::from_millis((random.unit() * 400.0) as u64)).await;
    }
    assert!(kills >= 10);

    let states = wait_for(&http, &stack, &ids, &["Processed", "Error"], 180).await;
    let unfinished: Vec<_> =
        states.iter().filter(|(_, s)| *s != "Processed" && *s != "Error").collect();
    assert!(unfinished.is_empty(), "orders not terminal after the kills: {unfinished:?}");

    let ledger = ledger(&http, &stack).await;
    assert_eq!(ledger["max_applications"], 1, "a remote effect was applied twice");
    assert_effects_match(&ledger, &FAST_WORKFLOW, &states);
    println!("{kills} kills, {} restarts, states: {:?}", stack.restarts(), count(&states));
}

/// Stopping the stack while orders are in flight, as `local-stack up` stops on Ctrl-C: every
/// function is going away at once, pollers and handlers mid-call, and none of them may panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_stopped_under_load_leaves_no_function_panicking() {
    let _turn = TURN.lock().await;
    let stack = start("e2e-stop", SOUND, 5).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&http, &stack.api_url, &format!("stop-{i}")).await);
    }
    // Orders at every stage, and more arriving, when the stack stops.
    let api = stack.api_url.clone();
    let more = tokio::spawn(async move {
        let http = reqwest::Client::new();
        for i in 0..200 {
            let request = http
                .post(format!("{api}/orders"))
                .header("content-type", "application/json")
                .header("idempotency-key", format!("stop-late-{i}"))
                .body(ORDER);
            let _ = signer(EXECUTE_API).send(&http, request).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let panics = stack.panics.clone();
    assert!(panics.seen().is_empty(), "panicked while running: {:?}", panics.seen());
    drop(stack);
    // What the processes printed as they went down.
    tokio::time::sleep(Duration::from_secs(3)).await;
    more.abort();
    assert!(panics.seen().is_empty(), "panicked while stopping: {:?}", panics.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_held_by_a_long_outage_wait_for_it_and_the_cli_shows_and_steers_the_hold() {
    let _turn = TURN.lock().await;
    // The payment service answers every charge with 503 until the outage is over.
    let outage =
        r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"transient_rate":1.0}}}"#;
    // Budgets of 5 s rather than 2: a hold spares a lease however short, but on a busy machine
    // a 2 s budget can run out between the scheduler and the agent, which is not what this
    // test is about.
    let workflow = sas_infra::demo::with_budgets(sas_workflows::order_fulfilment(), 5);
    let setup = Setup { workflow: &workflow, ..Setup::default() };
    let stack = start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-held", outage, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(submit(&http, &stack.api_url, &format!("e2e-outage-{i}")).await);
    }

    // Requests signed with another secret key are refused, as API Gateway refuses them.
    let forged = sas_with_secret(&stack, "not-the-key", &["services"]);
    assert!(!forged.status.success() && text(&forged).contains("403"), "{}", text(&forged));

    // The agent holds the service's charges: the orders wait for them, with nothing undone,
    // where the leases of the orders would otherwise have run out (the failure threshold is 2).
    let payment = |stack: &LocalStack| {
        let listed = sas(stack, &["services", "-o", "json"]);
        assert!(listed.status.success(), "{}", text(&listed));
        let page: Value = serde_json::from_slice(&listed.stdout).unwrap();
        let services = page["services"].as_array().unwrap().clone();
        services.into_iter().find(|s| s["service"] == "payment").unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let service = payment(&stack);
        if service["state"] == "actions_held" && service["waiting"] == 6 {
            let hold = &service["holds"][0];
            assert_eq!(
                (&hold["action"], &hold["probing"]),
                (&json!("charge-payment"), &json!(true))
            );
            break;
        }
        assert!(Instant::now() < deadline, "the orders never all waited: {service}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let states = wait_for(&http, &stack, &ids, &["Pending"], 10).await;
    assert!(states.values().all(|s| s == "Pending"), "while held: {states:?}");
    let ledger_now = ledger(&http, &stack).await;
    for id in &ids {
        assert_eq!(effects(&ledger_now, id), ["reserve-inventory"], "nothing undone");
    }
    let table = sas(&stack, &["services"]);
    println!("{}", text(&table));
    assert!(text(&table).contains("payment/charge-payment  held, probing"), "{}", text(&table));

    // An operator takes the hold over for a maintenance window: no probe goes, so the orders
    // wait even once the service answers again, until the operator releases it.
    let held = sas(&stack, &["hold", "payment", "--reason", "provider maintenance"]);
    assert!(held.status.success(), "{}", text(&held));
    let service = payment(&stack);
    let whole = &service["holds"][0];
    assert_eq!(service["state"], "held", "{service}");
    assert_eq!(whole["held_by"], "arn:aws:iam::123456789012:user/ops-e2e", "{service}");
    assert_eq!(
        (whole["action"].clone(), whole["probing"].clone(), whole["reason"].clone()),
        (Value::Null, json!(false), json!("provider maintenance"))
    );
    put_faults(&http, &stack, SOUND).await;
    // Several sweeps (one a second here) pass, and nothing moves.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let states = wait_for(&http, &stack, &ids, &["Pending"], 1).await;
    assert!(states.values().all(|s| s == "Pending"), "held by the operator: {states:?}");

    let released = sas(&stack, &["release", "payment", "--reason", "maintenance over"]);
    println!("{}", text(&released));
    assert!(released.status.success(), "{}", text(&released));
    let again = sas(&stack, &["release", "payment", "--reason", "twice"]);
    assert!(
        !again.status.success() && text(&again).contains("no hold to release"),
        "{}",
        text(&again)
    );

    let states = wait_for(&http, &stack, &ids, &["Processed", "Error", "Cancelled"], 120).await;
    assert!(states.values().all(|s| s == "Processed"), "after the release: {states:?}");
    let ledger = ledger(&http, &stack).await;
    assert_eq!(ledger["max_applications"], 1, "a remote effect was applied twice");
    assert_effects_match(&ledger, &workflow, &states);
    for id in &ids {
        // The same keys throughout: charged once, after the wait, and nothing was undone.
        assert_eq!(effects(&ledger, id), ["reserve-inventory", "charge-payment", "ship"]);
        // Each of the agent's processes counts the faults it meets itself, so a first request
        // may run out of its short budget before its process has seen five and hold the
        // service: one expired lease at most, below the threshold of 2 this stack runs with.
        let view = operator_view(&stack, id);
        assert!(view["failure_count"].as_u64().unwrap() < 2, "{view}");
    }
    let service = payment(&stack);
    assert_eq!((service["state"].clone(), service["waiting"].clone()), (json!("open"), json!(0)));
    for hold in service["holds"].as_array().unwrap() {
        // The whole service released, and the charges' hold with it.
        assert_eq!(hold["released"]["by"], "arn:aws:iam::123456789012:user/ops-e2e", "{service}");
    }
    let left = sas(&stack, &["list", "failed", "-o", "json"]);
    let page: Value = serde_json::from_slice(&left.stdout).unwrap();
    assert_eq!(page["orders"], json!([]), "{page}");
    // Each change reached the operators' alerts queue, once: the agent's hold of the charges,
    // the operator's hold of the service, and its release (which released the charges too).
    let changes = hold_alerts(&stack, 4).await;
    let seen: Vec<(String, String)> = changes
        .iter()
        .map(|d| (d["action"].as_str().unwrap_or("-").to_owned(), d["state"].to_string()))
        .collect();
    let wanted =
        [("charge-payment", "held"), ("-", "held"), ("-", "open"), ("charge-payment", "open")];
    for want in wanted.map(|(on, state)| (on, format!("{state:?}"))) {
        assert!(seen.contains(&(want.0.to_owned(), want.1.to_owned())), "{want:?} in {seen:?}");
    }
}

/// The first `want` alerts about services that reached the alerts queue, as their details.
async fn hold_alerts(stack: &LocalStack, want: usize) -> Vec<Value> {
    let sqs = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.sqs;
    let queue = stack.stack.reference("AlertsQueue").unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = Vec::new();
    while found.len() < want {
        assert!(Instant::now() < deadline, "only {found:?} of {want} reached the alerts queue");
        let received = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in received.messages() {
            let event: Value = serde_json::from_str(m.body().unwrap()).unwrap();
            if event["detail-type"] == "ServiceHoldChanged" {
                found.push(event["detail"].clone());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_cancelled_while_its_payment_is_in_flight_ends_cancelled_with_it_undone() {
    let _turn = TURN.lock().await;
    // The payment service holds every charge open, its effect in place, for as long as this
    // file exists; the charge's budget is long enough that the answer, not the supervisor,
    // ends the step.
    let (hold, held, faults) = holding_charges("hold-charge");
    let mut workflow: Value = serde_json::from_str(&FAST_WORKFLOW).unwrap();
    assert_eq!(workflow["steps"][1]["name"], "charge-payment");
    workflow["steps"][1]["budget_seconds"] = json!(60);
    let workflow = workflow.to_string();
    let setup = Setup { workflow: &workflow, ..Setup::default() };
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-cancel", &faults, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let id = submit(&http, &stack.api_url, "e2e-cancel-1").await;

    // The charge is on the wire: the service has it and has not answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held.exists() {
        assert!(Instant::now() < deadline, "the charge never reached the service");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = sas(&stack, &["cancel", &id, "--reason", "customer called"]);
    println!("{}", text(&cancelled));
    assert!(cancelled.status.success(), "{}", text(&cancelled));
    // The cancel is recorded, waiting for the step in flight.
    let view = operator_view(&stack, &id);
    assert_eq!(view["process_state"], "Processing", "{view}");
    assert_eq!(view["stop"]["command"], "cancel", "the cancel is not waiting: {view}");
    assert!(held.exists(), "the charge answered before the cancel was seen waiting");
    std::fs::remove_file(&hold).unwrap();

    let states = wait_for(
        &http,
        &stack,
        std::slice::from_ref(&id),
        &["Processed", "Error", "Cancelled"],
        60,
    )
    .await;
    assert_eq!(states[&id], "Cancelled");
    let ledger = ledger(&http, &stack).await;
    assert_effects_match(&ledger, &workflow, &states);
    // The charge took effect, its answer came back to a cancel waiting for it, and it was
    // refunded before the reservation was released; nothing shipped.
    assert_eq!(
        effects(&ledger, &id),
        ["reserve-inventory", "charge-payment", "refund-payment", "release-inventory"]
    );
    let view = operator_view(&stack, &id);
    let timeline = view["timeline"].as_array().unwrap();
    assert!(
        !timeline.iter().any(|e| e["what"] == "lease_expired"),
        "the charge's lease ran out instead of its answer ending it: {view}"
    );
    assert_eq!(view["alert"], Value::Null, "a cancelled order raises no alert: {view}");
    assert_eq!(view["needs_manual_undo"], json!([]), "{view}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_sampled_away_is_traced_from_its_first_fault_and_a_sound_one_not_at_all() {
    let _turn = TURN.lock().await;
    // No order is sampled at its start; every charge is refused, so every order is undone.
    let refusing =
        r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"permanent_rate":1.0}}}"#;
    let stack = start_with("e2e-traces", refusing, 2, &[("TraceSamplePercent", "0")]).await;
    let http = reqwest::Client::new();
    let id = submit(&http, &stack.api_url, "e2e-traces-1").await;
    let states =
        wait_for(&http, &stack, std::slice::from_ref(&id), &["Processed", "Error"], 60).await;
    assert_eq!(states[&id], "Error");
    let view = operator_view(&stack, &id);
    let trace = view["correlation_id"].as_str().unwrap().to_owned();

    // The trace begins at the refused charge: the payment agent's hop (its parent, the
    // scheduler's dispatch before any fault, was not kept). The reply, the release and its
    // reply follow, each a child of the one before.
    let segments = stack.traces.segments(std::slice::from_ref(&trace)).await.unwrap();
    let hops: Vec<(&str, &str, &str)> = segments
        .iter()
        .map(|s| {
            let note = |k: &str| s.annotations.get(k).map_or("", String::as_str);
            (s.name.as_str(), note("message"), note("step"))
        })
        .collect();
    assert!(segments.iter().all(|s| s.trace_id == trace && s.order_id() == Some(id.as_str())));
    assert_eq!(
        hops,
        [
            ("paymentAgentFunction", "request", "charge-payment"),
            ("SchedulerFunction", "reply", "charge-payment"),
            ("inventoryAgentFunction", "request", "reserve-inventory"),
            ("SchedulerFunction", "reply", "reserve-inventory"),
        ],
        "{segments:#?}"
    );
    for pair in segments.windows(2) {
        assert_eq!(pair[1].parent_id.as_ref(), Some(&pair[0].id), "{segments:#?}");
    }

    // Once the payment service takes charges again, an order that goes well is not traced.
    put_faults(&http, &stack, SOUND).await;
    let sound = submit(&http, &stack.api_url, "e2e-traces-2").await;
    let states =
        wait_for(&http, &stack, std::slice::from_ref(&sound), &["Processed", "Error"], 60).await;
    assert_eq!(states[&sound], "Processed");
    let trace = operator_view(&stack, &sound)["correlation_id"].as_str().unwrap().to_owned();
    let segments = stack.traces.segments(&[trace]).await.unwrap();
    assert!(segments.is_empty(), "{segments:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_fails_when_the_service_applies_a_repeated_key_again() {
    let _turn = TURN.lock().await;
    // Lost answers make the agents call again with the same key, and this service forgets its
    // keys: the orders all go through, but the business holds some steps twice.
    let forgetful = r#"{"default":{"lost_answer_rate":0.3,"forget_keys":true,"latency_ms":20}}"#;
    let stack = start("e2e-forgetful", forgetful, 2).await;
    let summary =
        sas_infra::demo::run(&stack, 10, None, Duration::from_secs(120), None).await.unwrap();
    println!("{}", summary.text);
    assert_eq!(summary.processed, 10, "{}", summary.text);
    assert!(!summary.passed(), "the demo passed with steps in place twice");
    assert!(
        summary.effects_wrong.iter().any(|w| w.contains(" in place 2 times")),
        "{:?}",
        summary.effects_wrong
    );
}

/// An order's body, and another one.
const ORDER: &str = r#"{"customer_id":"c-1","currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price":1250}],
    "ship_to":{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}"#;
const OTHER_ORDER: &str = r#"{"customer_id":"c-2","currency":"EUR","items":[{"sku":"BOOK-2","quantity":3,"unit_price":990}],
    "ship_to":{"name":"Bo","line1":"2 Side St","city":"Lyon","postal_code":"69001","country":"FR"}}"#;

/// How a test request authenticates.
enum Auth<'a> {
    Unsigned,
    /// Signed as this caller, with the right secret key, now.
    As(&'a str),
    /// Signed as this caller with another secret key.
    WrongKey(&'a str),
    /// Signed as this caller ten minutes ago.
    Stale(&'a str),
    /// `Authorization: Bearer` and this token.
    Token(String),
}

/// Sends a request to the stack's API as `auth` says; returns the status and the JSON body.
async fn call(
    http: &reqwest::Client,
    stack: &LocalStack,
    auth: &Auth<'_>,
    method: &str,
    path: &str,
    key_and_body: Option<(&str, &str)>,
) -> (u16, Value) {
    let url = format!("{}{path}", stack.api_url);
    let mut builder = match method {
        "POST" => http.post(url),
        _ => http.get(url),
    };
    if let Some((key, body)) = key_and_body {
        builder = builder
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned());
    }
    if let Auth::Token(token) = auth {
        builder = builder.bearer_auth(token);
    }
    let mut request = builder.build().unwrap();
    let signed = |caller: &str, secret: &str| {
        let credentials =
            aws_credential_types::Credentials::new(caller, secret, None, None, "test");
        SigV4::new(
            aws_credential_types::provider::SharedCredentialsProvider::new(credentials),
            "us-east-1",
            EXECUTE_API,
        )
    };
    match auth {
        Auth::Unsigned | Auth::Token(_) => {}
        Auth::As(caller) => signed(caller, LOCAL_SECRET_KEY).sign(&mut request).await.unwrap(),
        Auth::WrongKey(caller) => signed(caller, "not-the-key").sign(&mut request).await.unwrap(),
        Auth::Stale(caller) => {
            let then = std::time::SystemTime::now() - Duration::from_secs(600);
            signed(caller, LOCAL_SECRET_KEY).sign_at(&mut request, then).await.unwrap();
        }
    }
    let response = http.execute(request).await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Posts an order over a plain TCP connection with `key` as its bytes, which no HTTP client
/// library would send; returns the status and the JSON body.
async fn post_raw(stack: &LocalStack, key: &[u8], body: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = stack.api_url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let head = format!(
        "POST /orders HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nidempotency-key: ",
        body.len()
    );
    let request = [head.as_bytes(), key, b"\r\n\r\n", body.as_bytes()].concat();
    stream.write_all(&request).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Orders stored so far, read from the emulator.
async fn orders_stored(stack: &LocalStack) -> i32 {
    let clients = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await;
    let table = stack.stack.reference("StateTable").unwrap();
    let scan = clients.dynamodb.scan().table_name(table).consistent_read(true).send().await;
    scan.unwrap().count()
}

/// One refused case: its status, and nothing stored.
async fn refused(
    http: &reqwest::Client,
    stack: &LocalStack,
    case: &str,
    auth: &Auth<'_>,
    status: u16,
) {
    let before = orders_stored(stack).await;
    let (got, body) = call(http, stack, auth, "POST", "/orders", Some((case, ORDER))).await;
    assert_eq!(got, status, "{case}: {body}");
    assert_eq!(orders_stored(stack).await, before, "{case}: a refused request wrote an order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_lets_in_only_whom_it_should_in_each_auth_mode() {
    let _turn = TURN.lock().await;
    let http = reqwest::Client::new();

    // AWS_IAM, the default.
    let stack = start("e2e-auth-iam", SOUND, 5).await;
    refused(&http, &stack, "unsigned", &Auth::Unsigned, 403).await;
    refused(&http, &stack, "wrong-signature", &Auth::WrongKey("ada"), 403).await;
    refused(&http, &stack, "expired-signature", &Auth::Stale("ada"), 403).await;
    // Header values reach the function as API Gateway passes them, so that its own validation
    // answers; a value HTTP does not allow is refused by the gateway, which says why.
    let before = orders_stored(&stack).await;
    let (status, answer) =
        call(&http, &stack, &Auth::As("ada"), "POST", "/orders", Some(("clé", ORDER))).await;
    let code = answer["error"]["code"].as_str();
    assert_eq!((status, code), (400, Some("invalid_idempotency_key")), "{answer}");
    let (status, answer) = post_raw(&stack, b"k\x01", ORDER).await;
    assert_eq!(status, 400, "{answer}");
    let reason = answer["message"].as_str().unwrap_or_default();
    assert!(reason.contains("idempotency-key") && reason.contains("control"), "{answer}");
    assert_eq!(orders_stored(&stack).await, before, "a refused key wrote an order");
    let (status, mine) =
        call(&http, &stack, &Auth::As("ada"), "POST", "/orders", Some(("k-1", ORDER))).await;
    assert_eq!(status, 202, "{mine}");
    let id = mine["order_id"].as_str().unwrap().to_owned();
    let path = format!("/orders/{id}");
    let (status, view) = call(&http, &stack, &Auth::As("ada"), "GET", &path, None).await;
    assert_eq!((status, view["order_id"].as_str()), (200, Some(id.as_str())), "{view}");
    let (status, _) = call(&http, &stack, &Auth::Unsigned, "GET", &path, None).await;
    assert_eq!(status, 403, "an unsigned read");
    let (status, theirs) = call(&http, &stack, &Auth::As("bob"), "GET", &path, None).await;
    assert_eq!(status, 404, "another caller reads nothing of ada's order: {theirs}");
    let unknown = "/orders/00000000-0000-5000-8000-000000000000";
    let (_, never) = call(&http, &stack, &Auth::As("bob"), "GET", unknown, None).await;
    assert_eq!(theirs, never, "someone else's order answers exactly as an unknown id");
    // Keys are each caller's own: bob's k-1 is an order of bob's, even with another body,
    // and ada's k-1 with another body is a conflict only for ada.
    let stored = orders_stored(&stack).await;
    let (status, bobs) =
        call(&http, &stack, &Auth::As("bob"), "POST", "/orders", Some(("k-1", OTHER_ORDER))).await;
    assert_eq!((status, &bobs["created"]), (202, &json!(true)), "{bobs}");
    assert_ne!(bobs["order_id"], mine["order_id"]);
    assert_eq!(orders_stored(&stack).await, stored + 1);
    let before = orders_stored(&stack).await;
    let (status, conflict) =
        call(&http, &stack, &Auth::As("ada"), "POST", "/orders", Some(("k-1", OTHER_ORDER))).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(orders_stored(&stack).await, before, "a conflict writes nothing");
    let view = operator_view(&stack, &id);
    assert_eq!(view["owner"], format!("arn:aws:iam::123456789012:user/ada"), "{view}");
    // Each signed caller holds a policy, as on AWS: clients hold ClientPolicy, which has no
    // admin route, and operators (`ops*` keys) OperatorPolicy, which has no order route.
    let admin = format!("/admin/orders/{id}");
    let (status, _) = call(&http, &stack, &Auth::As("bob"), "GET", &admin, None).await;
    assert_eq!(status, 403, "a client reads no order through the operators' routes");
    let cancel = format!("{admin}/cancel");
    let (status, _) =
        call(&http, &stack, &Auth::As("bob"), "POST", &cancel, Some(("c-1", r#"{"reason":"x"}"#)))
            .await;
    assert_eq!(status, 403, "a client commands nothing");
    assert_eq!(operator_view(&stack, &id)["commands"], view["commands"], "the order is as it was");
    let (status, shown) = call(&http, &stack, &Auth::As("ops-carol"), "GET", &admin, None).await;
    assert_eq!((status, shown["order_id"].as_str()), (200, Some(id.as_str())), "{shown}");
    refused(&http, &stack, "operator-submits", &Auth::As("ops-carol"), 403).await;
    drop(stack);

    // JWT, against the local issuer.
    let issuer = "https://issuer.example";
    let jwt = [("ApiAuth", "JWT"), ("JwtIssuer", issuer), ("JwtAudience", "orders")];
    let stack = start_with("e2e-auth-jwt", SOUND, 5, &jwt).await;
    let now = chrono::Utc::now();
    let token = |iss: &str, aud: &str, sub: &str, ttl: i64| {
        sas_infra::access::jwt::mint(&sas_infra::access::jwt::claims(
            iss,
            aud,
            sub,
            now,
            chrono::Duration::seconds(ttl),
        ))
    };
    refused(&http, &stack, "no-token", &Auth::Unsigned, 401).await;
    let wrong_audience = Auth::Token(token(issuer, "elsewhere", "ada", 300));
    refused(&http, &stack, "wrong-audience", &wrong_audience, 401).await;
    let wrong_issuer = Auth::Token(token("https://other.example", "orders", "ada", 300));
    refused(&http, &stack, "wrong-issuer", &wrong_issuer, 401).await;
    refused(&http, &stack, "expired-token", &Auth::Token(token(issuer, "orders", "ada", -60)), 401)
        .await;
    refused(&http, &stack, "signed-not-token", &Auth::As("ada"), 401).await;
    let ada = Auth::Token(token(issuer, "orders", "ada", 300));
    let (status, mine) = call(&http, &stack, &ada, "POST", "/orders", Some(("k-1", ORDER))).await;
    assert_eq!(status, 202, "{mine}");
    let path = format!("/orders/{}", mine["order_id"].as_str().unwrap());
    assert_eq!(call(&http, &stack, &ada, "GET", &path, None).await.0, 200);
    let bob = Auth::Token(token(issuer, "orders", "bob", 300));
    assert_eq!(call(&http, &stack, &bob, "GET", &path, None).await.0, 404);
    let view = operator_view(&stack, mine["order_id"].as_str().unwrap());
    assert_eq!(view["owner"], format!("jwt:{issuer}#ada"), "{view}");
    // Answers to steps take the same tokens: without one the gateway refuses; with one the
    // function judges the answer (this workflow's shipping waits for no answer).
    let answer = format!("{path}/steps/ship/complete");
    let body = Some(("-", r#"{"token":"0123456789abcdef"}"#));
    assert_eq!(call(&http, &stack, &Auth::Unsigned, "POST", &answer, body).await.0, 401);
    let (status, judged) = call(&http, &stack, &bob, "POST", &answer, body).await;
    assert_eq!((status, judged["error"]["code"].as_str()), (409, Some("no_callback")), "{judged}");
    // The load tool carries a token instead of a signature.
    let jwt = token(issuer, "orders", "loader", 300);
    let args = ["--rate", "2", "--duration", "2s", "--input", ORDER];
    let (code, report) = sas_load(&stack, &[("SAS_JWT", &jwt)], &args);
    assert_eq!((code, &report["ended"]), (Some(0), &json!({"Processed": 4})), "{report:#}");
    drop(stack);

    // NONE, chosen explicitly: everyone is the same anonymous caller.
    let stack = start_with("e2e-auth-none", SOUND, 5, &[("ApiAuth", "NONE")]).await;
    let (status, anyone) =
        call(&http, &stack, &Auth::Unsigned, "POST", "/orders", Some(("k-1", ORDER))).await;
    assert_eq!(status, 202, "{anyone}");
    let path = format!("/orders/{}", anyone["order_id"].as_str().unwrap());
    assert_eq!(call(&http, &stack, &Auth::Unsigned, "GET", &path, None).await.0, 200);
    // The admin API stays behind IAM whatever the order routes take.
    let (status, _) = call(&http, &stack, &Auth::Unsigned, "GET", "/admin/orders", None).await;
    assert_eq!(status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_keeps_its_openapi_contract() {
    let python = tokio::task::spawn_blocking(|| {
        python_with(".venv-contract", &CONTRACT_TOOLS, "schemathesis, botocore")
    })
    .await
    .unwrap()
    .unwrap();
    let _turn = TURN.lock().await;
    let stack = start("e2e-contract", SOUND, 5).await;
    let root = workspace_root();
    let mut command = std::process::Command::new(python);
    command
        // Hypothesis keeps a folder of its own in the working directory.
        .current_dir(env!("CARGO_TARGET_TMPDIR"))
        .args(["-m", "schemathesis.cli", "--no-color", "--config-file"])
        .arg(root.join("tests/schemathesis.toml"))
        .arg("run")
        .arg(root.join("infra/openapi.yaml"))
        .args(["--url", &stack.api_url, "--max-examples", "40", "--seed", &seed().to_string()])
        // Every request asks to be signed, and the hook signs it as the caller `ops-contract`
        // (the local gateway checks the signature on the admin routes).
        .args(["--header", "Authorization: SigV4"])
        .env("SCHEMATHESIS_HOOKS", root.join("tests/schemathesis_sigv4.py"))
        .env("SIGV4_ACCESS_KEY_ID", "contract-client")
        .env("SIGV4_OPERATOR_ACCESS_KEY_ID", "ops-contract")
        .env("SIGV4_ANSWERER_ACCESS_KEY_ID", "answerer-contract")
        .env("SIGV4_SECRET_ACCESS_KEY", LOCAL_SECRET_KEY)
        .env("SIGV4_REGION", "us-east-1");
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().unwrap();
    println!("{}", text(&output));
    assert!(output.status.success(), "the API does not keep its OpenAPI document");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dead_letter_is_reported_as_it_arrives_with_its_order_and_reason() {
    let _turn = TURN.lock().await;
    let stack = start("e2e-dead-letters", SOUND, 5).await;
    let sqs = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.sqs;
    let queue = stack.stack.reference("SchedulerQueue").unwrap();
    // Redelivery in a second instead of the template's minute: five failed receives, quickly.
    sqs.set_queue_attributes()
        .queue_url(&queue)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout, "1")
        .send()
        .await
        .unwrap();
    // A receive already waiting (long polls last 20 s) hides what it gets for the old minute.
    tokio::time::sleep(Duration::from_secs(21)).await;
    let order = "6c1f0c5e-4b7a-4a39-8a8e-0f5d2e1b9c3a";
    let poison = [
        "not a message".to_owned(),
        json!({"v": 1, "type": "start", "order_id": order, "attempt": -1, "correlation_id": "c"})
            .to_string(),
    ];
    for body in &poison {
        sqs.send_message().queue_url(&queue).message_body(body).send().await.unwrap();
    }
    let started = Instant::now();
    while stack.dead_letters.arrivals().len() < 2 && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let arrivals = stack.dead_letters.arrivals();
    assert_eq!(arrivals.len(), 2, "{arrivals:#?}");
    for a in &arrivals {
        assert_eq!(
            (a.queue.as_str(), a.dead_letter_queue.as_str()),
            ("SchedulerQueue", "SchedulerDeadLetterQueue")
        );
        assert_eq!(a.receives, Some(5), "{a}");
        assert!(a.reason.contains("cannot be handled"), "the scheduler's own reason: {a}");
    }
    let with_order: Vec<_> = arrivals.iter().filter_map(|a| a.order_id.as_deref()).collect();
    assert_eq!(with_order, [order], "the order a readable body names");
    assert!(arrivals.iter().any(|a| a.kind.as_deref() == Some("start")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttling_delays_orders_and_dead_letters_none() {
    let _turn = TURN.lock().await;
    // Three concurrent executions for nine functions of two processes each.
    let quota = Setup { quota: Some(3), ..Setup::default() };
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-throttled", SOUND, 5, &[], quota).await;
    let http = reqwest::Client::new();
    let sqs = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.sqs;
    // Redelivery every 2 s instead of the template's minute: five receives, and what would be
    // the dead-letter queue's, within seconds.
    const VISIBILITY_SECONDS: u64 = 2;
    for queue in ["SchedulerQueue", "ReplyQueue"] {
        sqs.set_queue_attributes()
            .queue_url(stack.stack.reference(queue).unwrap())
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
                VISIBILITY_SECONDS.to_string(),
            )
            .send()
            .await
            .unwrap();
    }
    // A receive already waiting (long polls last 20 s) hides what it gets for the old minute.
    tokio::time::sleep(Duration::from_secs(21)).await;

    // DynamoDB throttles every write of the scheduler (an index partition, a table still
    // ramping up), past anything the SDK's retries absorb, for three times as long as the
    // queues' five receives take.
    let throttled_for = Duration::from_secs(3 * 5 * VISIBILITY_SECONDS);
    stack.proxy.faults.set(vec![FaultRule {
        caller: Some("SchedulerFunction".into()),
        ..FaultRule::new("dynamodb", Some("PutItem on StateTable"), WireFault::Throttle)
    }]);
    let began = Instant::now();
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(submit(&http, &stack.api_url, &format!("e2e-throttled-{i}")).await);
    }
    tokio::time::sleep(throttled_for.saturating_sub(began.elapsed())).await;
    let refused = stack.proxy.faults.hits();
    stack.proxy.faults.clear();
    // Then, while the orders catch up, other functions of the account take two of its three
    // executions for a while: the queues' pollers are throttled. They take them as soon as
    // the invocations in flight let them, while the backlog is still there.
    let others =
        tokio::time::timeout(Duration::from_secs(10), stack.account.as_ref().unwrap().occupy(2))
            .await
            .expect("two of the account's executions were not free within 10 s");
    tokio::time::sleep(Duration::from_secs(15)).await;
    drop(others);

    let states = wait_for(&http, &stack, &ids, &["Processed"], 240).await;
    let arrivals = stack.dead_letters.arrivals();
    assert!(arrivals.is_empty(), "throttling dead-lettered messages: {arrivals:#?}");
    assert!(states.values().all(|s| s == "Processed"), "{states:?}");
    let polled_throttles: u64 = stack
        .functions
        .iter()
        .filter(|f| f.spec.events.iter().any(|e| matches!(e, EventSource::Sqs { .. })))
        .map(|f| f.api.throttled())
        .sum();
    let lambda_throttles = stack.account.as_ref().unwrap().throttled();
    // What the test claims to show must have happened.
    assert!(refused >= 10, "the scheduler's writes were refused only {refused} times");
    assert!(polled_throttles > 0, "no queue's poller was throttled by the account's quota");
    let ledger = ledger(&http, &stack).await;
    assert_eq!(ledger["max_applications"], 1, "a remote effect was applied twice");
    assert_effects_match(&ledger, &FAST_WORKFLOW, &states);
    println!(
        "{refused} writes throttled; {lambda_throttles} invocations throttled, {polled_throttles} of them by queues' pollers"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sas_load_offers_orders_on_time_and_follows_each_to_its_end() {
    let _turn = TURN.lock().await;
    let stack = start("e2e-load", SOUND, 5).await;
    let (code, report) =
        sas_load(&stack, &[], &["--rate", "5", "--duration", "4s", "--input", ORDER]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!((report["offered"].as_u64(), report["accepted"].as_u64()), (Some(20), Some(20)));
    assert_eq!(report["ended"], json!({"Processed": 20}), "{report:#}");
    assert_eq!(report["unfinished"], 0);
    let latency = &report["latency_ms"]["end_to_end"];
    assert_eq!(latency["count"], 20, "{report:#}");
    assert!(
        latency["p50"].as_u64().unwrap() >= report["latency_ms"]["stack"]["p50"].as_u64().unwrap()
    );
    let seconds = report["by_second"].as_array().unwrap();
    let offered: u64 = seconds.iter().map(|s| s["offered"].as_u64().unwrap()).sum();
    assert_eq!(offered, 20);
    // Offered on time: five in each of the four seconds, however the stack answered.
    assert!(seconds[..4].iter().all(|s| s["offered"] == 5), "{seconds:?}");
    assert!(report["requests"]["posts"].as_u64().unwrap() >= 20);

    // An order the workflow's schema refuses is refused for good, said, and not sent again.
    let bad = r#"{"customer_id":{{i}}}"#;
    let (code, report) =
        sas_load(&stack, &[], &["--rate", "2", "--duration", "1s", "--input", bad]);
    assert_eq!(code, Some(1), "{report:#}");
    assert_eq!(
        (report["accepted"].as_u64(), report["door"]["rejected"].as_u64()),
        (Some(0), Some(2))
    );
    assert!(report["door"]["first_rejection"].as_str().unwrap().starts_with("400"), "{report:#}");
    assert_eq!(report["requests"]["posts"], 2, "a rejected order is not sent again");
}

/// Runs `sas load -o json` against the stack as the client [`CLIENT`], with `env` besides;
/// its exit code and its report.
fn sas_load(stack: &LocalStack, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, Value) {
    let out =
        std::process::Command::new(target_dir(TARGET_TMPDIR.as_ref()).join("debug").join("sas"))
            .args(["-o", "json", "load", "--drain", "60s"])
            .args(args)
            .env("SAS_API_URL", &stack.api_url)
            .env("AWS_ACCESS_KEY_ID", CLIENT)
            .env("AWS_SECRET_ACCESS_KEY", LOCAL_SECRET_KEY)
            .env("AWS_REGION", "us-east-1")
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .envs(env.iter().copied())
            .output()
            .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| json!(text(&out)));
    (out.status.code(), report)
}

/// Runs the `sas` binary against the stack as the caller `ops-e2e`.
fn sas(stack: &LocalStack, args: &[&str]) -> Output {
    sas_with_secret(stack, LOCAL_SECRET_KEY, args)
}

/// Runs `sas` as `ops-e2e`, signing with `secret`.
fn sas_with_secret(stack: &LocalStack, secret: &str, args: &[&str]) -> Output {
    std::process::Command::new(target_dir(TARGET_TMPDIR.as_ref()).join("debug").join("sas"))
        .args(args)
        .env("SAS_API_URL", &stack.api_url)
        .env("AWS_ACCESS_KEY_ID", "ops-e2e")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_SESSION_TOKEN")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The client the tests submit orders as, signing for the HTTP API (`execute-api`) or the
/// simulated service's URL (`lambda`).
fn signer(service: &str) -> SigV4 {
    local_signer(CLIENT, "us-east-1", service)
}

async fn submit(http: &reqwest::Client, api: &str, key: &str) -> String {
    submit_body(http, api, key, ORDER).await
}

async fn submit_body(http: &reqwest::Client, api: &str, key: &str, body: &str) -> String {
    // A killed submission process fails its request; a client retries with the same key.
    for _ in 0..20 {
        let request = http
            .post(format!("{api}/orders"))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned());
        let response = signer(EXECUTE_API).send(http, request).await;
        if let Ok(r) = response {
            if r.status() == 202 {
                let v: Value = r.json().await.unwrap();
                return v["order_id"].as_str().unwrap().to_owned();
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("order {key} was never accepted");
}

/// `GET /orders/{id}`, or null while it cannot be read.
async fn order(http: &reqwest::Client, stack: &LocalStack, id: &str) -> Value {
    let request = http.get(format!("{}/orders/{id}", stack.api_url));
    let response = signer(EXECUTE_API).send(http, request).await;
    match response {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// The order as an operator sees it (`sas show -o json`).
fn operator_view(stack: &LocalStack, id: &str) -> Value {
    let shown = sas(stack, &["show", id, "-o", "json"]);
    assert!(shown.status.success(), "{}", text(&shown));
    serde_json::from_slice(&shown.stdout).unwrap()
}

/// The orders' process states once all are in one of `terminal`, or as they stand after
/// `seconds`.
async fn wait_for(
    http: &reqwest::Client,
    stack: &LocalStack,
    ids: &[String],
    terminal: &[&str],
    seconds: u64,
) -> HashMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut states = HashMap::new();
    loop {
        for id in ids {
            let view = order(http, stack, id).await;
            let state = view["process_state"].as_str().unwrap_or("unknown").to_owned();
            states.insert(id.clone(), state);
        }
        if states.values().all(|s| terminal.contains(&s.as_str())) || Instant::now() > deadline {
            return states;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_of_one_customer_run_one_at_a_time_in_the_order_they_were_accepted() {
    let _turn = TURN.lock().await;
    let orders: usize =
        std::env::var("SAME_KEY_ORDERS").ok().and_then(|n| n.parse().ok()).unwrap_or(40).max(10);
    let customers = orders / 10;
    let mut keyed: Value = serde_json::from_str(&FAST_WORKFLOW).unwrap();
    keyed["concurrency"] = json!({ "key": "/input/customer_id", "limit": 1 });
    let workflow = keyed.to_string();
    let setup = Setup { workflow: &workflow, ..Setup::default() };
    let stack = start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-keys", SOUND, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let started = Instant::now();

    // Each customer's orders sent one after another (within a customer, the order of
    // acceptance is this one), the customers side by side: a customer's orders come in a burst,
    // and all but its first wait in line.
    let sends = (0..customers).map(|c| {
        let (http, api) = (http.clone(), stack.api_url.clone());
        async move {
            let mut ids = Vec::new();
            for n in 0..orders / customers {
                let mut body: Value = serde_json::from_str(ORDER).unwrap();
                body["customer_id"] = json!(format!("c-{c}"));
                let key = format!("same-{c}-{n}");
                ids.push((
                    format!("c-{c}"),
                    submit_body(&http, &api, &key, &body.to_string()).await,
                ));
            }
            ids
        }
    });
    let submitted: Vec<(String, String)> =
        futures_util::future::join_all(sends).await.into_iter().flatten().collect();
    // A customer's last order waits behind its others, and says so (once every order is
    // accepted, at least one customer has orders left in line: each runs ten in a row).
    let mut waiting = None;
    for c in 0..customers {
        let customer = format!("c-{c}");
        let (_, last) = submitted.iter().rev().find(|(of, _)| *of == customer).unwrap();
        let view = order(&http, &stack, last).await;
        if view["process_state"] == "Pending" && view.get("in_line").is_some() {
            waiting = Some((customer, view));
            break;
        }
    }
    let (customer, view) = waiting.expect("every customer's last order had started already");
    let key = format!("order-fulfilment/{customer}");
    let line = &view["in_line"];
    assert_eq!((&line["key"], &line["limit"]), (&json!(key), &json!(1)), "{view}");
    assert!(line["summary"].as_str().unwrap().contains("in line"), "{view}");
    let listed = sas(&stack, &["keys", "-o", "json"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let busy = listed["keys"].as_array().unwrap();
    let entry = busy.iter().find(|k| k["key"] == json!(key)).expect("the customer is busy");
    assert_eq!(entry["running"], 1, "{listed}");

    // Followed by each customer's last order (a customer's orders end in line order), every
    // 2 s and each only until it ended, so that reading states does not load the stack it
    // measures; then every order once.
    let mut lasts: Vec<String> = (0..customers)
        .filter_map(|c| submitted.iter().rev().find(|(of, _)| *of == format!("c-{c}")))
        .map(|(_, id)| id.clone())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(900);
    while !lasts.is_empty() && Instant::now() < deadline {
        let mut left = Vec::new();
        for id in lasts {
            let state = order(&http, &stack, &id).await["process_state"].clone();
            if !["Processed", "Error", "Cancelled"].iter().any(|s| state == *s) {
                left.push(id);
            }
        }
        lasts = left;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ended = started.elapsed();
    let ids: Vec<String> = submitted.iter().map(|(_, id)| id.clone()).collect();
    let states = wait_for(&http, &stack, &ids, &["Processed", "Error", "Cancelled"], 60).await;
    assert_eq!(count(&states).get("Processed"), Some(&orders), "{:?}", count(&states));

    // Each order's effects span [first, last] in the ledger's time; a customer's spans are
    // disjoint and follow the order of acceptance.
    let ledger = ledger(&http, &stack).await;
    let span = |id: &str| -> (f64, f64) {
        let times: Vec<f64> = ledger["effects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["order_id"] == id)
            .map(|e| e["at_s"].as_f64().unwrap())
            .collect();
        assert!(!times.is_empty(), "order {id} has no effect in the ledger");
        (times.iter().copied().fold(f64::MAX, f64::min), times.iter().copied().fold(0.0, f64::max))
    };
    let mut gaps = Vec::new();
    for c in 0..customers {
        let customer = format!("c-{c}");
        let spans: Vec<(f64, f64)> =
            submitted.iter().filter(|(of, _)| *of == customer).map(|(_, id)| span(id)).collect();
        for pair in spans.windows(2) {
            assert!(
                pair[1].0 > pair[0].1,
                "{customer}: an order started at {:.3} s, before the one accepted before it ended at {:.3} s",
                pair[1].0,
                pair[0].1
            );
            gaps.push(pair[1].0 - pair[0].1);
        }
        if std::env::var_os("SAME_KEY_TIMELINES").is_some() {
            for (_, id) in submitted.iter().filter(|(of, _)| *of == customer) {
                let view = order(&http, &stack, id).await;
                let (first, last) = span(id);
                println!("{customer} {id} effects {first:.3}..{last:.3}");
                for e in view["timeline"].as_array().unwrap() {
                    println!("    {} {}", e["at"], e["what"]);
                }
            }
        }
    }
    gaps.sort_by(f64::total_cmp);
    // The keys' table is read and written under the functions' own grants.
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
    println!(
        "same key: {orders} orders over {customers} customers at limit 1, sent in a burst per \
         customer, all Processed in {:.0} s; no two orders of a customer overlapped in the \
         ledger: each began after the one accepted before it ended, {:.0} ms after it at the \
         median ({:.0} ms at least, {:.0} ms at most)",
        ended.as_secs_f64(),
        gaps[gaps.len() / 2] * 1000.0,
        gaps[0] * 1000.0,
        gaps[gaps.len() - 1] * 1000.0
    );
}

async fn ledger(http: &reqwest::Client, stack: &LocalStack) -> Value {
    let remote = stack.stack.attribute("RemoteSimFunctionUrl", "FunctionUrl").unwrap();
    let request = http.get(format!("{remote}ledger"));
    signer(LAMBDA).send(http, request).await.unwrap().json().await.unwrap()
}

/// The actions the service applied for one order, in the order it applied them (an undo of
/// a step that never took effect changes nothing, and is left out).
fn effects(ledger: &Value, order_id: &str) -> Vec<String> {
    ledger["effects"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["order_id"] == order_id && e["output"]["noop"] != true)
        .map(|e| e["action"].as_str().unwrap().to_owned())
        .collect()
}

fn count(states: &HashMap<String, String>) -> HashMap<&str, usize> {
    let mut c = HashMap::new();
    for s in states.values() {
        *c.entry(s.as_str()).or_default() += 1;
    }
    c
}

/// An account-opening order's input.
fn account(name: &str, deposit: u64) -> String {
    json!({
        "customer": {"name": name, "email": format!("{}@example.com", name.to_lowercase())},
        "plan": "basic",
        "initial_deposit": deposit
    })
    .to_string()
}

/// Submits `body` to `workflow` (none: the default), signed as the client; the status and body.
async fn submit_to(
    http: &reqwest::Client,
    stack: &LocalStack,
    workflow: Option<&str>,
    key: &str,
    body: &str,
) -> (u16, Value) {
    let query = workflow.map(|w| format!("?workflow={w}")).unwrap_or_default();
    for _ in 0..20 {
        let request = http
            .post(format!("{}/orders{query}", stack.api_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(body.to_owned());
        if let Ok(r) = signer(EXECUTE_API).send(http, request).await {
            // The first requests may meet functions still starting, or throttled (API
            // Gateway's 500): a client sends the same key again.
            if !matches!(r.status().as_u16(), 500 | 502 | 503) {
                let status = r.status().as_u16();
                return (status, r.json().await.unwrap_or(Value::Null));
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("order {key} was never answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_inputs_and_outputs_are_kept_in_the_bucket_and_reach_every_step_whole() {
    let _turn = TURN.lock().await;
    // The payment service answers every charge with a 100 kB document.
    let faults = r#"{"default":{},"actions":{"charge-payment":{"output_bytes":100000}}}"#;
    let stack = start("e2e-large", faults, 2).await;
    let http = reqwest::Client::new();
    // An order of fifty lines, each with a long SKU: larger than a request carries.
    let lines: Vec<String> = (0..50)
        .map(|n| format!(r#"{{"sku":"SKU-{n}-{}","quantity":1,"unit_price":100}}"#, "X".repeat(50)))
        .collect();
    let mut input: Value = serde_json::from_str(ORDER).unwrap();
    input["items"] = serde_json::from_str(&format!("[{}]", lines.join(","))).unwrap();
    let body = serde_json::to_string_pretty(&input).unwrap();
    let input_bytes = serde_json::to_vec(&input).unwrap().len() as u64;
    assert!(input_bytes > 4096, "{input_bytes}");

    let shipped = submit_body(&http, &stack.api_url, "e2e-large-1", &body).await;
    let terminal = ["Processed", "Error", "Cancelled"];
    let states = wait_for(&http, &stack, std::slice::from_ref(&shipped), &terminal, 60).await;
    assert_eq!(states[&shipped], "Processed");
    // Shipping is refused from now on: the next order is undone.
    let refusing = r#"{"default":{},"actions":{"charge-payment":{"output_bytes":100000},"ship":{"permanent_rate":1.0}}}"#;
    put_faults(&http, &stack, refusing).await;
    let undone = submit_body(&http, &stack.api_url, "e2e-large-2", &body).await;
    let states = wait_for(&http, &stack, std::slice::from_ref(&undone), &terminal, 60).await;
    assert_eq!(states[&undone], "Error");

    let ledger = ledger(&http, &stack).await;
    let effects = ledger["effects"].as_array().unwrap();
    let effect = |order: &str, action: &str| {
        effects
            .iter()
            .find(|e| e["order_id"] == order && e["action"] == action)
            .unwrap_or_else(|| panic!("no {action} of {order}"))
    };
    // Every call carried the whole input, whatever the record keeps.
    for e in effects.iter().filter(|e| e["order_id"] == shipped || e["order_id"] == undone) {
        assert_eq!(e["order_bytes"], json!(input_bytes), "{}", e["key"]);
    }
    // Shipping got the charge's whole answer; the refund was told it whole.
    let charged = effect(&shipped, "charge-payment")["output"].clone();
    let charge_bytes = serde_json::to_vec(&charged).unwrap().len() as u64;
    assert!(charge_bytes > 100_000, "{charge_bytes}");
    assert_eq!(effect(&shipped, "ship")["outputs"]["charge-payment"], charged);
    assert_eq!(effect(&undone, "refund-payment")["input_bytes"], json!(charge_bytes));

    // The records keep references; the bucket keeps the values, two an order.
    let view = operator_view(&stack, &shipped);
    let stored = &view["steps"][1]["output"]["$stored"];
    assert_eq!(stored["bytes"], json!(charge_bytes), "{view}");
    // The client sees the references, or, asking for them, the values whole.
    let shown = order(&http, &stack, &shipped).await;
    assert_eq!(shown["steps"][1]["output"]["$stored"]["bytes"], json!(charge_bytes), "{shown}");
    assert!(shown["order"]["$stored"].is_object(), "{shown}");
    let request = http.get(format!("{}/orders/{shipped}?values=whole", stack.api_url));
    let whole: Value =
        signer(EXECUTE_API).send(&http, request).await.unwrap().json().await.unwrap();
    assert_eq!(whole["steps"][1]["output"], charged);
    assert_eq!(whole["order"], input);
    // An operator reads them back too, through the admin API, as its grants allow.
    let shown = sas(&stack, &["show", &shipped, "--whole", "-o", "json"]);
    assert!(shown.status.success(), "{}", text(&shown));
    let whole: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(whole["steps"][1]["output"], charged);
    assert_eq!(whole["order"], input);
    let given = &whole["outline"][2]["given"];
    assert_eq!(given, &json!(["reserve-inventory", "charge-payment"]), "{}", whole["outline"]);
    // Both are found by their customer, though their input is kept in the bucket.
    let found = sas(&stack, &["find", "c-1", "-o", "json"]);
    assert!(found.status.success(), "{}", text(&found));
    let found: Value = serde_json::from_slice(&found.stdout).unwrap();
    let states: Vec<(&str, &str)> = found["orders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| (o["order_id"].as_str().unwrap(), o["process_state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [(undone.as_str(), "Error"), (shipped.as_str(), "Processed")]);
    let none = text(&sas(&stack, &["find", "c-2"]));
    assert!(none.contains("no orders found by \"c-2\" (searched: "), "{none}");
    let clients = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await;
    let bucket = stack.stack.reference("PayloadBucket").unwrap();
    for id in [&shipped, &undone] {
        let listed = clients
            .s3
            .list_objects_v2()
            .bucket(&bucket)
            .prefix(format!("orders/{id}/"))
            .send()
            .await
            .unwrap();
        assert_eq!(listed.contents().len(), 2, "{id}: {listed:?}");
    }

    // Shipping is back; an operator counts the failed orders, then has the stack redrive them
    // all, and follows the report to its end.
    put_faults(&http, &stack, faults).await;
    let counted = sas(&stack, &["bulk", "redrive", "failed", "--reason", "shipping is back"]);
    assert!(text(&counted).contains("1 orders match; nothing was changed"), "{}", text(&counted));
    let asked =
        ["bulk", "redrive", "failed", "--reason", "shipping is back", "--yes", "--wait", "120"];
    let asked = [&asked[..], &["-o", "json"]].concat();
    let done = sas(&stack, &asked);
    assert!(done.status.success(), "{}", text(&done));
    let job: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!((job["finished"].clone(), job["tally"]["applied"].clone()), (json!(true), json!(1)));
    let states = wait_for(&http, &stack, std::slice::from_ref(&undone), &terminal, 60).await;
    assert_eq!(states[&undone], "Processed");
    let listed = text(&sas(&stack, &["bulk", "jobs"]));
    assert!(listed.contains("redrive  failed  1 of 1, done  by arn:aws:iam::"), "{listed}");
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
}

/// A parent that reserves the stock, then has two children at once: one charges the card and
/// confirms the payment, the other ships (and can call the parcel back); and the two
/// children's workflows.
fn family() -> String {
    let charge = json!({"name": "charge", "steps": [
        {"name": "charge-payment", "agent": "payment", "budget_seconds": 10,
         "compensation": {"action": "refund-payment", "budget_seconds": 10}},
        {"name": "confirm-payment", "agent": "payment", "budget_seconds": 10}]});
    let dispatch = json!({"name": "dispatch", "steps": [
        {"name": "ship", "agent": "shipping", "budget_seconds": 10,
         "compensation": {"action": "recall-parcel", "budget_seconds": 10}}]});
    let parent = json!({"name": "family", "steps": [
        {"name": "reserve-inventory", "agent": "inventory", "budget_seconds": 10,
         "compensation": {"action": "release-inventory", "budget_seconds": 10}},
        {"name": "pay", "child": {"workflow": "charge", "timeout_seconds": 120},
         "depends_on": ["reserve-inventory"]},
        {"name": "send", "child": {"workflow": "dispatch", "input": "/input/ship_to", "timeout_seconds": 120},
         "depends_on": ["reserve-inventory"]}]});
    json!([charge, dispatch, parent]).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_with_two_children_ends_with_them_and_a_cancel_stops_its_child_in_flight() {
    let _turn = TURN.lock().await;
    // The payment service holds every charge open while this file exists.
    let (hold, held, _) = holding_charges("hold-child-charge");
    std::fs::remove_file(&hold).unwrap();
    let faults = json!({"default": {"latency_ms": 20},
        "actions": {"charge-payment": {"hold_while": hold}}})
    .to_string();
    let workflows = family();
    let setup = Setup { workflow: &workflows, ..Setup::default() };
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-family", &faults, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let (status, body) = submit_to(&http, &stack, Some("family"), "family-1", ORDER).await;
    assert_eq!(status, 202, "{body}");
    let first = body["order_id"].as_str().unwrap().to_owned();
    let terminal = ["Processed", "Error", "Cancelled"];
    let states = wait_for(&http, &stack, std::slice::from_ref(&first), &terminal, 60).await;
    assert_eq!(states[&first], "Processed");
    // Each child is an order of its own, shown with its parent, and the parent with them.
    let parent = operator_view(&stack, &first);
    let children: Vec<String> = parent["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["child"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(children.len(), 2, "{parent}");
    for child in &children {
        let view = operator_view(&stack, child);
        assert_eq!(view["process_state"], "Processed", "{view}");
        assert_eq!(view["parent"]["order_id"], first.as_str(), "{view}");
    }
    assert_eq!(
        parent["steps"][1]["output"]["charge-payment"]["ref"]
            .as_str()
            .map(|r| r.starts_with("charge-payment")),
        Some(true),
        "{parent}"
    );
    let shown = text(&sas(&stack, &["show", &first]));
    assert!(children.iter().all(|c| shown.contains(c.as_str())), "{shown}");
    let ledger_now = ledger(&http, &stack).await;
    let of = |id: &str| effects(&ledger_now, id);
    assert_eq!(of(&first), ["reserve-inventory"]);
    assert_eq!(of(&children[0]), ["charge-payment", "confirm-payment"]);
    assert_eq!(of(&children[1]), ["ship"]);

    // Now every charge is held on the wire, and the next parent is cancelled meanwhile.
    std::fs::write(&hold, "").unwrap();
    let (status, body) = submit_to(&http, &stack, Some("family"), "family-2", ORDER).await;
    assert_eq!(status, 202, "{body}");
    let second = body["order_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held.exists() {
        assert!(Instant::now() < deadline, "the child's charge never reached the service");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cancelled = sas(&stack, &["cancel", &second, "--reason", "customer called"]);
    assert!(cancelled.status.success(), "{}", text(&cancelled));
    std::fs::remove_file(&hold).unwrap();
    let states = wait_for(&http, &stack, std::slice::from_ref(&second), &terminal, 90).await;
    assert_eq!(states[&second], "Cancelled");
    let parent = operator_view(&stack, &second);
    let child_of = |i: usize| parent["steps"][i]["child"].as_str().unwrap().to_owned();
    let (pay, send) = (child_of(1), child_of(2));
    // The charging child was cancelled, its charge (made while held) refunded; the shipping
    // child, processed before the cancel, was undone by its parent: its parcel recalled.
    for child in [&pay, &send] {
        let view = operator_view(&stack, child);
        assert_eq!(view["process_state"], "Cancelled", "{view}");
    }
    let ledger_then = ledger(&http, &stack).await;
    assert_eq!(effects(&ledger_then, &pay), ["charge-payment", "refund-payment"]);
    assert_eq!(effects(&ledger_then, &send), ["ship", "recall-parcel"]);
    assert_eq!(effects(&ledger_then, &second), ["reserve-inventory", "release-inventory"]);
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
}

/// A parent that reserves the stock and ships each parcel of its input by a child order of
/// its own, at most 20 at once, one in ten of them allowed to be refused.
fn fan() -> String {
    let parcel = json!({"name": "dispatch-parcel",
        "input_schema": {"type": "object", "required": ["parcel"]},
        "steps": [{"name": "ship", "agent": "shipping", "budget_seconds": 10,
                   "compensation": {"action": "recall-parcel", "budget_seconds": 10}}]});
    let parent = json!({"name": "ship-all", "steps": [
        {"name": "reserve-inventory", "agent": "inventory", "budget_seconds": 10,
         "compensation": {"action": "release-inventory", "budget_seconds": 10}},
        {"name": "ship-each", "each": {"items": "/input/parcels", "workflow": "dispatch-parcel",
         "max_concurrency": 20, "tolerance": {"share": 0.1}, "timeout_seconds": 600}}]});
    json!([parcel, parent]).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_over_two_hundred_parcels_ships_each_by_one_call_within_its_tolerance() {
    let _turn = TURN.lock().await;
    // The carrier refuses about one parcel in twenty-five, for good.
    let faults = json!({"default": {"latency_ms": 20},
        "actions": {"ship": {"permanent_rate": 0.04, "seed": 7}}})
    .to_string();
    let workflows = fan();
    let setup = Setup { workflow: &workflows, ..Setup::default() };
    let stack = start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-fan", &faults, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let parcels: Vec<Value> =
        (0..200).map(|k| json!({"parcel": format!("p-{k}"), "kg": 1 + k % 7})).collect();
    let input = json!({"parcels": parcels}).to_string();
    let (status, body) = submit_to(&http, &stack, Some("ship-all"), "fan-1", &input).await;
    assert_eq!(status, 202, "{body}");
    let id = body["order_id"].as_str().unwrap().to_owned();
    let terminal = ["Processed", "Error", "Cancelled"];
    let states = wait_for(&http, &stack, std::slice::from_ref(&id), &terminal, 300).await;
    let parent = operator_view(&stack, &id);
    assert_eq!(states[&id], "Processed", "{parent}");
    let fan = &parent["steps"][1]["fan"];
    let (ok, failed) = (fan["forward"]["ok"].as_u64().unwrap(), fan["forward"]["failed"].as_u64());
    assert_eq!(fan["items"], 200, "{fan}");
    assert_eq!(fan["inline"], 1, "a child of one call runs inline: {fan}");
    assert_eq!(ok + failed.unwrap_or(0), 200, "{fan}");
    assert!(failed.is_some_and(|f| (1..=20).contains(&f)), "the carrier refused none: {fan}");

    // The output is every parcel's answer, in order, a gap where the carrier refused.
    let request = http.get(format!("{}/orders/{id}?values=whole", stack.api_url));
    let whole: Value =
        signer(EXECUTE_API).send(&http, request).await.unwrap().json().await.unwrap();
    let list = whole["steps"][1]["output"].as_array().unwrap().clone();
    assert_eq!(list.len(), 200);
    let ledger_now = ledger(&http, &stack).await;
    let mut shipped = 0;
    for (k, answer) in list.iter().enumerate() {
        let child = sas_engine::OrderId::for_element(id.parse().unwrap(), "ship-each", 0, k as u32);
        let child = child.to_string();
        let of_child = effects(&ledger_now, &child);
        if answer.is_null() {
            assert!(of_child.is_empty(), "parcel {k} refused, yet {of_child:?}");
            continue;
        }
        shipped += 1;
        // Each call under its element's own order id and keys, as a child's would be.
        assert_eq!(of_child, ["ship"], "parcel {k}");
        assert_eq!(answer["ship"]["ref"].as_str().map(|r| r.starts_with("ship")), Some(true));
    }
    // No order was made for an element: its calls were the parent's.
    let child = sas_engine::OrderId::for_element(id.parse().unwrap(), "ship-each", 0, 7);
    let missing = text(&sas(&stack, &["show", &child.to_string()]));
    assert!(missing.contains("no order with this id"), "{missing}");
    assert_eq!(shipped, ok);
    let shown = text(&sas(&stack, &["show", &id]));
    assert!(
        shown.contains(&format!("200 elements: 200 started, 0 running, {ok} processed")),
        "{shown}"
    );
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workflows_run_side_by_side_one_of_them_on_a_rust_agent_that_calls_dynamodb_and_s3() {
    let _turn = TURN.lock().await;
    let fast = |name: &str| -> Value {
        let json = sas_workflows::file(name).unwrap().json;
        serde_json::from_str(&sas_infra::demo::with_budgets(json, 2)).unwrap()
    };
    // The repository's account-opening only reports a welcome that fails; a stricter copy
    // undoes the account for it.
    let mut strict = fast("account-opening");
    strict["name"] = json!("account-opening-strict");
    strict["steps"][1]["on_failure"] = json!("undo");
    let workflows = json!([fast("order-fulfilment"), fast("account-opening"), strict]).to_string();
    let setup = Setup { workflow: &workflows, ..Setup::default() };
    let stack = start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-two", SOUND, 2, &[], setup).await;
    let http = reqwest::Client::new();

    // A shop order names no workflow, as its clients always did; accounts name theirs.
    let (status, shop) = submit_to(&http, &stack, None, "shop-1", ORDER).await;
    assert_eq!(status, 202, "{shop}");
    let mut accounts = Vec::new();
    for (i, name) in ["Ada", "Grace", "Edsger"].iter().enumerate() {
        let body = account(name, 1000 * (i as u64 + 1));
        let (status, answer) =
            submit_to(&http, &stack, Some("account-opening"), &format!("acct-{i}"), &body).await;
        assert_eq!(status, 202, "{answer}");
        accounts.push(answer["order_id"].as_str().unwrap().to_owned());
    }
    // The ledger refuses a first deposit above its limit: nothing was opened.
    let (_, big) = submit_to(
        &http,
        &stack,
        Some("account-opening"),
        "acct-big",
        &account("Barbara", 200_000_000),
    )
    .await;
    let big = big["order_id"].as_str().unwrap().to_owned();
    let shop = shop["order_id"].as_str().unwrap().to_owned();

    // Input each workflow's schema refuses, and a workflow the stack does not run.
    let (status, refused) = submit_to(
        &http,
        &stack,
        Some("account-opening"),
        "acct-bad",
        r#"{"customer":{"name":"Ada","email":"nope"},"plan":"gold"}"#,
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    let fields: Vec<&str> = refused["error"]["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["field"].as_str().unwrap())
        .collect();
    assert!(fields.contains(&"/customer/email") && fields.contains(&"/plan"), "{refused}");
    let (status, unknown) = submit_to(&http, &stack, Some("trip"), "trip-1", "{}").await;
    assert_eq!(
        (status, unknown["error"]["code"].as_str()),
        (400, Some("unknown_workflow")),
        "{unknown}"
    );
    // An account's input is not a shop order, nor the other way round.
    let (status, _) = submit_to(&http, &stack, None, "shop-as-account", &account("Ada", 1)).await;
    assert_eq!(status, 400);

    let mut all = accounts.clone();
    all.extend([shop.clone(), big.clone()]);
    let states = wait_for(&http, &stack, &all, &["Processed", "Compensated", "Error"], 90).await;
    for id in accounts.iter().chain([&shop]) {
        assert_eq!(states[id], "Processed", "{states:?}");
    }
    // A refused first step has nothing to undo: the order fails, and its cause names the
    // ledger's reason.
    assert_eq!(states[&big], "Error", "{states:?}");
    let view = order(&http, &stack, &big).await;
    assert_eq!(view["cause"]["kind"], "step_rejected", "{view}");
    assert!(view.to_string().contains("needs a branch"), "{view}");

    // Each order names its workflow and version; an account's steps are the account's.
    let view = order(&http, &stack, &accounts[0]).await;
    assert_eq!(
        (view["workflow"].as_str(), view["workflow_version"].as_u64()),
        (Some("account-opening"), Some(1)),
        "{view}"
    );
    let steps: Vec<&str> =
        view["steps"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(steps, ["open-account", "send-welcome"]);
    let view = order(&http, &stack, &shop).await;
    assert_eq!(view["workflow"].as_str(), Some("order-fulfilment"), "{view}");
    // The welcome got the account the first step opened.
    let sim = ledger(&http, &stack).await;
    let welcome = sim["effects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["order_id"] == accounts[0].as_str() && e["action"] == "send-welcome")
        .unwrap_or_else(|| panic!("no welcome sent: {sim}"));
    let opened = &welcome["outputs"]["open-account"]["account_id"];
    assert!(opened.as_str().is_some_and(|a| a.starts_with("ACC-")), "{welcome}");

    // The ledger's table holds one open account per order processed, and none for the refused one.
    let clients = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await;
    let table = stack.stack.reference("LedgerAccountsTable").unwrap();
    let items = clients.dynamodb.scan().table_name(&table).send().await.unwrap();
    let open: Vec<_> =
        items.items().iter().filter(|i| i["Status"].as_s().unwrap() == "open").collect();
    assert_eq!((items.count(), open.len()), (3, 3), "{items:?}");
    assert!(open.iter().any(|i| i["Holder"].as_s().unwrap() == "Grace"));

    // Every welcome is refused from now on. Where the workflow only reports it, the account
    // stays open, the order is Processed, and the operators are told; where it undoes the
    // order, the account is closed (the compensation, on the ledger agent, with the step's
    // own output).
    put_faults(
        &http,
        &stack,
        r#"{"default":{"latency_ms":20},"actions":{"send-welcome":{"permanent_rate":1.0}}}"#,
    )
    .await;
    let (_, kept) =
        submit_to(&http, &stack, Some("account-opening"), "acct-kept", &account("Alan", 10)).await;
    let (_, closed) = submit_to(
        &http,
        &stack,
        Some("account-opening-strict"),
        "acct-closed",
        &account("Ken", 10),
    )
    .await;
    let kept = kept["order_id"].as_str().unwrap().to_owned();
    let closed = closed["order_id"].as_str().unwrap().to_owned();
    let both = [kept.clone(), closed.clone()];
    let states = wait_for(&http, &stack, &both, &["Processed", "Compensated", "Error"], 90).await;
    assert_eq!((states[&kept].as_str(), states[&closed].as_str()), ("Processed", "Error"));
    let view = order(&http, &stack, &kept).await;
    assert_eq!(view["steps"][1]["status"], "failed", "{view}");
    assert_eq!(view["steps"][1]["reported"]["kind"], "step_rejected", "{view}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while operator_view(&stack, &kept)["alert"] != "sent" {
        assert!(Instant::now() < deadline, "the report was never alerted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let shown = sas(&stack, &["show", &kept]);
    assert!(text(&shown).contains("send-welcome  failed (reported)"), "{}", text(&shown));
    // It is on the operators' list of reported orders until one of them acknowledges it.
    let listed = |stack: &LocalStack| {
        let out = sas(stack, &["-o", "json", "list", "reported"]);
        assert!(out.status.success(), "{}", text(&out));
        let page: Value = serde_json::from_slice(&out.stdout).unwrap();
        let orders = page["orders"].as_array().cloned().unwrap_or_default();
        orders.iter().filter_map(|o| o["order_id"].as_str().map(str::to_owned)).collect::<Vec<_>>()
    };
    // The index is read eventually consistently: the order may take a moment to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    while listed(&stack) != [kept.clone()] {
        assert!(Instant::now() < deadline, "not listed: {:?}", listed(&stack));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let acked = sas(&stack, &["acknowledge", &kept, "--reason", "welcome sent by hand"]);
    assert!(acked.status.success(), "{}", text(&acked));
    let again = sas(&stack, &["acknowledge", &kept, "--reason", "twice"]);
    assert!(!again.status.success(), "acknowledged twice: {}", text(&again));
    assert!(text(&again).contains("already_acknowledged"), "{}", text(&again));
    let view = operator_view(&stack, &kept);
    let noted = view["timeline"].as_array().unwrap().iter().find(|e| e["what"] == "acknowledged");
    assert_eq!(
        noted.map(|e| (e["by"].clone(), e["reason"].clone())),
        Some((json!("arn:aws:iam::123456789012:user/ops-e2e"), json!("welcome sent by hand"))),
        "{view}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !listed(&stack).is_empty() {
        assert!(Instant::now() < deadline, "still listed: {:?}", listed(&stack));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let view = order(&http, &stack, &closed).await;
    assert_eq!(view["steps"][0]["status"], "undone", "{view}");
    let items = clients.dynamodb.scan().table_name(&table).send().await.unwrap();
    let holder = |name: &str| -> Vec<String> {
        items
            .items()
            .iter()
            .filter(|i| i["Holder"].as_s().unwrap() == name)
            .map(|i| i["Status"].as_s().unwrap().clone())
            .collect()
    };
    assert_eq!((holder("Alan"), holder("Ken")), (vec!["open".into()], vec!["closed".into()]));

    // Each account has its statement in the ledger's bucket (S3, through the proxy and its
    // check), as the account now stands: the closed one's says so.
    let bucket = stack.stack.reference("LedgerStatementsBucket").unwrap();
    for item in items.items() {
        let account = item["AccountId"].as_s().unwrap();
        let object = clients
            .s3
            .get_object()
            .bucket(&bucket)
            .key(format!("statements/{account}.json"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("no statement of {account}: {e:?}"));
        let statement: Value =
            serde_json::from_slice(&object.body.collect().await.unwrap().into_bytes()).unwrap();
        assert_eq!(statement["account_id"], account.as_str(), "{statement}");
        assert_eq!(statement["status"], item["Status"].as_s().unwrap().as_str(), "{statement}");
        assert_eq!(statement["holder"], item["Holder"].as_s().unwrap().as_str(), "{statement}");
    }

    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
    assert!(access.checked.get("ledgerAgentFunction").copied().unwrap_or(0) > 0, "{access}");
    let statements: Vec<_> = access
        .unused
        .iter()
        .filter(|g| g.function == "ledgerAgentFunction" && g.action == "s3:PutObject")
        .filter(|g| g.resource_name.as_deref().is_some_and(|r| r.starts_with("LedgerStatements")))
        .collect();
    assert!(statements.is_empty(), "the statements' grant was used: {statements:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_express_order_reserves_and_charges_at_once_and_a_declined_card_releases_the_stock() {
    let _turn = TURN.lock().await;
    let json = sas_workflows::file("express-fulfilment").unwrap().json;
    let workflow = sas_infra::demo::with_budgets(json, 5);
    let setup = Setup { workflow: &workflow, ..Setup::default() };
    // Slow enough calls that two in flight at once show; half the cards declined, by the
    // call's key, so each order meets the same answer however often it asks.
    let faults =
        r#"{"default":{"latency_ms":300},"actions":{"charge-payment":{"permanent_rate":0.5}}}"#;
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-express", faults, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..6 {
        let key = format!("express-{i}");
        let (status, answer) =
            submit_to(&http, &stack, Some("express-fulfilment"), &key, ORDER).await;
        assert_eq!(status, 202, "{answer}");
        ids.push(answer["order_id"].as_str().unwrap().to_owned());
    }
    let states = wait_for(&http, &stack, &ids, &["Processed", "Error"], 120).await;
    let ledger = ledger(&http, &stack).await;
    assert_effects_match(&ledger, &workflow, &states);
    let mut ends = HashMap::new();
    for id in &ids {
        let view = order(&http, &stack, id).await;
        let timeline = view["timeline"].as_array().unwrap();
        // The claim leased both first steps in one write, before either was done.
        let at = |what: &str, step: &str| {
            let entry = timeline.iter().find(|e| e["what"] == what && e["step"] == step);
            entry.and_then(|e| e["at"].as_i64())
        };
        let claimed = (at("claimed", "reserve-inventory"), at("claimed", "charge-payment"));
        assert!(claimed.0.is_some() && claimed.0 == claimed.1, "not claimed together: {view}");
        let first_done =
            timeline.iter().find(|e| e["what"] == "step_done").and_then(|e| e["at"].as_i64());
        assert!(claimed.0 <= first_done, "{view}");
        let effects = effects(&ledger, id);
        match states[id].as_str() {
            "Processed" => assert_eq!(effects.last().map(String::as_str), Some("ship"), "{view}"),
            "Error" => {
                // The reservation was awaited, then released; nothing was charged or shipped.
                assert_eq!(view["cause"]["step"], "charge-payment", "{view}");
                assert_eq!(effects, ["reserve-inventory", "release-inventory"], "{view}");
            }
            other => panic!("{id} ended {other}: {view}"),
        }
        *ends.entry(states[id].clone()).or_insert(0) += 1;
    }
    assert!(ends.len() == 2, "both ends were to be met, only {ends:?} were");
}

/// `reviewed-fulfilment`, whose fraud review (a partner's, answered by webhook) may take 20 s
/// instead of an hour.
fn reviewed_workflow() -> String {
    let json = sas_workflows::file("reviewed-fulfilment").unwrap().json;
    let mut workflow: Value =
        serde_json::from_str(&sas_infra::demo::with_budgets(json, 5)).unwrap();
    let steps = workflow["steps"].as_array_mut().unwrap();
    let review = steps.iter_mut().find(|s| s["name"] == "fraud-review").unwrap();
    review["callback"]["timeout_seconds"] = json!(20);
    workflow.to_string()
}

/// The announcements of steps waiting for an answer that reached the callbacks queue, by order.
async fn announcements(stack: &LocalStack, want: usize) -> HashMap<String, Value> {
    let sqs = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await.sqs;
    let queue = stack.stack.reference("CallbacksQueue").unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut found = HashMap::new();
    while found.len() < want {
        assert!(Instant::now() < deadline, "only {} of {want} announced", found.len());
        let received = sqs
            .receive_message()
            .queue_url(&queue)
            .max_number_of_messages(10)
            .wait_time_seconds(1)
            .send()
            .await
            .unwrap();
        for m in received.messages() {
            let event: Value = serde_json::from_str(m.body().unwrap()).unwrap();
            assert_eq!(event["detail-type"], "StepAwaitsAnswer", "{event}");
            let detail = event["detail"].clone();
            found.insert(detail["order_id"].as_str().unwrap().to_owned(), detail);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reviewed_order_ships_once_approved_and_is_undone_if_refused_or_never_answered() {
    let _turn = TURN.lock().await;
    let workflow = reviewed_workflow();
    let setup = Setup { workflow: &workflow, ..Setup::default() };
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-review", SOUND, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for case in ["approved", "refused", "silent", "by-operator"] {
        let (status, answer) =
            submit_to(&http, &stack, Some("reviewed-fulfilment"), case, ORDER).await;
        assert_eq!(status, 202, "{answer}");
        ids.push(answer["order_id"].as_str().unwrap().to_owned());
    }
    let [approved, refused, silent, by_operator] = [0, 1, 2, 3].map(|i| ids[i].clone());
    let announced = announcements(&stack, ids.len()).await;
    let token = |id: &str| announced[id]["token"].as_str().unwrap().to_owned();
    let path = |id: &str, verb: &str| format!("/orders/{id}/steps/fraud-review/{verb}");
    let answerer = Auth::As("answerer-partner");
    let answer = |id: &str, verb: &str, body: Value| {
        let (http, stack, answerer, path) = (&http, &stack, &answerer, path(id, verb));
        async move {
            let body = body.to_string();
            call(http, stack, answerer, "POST", &path, Some(("-", &body))).await
        }
    };
    let detail = &announced[&approved];
    assert_eq!(detail["answer_path"], format!("/orders/{approved}/steps/fraud-review"), "{detail}");
    assert_eq!(detail["timeout_seconds"], 20, "{detail}");
    assert!(detail["outputs"]["charge-payment"].is_object(), "the charge's output: {detail}");
    // While it waits, the order's readers do not see the token.
    let view = order(&http, &stack, &approved).await;
    assert_eq!(view["steps"][2]["status"], "in_progress", "{view}");
    assert!(view["steps"][2].get("token").is_none(), "{view}");
    // They see it waiting for an answer, until it is due, and when the wait began.
    let due = view["steps"][2]["answer_by"].as_i64().expect("the answer's due time");
    assert_eq!(view["steps"][2]["waiting"], json!({"for": "answer", "until": due}), "{view}");
    let waits = |view: &Value| -> Vec<Value> {
        let timeline = view["timeline"].as_array().unwrap();
        timeline.iter().filter(|e| e["what"] == "waiting").cloned().collect()
    };
    let started = waits(&view);
    assert_eq!(started.len(), 1, "{view}");
    assert_eq!(
        (&started[0]["step"], started[0]["until"].as_i64()),
        (&json!("fraud-review"), Some(due))
    );
    assert_eq!(view["stopping"], false, "{view}");

    // Approved, with a heartbeat first; another order's token, and a client, change nothing.
    let (status, beat) = answer(&approved, "heartbeat", json!({"token": token(&approved)})).await;
    assert_eq!((status, beat["applied"].as_str()), (200, Some("now")), "{beat}");
    let due_at = |reply: &Value| {
        let at = reply["answer_by"].as_str().expect("the reply names when the answer is due");
        chrono::DateTime::parse_from_rfc3339(at).unwrap().timestamp_millis()
    };
    assert!(due_at(&beat) > due, "a heartbeat moves the due time: {beat}");
    let (status, wrong) = answer(&approved, "complete", json!({"token": token(&refused)})).await;
    assert_eq!((status, wrong["error"]["code"].as_str()), (409, Some("wrong_token")), "{wrong}");
    let body = json!({"token": token(&approved)}).to_string();
    let as_client = Auth::As("e2e-client");
    let (status, _) =
        call(&http, &stack, &as_client, "POST", &path(&approved, "complete"), Some(("-", &body)))
            .await;
    assert_eq!(status, 403, "a client holds no answerer's policy");
    let approval = json!({"token": token(&approved), "output": {"score": 12}, "reason": "clean"});
    let (status, done) = answer(&approved, "complete", approval).await;
    assert_eq!((status, done["applied"].as_str()), (200, Some("now")), "{done}");
    assert_eq!(due_at(&done), due_at(&beat), "the due time it met: {done}");

    let refusal = json!({"token": token(&refused), "reason": "card used in two countries"});
    let (status, done) = answer(&refused, "refuse", refusal).await;
    assert_eq!((status, done["applied"].as_str()), (200, Some("now")), "{done}");

    let shown = sas(
        &stack,
        &["complete", &by_operator, "fraud-review", "--reason", "partner down, checked by hand"],
    );
    assert!(shown.status.success(), "{}", text(&shown));

    let states = wait_for(&http, &stack, &ids, &["Processed", "Error"], 90).await;
    let expected = [
        (&approved, "Processed"),
        (&refused, "Error"),
        (&silent, "Error"),
        (&by_operator, "Processed"),
    ];
    for (id, state) in expected {
        assert_eq!(states[id.as_str()], state, "{}", order(&http, &stack, id).await);
    }
    let ledger = ledger(&http, &stack).await;
    assert_effects_match(&ledger, &workflow, &states);

    let view = order(&http, &stack, &approved).await;
    assert_eq!(view["steps"][2]["output"], json!({"score": 12}), "{view}");
    assert!(view["steps"][2].get("waiting").is_none(), "{view}");
    assert_eq!(waits(&view).len(), 1, "the wait began once: {view}");
    let answered = view["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "fraud-review" && e["what"] == "step_done");
    let answered = answered.expect("the answer is on the timeline");
    assert_eq!(answered["by"], "arn:aws:iam::123456789012:user/answerer-partner", "{view}");
    assert_eq!(answered["reason"], "clean", "{view}");

    let view = order(&http, &stack, &refused).await;
    assert_eq!(view["cause"]["kind"], "step_rejected", "{view}");
    let reason = view["cause"]["reason"].as_str().unwrap();
    assert!(reason.ends_with("card used in two countries"), "{view}");
    let view = order(&http, &stack, &silent).await;
    assert_eq!(view["cause"]["kind"], "step_timed_out", "{view}");
    assert_eq!(view["steps"][2]["detail"], "no answer within 20 s", "{view}");
    for id in [&refused, &silent] {
        let mut done = effects(&ledger, id);
        done.sort();
        assert_eq!(
            done,
            ["charge-payment", "refund-payment", "release-inventory", "reserve-inventory"],
            "{id}: both undone, nothing shipped"
        );
    }
    let view = operator_view(&stack, &by_operator);
    let answered = view["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "fraud-review" && e["what"] == "step_done");
    assert_eq!(
        answered.map(|e| e["reason"].clone()),
        Some(json!("partner down, checked by hand")),
        "{view}"
    );

    // After the end, the silent order's token is late, and the approved one's used.
    let (status, late) = answer(&silent, "complete", json!({"token": token(&silent)})).await;
    assert_eq!((status, late["error"]["code"].as_str()), (409, Some("not_waiting")), "{late}");
    let (status, again) = answer(&approved, "complete", json!({"token": token(&approved)})).await;
    assert_eq!((status, again["error"]["code"].as_str()), (409, Some("not_waiting")), "{again}");
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_deploys_a_new_version_while_orders_run_and_each_order_keeps_its_own() {
    let _turn = TURN.lock().await;
    // Every charge is held open while this file exists, so that orders are in flight when the
    // new version comes.
    let (hold, held, faults) = holding_charges("hold-version");
    let mut v1: Value = serde_json::from_str(&FAST_WORKFLOW).unwrap();
    v1["steps"][1]["budget_seconds"] = json!(60);
    let mut v2 = v1.clone();
    v2["version"] = json!(2);
    v2["steps"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "confirm", "agent": "shipping", "budget_seconds": 2}));
    let before = json!([v1]).to_string();
    let setup = Setup { workflow: &before, ..Setup::default() };
    let mut stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-version", &faults, 2, &[], setup).await;
    let http = reqwest::Client::new();
    let mut old = Vec::new();
    for i in 0..3 {
        old.push(submit(&http, &stack.api_url, &format!("e2e-v1-{i}")).await);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held.exists() {
        assert!(Instant::now() < deadline, "no charge reached the service");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The deploy, as `local-stack reload` makes it: every function that runs the engine
    // starts again with both versions, and nothing else does.
    let after = json!([v1, v2]).to_string();
    let mut options = stack.options().clone();
    let faults_now = options.overrides.iter().find(|(f, ..)| f == "RemoteSimFunction").unwrap();
    options.overrides = sas_tests::e2e::overrides_running(&after, &faults_now.2.clone());
    let reload = stack.reload(options).await.unwrap();
    let mut restarted: Vec<_> =
        reload.restarted.iter().map(|(f, what)| (f.as_str(), what.as_str())).collect();
    restarted.sort();
    let mut engine: Vec<_> =
        sas_tests::e2e::ENGINE_FUNCTIONS.iter().map(|f| (*f, "environment")).collect();
    engine.sort();
    assert_eq!(restarted, engine, "{reload}");
    assert!(reload.not_applied.is_empty(), "{reload}");
    // Asked again, with nothing changed, it restarts nothing.
    let again = stack.reload(stack.options().clone()).await.unwrap();
    assert!(again.restarted.is_empty() && again.regranted.is_empty(), "{again}");
    // A grant taken out of the template is out of force at the reload, with no restart, and
    // put back the same way.
    let original = stack.options().clone();
    let mut trimmed = original.clone();
    let text = std::fs::read_to_string(&trimmed.template).unwrap();
    let grant = "              - dynamodb:PutItem\n              - dynamodb:UpdateItem\n";
    assert_eq!(text.matches(grant).count(), 1, "the ledger's grant is in the template");
    trimmed.template = std::path::Path::new(TARGET_TMPDIR).join("e2e-version-template.yaml");
    std::fs::write(&trimmed.template, text.replace(grant, "              - dynamodb:PutItem\n"))
        .unwrap();
    let puts = |stack: &LocalStack| {
        let policies = stack.proxy.access.as_ref().unwrap().policies();
        let ledger = &policies.functions["ledgerAgentFunction"];
        ledger.statements.iter().any(|s| {
            s.actions.iter().any(|a| a == "dynamodb:UpdateItem")
                && s.resources.iter().any(|r| r.contains(":table/ledger-accounts-"))
        })
    };
    assert!(puts(&stack));
    let regranted = stack.reload(trimmed).await.unwrap();
    assert_eq!(regranted.regranted, ["ledgerAgentFunction"], "{regranted}");
    assert!(regranted.restarted.is_empty(), "{regranted}");
    assert!(regranted.to_string().contains("ledgerAgentFunction: its grants changed"));
    assert!(!puts(&stack), "the grant taken out is no longer in force");
    let back = stack.reload(original).await.unwrap();
    assert_eq!(back.regranted, ["ledgerAgentFunction"], "{back}");
    assert!(puts(&stack));
    let mut new = Vec::new();
    for i in 0..2 {
        new.push(submit(&http, &stack.api_url, &format!("e2e-v2-{i}")).await);
    }
    std::fs::remove_file(&hold).unwrap();

    let all: Vec<String> = old.iter().chain(&new).cloned().collect();
    let states = wait_for(&http, &stack, &all, &["Processed", "Error"], 120).await;
    assert!(states.values().all(|s| s == "Processed"), "{states:?}");
    let sim = ledger(&http, &stack).await;
    for (ids, version, steps) in [
        (&old, 1, vec!["reserve-inventory", "charge-payment", "ship"]),
        (&new, 2, vec!["reserve-inventory", "charge-payment", "ship", "confirm"]),
    ] {
        for id in ids {
            let view = order(&http, &stack, id).await;
            assert_eq!(view["workflow_version"], version, "{view}");
            assert_eq!(effects(&sim, id), steps, "{id}");
        }
    }
    assert!(stack.restarts() >= 5, "the engine's functions started again");
    // Each was let finish what it held first: no invocation was cut short, so no lease ran
    // out for the restart.
    assert_eq!(stack.unanswered(), 0, "invocations lost to the restart");
    let access = stack.access();
    assert!(access.denials.is_empty(), "{access}");
}

/// A file that holds every charge of the simulated payment service open while it exists (its
/// effect in place, its answer not sent), the file the service writes once it holds one, and
/// the faults that say so.
fn holding_charges(name: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let hold = std::path::Path::new(TARGET_TMPDIR).join(format!("{name}-{}", std::process::id()));
    std::fs::write(&hold, "").unwrap();
    let held = hold.with_extension("held");
    let _ = std::fs::remove_file(&held);
    let faults = json!({"actions": {"charge-payment": {"hold_while": hold}}}).to_string();
    (hold, held, faults)
}

/// A workflow that events and a schedule start: a tenant signed up, and every minute.
fn started() -> String {
    let tenant = json!({"name": "tenant-setup",
        "input_schema": {"type": "object", "required": ["tenant"],
                         "properties": {"tenant": {"type": "string"}}},
        "steps": [{"name": "reserve-inventory", "agent": "inventory", "budget_seconds": 10}],
        "starts": [
            {"event": {"pattern": {"source": ["crm"], "detail-type": ["TenantSignedUp"]}}},
            {"schedule": {"expression": "rate(1 minute)", "input": {"tenant": "every-minute"}}}]});
    json!([tenant]).to_string()
}

/// Every stored order's owner and key, by id.
async fn orders_by_id(stack: &LocalStack) -> HashMap<String, (String, String)> {
    let clients = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await;
    let table = stack.stack.reference("StateTable").unwrap();
    let scan = clients.dynamodb.scan().table_name(table).consistent_read(true).send().await;
    let items = scan.unwrap().items.unwrap_or_default();
    let order = |item: &HashMap<String, aws_sdk_dynamodb::types::AttributeValue>| {
        let body: Value = serde_json::from_str(&sas_aws::dynamo::body_text(item).unwrap()).unwrap();
        let field = |k: &str| body["submitted"][k].as_str().unwrap().to_owned();
        (item["OrderId"].as_s().unwrap().clone(), (field("owner"), field("key")))
    };
    items.iter().map(order).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_a_schedules_times_start_one_order_each_however_often_they_come() {
    let _turn = TURN.lock().await;
    let faults = json!({"default": {"latency_ms": 20}}).to_string();
    let workflows = started();
    let setup = Setup { workflow: &workflows, ..Setup::default() };
    let began = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let stack =
        start_stack_within(TARGET_TMPDIR.as_ref(), "e2e-starts", &faults, 2, &[], setup).await;
    let clients = sas_infra::emulation::aws::Clients::new(&stack.emulators, "us-east-1").await;
    let queue = stack.stack.reference("SchedulerQueue").unwrap();
    // Redelivery in a second instead of the template's minute: a refused event's five
    // receives, quickly. A receive already waiting (long polls last 20 s) hides what it gets
    // for the old minute.
    let visibility = aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout;
    let set = clients.sqs.set_queue_attributes().queue_url(&queue).attributes(visibility, "1");
    set.send().await.unwrap();
    tokio::time::sleep(Duration::from_secs(21)).await;
    let entry = |source: &str, kind: &str, detail: Value| {
        aws_sdk_eventbridge::types::PutEventsRequestEntry::builder()
            .event_bus_name(stack.stack.reference("EventBus").unwrap())
            .source(source)
            .detail_type(kind)
            .detail(detail.to_string())
            .build()
    };
    // One event the workflow's pattern matches, one it does not, and one that matches but
    // whose input the workflow's schema refuses.
    let put = clients
        .events
        .put_events()
        .entries(entry("crm", "TenantSignedUp", json!({"tenant": "acme"})))
        .entries(entry("billing", "InvoicePaid", json!({"tenant": "acme"})))
        .entries(entry("crm", "TenantSignedUp", json!({"name": "no tenant"})))
        .send()
        .await
        .unwrap();
    assert_eq!(put.failed_entry_count(), 0, "{put:?}");
    let signed_up = put.entries()[0].event_id().unwrap().to_owned();
    // One event delivered twice, as the bus may deliver one.
    let twice = json!({"version": "0", "id": "signed-up-twice", "source": "crm",
        "detail-type": "TenantSignedUp", "time": "2026-11-29T10:00:00Z", "region": "us-east-1",
        "resources": [], "detail": {"tenant": "globex"}});
    for _ in 0..2 {
        let send = clients.sqs.send_message().queue_url(&queue).message_body(twice.to_string());
        send.send().await.unwrap();
    }

    // Each order started is processed; wait for the first schedule's time after the stack
    // came up, and for every order there is then to end.
    let deadline = Instant::now() + Duration::from_secs(120);
    let minute = 60_000;
    let first_after_up = (began.as_millis() as i64 / minute + 1) * minute;
    let (orders, views) = loop {
        let orders = orders_by_id(&stack).await;
        let views: HashMap<String, Value> =
            orders.keys().map(|id| (id.clone(), operator_view(&stack, id))).collect();
        let scheduled_since_up = orders.values().any(|(_, key)| {
            key.rsplit('-')
                .next()
                .and_then(|ms| ms.parse::<i64>().ok())
                .is_some_and(|ms| key.starts_with("schedule-") && ms >= first_after_up)
        });
        let ended = views.values().all(|v| v["process_state"] == "Processed");
        let by_events = [signed_up.as_str(), "signed-up-twice"].iter().all(|event| {
            orders.values().any(|(_, key)| key == &format!("event-tenant-setup-{event}"))
        });
        if (scheduled_since_up && by_events && ended) || Instant::now() > deadline {
            break (orders, views);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for (id, view) in &views {
        assert_eq!(view["process_state"], "Processed", "{id}: {view}");
    }
    assert!(orders.values().all(|(owner, _)| owner == "sas:starts"), "{orders:?}");
    let keys: Vec<&str> = orders.values().map(|(_, key)| key.as_str()).collect();
    let mut by_event: Vec<&str> =
        keys.iter().filter_map(|k| k.strip_prefix("event-tenant-setup-")).collect();
    by_event.sort_unstable();
    let mut expected = vec![signed_up.as_str(), "signed-up-twice"];
    expected.sort_unstable();
    assert_eq!(by_event, expected, "one order per matching event, none for the other");
    let event_order = |event: &str| {
        let key =
            sas_engine::IdempotencyKey::parse(&format!("event-tenant-setup-{event}")).unwrap();
        sas_engine::OrderId::for_owner_key(&sas_engine::Owner::starts(), &key).to_string()
    };
    assert_eq!(views[&event_order(&signed_up)]["order"]["tenant"], "acme");
    let http = reqwest::Client::new();
    let ledger_now = ledger(&http, &stack).await;
    assert_eq!(effects(&ledger_now, &event_order("signed-up-twice")), ["reserve-inventory"]);

    // The schedule's times: whole minutes in a row, from at most five minutes before the
    // stack's first sweep to after it came up, one order each.
    let mut times: Vec<i64> = keys
        .iter()
        .filter_map(|k| k.strip_prefix("schedule-tenant-setup-1-"))
        .map(|ms| ms.parse().unwrap())
        .collect();
    times.sort_unstable();
    assert!(times.windows(2).all(|w| w[1] - w[0] == minute), "a time missed: {times:?}");
    assert!(times.first().is_some_and(|t| *t > began.as_millis() as i64 - 6 * minute), "{times:?}");
    assert!(times.last().is_some_and(|t| *t >= first_after_up), "{times:?}");
    assert_eq!(keys.len(), 2 + times.len(), "{keys:?}");
    for (id, (_, key)) in orders.iter().filter(|(_, (_, key))| key.starts_with("schedule-")) {
        assert_eq!(views[id]["order"]["tenant"], "every-minute", "{key}");
    }
    // The refused event wrote nothing (above), and ends in the dead-letter queue, saying why.
    let started = Instant::now();
    while stack.dead_letters.arrivals().is_empty() && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let arrivals = stack.dead_letters.arrivals();
    assert_eq!(arrivals.len(), 1, "{arrivals:#?}");
    let refused = &arrivals[0];
    assert_eq!(refused.kind.as_deref(), Some("event"), "{refused}");
    assert!(refused.reason.contains("the event starts no order of tenant-setup"), "{refused}");
    assert!(refused.reason.contains("\"tenant\" is a required property"), "{refused}");
    let access = stack.access();
    assert!(access.denials.is_empty(), "calls the template does not allow:\n{access}");
}
