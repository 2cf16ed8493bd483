//! Deliberate flaws in the quorum protocol, for the simulation's negative controls
//! (`leader_core::simulation::QuorumFlaw`, feature `simulation`; without it no flaw can be
//! planted, and the flawed branches are dead code the optimiser drops).

/// A deliberate flaw in the election over a quorum.
#[cfg_attr(not(feature = "simulation"), allow(dead_code, unreachable_pub))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum QuorumFlaw {
    /// None: the rules as documented.
    #[default]
    None,
    /// The term's deadline is the largest of the members' deadlines, not the majority-th
    /// largest: a leader that lost all but one member goes on.
    DeadlineFromLargest,
    /// An absent record on a key with a history is taken at once, without a tombstone timed
    /// for a ttl.
    AbsentTakenAtOnce,
    /// A released record is free at once if this member alone shows it released, not a
    /// majority.
    ReleasedByMinority,
    /// The token is one above what the first member that answered shows, not above
    /// everything a majority showed.
    TokenFromOne,
    /// A term needs one member: minorities write and lead.
    MajorityOfOne,
    /// A term needs half the members: with four, two halves can each lead.
    EvenHalves,
    /// The renew on the first member is blind: written on whatever revision it finds there,
    /// not on the term's own last write.
    BlindRenew,
}
