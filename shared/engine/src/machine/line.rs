//! Orders of a workflow with a concurrency key ([`crate::keys`]): waiting in their key's line,
//! admitted to one of its places, looked at again while they wait, and giving their place
//! back once they end.

use super::*;
use crate::keys::{OnConflict, RELEASE_CHECK, Slot};

/// Puts `next`, which holds no lease, in the line of `key`: Pending, looked at again when its
/// wait says, with its entry in the line written and a start message for it (whoever handles
/// that message admits the head of the line). It waits at a new attempt, unless it is new.
pub(super) fn into_line(next: &mut StateRecord, key: String, ctx: &Ctx<'_>) -> Vec<Effect> {
    if next.revision > 0 {
        next.attempt += 1;
    }
    // Each time in line is a run of its own, whose place is never taken for another's.
    let run = next.slot.as_ref().map_or(0, |s| s.run + 1);
    let slot = Slot { key, run, since: ctx.now, admitted: false, released: false };
    next.process_state = ProcessState::Pending;
    next.locked_by = None;
    next.complete_by = Some(slot.next_look(ctx.now, max_wait(ctx)));
    next.slot = Some(slot);
    next.note(ctx.now, Happening::InLine, None, ctx.config.timeline_limit);
    vec![Effect::Join, Effect::Kick { delay: Duration::ZERO, attempt: next.attempt }]
}

/// `decision`, for an order that gave its key's place back when it ended and now goes on (a
/// redrive, an undo of a processed order): what it would queue waits instead until the order
/// is admitted again, in line behind the orders of its key accepted before.
pub(super) fn in_line_first(record: &StateRecord, decision: Decision, ctx: &Ctx<'_>) -> Decision {
    let Decision::Apply(mut t) = decision else { return decision };
    let Some(slot) = t.next.slot.clone() else { return Decision::Apply(t) };
    if !t.next.process_state.is_in_flight() {
        return Decision::Apply(t);
    }
    // Only leases queued by this write are there (a relaunch sends nothing): they are taken
    // back, and a wait's time is set again when it really starts.
    for (i, s) in t.next.steps.iter_mut().enumerate() {
        if s.lease.take().is_some_and(|l| l.timer) {
            s.wake_at = record.steps.get(i).and_then(|r| r.wake_at);
        }
    }
    t.effects.retain(|e| !matches!(e, Effect::Kick { .. }));
    let mut effects = t.effects;
    effects.extend(into_line(&mut t.next, slot.key, ctx));
    apply(t.next, effects)
}

/// The order's start message was handled after its key's line was looked at: it starts if it
/// holds one of the key's places; otherwise it waits on, or, for a workflow that skips an
/// order whose key is busy, ends without running.
pub(super) fn admission(
    record: &StateRecord,
    attempt: u64,
    owner: &str,
    message: &str,
    admitted: bool,
    ctx: &Ctx<'_>,
) -> Decision {
    if attempt != record.attempt {
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    }
    let Some(slot) = record.slot.as_ref() else {
        return Decision::Ignore(Ignored::Stale { received: attempt, current: record.attempt });
    };
    let skips = ctx.workflow.concurrency().is_some_and(|c| c.on_conflict == OnConflict::Skip);
    if !admitted && !skips {
        return Decision::Ignore(Ignored::InLine);
    }
    let mut next = begin(record, ctx, InputRef::Message(message.to_owned()));
    if !admitted {
        next.cause = Some(Cause::KeyBusy { key: slot.key.clone() });
        return fail(next, ctx);
    }
    if let Some(s) = next.slot.as_mut() {
        s.admitted = true;
    }
    next.locked_by = Some(owner.to_owned());
    next.active_since = Some(ctx.now);
    next.note(ctx.now, Happening::Admitted, None, ctx.config.timeline_limit);
    proceed(next, status(ctx, StatusKind::Processing, None), ctx, Via::Lease)
}

/// The supervisor found a waiting order due: past its `max_wait` it fails, with its own
/// cause and an alert; otherwise it is looked at again later, with a start message now (the
/// place it waits for may be free, its start message lost).
pub(super) fn look_again(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    let Some(slot) = record.slot.clone() else {
        return Decision::Ignore(Ignored::Moved);
    };
    let mut next = begin(record, ctx, InputRef::Expire);
    if let Some(wait) = max_wait(ctx)
        && slot.since.plus(wait) <= ctx.now
    {
        let waited_s = slot.since.until(ctx.now).as_secs();
        // Nothing is undone: a redriven order's steps done before wait for an operator, as
        // they did before the redrive, rather than being undone without the key.
        next.cause = Some(Cause::KeyWaitedTooLong { key: slot.key, waited_s });
        return fail(next, ctx);
    }
    next.complete_by = Some(slot.next_look(ctx.now, max_wait(ctx)));
    // Its entry in the line is written again, should the write that put it there have
    // failed after the record's.
    let kick = Effect::Kick { delay: Duration::ZERO, attempt: record.attempt };
    apply(next, vec![Effect::Join, kick])
}

fn max_wait(ctx: &Ctx<'_>) -> Option<Duration> {
    ctx.workflow.concurrency().and_then(|c| c.max_wait)
}

/// Its place was given back: the ended order leaves the expiry index (unless its alert is
/// still to be confirmed).
pub(super) fn released(record: &StateRecord, ctx: &Ctx<'_>) -> Decision {
    if !record.release_pending() {
        return Decision::Ignore(Ignored::Released);
    }
    // The input that ended the order stays the last input, as for a recorded alert.
    let mut next = begin(record, ctx, record.last_input.clone());
    if let Some(slot) = next.slot.as_mut() {
        slot.released = true;
    }
    if next.alert != Some(AlertDelivery::Pending) {
        next.complete_by = None;
    }
    apply(next, Vec::new())
}

/// The supervisor found an ended order whose place was never recorded given back: it is
/// given back again (and the alert, if it is still owed, published again).
pub(super) fn release_again(record: &StateRecord, seen: Timestamp, ctx: &Ctx<'_>) -> Decision {
    if let Some(ignored) = not_expired(record, seen, ctx) {
        return Decision::Ignore(ignored);
    }
    let mut next = begin(record, ctx, InputRef::Expire);
    next.complete_by = Some(ctx.now.plus(RELEASE_CHECK));
    let mut effects = vec![Effect::Release];
    if record.alert == Some(AlertDelivery::Pending) {
        effects.extend(status(ctx, terminal_kind(record), None));
        effects.push(Effect::Alert);
    }
    apply(next, effects)
}
