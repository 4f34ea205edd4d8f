//! In-memory queues with the semantics of SQS standard queues, behind the [`Outbox`] port, plus
//! the consumer side (receive, delete, change visibility) that a Lambda event source mapping
//! drives on AWS.
//!
//! What is kept from SQS because the engine's correctness depends on it: a message can be
//! delayed (at most 15 minutes; a longer delay refuses the whole send); receiving it hides it
//! for the queue's visibility timeout rather than removing it, so a consumer that does not
//! delete it in time sees it again; a receipt from an earlier receive of a message received
//! again still deletes it (SQS may or may not; this is the answer that can pull a message from
//! under the consumer still working on it), but only the latest receipt changes its visibility;
//! and a message received too many times goes to the queue's dead-letter list instead of being
//! delivered again. A send can fail one message alone, which is tried again by itself, as the
//! SQS adapter does with a failed entry of a batch. Bodies are the encoded JSON strings a real
//! queue would carry, limited to 256 KiB. What is simplified: delays are exact where SQS counts
//! whole seconds (the adapter rounds up, so a message is never early on either); ordering is
//! exact (earliest visible first, then in sending order) where SQS is only roughly ordered; and
//! every visible message is returned, where SQS may sample a subset of its servers.
//!
//! A message sent with a group ([`crate::message::Message::group`]) is delivered as a fair
//! queue delivers it ([`crate::fair::Noise`]): while a group holds more than its share of the
//! messages in flight, or of the consumers' time, the quiet groups' messages come first, then
//! the noisy groups', the one with the fewest in flight first. A message without a group is a
//! tenant of its own, never noisy.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::fair::Noise;
pub use crate::ports::MAX_DELAY;
use crate::ports::{Clock, Depth, Destination, ENTRY_TRIES, Outbox, Outgoing, QueueDepths};
use crate::time::Timestamp;

/// Largest message body SQS accepts, in bytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Longest visibility timeout SQS accepts.
pub const MAX_VISIBILITY_TIMEOUT: Duration = Duration::from_secs(12 * 60 * 60);
/// Most messages one receive returns.
pub const MAX_RECEIVE_BATCH: usize = 10;

const SERVICE: &str = "sqs";

/// How one queue behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    /// How long a received message stays hidden before it is delivered again.
    pub visibility_timeout: Duration,
    /// After this many receives, the next time the message is due it goes to the queue's
    /// dead-letter list instead (the redrive policy's `maxReceiveCount`). `None`: never.
    pub max_receive_count: Option<u32>,
}

impl Default for QueueSettings {
    /// SQS's default visibility timeout (30 s) and a redrive after 5 receives.
    fn default() -> Self {
        QueueSettings { visibility_timeout: Duration::from_secs(30), max_receive_count: Some(5) }
    }
}

/// One message handed to a consumer by [`MemoryQueues::receive`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub message_id: String,
    /// Names this receive: any receipt of a message deletes it, only the latest changes its
    /// visibility.
    pub receipt: String,
    pub body: String,
    /// How many times the message has been received, this time included.
    pub receive_count: u32,
    /// What it was sent with as [`Outgoing::again_of`].
    pub again_of: Option<String>,
}

impl Delivery {
    /// The id its consumer knows it by: the one it was sent again for, else its own.
    pub fn identity(&self) -> &str {
        self.again_of.as_deref().unwrap_or(&self.message_id)
    }
}

/// SQS standard queues, one per [`Destination`], created on first use.
pub struct MemoryQueues<C> {
    clock: C,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    queues: HashMap<Destination, Queue>,
    // Global rather than per queue, like SQS message ids, so an id names one message anywhere.
    next_message: u64,
    next_receipt: u64,
    failing_sends: usize,
    /// The next send's message that fails alone: (its index, how many tries fail).
    failing_entry: Option<(usize, u32)>,
    depth_reads: u64,
}

#[derive(Default)]
struct Queue {
    settings: QueueSettings,
    // In sending order; `seq` breaks ties between messages that become visible together.
    messages: Vec<Stored>,
    dead: Vec<String>,
    sent: usize,
    /// What each group took of the consumers' time lately.
    noise: Noise,
}

struct Stored {
    seq: u64,
    id: String,
    body: String,
    #[allow(dead_code)] // Kept for debugging a simulation; SQS keeps it as SentTimestamp.
    sent_at: Timestamp,
    visible_at: Timestamp,
    receive_count: u32,
    receipt: Option<String>,
    /// Receipts of the earlier receives, which still delete it.
    old_receipts: Vec<String>,
    again_of: Option<String>,
    group: Option<String>,
    /// When it was last received: a consumer's time on it ends when it is deleted.
    received_at: Option<Timestamp>,
}

impl<C: Clock> MemoryQueues<C> {
    /// Empty queues reading time from `clock`.
    pub fn new(clock: C) -> Self {
        MemoryQueues { clock, state: Mutex::new(State::default()) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the settings of `dest`'s queue, creating it if needed. Messages already on the
    /// queue keep their current visibility; the new timeout applies to later receives.
    pub fn configure(&self, dest: &Destination, settings: QueueSettings) {
        self.state().queues.entry(dest.clone()).or_default().settings = settings;
    }

    /// Puts an arbitrary body on `dest`'s queue, as a misbehaving or older producer might, and
    /// returns its message id. Only the size limit applies; injected send faults do not.
    pub fn send_raw(&self, dest: &Destination, body: String) -> Result<String> {
        check_body(&body)?;
        let now = self.clock.now();
        Ok(self.state().push(dest, body, now, now, None, None))
    }

    /// Receives up to `max` (at most [`MAX_RECEIVE_BATCH`]) visible messages, earliest visible
    /// first, hiding each for the queue's visibility timeout. A due message already received
    /// `max_receive_count` times is moved to the dead-letter list instead of being returned.
    pub fn receive(&self, dest: &Destination, max: usize) -> Vec<Delivery> {
        let max = max.min(MAX_RECEIVE_BATCH);
        let now = self.clock.now();
        let mut state = self.state();
        let State { queues, next_receipt, .. } = &mut *state;
        let Some(queue) = queues.get_mut(dest) else {
            return Vec::new();
        };
        let settings = queue.settings;

        let due = queue.fair_order(now);

        let mut deliveries = Vec::new();
        let mut redriven = Vec::new();
        for seq in due {
            if deliveries.len() >= max {
                break;
            }
            let Some(message) = queue.messages.iter_mut().find(|m| m.seq == seq) else {
                continue;
            };
            if settings.max_receive_count.is_some_and(|limit| message.receive_count >= limit) {
                redriven.push(seq);
                continue;
            }
            *next_receipt += 1;
            let receipt = format!("{}#r-{}", message.id, next_receipt);
            message.receive_count += 1;
            message.visible_at = now.plus(settings.visibility_timeout);
            message.received_at = Some(now);
            if let Some(old) = message.receipt.replace(receipt.clone()) {
                message.old_receipts.push(old);
            }
            deliveries.push(Delivery {
                message_id: message.id.clone(),
                receipt,
                body: message.body.clone(),
                receive_count: message.receive_count,
                again_of: message.again_of.clone(),
            });
        }
        // Moved in the order they came due, so the dead-letter list reads like a queue too.
        for seq in redriven {
            if let Some(at) = queue.messages.iter().position(|m| m.seq == seq) {
                let message = queue.messages.remove(at);
                queue.dead.push(message.body);
            }
        }
        deliveries
    }

    /// Deletes the message `receipt` was issued for, by whichever of its receives, even one a
    /// later receive superseded while another consumer holds the message. A receipt never
    /// issued, or of a message no longer on the queue, is rejected.
    pub fn delete(&self, dest: &Destination, receipt: &str) -> Result<()> {
        let now = self.clock.now();
        let mut state = self.state();
        let queue =
            state.queues.get_mut(dest).ok_or_else(|| unknown_receipt(receipt, "a receipt"))?;
        let at = queue
            .messages
            .iter()
            .position(|m| {
                m.receipt.as_deref() == Some(receipt) || m.old_receipts.iter().any(|r| r == receipt)
            })
            .ok_or_else(|| unknown_receipt(receipt, "a receipt"))?;
        let message = queue.messages.remove(at);
        if let (Some(group), Some(received)) = (&message.group, message.received_at) {
            queue.noise.worked(group, received.until(now), now);
        }
        Ok(())
    }

    /// Makes the message of `receipt` visible again `timeout` from now (zero: at once), if
    /// `receipt` is its latest receipt. A timeout above [`MAX_VISIBILITY_TIMEOUT`] is rejected.
    pub fn change_visibility(
        &self,
        dest: &Destination,
        receipt: &str,
        timeout: Duration,
    ) -> Result<()> {
        if timeout > MAX_VISIBILITY_TIMEOUT {
            return Err(Error::rejected(
                SERVICE,
                format!("visibility timeout {timeout:?} is above the 12 h maximum"),
            ));
        }
        let now = self.clock.now();
        self.latest(dest, receipt, |message| message.visible_at = now.plus(timeout))
    }

    /// Puts the message of `receipt` back, visible at once, as if that receive had not been:
    /// what a consumer that took a batch and handles only some of it does for the rest, so
    /// that they are not counted towards the dead-letter list for receives never handled.
    pub fn put_back(&self, dest: &Destination, receipt: &str) -> Result<()> {
        let now = self.clock.now();
        self.latest(dest, receipt, |message| {
            message.visible_at = now;
            message.receive_count = message.receive_count.saturating_sub(1);
        })
    }

    /// Changes the message whose latest receipt is `receipt`.
    fn latest(
        &self,
        dest: &Destination,
        receipt: &str,
        change: impl FnOnce(&mut Stored),
    ) -> Result<()> {
        let mut state = self.state();
        let message = state
            .queues
            .get_mut(dest)
            .and_then(|q| q.messages.iter_mut().find(|m| m.receipt.as_deref() == Some(receipt)))
            .ok_or_else(|| unknown_receipt(receipt, "the latest receipt"))?;
        change(message);
        Ok(())
    }

    /// Makes the next `n` calls to [`Outbox::send`] fail as unavailable, sending nothing.
    /// Replaces any count set before.
    pub fn fail_next_sends(&self, n: usize) {
        self.state().failing_sends = n;
    }

    /// Makes the message at `index` of the next [`Outbox::send`] that has one fail alone on its
    /// first `tries` tries, as SQS fails one entry of a batch on its side: the send tries it
    /// again by itself, up to [`ENTRY_TRIES`] tries, and the other messages go once. Replaces
    /// any entry fault set before.
    pub fn fail_entry(&self, index: usize, tries: u32) {
        self.state().failing_entry = Some((index, tries));
    }

    /// How many times [`QueueDepths::depths`] was called.
    pub fn depth_reads(&self) -> u64 {
        self.state().depth_reads
    }

    /// Messages that a receive would return now (or redrive).
    pub fn visible_len(&self, dest: &Destination) -> usize {
        let now = self.clock.now();
        self.count(dest, |m| m.visible_at <= now)
    }

    /// Messages received and hidden by their visibility timeout.
    pub fn in_flight_len(&self, dest: &Destination) -> usize {
        let now = self.clock.now();
        self.count(dest, |m| m.visible_at > now && m.receive_count > 0)
    }

    /// Messages sent with a delay that has not yet run out, never received.
    pub fn delayed_len(&self, dest: &Destination) -> usize {
        let now = self.clock.now();
        self.count(dest, |m| m.visible_at > now && m.receive_count == 0)
    }

    /// Messages on the queue, whatever their visibility: neither deleted nor dead-lettered.
    pub fn len(&self, dest: &Destination) -> usize {
        self.count(dest, |_| true)
    }

    /// Whether the queue holds no message (dead letters aside).
    pub fn is_empty(&self, dest: &Destination) -> bool {
        self.len(dest) == 0
    }

    /// Bodies moved to the queue's dead-letter list, oldest first.
    pub fn dead_letters(&self, dest: &Destination) -> Vec<String> {
        self.state().queues.get(dest).map(|q| q.dead.clone()).unwrap_or_default()
    }

    /// Messages ever accepted by the queue, including those since deleted or dead-lettered.
    pub fn sent_count(&self, dest: &Destination) -> usize {
        self.state().queues.get(dest).map_or(0, |q| q.sent)
    }

    fn count(&self, dest: &Destination, keep: impl Fn(&Stored) -> bool) -> usize {
        self.state().queues.get(dest).map_or(0, |q| q.messages.iter().filter(|m| keep(m)).count())
    }
}

impl State {
    /// Stores `outgoing` (its `body` encoded), sent at `now`.
    fn push_sent(&mut self, outgoing: &Outgoing, body: String, now: Timestamp) -> String {
        let visible_at = now.plus(outgoing.delay);
        let group = outgoing.message.group().map(str::to_owned);
        self.push(&outgoing.to, body, now, visible_at, outgoing.again_of.clone(), group)
    }

    fn push(
        &mut self,
        dest: &Destination,
        body: String,
        sent_at: Timestamp,
        visible_at: Timestamp,
        again_of: Option<String>,
        group: Option<String>,
    ) -> String {
        self.next_message += 1;
        let seq = self.next_message;
        let id = format!("m-{seq}");
        let queue = self.queues.entry(dest.clone()).or_default();
        queue.sent += 1;
        queue.messages.push(Stored {
            seq,
            id: id.clone(),
            body,
            sent_at,
            visible_at,
            receive_count: 0,
            receipt: None,
            old_receipts: Vec::new(),
            again_of,
            group,
            received_at: None,
        });
        id
    }
}

impl Queue {
    /// The visible messages, in the order a receive takes them: earliest visible first, then in
    /// sending order; but the quiet groups' before the noisy groups', and among the noisy, the
    /// next from whichever has the fewest in flight.
    fn fair_order(&self, now: Timestamp) -> Vec<u64> {
        let mut due: Vec<(Timestamp, u64, Option<&str>)> = self
            .messages
            .iter()
            .filter(|m| m.visible_at <= now)
            .map(|m| (m.visible_at, m.seq, m.group.as_deref()))
            .collect();
        due.sort_unstable();
        // With the messages waiting all of one group, there is nothing to put first.
        if due.iter().all(|(_, _, g)| *g == due[0].2) {
            return due.into_iter().map(|(_, seq, _)| seq).collect();
        }
        let mut in_flight: HashMap<&str, usize> = HashMap::new();
        for m in self.messages.iter().filter(|m| m.visible_at > now && m.receive_count > 0) {
            if let Some(group) = m.group.as_deref() {
                *in_flight.entry(group).or_default() += 1;
            }
        }
        // A group with messages waiting and none in flight counts too, at none.
        for (_, _, group) in &due {
            if let Some(group) = group {
                in_flight.entry(group).or_default();
            }
        }
        let noisy = self.noise.noisy(&in_flight, now);
        if noisy.is_empty() {
            return due.into_iter().map(|(_, seq, _)| seq).collect();
        }
        let mut order = Vec::with_capacity(due.len());
        let mut waiting: HashMap<&str, std::collections::VecDeque<u64>> = HashMap::new();
        for (_, seq, group) in due {
            match group.filter(|g| noisy.contains(g)) {
                Some(g) => waiting.entry(g).or_default().push_back(seq),
                None => order.push(seq),
            }
        }
        while let Some(group) = waiting
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .min_by_key(|(g, q)| (in_flight.get(*g).copied().unwrap_or(0), q.front().copied()))
            .map(|(g, _)| *g)
        {
            if let Some(seq) = waiting.get_mut(group).and_then(|q| q.pop_front()) {
                order.push(seq);
                *in_flight.entry(group).or_default() += 1;
            }
        }
        order
    }
}

fn check_body(body: &str) -> Result<()> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Error::rejected(
            SERVICE,
            format!("message body is {} bytes, above the {MAX_BODY_BYTES} byte limit", body.len()),
        ));
    }
    Ok(())
}

/// `which`: the receipts that would have done.
fn unknown_receipt(receipt: &str, which: &str) -> Error {
    Error::rejected(
        SERVICE,
        format!("receipt {receipt:?} is not {which} of any message on the queue"),
    )
}

impl<C: Clock> Outbox for MemoryQueues<C> {
    /// Refuses the whole send, sending nothing, if any message is one SQS would reject (delay
    /// above 15 minutes, body above 256 KiB), as the SQS adapter checks before it sends.
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        let mut bodies = Vec::with_capacity(messages.len());
        for outgoing in messages {
            if outgoing.delay > MAX_DELAY {
                return Err(Error::rejected(
                    SERVICE,
                    format!("delay {:?} is above the 15 minute maximum", outgoing.delay),
                ));
            }
            let body = outgoing.message.encode();
            check_body(&body)?;
            bodies.push(body);
        }
        let now = self.clock.now();
        let mut state = self.state();
        if state.failing_sends > 0 {
            state.failing_sends -= 1;
            return Err(Error::unavailable(SERVICE, "injected send failure"));
        }
        let failing = state.failing_entry.filter(|&(index, _)| index < messages.len());
        if failing.is_some() {
            state.failing_entry = None;
        }
        // The failed message's tries go out after the batch that carried it, as the adapter's do.
        let mut retried = None;
        for (index, (outgoing, body)) in messages.iter().zip(bodies).enumerate() {
            match failing {
                Some((at, tries)) if at == index => retried = Some((outgoing, body, tries)),
                _ => {
                    state.push_sent(outgoing, body, now);
                }
            }
        }
        match retried {
            Some((outgoing, _, tries)) if tries >= ENTRY_TRIES => Err(Error::unavailable(
                SERVICE,
                format!("a message to {:?} failed {ENTRY_TRIES} tries (injected)", outgoing.to),
            )),
            Some((outgoing, body, _)) => {
                state.push_sent(outgoing, body, now);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl<C: Clock> QueueDepths for MemoryQueues<C> {
    /// Every queue that was configured or sent to, in a stable order.
    async fn depths(&self) -> Result<Vec<(Destination, Depth)>> {
        let now = self.clock.now();
        let mut state = self.state();
        state.depth_reads += 1;
        let mut depths: Vec<(Destination, Depth)> = state
            .queues
            .iter()
            .map(|(dest, q)| {
                let mut d = Depth::default();
                for m in &q.messages {
                    if m.visible_at <= now {
                        d.waiting += 1;
                    } else if m.receive_count > 0 {
                        d.in_flight += 1;
                    } else {
                        d.delayed += 1;
                    }
                }
                (dest.clone(), d)
            })
            .collect();
        depths.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(depths)
    }
}

impl<C> fmt::Debug for MemoryQueues<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Bodies can be large and many; the sizes say enough to tell queues apart.
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut queues: Vec<String> = state
            .queues
            .iter()
            .map(|(dest, q)| {
                format!("{dest:?}: {} queued, {} dead", q.messages.len(), q.dead.len())
            })
            .collect();
        queues.sort();
        f.debug_struct("MemoryQueues").field("queues", &queues).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AgentName, IdempotencyKey, OrderId};
    use crate::memory::ManualClock;
    use crate::message::{Message, Start};

    fn start(n: u64) -> Message {
        Message::Start(Start {
            order_id: OrderId::for_key(&IdempotencyKey::parse("k").unwrap()),
            attempt: n,
            correlation_id: format!("c-{n}"),
            due_at: None,
            group: None,
        })
    }

    fn attempt(body: &str) -> u64 {
        match Message::decode(body).unwrap() {
            Message::Start(s) => s.attempt,
            other => panic!("unexpected {other:?}"),
        }
    }

    fn setup() -> (ManualClock, MemoryQueues<ManualClock>) {
        let clock = ManualClock::default();
        (clock.clone(), MemoryQueues::new(clock))
    }

    async fn send(q: &MemoryQueues<ManualClock>, n: u64, delay: Duration) -> Result<()> {
        q.send(&[Outgoing::later(Destination::Scheduler, start(n), delay)]).await
    }

    const S: Destination = Destination::Scheduler;

    #[tokio::test]
    async fn a_delayed_message_is_hidden_until_its_delay_runs_out() {
        let (clock, q) = setup();
        send(&q, 1, Duration::from_secs(60)).await.unwrap();
        assert_eq!((q.len(&S), q.visible_len(&S), q.delayed_len(&S)), (1, 0, 1));
        assert!(q.receive(&S, 10).is_empty());
        clock.advance(Duration::from_secs(59));
        assert!(q.receive(&S, 10).is_empty());
        clock.advance(Duration::from_secs(1));
        let got = q.receive(&S, 10);
        assert_eq!(got.len(), 1);
        assert_eq!(attempt(&got[0].body), 1);
        assert_eq!(got[0].message_id, "m-1");
    }

    fn of(group: &str, n: u64) -> Outgoing {
        let Message::Start(mut start) = start(n) else { unreachable!() };
        start.group = Some(group.to_owned());
        Outgoing::now(S, Message::Start(start))
    }

    fn attempts(got: &[Delivery]) -> Vec<u64> {
        got.iter().map(|d| attempt(&d.body)).collect()
    }

    #[tokio::test]
    async fn a_group_holding_the_consumers_waits_behind_the_quiet_groups() {
        let (clock, q) = setup();
        let bulk: Vec<Outgoing> = (0..100).map(|n| of("bulk", n)).collect();
        q.send(&bulk).await.unwrap();
        // Consumers take 40 of the bulk and work on them.
        for _ in 0..4 {
            assert_eq!(q.receive(&S, 10).len(), 10);
        }
        clock.advance(Duration::from_secs(1));
        q.send(&[of("quiet-1", 1000), of("quiet-2", 2000), of("acme", 3000)]).await.unwrap();
        q.send(&[of("acme#priority", 4000)]).await.unwrap();
        let got = q.receive(&S, 10);
        assert_eq!(attempts(&got)[..4], [1000, 2000, 3000, 4000], "the quiet first");
        assert!(attempts(&got)[4..].iter().all(|n| *n < 100), "then the bulk");
        // Below its share in flight, and before it took the consumers' time, a group is served
        // in its turn.
        let (_, q) = setup();
        q.send(&(0..5).map(|n| of("bulk", n)).collect::<Vec<_>>()).await.unwrap();
        q.send(&[of("quiet", 1000)]).await.unwrap();
        assert_eq!(attempts(&q.receive(&S, 10)), [0, 1, 2, 3, 4, 1000]);
    }

    #[tokio::test]
    async fn a_group_that_took_the_consumers_time_lately_goes_after_the_others() {
        let (clock, q) = setup();
        // A bulk of slow messages, each taking its consumer 2 s; a quiet group's, 100 ms.
        for n in 0..10 {
            q.send(&[of("slow", n), of("quiet", 100 + n)]).await.unwrap();
            for _ in 0..2 {
                let d = q.receive(&S, 1).remove(0);
                let took = if attempt(&d.body) < 100 { 2000 } else { 100 };
                clock.advance(Duration::from_millis(took));
                q.delete(&S, &d.receipt).unwrap();
            }
        }
        q.send(&[of("slow", 50), of("slow", 51), of("quiet", 150)]).await.unwrap();
        assert_eq!(attempts(&q.receive(&S, 3)), [150, 50, 51]);
        // With one group only, nobody is its neighbour: in sending order.
        let (_, q) = setup();
        q.send(&[of("alone", 1), of("alone", 2)]).await.unwrap();
        assert_eq!(attempts(&q.receive(&S, 10)), [1, 2]);
    }

    #[tokio::test]
    async fn delays_above_15_minutes_and_oversized_bodies_are_rejected() {
        let (_, q) = setup();
        send(&q, 1, MAX_DELAY).await.unwrap();
        let err = send(&q, 2, MAX_DELAY + Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(err, Error::Rejected { .. }), "{err}");
        assert!(q.send_raw(&S, "x".repeat(MAX_BODY_BYTES + 1)).is_err());
        assert!(q.send_raw(&S, "x".repeat(MAX_BODY_BYTES)).is_ok());
        assert_eq!(q.sent_count(&S), 2);
    }

    #[tokio::test]
    async fn a_send_with_a_message_sqs_would_reject_sends_nothing() {
        let (_, q) = setup();
        let ok = Outgoing::now(S, start(1));
        let bad = Outgoing { delay: Duration::from_secs(901), ..ok.clone() };
        assert!(q.send(&[ok.clone(), bad, ok]).await.is_err());
        assert_eq!(q.sent_count(&S), 0);
    }

    #[tokio::test]
    async fn a_message_failing_alone_is_tried_again_alone() {
        let (_, q) = setup();
        let batch: Vec<Outgoing> = (1..=3).map(|n| Outgoing::now(S, start(n))).collect();
        q.fail_entry(1, ENTRY_TRIES - 1);
        q.send(&batch).await.unwrap();
        let sent: Vec<u64> = q.receive(&S, 10).iter().map(|d| attempt(&d.body)).collect();
        assert_eq!(sent, [1, 3, 2], "once each, the failed one after the others");

        q.fail_entry(1, ENTRY_TRIES);
        let err = q.send(&batch).await.unwrap_err();
        assert!(err.is_retryable(), "{err}");
        let sent: Vec<u64> = q.receive(&S, 10).iter().map(|d| attempt(&d.body)).collect();
        assert_eq!(sent, [1, 3]);
        q.send(&batch).await.unwrap();
        assert_eq!(q.visible_len(&S), 3, "the fault was spent");
    }

    #[tokio::test]
    async fn a_message_sent_again_is_known_by_the_first_ones_id() {
        let (_, q) = setup();
        send(&q, 1, Duration::ZERO).await.unwrap();
        let first = q.receive(&S, 1).pop().unwrap();
        assert_eq!(first.identity(), first.message_id);
        let again = Outgoing::again(S, start(1), Duration::ZERO, first.identity());
        q.send(&[again]).await.unwrap();
        q.delete(&S, &first.receipt).unwrap();
        let second = q.receive(&S, 1).pop().unwrap();
        assert_ne!(second.message_id, first.message_id);
        assert_eq!((second.identity(), second.receive_count), (first.message_id.as_str(), 1));
        // Sent again once more, it keeps the first id.
        q.send(&[Outgoing::again(S, start(1), Duration::ZERO, second.identity())]).await.unwrap();
        q.delete(&S, &second.receipt).unwrap();
        assert_eq!(q.receive(&S, 1).pop().unwrap().identity(), first.message_id);
    }

    #[tokio::test]
    async fn an_undeleted_message_comes_back_after_its_visibility_timeout() {
        let (clock, q) = setup();
        send(&q, 1, Duration::ZERO).await.unwrap();
        let first = q.receive(&S, 1);
        assert_eq!(first[0].receive_count, 1);
        assert_eq!((q.visible_len(&S), q.in_flight_len(&S)), (0, 1));
        clock.advance(Duration::from_secs(29));
        assert!(q.receive(&S, 1).is_empty());
        clock.advance(Duration::from_secs(1));
        let second = q.receive(&S, 1);
        assert_eq!(second[0].message_id, first[0].message_id);
        assert_eq!(second[0].receive_count, 2);
        assert_ne!(second[0].receipt, first[0].receipt);
    }

    #[tokio::test]
    async fn any_receipt_of_a_message_deletes_it() {
        let (clock, q) = setup();
        send(&q, 1, Duration::ZERO).await.unwrap();
        let stale = q.receive(&S, 1).remove(0).receipt;
        clock.advance(Duration::from_secs(30));
        let latest = q.receive(&S, 1).remove(0).receipt;
        assert!(q.delete(&S, "nonsense").is_err());
        assert!(q.delete(&Destination::Replies, &latest).is_err());
        assert!(q.change_visibility(&S, &stale, Duration::ZERO).is_err(), "only the latest");
        assert_eq!(q.len(&S), 1);
        // Superseded while another consumer holds the message, and still it deletes it.
        q.delete(&S, &stale).unwrap();
        assert!(q.is_empty(&S));
        let err = q.delete(&S, &latest).unwrap_err();
        assert!(matches!(err, Error::Rejected { .. }), "gone: {err}");
        assert_eq!(q.sent_count(&S), 1);
    }

    #[tokio::test]
    async fn a_message_received_too_often_is_redriven_to_the_dead_letters() {
        let (clock, q) = setup();
        q.configure(
            &S,
            QueueSettings {
                visibility_timeout: Duration::from_secs(10),
                max_receive_count: Some(3),
            },
        );
        send(&q, 1, Duration::ZERO).await.unwrap();
        for n in 1..=3 {
            let got = q.receive(&S, 10);
            assert_eq!(got[0].receive_count, n);
            clock.advance(Duration::from_secs(10));
        }
        assert!(q.receive(&S, 10).is_empty());
        assert!(q.is_empty(&S));
        let dead = q.dead_letters(&S);
        assert_eq!(dead.len(), 1);
        assert_eq!(attempt(&dead[0]), 1);
    }

    #[tokio::test]
    async fn without_a_redrive_policy_a_message_comes_back_forever() {
        let (clock, q) = setup();
        let settings = QueueSettings { max_receive_count: None, ..QueueSettings::default() };
        q.configure(&S, settings);
        send(&q, 1, Duration::ZERO).await.unwrap();
        for _ in 0..20 {
            assert_eq!(q.receive(&S, 1).len(), 1);
            clock.advance(settings.visibility_timeout);
        }
        assert!(q.dead_letters(&S).is_empty());
    }

    #[tokio::test]
    async fn malformed_bodies_travel_like_any_other() {
        let (_, q) = setup();
        let dest = Destination::Agent(AgentName::new("payments"));
        let id = q.send_raw(&dest, "{not json".into()).unwrap();
        let got = q.receive(&dest, 1);
        assert_eq!(got[0].message_id, id);
        assert_eq!(got[0].body, "{not json");
        assert!(q.receive(&S, 1).is_empty());
    }

    #[tokio::test]
    async fn change_visibility_extends_or_releases_a_message() {
        let (clock, q) = setup();
        send(&q, 1, Duration::ZERO).await.unwrap();
        let receipt = q.receive(&S, 1).remove(0).receipt;
        q.change_visibility(&S, &receipt, Duration::from_secs(120)).unwrap();
        clock.advance(Duration::from_secs(119));
        assert!(q.receive(&S, 1).is_empty());
        q.change_visibility(&S, &receipt, Duration::ZERO).unwrap();
        let again = q.receive(&S, 1).remove(0);
        assert_eq!(again.receive_count, 2);
        assert!(
            q.change_visibility(&S, &receipt, Duration::ZERO).is_err(),
            "a superseded receipt must not change visibility"
        );
        assert!(q.change_visibility(&S, &again.receipt, Duration::from_secs(13 * 3600)).is_err());
        assert_eq!(q.in_flight_len(&S), 1);
    }

    #[tokio::test]
    async fn messages_come_out_by_visibility_time_then_sending_order() {
        let (clock, q) = setup();
        send(&q, 1, Duration::from_secs(20)).await.unwrap();
        send(&q, 2, Duration::ZERO).await.unwrap();
        send(&q, 3, Duration::from_secs(10)).await.unwrap();
        send(&q, 4, Duration::ZERO).await.unwrap();
        clock.advance(Duration::from_secs(20));
        let order: Vec<u64> = q.receive(&S, 10).iter().map(|d| attempt(&d.body)).collect();
        assert_eq!(order, [2, 4, 3, 1]);
    }

    #[tokio::test]
    async fn a_receive_returns_at_most_ten() {
        let (_, q) = setup();
        let batch: Vec<Outgoing> = (0..25).map(|n| Outgoing::now(S, start(n))).collect();
        q.send(&batch).await.unwrap();
        assert_eq!(q.receive(&S, 100).len(), 10);
        assert_eq!(q.receive(&S, 3).len(), 3);
        assert_eq!(q.receive(&S, 0).len(), 0);
        assert_eq!((q.visible_len(&S), q.in_flight_len(&S)), (12, 13));
        assert_eq!(q.receive(&S, 10).len(), 10);
        assert_eq!(q.receive(&S, 10).len(), 2);
    }

    #[tokio::test]
    async fn injected_send_failures_send_nothing() {
        let (_, q) = setup();
        q.fail_next_sends(2);
        for _ in 0..2 {
            let err = send(&q, 1, Duration::ZERO).await.unwrap_err();
            assert!(err.is_retryable(), "{err}");
        }
        assert_eq!(q.sent_count(&S), 0);
        send(&q, 1, Duration::ZERO).await.unwrap();
        assert_eq!(q.sent_count(&S), 1);
    }

    #[test]
    fn queues_can_be_shared_between_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<MemoryQueues<ManualClock>>();
    }
}
