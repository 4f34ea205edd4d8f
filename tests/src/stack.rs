//! A stack provisioned from `template.yaml` on the shared moto server, and the whole system
//! wired on it with the real adapters and the real function handlers. The event sources are
//! played by the test: it receives from the queues and hands batches to the handlers as the
//! SQS event source mapping would, deleting what the handler did not report as failed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_http::http::{HeaderValue, Method, Request};
use lambda_http::{Body, RequestExt, Response};
use sas_admin::Admin;
use sas_aws::batch::Coalescing;
use sas_aws::dead_letters::{DeadLetterQueue, DeadLetters};
use sas_aws::depths::SqsDepths;
use sas_aws::dynamo::DynamoStore;
use sas_aws::eventbridge::EventBridgeBus;
use sas_aws::health::DynamoServiceBook;
use sas_aws::http::HttpRemote;
use sas_aws::payloads::S3Payloads;
use sas_aws::settings::Tables;
use sas_aws::sqs::{QueueUrls, SqsOutbox};
use sas_aws::system::UuidIds;
use sas_aws::waits::DynamoWaits;
use sas_engine::catalogue::Catalogue;
use sas_engine::config::EngineConfig;
use sas_engine::events::StatusKinds;
use sas_engine::load::{Gauges, Unmetered};
use sas_engine::memory::{ManualClock, SplitMix};
use sas_engine::ports::{Destination, Read};
use sas_engine::retry::WaitPolicy;
use sas_engine::services::{
    Agent, Assembly, Keyring, Scheduler, ServiceDesk, Starter, StatusService, Submission,
    Supervisor, SweepReport,
};
use sas_engine::state::StateRecord;
use sas_engine::workflow::Workflow;
use sas_engine::{AgentName, OrderId, Timestamp};
use sas_infra::emulation::aws::{Clients, Endpoints};
use sas_infra::emulation::provision::{Options, Stack, provision};
use sas_infra::emulation::proxy::{Proxy, Upstreams};
use sas_infra::emulation::template::Template;
use serde_json::Value;

use crate::moto::{Moto, workspace_root};

/// The scheduler's two queues, by logical id, and how operators name them.
const SCHEDULER_QUEUES: [(&str, &str); 2] =
    [("SchedulerQueue", "scheduler"), ("ReplyQueue", "replies")];

static STACKS: AtomicU32 = AtomicU32::new(0);

/// Resources of one test, provisioned from the template.
#[derive(Debug)]
pub struct TestStack {
    pub stack: Stack,
    pub template: Template,
    pub dynamodb: aws_sdk_dynamodb::Client,
    pub sqs: aws_sdk_sqs::Client,
    pub events: aws_sdk_eventbridge::Client,
    pub s3: aws_sdk_s3::Client,
}

impl TestStack {
    /// Provisions `template.yaml` under a fresh stack name.
    pub async fn new(name: &str) -> TestStack {
        TestStack::with_attributes(name, HashMap::new()).await
    }

    /// Provisions with attributes provided from outside (e.g. the remote service's URL).
    pub async fn with_attributes(
        name: &str,
        attributes: HashMap<(String, String), Value>,
    ) -> TestStack {
        TestStack::on(&Moto::shared().endpoint, name, attributes).await
    }

    /// Provisions on `endpoint` (the shared moto server, or a proxy in front of it).
    pub async fn on(
        endpoint: &str,
        name: &str,
        attributes: HashMap<(String, String), Value>,
    ) -> TestStack {
        let clients = Clients::new(&Endpoints::single(endpoint), "us-east-1").await;
        let template = Template::load(&workspace_root().join("template.yaml")).unwrap();
        let n = STACKS.fetch_add(1, Ordering::Relaxed);
        let options = Options {
            stack_name: format!("{name}-{}-{n}", std::process::id()),
            region: "us-east-1".into(),
            // The tests read the status events from the sample subscriber's queue.
            parameters: HashMap::from([("CreateOrderEventsQueue".into(), "true".into())]),
            attributes,
        };
        let stack = provision(&template, &clients, &options).await.unwrap();
        let Clients { dynamodb, sqs, events, s3, .. } = clients;
        TestStack { dynamodb, sqs, events, s3, stack, template }
    }

    /// Provisions with every call going through the local stack's proxy, whose fault rules the
    /// test sets.
    pub async fn behind_proxy(name: &str) -> (TestStack, Proxy) {
        let (proxy, endpoint) = proxy_to_moto().await;
        (TestStack::on(&endpoint, name, HashMap::new()).await, proxy)
    }

    pub fn name(&self, logical_id: &str) -> String {
        self.stack.reference(logical_id).unwrap_or_else(|| panic!("{logical_id} not provisioned"))
    }

    /// Large inputs and outputs, in the stack's payload bucket.
    pub fn payloads(&self) -> S3Payloads {
        S3Payloads::new(self.s3.clone(), Some(self.name("PayloadBucket")))
    }

    pub fn store(&self) -> DynamoStore {
        let tables = Tables {
            state: self.name("StateTable"),
            orders: self.name("OrdersTable"),
            keys: self.name("KeysTable"),
        };
        DynamoStore::new(self.dynamodb.clone(), &tables)
    }

    /// The services' health table.
    pub fn book(&self) -> DynamoServiceBook {
        DynamoServiceBook::new(self.dynamodb.clone(), self.name("ServicesTable"))
    }

    /// The template's agents, each with the logical id of the queue its function reads: every
    /// function with an `AGENT_NAME`, and its SQS event source.
    pub fn agent_queues(&self) -> Vec<(AgentName, String)> {
        let mut out = Vec::new();
        for (id, function) in self.template.of_kind("AWS::Serverless::Function") {
            let p = &function.properties;
            let Some(agent) = p["Environment"]["Variables"]["AGENT_NAME"].as_str() else {
                continue;
            };
            let events = p["Events"].as_object().into_iter().flat_map(|e| e.values());
            let queue = events
                .filter(|e| e["Type"] == "SQS")
                .find_map(|e| e["Properties"]["Queue"]["Fn::GetAtt"][0].as_str())
                .unwrap_or_else(|| panic!("{id} reads no queue"));
            out.push((AgentName::new(agent), queue.to_owned()));
        }
        out
    }

    /// Every work queue by logical id: the scheduler's two, then each agent's.
    pub fn work_queues(&self) -> Vec<(Destination, String)> {
        let scheduler = [Destination::Scheduler, Destination::Replies]
            .into_iter()
            .zip(SCHEDULER_QUEUES.map(|(queue, _)| queue.to_owned()));
        let agents = self.agent_queues().into_iter().map(|(a, q)| (Destination::Agent(a), q));
        scheduler.chain(agents).collect()
    }

    /// The dead-letter queue of a work queue (by logical id), from its redrive policy.
    fn dead_letter_queue_of(&self, queue: &str) -> String {
        let resource = self.template.resource(queue).unwrap_or_else(|| panic!("no {queue}"));
        let target = &resource.properties["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0];
        target.as_str().unwrap_or_else(|| panic!("{queue} has no dead-letter queue")).to_owned()
    }

    /// The depths of every queue of the system.
    pub fn depths(&self) -> SqsDepths {
        let queues = self.work_queues().into_iter().map(|(d, q)| (d, self.name(&q))).collect();
        SqsDepths::new(self.sqs.clone(), queues)
    }

    /// Number of items in a table (a scan: tests only).
    pub async fn count(&self, table_logical_id: &str) -> i32 {
        self.dynamodb.scan().table_name(self.name(table_logical_id)).send().await.unwrap().count()
    }

    /// Receives up to ten visible messages from a queue, without deleting them.
    pub async fn receive(
        &self,
        queue_logical_id: &str,
        wait_seconds: i32,
    ) -> Vec<aws_sdk_sqs::types::Message> {
        self.sqs
            .receive_message()
            .queue_url(self.name(queue_logical_id))
            .max_number_of_messages(10)
            .wait_time_seconds(wait_seconds)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::All)
            .message_attribute_names("All")
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default()
    }

    pub async fn delete(&self, queue_logical_id: &str, receipt: &str) {
        self.sqs
            .delete_message()
            .queue_url(self.name(queue_logical_id))
            .receipt_handle(receipt)
            .send()
            .await
            .unwrap();
    }

    /// Makes a received message visible again at once, as its visibility timeout running out
    /// would (the template's timeouts are a minute or more; tests do not wait that long).
    pub async fn release(&self, queue_logical_id: &str, receipt: &str) {
        self.sqs
            .change_message_visibility()
            .queue_url(self.name(queue_logical_id))
            .receipt_handle(receipt)
            .visibility_timeout(0)
            .send()
            .await
            .unwrap();
    }

    /// Drains a queue that only receives (alerts, order events) and returns the JSON bodies.
    pub async fn drain(&self, queue_logical_id: &str) -> Vec<Value> {
        self.drain_raw(queue_logical_id)
            .await
            .iter()
            .map(|b| serde_json::from_str(b).unwrap())
            .collect()
    }

    /// Drains a queue and returns the bodies as they are.
    pub async fn drain_raw(&self, queue_logical_id: &str) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let batch = self.receive(queue_logical_id, 0).await;
            if batch.is_empty() {
                return out;
            }
            for m in batch {
                out.push(m.body().unwrap_or_default().to_owned());
                self.delete(queue_logical_id, m.receipt_handle().unwrap_or_default()).await;
            }
        }
    }

    pub async fn send_raw(&self, queue_logical_id: &str, body: &str) {
        self.sqs
            .send_message()
            .queue_url(self.name(queue_logical_id))
            .message_body(body)
            .send()
            .await
            .unwrap();
    }
}

/// The local stack's AWS proxy in front of the shared moto server, served in-process on a free
/// loopback port, and its endpoint.
pub async fn proxy_to_moto() -> (Proxy, String) {
    let proxy = Proxy::new(Upstreams::single(&Moto::shared().endpoint));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(proxy.clone().serve(listener));
    (proxy, endpoint)
}

/// The simulated remote service, served in-process on a free loopback port.
#[derive(Debug)]
pub struct RemoteService {
    pub url: String,
    http: reqwest::Client,
}

impl RemoteService {
    pub async fn start(faults: &str) -> RemoteService {
        let config = sas_remote_sim::FaultConfig::from_json(faults).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let app = sas_remote_sim::router(sas_remote_sim::App::new(config));
        tokio::spawn(async move { axum::serve(listener, app).await });
        RemoteService { url, http: reqwest::Client::new() }
    }

    pub async fn ledger(&self) -> Value {
        self.http.get(format!("{}/ledger", self.url)).send().await.unwrap().json().await.unwrap()
    }

    pub async fn stats(&self) -> Value {
        self.http.get(format!("{}/stats", self.url)).send().await.unwrap().json().await.unwrap()
    }

    /// Replaces the service's fault configuration (a service recovering, or breaking).
    pub async fn set_faults(&self, faults: &str) {
        let response = self
            .http
            .put(format!("{}/faults", self.url))
            .header("content-type", "application/json")
            .body(faults.to_owned())
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.text().await.unwrap());
    }
}

type Store = DynamoStore;
type Outbox = SqsOutbox;
type Bus = EventBridgeBus;
type Load = Gauges<DynamoWaits, SqsDepths>;
type TestAgent = Agent<
    HttpRemote<ManualClock>,
    Coalescing<Outbox>,
    ManualClock,
    SplitMix,
    DynamoWaits,
    DynamoServiceBook,
    S3Payloads,
>;

/// The functions' default linger for batched sends.
const LINGER: Duration = Duration::from_millis(sas_aws::settings::DEFAULT_SEND_LINGER_MS);

/// The whole system on one stack: every handler with real adapters, a manual clock, and the
/// simulated remote service.
pub struct System {
    pub t: TestStack,
    pub clock: ManualClock,
    pub config: Arc<EngineConfig>,
    pub remote: RemoteService,
    submission: Submission<Store, Outbox, Bus, ManualClock, UuidIds, Load, S3Payloads>,
    status: StatusService<Store>,
    scheduler: Scheduler<Store, Coalescing<Outbox>, Bus, ManualClock, DynamoWaits, S3Payloads>,
    /// The scheduler's starter, of orders the bus's events start.
    starter: Starter<Store, Coalescing<Outbox>, Bus, ManualClock, UuidIds, Unmetered, S3Payloads>,
    /// The supervisor's starter, of orders the schedules start.
    scheduled: Starter<Store, Outbox, Bus, ManualClock, UuidIds, Unmetered, S3Payloads>,
    /// Each agent with the logical id of its queue.
    agents: Vec<(String, TestAgent)>,
    supervisor: Supervisor<Store, Store, Outbox, Bus, ManualClock, Load, S3Payloads>,
    /// Each service's health, as the agents and the supervisor keep it.
    pub book: DynamoServiceBook,
    admin: Admin<Store, Outbox, Bus, ManualClock, DynamoServiceBook, S3Payloads>,
    /// Whether a failed message comes back at once, as if its visibility timeout had passed.
    pub fast_redelivery: std::sync::atomic::AtomicBool,
    /// The proxy between the system and moto, when started with [`System::behind_proxy`].
    pub proxy: Option<Proxy>,
}

impl std::fmt::Debug for System {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("System").field("stack", &self.t.stack.created).finish_non_exhaustive()
    }
}

/// Configuration for tests: short waits, because the supervisor's kick is a real SQS delay.
pub fn test_config() -> EngineConfig {
    EngineConfig {
        wait: WaitPolicy { base: Duration::from_secs(1), max: Duration::from_secs(2) },
        status_events: StatusKinds::all(),
        ..EngineConfig::default()
    }
}

impl System {
    pub async fn start(name: &str, faults: &str) -> System {
        System::with_config(name, faults, test_config()).await
    }

    pub async fn with_config(name: &str, faults: &str, config: EngineConfig) -> System {
        System::on(&Moto::shared().endpoint, name, faults, config).await
    }

    /// The system with every AWS call going through the local stack's proxy, whose fault
    /// rules the test sets (`system.proxy`).
    pub async fn behind_proxy(name: &str, faults: &str) -> System {
        let (proxy, url) = proxy_to_moto().await;
        let mut system = System::on(&url, name, faults, test_config()).await;
        system.proxy = Some(proxy);
        system
    }

    async fn on(endpoint: &str, name: &str, faults: &str, config: EngineConfig) -> System {
        let remote = RemoteService::start(faults).await;
        let attributes = HashMap::from([(
            ("RemoteSimFunctionUrl".into(), "FunctionUrl".into()),
            Value::String(remote.url.clone()),
        )]);
        let t = TestStack::on(endpoint, name, attributes).await;
        let clock = ManualClock::at(sas_engine::ports::Clock::now(&sas_aws::system::SystemClock));
        let config = Arc::new(config);
        let agent_queues = t.agent_queues();
        let agent_names: Vec<AgentName> = agent_queues.iter().map(|(a, _)| a.clone()).collect();
        let workflow =
            Workflow::from_json(sas_workflows::order_fulfilment(), &agent_names).unwrap();
        let workflow = Arc::new(Catalogue::single(workflow));
        let actions = workflow.actions();
        // The scheduler's outbox, as its settings make it: the agents' queues and its own two.
        let mut agent_urls = QueueUrls::default()
            .with(Destination::Scheduler, t.name("SchedulerQueue"))
            .with(Destination::Replies, t.name("ReplyQueue"));
        for (agent, queue) in &agent_queues {
            agent_urls = agent_urls.with(Destination::Agent(agent.clone()), t.name(queue));
        }
        let to_scheduler =
            QueueUrls::default().with(Destination::Scheduler, t.name("SchedulerQueue"));
        let to_replies = QueueUrls::default().with(Destination::Replies, t.name("ReplyQueue"));
        let waits = DynamoWaits::new(t.dynamodb.clone(), t.name("QueueWaitsTable"));
        let system = Assembly {
            store: t.store(),
            bus: EventBridgeBus::new(t.events.clone(), t.name("EventBus")),
            clock: clock.clone(),
            config: config.clone(),
            catalogue: workflow,
            waits: waits.clone(),
            load: Gauges { waits, depths: t.depths() },
            payloads: t.payloads(),
        };
        let to_scheduler_outbox = || SqsOutbox::new(t.sqs.clone(), to_scheduler.clone());
        let submission = system.submission(to_scheduler_outbox(), UuidIds);
        let scheduler_outbox = Coalescing::new(SqsOutbox::new(t.sqs.clone(), agent_urls), LINGER);
        let starter = system.starter(scheduler_outbox.clone(), UuidIds);
        let scheduler = system.scheduler(scheduler_outbox, "scheduler/test");
        let agents =
            agent_queues
                .iter()
                .map(|(agent, queue)| {
                    let remote =
                        HttpRemote::with_clock(&remote.url, Duration::from_secs(5), clock.clone())
                            .unwrap();
                    let own = Destination::Agent(agent.clone());
                    let urls = to_replies.clone().with(own, t.name(queue));
                    let outbox = Coalescing::new(SqsOutbox::new(t.sqs.clone(), urls), LINGER);
                    let reporter = format!("agent-{agent}/test");
                    let a = system
                        .agent(agent, remote, outbox, SplitMix::seeded(3), reporter)
                        .guarded(t.book(), agent.as_str(), config.hold);
                    (queue.clone(), a)
                })
                .collect();
        let supervisor = system.supervisor(to_scheduler_outbox());
        let scheduled = system.starter(to_scheduler_outbox(), UuidIds);
        // Named as operators name them: the scheduler's two queues, then each agent's.
        let names = SCHEDULER_QUEUES
            .map(|(_, name)| name.to_owned())
            .into_iter()
            .chain(agent_names.iter().map(|a| a.as_str().to_owned()));
        let dead_letter_queues: Vec<DeadLetterQueue> = t
            .work_queues()
            .into_iter()
            .zip(names)
            .map(|((_, queue), name)| DeadLetterQueue {
                name,
                url: t.name(&t.dead_letter_queue_of(&queue)),
                source_url: t.name(&queue),
            })
            .collect();
        let admin = Admin {
            status: StatusService::new(t.store()).keeping(t.payloads()),
            operator: system.operator(to_scheduler_outbox()),
            finder: t.store(),
            clock: clock.clone(),
            desk: ServiceDesk {
                book: t.book(),
                index: t.store(),
                clock: clock.clone(),
                agents: agent_names.clone(),
                limits: Default::default(),
                actions,
            },
            keyring: Keyring::new(t.store()),
            shards: config.index_shards,
            dead_letters: DeadLetters::new(t.sqs.clone(), dead_letter_queues),
            catalogue: system.catalogue.clone(),
            console: None,
        };
        let status = StatusService::new(t.store());
        let book = t.book();
        System {
            t,
            clock,
            config,
            remote,
            submission,
            status,
            scheduler,
            starter,
            scheduled,
            agents,
            supervisor,
            book,
            admin,
            fast_redelivery: Default::default(),
            proxy: None,
        }
    }

    /// `POST /orders` through the submission handler.
    pub async fn post(&self, key: Option<&str>, content_type: &str, body: &str) -> (u16, Value) {
        self.post_bytes(key.map(str::as_bytes), Some(content_type), body.as_bytes().to_vec()).await
    }

    /// `POST /orders` with any key header bytes, any content type or none, and any body.
    pub async fn post_bytes(
        &self,
        key: Option<&[u8]>,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        decode(self.post_response(key, content_type, body).await)
    }

    /// `POST /orders`, answered as the handler built it, headers included.
    pub async fn post_response(
        &self,
        key: Option<&[u8]>,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Response<Body> {
        let mut request = Request::builder().method(Method::POST).uri("/orders");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        if let Some(key) = key {
            request = request.header("idempotency-key", HeaderValue::from_bytes(key).unwrap());
        }
        let body = match String::from_utf8(body) {
            Ok(text) => Body::Text(text),
            Err(e) => Body::Binary(e.into_bytes()),
        };
        sas_submission::handle(&self.submission, request.body(body).unwrap()).await
    }

    /// `GET /orders/{id}` through the status handler.
    pub async fn get(&self, id: &str) -> (u16, Value) {
        let request = Request::builder()
            .method(Method::GET)
            .uri(format!("/orders/{id}"))
            .body(Body::Empty)
            .unwrap()
            .with_path_parameters(HashMap::from([("id".to_owned(), id.to_owned())]));
        decode(sas_status::handle(&self.status, request).await)
    }

    /// A request to the admin API (`path` with its query string), as API Gateway hands it to
    /// the admin function: `caller` is the IAM principal its authorizer found, if any.
    pub async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        caller: Option<&str>,
    ) -> (u16, Value) {
        let (raw_path, query) = path.split_once('?').unwrap_or((path, ""));
        let parameters: HashMap<&str, &str> =
            query.split('&').filter_map(|kv| kv.split_once('=')).collect();
        let mut event = serde_json::json!({
            "version": "2.0",
            "routeKey": format!("{method} {raw_path}"),
            "rawPath": raw_path,
            "rawQueryString": query,
            "headers": {"content-type": "application/json", "host": "admin.test"},
            "requestContext": {
                "accountId": "123456789012", "apiId": "test", "domainName": "admin.test",
                "http": {"method": method, "path": raw_path, "protocol": "HTTP/1.1",
                         "sourceIp": "127.0.0.1", "userAgent": "test"},
                "requestId": "r", "routeKey": format!("{method} {raw_path}"), "stage": "$default",
                "time": "22/Nov/2026:00:00:00 +0000", "timeEpoch": 0
            },
            "isBase64Encoded": false,
        });
        if !query.is_empty() {
            event["queryStringParameters"] = serde_json::json!(parameters);
        }
        if let Some(body) = body {
            event["body"] = Value::String(body.to_string());
        }
        if let Some(caller) = caller {
            event["requestContext"]["authorizer"] = serde_json::json!({"iam": {"userArn": caller}});
        }
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        // On the heap, as a batch's handler: the tests' threads have small stacks.
        decode(Box::pin(sas_admin::handle(&self.admin, request)).await)
    }

    /// One round of the event sources: every queue's visible messages, in batches, to their
    /// handler. Returns how many messages were delivered.
    pub async fn pump(&self) -> usize {
        let mut delivered = 0;
        for (_, queue) in self.t.work_queues() {
            delivered += self.pump_queue(&queue).await;
        }
        delivered
    }

    /// Delivers one batch of `queue` (by logical id) to the function that consumes it.
    pub async fn pump_queue(&self, queue: &str) -> usize {
        self.deliver(queue, |event| self.handle_batch(queue, event)).await
    }

    /// Hands `event` to the handler of the function that consumes `queue` (by logical id).
    pub async fn handle_batch(&self, queue: &str, event: SqsEvent) -> SqsBatchResponse {
        // On the heap: a batch's handler is a large future, and the tests' threads have small
        // stacks.
        match self.agents.iter().find(|(q, _)| q == queue) {
            Some((_, agent)) => Box::pin(sas_agent_kit::handle(agent, event)).await,
            None => Box::pin(sas_scheduler::handle(&self.scheduler, &self.starter, event)).await,
        }
    }

    /// Receives a batch from `queue`, hands it to `handler`, deletes what did not fail and
    /// leaves the failures in flight (their visibility timeout decides when they return).
    pub async fn deliver<F, Fut>(&self, queue: &str, handler: F) -> usize
    where
        F: Fn(SqsEvent) -> Fut,
        Fut: std::future::Future<Output = SqsBatchResponse>,
    {
        let batch = self.t.receive(queue, 0).await;
        if batch.is_empty() {
            return 0;
        }
        let mut event = SqsEvent::default();
        for m in &batch {
            let mut record = SqsMessage::default();
            record.message_id = m.message_id().map(str::to_owned);
            record.receipt_handle = m.receipt_handle().map(str::to_owned);
            record.body = m.body().map(str::to_owned);
            // As Lambda hands them over: the receive count, and the message attributes.
            for (name, value) in m.attributes().into_iter().flatten() {
                record.attributes.insert(name.as_str().to_owned(), value.clone());
            }
            for (name, value) in m.message_attributes().into_iter().flatten() {
                let mut attribute = aws_lambda_events::event::sqs::SqsMessageAttribute::default();
                attribute.string_value = value.string_value().map(str::to_owned);
                attribute.data_type = Some(value.data_type().to_owned());
                record.message_attributes.insert(name.clone(), attribute);
            }
            event.records.push(record);
        }
        let response = handler(event).await;
        let failed: Vec<&str> =
            response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        for m in &batch {
            let receipt = m.receipt_handle().unwrap_or_default();
            if !failed.contains(&m.message_id().unwrap_or_default()) {
                self.t.delete(queue, receipt).await;
            } else if self.fast_redelivery.load(Ordering::Relaxed) {
                self.t.release(queue, receipt).await;
            }
        }
        batch.len()
    }

    /// Pumps until a round delivers nothing.
    pub async fn settle(&self) {
        for _ in 0..200 {
            if self.pump().await == 0 {
                return;
            }
        }
        panic!("the system did not settle");
    }

    pub async fn sweep(&self) -> SweepReport {
        let look_back = sas_engine::starts::MIN_LOOK_BACK;
        Box::pin(sas_supervisor::handle(&self.supervisor, &self.book, &self.scheduled, look_back))
            .await
            .unwrap()
    }

    /// The supervisor's slice of the bulk commands not finished, as one sweep drives them.
    pub async fn drive_bulk(&self) -> Vec<sas_engine::bulk::BulkJob> {
        self.supervisor.drive_bulk(&self.t.store()).await.unwrap()
    }

    pub async fn state(&self, id: OrderId) -> StateRecord {
        use sas_engine::ports::StateStore;
        self.t.store().load(id, Read::Consistent).await.unwrap().unwrap()
    }

    /// Moves the manual clock past every deadline the record has, and past the time its
    /// messages could still be on their way while the queues are quick.
    pub async fn expire(&self, id: OrderId) {
        // The index may hold the order ahead of its leases: the later of the two is the one
        // past which everything is due.
        let r = self.state(id).await;
        let due = r.earliest_lease().into_iter().chain(r.complete_by).max().unwrap();
        self.clock.set(due.plus(sas_engine::load::SLACK).plus(Duration::from_millis(1)));
    }

    pub fn now(&self) -> Timestamp {
        use sas_engine::ports::Clock;
        self.clock.now()
    }
}

fn decode(response: Response<Body>) -> (u16, Value) {
    let status = response.status().as_u16();
    let body = match response.body() {
        Body::Text(t) => serde_json::from_str(t).unwrap_or(Value::String(t.clone())),
        Body::Binary(b) => serde_json::from_slice(b).unwrap_or(Value::Null),
        _ => Value::Null,
    };
    (status, body)
}

/// A valid order body.
pub fn order_json(customer: &str) -> String {
    serde_json::json!({
        "customer_id": customer,
        "currency": "EUR",
        "items": [{"sku": "BOOK-1", "quantity": 2, "unit_price": 1250}],
        "ship_to": {"name": "Ada Lovelace", "line1": "12 St James's Square", "city": "London",
                    "postal_code": "SW1Y 4JH", "country": "GB"}
    })
    .to_string()
}

/// The order id of a submission's answer.
pub fn order_id(body: &Value) -> OrderId {
    body["order_id"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .unwrap_or_else(|_| panic!("no order id in {body}"))
}

/// The statuses of one order's status events, in the order they were read.
pub fn statuses(events: &[Value], id: OrderId) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["detail"]["order_id"] == id.to_string())
        .map(|e| e["detail"]["status"].as_str().unwrap_or_default().to_owned())
        .collect()
}
