//! Guards broken on purpose, so that the test suite can show it notices each one.
//!
//! A check that passes whatever the engine does proves nothing; the simulations switch one of
//! these on and expect to fail. They exist only with the `mutants` feature, which the engine's
//! own tests turn on; without it every switch reads as off and the code around it is what runs
//! in production. A switch is per thread, so tests running side by side do not see each other's.

/// One deliberately broken guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutant {
    /// The reply guard off by one: a reply of the attempt before the current one is taken.
    ReplyFromPreviousAttempt,
    /// A redrive gives a step of unknown outcome keys of a new generation, so its service
    /// cannot answer what it already did.
    NewKeysForUncertainSteps,
    /// The supervisor judges a lease as soon as its CompleteBy passes, however long the queues
    /// make messages wait.
    NoHorizon,
    /// A Pending order reset by the supervisor takes a new attempt, so its late start message
    /// no longer claims it.
    PendingResetTakesNewAttempt,
    /// An agent's deadline is the lease's CompleteBy, so a request that waited in its queue
    /// past it is dropped instead of run with its budget.
    AgentDeadlineFromCompleteBy,
    /// An answer to a step that waits for one counts whatever token it bears.
    AnswerWithAnyToken,
    /// A guarded agent told its service is held calls it all the same.
    HeldAgentCallsService,
    /// A step that waits for its held service holds a lease as long as its budget, as a step
    /// in flight does, instead of its `max_hold`: it fails with the budget.
    HeldStepBurnsLease,
    /// The supervisor resumes no order for a service open again (but for its probes).
    NoResume,
    /// The supervisor announces a hold or a release without recording it, so that it goes
    /// out again at the next sweep.
    AnnouncementUnrecorded,
    /// A declared rate's turns are spaced a second over the rate apart, with no room for calls
    /// that take a little longer than others to reach the service.
    SpacingWithoutTravel,
    /// An agent hands its service the references to stored values as they are, instead of
    /// the values they stand for.
    StoredValuesUnread,
    /// The end of an element of a list is counted whether or not it was in flight, so that a
    /// duplicate of it counts again.
    ElementEndsCountedTwice,
    /// A child its parent undoes while it is in flight ends Processed when the cancel comes
    /// too late, as an order cancelled by an operator does, and its parent takes it as undone.
    ChildKeptWhenUndoComesLate,
    /// An event delivered again, whose order exists, starts another under a key of its own.
    EventStartedAgain,
    /// A hold of one action stops every call of its service, and any call of the service may
    /// probe it: an action that answers waits for another that does not, and its answer opens
    /// a hold it did not try.
    ProbeOfAnotherAction,
    /// A refusal counts towards a hold, as a passing fault does.
    RefusalCountsTowardsHold,
    /// An order that ended records its key's place given back without giving it back.
    PlaceKeptOnEnd,
    /// An order that ended gives back its key's place and another's besides, as a counter
    /// decremented twice would.
    PlaceFreedTwice,
}

impl Mutant {
    /// The recovery before queue waits were taken into account: all three at once.
    pub const OLD_RECOVERY: [Mutant; 3] = [
        Mutant::NoHorizon,
        Mutant::PendingResetTakesNewAttempt,
        Mutant::AgentDeadlineFromCompleteBy,
    ];

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

#[cfg(feature = "mutants")]
thread_local! {
    static ON: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether `mutant` is switched on for this thread; always false without the feature.
#[inline]
pub fn on(mutant: Mutant) -> bool {
    #[cfg(feature = "mutants")]
    {
        ON.with(|on| on.get() & mutant.bit() != 0)
    }
    #[cfg(not(feature = "mutants"))]
    {
        let _ = mutant.bit();
        false
    }
}

/// Switches `mutants` on for this thread until the guard is dropped.
#[cfg(feature = "mutants")]
pub fn switch_on(mutants: &[Mutant]) -> Switched {
    let before = ON.with(|on| on.replace(mutants.iter().fold(on.get(), |bits, m| bits | m.bit())));
    Switched { before }
}

/// Puts the switches back as they were when dropped.
#[cfg(feature = "mutants")]
#[derive(Debug)]
#[must_use = "the mutants are switched off again when this is dropped"]
pub struct Switched {
    before: u32,
}

#[cfg(feature = "mutants")]
impl Drop for Switched {
    fn drop(&mut self) {
        ON.with(|on| on.set(self.before));
    }
}
