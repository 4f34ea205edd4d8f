//! Consuming an SQS batch the way the event source mapping expects with
//! `ReportBatchItemFailures`: every message is handled (concurrently, one span each), and only
//! the ones that failed are reported, so they come back after their visibility timeout and,
//! past the queue's `maxReceiveCount`, land in its dead-letter queue. A message that cannot be
//! parsed fails on every try and so ends there too, without holding up the rest of its batch.
//!
//! [`for_each_message_coalescing`] also lets the messages a batch sends share requests: what a
//! handler sends through a [`Coalescing`] outbox waits until every handler still running is
//! waiting to send too, or until the oldest waiting message has waited the linger, and then
//! all of it goes out together. Ten replies handled in one invocation dispatch their ten
//! requests in one `SendMessageBatch` per queue; ten remote calls that end close together send
//! their ten replies in one. A slow handler holds the others back by the linger at most. Each
//! handler still learns whether its own messages were sent, so a failed send fails exactly the
//! messages that needed it, and their redelivery sends again.
//!
//! A consumer whose handlers write the order a message is about (the scheduler) has the
//! messages of one order handled in turn, in the batch's order, and those of different orders
//! side by side: the ends of a parent's children, or replies of an order's steps side by side,
//! that come in one batch then never meet each other's writes. [`for_each_turn_coalescing`]
//! hands one order's messages over together, for the scheduler to record them in one write.
//!
//! A passing cause (throttling, a service's 5xx, a timeout) must delay a message, never
//! dead-letter it, however long it lasts; but SQS counts every receive against the queue's
//! `maxReceiveCount` whatever the cause. So a message that fails for such a cause on its
//! [`REQUEUE_FROM_RECEIVE`]th receive or later is sent again to its own queue, as a new message
//! with a fresh count, [`REQUEUE_DELAY`] later, and the old one is deleted. A message whose
//! order other writers kept changing ([`Error::Contended`]: many children ending at once, in
//! other invocations) is sent again at once, [`CONTENDED_DELAY`] later, rather than left to its
//! visibility timeout. Only a message that cannot be handled at all reaches the dead-letter
//! queue. The queues' `maxReceiveCount` must be above [`REQUEUE_FROM_RECEIVE`], so that a
//! failed resend still has receives to spare.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use aws_lambda_events::event::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::future::join_all;
use sas_engine::message::Message;
use sas_engine::ports::{Destination, Incoming, Outbox, Outgoing};
use sas_engine::{Error, Result};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tracing::{Instrument, error, info, info_span, warn};

use crate::sqs::AGAIN_OF_ATTRIBUTE;
use crate::trace;

/// From this receive on, a message failing for a passing cause is sent again instead of being
/// left for redelivery (see the module's documentation).
pub const REQUEUE_FROM_RECEIVE: u32 = 3;

/// How long a message sent again waits before it is delivered.
pub const REQUEUE_DELAY: Duration = Duration::from_secs(60);

/// How long a message whose order other writers kept changing waits before it is delivered
/// again: long enough for a burst of writers to be through, far shorter than a visibility
/// timeout.
pub const CONTENDED_DELAY: Duration = Duration::from_secs(1);

tokio::task_local! {
    /// The batch the message being handled belongs to, inside a coalescing batch.
    static BATCH: Arc<Gate>;
}

/// An [`Outbox`] whose sends, inside [`for_each_message_coalescing`], are gathered with the
/// rest of the batch's; anywhere else it sends at once.
#[derive(Clone, Debug)]
pub struct Coalescing<Q> {
    inner: Q,
    linger: Duration,
}

impl<Q> Coalescing<Q> {
    /// `linger` bounds how long a message waits for the batch's other messages.
    pub fn new(inner: Q, linger: Duration) -> Self {
        Coalescing { inner, linger }
    }
}

impl<Q: Outbox> Outbox for Coalescing<Q> {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        match BATCH.try_with(Arc::clone) {
            Ok(gate) => gate.send(messages).await,
            Err(_) => self.inner.send(messages).await,
        }
    }
}

/// The sends of one batch: who is still running, and who is waiting for a send.
#[derive(Debug)]
struct Gate {
    state: Mutex<GateState>,
    changed: Notify,
}

#[derive(Debug)]
struct GateState {
    /// Handlers that have not finished.
    running: usize,
    /// Handlers blocked in a send, in the order they arrived.
    waiting: Vec<Waiter>,
}

#[derive(Debug)]
struct Waiter {
    messages: Vec<Outgoing>,
    since: Instant,
    sent: oneshot::Sender<Result<()>>,
}

impl Gate {
    fn new(running: usize) -> Self {
        Gate {
            state: Mutex::new(GateState { running, waiting: Vec::new() }),
            changed: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let (sent, outcome) = oneshot::channel();
        self.lock().waiting.push(Waiter {
            messages: messages.to_vec(),
            since: Instant::now(),
            sent,
        });
        self.changed.notify_one();
        outcome.await.unwrap_or_else(|_| {
            Err(Error::unavailable("sqs", "the batch ended before the message was sent"))
        })
    }

    fn finished(&self) {
        self.lock().running -= 1;
        self.changed.notify_one();
    }

    /// Sends what the handlers wait for, whenever nobody else can join it or the oldest has
    /// waited `linger`, until every handler has finished.
    async fn serve<Q: Outbox>(&self, outbox: &Q, linger: Duration) {
        loop {
            let due = {
                let state = self.lock();
                if state.running == 0 && state.waiting.is_empty() {
                    return;
                }
                match state.waiting.first().map(|w| w.since) {
                    Some(_) if state.waiting.len() == state.running => Some(Instant::now()),
                    Some(since) => Some(since + linger),
                    None => None,
                }
            };
            if due.is_some_and(|at| at <= Instant::now()) {
                let waiters = std::mem::take(&mut self.lock().waiting);
                flush(outbox, waiters).await;
                continue;
            }
            let timer = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.changed.notified() => {}
                () = timer => {}
            }
        }
    }
}

/// Sends the waiters' messages in one call and tells each of them how it went.
async fn flush<Q: Outbox>(outbox: &Q, waiters: Vec<Waiter>) {
    let messages: Vec<Outgoing> = waiters.iter().flat_map(|w| w.messages.iter().cloned()).collect();
    let result = outbox.send(&messages).await;
    if let Err(e) = &result {
        warn!(error = %e, messages = messages.len(), "sending the batch's messages failed; their sources will be retried");
    }
    for waiter in waiters {
        let outcome = match &result {
            Ok(()) => Ok(()),
            Err(e) if e.is_retryable() => Err(Error::unavailable("sqs", e.to_string())),
            Err(e) => Err(Error::rejected("sqs", e.to_string())),
        };
        // A waiter that is gone has nobody left to tell.
        let _ = waiter.sent.send(outcome);
    }
}

/// One record of a batch, as a handler needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub message_id: String,
    pub body: String,
    /// SQS's `ApproximateReceiveCount`: 1 on the first delivery (and when SQS did not say).
    pub receive_count: u32,
    /// The `AWSTraceHeader` it was sent with, if any.
    pub trace_header: Option<String>,
    /// The id of the message it was sent again for, if it is one (its
    /// [`AGAIN_OF_ATTRIBUTE`] message attribute).
    pub again_of: Option<String>,
}

impl Received {
    fn from_record(record: SqsMessage) -> Received {
        let receive_count = record
            .attributes
            .get("ApproximateReceiveCount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        Received {
            message_id: record.message_id.unwrap_or_default(),
            body: record.body.unwrap_or_default(),
            receive_count,
            trace_header: record.attributes.get(trace::ATTRIBUTE).cloned(),
            again_of: record
                .message_attributes
                .get(AGAIN_OF_ATTRIBUTE)
                .and_then(|a| a.string_value.clone()),
        }
    }

    /// The id the engine knows it by: the message it was sent again for, else its own.
    pub fn identity(&self) -> &str {
        self.again_of.as_deref().unwrap_or(&self.message_id)
    }

    /// Begins its hop of its order's trace.
    fn begin_hop(&self) -> trace::Hop {
        trace::Hop::begin(self.trace_header.as_deref(), trace::About::of(&self.body))
    }

    /// The message as the engine's services take it.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { message_id: self.identity(), receive_count: self.receive_count }
    }
}

/// Handles every record of `event` with `handle` and reports the failures.
pub async fn for_each_message<F, Fut>(event: SqsEvent, handle: F) -> SqsBatchResponse
where
    F: Fn(Received) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let results = join_all(event.records.into_iter().map(|record| {
        let received = Received::from_record(record);
        handle_one(received.begin_hop(), received.message_id.clone(), handle(received))
    }))
    .await;
    response(results.into_iter().filter_map(|(id, ok)| (!ok).then_some(id)))
}

/// Which messages of a batch are handled in turn rather than side by side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turns {
    /// Every message side by side (an agent's requests, which write no order).
    None,
    /// The messages about one order in turn, in the batch's order (the scheduler's, each of
    /// which writes the order it is about).
    PerOrder,
}

/// Like [`for_each_message`], with what the handlers send through `outbox` gathered into as
/// few sends as the linger allows. `home` names the queue a message is consumed from, where it
/// is sent again when it keeps failing for a passing cause; `turns`, which messages wait for
/// each other.
pub async fn for_each_message_coalescing<Q, H, F, Fut>(
    event: SqsEvent,
    outbox: &Coalescing<Q>,
    home: H,
    turns: Turns,
    handle: F,
) -> SqsBatchResponse
where
    Q: Outbox,
    H: Fn(&Message) -> Option<Destination>,
    F: Fn(Received) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let lines = in_turns(event.records.into_iter().map(Received::from_record).collect(), turns);
    let gate = Arc::new(Gate::new(lines.len()));
    let (handle, home) = (&handle, &home);
    let handlers = join_all(lines.into_iter().map(|line| {
        let gate = gate.clone();
        async move {
            let mut results = Vec::with_capacity(line.len());
            for received in line {
                let hop = received.begin_hop();
                let (id, receive_count) = (received.message_id.clone(), received.receive_count);
                let sent =
                    Sent { body: received.body.clone(), identity: received.identity().into() };
                let handled = handle(received);
                let work =
                    async move { settle(outbox, &sent, home, receive_count, handled.await).await };
                results.push(BATCH.scope(gate.clone(), handle_one(hop, id, work)).await);
            }
            gate.finished();
            results
        }
    }));
    let (results, ()) = tokio::join!(handlers, gate.serve(&outbox.inner, outbox.linger));
    response(results.into_iter().flatten().filter_map(|(id, ok)| (!ok).then_some(id)))
}

/// Like [`for_each_message_coalescing`] with [`Turns::PerOrder`], each order's messages of the
/// batch handed to `handle` together, in the batch's order, so that it may record them all
/// with one write; `handle` says what became of each. A message that keeps failing is sent
/// again as [`for_each_message_coalescing`] does.
pub async fn for_each_turn_coalescing<Q, H, F, Fut>(
    event: SqsEvent,
    outbox: &Coalescing<Q>,
    home: H,
    handle: F,
) -> SqsBatchResponse
where
    Q: Outbox,
    H: Fn(&Message) -> Option<Destination>,
    F: Fn(Vec<Received>) -> Fut,
    Fut: Future<Output = Vec<Result<()>>>,
{
    let records = event.records.into_iter().map(Received::from_record).collect();
    let lines = in_turns(records, Turns::PerOrder);
    let gate = Arc::new(Gate::new(lines.len()));
    let (handle, home) = (&handle, &home);
    let handlers = join_all(lines.into_iter().map(|line| {
        let gate = gate.clone();
        async move {
            let kept: Vec<(trace::Hop, String, u32, Sent)> = line
                .iter()
                .map(|r| {
                    let sent = Sent { body: r.body.clone(), identity: r.identity().into() };
                    (r.begin_hop(), r.message_id.clone(), r.receive_count, sent)
                })
                .collect();
            let about = kept.first().map(|(hop, ..)| hop.about());
            let span = info_span!(
                "turn",
                messages = kept.len(),
                order_id = about.as_ref().and_then(|a| a.order_id.as_deref()),
                correlation_id = about.as_ref().and_then(|a| a.correlation_id.as_deref()),
            );
            let handled = BATCH.scope(gate.clone(), handle(line).instrument(span)).await;
            let mut results = Vec::with_capacity(kept.len());
            for ((hop, id, receive_count, sent), handled) in kept.into_iter().zip(handled) {
                let work = async move { settle(outbox, &sent, home, receive_count, handled).await };
                results.push(BATCH.scope(gate.clone(), handle_one(hop, id, work)).await);
            }
            gate.finished();
            results
        }
    }));
    let (results, ()) = tokio::join!(handlers, gate.serve(&outbox.inner, outbox.linger));
    response(results.into_iter().flatten().filter_map(|(id, ok)| (!ok).then_some(id)))
}

/// The batch's messages as lines handled side by side, each line's messages in turn: one line
/// per message, or, [`Turns::PerOrder`], one per order (a message whose order cannot be read
/// has a line of its own).
fn in_turns(records: Vec<Received>, turns: Turns) -> Vec<Vec<Received>> {
    let mut lines: Vec<Vec<Received>> = Vec::new();
    let mut of_order: std::collections::HashMap<sas_engine::OrderId, usize> = Default::default();
    for received in records {
        let order = match turns {
            Turns::None => None,
            Turns::PerOrder => Message::decode(&received.body).ok().and_then(|m| m.order_id()),
        };
        match order.and_then(|id| of_order.get(&id).copied()) {
            Some(line) => lines[line].push(received),
            None => {
                if let Some(id) = order {
                    of_order.insert(id, lines.len());
                }
                lines.push(vec![received]);
            }
        }
    }
    lines
}

/// What a message that may be sent again was: its body, and the id the engine knows it by.
struct Sent {
    body: String,
    identity: String,
}

/// What became of a message, once one that keeps failing for a passing cause is sent again:
/// at once if its order's other writers kept it out, from its [`REQUEUE_FROM_RECEIVE`]th
/// receive otherwise.
async fn settle<Q: Outbox>(
    outbox: &Coalescing<Q>,
    sent: &Sent,
    home: impl Fn(&Message) -> Option<Destination>,
    receive_count: u32,
    handled: Result<()>,
) -> Result<()> {
    match handled {
        Err(e @ Error::Contended { .. }) => {
            requeue(outbox, sent, home, receive_count, CONTENDED_DELAY, e).await
        }
        Err(e) if e.is_retryable() && receive_count >= REQUEUE_FROM_RECEIVE => {
            requeue(outbox, sent, home, receive_count, REQUEUE_DELAY, e).await
        }
        other => other,
    }
}

/// Sends a message that failed with `error` again, as a new message known by the same id,
/// `delay` later, to the queue `home` names for it: done if the send worked, else the error
/// stands and the queue redelivers it.
async fn requeue<Q: Outbox>(
    outbox: &Coalescing<Q>,
    sent: &Sent,
    home: impl Fn(&Message) -> Option<Destination>,
    receive_count: u32,
    delay: Duration,
    error: Error,
) -> Result<()> {
    let decoded = Message::decode(&sent.body).ok();
    let Some((to, message)) = decoded.and_then(|m| Some((home(&m)?, m))) else {
        return Err(error);
    };
    match outbox.send(&[Outgoing::again(to, message, delay, &sent.identity)]).await {
        Ok(()) => {
            info!(%error, receive_count, delay_s = delay.as_secs(), "sent again as a new message, so that a passing cause delays it and never dead-letters it");
            Ok(())
        }
        Err(resend) => {
            warn!(%resend, "could not send it again; it stays in its queue");
            Err(error)
        }
    }
}

/// Runs one message's handling in its span, as a hop of its order's trace, and logs a failure;
/// returns (id, succeeded). Every line logged while handling it names the message, the order,
/// its correlation id and the trace.
async fn handle_one(
    hop: trace::Hop,
    id: String,
    work: impl Future<Output = Result<()>>,
) -> (String, bool) {
    let about = hop.about();
    let span = info_span!(
        "message",
        message_id = %id,
        order_id = about.order_id.as_deref(),
        correlation_id = about.correlation_id.as_deref(),
        trace_id = hop.trace_id(),
    );
    let ok = async move {
        match work.await {
            Ok(()) => true,
            Err(e) => {
                report(&e);
                false
            }
        }
    }
    .instrument(span)
    .await;
    hop.end(!ok);
    (id, ok)
}

fn report(e: &Error) {
    if e.is_retryable() {
        warn!(error = %e, "will be retried");
    } else {
        error!(error = %e, "cannot be handled; it will end in the dead-letter queue");
    }
}

fn response(failed: impl Iterator<Item = String>) -> SqsBatchResponse {
    let mut response = SqsBatchResponse::default();
    for id in failed {
        let mut failure = BatchItemFailure::default();
        failure.item_identifier = id;
        response.batch_item_failures.push(failure);
    }
    response
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use aws_lambda_events::event::sqs::SqsMessageAttribute;
    use sas_engine::memory::{ManualClock, MemoryQueues};
    use sas_engine::message::{Message, Start};
    use sas_engine::ports::Destination;
    use sas_engine::{IdempotencyKey, OrderId};

    use super::*;

    fn event(ids: &[&str]) -> SqsEvent {
        let mut event = SqsEvent::default();
        for id in ids {
            let mut m = SqsMessage::default();
            m.message_id = Some((*id).to_owned());
            m.body = Some((*id).to_owned());
            event.records.push(m);
        }
        event
    }

    fn start(n: u64) -> Outgoing {
        let order_id = OrderId::for_key(&IdempotencyKey::parse(&format!("k{n}")).unwrap());
        Outgoing::now(
            Destination::Scheduler,
            Message::Start(Start {
                order_id,
                attempt: n,
                correlation_id: "c".into(),
                due_at: None,
                group: None,
            }),
        )
    }

    /// Records each call it passes on: when, and how many messages.
    #[derive(Debug)]
    struct Recorder {
        clock: ManualClock,
        queues: MemoryQueues<ManualClock>,
        calls: Mutex<Vec<(Duration, usize)>>,
        began: Instant,
    }

    impl Recorder {
        fn new() -> Arc<Self> {
            let clock = ManualClock::default();
            Arc::new(Recorder {
                queues: MemoryQueues::new(clock.clone()),
                clock,
                calls: Mutex::default(),
                began: Instant::now(),
            })
        }
        fn calls(&self) -> Vec<(Duration, usize)> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Outbox for Recorder {
        async fn send(&self, messages: &[Outgoing]) -> Result<()> {
            let at = self.began.elapsed();
            self.calls.lock().unwrap().push((at, messages.len()));
            self.queues.send(messages).await
        }
    }

    fn nowhere(_: &Message) -> Option<Destination> {
        None
    }

    fn failed(response: &SqsBatchResponse) -> Vec<&str> {
        let mut ids: Vec<_> =
            response.batch_item_failures.iter().map(|f| f.item_identifier.as_str()).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn a_record_says_how_often_it_was_received() {
        let mut record = SqsMessage::default();
        record.message_id = Some("m-1".into());
        assert_eq!(Received::from_record(record.clone()).incoming().receive_count, 1);
        record.attributes.insert("ApproximateReceiveCount".into(), "4".into());
        let received = Received::from_record(record.clone());
        assert_eq!(received.incoming(), Incoming { message_id: "m-1", receive_count: 4 });
        // One sent again is known by the id of the message it was sent again for.
        let mut first = SqsMessageAttribute::default();
        (first.string_value, first.data_type) = (Some("m-0".into()), Some("String".into()));
        record.message_attributes.insert(AGAIN_OF_ATTRIBUTE.into(), first);
        let received = Received::from_record(record);
        assert_eq!(received.incoming(), Incoming { message_id: "m-0", receive_count: 4 });
        assert_eq!(received.message_id, "m-1", "its failure is reported by its own id");
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_sends_once_and_reports_only_its_failures() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_secs(3600));
        let outbox_ref = &outbox;
        let response = for_each_message_coalescing(
            event(&["a", "b", "c"]),
            &outbox,
            nowhere,
            Turns::None,
            |r: Received| async move {
                let id = r.message_id.as_str();
                outbox_ref.send(&[start(1), start(2)]).await?;
                if id == "b" { Err(Error::InvalidMessage("poison".into())) } else { Ok(()) }
            },
        )
        .await;
        assert_eq!(failed(&response), ["b"]);
        // Six messages in one call, as soon as all three handlers waited: the linger never ran.
        assert_eq!(recorder.calls(), [(Duration::ZERO, 6)]);
        // Outside a batch, the outbox sends at once.
        outbox.send(&[start(3)]).await.unwrap();
        assert_eq!(recorder.queues.sent_count(&Destination::Scheduler), 7);
    }

    #[tokio::test(start_paused = true)]
    async fn when_the_combined_send_fails_every_sender_is_retried() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(100));
        let outbox_ref = &outbox;
        recorder.queues.fail_next_sends(1);
        let response = for_each_message_coalescing(
            event(&["a", "b", "quiet"]),
            &outbox,
            nowhere,
            Turns::None,
            |r: Received| async move {
                let id = r.message_id.as_str();
                if id != "quiet" {
                    outbox_ref.send(&[start(1)]).await?;
                }
                Ok(())
            },
        )
        .await;
        assert_eq!(failed(&response), ["a", "b"], "the message that sent nothing is done");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_handler_holds_the_others_back_by_the_linger_at_most() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(100));
        let outbox_ref = &outbox;
        let response = for_each_message_coalescing(
            event(&["a", "b", "slow"]),
            &outbox,
            nowhere,
            Turns::None,
            |r: Received| async move {
                let id = r.message_id.as_str();
                if id == "slow" {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                } else if id == "b" {
                    tokio::time::sleep(Duration::from_millis(60)).await;
                }
                outbox_ref.send(&[start(1)]).await
            },
        )
        .await;
        assert!(failed(&response).is_empty());
        // a waited for b (60 ms apart, within the linger) but not for the slow one.
        assert_eq!(
            recorder.calls(),
            [(Duration::from_millis(100), 2), (Duration::from_secs(10), 1)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_that_finishes_without_sending_releases_the_others() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_secs(3600));
        let outbox_ref = &outbox;
        let response = for_each_message_coalescing(
            event(&["a", "quiet"]),
            &outbox,
            nowhere,
            Turns::None,
            |r: Received| async move {
                let id = r.message_id.as_str();
                if id == "quiet" {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    return Ok(());
                }
                outbox_ref.send(&[start(1)]).await
            },
        )
        .await;
        assert!(failed(&response).is_empty());
        assert_eq!(recorder.calls(), [(Duration::from_secs(5), 1)]);
    }

    fn received_as(id: &str, body: &str, receive_count: u32) -> SqsEvent {
        let mut m = SqsMessage::default();
        m.message_id = Some(id.to_owned());
        m.body = Some(body.to_owned());
        m.attributes.insert("ApproximateReceiveCount".into(), receive_count.to_string());
        let mut event = SqsEvent::default();
        event.records.push(m);
        event
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_failing_for_a_passing_cause_is_sent_again_before_it_runs_out_of_receives() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(10));
        let body = start(1).message.encode();
        let throttled = |_: Received| async {
            Err(Error::unavailable("dynamodb", "ThrottlingException: rate exceeded"))
        };
        let home = |_: &Message| Some(Destination::Scheduler);
        // Early receives are left to the queue's own redelivery.
        for count in 1..REQUEUE_FROM_RECEIVE {
            let response = for_each_message_coalescing(
                received_as("m", &body, count),
                &outbox,
                home,
                Turns::None,
                throttled,
            )
            .await;
            assert_eq!(failed(&response), ["m"], "receive {count}");
        }
        assert_eq!(recorder.queues.sent_count(&Destination::Scheduler), 0);
        // Then it goes back as a new message, later, and the old one is done with.
        let response = for_each_message_coalescing(
            received_as("m", &body, REQUEUE_FROM_RECEIVE),
            &outbox,
            home,
            Turns::None,
            throttled,
        )
        .await;
        assert!(failed(&response).is_empty());
        assert_eq!(recorder.queues.sent_count(&Destination::Scheduler), 1);
        assert!(recorder.queues.receive(&Destination::Scheduler, 10).is_empty(), "came early");
        recorder.clock.advance(REQUEUE_DELAY);
        let later = recorder.queues.receive(&Destination::Scheduler, 10);
        let later: Vec<_> =
            later.iter().map(|m| (m.body.as_str(), m.receive_count, m.identity())).collect();
        // Known by the first one's id, so that a transition it wrote is replayed.
        assert_eq!(later, [(body.as_str(), 1, "m")]);

        // A message that cannot be handled is not sent again: it is for the dead-letter queue.
        let poison = |_: Received| async { Err(Error::InvalidMessage("poison".into())) };
        let response = for_each_message_coalescing(
            received_as("p", &body, 4),
            &outbox,
            home,
            Turns::None,
            poison,
        )
        .await;
        assert_eq!(failed(&response), ["p"]);
        // Nor is one whose home is unknown, or one whose resend fails.
        let response = for_each_message_coalescing(
            received_as("n", &body, 4),
            &outbox,
            nowhere,
            Turns::None,
            throttled,
        )
        .await;
        assert_eq!(failed(&response), ["n"]);
        recorder.queues.fail_next_sends(1);
        let response = for_each_message_coalescing(
            received_as("f", &body, 4),
            &outbox,
            home,
            Turns::None,
            throttled,
        )
        .await;
        assert_eq!(failed(&response), ["f"]);
        assert_eq!(recorder.queues.sent_count(&Destination::Scheduler), 1);
    }

    /// A reply of `order`'s step `n`, as a message body.
    fn reply_of(order: &str, n: u64) -> String {
        use sas_engine::message::{StepOutcome, StepRef, StepReply};
        let order_id = OrderId::for_key(&IdempotencyKey::parse(order).unwrap());
        Message::Reply(StepReply {
            order_id,
            attempt: n,
            correlation_id: "c".into(),
            step: StepRef {
                index: 0,
                name: "s".into(),
                direction: sas_engine::Direction::Do,
                element: None,
            },
            complete_by: sas_engine::Timestamp::from_millis(0),
            idempotency_key: format!("k{n}"),
            outcome: StepOutcome::done(serde_json::json!({})),
            due_at: None,
            group: None,
        })
        .encode()
    }

    #[tokio::test(start_paused = true)]
    async fn one_order_s_messages_are_handed_over_together_and_each_answers_for_itself() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(10));
        let mut event = SqsEvent::default();
        for (id, order, n) in [("p1", "parent", 1), ("x", "other", 1), ("p2", "parent", 2)] {
            let mut m = SqsMessage::default();
            m.message_id = Some(id.to_owned());
            m.body = Some(reply_of(order, n));
            event.records.push(m);
        }
        let lines: Mutex<Vec<Vec<String>>> = Mutex::default();
        let lines = &lines;
        let response =
            for_each_turn_coalescing(event, &outbox, nowhere, |line: Vec<Received>| async move {
                let ids: Vec<String> = line.iter().map(|r| r.message_id.clone()).collect();
                lines.lock().unwrap().push(ids.clone());
                // The second of the parent's fails; the others are done.
                ids.iter()
                    .map(|id| match id.as_str() {
                        "p2" => Err(Error::unavailable("test", "a passing cause")),
                        _ => Ok(()),
                    })
                    .collect()
            })
            .await;
        let mut seen = lines.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, [vec!["p1".to_owned(), "p2".to_owned()], vec!["x".to_owned()]]);
        assert_eq!(failed(&response), ["p2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_messages_of_one_order_are_handled_in_turn_and_those_of_others_side_by_side() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(10));
        let mut event = SqsEvent::default();
        for (id, order, n) in [("p1", "parent", 1), ("x", "other", 1), ("p2", "parent", 2)] {
            let mut m = SqsMessage::default();
            m.message_id = Some(id.to_owned());
            m.body = Some(reply_of(order, n));
            event.records.push(m);
        }
        let running: Mutex<Vec<String>> = Mutex::default();
        let seen: Mutex<Vec<(String, Vec<String>)>> = Mutex::default();
        let (running, seen) = (&running, &seen);
        let handled = |turns: Turns| {
            let event = event.clone();
            let outbox = &outbox;
            async move {
                seen.lock().unwrap().clear();
                for_each_message_coalescing(
                    event,
                    outbox,
                    nowhere,
                    turns,
                    |r: Received| async move {
                        let id = r.message_id.clone();
                        let beside = running.lock().unwrap().clone();
                        seen.lock().unwrap().push((id.clone(), beside));
                        running.lock().unwrap().push(id.clone());
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        running.lock().unwrap().retain(|r| *r != id);
                        Ok(())
                    },
                )
                .await
            }
        };
        assert!(failed(&handled(Turns::PerOrder).await).is_empty());
        let order: Vec<(String, Vec<String>)> = seen.lock().unwrap().clone();
        // p2 began once p1 was over, with only the other order's message beside it.
        let p2 = order.iter().find(|(id, _)| id == "p2").unwrap();
        assert!(!p2.1.contains(&"p1".to_owned()), "{order:?}");
        let x = order.iter().find(|(id, _)| id == "x").unwrap();
        assert_eq!(x.1, ["p1"], "another order's message ran beside: {order:?}");
        // Side by side, all three run at once.
        assert!(failed(&handled(Turns::None).await).is_empty());
        let p2 = seen.lock().unwrap().iter().find(|(id, _)| id == "p2").unwrap().clone();
        assert_eq!(p2.1.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_whose_order_others_kept_writing_is_sent_again_a_second_later() {
        let recorder = Recorder::new();
        let outbox = Coalescing::new(recorder.clone(), Duration::from_millis(10));
        let body = start(1).message.encode();
        let home = |_: &Message| Some(Destination::Scheduler);
        let contended = |_: Received| async {
            let order_id = OrderId::for_key(&IdempotencyKey::parse("k1").unwrap());
            Err(Error::Contended { order_id, tries: 8 })
        };
        // At its first receive: it does not wait for its visibility timeout.
        let response = for_each_message_coalescing(
            received_as("m", &body, 1),
            &outbox,
            home,
            Turns::PerOrder,
            contended,
        )
        .await;
        assert!(failed(&response).is_empty());
        assert!(recorder.queues.receive(&Destination::Scheduler, 10).is_empty(), "came early");
        recorder.clock.advance(CONTENDED_DELAY);
        let again = recorder.queues.receive(&Destination::Scheduler, 10);
        assert_eq!(again.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(), [body.as_str()]);
    }
}
