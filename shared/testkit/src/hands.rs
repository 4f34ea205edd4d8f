//! What the people and the plumbing around a system do to it while it runs, shared by every
//! simulation: the dice of a run's faults, the pump that hands each consumer its messages as
//! the deployed functions get them, an operator's commands, and an operator holding a service
//! by hand and releasing it.

use sas_engine::machine::Answer;
use sas_engine::memory::{Delivery, ManualClock, MemoryServiceBook, MemoryStore, SplitMix};
use sas_engine::message::Message;
use sas_engine::services::{Answering, DeskRefusal, ServiceDesk, SweepReport};
use sas_engine::state::{CommandKind, ProcessState};
use std::sync::Arc;
use std::time::Duration;

/// The operators' desk of a run on in-memory ports.
pub type Desk = ServiceDesk<Arc<MemoryServiceBook>, Arc<MemoryStore<ManualClock>>, ManualClock>;

/// A draw from 0 to `n` (excluded) off `rng`.
pub fn pick(rng: &SplitMix, n: usize) -> usize {
    ((rng.unit() * n as f64) as usize).min(n.saturating_sub(1))
}

/// A run's draws of faults: each kind switched on is injected with its probability, while
/// the faults are `on`; a kind switched off is still drawn, so that switching one kind off
/// leaves the others' schedule alone. Every fault injected is noted, for the run to count.
#[derive(Debug)]
pub struct Dice<'a> {
    pub rng: &'a SplitMix,
    pub faults: crate::Faults,
    pub on: bool,
    pub drawn: Vec<crate::Fault>,
}

impl Dice<'_> {
    /// Whether to inject `fault` now, with probability `p`.
    pub fn chance(&mut self, fault: crate::Fault, p: f64) -> bool {
        let hit = self.on && self.rng.unit() < p && self.faults.on(fault);
        if hit {
            self.drawn.push(fault);
        }
        hit
    }

    /// A draw from 0 to `n` (excluded).
    pub fn pick(&self, n: usize) -> usize {
        pick(self.rng, n)
    }
}

/// An operator holds a service by hand (a maintenance window), or one action of it, or, when
/// something is held, releases a hold made by hand or, by a coin's toss, the agent's own;
/// every choice drawn from `rng`. A refusal (held already, the same way) changes nothing; an
/// action the desk does not know, or the desk failing, is an error.
pub async fn hold_by_hand(
    desk: &Desk,
    clock: &ManualClock,
    rng: &SplitMix,
    services: &[String],
) -> Result<(), String> {
    // A person's hand: never within the millisecond of the change before, as a hold's alert
    // is named by the millisecond it began.
    clock.advance(Duration::from_millis(1 + pick(rng, 1000) as u64));
    let target = services[pick(rng, services.len())].clone();
    let coin = pick(rng, 2) == 0;
    let one_action = pick(rng, 3) == 0;
    let records = desk.book.records();
    let by_hand = records.iter().find_map(|r| {
        let (on, _) = r.holds().find(|(_, h)| h.by.is_some())?;
        Some((r.service.clone(), on.map(str::to_owned)))
    });
    let agents =
        records.iter().any(|r| r.service == target && r.holds().any(|(_, h)| h.by.is_none()));
    let release = match by_hand {
        Some(held) => Some(held),
        None if agents && coin => Some((target.clone(), None)),
        None => None,
    };
    let done = match &release {
        Some((service, on)) => {
            desk.release(service, on.as_deref(), "sim-operator", "maintenance over").await
        }
        None => {
            // The actions deployed so far: the desk refuses a version's before its deploy.
            let actions: Vec<String> =
                desk.actions.get(&target).into_iter().flatten().cloned().collect();
            let action = (one_action && !actions.is_empty())
                .then(|| actions[pick(rng, actions.len())].clone());
            desk.hold(&target, action.as_deref(), "sim-operator", "maintenance window").await
        }
    };
    match done {
        Err(e) => Err(format!("the desk failed on {target}: {e}")),
        Ok(Err(refused @ DeskRefusal::UnknownAction { .. })) => {
            Err(format!("the desk refused a hold: {refused}"))
        }
        Ok(_) => Ok(()),
    }
}

/// Once the faults stop, the operator releases every hold made by hand.
pub async fn release_by_hand(desk: &Desk) -> Result<(), String> {
    for record in desk.book.records() {
        // The whole service released releases its actions with it.
        let held: Vec<Option<String>> = match &record.whole.held {
            Some(hold) if hold.by.is_some() => vec![None],
            _ => record
                .holds()
                .filter(|(_, h)| h.by.is_some())
                .map(|(on, _)| on.map(str::to_owned))
                .collect(),
        };
        for on in held {
            let why = "the faults stopped";
            let released = desk.release(&record.service, on.as_deref(), "sim-operator", why).await;
            if !matches!(released, Ok(Ok(_))) {
                let held = sas_engine::health::hold_key(&record.service, on.as_deref());
                return Err(format!("{held} not released: {released:?}"));
            }
        }
    }
    Ok(())
}

/// Whether a supervisor that swept so resumes held orders, as the deployed one decides: only
/// while the queues flow.
pub fn flowing(swept: &sas_engine::Result<SweepReport>) -> bool {
    matches!(swept, Ok(report) if report.stalled.is_none())
}

/// The positions in `batch` of the scheduler's messages about the order of its first one (the
/// replies and children's ends a turn folds), if there are two or more.
pub fn one_order(batch: &[Delivery]) -> Vec<usize> {
    let messages: Vec<Option<Message>> =
        batch.iter().map(|d| Message::decode(&d.body).ok()).collect();
    let foldable =
        |m: &Option<Message>| matches!(m, Some(Message::Reply(_) | Message::ChildEnded(_)));
    let Some(order) = messages.first().filter(|m| foldable(m)).and_then(|m| m.as_ref()?.order_id())
    else {
        return Vec::new();
    };
    let same: Vec<usize> = (0..batch.len())
        .filter(|&k| {
            foldable(&messages[k])
                && messages[k].as_ref().and_then(Message::order_id) == Some(order)
        })
        .collect();
    if same.len() > 1 { same } else { Vec::new() }
}

/// What the pump took of a queue's batch for its consumer, as a deployed one gets them.
#[derive(Debug)]
pub enum Taken {
    /// One order's replies, folded into one turn of the scheduler.
    Turn(Vec<Delivery>),
    /// A few messages handled side by side, as one batch of replies or of an agent's requests.
    Together(Vec<Delivery>),
    /// One message, maybe not the first visible; `duplicated` when a second copy was sent.
    One { delivery: Delivery, duplicated: bool },
    /// A message deleted instead of handled.
    Lost,
}

/// Takes from `batch`, received from `dest`, what its consumer handles now, with the faults
/// `dice` draw (each kind with its probability, in a fixed order, so that a seed replays):
/// one order's replies folded into a turn; replies, or (where `agent_batches`) an agent's
/// requests, side by side; one message taken out of order, the others put back or, delayed,
/// left hidden until their visibility timeout; the message lost or sent twice. An event on
/// the scheduler queue has no record but its queue, which keeps it until its consumer is done
/// with it: no event is lost.
pub fn take(
    queues: &sas_engine::memory::MemoryQueues<ManualClock>,
    dest: &sas_engine::ports::Destination,
    mut batch: Vec<Delivery>,
    agent_batches: bool,
    dice: &mut Dice,
) -> Taken {
    use crate::Fault;
    use sas_engine::ports::Destination;
    let of_one_order = one_order(&batch);
    if of_one_order.len() > 1 && dice.chance(Fault::Folded, 0.5) {
        let mut taken = Vec::new();
        for (k, d) in batch.into_iter().enumerate() {
            if of_one_order.contains(&k) {
                taken.push(d);
            } else {
                let _ = queues.put_back(dest, &d.receipt);
            }
        }
        return Taken::Turn(taken);
    }
    let side_by_side = match dest {
        Destination::Replies => Some(Fault::Batched),
        Destination::Agent(_) if agent_batches => Some(Fault::AgentBatch),
        _ => None,
    };
    if let Some(kind) = side_by_side.filter(|_| batch.len() > 1)
        && dice.chance(kind, 0.3)
    {
        let taken: Vec<Delivery> = batch.drain(..batch.len().min(3)).collect();
        for other in &batch {
            let _ = queues.put_back(dest, &other.receipt);
        }
        return Taken::Together(taken);
    }
    // Reordering: take any of the visible messages. The others are put back uncounted, as if
    // only the one taken had been received (a Lambda handles its whole batch), or, delayed,
    // stay hidden until their visibility timeout, a receive that counts.
    let chosen = if batch.len() > 1 && dice.chance(Fault::Reordered, 0.3) {
        dice.pick(batch.len())
    } else {
        0
    };
    let d = batch.swap_remove(chosen);
    for other in &batch {
        if !dice.chance(Fault::Delayed, 0.5) {
            let _ = queues.put_back(dest, &other.receipt);
        }
    }
    let event = d.body.contains("\"detail-type\"");
    if !event && dice.chance(Fault::Lost, 0.04) {
        let _ = queues.delete(dest, &d.receipt);
        return Taken::Lost;
    }
    let duplicated = dice.chance(Fault::Duplicated, 0.05);
    if duplicated {
        let _ = queues.send_raw(dest, d.body.clone());
    }
    Taken::One { delivery: d, duplicated }
}

/// The operators' commands of a run: what each is, and its id, new or sent before.
#[derive(Debug, Default)]
pub struct Operators {
    /// Command ids handed out so far, and the last command sent for each order.
    sent: u64,
    last: std::collections::HashMap<sas_engine::OrderId, (CommandKind, String)>,
}

impl Operators {
    /// A command on order `id`, in `state` (with whether an undo of it failed): mostly what
    /// the state calls for (redrive an order in error, or its compensation; resume one paused;
    /// cancel or pause one in flight; undo one processed), sometimes anything at all, and now
    /// and then the last command sent for the order, again (a tool retrying a call it is
    /// unsure went through); every choice drawn from `rng`.
    pub fn choose(
        &mut self,
        id: sas_engine::OrderId,
        state: Option<(ProcessState, bool)>,
        rng: &SplitMix,
    ) -> (CommandKind, String) {
        let fitting = match state {
            Some((ProcessState::Error, true)) => Some(CommandKind::RedriveCompensation),
            Some((ProcessState::Error, false)) => Some(CommandKind::Redrive),
            Some((ProcessState::Paused, _)) => Some(CommandKind::Resume),
            Some((ProcessState::Pending | ProcessState::Processing, _)) => {
                Some(if pick(rng, 2) == 0 { CommandKind::Cancel } else { CommandKind::Pause })
            }
            Some((ProcessState::Processed, _)) => Some(CommandKind::Undo),
            _ => None,
        };
        let anything = CommandKind::ALL[pick(rng, CommandKind::ALL.len())];
        let fresh = match fitting {
            Some(kind) if pick(rng, 4) != 0 => kind,
            _ => anything,
        };
        let repeat = pick(rng, 4) == 0;
        let (kind, command_id) = match self.last.get(&id) {
            Some(earlier) if repeat => earlier.clone(),
            _ => (fresh, self.next_id()),
        };
        self.last.insert(id, (kind, command_id.clone()));
        (kind, command_id)
    }

    /// A new command's id.
    pub fn next_id(&mut self) -> String {
        self.sent += 1;
        format!("op-{}", self.sent)
    }
}

/// The answer of the party outside to a step `announced` as waiting for it, while the faults
/// run: mostly with the announcement's token (an old one, for a step announced again since),
/// sometimes with a forged one, sometimes as an operator, without one; mostly completing the
/// step with `output`, sometimes refusing it or keeping it alive. Returns the order, the step,
/// the token given and the answer; `None` for an announcement that is not one.
pub fn answer_to(
    announced: &serde_json::Value,
    rng: &SplitMix,
    output: serde_json::Value,
) -> Option<(sas_engine::OrderId, String, Option<String>, Answering)> {
    let id = announced["order_id"].as_str()?.parse().ok()?;
    let step = announced["step"].as_str()?.to_owned();
    let forged = "f".repeat(40);
    let token = match pick(rng, 10) {
        0 => Some(forged.as_str()),
        1 => None,
        _ => announced["token"].as_str(),
    };
    let answer = match pick(rng, 6) {
        0 => Answer::Refuse,
        1 => Answer::Heartbeat,
        _ => Answer::Complete { output },
    };
    let answering = Answering::new(&step, token, answer, "sim-party", "simulated").ok()?;
    Some((id, step, token.map(str::to_owned), answering))
}

/// An answer to `step` with `token` that was taken must have found the step waiting, in an
/// order in flight (`before` it), under that very token: no stale, repeated or forged answer
/// is applied.
pub fn check_answer_taken(
    before: &sas_engine::state::StateRecord,
    step: &str,
    token: Option<&str>,
) -> Result<(), String> {
    let id = before.order_id;
    let waiting = before.steps.iter().find(|s| s.name == step);
    let Some(waiting) =
        waiting.filter(|w| before.process_state.is_in_flight() && w.sent().is_some())
    else {
        return Err(format!("{id} took an answer for {step}, which did not wait for one"));
    };
    match token {
        Some(token) if waiting.token.as_deref() != Some(token) => {
            Err(format!("{id} took an answer for {step} with another token"))
        }
        _ => Ok(()),
    }
}

/// The messages of `taken`, each with how it came, as a consumer's turn takes them.
pub fn incoming<'a>(
    taken: &'a [Delivery],
    messages: &[Message],
) -> Vec<(Message, sas_engine::ports::Incoming<'a>)> {
    taken
        .iter()
        .zip(messages)
        .map(|(d, m)| {
            let incoming = sas_engine::ports::Incoming {
                message_id: d.identity(),
                receive_count: d.receive_count,
            };
            (m.clone(), incoming)
        })
        .collect()
}
