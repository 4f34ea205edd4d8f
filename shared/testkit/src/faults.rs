//! The kinds of fault a run injects, and which of them are switched on. The engine's own
//! simulation injects every kind; a team's run ([`crate::Kit`]) injects those that reach a
//! workflow from outside its agents' code (see [`Fault`] for each).

/// A kind of fault a run can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// A message deleted instead of handled.
    Lost,
    /// A second copy of a message sent.
    Duplicated,
    /// A message handled before others that were visible earlier.
    Reordered,
    /// Messages left invisible until their visibility timeout.
    Delayed,
    /// A handler dying at one of its port calls.
    Crash,
    /// A write refused as throttled.
    Throttled,
    /// Two supervisors sweeping at once.
    DoubleSweep,
    /// Writes reaching the expiry index seconds late (every other seed).
    IndexLag,
    /// Eventual reads seeing records as they were a second ago (every third seed).
    StaleRead,
    /// A remote call failing for now.
    RemoteTransient,
    /// A remote call refused for good.
    RemotePermanent,
    /// A remote effect applied and its answer lost.
    LostAnswer,
    /// A remote call answering after the caller's deadline, its effect applied.
    Timeout,
    /// A remote effect applied, answered with more than a step may return.
    OversizeOutput,
    /// An output, or an order's input, too large to carry in a message: stored outside the
    /// record, and read back by the agents that need it.
    LargeValue,
    /// An operator's command on a random order.
    Operator,
    /// Replies handled together, concurrently, as one batch of the reply queue is.
    Batched,
    /// An answer from outside to a step that waits for one: given, refused or kept alive, with
    /// the token of its announcement, an older one, a forged one, or by an operator.
    Answer,
    /// A service down for a spell: every call of its actions fails for now (on the seeds whose
    /// services misbehave over time, as the three below; counted once it failed a call).
    Outage,
    /// A service down and up in turns of a few seconds.
    Flapping,
    /// A service down, then coming back slowly: a share of calls failing, falling to none.
    SlowRecovery,
    /// An operator holding a service by hand, or releasing it (its own hold or its agent's).
    ManualHold,
    /// A remote call answered 429 with a `Retry-After`, above the service's own rate or at
    /// random (on the seeds whose services are paced, as the one below).
    RemoteThrottled,
    /// Requests of one agent handled together, concurrently, as one batch of its queue is.
    AgentBatch,
    /// A service whose forward actions are down for a spell while its undos answer (on the
    /// seeds whose services misbehave, as the two below).
    ForwardDown,
    /// A service whose undos are down for a spell while its forward actions answer.
    UndoDown,
    /// One action of a service refused for good for a spell, as a grant taken away is: no
    /// sign of the service being down, the step's own failure.
    Denied,
    /// One order's messages of a batch handled in one turn, as the deployed scheduler does:
    /// what they do written at once, a crash anywhere in it.
    Folded,
}

impl Fault {
    /// Every kind, in the order of their names' list.
    pub const ALL: [Fault; 28] = [
        Fault::Lost,
        Fault::Duplicated,
        Fault::Reordered,
        Fault::Delayed,
        Fault::Crash,
        Fault::Throttled,
        Fault::DoubleSweep,
        Fault::IndexLag,
        Fault::StaleRead,
        Fault::RemoteTransient,
        Fault::RemotePermanent,
        Fault::LostAnswer,
        Fault::Timeout,
        Fault::OversizeOutput,
        Fault::LargeValue,
        Fault::Operator,
        Fault::Batched,
        Fault::Answer,
        Fault::Outage,
        Fault::Flapping,
        Fault::SlowRecovery,
        Fault::ManualHold,
        Fault::RemoteThrottled,
        Fault::AgentBatch,
        Fault::ForwardDown,
        Fault::UndoDown,
        Fault::Denied,
        Fault::Folded,
    ];

    /// The kind's name, as `SIM_FAULTS` and `SIM_FAULTS_OFF` take it.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Lost => "lost",
            Fault::Duplicated => "duplicated",
            Fault::Reordered => "reordered",
            Fault::Delayed => "delayed",
            Fault::Crash => "crash",
            Fault::Throttled => "throttled",
            Fault::DoubleSweep => "double-sweep",
            Fault::IndexLag => "index-lag",
            Fault::StaleRead => "stale-read",
            Fault::RemoteTransient => "remote-transient",
            Fault::RemotePermanent => "remote-permanent",
            Fault::LostAnswer => "lost-answer",
            Fault::Timeout => "timeout",
            Fault::OversizeOutput => "oversize-output",
            Fault::LargeValue => "large-value",
            Fault::Operator => "operator",
            Fault::Batched => "batched",
            Fault::Answer => "answer",
            Fault::Outage => "outage",
            Fault::Flapping => "flapping",
            Fault::SlowRecovery => "slow-recovery",
            Fault::ManualHold => "manual-hold",
            Fault::RemoteThrottled => "remote-throttled",
            Fault::AgentBatch => "agent-batch",
            Fault::ForwardDown => "forward-down",
            Fault::UndoDown => "undo-down",
            Fault::Denied => "denied",
            Fault::Folded => "folded",
        }
    }

    /// The kind named `name`; an unknown name is an error that lists the known ones.
    pub fn parse(name: &str) -> Result<Fault, String> {
        Fault::ALL.into_iter().find(|f| f.name() == name).ok_or_else(|| {
            let known: Vec<_> = Fault::ALL.iter().map(|f| f.name()).collect();
            format!("unknown fault kind {name:?}; the kinds are {}", known.join(", "))
        })
    }
}

/// The fault kinds switched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Faults([bool; Fault::ALL.len()]);

impl Faults {
    /// Every kind.
    pub fn all() -> Faults {
        Faults([true; Fault::ALL.len()])
    }

    /// No kind at all: a run with no fault but the services' own answers.
    pub fn none() -> Faults {
        Faults([false; Fault::ALL.len()])
    }

    /// These kinds, and `fault` too.
    pub fn with(mut self, fault: Fault) -> Faults {
        self.0[fault as usize] = true;
        self
    }

    /// These kinds but `fault`.
    pub fn without(mut self, fault: Fault) -> Faults {
        self.0[fault as usize] = false;
        self
    }

    /// Whether `fault` is switched on.
    pub fn on(self, fault: Fault) -> bool {
        self.0[fault as usize]
    }

    /// From `SIM_FAULTS` (only these kinds) and `SIM_FAULTS_OFF` (all but these kinds); a
    /// name that is no kind is an error naming the known ones.
    pub fn from_env() -> Result<Faults, String> {
        let names = |var: &str| -> Result<Vec<Fault>, String> {
            let Ok(v) = std::env::var(var) else { return Ok(Vec::new()) };
            v.split(',').map(str::trim).filter(|n| !n.is_empty()).map(Fault::parse).collect()
        };
        let mut faults = Faults::all();
        if std::env::var("SIM_FAULTS").is_ok() {
            faults = Faults::none();
            for f in names("SIM_FAULTS")? {
                faults = faults.with(f);
            }
        }
        for f in names("SIM_FAULTS_OFF")? {
            faults = faults.without(f);
        }
        Ok(faults)
    }
}
