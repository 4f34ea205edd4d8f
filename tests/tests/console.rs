//! The operators' console, as a person uses it: `sas console` runs against the local stack
//! with a caller's own credentials, and headless Chromium opens the address it prints, then
//! clicks, types and reads the page through the DevTools protocol.
//!
//! - An operator finds an order that failed (its payment refused), reads why, redrives it
//!   once the service is back, and sees it end Processed without reloading the page; the
//!   redrive is on the order's timeline with the operator's name and reason.
//! - The operator holds a service, sees an order wait for it, and releases it; and sees the
//!   dead-letter queues and the keys.
//! - Someone who only reads (`ReadOnlyPolicy`) sees the same orders, and every command they
//!   try (an order's, a service's) is refused by the API, with nothing changed.
//! - With a service held, an operator cancels all 500 orders in flight at its step with one
//!   bulk command: the count is shown before, the report after says 500 applied, and each
//!   order is undone (once the service is back, since its request had gone out) and ends
//!   Cancelled with the cancel once on its timeline.
//! - What is not the page gets nothing: a call without the session, or naming another host,
//!   is refused before anything is signed.
//! - A JWT stack's console signs its users in at the stack's issuer (a local one here): the
//!   page follows the issuer's discovery document, trades the code for an ID token, and the
//!   identity pool maps the user's group to the operators' or readers' role, or to none.
//!
//! The browser is the machine's Chromium, or one the test installs into `.chromium/` itself
//! (see `sas_tests::browser`).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use sas_infra::access::issuer::LocalIssuer;
use sas_infra::access::jwt;
use sas_infra::access::sigv4::local_signer;
use sas_infra::emulation::local::LocalStack;
use sas_tests::browser::Chromium;
use sas_tests::devtools::Tab;
use sas_tests::e2e::{SOUND, build_binaries, put_faults, start_stack};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");
const REGION: &str = "us-east-1";

/// Every payment refused for good: each order ends in Error at charge-payment.
const DECLINING: &str =
    r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"permanent_rate":1.0}}}"#;

/// Long enough for an order to go through the local stack on a busy machine.
const ENDS_WITHIN: Duration = Duration::from_secs(90);

/// `sas console` running as `caller`, and the address it printed.
struct Console {
    url: String,
    _process: Child,
}

async fn console(stack: &LocalStack, caller: &str) -> Console {
    let bin = build_binaries(Path::new(TARGET_TMPDIR));
    let mut process = tokio::process::Command::new(bin.join("sas"))
        .arg("console")
        .env("SAS_API_URL", &stack.api_url)
        .env("AWS_ACCESS_KEY_ID", caller)
        .env("AWS_SECRET_ACCESS_KEY", sas_infra::access::sigv4::LOCAL_SECRET_KEY)
        .env("AWS_REGION", REGION)
        .env_remove("AWS_PROFILE")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(process.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("sas console printed no address")
        .unwrap()
        .unwrap();
    let url = line.split_whitespace().find(|w| w.starts_with("http://")).unwrap().to_owned();
    Console { url, _process: process }
}

/// An order of customer c-1.
const ORDER: &str = r#"{"customer_id":"c-1","currency":"EUR","items":[{"sku":"BOOK-1","quantity":1,"unit_price":1250}],
                  "ship_to":{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}"#;

async fn submit(http: &reqwest::Client, stack: &LocalStack, key: &str) -> String {
    submit_as(http, stack, key, None).await
}

/// Submits an order signed with SigV4 as a client, or with `bearer`'s token.
async fn submit_as(
    http: &reqwest::Client,
    stack: &LocalStack,
    key: &str,
    bearer: Option<&str>,
) -> String {
    let signer = local_signer("console-client", REGION, "execute-api");
    for _ in 0..20 {
        let request = http
            .post(format!("{}/orders", stack.api_url))
            .header("content-type", "application/json")
            .header("idempotency-key", key)
            .body(ORDER);
        let sent = match bearer {
            Some(token) => request.bearer_auth(token).send().await.map_err(|e| e.to_string()),
            None => signer.send(http, request).await.map_err(|e| e.to_string()),
        };
        if let Ok(answer) = sent {
            if answer.status() == 202 {
                let v: Value = answer.json().await.unwrap();
                return v["order_id"].as_str().unwrap().to_owned();
            }
        }
        // The first requests may meet functions still starting.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("the order {key} was not accepted");
}

/// The order as the admin API shows it to an operator.
async fn shown(http: &reqwest::Client, stack: &LocalStack, id: &str) -> Value {
    let signer = local_signer("ops-check", REGION, "execute-api");
    let request = http.get(format!("{}/admin/orders/{id}", stack.api_url));
    signer.send(http, request).await.unwrap().json().await.unwrap()
}

async fn wait_state(http: &reqwest::Client, stack: &LocalStack, id: &str, state: &str) {
    let deadline = tokio::time::Instant::now() + ENDS_WITHIN;
    loop {
        let view = shown(http, stack, id).await;
        if view["process_state"] == state {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{id} not {state}: {view}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Writes the page as `<name>.png` into the folder `CONSOLE_SCREENSHOTS` names, if it names
/// one: the README's screenshots are taken this way.
async fn shot(tab: &mut Tab, name: &str) {
    if let Some(dir) = std::env::var_os("CONSOLE_SCREENSHOTS") {
        let png = tab.screenshot().await.unwrap();
        std::fs::write(Path::new(&dir).join(format!("{name}.png")), png).unwrap();
    }
}

/// A JavaScript string literal of `text`.
fn js(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

/// Answers a dialog the page opened: a reason, then Confirm; returns the notice it shows.
async fn confirm(tab: &mut Tab, reason: &str) -> Value {
    tab.wait_for("document.getElementById('ask').open", Duration::from_secs(5)).await.unwrap();
    tab.fill("#ask-reason", reason).await.unwrap();
    tab.click("#ask-confirm").await.unwrap();
    tab.wait_for(
        "(() => { const n = document.getElementById('notice'); return !n.hidden && !document.getElementById('ask').open && { kind: n.className, status: n.dataset.status, text: n.textContent }; })()",
        Duration::from_secs(30),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_failed_order_redrives_it_and_a_reader_is_refused_every_command() {
    let browser = Chromium::find_or_install().unwrap();
    let stack = start_stack(TARGET_TMPDIR.as_ref(), "e2e-console", DECLINING, 5, &[]).await;
    let http = reqwest::Client::new();
    let redriven = submit(&http, &stack, "console-1").await;
    let left = submit(&http, &stack, "console-2").await;
    wait_state(&http, &stack, &redriven, "Error").await;
    wait_state(&http, &stack, &left, "Error").await;

    // The operator signs in: the console runs with their credentials, and says whose.
    let operator = console(&stack, "ops-alice").await;
    let mut tab = Tab::open(&browser, 1280, 900).await.unwrap();
    tab.goto(&operator.url).await.unwrap();
    let who = tab.wait_for("document.getElementById('who').dataset.caller", ENDS_WITHIN).await;
    assert_eq!(who.unwrap(), "arn:aws:iam::123456789012:user/ops-alice");
    let address = tab.eval("location.href").await.unwrap();
    assert!(!address.as_str().unwrap().contains("session="), "the token leaves the address");

    // It finds the failed order in the list, and opens it.
    let row = format!("#orders a[data-order={}]", js(&redriven));
    tab.wait_for(&format!("document.querySelector({})", js(&row)), ENDS_WITHIN).await.unwrap();
    let failed_count =
        "(document.querySelector('[data-list=failed] .count') || { dataset: {} }).dataset.count";
    assert_eq!(tab.eval(failed_count).await.unwrap(), "2", "the failed list's count");
    let awaiting = "document.querySelector('[data-list=awaiting-answer] .count').dataset.count";
    assert_eq!(tab.eval(awaiting).await.unwrap(), "0", "no step here waits for an answer");
    shot(&mut tab, "console-attention").await;
    tab.click(&row).await.unwrap();
    let state = "(() => { const s = document.getElementById('order-state'); return s && s.dataset.state; })()";
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Error");
    let why = tab.eval("document.getElementById('cause').textContent").await.unwrap();
    let why = why.as_str().unwrap();
    assert!(why.contains("step_rejected at charge-payment"), "{why}");
    // The workflow drawn: a box per step, the failed one marked, an arrow from each step to
    // the one that waits for it.
    let boxes = tab
        .eval("[...document.querySelectorAll('#graph [data-node]')].map((n) => n.dataset.node + ':' + n.dataset.status)")
        .await
        .unwrap();
    assert_eq!(
        boxes,
        serde_json::json!([
            "reserve-inventory:undone",
            "charge-payment:failed",
            "ship:not_started"
        ])
    );
    let arrows = tab.eval("document.querySelectorAll('#graph .edge').length").await.unwrap();
    assert_eq!(arrows, 2);
    shot(&mut tab, "console-order").await;
    let failed_step = tab
        .eval("document.querySelector('#steps tr[data-step=\"charge-payment\"]').dataset.status")
        .await
        .unwrap();
    assert_eq!(failed_step, "failed");

    // The payment service is back: a redrive, with a reason, and the page follows the order
    // to its end by itself.
    put_faults(&http, &stack, SOUND).await;
    tab.click("button[data-verb=redrive]").await.unwrap();
    let done = confirm(&mut tab, "card limit raised by the bank").await;
    assert_eq!(done["kind"], "done", "{done}");
    let processed = format!("{state} === 'Processed'");
    tab.wait_for(&processed, ENDS_WITHIN).await.unwrap();
    let entry = tab
        .eval("[...document.querySelectorAll('#timeline tr')].map((r) => r.textContent).find((t) => t.includes('card limit raised'))")
        .await
        .unwrap();
    let entry = entry.as_str().expect("the redrive is on the timeline");
    assert!(entry.contains("user/ops-alice"), "{entry}");
    // Back in the list, one order is left to look at.
    tab.click("a[data-nav=attention]").await.unwrap();
    tab.wait_for(&format!("{failed_count} === '1'"), ENDS_WITHIN).await.unwrap();

    // A service held and released by hand, with a reason each time.
    tab.click("a[data-nav=services]").await.unwrap();
    tab.wait_for("document.querySelector('#services [data-hold-service=payment]')", ENDS_WITHIN)
        .await
        .unwrap();
    tab.click("[data-hold-service=payment]").await.unwrap();
    let held = confirm(&mut tab, "the bank's maintenance window").await;
    assert_eq!(held["kind"], "done", "{held}");
    tab.wait_for("document.querySelector('tr[data-service=payment] [data-release]')", ENDS_WITHIN)
        .await
        .unwrap();
    shot(&mut tab, "console-services").await;
    // An order that reaches the held service waits for it, and is listed as waiting (an
    // agent's view of its service is at most a second old).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let waits = submit(&http, &stack, "console-3").await;
    let one_waits = "(document.querySelector('tr[data-service=payment] [data-waiting]') || {}).textContent === '1 waiting'";
    tab.wait_for(one_waits, ENDS_WITHIN).await.unwrap();
    tab.click("tr[data-service=payment] [data-waiting]").await.unwrap();
    let listed = format!("document.querySelector('#waiting a[data-order={}]')", js(&waits));
    tab.wait_for(&listed, ENDS_WITHIN).await.unwrap();
    tab.click("a[data-nav=services]").await.unwrap();
    tab.wait_for("document.querySelector('tr[data-service=payment] [data-release]')", ENDS_WITHIN)
        .await
        .unwrap();
    tab.click("tr[data-service=payment] [data-release]").await.unwrap();
    let released = confirm(&mut tab, "the window is over").await;
    assert_eq!(released["kind"], "done", "{released}");
    tab.wait_for("!document.querySelector('tr[data-service=payment] [data-release]')", ENDS_WITHIN)
        .await
        .unwrap();
    // Released, the order that waited goes on to its end.
    wait_state(&http, &stack, &waits, "Processed").await;

    // The dead-letter queues and the keys are there to look at.
    tab.click("a[data-nav=dead-letters]").await.unwrap();
    let queues = tab
        .wait_for("document.querySelectorAll('#queues tbody tr').length", ENDS_WITHIN)
        .await
        .unwrap();
    assert!(queues.as_u64().unwrap() >= 2, "{queues}");
    tab.click("a[data-nav=keys]").await.unwrap();
    tab.wait_for(
        "document.getElementById('keys') || document.getElementById('keys-empty')",
        ENDS_WITHIN,
    )
    .await
    .unwrap();

    // An id that names no order says so.
    tab.fill("#search-id", "5d0f5d7e-1b7c-4e0a-9b8e-000000000000").await.unwrap();
    tab.click("#search button").await.unwrap();
    let missing = tab
        .wait_for("(document.getElementById('not-found') || {}).textContent", ENDS_WITHIN)
        .await
        .unwrap();
    assert!(missing.as_str().unwrap().contains("no order with this id"), "{missing}");
    // A customer's orders are found, ended ones included, by the value their workflow's
    // search_key reads from the input.
    tab.fill("#search-id", "c-1").await.unwrap();
    tab.click("#search button").await.unwrap();
    let rows = "[...document.querySelectorAll('#found-orders tr[data-order]')].map((r) => r.dataset.order \
        + ' ' + r.querySelector('[data-state]').dataset.state).join(',')";
    let found = tab.wait_for(rows, ENDS_WITHIN).await.unwrap();
    let found: Vec<&str> = found.as_str().unwrap().split(',').collect();
    for expected in [format!("{redriven} Processed"), format!("{left} Error")] {
        assert!(found.contains(&expected.as_str()), "{expected} in {found:?}");
    }
    let searched = tab.eval("document.getElementById('search-keys').textContent").await.unwrap();
    assert!(
        searched.as_str().unwrap().contains("order-fulfilment by /input/customer_id"),
        "{searched}"
    );
    // A key is found with its submitter, as the order shows them.
    tab.fill("#search-id", "console-1").await.unwrap();
    tab.click("#search button").await.unwrap();
    // The view of the customer's orders has the same form: wait for this key's to be drawn.
    let drawn = "location.hash.includes('console-1') \
        && document.getElementById('view').dataset.drawn === location.hash \
        && document.querySelector('#find [name=submitter]')";
    tab.wait_for(drawn, ENDS_WITHIN).await.unwrap();
    tab.fill("#find [name=submitter]", "arn:aws:iam::123456789012:user/console-client")
        .await
        .unwrap();
    tab.click("#find button").await.unwrap();
    let found = tab
        .wait_for(
            "(document.querySelector('#found a[data-order]') || { dataset: {} }).dataset.order",
            ENDS_WITHIN,
        )
        .await
        .unwrap();
    assert_eq!(found, redriven.as_str());

    // A reader sees the same orders, and is refused every command by the API.
    let reader = console(&stack, "reader-bob").await;
    let mut tab = Tab::open(&browser, 1280, 900).await.unwrap();
    tab.goto(&reader.url).await.unwrap();
    let row = format!("#orders a[data-order={}]", js(&left));
    tab.wait_for(&format!("document.querySelector({})", js(&row)), ENDS_WITHIN).await.unwrap();
    tab.click(&row).await.unwrap();
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Error");
    let before = shown(&http, &stack, &left).await;
    for verb in ["redrive", "redrive-compensation"] {
        tab.click(&format!("button[data-verb={verb}]")).await.unwrap();
        let refused = confirm(&mut tab, "trying what a reader may not").await;
        assert_eq!(
            (refused["kind"].as_str(), refused["status"].as_str()),
            (Some("error"), Some("403")),
            "{verb}: {refused}"
        );
    }
    tab.click("a[data-nav=services]").await.unwrap();
    tab.wait_for("document.querySelector('[data-hold-service=payment]')", ENDS_WITHIN)
        .await
        .unwrap();
    tab.click("[data-hold-service=payment]").await.unwrap();
    let refused = confirm(&mut tab, "trying what a reader may not").await;
    assert_eq!(refused["status"], "403", "{refused}");
    let after = shown(&http, &stack, &left).await;
    assert_eq!(after["process_state"], "Error");
    assert_eq!(after["timeline"], before["timeline"], "nothing was written for the reader");

    // The signing proxy answers the page alone.
    let api = format!("{}api/admin/me", operator.url.split('#').next().unwrap());
    let bare = http.get(&api).send().await.unwrap();
    assert_eq!(bare.status(), 401, "no session, nothing signed");
    let token = operator.url.split("session=").nth(1).unwrap();
    let other_host = http
        .get(&api)
        .header("host", "attacker.example:80")
        .header("x-sas-console", token)
        .send()
        .await
        .unwrap();
    assert_eq!(other_host.status(), 421, "a name rebound to loopback reaches nothing");
    let good = http.get(&api).header("x-sas-console", token).send().await.unwrap();
    assert_eq!(good.status(), 200);
}

/// The `config.json` a stack serves its console's page.
async fn page_config(http: &reqwest::Client, stack: &LocalStack) -> Value {
    let answer = http.get(format!("{}/console/config.json", stack.api_url)).send().await.unwrap();
    answer.json().await.unwrap()
}

/// Puts `caller`'s keys in the tab's session, as the identity pool's credentials are kept
/// once a user has signed in (the local stack takes `local` as every key's secret), valid
/// for `seconds` (negative: already expired), and loads the page again.
async fn sign_in_as(tab: &mut Tab, url: &str, caller: &str, secret: &str, seconds: i64) {
    let keys = format!(
        "sessionStorage.setItem('sas-console-credentials', JSON.stringify({{ accessKeyId: {}, secretAccessKey: {}, sessionToken: null, expiration: Date.now() + {} }}))",
        js(caller),
        js(secret),
        seconds * 1000
    );
    tab.eval(&keys).await.unwrap();
    tab.goto(url).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stack_serves_its_console_whose_page_signs_each_call_itself() {
    let browser = Chromium::find_or_install().unwrap();
    let parameters = [("Console", "true")];
    let stack =
        start_stack(TARGET_TMPDIR.as_ref(), "e2e-console-stack", DECLINING, 5, &parameters).await;
    let http = reqwest::Client::new();
    let order = submit(&http, &stack, "console-stack-1").await;
    wait_state(&http, &stack, &order, "Error").await;

    // Anyone may load the page, which holds nothing; it says where to sign in.
    let url = format!("{}/console/index.html", stack.api_url);
    let config = page_config(&http, &stack).await;
    assert_eq!(config["mode"], "signed", "{config}");
    let authorize = config["authorize"].as_str().unwrap();
    assert!(
        authorize.starts_with("https://")
            && authorize.ends_with(".auth.us-east-1.amazoncognito.com/oauth2/authorize"),
        "{config}"
    );
    let mut tab = Tab::open(&browser, 1280, 900).await.unwrap();
    tab.goto(&url).await.unwrap();
    tab.wait_for("document.getElementById('sign-in')", ENDS_WITHIN).await.unwrap();

    // Signed in as an operator, the page signs each call with SigV4, which the API checks
    // as API Gateway does: the operator finds the order, and redrives it.
    sign_in_as(&mut tab, &url, "ops-carol", "local", 3600).await;
    let who = tab.wait_for("document.getElementById('who').dataset.caller", ENDS_WITHIN).await;
    assert_eq!(who.unwrap(), "arn:aws:iam::123456789012:user/ops-carol");
    let row = format!("#orders a[data-order={}]", js(&order));
    tab.wait_for(&format!("document.querySelector({})", js(&row)), ENDS_WITHIN).await.unwrap();
    tab.click(&row).await.unwrap();
    let state = "(() => { const s = document.getElementById('order-state'); return s && s.dataset.state; })()";
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Error");
    put_faults(&http, &stack, SOUND).await;
    tab.click("button[data-verb=redrive]").await.unwrap();
    let done = confirm(&mut tab, "the payment service is back").await;
    assert_eq!(done["kind"], "done", "{done}");
    tab.wait_for(&format!("{state} === 'Processed'"), ENDS_WITHIN).await.unwrap();

    // A reader's calls are signed as well, and the API refuses their commands.
    sign_in_as(&mut tab, &format!("{url}#/orders/{order}"), "reader-dan", "local", 3600).await;
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Processed");
    refused_by_the_api(&mut tab, &http, &stack, &order, "undo", "Processed").await;

    // A signature made with the wrong secret is refused by the API, and an expired session
    // sends the user back to sign in.
    sign_in_as(&mut tab, &url, "ops-carol", "not-the-secret", 3600).await;
    let notice = tab
        .wait_for("(() => { const n = document.getElementById('notice'); return !n.hidden && n.dataset.status; })()", ENDS_WITHIN)
        .await
        .unwrap();
    assert_eq!(notice, "403");
    sign_in_as(&mut tab, &url, "ops-carol", "local", -60).await;
    let why = tab
        .wait_for("(document.getElementById('signed-out') || {}).textContent", ENDS_WITHIN)
        .await
        .unwrap();
    assert!(why.as_str().unwrap().contains("expired"), "{why}");
    tab.wait_for("document.getElementById('sign-in')", ENDS_WITHIN).await.unwrap();
}

/// A reader gives the command `verb` on the order's page: the API refuses it (403), and
/// the order stays `state`.
async fn refused_by_the_api(
    tab: &mut Tab,
    http: &reqwest::Client,
    stack: &LocalStack,
    order: &str,
    verb: &str,
    state: &str,
) {
    tab.click(&format!("button[data-verb={verb}]")).await.unwrap();
    let refused = confirm(tab, "trying what a reader may not").await;
    assert_eq!(
        (refused["kind"].as_str(), refused["status"].as_str()),
        (Some("error"), Some("403")),
        "{refused}"
    );
    assert_eq!(shown(http, stack, order).await["process_state"], state);
}

/// Signs in at the local issuer's page as `user` in `groups`, from the console's own page.
async fn sign_in_at_issuer(tab: &mut Tab, user: &str, groups: &str) {
    tab.wait_for("document.getElementById('sign-in')", ENDS_WITHIN).await.unwrap();
    tab.click("#sign-in").await.unwrap();
    let at_issuer = "location.pathname === '/authorize' && !!document.getElementById('user')";
    tab.wait_for(at_issuer, ENDS_WITHIN).await.unwrap();
    tab.fill("#user", user).await.unwrap();
    tab.fill("#groups", groups).await.unwrap();
    tab.click("#sign-in").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jwt_stack_s_console_signs_its_users_in_at_the_stack_s_own_issuer() {
    let browser = Chromium::find_or_install().unwrap();
    let issuer = LocalIssuer::start().await.unwrap();
    let parameters = [
        ("Console", "true"),
        ("ApiAuth", "JWT"),
        ("JwtIssuer", issuer.url()),
        ("JwtAudience", "orders"),
        ("ConsoleClientId", "console"),
    ];
    let stack =
        start_stack(TARGET_TMPDIR.as_ref(), "e2e-console-jwt", DECLINING, 5, &parameters).await;
    let http = reqwest::Client::new();
    // A client of the stack submits with a token of the same issuer, for the orders' audience.
    let now = chrono::Utc::now();
    let token =
        jwt::mint(&jwt::claims(issuer.url(), "orders", "shop", now, chrono::Duration::minutes(30)));
    let order = submit_as(&http, &stack, "console-jwt-1", Some(&token)).await;
    wait_state(&http, &stack, &order, "Error").await;

    // The page's configuration names the issuer's endpoints, read from its discovery document.
    let config = page_config(&http, &stack).await;
    assert_eq!(config["authorize"], format!("{}/authorize", issuer.url()), "{config}");
    assert_eq!(config["provider"], issuer.url().trim_start_matches("http://"), "{config}");

    // An operator signs in at the issuer; the identity pool maps their group to the
    // operators' role, whose credentials the page signs every call with.
    let url = format!("{}/console/index.html", stack.api_url);
    let mut tab = Tab::open(&browser, 1280, 900).await.unwrap();
    tab.goto(&url).await.unwrap();
    sign_in_at_issuer(&mut tab, "ada", "team-a sas-operators").await;
    let who = "(document.getElementById('who') || {dataset: {}}).dataset.caller";
    let caller = tab.wait_for(who, ENDS_WITHIN).await.unwrap();
    assert_eq!(caller, "arn:aws:iam::123456789012:user/ops-ada");
    assert!(
        tab.eval("location.search").await.unwrap().as_str().unwrap().is_empty(),
        "the code is not kept"
    );
    let row = format!("#orders a[data-order={}]", js(&order));
    tab.wait_for(&format!("document.querySelector({})", js(&row)), ENDS_WITHIN).await.unwrap();
    tab.click(&row).await.unwrap();
    let state = "(() => { const s = document.getElementById('order-state'); return s && s.dataset.state; })()";
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Error");

    // Signed out (at the issuer too), a reader signs in: sees the order, and is refused its
    // commands by the API.
    tab.click("#sign-out").await.unwrap();
    sign_in_at_issuer(&mut tab, "dan", "sas-readers").await;
    assert_eq!(
        tab.wait_for(who, ENDS_WITHIN).await.unwrap(),
        "arn:aws:iam::123456789012:user/read-dan"
    );
    tab.goto(&format!("{url}#/orders/{order}")).await.unwrap();
    assert_eq!(tab.wait_for(state, ENDS_WITHIN).await.unwrap(), "Error");
    refused_by_the_api(&mut tab, &http, &stack, &order, "redrive", "Error").await;

    // Someone in neither group signs in at the issuer and gets no credentials.
    tab.eval("sessionStorage.clear()").await.unwrap();
    tab.goto(&url).await.unwrap();
    sign_in_at_issuer(&mut tab, "eve", "team-a").await;
    let why = tab
        .wait_for("(document.getElementById('signed-out') || {}).textContent", ENDS_WITHIN)
        .await
        .unwrap();
    assert!(why.as_str().unwrap().contains("no credentials for this user"), "{why}");
}

/// An admin API call signed as `caller`: its status and body.
async fn admin(
    http: &reqwest::Client,
    stack: &LocalStack,
    caller: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let signer = local_signer(caller, REGION, "execute-api");
    let mut request = http.request(method, format!("{}{path}", stack.api_url));
    if let Some(body) = body {
        request = request.header("content-type", "application/json").body(body.to_string());
    }
    let answer = signer.send(http, request).await.unwrap();
    let status = answer.status().as_u16();
    (status, answer.json().await.unwrap_or(Value::Null))
}

/// Orders of one bulk test.
const BULK_ORDERS: usize = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_cancel_of_the_orders_waiting_for_a_held_service_reports_each_and_undoes_them_once_it_is_back()
 {
    use futures_util::StreamExt;

    let browser = Chromium::find_or_install().unwrap();
    // Orders resume after a hold at 50 a second, not 10: the test waits less.
    let parameters = [("ResumePerSecond", "50")];
    let stack =
        start_stack(TARGET_TMPDIR.as_ref(), "e2e-console-bulk", SOUND, 5, &parameters).await;
    let http = reqwest::Client::new();
    // The payment service is held: each order reserves its stock, then waits for it.
    let hold = serde_json::json!({ "reason": "the bank is down for the day" });
    let (status, held) = admin(
        &http,
        &stack,
        "ops-setup",
        reqwest::Method::POST,
        "/admin/services/payment/hold",
        Some(hold),
    )
    .await;
    assert_eq!(status, 200, "{held}");
    // An agent's view of its service is at most a second old.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = std::time::Instant::now();
    let ids: Vec<String> = futures_util::stream::iter(0..BULK_ORDERS)
        .map(|i| {
            let (http, stack) = (&http, &stack);
            async move { submit(http, stack, &format!("bulk-{i}")).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    eprintln!("{BULK_ORDERS} orders submitted in {:?}", started.elapsed());
    let deadline = tokio::time::Instant::now() + ENDS_WITHIN * 2;
    loop {
        let path = "/admin/services/payment/waiting?limit=1";
        let (_, waiting) =
            admin(&http, &stack, "ops-setup", reqwest::Method::GET, path, None).await;
        if waiting["waiting"] == BULK_ORDERS {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not every order waits: {waiting}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    eprintln!("every order waits after {:?}", started.elapsed());
    // The operator lists the orders in flight at the held step, and cancels all that match.
    let operator = console(&stack, "ops-erin").await;
    let mut tab = Tab::open(&browser, 1280, 900).await.unwrap();
    tab.goto(&operator.url).await.unwrap();
    tab.wait_for("document.getElementById('who').dataset.caller", ENDS_WITHIN).await.unwrap();
    tab.eval("location.hash = '#/?list=in-flight&step=charge-payment'").await.unwrap();
    let cancel_all = "(document.querySelector('[data-bulk=cancel]') || {}).textContent";
    let label = tab.wait_for(cancel_all, ENDS_WITHIN).await.unwrap();
    // In flight, the index counts every order whatever its step: at most this many match.
    assert_eq!(label, format!("Cancel up to {BULK_ORDERS}").as_str(), "the count shown before");
    tab.click("[data-bulk=cancel]").await.unwrap();
    let asked = confirm(&mut tab, "the bank stays down: customers were told").await;
    assert_eq!(asked["kind"], "done", "{asked}");
    // The page follows the bulk command to its end, then reports each order's outcome.
    let finished =
        "(document.getElementById('bulk-state') || { dataset: {} }).dataset.finished === 'true'";
    tab.wait_for(finished, ENDS_WITHIN * 2).await.unwrap();
    let tally = tab
        .eval("Object.fromEntries([...document.querySelectorAll('#tally tr')].map((r) => [r.dataset.tally, Number(r.querySelector('td').textContent)]))")
        .await
        .unwrap();
    let expected = serde_json::json!({
        "applied": BULK_ORDERS, "before": 0, "refused": 0, "gone": 0, "newer": 0
    });
    assert_eq!(tally, expected);
    shot(&mut tab, "console-bulk").await;
    eprintln!("reported after {:?}", started.elapsed());

    // Each order is undone once the bank is back: the charge first, whose request went out
    // (its agent's answer that it did not call could come from a second copy of the request),
    // then the stock; and it ends Cancelled.
    let release = serde_json::json!({ "reason": "the bank is back" });
    let path = "/admin/services/payment/release";
    let (status, released) =
        admin(&http, &stack, "ops-setup", reqwest::Method::POST, path, Some(release)).await;
    assert_eq!(status, 200, "{released}");
    // Watched by the count of orders in flight, which reads one index, not every order.
    let deadline = tokio::time::Instant::now() + ENDS_WITHIN * 4;
    loop {
        let (_, counts) =
            admin(&http, &stack, "ops-setup", reqwest::Method::GET, "/admin/counts", None).await;
        if counts["in_flight"]["orders"] == 0 || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!("ended after {:?}", started.elapsed());
    let ended: Vec<Value> = futures_util::stream::iter(&ids)
        .map(|id| shown(&http, &stack, id))
        .buffer_unordered(16)
        .collect()
        .await;
    for view in &ended {
        assert_eq!(view["process_state"], "Cancelled", "{view}");
        let steps: Vec<&str> = view["steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["status"].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["undone", "undone", "not_started"], "{view}");
        let cancels: Vec<&Value> = view["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["what"] == "cancel_requested")
            .filter(|e| e["reason"] == "the bank stays down: customers were told")
            .filter(|e| e["by"] == "arn:aws:iam::123456789012:user/ops-erin")
            .collect();
        assert_eq!(cancels.len(), 1, "the cancel is on the timeline once: {view}");
    }
}
