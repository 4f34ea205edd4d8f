//! The demo's clients: each submits its order through the HTTP API, signed, and sends it again
//! as a client of the API should when the door refuses or throttles it (see the demo's own
//! documentation).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sas_aws::signing::SigV4;
use sas_rng::SplitMix;
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{
    ACCOUNT_EVERY, ACCOUNT_WORKFLOW, DEMO_CLIENT, EXPRESS_WORKFLOW, SPLIT_EVERY, SPLIT_WORKFLOW,
    workflows_run,
};
use crate::access::sigv4;
use crate::emulation::local::LocalStack;

/// How the clients fared at the door.
#[derive(Debug, Default)]
pub(super) struct Door {
    /// 503 answers: refused while the queues were long (or a dependency was unavailable).
    pub(super) refused: AtomicU64,
    /// 429 answers: the route's throttling.
    pub(super) throttled: AtomicU64,
    /// 500 answers: API Gateway's when Lambda throttles the function (or the function fails).
    pub(super) failed: AtomicU64,
    /// Anything else that was not a 202: connections refused, a killed process.
    pub(super) other: AtomicU64,
}

/// Starts submitting `orders` orders through `stack`'s HTTP API, at most `rate` new ones a
/// second if given (otherwise as fast as 8 clients can), each until it is accepted or
/// `deadline` passes; the task ends with the ids of the orders accepted.
pub(super) fn submit_all(
    stack: &LocalStack,
    http: &reqwest::Client,
    orders: usize,
    rate: Option<f64>,
    deadline: Instant,
    door: &Arc<Door>,
) -> JoinHandle<Vec<String>> {
    // Unpaced, 8 clients send as fast as they are answered; paced, every order is a client of
    // its own arriving on time, however slow the answers.
    let slots = Arc::new(Semaphore::new(if rate.is_some() { orders.max(1) } else { 8 }));
    let pace = rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let (http, api, door) = (http.clone(), stack.api_url.clone(), door.clone());
    let run = workflows_run(stack);
    let runs = |workflow: &str| run.iter().any(|(name, _)| name == workflow);
    let shapes = Shapes {
        accounts: runs(ACCOUNT_WORKFLOW),
        express: runs(EXPRESS_WORKFLOW),
        split: runs(SPLIT_WORKFLOW),
    };
    // The demo's client signs its orders, as the API's default authorizer wants.
    let signer = sigv4::local_signer(DEMO_CLIENT, &stack.stack.context.region, sigv4::EXECUTE_API);
    tokio::spawn(async move {
        let mut submissions = Vec::new();
        for i in 0..orders {
            if let Some(pace) = pace {
                tokio::time::sleep(pace).await;
            }
            let (http, api, slots, door, signer) =
                (http.clone(), api.clone(), slots.clone(), door.clone(), signer.clone());
            submissions.push(tokio::spawn(async move {
                let _slot = slots.acquire_owned().await;
                let (path, body) = order(&api, i, shapes);
                submit(&http, &signer, (&path, &body), i, deadline, &door).await
            }));
        }
        let mut ids = Vec::new();
        for s in submissions {
            if let Ok(Some(id)) = s.await {
                ids.push(id);
            }
        }
        ids
    })
}

/// Sends the demo's `i`th order until it is accepted or `deadline` passes; returns its id if
/// accepted.
async fn submit(
    http: &reqwest::Client,
    signer: &SigV4,
    (path, body): (&str, &str),
    i: usize,
    deadline: Instant,
    door: &Door,
) -> Option<String> {
    let jitter = SplitMix::seeded(i as u64);
    let mut backoff = Duration::from_millis(500);
    while Instant::now() < deadline {
        let request = http
            .post(path)
            .header("content-type", "application/json")
            .header("idempotency-key", format!("demo-order-{i:05}"))
            .body(body.to_owned());
        let answer = signer.send(http, request).await;
        let wait = match answer {
            Ok(a) if a.status() == 202 => {
                let v: Value = a.json().await.ok()?;
                return v["order_id"].as_str().map(str::to_owned);
            }
            Ok(a) if a.status() == 503 && a.headers().contains_key("retry-after") => {
                door.refused.fetch_add(1, Ordering::Relaxed);
                let seconds = a
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(1);
                Some(Duration::from_secs(seconds))
            }
            Ok(a) if a.status() == 429 => {
                door.throttled.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(a) if a.status() == 500 => {
                door.failed.fetch_add(1, Ordering::Relaxed);
                None
            }
            // Anything else (a killed submission process, a refused connection): the same key
            // again shortly, as a client should.
            _ => {
                door.other.fetch_add(1, Ordering::Relaxed);
                None
            }
        };
        let wait = match wait {
            Some(retry_after) => retry_after,
            None => {
                backoff = (backoff * 2).min(Duration::from_secs(30));
                backoff
            }
        };
        tokio::time::sleep(wait.mul_f64(1.0 + 0.2 * jitter.unit())).await;
    }
    None
}

/// Which of the demo's workflows the stack runs, besides the reference one.
#[derive(Clone, Copy)]
struct Shapes {
    accounts: bool,
    express: bool,
    split: bool,
}

/// The path and body of the demo's `i`th order: a shop order, or (with `accounts`, one in
/// [`ACCOUNT_EVERY`]) an account to open; with `express`, the shop order after each account
/// runs its express variant; with `split`, one in [`SPLIT_EVERY`] is shipped parcel by parcel.
fn order(api: &str, i: usize, shapes: Shapes) -> (String, String) {
    let Shapes { accounts, express, split } = shapes;
    let account = accounts && i % ACCOUNT_EVERY == ACCOUNT_EVERY - 1;
    if account {
        let body = serde_json::json!({
            "customer": {"name": format!("Holder {i}"), "email": format!("holder-{i}@example.com")},
            "plan": if i % 2 == 0 { "basic" } else { "premium" },
            "initial_deposit": 1000 * (i % 50)
        });
        (format!("{api}/orders?workflow={ACCOUNT_WORKFLOW}"), body.to_string())
    } else {
        let body = format!(
            r#"{{"customer_id":"demo-{c}","currency":"EUR","items":[{{"sku":"BOOK-{s}","quantity":{q},"unit_price":1250}}],
            "ship_to":{{"name":"Ada","line1":"1 Main St","city":"Paris","postal_code":"75001","country":"FR"}}}}"#,
            c = i % 37,
            s = i % 5,
            q = 1 + i % 3
        );
        if express && i % ACCOUNT_EVERY == 0 {
            (format!("{api}/orders?workflow={EXPRESS_WORKFLOW}"), body)
        } else if split && i % SPLIT_EVERY == 1 {
            // Two to five parcels, each shipped by an order of its own.
            let mut order: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let parcels: Vec<serde_json::Value> = (0..2 + i % 4)
                .map(|k| serde_json::json!({"parcel": format!("P-{i}-{k}"), "kg": 1 + k}))
                .collect();
            order["parcels"] = parcels.into();
            (format!("{api}/orders?workflow={SPLIT_WORKFLOW}"), order.to_string())
        } else {
            (format!("{api}/orders"), body)
        }
    }
}
