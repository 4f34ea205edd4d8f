//! One contract per port, checked on both of its implementations: the in-memory one the engine's
//! tests and the simulation run on, and the AWS adapter (for the remote service, the simulated
//! service the local stack and the demo call over HTTP), on moto with resources from
//! `template.yaml`, behind the local stack's AWS proxy where a contract needs a failure AWS
//! produces and moto does not. What the simulation proves holds only as far as the memory ports
//! behave like the adapters; each contract below states a semantic the engine relies on, once,
//! and both implementations must keep it, in failure as in success: a record refused, an
//! event refused, a message failed alone, a delay refused.
//!
//! Where the two may differ on purpose, the contract asks only for what both promise: an
//! eventually consistent read may be stale only where a read lag is set (the memory store's
//! harsher world; moto, like the memory store without a lag, sees the latest write); a delay
//! of a fraction of a second may run to the next whole second on SQS; and SQS counts depths
//! approximately.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use sas_aws::depths::SqsDepths;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::http::HttpRemote;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::SystemClock;
use sas_aws::waits::DynamoWaits;
use sas_engine::config::EngineConfig;
use sas_engine::events::{BusEvent, STATUS_DETAIL_TYPE, StatusKind};
use sas_engine::ids::{Direction, step_key};
use sas_engine::keys::{Queued, Slots};
use sas_engine::machine::{Ctx, Decision, Input, decide};
use sas_engine::memory::{
    Behaviour, ENTRY_FAILURE, ManualClock, MemoryBus, MemoryQueues, MemoryRemote, MemoryStore,
    MemoryWaits, QueueSettings,
};
use sas_engine::message::{Message, Start};
use sas_engine::message::{StepOutcome, StepRef};
use sas_engine::order::Order;
use sas_engine::ports::{
    BulkBook, BusyKey, Clock, Counted, Created, Destination, ENTRY_TRIES, EventBus, Expected,
    ExpiryIndex, KeyIndex, ListPage, ListQuery, Listing, MAX_DELAY, OrderFinder, OrderRecord,
    Outbox, Outgoing, Page, QueueDepths, Read, RemoteCall, RemoteFault, RemoteService, Saved,
    StateStore, WaitGauge, WaitReport,
};
use sas_engine::services::search::{SearchQuery, search};
use sas_engine::state::{CommandKind, ProcessState, StateRecord, StepStatus};
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, Error, IdempotencyKey, OrderId, Owner, Timestamp};
use sas_infra::emulation::proxy::{FaultRule, Proxy, WireFault};
use sas_tests::TestStack;
use sas_tests::stack::order_json;

fn workflow() -> Workflow {
    let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
    Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap()
}

fn new_order(key: &str, config: &EngineConfig, at: Timestamp) -> (OrderRecord, StateRecord) {
    new_order_of(&workflow(), key, config, at)
}

/// A new order of `workflow`, which takes an order's input.
fn new_order_of(
    workflow: &Workflow,
    key: &str,
    config: &EngineConfig,
    at: Timestamp,
) -> (OrderRecord, StateRecord) {
    let key = IdempotencyKey::parse(key).unwrap();
    let id = OrderId::for_key(&key);
    let order = Order(serde_json::from_str(&order_json("c-1")).unwrap());
    let ctx = sas_engine::machine::Ctx { now: at, config, workflow, seed: 0 };
    let mut state = sas_engine::machine::create(id, "corr".into(), &ctx).next;
    let order = OrderRecord {
        order_id: id,
        owner: Owner::anonymous(),
        idempotency_key: key,
        order,
        created_at: at,
    };
    state.submitted = Some(sas_engine::state::Submitted {
        owner: order.owner.clone(),
        key: order.idempotency_key.clone(),
        input: order.order.clone(),
    });
    (order, state)
}

/// A key that differs between runs on the shared moto server.
fn key(name: &str) -> String {
    format!("{name}-{}", std::process::id())
}

// ---------------------------------------------------------------- state store and index

/// What an eventually consistent read of a store may miss.
enum Eventual<'a> {
    /// Nothing: it sees the latest write (moto; the memory store without a read lag).
    Latest,
    /// The writes of the last `lag` on `clock` (the memory store with a read lag).
    Lagging { lag: Duration, clock: &'a ManualClock },
}

/// A new order with its item in the orders table too, as records written before orders were
/// kept in them find theirs there: the store still reads and writes both.
async fn create<S: StateStore>(store: &S, order: &OrderRecord, state: &StateRecord) -> Created {
    let order_put = store.create_order(order).await.unwrap();
    let state_put = store.create_state(state).await.unwrap();
    assert_eq!(order_put, state_put, "the order and its record are both new, or both there");
    state_put
}

/// Creation is all or nothing; writes are conditional on the record as read; a failed condition
/// is an outcome, not an error; a record that breaks an invariant is refused before anything is
/// written; the index holds only records with a CompleteBy, per shard, earliest first, up to a
/// limit; an eventual read sees the latest write unless a lag is set, and then an older version
/// of the same order, or none, until the lag has passed.
async fn store_contract<S: StateStore + ExpiryIndex>(
    store: &S,
    t0: Timestamp,
    eventual: Eventual<'_>,
) {
    let config = EngineConfig { index_shards: 2, ..EngineConfig::default() };
    let (order, state) = new_order(&key("create"), &config, t0);
    assert_eq!(create(store, &order, &state).await, Created::Created);
    assert_eq!(store.create_order(&order).await.unwrap(), Created::AlreadyExists);
    assert_eq!(store.create_state(&state).await.unwrap(), Created::AlreadyExists);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), state);
    assert_eq!(store.load_order(order.order_id, Read::Consistent).await.unwrap().unwrap(), order);
    // A record under an id that has one is refused, whatever it holds; an order alone is
    // written alone.
    let (other_order, mut other_state) = new_order(&key("create-other"), &config, t0);
    assert_eq!(store.create_order(&other_order).await.unwrap(), Created::Created);
    assert!(store.load(other_order.order_id, Read::Consistent).await.unwrap().is_none());
    other_state.order_id = order.order_id;
    assert_eq!(store.create_state(&other_state).await.unwrap(), Created::AlreadyExists);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), state);

    // Conditional writes.
    let mut next = state.clone();
    next.revision += 1;
    next.process_state = ProcessState::Processing;
    next.locked_by = Some("scheduler/a".into());
    next.attempt = 1;
    let lease = next.steps[0].lease.as_mut().unwrap();
    (lease.attempt, lease.sent) = (1, true);
    next.steps[0].dispatched = true;
    assert_eq!(store.save(&next, Expected::of(&state)).await.unwrap(), Saved::Saved);
    let mut rival = state.clone();
    rival.revision += 1;
    rival.failure_count = 1;
    assert_eq!(store.save(&rival, Expected::of(&state)).await.unwrap(), Saved::Conflict);
    let mut later = next.clone();
    later.revision += 1;
    let wrong_attempt = Expected { attempt: 7, ..Expected::of(&next) };
    assert_eq!(store.save(&later, wrong_attempt).await.unwrap(), Saved::Conflict);
    let wrong_state = Expected { process_state: ProcessState::Pending, ..Expected::of(&next) };
    assert_eq!(store.save(&later, wrong_state).await.unwrap(), Saved::Conflict);
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), next);
    // A broken record is refused where it is made, not found on a later read: on create (a
    // Pending order holding a lock), on save (Processing without one), and a revision skipped.
    let (locked_order, mut locked) = new_order(&key("invalid"), &config, t0);
    locked.locked_by = Some("scheduler/a".into());
    let refused = store.create_state(&locked).await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    assert!(store.load(locked_order.order_id, Read::Consistent).await.unwrap().is_none());
    let mut unlocked = next.clone();
    unlocked.revision += 1;
    unlocked.locked_by = None;
    let refused = store.save(&unlocked, Expected::of(&next)).await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    let mut skipping = next.clone();
    skipping.revision += 2;
    let refused = store.save(&skipping, Expected::of(&next)).await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
    assert_eq!(store.load(order.order_id, Read::Consistent).await.unwrap().unwrap(), next);
    let (_, ghost) = new_order(&key("ghost"), &config, t0);
    let mut ghost_next = ghost.clone();
    ghost_next.revision += 1;
    assert_eq!(store.save(&ghost_next, Expected::of(&ghost)).await.unwrap(), Saved::Conflict);

    // The index: sparse, sharded, ordered, limited.
    let mut records = vec![next.clone()];
    for i in 0..5 {
        let at = t0.plus(Duration::from_secs(i));
        let (o, s) = new_order(&key(&format!("index-{i}")), &config, at);
        create(store, &o, &s).await;
        records.push(s);
    }
    let last_due = records.iter().filter_map(|r| r.complete_by).max().unwrap();
    let ours = |entries: &[sas_engine::ports::IndexEntry]| {
        entries.iter().filter(|e| records.iter().any(|r| r.order_id == e.order_id)).count()
    };
    let mut seen = 0;
    for shard in 0..2 {
        // Orders due later than asked are left out: they wait for a time.
        let early = store.due(shard, t0).await.unwrap();
        assert_eq!(ours(&early), 0, "nothing of ours is due at {t0}");
        let entries = store.due(shard, last_due).await.unwrap();
        assert!(entries.iter().all(|e| e.order_id.shard(2) == shard), "one shard per query");
        assert!(entries.windows(2).all(|w| w[0].complete_by <= w[1].complete_by), "earliest first");
        // Each entry tells since when its order is watched.
        for e in &entries {
            if let Some(r) = records.iter().find(|r| r.order_id == e.order_id) {
                assert_eq!(e.watched_since, r.watched_since(), "order {}", e.order_id);
                assert_eq!(Some(e.complete_by), r.complete_by, "order {}", e.order_id);
            }
        }
        seen += ours(&entries);
    }
    assert_eq!(seen, records.len());
    // A finished record leaves the index.
    let mut done = next.clone();
    done.revision += 1;
    done.process_state = ProcessState::Processed;
    done.locked_by = None;
    done.complete_by = None;
    done.ended_at = Some(done.updated_at);
    for s in &mut done.steps {
        s.status = StepStatus::Done;
        s.lease = None;
    }
    // It carries when it may be forgotten, which reads back as written (whole seconds).
    done.expires_at = done.expiry(Some(Duration::from_secs(24 * 3600)));
    assert!(done.expires_at.is_some());
    assert_eq!(store.save(&done, Expected::of(&next)).await.unwrap(), Saved::Saved);
    let shard = done.order_id.shard(2);
    let entries = store.due(shard, last_due).await.unwrap();
    assert!(entries.iter().all(|e| e.order_id != done.order_id), "a finished record left");
    // An eventual read may miss writes only where a lag hides them, and never shows another
    // order's record or a version newer than the latest.
    if let Eventual::Lagging { lag, clock } = eventual {
        let seen = store.load(order.order_id, Read::Eventual).await.unwrap();
        assert!(
            seen.is_none_or(|r| r.order_id == order.order_id && r.revision < done.revision),
            "an older version, or none"
        );
        clock.advance(lag);
    }
    assert_eq!(store.load(order.order_id, Read::Eventual).await.unwrap(), Some(done));
    assert_eq!(store.load_order(order.order_id, Read::Eventual).await.unwrap(), Some(order));
}

#[tokio::test]
async fn memory_store_keeps_the_store_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    store_contract(&MemoryStore::new(clock.clone()), clock.now(), Eventual::Latest).await;
}

#[test]
fn a_store_whose_condition_checks_the_revision_only_fails_the_store_contract() {
    // A thread of its own, whose panic is the expected outcome.
    let outcome = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
            let store = MemoryStore::new(clock.clone());
            store.condition_on_revision_only();
            store_contract(&store, clock.now(), Eventual::Latest).await;
        });
    })
    .join();
    assert!(outcome.is_err(), "the contract passed a store that ignores state and attempt");
}

#[tokio::test]
async fn memory_store_with_stale_reads_keeps_the_store_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    let store = MemoryStore::new(clock.clone());
    let lag = Duration::from_secs(1);
    store.set_read_lag(lag);
    store_contract(&store, clock.now(), Eventual::Lagging { lag, clock: &clock }).await;
    assert!(store.stats().stale_reads > 0, "the lag hid a write");
}

#[tokio::test]
async fn dynamodb_store_keeps_the_store_contract() {
    let t = TestStack::new("contract-store").await;
    store_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000), Eventual::Latest).await;
}

// ---------------------------------------------------------------- concurrency keys

fn queued(n: u128, since: i64) -> Queued {
    Queued {
        order_id: OrderId::for_key(&IdempotencyKey::parse(&format!("queued-{n}")).unwrap()),
        run: 0,
        since: Timestamp::from_millis(since),
        attempt: 2,
        correlation_id: format!("corr-{n}"),
        // Every other entry carries a group, so that both kinds read back as written.
        group: (n % 2 == 0).then(|| format!("tenant-{n}")),
    }
}

/// A key's places are written only on the version read, and taken from nowhere else; its line
/// reads back in the order of acceptance, whatever the order of the writes, and each key's
/// line is its own.
async fn keys_contract<S: StateStore + KeyIndex>(store: &S, prefix: &str, t0: Timestamp) {
    let key = format!("{prefix}/c-1");
    let other = format!("{prefix}/c-10");
    let empty = store.slots(&key).await.unwrap();
    assert_eq!(empty, Slots::empty(&key), "nothing written: no place taken, version 0");

    let mut first = empty.clone();
    first.version = 1;
    first.limit = 2;
    first.running.insert(queued(1, 10).place(), t0);
    assert_eq!(store.save_slots(&first).await.unwrap(), Saved::Saved);
    assert_eq!(store.save_slots(&first).await.unwrap(), Saved::Conflict, "version 1 again");
    assert_eq!(store.slots(&key).await.unwrap(), first);

    let mut second = first.clone();
    second.version = 2;
    second.running.insert(queued(2, 20).place(), t0.plus(Duration::from_secs(1)));
    let mut racing = first.clone();
    racing.version = 2;
    racing.running.insert(queued(3, 30).place(), t0);
    assert_eq!(store.save_slots(&second).await.unwrap(), Saved::Saved);
    assert_eq!(store.save_slots(&racing).await.unwrap(), Saved::Conflict, "read the same");
    assert_eq!(store.slots(&key).await.unwrap(), second);
    // Busy since its first place was taken, not since the last.
    let busy = store.busy_keys(100).await.unwrap();
    assert_eq!(busy, vec![BusyKey { key: key.clone(), since: t0 }]);
    let mut idle = second.clone();
    idle.version = 3;
    idle.running.clear();
    assert_eq!(store.save_slots(&idle).await.unwrap(), Saved::Saved);
    assert_eq!(store.slots(&key).await.unwrap(), idle);
    assert_eq!(store.busy_keys(100).await.unwrap(), vec![], "idle: listed no more");
    assert_eq!(store.slots(&other).await.unwrap(), Slots::empty(&other), "a key of its own");

    // Joined out of order, and one twice: read back oldest first, once each.
    for q in [queued(5, 300), queued(3, 100), queued(4, 200), queued(5, 300)] {
        store.join(&key, &q).await.unwrap();
    }
    store.join(&other, &queued(9, 50)).await.unwrap();
    let line = store.line(&key, 10).await.unwrap();
    assert_eq!(line, vec![queued(3, 100), queued(4, 200), queued(5, 300)]);
    assert_eq!(store.line(&key, 2).await.unwrap(), line[..2].to_vec());
    let key_ref = key.as_str();
    let ahead = |q: Queued| async move { store.ahead(key_ref, &q.position()).await.unwrap() };
    assert_eq!((ahead(queued(3, 100)).await, ahead(queued(5, 300)).await), (0, 2));
    assert_eq!(ahead(queued(6, 250)).await, 2, "a position not in line counts those before it");

    store.leave(&key, &queued(4, 200)).await.unwrap();
    store.leave(&key, &queued(4, 200)).await.unwrap();
    assert_eq!(store.line(&key, 10).await.unwrap(), vec![queued(3, 100), queued(5, 300)]);
    assert_eq!(ahead(queued(5, 300)).await, 1);
    assert_eq!(store.line(&other, 10).await.unwrap(), vec![queued(9, 50)]);

    // Pages of a pass run inline: read back in the order of their ids, one written again
    // replaced, each pass's its own; kept beside the keys, they never meet a key's line, even
    // under the same name.
    let page = |pass: &str, id: &str, outputs: &[(u32, serde_json::Value)]| Page {
        pass: pass.to_owned(),
        id: id.to_owned(),
        outputs: outputs.iter().cloned().collect(),
    };
    let pass = format!("{prefix}/order#ship-each#0");
    let later = page(&pass, &Page::id_of(12, "m-2"), &[(2, serde_json::json!({"ref": "ship-3"}))]);
    let first = page(
        &pass,
        &Page::id_of(9, "m-1"),
        &[(0, serde_json::json!({"ref": "ship-1"})), (1, serde_json::json!(null))],
    );
    store.put_page(&later).await.unwrap();
    store.put_page(&first).await.unwrap();
    store.put_page(&first).await.unwrap();
    store.put_page(&page(&key, "1", &[(0, serde_json::json!(1))])).await.unwrap();
    assert_eq!(store.pages(&pass).await.unwrap(), vec![first.clone(), later.clone()]);
    assert_eq!(store.line(&key, 10).await.unwrap(), vec![queued(3, 100), queued(5, 300)]);
    assert_eq!(ahead(queued(5, 300)).await, 1, "a page is not in a line");
    store.drop_pages(&key).await.unwrap();
    assert_eq!(store.line(&key, 10).await.unwrap(), vec![queued(3, 100), queued(5, 300)]);
    assert_eq!(store.pages(&key).await.unwrap(), vec![]);
    assert_eq!(store.pages(&pass).await.unwrap().len(), 2, "another pass's pages stay");
    store.drop_pages(&pass).await.unwrap();
    store.drop_pages(&pass).await.unwrap();
    assert_eq!(store.pages(&pass).await.unwrap(), vec![]);
}

#[tokio::test]
async fn memory_store_keeps_the_keys_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    keys_contract(&MemoryStore::new(clock.clone()), "shape", clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_keys_contract() {
    let t = TestStack::new("contract-keys").await;
    keys_contract(&t.store(), "shape", Timestamp::from_millis(1_800_000_000_000)).await;
}

// ---------------------------------------------------------------- order finder

/// Drives `record` through `inputs`, each at `at`, as the services would, writing each step.
async fn drive<S: StateStore>(
    store: &S,
    record: StateRecord,
    inputs: &[Input<'_>],
    at: Timestamp,
) -> StateRecord {
    drive_in(&workflow(), store, record, inputs, at).await
}

/// [`drive`], for an order of `workflow`.
async fn drive_in<S: StateStore>(
    workflow: &Workflow,
    store: &S,
    mut record: StateRecord,
    inputs: &[Input<'_>],
    at: Timestamp,
) -> StateRecord {
    let config = EngineConfig::default();
    for input in inputs {
        let ctx = Ctx { now: at, config: &config, workflow, seed: 0 };
        let Decision::Apply(t) = decide(&record, *input, &ctx) else {
            panic!("{input:?} did not apply")
        };
        assert_eq!(store.save(&t.next, Expected::of(&record)).await.unwrap(), Saved::Saved);
        record = t.next;
    }
    record
}

/// Orders in Error and paused are listed newest first, filtered by step and cause, a page at
/// a time; orders in flight by age; nothing else is.
async fn finder_contract<S: StateStore + OrderFinder>(store: &S, t0: Timestamp) {
    let config = EngineConfig::default();
    let at = |s: u64| t0.plus(Duration::from_secs(s));
    let mut ids = Vec::new();
    let mut records = Vec::new();
    for (n, name) in
        ["refused-pay", "refused-stock", "paused", "old", "young", "done"].iter().enumerate()
    {
        let (order, state) = new_order(&key(&format!("finder-{name}")), &config, at(n as u64));
        assert_eq!(create(store, &order, &state).await, Created::Created);
        ids.push(order.order_id);
        records.push(state);
    }
    let claim = |a| Input::Claim { attempt: a, owner: "s", message: "m-claim" };
    let reply = |a, i: usize, name: &str, d, outcome| {
        (a, StepRef { index: i, name: name.into(), direction: d, element: None }, outcome)
    };
    let done = StepOutcome::done(serde_json::json!({"ref": "r"}));
    let refused = StepOutcome::failed("refused");
    // Payment refused, inventory released: Error at t0+10, failed at charge-payment.
    let r = drive(store, records[0].clone(), &[claim(0)], at(10)).await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Do, done.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m1" }],
        at(10),
    )
    .await;
    let (a, s, o) = reply(r.attempt, 1, "charge-payment", Direction::Do, refused.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m2" }],
        at(10),
    )
    .await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Undo, done.clone());
    let r = drive(
        store,
        r,
        &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m3" }],
        at(10),
    )
    .await;
    assert_eq!(r.process_state, ProcessState::Error);
    // Stock refused: Error at t0+20.
    let r = drive(store, records[1].clone(), &[claim(0)], at(20)).await;
    let (a, s, o) = reply(r.attempt, 0, "reserve-inventory", Direction::Do, refused.clone());
    drive(store, r, &[Input::Reply { attempt: a, step: &s, outcome: &o, message: "m4" }], at(20))
        .await;
    // Paused at t0+30.
    let pause = Input::Command {
        command: CommandKind::Pause,
        id: "p",
        by: "ops",
        reason: "check",
        after: Duration::ZERO,
    };
    let paused_record = drive(store, records[2].clone(), &[pause], at(30)).await;
    // Processed.
    let mut r = drive(store, records[5].clone(), &[claim(0)], at(40)).await;
    for (i, name) in ["reserve-inventory", "charge-payment", "ship"].iter().enumerate() {
        let (a, s, o) = reply(r.attempt, i, name, Direction::Do, done.clone());
        r = drive(
            store,
            r,
            &[Input::Reply { attempt: a, step: &s, outcome: &o, message: &format!("m{}", 10 + i) }],
            at(40),
        )
        .await;
    }
    assert_eq!(r.process_state, ProcessState::Processed);

    let query = |listing| ListQuery {
        listing,
        step: None,
        cause: None,
        workflow: None,
        now: at(100),
        shards: config.index_shards,
        limit: 10,
        after: None,
    };
    let listed = |page: &ListPage| page.orders.iter().map(|l| l.order_id).collect::<Vec<_>>();
    let failed = store.find(&query(Listing::Failed)).await.unwrap();
    assert_eq!(listed(&failed), [ids[1], ids[0]], "newest failure first");
    assert_eq!(failed.next, None);
    assert_eq!(failed.orders[1].step.as_deref(), Some("charge-payment"));
    assert_eq!(failed.orders[1].cause.as_deref(), Some("step_rejected"));
    assert_eq!((failed.orders[1].since, failed.orders[1].entered), (at(10), at(10)));
    let by_step = ListQuery { step: Some("charge-payment".into()), ..query(Listing::Failed) };
    assert_eq!(listed(&store.find(&by_step).await.unwrap()), [ids[0]], "{failed:?}");
    let by_cause = ListQuery { cause: Some("step_timed_out".into()), ..query(Listing::Failed) };
    assert!(store.find(&by_cause).await.unwrap().orders.is_empty());
    // Each order names its workflow and version, and a listing can keep one workflow's.
    assert_eq!(
        (failed.orders[0].workflow.as_str(), failed.orders[0].workflow_version),
        ("order-fulfilment", 1)
    );
    let workflow =
        |name: &str, listing| ListQuery { workflow: Some(name.into()), ..query(listing) };
    let ours = store.find(&workflow("order-fulfilment", Listing::Failed)).await.unwrap();
    assert_eq!(listed(&ours), listed(&failed));
    assert!(store.find(&workflow("trip", Listing::Failed)).await.unwrap().orders.is_empty());
    let any_age = Listing::InFlight { older_than: Duration::from_secs(1) };
    assert!(store.find(&workflow("trip", any_age)).await.unwrap().orders.is_empty());
    assert_eq!(store.find(&workflow("order-fulfilment", any_age)).await.unwrap().orders.len(), 2);
    let first = store.find(&ListQuery { limit: 1, ..query(Listing::Failed) }).await.unwrap();
    assert_eq!(listed(&first), [ids[1]]);
    let second = ListQuery { limit: 1, after: first.next.clone(), ..query(Listing::Failed) };
    let second = store.find(&second).await.unwrap();
    assert_eq!((listed(&second), second.next), (vec![ids[0]], None));
    let paused = store.find(&query(Listing::Paused)).await.unwrap();
    assert_eq!(listed(&paused), [ids[2]]);
    // A processed order with nothing reported is on no operator's list.
    assert!(store.find(&query(Listing::Reported)).await.unwrap().orders.is_empty());
    assert_eq!(paused.orders[0].step.as_deref(), Some("reserve-inventory"));
    // Accepted at t0+3 and t0+4, still Pending; at t0+100, 97 s old or more is only the first.
    let old = Listing::InFlight { older_than: Duration::from_secs(97) };
    let in_flight = store.find(&query(old)).await.unwrap();
    assert_eq!(listed(&in_flight), [ids[3]]);
    assert_eq!((in_flight.orders[0].since, in_flight.orders[0].entered), (at(3), at(3)));
    let both =
        store.find(&query(Listing::InFlight { older_than: Duration::from_secs(1) })).await.unwrap();
    assert_eq!(listed(&both), [ids[4], ids[3]]);
    let bad = ListQuery { after: Some("not-a-cursor".into()), ..query(Listing::Failed) };
    assert!(store.find(&bad).await.is_err());
    // Resumed at t0+90, the paused order is watched from then, and keeps when it was accepted.
    let resume = Input::Command {
        command: CommandKind::Resume,
        id: "r",
        by: "ops",
        reason: "checked",
        after: Duration::ZERO,
    };
    let resumed = drive(store, paused_record, &[resume], at(90)).await;
    let read = store.load(ids[2], Read::Consistent).await.unwrap().unwrap();
    assert_eq!((read.created_at, read.watched_since()), (at(2), at(90)));
    assert_eq!(read, resumed);
    let recent = query(Listing::InFlight { older_than: Duration::from_secs(5) });
    let recent = store.find(&recent).await.unwrap();
    assert_eq!(listed(&recent), [ids[2], ids[4], ids[3]], "{recent:?}");
    assert_eq!((recent.orders[0].since, recent.orders[0].entered), (at(90), at(90)));
    assert_eq!(listed(&store.find(&query(old)).await.unwrap()), [ids[3]], "10 s is not 97");

    // Each listing counted by its index, exactly where the index holds the listing itself.
    let count = |q: ListQuery, cap| async move { store.count(&q, cap).await.unwrap() };
    let exact = |orders| Counted { orders, capped: false, exact: true };
    assert_eq!(count(query(Listing::Failed), 100).await, exact(2));
    assert_eq!(count(by_step.clone(), 100).await, exact(1));
    assert_eq!(count(by_cause.clone(), 100).await, exact(0));
    assert_eq!(count(workflow("trip", Listing::Failed), 100).await, exact(0));
    assert_eq!(count(query(Listing::Paused), 100).await, exact(0), "resumed");
    assert_eq!(count(query(Listing::Reported), 100).await, exact(0));
    let capped = count(query(Listing::Failed), 1).await;
    assert_eq!(capped, Counted { orders: 1, capped: true, exact: true });
    // In flight: counted by the in-flight index, exactly but for the step, which the index
    // does not know: filtered by step, the count is of every step's.
    assert_eq!(count(query(Listing::InFlight { older_than: Duration::ZERO }), 100).await, exact(3));
    assert_eq!(count(query(old), 100).await, exact(1));
    assert_eq!(
        count(workflow("trip", Listing::InFlight { older_than: Duration::ZERO }), 100).await,
        exact(0)
    );
    let at_ship = ListQuery { step: Some("ship".into()), ..query(old) };
    assert_eq!(count(at_ship, 100).await, Counted { orders: 1, capped: false, exact: false });
    let capped = count(query(Listing::InFlight { older_than: Duration::ZERO }), 2).await;
    assert_eq!(capped, Counted { orders: 2, capped: true, exact: true });
    let caused = ListQuery { cause: Some("step_rejected".into()), ..query(old) };
    assert_eq!(count(caused, 100).await, exact(0), "an order in flight has no failure cause");
}

/// Orders in flight are listed newest first, by since when they are watched then by order id,
/// page after page with nothing left out or listed twice, however many share a millisecond
/// and whichever shards they are on; a filter by step reads on until its page is full.
async fn in_flight_pages_contract<S: StateStore + OrderFinder>(store: &S, t0: Timestamp) {
    let config = EngineConfig { index_shards: 4, ..EngineConfig::default() };
    let at = |s: u64| t0.plus(Duration::from_secs(s));
    let mut expected = Vec::new();
    for n in 0..11u64 {
        // Seven accepted in the same millisecond on one shard, the others a second apart.
        let when = at(n.saturating_sub(6));
        let (order, mut state) = new_order(&key(&format!("pages-{n}")), &config, when);
        state.shard = if n < 7 { 0 } else { (n % 3 + 1) as u16 };
        assert_eq!(create(store, &order, &state).await, Created::Created);
        expected.push((when, order.order_id));
    }
    expected.sort_unstable_by(|a, b| b.cmp(a));
    let expected: Vec<OrderId> = expected.into_iter().map(|(_, id)| id).collect();
    let query = |after: Option<String>, step: Option<&str>| ListQuery {
        listing: Listing::InFlight { older_than: Duration::ZERO },
        step: step.map(str::to_owned),
        cause: None,
        workflow: None,
        now: at(100),
        shards: config.index_shards,
        limit: 2,
        after,
    };
    for step in [None, Some("reserve-inventory")] {
        let (mut seen, mut after, mut pages) = (Vec::new(), None, 0);
        loop {
            let page = store.find(&query(after, step)).await.unwrap();
            assert!(page.orders.len() <= 2, "{page:?}");
            seen.extend(page.orders.iter().map(|l| l.order_id));
            pages += 1;
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, expected, "filtered by {step:?}, in {pages} pages");
    }
    let none = store.find(&query(None, Some("ship"))).await.unwrap();
    assert_eq!((none.orders.len(), none.next), (0, None));

    // Filtered by a step none is at, among more orders than a page may pass over: a page may
    // come back short, even empty, with where to read on; the pages end, and list nothing.
    for n in 11..520u64 {
        let (order, mut state) = new_order(&key(&format!("pages-{n}")), &config, at(5));
        state.shard = (n % 4) as u16;
        assert_eq!(create(store, &order, &state).await, Created::Created);
    }
    let (mut after, mut pages) = (None, 0);
    loop {
        let page = store.find(&ListQuery { limit: 50, ..query(after, Some("ship")) }).await;
        let page = page.unwrap();
        assert!(page.orders.is_empty(), "{page:?}");
        pages += 1;
        match page.next {
            Some(next) if pages < 3 => after = Some(next),
            next => {
                assert_eq!(next, None, "past {pages} pages");
                break;
            }
        }
    }
}

/// Orders are found by their search key, ended or not, newest first (those of one millisecond
/// in any order), page after page with nothing left out or listed twice; an order with another
/// key or none is not; an order's later writes leave it found once.
async fn search_contract<S: StateStore + OrderFinder>(store: &S, t0: Timestamp) {
    let config = EngineConfig::default();
    let at = |s: u64| t0.plus(Duration::from_secs(s));
    let (value, other) = (key("customer"), key("another"));
    let mut expected = Vec::new();
    for n in 0..7u64 {
        // Four accepted in one millisecond; one with another customer, one with none.
        let when = at(n.saturating_sub(3));
        let (order, mut state) = new_order(&key(&format!("search-{n}")), &config, when);
        state.search_key = match n {
            5 => Some(other.clone()),
            6 => None,
            _ => Some(value.clone()),
        };
        assert_eq!(create(store, &order, &state).await, Created::Created);
        if n < 5 {
            expected.push(((when, order.order_id), state));
        }
    }
    expected.sort_unstable_by_key(|(entry, _)| std::cmp::Reverse(*entry));
    // The oldest is claimed and refused: it ends in Error, and is found all the same.
    let claim = Input::Claim { attempt: 0, owner: "s", message: "m-claim" };
    let oldest = expected.last().unwrap().1.clone();
    let r = drive(store, oldest, &[claim], at(10)).await;
    let step = StepRef {
        index: 0,
        name: "reserve-inventory".into(),
        direction: Direction::Do,
        element: None,
    };
    let refused = StepOutcome::failed("refused");
    let reply = Input::Reply { attempt: r.attempt, step: &step, outcome: &refused, message: "m1" };
    let r = drive(store, r, &[reply], at(10)).await;
    assert_eq!(r.process_state, ProcessState::Error);

    let entries: Vec<(Timestamp, OrderId)> = expected.iter().map(|(e, _)| *e).collect();
    let (mut seen, mut after) = (Vec::new(), None);
    loop {
        let page = store.searched(&value, after, 2).await.unwrap();
        assert!(page.len() <= 2, "{page:?}");
        seen.extend(page.iter().copied());
        if page.len() < 2 {
            break;
        }
        after = page.last().copied();
    }
    // Newest first, each once; of one millisecond, in the store's own order.
    assert!(seen.windows(2).all(|w| w[0].0 >= w[1].0), "{seen:?}");
    let mut sorted = seen.clone();
    sorted.sort_unstable_by_key(|entry| std::cmp::Reverse(*entry));
    assert_eq!(sorted, entries);
    assert_eq!(store.searched(&other, None, 10).await.unwrap().len(), 1);
    assert!(store.searched(&key("nobody"), None, 10).await.unwrap().is_empty());

    // Through the search the console and `sas find` use: what became of each, a page at a time.
    let query = |after| SearchQuery { value: value.clone(), workflow: None, limit: 3, after };
    let first = search(store, &query(None)).await.unwrap();
    let second = search(store, &query(first.next.clone())).await.unwrap();
    assert_eq!(second.next, None);
    let found: Vec<_> = first.orders.iter().chain(&second.orders).collect();
    let ids: Vec<OrderId> = found.iter().map(|f| f.order_id).collect();
    assert_eq!(ids, seen.iter().map(|(_, id)| *id).collect::<Vec<_>>());
    for f in &found {
        if f.order_id == r.order_id {
            assert_eq!((f.process_state, f.cause), (ProcessState::Error, Some("step_rejected")));
            assert_eq!(f.step.as_deref(), Some("reserve-inventory"));
        } else {
            assert_eq!((f.process_state, f.cause), (ProcessState::Pending, None), "{f:?}");
        }
    }
    let elsewhere = SearchQuery { workflow: Some("account-opening".into()), ..query(None) };
    assert!(search(store, &elsewhere).await.unwrap().orders.is_empty());
}

#[tokio::test]
async fn memory_store_keeps_the_search_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    search_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_search_contract() {
    let t = TestStack::new("contract-search").await;
    search_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

#[tokio::test]
async fn memory_store_keeps_the_in_flight_pages_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    in_flight_pages_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_in_flight_pages_contract() {
    let t = TestStack::new("contract-pages").await;
    in_flight_pages_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

#[tokio::test]
async fn memory_store_keeps_the_finder_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    finder_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_finder_contract() {
    let t = TestStack::new("contract-finder").await;
    finder_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

/// An order whose step waits for an answer from outside is listed and counted as awaiting
/// one, with that step and since when it waits, until the answer comes.
async fn awaiting_contract<S: StateStore + OrderFinder>(store: &S, t0: Timestamp) {
    let config = EngineConfig::default();
    let file = sas_workflows::file("reviewed-fulfilment").unwrap().json;
    let reviewed = Workflow::from_json(file, &Workflow::agents_in(file)).unwrap();
    let at = |s: u64| t0.plus(Duration::from_secs(s));
    let (order, state) = new_order_of(&reviewed, &key("awaiting"), &config, at(0));
    assert_eq!(create(store, &order, &state).await, Created::Created);
    let claim = Input::Claim { attempt: 0, owner: "s", message: "m-claim" };
    let mut r = drive_in(&reviewed, store, state, &[claim], at(1)).await;
    let done = StepOutcome::done(serde_json::json!({"ref": "r"}));
    for (i, name) in ["reserve-inventory", "charge-payment"].iter().enumerate() {
        let attempt = r.steps[i].lease.unwrap().attempt;
        let step =
            StepRef { index: i, name: (*name).into(), direction: Direction::Do, element: None };
        let reply =
            Input::Reply { attempt, step: &step, outcome: &done, message: &format!("m-{i}") };
        r = drive_in(&reviewed, store, r, &[reply], at(5)).await;
    }
    let query = ListQuery {
        listing: Listing::AwaitingAnswer,
        step: None,
        cause: None,
        workflow: None,
        now: at(10),
        shards: config.index_shards,
        limit: 10,
        after: None,
    };
    let page = store.find(&query).await.unwrap();
    assert_eq!(page.orders.len(), 1, "{page:?}");
    let listed = &page.orders[0];
    assert_eq!(
        (listed.order_id, listed.step.as_deref(), listed.since, listed.workflow.as_str()),
        (order.order_id, Some("fraud-review"), at(5), "reviewed-fulfilment")
    );
    assert_eq!(listed.entered, at(5), "on the list since its wait began");
    // In flight meanwhile: watched from the end of its wait, a time to come, yet on the list of
    // orders in flight since it was accepted.
    let in_flight =
        ListQuery { listing: Listing::InFlight { older_than: Duration::ZERO }, ..query.clone() };
    let page = store.find(&in_flight).await.unwrap();
    assert_eq!(page.orders.len(), 1, "{page:?}");
    assert!(page.orders[0].since > at(10), "{page:?}");
    assert_eq!(page.orders[0].entered, at(0), "{page:?}");
    let older = ListQuery {
        listing: Listing::InFlight { older_than: Duration::from_secs(5) },
        ..query.clone()
    };
    assert!(store.find(&older).await.unwrap().orders.is_empty(), "waiting, not held up");
    let exact = |orders| Counted { orders, capped: false, exact: true };
    assert_eq!(store.count(&query, 100).await.unwrap(), exact(1));
    let other_step = ListQuery { step: Some("ship".into()), ..query.clone() };
    assert_eq!(store.count(&other_step, 100).await.unwrap(), exact(0));
    // Not on the failed list meanwhile, and off this one once answered.
    let failed = ListQuery { listing: Listing::Failed, ..query.clone() };
    assert!(store.find(&failed).await.unwrap().orders.is_empty());
    let token = r.steps[2].token.clone().unwrap();
    let complete = sas_engine::machine::Answer::Complete { output: serde_json::json!({}) };
    let answer = Input::Answer {
        step: "fraud-review",
        token: Some(&token),
        answer: &complete,
        by: "reviewer",
        reason: "looks fine",
    };
    drive_in(&reviewed, store, r, &[answer], at(20)).await;
    assert!(store.find(&query).await.unwrap().orders.is_empty());
    assert_eq!(store.count(&query, 100).await.unwrap(), exact(0));
}

#[tokio::test]
async fn memory_store_keeps_the_awaiting_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    awaiting_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_awaiting_contract() {
    let t = TestStack::new("contract-awaiting").await;
    awaiting_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

/// Bulk jobs: made once per id, read back as written, saved only from the round they were
/// read at, listed newest first.
async fn bulk_book_contract<K: BulkBook>(book: &K, t0: Timestamp) {
    use sas_engine::bulk::{BulkFilter, BulkJob, BulkList, Tally};
    let job = |id: &str, at: u64| BulkJob {
        id: id.into(),
        command: CommandKind::Redrive,
        filter: BulkFilter {
            list: BulkList::Failed,
            workflow: None,
            step: Some("charge-payment".into()),
            cause: None,
            older_than_s: 0,
        },
        by: "arn:ops".into(),
        reason: "the bank is back".into(),
        expected: 3,
        as_of: t0.plus(Duration::from_secs(at)),
        created_at: t0.plus(Duration::from_secs(at)),
        updated_at: t0.plus(Duration::from_secs(at)),
        cursor: None,
        round: 0,
        tally: Tally::default(),
        refusals: Vec::new(),
        finished: false,
    };
    let first = job("bulk-a", 1);
    assert!(book.create_job(&first).await.unwrap());
    assert!(!book.create_job(&job("bulk-a", 9)).await.unwrap(), "one job per id");
    assert_eq!(book.job("bulk-a").await.unwrap(), Some(first.clone()));
    assert_eq!(book.job("bulk-none").await.unwrap(), None);
    let mut next = first.clone();
    next.round = 1;
    next.cursor = Some("cursor".into());
    next.tally.applied = 2;
    assert_eq!(book.save_job(&next, 0).await.unwrap(), Saved::Saved);
    assert_eq!(book.save_job(&first, 0).await.unwrap(), Saved::Conflict, "a stale round");
    assert_eq!(book.job("bulk-a").await.unwrap(), Some(next));
    assert!(book.create_job(&job("bulk-b", 2)).await.unwrap());
    let listed: Vec<String> = book.jobs(10).await.unwrap().into_iter().map(|j| j.id).collect();
    assert_eq!(listed, ["bulk-b", "bulk-a"], "newest first");
    assert_eq!(book.jobs(1).await.unwrap().len(), 1);
}

#[tokio::test]
async fn memory_store_keeps_the_bulk_book_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    bulk_book_contract(&MemoryStore::new(clock.clone()), clock.now()).await;
}

#[tokio::test]
async fn dynamodb_store_keeps_the_bulk_book_contract() {
    let t = TestStack::new("contract-bulk").await;
    bulk_book_contract(&t.store(), Timestamp::from_millis(1_800_000_000_000)).await;
}

// ---------------------------------------------------------------- queues

/// The consumer side of a queue, as an event source mapping uses it, and the one fault of the
/// sending side that needs a hand from outside.
trait Consumer {
    /// Up to ten visible messages: (message id, receipt, body, receive count).
    async fn receive(&self) -> Vec<(String, String, String, u32)>;
    async fn delete(&self, receipt: &str);
    /// Makes a received message visible again after `after`.
    async fn hide_for(&self, receipt: &str, after: Duration);
    /// Lets `d` pass.
    async fn pass(&self, d: Duration);
    /// Bodies moved to the dead-letter queue.
    async fn dead_letters(&self) -> Vec<String>;
    /// Makes the next send fail its message at `index` alone, on its first `tries` tries, as
    /// SQS fails one entry of a batch on its side.
    fn fail_entry(&self, index: usize, tries: u32);
}

fn start(n: u64, at: Timestamp) -> Message {
    let id = OrderId::for_key(&IdempotencyKey::parse(&format!("q{n}")).unwrap());
    Message::Start(Start {
        order_id: id,
        attempt: n,
        correlation_id: "c".into(),
        due_at: Some(at),
        group: None,
    })
}

fn attempts(got: &[(String, String, String, u32)]) -> Vec<u64> {
    let mut out: Vec<u64> = got
        .iter()
        .map(|(_, _, body, _)| match Message::decode(body).unwrap() {
            Message::Start(s) => s.attempt,
            other => panic!("{other:?}"),
        })
        .collect();
    out.sort_unstable();
    out
}

/// Sent messages are delivered whole; a delayed one never before its delay, and by the next
/// whole second after it; a delay SQS does not take fails the whole send. A message the queue
/// fails alone is sent again alone, and if it keeps failing the send fails, retryably, with
/// every other message delivered once. A message not deleted comes back, with the same id and
/// a higher receive count; a receipt of an earlier receive still deletes it; after too many
/// receives it goes to the dead-letter queue. The depths count what waits, what is in flight
/// and what is delayed. Groups are delivered fairly.
async fn queue_contract<Q: Outbox + QueueDepths, C: Consumer>(
    outbox: &Q,
    consumer: &C,
    now: Timestamp,
    max_receive_count: u32,
) {
    let dest = Destination::Scheduler;
    let delayed = |n, delay| Outgoing::later(dest.clone(), start(n, now), delay);
    let depth = async || {
        let depths = outbox.depths().await.unwrap();
        depths.iter().find(|(q, _)| *q == dest).map(|(_, depth)| *depth).unwrap_or_default()
    };
    let too_long = delayed(21, MAX_DELAY + Duration::from_secs(1));
    let refused = outbox.send(&[delayed(20, Duration::ZERO), too_long]).await.unwrap_err();
    assert!(matches!(refused, Error::Rejected { .. }), "{refused}");

    let mut batch: Vec<Outgoing> = (1..=3).map(|n| delayed(n, Duration::ZERO)).collect();
    batch.push(delayed(8, Duration::from_millis(1500)));
    batch.push(delayed(9, Duration::from_secs(2)));
    outbox.send(&batch).await.unwrap();
    let before = depth().await;
    assert_eq!((before.waiting, before.delayed), (3, 2), "{before:?}");

    let got = consumer.receive().await;
    assert_eq!(attempts(&got), [1, 2, 3], "nothing of the refused send, nothing delayed yet");
    assert!(got.iter().all(|(_, _, _, count)| *count == 1));
    assert_eq!(depth().await.in_flight, 3);
    // Two handled, one failed: it comes back after its visibility timeout, same id.
    consumer.delete(&got[0].1).await;
    consumer.delete(&got[1].1).await;
    consumer.hide_for(&got[2].1, Duration::from_secs(2)).await;
    assert!(consumer.receive().await.is_empty(), "hidden while its timeout runs");
    consumer.pass(Duration::from_millis(1100)).await;
    assert!(consumer.receive().await.is_empty(), "1.5 s is not cut to 1 s");
    consumer.pass(Duration::from_millis(1000)).await;
    let again = consumer.receive().await;
    assert_eq!(attempts(&again), [attempts(&got[2..])[0], 8, 9]);
    let back = again.iter().find(|(id, ..)| *id == got[2].0).expect("the same message id");
    assert_eq!(back.3, 2, "received twice");
    // SQS answers a delete with a receipt of an earlier receive with success, and may or may
    // not delete the message: moto does, and so does the memory queue, the answer under which
    // the consumer holding the message can lose it.
    let message = |n: u64| again.iter().find(|m| attempts(std::slice::from_ref(m)) == [n]);
    let nine = message(9).unwrap();
    consumer.hide_for(&nine.1, Duration::ZERO).await;
    assert_eq!(attempts(&consumer.receive().await), [9]);
    let held = depth().await.in_flight;
    consumer.delete(&nine.1).await;
    assert_eq!(depth().await.in_flight, held - 1, "deleted by its earlier receipt");
    consumer.delete(&message(8).unwrap().1).await;
    // Received too many times: dead-lettered, never delivered again.
    let mut receipt = back.1.clone();
    for _ in back.3..max_receive_count {
        consumer.hide_for(&receipt, Duration::ZERO).await;
        receipt = consumer.receive().await.into_iter().find(|(id, ..)| *id == got[2].0).unwrap().1;
    }
    consumer.hide_for(&receipt, Duration::ZERO).await;
    let after = consumer.receive().await;
    assert!(after.iter().all(|(id, ..)| *id != got[2].0), "redriven, not delivered");
    assert_eq!(consumer.dead_letters().await.len(), 1);

    // One message failed once: sent again alone, so every message arrives once.
    let three = |from| (from..from + 3).map(|n| delayed(n, Duration::ZERO)).collect::<Vec<_>>();
    consumer.fail_entry(1, 1);
    outbox.send(&three(30)).await.unwrap();
    let got = consumer.receive().await;
    assert_eq!(attempts(&got), [30, 31, 32], "the others were not sent again");
    for (_, receipt, ..) in &got {
        consumer.delete(receipt).await;
    }
    // Failed on every try: the send fails, worth retrying, and the others arrived once.
    consumer.fail_entry(1, ENTRY_TRIES);
    let failed = outbox.send(&three(40)).await.unwrap_err();
    assert!(failed.is_retryable(), "{failed}");
    let got = consumer.receive().await;
    assert_eq!(attempts(&got), [40, 42]);
    for (_, receipt, ..) in &got {
        consumer.delete(receipt).await;
    }

    // A fair queue: while one group holds the consumers, the others' messages come first, a
    // priority group and a message without a group among them.
    let of = |group: Option<&str>, n: u64| {
        let Message::Start(mut start) = start(n, now) else { unreachable!() };
        start.group = group.map(str::to_owned);
        Outgoing::now(dest.clone(), Message::Start(start))
    };
    let bulk: Vec<Outgoing> = (100..200).map(|n| of(Some("bulk"), n)).collect();
    outbox.send(&bulk).await.unwrap();
    for _ in 0..4 {
        assert_eq!(consumer.receive().await.len(), 10, "the consumers hold 40 of the bulk");
    }
    outbox.send(&[of(Some("quiet"), 1), of(Some("bulk#priority"), 2)]).await.unwrap();
    outbox.send(&[of(None, 3)]).await.unwrap();
    let got = consumer.receive().await;
    let in_order: Vec<u64> = got.iter().flat_map(|m| attempts(std::slice::from_ref(m))).collect();
    assert_eq!(in_order[..3], [1, 2, 3], "{in_order:?}");
    assert!(in_order[3..].iter().all(|n| *n >= 100), "then the bulk: {in_order:?}");
}

struct MemoryConsumer {
    queues: Arc<MemoryQueues<ManualClock>>,
    clock: ManualClock,
}

impl Consumer for MemoryConsumer {
    async fn receive(&self) -> Vec<(String, String, String, u32)> {
        self.queues
            .receive(&Destination::Scheduler, 10)
            .into_iter()
            .map(|d| (d.message_id, d.receipt, d.body, d.receive_count))
            .collect()
    }
    async fn delete(&self, receipt: &str) {
        self.queues.delete(&Destination::Scheduler, receipt).unwrap();
    }
    async fn hide_for(&self, receipt: &str, after: Duration) {
        self.queues.change_visibility(&Destination::Scheduler, receipt, after).unwrap();
    }
    async fn pass(&self, d: Duration) {
        self.clock.advance(d);
    }
    async fn dead_letters(&self) -> Vec<String> {
        self.queues.dead_letters(&Destination::Scheduler)
    }
    fn fail_entry(&self, index: usize, tries: u32) {
        self.queues.fail_entry(index, tries);
    }
}

/// The test stack's queues, through the proxy that fails their entries.
struct SqsConsumer<'a>(&'a TestStack, &'a Proxy);

impl Consumer for SqsConsumer<'_> {
    async fn receive(&self) -> Vec<(String, String, String, u32)> {
        self.0
            .receive("SchedulerQueue", 0)
            .await
            .into_iter()
            .map(|m| {
                let count = m
                    .attributes()
                    .and_then(|a| {
                        a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount)
                    })
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let text = |s: Option<&str>| s.unwrap_or_default().to_owned();
                (text(m.message_id()), text(m.receipt_handle()), text(m.body()), count)
            })
            .collect()
    }
    async fn delete(&self, receipt: &str) {
        self.0.delete("SchedulerQueue", receipt).await;
    }
    async fn hide_for(&self, receipt: &str, after: Duration) {
        self.0
            .sqs
            .change_message_visibility()
            .queue_url(self.0.name("SchedulerQueue"))
            .receipt_handle(receipt)
            .visibility_timeout(after.as_secs() as i32)
            .send()
            .await
            .unwrap();
    }
    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
    async fn dead_letters(&self) -> Vec<String> {
        self.0.drain_raw("SchedulerDeadLetterQueue").await
    }
    fn fail_entry(&self, index: usize, tries: u32) {
        // The first try carries the whole batch; each later one only the failed message.
        let rule = |index, times| FaultRule {
            times: Some(times),
            ..FaultRule::new("sqs", Some("SendMessageBatch"), WireFault::FailEntry { index })
        };
        let mut rules = vec![rule(index, 1)];
        if tries > 1 {
            rules.push(rule(0, tries - 1));
        }
        self.1.faults.set(rules);
    }
}

#[tokio::test]
async fn memory_queues_keep_the_queue_contract() {
    let clock = ManualClock::at(Timestamp::from_millis(1_800_000_000_000));
    let queues = Arc::new(MemoryQueues::new(clock.clone()));
    // As the template configures the scheduler's queue.
    let settings =
        QueueSettings { visibility_timeout: Duration::from_secs(61), max_receive_count: Some(5) };
    queues.configure(&Destination::Scheduler, settings);
    let consumer = MemoryConsumer { queues: queues.clone(), clock: clock.clone() };
    queue_contract(&queues, &consumer, clock.now(), 5).await;
}

/// The outbox and the depths of the real queues, as one port pair.
struct SqsQueues(SqsOutbox, SqsDepths);

impl Outbox for SqsQueues {
    async fn send(&self, messages: &[Outgoing]) -> sas_engine::Result<()> {
        self.0.send(messages).await
    }
}

impl QueueDepths for SqsQueues {
    async fn depths(&self) -> sas_engine::Result<Vec<(Destination, sas_engine::ports::Depth)>> {
        self.1.depths().await
    }
}

#[tokio::test]
async fn sqs_queues_keep_the_queue_contract() {
    let (t, proxy) = TestStack::behind_proxy("contract-queues").await;
    let outbox = SqsOutbox::new(
        t.sqs.clone(),
        QueueUrls::default().with(Destination::Scheduler, t.name("SchedulerQueue")),
    );
    let now = sas_aws::system::SystemClock.now();
    queue_contract(&SqsQueues(outbox, t.depths()), &SqsConsumer(&t, &proxy), now, 5).await;
    assert!(proxy.faults.rules().iter().all(|r| r.times == Some(0)), "every fault was used");
}

// ---------------------------------------------------------------- event bus

/// The bus side the contract cannot reach through the port.
trait Subscriber {
    /// Makes the next publish fail its entry at `index`, as EventBridge fails one on its side.
    fn refuse_entry(&self, index: usize);
    /// The statuses of the status events delivered since the last call, sorted.
    async fn delivered(&self) -> Vec<String>;
}

/// A batch of events is accepted whole, or the answer lists by position the entries refused,
/// and every other entry is delivered once.
async fn bus_contract<B: EventBus, S: Subscriber>(bus: &B, subscriber: &S, at: Timestamp) {
    let (_, state) = new_order(&key("bus"), &EngineConfig::default(), at);
    let events = |kinds: &[StatusKind]| -> Vec<BusEvent> {
        kinds.iter().map(|k| BusEvent::status(&state, *k, None, at)).collect()
    };
    use StatusKind::{Compensating, Failed, Processed, Processing};
    let report = bus.publish(&events(&[Processing, Processed])).await.unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(bus.publish(&[]).await.unwrap().failed.is_empty(), "nothing to publish is fine");
    assert_eq!(subscriber.delivered().await, ["processed", "processing"]);

    subscriber.refuse_entry(1);
    let report = bus.publish(&events(&[Processing, Compensating, Failed])).await.unwrap();
    let failed: Vec<usize> = report.failed.iter().map(|(i, _)| *i).collect();
    assert_eq!(failed, [1], "{report:?}");
    assert!(report.failed[0].1.contains(ENTRY_FAILURE), "the service's code: {report:?}");
    assert_eq!(subscriber.delivered().await, ["failed", "processing"], "the others went");
    // The refusal was of one entry of one call, not of the event.
    assert!(bus.publish(&events(&[Compensating])).await.unwrap().failed.is_empty());
    assert_eq!(subscriber.delivered().await, ["compensating"]);
}

/// The statuses of status events, sorted.
fn statuses<'a>(details: impl Iterator<Item = &'a serde_json::Value>) -> Vec<String> {
    let mut out: Vec<String> =
        details.map(|d| d["status"].as_str().unwrap_or_default().to_owned()).collect();
    out.sort();
    out
}

/// The memory bus, and how many of its events were already seen.
struct MemorySubscriber<'a>(&'a MemoryBus, std::sync::Mutex<usize>);

impl Subscriber for MemorySubscriber<'_> {
    fn refuse_entry(&self, index: usize) {
        self.0.reject_entry_at(index);
    }
    async fn delivered(&self) -> Vec<String> {
        let all = self.0.of_type(STATUS_DETAIL_TYPE);
        let mut seen = self.1.lock().unwrap();
        let new = statuses(all[*seen..].iter());
        *seen = all.len();
        new
    }
}

/// The queue the template subscribes to status events, and the proxy in front of EventBridge.
struct QueueSubscriber<'a>(&'a TestStack, &'a Proxy);

impl Subscriber for QueueSubscriber<'_> {
    fn refuse_entry(&self, index: usize) {
        let fault = WireFault::FailEntry { index };
        let rule = FaultRule::new("eventbridge", Some("PutEvents"), fault);
        self.1.faults.set(vec![FaultRule { times: Some(1), ..rule }]);
    }
    async fn delivered(&self) -> Vec<String> {
        let events = self.0.drain("OrderEventsQueue").await;
        statuses(events.iter().map(|e| &e["detail"]))
    }
}

#[tokio::test]
async fn memory_bus_keeps_the_bus_contract() {
    let bus = MemoryBus::new();
    let subscriber = MemorySubscriber(&bus, Default::default());
    bus_contract(&bus, &subscriber, Timestamp::from_millis(1_800_000_000_000)).await;
}

#[tokio::test]
async fn eventbridge_keeps_the_bus_contract() {
    let (t, proxy) = TestStack::behind_proxy("contract-bus").await;
    let bus = EventBridgeBus::new(t.events.clone(), t.name("EventBus"));
    let subscriber = QueueSubscriber(&t, &proxy);
    bus_contract(&bus, &subscriber, Timestamp::from_millis(1_800_000_000_000)).await;
    assert!(proxy.faults.rules().iter().all(|r| r.times == Some(0)), "the fault was used");
}

// ---------------------------------------------------------------- wait gauge

/// A reporter's report replaces its previous one for the same queue; reports of other
/// reporters and queues stand beside it; an expired report is gone.
async fn gauge_contract<G: WaitGauge>(gauge: &G, now: Timestamp) {
    let report = |reporter: &str, queue: Destination, wait: u64, expires_in: u64| WaitReport {
        queue,
        reporter: reporter.to_owned(),
        wait: Duration::from_secs(wait),
        rate: 2.5,
        at: now,
        until: now.plus(Duration::from_secs(expires_in)),
        expires: now.plus(Duration::from_secs(expires_in)),
    };
    let payment = Destination::Agent(AgentName::new("payment"));
    gauge.report(&report("a", Destination::Scheduler, 10, 60)).await.unwrap();
    gauge.report(&report("a", Destination::Scheduler, 20, 60)).await.unwrap();
    gauge.report(&report("b", Destination::Scheduler, 5, 60)).await.unwrap();
    gauge.report(&report("a", payment.clone(), 7, 30)).await.unwrap();
    let mut got = gauge.reports(now).await.unwrap();
    got.sort_by(|x, y| (&x.queue, &x.reporter).cmp(&(&y.queue, &y.reporter)));
    let summary: Vec<(String, String, u64)> =
        got.iter().map(|r| (r.queue.name(), r.reporter.clone(), r.wait.as_secs())).collect();
    assert_eq!(
        summary,
        [
            ("scheduler".into(), "a".into(), 20),
            ("scheduler".into(), "b".into(), 5),
            ("agent:payment".into(), "a".into(), 7),
        ]
    );
    assert_eq!(got[0], report("a", Destination::Scheduler, 20, 60), "read back whole");
    let later = gauge.reports(now.plus(Duration::from_secs(45))).await.unwrap();
    assert_eq!(later.len(), 2, "the payment report expired");
}

#[tokio::test]
async fn memory_waits_keep_the_gauge_contract() {
    gauge_contract(&MemoryWaits::default(), Timestamp::from_millis(1_800_000_000_000)).await;
}

#[tokio::test]
async fn dynamodb_waits_keep_the_gauge_contract() {
    let t = TestStack::new("contract-waits").await;
    let gauge = DynamoWaits::new(t.dynamodb.clone(), t.name("QueueWaitsTable"));
    gauge_contract(&gauge, Timestamp::from_millis(1_800_000_000_000)).await;
}

// ---------------------------------------------------------------- remote service

/// The action every implementation refuses for good, as its fault setting says.
const REFUSED: &str = "decline-card";

/// A call of `step` of order `order`, with the step's key of the first run.
fn remote_call(order: &str, step: &str, direction: Direction, now: Timestamp) -> RemoteCall {
    let order_id = OrderId::for_key(&IdempotencyKey::parse(order).unwrap());
    let action = match direction {
        Direction::Do => step.to_owned(),
        Direction::Undo => format!("undo-{step}"),
    };
    RemoteCall {
        order_id,
        action,
        direction,
        idempotency_key: step_key(order_id, step, direction, 0),
        order: Order(serde_json::from_str(&order_json(order)).unwrap()),
        input: None,
        outputs: Default::default(),
        deadline: now.plus(Duration::from_secs(60)),
    }
}

/// What the engine relies on from a remote service, and the simulation from its double: one
/// effect per key, an undo that tells whether it undid anything, a refusal that stays one,
/// and a step undone that cannot be done again under the same key.
async fn remote_contract<R: RemoteService>(remote: &R, now: Timestamp) {
    let call = |order: &str, step: &str, d| remote_call(order, step, d, now);
    // The same key answers the same, however often it is sent.
    let first = remote.call(&call("o-1", "charge", Direction::Do)).await.unwrap();
    assert!(first.get("noop").is_none(), "{first}");
    assert_eq!(remote.call(&call("o-1", "charge", Direction::Do)).await.unwrap(), first);
    // Undone after it was done: an undo that undid something; the step cannot be done again.
    let undone = remote.call(&call("o-1", "charge", Direction::Undo)).await.unwrap();
    assert!(undone.get("noop").is_none(), "{undone}");
    let again = remote.call(&call("o-1", "charge", Direction::Do)).await;
    assert!(matches!(again, Err(RemoteFault::Permanent(_))), "{again:?}");
    // Undone before it was ever done (its answer lost, say): an undo of nothing, and the late
    // do is refused rather than taking effect behind the undo.
    let nothing = remote.call(&call("o-2", "charge", Direction::Undo)).await.unwrap();
    assert_eq!(nothing.get("noop"), Some(&serde_json::json!(true)), "{nothing}");
    let late = remote.call(&call("o-2", "charge", Direction::Do)).await;
    assert!(matches!(late, Err(RemoteFault::Permanent(_))), "{late:?}");
    // Other orders' steps are their own.
    let other = remote.call(&call("o-3", "charge", Direction::Do)).await.unwrap();
    assert!(other.get("noop").is_none(), "{other}");
    // A refusal for good is one: the same key is refused again, and nothing took effect.
    let refused = remote.call(&call("o-4", REFUSED, Direction::Do)).await;
    assert!(matches!(refused, Err(RemoteFault::Permanent(_))), "{refused:?}");
    let again = remote.call(&call("o-4", REFUSED, Direction::Do)).await;
    assert_eq!(again, refused, "a refusal answers the same");
    let undo = remote.call(&call("o-4", REFUSED, Direction::Undo)).await.unwrap();
    assert_eq!(undo.get("noop"), Some(&serde_json::json!(true)), "{undo}");
}

#[tokio::test]
async fn memory_remote_keeps_the_remote_contract() {
    let clock = ManualClock::default();
    let remote = MemoryRemote::new(clock.clone());
    remote.script(REFUSED, [Behaviour::Permanent("declined".into())]);
    remote_contract(&remote, clock.now()).await;
}

#[tokio::test]
async fn the_simulated_service_keeps_the_remote_contract() {
    let faults = format!(r#"{{"actions":{{"{REFUSED}":{{"permanent_rate":1.0}}}}}}"#);
    let service = sas_tests::stack::RemoteService::start(&faults).await;
    let remote = HttpRemote::new(&service.url, Duration::from_secs(5)).unwrap();
    remote_contract(&remote, SystemClock.now()).await;
}
