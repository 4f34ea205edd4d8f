//! Load: how long messages wait in the queues, and what the system makes of it.
//!
//! A backlog makes orders slower; it must never make them fail, and recovery must not add
//! work to it. Two figures describe the queues:
//!
//! - **Waits**, measured by the consumers. Every message carries when it became due
//!   (`due_at`); when the scheduler or an agent takes a message on its first delivery, it notes
//!   how long that message waited. A [`WaitReporter`] per consumer process reports the longest
//!   wait it saw lately to the [`WaitGauge`], with how many messages it took per second: at
//!   most every [`REPORT_EVERY`] while waits are above [`REPORT_FLOOR`] or while it takes
//!   messages twice as fast as it last said, and every [`HEARTBEAT`] otherwise, so that a
//!   queue being consumed is known to be consumed. An idle consumer writes nothing. A wait
//!   stands for as long as its message's consequences may take: the work its consumer may
//!   still do on it (an agent's budget), then the claim grace.
//! - **Depths**, read from the queues themselves ([`QueueDepths`]): how many messages are
//!   waiting for a consumer right now.
//!
//! The supervisor turns them into a [`Horizon`]: the longest a message of an order in flight
//! can currently still be on its way. Queues are roughly first in, first out, so a message
//! still waiting is younger than the messages its consumers are taking now: while a lease is
//! expired by less than the horizon, its messages may only be late, and the supervisor leaves
//! it alone. A lost message stops being younger than what the consumers take once the
//! messages sent after it are consumed, so its lease is judged at most a horizon (plus a sweep)
//! after it ended. A queue that holds waiting messages while no consumer has reported for a
//! heartbeat is *stalled*: its waits are unknown, so no lease is judged at all.
//!
//! The door turns them into an [`Admission`]: the time a new order's messages would wait in
//! all the queues they pass (each queue's waiting messages over the rate its consumers take
//! them) against the longest the deployment accepts. Beyond it, new orders are refused with a
//! time to come back.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tracing::warn;

use crate::catalogue::Catalogue;
use crate::error::Result;
use crate::ports::{Depth, Destination, Incoming, QueueDepths, WaitGauge, WaitReport};
use crate::time::Timestamp;
use crate::workflow::Workflow;

/// Shortest time between two reports of one consumer on one queue.
pub const REPORT_EVERY: Duration = Duration::from_secs(5);
/// Waits shorter than this are not worth a report of their own: they ride on the heartbeat.
pub const REPORT_FLOOR: Duration = Duration::from_secs(1);
/// Longest time between two reports of a consumer that takes messages.
pub const HEARTBEAT: Duration = Duration::from_secs(60);
/// Messages per second a queue is assumed to drain at least. The rate consumers report is the
/// rate they took messages at, which is the rate messages came while they kept up: below
/// their capacity. This floor keeps a quiet queue's low rate from turning a small burst away.
pub const NOMINAL_RATE: f64 = 10.0;
/// Longest `Retry-After` the door gives.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What a horizon adds for the reports' own delay: a wait is reported up to [`REPORT_EVERY`]
/// after it was seen, and waits under [`REPORT_FLOOR`] are not reported at once.
pub const SLACK: Duration = Duration::from_secs(REPORT_EVERY.as_secs() + REPORT_FLOOR.as_secs());

/// One consumer process's wait reports: what it saw, and when it last reported each queue.
#[derive(Debug)]
pub struct WaitReporter<G> {
    gauge: G,
    reporter: String,
    /// How long a wait stands beyond the work that follows it.
    grace: Duration,
    tracks: Mutex<HashMap<Destination, Track>>,
}

#[derive(Debug, Default)]
struct Track {
    /// The longest wait seen in each [`REPORT_EVERY`] slice, with when it was seen and until
    /// when it stands, oldest first; dropped once they no longer stand.
    samples: VecDeque<(Timestamp, Duration, Timestamp)>,
    /// Messages taken since the last report, and since when.
    taken: u64,
    since: Option<Timestamp>,
    /// The last report: when, and the wait, `until` and rate it gave.
    last: Option<(Timestamp, Duration, Timestamp, f64)>,
}

impl<G: WaitGauge> WaitReporter<G> {
    /// `reporter` names this process. A wait it reports stands for the work that follows it,
    /// then `claim_grace` and one more [`REPORT_EVERY`].
    pub fn new(gauge: G, reporter: String, claim_grace: Duration) -> Self {
        WaitReporter {
            gauge,
            reporter,
            grace: claim_grace + REPORT_EVERY,
            tracks: Mutex::default(),
        }
    }

    /// Notes that `incoming`, due at `due_at`, was taken from `queue` at `now`, to be worked on
    /// for up to `work`, and reports if a report is due. A failed report is logged and made
    /// again when the next one is due: how long queues are is worth knowing, never worth
    /// failing a message for.
    pub async fn observe(
        &self,
        queue: &Destination,
        due_at: Option<Timestamp>,
        incoming: Incoming<'_>,
        now: Timestamp,
        work: Duration,
    ) {
        // A message back from a failed delivery waited for its visibility timeout, not for
        // the queue: only first deliveries tell how long the queue is.
        let waited = due_at.filter(|_| incoming.receive_count <= 1).map(|due| due.until(now));
        let stands = now.plus(work + self.grace);
        let report = self.note(queue, waited.map(|w| (w, stands)), now, 1);
        self.send(report).await;
    }

    async fn send(&self, report: Option<WaitReport>) {
        let Some(report) = report else { return };
        if let Err(e) = self.gauge.report(&report).await {
            warn!(queue = %report.queue.name(), error = %e, "could not report the queue's wait");
        }
    }

    /// Records an observation of `taken` messages and returns the report to send, if one is
    /// due.
    fn note(
        &self,
        queue: &Destination,
        waited: Option<(Duration, Timestamp)>,
        now: Timestamp,
        taken: u64,
    ) -> Option<WaitReport> {
        let mut tracks = self.tracks.lock().unwrap_or_else(|e| e.into_inner());
        let track = tracks.entry(queue.clone()).or_default();
        track.taken += taken;
        let since = *track.since.get_or_insert(now);
        if let Some((waited, stands)) = waited {
            let slice = REPORT_EVERY.as_millis() as i64;
            match track.samples.back_mut() {
                Some((at, w, until)) if at.as_millis() / slice == now.as_millis() / slice => {
                    *w = (*w).max(waited);
                    *until = (*until).max(stands);
                }
                _ => track.samples.push_back((now, waited, stands)),
            }
        }
        track.samples.retain(|(_, _, until)| *until > now);
        let (wait, until) = track
            .samples
            .iter()
            .max_by_key(|(_, w, until)| (*w, *until))
            .map_or((Duration::ZERO, now), |(_, w, until)| (*w, *until));
        let span = since.until(now).max(Duration::from_secs(1)).as_secs_f64();
        let rate = track.taken as f64 / span;
        let due = match track.last {
            None => true,
            Some((at, last_wait, last_until, last_rate)) => {
                let elapsed = at.until(now);
                let news = wait != last_wait || (until != last_until && wait >= REPORT_FLOOR);
                // A consumer taking messages twice as fast as it last said reports it: the door
                // counts a queue's waiting messages against that rate, and a stack that has
                // had no traffic would otherwise be held to its first reports' pace until the
                // heartbeat.
                let faster = rate >= 2.0 * last_rate.max(1.0);
                (elapsed >= REPORT_EVERY
                    && (faster || news && (wait >= REPORT_FLOOR || last_wait >= REPORT_FLOOR)))
                    || elapsed >= HEARTBEAT
            }
        };
        if !due {
            return None;
        }
        // Counted as made now, so that the messages handled beside this one while it is being
        // written do not make the same report again.
        track.last = Some((now, wait, until, rate));
        track.taken = 0;
        track.since = Some(now);
        Some(WaitReport {
            queue: queue.clone(),
            reporter: self.reporter.clone(),
            wait,
            rate,
            at: now,
            until,
            // A report also says that the queue is being consumed, until the next heartbeat.
            expires: until.max(now.plus(HEARTBEAT + REPORT_EVERY)),
        })
    }
}

/// What the reports and depths say of one queue.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct QueueLoad {
    /// The longest wait any consumer reported that still stands.
    pub wait: Duration,
    /// Messages taken per second by the consumers that reported lately; `None` if none did.
    pub rate: Option<f64>,
    /// The queue's depth, if it was read.
    pub depth: Option<Depth>,
}

impl QueueLoad {
    /// Waiting messages and no consumer heard from for a heartbeat: nobody is taking them.
    pub fn stalled(&self) -> bool {
        self.rate.is_none() && self.depth.is_some_and(|d| d.waiting > 0)
    }

    /// How long a message sent now would wait: the waiting messages over the rate they are
    /// taken at, never taken to be below [`NOMINAL_RATE`].
    pub fn expected_wait(&self) -> Duration {
        let waiting = self.depth.map_or(0, |d| d.waiting) as f64;
        let rate = self.rate.unwrap_or(0.0).max(NOMINAL_RATE);
        Duration::from_secs_f64(waiting / rate)
    }
}

/// Every queue's load, as read at `at`.
#[derive(Clone, Debug, PartialEq)]
pub struct Load {
    pub at: Timestamp,
    pub queues: BTreeMap<Destination, QueueLoad>,
}

impl Load {
    /// Combines the standing reports and the depths read at `now`.
    pub fn new(now: Timestamp, reports: &[WaitReport], depths: &[(Destination, Depth)]) -> Load {
        let mut queues: BTreeMap<Destination, QueueLoad> = BTreeMap::new();
        // Per queue, the longest the first message still waiting can have waited: it came
        // after every message a consumer took, so at most the wait of the last one a consumer
        // reported, and the time since.
        let mut heads: HashMap<Destination, Duration> = HashMap::new();
        let fresh = HEARTBEAT + REPORT_EVERY;
        for r in reports {
            let q = queues.entry(r.queue.clone()).or_default();
            if r.until > now {
                q.wait = q.wait.max(r.wait);
            }
            if r.at.plus(fresh) > now {
                q.rate = Some(q.rate.unwrap_or(0.0) + r.rate);
                let head = r.wait + r.at.until(now);
                heads.entry(r.queue.clone()).and_modify(|h| *h = (*h).min(head)).or_insert(head);
            }
        }
        for (queue, depth) in depths {
            let q = queues.entry(queue.clone()).or_default();
            q.depth = Some(*depth);
            // Messages wait, and their consumers have taken none for a while (each busy with
            // a slow batch, say): the waits reported lapse, but the messages waiting have not
            // stopped ageing.
            if depth.waiting > 0
                && let Some(head) = heads.get(queue)
            {
                q.wait = q.wait.max(*head);
            }
        }
        Load { at: now, queues }
    }

    fn of(&self, queue: &Destination) -> QueueLoad {
        self.queues.get(queue).copied().unwrap_or_default()
    }

    /// How long past its CompleteBy a lease may still be explained by waiting messages.
    pub fn horizon(&self, catalogue: &Catalogue) -> Horizon {
        if let Some((queue, _)) = self.queues.iter().find(|(_, q)| q.stalled()) {
            return Horizon::Stalled(queue.clone());
        }
        // A Pending order waits on its start message; an order in flight on its request, then
        // on the reply.
        let replies = self.of(&Destination::Replies).wait;
        let longest = catalogue
            .agents()
            .into_iter()
            .map(|a| self.of(&Destination::Agent(a)).wait + replies)
            .chain([self.of(&Destination::Scheduler).wait])
            .max()
            .unwrap_or_default();
        Horizon::Within(longest + SLACK)
    }

    /// Whether the door takes a new order, given the longest it may expect to wait in the
    /// queues in all: its start message, then a request and a reply for each step along the
    /// longest path of its dependencies (steps side by side wait at once).
    ///
    /// What the door did since the queues were read counts too ([`DoorTally`]). The orders it
    /// let in wait at the slowest queue of the path, ahead of a new one, so that a burst cannot
    /// slip in between two reads. And the clients it refused will come back: a refused client
    /// is asked to wait at least as long as the slowest queue needs to take the orders of
    /// every client refused before it, so that they come back spread out rather than all at
    /// once, again and again.
    ///
    /// `part` is the part of that wait the new order's tenant waits (1 without fair queues; see
    /// [`crate::fair::Shares::part`]).
    pub fn admission(
        &self,
        max_wait: Duration,
        workflow: &Workflow,
        tally: &DoorTally,
        part: f64,
    ) -> Admission {
        // Every queue an order's messages pass through, once per visit.
        let mut path = vec![Destination::Scheduler];
        for agent in workflow.steps().iter().filter_map(crate::workflow::Step::agent) {
            path.push(Destination::Agent(agent.clone()));
            path.push(Destination::Replies);
        }
        let waits: Vec<(Destination, Duration)> =
            path.iter().map(|q| (q.clone(), self.of(q).expected_wait())).collect();
        // When each step's reply is back, at the latest, counted from the claim: after the
        // latest of the steps it depends on (the steps come in an order of their dependencies).
        let replies = self.of(&Destination::Replies).expected_wait();
        let mut back: HashMap<&str, Duration> = HashMap::new();
        for step in workflow.steps() {
            let after = step.depends_on.iter().filter_map(|d| back.get(d.as_str())).max();
            let own = step.agent().map_or(Duration::ZERO, |a| {
                self.of(&Destination::Agent(a.clone())).expected_wait() + replies
            });
            back.insert(&step.name, after.copied().unwrap_or_default() + own);
        }
        let longest = back.values().max().copied().unwrap_or_default();
        // Orders a second the slowest queue passes: a queue visited n times per order passes
        // orders at 1/n of its messages' rate.
        let slowest = path
            .iter()
            .map(|q| {
                let visits = path.iter().filter(|p| *p == q).count() as f64;
                self.of(q).rate.unwrap_or(0.0).max(NOMINAL_RATE) / visits
            })
            .fold(f64::INFINITY, f64::min);
        let ahead = Duration::from_secs_f64(tally.admitted as f64 / slowest);
        let total = (self.of(&Destination::Scheduler).expected_wait() + longest + ahead)
            .mul_f64(part.clamp(0.0, 1.0));
        if total <= max_wait {
            return Admission::Admit { expected_wait: total };
        }
        let busiest = waits.iter().max_by_key(|(_, w)| *w).map(|(q, _)| q.clone());
        let spread = Duration::from_secs_f64((tally.refused + 1) as f64 / slowest);
        let retry_after =
            (total - max_wait).max(spread).max(Duration::from_secs(1)).min(MAX_RETRY_AFTER);
        Admission::Refuse {
            busiest: busiest.unwrap_or(Destination::Scheduler),
            expected_wait: total,
            retry_after: Duration::from_secs(retry_after.as_secs_f64().ceil() as u64),
        }
    }
}

/// What one door did since the load it uses was read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DoorTally {
    /// When that load was read.
    pub at: Option<Timestamp>,
    /// Orders let in since.
    pub admitted: u64,
    /// Orders refused since.
    pub refused: u64,
}

impl DoorTally {
    /// The tally for `load`: kept if it counts since that same read, started afresh otherwise.
    pub fn for_load(&mut self, load: &Load) -> DoorTally {
        if self.at != Some(load.at) {
            *self = DoorTally { at: Some(load.at), ..DoorTally::default() };
        }
        *self
    }
}

/// Where the supervisor and the door read the queues' load.
pub trait LoadSource: Send + Sync {
    /// The load as it stands at `now`.
    fn load(&self, now: Timestamp) -> impl Future<Output = Result<Load>> + Send;
}

/// No queue's load: a door over it lets every order in. For the orders nobody could be told to
/// bring back later (an event of the bus, a schedule's time): their queue is their buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct Unmetered;

impl LoadSource for Unmetered {
    async fn load(&self, now: Timestamp) -> Result<Load> {
        Ok(Load { at: now, queues: BTreeMap::new() })
    }
}

/// The consumers' wait reports and the queues' depths, read together.
#[derive(Clone, Debug)]
pub struct Gauges<G, D> {
    pub waits: G,
    pub depths: D,
}

impl<G: WaitGauge, D: QueueDepths> LoadSource for Gauges<G, D> {
    async fn load(&self, now: Timestamp) -> Result<Load> {
        let (reports, depths) =
            futures_util::future::join(self.waits.reports(now), self.depths.depths()).await;
        let load = Load::new(now, &reports?, &depths?);
        for (queue, q) in &load.queues {
            let waiting = q.depth.map(|d| d.waiting as f64);
            crate::metrics::queue_load(queue.name(), waiting, q.expected_wait());
        }
        Ok(load)
    }
}

/// A load source read at most once per [`REPORT_EVERY`]: nothing newer could have been
/// reported meanwhile, and a busy door must not read the queues for every request. When a
/// read fails, the last load read is used while it is younger than a heartbeat.
#[derive(Debug)]
pub struct Cached<L> {
    inner: L,
    last: Mutex<Option<Load>>,
}

impl<L> Cached<L> {
    pub fn new(inner: L) -> Self {
        Cached { inner, last: Mutex::new(None) }
    }
}

impl<L: LoadSource> LoadSource for Cached<L> {
    async fn load(&self, now: Timestamp) -> Result<Load> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(load) = last.as_ref().filter(|l| l.at.plus(REPORT_EVERY) > now) {
            return Ok(load.clone());
        }
        match self.inner.load(now).await {
            Ok(load) => {
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(load.clone());
                Ok(load)
            }
            Err(e) => match last.filter(|l| l.at.plus(HEARTBEAT) > now) {
                Some(load) => {
                    warn!(error = %e, "reading the queues' load failed: using the last one read");
                    Ok(load)
                }
                None => Err(e),
            },
        }
    }
}

impl<T: LoadSource + ?Sized> LoadSource for std::sync::Arc<T> {
    fn load(&self, now: Timestamp) -> impl Future<Output = Result<Load>> + Send {
        (**self).load(now)
    }
}

/// How long an expired lease may still be waiting on its messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Horizon {
    /// Leases expired by less than this are left alone.
    Within(Duration),
    /// This queue has waiting messages and no consumer: nothing can be told, nothing is judged.
    Stalled(Destination),
}

/// The door's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Let in, expected to wait `expected_wait` in the queues.
    Admit { expected_wait: Duration },
    /// A new order would wait `expected_wait` in the queues, most of it on `busiest`: come
    /// back after `retry_after`.
    Refuse { busiest: Destination, expected_wait: Duration, retry_after: Duration },
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::AgentName;
    use crate::memory::MemoryWaits;
    use crate::ports::Incoming;

    const T0: Timestamp = Timestamp::from_millis(1_000_000);
    /// How long a wait stands after the message was taken: the claim grace and one report.
    const MEMORY: Duration = Duration::from_secs(90);
    const GRACE: Duration = Duration::from_secs(85);

    fn at(secs: u64) -> Timestamp {
        T0.plus(Duration::from_secs(secs))
    }

    fn workflow() -> Workflow {
        let agents = Workflow::agents_in(sas_workflows::order_fulfilment());
        Workflow::from_json(sas_workflows::order_fulfilment(), &agents).unwrap()
    }

    fn catalogue() -> Catalogue {
        Catalogue::single(workflow())
    }

    async fn take(r: &WaitReporter<Arc<MemoryWaits>>, waited: u64, now: Timestamp) {
        let due = now.minus(Duration::from_secs(waited));
        r.observe(&Destination::Scheduler, Some(due), Incoming::first("m"), now, Duration::ZERO)
            .await;
    }

    #[tokio::test]
    async fn a_wait_stands_for_the_work_that_follows_it() {
        // An agent that took a request after 40 s may work on it for its 60 s budget: the wait
        // must still be known when the reply is due.
        let gauge = Arc::new(MemoryWaits::default());
        let r = WaitReporter::new(gauge.clone(), "agent-1".into(), GRACE);
        let queue = Destination::Agent(AgentName::new("shipping"));
        let due = at(0);
        r.observe(&queue, Some(due), Incoming::first("m"), at(40), Duration::from_secs(60)).await;
        let report = gauge.reports(at(40)).await.unwrap().remove(0);
        assert_eq!(report.wait, Duration::from_secs(40));
        assert_eq!(report.until, at(40 + 60).plus(MEMORY));
    }

    #[tokio::test]
    async fn short_waits_ride_on_the_heartbeat_and_long_ones_are_reported_at_once() {
        let gauge = Arc::new(MemoryWaits::default());
        let r = WaitReporter::new(gauge.clone(), "p1".into(), GRACE);
        take(&r, 0, at(0)).await;
        assert_eq!(gauge.writes(), 1, "the first message announces the consumer");
        for s in 1..60 {
            take(&r, 0, at(s)).await;
        }
        assert_eq!(gauge.writes(), 1, "short waits wait for the heartbeat");
        take(&r, 0, at(60)).await;
        assert_eq!(gauge.writes(), 2, "the heartbeat");
        take(&r, 30, at(61)).await;
        assert_eq!(gauge.writes(), 2, "at most one report per REPORT_EVERY");
        take(&r, 30, at(65)).await;
        assert_eq!(gauge.writes(), 3);
        let report = gauge.reports(at(65)).await.unwrap().remove(0);
        assert_eq!(report.wait, Duration::from_secs(30));
        // Two messages in the 5 s since the heartbeat.
        assert!((report.rate - 2.0 / 5.0).abs() < 1e-9, "{}", report.rate);
        assert_eq!(report.until, at(65).plus(MEMORY), "a long wait stands for the memory");
        // The queue is quick again: nothing new to say but the heartbeat, until the long wait
        // leaves the memory.
        for s in 70..=155 {
            take(&r, 0, at(s)).await;
        }
        assert_eq!(gauge.writes(), 5, "the heartbeat at 125 s and the change at 155 s");
        let report = gauge.reports(at(155)).await.unwrap().remove(0);
        assert_eq!((report.wait, report.at), (Duration::ZERO, at(155)));
    }

    #[tokio::test]
    async fn a_consumer_taking_messages_ever_faster_says_so_before_its_heartbeat() {
        let gauge = Arc::new(MemoryWaits::default());
        let r = WaitReporter::new(gauge.clone(), "p1".into(), GRACE);
        take(&r, 0, at(0)).await;
        assert_eq!(gauge.writes(), 1, "the first message, at one a second");
        // Traffic arrives: 20 messages a second, with waits too short to report.
        for s in 1..=5 {
            for _ in 0..20 {
                take(&r, 0, at(s)).await;
            }
        }
        assert_eq!(gauge.writes(), 2, "twenty times as fast, said once REPORT_EVERY passed");
        let report = gauge.reports(at(5)).await.unwrap().remove(0);
        assert!(report.rate > 15.0, "{}", report.rate);
        // Steady at that pace: nothing more until the heartbeat.
        for s in 6..60 {
            for _ in 0..20 {
                take(&r, 0, at(s)).await;
            }
        }
        assert_eq!(gauge.writes(), 2, "a steady rate is no news");
        // Twice as fast again.
        for s in 60..=65 {
            for _ in 0..45 {
                take(&r, 0, at(s)).await;
            }
        }
        assert_eq!(gauge.writes(), 3, "the rate doubled");
    }

    #[tokio::test]
    async fn redeliveries_and_messages_without_a_due_time_are_counted_but_not_timed() {
        let gauge = Arc::new(MemoryWaits::default());
        let r = WaitReporter::new(gauge.clone(), "p1".into(), GRACE);
        let late = Incoming { message_id: "m", receive_count: 2 };
        let queue = Destination::Scheduler;
        r.observe(&queue, Some(at(0)), late, at(500), Duration::ZERO).await;
        r.observe(&queue, None, Incoming::first("n"), at(501), Duration::ZERO).await;
        let report = gauge.reports(at(501)).await.unwrap().remove(0);
        assert_eq!(report.wait, Duration::ZERO, "a visibility timeout is not a backlog");
    }

    fn report(queue: Destination, wait: u64, rate: f64, at_s: u64) -> WaitReport {
        WaitReport {
            queue,
            reporter: format!("p{at_s}"),
            wait: Duration::from_secs(wait),
            rate,
            at: at(at_s),
            until: at(at_s).plus(MEMORY),
            expires: at(at_s).plus(MEMORY),
        }
    }

    fn depth(waiting: u64) -> Depth {
        Depth { waiting, ..Depth::default() }
    }

    #[test]
    fn the_horizon_is_the_longest_path_of_waits_plus_the_reports_delay() {
        let inventory = Destination::Agent(AgentName::new("inventory"));
        let reports = [
            report(Destination::Scheduler, 40, 5.0, 0),
            report(inventory.clone(), 30, 5.0, 0),
            report(Destination::Replies, 20, 5.0, 0),
            report(Destination::Replies, 2, 5.0, 1),
        ];
        let load = Load::new(at(10), &reports, &[(Destination::Scheduler, depth(100))]);
        // inventory then replies (30 + 20) is longer than the scheduler queue's 40.
        assert_eq!(load.horizon(&catalogue()), Horizon::Within(Duration::from_secs(50) + SLACK));
        // Once the reports lapse, only the slack is left.
        let later = Load::new(at(100), &reports, &[]);
        assert_eq!(later.horizon(&catalogue()), Horizon::Within(SLACK));
    }

    #[test]
    fn waiting_messages_without_a_consumer_stall_the_horizon() {
        let payment = Destination::Agent(AgentName::new("payment"));
        let load = Load::new(at(0), &[], &[(payment.clone(), depth(3))]);
        assert_eq!(load.horizon(&catalogue()), Horizon::Stalled(payment.clone()));
        // A consumer heard from lately, even idle, means the queue is being taken; what waits
        // came after what it took, 30 s ago at most.
        let heard = [report(payment.clone(), 0, 0.5, 0)];
        let load = Load::new(at(30), &heard, &[(payment.clone(), depth(3))]);
        let since = Duration::from_secs(30);
        assert_eq!(load.horizon(&catalogue()), Horizon::Within(since + SLACK));
        // An empty queue cannot stall.
        let load = Load::new(at(0), &[], &[(payment, depth(0))]);
        assert_eq!(load.horizon(&catalogue()), Horizon::Within(SLACK));
    }

    #[test]
    fn waiting_messages_keep_ageing_while_their_consumers_take_none() {
        let payment = Destination::Agent(AgentName::new("payment"));
        // Two consumers took payment requests that had waited 90 s and 80 s, then none for
        // 40 s (their waits stand 35 s): what still waits came after what they took.
        let mut reports =
            [report(payment.clone(), 90, 2.0, 0), report(payment.clone(), 80, 2.0, 5)];
        for r in &mut reports {
            r.until = r.at.plus(Duration::from_secs(35));
        }
        let busy = Load::new(at(45), &reports, &[(payment.clone(), depth(150))]);
        // 80 s waited by the one taken at 5 s, and 40 s since: the tighter of the two.
        let replies = Duration::ZERO;
        let head = Duration::from_secs(120) + replies;
        assert_eq!(busy.horizon(&catalogue()), Horizon::Within(head + SLACK));
        // Once the queue is empty, the lapsed waits are forgotten.
        let drained = Load::new(at(45), &reports, &[(payment, depth(0))]);
        assert_eq!(drained.horizon(&catalogue()), Horizon::Within(SLACK));
    }

    #[test]
    fn the_door_counts_steps_side_by_side_once() {
        let max = Duration::from_secs(30);
        let agents =
            [AgentName::new("inventory"), AgentName::new("payment"), AgentName::new("shipping")];
        let both = r#"{"name":"both","steps":[
            {"name":"reserve","agent":"inventory","depends_on":[]},
            {"name":"charge","agent":"payment","depends_on":[]},
            {"name":"ship","agent":"shipping","depends_on":["reserve","charge"]}]}"#;
        let in_a_row = both
            .replace(r#""depends_on":[]"#, r#""depends_on":null"#)
            .replace(r#","depends_on":null"#, "");
        let both = Workflow::from_json(both, &agents).unwrap();
        let in_a_row = Workflow::from_json(&in_a_row, &agents).unwrap();
        // 20 s of waiting at each of inventory and payment.
        let busy = |agent: &str| (Destination::Agent(AgentName::new(agent)), depth(200));
        let reports = [
            report(Destination::Agent(AgentName::new("inventory")), 0, 10.0, 0),
            report(Destination::Agent(AgentName::new("payment")), 0, 10.0, 0),
        ];
        let load = Load::new(at(1), &reports, &[busy("inventory"), busy("payment")]);
        assert!(matches!(
            load.admission(max, &both, &DoorTally::default(), 1.0),
            Admission::Admit { .. }
        ));
        assert!(matches!(
            load.admission(max, &in_a_row, &DoorTally::default(), 1.0),
            Admission::Refuse { expected_wait, .. } if expected_wait == Duration::from_secs(40)
        ));
    }

    #[test]
    fn the_door_refuses_when_a_new_order_would_wait_too_long_in_all() {
        let max = Duration::from_secs(30);
        let w = workflow();
        let reports = [report(Destination::Scheduler, 1, 20.0, 0)];
        // A quiet queue's low rate is not taken as its capacity: 500 waiting at a reported
        // 2 a second count as 50 s, not 250 s.
        let slow = [report(Destination::Scheduler, 0, 2.0, 0)];
        let load = Load::new(at(1), &slow, &[(Destination::Scheduler, depth(500))]);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Refuse { expected_wait, .. } if expected_wait == Duration::from_secs(50)
        ));
        // 400 waiting at 20 a second: 20 s, admitted.
        let load = Load::new(at(1), &reports, &[(Destination::Scheduler, depth(400))]);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Admit { .. }
        ));
        // 1000 waiting: 50 s, refused, back in 20 s.
        let load = Load::new(at(1), &reports, &[(Destination::Scheduler, depth(1000))]);
        assert_eq!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Refuse {
                busiest: Destination::Scheduler,
                expected_wait: Duration::from_secs(50),
                retry_after: Duration::from_secs(20),
            }
        );
        // The waits add up along an order's path: 100 waiting on each agent's queue and on the
        // replies, at the nominal 10 a second, is 10 s a queue and 60 s in all (the replies
        // are waited for once per step).
        let mut depths: Vec<(Destination, Depth)> = ["inventory", "payment", "shipping"]
            .map(|a| (Destination::Agent(AgentName::new(a)), depth(100)))
            .to_vec();
        depths.push((Destination::Replies, depth(100)));
        let load = Load::new(at(1), &[], &depths);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Refuse { expected_wait, .. } if expected_wait == Duration::from_secs(60)
        ));
        // Orders let in since the queues were read count too, at the slowest queue: here the
        // replies, taken at the nominal 10 a second, three per order. 100 orders admitted are
        // 30 s ahead of a new one.
        let load = Load::new(at(1), &reports, &[(Destination::Scheduler, depth(100))]);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Admit { .. }
        ));
        let tally = DoorTally { admitted: 100, ..DoorTally::default() };
        assert!(matches!(
            load.admission(max, &w, &tally, 1.0),
            Admission::Refuse { expected_wait, .. } if expected_wait == Duration::from_secs(35)
        ));
        // Clients refused since are asked to come back spread out: the 51st refused waits for
        // the slowest queue to take the 50 orders before it and its own (51 at 3⅓ a second,
        // 15.3 s), not only for the 5 s the queues are over.
        let tally = DoorTally { admitted: 100, refused: 50, ..DoorTally::default() };
        assert!(matches!(
            load.admission(max, &w, &tally, 1.0),
            Admission::Refuse { retry_after, .. } if retry_after == Duration::from_secs(16)
        ));
        // A huge backlog asks for at most a minute.
        let load = Load::new(at(1), &reports, &[(Destination::Scheduler, depth(1_000_000))]);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Refuse { retry_after, .. } if retry_after == MAX_RETRY_AFTER
        ));
        // With fair queues, a tenant waits behind its part of the backlog: the 50 s that turn
        // away the tenant who made it let in one whose part is a tenth.
        let load = Load::new(at(1), &reports, &[(Destination::Scheduler, depth(1000))]);
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 1.0),
            Admission::Refuse { .. }
        ));
        assert!(matches!(
            load.admission(max, &w, &DoorTally::default(), 0.1),
            Admission::Admit { .. }
        ));
    }
}
