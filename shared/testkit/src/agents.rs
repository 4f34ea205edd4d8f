//! The services a run's agents call: a team's own (its [`RemoteService`], unchanged), or a
//! stand-in for an HTTP service with the simulated service's knobs ([`StandIn`]); each behind
//! the faults the kit injects between an agent and its service, and watched as the service
//! sees its calls.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use sas_engine::memory::{Behaviour, MemoryRemote, Outage, SplitMix, Throttle};
use sas_engine::payload::MAX_PAYLOAD_LEN;
use sas_engine::ports::{Clock, RemoteCall, RemoteFault, RemoteService};
use sas_engine::{Direction, Timestamp};
use serde_json::Value;

use crate::faults::{Fault, Faults};
use crate::ledger::Ledger;
use crate::world::{Timeline, lock};

type Answer = Result<Value, RemoteFault>;

/// A [`RemoteService`] of any type, behind one.
pub(crate) trait AnyService: Send + Sync {
    fn call_boxed<'a>(
        &'a self,
        call: &'a RemoteCall,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + 'a>>;
}

impl<R: RemoteService> AnyService for R {
    fn call_boxed<'a>(
        &'a self,
        call: &'a RemoteCall,
    ) -> Pin<Box<dyn Future<Output = Answer> + Send + 'a>> {
        Box::pin(self.call(call))
    }
}

/// How a run builds an agent's service afresh for each seed, given the seed's ledger.
pub(crate) type Build = Arc<dyn Fn(&Ledger) -> Arc<dyn AnyService> + Send + Sync>;

/// A builder of a team's service, for [`crate::Kit::agent`].
pub(crate) fn own<R, F>(build: F) -> Build
where
    R: RemoteService + 'static,
    F: Fn(&Ledger) -> R + Send + Sync + 'static,
{
    Arc::new(move |ledger: &Ledger| Arc::new(build(ledger)) as Arc<dyn AnyService>)
}

/// A stand-in for an HTTP service, declared with the simulated service's knobs (`cargo run
/// -p sas-remote-sim -- --help`), for all its actions or one: it applies each key's effect
/// once and answers `{"ref": "<action>-<n>"}`, keeps its refusals, refuses a `do` after its
/// undo, and records every effect in the run's ledger as `<agent>:<order>/<step>`.
#[derive(Clone, Debug, Default)]
pub struct StandIn {
    default: Knobs,
    actions: Vec<(String, Knobs)>,
}

/// The knobs of one action, or of all.
#[derive(Clone, Debug, Default, PartialEq)]
struct Knobs {
    latency_ms: Option<u64>,
    latency_jitter_ms: Option<u64>,
    transient_rate: Option<f64>,
    throttle_rate: Option<f64>,
    max_per_second: Option<u32>,
    permanent_rate: Option<f64>,
    permanent_undo: Option<bool>,
    denied: Option<bool>,
    lost_answer_rate: Option<f64>,
    outages: Option<Vec<(f64, f64)>>,
}

impl Knobs {
    fn over(&self, base: &Knobs) -> Knobs {
        Knobs {
            latency_ms: self.latency_ms.or(base.latency_ms),
            latency_jitter_ms: self.latency_jitter_ms.or(base.latency_jitter_ms),
            transient_rate: self.transient_rate.or(base.transient_rate),
            throttle_rate: self.throttle_rate.or(base.throttle_rate),
            max_per_second: self.max_per_second.or(base.max_per_second),
            permanent_rate: self.permanent_rate.or(base.permanent_rate),
            permanent_undo: self.permanent_undo.or(base.permanent_undo),
            denied: self.denied.or(base.denied),
            lost_answer_rate: self.lost_answer_rate.or(base.lost_answer_rate),
            outages: self.outages.clone().or_else(|| base.outages.clone()),
        }
    }

    fn parse(value: &Value, at: &str) -> Result<Knobs, String> {
        let Some(fields) = value.as_object() else {
            return Err(format!("{at}: the knobs are an object"));
        };
        let mut k = Knobs::default();
        for (name, v) in fields {
            let bad = || format!("{at}/{name}: {v} is not a value this knob takes");
            let rate = || v.as_f64().filter(|r| (0.0..=1.0).contains(r)).ok_or_else(bad);
            match name.as_str() {
                "latency_ms" => k.latency_ms = Some(v.as_u64().ok_or_else(bad)?),
                "latency_jitter_ms" => k.latency_jitter_ms = Some(v.as_u64().ok_or_else(bad)?),
                "transient_rate" => k.transient_rate = Some(rate()?),
                "throttle_rate" => k.throttle_rate = Some(rate()?),
                "permanent_rate" => k.permanent_rate = Some(rate()?),
                "lost_answer_rate" => k.lost_answer_rate = Some(rate()?),
                "max_per_second" => {
                    let n = v.as_u64().and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
                    k.max_per_second = Some(n.ok_or_else(bad)?);
                }
                "permanent_undo" => k.permanent_undo = Some(v.as_bool().ok_or_else(bad)?),
                "denied" => k.denied = Some(v.as_bool().ok_or_else(bad)?),
                "outages" => {
                    let list = v.as_array().ok_or_else(bad)?;
                    let mut windows = Vec::new();
                    for w in list {
                        let start = w["start_s"].as_f64().ok_or_else(bad)?;
                        let end = w["end_s"].as_f64().ok_or_else(bad)?;
                        if !(0.0 <= start && start < end) {
                            return Err(bad());
                        }
                        windows.push((start, end));
                    }
                    k.outages = Some(windows);
                }
                // Knobs of the simulated service that mean nothing here: the kit draws every
                // random decision from the seed, and the effects' outputs are its own.
                "seed" | "output_bytes" | "forget_keys" | "hold_while" => {
                    return Err(format!(
                        "{at}/{name}: a knob of the simulated service the kit does not take (it draws from the seed and records every effect)"
                    ));
                }
                other => return Err(format!("{at}/{other}: no such knob")),
            }
        }
        Ok(k)
    }
}

impl StandIn {
    /// A service that applies every call.
    pub fn new() -> StandIn {
        StandIn::default()
    }

    /// The simulated service's fault configuration, `{"default": {...}, "actions": {"<action>":
    /// {...}}}`: `latency_ms`, `latency_jitter_ms`, `transient_rate`, `throttle_rate`,
    /// `max_per_second`, `permanent_rate`, `permanent_undo`, `denied`, `lost_answer_rate` and
    /// `outages` (`[{"start_s", "end_s"}]`, from the run's start). A knob it does not know, or
    /// a value it does not take, is an error naming it.
    pub fn from_json(json: &str) -> Result<StandIn, String> {
        let value: Value = serde_json::from_str(json).map_err(|e| format!("knobs: {e}"))?;
        let mut stand_in = StandIn::default();
        for (name, v) in value.as_object().into_iter().flatten() {
            match name.as_str() {
                "default" => stand_in.default = Knobs::parse(v, "/default")?,
                "actions" => {
                    for (action, k) in v.as_object().into_iter().flatten() {
                        let knobs = Knobs::parse(k, &format!("/actions/{action}"))?;
                        stand_in.actions.push((action.clone(), knobs));
                    }
                }
                other => return Err(format!("/{other}: no such part (default, actions)")),
            }
        }
        Ok(stand_in)
    }

    /// Refuses this share of `action`'s new keys for good (a declined card).
    pub fn refusing(mut self, action: &str, rate: f64) -> StandIn {
        self.knobs_of(action).permanent_rate = Some(rate);
        self
    }

    /// Fails this share of `action`'s calls for now, nothing applied (a 503).
    pub fn failing(mut self, action: &str, rate: f64) -> StandIn {
        self.knobs_of(action).transient_rate = Some(rate);
        self
    }

    /// Applies this share of `action`'s calls and loses the answer.
    pub fn losing_answers(mut self, action: &str, rate: f64) -> StandIn {
        self.knobs_of(action).lost_answer_rate = Some(rate);
        self
    }

    /// Answers `action`'s calls after this long, and up to `jitter` more.
    pub fn slow(mut self, action: &str, latency: Duration, jitter: Duration) -> StandIn {
        let knobs = self.knobs_of(action);
        knobs.latency_ms = Some(latency.as_millis() as u64);
        knobs.latency_jitter_ms = Some(jitter.as_millis() as u64);
        self
    }

    /// Takes no more than `per_second` calls of `action` in any second; the others get 429.
    pub fn rate(mut self, action: &str, per_second: u32) -> StandIn {
        self.knobs_of(action).max_per_second = Some(per_second.max(1));
        self
    }

    /// Down (503 to every call) from `start` to `end` after the run's start.
    pub fn down(mut self, start: Duration, end: Duration) -> StandIn {
        let windows = self.default.outages.get_or_insert_with(Vec::new);
        windows.push((start.as_secs_f64(), end.as_secs_f64()));
        self
    }

    fn knobs_of(&mut self, action: &str) -> &mut Knobs {
        if action == "*" {
            return &mut self.default;
        }
        let at = match self.actions.iter().position(|(a, _)| a == action) {
            Some(at) => at,
            None => {
                self.actions.push((action.to_owned(), Knobs::default()));
                self.actions.len() - 1
            }
        };
        &mut self.actions[at].1
    }

    /// The service of one seed's run: `actions` are the agent's, each with whether it is an
    /// undo; every decision drawn from `seed`.
    pub(crate) fn build(
        &self,
        timeline: &Timeline,
        start: Timestamp,
        actions: &[(String, bool)],
        seed: u64,
    ) -> Arc<MemoryRemote<Timeline>> {
        let remote = Arc::new(MemoryRemote::new(timeline.clone()));
        let draw = SplitMix::seeded(seed ^ 0x57a1d);
        for (n, (action, undo)) in actions.iter().enumerate() {
            let knobs = self
                .actions
                .iter()
                .find(|(a, _)| a == action)
                .map_or(self.default.clone(), |(_, k)| k.over(&self.default));
            let at = |s: f64| start.plus(Duration::from_secs_f64(s));
            for &(from, until) in knobs.outages.iter().flatten() {
                remote.outage(Outage {
                    actions: vec![action.clone()],
                    from: at(from),
                    until: at(until),
                    flapping: None,
                    recovery: Duration::ZERO,
                    refusal: None,
                });
            }
            if knobs.denied == Some(true) {
                remote.outage(Outage {
                    actions: vec![action.clone()],
                    from: start,
                    until: start.plus(Duration::from_secs(100 * 365 * 86_400)),
                    flapping: None,
                    recovery: Duration::ZERO,
                    refusal: Some("AccessDenied".into()),
                });
            }
            let throttle = knobs.throttle_rate.unwrap_or(0.0);
            if throttle > 0.0 || knobs.max_per_second.is_some() {
                remote.throttle(Throttle {
                    actions: vec![action.clone()],
                    per_second: knobs.max_per_second,
                    per_mille: (throttle * 1000.0) as u32,
                    retry_after: Some(Duration::from_secs(1)),
                    seed: seed ^ n as u64,
                });
            }
            let refuse = match undo {
                true if knobs.permanent_undo != Some(true) => 0.0,
                _ => knobs.permanent_rate.unwrap_or(0.0),
            };
            let transient = knobs.transient_rate.unwrap_or(0.0);
            let lost = knobs.lost_answer_rate.unwrap_or(0.0);
            let latency = knobs.latency_ms.unwrap_or(0);
            let jitter = knobs.latency_jitter_ms.unwrap_or(0);
            let script: Vec<Behaviour> = (0..2000)
                .map(|_| {
                    let x = draw.unit();
                    if x < refuse {
                        Behaviour::Permanent("refused".into())
                    } else if x < refuse + transient {
                        Behaviour::Transient
                    } else if x < refuse + transient + lost {
                        Behaviour::ApplyThenLoseAnswer
                    } else if latency + jitter > 0 {
                        let extra = (draw.unit() * jitter as f64) as u64;
                        Behaviour::Slow(Duration::from_millis(latency + extra))
                    } else {
                        Behaviour::Succeed
                    }
                })
                .collect();
            remote.script(action, script);
        }
        remote
    }
}

/// What reaches a service of a run: the team's or a stand-in.
#[derive(Clone)]
pub(crate) enum Service {
    Own(Arc<dyn AnyService>),
    /// The stand-in, and how many of its ledger's effects the run's ledger has.
    StandIn {
        remote: Arc<MemoryRemote<Timeline>>,
        seen: Arc<Mutex<usize>>,
    },
}

/// Something the run must report: a handler's panic.
pub(crate) type Alarm = Arc<Mutex<Vec<(sas_engine::OrderId, String)>>>;

/// An agent's service as the run wires it: the faults the seed injects between the agent and
/// the service, a panic in the team's code caught and reported, and each call and answer
/// written to the order's timeline.
#[derive(Clone)]
pub(crate) struct Injected {
    pub agent: String,
    pub service: Service,
    pub ledger: Ledger,
    pub clock: Timeline,
    pub draws: Arc<SplitMix>,
    pub faults: Faults,
    /// Whether the seed's faults are still on (the kit's own injections stop with them).
    pub on: Arc<std::sync::atomic::AtomicBool>,
    /// When, and how, the service misbehaves over time on this seed.
    pub spells: Arc<Vec<Spell>>,
    /// Whether the service is one of the team's own (the kit leaves its answers as they are)
    /// or a stand-in (whose answers the kit may make large).
    pub own: bool,
    pub alarms: Alarm,
    pub timeline: crate::run::Timelines,
    pub injected: Arc<Mutex<[u64; Fault::ALL.len()]>>,
    /// The keys that reached the service: a refusal is a decision about a new key, so the kit
    /// refuses none of these (a service answers a key it took with what it answered).
    pub reached: Arc<Mutex<std::collections::HashSet<String>>>,
    /// The keys the kit refused: refused again, as a service keeps its refusals.
    pub refused: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl Injected {
    /// What the seed does to this call before and after it reaches the service.
    fn draw(&self, call: &RemoteCall) -> Option<Fault> {
        if lock(&self.refused).contains(&call.idempotency_key) {
            return Some(Fault::RemotePermanent);
        }
        if !self.on.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let now = self.clock.now();
        let new_key = !lock(&self.reached).contains(&call.idempotency_key);
        if let Some(spell) = self.spells.iter().find(|s| s.fails(call, now, new_key, &self.draws)) {
            return Some(spell.kind);
        }
        let x = self.draws.unit();
        let stand_in = !self.own;
        let fault = match x {
            x if x < 0.08 => Fault::RemoteTransient,
            x if x < 0.12 => Fault::LostAnswer,
            x if x < 0.14 => Fault::Timeout,
            x if x < 0.17 && call.direction == Direction::Do && new_key => Fault::RemotePermanent,
            x if x < 0.20 => Fault::RemoteThrottled,
            x if x < 0.21 && stand_in && call.direction == Direction::Do => Fault::OversizeOutput,
            x if x < 0.25 && stand_in => Fault::LargeValue,
            _ => return None,
        };
        self.faults.on(fault).then_some(fault)
    }

    fn note(&self, call: &RemoteCall, what: String) {
        let at = self.clock.now();
        let line =
            format!("{at} {}: {} {} → {what}", self.agent, call.action, call.direction.as_str());
        lock(&self.timeline).entry(call.order_id).or_default().push(line);
    }

    /// The service working on a call.
    async fn reach(&self, call: &RemoteCall) -> Answer {
        lock(&self.reached).insert(call.idempotency_key.clone());
        match &self.service {
            Service::Own(own) => {
                let answer =
                    std::panic::AssertUnwindSafe(own.call_boxed(call)).catch_unwind().await;
                answer.unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                        .unwrap_or_else(|| "a panic".into());
                    let what = format!(
                        "the handler of {} panicked on {} ({}): {why}",
                        self.agent,
                        call.action,
                        call.direction.as_str()
                    );
                    lock(&self.alarms).push((call.order_id, what.clone()));
                    Err(RemoteFault::Permanent(what))
                })
            }
            Service::StandIn { remote, seen } => {
                let answer = remote.call(call).await;
                // Every effect the stand-in applied since, into the run's ledger. (It applies
                // a key once: the kit takes no knob that makes it forget its keys.)
                let mut seen = lock(seen);
                let effects = remote.ledger();
                for e in effects.iter().skip(*seen).filter(|e| e.output.get("noop").is_none()) {
                    let step = crate::ledger::step_of(&e.key);
                    let name = format!("{}:{}/{step}", self.agent, e.order_id);
                    let call = RemoteCall {
                        idempotency_key: e.key.clone(),
                        order_id: e.order_id,
                        ..call.clone()
                    };
                    match e.direction {
                        Direction::Do => self.ledger.apply(&call, name),
                        Direction::Undo => self.ledger.undo(&call, name),
                    }
                }
                *seen = effects.len();
                answer
            }
        }
    }
}

impl RemoteService for Injected {
    async fn call(&self, call: &RemoteCall) -> Answer {
        let fault = self.draw(call);
        if let Some(fault) = fault {
            lock(&self.injected)[fault as usize] += 1;
        }
        let answer = match fault {
            Some(Fault::RemoteTransient) => Err(RemoteFault::Transient("unavailable".into())),
            Some(Fault::RemotePermanent | Fault::Denied) => {
                lock(&self.refused).insert(call.idempotency_key.clone());
                let reason = if fault == Some(Fault::Denied) { "AccessDenied" } else { "refused" };
                Err(RemoteFault::Permanent(reason.into()))
            }
            Some(Fault::RemoteThrottled) => {
                let retry_after = Duration::from_millis(500 + (self.draws.unit() * 2500.0) as u64);
                let reason = "429 Too Many Requests".to_owned();
                Err(RemoteFault::Throttled { reason, retry_after: Some(retry_after) })
            }
            Some(Fault::LostAnswer) => {
                let _lost = self.reach(call).await;
                Err(RemoteFault::Transient("answer lost".into()))
            }
            Some(Fault::Timeout) => {
                // Answered after the caller stopped waiting, its effect in place all the same.
                let late = self.clock.now().until(call.deadline) + Duration::from_secs(1);
                self.clock.sleep(late).await;
                let _late = self.reach(call).await;
                Err(RemoteFault::Transient("timeout".into()))
            }
            Some(Fault::LargeValue | Fault::OversizeOutput) => {
                let bytes = match fault {
                    Some(Fault::OversizeOutput) => MAX_PAYLOAD_LEN,
                    _ => 600 + (self.draws.unit() * 200_000.0) as usize,
                };
                self.reach(call).await.map(|mut output| {
                    if let Some(fields) = output.as_object_mut() {
                        fields.insert("statement".into(), "x".repeat(bytes).into());
                    }
                    output
                })
            }
            // Every spell of a service down.
            Some(_) => Err(RemoteFault::Transient("unavailable: outage".into())),
            None => self.reach(call).await,
        };
        let what = match (&fault, &answer) {
            (Some(f), _) => format!("{} (injected)", f.name()),
            (None, Ok(v)) => format!("done {v}"),
            (None, Err(e)) => format!("{e:?}"),
        };
        self.note(call, what);
        answer
    }
}

/// A spell during which a service misbehaves: down (every call failing for now), flapping
/// (down and up in turns), coming back slowly (a share of calls failing, falling to none),
/// down for its forward actions or its undos only, or one action refused for good (a grant
/// taken away: its new keys refused, the keys it took answered).
#[derive(Clone, Debug)]
pub(crate) struct Spell {
    pub kind: Fault,
    pub from: Timestamp,
    pub until: Timestamp,
    /// The action a refusal is of.
    pub action: String,
}

impl Spell {
    fn fails(&self, call: &RemoteCall, now: Timestamp, new_key: bool, draws: &SplitMix) -> bool {
        let during = self.from <= now && now < self.until;
        match self.kind {
            Fault::Flapping => {
                during && (self.from.until(now).as_millis() / FLAP.as_millis()) % 2 == 0
            }
            Fault::SlowRecovery if now >= self.until => {
                let since = self.until.until(now);
                since < RECOVERY
                    && draws.unit() < 1.0 - since.as_secs_f64() / RECOVERY.as_secs_f64()
            }
            Fault::ForwardDown => during && call.direction == Direction::Do,
            Fault::UndoDown => during && call.direction == Direction::Undo,
            Fault::Denied => during && new_key && call.action == self.action,
            _ => during,
        }
    }
}

/// How long a flapping service is down, then up, in turns; how long a slow one takes to come
/// back once its spell is over.
const FLAP: Duration = Duration::from_secs(4);
const RECOVERY: Duration = Duration::from_secs(60);

/// The spells a seed gives a service, among the kinds switched on: on half the seeds one
/// spell of up to two minutes within the first ten, of a kind drawn, over `actions`.
pub(crate) fn spells(
    draw: &SplitMix,
    start: Timestamp,
    faults: Faults,
    actions: &[(String, bool)],
) -> Vec<Spell> {
    const KINDS: [Fault; 6] = [
        Fault::Outage,
        Fault::Flapping,
        Fault::SlowRecovery,
        Fault::ForwardDown,
        Fault::UndoDown,
        Fault::Denied,
    ];
    // Drawn whatever is switched on, so that switching one kind off leaves the others' draws.
    let (some, x, from, long, which) =
        (draw.unit() < 0.5, draw.unit(), draw.unit(), draw.unit(), draw.unit());
    let kind = KINDS[((x * KINDS.len() as f64) as usize).min(KINDS.len() - 1)];
    let forward: Vec<&String> = actions.iter().filter(|(_, undo)| !undo).map(|(a, _)| a).collect();
    if !some || !faults.on(kind) || forward.is_empty() {
        return Vec::new();
    }
    let from = start.plus(Duration::from_secs_f64(from * 600.0));
    let until = from.plus(Duration::from_secs_f64(10.0 + long * 110.0));
    let action = forward[((which * forward.len() as f64) as usize).min(forward.len() - 1)].clone();
    vec![Spell { kind, from, until, action }]
}
