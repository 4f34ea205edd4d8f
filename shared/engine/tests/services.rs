//! Each service on its own, through in-memory ports: submission's idempotency and rejections,
//! the agent's retries and deadline, the supervisor's sweep, and event delivery.

#![allow(clippy::unwrap_used)] // test crate: helpers outside #[test] fns panic on failed setup

mod world;

use std::sync::Arc;
use std::time::Duration;

use sas_engine::config::{EngineConfig, HoldPolicy};
use sas_engine::events::{SERVICE_DETAIL_TYPE, StatusKinds};
use sas_engine::health::ServiceRecord;
use sas_engine::ids::{Direction, step_key};
use sas_engine::keys::{Queued, Slots};
use sas_engine::load::{SLACK, WaitReporter};
use sas_engine::machine::Refused;
use sas_engine::memory::{
    Behaviour, ManualClock, MemoryPayloads, MemoryQueues, MemoryRemote, MemoryWaits, SplitMix,
};
use sas_engine::message::{
    ElementCall, ElementOutcome, ElementsRequest, Message, StepOutcome, StepRef, StepRequest,
};
use sas_engine::order::Order;
use sas_engine::payload::{MAX_INLINE_INPUT_LEN, MAX_PAYLOAD_LEN, Stored};
use sas_engine::ports::{
    Clock, Created, Destination, ENTRY_TRIES, Expected, ExpiryIndex, Incoming, IndexEntry,
    OrderRecord, Read, Saved, ServiceBook, StateStore, WaitGauge,
};
use sas_engine::retry::RetryPolicy;
use sas_engine::services::search::{SearchPage, SearchQuery, search};
use sas_engine::services::{
    Agent, AgentOutcome, Applied, Asked, Command, Handled, Ports, StatusService, Supervisor, Values,
};
use sas_engine::state::CommandKind;
use sas_engine::state::{AlertDelivery, Happening, ProcessState, StateRecord, StepStatus};
use sas_engine::{Error, OrderId, Owner, Result, Timestamp};
use world::{World, order_body};

// ---------------------------------------------------------------- submission

#[tokio::test]
async fn the_same_key_and_order_return_the_existing_order() {
    let mut w = World::new();
    let first = w.submit("key-1").await.unwrap();
    assert!(first.created);
    let again = w.submit("key-1").await.unwrap();
    assert_eq!((again.order_id, again.created), (first.order_id, false));
    assert_eq!(w.store.orders().len(), 1);
    // The order was never claimed, so the start message is sent again (the first sender may
    // have died before sending it); a duplicate start still leads to one claim.
    assert_eq!(w.queues.sent_count(&Destination::Scheduler), 2);
    w.settle().await;
    assert_eq!(w.state(first.order_id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
    // Once the order has moved, a retried submission sends nothing more.
    w.submit("key-1").await.unwrap();
    assert_eq!(w.queues.sent_count(&Destination::Scheduler), 2);
}

#[tokio::test]
async fn the_same_key_with_another_order_is_refused_and_writes_nothing() {
    let w = World::new();
    let id = w.submit("key-2").await.unwrap().order_id;
    let before = (w.store.peek(id), w.queues.sent_count(&Destination::Scheduler));
    let other = order_body("a-much-longer-key");
    let err = w.submission.submit("key-2", other.as_bytes()).await.unwrap_err();
    assert!(matches!(err, Error::KeyReused { existing } if existing == id), "{err}");
    assert_eq!((w.store.peek(id), w.queues.sent_count(&Destination::Scheduler)), before);
    assert_eq!(
        w.store.orders()[0].order,
        Order(serde_json::from_str(&order_body("key-2")).unwrap())
    );
}

#[tokio::test]
async fn an_order_whose_wait_names_no_usable_time_is_refused_and_writes_nothing() {
    let mut w = World::new();
    let later = r#"{"name":"later","steps":[{"name":"hold","wait":{"until":"/release_at"}},
        {"name":"release","agent":"payment"}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(later, &world::agent_names());
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow.unwrap()));
    for body in [r#"{}"#, r#"{"release_at":"soon"}"#, r#"{"release_at":"2099-01-01T00:00:00Z"}"#] {
        let err = w.submission.submit("later-1", body.as_bytes()).await.unwrap_err();
        let Error::InvalidOrder(rejection) = err else { panic!("{err}") };
        assert_eq!(rejection.errors[0].field, "/release_at", "{body}");
    }
    assert!(w.store.orders().is_empty());
    assert_eq!(w.queues.sent_count(&Destination::Scheduler), 0);
    // A time within a year is kept on the record, and the order waits for it.
    let at = w.clock.now().plus(Duration::from_secs(3600)).to_rfc3339();
    let body = format!(r#"{{"release_at":"{at}"}}"#);
    let id = w.submission.submit("later-2", body.as_bytes()).await.unwrap().order_id;
    let r = w.state(id);
    assert_eq!(r.steps[0].wake_at.map(|t| t.to_rfc3339()), Some(at));
    assert_eq!(r.complete_by, r.steps[0].wake_at);
}

#[tokio::test]
async fn an_order_waiting_for_a_time_is_not_the_oldest_order_held_up() {
    let mut w = World::new();
    let later = r#"{"name":"later","steps":[{"name":"charge-payment","agent":"payment"},
        {"name":"hold","wait":{"seconds":86400}},{"name":"ship","agent":"shipping"}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(later, &world::agent_names());
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow.unwrap()));
    let id = w.submit("later-1").await.unwrap().order_id;
    w.settle().await;
    assert!(w.state(id).steps[1].lease.is_some_and(|l| l.timer), "{:?}", w.state(id));
    w.clock.advance(Duration::from_secs(7200));
    assert_eq!(w.sweep().await.oldest_ms, Some(0), "two hours into its wait");
    // Past its time it is watched again, from its time on: no sweep came for two hours.
    w.clock.advance(Duration::from_secs(86400));
    assert_eq!(w.sweep().await.oldest_ms, Some(7_200_000));
    // Woken, it is watched from then on, not from when it was accepted.
    let woke = w.state(id);
    assert_eq!(woke.steps[1].status, StepStatus::Done, "{woke:?}");
    assert_eq!(woke.watched_since(), w.clock.now());
    w.clock.advance(Duration::from_secs(60));
    assert_eq!(w.sweep().await.oldest_ms, Some(60_000));
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn rejected_submissions_write_and_send_nothing() {
    let w = World::new();
    let valid = order_body("x");
    let cases: [(&str, &[u8]); 5] = [
        ("key-3", b"{}"),
        ("key-3", b"not json"),
        ("key-3", br#"{"customer_id":"c","currency":"EUR","items":[],"ship_to":{}}"#),
        ("", valid.as_bytes()),
        ("bad key", valid.as_bytes()),
    ];
    for (key, body) in cases {
        let err = w.submission.submit(key, body).await.unwrap_err();
        assert!(matches!(err, Error::InvalidOrder(_) | Error::InvalidKey(_)), "{err}");
        assert!(!err.is_retryable());
    }
    assert_eq!((w.store.stats().order_puts, w.store.stats().writes), (0, 0));
    assert!(w.store.records().is_empty() && w.store.orders().is_empty());
    assert_eq!(w.queues.sent_count(&Destination::Scheduler), 0);
    assert_eq!(w.bus.count(), 0);
}

#[tokio::test]
async fn an_order_is_found_by_its_customer_after_it_ended_newest_first_a_page_at_a_time() {
    let mut w = World::new();
    // The customer is `c-<length of the key>`: three orders of c-5, one of c-3.
    let mut theirs = Vec::new();
    for key in ["key-a", "key-b", "key-c"] {
        theirs.push(w.submit(key).await.unwrap().order_id);
        w.clock.advance(Duration::from_secs(1));
    }
    let other = w.submit("k-1").await.unwrap().order_id;
    w.remote.script("charge-payment", vec![Behaviour::Permanent("declined".into())]);
    w.settle().await;
    assert_eq!(w.state(other).search_key.as_deref(), Some("c-3"));

    let query = |value: &str, workflow: Option<&str>, after: Option<String>| SearchQuery {
        value: value.into(),
        workflow: workflow.map(str::to_owned),
        limit: 2,
        after,
    };
    let first = search(&*w.store, &query("c-5", None, None)).await.unwrap();
    let ids: Vec<OrderId> = first.orders.iter().map(|f| f.order_id).collect();
    assert_eq!(ids, [theirs[2], theirs[1]], "the newest first");
    let second = search(&*w.store, &query("c-5", None, first.next)).await.unwrap();
    assert_eq!(second.orders.iter().map(|f| f.order_id).collect::<Vec<_>>(), [theirs[0]]);
    assert_eq!(second.next, None);
    // What became of each: the first one charged was refused and undone.
    let found = &second.orders[0];
    assert_eq!((found.workflow.as_str(), found.workflow_version), ("order-fulfilment", 1));
    assert_eq!(found.process_state, ProcessState::Error);
    assert_eq!(
        (found.step.as_deref(), found.cause),
        (Some("charge-payment"), Some("step_rejected"))
    );
    assert!(found.ended_at.is_some());
    assert_eq!(first.orders[0].process_state, ProcessState::Processed);

    let of_workflow = search(&*w.store, &query("c-5", Some("order-fulfilment"), None)).await;
    assert_eq!(of_workflow.unwrap().orders.len(), 2);
    let elsewhere = search(&*w.store, &query("c-5", Some("account-opening"), None)).await;
    assert_eq!(elsewhere.unwrap(), SearchPage::default());
    assert_eq!(search(&*w.store, &query("c-9", None, None)).await.unwrap(), SearchPage::default());
    for bad in [query("", None, None), query(&"c".repeat(257), None, None)] {
        let err = search(&*w.store, &bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidCommand(_)), "{err}");
    }
    let err = search(&*w.store, &query("c-5", None, Some("here".into()))).await.unwrap_err();
    assert!(err.to_string().contains("cursor"), "{err}");
}

#[tokio::test]
async fn a_throttled_submission_can_be_retried_with_the_same_key() {
    let mut w = World::new();
    w.store.fail_next_writes(1);
    let err = w.submit("key-4").await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(w.store.records().is_empty());
    let ok = w.submit("key-4").await.unwrap();
    assert!(ok.created);
    w.settle().await;
    assert_eq!(w.state(ok.order_id).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn an_order_whose_record_was_written_before_records_kept_orders_is_still_its_keys() {
    let mut w = World::new();
    let id = w.submit("key-5").await.unwrap().order_id;
    // As an earlier version wrote it: the order in the orders table, the record without it.
    let record = w.state(id);
    let order = record.order().unwrap();
    let mut legacy = record.clone();
    legacy.submitted = None;
    legacy.revision += 1;
    assert_eq!(w.store.create_order(&order).await.unwrap(), Created::Created);
    assert_eq!(w.store.save(&legacy, Expected::of(&record)).await.unwrap(), Saved::Saved);
    // Sent again, the key is its order; another body under it is refused.
    assert!(!w.submit("key-5").await.unwrap().created);
    let other = br#"{"customer_id":"c-9","currency":"EUR","items":[{"sku":"X","quantity":1,"unit_price":1}],"ship_to":{"name":"A","line1":"1","city":"P","postal_code":"1","country":"FR"}}"#;
    assert!(matches!(w.submission.submit("key-5", other).await, Err(Error::KeyReused { .. })));
    // It runs on the order found in the orders table, and its status shows it.
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
    let status = StatusService::new(w.store.clone());
    let view = status.get(id, &Owner::anonymous()).await.unwrap().unwrap();
    assert_eq!(view.order, order.order);
}

#[tokio::test]
async fn an_order_is_forgotten_its_retention_after_it_ended_and_its_key_is_free_again() {
    let month = Duration::from_secs(30 * 24 * 3600);
    let mut w = World::with(EngineConfig { retention: Some(month), ..EngineConfig::default() });
    let id = w.submit("key-6").await.unwrap().order_id;
    assert_eq!(w.state(id).expires_at, None, "in flight");
    w.settle().await;
    let ended = w.state(id);
    assert_eq!(ended.process_state, ProcessState::Processed);
    let due = ended.expires_at.expect("a processed order expires");
    assert!(due >= ended.ended_at.unwrap().plus(month) && due.as_millis() % 1000 == 0, "{due:?}");
    // Kept until then, and the key is its order.
    w.clock.advance(month - Duration::from_secs(60));
    assert_eq!(w.store.forget_expired(), 0);
    assert!(!w.submit("key-6").await.unwrap().created);
    w.clock.advance(Duration::from_secs(61));
    assert_eq!(w.store.forget_expired(), 1);
    let status = StatusService::new(w.store.clone());
    assert!(status.get(id, &Owner::anonymous()).await.unwrap().is_none());
    // The key sent again is a new order, which runs.
    assert!(w.submit("key-6").await.unwrap().created);
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn an_order_in_error_is_kept_whatever_the_retention() {
    let month = Duration::from_secs(30 * 24 * 3600);
    let mut w = World::with(EngineConfig { retention: Some(month), ..EngineConfig::default() });
    w.remote.script("charge-payment", [Behaviour::Permanent("card declined".into())]);
    let id = w.submit("key-7").await.unwrap().order_id;
    w.settle().await;
    let failed = w.state(id);
    assert_eq!((failed.process_state, failed.expires_at), (ProcessState::Error, None));
    w.clock.advance(month * 12);
    assert_eq!(w.store.forget_expired(), 0);
}

#[tokio::test]
async fn the_door_refuses_orders_that_would_wait_too_long_and_writes_nothing() {
    let config =
        EngineConfig { max_queue_wait: Duration::from_secs(10), ..EngineConfig::default() };
    let w = World::with(config);
    // Nobody takes the messages yet, and no consumer has said how fast it goes: the door
    // counts what it let in since it read the queues, at the slowest queue of an order's path
    // (the replies: three per order, at the assumed 10 a second).
    let mut admitted = 0;
    let err = loop {
        match w.submit(&format!("early-{admitted}")).await {
            Ok(_) => admitted += 1,
            Err(e) => break e,
        }
    };
    // 34 orders are 10.2 s of the slowest queue's work: the 35th is refused.
    assert_eq!(admitted, 34);
    let Error::Overloaded { expected_wait, retry_after, .. } = &err else { panic!("{err}") };
    assert!(expected_wait.as_secs_f64() > 10.0, "{expected_wait:?}");
    assert!(*retry_after >= Duration::from_secs(1));
    assert!(err.is_retryable());
    // Read again 5 s later: 34 start messages wait; still room for a little more.
    w.clock.advance(sas_engine::load::REPORT_EVERY);
    let before = (w.store.stats().writes, w.queues.sent_count(&Destination::Scheduler));
    assert_eq!(before.0, 34, "the refused order wrote nothing");
    let mut more = 0;
    while w.submit(&format!("later-{more}")).await.is_ok() {
        more += 1;
    }
    assert!(more < 34, "the waiting messages count now: {more}");
    // Each refused client is asked to wait longer, as more are refused.
    let waits: Vec<Duration> = (0..3)
        .map(|n| {
            let err = futures_util::FutureExt::now_or_never(w.submit(&format!("refused-{n}")))
                .unwrap()
                .unwrap_err();
            let Error::Overloaded { retry_after, .. } = err else { panic!("{err}") };
            retry_after
        })
        .collect();
    assert!(waits.windows(2).all(|p| p[0] <= p[1]), "{waits:?}");
    let after = (w.store.stats().writes, w.queues.sent_count(&Destination::Scheduler));
    assert_eq!(after.1, before.1 + more, "a refused order sends nothing");
}

#[tokio::test]
async fn a_tenant_that_floods_the_door_is_refused_for_its_own_backlog_not_the_others() {
    let config =
        EngineConfig { max_queue_wait: Duration::from_secs(10), ..EngineConfig::default() };
    let bulk = Owner::iam("arn:aws:iam::123456789012:user/bulk").unwrap();
    let quiet = Owner::iam("arn:aws:iam::123456789012:user/quiet").unwrap();
    for fair in [true, false] {
        let w = World::with(EngineConfig { fair_queues: fair, ..config.clone() });
        let submit = |owner: &Owner, key: String| {
            let body = order_body(&key);
            let submission = &w.submission;
            let owner = owner.clone();
            async move { submission.submit_as(&owner, &key, body.as_bytes()).await }
        };
        let mut admitted = 0;
        while submit(&bulk, format!("bulk-{admitted}")).await.is_ok() {
            admitted += 1;
        }
        assert!(admitted >= 34, "{admitted}");
        let mut quiet_admitted = 0;
        for n in 0..10 {
            if submit(&quiet, format!("quiet-{n}")).await.is_ok() {
                quiet_admitted += 1;
            }
        }
        let bulk_again = submit(&bulk, "bulk-again".into()).await;
        assert!(matches!(bulk_again, Err(Error::Overloaded { .. })), "{bulk_again:?}");
        if fair {
            assert_eq!(quiet_admitted, 10, "the quiet tenant's orders wait behind its own");
            // Each order's messages carry its tenant's group.
            let records = w.store.records();
            let groups: std::collections::BTreeSet<_> =
                records.iter().filter_map(|r| r.group.as_deref()).collect();
            assert_eq!(groups, [bulk.as_str(), quiet.as_str()].into_iter().collect());
            let starts = w.queues.receive(&Destination::Scheduler, 10);
            assert!(
                starts
                    .iter()
                    .all(|d| { Message::decode(&d.body).unwrap().group() == Some(bulk.as_str()) })
            );
        } else {
            assert_eq!(quiet_admitted, 0, "without fair queues, everyone waits behind the bulk");
            assert!(w.store.records().iter().all(|r| r.group.is_none()));
        }
    }
}

#[tokio::test]
async fn a_caller_may_mark_its_order_a_priority_of_its_tenant() {
    let w = World::new();
    let acme = Owner::iam("arn:aws:iam::123456789012:user/acme").unwrap();
    let submit = |key: &'static str, priority: Option<&'static str>| {
        let body = order_body(key);
        let (submission, acme) = (&w.submission, acme.clone());
        let asked = Asked { workflow: None, priority };
        async move { submission.submit_asking(&acme, asked, key, body.as_bytes()).await }
    };
    let rush = submit("rush", Some("high")).await.unwrap().order_id;
    let plain = submit("plain", Some("normal")).await.unwrap().order_id;
    let unsaid = submit("unsaid", None).await.unwrap().order_id;
    let group =
        |id: OrderId| w.store.records().into_iter().find(|r| r.order_id == id).unwrap().group;
    let priority = format!("{}#priority", acme.as_str());
    assert_eq!(group(rush), Some(priority.clone()));
    assert_eq!(
        (group(plain), group(unsaid)),
        (Some(acme.as_str().into()), Some(acme.as_str().into()))
    );
    let starts = w.queues.receive(&Destination::Scheduler, 10);
    let groups: Vec<_> = starts
        .iter()
        .map(|d| Message::decode(&d.body).unwrap().group().map(str::to_owned))
        .collect();
    assert!(groups.contains(&Some(priority)), "{groups:?}");

    // A priority the API does not know is refused, naming it, and writes nothing.
    let puts = w.store.stats().writes;
    let err = submit("urgent", Some("urgent")).await.unwrap_err();
    let Error::InvalidOrder(rejection) = &err else { panic!("{err}") };
    assert_eq!(rejection.errors[0].field, "priority", "{err}");
    assert_eq!(w.store.stats().writes, puts);
    // The key sent again is its order, at the priority it was first given.
    assert_eq!(submit("rush", None).await.unwrap().order_id, rush);
}

#[tokio::test]
async fn the_door_reads_the_queues_at_most_every_few_seconds() {
    let w = World::new();
    for i in 0..20 {
        w.submit(&format!("busy-{i}")).await.unwrap();
    }
    // One read for twenty orders in the same instant.
    let reads = || w.queues.depth_reads();
    assert_eq!(reads(), 1);
    w.clock.advance(sas_engine::load::REPORT_EVERY);
    w.submit("later").await.unwrap();
    assert_eq!(reads(), 2);
}

// ---------------------------------------------------------------- agent

struct AgentBench {
    clock: ManualClock,
    remote: Arc<MemoryRemote<ManualClock>>,
    queues: Arc<MemoryQueues<ManualClock>>,
    waits: Arc<MemoryWaits>,
    agent: BenchAgent<Arc<MemoryRemote<ManualClock>>>,
}

type BenchAgent<R> =
    Agent<R, Arc<MemoryQueues<ManualClock>>, ManualClock, SplitMix, Arc<MemoryWaits>>;

/// An agent of the payment service over these ports.
fn payment_agent<R: sas_engine::ports::RemoteService>(
    remote: R,
    queues: Arc<MemoryQueues<ManualClock>>,
    clock: ManualClock,
    waits: Arc<MemoryWaits>,
) -> BenchAgent<R> {
    Agent::new(
        remote,
        queues,
        clock,
        SplitMix::seeded(7),
        RetryPolicy::default(),
        Destination::Agent(sas_engine::AgentName::new("payment")),
        WaitReporter::new(waits, "agent-payment".into(), Duration::from_secs(30)),
    )
}

impl AgentBench {
    fn new() -> Self {
        let clock = ManualClock::default();
        let remote = Arc::new(MemoryRemote::new(clock.clone()));
        let queues = Arc::new(MemoryQueues::new(clock.clone()));
        let waits = Arc::new(MemoryWaits::default());
        let agent = payment_agent(remote.clone(), queues.clone(), clock.clone(), waits.clone());
        AgentBench { clock, remote, queues, waits, agent }
    }

    /// A request sent now, with `budget` to do it.
    fn request(&self, budget: Duration) -> StepRequest {
        let order_id = OrderId::for_key(&sas_engine::IdempotencyKey::parse("agent-1").unwrap());
        StepRequest {
            order_id,
            attempt: 4,
            correlation_id: "corr".into(),
            step: StepRef {
                index: 1,
                name: "charge-payment".into(),
                direction: Direction::Do,
                element: None,
            },
            action: "charge-payment".into(),
            complete_by: self.clock.now().plus(budget),
            idempotency_key: step_key(order_id, "charge-payment", Direction::Do, 0),
            order: Order(serde_json::from_str(&order_body("agent-1")).unwrap()),
            input: None,
            outputs: Default::default(),
            due_at: Some(self.clock.now()),
            budget_ms: Some(budget.as_millis() as u64),
            resumed: false,
            last_lease: false,
            group: Some("acme".into()),
        }
    }

    async fn handle(&self, request: &StepRequest) -> Result<AgentOutcome> {
        self.agent.handle(request, Incoming::first("request-1")).await
    }

    fn replies(&self) -> Vec<Message> {
        self.queues
            .receive(&Destination::Replies, 10)
            .into_iter()
            .map(|d| Message::decode(&d.body).unwrap())
            .collect()
    }
}

#[tokio::test]
async fn the_agent_retries_transient_faults_with_jittered_backoff() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", [Behaviour::Transient, Behaviour::Transient]);
    let req = b.request(Duration::from_secs(30));
    let start = b.clock.now();
    let outcome = b.handle(&req).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 3 });
    let waited = start.until(b.clock.now());
    // Full jitter: each wait is at most its exponential ceiling (200 ms, then 400 ms).
    assert!(waited <= Duration::from_millis(600), "{waited:?}");
    assert_eq!(b.remote.calls(&req.idempotency_key), 3, "every retry carries the same key");
    assert_eq!(b.remote.applications(&req.idempotency_key), 1);
    let replies = b.replies();
    assert_eq!(replies.len(), 1);
    let Message::Reply(reply) = &replies[0] else { panic!() };
    assert_eq!((reply.attempt, &reply.step), (req.attempt, &req.step));
    assert!(matches!(reply.outcome, StepOutcome::Done { .. }));
}

/// A guarded payment agent, its service's health kept in `book`, over ports of its own.
struct Guarded {
    clock: ManualClock,
    remote: Arc<MemoryRemote<ManualClock>>,
    queues: Arc<MemoryQueues<ManualClock>>,
    book: Arc<sas_engine::memory::MemoryServiceBook>,
    agent: GuardedAgent,
}

type GuardedAgent = Agent<
    Arc<MemoryRemote<ManualClock>>,
    Arc<MemoryQueues<ManualClock>>,
    ManualClock,
    SplitMix,
    Arc<MemoryWaits>,
    Arc<sas_engine::memory::MemoryServiceBook>,
>;

fn guarded(policy: HoldPolicy) -> Guarded {
    let clock = ManualClock::default();
    let remote = Arc::new(MemoryRemote::new(clock.clone()));
    let queues = Arc::new(MemoryQueues::new(clock.clone()));
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let agent = payment_agent(remote.clone(), queues.clone(), clock.clone(), Arc::default())
        .guarded(book.clone(), "payment", policy);
    Guarded { clock, remote, queues, book, agent }
}

#[tokio::test]
async fn a_guarded_agent_holds_a_failing_action_probes_it_alone_and_opens_it_on_an_answer() {
    let policy = HoldPolicy { after_failures: 3, ..HoldPolicy::default() };
    let Guarded { clock, remote, queues, book, agent } = guarded(policy);
    let b = AgentBench::new();
    let request = |key: &str| {
        let mut r = b.request(Duration::from_secs(30));
        r.complete_by = clock.now().plus(Duration::from_secs(30));
        r.due_at = Some(clock.now());
        r.idempotency_key = format!("{}/{key}", r.idempotency_key);
        r
    };
    let held = |outcome: &StepOutcome| matches!(outcome, StepOutcome::Held { .. });
    let last_reply = || {
        let replies: Vec<Message> = queues
            .receive(&Destination::Replies, 10)
            .into_iter()
            .map(|d| Message::decode(&d.body).unwrap())
            .collect();
        let Some(Message::Reply(reply)) = replies.last().cloned() else { panic!("no reply") };
        reply.outcome
    };
    remote.script("charge-payment", std::iter::repeat_n(Behaviour::Transient, 100));

    // Three faults in a row hold the service: the step is answered held, not left to expire.
    let first = request("a");
    let outcome = agent.handle(&first, Incoming::first("m1")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Held { calls: 3 });
    let reply = last_reply();
    assert!(held(&reply));
    let record = book.load("payment").await.unwrap().unwrap();
    let (on, hold) = record.holding("charge-payment").unwrap();
    assert_eq!(on, Some("charge-payment"), "the action is held, not the whole service");
    let hold = hold.clone();
    assert!(hold.reason.starts_with("3 passing faults in a row"), "{}", hold.reason);
    let StepOutcome::Held { action, .. } = reply else { panic!() };
    assert_eq!(action.as_deref(), Some("charge-payment"));

    // While held, nothing of it is called...
    let outcome = agent.handle(&request("b"), Incoming::first("m2")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Held { calls: 0 });
    assert_eq!(remote.faults().transient, 3);
    // ... but a refund, which answers, is: what is held is what is down.
    let mut refund = request("refund");
    refund.action = "refund-payment".into();
    refund.step.direction = Direction::Undo;
    let outcome = agent.handle(&refund, Incoming::first("m-refund")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    let record = book.load("payment").await.unwrap().unwrap();
    assert!(record.holding("charge-payment").is_some(), "a refund's answer opens no charge");
    let _ = last_reply();
    // ... but one probe per interval, which fails while the service is down.
    clock.advance(policy.probe_every);
    let outcome = agent.handle(&request("c"), Incoming::first("m3")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Held { calls: 1 });
    let outcome = agent.handle(&request("d"), Incoming::first("m4")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Held { calls: 0 });
    assert_eq!(remote.faults().transient, 4);
    let _ = last_reply();
    // The probe's fault says why the hold goes on.
    let record = book.load("payment").await.unwrap().unwrap();
    let probed = record.holding("charge-payment").unwrap().1;
    assert_eq!((probed.probes, probed.last_probe.is_some()), (1, true), "{probed:?}");

    // The service is back: the next probe succeeds and opens it.
    remote.unscript("charge-payment");
    clock.advance(policy.probe_every);
    let outcome = agent.handle(&request("e"), Incoming::first("m5")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    let record = book.load("payment").await.unwrap().unwrap();
    assert!(!record.is_held() && record.unannounced());
    let released = record.scope(Some("charge-payment")).unwrap().released.clone().unwrap();
    assert_eq!(released.held_since, hold.since);

    // On an open, healthy service the guard writes nothing.
    let writes = book.writes();
    clock.advance(Duration::from_secs(2));
    for key in ["f", "g", "h"] {
        let outcome = agent.handle(&request(key), Incoming::first(key)).await.unwrap();
        assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    }
    assert_eq!(book.writes(), writes);
}

#[tokio::test]
async fn a_step_s_last_lease_met_only_by_passing_faults_holds_its_action_rather_than_fail_it() {
    let policy = HoldPolicy { after_failures: 5, ..HoldPolicy::default() };
    let Guarded { clock, remote, queues, book, agent } = guarded(policy);
    let b = AgentBench::new();
    // A budget with room for fewer calls than a hold takes: an execution under load, or one
    // of many sharing the service's calls.
    let request = |key: &str, last_lease: bool| {
        let budget = Duration::from_millis(500);
        let mut r = b.request(budget);
        r.complete_by = clock.now().plus(budget);
        r.due_at = Some(clock.now());
        r.idempotency_key = format!("{}/{key}", r.idempotency_key);
        StepRequest { last_lease, ..r }
    };
    remote.script("charge-payment", std::iter::repeat_n(Behaviour::Transient, 100));

    // A lease that may run out again gives up, and its step is tried again later.
    let outcome = agent.handle(&request("a", false), Incoming::first("m1")).await.unwrap();
    let AgentOutcome::GaveUp { calls } = outcome else { panic!("{outcome:?}") };
    assert!(calls < policy.after_failures, "{calls} calls");
    assert!(book.load("payment").await.unwrap().is_none_or(|r| !r.is_held()));

    // The step's last lease does not fail it for faults that pass: the action is held, and
    // the step waits for its probes.
    clock.advance(policy.window * 2);
    let outcome = agent.handle(&request("b", true), Incoming::first("m2")).await.unwrap();
    let AgentOutcome::Held { calls } = outcome else { panic!("{outcome:?}") };
    assert!(calls < policy.after_failures, "{calls} calls");
    let record = book.load("payment").await.unwrap().unwrap();
    let (on, hold) = record.holding("charge-payment").unwrap();
    assert_eq!(on, Some("charge-payment"));
    assert!(hold.reason.contains("passing faults in a row"), "{}", hold.reason);
    let StepOutcome::Held { action, .. } = last_reply_of(&queues) else { panic!() };
    assert_eq!(action.as_deref(), Some("charge-payment"));

    // A refusal on the last lease is the step's own failure, as ever.
    remote.unscript("charge-payment");
    let mut refund = request("refund", true);
    (refund.action, refund.step.direction) = ("refund-payment".into(), Direction::Undo);
    remote.script("refund-payment", [Behaviour::Permanent("no such charge".into())]);
    let outcome = agent.handle(&refund, Incoming::first("m3")).await.unwrap();
    assert!(matches!(outcome, AgentOutcome::Replied { done: false, .. }), "{outcome:?}");
}

/// The last reply on the reply queue's outcome.
fn last_reply_of(queues: &MemoryQueues<ManualClock>) -> StepOutcome {
    let replies: Vec<Message> = queues
        .receive(&Destination::Replies, 10)
        .into_iter()
        .map(|d| Message::decode(&d.body).unwrap())
        .collect();
    let Some(Message::Reply(reply)) = replies.last().cloned() else { panic!("no reply") };
    reply.outcome
}

#[tokio::test]
async fn refusals_never_hold_a_service_however_many_come_in_a_row() {
    let policy = HoldPolicy { after_failures: 3, ..HoldPolicy::default() };
    let Guarded { clock, remote, queues, book, agent } = guarded(policy);
    let b = AgentBench::new();
    // A grant missing: every charge is denied, which is no sign that the service is down.
    let denied = Behaviour::Permanent("AccessDenied: not authorized to perform charge".into());
    remote.script("charge-payment", std::iter::repeat_n(denied, 20));
    for k in 0..10 {
        let mut r = b.request(Duration::from_secs(30));
        r.complete_by = clock.now().plus(Duration::from_secs(30));
        r.idempotency_key = format!("{}/{k}", r.idempotency_key);
        let outcome = agent.handle(&r, Incoming::first(&format!("m{k}"))).await.unwrap();
        assert_eq!(outcome, AgentOutcome::Replied { done: false, calls: 1 });
        let StepOutcome::Failed { reason } = last_reply_of(&queues) else { panic!() };
        assert!(reason.contains("AccessDenied"), "{reason}");
    }
    let record = book.load("payment").await.unwrap();
    assert!(record.as_ref().is_none_or(|r| !r.is_held()), "{record:?}");
    assert_eq!(book.writes(), 0, "refusals write nothing to the services' book");
}

#[tokio::test]
async fn the_agent_never_retries_past_its_budget_and_then_stays_silent() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", std::iter::repeat_n(Behaviour::Transient, 100));
    let req = b.request(Duration::from_secs(3));
    let outcome = b.handle(&req).await.unwrap();
    assert!(matches!(outcome, AgentOutcome::GaveUp { .. }), "{outcome:?}");
    assert!(b.clock.now() < req.complete_by, "stopped before the deadline, not after");
    assert!(b.replies().is_empty(), "no reply, not even an error");
}

#[tokio::test]
async fn a_request_that_waited_in_a_backlog_still_gets_its_whole_budget() {
    let b = AgentBench::new();
    let req = b.request(Duration::from_secs(5));
    // The request sat in the agent's queue for two minutes, far past its lease.
    b.clock.advance(Duration::from_secs(120));
    b.remote.script("charge-payment", [Behaviour::Slow(Duration::from_secs(4))]);
    assert_eq!(b.handle(&req).await.unwrap(), AgentOutcome::Replied { done: true, calls: 1 });
    assert_eq!(b.replies().len(), 1, "the late answer is sent: its attempt decides if it counts");
    // How long it waited is reported for the payment queue, to stand until the work is done.
    let report = b.waits.reports(b.clock.now()).await.unwrap().remove(0);
    assert_eq!(report.wait, Duration::from_secs(120));
    assert!(report.until >= req.complete_by.plus(Duration::from_secs(120)));
}

#[tokio::test]
async fn the_agent_stops_after_its_call_budget() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", std::iter::repeat_n(Behaviour::Transient, 100));
    let req = b.request(Duration::from_secs(900));
    let outcome = b.handle(&req).await.unwrap();
    assert_eq!(outcome, AgentOutcome::GaveUp { calls: RetryPolicy::default().max_calls });
    assert!(b.replies().is_empty());
}

#[tokio::test]
async fn a_request_of_an_older_scheduler_is_dropped_once_its_lease_is_over() {
    let b = AgentBench::new();
    // Without a budget of its own, a request is worked on until its CompleteBy.
    let req = StepRequest { budget_ms: None, ..b.request(Duration::from_secs(5)) };
    b.clock.advance(Duration::from_secs(5));
    assert_eq!(b.handle(&req).await.unwrap(), AgentOutcome::Expired { calls: 0 });
    assert_eq!(b.remote.calls(&req.idempotency_key), 0);
    assert!(b.replies().is_empty());
}

#[tokio::test]
async fn a_call_that_outlives_the_lease_sends_nothing() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", [Behaviour::Slow(Duration::from_secs(40))]);
    let req = b.request(Duration::from_secs(30));
    assert_eq!(b.handle(&req).await.unwrap(), AgentOutcome::GaveUp { calls: 1 });
    assert!(b.replies().is_empty());
}

/// A service that answers, but only after the caller's deadline.
struct LateRemote(ManualClock);

impl sas_engine::ports::RemoteService for LateRemote {
    async fn call(
        &self,
        call: &sas_engine::ports::RemoteCall,
    ) -> std::result::Result<serde_json::Value, sas_engine::ports::RemoteFault> {
        self.0.set(call.deadline.plus(Duration::from_secs(1)));
        Ok(serde_json::json!({"late": true}))
    }
}

#[tokio::test]
async fn an_answer_after_the_budget_is_not_sent() {
    let b = AgentBench::new();
    let late = payment_agent(
        LateRemote(b.clock.clone()),
        b.queues.clone(),
        b.clock.clone(),
        b.waits.clone(),
    );
    let req = b.request(Duration::from_secs(30));
    assert_eq!(
        late.handle(&req, Incoming::first("request-1")).await.unwrap(),
        AgentOutcome::Expired { calls: 1 }
    );
    assert!(b.replies().is_empty());
}

#[tokio::test]
async fn a_permanent_fault_is_reported_while_the_lease_holds() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", [Behaviour::Permanent("card declined".into())]);
    let req = b.request(Duration::from_secs(30));
    assert_eq!(b.handle(&req).await.unwrap(), AgentOutcome::Replied { done: false, calls: 1 });
    let Message::Reply(reply) = &b.replies()[0] else { panic!() };
    assert_eq!(reply.outcome, StepOutcome::Failed { reason: "card declined".into() });
}

#[tokio::test]
async fn the_elements_of_one_request_are_called_under_their_own_keys_and_answered_at_once() {
    let b = AgentBench::new();
    let step = b.request(Duration::from_secs(30));
    let elements: Vec<ElementCall> = (0..3)
        .map(|k| {
            let id = OrderId::for_element(step.order_id, "ship", 0, k);
            ElementCall {
                element: k,
                order_id: id,
                idempotency_key: step_key(id, "charge-payment", Direction::Do, 0),
                input: serde_json::json!({"parcel": k}),
                output: None,
            }
        })
        .collect();
    let request = ElementsRequest {
        order_id: step.order_id,
        attempt: step.attempt,
        correlation_id: step.correlation_id.clone(),
        step: StepRef { name: "ship".into(), ..step.step.clone() },
        action: "charge-payment".into(),
        complete_by: step.complete_by,
        elements: elements.clone(),
        due_at: step.due_at,
        budget_ms: step.budget_ms,
        resumed: false,
        last_lease: false,
        group: step.group.clone(),
    };
    // The first call answers, the second is refused, the third meets only passing faults.
    b.remote.script(
        "charge-payment",
        [Behaviour::Succeed, Behaviour::Permanent("no such parcel".into())]
            .into_iter()
            .chain(std::iter::repeat_n(Behaviour::Transient, 100)),
    );
    let ended = b.agent.handle_elements(&request, Incoming::first("m1")).await.unwrap();
    assert_eq!(ended[0], (0, AgentOutcome::Replied { done: true, calls: 1 }));
    assert_eq!(ended[1], (1, AgentOutcome::Replied { done: false, calls: 1 }));
    assert!(matches!(ended[2], (2, AgentOutcome::GaveUp { .. })), "{ended:?}");
    // One reply, for the two that have an answer; the third is left to the lease.
    let replies = b.replies();
    assert_eq!(replies.len(), 1);
    let Message::ElementsReply(reply) = &replies[0] else { panic!("{replies:?}") };
    assert_eq!((reply.order_id, reply.attempt, reply.step.element), (step.order_id, 4, None));
    let outcomes: Vec<&ElementOutcome> = reply.outcomes.iter().collect();
    assert_eq!(outcomes.len(), 2);
    assert!(matches!(
        outcomes[0],
        ElementOutcome { element: 0, outcome: StepOutcome::Done { .. } }
    ));
    assert_eq!(outcomes[1].outcome, StepOutcome::Failed { reason: "no such parcel".into() });
    // Each call was made under its element's own key, as its child order's step would be.
    for call in &elements {
        assert!(b.remote.calls(&call.idempotency_key) >= 1, "{}", call.idempotency_key);
    }
    assert!(b.remote.applied(&elements[0].idempotency_key));
    let entry = &b.remote.ledger()[0];
    assert_eq!(entry.order_id, elements[0].order_id, "the service sees the element's own order");
    // The reply names the request's whole step again, through the queue as it goes.
    let encoded = Message::ElementsReply(reply.clone()).encode();
    assert_eq!(Message::decode(&encoded).unwrap(), Message::ElementsReply(reply.clone()));
}

#[tokio::test]
async fn an_output_too_large_is_answered_as_such_not_carried() {
    let b = AgentBench::new();
    b.remote.script("charge-payment", [Behaviour::Oversize]);
    let req = b.request(Duration::from_secs(30));
    assert!(matches!(b.handle(&req).await.unwrap(), AgentOutcome::Replied { done: true, .. }));
    let Message::Reply(reply) = &b.replies()[0] else { panic!() };
    assert!(matches!(reply.outcome, StepOutcome::TooLarge { bytes } if bytes > 512));
    let size = Message::Reply(reply.clone()).encode().len();
    assert!(size < 2048, "the reply stays small: {size} bytes");
}

#[tokio::test]
async fn an_order_whose_step_answers_too_much_records_why_and_undoes_the_step_too() {
    let mut w = World::new();
    w.remote.script("charge-payment", [Behaviour::Oversize]);
    let id = w.submit("too-much").await.unwrap().order_id;
    w.run_for(Duration::from_secs(300)).await;
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Error);
    assert!(
        matches!(&r.cause, Some(sas_engine::state::Cause::OutputTooLarge { step, bytes, limit })
            if step == "charge-payment" && *limit == MAX_PAYLOAD_LEN as u64 && *bytes > *limit),
        "{:?}",
        r.cause
    );
    // The charge went through: it is refunded, and the stock released; no message was poison.
    assert!(w.remote.applied(&World::key(id, "charge-payment", "undo")));
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert!(w.handled.iter().all(|(_, h)| !matches!(h, Handled::Illegal(_))), "{:?}", w.handled);
    assert_eq!(w.statuses(id).last().map(String::as_str), Some("compensated"));
    assert_eq!(w.alerts().len(), 1);
}

#[tokio::test]
async fn a_large_output_is_stored_and_its_undo_is_told_it_whole() {
    let mut w = World::new();
    w.remote.script("charge-payment", [Behaviour::Large(100_000)]);
    w.remote.script("ship", [Behaviour::Permanent("no carrier".into())]);
    let id = w.submit("large-charge").await.unwrap().order_id;
    w.run_for(Duration::from_secs(300)).await;
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Error, "{:?}", r.cause);
    assert_eq!(w.statuses(id).last().map(String::as_str), Some("compensated"));
    // The record keeps a reference, small enough to ride in any message.
    let output = r.steps.iter().find(|s| s.name == "charge-payment").unwrap().output.clone();
    let stored = Stored::of(output.as_ref().unwrap()).expect("the output is stored");
    assert!(stored.bytes > 100_000 && output.unwrap().to_string().len() <= 512);
    assert_eq!(w.system.payloads.keys(), vec![stored.key]);
    // The refund went through, told exactly what the charge answered.
    assert!(w.remote.applied(&World::key(id, "charge-payment", "undo")));
    assert_eq!(w.remote.faults().misread, 0);
    assert_eq!(w.remote.faults().large, 1);
}

#[tokio::test]
async fn a_large_input_is_stored_after_the_door_and_every_step_reads_it_whole() {
    let mut w = World::new();
    let lines: Vec<String> = (0..50)
        .map(|n| format!(r#"{{"sku":"SKU-{n}-{}","quantity":1,"unit_price":100}}"#, "X".repeat(50)))
        .collect();
    let body = order_body("large-input").replace(
        r#"[{"sku":"BOOK-1","quantity":2,"unit_price":1250}]"#,
        &format!("[{}]", lines.join(",")),
    );
    assert!(body.len() > MAX_INLINE_INPUT_LEN, "{}", body.len());
    let id = w.submission.submit("large-input", body.as_bytes()).await.unwrap().order_id;
    let kept = w.store.orders()[0].order.clone();
    assert!(Stored::of(kept.input()).is_some(), "the input is kept as a reference: {kept:?}");
    w.run_for(Duration::from_secs(300)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.faults().misread, 0);
    // Submitted again, it is the same order, and nothing more is stored.
    let again = w.submission.submit("large-input", body.as_bytes()).await.unwrap();
    assert!(!again.created && again.order_id == id);
    assert_eq!(w.system.payloads.keys().len(), 1);
}

#[tokio::test]
async fn an_order_whose_stored_input_is_gone_fails_at_once_with_that_cause() {
    let mut w = World::new();
    let lines: Vec<String> = (0..50)
        .map(|n| format!(r#"{{"sku":"SKU-{n}-{}","quantity":1,"unit_price":100}}"#, "X".repeat(50)))
        .collect();
    let body = order_body("gone-input1").replace(
        r#"[{"sku":"BOOK-1","quantity":2,"unit_price":1250}]"#,
        &format!("[{}]", lines.join(",")),
    );
    assert!(body.len() > MAX_INLINE_INPUT_LEN, "{}", body.len());
    let id = w.submission.submit("gone-input1", body.as_bytes()).await.unwrap().order_id;
    assert_eq!(w.system.payloads.keys().len(), 1, "the input is stored");
    // The stored input is gone before the first step reads it (its retention was too short).
    w.system.payloads.clear();
    w.run_for(Duration::from_secs(60)).await;
    let r = w.state(id);
    assert_eq!((r.process_state, r.failure_count), (ProcessState::Error, 0), "{r:?}");
    let cause = r.cause.unwrap().to_string();
    assert!(
        cause.contains("a value it needs is unreadable") && cause.contains("is gone"),
        "{cause}"
    );
    assert!(w.remote.ledger().is_empty(), "the service was never called");
    assert_eq!(w.alerts().len(), 1, "the operators are told");
}

#[tokio::test]
async fn an_input_above_the_limit_is_refused_and_nothing_is_written() {
    let w = World::new();
    let body = format!(r#"{{"customer_id":"{}"}}"#, "c".repeat(MAX_PAYLOAD_LEN));
    let err = w.submission.submit("huge", body.as_bytes()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOrder(_)), "{err}");
    assert!(err.to_string().contains("more than the 262144"), "{err}");
    assert!(w.store.orders().is_empty() && w.system.payloads.keys().is_empty());
    assert!(w.queues.receive(&Destination::Scheduler, 10).is_empty());
}

#[tokio::test]
async fn an_output_the_store_cannot_take_now_brings_the_request_back() {
    let b = AgentBench::new();
    let shelf = Arc::new(MemoryPayloads::default());
    let agent = payment_agent(b.remote.clone(), b.queues.clone(), b.clock.clone(), b.waits.clone())
        .keeping(shelf.clone());
    let req = b.request(Duration::from_secs(30));
    b.remote.script("charge-payment", [Behaviour::Large(10_000)]);
    shelf.fail_next_puts(1);
    let err = agent.handle(&req, Incoming::first("request-1")).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(b.replies().is_empty(), "no reply without its output");
    // Again: the service answers from its ledger, and the output is stored once.
    let outcome = agent.handle(&req, Incoming::first("request-1")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    assert_eq!(b.remote.ledger().len(), 1);
    assert_eq!(shelf.keys().len(), 1);
    let Message::Reply(reply) = &b.replies()[0] else { panic!() };
    let StepOutcome::Done { output } = &reply.outcome else { panic!("{:?}", reply.outcome) };
    assert!(Stored::of(output).is_some_and(|s| s.bytes > 10_000));
}

#[tokio::test]
async fn a_reply_that_cannot_be_sent_is_retried_without_a_second_effect() {
    let b = AgentBench::new();
    let req = b.request(Duration::from_secs(30));
    b.queues.fail_next_sends(1);
    let err = b.handle(&req).await.unwrap_err();
    assert!(err.is_retryable());
    // The request comes back; the service sees the same key and answers from its ledger.
    assert!(matches!(b.handle(&req).await.unwrap(), AgentOutcome::Replied { done: true, .. }));
    assert_eq!(b.remote.calls(&req.idempotency_key), 2);
    assert_eq!(b.remote.applications(&req.idempotency_key), 1);
    assert_eq!(b.replies().len(), 1);
}

/// A service that answers every call at once and notes when each came, how many were in
/// flight at once, and throttles the calls it is told to.
struct Stamped {
    clock: ManualClock,
    log: std::sync::Mutex<StampLog>,
}

#[derive(Default)]
struct StampLog {
    at: Vec<Timestamp>,
    in_flight: u32,
    most_in_flight: u32,
    throttle: Vec<Option<Duration>>,
    /// The most calls it takes in a second of its own, however aligned; more are throttled
    /// (with no `Retry-After`) and not counted.
    limit: Option<usize>,
    throttled: usize,
}

impl Stamped {
    fn new(clock: &ManualClock) -> Arc<Self> {
        Arc::new(Stamped { clock: clock.clone(), log: Default::default() })
    }

    fn log(&self) -> std::sync::MutexGuard<'_, StampLog> {
        self.log.lock().unwrap()
    }

    /// The most calls that reached it within one second, however the second is aligned.
    fn busiest_second(&self) -> usize {
        let at: Vec<i64> = self.log().at.iter().map(|t| t.as_millis()).collect();
        at.iter()
            .map(|from| at.iter().filter(|t| (*from..*from + 1000).contains(*t)).count())
            .max()
            .unwrap_or(0)
    }
}

impl sas_engine::ports::RemoteService for Stamped {
    async fn call(
        &self,
        _: &sas_engine::ports::RemoteCall,
    ) -> std::result::Result<serde_json::Value, sas_engine::ports::RemoteFault> {
        let throttle = {
            let mut log = self.log();
            let now = self.clock.now();
            let second_ago = now.minus(Duration::from_secs(1));
            let taken = log.at.iter().rev().take_while(|t| **t > second_ago).count();
            if log.limit.is_some_and(|limit| taken >= limit) {
                log.throttled += 1;
                return Err(sas_engine::ports::RemoteFault::Throttled {
                    reason: "429 Too Many Requests".into(),
                    retry_after: None,
                });
            }
            log.at.push(now);
            log.in_flight += 1;
            log.most_in_flight = log.most_in_flight.max(log.in_flight);
            if log.throttle.is_empty() { None } else { Some(log.throttle.remove(0)) }
        };
        // Others run while this call is in flight.
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        self.log().in_flight -= 1;
        match throttle {
            Some(retry_after) => Err(sas_engine::ports::RemoteFault::Throttled {
                reason: "429 Too Many Requests".into(),
                retry_after,
            }),
            None => Ok(serde_json::json!({ "ok": true })),
        }
    }
}

type StampedAgent = Agent<
    Arc<Stamped>,
    Arc<MemoryQueues<ManualClock>>,
    ManualClock,
    SplitMix,
    Arc<MemoryWaits>,
    Arc<sas_engine::memory::MemoryServiceBook>,
>;

/// `n` executions of the payment agent, sharing one book and one service, within `limits`.
fn limited_agents(
    n: usize,
    limits: sas_engine::pace::Limits,
) -> (AgentBench, Arc<Stamped>, Arc<sas_engine::memory::MemoryServiceBook>, Vec<StampedAgent>) {
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let agents = (0..n)
        .map(|_| {
            payment_agent(service.clone(), b.queues.clone(), b.clock.clone(), b.waits.clone())
                .guarded(book.clone(), "payment", HoldPolicy::default())
                .limited(limits)
        })
        .collect();
    (b, service, book, agents)
}

#[tokio::test]
async fn a_declared_rate_holds_across_executions_and_a_request_without_a_turn_is_kept_back() {
    let limits = sas_engine::pace::Limits { per_second: Some(5), in_flight: None };
    let (b, service, _book, agents) = limited_agents(3, limits);
    // 23 requests spread over three executions, each with 30 s to go: every one is called
    // once, in its turn, never more than 5 in a second.
    for i in 0..23 {
        let mut request = b.request(Duration::from_secs(30));
        request.idempotency_key = format!("{}/{i}", request.idempotency_key);
        let outcome = agents[i % 3].handle(&request, Incoming::first("m")).await.unwrap();
        assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    }
    assert_eq!(service.log().at.len(), 23);
    assert_eq!(service.busiest_second(), 5);
    let first = service.log().at[0];
    let last = *service.log().at.last().unwrap();
    assert!(first.until(last) >= Duration::from_millis(22 * 200), "23 calls at 5 a second");

    // A request whose budget ends before the next free turn is not called: the agent tells
    // the scheduler when there will be room, and the step is deferred to then.
    let replies = b.queues.sent_count(&Destination::Replies);
    let short = b.request(Duration::from_millis(1_100));
    let outcome = agents[1].handle(&short, Incoming::first("m-short")).await.unwrap();
    let AgentOutcome::KeptBack { calls: 0, until } = outcome else { panic!("{outcome:?}") };
    assert!(until > b.clock.now());
    assert_eq!(service.log().at.len(), 23);
    assert_eq!(b.queues.sent_count(&Destination::Replies), replies + 1);
    let mut outcomes = Vec::new();
    loop {
        let batch = b.queues.receive(&Destination::Replies, 10);
        if batch.is_empty() {
            break;
        }
        for d in batch {
            let Message::Reply(reply) = Message::decode(&d.body).unwrap() else { panic!() };
            outcomes.push(reply.outcome);
        }
    }
    assert_eq!(outcomes.last(), Some(&StepOutcome::Deferred { until }));
    let own = Destination::Agent(sas_engine::AgentName::new("payment"));
    assert_eq!(b.queues.delayed_len(&own), 0, "nothing sent back to the agent's own queue");
}

/// The manual clock, but a wait lets the other tasks run, as a real one does.
#[derive(Clone, Debug)]
struct Ticking(ManualClock);

impl Clock for Ticking {
    fn now(&self) -> Timestamp {
        self.0.now()
    }
    async fn sleep(&self, duration: Duration) {
        self.0.advance(duration);
        tokio::task::yield_now().await;
    }
}

/// The manual clock, but every wait lasts `extra` longer than asked, as on a busy host.
#[derive(Clone, Debug)]
struct Drowsy {
    clock: ManualClock,
    extra: Arc<std::sync::Mutex<Duration>>,
}

impl Clock for Drowsy {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }
    async fn sleep(&self, duration: Duration) {
        self.clock.advance(duration + *self.extra.lock().unwrap());
    }
}

/// The shared book, but writing a turn takes `write` (of the same clock).
struct SlowTurns {
    book: sas_engine::memory::MemoryServiceBook,
    clock: ManualClock,
    write: Duration,
    /// How long a read of the service's record takes.
    read: Duration,
}

impl sas_engine::ports::Pace for SlowTurns {
    async fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> Result<sas_engine::pace::Booked> {
        self.clock.advance(self.write);
        self.book.take_turn(service, spacing, now, latest).await
    }
    async fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<sas_engine::pace::Place>> {
        self.book.enter(service, limit, now, until).await
    }
    async fn leave(&self, service: &str, place: sas_engine::pace::Place) -> Result<()> {
        self.book.leave(service, place).await
    }
    async fn usage(&self, service: &str, now: Timestamp) -> Result<sas_engine::pace::Usage> {
        self.book.usage(service, now).await
    }
}

impl sas_engine::ports::ServiceBook for SlowTurns {
    async fn load(&self, service: &str) -> Result<Option<sas_engine::health::ServiceRecord>> {
        self.clock.advance(self.read);
        self.book.load(service).await
    }
    async fn all(&self) -> Result<Vec<sas_engine::health::ServiceRecord>> {
        self.book.all().await
    }
    async fn save(
        &self,
        next: &sas_engine::health::ServiceRecord,
    ) -> Result<sas_engine::ports::Saved> {
        self.book.save(next).await
    }
}

/// The gaps between the calls that reached `service`.
fn gaps(service: &Stamped) -> Vec<u64> {
    let at = service.log().at.clone();
    at.windows(2).map(|w| w[0].until(w[1]).as_millis() as u64).collect()
}

type PacedAgent<C, G> =
    Agent<Arc<Stamped>, Arc<MemoryQueues<ManualClock>>, C, SplitMix, Arc<MemoryWaits>, G>;

/// The payment agent of `b` on `clock`, calling `service` within `limits` kept in `book`.
fn paced_agent<C, G>(
    b: &AgentBench,
    service: &Arc<Stamped>,
    clock: C,
    book: G,
    limits: sas_engine::pace::Limits,
) -> PacedAgent<C, G>
where
    C: Clock + Clone,
    G: sas_engine::ports::ServiceBook + sas_engine::ports::Pace,
{
    Agent::new(
        service.clone(),
        b.queues.clone(),
        clock,
        SplitMix::seeded(7),
        RetryPolicy::default(),
        Destination::Agent(sas_engine::AgentName::new("payment")),
        WaitReporter::new(b.waits.clone(), "agent-payment".into(), Duration::from_secs(30)),
    )
    .guarded(book, "payment", HoldPolicy::default())
    .limited(limits)
}

/// Request `i` of `b`, with 30 s to go and a key of its own.
fn nth_request(b: &AgentBench, i: usize) -> StepRequest {
    let mut request = b.request(Duration::from_secs(30));
    request.idempotency_key = format!("{}/{i}", request.idempotency_key);
    request
}

#[tokio::test]
async fn a_call_woken_late_for_its_turn_takes_another_rather_than_meet_the_next_call() {
    use sas_engine::pace::{Limits, spacing};
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let drowsy = Drowsy { clock: b.clock.clone(), extra: Arc::default() };
    let limits = Limits { per_second: Some(5), in_flight: None };
    let agent = paced_agent(&b, &service, drowsy.clone(), book, limits);
    let start = b.clock.now();
    for i in 0..4 {
        // The second call's wait for its turn (240 ms on) lasts 300 ms more.
        *drowsy.extra.lock().unwrap() = Duration::from_millis(if i == 1 { 300 } else { 0 });
        let outcome = agent.handle(&nth_request(&b, i), Incoming::first("m")).await.unwrap();
        assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    }
    // It woke 300 ms late, at 540 ms: going then, it would have met the third call (whose turn
    // was 480 ms) within a few ms. It took the turn at 540 ms instead, and the third call the
    // one after.
    assert_eq!(service.log().at[0], start);
    assert_eq!(service.log().at[1], start.plus(Duration::from_millis(540)));
    let spacing = spacing(5).as_millis() as u64;
    assert_eq!(gaps(&service), [540, spacing, spacing]);
}

#[tokio::test]
async fn slow_writes_of_turns_make_a_call_ask_for_its_turn_ahead_not_arrive_late_for_it() {
    use sas_engine::pace::{Limits, spacing};
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(SlowTurns {
        book: sas_engine::memory::MemoryServiceBook::default(),
        clock: b.clock.clone(),
        write: Duration::from_millis(300),
        read: Duration::ZERO,
    });
    let limits = Limits { per_second: Some(5), in_flight: None };
    let agent = paced_agent(&b, &service, b.clock.clone(), book, limits);
    let start = b.clock.now();
    for i in 0..4 {
        let outcome = agent.handle(&nth_request(&b, i), Incoming::first("m")).await.unwrap();
        assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    }
    // The first turn (now) was 300 ms gone once written: the call let it pass, and asked
    // from then on for turns 300 ms ahead, each kept to the millisecond.
    assert_eq!(service.log().at[0], start.plus(Duration::from_millis(600)));
    assert!(
        gaps(&service).iter().all(|gap| *gap >= spacing(5).as_millis() as u64),
        "{:?}",
        gaps(&service)
    );
}

#[tokio::test]
async fn a_slow_look_at_the_service_before_a_distant_turn_does_not_make_the_call_late() {
    use sas_engine::pace::{Limits, spacing};
    use sas_engine::ports::Pace;
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(SlowTurns {
        book: sas_engine::memory::MemoryServiceBook::default(),
        clock: b.clock.clone(),
        write: Duration::ZERO,
        read: Duration::from_millis(400),
    });
    // Calls before it took the next 20 turns: its own is 4.8 s away, and the record it read
    // first is old by then.
    let start = b.clock.now();
    let far = start.plus(Duration::from_secs(60));
    for _ in 0..20 {
        book.book.take_turn("payment", spacing(5), start, far).await.unwrap();
    }
    let limits = Limits { per_second: Some(5), in_flight: None };
    let agent = paced_agent(&b, &service, b.clock.clone(), book, limits);
    let outcome = agent.handle(&nth_request(&b, 0), Incoming::first("m")).await.unwrap();
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 1 });
    // The record was read again during the wait, not at the turn: the call went on time,
    // where a read at the turn would have made it 400 ms late and cost it the turn.
    assert_eq!(service.log().at, [start.plus(spacing(5) * 20)]);
}

#[tokio::test]
async fn a_declared_concurrency_holds_across_executions() {
    let limits = sas_engine::pace::Limits { per_second: None, in_flight: Some(2) };
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let agents: Vec<_> = (0..3)
        .map(|_| paced_agent(&b, &service, Ticking(b.clock.clone()), book.clone(), limits))
        .collect();
    let requests: Vec<StepRequest> = (0..9).map(|i| nth_request(&b, i)).collect();
    let outcomes = futures_util::future::join_all(
        requests.iter().enumerate().map(|(i, r)| agents[i % 3].handle(r, Incoming::first("m"))),
    )
    .await;
    for outcome in outcomes {
        assert_eq!(outcome.unwrap(), AgentOutcome::Replied { done: true, calls: 1 });
    }
    assert_eq!(service.log().at.len(), 9);
    assert_eq!(service.log().most_in_flight, 2, "two in flight at once, never three");
    let usage = sas_engine::ports::Pace::usage(&*book, "payment", b.clock.now()).await.unwrap();
    assert_eq!(usage.in_flight, 0, "every place was given back");
}

#[tokio::test]
async fn a_throttled_call_quiets_every_execution_for_as_long_as_the_service_asked() {
    use sas_engine::ports::ServiceBook;

    let (b, service, book, agents) = limited_agents(2, sas_engine::pace::Limits::NONE);
    service.log().throttle.push(Some(Duration::from_secs(3)));
    let start = b.clock.now();
    let first = b.request(Duration::from_secs(30));
    let outcome = agents[0].handle(&first, Incoming::first("m1")).await.unwrap();
    // Tried again once the quiet was over, without counting against the retries.
    assert_eq!(outcome, AgentOutcome::Replied { done: true, calls: 2 });
    let at = service.log().at.clone();
    assert!(at[0].until(at[1]) >= Duration::from_secs(3), "{at:?}");
    let record = book.load("payment").await.unwrap().unwrap();
    assert_eq!(record.quiet_until, Some(start.plus(Duration::from_secs(3))));

    // The other execution, asked during the quiet, waits it out too.
    b.clock.set(start.plus(Duration::from_millis(1_500)));
    service.log().throttle.push(Some(Duration::from_secs(4)));
    let mut second = b.request(Duration::from_secs(30));
    second.idempotency_key = format!("{}/2", second.idempotency_key);
    agents[0].handle(&second, Incoming::first("m2")).await.unwrap();
    let quiet_until = book.load("payment").await.unwrap().unwrap().quiet_until.unwrap();
    let mut third = b.request(Duration::from_secs(30));
    third.idempotency_key = format!("{}/3", third.idempotency_key);
    b.clock.set(quiet_until.minus(Duration::from_secs(2)));
    let calls = service.log().at.len();
    agents[1].handle(&third, Incoming::first("m3")).await.unwrap();
    assert!(service.log().at[calls] >= quiet_until, "called before the quiet was over");

    // A quiet longer than a request's budget keeps it back instead.
    service.log().throttle.push(Some(Duration::from_secs(120)));
    let mut fourth = b.request(Duration::from_secs(30));
    fourth.idempotency_key = format!("{}/4", fourth.idempotency_key);
    let outcome = agents[1].handle(&fourth, Incoming::first("m4")).await.unwrap();
    assert!(matches!(outcome, AgentOutcome::KeptBack { calls: 1, .. }), "{outcome:?}");
}

/// Tokio's clock, paused by the test so that it jumps to the next timer once every task waits,
/// read as a timestamp. It sets the bench's manual clock to the same time whenever it is read,
/// for the parts of the bench that read that one (the service's log, the queues).
#[derive(Clone, Debug)]
struct Paused {
    manual: ManualClock,
    base: Timestamp,
    origin: tokio::time::Instant,
}

impl Paused {
    fn new(manual: &ManualClock) -> Paused {
        Paused { manual: manual.clone(), base: manual.now(), origin: tokio::time::Instant::now() }
    }
}

impl Clock for Paused {
    fn now(&self) -> Timestamp {
        let now = self.base.plus(self.origin.elapsed());
        self.manual.set(now);
        now
    }
    async fn sleep(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_service_that_throttles_with_no_rate_declared_is_called_at_a_rate_learned_from_it() {
    use sas_engine::ports::ServiceBook;

    // The service takes 5 calls in any second; nobody declared it. Two executions of its
    // agent each take batches of ten requests at once, as the deployed agents do.
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    service.log().limit = Some(5);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let clock = Paused::new(&b.clock);
    let agents: Vec<_> = (0..2)
        .map(|_| {
            paced_agent(&b, &service, clock.clone(), book.clone(), sas_engine::pace::Limits::NONE)
        })
        .collect();
    let start = clock.now();
    let mut calls = 0;
    for round in 0..15 {
        let requests: Vec<StepRequest> = (0..20).map(|i| nth_request(&b, round * 20 + i)).collect();
        let outcomes = futures_util::future::join_all(
            requests.iter().enumerate().map(|(i, r)| agents[i % 2].handle(r, Incoming::first("m"))),
        )
        .await;
        for (i, outcome) in outcomes.into_iter().enumerate() {
            match outcome.unwrap() {
                AgentOutcome::Replied { done: true, calls: c } => calls += c as usize,
                other => panic!("round {round}, request {i}: {other:?}"),
            }
        }
    }
    let record = book.load("payment").await.unwrap().unwrap();
    let took = start.until(clock.now());
    let throttled = service.log().throttled;
    assert!(!record.is_held(), "throttling that a lower rate answers holds nothing");
    assert_eq!(calls, 300 + throttled, "each throttled call was made again");
    // Called as it comes, the service throttles more calls than it takes (465 for these 300):
    // at the learned rate, one in ten at most, and two thirds of its rate kept.
    assert!(throttled <= 300 / 10, "{throttled} throttled in {took:?}");
    assert!(took <= Duration::from_secs(90), "300 calls took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn the_orders_resumed_after_a_hold_reach_their_service_at_the_resume_rate() {
    // Sixty orders resumed at once, as a supervisor's delays in whole seconds and the queues'
    // delivery may bunch them, through two executions of an agent whose service declares no
    // rate: their calls go at the stack's resume rate (10 a second), across both.
    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    let clock = Paused::new(&b.clock);
    let agents: Vec<_> = (0..2)
        .map(|_| {
            paced_agent(&b, &service, clock.clone(), book.clone(), sas_engine::pace::Limits::NONE)
        })
        .collect();
    let resumed: Vec<StepRequest> =
        (0..60).map(|i| StepRequest { resumed: true, ..nth_request(&b, i) }).collect();
    let outcomes = futures_util::future::join_all(
        resumed.iter().enumerate().map(|(i, r)| agents[i % 2].handle(r, Incoming::first("m"))),
    )
    .await;
    for outcome in outcomes {
        assert!(matches!(outcome.unwrap(), AgentOutcome::Replied { done: true, calls: 1 }));
    }
    let busiest = service.busiest_second();
    assert!(busiest <= 10, "{busiest} calls in one second at a resume rate of 10");
    // The orders that did not wait are not slowed by it.
    let fresh: Vec<StepRequest> = (60..90).map(|i| nth_request(&b, i)).collect();
    let start = clock.now();
    let outcomes = futures_util::future::join_all(
        fresh.iter().enumerate().map(|(i, r)| agents[i % 2].handle(r, Incoming::first("m"))),
    )
    .await;
    assert!(outcomes.into_iter().all(|o| o.is_ok()));
    assert!(start.until(clock.now()) < Duration::from_secs(1), "fresh calls go at once");
}

/// A services book on which an operator holds the payment service the moment a call takes
/// its turn: the hold comes while the call waits for it.
struct HeldWhileWaiting {
    book: Arc<sas_engine::memory::MemoryServiceBook>,
    clock: ManualClock,
}

impl sas_engine::ports::ServiceBook for HeldWhileWaiting {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        self.book.load(service).await
    }
    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        self.book.all().await
    }
    async fn save(&self, next: &ServiceRecord) -> Result<sas_engine::ports::Saved> {
        self.book.save(next).await
    }
}

impl sas_engine::ports::Pace for HeldWhileWaiting {
    async fn take_turn(
        &self,
        service: &str,
        spacing: Duration,
        now: Timestamp,
        latest: Timestamp,
    ) -> Result<sas_engine::pace::Booked> {
        use sas_engine::ports::ServiceBook;
        let booked = self.book.take_turn(service, spacing, now, latest).await?;
        let record = self.book.load(service).await?;
        let record = record.unwrap_or_else(|| ServiceRecord::open(service, self.clock.now()));
        let held = record.hold_by(self.clock.now(), None, "ops", "maintenance").unwrap();
        self.book.save(&held).await?;
        Ok(booked)
    }
    async fn enter(
        &self,
        service: &str,
        limit: u32,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<sas_engine::pace::Place>> {
        self.book.enter(service, limit, now, until).await
    }
    async fn leave(&self, service: &str, place: sas_engine::pace::Place) -> Result<()> {
        self.book.leave(service, place).await
    }
    async fn usage(&self, service: &str, now: Timestamp) -> Result<sas_engine::pace::Usage> {
        self.book.usage(service, now).await
    }
}

#[tokio::test]
async fn a_call_that_waited_for_its_turn_is_not_made_once_its_service_is_held() {
    use sas_engine::ports::Pace;

    let b = AgentBench::new();
    let service = Stamped::new(&b.clock);
    let book = Arc::new(sas_engine::memory::MemoryServiceBook::default());
    // Calls before it took the next ten seconds' turns.
    let spacing = sas_engine::pace::spacing(1);
    for _ in 0..9 {
        let far = b.clock.now().plus(Duration::from_secs(60));
        book.take_turn("payment", spacing, b.clock.now(), far).await.unwrap();
    }
    let limits = sas_engine::pace::Limits { per_second: Some(1), in_flight: None };
    let held_meanwhile = HeldWhileWaiting { book: book.clone(), clock: b.clock.clone() };
    let agent = payment_agent(service.clone(), b.queues.clone(), b.clock.clone(), b.waits.clone())
        .guarded(held_meanwhile, "payment", HoldPolicy::default())
        .limited(limits);
    let request = b.request(Duration::from_secs(30));
    let outcome = agent.handle(&request, Incoming::first("m")).await.unwrap();
    // Its turn came over ten seconds into the hold: it is no probe, and the service is not
    // called; the step waits for the service as any other would.
    assert!(service.log().at.is_empty(), "called at {:?}, while held", service.log().at);
    assert_eq!(outcome, AgentOutcome::Held { calls: 0 });
    let Some(Message::Reply(reply)) = b.replies().pop() else { panic!("no reply") };
    assert!(matches!(reply.outcome, StepOutcome::Held { .. }), "{:?}", reply.outcome);
}

// ---------------------------------------------------------------- scheduler reads

#[tokio::test]
async fn an_order_runs_whole_when_every_cheap_read_misses() {
    let mut w = World::new();
    // Eventual reads see the tables as they were an hour ago: nothing of this order yet.
    w.store.set_read_lag(Duration::from_secs(3600));
    let id = w.submit("unseen").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
    assert!(w.handled.iter().all(|(_, h)| *h == Handled::Applied), "{:?}", w.handled);
    // Each of the four scheduler messages missed once; the requests take the order from its
    // record, and read nothing more.
    assert_eq!(w.store.stats().stale_reads, 4);
}

#[tokio::test]
async fn a_stale_copy_never_decides_what_the_latest_record_would_not() {
    let mut w = World::new();
    w.store.set_read_lag(Duration::from_secs(1));
    let id = w.submit("stale").await.unwrap().order_id;
    // A second start message, as a retried submission or the supervisor would send.
    w.submit("stale").await.unwrap();
    w.clock.advance(Duration::from_secs(2));
    // The first start claims. From here on every eventual read sees the Pending record.
    assert!(w.step(&Destination::Scheduler).await);
    // The second start looks like a fresh claim against the stale copy; the write's condition
    // fails, and the latest record shows the order already claimed.
    let conflicts = w.store.stats().conflicts;
    assert!(w.step(&Destination::Scheduler).await);
    assert_eq!(w.store.stats().conflicts, conflicts + 1);
    assert!(matches!(w.handled[1].1, Handled::Ignored(_)), "{:?}", w.handled);
    // Replies look impossible against the Pending copy, and are judged on the latest.
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.state(id).attempt, 3, "one lease per step, never a second");
    assert_eq!(w.remote.max_applications(), 1);
    assert!(w.store.stats().stale_reads >= 4);
}

#[tokio::test]
async fn replies_of_steps_side_by_side_handled_in_one_batch_are_all_recorded() {
    // Three steps at once; their replies come back together and are handled concurrently, as
    // a batch is: each write meets the others', and each reply is judged again on what they
    // wrote rather than dropped.
    let mut w = World::new();
    let three = r#"{"name":"three","steps":[
        {"name":"reserve-inventory","agent":"inventory","depends_on":[]},
        {"name":"charge-payment","agent":"payment","depends_on":[]},
        {"name":"ship","agent":"shipping","depends_on":[]}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(three, &world::agent_names());
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow.unwrap()));
    let id = w.submit("three").await.unwrap().order_id;
    assert!(w.step(&Destination::Scheduler).await);
    for agent in ["inventory", "payment", "shipping"] {
        assert!(w.step(&Destination::Agent(sas_engine::AgentName::new(agent))).await);
    }
    let p = w.ports();
    let ports = Ports {
        store: Yielding(p.store),
        outbox: p.outbox,
        bus: p.bus,
        clock: p.clock,
        config: p.config,
        catalogue: p.catalogue,
        payloads: p.payloads,
    };
    let scheduler =
        sas_engine::services::Scheduler::new(ports, w.waits.clone(), "scheduler-y".into());
    let replies = w.queues.receive(&Destination::Replies, 10);
    assert_eq!(replies.len(), 3);
    let conflicts = w.store.stats().conflicts;
    let handle = |d: &sas_engine::memory::Delivery| {
        let message = Message::decode(&d.body).unwrap();
        let message_id = d.message_id.clone();
        let scheduler = &scheduler;
        async move {
            let incoming = Incoming { message_id: &message_id, receive_count: 1 };
            scheduler.handle(&message, incoming).await.unwrap()
        }
    };
    let handled = tokio::join!(handle(&replies[0]), handle(&replies[1]), handle(&replies[2]));
    assert_eq!(handled, (Handled::Applied, Handled::Applied, Handled::Applied));
    assert!(w.store.stats().conflicts >= conflicts + 3, "the writes never met");
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn the_replies_of_one_order_in_one_batch_are_recorded_by_one_write() {
    // Three steps at once, then a last one: their three replies, handled as one order's turn
    // of a batch, make one write; any of them delivered again replays what it owed.
    let mut w = World::new();
    let four = r#"{"name":"four","steps":[
        {"name":"reserve-inventory","agent":"inventory","depends_on":[]},
        {"name":"charge-payment","agent":"payment","depends_on":[]},
        {"name":"hold-stock","agent":"shipping","depends_on":[]},
        {"name":"ship","agent":"shipping","depends_on":["reserve-inventory","charge-payment","hold-stock"]}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(four, &world::agent_names());
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow.unwrap()));
    let id = w.submit("four").await.unwrap().order_id;
    assert!(w.step(&Destination::Scheduler).await);
    for agent in ["inventory", "payment", "shipping"] {
        assert!(w.step(&Destination::Agent(sas_engine::AgentName::new(agent))).await);
    }
    let replies = w.queues.receive(&Destination::Replies, 10);
    assert_eq!(replies.len(), 3);
    let messages: Vec<(Message, String)> =
        replies.iter().map(|d| (Message::decode(&d.body).unwrap(), d.message_id.clone())).collect();
    let turn: Vec<(Message, Incoming<'_>)> = messages
        .iter()
        .map(|(m, id)| (m.clone(), Incoming { message_id: id, receive_count: 1 }))
        .collect();
    let writes = w.store.stats().writes;
    let handled: Vec<Handled> =
        w.scheduler.handle_turn(&turn).await.into_iter().map(Result::unwrap).collect();
    assert_eq!(handled, vec![Handled::Applied; 3]);
    assert_eq!(w.store.stats().writes, writes + 1, "one write for the three replies");
    let record = w.state(id);
    assert!(record.steps[..3].iter().all(|s| s.status == StepStatus::Done), "{:?}", record.steps);
    assert!(messages.iter().all(|(_, m)| record.last_input.is_message(m)), "every reply is named");
    // The last step was sent once, by the one write's effects.
    assert_eq!(w.queues.len(&Destination::Agent(sas_engine::AgentName::new("shipping"))), 1);
    // The second reply again, as after a crash before its effects: it replays them.
    let (again, again_id) = &messages[1];
    let incoming = Incoming { message_id: again_id, receive_count: 2 };
    assert_eq!(w.scheduler.handle(again, incoming).await.unwrap(), Handled::Replayed);
    for reply in &replies {
        w.queues.delete(&Destination::Replies, &reply.receipt).unwrap();
    }
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.remote.max_applications(), 1);
}

// ---------------------------------------------------------------- supervisor

/// A store that yields to the runtime before every call, so that two services running
/// concurrently on one thread interleave their reads and writes.
struct Yielding<S>(S);

impl<S: StateStore> StateStore for Yielding<S> {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        tokio::task::yield_now().await;
        self.0.create_order(order).await
    }
    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        tokio::task::yield_now().await;
        self.0.create_state(state).await
    }
    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        tokio::task::yield_now().await;
        self.0.load(id, read).await
    }
    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        self.0.load_order(id, read).await
    }
    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        tokio::task::yield_now().await;
        self.0.save(next, expected).await
    }
    async fn slots(&self, key: &str) -> Result<Slots> {
        tokio::task::yield_now().await;
        self.0.slots(key).await
    }
    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        tokio::task::yield_now().await;
        self.0.save_slots(next).await
    }
    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        tokio::task::yield_now().await;
        self.0.join(key, queued).await
    }
    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        tokio::task::yield_now().await;
        self.0.line(key, limit).await
    }
    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        tokio::task::yield_now().await;
        self.0.ahead(key, position).await
    }
    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        tokio::task::yield_now().await;
        self.0.leave(key, queued).await
    }
    async fn put_page(&self, page: &sas_engine::ports::Page) -> Result<()> {
        tokio::task::yield_now().await;
        self.0.put_page(page).await
    }
    async fn pages(&self, pass: &str) -> Result<Vec<sas_engine::ports::Page>> {
        tokio::task::yield_now().await;
        self.0.pages(pass).await
    }
    async fn drop_pages(&self, pass: &str) -> Result<()> {
        tokio::task::yield_now().await;
        self.0.drop_pages(pass).await
    }
}

impl<S: ExpiryIndex> ExpiryIndex for Yielding<S> {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        self.0.due(shard, due_by).await
    }
}

impl<G: ServiceBook> ServiceBook for Yielding<G> {
    async fn load(&self, service: &str) -> Result<Option<ServiceRecord>> {
        tokio::task::yield_now().await;
        self.0.load(service).await
    }
    async fn all(&self) -> Result<Vec<ServiceRecord>> {
        tokio::task::yield_now().await;
        self.0.all().await
    }
    async fn save(&self, next: &ServiceRecord) -> Result<Saved> {
        tokio::task::yield_now().await;
        self.0.save(next).await
    }
}

type TestSupervisor = Supervisor<
    Yielding<world::Store>,
    world::Store,
    world::Queues,
    world::Bus,
    ManualClock,
    world::Load,
    world::Payloads,
>;

fn racing_supervisor(w: &World) -> TestSupervisor {
    let load = w.load();
    let p = w.ports();
    let ports = Ports {
        store: Yielding(p.store.clone()),
        outbox: p.outbox,
        bus: p.bus,
        clock: p.clock,
        config: p.config,
        catalogue: p.catalogue,
        payloads: p.payloads,
    };
    Supervisor::new(ports, p.store, load)
}

/// Takes every message off `dest` for good, as a queue that loses them would.
fn lose_all(w: &World, dest: &Destination) {
    loop {
        let batch = w.queues.receive(dest, 10);
        if batch.is_empty() {
            return;
        }
        for d in batch {
            w.queues.delete(dest, &d.receipt).unwrap();
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn two_supervisors_at_once_never_both_act_on_a_record() {
    let mut w = World::new();
    let id = w.submit("race-1").await.unwrap().order_id;
    // Lose the start message so the order expires.
    lose_all(&w, &Destination::Scheduler);
    w.clock.advance(Duration::from_secs(60) + SLACK);
    let (a, b) = (racing_supervisor(&w), racing_supervisor(&w));
    let (ra, rb) = tokio::join!(a.sweep(), b.sweep());
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!((ra.found, rb.found), (1, 1), "both saw the expired record");
    assert_eq!(ra.acted + rb.acted, 1);
    assert_eq!(ra.lost_races + rb.lost_races, 1);
    assert_eq!(w.state(id).failure_count, 1, "counted once");
    // One new start message.
    assert_eq!(w.queues.sent_count(&Destination::Scheduler), 2);
    w.run_for(Duration::from_secs(300)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

#[tokio::test(flavor = "current_thread")]
async fn racing_supervisors_at_the_threshold_send_exactly_one_alert() {
    let config = EngineConfig {
        failure_threshold: 1,
        status_events: StatusKinds::all(),
        ..EngineConfig::default()
    };
    let mut w = World::with(config);
    w.remote.script(
        "reserve-inventory",
        std::iter::repeat_n(Behaviour::Slow(Duration::from_secs(120)), 5),
    );
    w.remote.script(
        "release-inventory",
        std::iter::repeat_n(Behaviour::Slow(Duration::from_secs(120)), 5),
    );
    let id = w.submit("race-2").await.unwrap().order_id;
    w.settle().await;
    for _ in 0..10 {
        w.clock.advance(Duration::from_secs(200));
        let (a, b) = (racing_supervisor(&w), racing_supervisor(&w));
        let _ = tokio::join!(a.sweep(), b.sweep());
        w.settle().await;
    }
    let r = w.state(id);
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.alert, Some(AlertDelivery::Sent));
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(r.needs_manual_undo(), ["reserve-inventory"]);
}

#[tokio::test(flavor = "current_thread")]
async fn racing_supervisors_announce_a_hold_and_its_release_once() {
    let w = World::new();
    let now = w.clock.now();
    let policy = HoldPolicy::default();
    let held =
        ServiceRecord::open("payment", now).hold(now, "charge-payment", 5, "503", &policy).unwrap();
    assert_eq!(w.book.save(&held).await.unwrap(), Saved::Saved);
    // Every read and write of the book gives way, so the two tendings interleave.
    let book = Yielding(w.book.clone());
    let (a, b) = (racing_supervisor(&w), racing_supervisor(&w));
    let (ra, rb) = tokio::join!(a.tend(&book, true), b.tend(&book, true));
    assert_eq!(ra.unwrap().announced + rb.unwrap().announced, 1);
    let (ra, rb) = tokio::join!(a.tend(&book, true), b.tend(&book, true));
    assert_eq!(ra.unwrap().announced + rb.unwrap().announced, 0, "announced already");

    let record = w.book.load("payment").await.unwrap().unwrap();
    let released = record.release_by(w.clock.now(), None, "ops", "back").unwrap();
    assert_eq!(w.book.save(&released).await.unwrap(), Saved::Saved);
    let (ra, rb) = tokio::join!(a.tend(&book, true), b.tend(&book, true));
    assert_eq!(ra.unwrap().announced + rb.unwrap().announced, 1);
    let states: Vec<_> =
        w.bus.of_type(SERVICE_DETAIL_TYPE).iter().map(|e| e["state"].clone()).collect();
    assert_eq!(states, ["held", "open"]);
    assert!(!w.book.load("payment").await.unwrap().unwrap().unannounced());
}

#[tokio::test]
async fn a_sweep_is_bounded_and_the_rest_waits_for_the_next() {
    let config = EngineConfig { sweep_limit: 8, index_shards: 4, ..EngineConfig::default() };
    let mut w = World::with(config);
    for i in 0..30 {
        w.submit(&format!("bulk-{i}")).await.unwrap();
    }
    // Every start message lost.
    lose_all(&w, &Destination::Scheduler);
    w.clock.advance(Duration::from_secs(60) + SLACK);
    let first = w.sweep().await;
    assert_eq!((first.found, first.acted), (8, 8), "{first:?}");
    let mut total = first.acted;
    for _ in 0..10 {
        total += w.sweep().await.acted;
    }
    assert_eq!(total, 30);
    w.run_for(Duration::from_secs(600)).await;
    assert!(w.store.records().iter().all(|r| r.process_state == ProcessState::Processed));
}

#[tokio::test]
async fn a_bounded_sweep_repairs_the_longest_expired_first() {
    let config = EngineConfig { sweep_limit: 4, index_shards: 4, ..EngineConfig::default() };
    let w = World::with(config);
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(w.submit(&format!("queue-{i}")).await.unwrap().order_id);
        w.clock.advance(Duration::from_secs(1));
    }
    lose_all(&w, &Destination::Scheduler);
    w.clock.advance(Duration::from_secs(60) + SLACK);
    let now = w.clock.now();
    let report = w.sweep().await;
    assert_eq!((report.found, report.acted), (4, 4), "{report:?}");
    let repaired: Vec<bool> =
        ids.iter().map(|&id| w.state(id).complete_by.is_some_and(|at| at > now)).collect();
    assert_eq!(repaired, [true, true, true, true, false, false, false, false, false, false]);
}

#[tokio::test]
async fn a_stack_that_wrote_to_fewer_shards_is_still_repaired_whole() {
    // Before the index had its fixed shards, a stack spread its entries over 32 at most.
    let before = EngineConfig {
        index_shards: 32,
        status_events: StatusKinds::all(),
        ..EngineConfig::default()
    };
    let mut w = World::with(before);
    for i in 0..100 {
        w.submit(&format!("before-{i}")).await.unwrap();
    }
    let shards: std::collections::BTreeSet<u16> =
        w.store.records().iter().map(|r| r.shard).collect();
    assert!(shards.len() > 16 && shards.iter().all(|&s| s < 32), "{shards:?}");
    // Every start message lost, and the stack updated to today's shards.
    lose_all(&w, &Destination::Scheduler);
    w.system.config = Arc::new(EngineConfig::default());
    w.supervisor = w.system.supervisor(w.queues.clone());
    assert_eq!(w.system.config.index_shards, sas_engine::config::INDEX_SHARDS);
    w.clock.advance(Duration::from_secs(60) + SLACK);
    let report = w.sweep().await;
    assert_eq!((report.found, report.acted), (100, 100), "{report:?}");
    w.run_for(Duration::from_secs(600)).await;
    assert!(w.store.records().iter().all(|r| r.process_state == ProcessState::Processed));
}

#[tokio::test]
async fn finished_orders_leave_the_index_so_sweeps_cost_what_has_expired() {
    let mut w = World::new();
    for i in 0..50 {
        w.submit(&format!("done-{i}")).await.unwrap();
    }
    w.settle().await;
    assert_eq!(w.store.index_len(), 0);
    w.clock.advance(Duration::from_secs(3600));
    let r = w.sweep().await;
    assert_eq!((r.found, r.acted), (0, 0));
    assert_eq!(r.oldest_ms, Some(0), "nothing is in flight");
}

#[tokio::test]
async fn a_lagging_index_entry_is_rechecked_against_the_table() {
    let mut w = World::new();
    w.store.set_index_lag(Duration::from_secs(120));
    let id = w.submit("lag").await.unwrap().order_id;
    w.clock.advance(Duration::from_secs(121)); // the index now shows the Pending deadline
    w.settle().await; // meanwhile the order finishes; the index has not caught up
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    let entry = w.store.due(id.shard(w.system.config.index_shards), w.clock.now()).await.unwrap();
    assert_eq!(entry.len(), 1, "the index still lists the finished order");
    let handled = w.supervisor.handle(entry[0], Duration::ZERO).await.unwrap();
    assert!(matches!(handled, Handled::Ignored(_)), "{handled:?}");
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

#[tokio::test]
async fn a_record_whose_deadline_has_not_passed_is_never_touched() {
    // Faults that never add up to a hold in a row: the first step's leases run out, up to its
    // last (which would hold the action instead).
    let hold = HoldPolicy { after_failures: u32::MAX, ..HoldPolicy::default() };
    let mut w = World::with(EngineConfig { failure_threshold: 3, hold, ..EngineConfig::default() });
    w.remote.script("reserve-inventory", std::iter::repeat_n(Behaviour::Transient, 1_000));
    let id = w.submit("patient").await.unwrap().order_id;
    w.settle().await;
    let cb = w.state(id).earliest_lease().unwrap();
    assert!(w.clock.now() < cb, "the agent gave up before the deadline");
    // The queues are quick: the lease is judged once the reports' own delay has passed too.
    w.clock.set(cb.plus(SLACK));
    assert_eq!(w.sweep().await.acted, 1);
    w.clock.advance(w.system.config.wait.wait(1));
    w.settle().await;
    // One failure counted, the next lease running.
    let r = w.state(id);
    assert_eq!((r.failure_count, r.process_state), (1, ProcessState::Processing));
    let cb = r.earliest_lease().unwrap();
    w.clock.set(cb.plus(SLACK).minus(Duration::from_millis(1)));
    assert_eq!(w.sweep().await.acted, 0);
    assert_eq!(w.state(id), r, "not a byte changed");
    // At the deadline it is acted on: a second failure is counted.
    w.clock.set(cb.plus(SLACK));
    assert_eq!(w.sweep().await.acted, 1);
    assert_eq!(w.state(id).failure_count, 2);
}

/// The scheduler takes one start message; every other queue is handled at once.
async fn slow_scheduler_step(w: &mut World) {
    if let Some(d) = w.queues.receive(&Destination::Scheduler, 1).pop() {
        let incoming = Incoming { message_id: &d.message_id, receive_count: d.receive_count };
        assert!(w.deliver(&Destination::Scheduler, incoming, &d.body).await);
        w.queues.delete(&Destination::Scheduler, &d.receipt).unwrap();
    }
    for dest in w.destinations().into_iter().filter(|d| *d != Destination::Scheduler) {
        while let Some(d) = w.queues.receive(&dest, 1).pop() {
            let incoming = Incoming { message_id: &d.message_id, receive_count: d.receive_count };
            assert!(w.deliver(&dest, incoming, &d.body).await);
            w.queues.delete(&dest, &d.receipt).unwrap();
        }
    }
}

#[tokio::test]
async fn a_backlog_delays_orders_but_never_counts_against_them() {
    let mut w = World::new();
    let ids: Vec<OrderId> = {
        let mut ids = Vec::new();
        for i in 0..30 {
            ids.push(w.submit(&format!("queued-{i}")).await.unwrap().order_id);
        }
        ids
    };
    // The scheduler is slow: it takes one start message every 10 s, long past every claim
    // grace, while the supervisor sweeps every 5 s.
    let mut sweeps = Vec::new();
    for _ in 0..40 {
        slow_scheduler_step(&mut w).await;
        w.clock.advance(Duration::from_secs(5));
        sweeps.push(w.sweep().await);
        w.clock.advance(Duration::from_secs(5));
        sweeps.push(w.sweep().await);
    }
    assert!(ids.iter().all(|id| w.state(*id).process_state == ProcessState::Processed));
    assert!(ids.iter().all(|id| w.state(*id).failure_count == 0), "a wait is not a failure");
    assert_eq!(sweeps.iter().map(|r| r.acted).sum::<usize>(), 0, "nothing was reset");
    assert_eq!(
        w.queues.sent_count(&Destination::Scheduler),
        30,
        "recovery added no message to the backlog"
    );
    // The horizon followed the backlog: the last orders waited well over three minutes.
    let longest = sweeps.iter().map(|r| r.horizon_ms).max().unwrap();
    assert!(longest > 180_000, "{longest}");
}

#[tokio::test]
async fn a_lost_message_is_still_found_once_the_queues_are_past_it() {
    let mut w = World::new();
    let lost = w.submit("lost").await.unwrap().order_id;
    lose_all(&w, &Destination::Scheduler);
    // A backlog that takes 200 s to clear, made of later orders.
    for i in 0..20 {
        w.submit(&format!("after-{i}")).await.unwrap();
    }
    let mut found_at = None;
    for step in 0..60 {
        slow_scheduler_step(&mut w).await;
        w.clock.advance(Duration::from_secs(10));
        if w.sweep().await.acted > 0 && found_at.is_none() {
            found_at = Some(step);
        }
    }
    let found_at = found_at.expect("the lost start message was never found");
    // Not while later messages still waited (the first 20 steps), but soon after.
    assert!((20..40).contains(&found_at), "found at step {found_at}");
    w.run_for(Duration::from_secs(600)).await;
    let r = w.state(lost);
    assert_eq!(r.process_state, ProcessState::Processed);
    let retries = r.timeline.iter().filter(|e| e.what == Happening::RetryScheduled).count();
    assert_eq!(retries, 1, "one reset, for the one message lost");
}

#[tokio::test]
async fn waiting_messages_nobody_takes_stop_every_judgement() {
    let mut w = World::new();
    let id = w.submit("stuck").await.unwrap().order_id;
    // The scheduler never runs: its queue holds the start message and no consumer reported.
    w.clock.advance(Duration::from_secs(3600));
    let report = w.sweep().await;
    assert_eq!(report.stalled.as_deref(), Some("scheduler"));
    assert_eq!((report.found, report.acted), (0, 0));
    // A stalled sweep judges nothing, but still tells how long the order has waited.
    assert_eq!(report.oldest_ms, Some(3_600_000));
    assert_eq!(w.state(id).failure_count, 0);
    // Once the scheduler runs, the order goes through untouched.
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    assert_eq!(w.state(id).failure_count, 0);
}

/// The request waiting on `dest`, left there for its agent.
fn waiting_request(w: &World, dest: &Destination) -> StepRequest {
    let d = w.queues.receive(dest, 1).pop().expect("a request waits");
    w.queues.change_visibility(dest, &d.receipt, Duration::ZERO).unwrap();
    match Message::decode(&d.body).unwrap() {
        Message::Request(r) => *r,
        other => panic!("not a request: {other:?}"),
    }
}

#[tokio::test]
async fn each_step_is_asked_with_the_outputs_of_the_steps_before_it() {
    let mut w = World::new();
    w.remote.script("ship", [Behaviour::Permanent("no carrier".into())]);
    let id = w.submit("outputs-1").await.unwrap().order_id;
    let agent = |name| Destination::Agent(sas_engine::AgentName::new(name));
    w.step(&Destination::Scheduler).await;
    assert!(waiting_request(&w, &agent("inventory")).outputs.is_empty());
    w.step(&agent("inventory")).await;
    w.step(&Destination::Replies).await;
    let reserved = w.state(id).steps[0].output.clone().unwrap();
    let charge = waiting_request(&w, &agent("payment"));
    assert_eq!(charge.outputs, [("reserve-inventory".to_owned(), reserved.clone())].into());
    w.step(&agent("payment")).await;
    w.step(&Destination::Replies).await;
    let charged = w.state(id).steps[1].output.clone().unwrap();
    let ship = waiting_request(&w, &agent("shipping"));
    let before = [
        ("reserve-inventory".to_owned(), reserved),
        ("charge-payment".to_owned(), charged.clone()),
    ];
    assert_eq!(ship.outputs, before.into());
    // Shipping is refused: the refund is asked with the charge's own output, and nothing else.
    w.step(&agent("shipping")).await;
    w.step(&Destination::Replies).await;
    let refund = waiting_request(&w, &agent("payment"));
    assert_eq!((refund.action.as_str(), refund.input), ("refund-payment", Some(charged)));
    assert!(refund.outputs.is_empty());
}

#[tokio::test]
async fn a_step_is_asked_with_the_outputs_of_the_steps_it_depends_on_only() {
    let mut w = World::new();
    // Shipping depends on the reservation and not on the charge, which needs nothing before.
    let json = r#"{"name": "order-fulfilment", "steps": [
        {"name": "reserve-inventory", "agent": "inventory"},
        {"name": "charge-payment", "agent": "payment", "depends_on": []},
        {"name": "ship", "agent": "shipping", "depends_on": ["reserve-inventory"]}]}"#;
    let workflow = sas_engine::workflow::Workflow::from_json(json, &world::agent_names()).unwrap();
    w.deploy(sas_engine::catalogue::Catalogue::single(workflow));
    let id = w.submit("outputs-2").await.unwrap().order_id;
    let agent = |name| Destination::Agent(sas_engine::AgentName::new(name));
    w.step(&Destination::Scheduler).await;
    w.step(&agent("inventory")).await;
    w.step(&Destination::Replies).await;
    let reserved = w.state(id).steps[0].output.clone().unwrap();
    assert!(waiting_request(&w, &agent("payment")).outputs.is_empty());
    w.step(&agent("payment")).await;
    w.step(&Destination::Replies).await;
    let ship = waiting_request(&w, &agent("shipping"));
    assert_eq!(ship.outputs, [("reserve-inventory".to_owned(), reserved)].into());
    w.settle().await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
}

// ---------------------------------------------------------------- events

#[tokio::test]
async fn a_rejected_alert_is_an_error_and_is_delivered_on_redelivery() {
    let mut w = World::new();
    w.remote.script("reserve-inventory", [Behaviour::Permanent("no stock".into())]);
    let id = w.submit("alert-1").await.unwrap().order_id;
    let inventory = Destination::Agent(sas_engine::AgentName::new("inventory"));
    w.step(&Destination::Scheduler).await;
    w.step(&inventory).await;
    // The bus refuses the entries, and then each try of them alone.
    w.bus.reject_next_entries(2 * ENTRY_TRIES as usize);
    assert!(!w.step(&Destination::Replies).await, "a dropped alert fails the handler");
    assert_eq!(w.state(id).alert, Some(AlertDelivery::Pending));
    assert!(w.alerts().is_empty());
    w.clock.advance(Duration::from_secs(31));
    w.settle().await;
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(w.state(id).alert, Some(AlertDelivery::Sent));
}

#[tokio::test]
async fn an_event_the_bus_refuses_alone_is_published_again_alone() {
    let mut w = World::new();
    w.remote.script("reserve-inventory", [Behaviour::Permanent("no stock".into())]);
    let id = w.submit("alert-3").await.unwrap().order_id;
    let inventory = Destination::Agent(sas_engine::AgentName::new("inventory"));
    w.step(&Destination::Scheduler).await;
    w.step(&inventory).await;
    // The reply publishes the order's status and its alert; the bus refuses the second entry.
    w.bus.reject_entry_at(1);
    let before = w.bus.count();
    assert!(w.step(&Destination::Replies).await, "a refusal the retry mended failed the handler");
    assert_eq!(w.bus.count(), before + 2, "each event once: {:?}", w.bus.published());
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(w.state(id).alert, Some(AlertDelivery::Sent));
}

#[tokio::test]
async fn an_alert_whose_message_gave_up_is_published_by_the_supervisor() {
    let mut w = World::new();
    w.remote.script("reserve-inventory", [Behaviour::Permanent("no stock".into())]);
    let id = w.submit("alert-2").await.unwrap().order_id;
    w.bus.fail_next_calls(1_000);
    w.settle().await;
    // The reply is retried until the queue gives up on it.
    for _ in 0..10 {
        w.clock.advance(Duration::from_secs(31));
        w.settle().await;
    }
    assert_eq!(w.queues.dead_letters(&Destination::Replies).len(), 1);
    assert_eq!(w.state(id).alert, Some(AlertDelivery::Pending));
    w.bus.fail_next_calls(0);
    w.run_for(Duration::from_secs(600)).await;
    assert_eq!(w.alerts().len(), 1);
    assert_eq!(w.state(id).alert, Some(AlertDelivery::Sent));
}

#[tokio::test]
async fn only_the_configured_status_events_are_published() {
    let mut w = World::with(EngineConfig::default());
    let id = w.submit("quiet").await.unwrap().order_id;
    w.settle().await;
    assert_eq!(w.statuses(id), ["processed"]);
}

// ---------------------------------------------------------------- status

#[tokio::test]
async fn the_status_view_shows_steps_and_timeline() {
    let mut w = World::new();
    let id = w.submit("view").await.unwrap().order_id;
    w.settle().await;
    let status = StatusService::new(w.store.clone());
    let view = status.get(id, &Owner::anonymous()).await.unwrap().unwrap();
    assert_eq!(view.process_state, ProcessState::Processed);
    assert_eq!(view.steps.len(), 3);
    assert!(view.timeline.len() >= 5);
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(json["process_state"], "Processed");
    assert_eq!(json["order"]["currency"], "EUR");
    let unknown = OrderId::for_key(&sas_engine::IdempotencyKey::parse("nobody").unwrap());
    assert!(status.get(unknown, &Owner::anonymous()).await.unwrap().is_none());
}

#[tokio::test]
async fn an_order_is_its_owners_and_so_are_its_keys() {
    let w = World::new();
    let ada = Owner::iam("arn:aws:iam::123456789012:user/ada").unwrap();
    let bob = Owner::jwt("https://issuer.example", "bob").unwrap();
    let body = world::order_body("shared-key");
    let a = w.submission.submit_as(&ada, "shared-key", body.as_bytes()).await.unwrap();
    // The same key is Bob's own: a new order, not a conflict that would tell him Ada used it.
    let other = world::order_body("another order");
    let b = w.submission.submit_as(&bob, "shared-key", other.as_bytes()).await.unwrap();
    assert!(a.created && b.created && a.order_id != b.order_id);
    // Each sees their own order; to anyone else it does not exist.
    let status = StatusService::new(w.store.clone());
    assert!(status.get(a.order_id, &ada).await.unwrap().is_some());
    for stranger in [&bob, &Owner::anonymous()] {
        assert_eq!(status.get(a.order_id, stranger).await.unwrap(), None, "{stranger}");
    }
    // Ada sending her key again with another order is refused; Bob's order is untouched.
    let reused = w.submission.submit_as(&ada, "shared-key", other.as_bytes()).await;
    assert!(matches!(reused, Err(Error::KeyReused { .. })), "{reused:?}");
    assert!(status.get(b.order_id, &bob).await.unwrap().is_some());
}

#[tokio::test]
async fn a_processed_order_undone_is_compensated_by_its_own_undos_and_the_rest_left_listed() {
    let mut w = World::new();
    let id = w.submit("to-undo").await.unwrap().order_id;
    w.run_for(Duration::from_secs(60)).await;
    assert_eq!(w.state(id).process_state, ProcessState::Processed);
    let undo = Command::new(CommandKind::Undo, "undo-1", "arn:ops", "returned").unwrap();
    let commanded = w.operator().command(id, &undo).await.unwrap().unwrap();
    assert!(matches!(commanded.applied, Applied::Now), "{commanded:?}");
    w.run_for(Duration::from_secs(120)).await;
    let r = w.state(id);
    // The refund and the release went through; shipping has no undo and is left to the
    // operators, with an alert.
    assert!(w.remote.applied(&World::key(id, "charge-payment", "undo")));
    assert!(w.remote.applied(&World::key(id, "reserve-inventory", "undo")));
    assert_eq!(r.process_state, ProcessState::Error);
    assert_eq!(r.needs_manual_undo(), ["ship"]);
    assert_eq!(w.alerts().len(), 1);
    // Sent again, it is the same command; another finds nothing processed to undo.
    let again = w.operator().command(id, &undo).await.unwrap().unwrap();
    assert!(matches!(again.applied, Applied::Before), "{again:?}");
    let other = Command::new(CommandKind::Undo, "undo-2", "arn:ops", "twice").unwrap();
    let refused = w.operator().command(id, &other).await.unwrap().unwrap();
    assert!(
        matches!(refused.applied, Applied::Refused(Refused::NotProcessed { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_step_under_way_reads_in_progress_and_an_undo_under_way_undoing() {
    let mut w = World::new();
    let id = w.submit("shown-in-flight").await.unwrap().order_id;
    let status = StatusService::new(w.store.clone());
    let owner = Owner::anonymous();
    let shown = |view: sas_engine::services::OrderView| {
        let json = serde_json::to_value(&view).unwrap();
        let steps = json["steps"].as_array().unwrap().clone();
        steps.iter().map(|s| s["status"].as_str().unwrap().to_owned()).collect::<Vec<_>>()
    };
    // Claimed: the first step's request is on its way.
    w.step(&Destination::Scheduler).await;
    let view = status.get(id, &owner).await.unwrap().unwrap();
    assert_eq!(shown(view), ["in_progress", "not_started", "not_started"]);
    // The shipment refused: the charge's undo under way, the stock's not begun.
    w.remote.script("ship", [Behaviour::Permanent("no carrier".into())]);
    for dest in ["inventory", "payment", "shipping"] {
        let agent = Destination::Agent(sas_engine::AgentName::new(dest));
        w.step(&agent).await;
        w.step(&Destination::Replies).await;
    }
    let view = status.get(id, &owner).await.unwrap().unwrap();
    assert_eq!(shown(view), ["to_undo", "undoing", "failed"]);
}

#[tokio::test]
async fn an_order_s_stored_values_are_shown_as_references_or_whole_as_asked() {
    let mut w = World::new();
    w.remote.script("charge-payment", [Behaviour::Large(20_000)]);
    let id = w.submit("shown-whole").await.unwrap().order_id;
    w.run_for(Duration::from_secs(60)).await;
    let status = StatusService::new(w.store.clone()).keeping(w.system.payloads.clone());
    let owner = Owner::anonymous();
    let charge = |v: &sas_engine::services::OrderView| {
        v.steps.iter().find(|s| s.state.name == "charge-payment").unwrap().state.output.clone()
    };
    let referred = status.get(id, &owner).await.unwrap().unwrap();
    assert!(Stored::of(&charge(&referred).unwrap()).is_some());
    let whole = status.get_with(id, &owner, Values::Whole).await.unwrap().unwrap();
    let output = charge(&whole).unwrap();
    assert_eq!(output["statement"].as_str().map(str::len), Some(20_000), "{output}");
    // Gone with the retention, a value stays its reference, saying so; nobody else sees the
    // order.
    w.system.payloads.clear();
    let gone = status.get_with(id, &owner, Values::Whole).await.unwrap().unwrap();
    let mut told = charge(&gone).unwrap();
    let why = told.as_object_mut().unwrap().remove("unreadable").unwrap();
    assert!(why.as_str().unwrap().contains("is gone"), "{why}");
    assert!(why.as_str().unwrap().contains("PayloadRetentionDays"), "{why}");
    assert_eq!(Some(told), charge(&referred));
    let stranger = Owner::iam("arn:aws:iam::123456789012:user/someone-else").unwrap();
    assert!(status.get_with(id, &stranger, Values::Whole).await.unwrap().is_none());
}
