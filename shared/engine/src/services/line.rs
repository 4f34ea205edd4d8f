//! Concurrency keys at work ([`crate::keys`]): admitting the head of a key's line into its free
//! places, giving a place back once its order ended, and taking back the places of orders that
//! ended without giving theirs back.
//!
//! Every change of a key's places is a write conditional on the version read; a conflict is
//! another order admitting or leaving at the same moment, and the places are read again.

use tracing::{debug, info};

use super::effects::Ports;
use crate::error::Result;
use crate::ids::OrderId;
use crate::keys::{self, CHECK_PLACES_AFTER, Plan, Queued, Slots, Standing};
use crate::message::{Message, Start};
use crate::mutants::{self, Mutant};
use crate::ports::{Clock, Destination, Outbox, Outgoing, Payloads, Read, Saved, StateStore};
use crate::state::StateRecord;

/// Reads of a key's places a change is tried on before it is left to the next look: each
/// conflict is another order of the key admitted or leaving.
const KEY_TRIES: usize = 8;

impl<S: StateStore, Q: Outbox, B, C: Clock, P: Payloads> Ports<S, Q, B, C, P> {
    /// Whether `record`, waiting in its key's line, holds one of the key's places, once the
    /// head of the line was admitted into the free places (the others admitted are sent their
    /// start message). When the key is full, the places taken for a while are checked first:
    /// those of orders that ended are taken back.
    pub(super) async fn take_place(&self, record: &StateRecord) -> Result<bool> {
        let Some(slot) = record.slot.as_ref() else { return Ok(false) };
        let limit = self.limit_of(record)?;
        let place = slot.place(record.order_id);
        let read = self.store.slots(&slot.key).await?;
        let mut slots = self.admit(read, limit, Some(record.order_id), None).await?;
        let now = self.clock.now();
        let full = slots.running.len() >= limit as usize;
        let long_held = slots.running.values().any(|at| at.plus(CHECK_PLACES_AFTER) <= now);
        if !slots.running.contains_key(&place) && full && long_held && self.reclaim(&slots).await? {
            let read = self.store.slots(&slot.key).await?;
            slots = self.admit(read, limit, Some(record.order_id), None).await?;
        }
        Ok(slots.running.contains_key(&place))
    }

    /// Gives `record`'s place back (it ended), takes it out of its key's line if it was still
    /// there, and admits the next in line in the same write: a key with orders waiting never
    /// looks idle between two of them.
    pub(super) async fn release(&self, record: &StateRecord) -> Result<()> {
        let Some(slot) = record.slot.as_ref() else { return Ok(()) };
        // Even an admitted order: the admission that took its place may have died before it
        // took it out of the line, and a full key's line is not read. Out of the line first,
        // or the place it frees could be given to it again.
        self.store.leave(&slot.key, &Queued::of(record, slot)).await?;
        let slots = self.store.slots(&slot.key).await?;
        let place = slot.place(record.order_id);
        self.admit(slots, self.limit_of(record)?, None, Some(&place)).await?;
        Ok(())
    }

    /// Where `record` stands in its key's line, if it waits there.
    pub async fn standing(&self, record: &StateRecord) -> Result<Option<Standing>> {
        standing(&self.store, record).await
    }

    /// Gives back `freeing` (the place of an order that ended), if it is still taken, and
    /// admits the head of its key's line into the free places of `slots` (as just read), in one
    /// write; sends each order admitted its start message (but `except`'s, whose handler goes
    /// on with it). The places as written, or as last read if they kept changing under it.
    async fn admit(
        &self,
        mut slots: Slots,
        limit: u32,
        except: Option<OrderId>,
        freeing: Option<&str>,
    ) -> Result<Slots> {
        let key = slots.key.clone();
        let key = key.as_str();
        for _ in 0..KEY_TRIES {
            let mut base = slots.clone();
            let freed = match freeing {
                Some(place) if !mutants::on(Mutant::PlaceKeptOnEnd) => {
                    base.running.remove(place).is_some()
                }
                _ => false,
            };
            if freed && mutants::on(Mutant::PlaceFreedTwice) {
                let other = base.running.keys().next().cloned();
                other.map(|p| base.running.remove(&p));
            }
            let line = if base.running.len() < limit as usize {
                self.store.line(key, limit as usize).await?
            } else {
                Vec::new()
            };
            let plan = match keys::plan(&base, &line, limit, self.clock.now()) {
                Some(plan) => plan,
                None if freed => {
                    let mut next = base;
                    next.version += 1;
                    Plan { next, admitted: Vec::new(), stale: Vec::new() }
                }
                None => return Ok(slots),
            };
            if self.store.save_slots(&plan.next).await? == Saved::Conflict {
                slots = self.store.slots(key).await?;
                continue;
            }
            for queued in plan.stale.iter().chain(&plan.admitted) {
                self.store.leave(key, queued).await?;
            }
            let starts: Vec<Outgoing> = plan
                .admitted
                .iter()
                .filter(|q| Some(q.order_id) != except)
                .map(|q| {
                    Outgoing::now(
                        Destination::Scheduler,
                        Message::Start(Start {
                            order_id: q.order_id,
                            attempt: q.attempt,
                            correlation_id: q.correlation_id.clone(),
                            due_at: Some(self.clock.now()),
                            group: q.group.clone(),
                        }),
                    )
                })
                .collect();
            if !starts.is_empty() {
                self.outbox.send(&starts).await?;
            }
            if freed {
                debug!(key, place = freeing, "place given back");
            }
            for q in &plan.admitted {
                info!(order_id = %q.order_id, key, "admitted to its key's place");
            }
            return Ok(plan.next);
        }
        Ok(slots)
    }

    /// Takes back the places of `slots` whose orders ended (or run again under another place);
    /// whether any was.
    async fn reclaim(&self, slots: &Slots) -> Result<bool> {
        let ids: Vec<OrderId> = slots.running.keys().filter_map(|p| Slots::order_of(p)).collect();
        let records = self.store.load_many(&ids, Read::Consistent).await?;
        let read: Vec<(OrderId, Option<StateRecord>)> = ids.into_iter().zip(records).collect();
        let ended: Vec<String> = keys::ended_places(slots, &read).into_iter().cloned().collect();
        if ended.is_empty() {
            return Ok(false);
        }
        let mut next = slots.clone();
        for place in &ended {
            next.running.remove(place);
        }
        next.version += 1;
        let saved = self.store.save_slots(&next).await? == Saved::Saved;
        if saved {
            info!(key = %slots.key, places = ?ended, "places of orders that ended taken back");
        }
        Ok(saved)
    }

    /// The limit of `record`'s key, as the version of its workflow it runs declares it.
    fn limit_of(&self, record: &StateRecord) -> Result<u32> {
        let workflow = self.catalogue.of(record)?;
        Ok(workflow.concurrency().map_or(keys::MAX_LIMIT, |c| c.limit))
    }
}

/// Where `record` stands in its key's line, if it waits there: the key's places as they are
/// now, and the orders ahead of it.
pub async fn standing<S: StateStore>(store: &S, record: &StateRecord) -> Result<Option<Standing>> {
    let Some(slot) = record.slot.as_ref().filter(|_| record.waits_in_line()) else {
        return Ok(None);
    };
    let slots = store.slots(&slot.key).await?;
    let ahead = store.ahead(&slot.key, &Queued::of(record, slot).position()).await?;
    Ok(Some(Standing {
        key: slot.key.clone(),
        limit: slots.limit,
        running: u32::try_from(slots.running.len()).unwrap_or(u32::MAX),
        position: ahead + 1,
        since: slot.since,
    }))
}
