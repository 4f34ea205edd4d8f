//! An agent: performs one step (or undo) against its remote service, within its budget.
//!
//! It passes the step's idempotency key on every call, and retries transient faults with
//! backoff and full jitter. Its budget counts from when it takes the request, not from when the
//! request was sent: a request that waited in a backlog still gets its whole budget, so a slow
//! queue never makes the work fail. Once the budget is spent the agent stops and sends nothing,
//! not even an error; the supervisor finds the lease. A reply that arrives after the lease ran
//! out is still worth sending: the attempt it carries, not the clock, decides whether it counts.
//!
//! A guarded agent ([`Agent::guarded`]) asks its [`Guard`] before each call: while the call's
//! action (or the whole service) is held it does not call it (but for the guard's probes), and
//! answers `held` at once, naming what is held, so that the step waits for it without burning
//! its lease. Passing faults it meets are counted towards a hold of the action; once it is
//! held, it stops retrying and answers `held`. A refusal is the step's own failure, never a
//! sign that the service is down: it counts towards no hold.
//! A guarded agent whose service declares limits ([`Agent::limited`]) calls it only in its
//! turn; a request that cannot have its turn within its budget, or meets a service that asked
//! to be left alone for longer, is not called: the agent answers that the step is deferred
//! until there will be room, and the scheduler gives the step a lease that starts then (a
//! request sent back to the queue would come after every request sent meanwhile, and its old
//! lease could run out while it waits behind them). A throttled call is tried again once the
//! service's quiet is over, and does not count against the retries.
//!
//! An agent that keeps payloads ([`Agent::keeping`]) reads back the stored values a request
//! refers to before it calls its service, and stores an output too large to carry before it
//! replies ([`crate::payload`]); the service sees only whole values.

use std::time::Duration;

use tracing::{debug, info, warn};

use crate::error::Result;
use crate::ids::OrderId;
use crate::load::WaitReporter;
use crate::message::{
    ElementOutcome, ElementsRequest, MAX_DEFER, Message, StepOutcome, StepReply, StepRequest,
};
use crate::metrics;
use crate::mutants::{self, Mutant};
use crate::order::Order;
use crate::payload::{self, Kept, NoPayloads};
use crate::ports::{
    Clock, Destination, Incoming, Outbox, Outgoing, Payloads, Random, RemoteCall, RemoteFault,
    RemoteService, WaitGauge,
};
use crate::retry::RetryPolicy;
use crate::time::Timestamp;

use super::guard::{Admission, Guard, NoBook, Pass};
use crate::config::HoldPolicy;
use crate::pace::Limits;
use crate::ports::{Pace, ServiceBook};

/// How an agent finished with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentOutcome {
    /// A reply was sent: the action took effect (`done`), or was refused for good.
    Replied { done: bool, calls: u32 },
    /// The budget ran out (before the first call, or before an answer came): nothing was sent.
    Expired { calls: u32 },
    /// Transient faults used up the retries, or the next wait would end after the budget:
    /// nothing was sent; the supervisor will find the expired lease.
    GaveUp { calls: u32 },
    /// The service is held: the step was answered `held`, after `calls` calls (a probe, or
    /// the faults that made the hold).
    Held { calls: u32 },
    /// The service had no room for the call within the budget: the step was deferred to
    /// `until` (a `Deferred` reply).
    KeptBack { calls: u32, until: Timestamp },
}

/// An agent, over its ports.
#[derive(Debug)]
pub struct Agent<R, Q, C, X, W, G = NoBook, P = NoPayloads> {
    remote: R,
    outbox: Q,
    clock: C,
    random: X,
    retry: RetryPolicy,
    queue: Destination,
    waits: WaitReporter<W>,
    guard: Option<Guard<G, C>>,
    payloads: P,
}

impl<R: RemoteService, Q: Outbox, C: Clock, X: Random, W: WaitGauge> Agent<R, Q, C, X, W> {
    /// The agent that takes requests from `queue`, reporting how long they waited to `waits`.
    pub fn new(
        remote: R,
        outbox: Q,
        clock: C,
        random: X,
        retry: RetryPolicy,
        queue: Destination,
        waits: WaitReporter<W>,
    ) -> Self {
        Agent {
            remote,
            outbox,
            clock,
            random,
            retry,
            queue,
            waits,
            guard: None,
            payloads: NoPayloads,
        }
    }
}

impl<R, Q, C, X, W, G, P> Agent<R, Q, C, X, W, G, P> {
    /// The same agent, reading stored inputs from `payloads` and storing its large outputs
    /// there ([`crate::payload`]).
    pub fn keeping<K: Payloads>(self, payloads: K) -> Agent<R, Q, C, X, W, G, K> {
        let Agent { remote, outbox, clock, random, retry, queue, waits, guard, .. } = self;
        Agent { remote, outbox, clock, random, retry, queue, waits, guard, payloads }
    }

    /// The same agent, guarding `service` with its record in `book`.
    pub fn guarded<H: ServiceBook + Pace>(
        self,
        book: H,
        service: &str,
        policy: HoldPolicy,
    ) -> Agent<R, Q, C, X, W, H, P>
    where
        C: Clock + Clone,
    {
        let guard = Guard::new(book, self.clock.clone(), service, policy);
        let Agent { remote, outbox, clock, random, retry, queue, waits, payloads, .. } = self;
        Agent { remote, outbox, clock, random, retry, queue, waits, guard: Some(guard), payloads }
    }
}

impl<R, Q, C, X, W, G, P> Agent<R, Q, C, X, W, G, P>
where
    R: RemoteService,
    Q: Outbox,
    C: Clock,
    X: Random,
    W: WaitGauge,
    G: ServiceBook + Pace,
    P: Payloads,
{
    /// The same agent, keeping its guarded service within `limits` (an agent without a guard
    /// has no shared tally to keep them with, and is left as it is).
    pub fn limited(self, limits: Limits) -> Self {
        let guard = self.guard.map(|g| g.limited(limits));
        Agent { guard, ..self }
    }

    /// The outbox replies are sent through (a batch consumer may gather them).
    pub fn outbox(&self) -> &Q {
        &self.outbox
    }

    /// The queue it takes its requests from.
    pub fn queue(&self) -> &Destination {
        &self.queue
    }

    /// Performs the request. An `Err` (the reply could not be sent) should make the request
    /// come back: calling the service again with the same key is harmless.
    pub async fn handle(
        &self,
        request: &StepRequest,
        incoming: Incoming<'_>,
    ) -> Result<AgentOutcome> {
        let taken = self.clock.now();
        let deadline = deadline(request.budget_ms, request.complete_by, taken);
        self.waits
            .observe(&self.queue, request.due_at, incoming, taken, taken.until(deadline))
            .await;
        match self.perform(request, deadline).await? {
            Performed::Answer { outcome, calls } => {
                let Some(settled) = self.settle(request, deadline, &outcome, calls) else {
                    return Ok(AgentOutcome::Expired { calls });
                };
                let reply = StepReply {
                    order_id: request.order_id,
                    attempt: request.attempt,
                    correlation_id: request.correlation_id.clone(),
                    step: request.step.clone(),
                    complete_by: request.complete_by,
                    idempotency_key: request.idempotency_key.clone(),
                    outcome,
                    due_at: Some(self.clock.now()),
                    group: request.group.clone(),
                };
                let reply = Outgoing::now(Destination::Replies, Message::Reply(reply));
                self.outbox.send(&[reply]).await?;
                Ok(settled)
            }
            Performed::Silent(outcome) => Ok(outcome),
        }
    }

    /// Performs the calls of the elements `request` carries, side by side, each as its child
    /// order's step would be (under its own keys, guard and turns), and answers those that have
    /// an answer in one reply. What became of each, by element. An `Err` (a call's stored
    /// value could not be read or kept now, or the reply could not be sent) should make the
    /// request come back: every call is made again under its key, which is harmless.
    pub async fn handle_elements(
        &self,
        request: &ElementsRequest,
        incoming: Incoming<'_>,
    ) -> Result<Vec<(u32, AgentOutcome)>> {
        let taken = self.clock.now();
        let deadline = deadline(request.budget_ms, request.complete_by, taken);
        self.waits
            .observe(&self.queue, request.due_at, incoming, taken, taken.until(deadline))
            .await;
        let requests: Vec<StepRequest> =
            request.elements.iter().map(|call| request.request_of(call)).collect();
        let performed =
            futures_util::future::join_all(requests.iter().map(|r| self.perform(r, deadline)))
                .await;
        let mut answers = Vec::new();
        let mut ended = Vec::with_capacity(requests.len());
        for (element, performed) in requests.iter().zip(performed) {
            let k = element.step.element.unwrap_or_default();
            match performed? {
                Performed::Answer { outcome, calls } => {
                    match self.settle(element, deadline, &outcome, calls) {
                        Some(settled) => {
                            ended.push((k, settled));
                            answers.push(ElementOutcome { element: k, outcome });
                        }
                        None => ended.push((k, AgentOutcome::Expired { calls })),
                    }
                }
                Performed::Silent(outcome) => ended.push((k, outcome)),
            }
        }
        if !answers.is_empty() {
            let reply = request.reply(answers, self.clock.now());
            let reply = Outgoing::now(Destination::Replies, Message::ElementsReply(reply));
            self.outbox.send(&[reply]).await?;
        }
        Ok(ended)
    }

    /// Calls the service for `request` until it answers, or the step is held, kept back, or
    /// out of time or retries.
    async fn perform(&self, request: &StepRequest, deadline: Timestamp) -> Result<Performed> {
        let call = match self.call_for(request, deadline).await {
            Ok(call) => call,
            // A value the step needs can never be read back (gone with its retention, or not
            // the one written): its service is not called, and the step fails at once with
            // that cause, rather than leave its lease to run out again and again.
            Err(e) if !e.is_retryable() => {
                let why = payload::unreadable(&e);
                warn!(order_id = %request.order_id, %why, "a stored value the step needs cannot be read");
                let outcome =
                    StepOutcome::failed(&format!("a value it needs is unreadable: {why}"));
                return Ok(Performed::Answer { outcome, calls: 0 });
            }
            Err(e) => return Err(e),
        };
        let mut calls = 0;
        // The last passing fault that counts towards a hold, if every call so far met one.
        let mut last_fault: Option<String> = None;
        loop {
            if self.clock.now() >= deadline {
                if let Some(outcome) =
                    self.held_at_last(request, &call, last_fault.as_deref()).await
                {
                    return Ok(Performed::Answer { outcome, calls });
                }
                info!(order_id = %request.order_id, calls, "budget spent before the call: dropped");
                metrics::agent_finished("expired");
                return Ok(Performed::Silent(AgentOutcome::Expired { calls }));
            }
            // `probe`: the hold this call probes (`Some(None)`: the whole service's).
            let (probe, pass) = match self.admit(&call.action, deadline, request.resumed).await {
                Admission::Call(pass) => (None, pass),
                Admission::Probe { pass, on } => (Some(on), pass),
                Admission::Held(_) if mutants::on(Mutant::HeldAgentCallsService) => {
                    (None, Pass::default())
                }
                Admission::Held(holding) => {
                    let outcome = StepOutcome::held(&holding.reason, holding.on.as_deref());
                    return Ok(Performed::Answer { outcome, calls });
                }
                Admission::Busy { until } => {
                    return Ok(self.keep_back(request, until, calls));
                }
            };
            calls += 1;
            let started = self.clock.now();
            let answer = self.remote.call(&call).await;
            let took = started.until(self.clock.now());
            self.done(pass).await;
            let probe = probe.as_ref().map(Option::as_deref);
            let (fault, throttled) = match answer {
                Ok(output) => {
                    metrics::remote_call("ok", took);
                    self.answered(&call.action, probe).await;
                    let outcome = self.outcome_of(request.order_id, output).await?;
                    return Ok(Performed::Answer { outcome, calls });
                }
                Err(RemoteFault::Permanent(reason))
                    if mutants::on(Mutant::RefusalCountsTowardsHold) =>
                {
                    (reason, None)
                }
                Err(RemoteFault::Permanent(reason)) => {
                    metrics::remote_call("refused", took);
                    // The cause the order keeps, said where the agent's operators look too: a
                    // grant missing is read here first.
                    info!(action = %call.action, %reason, "the service refused the call: the step fails");
                    self.answered(&call.action, probe).await;
                    let outcome = StepOutcome::failed(&reason);
                    return Ok(Performed::Answer { outcome, calls });
                }
                Err(RemoteFault::Transient(reason)) => {
                    metrics::remote_call("transient", took);
                    (reason, None)
                }
                Err(RemoteFault::Throttled { reason, retry_after }) => {
                    metrics::remote_call("throttled", took);
                    (reason, Some(retry_after))
                }
            };
            if let Some(guard) = &self.guard {
                let counts = match throttled {
                    Some(retry_after) => guard.throttled(retry_after).await,
                    None => true,
                };
                if counts {
                    last_fault = Some(fault.clone());
                }
                if let Some(holding) = guard.fault(&call.action, &fault, counts, probe).await {
                    // Held (or still held, its probe failed): the step waits for it.
                    let outcome = StepOutcome::held(&fault, holding.on.as_deref());
                    return Ok(Performed::Answer { outcome, calls });
                }
                if throttled.is_some() {
                    // The next admission waits out the quiet the service asked for.
                    continue;
                }
            }
            let spent = calls >= self.retry.max_calls;
            // An unguarded agent waits out a throttle itself.
            let backoff = self.retry.delay(calls, self.random.unit());
            let delay = throttled.flatten().map_or(backoff, |after| after.max(backoff));
            if spent || self.clock.now().plus(delay) >= deadline {
                if let Some(outcome) =
                    self.held_at_last(request, &call, last_fault.as_deref()).await
                {
                    return Ok(Performed::Answer { outcome, calls });
                }
            }
            if spent {
                warn!(order_id = %request.order_id, calls, %fault, "retries exhausted");
                metrics::agent_finished("gave_up");
                return Ok(Performed::Silent(AgentOutcome::GaveUp { calls }));
            }
            if self.clock.now().plus(delay) >= deadline {
                info!(order_id = %request.order_id, calls, %fault, "no time left for another try");
                metrics::agent_finished("gave_up");
                return Ok(Performed::Silent(AgentOutcome::GaveUp { calls }));
            }
            debug!(order_id = %request.order_id, calls, ?delay, %fault, "transient fault, retrying");
            self.clock.sleep(delay).await;
        }
    }

    /// A step's last lease that ends with every call met by a passing fault (the last:
    /// `last_fault`) is held rather than left to fail the order: the outcome to reply, if its
    /// action is held now.
    async fn held_at_last(
        &self,
        request: &StepRequest,
        call: &RemoteCall,
        last_fault: Option<&str>,
    ) -> Option<StepOutcome> {
        let (Some(guard), Some(fault)) = (&self.guard, last_fault) else { return None };
        if !request.last_lease {
            return None;
        }
        let holding = guard.hold_at_last(&call.action, fault).await?;
        Some(StepOutcome::held(fault, holding.on.as_deref()))
    }

    /// The call `request` asks for, with every stored value it carries read back.
    async fn call_for(&self, request: &StepRequest, deadline: Timestamp) -> Result<RemoteCall> {
        let id = request.order_id;
        let order = Order(self.whole(id, request.order.input()).await?);
        let input = match &request.input {
            Some(value) => Some(self.whole(id, value).await?),
            None => None,
        };
        let mut outputs = request.outputs.clone();
        for value in outputs.values_mut() {
            *value = self.whole(id, value).await?;
        }
        Ok(RemoteCall {
            order_id: id,
            action: request.action.clone(),
            direction: request.step.direction,
            idempotency_key: request.idempotency_key.clone(),
            order,
            input,
            outputs,
            deadline,
        })
    }

    /// The value `value` of order `id` stands for, read back if it is stored.
    async fn whole(&self, id: OrderId, value: &serde_json::Value) -> Result<serde_json::Value> {
        if mutants::on(Mutant::StoredValuesUnread) {
            return Ok(value.clone());
        }
        payload::resolve(&self.payloads, id, value).await
    }

    /// The outcome of a call that answered `output`: carried as it is, stored and referred
    /// to, or too large. A store that cannot take it now fails the request, which comes back:
    /// the call is made again under the same key, and the service answers it again.
    async fn outcome_of(
        &self,
        order_id: OrderId,
        output: serde_json::Value,
    ) -> Result<StepOutcome> {
        Ok(match payload::keep_output(&self.payloads, order_id, output).await? {
            Kept::Inline(output) | Kept::Stored(output) => StepOutcome::Done { output },
            Kept::TooLarge { bytes } => StepOutcome::TooLarge { bytes },
        })
    }

    async fn admit(&self, action: &str, deadline: Timestamp, resumed: bool) -> Admission {
        match &self.guard {
            Some(guard) => guard.admit(action, deadline, resumed).await,
            None => Admission::Call(Pass::default()),
        }
    }

    async fn done(&self, pass: Pass) {
        if let Some(guard) = &self.guard {
            guard.done(pass).await;
        }
    }

    /// Tells the scheduler that `request`'s service has no room for it before `until`: the
    /// step goes again then, at a lease that starts then, so that nothing counts against it
    /// however long the service's room takes to come.
    fn keep_back(&self, request: &StepRequest, until: Timestamp, calls: u32) -> Performed {
        let now = self.clock.now();
        let until = until.max(now.plus(Duration::from_secs(1))).min(now.plus(MAX_DEFER));
        info!(order_id = %request.order_id, delay_s = now.until(until).as_secs(), "no room at the service within the budget: deferred");
        Performed::Answer { outcome: StepOutcome::Deferred { until }, calls }
    }

    async fn answered(&self, action: &str, probe: Option<Option<&str>>) {
        if let Some(guard) = &self.guard {
            guard.answered(action, probe).await;
        }
    }

    /// What answering `outcome` to `request` makes of it, or `None` if the answer outlived
    /// the budget and is not sent: the supervisor treats the step as silent, and the next
    /// attempt gets the recorded answer under the same key.
    fn settle(
        &self,
        request: &StepRequest,
        deadline: Timestamp,
        outcome: &StepOutcome,
        calls: u32,
    ) -> Option<AgentOutcome> {
        if self.clock.now() >= deadline {
            info!(order_id = %request.order_id, calls, "answer after the budget: not sent");
            metrics::agent_finished("expired");
            return None;
        }
        let done = match outcome {
            StepOutcome::Done { .. } => true,
            StepOutcome::TooLarge { bytes } => {
                warn!(order_id = %request.order_id, bytes, "the service's answer is too large to carry");
                true
            }
            StepOutcome::Failed { .. } => false,
            StepOutcome::Deferred { until } => {
                metrics::agent_finished("kept_back");
                return Some(AgentOutcome::KeptBack { calls, until: *until });
            }
            StepOutcome::Held { .. } => {
                metrics::agent_finished("held");
                return Some(AgentOutcome::Held { calls });
            }
        };
        metrics::agent_finished("replied");
        Some(AgentOutcome::Replied { done, calls })
    }
}

/// What became of a request's calls: an answer to send, or nothing to send.
enum Performed {
    Answer { outcome: StepOutcome, calls: u32 },
    Silent(AgentOutcome),
}

/// When the agent must be done with a request taken at `taken`: its budget from then, or, for
/// a request from an older scheduler that carries none, its CompleteBy.
fn deadline(budget_ms: Option<u64>, complete_by: Timestamp, taken: Timestamp) -> Timestamp {
    if mutants::on(Mutant::AgentDeadlineFromCompleteBy) {
        return complete_by;
    }
    budget_ms.map_or(complete_by, |ms| taken.plus(Duration::from_millis(ms)))
}
