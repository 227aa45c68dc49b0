//! Verified state: a node adopts a peer's state only when it can check it.
//!
//! A state θ(r+1) is the deterministic result of applying the swarm's aggregator and outer step
//! ([`Recipe::apply`]) to θ(r) and the set of signed contributions that formed it. So:
//! - **Replay.** A state one round ahead of one we trust (our current state, or for a fork the
//!   state before it) is checked by fetching the contributions its holders say formed it,
//!   verifying each (signature, swarm, round, base state, membership, bounds) and replaying the
//!   round — no training, and fewer bytes than the state itself.
//! - **Attestation.** A state further ahead is adopted only when the swarm's rules vouch for
//!   it: a bootstrap node named in the manifest (which follows every round by replay) signed a
//!   status holding it, or, in a private swarm, the manifest's quorum of members did.
//! - **Choice.** Between verified states of one round, the one formed by more contributions
//!   wins, then the smaller hash ([`preferred`]); every node applying this picks the same.
//!
//! A claim — a signed status — is only a pointer to something to check; how many peers repeat
//! it does not matter. The rules live in the round machine ([`crate::machine::rules`]), which
//! runs the verification stage by stage (`machine/align.rs`); this module names them for the
//! daemon's and the lab's users.

pub use crate::machine::rules::*;
