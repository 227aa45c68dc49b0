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
//! it does not matter.

use libp2p::PeerId;
use nightshift_protocol::{
    ContributionId, Hash32, Request, Response, SignedEnvelope, StateSnapshot,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::machine::rules::*;
use crate::net::{NetHandle, peer_id_of};

/// Time-out of one contribution look-up while replaying.
const FETCH_TIMEOUT_SECS: u64 = 10;
/// The longest a replay may spend fetching.
const REPLAY_TIMEOUT_SECS: u64 = 60;

/// Replays `claim` from `base` (hash `base_hash`): fetches every contribution it names (from
/// `known` when we hold it, else from the claim's holders), verifies each, applies the round
/// and checks the result against the claimed hash.
///
/// # Errors
/// When a contribution cannot be had or is refused, or the result differs from the claim.
pub async fn replay(
    net: &NetHandle,
    recipe: Arc<Recipe>,
    base: Arc<StateSnapshot>,
    base_hash: Hash32,
    claim: &Claim,
    known: &HashMap<[u8; 32], Arc<SignedEnvelope>>,
) -> Result<Replayed, ReplayError> {
    if claim.formed_by.len() > recipe.max_contributors() {
        return Err(ReplayError::TooMany(claim.formed_by.len()));
    }
    if claim.formed_by.is_empty() {
        return Err(ReplayError::Empty);
    }
    let round = base.round;
    let fetches = claim.formed_by.iter().map(|id| {
        let held = known
            .get(&id.sender)
            .filter(|e| ContributionId::of(e) == *id)
            .cloned();
        // Ask the sender itself first when it holds the state too: every member serves its own
        // contribution, and no single holder serves them all. A few holders at most.
        let mut holders = claim.holders.clone();
        if let Some(i) = holders.iter().position(|h| *h == id.sender) {
            holders.swap(0, i);
        }
        holders.truncate(MAX_HOLDERS_ASKED);
        let holders: Vec<PeerId> = holders.iter().filter_map(peer_id_of).collect();
        let net = net.clone();
        let id = *id;
        async move {
            if let Some(env) = held {
                return Ok((env, 0u64));
            }
            for peer in holders {
                let r = tokio::time::timeout(
                    Duration::from_secs(FETCH_TIMEOUT_SECS),
                    net.request(
                        peer,
                        Request::GetContribution {
                            round,
                            sender: id.sender,
                        },
                    ),
                )
                .await;
                // Only the very contribution the claim names: a holder serving another one of
                // the sender's (or junk) is passed over for the next.
                if let Ok(Ok(Response::Contribution(Some(env)))) = r
                    && env.header.round == round
                    && ContributionId::of(&env) == id
                {
                    let bytes = env.payload.len() as u64;
                    return Ok((Arc::new(env), bytes));
                }
            }
            Err(ReplayError::Unavailable(hex::encode(&id.sender[..6])))
        }
    });
    let fetched: Vec<(Arc<SignedEnvelope>, u64)> = tokio::time::timeout(
        Duration::from_secs(REPLAY_TIMEOUT_SECS),
        futures::future::join_all(fetches),
    )
    .await
    .map_err(|_| ReplayError::TimedOut)?
    .into_iter()
    .collect::<Result<_, _>>()?;
    let claimed = claim.hash;
    tokio::task::spawn_blocking(move || {
        let fetched_bytes = fetched.iter().map(|(_, b)| b).sum();
        let envelopes: Vec<Arc<SignedEnvelope>> = fetched.into_iter().map(|(e, _)| e).collect();
        let mut r = replay_round(&recipe, &base, base_hash, envelopes, claimed)?;
        r.fetched_bytes = fetched_bytes;
        Ok(r)
    })
    .await
    .map_err(|e| ReplayError::Task(e.to_string()))?
}

/// A verified state, ready to adopt.
pub struct Verified {
    pub state: StateSnapshot,
    /// The peer it came from (the first holder, for a replay).
    pub from: PeerId,
    /// "replay" or "attested".
    pub verified: &'static str,
    /// Bytes fetched to verify it.
    pub bytes: u64,
    /// The state it was replayed from (none for an attested one): the base a later fork of its
    /// round is replayed from.
    pub prev: Option<(Arc<StateSnapshot>, Hash32)>,
    /// The contributions that formed it, to serve on to others who replay it.
    pub envelopes: Vec<Arc<SignedEnvelope>>,
    /// Milliseconds the replay's verifying and arithmetic took (not the fetching).
    pub replay_ms: Option<f64>,
}

/// Downloads the attested state `claim` names from its holders (checked against its hash and
/// contribution list).
async fn download(
    net: &NetHandle,
    store: &crate::store::Store,
    recipe: &Recipe,
    claim: &Claim,
) -> Result<Verified, (anyhow::Error, bool)> {
    let holders: Vec<PeerId> = claim.holders.iter().filter_map(peer_id_of).collect();
    super::sync::fetch_state(
        net,
        store,
        recipe.num_params,
        &holders,
        claim.round,
        claim.hash,
        &claim.formed_by,
    )
    .await
    .map(|(state, from, bytes)| Verified {
        state,
        from,
        verified: "attested",
        bytes,
        prev: None,
        envelopes: vec![],
        replay_ms: None,
    })
    .map_err(|e| (e, false))
}

/// Tries `list` in order and returns the first state that verifies: a fork replayed from
/// `prev`, a state one round ahead replayed from `current`, an attested state downloaded (into
/// `store`) and checked against its hash. `known` holds contributions we already have, by round
/// and sender. A claim that fails is noted in `rejected`.
///
/// # Errors
/// Never: failures are logged and noted; `None` when nothing verified.
#[allow(clippy::too_many_arguments)]
pub async fn first_verified(
    net: &NetHandle,
    store: &crate::store::Store,
    recipe: &Arc<Recipe>,
    current: (&StateSnapshot, Hash32),
    prev: Option<&(Arc<StateSnapshot>, Hash32)>,
    list: Vec<Candidate>,
    known: &HashMap<(u64, [u8; 32]), Arc<SignedEnvelope>>,
    rejected: &mut Rejections,
) -> Option<Verified> {
    for cand in list {
        let claim = cand.claim().clone();
        let base = match &cand {
            Candidate::Fork(_) => match prev {
                Some((b, h)) if b.round + 1 == claim.round => Some((b.clone(), *h)),
                _ => continue,
            },
            Candidate::Ahead(_) => Some((Arc::new(current.0.clone()), current.1)),
            Candidate::Attested(_) => None,
        };
        let outcome: Result<Verified, (anyhow::Error, bool)> = match base {
            Some((base, base_hash)) => {
                let held: HashMap<[u8; 32], Arc<SignedEnvelope>> = known
                    .iter()
                    .filter(|((r, _), _)| *r == base.round)
                    .map(|((_, k), e)| (*k, e.clone()))
                    .collect();
                replay(net, recipe.clone(), base.clone(), base_hash, &claim, &held)
                    .await
                    .map(|r| Verified {
                        state: r.state,
                        from: peer_id_of(&claim.holders[0]).unwrap_or(net.local_peer),
                        verified: "replay",
                        bytes: r.fetched_bytes,
                        prev: Some((base, base_hash)),
                        envelopes: r.envelopes,
                        replay_ms: Some(r.replay_ms),
                    })
                    .map_err(|e| {
                        let fault = e.is_fault();
                        (anyhow::Error::from(e), fault)
                    })
            }
            None => download(net, store, recipe, &claim).await,
        };
        // A state that builds on a base we do not hold (we are on a fork of the round before)
        // is not the claim's fault: when the swarm's rules vouch for it, download it instead.
        let outcome = match outcome {
            Err((e, false))
                if recipe.attested(&claim)
                    && e.downcast_ref::<ReplayError>()
                        .is_some_and(|e| matches!(e, ReplayError::OtherBase { .. })) =>
            {
                download(net, store, recipe, &claim).await
            }
            other => other,
        };
        match outcome {
            Ok(v) => return Some(v),
            Err((e, fault)) => {
                tracing::warn!(round = claim.round, hash = %claim.hash.short(), error = %e, "a claimed state did not verify; not adopting it");
                rejected.note(&claim, fault, crate::net::mono_ms());
            }
        }
    }
    None
}
