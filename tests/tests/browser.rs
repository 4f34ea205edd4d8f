//! The page that shows a local run, as a browser draws it: a small demo runs on a local stack
//! while its page is served, then headless Chromium loads the live page and the report the run
//! leaves, and the test reads from their DOM what the charts and tables show:
//!
//! - the states chart's Processed series ends at the orders the table holds as Processed;
//! - the time-to-terminal bars add up to the orders that ended, and the alerts table has a
//!   row per order in Error;
//! - the queue chart has a series per queue of the stack, dead-letter queues included;
//! - an order's link leads to its timeline (a page of its own live, a section of the report),
//!   which names the order and shows its first timeline entry.
//!
//! The browser is the machine's Chromium, or one the test installs into `.chromium/` itself
//! (see `sas_tests::browser`).

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use sas_infra::demo;
use sas_infra::emulation::aws::Clients;
use sas_infra::emulation::emulator::workspace_root;
use sas_infra::emulation::local::LocalStack;
use sas_infra::emulation::template::Template;
use sas_infra::observe::view::Observer;
use sas_tests::browser::Chromium;
use sas_tests::e2e::start_stack;
use serde_json::Value;
use tokio::net::TcpListener;

const TARGET_TMPDIR: &str = env!("CARGO_TARGET_TMPDIR");

/// Some payments declined for good, so that the run has alerts and compensated orders too.
const FAULTS: &str =
    r#"{"default":{"latency_ms":20},"actions":{"charge-payment":{"permanent_rate":0.5}}}"#;

const ORDERS: usize = 10;

/// The DOM of `url` once its scripts have run (ten seconds of the page's own time: five
/// refreshes of the live page).
async fn dump(browser: &Chromium, url: &str) -> String {
    let run = browser
        .headless()
        .args(["--virtual-time-budget=10000", "--dump-dom", url])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run)
        .await
        .unwrap_or_else(|_| panic!("chromium did not finish with {url}"))
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The attributes of every `<name ...>` tag in `html`, as the browser serialised them (values
/// in double quotes, quotes inside escaped).
fn tags(html: &str, name: &str) -> Vec<HashMap<String, String>> {
    let open = format!("<{name} ");
    html.match_indices(&open)
        .map(|(at, _)| {
            let rest = &html[at + open.len()..];
            let tag = &rest[..rest.find('>').unwrap()];
            tag.split('"')
                .collect::<Vec<_>>()
                .chunks(2)
                .filter(|kv| kv.len() == 2)
                .map(|kv| {
                    let key = kv[0].trim_end_matches('=').rsplit(' ').next().unwrap();
                    (key.to_owned(), kv[1].to_owned())
                })
                .collect()
        })
        .collect()
}

/// The `<svg data-chart="name">` element of `html`.
fn chart<'a>(html: &'a str, name: &str) -> &'a str {
    let start = html
        .find(&format!("<svg data-chart=\"{name}\""))
        .unwrap_or_else(|| panic!("no {name} chart in the page"));
    let end = start + html[start..].find("</svg>").unwrap();
    &html[start..end]
}

/// The element of `html` from `start` to the first `end` after it.
fn element<'a>(html: &'a str, start: &str, end: &str) -> &'a str {
    let from = html.find(start).unwrap_or_else(|| panic!("no {start} in the page"));
    let to = from + html[from..].find(end).unwrap();
    &html[from..to]
}

/// What the table says, read straight from the emulator.
struct Truth {
    processed: usize,
    ended: usize,
    errors: usize,
    /// Each order's first timeline entry (its `what`).
    first_entry: HashMap<String, String>,
    queues: Vec<String>,
}

async fn truth(stack: &LocalStack) -> Truth {
    let clients = Clients::new(&stack.emulators, &stack.stack.context.region).await;
    let table = stack.stack.reference("StateTable").unwrap();
    let items = clients.dynamodb.scan().table_name(table).send().await.unwrap();
    let (mut processed, mut ended, mut errors) = (0, 0, 0);
    let mut first_entry = HashMap::new();
    for item in items.items() {
        let text = |k: &str| item[k].as_s().unwrap().clone();
        match text("ProcessState").as_str() {
            "Processed" => processed += 1,
            "Error" => errors += 1,
            "Cancelled" => ended += 1,
            _ => {}
        }
        let body: Value = serde_json::from_str(&sas_aws::dynamo::body_text(item).unwrap()).unwrap();
        first_entry
            .insert(text("OrderId"), body["timeline"][0]["what"].as_str().unwrap().to_owned());
    }
    assert_eq!(first_entry.len(), ORDERS, "every order is in the table");
    ended += processed + errors;
    let template = Template::load(&workspace_root().join("template.yaml")).unwrap();
    // The queues the stack has: a queue whose condition does not hold is not made.
    let queues = template
        .of_kind("AWS::SQS::Queue")
        .filter(|(_, queue)| stack.stack.context.holds(queue.condition.as_deref()))
        .map(|(id, _)| id.to_owned())
        .collect();
    Truth { processed, ended, errors, first_entry, queues }
}

/// What both pages must show; returns the order the first order link points at, and the link.
fn check_charts(page: &str, truth: &Truth, which: &str) -> (String, String) {
    let states = tags(chart(page, "states"), "polyline");
    let processed = states
        .iter()
        .find(|s| s["data-series"] == "Processed")
        .unwrap_or_else(|| panic!("{which}: no Processed series"));
    assert_eq!(
        processed["data-last"],
        truth.processed.to_string(),
        "{which}: the Processed series ends at the processed orders"
    );
    let bars = tags(chart(page, "time-to-terminal"), "rect");
    let counted: usize = bars
        .iter()
        .filter(|b| b.contains_key("data-bin"))
        .map(|b| b["data-count"].parse::<usize>().unwrap())
        .sum();
    assert_eq!(counted, truth.ended, "{which}: the histogram counts every ended order once");
    let mut series: Vec<String> = tags(chart(page, "queues"), "polyline")
        .into_iter()
        .map(|s| s["data-series"].clone())
        .collect();
    let mut queues = truth.queues.clone();
    series.sort();
    queues.sort();
    assert_eq!(series, queues, "{which}: a series per queue");
    let alerts = element(page, "<table id=\"alerts\">", "</table>");
    assert_eq!(
        alerts.matches("<tr>").count() - 1,
        truth.errors,
        "{which}: a row per order in Error, under the header"
    );
    let orders = element(page, "<table id=\"orders\">", "</table>");
    let link = tags(orders, "a").into_iter().next().expect("an order link");
    let href = link["href"].clone();
    let id = href.trim_start_matches("orders/").trim_start_matches("#order-").to_owned();
    assert!(truth.first_entry.contains_key(&id), "{which}: the link {href} names no order");
    (id, href)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_the_run_live_and_as_a_report() {
    let browser = Chromium::find_or_install().unwrap();
    let stack = start_stack(TARGET_TMPDIR.as_ref(), "e2e-view", FAULTS, 5, &[]).await;
    let mut observer = Observer::start(&stack).await.unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    observer.serve(listener);

    let summary = demo::run(&stack, ORDERS, None, Duration::from_secs(120), None).await.unwrap();
    assert_eq!(summary.unfinished, 0, "{}", summary.text);
    observer.refresh().await;
    let truth = truth(&stack).await;
    assert!(truth.processed > 0, "some orders went through");
    // The page's checks of alert rows prove nothing without an order in Error (half the
    // payments are refused: all ten going through has odds of one in a thousand).
    assert!(truth.errors > 0, "no order failed, so the alert rows went unchecked");
    println!("{} processed, {} in Error, of {ORDERS}", truth.processed, truth.errors);

    // Live: the page fetches the view; each order has a page of its own.
    let live = dump(&browser, &url).await;
    let (id, href) = check_charts(&live, &truth, "live");
    assert_eq!(href, format!("orders/{id}"));
    let order = dump(&browser, &format!("{url}{href}")).await;
    assert!(order.contains(&format!("<span class=\"id\">{id}</span>")), "{order}");
    let first = tags(&order, "tr").into_iter().find(|t| t.contains_key("data-what"));
    assert_eq!(first.map(|t| t["data-what"].clone()), Some(truth.first_entry[&id].clone()));

    // The report: the same page with the view embedded, and each order's timeline in it.
    let report = Path::new(TARGET_TMPDIR).join("view-report.html");
    std::fs::write(&report, observer.report().await).unwrap();
    let file = format!("file://{}", report.display());
    let page = dump(&browser, &file).await;
    let status = element(&page, "<p id=\"status\"", "</p>");
    assert!(status.contains("Report of a run"), "the report draws what it holds: {status}");
    let (id, href) = check_charts(&page, &truth, "report");
    assert_eq!(href, format!("#order-{id}"));
    let followed = dump(&browser, &format!("{file}{href}")).await;
    let section = element(&followed, &format!("<details id=\"order-{id}\""), "</details>");
    assert!(section.contains("open=\"\""), "the linked timeline is opened: {section}");
    assert!(section.contains(&format!("<summary>{id}:")), "{section}");
    let first = tags(section, "tr").into_iter().find(|t| t.contains_key("data-what"));
    assert_eq!(first.map(|t| t["data-what"].clone()), Some(truth.first_entry[&id].clone()));
}
