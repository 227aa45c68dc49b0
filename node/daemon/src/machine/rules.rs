//! Verified state, the pure rules: a node adopts a peer's state only when it can check it.
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

use nightshift_model::OuterOptimizer;
use nightshift_protocol::{
    Aggregator, ContributionId, DeltaCodec, Hash32, SignedEnvelope, SignedManifest, StateSnapshot,
    Status, StatusLists,
};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use thiserror::Error;

use super::accept::{Accepted, RoundContext, RoundStep, accept, round_step};
use super::sliced::{Slicing, sliced_round_step};
use super::{Key, Millis};
use nightshift_protocol::MAX_EXPECTED;
use nightshift_protocol::slices::{Averaging, MAX_SLICES};

/// Holders asked for one contribution before a replay gives up on it.
pub const MAX_HOLDERS_ASKED: usize = 3;
/// Most contributions a round of an open swarm counts.
pub const MAX_OPEN_CONTRIBUTORS: usize = 256;
/// Most contributions a round of an open swarm cut into `slices` counts (see
/// [`Recipe::round_max_contributors`]).
pub fn sliced_open_bound(slices: u32) -> usize {
    (slices as usize * MAX_OPEN_CONTRIBUTORS / 2)
        .clamp(MAX_OPEN_CONTRIBUTORS, MAX_EXPECTED as usize)
}
/// Slices of an open swarm's round 0 when the recipe names no count.
pub const FIRST_ROUND_SLICES: usize = 16;
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
    /// Average slice by slice, as reducers inside the network do ([`super::sliced`]); `None`:
    /// every node averages whole contributions. Set by the lab only, while the reducers'
    /// transport is built (issue 26).
    pub slicing: Option<Slicing>,
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
            slicing: match t.averaging {
                Averaging::AllToAll => None,
                Averaging::Reduce { slices, mean_codec } => Some(Slicing { slices, mean_codec }),
            },
        }
    }

    /// Most contributions any round may count: the members; in an open swarm (where keys are
    /// free, so the bound is what keeps a round's memory bounded) [`MAX_OPEN_CONTRIBUTORS`]
    /// when every node holds every contribution whole, [`MAX_EXPECTED`] with reducers (each
    /// round's own bound: [`Recipe::round_max_contributors`]).
    pub fn max_contributors(&self) -> usize {
        match (&self.allowlist, self.slicing) {
            (Some(members), _) => members.len(),
            (None, None) => MAX_OPEN_CONTRIBUTORS,
            (None, Some(_)) => MAX_EXPECTED as usize,
        }
    }

    /// Most contributions the round from `base` may count. With reducers an open swarm's bound
    /// grows with the round's slices: a node holds one header per contribution and, as a slice's
    /// reducer and checker, two slices of each, 2·N/S contributions' worth, kept within what
    /// [`MAX_OPEN_CONTRIBUTORS`] whole contributions take (N ≤ 128·S, at most [`MAX_EXPECTED`]).
    pub fn round_max_contributors(&self, base: &StateSnapshot) -> usize {
        match self.round_slicing(base) {
            Some(s) if self.allowlist.is_none() => sliced_open_bound(s.slices),
            _ => self.max_contributors(),
        }
    }

    /// Whether `claim` could be a state of this swarm at all: no more contributions than a round
    /// counts, and in a swarm with an allowlist, only members' (the list is checked again by
    /// the replay; this keeps a made-up list from costing look-ups or inflating a count).
    pub fn plausible(&self, claim: &Claim) -> bool {
        claim.formed <= self.max_contributors()
            && self.allowlist.as_ref().is_none_or(|members| {
                claim
                    .formed_by
                    .iter()
                    .flatten()
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
        let step = match self.round_slicing(base) {
            None => round_step(set, base.noise, self.aggregator)?,
            Some(s) => sliced_round_step(set, base.noise, self.aggregator, self.codec, s)?,
        };
        let formed_by = set
            .values()
            .map(|a| ContributionId {
                sender: a.sender,
                digest: a.digest,
            })
            .collect();
        Some((self.next_state(base, &step, formed_by), step))
    }

    /// How the round that starts from `base` cuts its contributions, when the swarm averages
    /// slice by slice: the recipe's slice count, or (when it names none) one slice per
    /// contributor to `base` — about the round's reducers — as many as the model's blocks
    /// allow. Round 0 has no contributors to count: a private swarm cuts it for its members,
    /// an open one into [`FIRST_ROUND_SLICES`] (one slice would make one node the reducer of
    /// every contribution).
    pub fn round_slicing(&self, base: &StateSnapshot) -> Option<Slicing> {
        let s = self.slicing?;
        if s.slices > 0 {
            return Some(s);
        }
        let contributors = match base.formed_by.len() {
            0 => self.allowlist.as_ref().map_or(FIRST_ROUND_SLICES, Vec::len),
            n => n,
        };
        let want = contributors.clamp(1, MAX_SLICES as usize) as u32;
        (1..=want)
            .rev()
            .map(|slices| Slicing { slices, ..s })
            .find(|s| s.ranges(self.num_params, self.codec).is_some())
    }

    /// θ(r+1) from `base` and the round's `step`, formed by `formed_by` (in key order).
    pub fn next_state(
        &self,
        base: &StateSnapshot,
        step: &RoundStep,
        formed_by: Vec<ContributionId>,
    ) -> StateSnapshot {
        let mut params = base.params.clone();
        let mut outer = OuterOptimizer {
            lr: self.outer_lr,
            momentum: self.outer_momentum,
            buf: base.momentum.clone(),
        };
        outer.step(&mut params, &step.delta);
        StateSnapshot {
            round: base.round + 1,
            params,
            momentum: outer.buf,
            formed_by,
            noise: step.noise,
        }
    }

    /// Whether the swarm's rules vouch for `claim` without a replay: a bootstrap named in the
    /// manifest signed it, or (private swarm) at least the quorum of members did.
    pub fn attested(&self, claim: &Claim) -> bool {
        self.attested_by(&claim.signers)
    }

    /// Whether statuses signed by `signers` holding one state attest it (see
    /// [`Recipe::attested`]).
    pub fn attested_by(&self, signers: &[Key]) -> bool {
        if signers.iter().any(|s| self.bootstraps.contains(s)) {
            return true;
        }
        match &self.allowlist {
            Some(members) => {
                let n = signers
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

/// A state some peers say they hold: its round, hash and the contributions that formed it (their
/// count and root, and the list once a holder sent it), who holds it and who signed that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub round: u64,
    pub hash: Hash32,
    pub formed: usize,
    pub formed_root: Hash32,
    /// Sorted by sender, one per sender; `None` until a holder sent the list.
    pub formed_by: Option<Vec<ContributionId>>,
    /// The peers (their keys) whose signed statuses claim it: they hold it, and they signed
    /// that they do.
    pub holders: Vec<Key>,
    pub signers: Vec<Key>,
}

/// Groups verified statuses, each with the key of the peer that signed it and the lists it sent
/// (if any, already checked against the status: [`StatusLists::matches`]), into claims (one per
/// round, hash and contribution set).
pub fn group_claims<'a>(
    statuses: impl IntoIterator<Item = (Key, &'a Status, Option<&'a StatusLists>)>,
) -> Vec<Claim> {
    let mut out: Vec<Claim> = vec![];
    for (signer, s, lists) in statuses {
        debug_assert!(lists.is_none_or(|l| l.matches(s)), "lists checked first");
        let listed = lists.map(|l| {
            let mut formed = l.formed_by.clone();
            formed.sort_unstable();
            formed
        });
        match out.iter_mut().find(|c| {
            c.round == s.round
                && c.hash == s.state_hash
                && c.formed == s.formed as usize
                && c.formed_root == s.formed_root
        }) {
            Some(c) => {
                c.holders.push(signer);
                c.signers.push(signer);
                if c.formed_by.is_none() {
                    c.formed_by = listed;
                }
            }
            None => out.push(Claim {
                round: s.round,
                hash: s.state_hash,
                formed: s.formed as usize,
                formed_root: s.formed_root,
                formed_by: listed,
                holders: vec![signer],
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

/// How long a claim that failed to verify through its own fault, and the peers that signed it,
/// are left alone.
pub const REJECT_SECS: u64 = 30;
/// How long a claim that failed through no fault of its own (a contribution that could not be
/// fetched in time, a state built on another base than ours) waits before it is tried again.
pub const RETRY_SECS: u64 = 5;

/// Claims that failed to verify lately, and the signers of those that were at fault: a faulty
/// claim and its signers are not tried again for [`REJECT_SECS`], so a peer that keeps claiming
/// made-up states (a new one every second) costs a node one failed verification per
/// [`REJECT_SECS`], not one per round. A claim that failed only because the network did (or it
/// builds on a state we do not hold) is tried again after [`RETRY_SECS`], and leaves its signers
/// in good standing. Times are the caller's clock, in milliseconds.
#[derive(Debug, Default)]
pub struct Rejections {
    hashes: HashMap<Hash32, (Millis, bool)>,
    signers: HashMap<[u8; 32], Millis>,
}

impl Rejections {
    /// Notes at `now` that `claim` failed to verify: its hash, and when the claim itself was at
    /// fault (not the network), its signers too.
    pub fn note(&mut self, claim: &Claim, fault: bool, now: Millis) {
        let was_fault = self.hashes.get(&claim.hash).is_some_and(|(_, f)| *f);
        self.hashes.insert(claim.hash, (now, fault || was_fault));
        if fault {
            for s in &claim.signers {
                self.signers.insert(*s, now);
            }
        }
    }

    /// Forgets what is older than [`REJECT_SECS`] (a fault) or [`RETRY_SECS`] at `now`.
    pub fn prune(&mut self, now: Millis) {
        let age = |at: Millis| now.saturating_sub(at);
        self.hashes.retain(|_, (at, fault)| {
            age(*at) < if *fault { REJECT_SECS } else { RETRY_SECS } * 1000
        });
        self.signers.retain(|_, at| age(*at) < REJECT_SECS * 1000);
    }

    /// Whether `claim` failed lately through its own fault, or every one of its signers signed
    /// a claim that did.
    pub fn faulty(&self, claim: &Claim) -> bool {
        self.hashes.get(&claim.hash).is_some_and(|(_, f)| *f)
            || (!claim.signers.is_empty()
                && claim.signers.iter().all(|s| self.signers.contains_key(s)))
    }

    /// Whether `claim` is left alone: its hash failed lately, or every one of its signers
    /// signed a claim that was at fault.
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
    /// A state the swarm's rules attest, while ours is not attested, of our own round (one the
    /// rules would not prefer) or of the round before (other than the one ours was formed
    /// from): when it builds on the same base as ours (or as the one before) it belongs to our
    /// chain and is left alone (its holders come to ours by replay); when it builds on another,
    /// the swarm went on along two chains, and the attested one is downloaded — going back a
    /// round if need be (see [`candidates`]).
    Cross(Claim),
    /// A state more than a round ahead, vouched for by attestation: download it and check its
    /// hash and contribution list.
    Attested(Claim),
}

impl Candidate {
    pub fn claim(&self) -> &Claim {
        match self {
            Candidate::Fork(c)
            | Candidate::Ahead(c)
            | Candidate::Cross(c)
            | Candidate::Attested(c) => c,
        }
    }
}

/// What we hold: the round, hash and number of contributions that formed it.
#[derive(Clone, Copy, Debug)]
pub struct Held<'a> {
    pub round: u64,
    pub hash: Hash32,
    pub formed: usize,
    /// Whether the swarm's rules attest our state: its holders (peers whose statuses hold it,
    /// and we) include a bootstrap or, in a private swarm, the quorum of members.
    pub attested: bool,
    /// The states we held lately, one per round, oldest first, ours last.
    pub chain: &'a [(u64, Hash32)],
}

/// The candidates worth trying, best first: forks of our round that the rules prefer over our
/// state, then, when ours is not attested, attested states of our round the rules do not prefer
/// ([`Candidate::Cross`]), then states one round ahead (most contributions first), then attested
/// states more than one round ahead (highest round first). Forks and states ahead are replayed;
/// a state a node could replay is never taken on attestation: what fails to replay is not
/// adopted, however many sign it.
///
/// Between two chains — states built on different bases, which neither side can replay — the
/// attested one wins: a node whose state nobody attests leaves it for the attested state of its
/// round, preferred or not, or of the round before when that is not the state ours was formed
/// from (an attesting bootstrap follows a round behind the trainers). Within one chain the
/// rules' preference decides, as before. Without this, a swarm split at some round (a bootstrap that could not fetch the
/// preferred state's contributions followed the lesser one) went on along both chains to the end.
/// Claims that `rejected` skips, and implausible ones ([`Recipe::plausible`]), are left out.
pub fn candidates(
    recipe: &Recipe,
    held: Held<'_>,
    claims: &[Claim],
    rejected: &Rejections,
) -> Vec<Candidate> {
    let key = |c: &Claim| (c.formed, c.hash);
    let fresh = |c: &&Claim| !rejected.skips(c) && c.hash != held.hash && recipe.plausible(c);
    let mut forks: Vec<&Claim> = claims
        .iter()
        .filter(fresh)
        .filter(|c| c.round == held.round)
        .filter(|c| preferred(key(c), (held.formed, held.hash)) == Ordering::Less)
        .collect();
    forks.sort_by(|a, b| preferred(key(a), key(b)));
    let mut crosses: Vec<&Claim> = claims
        .iter()
        .filter(fresh)
        .filter(|c| !held.attested && recipe.attested(c))
        .filter(|c| {
            (c.round == held.round && preferred(key(c), (held.formed, held.hash)) != Ordering::Less)
                || (c.round < held.round
                    && held
                        .chain
                        .iter()
                        .any(|(r, h)| *r == c.round && *h != c.hash))
        })
        .collect();
    crosses.sort_by(|a, b| b.round.cmp(&a.round).then(preferred(key(a), key(b))));
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
    out.extend(crosses.iter().map(|c| Candidate::Cross((*c).clone())));
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
    #[error("the claim's contributions build on state {got}, not on ours ({ours})")]
    OtherBase { got: String, ours: String },
    #[error("replay task failed: {0}")]
    Task(String),
}

impl ReplayError {
    /// Whether the claim itself is at fault (its contributions do not form it, or are not
    /// acceptable), rather than the network (a contribution that could not be had in time).
    pub fn is_fault(&self) -> bool {
        !matches!(
            self,
            ReplayError::Unavailable(_)
                | ReplayError::TimedOut
                | ReplayError::Task(_)
                | ReplayError::OtherBase { .. }
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
    let t0 = std::time::Instant::now(); // measures the replay's cost; decides nothing
    let ctx = recipe.context(base.round, base_hash);
    // Verifying and decoding each contribution is independent of the others: in parallel.
    use rayon::prelude::*;
    let accepted: Vec<Accepted> = envelopes
        .par_iter()
        .map(|env| {
            accept(&ctx, env).map_err(|e| match e {
                // Signed, but for another base: we diverged further back than this round, which
                // is nobody's fault in particular (a state from a quorum or bootstrap repairs it).
                super::accept::Refusal::Verify(nightshift_protocol::VerifyError::WrongBase {
                    got,
                    expected,
                }) => ReplayError::OtherBase {
                    got,
                    ours: expected,
                },
                e => ReplayError::Refused {
                    sender: hex::encode(&env.header.sender[..6]),
                    reason: e.to_string(),
                },
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

#[cfg(test)]
mod tests;
