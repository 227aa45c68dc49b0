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
use nightshift_model::OuterOptimizer;
use nightshift_protocol::{
    Aggregator, ContributionId, DeltaCodec, Hash32, Request, Response, SignedEnvelope,
    SignedManifest, StateSnapshot, Status,
};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

use super::accept::{Accepted, RoundContext, RoundStep, accept, round_step};
use crate::net::{NetHandle, public_key_of};

/// Time-out of one contribution look-up while replaying.
const FETCH_TIMEOUT_SECS: u64 = 10;
/// Holders asked for one contribution before a replay gives up on it.
const MAX_HOLDERS_ASKED: usize = 3;
/// The longest a replay may spend fetching.
const REPLAY_TIMEOUT_SECS: u64 = 60;
/// Most contributions a round of an open swarm counts.
pub const MAX_OPEN_CONTRIBUTORS: usize = 256;
/// Most candidate states tried per alignment (each may cost a look-up per contribution).
pub const MAX_CANDIDATES: usize = 4;

/// What replaying a round needs to know about the swarm: the manifest's recipe.
#[derive(Clone, Debug)]
pub struct Recipe {
    pub swarm_id: Hash32,
    /// Members who may contribute (`None`: an open swarm).
    pub allowlist: Option<Vec<[u8; 32]>>,
    /// Bootstrap keys, whose attestation a node far behind trusts.
    pub bootstraps: Vec<[u8; 32]>,
    pub attest_quorum: u32,
    pub num_params: usize,
    /// Parameter shapes in flat order (the low-rank codec's matrices).
    pub shapes: Arc<Vec<Vec<usize>>>,
    pub codec: DeltaCodec,
    /// Most tokens one round can train (H · batch · seq).
    pub max_tokens: u64,
    pub aggregator: Aggregator,
    pub outer_lr: f32,
    pub outer_momentum: f32,
}

impl Recipe {
    /// The recipe of `m` for a model of `shapes`.
    pub fn new(m: &SignedManifest, shapes: Arc<Vec<Vec<usize>>>) -> Self {
        let t = &m.manifest.training;
        Recipe {
            swarm_id: m.swarm_id(),
            allowlist: m.manifest.allowlist().map(<[_]>::to_vec),
            bootstraps: m.manifest.bootstraps.clone(),
            attest_quorum: m.manifest.attest_quorum,
            num_params: shapes.iter().map(|s| s.iter().product::<usize>()).sum(),
            shapes,
            codec: t.codec,
            max_tokens: t.inner_steps as u64
                * t.batch_size as u64
                * m.manifest.model.seq_len as u64,
            aggregator: m.manifest.aggregator,
            outer_lr: t.outer_lr,
            outer_momentum: t.outer_momentum,
        }
    }

    /// Most contributions one round may count: the members, or [`MAX_OPEN_CONTRIBUTORS`] in an
    /// open swarm (where keys are free, so the bound is what keeps a round's memory bounded).
    pub fn max_contributors(&self) -> usize {
        self.allowlist
            .as_ref()
            .map_or(MAX_OPEN_CONTRIBUTORS, Vec::len)
    }

    /// Whether `claim` could be a state of this swarm at all: no more contributions than a round
    /// counts, and in a swarm with an allowlist, only members' (the list is checked again by
    /// the replay; this keeps a made-up list from costing look-ups or inflating a count).
    pub fn plausible(&self, claim: &Claim) -> bool {
        claim.formed_by.len() <= self.max_contributors()
            && self.allowlist.as_ref().is_none_or(|members| {
                claim
                    .formed_by
                    .iter()
                    .all(|id| members.contains(&id.sender))
            })
    }

    /// What a contribution to the round that starts from `base` (whose hash is `base_hash`)
    /// must match.
    pub fn context(&self, round: u64, base_hash: Hash32) -> RoundContext<'_> {
        RoundContext {
            swarm_id: self.swarm_id,
            round,
            base_hash,
            allowlist: self.allowlist.as_deref(),
            num_params: self.num_params,
            shapes: &self.shapes,
            codec: self.codec,
            max_tokens: self.max_tokens,
        }
    }

    /// The round from `base` with the contributions `set`: θ(r+1) with its momentum, the set that
    /// formed it and the noise ratio, and the step taken. The one function both a round's own
    /// outer step and a replay run, so the two agree bit for bit. `None` when `set` is empty.
    pub fn apply(
        &self,
        base: &StateSnapshot,
        set: &BTreeMap<[u8; 32], Accepted>,
    ) -> Option<(StateSnapshot, RoundStep)> {
        let step = round_step(set, base.noise, self.aggregator)?;
        let mut params = base.params.clone();
        let mut outer = OuterOptimizer {
            lr: self.outer_lr,
            momentum: self.outer_momentum,
            buf: base.momentum.clone(),
        };
        outer.step(&mut params, &step.delta);
        let state = StateSnapshot {
            round: base.round + 1,
            params,
            momentum: outer.buf,
            formed_by: set
                .values()
                .map(|a| ContributionId {
                    sender: a.sender,
                    digest: a.digest,
                })
                .collect(),
            noise: step.noise,
        };
        Some((state, step))
    }

    /// Whether the swarm's rules vouch for `claim` without a replay: a bootstrap named in the
    /// manifest signed it, or (private swarm) at least the quorum of members did.
    pub fn attested(&self, claim: &Claim) -> bool {
        if claim.signers.iter().any(|s| self.bootstraps.contains(s)) {
            return true;
        }
        match &self.allowlist {
            Some(members) => {
                let n = claim
                    .signers
                    .iter()
                    .filter(|s| members.contains(s))
                    .collect::<HashSet<_>>()
                    .len();
                n >= self.attest_quorum.max(1) as usize
            }
            // In an open swarm anyone can make keys: only bootstraps attest.
            None => false,
        }
    }
}

/// A state some peers say they hold: its round, hash and the contributions that formed it, who
/// holds it and who signed that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub round: u64,
    pub hash: Hash32,
    /// Sorted by sender, one per sender.
    pub formed_by: Vec<ContributionId>,
    pub holders: Vec<PeerId>,
    pub signers: Vec<[u8; 32]>,
}

/// Groups verified statuses into claims (one per round, hash and contribution set). A status
/// that lists a sender twice claims nothing.
pub fn group_claims<'a>(statuses: impl IntoIterator<Item = (PeerId, &'a Status)>) -> Vec<Claim> {
    let mut out: Vec<Claim> = vec![];
    for (peer, s) in statuses {
        let mut formed = s.formed_by.clone();
        formed.sort_unstable();
        if formed.windows(2).any(|w| w[0].sender == w[1].sender) {
            continue;
        }
        let Some(signer) = public_key_of(&peer) else {
            continue;
        };
        match out
            .iter_mut()
            .find(|c| c.round == s.round && c.hash == s.state_hash && c.formed_by == formed)
        {
            Some(c) => {
                c.holders.push(peer);
                c.signers.push(signer);
            }
            None => out.push(Claim {
                round: s.round,
                hash: s.state_hash,
                formed_by: formed,
                holders: vec![peer],
                signers: vec![signer],
            }),
        }
    }
    out
}

/// Which of two states of the same round the swarm continues from: the one formed by more
/// contributions (more of the swarm's work counted), then the smaller hash. `Less` means `a` is
/// preferred.
pub fn preferred(a: (usize, Hash32), b: (usize, Hash32)) -> Ordering {
    b.0.cmp(&a.0).then(a.1.cmp(&b.1))
}

/// How long a claim that failed to verify, and the peers that signed it, are left alone.
pub const REJECT_SECS: u64 = 30;

/// Claims that failed to verify lately, and the signers of those that were at fault: neither is
/// tried again for [`REJECT_SECS`], so a peer that keeps claiming made-up states (a new one every
/// second) costs a node one failed verification per [`REJECT_SECS`], not one per round. A claim
/// that failed only because a contribution could not be fetched leaves its signers in good
/// standing.
#[derive(Debug, Default)]
pub struct Rejections {
    hashes: HashMap<Hash32, std::time::Instant>,
    signers: HashMap<[u8; 32], std::time::Instant>,
}

impl Rejections {
    /// Notes that `claim` failed to verify: its hash, and when the claim itself was at fault
    /// (not the network), its signers too.
    pub fn note(&mut self, claim: &Claim, fault: bool) {
        let now = std::time::Instant::now();
        self.hashes.insert(claim.hash, now);
        if fault {
            for s in &claim.signers {
                self.signers.insert(*s, now);
            }
        }
    }

    /// Forgets what is older than [`REJECT_SECS`].
    pub fn prune(&mut self) {
        let fresh = |at: &mut std::time::Instant| at.elapsed() < Duration::from_secs(REJECT_SECS);
        self.hashes.retain(|_, at| fresh(at));
        self.signers.retain(|_, at| fresh(at));
    }

    /// Whether `claim` is left alone: its hash failed lately, or every one of its signers
    /// signed a claim that did.
    pub fn skips(&self, claim: &Claim) -> bool {
        self.hashes.contains_key(&claim.hash)
            || (!claim.signers.is_empty()
                && claim.signers.iter().all(|s| self.signers.contains_key(s)))
    }
}

/// One way to a better state, in the order to try them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Candidate {
    /// A state of our own round formed differently, preferred over ours: replay it from the
    /// state before ours.
    Fork(Claim),
    /// A state one round ahead: replay it from ours.
    Ahead(Claim),
    /// A state more than a round ahead, vouched for by attestation: download it and check its
    /// hash and contribution list.
    Attested(Claim),
}

impl Candidate {
    pub fn claim(&self) -> &Claim {
        match self {
            Candidate::Fork(c) | Candidate::Ahead(c) | Candidate::Attested(c) => c,
        }
    }
}

/// What we hold: the round, hash and number of contributions that formed it.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub round: u64,
    pub hash: Hash32,
    pub formed: usize,
}

/// The candidates worth trying, best first: forks of our round that the rules prefer over our
/// state, then states one round ahead (most contributions first), both to be replayed, then
/// attested states more than one round ahead (highest round first). A state a node could replay
/// is never taken on attestation: what fails to replay is not adopted, however many sign it.
/// Claims that `rejected` skips, and implausible ones ([`Recipe::plausible`]), are left out.
pub fn candidates(
    recipe: &Recipe,
    held: Held,
    claims: &[Claim],
    rejected: &Rejections,
) -> Vec<Candidate> {
    let key = |c: &Claim| (c.formed_by.len(), c.hash);
    let fresh = |c: &&Claim| !rejected.skips(c) && c.hash != held.hash && recipe.plausible(c);
    let mut forks: Vec<&Claim> = claims
        .iter()
        .filter(fresh)
        .filter(|c| c.round == held.round)
        .filter(|c| preferred(key(c), (held.formed, held.hash)) == Ordering::Less)
        .collect();
    forks.sort_by(|a, b| preferred(key(a), key(b)));
    let mut ahead: Vec<&Claim> = claims
        .iter()
        .filter(fresh)
        .filter(|c| c.round == held.round + 1)
        .collect();
    ahead.sort_by(|a, b| preferred(key(a), key(b)));
    let mut far: Vec<&Claim> = claims
        .iter()
        .filter(fresh)
        .filter(|c| c.round > held.round + 1 && recipe.attested(c))
        .collect();
    far.sort_by(|a, b| b.round.cmp(&a.round).then(preferred(key(a), key(b))));
    let mut out: Vec<Candidate> = forks
        .iter()
        .map(|c| Candidate::Fork((*c).clone()))
        .collect();
    out.extend(ahead.iter().map(|c| Candidate::Ahead((*c).clone())));
    out.extend(far.iter().map(|c| Candidate::Attested((*c).clone())));
    out.truncate(MAX_CANDIDATES * 2);
    out
}

/// Why a claimed state could not be verified.
#[derive(Debug, Error)]
pub enum ReplayError {
    #[error("no holder served {0}'s contribution")]
    Unavailable(String),
    #[error("contribution of {sender}: {reason}")]
    Refused { sender: String, reason: String },
    #[error("the claim names {0} contributors, more than the swarm can have")]
    TooMany(usize),
    #[error("the claim names no contributions")]
    Empty,
    #[error("replaying the round gives state {got}, not the claimed {claimed}")]
    Mismatch { got: String, claimed: String },
    #[error("fetching the contributions took too long")]
    TimedOut,
    #[error("replay task failed: {0}")]
    Task(String),
}

impl ReplayError {
    /// Whether the claim itself is at fault (its contributions do not form it, or are not
    /// acceptable), rather than the network (a contribution that could not be had in time).
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            ReplayError::Unavailable(_) | ReplayError::TimedOut | ReplayError::Task(_)
        )
    }
}

/// A verified state and what verifying it took.
pub struct Replayed {
    pub state: StateSnapshot,
    pub hash: Hash32,
    /// The contributions that formed it, to serve to others who replay it from us.
    pub envelopes: Vec<Arc<SignedEnvelope>>,
    pub step: RoundStep,
    /// Bytes of the contributions fetched (not counting those we held).
    pub fetched_bytes: u64,
    /// Milliseconds spent on verifying and replaying (not fetching).
    pub replay_ms: f64,
}

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
        if let Some(own) = crate::net::peer_id_of(&id.sender)
            && let Some(i) = holders.iter().position(|h| *h == own)
        {
            holders.swap(0, i);
        }
        holders.truncate(MAX_HOLDERS_ASKED);
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

/// The CPU side of a replay: verifies every envelope against the round that starts from `base`
/// (hash `base_hash`), applies the round, and checks the result against `claimed`. What the
/// replay costs a node, and what `bench trust` measures.
///
/// # Errors
/// A refused contribution, an empty set, or a result other than `claimed`.
pub fn replay_round(
    recipe: &Recipe,
    base: &StateSnapshot,
    base_hash: Hash32,
    envelopes: Vec<Arc<SignedEnvelope>>,
    claimed: Hash32,
) -> Result<Replayed, ReplayError> {
    let t0 = std::time::Instant::now();
    let ctx = recipe.context(base.round, base_hash);
    // Verifying and decoding each contribution is independent of the others: in parallel.
    use rayon::prelude::*;
    let accepted: Vec<Accepted> = envelopes
        .par_iter()
        .map(|env| {
            accept(&ctx, env).map_err(|e| ReplayError::Refused {
                sender: hex::encode(&env.header.sender[..6]),
                reason: e.to_string(),
            })
        })
        .collect::<Result<_, _>>()?;
    let set: BTreeMap<[u8; 32], Accepted> = accepted.into_iter().map(|a| (a.sender, a)).collect();
    let (state, step) = recipe.apply(base, &set).ok_or(ReplayError::Empty)?;
    let hash = state.hash();
    if hash != claimed {
        return Err(ReplayError::Mismatch {
            got: hash.short(),
            claimed: claimed.short(),
        });
    }
    Ok(Replayed {
        state,
        hash,
        envelopes,
        step,
        fetched_bytes: 0,
        replay_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
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
                        from: claim.holders[0],
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
            None => super::sync::fetch_state(
                net,
                store,
                recipe.num_params,
                &claim.holders,
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
            .map_err(|e| (e, false)),
        };
        match outcome {
            Ok(v) => return Some(v),
            Err((e, fault)) => {
                tracing::warn!(round = claim.round, hash = %claim.hash.short(), error = %e, "a claimed state did not verify; not adopting it");
                rejected.note(&claim, fault);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;
