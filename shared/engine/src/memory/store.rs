//! In-memory state store and expiry index, with DynamoDB's semantics where they matter.
//!
//! - `save` is a conditional put: it writes only if the stored record still has the expected
//!   process state, attempt and revision, and reports a conflict otherwise.
//! - `create` is a transaction of two puts, each on the condition that its item does not
//!   exist: both are written or neither.
//! - An eventual read sees the items as they were `read_lag` ago (a record that did not exist
//!   then is not found), so every eventual read made within the lag of a write is stale: a
//!   harsher world than DynamoDB's, where most are not. Consistent reads see the latest.
//! - The expiry index is sparse (only records with a CompleteBy are in it), sharded, and
//!   eventually consistent: each write reaches the index only `index_lag` after it was made,
//!   measured on the store's clock, so a sweep can see entries that are already out of date and
//!   miss ones that are new.
//!
//! - The finder lists what an operator's indexes would hold: orders in Error or paused by
//!   [`StateRecord::attention`], and orders in flight by their acceptance time.
//!
//! Every record written is first checked by [`check_write`], as the DynamoDB adapter checks it,
//! so a transition that breaks an invariant fails loudly instead of being stored.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::bulk::BulkJob;
use crate::error::{Error, Result};
use crate::ids::OrderId;
use crate::keys::{Queued, Slots};
use crate::ports::{
    BulkBook, BusyKey, Clock, Counted, Created, Expected, ExpiryIndex, HeldIndex, IndexEntry,
    KeyIndex, ListPage, ListQuery, Listed, Listing, OrderFinder, OrderRecord, Page, Read, Saved,
    StateStore, check_write,
};
use crate::state::{AttentionList, StateRecord};
use crate::time::Timestamp;

/// Largest item DynamoDB stores.
const MAX_ITEM_BYTES: usize = 400 * 1024;

/// Counts of what the store was asked to do, for tests and cost estimates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Orders' items written or refused as existing.
    pub order_puts: u64,
    pub writes: u64,
    pub conflicts: u64,
    pub reads: u64,
    pub index_queries: u64,
    /// Index queries made while some writes had not reached the index yet.
    pub stale_index_queries: u64,
    /// Eventual reads that missed the latest write.
    pub stale_reads: u64,
}

/// The state table, the orders table and the expiry index. Clones share the same data.
#[derive(Clone, Debug)]
pub struct MemoryStore<C> {
    inner: Arc<Mutex<Inner>>,
    clock: C,
}

/// A write as the index will see it: when it was made, whose record, and the entry (shard,
/// CompleteBy, since when the order is watched) it leaves, if any.
type IndexChange = (Timestamp, OrderId, Option<(u16, Timestamp, Timestamp)>);

#[derive(Debug, Default)]
struct Inner {
    states: HashMap<OrderId, StateRecord>,
    orders: HashMap<OrderId, OrderRecord>,
    read_lag: Duration,
    /// Each record's versions an eventual read may still see, oldest first, with when each
    /// was written; kept only while `read_lag` is not zero.
    versions: HashMap<OrderId, VecDeque<(Timestamp, StateRecord)>>,
    index_lag: Duration,
    /// Writes not yet visible in the index.
    index_backlog: VecDeque<IndexChange>,
    /// The index as a sweep sees it: (shard, CompleteBy, order).
    index: BTreeSet<(u16, Timestamp, OrderId)>,
    /// Each indexed order's entry, with since when it is watched (projected as in DynamoDB).
    indexed: HashMap<OrderId, (u16, Timestamp, Timestamp)>,
    failing_writes: u32,
    /// Writes that succeed before the failing ones begin.
    spared_writes: u32,
    /// The condition broken on purpose: a save checks the revision only.
    revision_only: bool,
    stats: StoreStats,
    /// Each concurrency key's places.
    slots: HashMap<String, Slots>,
    /// Since when each key with orders running has had some: the busy keys' index.
    busy: HashMap<String, Timestamp>,
    /// Each concurrency key's line, by position.
    lines: HashMap<String, BTreeMap<String, Queued>>,
    /// Each pass's pages, by id.
    pages: HashMap<String, BTreeMap<String, Page>>,
    /// The bulk commands, by id.
    jobs: HashMap<String, BulkJob>,
}

impl<C: Clock> MemoryStore<C> {
    pub fn new(clock: C) -> Self {
        MemoryStore { inner: Arc::default(), clock }
    }

    /// The pages of `pass`, as they are now.
    pub fn pages_of(&self, pass: &str) -> Vec<Page> {
        self.lock().pages.get(pass).map(|p| p.values().cloned().collect()).unwrap_or_default()
    }

    /// Breaks the store's condition on purpose: a save then checks the expected revision only,
    /// not the process state and attempt, for showing that the store contract notices.
    pub fn condition_on_revision_only(&self) {
        self.lock().revision_only = true;
    }

    /// Makes index updates visible only this long after the write.
    pub fn set_index_lag(&self, lag: Duration) {
        self.lock().index_lag = lag;
    }

    /// Makes eventual reads see the items as they were this long ago.
    pub fn set_read_lag(&self, lag: Duration) {
        self.lock().read_lag = lag;
    }

    /// The next `n` writes (saves and creates) fail as throttled, writing nothing.
    pub fn fail_next_writes(&self, n: u32) {
        self.fail_writes_after(0, n);
    }

    /// After the next `spared` writes, `n` fail as throttled, writing nothing.
    pub fn fail_writes_after(&self, spared: u32, n: u32) {
        let mut inner = self.lock();
        (inner.spared_writes, inner.failing_writes) = (spared, n);
    }

    pub fn stats(&self) -> StoreStats {
        self.lock().stats
    }

    /// A record as stored, without counting a read.
    pub fn peek(&self, id: OrderId) -> Option<StateRecord> {
        self.lock().states.get(&id).cloned()
    }

    /// Every state record, in no particular order.
    pub fn records(&self) -> Vec<StateRecord> {
        self.lock().states.values().cloned().collect()
    }

    /// Every order: kept in its record, or in the orders table for a record written before.
    pub fn orders(&self) -> Vec<OrderRecord> {
        let inner = self.lock();
        let kept = inner.states.values().filter_map(StateRecord::order);
        let legacy = inner.orders.values().filter(|o| {
            inner.states.get(&o.order_id).is_none_or(|state| state.submitted.is_none())
        });
        kept.chain(legacy.cloned()).collect()
    }

    /// Deletes every record whose `expires_at` is past, as DynamoDB's time to live does some
    /// time after; returns how many. Such a record is in no index.
    pub fn forget_expired(&self) -> usize {
        let now = self.clock.now();
        let mut inner = self.lock();
        let before = inner.states.len();
        inner.states.retain(|_, state| state.expires_at.is_none_or(|at| at > now));
        let gone = before - inner.states.len();
        let Inner { states, versions, .. } = &mut *inner;
        versions.retain(|id, _| states.contains_key(id));
        gone
    }

    /// Every concurrency key's places, as stored.
    pub fn all_slots(&self) -> Vec<Slots> {
        self.lock().slots.values().cloned().collect()
    }

    /// Every concurrency key's line, in order.
    pub fn lines(&self) -> Vec<(String, Vec<Queued>)> {
        let inner = self.lock();
        inner.lines.iter().map(|(k, l)| (k.clone(), l.values().cloned().collect())).collect()
    }

    /// Entries in the index as a sweep would see them now, for tests.
    pub fn index_len(&self) -> usize {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.catch_up(now);
        inner.index.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    fn take_write_fault(&mut self) -> Result<()> {
        if self.spared_writes > 0 {
            self.spared_writes -= 1;
            return Ok(());
        }
        if self.failing_writes > 0 {
            self.failing_writes -= 1;
            return Err(Error::unavailable(
                "dynamodb",
                "ProvisionedThroughputExceededException (injected)",
            ));
        }
        Ok(())
    }

    /// Keeps the version just written for the eventual reads that may still see the old ones.
    fn record_version(&mut self, now: Timestamp, record: &StateRecord) {
        if !self.read_lag.is_zero() {
            self.versions.entry(record.order_id).or_default().push_back((now, record.clone()));
        }
    }

    /// The version of a record an eventual read sees at `now`: the newest at least `read_lag`
    /// old. Older versions can no longer be seen by anyone and are dropped.
    fn eventual_state(&mut self, id: OrderId, now: Timestamp) -> Option<StateRecord> {
        let lag = self.read_lag;
        let Some(versions) = self.versions.get_mut(&id) else {
            // Written before the lag was set: nothing older to show.
            return self.states.get(&id).cloned();
        };
        let visible = versions.iter().rposition(|(at, _)| at.plus(lag) <= now)?;
        versions.drain(..visible);
        versions.front().map(|(_, r)| r.clone())
    }

    fn record_index_change(&mut self, now: Timestamp, record: &StateRecord) {
        let entry = record.complete_by.map(|cb| (record.shard, cb, record.watched_since()));
        self.index_backlog.push_back((now, record.order_id, entry));
    }

    /// Applies the index updates old enough to be visible at `now`.
    fn catch_up(&mut self, now: Timestamp) {
        while let Some(&(at, id, entry)) = self.index_backlog.front() {
            if at.plus(self.index_lag) > now {
                break;
            }
            self.index_backlog.pop_front();
            if let Some((shard, cb, _)) = self.indexed.remove(&id) {
                self.index.remove(&(shard, cb, id));
            }
            if let Some((shard, cb, watched)) = entry {
                self.index.insert((shard, cb, id));
                self.indexed.insert(id, (shard, cb, watched));
            }
        }
    }
}

fn check_size<T: serde::Serialize>(item: &T) -> Result<()> {
    let size = serde_json::to_vec(item).map_or(usize::MAX, |v| v.len());
    if size > MAX_ITEM_BYTES {
        return Err(Error::rejected(
            "dynamodb",
            format!("item of {size} bytes exceeds the 400 KB limit"),
        ));
    }
    Ok(())
}

impl<C: Clock> StateStore for MemoryStore<C> {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        check_size(order)?;
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.order_puts += 1;
        if inner.orders.contains_key(&order.order_id) {
            return Ok(Created::AlreadyExists);
        }
        inner.orders.insert(order.order_id, order.clone());
        Ok(Created::Created)
    }

    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        check_write(state, None)?;
        check_size(state)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.writes += 1;
        if inner.states.contains_key(&state.order_id) {
            return Ok(Created::AlreadyExists);
        }
        inner.states.insert(state.order_id, state.clone());
        inner.record_version(now, state);
        inner.record_index_change(now, state);
        Ok(Created::Created)
    }

    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.stats.reads += 1;
        let latest = inner.states.get(&id).cloned();
        if read == Read::Consistent || inner.read_lag.is_zero() {
            return Ok(latest);
        }
        let seen = inner.eventual_state(id, now);
        if seen != latest {
            inner.stats.stale_reads += 1;
        }
        Ok(seen)
    }

    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.stats.reads += 1;
        let lag = inner.read_lag;
        let too_new = inner.orders.get(&id).is_some_and(|o| o.created_at.plus(lag) > now);
        if read == Read::Eventual && too_new {
            inner.stats.stale_reads += 1;
            return Ok(None);
        }
        Ok(inner.orders.get(&id).cloned())
    }

    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        check_write(next, Some(expected))?;
        check_size(next)?;
        let now = self.clock.now();
        let mut inner = self.lock();
        inner.take_write_fault()?;
        let revision_only = inner.revision_only;
        let matches = inner.states.get(&next.order_id).is_some_and(|current| {
            let seen = Expected::of(current);
            seen == expected || revision_only && seen.revision == expected.revision
        });
        if !matches {
            inner.stats.conflicts += 1;
            return Ok(Saved::Conflict);
        }
        inner.stats.writes += 1;
        inner.states.insert(next.order_id, next.clone());
        inner.record_version(now, next);
        inner.record_index_change(now, next);
        Ok(Saved::Saved)
    }

    async fn slots(&self, key: &str) -> Result<Slots> {
        let mut inner = self.lock();
        inner.stats.reads += 1;
        Ok(inner.slots.get(key).cloned().unwrap_or_else(|| Slots::empty(key)))
    }

    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        check_size(next)?;
        let mut inner = self.lock();
        inner.take_write_fault()?;
        let stored = inner.slots.get(&next.key).map_or(0, |s| s.version);
        if next.version != stored + 1 {
            inner.stats.conflicts += 1;
            return Ok(Saved::Conflict);
        }
        inner.stats.writes += 1;
        inner.slots.insert(next.key.clone(), next.clone());
        match next.running.values().max() {
            None => {
                inner.busy.remove(&next.key);
            }
            Some(newest) => {
                inner.busy.entry(next.key.clone()).or_insert(*newest);
            }
        }
        Ok(Saved::Saved)
    }

    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.writes += 1;
        inner.lines.entry(key.to_owned()).or_default().insert(queued.position(), queued.clone());
        Ok(())
    }

    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        let mut inner = self.lock();
        inner.stats.reads += 1;
        let line = inner.lines.get(key);
        Ok(line.map(|l| l.values().take(limit).cloned().collect()).unwrap_or_default())
    }

    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        let mut inner = self.lock();
        inner.stats.reads += 1;
        let ahead = inner.lines.get(key).map_or(0, |l| l.range(..position.to_owned()).count());
        Ok(u32::try_from(ahead).unwrap_or(u32::MAX))
    }

    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.writes += 1;
        if let Some(line) = inner.lines.get_mut(key) {
            line.remove(&queued.position());
            if line.is_empty() {
                inner.lines.remove(key);
            }
        }
        Ok(())
    }

    async fn put_page(&self, page: &Page) -> Result<()> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.writes += 1;
        inner.pages.entry(page.pass.clone()).or_default().insert(page.id.clone(), page.clone());
        Ok(())
    }

    async fn pages(&self, pass: &str) -> Result<Vec<Page>> {
        let inner = self.lock();
        Ok(inner.pages.get(pass).map(|p| p.values().cloned().collect()).unwrap_or_default())
    }

    async fn drop_pages(&self, pass: &str) -> Result<()> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        inner.stats.writes += 1;
        inner.pages.remove(pass);
        Ok(())
    }
}

impl<C: Clock> ExpiryIndex for MemoryStore<C> {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        let clock_now = self.clock.now();
        let mut inner = self.lock();
        inner.stats.index_queries += 1;
        inner.catch_up(clock_now);
        if !inner.index_backlog.is_empty() {
            inner.stats.stale_index_queries += 1;
        }
        let inner = &*inner;
        let from = (shard, Timestamp::from_millis(i64::MIN), OrderId::from_uuid(uuid::Uuid::nil()));
        let to = (shard, due_by, OrderId::from_uuid(uuid::Uuid::max()));
        Ok(inner
            .index
            .range(from..=to)
            .filter_map(|&(_, complete_by, order_id)| {
                let (_, _, watched_since) = *inner.indexed.get(&order_id)?;
                Some(IndexEntry { order_id, complete_by, watched_since })
            })
            .collect())
    }
}

impl<C: Clock> BulkBook for MemoryStore<C> {
    async fn create_job(&self, job: &BulkJob) -> Result<bool> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        if inner.jobs.contains_key(&job.id) {
            return Ok(false);
        }
        inner.jobs.insert(job.id.clone(), job.clone());
        Ok(true)
    }

    async fn job(&self, id: &str) -> Result<Option<BulkJob>> {
        Ok(self.lock().jobs.get(id).cloned())
    }

    async fn save_job(&self, job: &BulkJob, round: u64) -> Result<Saved> {
        let mut inner = self.lock();
        inner.take_write_fault()?;
        match inner.jobs.get_mut(&job.id) {
            Some(stored) if stored.round == round => {
                *stored = job.clone();
                Ok(Saved::Saved)
            }
            _ => Ok(Saved::Conflict),
        }
    }

    async fn jobs(&self, limit: usize) -> Result<Vec<BulkJob>> {
        let inner = self.lock();
        let mut jobs: Vec<BulkJob> = inner.jobs.values().cloned().collect();
        jobs.sort_by_key(|j| std::cmp::Reverse((j.created_at, j.id.clone())));
        jobs.truncate(limit);
        Ok(jobs)
    }
}

impl<C: Clock> KeyIndex for MemoryStore<C> {
    async fn busy_keys(&self, limit: usize) -> Result<Vec<BusyKey>> {
        let mut inner = self.lock();
        inner.stats.reads += 1;
        let mut busy: Vec<BusyKey> = inner
            .busy
            .iter()
            .map(|(key, since)| BusyKey { key: key.clone(), since: *since })
            .collect();
        busy.sort_by(|a, b| (a.since, &a.key).cmp(&(b.since, &b.key)));
        busy.truncate(limit);
        Ok(busy)
    }
}

impl<C: Clock> HeldIndex for MemoryStore<C> {
    async fn held(&self, on: &str, limit: usize) -> Result<Vec<OrderId>> {
        let mut inner = self.lock();
        inner.stats.index_queries += 1;
        let mut held: Vec<(Timestamp, OrderId)> = inner
            .states
            .values()
            .filter_map(|r| r.held_on().filter(|h| h.key() == on).map(|h| (h.since, r.order_id)))
            .collect();
        held.sort_unstable();
        Ok(held.into_iter().take(limit).map(|(_, id)| id).collect())
    }

    async fn count_held(&self, on: &str) -> Result<u64> {
        let mut inner = self.lock();
        inner.stats.index_queries += 1;
        Ok(inner.states.values().filter(|r| r.held_on().is_some_and(|h| h.key() == on)).count()
            as u64)
    }
}

impl<C: Clock> OrderFinder for MemoryStore<C> {
    async fn find(&self, query: &ListQuery) -> Result<ListPage> {
        let after = query.start()?;
        let mut rows: Vec<Listed> =
            self.lock().states.values().filter_map(|r| listed(r, query)).collect();
        rows.sort_by_key(|l| std::cmp::Reverse((l.since, l.order_id)));
        if let Some(after) = after {
            rows.retain(|l| (l.since, l.order_id) < after);
        }
        Ok(ListPage::cut(rows, query.page_size()))
    }

    async fn count(&self, query: &ListQuery, cap: u64) -> Result<Counted> {
        let mut inner = self.lock();
        inner.stats.index_queries += 1;
        if let Listing::InFlight { .. } = query.listing {
            // As DynamoDB counts it: the in-flight index knows each order's workflow and since
            // when it is watched, not the step it is at.
            let any_step = ListQuery { step: None, ..query.clone() };
            let found = inner.states.values().filter(|r| listed(r, &any_step).is_some()).count();
            return Ok(Counted::of(found as u64, cap, query.step.is_none()));
        }
        let found = inner.states.values().filter(|r| listed(r, query).is_some()).count();
        Ok(Counted::of(found as u64, cap, true))
    }

    async fn searched(
        &self,
        value: &str,
        after: Option<(Timestamp, OrderId)>,
        limit: usize,
    ) -> Result<Vec<(Timestamp, OrderId)>> {
        let mut inner = self.lock();
        inner.stats.index_queries += 1;
        let mut found: Vec<(Timestamp, OrderId)> = inner
            .states
            .values()
            .filter(|r| r.search_key.as_deref() == Some(value))
            .map(|r| (r.created_at, r.order_id))
            .filter(|entry| after.is_none_or(|after| *entry < after))
            .collect();
        found.sort_by_key(|entry| std::cmp::Reverse(*entry));
        found.truncate(limit);
        Ok(found)
    }
}

/// The row `record` makes in `query`'s listing, if it is in it.
fn listed(record: &StateRecord, query: &ListQuery) -> Option<Listed> {
    let row = match query.listing {
        Listing::Failed | Listing::Paused | Listing::Reported | Listing::AwaitingAnswer => {
            let wanted = match query.listing {
                Listing::Failed => AttentionList::Failed,
                Listing::Paused => AttentionList::Paused,
                Listing::Reported => AttentionList::Reported,
                _ => AttentionList::AwaitingAnswer,
            };
            let a = record.attention().filter(|a| a.list == wanted)?;
            Listed {
                order_id: record.order_id,
                workflow: record.workflow.clone(),
                workflow_version: record.workflow_version,
                since: a.since,
                entered: a.since,
                step: a.step,
                cause: a.cause.map(str::to_owned),
            }
        }
        Listing::InFlight { older_than } => {
            // Without an age, orders waiting for a time or an answer are listed too.
            if !record.process_state.is_in_flight()
                || (!older_than.is_zero() && record.watched_since() > query.now.minus(older_than))
            {
                return None;
            }
            Listed {
                order_id: record.order_id,
                workflow: record.workflow.clone(),
                workflow_version: record.workflow_version,
                since: record.watched_since(),
                entered: record.taken_up(),
                step: record.current_step().map(|s| s.name.clone()),
                cause: None,
            }
        }
    };
    let keep = query.step.as_ref().is_none_or(|s| row.step.as_ref() == Some(s))
        && query.cause.as_ref().is_none_or(|c| row.cause.as_ref() == Some(c))
        && query.workflow.as_ref().is_none_or(|w| *w == row.workflow);
    keep.then_some(row)
}
