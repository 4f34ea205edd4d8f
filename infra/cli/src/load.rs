//! `sas load`: offers a stack orders on a schedule, follows each to its end, and reports what
//! the stack made of them: throughput, latency percentiles, the door's refusals, errors, and
//! the API requests an order took.
//!
//! Arrivals are open: the i-th order arrives at its own time whatever the stack is doing, as a
//! client of its own, so that a slow stack shows as slow rather than as offered less. A client
//! refused at the door (503 with `Retry-After`, 429, or 500 when Lambda throttles) sends the same
//! order again with the same idempotency key, as the API asks of its clients.
//!
//! Latency is read from the order itself, not from how often it is polled: the door's part on
//! the client's clock (first try to acceptance), the stack's part on the stack's clock (the
//! order's `created_at` to its last write, once it has ended). Polls therefore start late and
//! thin out, and cost few requests.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::DateTime;
use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::client::{Api, CliError};

/// API Gateway's HTTP APIs, per request (the first 300 million a month, us-east-1).
const API_PRICE_PER_MILLION: f64 = 1.00;
/// The first poll of an accepted order, and the most time between two.
const FIRST_POLL: Duration = Duration::from_millis(250);
const MOST_BETWEEN_POLLS: Duration = Duration::from_secs(5);
/// Backoff of a client whose try got no `Retry-After`.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MOST_BACKOFF: Duration = Duration::from_secs(10);

/// What to offer the stack.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The workflow to run (the stack's default if none).
    pub workflow: Option<String>,
    /// Each order's body; `{{i}}` becomes the order's number and `{{run}}` the run's id.
    pub input: String,
    /// Orders a second at the start, and at the end if the rate ramps.
    pub rate: f64,
    pub ramp_to: Option<f64>,
    /// How long orders arrive.
    pub duration: Duration,
    /// How long, after the last arrival, orders are followed to their end.
    pub drain: Duration,
    /// Names the run's idempotency keys, so that a run sent again is not new orders.
    pub run: String,
}

impl Plan {
    /// Orders offered in all: the rate's integral over the duration.
    pub fn arrivals(&self) -> usize {
        let end = self.ramp_to.unwrap_or(self.rate);
        ((self.rate + end) / 2.0 * self.duration.as_secs_f64()).round() as usize
    }

    /// When the `i`th order arrives, from the start: where the rate's integral reaches `i`.
    pub fn arrival_at(&self, i: usize) -> Duration {
        let (r0, t) = (self.rate, self.duration.as_secs_f64());
        let slope = (self.ramp_to.unwrap_or(r0) - r0) / t;
        let n = i as f64;
        let at = if slope.abs() < 1e-12 {
            n / r0
        } else {
            // r0·s + slope·s²/2 = n
            (-r0 + (r0 * r0 + 2.0 * slope * n).max(0.0).sqrt()) / slope
        };
        Duration::from_secs_f64(at.clamp(0.0, t))
    }

    fn body(&self, i: usize) -> String {
        self.input.replace("{{i}}", &i.to_string()).replace("{{run}}", &self.run)
    }

    fn path(&self) -> String {
        match &self.workflow {
            Some(w) => format!("/orders?workflow={}", crate::encode(w)),
            None => "/orders".to_owned(),
        }
    }
}

/// How one order went.
#[derive(Clone, Debug)]
enum Outcome {
    /// It ended in `state` (Processed, Error or Cancelled).
    Ended { state: String, door: Duration, stack: Duration, ended_at: Duration },
    /// Accepted, and still not ended when the run stopped following it.
    Unfinished,
    /// Never accepted: refused until the run ended, or rejected for good (a 4xx).
    NotAccepted,
}

/// What the clients met, all orders together.
#[derive(Debug, Default)]
struct Tally {
    posts: u64,
    gets: u64,
    /// 503 with `Retry-After`: the door shed the order while the queues were long.
    refused: u64,
    /// 429: the route's throttling.
    throttled: u64,
    /// 500: API Gateway's answer when Lambda throttles a function, or a function failed.
    failed: u64,
    /// No answer at all (a connection refused or timed out).
    unanswered: u64,
    /// Refused for good (400, 403, 413, 422...): the first such answer, and how many.
    rejected: u64,
    first_rejection: Option<String>,
    /// By second of the run: accepted, refused (503 or 429) and ended orders.
    accepted_by_second: BTreeMap<u64, u64>,
    refused_by_second: BTreeMap<u64, u64>,
}

impl Tally {
    fn at(map: &mut BTreeMap<u64, u64>, since_start: Duration) {
        *map.entry(since_start.as_secs()).or_default() += 1;
    }
}

/// Offers `plan` to the stack behind `api` and follows every order accepted.
pub async fn run(api: Arc<Api>, plan: Plan) -> Result<Value, CliError> {
    let orders = plan.arrivals();
    if orders == 0 {
        return Err(CliError::Usage("the plan offers no order: raise --rate or --duration".into()));
    }
    let plan = Arc::new(plan);
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start = Instant::now();
    let stop_following = start + plan.duration + plan.drain;
    let mut clients = Vec::with_capacity(orders);
    for i in 0..orders {
        let (api, plan, tally) = (api.clone(), plan.clone(), tally.clone());
        clients.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + plan.arrival_at(i)).into()).await;
            client(&api, &plan, i, start, stop_following, &tally).await
        }));
    }
    let mut outcomes = Vec::with_capacity(orders);
    for c in clients {
        outcomes.push(c.await.unwrap_or(Outcome::NotAccepted));
    }
    let tally = std::mem::take(&mut *tally.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(report(&plan, &outcomes, tally, start.elapsed()))
}

/// One order's client: sends it until it is accepted, then follows it to its end.
async fn client(
    api: &Api,
    plan: &Plan,
    i: usize,
    start: Instant,
    stop: Instant,
    tally: &Mutex<Tally>,
) -> Outcome {
    let note = |f: &dyn Fn(&mut Tally)| f(&mut tally.lock().unwrap_or_else(|e| e.into_inner()));
    let key = format!("{}-{i:07}", plan.run);
    let (path, body) = (plan.path(), plan.body(i));
    let first_try = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    let id = loop {
        if Instant::now() >= stop {
            return Outcome::NotAccepted;
        }
        let answer = api.once("POST", &path, &[("idempotency-key", &key)], &body).await;
        note(&|t| t.posts += 1);
        let wait = match answer {
            Ok(a) if a.status == 202 => match a.body["order_id"].as_str() {
                Some(id) => break id.to_owned(),
                None => {
                    note(&|t| t.unanswered += 1);
                    None
                }
            },
            Ok(a) if a.status == 503 || a.status == 429 => {
                let since = start.elapsed();
                note(&|t| {
                    if a.status == 503 {
                        t.refused += 1
                    } else {
                        t.throttled += 1
                    }
                    Tally::at(&mut t.refused_by_second, since);
                });
                a.retry_after.map(Duration::from_secs)
            }
            Ok(a) if a.status >= 500 => {
                note(&|t| t.failed += 1);
                None
            }
            Ok(a) => {
                let message = a.body.pointer("/error/message").and_then(Value::as_str).map_or_else(
                    || format!("{} {}", a.status, a.body),
                    |m| format!("{} {m}", a.status),
                );
                note(&|t| {
                    t.rejected += 1;
                    t.first_rejection.get_or_insert_with(|| message.clone());
                });
                return Outcome::NotAccepted;
            }
            Err(_) => {
                note(&|t| t.unanswered += 1);
                None
            }
        };
        let pause = wait.unwrap_or_else(|| {
            let b = backoff;
            backoff = (backoff * 2).min(MOST_BACKOFF);
            b
        });
        tokio::time::sleep(pause).await;
    };
    let door = first_try.elapsed();
    note(&|t| Tally::at(&mut t.accepted_by_second, start.elapsed()));

    let mut between = FIRST_POLL;
    loop {
        tokio::time::sleep(between).await;
        if Instant::now() >= stop {
            return Outcome::Unfinished;
        }
        between = (between * 2).min(MOST_BETWEEN_POLLS);
        let answer = api.once("GET", &format!("/orders/{id}"), &[], "").await;
        note(&|t| t.gets += 1);
        let Ok(view) = answer.map(|a| a.body) else { continue };
        let state = view["process_state"].as_str().unwrap_or_default();
        if !matches!(state, "Processed" | "Error" | "Cancelled") {
            continue;
        }
        let stamp = |field: &str| DateTime::parse_from_rfc3339(view[field].as_str()?).ok();
        let stack = match (stamp("created_at"), stamp("updated_at")) {
            (Some(from), Some(to)) => (to - from).to_std().unwrap_or_default(),
            _ => Duration::ZERO,
        };
        let accepted_at = first_try.saturating_duration_since(start) + door;
        return Outcome::Ended {
            state: state.to_owned(),
            door,
            stack,
            ended_at: accepted_at + stack,
        };
    }
}

/// The run's figures, as JSON; [`render`] prints them for people.
fn report(plan: &Plan, outcomes: &[Outcome], tally: Tally, took: Duration) -> Value {
    let mut end_to_end = histogram();
    let mut stack = histogram();
    let mut states: BTreeMap<String, u64> = BTreeMap::new();
    let mut ended_by_second: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut unfinished, mut not_accepted) = (0u64, 0u64);
    for outcome in outcomes {
        match outcome {
            Outcome::Ended { state, door, stack: s, ended_at } => {
                *states.entry(state.clone()).or_default() += 1;
                let _ = end_to_end.record(millis(*door + *s));
                let _ = stack.record(millis(*s));
                Tally::at(&mut ended_by_second, *ended_at);
            }
            Outcome::Unfinished => unfinished += 1,
            Outcome::NotAccepted => not_accepted += 1,
        }
    }
    let offered = outcomes.len() as u64;
    let accepted = offered - not_accepted;
    let seconds = plan.duration.as_secs_f64();
    let requests = tally.posts + tally.gets;
    let per_order = |n: u64| if accepted == 0 { 0.0 } else { n as f64 / accepted as f64 };
    let last = ended_by_second.keys().chain(tally.accepted_by_second.keys()).max().copied();
    let mut offered_by_second: BTreeMap<u64, u64> = BTreeMap::new();
    for i in 0..outcomes.len() {
        Tally::at(&mut offered_by_second, plan.arrival_at(i));
    }
    let by_second: Vec<Value> = (0..=last.unwrap_or(0))
        .map(|s| {
            json!({
                "second": s,
                "offered": offered_by_second.get(&s).copied().unwrap_or(0),
                "accepted": tally.accepted_by_second.get(&s).copied().unwrap_or(0),
                "refused": tally.refused_by_second.get(&s).copied().unwrap_or(0),
                "ended": ended_by_second.get(&s).copied().unwrap_or(0),
            })
        })
        .collect();
    let peak = ended_by_second.values().max().copied().unwrap_or(0);
    // Over the time each took: the arrivals' window at least, to the last order accepted or
    // ended (a backlog drains after the arrivals stop).
    let span = |last: Option<u64>| last.map_or(seconds, |s| seconds.max(s as f64 + 1.0));
    let ended_count: u64 = states.values().sum();
    json!({
        "plan": {
            "workflow": plan.workflow,
            "rate": plan.rate,
            "ramp_to": plan.ramp_to,
            "seconds": seconds,
            "run": plan.run,
        },
        "took_seconds": took.as_secs_f64(),
        "offered": offered,
        "accepted": accepted,
        "not_accepted": not_accepted,
        "ended": states,
        "unfinished": unfinished,
        "door": {
            "refused_503": tally.refused,
            "throttled_429": tally.throttled,
            "failed_500": tally.failed,
            "unanswered": tally.unanswered,
            "rejected": tally.rejected,
            "first_rejection": tally.first_rejection,
        },
        "throughput": {
            "accepted_per_second":
                accepted as f64 / span(tally.accepted_by_second.keys().max().copied()),
            "ended_per_second": ended_count as f64 / span(ended_by_second.keys().max().copied()),
            "peak_ended_in_a_second": peak,
        },
        "latency_ms": {
            "end_to_end": percentiles(&end_to_end),
            "stack": percentiles(&stack),
        },
        "requests": {
            "posts": tally.posts,
            "gets": tally.gets,
            "per_order": per_order(requests),
            "api_cost_per_million_orders": per_order(requests) * API_PRICE_PER_MILLION,
        },
        "by_second": by_second,
    })
}

fn histogram() -> Histogram<u64> {
    // Milliseconds from 1 ms to a day, to three significant figures.
    Histogram::new_with_bounds(1, 86_400_000, 3).expect("bounds of 1 ms to a day are valid")
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn percentiles(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!(null);
    }
    json!({
        "count": h.len(),
        "p50": h.value_at_quantile(0.50),
        "p90": h.value_at_quantile(0.90),
        "p95": h.value_at_quantile(0.95),
        "p99": h.value_at_quantile(0.99),
        "p99_9": h.value_at_quantile(0.999),
        "max": h.max(),
    })
}

/// The report for people.
pub fn render(r: &Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let n = |p: &str| r.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
    let rate = match r.pointer("/plan/ramp_to").and_then(Value::as_f64) {
        Some(to) => format!("{} to {to}", n("/plan/rate")),
        None => n("/plan/rate").to_string(),
    };
    let _ = writeln!(
        t,
        "offered {:.0} orders over {:.0} s ({rate} a second); accepted {:.0}, not accepted {:.0}",
        n("/offered"),
        n("/plan/seconds"),
        n("/accepted"),
        n("/not_accepted"),
    );
    let ended: Vec<String> = r["ended"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(state, count)| format!("{state} {count}"))
        .collect();
    let _ = writeln!(
        t,
        "ended: {}; unfinished {:.0}",
        if ended.is_empty() { "none".to_owned() } else { ended.join(", ") },
        n("/unfinished")
    );
    let _ = writeln!(
        t,
        "door: {:.0} refused (503), {:.0} throttled (429), {:.0} failed (500), {:.0} unanswered, {:.0} rejected{}",
        n("/door/refused_503"),
        n("/door/throttled_429"),
        n("/door/failed_500"),
        n("/door/unanswered"),
        n("/door/rejected"),
        r.pointer("/door/first_rejection")
            .and_then(Value::as_str)
            .map(|m| format!(" (first: {m})"))
            .unwrap_or_default(),
    );
    let _ = writeln!(
        t,
        "throughput: {:.1} accepted and {:.1} ended a second, each from the start to its last; at most {:.0} ended in one second",
        n("/throughput/accepted_per_second"),
        n("/throughput/ended_per_second"),
        n("/throughput/peak_ended_in_a_second"),
    );
    for (name, key) in [("first try to end", "end_to_end"), ("the stack alone", "stack")] {
        let p = |q: &str| n(&format!("/latency_ms/{key}/{q}")) / 1000.0;
        let _ = writeln!(
            t,
            "latency, {name}: p50 {:.3} s, p90 {:.3} s, p99 {:.3} s, p99.9 {:.3} s, max {:.3} s",
            p("p50"),
            p("p90"),
            p("p99"),
            p("p99_9"),
            p("max"),
        );
    }
    let _ = writeln!(
        t,
        "API requests: {:.0} submissions and {:.0} status reads, {:.2} an order: ${:.2} per million orders at $1.00 per million requests (an order's other costs: cargo run -p sas-infra --bin cost-model)",
        n("/requests/posts"),
        n("/requests/gets"),
        n("/requests/per_order"),
        n("/requests/api_cost_per_million_orders"),
    );
    let _ = writeln!(t, "\n| second | offered | accepted | refused | ended |");
    let _ = writeln!(t, "| ---: | ---: | ---: | ---: | ---: |");
    for s in r["by_second"].as_array().into_iter().flatten() {
        let c = |k: &str| s[k].as_u64().unwrap_or(0);
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} | {} |",
            c("second"),
            c("offered"),
            c("accepted"),
            c("refused"),
            c("ended")
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rate: f64, ramp_to: Option<f64>, seconds: u64) -> Plan {
        Plan {
            workflow: None,
            input: r#"{"n":{{i}},"run":"{{run}}"}"#.into(),
            rate,
            ramp_to,
            duration: Duration::from_secs(seconds),
            drain: Duration::ZERO,
            run: "r1".into(),
        }
    }

    #[test]
    fn a_steady_rate_spaces_arrivals_evenly() {
        let p = plan(20.0, None, 10);
        assert_eq!(p.arrivals(), 200);
        assert_eq!(p.arrival_at(0), Duration::ZERO);
        assert_eq!(p.arrival_at(20), Duration::from_secs(1));
        assert_eq!(p.arrival_at(199), Duration::from_secs_f64(9.95));
        assert_eq!(p.body(7), r#"{"n":7,"run":"r1"}"#);
    }

    #[test]
    fn a_ramp_offers_its_integral_and_arrives_ever_closer() {
        // 0 to 100 a second over 10 s: 500 orders, a quarter of them in the first half.
        let p = plan(0.0, Some(100.0), 10);
        assert_eq!(p.arrivals(), 500);
        let half = (0..500).filter(|&i| p.arrival_at(i) < Duration::from_secs(5)).count();
        assert_eq!(half, 125);
        let gaps: Vec<Duration> = (1..500).map(|i| p.arrival_at(i) - p.arrival_at(i - 1)).collect();
        assert!(gaps.windows(2).all(|w| w[1] <= w[0] + Duration::from_micros(1)));
        // Down, too.
        let down = plan(100.0, Some(50.0), 10);
        assert_eq!(down.arrivals(), 750);
        assert!(down.arrival_at(749) <= Duration::from_secs(10));
    }

    #[test]
    fn the_report_counts_each_end_and_the_latency_adds_the_door_to_the_stack() {
        let p = plan(2.0, None, 2);
        let ended = |ms: u64, at: u64| Outcome::Ended {
            state: "Processed".into(),
            door: Duration::from_millis(100),
            stack: Duration::from_millis(ms),
            ended_at: Duration::from_secs(at),
        };
        let outcomes = [ended(200, 0), ended(400, 1), Outcome::Unfinished, Outcome::NotAccepted];
        let tally = Tally { posts: 5, gets: 6, refused: 1, ..Tally::default() };
        let r = report(&p, &outcomes, tally, Duration::from_secs(3));
        assert_eq!((r["offered"].as_u64(), r["accepted"].as_u64()), (Some(4), Some(3)));
        assert_eq!(r["ended"]["Processed"], 2);
        assert_eq!(r["unfinished"], 1);
        assert_eq!(r.pointer("/latency_ms/end_to_end/max").and_then(Value::as_u64), Some(500));
        assert_eq!(r.pointer("/latency_ms/stack/p50").and_then(Value::as_u64), Some(200));
        assert_eq!(r.pointer("/requests/per_order").and_then(Value::as_f64), Some(11.0 / 3.0));
        let text = render(&r);
        assert!(text.contains("Processed 2"), "{text}");
        assert!(text.contains("1 refused (503)"), "{text}");
    }
}
