//! What only the AWS adapters have to get right, against a real emulator (moto), on tables,
//! queues, a bus and a bucket created from `template.yaml`: splitting sends into batches,
//! routing events through the rules, mapping a missing resource to the right error, and
//! keeping large values as objects that read back whole. The semantics the
//! adapters share with the in-memory ports are in `contract.rs`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use aws_sdk_sqs::types::MessageSystemAttributeName;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::sqs::{AGAIN_OF_ATTRIBUTE, QueueUrls, SqsOutbox};
use sas_engine::config::EngineConfig;
use sas_engine::events::{BusEvent, StatusKind};
use sas_engine::message::{Message, Start};
use sas_engine::order::Order;
use sas_engine::payload::{self, Kept, Stored};
use sas_engine::ports::{
    Destination, EventBus, OrderRecord, Outbox, Outgoing, Payloads, Read, StateStore,
};
use sas_engine::state::StateRecord;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, IdempotencyKey, OrderId, Owner, Timestamp};
use sas_tests::TestStack;
use sas_tests::stack::order_json;

const T0: Timestamp = Timestamp::from_millis(1_800_000_000_000);

fn workflow() -> Workflow {
    let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
    Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap()
}

fn new_order(key: &str, config: &EngineConfig) -> (OrderRecord, StateRecord) {
    let key = IdempotencyKey::parse(key).unwrap();
    let id = OrderId::for_key(&key);
    let order = Order(serde_json::from_str(&order_json("c-1")).unwrap());
    let workflow = workflow();
    let ctx = sas_engine::machine::Ctx { now: T0, config, workflow: &workflow, seed: 0 };
    let state = sas_engine::machine::create(id, "corr".into(), &ctx).next;
    (
        OrderRecord {
            order_id: id,
            owner: Owner::anonymous(),
            idempotency_key: key,
            order,
            created_at: T0,
        },
        state,
    )
}

#[tokio::test]
async fn a_large_value_is_kept_as_one_object_and_reads_back_whole() {
    let t = TestStack::new("payloads").await;
    let store = t.payloads();
    let id = OrderId::for_key(&IdempotencyKey::parse("large-1").unwrap());
    let value = serde_json::json!({ "document": "é".repeat(60_000) });
    let Kept::Stored(reference) = payload::keep_output(&store, id, value.clone()).await.unwrap()
    else {
        panic!("a 120 kB output is stored")
    };
    // Kept again (a retried call), it is the same object.
    assert_eq!(
        payload::keep_output(&store, id, value.clone()).await.unwrap(),
        Kept::Stored(reference.clone())
    );
    assert_eq!(payload::resolve(&store, id, &reference).await.unwrap(), value);
    let key = Stored::of(&reference).unwrap().key;
    let listed = t.s3.list_objects_v2().bucket(t.name("PayloadBucket")).send().await.unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, [key.as_str()]);
    // A key with nothing under it is no object, not an error.
    assert_eq!(store.get(&format!("{}missing", payload::prefix(id))).await.unwrap(), None);
    // Without a bucket, nothing is stored.
    let none = sas_aws::payloads::S3Payloads::new(t.s3.clone(), None);
    assert!(matches!(payload::keep_output(&none, id, value).await.unwrap(), Kept::TooLarge { .. }));

    // The bucket is created as the template declares it: encrypted, closed to the public,
    // its objects the bucket owner's, and expired PayloadRetentionDays (90) after they were
    // written, which the provisioning reports the emulator does not do.
    let bucket = t.name("PayloadBucket");
    let encryption = t.s3.get_bucket_encryption().bucket(&bucket).send().await.unwrap();
    let rule = &encryption.server_side_encryption_configuration().unwrap().rules()[0];
    let algorithm = rule.apply_server_side_encryption_by_default().unwrap().sse_algorithm();
    assert_eq!(algorithm.as_str(), "AES256");
    let blocked = t.s3.get_public_access_block().bucket(&bucket).send().await.unwrap();
    let blocked = blocked.public_access_block_configuration().unwrap();
    assert_eq!(blocked.block_public_acls(), Some(true));
    assert_eq!(blocked.restrict_public_buckets(), Some(true));
    let lifecycle = t.s3.get_bucket_lifecycle_configuration().bucket(&bucket).send().await.unwrap();
    let expiry = &lifecycle.rules()[0];
    assert_eq!(expiry.id(), Some("expire-order-values"));
    assert_eq!(expiry.expiration().and_then(|e| e.days()), Some(90));
    let told: Vec<&str> = t.stack.skipped.iter().map(|(id, ..)| id.as_str()).collect();
    assert!(told.contains(&"PayloadBucket.LifecycleConfiguration"), "{told:?}");
}

#[tokio::test]
async fn records_are_read_a_hundred_at_a_time_in_the_order_asked_with_none_for_a_missing_one() {
    let t = TestStack::new("load-many").await;
    let store = t.store();
    let config = EngineConfig::default();
    let mut ids = Vec::new();
    for k in 0..150 {
        let (order, state) = new_order(&format!("many-{k}"), &config);
        store.create_order(&order).await.unwrap();
        store.create_state(&state).await.unwrap();
        ids.push(state.order_id);
    }
    // Asked for in another order than written, past one call's hundred, with a missing id.
    ids.reverse();
    let missing = OrderId::for_key(&IdempotencyKey::parse("never-written").unwrap());
    ids.insert(70, missing);
    let read = store.load_many(&ids, Read::Consistent).await.unwrap();
    assert_eq!(read.len(), ids.len());
    for (id, record) in ids.iter().zip(&read) {
        match record {
            Some(r) => assert_eq!(r.order_id, *id),
            None => assert_eq!(*id, missing),
        }
    }
    assert_eq!(read.iter().filter(|r| r.is_none()).count(), 1);
}

#[tokio::test]
async fn the_outbox_batches_by_queue_and_honours_delays() {
    let t = TestStack::new("outbox").await;
    let urls = QueueUrls::default()
        .with(Destination::Scheduler, t.name("SchedulerQueue"))
        .with(Destination::Replies, t.name("ReplyQueue"));
    let outbox = SqsOutbox::new(t.sqs.clone(), urls);
    let start = |n: u64| {
        let id = OrderId::for_key(&IdempotencyKey::parse(&format!("k{n}")).unwrap());
        // Every other message is of a tenant: the others are each their own to a fair queue.
        let group = (n % 2 == 0).then(|| format!("tenant-{}", n % 3));
        Message::Start(Start {
            order_id: id,
            attempt: n,
            correlation_id: "c".into(),
            due_at: None,
            group,
        })
    };
    let mut messages: Vec<Outgoing> =
        (0..23).map(|n| Outgoing::now(Destination::Scheduler, start(n))).collect();
    messages.push(Outgoing::later(Destination::Scheduler, start(99), Duration::from_secs(30)));
    outbox.send(&messages).await.unwrap();
    let mut received = Vec::new();
    loop {
        let batch = t.receive("SchedulerQueue", 0).await;
        if batch.is_empty() {
            break;
        }
        for m in batch {
            let message = Message::decode(m.body().unwrap()).unwrap();
            let group =
                m.attributes().and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId));
            assert_eq!(group.map(String::as_str), message.group(), "sent as its MessageGroupId");
            received.push(message);
            t.delete("SchedulerQueue", m.receipt_handle().unwrap()).await;
        }
    }
    assert_eq!(received.len(), 23, "the delayed message is not visible yet");
    assert!(received.iter().filter(|m| m.group().is_some()).count() >= 11);
    // A message sent again carries the id its consumer knows it by.
    outbox
        .send(&[Outgoing::again(Destination::Replies, start(7), Duration::ZERO, "m-7")])
        .await
        .unwrap();
    let again = t.receive("ReplyQueue", 0).await;
    let carried = again[0].message_attributes().and_then(|a| a.get(AGAIN_OF_ATTRIBUTE));
    assert_eq!(carried.and_then(|a| a.string_value()), Some("m-7"), "{again:?}");
    // A destination the function was not configured for is a configuration error.
    let err = outbox
        .send(&[Outgoing::now(Destination::Agent(AgentName::new("fax")), start(1))])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fax"), "{err}");
    // A queue that does not exist (yet: a stack update may be creating it) is a passing cause.
    let missing = SqsOutbox::new(
        t.sqs.clone(),
        QueueUrls::default()
            .with(Destination::Replies, format!("{}-missing", t.name("ReplyQueue"))),
    );
    let err = missing.send(&[Outgoing::now(Destination::Replies, start(1))]).await.unwrap_err();
    assert!(err.is_retryable() && err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test]
async fn published_events_reach_the_queues_subscribed_by_rules() {
    let t = TestStack::new("bus").await;
    let bus = EventBridgeBus::new(t.events.clone(), t.name("EventBus"));
    let (_, state) = new_order("k-bus", &EngineConfig::default());
    let status = BusEvent::status(&state, StatusKind::Processed, None, T0);
    let report = bus.publish(&[status]).await.unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    let events = t.drain("OrderEventsQueue").await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["detail-type"], "OrderStatusChanged");
    assert_eq!(events[0]["source"], "sas.orders");
    assert_eq!(events[0]["detail"]["order_id"], state.order_id.to_string());
    assert!(t.drain("AlertsQueue").await.is_empty(), "status events are not alerts");

    // Publishing to a bus that does not exist is never a silent success.
    let missing = EventBridgeBus::new(t.events.clone(), format!("{}-missing", t.name("EventBus")));
    let status = BusEvent::status(&state, StatusKind::Processed, None, T0);
    match missing.publish(&[status]).await {
        Ok(report) => panic!("publishing to a missing bus succeeded: {report:?}"),
        // A deployment mistake, which retrying cannot mend.
        Err(e) => assert!(!e.is_retryable(), "{e}"),
    }
}

/// What a service behind an agent received: method, path, headers and body of each call.
type Received =
    std::sync::Arc<std::sync::Mutex<Vec<(String, String, Vec<(String, String)>, Vec<u8>)>>>;

/// A service that answers every action with `{"ok": true}` and keeps what it received.
async fn recording_service() -> (String, Received) {
    let received: Received = Received::default();
    let keep = received.clone();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let keep = keep.clone();
        async move {
            let (parts, body) = request.into_parts();
            let body = axum::body::to_bytes(body, 1 << 20).await.unwrap().to_vec();
            let headers = parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str().to_owned(), v.to_str().unwrap().to_owned()))
                .collect();
            keep.lock().unwrap().push((
                parts.method.to_string(),
                parts.uri.path().to_owned(),
                headers,
                body,
            ));
            axum::Json(serde_json::json!({"ok": true}))
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn remote_call() -> sas_engine::ports::RemoteCall {
    let config = EngineConfig::default();
    let (record, _) = new_order("auth-1", &config);
    sas_engine::ports::RemoteCall {
        order_id: record.order_id,
        action: "charge-payment".into(),
        direction: sas_engine::Direction::Do,
        idempotency_key: "key-1".into(),
        order: record.order,
        input: None,
        outputs: [("reserve-inventory".to_owned(), serde_json::json!({"ref": "r-1"}))].into(),
        deadline: Timestamp::from_millis(i64::MAX / 2),
    }
}

#[tokio::test]
async fn an_agent_calls_its_service_with_a_token_from_secrets_manager_or_signed() {
    use sas_aws::http::{HttpRemote, ServiceAuth};
    use sas_engine::ports::RemoteService;

    let (url, received) = recording_service().await;
    // The token, stored as a deployer would store it, read as the agent does at cold start.
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(&sas_infra::emulation::emulator::Moto::shared().endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_credential_types::Credentials::new(
            "local", "local", None, None, "test",
        ))
        .load()
        .await;
    let created = aws_sdk_secretsmanager::Client::new(&sdk)
        .create_secret()
        .name(format!("inventory-token-{}", std::process::id()))
        .secret_string("s3cr3t-token\n")
        .send()
        .await
        .unwrap();
    let token = sas_aws::clients::secret_text(&sdk, created.arn().unwrap()).await.unwrap();
    let missing = sas_aws::clients::secret_text(&sdk, "no-such-secret").await.unwrap_err();
    assert!(missing.contains("no-such-secret"), "{missing}");

    let bearer = ServiceAuth::bearer(&token).unwrap();
    assert!(!format!("{bearer:?}").contains("s3cr3t"), "the token is never printed");
    let remote = HttpRemote::new(&url, Duration::from_secs(5)).unwrap().with_auth(bearer);
    assert_eq!(remote.call(&remote_call()).await.unwrap(), serde_json::json!({"ok": true}));
    let api_key = ServiceAuth::header("x-api-key", &token).unwrap();
    let remote = HttpRemote::new(&url, Duration::from_secs(5)).unwrap().with_auth(api_key);
    remote.call(&remote_call()).await.unwrap();
    let signer =
        sas_infra::access::sigv4::local_signer("inventoryAgentFunction", "us-east-1", "lambda");
    let remote = HttpRemote::new(&url, Duration::from_secs(5))
        .unwrap()
        .with_auth(ServiceAuth::SigV4(signer));
    remote.call(&remote_call()).await.unwrap();

    let calls = received.lock().unwrap().clone();
    let header =
        |n: usize, name: &str| calls[n].2.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(header(0, "authorization").as_deref(), Some("Bearer s3cr3t-token"));
    assert_eq!(header(1, "x-api-key").as_deref(), Some("s3cr3t-token"));
    assert_eq!(header(1, "authorization"), None);
    // The signed call is one a function URL with AWS_IAM auth takes, from this caller.
    let (method, path, headers, body) = &calls[2];
    let signed =
        sas_infra::access::sigv4::Signed { method, raw_path: path, raw_query: "", headers, body };
    let caller =
        sas_infra::access::sigv4::verify(&signed, "us-east-1", "lambda", chrono::Utc::now());
    assert_eq!(caller.as_deref(), Ok("inventoryAgentFunction"));
    // The body: what the service needs of the order and of the steps before.
    let (_, path, _, body) = &calls[0];
    assert_eq!(path, "/actions/charge-payment");
    let body: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(body["direction"], "do");
    assert_eq!(body["outputs"], serde_json::json!({"reserve-inventory": {"ref": "r-1"}}));
    assert_eq!(body["input"], serde_json::Value::Null);
    assert_eq!(body["order"]["currency"], "EUR");
}

#[tokio::test]
async fn executions_sharing_a_services_table_never_take_the_same_turn_or_more_than_its_places() {
    use sas_engine::health::ServiceRecord;
    use sas_engine::pace::Booked;
    use sas_engine::ports::{Pace, ServiceBook};

    let t = TestStack::new("pace").await;
    // Three executions, each with its own memory of what it read.
    let books = [t.book(), t.book(), t.book()];
    let spacing = Duration::from_millis(250);
    let latest = T0.plus(Duration::from_millis(4_900));
    // All at once: most takes first fail their condition, and go on from what stands in the
    // way, as each book's memory of the last turn goes stale.
    let takes = books.iter().cycle().take(24).map(|b| b.take_turn("payment", spacing, T0, latest));
    let booked = futures_util::future::join_all(takes).await;
    let mut starts: Vec<i64> = booked
        .iter()
        .filter_map(|b| match b.as_ref().unwrap() {
            Booked::Start(start) => Some(start.as_millis()),
            Booked::TooLate { .. } => None,
        })
        .collect();
    starts.sort_unstable();
    // 24 asked for the turns of 4.9 s at one every 250 ms: 20 were given one, each its own,
    // and the other 4 were told the next free turn is too late for them.
    let expected: Vec<i64> = (0..20).map(|k| T0.as_millis() + 250 * k).collect();
    assert_eq!(starts, expected, "{booked:?}");

    // Places: 2 of them; a third caller waits, and a place past its call is free again.
    let now = T0;
    let until = now.plus(Duration::from_secs(30));
    let a = books[0].enter("payment", 2, now, until).await.unwrap().unwrap();
    let b = books[1].enter("payment", 2, now, until).await.unwrap().unwrap();
    assert_ne!(a.slot, b.slot);
    assert_eq!(books[2].enter("payment", 2, now, until).await.unwrap(), None);
    let usage = books[2].usage("payment", now).await.unwrap();
    assert_eq!(usage.in_flight, 2);
    books[0].leave("payment", a).await.unwrap();
    let c = books[2].enter("payment", 2, now, until).await.unwrap().unwrap();
    assert_eq!(c.slot, a.slot);
    let later = until.plus(Duration::from_secs(1));
    let d = books[0].enter("payment", 2, later, later.plus(Duration::from_secs(30))).await;
    assert!(d.unwrap().is_some(), "places past their calls are free again");
    // Giving back a place someone took again after it ran out leaves theirs alone.
    books[1].leave("payment", b).await.unwrap();
    assert_eq!(books[1].usage("payment", later).await.unwrap().in_flight, 1);

    // The tallies and places are not services' records.
    books[0]
        .save(&ServiceRecord { version: 1, ..ServiceRecord::open("payment", now) })
        .await
        .unwrap();
    let all = books[0].all().await.unwrap();
    assert_eq!(all.iter().map(|r| r.service.as_str()).collect::<Vec<_>>(), ["payment"]);
}
