//! An agent: performs one step (or undo) against its remote service, within the lease.
//!
//! It passes the step's idempotency key on every call, retries transient faults with backoff
//! and full jitter, and never works past CompleteBy: once the lease is over, another attempt may
//! already be running, so the agent stops and sends nothing, not even an error.

use tracing::{debug, info, warn};

use crate::error::Result;
use crate::message::{Message, StepOutcome, StepReply, StepRequest};
use crate::ports::{
    Clock, Destination, Outbox, Outgoing, Random, RemoteCall, RemoteFault, RemoteService,
};
use crate::retry::RetryPolicy;

/// How an agent finished with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentOutcome {
    /// A reply was sent: the action took effect (`done`), or was refused for good.
    Replied { done: bool, calls: u32 },
    /// CompleteBy passed (before the first call, or before an answer came): nothing was sent.
    Expired { calls: u32 },
    /// Transient faults used up the retries, or the next wait would end after CompleteBy:
    /// nothing was sent; the supervisor will find the expired lease.
    GaveUp { calls: u32 },
}

/// An agent, over its ports.
#[derive(Debug)]
pub struct Agent<R, Q, C, X> {
    remote: R,
    outbox: Q,
    clock: C,
    random: X,
    retry: RetryPolicy,
}

impl<R: RemoteService, Q: Outbox, C: Clock, X: Random> Agent<R, Q, C, X> {
    pub fn new(remote: R, outbox: Q, clock: C, random: X, retry: RetryPolicy) -> Self {
        Agent { remote, outbox, clock, random, retry }
    }

    /// The outbox replies are sent through (a batch consumer may gather them).
    pub fn outbox(&self) -> &Q {
        &self.outbox
    }

    /// Performs the request. An `Err` (the reply could not be sent) should make the request
    /// come back: calling the service again with the same key is harmless.
    pub async fn handle(&self, request: &StepRequest) -> Result<AgentOutcome> {
        let call = RemoteCall {
            order_id: request.order_id,
            action: request.action.clone(),
            direction: request.step.direction,
            idempotency_key: request.idempotency_key.clone(),
            order: request.order.clone(),
            input: request.input.clone(),
            deadline: request.complete_by,
        };
        let mut calls = 0;
        loop {
            if self.clock.now() >= request.complete_by {
                info!(order_id = %request.order_id, calls, "lease over before the call: dropped");
                return Ok(AgentOutcome::Expired { calls });
            }
            calls += 1;
            let fault = match self.remote.call(&call).await {
                Ok(output) => return self.reply(request, StepOutcome::done(output), calls).await,
                Err(RemoteFault::Permanent(reason)) => {
                    return self.reply(request, StepOutcome::failed(&reason), calls).await;
                }
                Err(RemoteFault::Transient(reason)) => reason,
            };
            if calls >= self.retry.max_calls {
                warn!(order_id = %request.order_id, calls, %fault, "retries exhausted");
                return Ok(AgentOutcome::GaveUp { calls });
            }
            let delay = self.retry.delay(calls, self.random.unit());
            if self.clock.now().plus(delay) >= request.complete_by {
                info!(order_id = %request.order_id, calls, %fault, "no time left for another try");
                return Ok(AgentOutcome::GaveUp { calls });
            }
            debug!(order_id = %request.order_id, calls, ?delay, %fault, "transient fault, retrying");
            self.clock.sleep(delay).await;
        }
    }

    async fn reply(
        &self,
        request: &StepRequest,
        outcome: StepOutcome,
        calls: u32,
    ) -> Result<AgentOutcome> {
        if self.clock.now() >= request.complete_by {
            // The answer came too late to matter: the scheduler has moved on or will.
            info!(order_id = %request.order_id, calls, "answer after CompleteBy: not sent");
            return Ok(AgentOutcome::Expired { calls });
        }
        let done = matches!(outcome, StepOutcome::Done { .. });
        let reply = StepReply {
            order_id: request.order_id,
            attempt: request.attempt,
            correlation_id: request.correlation_id.clone(),
            step: request.step.clone(),
            complete_by: request.complete_by,
            idempotency_key: request.idempotency_key.clone(),
            outcome,
        };
        self.outbox.send(&[Outgoing::now(Destination::Replies, Message::Reply(reply))]).await?;
        Ok(AgentOutcome::Replied { done, calls })
    }
}
