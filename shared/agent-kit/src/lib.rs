//! An agent, whatever service it calls. A team implements [`RemoteService`] for its service
//! (the call names the action, carries the order, the outputs of the steps before, the
//! idempotency key and the deadline; the answer is done with an output, refused with a
//! reason, or a passing fault to try again) and writes a `main.rs` that calls [`run`]:
//!
//! ```no_run
//! use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService, run};
//! use serde_json::{Value, json};
//!
//! struct Greeter;
//!
//! impl RemoteService for Greeter {
//!     async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
//!         Ok(json!({ "greeted": call.order_id.to_string() }))
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     run(async |_wiring, _settings| Ok(Greeter)).await
//! }
//! ```
//!
//! An agent that calls an AWS service builds its client once, in [`run`]'s builder, from the
//! function's SDK configuration ([`Wiring::sdk`]): its region, its role's credentials and, on
//! the local stack, the endpoint whose proxy checks every call against the role's grants in
//! the template. S3 on an endpoint of one's own is addressed by path. A failed call is reported
//! as [`sdk_fault`] classifies it: a timeout, throttling or a 5xx passes (tried again within the
//! step's budget, and in a row they hold the action), while an access denied, a validation
//! error or any other refusal fails the step at once with its cause and holds nothing:
//!
//! ```no_run
//! use aws_sdk_s3::primitives::ByteStream;
//! use sas_agent_kit::{RemoteCall, RemoteFault, RemoteService, run, sdk_fault};
//! use serde_json::{Value, json};
//!
//! struct Archive {
//!     s3: aws_sdk_s3::Client,
//!     bucket: String,
//! }
//!
//! impl RemoteService for Archive {
//!     async fn call(&self, call: &RemoteCall) -> Result<Value, RemoteFault> {
//!         // One object per order and step: a call repeated writes the same object again.
//!         let key = format!("archive/{}.json", call.idempotency_key.replace('/', "-"));
//!         let body = ByteStream::from(call.order.input().to_string().into_bytes());
//!         self.s3
//!             .put_object()
//!             .bucket(&self.bucket)
//!             .key(&key)
//!             .body(body)
//!             .send()
//!             .await
//!             .map_err(|e| sdk_fault("S3", e))?;
//!         Ok(json!({ "archived": key }))
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), lambda_runtime::Error> {
//!     let bucket = std::env::var("ARCHIVE_BUCKET")?;
//!     run(async |wiring, _settings| {
//!         let sdk = wiring.sdk();
//!         let config = aws_sdk_s3::config::Builder::from(sdk)
//!             .force_path_style(sdk.endpoint_url().is_some())
//!             .build();
//!         Ok(Archive { s3: aws_sdk_s3::Client::from_conf(config), bucket })
//!     })
//!     .await
//! }
//! ```
//!
//! Everything else is the kit's: the request queue and its batches, retries with backoff
//! within the step's budget, an action of the service held after passing faults in a row of
//! its calls (its steps wait, answered `held`, and one probe at a time goes to it until it
//! answers, while the service's other actions go on), its declared rate
//! and concurrency kept across executions, the quiet a throttling service asks for, the reply (sent only while the lease holds, fenced by its attempt
//! number), requests sent again when a passing cause keeps them back, the wait reports the
//! supervisor reads, traces, metrics and logs.

#![warn(missing_docs)]

pub mod settings;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{LambdaEvent, service_fn};
use sas_aws::batch::{Coalescing, Turns, for_each_message_coalescing};
use sas_aws::clients;
use sas_aws::health::DynamoServiceBook;
use sas_aws::settings::{Env, reporter_name};
use sas_aws::sqs::QueueUrls;
use sas_aws::system::{Jitter, SystemClock};
use sas_engine::load::WaitReporter;
use sas_engine::message::Message;
use sas_engine::ports::{
    Clock, Destination, Outbox, Pace, Payloads, Random, ServiceBook, WaitGauge,
};
use sas_engine::services::{Agent, AgentOutcome};
use sas_engine::{AgentName, Error};
use tracing::{Span, debug, info};

pub use sas_aws::errors::remote_fault as sdk_fault;
pub use sas_aws::wiring::Wiring;
pub use sas_engine::Direction;
pub use sas_engine::order::Order;
pub use sas_engine::ports::{RemoteCall, RemoteFault, RemoteService};
pub use settings::AgentSettings;

/// Runs the agent of this deployment (`AGENT_NAME`) on the service `build` makes, until the
/// Lambda runtime stops it. `build` runs once per cold start, with the clients and the
/// settings, for whatever the service needs (an SDK client, a secret read once).
pub async fn run<R, B>(build: B) -> Result<(), lambda_runtime::Error>
where
    R: RemoteService,
    B: AsyncFnOnce(&Wiring, &AgentSettings) -> Result<R, lambda_runtime::Error>,
{
    let s = AgentSettings::from_env(&Env::process())?;
    let wiring = Wiring::start(&format!("agent-{}", s.name)).await;
    clients::warm_up(clients::touch_queue(wiring.sqs(), &s.reply_queue)).await;
    let remote = build(&wiring, &s).await?;

    let own = Destination::Agent(AgentName::new(&s.name));
    let queues = QueueUrls::default()
        .with(Destination::Replies, s.reply_queue.clone())
        .with(own.clone(), s.own_queue.clone());
    let waits = WaitReporter::new(
        wiring.waits(&s.waits_table),
        reporter_name(&format!("agent-{}", s.name)),
        s.config.claim_grace,
    );
    let agent = Agent::new(
        remote,
        Coalescing::new(wiring.outbox(queues), s.linger),
        SystemClock,
        Jitter::default(),
        s.config.agent_retry,
        own,
        waits,
    )
    .guarded(
        DynamoServiceBook::new(wiring.dynamodb().clone(), s.services_table.clone()),
        &s.name,
        s.config.hold,
    )
    .limited(s.limits)
    .keeping(wiring.payloads(s.payload_bucket.clone()));
    info!(agent = %s.name, "agent ready");
    let (agent, wiring) = (&agent, &wiring);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<_>| async move {
        Ok::<_, lambda_runtime::Error>(wiring.invocation(handle(agent, event.payload)).await)
    }))
    .await
}

/// Handles an SQS batch of step requests, each handed to the engine's [`Agent`]; the failed
/// messages are reported for redelivery. Replies whose calls end close together share one
/// `SendMessageBatch`; none waits longer than the linger for the others. A reply can therefore
/// leave up to the linger after the agent checked CompleteBy; like any delay in delivery, that
/// is harmless, because its attempt number, not the clock, decides whether it still counts.
pub async fn handle<R, Q, C, X, W, G, P>(
    agent: &Agent<R, Coalescing<Q>, C, X, W, G, P>,
    event: SqsEvent,
) -> SqsBatchResponse
where
    R: RemoteService,
    Q: Outbox,
    C: Clock,
    X: Random,
    W: WaitGauge,
    G: ServiceBook + Pace,
    P: Payloads,
{
    // A request kept back by a passing cause goes back to this agent's own queue.
    let home = |m: &Message| {
        matches!(m, Message::Request(_) | Message::Elements(_)).then(|| agent.queue().clone())
    };
    for_each_message_coalescing(event, agent.outbox(), home, Turns::None, |received| async move {
        let request = match Message::decode(&received.body)? {
            Message::Request(request) => request,
            Message::Elements(request) => {
                Span::current().record("order_id", tracing::field::display(request.order_id));
                let ended = agent.handle_elements(&request, received.incoming()).await?;
                debug!(action = %request.action, attempt = request.attempt, ?ended, "elements handled");
                return Ok(());
            }
            _ => {
                return Err(Error::InvalidMessage(
                    "only step requests belong on an agent's queue".into(),
                ));
            }
        };
        Span::current().record("order_id", tracing::field::display(request.order_id));
        let outcome = agent.handle(&request, received.incoming()).await?;
        // A step done is in the order's timeline; the log keeps what went otherwise (and,
        // at debug, every step), which is what an operator searches it for.
        if matches!(outcome, AgentOutcome::Replied { done: true, .. }) {
            debug!(action = %request.action, attempt = request.attempt, ?outcome, "step handled");
        } else {
            info!(action = %request.action, attempt = request.attempt, ?outcome, "step handled");
        }
        Ok(())
    })
    .await
}

/// The repository's README, whose Rust examples (an agent on this kit, as a team copies it,
/// and its test with the test kit) are compiled with the kit's tests, so that they never
/// drift from the kits' APIs.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
