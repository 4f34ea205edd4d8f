//! A step over a list: one child order per element, at most `max_concurrency` of them in
//! flight, forward and while undoing.
//!
//! The step holds one lease for the whole pass, and its record only counts (the window of
//! [`FanState`]): the elements started, those in flight, those ended well or not. An element's
//! end comes as a reply of the step's lease naming the element; one that is not in flight is a
//! duplicate. Forward, the pass starts elements in order while nothing stops it and fewer
//! have failed than the step tolerates; once none is in flight it ends: every element ended
//! within the tolerance and the step's output is collected from the children (a reply of the
//! lease brings it), or the step failed, its processed children left to undo. Its undo passes
//! over the children started, each undone by its own compensation (one that failed undid
//! itself and answers at once); the step is undone once every one is.
//!
//! A pass over a child workflow of one agent step runs inline ([`crate::workflow::Inline`]):
//! no child order is made, each element is one call of the step's agent under the keys its
//! child's step would have had, and the calls started together go in one request, answered
//! in one reply. The record keeps, besides the counts, the few elements that need more than a
//! count: those with nothing to undo (`settled`), those whose effect may be in place though
//! they failed (`dirty`, each undone at once, as its child would have undone itself), and the
//! leases that ran out on each element in flight (`strikes`, up to the child step's limit).

use super::*;
use crate::message::{ElementOutcome, MAX_DELIVERY_DELAY};
use crate::ports::Page;
use crate::state::FanState;
use crate::workflow::{Fan, Step};

/// How step `state` runs over a list; `None` if it does not.
pub(super) fn fan_of(ctx: &Ctx<'_>, state: &StepState) -> Option<Fan> {
    match ctx.workflow.step_named(&state.name).map(|s| &s.work) {
        Some(Work::Child(child)) => child.fan,
        _ => None,
    }
}

/// Step `i`, just sent, over its list: forward, the list is read first (at its first lease
/// of the run) or the pass goes on where a pause left it; an undo passes over the children
/// started afresh, each of which answers again.
pub(super) fn open(
    next: &mut StateRecord,
    i: usize,
    fan: Fan,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    let direction = next.steps[i].direction();
    let inline_step = inline_step(ctx, &next.steps[i]);
    let inline = inline_step.map(|s| s.budget);
    let ends_by = next.steps[i].ends_by;
    let past_timeout = inline.is_some() && ends_by.is_some_and(|e| e <= ctx.now);
    let state = next.steps[i].fan.get_or_insert_with(FanState::default);
    match direction {
        Direction::Do if state.items.is_none() => effects.push(Effect::Count { step: i }),
        Direction::Do if past_timeout => {
            // Past the pass's timeout: nothing more is sent, and the lease ends with it.
            if let (Some(lease), Some(end)) = (next.steps[i].lease.as_mut(), ends_by) {
                lease.complete_by = end;
            }
        }
        Direction::Do => {
            if let Some(budget) = inline {
                // Sent again at a new attempt: the calls in flight go again with it.
                let again: Vec<u32> = in_flight(state);
                state.strikes.retain(|k, _| again.contains(k));
                if !again.is_empty() {
                    effects.push(Effect::Elements { step: i, elements: again });
                }
                call_lease(next, i, budget, ctx);
            }
            advance(next, i, fan, ctx, effects)
        }
        Direction::Undo => {
            state.back = Default::default();
            // Every element started is undone by the pass now, whatever its call came to.
            if inline.is_some() {
                state.forward.running.clear();
                state.cleaning.clear();
                state.strikes.clear();
            }
            if inline.is_some() {
                if let Some(budget) = inline_step.and_then(undo_budget) {
                    call_lease(next, i, budget, ctx);
                }
                return advance(next, i, fan, ctx, effects);
            }
            let Some(state) = next.steps[i].fan.as_mut() else { return };
            if state.forward.next == 0 {
                // Nothing started: the undo is answered at once.
                effects.push(Effect::Elements { step: i, elements: Vec::new() });
                return;
            }
            advance(next, i, fan, ctx, effects);
        }
    }
}

/// The list of step `step`, sent at `attempt`, was read: it has `items` elements, or cannot be
/// run (no list at its pointer, too long), and the step fails with nothing done.
pub(super) fn counted(
    record: &StateRecord,
    attempt: u64,
    step: usize,
    items: Result<u32, &str>,
    ctx: &Ctx<'_>,
) -> Decision {
    let stale = Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    let Some((i, state, _)) = record.leased().find(|(i, s, l)| {
        *i == step && l.attempt == attempt && l.sent && s.direction() == Direction::Do
    }) else {
        return stale;
    };
    let Some(fan) = fan_of(ctx, state) else {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    };
    if state.fan.as_ref().is_none_or(|f| f.items.is_some()) {
        return stale;
    }
    // The message that sent the step stays the last input: its redelivery replays the pass.
    let mut next = begin(record, ctx, record.last_input.clone());
    let mut effects = Vec::new();
    match items {
        Ok(items) => {
            let inline = inline_of(ctx, &next.steps[i]).map(|inline| inline.version);
            if let Some(f) = next.steps[i].fan.as_mut() {
                f.items = Some(items);
                f.inline = inline;
            }
            if let Some(step) = inline_step(ctx, &next.steps[i]) {
                call_lease(&mut next, i, step.budget, ctx);
            }
            advance(&mut next, i, fan, ctx, &mut effects);
        }
        Err(reason) => {
            let name = next.steps[i].name.clone();
            next.steps[i].lease = None;
            next.steps[i].status = StepStatus::Failed;
            next.steps[i].detail = Some(reason.to_owned());
            failed(
                &mut next,
                i,
                Cause::StepRejected { step: name, reason: reason.to_owned() },
                ctx,
            );
        }
    }
    proceed(next, effects, ctx, Via::Lease)
}

/// The child of element `element` of the step `step` names ended, as `outcome` says, for the
/// lease at `attempt`.
pub(super) fn element(
    record: &StateRecord,
    attempt: u64,
    step: &StepRef,
    element: u32,
    outcome: &StepOutcome,
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let (i, leased, _) = match answered(record, attempt, step) {
        Ok(found) => found,
        Err(decision) => return decision,
    };
    let Some(fan) = fan_of(ctx, leased) else {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    };
    let direction = leased.direction();
    let ok = match outcome {
        StepOutcome::Done { .. } => true,
        StepOutcome::Failed { .. } => false,
        StepOutcome::TooLarge { .. } | StepOutcome::Held { .. } | StepOutcome::Deferred { .. } => {
            return Decision::Illegal(Illegal::NotDispatched { attempt });
        }
    };
    let running = leased.fan.as_ref().is_some_and(|f| {
        let w = if direction == Direction::Do { &f.forward } else { &f.back };
        w.running.contains(&element)
    });
    if !running && !mutants::on(Mutant::ElementEndsCountedTwice) {
        // Its end was counted already: a duplicate.
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    if let Some(f) = next.steps[i].fan.as_mut() {
        let w = if direction == Direction::Do { &mut f.forward } else { &mut f.back };
        w.running.retain(|&k| k != element);
        if ok {
            w.ok += 1;
        } else {
            w.failed += 1;
        }
    }
    let mut effects = Vec::new();
    advance(&mut next, i, fan, ctx, &mut effects);
    proceed(next, effects, ctx, Via::Lease)
}

/// Whether a reply to the whole of step `state` (not to one element) may be taken: forward,
/// the collected output of a pass that ended well; for its undo, the answer of one with
/// nothing to undo.
pub(super) fn whole_reply_fits(ctx: &Ctx<'_>, state: &StepState) -> bool {
    let Some(fan) = fan_of(ctx, state) else { return true };
    let Some(f) = &state.fan else { return false };
    match state.direction() {
        Direction::Do => f.items.is_some_and(|items| {
            f.forward.next == items
                && f.forward.running.is_empty()
                && f.forward.failed <= fan.tolerance.allows(items)
        }),
        Direction::Undo => f.forward.next == 0,
    }
}

/// What a redelivered message owes step `i`'s pass: the elements in flight again, or the
/// read of its list, or its collection.
pub(super) fn replay_of(state: &StepState, i: usize) -> Effect {
    let Some(f) = &state.fan else { return Effect::Count { step: i } };
    let window = match state.direction() {
        Direction::Do if f.items.is_none() => return Effect::Count { step: i },
        Direction::Do => &f.forward,
        Direction::Undo => &f.back,
    };
    if window.running.is_empty() && f.cleaning.is_empty() && state.direction() == Direction::Do {
        return Effect::Collect { step: i };
    }
    let mut elements = window.running.clone();
    if state.direction() == Direction::Do {
        elements.extend(&f.cleaning);
    }
    Effect::Elements { step: i, elements }
}

/// Moves step `i`'s pass on: starts as many elements as its concurrency allows while nothing
/// stops it, and, once none is in flight, ends it.
fn advance(next: &mut StateRecord, i: usize, fan: Fan, ctx: &Ctx<'_>, effects: &mut Vec<Effect>) {
    let direction = next.steps[i].direction();
    let inline = inline_step(ctx, &next.steps[i]);
    // A cancel or a failure ends the pass; a pause only holds it, to go on where it was.
    let ending = next.cause.is_some() || cancelled_by(next).is_some();
    let pausing = next.stop.is_some() && !ending;
    let Some(state) = next.steps[i].fan.as_mut() else { return };
    let Some(items) = state.items else { return };
    let allowed = fan.tolerance.allows(items);
    let tripped = direction == Direction::Do && state.forward.failed > allowed;
    let cleaning = state.cleaning.len();
    let (window, end) = match direction {
        Direction::Do => (&mut state.forward, items),
        Direction::Undo => (&mut state.back, state.forward.next),
    };
    let held_back = direction == Direction::Do && (tripped || ending || pausing);
    let mut started = Vec::new();
    loop {
        // Inline, an element with nothing to undo is passed over by the undo.
        while inline.is_some() && direction == Direction::Undo && window.next < end {
            if !state.settled.contains(window.next) {
                break;
            }
            window.next += 1;
        }
        let room = window.running.len() + cleaning < fan.max_concurrency as usize;
        if held_back || !room || window.next >= end {
            break;
        }
        window.running.push(window.next);
        started.push(window.next);
        window.next += 1;
    }
    if !started.is_empty() {
        effects.push(Effect::Elements { step: i, elements: started });
        let budget = match direction {
            Direction::Do => inline.map(|s| s.budget),
            Direction::Undo => inline.and_then(undo_budget),
        };
        if let Some(budget) = budget {
            extend_lease(next, i, budget, ctx);
        }
    }
    let Some(state) = next.steps[i].fan.as_mut() else { return };
    let window = match direction {
        Direction::Do => &state.forward,
        Direction::Undo => &state.back,
    };
    if !window.running.is_empty() || (direction == Direction::Do && !state.cleaning.is_empty()) {
        return;
    }
    let (next_k, ok, failures) = (window.next, window.ok, window.failed);
    let dirty = !state.dirty.is_empty();
    let name = next.steps[i].name.clone();
    let limit = ctx.config.timeline_limit;
    match direction {
        Direction::Do if next_k == items && !tripped && !ending => {
            // Every element ended within the tolerance: the children's outputs are read and
            // come back as the reply of this lease.
            effects.push(Effect::Collect { step: i });
        }
        Direction::Do if pausing && !tripped => next.steps[i].lease = None,
        Direction::Do => {
            let s = &mut next.steps[i];
            s.lease = None;
            // Its processed children took effect: the step is undone with the others.
            s.status = if ok > 0 || dirty { StepStatus::ToUndo } else { StepStatus::Failed };
            let detail = if tripped {
                format!("{failures} of {items} elements failed; it tolerates {allowed}")
            } else {
                format!("stopped after {next_k} of {items} elements")
            };
            s.detail = Some(detail.clone());
            if tripped {
                failed(next, i, Cause::StepRejected { step: name, reason: detail }, ctx);
                // Passed on a report, its processed children stay, as an uncertain step's
                // effect does (undone after all should the order stop later).
                let s = &mut next.steps[i];
                if s.reported.is_some() && s.status == StepStatus::ToUndo {
                    s.status = StepStatus::Uncertain;
                }
            }
        }
        Direction::Undo => {
            let s = &mut next.steps[i];
            s.lease = None;
            if failures == 0 {
                s.status = StepStatus::Undone;
                next.note(ctx.now, Happening::StepUndone, Some(name), limit);
            } else {
                s.status = StepStatus::UndoFailed;
                s.detail = Some(format!("the undo of {failures} of {next_k} elements failed"));
                next.note(ctx.now, Happening::UndoFailed, Some(name), limit);
            }
        }
    }
}

/// What step `state` runs inline, if its pass does: the child's step, in the version the pass
/// took when its list was read.
pub(super) fn inline_step<'w>(ctx: &Ctx<'w>, state: &StepState) -> Option<&'w Step> {
    let version = state.fan.as_ref()?.inline?;
    inline_of(ctx, state)?.step(version)
}

/// What step `state` would run inline, were its list read now.
fn inline_of<'w>(ctx: &Ctx<'w>, state: &StepState) -> Option<&'w crate::workflow::Inline> {
    match &ctx.workflow.step_named(&state.name)?.work {
        Work::Child(child) if child.fan.is_some() => child.inline.as_ref(),
        _ => None,
    }
}

/// The budget of the undo of an element run inline, if its step has one.
fn undo_budget(step: &Step) -> Option<Duration> {
    step.action(Direction::Undo).map(|(_, budget)| budget)
}

/// The elements of a pass whose calls are in flight: forward, those called and those being
/// undone; backward, those being undone.
fn in_flight(state: &FanState) -> Vec<u32> {
    let mut elements = state.forward.running.clone();
    elements.extend(&state.cleaning);
    elements
}

/// Step `i`'s lease covers the calls just sent, each with `budget`: it ends no sooner than
/// their budgets do, and no later than the step's own timeout. A lease just taken ends then;
/// one that covers calls still in flight is only ever made longer.
fn call_lease(next: &mut StateRecord, i: usize, budget: Duration, ctx: &Ctx<'_>) {
    lease_for_calls(next, i, budget, ctx, false);
}

/// [`call_lease`], for calls sent beside others still in flight.
fn extend_lease(next: &mut StateRecord, i: usize, budget: Duration, ctx: &Ctx<'_>) {
    lease_for_calls(next, i, budget, ctx, true);
}

fn lease_for_calls(
    next: &mut StateRecord,
    i: usize,
    budget: Duration,
    ctx: &Ctx<'_>,
    beside: bool,
) {
    let ends_by = next.steps[i].ends_by.filter(|_| next.steps[i].direction() == Direction::Do);
    let Some(lease) = next.steps[i].lease.as_mut() else { return };
    let mut complete_by = ctx.now.plus(ctx.config.claim_grace).plus(budget);
    if beside {
        complete_by = complete_by.max(lease.complete_by);
    }
    if let Some(end) = ends_by {
        complete_by = complete_by.min(end);
    }
    lease.complete_by = complete_by;
}

/// An agent answered elements of step `step`'s pass, run inline, for its lease at `attempt`:
/// each answer for an element in flight is taken, any other is a duplicate. Done counts the
/// element ended well (its output was kept on a page before this); refused, ended failed with
/// nothing to undo; an output too large to keep, failed with its effect in place, undone at
/// once. A held service parks the whole pass, as it would a step; a service without room for
/// some calls has them sent again when it says there will be.
pub(super) fn elements_answered(
    record: &StateRecord,
    attempt: u64,
    step: &StepRef,
    outcomes: &[ElementOutcome],
    message: &str,
    ctx: &Ctx<'_>,
) -> Decision {
    let stale = Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    let Some((i, leased, lease)) = holder(record, attempt, step) else { return stale };
    if !lease.sent {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    }
    if step.index != i || step.name != leased.name {
        return Decision::Illegal(Illegal::WrongStep {
            leased: leased.name.clone(),
            replied: step.name.clone(),
        });
    }
    let (Some(fan), Some(inline)) = (fan_of(ctx, leased), inline_step(ctx, leased)) else {
        return Decision::Illegal(Illegal::NotDispatched { attempt });
    };
    let direction = leased.direction();
    // Forward, the undo of a dirty element is answered as an undo.
    let cleanup = direction == Direction::Do && step.direction == Direction::Undo;
    if step.direction != direction && !cleanup {
        return Decision::Illegal(Illegal::WrongDirection {
            leased: direction,
            replied: step.direction,
        });
    }
    let lease = *lease;
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    let name = leased.name.clone();
    let mut taken = false;
    let mut dirtied = Vec::new();
    let mut kept = std::collections::BTreeMap::new();
    let mut held = None;
    let mut deferred: Vec<(u32, Timestamp)> = Vec::new();
    let mut undo_refused = None;
    let Some(f) = next.steps[i].fan.as_mut() else { return stale };
    for ElementOutcome { element: k, outcome } in outcomes {
        let k = *k;
        let in_flight = match (direction, cleanup) {
            (Direction::Do, false) => f.forward.running.contains(&k),
            (Direction::Do, true) => f.cleaning.contains(&k),
            (Direction::Undo, _) => f.back.running.contains(&k),
        };
        if !in_flight {
            continue;
        }
        let ended = match outcome {
            StepOutcome::Held { reason, action } => {
                held.get_or_insert((reason.clone(), action.clone()));
                false
            }
            StepOutcome::Deferred { until } => {
                deferred.push((k, *until));
                false
            }
            _ => true,
        };
        if !ended {
            continue;
        }
        taken = true;
        f.strikes.remove(&k);
        match (direction, cleanup, outcome) {
            (Direction::Do, false, StepOutcome::Done { output })
                if output_len(output).is_none() =>
            {
                f.forward.running.retain(|&e| e != k);
                f.forward.ok += 1;
                kept.insert(k, output.clone());
            }
            (Direction::Do, false, StepOutcome::Done { .. } | StepOutcome::TooLarge { .. }) => {
                if failed_in_place(f, k, inline.compensation.is_some()) {
                    dirtied.push(k);
                }
            }
            (Direction::Do, false, _) => {
                f.forward.running.retain(|&e| e != k);
                f.forward.failed += 1;
                f.settled.insert(k);
            }
            (Direction::Do, true, StepOutcome::Failed { reason }) => {
                // Its effect stays: the step fails, and the order's undo tries again.
                f.cleaning.retain(|&e| e != k);
                undo_refused.get_or_insert((k, reason.clone()));
            }
            (Direction::Do, true, _) => {
                f.cleaning.retain(|&e| e != k);
                f.dirty.remove(k);
                f.settled.insert(k);
            }
            (Direction::Undo, _, StepOutcome::Failed { .. }) => {
                f.back.running.retain(|&e| e != k);
                f.back.failed += 1;
            }
            (Direction::Undo, _, _) => {
                f.back.running.retain(|&e| e != k);
                f.back.ok += 1;
                f.dirty.remove(k);
            }
        }
    }
    let mut effects = Vec::new();
    // The undo of a dirty element started just now goes out with this write (or, should the
    // pass wait for its service, once it resumes).
    if !dirtied.is_empty() && held.is_none() {
        effects.push(Effect::Elements { step: i, elements: dirtied });
        if let Some(budget) = undo_budget(inline) {
            extend_lease(&mut next, i, budget, ctx);
        }
    }
    if !taken && held.is_none() && deferred.is_empty() {
        return stale;
    }
    let page = (!kept.is_empty()).then(|| Page {
        pass: Page::pass_of(record.order_id, &name, leased.generation),
        id: Page::id_of(next.revision, message),
        outputs: kept,
    });
    if let Some((k, reason)) = undo_refused {
        let reason = format!("the undo of element {k} was refused: {reason}");
        next.steps[i].detail = Some(reason.clone());
        failed(&mut next, i, Cause::StepRejected { step: name, reason }, ctx);
    }
    if let Some((reason, action)) = held {
        // The whole pass waits for its service, each element in flight sent again on resuming.
        park_on(&mut next, i, &lease, &reason, action.as_deref(), inline, ctx);
        return with_pages(proceed(next, effects, ctx, Via::Lease), page);
    }
    if let Some(until) = deferred.iter().map(|(_, until)| *until).max() {
        let delay = ctx.now.until(until).min(MAX_DELIVERY_DELAY);
        let elements = deferred.into_iter().map(|(k, _)| k).collect();
        effects.push(Effect::ElementsAgain { step: i, elements, delay });
        if let Some(l) = next.steps[i].lease.as_mut() {
            let budget = if cleanup || direction == Direction::Undo {
                undo_budget(inline).unwrap_or(inline.budget)
            } else {
                inline.budget
            };
            l.complete_by = l.complete_by.max(ctx.now.plus(delay).plus(budget));
        }
    }
    advance(&mut next, i, fan, ctx, &mut effects);
    with_pages(proceed(next, effects, ctx, Via::Lease), page)
}

/// Element `k`, called, ended failed with its effect perhaps in place: undone at once if it
/// can be, as its child order would have undone itself (true: its undo is to be sent);
/// otherwise left as it is, nothing able to undo it.
fn failed_in_place(f: &mut FanState, k: u32, undoable: bool) -> bool {
    f.forward.running.retain(|&e| e != k);
    f.forward.failed += 1;
    if undoable {
        f.dirty.insert(k);
        f.cleaning.push(k);
    } else {
        f.settled.insert(k);
    }
    undoable
}

/// `decision`, whose write takes the outputs on `page`.
fn with_pages(decision: Decision, page: Option<Page>) -> Decision {
    match decision {
        Decision::Apply(mut t) => {
            t.pages.extend(page);
            Decision::Apply(t)
        }
        other => other,
    }
}

/// Step `i`'s lease ran out while its pass, run inline, had calls in flight, before the step's
/// own timeout: each element in flight takes a strike. One past its child step's limit of
/// expired leases ended with its effect unknown: forward, it failed and is undone at once
/// (if it can be); its undo, failed. The others are sent again, at a new attempt, after the
/// wait the child step takes after as many expired leases.
pub(super) fn inline_expired(
    next: &mut StateRecord,
    i: usize,
    lease: Lease,
    ctx: &Ctx<'_>,
    effects: &mut Vec<Effect>,
) {
    let (Some(fan), Some(inline)) = (fan_of(ctx, &next.steps[i]), inline_step(ctx, &next.steps[i]))
    else {
        return;
    };
    let inline = inline.clone();
    let direction = next.steps[i].direction();
    let name = next.steps[i].name.clone();
    let threshold = inline.lease_limit(ctx.config.failure_threshold);
    let limit = ctx.config.timeline_limit;
    next.note(ctx.now, Happening::LeaseExpired, Some(name.clone()), limit);
    let Some(f) = next.steps[i].fan.as_mut() else { return };
    let flying: Vec<u32> = match direction {
        Direction::Do => in_flight(f),
        Direction::Undo => f.back.running.clone(),
    };
    let mut most = 0;
    let mut undo_lost = None;
    for k in flying {
        let strikes = f.strikes.entry(k).or_default();
        *strikes += 1;
        if *strikes < threshold {
            most = most.max(*strikes);
            continue;
        }
        f.strikes.remove(&k);
        if direction == Direction::Undo {
            f.back.running.retain(|&e| e != k);
            f.back.failed += 1;
        } else if f.cleaning.contains(&k) {
            f.cleaning.retain(|&e| e != k);
            undo_lost.get_or_insert(k);
        } else {
            failed_in_place(f, k, inline.compensation.is_some());
        }
    }
    next.attempt += 1;
    let wait = inline.waits(ctx.config.wait).wait(most).min(MAX_DELIVERY_DELAY);
    let budget = match direction {
        Direction::Do => inline.budget,
        Direction::Undo => undo_budget(&inline).unwrap_or(inline.budget),
    };
    next.steps[i].lease = Some(Lease {
        attempt: next.attempt,
        complete_by: ctx.now.plus(wait).plus(ctx.config.claim_grace).plus(budget),
        ..lease
    });
    if let Some(k) = undo_lost {
        let reason = format!("the undo of element {k} got no answer within {threshold} leases");
        next.steps[i].detail = Some(reason.clone());
        failed(next, i, Cause::StepRejected { step: name, reason }, ctx);
    }
    let again = next.steps[i].fan.as_ref().map(|f| match direction {
        Direction::Do => in_flight(f),
        Direction::Undo => f.back.running.clone(),
    });
    if let Some(elements) = again.filter(|e| !e.is_empty()) {
        effects.push(Effect::ElementsAgain { step: i, elements, delay: wait });
    }
    advance(next, i, fan, ctx, effects);
}
