//! Leases: a start message claiming what is queued, dispatch to agents and the announcement
//! of callbacks, waits and their wake, and the supervisor's expiry judging each lease.

use super::*;
use crate::message::MAX_DELIVERY_DELAY;

/// A start message: every step queued at its attempt is leased and dispatched, and a wait
/// whose time has come is over.
pub(super) fn claim(
    record: &StateRecord,
    attempt: u64,
    owner: &str,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let queued: Vec<(usize, Lease)> = record
        .leased()
        .filter(|(_, _, l)| !l.sent && !l.held && l.attempt == attempt)
        .map(|(i, _, l)| (i, *l))
        .collect();
    if queued.is_empty() {
        return timed_out(record, attempt, message, ctx);
    }
    if queued.iter().all(|(_, l)| l.timer && l.complete_by > ctx.now) {
        // A wait's start message came before its time (clocks differ a little): the
        // supervisor wakes it if nothing else does.
        return Decision::Ignore(Ignored::NotExpired { complete_by: record.complete_by });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    next.locked_by = Some(owner.to_owned());
    let mut effects = if record.process_state == ProcessState::Pending {
        status(ctx, StatusKind::Processing, None)
    } else {
        Vec::new()
    };
    for (i, lease) in queued {
        if lease.timer {
            if lease.complete_by <= ctx.now {
                wake(&mut next, i, ctx, &mut effects);
            }
            continue;
        }
        let Some(budget) = budget_of(&next.steps[i], ctx) else {
            return unknown_step(&next.steps[i]);
        };
        // A deadline that still leaves the step its whole budget is kept: the lease is as
        // long as promised, and the expiry index entry is not rewritten (an index key change
        // costs two index writes).
        let fresh = ctx.now.plus(budget);
        dispatch(&mut next, i, lease.complete_by.max(fresh), ctx, &mut effects);
        let name = next.steps[i].name.clone();
        next.note(ctx.now, Happening::Claimed, Some(name), ctx.config.timeline_limit);
    }
    proceed(next, effects, ctx, Via::Lease)
}

/// A start message no queued lease holds: the end of the callback waiting at its attempt, if
/// one is, judged as its expiry would be (so that a timeout of minutes acts within seconds of
/// its end, not at the next sweep); otherwise stale.
pub(super) fn timed_out(
    record: &StateRecord,
    attempt: u64,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let callback =
        record.leased().find(|(_, s, l)| l.sent && l.attempt == attempt && awaits_callback(ctx, s));
    let Some((i, _, lease)) = callback else {
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    };
    if lease.complete_by > ctx.now {
        return Decision::Ignore(Ignored::NotExpired { complete_by: Some(lease.complete_by) });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    let mut effects = Vec::new();
    judge(&mut next, i, ctx, &mut effects);
    proceed(next, effects, ctx, Via::KICK)
}

/// The start message that ends a callback's wait at the end of `lease`, if SQS can delay a
/// message that long; a longer wait ends at the supervisor's sweep.
pub(super) fn callback_end(lease: &Lease, ctx: &Ctx<'_>) -> Option<Effect> {
    let delay = ctx.now.until(lease.complete_by);
    (delay <= MAX_DELIVERY_DELAY).then_some(Effect::Kick { delay, attempt: lease.attempt })
}

/// The wait of step `i` is over: the step is done.
pub(super) fn wake(next: &mut StateRecord, i: usize, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let name = next.steps[i].name.clone();
    next.steps[i].lease = None;
    next.steps[i].status = StepStatus::Done;
    next.steps[i].output = Some(serde_json::json!({ "woke_at": ctx.now.to_rfc3339() }));
    next.active_since = Some(ctx.now);
    next.note(ctx.now, Happening::StepDone, Some(name.clone()), ctx.config.timeline_limit);
    effects.extend(status(ctx, StatusKind::StepDone, Some(name)));
}

/// Starts the wait of step `i`: a lease that ends when it wakes (kept from an earlier start),
/// and, for a wait SQS can delay a message for, a start message that comes at that time; the
/// supervisor wakes a longer one.
pub(super) fn wait_for(
    next: &mut StateRecord,
    i: usize,
    wait: &Wait,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    let from_now = match wait {
        Wait::For(duration) => *duration,
        // Set at submission; a record made without it wakes at once.
        Wait::Until(_) => Duration::ZERO,
    };
    let wake = *next.steps[i].wake_at.get_or_insert(ctx.now.plus(from_now));
    next.attempt += 1;
    let attempt = next.attempt;
    next.steps[i].lease = Some(Lease {
        attempt,
        complete_by: wake,
        sent: false,
        failures: 0,
        timer: true,
        held: false,
        held_since: None,
    });
    let name = next.steps[i].name.clone();
    next.note_wait(ctx.now, &name, WaitingFor::Time, wake, ctx.config.timeline_limit);
    let delay = ctx.now.until(wake);
    if delay <= MAX_DELIVERY_DELAY {
        effects.push(Effect::Kick { delay, attempt });
    }
}

/// Starts steps `ready` (or their undos): leased and dispatched at once, or queued at one new
/// attempt with one start message for them all.
pub(super) fn start(
    next: &mut StateRecord,
    ready: &[usize],
    effects: &mut Vec<Effect>,
    ctx: &Ctx<'_>,
    via: Via,
) -> Result<(), Decision> {
    let mut kicked = None;
    for &i in ready {
        let state = &next.steps[i];
        let step = ctx.workflow.step_named(&state.name);
        if let (Some(Work::Wait(wait)), Direction::Do) = (step.map(|s| &s.work), state.direction())
        {
            wait_for(next, i, wait, ctx, effects);
            continue;
        }
        let Some(budget) = budget_of(state, ctx) else {
            return Err(unknown_step(state));
        };
        match via {
            Via::Lease => dispatch(next, i, ctx.now.plus(budget), ctx, effects),
            Via::Kick { after } => {
                // Every step queued by this write at one attempt, claimed by one start message.
                let attempt = *kicked.get_or_insert_with(|| {
                    next.attempt += 1;
                    next.attempt
                });
                let complete_by = ctx.now.plus(after).plus(ctx.config.claim_grace).plus(budget);
                let lease = Lease::queued(attempt, complete_by);
                next.steps[i].lease = Some(lease);
            }
        }
    }
    if let (Some(attempt), Via::Kick { after }) = (kicked, via) {
        effects.push(Effect::Kick { delay: after, attempt });
    }
    Ok(())
}

/// How often the supervisor looks at the children of a step in flight, its lease ending then:
/// a start, or word of an end, lost on the way is made again within this time rather than at
/// the step's timeout.
pub const CHILD_LOOK: Duration = Duration::from_secs(300);

/// Sends step `i`, due by `complete_by`: its request to its agent, or, for a callback, the
/// announcement of a fresh token, which only this lease accepts.
pub(super) fn dispatch(
    next: &mut StateRecord,
    i: usize,
    complete_by: Timestamp,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    if starts_child(ctx, &next.steps[i]) {
        // Forward, its timeout; the lease ends at the next look at its children. A pass run
        // inline that waited for its held service goes on within the timeout it had.
        let after_hold = next.steps[i].lease.is_some_and(|l| l.held_since.is_some())
            && next.steps[i].ends_by.is_some();
        if next.steps[i].direction() == Direction::Do && !after_hold {
            next.steps[i].ends_by = Some(complete_by);
        }
        send(next, i, complete_by.min(ctx.now.plus(CHILD_LOOK)));
        if let Some(fan) = fan_of(ctx, &next.steps[i]) {
            return open(next, i, fan, ctx, effects);
        }
        let state = &next.steps[i];
        next.steps[i].child =
            Some(OrderId::for_child(next.order_id, &state.name, state.generation));
        effects.push(Effect::Child { step: i });
        return;
    }
    if !awaits_callback(ctx, &next.steps[i]) {
        send(next, i, complete_by);
        effects.push(Effect::Dispatch { step: i });
        return;
    }
    // Not marked dispatched: nothing reached a service, so a stop leaves nothing to judge.
    next.attempt += 1;
    let attempt = next.attempt;
    let lease = Lease {
        attempt,
        complete_by,
        sent: true,
        failures: 0,
        timer: false,
        held: false,
        held_since: None,
    };
    next.steps[i].lease = Some(lease);
    next.steps[i].token = Some(token(ctx.seed, next.order_id, attempt, i));
    next.steps[i].answer_by = Some(complete_by);
    let name = next.steps[i].name.clone();
    next.note_wait(ctx.now, &name, WaitingFor::Answer, complete_by, ctx.config.timeline_limit);
    effects.push(Effect::Announce { step: i });
    effects.extend(callback_end(&lease, ctx));
}

/// A token no one can guess from anything the order shows, distinct for every step and attempt
/// even from one seed.
pub(super) fn token(seed: u128, order_id: OrderId, attempt: u64, step: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    hash.update(seed.to_le_bytes());
    hash.update(order_id.to_string().as_bytes());
    hash.update(attempt.to_le_bytes());
    hash.update((step as u64).to_le_bytes());
    hash.finalize().iter().take(20).map(|b| format!("{b:02x}")).collect()
}

/// What brings the children of step `i` (`state`, which starts them) in line with its lease
/// again: its child, or its list's elements in flight (or the read of its list, or its
/// collection).
pub(super) fn children_again(ctx: &Ctx<'_>, state: &StepState, i: usize) -> Effect {
    match fan_of(ctx, state) {
        Some(_) => replay_of(state, i),
        None => Effect::Child { step: i },
    }
}

/// Whether `state` is a step that starts a child order (to do or to undo).
pub(super) fn starts_child(ctx: &Ctx<'_>, state: &StepState) -> bool {
    ctx.workflow.step_named(&state.name).is_some_and(|s| matches!(s.work, Work::Child(_)))
}

/// Whether `state` is a step that waits for a callback (to do: a callback has no undo).
pub(super) fn awaits_callback(ctx: &Ctx<'_>, state: &StepState) -> bool {
    ctx.workflow.step_named(&state.name).is_some_and(|s| matches!(s.work, Work::Callback))
}

/// Leases step `i` (keeping its count of expired leases) and marks it dispatched: a new
/// attempt, due by `complete_by`, whose request goes out once the record is written; from
/// then on it may have reached its service under the step's keys.
pub(super) fn send(next: &mut StateRecord, i: usize, complete_by: Timestamp) {
    next.attempt += 1;
    let (failures, held_since) =
        next.steps[i].lease.map_or((0, None), |l| (l.failures, l.held_since));
    let attempt = next.attempt;
    next.steps[i].lease = Some(Lease {
        attempt,
        complete_by,
        sent: true,
        failures,
        timer: false,
        held: false,
        held_since,
    });
    next.steps[i].dispatched = true;
}

/// The supervisor found an expired record in flight: every lease expired by more than the
/// horizon is judged in the one write.
pub(super) fn expire(
    record: &StateRecord,
    seen: Timestamp,
    horizon: Duration,
    ctx: &Ctx<'_>,
) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    // A wait, a callback or a hold is due at its time: no message of it can be on its way.
    let due = |s: &StepState, l: &Lease| match l.timer || l.held || awaits_callback(ctx, s) {
        true => l.complete_by,
        false => l.complete_by.plus(horizon),
    };
    let expired: Vec<usize> =
        record.leased().filter(|(_, s, l)| due(s, l) <= ctx.now).map(|(i, _, _)| i).collect();
    if expired.is_empty() {
        // Found before any lease ended (the index may hold an order early): nothing is late.
        if let Some(end) = record.earliest_lease().filter(|&end| end > ctx.now) {
            return Decision::Ignore(Ignored::NotExpired { complete_by: Some(end) });
        }
        let until = record.leased().map(|(_, s, l)| due(s, l)).min();
        return Decision::Ignore(Ignored::Queued { until: until.unwrap_or(seen.plus(horizon)) });
    }
    let mut next = begin(record, ctx, InputRef::Expire);
    let mut effects = Vec::new();
    for i in expired {
        judge(&mut next, i, ctx, &mut effects);
    }
    proceed(next, effects, ctx, Via::KICK)
}

/// Judges the expired lease of step `i`: tried again after a wait while below its threshold
/// and nothing stops the order; otherwise the step failed (its outcome unknown), or its undo
/// did.
pub(super) fn judge(next: &mut StateRecord, i: usize, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let Some(lease) = next.steps[i].lease.take() else { return };
    if lease.timer {
        return wake(next, i, ctx, effects);
    }
    // A pass run inline past its own timeout times out, held or not.
    let past_timeout = inline_step(ctx, &next.steps[i]).is_some()
        && next.steps[i].direction() == Direction::Do
        && next.steps[i].ends_by.is_some_and(|end| end <= ctx.now);
    if lease.held && !past_timeout {
        return held_too_long(next, i, ctx);
    }
    if let Some(step) = ctx.workflow.step_named(&next.steps[i].name)
        && matches!(step.work, Work::Child(_))
    {
        let inline = inline_step(ctx, &next.steps[i]).is_some();
        match (next.steps[i].direction(), next.steps[i].ends_by) {
            // A pass run inline has calls, not children, in flight: they take strikes.
            (Direction::Undo, _) if inline => return inline_expired(next, i, lease, ctx, effects),
            (Direction::Do, Some(end)) if inline && end > ctx.now => {
                return inline_expired(next, i, lease, ctx, effects);
            }
            (Direction::Undo, _) => {
                // Its children end on their own (each is an order the supervisor sees
                // through), however long their undos take: the step asks them again, and
                // nothing counts against it.
                next.attempt += 1;
                let complete_by = ctx.now.plus(ctx.config.claim_grace).plus(step.budget);
                next.steps[i].lease =
                    Some(Lease { attempt: next.attempt, complete_by, sent: false, ..lease });
                effects.push(Effect::Kick { delay: Duration::ZERO, attempt: next.attempt });
                return;
            }
            (Direction::Do, Some(end)) if end > ctx.now => {
                // Not its timeout yet, only a look at its children: whatever start or word of
                // an end was lost is made again, under the same lease, and nothing counts
                // against it.
                let complete_by = end.min(ctx.now.plus(CHILD_LOOK));
                next.steps[i].lease = Some(Lease { complete_by, ..lease });
                effects.push(children_again(ctx, &next.steps[i], i));
                return;
            }
            (Direction::Do, _) => {}
        }
    }
    let failures = lease.failures.saturating_add(1);
    next.failure_count = next.failure_count.saturating_add(1);
    let name = next.steps[i].name.clone();
    let limit = ctx.config.timeline_limit;
    next.note(ctx.now, Happening::LeaseExpired, Some(name.clone()), limit);

    let Some(step) = ctx.workflow.step_named(&name) else {
        // No amount of retrying can run a step the workflow no longer has.
        next.cause.get_or_insert(Cause::UnknownStep { step: name.clone() });
        next.steps[i].status = StepStatus::Uncertain;
        return;
    };
    let direction = next.steps[i].direction();
    if matches!(step.work, Work::Callback) {
        // Its budget was the time the outside world had to answer, and it did not.
        next.steps[i].status = StepStatus::Failed;
        next.steps[i].detail = Some(format!("no answer within {} s", step.budget.as_secs()));
        return failed(next, i, Cause::StepTimedOut { step: name, failures }, ctx);
    }
    if matches!(step.work, Work::Child(_)) && direction == Direction::Do {
        // Its budget was the time its child (or list of children) had to end. A child may
        // still be running, and may yet take effect: the step is undone as any step of
        // unknown outcome, which cancels its children in flight and undoes those processed.
        let ending = next.cause.is_some() || cancelled_by(next).is_some();
        let undo = step.on_failure == OnFailure::Undo || ending;
        next.steps[i].status = if undo { StepStatus::ToUndo } else { StepStatus::Uncertain };
        next.steps[i].detail =
            Some(format!("its child did not end within {} s", step.budget.as_secs()));
        // A list's children in flight stop now, not when its undo reaches them.
        if fan_of(ctx, &next.steps[i]).is_some() {
            effects.push(Effect::StopChild { step: i });
        }
        return failed(next, i, Cause::StepTimedOut { step: name, failures }, ctx);
    }
    let threshold = step.lease_limit(ctx.config.failure_threshold);
    // An order that stops for good does not wait for a retry of a step: its outcome is
    // unknown now. One that pauses takes the step back, and starts it again on resuming.
    let ending =
        direction == Direction::Do && (next.cause.is_some() || cancelled_by(next).is_some());
    if failures < threshold && !ending {
        if direction == Direction::Do && next.stop.is_some() {
            return;
        }
        // Wait longer before each further try, in case the fault is not as transient as hoped.
        let wait = step.waits(ctx.config.wait).wait(failures);
        let budget = step.action(direction).map_or(step.budget, |(_, b)| b);
        // A sent request (or its reply) is judged lost, and a new attempt fences it out. A
        // queued step keeps its attempt: should its start message only be late after all, it
        // still claims the step, and the new one finds it claimed.
        let attempt = if lease.sent || mutants::on(Mutant::PendingResetTakesNewAttempt) {
            next.attempt += 1;
            next.attempt
        } else {
            lease.attempt
        };
        let complete_by = ctx.now.plus(wait).plus(ctx.config.claim_grace).plus(budget);
        next.steps[i].lease = Some(Lease {
            attempt,
            complete_by,
            sent: false,
            failures,
            timer: false,
            held: false,
            held_since: lease.held_since,
        });
        next.note(ctx.now, Happening::RetryScheduled, Some(name), limit);
        effects.push(Effect::Kick { delay: wait, attempt });
        return;
    }
    let detail = match failures {
        1 => "its lease expired once, its outcome unknown".to_owned(),
        n => format!("its lease expired {n} times, its outcome unknown"),
    };
    match direction {
        Direction::Do => {
            // The step may have taken effect with its answer lost: undo it too if it can be
            // undone (compensations must tolerate undoing what never happened), otherwise
            // leave it to the operator. Passed on a report, it stays as it may be.
            let undo =
                step.compensation.is_some() && (step.on_failure == OnFailure::Undo || ending);
            next.steps[i].status = if undo { StepStatus::ToUndo } else { StepStatus::Uncertain };
            next.steps[i].detail = Some(detail);
            failed(next, i, Cause::StepTimedOut { step: name, failures }, ctx);
        }
        Direction::Undo => {
            next.steps[i].status = StepStatus::UndoFailed;
            next.steps[i].detail = Some(detail);
            next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
        }
    }
}

/// The start messages the record's queued steps wait for.
pub(super) fn kicks(record: &StateRecord) -> Vec<Effect> {
    let mut attempts: Vec<u64> =
        record.leased().filter(|(_, _, l)| !l.sent && !l.held).map(|(_, _, l)| l.attempt).collect();
    attempts.sort_unstable();
    attempts.dedup();
    attempts.into_iter().map(|attempt| Effect::Kick { delay: Duration::ZERO, attempt }).collect()
}

pub(super) fn not_expired(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Option<Ignored> {
    if record.complete_by != Some(seen) {
        return Some(Ignored::Moved);
    }
    if seen > ctx.now {
        return Some(Ignored::NotExpired { complete_by: record.complete_by });
    }
    None
}

/// The budget of the action a lease on `state` is for (a callback's timeout); `None` if the
/// workflow has no such step (or no undo for it).
pub(super) fn budget_of(state: &StepState, ctx: &Ctx<'_>) -> Option<Duration> {
    let step = ctx.workflow.step_named(&state.name)?;
    match (&step.work, state.direction()) {
        (Work::Callback, Direction::Do) | (Work::Child(_), _) => Some(step.budget),
        _ => step.action(state.direction()).map(|(_, budget)| budget),
    }
}
