//! The admin API under `/admin/`: operators find the orders that need them, read one, give it
//! a command, and look at and move back dead letters.
//!
//! Every route sits behind `AWS_IAM` authorisation. The caller's principal, which API Gateway
//! puts in the request context, is who a command is recorded as; a request without one is
//! refused (403), so a route left open by mistake still changes nothing.
//!
//! | Route | Does |
//! |---|---|
//! | `GET /admin/orders?list=failed\|paused\|in-flight\|reported\|awaiting-answer` | a page of orders (filters: `older_than` seconds, `step`, `cause`; `limit`, `after`) |
//! | `GET /admin/orders/{id}?values=references\|whole` | the order with its timeline, commands and what is left to undo, and its workflow's steps outlined, each with the steps whose outputs it is given; with `values=whole`, its stored input and outputs read back whole |
//! | `POST /admin/orders/{id}/{cancel\|pause\|resume\|redrive}` | a command: `{"command_id", "reason", "compensation"?}` |
//! | `POST /admin/orders/{id}/steps/{step}/{complete\|refuse}` | answers a step that waits for a callback, for the party outside: `{"reason", "output"?}` |
//! | `GET /admin/dead-letters` | each dead-letter queue's depth |
//! | `GET /admin/dead-letters/{queue}?limit=` | up to 10 of its messages, left in place |
//! | `POST /admin/dead-letters/{queue}/redrive` | moves its messages back to their queue: `{"reason"}`, logged with the caller |
//! | `GET /admin/lookup?idempotency_key=&submitter=` | the order a submitter's idempotency key made |
//! | `GET /admin/search?key=&workflow=` | the orders whose workflow's `search_key` reads `key` from their input (a customer), ended ones included, newest first (`limit`, `after`) |
//! | `POST /admin/bulk` | a command for every order a listing holds, as counted: `{"command", "filter", "reason", "command_id", "expect"}`; driven by the supervisor |
//! | `GET /admin/bulk`, `GET /admin/bulk/{id}` | the bulk commands, or one, with what each order made of it |
//! | `GET /admin/counts` | how many orders each listing holds (the same filters), counted by its index |
//! | `GET /admin/me` | who the API takes the caller for |
//! | `GET /console/{file}` | the console's page and its configuration, where the stack serves it (no authorisation: the page holds nothing) |
//! | `GET /admin/keys?key=&limit=` | the concurrency keys with orders running (how many run and wait, since when), or one key's running orders and line |
//! | `GET /admin/services` | each service: open or held, and each hold of it or of one of its actions (since when, why, by whom, probing, what the probes last met), orders waiting |
//! | `GET /admin/services/{agent}/waiting?action=` | the orders waiting for a hold of it, longest waiting first, and how many |
//! | `POST /admin/services/{agent}/{hold\|release}` | holds a service, or one of its actions, by hand, or releases it: `{"reason", "action"?}` |

pub mod console;
pub mod settings;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use lambda_http::http::{HeaderValue, Method, StatusCode};
use lambda_http::{Body, Request, RequestExt, Response};
use sas_aws::api;
use sas_aws::dead_letters::DeadLetters;
use sas_engine::bulk::BulkFilter;
use sas_engine::catalogue::Catalogue;
use sas_engine::ids::{IdempotencyKey, Owner};
use sas_engine::machine::Refused;
use sas_engine::payload::NoPayloads;
use sas_engine::ports::{
    BulkBook, Clock, EventBus, HeldIndex, KeyIndex, ListQuery, Listing, OrderFinder, Outbox, Pace,
    Payloads, Read, ServiceBook, StateStore,
};
use sas_engine::services::search::{self, SearchQuery};
use sas_engine::services::{
    Applied, Command, Commanded, DeskRefusal, Keyring, Operator, ServiceDesk, StatusService,
    Values, bulk, outline,
};
use sas_engine::state::CommandKind;
use sas_engine::{Error, OrderId};
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::error;

/// Orders on one page unless the caller asks otherwise, and the most it may ask for.
pub const DEFAULT_PAGE: usize = 25;
pub const MAX_PAGE: usize = 100;
/// Bulk commands listed, the newest first.
const BULK_JOBS_LISTED: usize = 20;
/// Most orders a count of one listing reads up to: past it, the count says "at least".
const COUNT_CAP: u64 = 10_000;
/// Longest age a listing's filter takes, in seconds: a leap year.
const MAX_AGE_S: u64 = 366 * 86_400;
/// Longest step or cause filter accepted.
const MAX_FILTER_LEN: usize = 64;
/// Longest concurrency key asked for, in characters: a group name, a slash and a value.
const MAX_KEY_LEN: usize = 400;
/// Longest reason a hold or release may give.
const MAX_REASON_CHARS: usize = 300;
/// Largest command body accepted.
const MAX_BODY_BYTES: usize = 4 * 1024;
/// Most dead letters one redrive call copies where SQS's move task is not available, and the
/// time it may take (the function's timeout is 30 s).
const COPY_MAX: u64 = 1_000;
const COPY_BUDGET: Duration = Duration::from_secs(20);

/// What the admin API works with.
#[derive(Debug)]
pub struct Admin<S, Q, B, C, G, P = NoPayloads> {
    pub status: StatusService<S, P>,
    pub operator: Operator<S, Q, B, C, P>,
    pub finder: S,
    pub clock: C,
    /// Shards of the expiry index an in-flight listing reads: all that may hold an entry.
    pub shards: u16,
    pub dead_letters: DeadLetters,
    /// The services, their holds, and the orders waiting for them.
    pub desk: ServiceDesk<G, S, C>,
    /// The concurrency keys, their running orders and their lines.
    pub keyring: Keyring<S>,
    /// The workflows, whose steps an order's view outlines.
    pub catalogue: Arc<Catalogue>,
    /// The console, when the stack serves it: where its users sign in.
    pub console: Option<console::ConsoleSite>,
}

/// A hold's or release's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceBody {
    reason: String,
    /// One action of the service alone; absent: the whole service. A `null` is refused, as
    /// any value that is not a string.
    #[serde(default, deserialize_with = "present_string")]
    action: Option<String>,
}

/// A field that is a string when present.
fn present_string<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    String::deserialize(d).map(Some)
}

/// A command's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandBody {
    command_id: String,
    reason: String,
    #[serde(default)]
    compensation: bool,
}

/// Handles one request routed to `/admin/...`.
pub async fn handle<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    request: Request,
) -> Response<Body>
where
    S: StateStore + OrderFinder + HeldIndex + KeyIndex + BulkBook,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
    G: ServiceBook + Pace,
{
    if request.uri().path().starts_with("/console") {
        return console(admin.console.as_ref(), &request).await;
    }
    // Only a named principal may act: the anonymous caller of a route left without its
    // authorizer by mistake changes nothing.
    let Some(caller) = api::caller(&request).ok().filter(|c| !c.is_anonymous()).map(String::from)
    else {
        return api::error(
            StatusCode::FORBIDDEN,
            "forbidden",
            "no caller identity: the admin API needs AWS_IAM (SigV4-signed) requests",
            json!({}),
        );
    };
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = request.method().clone();
    let query = request.query_string_parameters();
    let query: HashMap<&str, &str> = query.iter().collect();
    match (method, segments.as_slice()) {
        (Method::GET, ["admin", "orders"]) => list(admin, &query).await,
        (Method::GET, ["admin", "orders", id]) => show(admin, id, &query).await,
        (Method::POST, ["admin", "orders", id, command]) => {
            order_command(admin, id, command, &caller, request.body()).await
        }
        (Method::POST, ["admin", "orders", id, "steps", step, verb @ ("complete" | "refuse")]) => {
            let Ok(order_id) = id.parse::<OrderId>() else {
                return bad_request("the order id must be a UUID");
            };
            match api::answering(verb, step, request.body(), &caller, true) {
                Ok(answer) => {
                    let outcome = admin.operator.answer(order_id, &answer).await;
                    api::answered(order_id, &answer, outcome)
                }
                Err(response) => *response,
            }
        }
        (Method::GET, ["admin", "dead-letters"]) => match admin.dead_letters.summaries().await {
            Ok(queues) => api::json(StatusCode::OK, &json!({ "queues": queues })),
            Err(e) => failure(&e),
        },
        (Method::GET, ["admin", "dead-letters", queue]) => {
            let Some(dlq) = admin.dead_letters.queue(queue) else {
                return unknown_queue(admin, queue);
            };
            let limit = match number(&query, "limit", 10, 1, 10) {
                Ok(l) => l,
                Err(message) => return bad_request(&message),
            };
            match admin.dead_letters.peek(dlq, limit).await {
                Ok(messages) => {
                    api::json(StatusCode::OK, &json!({ "queue": queue, "messages": messages }))
                }
                Err(e) => failure(&e),
            }
        }
        (Method::POST, ["admin", "dead-letters", queue, "redrive"]) => {
            let Some(dlq) = admin.dead_letters.queue(queue) else {
                return unknown_queue(admin, queue);
            };
            let reason = match reason_of(request.body()) {
                Ok(reason) => reason,
                Err(response) => return *response,
            };
            match admin.dead_letters.redrive(dlq, COPY_MAX, COPY_BUDGET).await {
                Ok(moved) => {
                    tracing::info!(queue, by = %caller, reason, "dead letters redriven");
                    let mut body = serde_json::to_value(&moved).unwrap_or(Value::Null);
                    body["queue"] = Value::String((*queue).to_owned());
                    api::json(StatusCode::OK, &body)
                }
                Err(e) => failure(&e),
            }
        }
        (Method::GET, ["admin", "counts"]) => counts(admin, &query).await,
        (Method::POST, ["admin", "bulk"]) => bulk_start(admin, &caller, request.body()).await,
        (Method::GET, ["admin", "bulk"]) => match admin.finder.jobs(BULK_JOBS_LISTED).await {
            Ok(jobs) => api::json(StatusCode::OK, &json!({ "jobs": jobs })),
            Err(e) => failure(&e),
        },
        (Method::GET, ["admin", "bulk", id]) => match admin.finder.job(id).await {
            Ok(Some(job)) => api::json(StatusCode::OK, &json!({ "job": job })),
            Ok(None) => api::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no bulk command with this id",
                json!({}),
            ),
            Err(e) => failure(&e),
        },
        (Method::GET, ["admin", "lookup"]) => lookup(admin, &query).await,
        (Method::GET, ["admin", "search"]) => search_orders(admin, &query).await,
        (Method::GET, ["admin", "me"]) => api::json(StatusCode::OK, &json!({ "caller": caller })),
        (Method::GET, ["admin", "keys"]) => keys(&admin.keyring, &query).await,
        (Method::GET, ["admin", "services"]) => match admin.desk.list().await {
            Ok(services) => api::json(StatusCode::OK, &json!({ "services": services })),
            Err(e) => failure(&e),
        },
        (Method::GET, ["admin", "services", service, "waiting"]) => {
            waiting(admin, service, &query).await
        }
        (Method::POST, ["admin", "services", service, verb]) => {
            service_command(admin, service, verb, &caller, request.body()).await
        }
        _ => api::error(StatusCode::NOT_FOUND, "not_found", "no such admin route", json!({})),
    }
}

async fn list<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: StateStore + OrderFinder,
    C: Clock,
    P: Payloads,
{
    let listing = match query.get("list").copied().unwrap_or("failed") {
        "failed" => Listing::Failed,
        "paused" => Listing::Paused,
        "in-flight" => Listing::InFlight { older_than: Duration::ZERO },
        "reported" => Listing::Reported,
        "awaiting-answer" => Listing::AwaitingAnswer,
        other => {
            return bad_request(&format!(
                "list={other:?}: must be failed, paused, in-flight, reported or awaiting-answer"
            ));
        }
    };
    let request = match list_query(admin, listing, query) {
        Ok(request) => request,
        Err(message) => return bad_request(&message),
    };
    match admin.finder.find(&request).await {
        Ok(page) => {
            let orders: Vec<Value> = page
                .orders
                .iter()
                .map(|o| {
                    json!({
                        "order_id": o.order_id,
                        "workflow": o.workflow,
                        "workflow_version": o.workflow_version,
                        "since": o.since.to_rfc3339(),
                        "step": o.step,
                        "cause": o.cause,
                    })
                })
                .collect();
            api::json(StatusCode::OK, &json!({ "orders": orders, "next": page.next }))
        }
        Err(Error::InvalidCommand(message)) => bad_request(&message),
        Err(e) => failure(&e),
    }
}

/// `GET /admin/counts`: how many orders each listing holds with the filters given, each
/// counted by its index up to [`COUNT_CAP`].
async fn counts<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: OrderFinder,
    C: Clock,
{
    // Read once, as the in-flight listing takes them (with its age); the others keep the
    // same filters.
    let in_flight = Listing::InFlight { older_than: Duration::ZERO };
    let base = match list_query(admin, in_flight, query) {
        Ok(request) => request,
        Err(message) => return bad_request(&message),
    };
    let lists = [
        ("failed", Listing::Failed),
        ("reported", Listing::Reported),
        ("paused", Listing::Paused),
        ("awaiting_answer", Listing::AwaitingAnswer),
        ("in_flight", base.listing),
    ];
    let mut body = serde_json::Map::new();
    for (name, listing) in lists {
        let request = ListQuery { listing, ..base.clone() };
        match admin.finder.count(&request, COUNT_CAP).await {
            Ok(counted) => {
                body.insert(name.to_owned(), json!(counted));
            }
            Err(e) => return failure(&e),
        }
    }
    api::json(StatusCode::OK, &Value::Object(body))
}

/// A bulk command's body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BulkBody {
    command: String,
    #[serde(default)]
    compensation: bool,
    /// The listing and its filters: `{"list", "workflow"?, "step"?, "cause"?, "older_than_s"?}`.
    filter: BulkFilter,
    reason: String,
    command_id: String,
    /// How many orders the caller was shown the listing holds.
    expect: u64,
}

/// `POST /admin/bulk`: a command for every order a listing holds, as the caller counted them
/// (`GET /admin/counts`); refused with the count of now if the listing changed.
async fn bulk_start<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    caller: &str,
    body: &Body,
) -> Response<Body>
where
    S: StateStore + OrderFinder + BulkBook,
    C: Clock,
{
    let bytes = api::body_bytes(body);
    if bytes.len() > MAX_BODY_BYTES {
        return bad_request(&format!("the body must be at most {MAX_BODY_BYTES} bytes"));
    }
    let body: BulkBody = match serde_json::from_slice(bytes) {
        Ok(b) => b,
        Err(e) => {
            return bad_request(&format!(
                "the body must be {{\"command\", \"filter\": {{\"list\", ...}}, \"reason\", \"command_id\", \"expect\"}}: {e}"
            ));
        }
    };
    let kind = match command_kind(&body.command, body.compensation) {
        Some(Ok(kind)) => kind,
        Some(Err(message)) => return bad_request(message),
        None if body.compensation => return bad_request(COMPENSATION_REDRIVE_ONLY),
        None => {
            return bad_request(&format!(
                "command {:?}: cancel, pause, resume, redrive, acknowledge or undo",
                body.command
            ));
        }
    };
    let filter = &body.filter;
    let named = [("step", &filter.step), ("cause", &filter.cause), ("workflow", &filter.workflow)];
    for (name, value) in named {
        if let Err(message) = filter_value(&format!("filter.{name}"), value.as_deref()) {
            return bad_request(&message);
        }
    }
    if filter.older_than_s > MAX_AGE_S {
        return bad_request(&format!("filter.older_than_s must be at most {MAX_AGE_S}"));
    }
    let command = match Command::new(kind, &body.command_id, caller, &body.reason) {
        Ok(c) => c,
        Err(Error::InvalidCommand(message)) => return bad_request(&message),
        Err(e) => return failure(&e),
    };
    let ask = bulk::Ask { command, filter: body.filter, expected: body.expect };
    match bulk::start(&admin.finder, &admin.finder, ask, admin.clock.now(), admin.shards).await {
        Ok(bulk::Started::New(job)) => {
            tracing::info!(job = %job.id, by = %job.by, reason = %job.reason, "bulk command asked for");
            api::json(StatusCode::ACCEPTED, &json!({ "job": job }))
        }
        Ok(bulk::Started::Existing(job)) => api::json(StatusCode::OK, &json!({ "job": job })),
        Ok(bulk::Started::Changed { count }) => api::error(
            StatusCode::CONFLICT,
            "filter_changed",
            &format!(
                "the listing holds {} orders now, not the {} shown: count again, and act on what matches now",
                count.orders, body.expect
            ),
            json!({ "count": count }),
        ),
        Ok(bulk::Started::TooMany { count }) => api::error(
            StatusCode::BAD_REQUEST,
            "too_many",
            &format!("more than {} orders match: narrow the filter", count.orders),
            json!({ "count": count }),
        ),
        Err(Error::InvalidCommand(message)) => bad_request(&message),
        Err(e) => failure(&e),
    }
}

/// `GET /admin/lookup?idempotency_key=&submitter=`: the order a submitter's key made, found by
/// the id the key maps to (a read of one record, never a search).
async fn lookup<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: StateStore,
{
    let (Some(key), Some(submitter)) = (query.get("idempotency_key"), query.get("submitter"))
    else {
        return bad_request(
            "idempotency_key and submitter are both needed: a key is its submitter's own",
        );
    };
    let key = match IdempotencyKey::parse(key) {
        Ok(key) => key,
        Err(e) => return bad_request(&format!("idempotency_key: {e}")),
    };
    let submitter = match Owner::try_from((*submitter).to_owned()) {
        Ok(owner) => owner,
        Err(e) => return bad_request(&format!("submitter: {e}")),
    };
    let order_id = OrderId::for_owner_key(&submitter, &key);
    match admin.finder.load(order_id, Read::Eventual).await {
        Ok(Some(_)) => api::json(StatusCode::OK, &json!({ "order_id": order_id })),
        Ok(None) => api::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "no order was made with this key by this submitter (the submitter as an order shows it: an IAM ARN, or a token's issuer and subject)",
            json!({}),
        ),
        Err(e) => failure(&e),
    }
}

/// `GET /admin/search?key=&workflow=`: the orders whose workflow's `search_key` reads `key`
/// from their input, ended ones included, the newest first, a page at a time; with the key
/// each workflow declares, so that the caller knows what was searched.
async fn search_orders<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: StateStore + OrderFinder,
{
    let Some(value) = query.get("key") else {
        return bad_request(
            "key is needed: the value to find orders by, as a workflow's search_key reads it from their input (a customer id, say)",
        );
    };
    let limit = match number(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE) {
        Ok(limit) => limit,
        Err(message) => return bad_request(&message),
    };
    let workflow = match filter_value("workflow", query.get("workflow").copied()) {
        Ok(workflow) => workflow,
        Err(message) => return bad_request(&message),
    };
    let catalogue = &admin.catalogue;
    let declared: BTreeMap<&str, &str> = catalogue
        .names()
        .into_iter()
        .filter_map(|name| Some((name, catalogue.current(name)?.search_key()?)))
        .collect();
    let request = SearchQuery {
        value: (*value).to_owned(),
        workflow,
        limit,
        after: query.get("after").map(|a| (*a).to_owned()),
    };
    match search::search(&admin.finder, &request).await {
        Ok(page) => api::json(
            StatusCode::OK,
            &json!({ "orders": page.orders, "next": page.next, "search_keys": declared }),
        ),
        Err(Error::InvalidCommand(message)) => bad_request(&message),
        Err(e) => failure(&e),
    }
}

/// The listing query `query`'s parameters ask for (`older_than` applies to in-flight
/// listings), or why they cannot be read.
fn list_query<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    listing: Listing,
    query: &HashMap<&str, &str>,
) -> Result<ListQuery, String>
where
    C: Clock,
{
    let most = MAX_AGE_S as usize;
    let older_than = Duration::from_secs(number(query, "older_than", 0, 0, most)? as u64);
    let listing = match listing {
        Listing::InFlight { .. } => Listing::InFlight { older_than },
        other => other,
    };
    let limit = number(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)?;
    let filter = |name: &str| filter_value(name, query.get(name).copied());
    Ok(ListQuery {
        listing,
        step: filter("step")?,
        cause: filter("cause")?,
        workflow: filter("workflow")?,
        now: admin.clock.now(),
        shards: admin.shards,
        limit,
        after: query.get("after").map(|a| (*a).to_owned()),
    })
}

const COMPENSATION_REDRIVE_ONLY: &str = "compensation applies to redrive only";

/// The command a verb names, with `compensation` for a redrive of the undos: `None` if the
/// verb names no command, an error if `compensation` does not fit it.
fn command_kind(verb: &str, compensation: bool) -> Option<Result<CommandKind, &'static str>> {
    let kind = match verb {
        "cancel" => CommandKind::Cancel,
        "pause" => CommandKind::Pause,
        "resume" => CommandKind::Resume,
        "acknowledge" => CommandKind::Acknowledge,
        "undo" => CommandKind::Undo,
        "redrive" if compensation => return Some(Ok(CommandKind::RedriveCompensation)),
        "redrive" => CommandKind::Redrive,
        _ => return None,
    };
    Some(if compensation { Err(COMPENSATION_REDRIVE_ONLY) } else { Ok(kind) })
}

/// A listing's filter (`step`, `cause`, `workflow`), if given: a name of 1 to
/// [`MAX_FILTER_LEN`] letters, digits, '-' or '_'.
fn filter_value(name: &str, value: Option<&str>) -> Result<Option<String>, String> {
    match value {
        None => Ok(None),
        Some(v)
            if !v.is_empty()
                && v.len() <= MAX_FILTER_LEN
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b)) =>
        {
            Ok(Some(v.to_owned()))
        }
        Some(_) => Err(format!("{name} must be 1 to {MAX_FILTER_LEN} letters, digits, '-' or '_'")),
    }
}

/// `GET /admin/keys`: the busy keys, or the one `key` names.
async fn keys<S: StateStore + KeyIndex>(
    keyring: &Keyring<S>,
    query: &HashMap<&str, &str>,
) -> Response<Body> {
    let limit = match number(query, "limit", MAX_PAGE, 1, sas_engine::services::MAX_LINE) {
        Ok(l) => l,
        Err(message) => return bad_request(&message),
    };
    let answer = match query.get("key") {
        Some(key) if key.is_empty() || key.chars().count() > MAX_KEY_LEN => {
            return bad_request(&format!("key must be 1 to {MAX_KEY_LEN} characters"));
        }
        Some(key) => keyring.key(key, limit).await.map(|view| json!(view)),
        None => keyring.list(limit).await.map(|keys| json!({ "keys": keys })),
    };
    match answer {
        Ok(body) => api::json(StatusCode::OK, &body),
        Err(e) => failure(&e),
    }
}

async fn show<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    id: &str,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: StateStore,
    P: Payloads,
{
    let Ok(order_id) = id.parse::<OrderId>() else {
        return bad_request("the order id must be a UUID");
    };
    let Some(values) = Values::asked(query.get("values").copied()) else {
        return bad_request("values must be references or whole");
    };
    match admin.status.operator_view(order_id, values).await {
        Ok(Some(view)) => match serde_json::to_value(&view) {
            Ok(mut body) => {
                // The steps as the order's version declares them, for a console to draw; absent
                // if this deployment no longer has that version.
                let version =
                    admin.catalogue.version(&view.view.workflow, view.view.workflow_version);
                if let Some(workflow) = version {
                    body["outline"] = json!(outline(workflow));
                }
                api::json(StatusCode::OK, &body)
            }
            Err(e) => failure(&Error::rejected("admin", e)),
        },
        Ok(None) => not_found(),
        Err(e) => failure(&e),
    }
}

async fn order_command<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    id: &str,
    command: &str,
    caller: &str,
    body: &Body,
) -> Response<Body>
where
    S: StateStore,
    Q: Outbox,
    B: EventBus,
    C: Clock,
    P: Payloads,
{
    let Ok(order_id) = id.parse::<OrderId>() else {
        return bad_request("the order id must be a UUID");
    };
    let bytes = api::body_bytes(body);
    if bytes.len() > MAX_BODY_BYTES {
        return bad_request(&format!("the body must be at most {MAX_BODY_BYTES} bytes"));
    }
    let body: CommandBody = match serde_json::from_slice(bytes) {
        Ok(b) => b,
        Err(e) => {
            return bad_request(&format!(
                "the body must be {{\"command_id\", \"reason\", \"compensation\"?}}: {e}"
            ));
        }
    };
    let kind = match command_kind(command, body.compensation) {
        Some(Ok(kind)) => kind,
        Some(Err(message)) => return bad_request(message),
        None => {
            return api::error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such command: cancel, pause, resume, redrive, acknowledge or undo",
                json!({}),
            );
        }
    };
    let command = match Command::new(kind, &body.command_id, caller, &body.reason) {
        Ok(c) => c,
        Err(Error::InvalidCommand(message)) => return bad_request(&message),
        Err(e) => return failure(&e),
    };
    match admin.operator.command(order_id, &command).await {
        Ok(Some(Commanded { applied: Applied::Refused(refused), record })) => {
            refusal(record.process_state.as_str(), &refused)
        }
        Ok(Some(done)) => {
            let r = &done.record;
            api::json(
                StatusCode::OK,
                &json!({
                    "order_id": order_id,
                    "command": kind.as_str(),
                    "command_id": command.id,
                    "applied": if done.applied == Applied::Now { "now" } else { "before" },
                    "process_state": r.process_state.as_str(),
                    "phase": r.phase,
                    "waiting": r.stop.as_ref().map(|s| s.command.as_str()),
                }),
            )
        }
        Ok(None) => not_found(),
        Err(e) => failure(&e),
    }
}

/// `GET /admin/services/{agent}/waiting?action=&limit=`: the orders waiting for a hold of the
/// service (or of one action of it), the longest waiting first, and how many wait.
async fn waiting<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    service: &str,
    query: &HashMap<&str, &str>,
) -> Response<Body>
where
    S: HeldIndex,
{
    if !admin.desk.agents.iter().any(|a| a.as_str() == service) {
        return api::error(
            StatusCode::NOT_FOUND,
            "unknown_service",
            &format!("no agent {service:?} is deployed"),
            json!({}),
        );
    }
    let limit = match number(query, "limit", MAX_PAGE, 1, MAX_PAGE) {
        Ok(l) => l,
        Err(message) => return bad_request(&message),
    };
    let action = query.get("action").copied();
    if action.is_some_and(|a| {
        a.is_empty()
            || a.len() > MAX_FILTER_LEN
            || !a.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
    }) {
        return bad_request(&format!(
            "action must be 1 to {MAX_FILTER_LEN} letters, digits, '-' or '_'"
        ));
    }
    let on = sas_engine::health::hold_key(service, action);
    let (orders, count) =
        match (admin.finder.held(&on, limit).await, admin.finder.count_held(&on).await) {
            (Ok(orders), Ok(count)) => (orders, count),
            (Err(e), _) | (_, Err(e)) => return failure(&e),
        };
    api::json(
        StatusCode::OK,
        &json!({ "service": service, "action": action, "waiting": count, "orders": orders }),
    )
}

/// A hold or a release of a service, recorded with the caller and the reason given.
async fn service_command<S, Q, B, C, G, P>(
    admin: &Admin<S, Q, B, C, G, P>,
    service: &str,
    verb: &str,
    caller: &str,
    body: &Body,
) -> Response<Body>
where
    S: HeldIndex,
    C: Clock,
    P: Payloads,
    G: ServiceBook + Pace,
{
    if !matches!(verb, "hold" | "release") {
        return bad_request(&format!("{verb:?}: a service is held (hold) or released (release)"));
    }
    let bytes = api::body_bytes(body);
    if bytes.len() > MAX_BODY_BYTES {
        return bad_request(&format!("the body must be at most {MAX_BODY_BYTES} bytes"));
    }
    let body: ServiceBody = match serde_json::from_slice(bytes) {
        Ok(b) => b,
        Err(e) => {
            return bad_request(&format!("the body must be {{\"reason\", \"action\"?}}: {e}"));
        }
    };
    if body.reason.trim().is_empty() || body.reason.chars().count() > MAX_REASON_CHARS {
        return bad_request(&format!(
            "a reason of 1 to {MAX_REASON_CHARS} characters is required: it is recorded with the hold or release"
        ));
    }
    let action = body.action.as_deref();
    let done = match verb {
        "hold" => admin.desk.hold(service, action, caller, &body.reason).await,
        _ => admin.desk.release(service, action, caller, &body.reason).await,
    };
    match done {
        Ok(Ok(view)) => api::json(StatusCode::OK, &json!({ "service": view })),
        Ok(Err(refused @ (DeskRefusal::Unknown { .. } | DeskRefusal::UnknownAction { .. }))) => {
            api::error(StatusCode::NOT_FOUND, refused.code(), &refused.to_string(), json!({}))
        }
        Ok(Err(refused)) => {
            api::error(StatusCode::CONFLICT, refused.code(), &refused.to_string(), json!({}))
        }
        Err(e) => failure(&e),
    }
}

/// `GET /console/{file}`: the console's page, which anyone may load (it
/// holds no data and no secret; every call it makes is signed and authorised as any other),
/// and its configuration; 404 where the stack does not serve its console.
async fn console(site: Option<&console::ConsoleSite>, request: &Request) -> Response<Body> {
    let Some(site) = site else {
        return api::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "this stack does not serve its console (parameter Console); `sas console` serves it",
            json!({}),
        );
    };
    if request.method() != Method::GET {
        return api::error(StatusCode::NOT_FOUND, "not_found", "no such route", json!({}));
    }
    let sign_in = match site.sign_in().await {
        Ok(sign_in) => sign_in,
        Err(why) => {
            error!(%why, "the console's sign-in");
            return api::error(StatusCode::BAD_GATEWAY, "sign_in_unavailable", &why, json!({}));
        }
    };
    let mode = sas_console::Mode::Signed(sign_in.clone());
    let path = request.uri().path();
    let file = path.strip_prefix("/console").unwrap_or(path).trim_start_matches('/');
    let (kind, body) = match file {
        "config.json" => ("application/json", mode.config()),
        other => match sas_console::file(other) {
            Some((kind, body)) => (kind, body.to_owned()),
            None => {
                return api::error(StatusCode::NOT_FOUND, "not_found", "no such file", json!({}));
            }
        },
    };
    let mut response = Response::new(Body::Text(body));
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static(kind));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    if let Ok(policy) = HeaderValue::from_str(&mode.content_security_policy()) {
        headers.insert("content-security-policy", policy);
    }
    response
}

/// A body that gives only a reason, as a move of dead letters needs, or the answer refusing it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReasonBody {
    reason: String,
}

fn reason_of(body: &Body) -> Result<String, Box<Response<Body>>> {
    let bytes = api::body_bytes(body);
    let refused = |message: String| Box::new(bad_request(&message));
    if bytes.len() > MAX_BODY_BYTES {
        return Err(refused(format!("the body must be at most {MAX_BODY_BYTES} bytes")));
    }
    let body: ReasonBody = serde_json::from_slice(bytes)
        .map_err(|e| refused(format!("the body must be {{\"reason\"}}: {e}")))?;
    let reason = body.reason.trim();
    if reason.is_empty() || reason.chars().count() > MAX_REASON_CHARS {
        return Err(refused(format!(
            "a reason of 1 to {MAX_REASON_CHARS} characters is required: it is logged with who gave it"
        )));
    }
    Ok(reason.to_owned())
}

/// 409: the command does not fit the order's state; nothing was written.
fn refusal(state: &str, refused: &Refused) -> Response<Body> {
    api::error(
        StatusCode::CONFLICT,
        refused.code(),
        &refused.to_string(),
        json!({ "state": state }),
    )
}

/// A whole number query parameter within bounds, or why not.
fn number(
    query: &HashMap<&str, &str>,
    name: &str,
    default: usize,
    min: usize,
    max: usize,
) -> Result<usize, String> {
    match query.get(name) {
        None => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(format!("{name} must be a whole number from {min} to {max}")),
        },
    }
}

fn unknown_queue<S, Q, B, C, G, P>(admin: &Admin<S, Q, B, C, G, P>, queue: &str) -> Response<Body> {
    api::error(
        StatusCode::NOT_FOUND,
        "not_found",
        &format!(
            "no dead-letter queue {queue:?}: one of {}",
            admin.dead_letters.names().join(", ")
        ),
        json!({}),
    )
}

fn bad_request(message: &str) -> Response<Body> {
    api::error(StatusCode::BAD_REQUEST, "invalid_request", message, json!({}))
}

fn not_found() -> Response<Body> {
    api::error(StatusCode::NOT_FOUND, "not_found", "no order with this id", json!({}))
}

/// A failure of the system rather than of the request: 503 if it may pass, 500 otherwise.
fn failure(e: &Error) -> Response<Body> {
    if let Error::WorkflowGone { workflow, version, .. } = e {
        // Nothing can drive the order until that version is deployed again.
        return api::error(
            StatusCode::CONFLICT,
            "workflow_version_gone",
            &e.to_string(),
            json!({ "workflow": workflow, "workflow_version": version }),
        );
    }
    if e.is_retryable() {
        error!(error = %e, "dependency unavailable");
        return api::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "temporarily unavailable; retry (a command with the same command_id)",
            json!({}),
        );
    }
    error!(error = %e, "admin request failed");
    api::error(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error", json!({}))
}
