//! The world a simulated run lives in: a clock that handlers running side by side share as
//! if each had its own ([`Timeline`]), and ports that fail the call they are told to, as if the
//! process died right there ([`Crashy`], armed through [`Crashes`]).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use sas_engine::keys::{Queued, Slots};
use sas_engine::memory::{
    ManualClock, MemoryBus, MemoryPayloads, MemoryQueues, MemoryStore, MemoryWaits,
};
use sas_engine::ports::{
    Clock, Created, EventBus, Expected, ExpiryIndex, HeldIndex, IndexEntry, OrderRecord, Outbox,
    Outgoing, Page, Read, Saved, StateStore,
};
use sas_engine::state::StateRecord;
use sas_engine::{Error, OrderId, Result, Timestamp};

/// The agents' and the services' clock: the manual clock, but handlers running side by side (an
/// agent's batch) wake from their waits in the order of the times they wait for, and the clock
/// moves to each one's time as it wakes, so that each sees time as it would on a clock of its
/// own. Before a wait moves the clock, whatever runs beside it goes as far as it can at the
/// time it is; a wait with nothing beside it moves the clock as the manual clock's does.
#[derive(Clone, Debug)]
pub struct Timeline {
    clock: ManualClock,
    waits: Arc<Mutex<BTreeSet<(Timestamp, u64)>>>,
    next: Arc<AtomicU64>,
}

impl Timeline {
    /// A timeline on `clock`: moving one moves the other.
    pub fn new(clock: &ManualClock) -> Timeline {
        Timeline { clock: clock.clone(), waits: Arc::default(), next: Arc::default() }
    }

    fn first(&self) -> Option<(Timestamp, u64)> {
        lock(&self.waits).first().copied()
    }
}

/// How many times the earliest wait on the timeline lets the handlers beside it run before it
/// moves the clock: enough for each to reach its own next wait.
const SIDE_BY_SIDE_ROUNDS: u32 = 3;

/// A wait on the timeline, taken off it when it ends or is given up.
#[derive(Debug)]
struct Waiting(Arc<Mutex<BTreeSet<(Timestamp, u64)>>>, (Timestamp, u64));

impl Drop for Waiting {
    fn drop(&mut self) {
        lock(&self.0).remove(&self.1);
    }
}

impl Clock for Timeline {
    fn now(&self) -> Timestamp {
        self.clock.now()
    }

    async fn sleep(&self, duration: Duration) {
        let at = self.clock.now().plus(duration);
        let me = (at, self.next.fetch_add(1, Ordering::Relaxed));
        lock(&self.waits).insert(me);
        let waiting = Waiting(self.waits.clone(), me);
        let mut first_for = 0;
        while first_for < SIDE_BY_SIDE_ROUNDS {
            tokio::task::yield_now().await;
            first_for = if self.first() == Some(me) { first_for + 1 } else { 0 };
        }
        drop(waiting);
        self.clock.set(at);
    }
}

/// The ports a seed's handlers go through: the in-memory ones, each call of which a crash
/// may stop.
pub type Store = Crashy<Arc<MemoryStore<ManualClock>>>;
pub type Queues = Crashy<Arc<MemoryQueues<ManualClock>>>;
pub type Bus = Crashy<Arc<MemoryBus>>;
pub type Payloads = Crashy<Arc<MemoryPayloads>>;
pub type Waits = Arc<MemoryWaits>;
/// What the door and the supervisor read of the load: the waits and the queues' depths.
pub type Load = sas_engine::load::Gauges<Waits, Arc<MemoryQueues<ManualClock>>>;
/// The services' records, which the agents guard and the supervisor tends.
pub type Book = Arc<sas_engine::memory::MemoryServiceBook>;

/// The in-memory ports of one seed's run: the store with the lags the seed gives it (its
/// expiry index 20 s behind on even seeds, its eventual reads a second old on every third,
/// where those kinds are on), the queues, the bus, the waits' reports and the payloads' shelf,
/// on one manual clock and its timeline; and the crashes every port a handler goes through
/// shares (see [`Crashes::wrap`]).
#[derive(Clone, Debug)]
pub struct Ports {
    pub clock: ManualClock,
    pub timeline: Timeline,
    pub memory: Arc<MemoryStore<ManualClock>>,
    pub queues: Arc<MemoryQueues<ManualClock>>,
    pub waits: Arc<MemoryWaits>,
    pub bus: Arc<MemoryBus>,
    pub shelf: Arc<MemoryPayloads>,
    pub crashes: Crashes,
}

impl Ports {
    /// The ports of `seed`'s run, with the kinds of fault `faults` switches on.
    pub fn new(seed: u64, faults: crate::Faults) -> Ports {
        let clock = ManualClock::default();
        let memory = Arc::new(MemoryStore::new(clock.clone()));
        if seed % 2 == 0 && faults.on(crate::Fault::IndexLag) {
            memory.set_index_lag(Duration::from_secs(20));
        }
        if seed % 3 == 0 && faults.on(crate::Fault::StaleRead) {
            memory.set_read_lag(Duration::from_secs(1));
        }
        Ports {
            timeline: Timeline::new(&clock),
            queues: Arc::new(MemoryQueues::new(clock.clone())),
            waits: Arc::new(MemoryWaits::default()),
            bus: Arc::new(MemoryBus::new()),
            shelf: Arc::new(MemoryPayloads::default()),
            crashes: Crashes::default(),
            memory,
            clock,
        }
    }
}

/// Crashes of handlers, shared by every port they go through: armed, the n-th port call from
/// now fails (whichever port it goes to), and the handler stops there, its message not deleted.
#[derive(Clone, Debug, Default)]
pub struct Crashes {
    /// Calls left before the failing one; zero means disarmed.
    countdown: Arc<AtomicU32>,
    crashed: Arc<AtomicU32>,
}

impl Crashes {
    /// `inner`, failing its calls as these crashes are armed.
    pub fn wrap<P>(&self, inner: P) -> Crashy<P> {
        Crashy { inner, crashes: self.clone() }
    }

    /// Fails the `at`-th port call from now (1 is the next one).
    pub fn arm(&self, at: u32) {
        self.countdown.store(at, Ordering::Relaxed);
    }

    /// Takes back a crash armed and not reached.
    pub fn disarm(&self) {
        self.countdown.store(0, Ordering::Relaxed);
    }

    /// How many calls failed so far.
    pub fn count(&self) -> u32 {
        self.crashed.load(Ordering::Relaxed)
    }
}

/// A port that fails the call its [`Crashes`] are armed for, as if the process died right
/// there, and gives way to any handler running beside it before every call.
#[derive(Clone, Debug)]
pub struct Crashy<P> {
    inner: P,
    crashes: Crashes,
}

impl<P> Crashy<P> {
    /// Before every call: give way to any concurrent handler (so two supervisors sweeping at
    /// once interleave their reads and writes), then fail if this is the chosen call.
    async fn step(&self) -> Result<()> {
        tokio::task::yield_now().await;
        let countdown = &self.crashes.countdown;
        let left = countdown.load(Ordering::Relaxed);
        if left == 0 {
            return Ok(());
        }
        countdown.store(left - 1, Ordering::Relaxed);
        if left == 1 {
            self.crashes.crashed.fetch_add(1, Ordering::Relaxed);
            return Err(Error::unavailable("simulation", "the handler died here"));
        }
        Ok(())
    }
}

impl<P: StateStore> StateStore for Crashy<P> {
    async fn create_order(&self, order: &OrderRecord) -> Result<Created> {
        self.step().await?;
        self.inner.create_order(order).await
    }
    async fn create_state(&self, state: &StateRecord) -> Result<Created> {
        self.step().await?;
        self.inner.create_state(state).await
    }
    async fn load(&self, id: OrderId, read: Read) -> Result<Option<StateRecord>> {
        self.step().await?;
        self.inner.load(id, read).await
    }
    async fn load_order(&self, id: OrderId, read: Read) -> Result<Option<OrderRecord>> {
        self.step().await?;
        self.inner.load_order(id, read).await
    }
    async fn save(&self, next: &StateRecord, expected: Expected) -> Result<Saved> {
        self.step().await?;
        self.inner.save(next, expected).await
    }
    async fn slots(&self, key: &str) -> Result<Slots> {
        self.step().await?;
        self.inner.slots(key).await
    }
    async fn save_slots(&self, next: &Slots) -> Result<Saved> {
        self.step().await?;
        self.inner.save_slots(next).await
    }
    async fn join(&self, key: &str, queued: &Queued) -> Result<()> {
        self.step().await?;
        self.inner.join(key, queued).await
    }
    async fn line(&self, key: &str, limit: usize) -> Result<Vec<Queued>> {
        self.step().await?;
        self.inner.line(key, limit).await
    }
    async fn ahead(&self, key: &str, position: &str) -> Result<u32> {
        self.step().await?;
        self.inner.ahead(key, position).await
    }
    async fn leave(&self, key: &str, queued: &Queued) -> Result<()> {
        self.step().await?;
        self.inner.leave(key, queued).await
    }
    async fn put_page(&self, page: &Page) -> Result<()> {
        self.step().await?;
        self.inner.put_page(page).await
    }
    async fn pages(&self, pass: &str) -> Result<Vec<Page>> {
        tokio::task::yield_now().await;
        self.inner.pages(pass).await
    }
    async fn drop_pages(&self, pass: &str) -> Result<()> {
        self.step().await?;
        self.inner.drop_pages(pass).await
    }
}

impl<P: ExpiryIndex> ExpiryIndex for Crashy<P> {
    async fn due(&self, shard: u16, due_by: Timestamp) -> Result<Vec<IndexEntry>> {
        tokio::task::yield_now().await;
        self.inner.due(shard, due_by).await
    }
}

impl<P: HeldIndex> HeldIndex for Crashy<P> {
    async fn held(&self, service: &str, limit: usize) -> Result<Vec<OrderId>> {
        tokio::task::yield_now().await;
        self.inner.held(service, limit).await
    }

    async fn count_held(&self, service: &str) -> Result<u64> {
        tokio::task::yield_now().await;
        self.inner.count_held(service).await
    }
}

impl<P: sas_engine::ports::Payloads> sas_engine::ports::Payloads for Crashy<P> {
    async fn put(&self, key: &str, body: Vec<u8>) -> Result<()> {
        self.step().await?;
        self.inner.put(key, body).await
    }
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.step().await?;
        self.inner.get(key).await
    }
}

impl<P: Outbox> Outbox for Crashy<P> {
    async fn send(&self, messages: &[Outgoing]) -> Result<()> {
        self.step().await?;
        self.inner.send(messages).await
    }
}

impl<P: EventBus> EventBus for Crashy<P> {
    async fn publish(
        &self,
        events: &[sas_engine::events::BusEvent],
    ) -> Result<sas_engine::events::PublishReport> {
        self.step().await?;
        self.inner.publish(events).await
    }
}

/// The data behind `mutex`, whether or not a panic poisoned it: a failed check panics while
/// the run's handlers hold their locks, and the report is written after.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
