//! Align: before a round, wait briefly for peers finishing the previous one, then move to a
//! better state only once it verifies — a fork of our round (replayed from the state before ours)
//! or the next round (replayed from ours), or a state further on by attestation — and then train
//! at once, join the round under way for the time it has left, or wait for it to end.

use super::combine::{Combining, Outcome};
use super::reducer::RoundSlices;
use super::rules::{Candidate, Claim, Held, candidates, group_claims, replay_round};
use super::*;
use nightshift_protocol::VerifyError;
use nightshift_protocol::message::formed_root;
use nightshift_protocol::slices::SliceError;

pub(super) mod after;
mod replay_sliced;
pub(super) use replay_sliced::replay_combining;

/// A verification under way: the claims still worth trying this alignment, the one being tried.
#[derive(Debug)]
pub(super) struct Verifying {
    /// Improvements still allowed this alignment.
    left: u8,
    /// Finish after this look (the node did its last round).
    then_finish: bool,
    current: Option<Attempt>,
}

/// Why a [`Candidate::Cross`] is left alone.
const OUR_CHAIN: &str = "a lesser state of our own chain (it builds on our base)";

/// One claim being verified.
#[derive(Debug)]
enum Attempt {
    /// Waiting for a holder to send the list of contributions the claim commits to (asked
    /// again of the claim's holders every [`LISTS_RETRY_MS`]).
    Lists {
        claim: Claim,
        fork: bool,
        /// A [`Candidate::Cross`]: once the list is in, left alone when it builds on our base,
        /// downloaded when not.
        cross: bool,
        asked_at: Millis,
        until: Millis,
    },
    Replay(Replay),
    Download {
        claim: Claim,
        until: Millis,
    },
}

#[derive(Debug)]
struct Replay {
    claim: Claim,
    /// The contributions the claim names (its list, sent by a holder and checked against its
    /// root), in key order.
    ids: Vec<ContributionId>,
    fork: bool,
    base: Arc<StateSnapshot>,
    base_hash: Hash32,
    have: BTreeMap<Key, Arc<SignedEnvelope>>,
    /// For each contribution still missing: the holders to ask, the one asked, and when.
    asking: BTreeMap<Key, (Vec<Key>, usize, Millis)>,
    bytes: u64,
    until: Millis,
    /// A round averaged slice by slice: its combining, once every header is in.
    combining: Option<Box<Combining>>,
}

impl RoundMachine {
    /// While peers still train or collect the previous round, wait for them (they may form a
    /// state we prefer), at most until `until` — or [`RICHER_WAIT_MS`] longer while one of them
    /// holds more of that round's contributions than formed our state (its state will be
    /// preferred to ours); a window that closes ends the wait (unless this is the look after
    /// the last round, `finish`, which trains no more).
    pub(super) fn align_wait(&mut self, now: Millis, until: Millis, finish: bool) {
        let available = self.available || finish;
        if available && self.refreshing() && now < until {
            return;
        }
        let r = self.state.round;
        let ours = self.state.formed_by.len();
        let mut lagging = 0;
        let mut richer = false;
        for (_, s) in self.trainer_peers() {
            if s.round < r && matches!(s.phase, Phase::Training | Phase::Collecting) {
                lagging += 1;
                richer |= s.round + 1 == r && s.holding as usize > ours;
            }
        }
        let until = if richer {
            until + RICHER_WAIT_MS
        } else {
            until
        };
        if lagging == 0 || now >= until || !available {
            if finish && !self.final_look {
                // The look after the last round, which no next round repairs: on fresh
                // statuses (an announcement of a state formed meanwhile may have been lost).
                self.final_look = true;
                self.stage = Stage::Aligning {
                    until: now + LOOKUP_MS,
                    finish,
                };
                self.refresh_statuses(now);
                return;
            }
            self.start_verifying(now, finish);
        }
    }

    pub(super) fn start_verifying(&mut self, now: Millis, then_finish: bool) {
        self.stage = Stage::Verifying(Verifying {
            left: MAX_IMPROVEMENTS,
            then_finish,
            current: None,
        });
        self.verify_step(now);
    }

    /// The claims of the connected peers' statuses (a peer that finished still holds a state of
    /// our round to compare with, or of the next one to replay while it lingers).
    pub(super) fn claims(&self) -> Vec<Claim> {
        let r = self.state.round;
        group_claims(self.peers.iter().filter_map(|(k, p)| {
            let s = p.status.as_ref()?;
            (p.connected && (s.phase != Phase::Done || s.round == r || s.round == r + 1))
                .then_some((*k, s, p.lists.as_deref()))
        }))
    }

    /// Tries the best claim not tried yet; adopts what verifies; moves on when none is left.
    pub(super) fn verify_step(&mut self, now: Millis) {
        let Stage::Verifying(v) = &mut self.stage else {
            return;
        };
        match &mut v.current {
            Some(Attempt::Lists {
                claim,
                fork,
                cross,
                asked_at,
                until,
            }) => {
                let (claim, fork, cross, until) = (claim.clone(), *fork, *cross, *until);
                let again = now >= *asked_at + LISTS_RETRY_MS;
                if again {
                    *asked_at = now;
                }
                let same = |c: &Claim| {
                    c.round == claim.round
                        && c.hash == claim.hash
                        && c.formed_root == claim.formed_root
                };
                let claims = self.claims();
                if !claims.iter().any(same) {
                    // Every holder moved on (or left): its list will not come; the states they
                    // moved to are the next candidates.
                    self.attempt_failed(now, "its holders moved on".into(), false);
                    return;
                }
                let listed = claims
                    .iter()
                    .find(|c| same(c) && c.formed_by.is_some())
                    .cloned();
                if listed.is_none() && again {
                    // An answer lost, or a holder that moved on: ask whoever holds it now.
                    let mut from: Vec<Key> = claims
                        .iter()
                        .filter(|c| same(c))
                        .flat_map(|c| c.holders.clone())
                        .collect();
                    from.truncate(rules::MAX_HOLDERS_ASKED);
                    self.ask_lists(now, from, false);
                }
                match listed {
                    Some(c) if !self.cfg.recipe.plausible(&c) => {
                        self.attempt_failed(now, "its list names non-members".into(), true);
                    }
                    Some(c) if cross => match self.start_listed_cross(now, c) {
                        Some(attempt) => {
                            if let Stage::Verifying(v) = &mut self.stage {
                                v.current = Some(attempt);
                            }
                        }
                        None => self.attempt_failed(now, OUR_CHAIN.into(), false),
                    },
                    Some(c) => match self.start_listed_replay(now, c, fork) {
                        Some(attempt) => {
                            if let Stage::Verifying(v) = &mut self.stage {
                                v.current = Some(attempt);
                            }
                            self.try_replay(now);
                        }
                        None => self.attempt_failed(now, "its base is gone".into(), false),
                    },
                    None if now >= until => {
                        self.attempt_failed(now, "no holder sent its list".into(), false);
                    }
                    None => {}
                }
                return;
            }
            Some(Attempt::Replay(rp)) => {
                // Holders that do not answer in time are passed over for the next.
                let mut ask = vec![];
                let mut gone = vec![];
                for (sender, (holders, i, at)) in rp.asking.iter_mut() {
                    if now >= *at + REPLAY_FETCH_MS {
                        *i += 1;
                        *at = now;
                        match holders.get(*i) {
                            Some(h) => ask.push((*h, *sender)),
                            None => gone.push(*sender),
                        }
                    }
                }
                let round = rp.base.round;
                let timed_out = now >= rp.until;
                for (from, sender) in ask {
                    self.out.push(Output::Fetch {
                        from,
                        round,
                        sender,
                    });
                }
                if let Some(sender) = gone.first() {
                    let reason = format!("no holder served {}'s contribution", short(sender));
                    self.attempt_failed(now, reason, false);
                } else if timed_out {
                    self.attempt_failed(
                        now,
                        "fetching the contributions took too long".into(),
                        false,
                    );
                } else {
                    self.try_replay(now);
                }
                return;
            }
            Some(Attempt::Download { until, .. }) => {
                if now >= *until {
                    self.attempt_failed(now, "the state download took too long".into(), false);
                }
                return;
            }
            None => {}
        }
        let (left, then_finish) = (v.left, v.then_finish);
        let list = if left == 0 {
            vec![]
        } else {
            self.rejected.prune(now);
            let claims = self.claims();
            candidates(
                &self.cfg.recipe,
                self.held_now(&claims),
                &claims,
                &self.rejected,
            )
        };
        for cand in list {
            let attempt = match cand {
                Candidate::Fork(claim) => self.start_claim_replay(now, claim, true),
                Candidate::Cross(claim) => self.start_cross(now, claim),
                Candidate::Ahead(claim) => self.start_claim_replay(now, claim, false),
                Candidate::Attested(claim) => Some(self.start_download(now, claim)),
            };
            let Some(attempt) = attempt else {
                continue;
            };
            if self.phase != Phase::Syncing {
                self.announce(Phase::Syncing);
            }
            if let Stage::Verifying(v) = &mut self.stage {
                v.current = Some(attempt);
            }
            self.try_replay(now);
            return;
        }
        // Nothing (more) to try.
        if self.phase == Phase::Syncing {
            self.announce(Phase::Ready);
        }
        if then_finish || (self.done() && (!self.trained_any || self.final_look)) {
            self.finish("finished");
        } else if self.done() {
            // Reached the last round by a replay: the look after it waits for the peers still
            // finishing that round, as after a round of its own (a state they form may be
            // preferred, and no next round repairs the last one).
            self.begin_round(now);
        } else {
            self.after_align(now);
        }
    }

    /// Replays `claim` (from the state before ours when it is a `fork`), once a holder has sent
    /// the list of contributions it commits to: asked for first when none has.
    /// `None`: a fork whose base we no longer hold.
    fn start_claim_replay(&mut self, now: Millis, claim: Claim, fork: bool) -> Option<Attempt> {
        if fork
            && self
                .prev
                .as_ref()
                .is_none_or(|(b, _)| b.round + 1 != claim.round)
        {
            // Nothing to replay it from (we downloaded ours, or restarted): a fork the rules
            // prefer and attest is downloaded.
            return self
                .cfg
                .recipe
                .attested(&claim)
                .then(|| self.start_download(now, claim));
        }
        if claim.formed_by.is_some() {
            return self.start_listed_replay(now, claim, fork);
        }
        Some(self.ask_claim_lists(now, claim, fork, false))
    }

    /// Asks a few of `claim`'s holders for the list it commits to, and waits for it.
    fn ask_claim_lists(&mut self, now: Millis, claim: Claim, fork: bool, cross: bool) -> Attempt {
        let mut from = claim.holders.clone();
        from.truncate(rules::MAX_HOLDERS_ASKED);
        self.ask_lists(now, from, false);
        Attempt::Lists {
            claim,
            fork,
            cross,
            asked_at: now,
            until: now + REPLAY_FETCH_MS,
        }
    }

    /// What we hold, for the rules: our round, hash and count, and whether the swarm's rules
    /// attest our state (the peers among `claims` that hold it, and we, sign it).
    pub(super) fn held_now(&self, claims: &[Claim]) -> Held<'_> {
        let mut signers: Vec<Key> = claims
            .iter()
            .filter(|c| c.round == self.state.round && c.hash == self.hash)
            .flat_map(|c| c.signers.iter().copied())
            .collect();
        signers.push(self.me);
        Held {
            round: self.state.round,
            hash: self.hash,
            formed: self.state.formed_by.len(),
            attested: self.cfg.recipe.attested_by(&signers),
            chain: &self.chain,
        }
    }

    /// An attested state of our round that the rules do not prefer, while ours is not attested
    /// ([`Candidate::Cross`]): once its list is known, left alone when it builds on our base,
    /// downloaded when not (asked for its list first when no holder has sent it).
    fn start_cross(&mut self, now: Millis, claim: Claim) -> Option<Attempt> {
        if claim.formed_by.is_some() {
            return self.start_listed_cross(now, claim);
        }
        Some(self.ask_claim_lists(now, claim, true, true))
    }

    /// A cross candidate whose list is known: the attested state is downloaded, unless a
    /// contribution it names is one we hold for the round before the claim's — each is signed
    /// for its base, so the claim is a sibling of ours (or of the state before ours) — and the
    /// rules do not prefer it: then it is a lesser state of our own chain, whose holders come to
    /// ours by replay (`None`).
    fn start_listed_cross(&mut self, now: Millis, claim: Claim) -> Option<Attempt> {
        let ids = claim.formed_by.as_deref()?;
        let base_round = claim.round.checked_sub(1)?;
        if ids.iter().any(|id| self.held_as(base_round, id).is_some()) {
            // A sibling of ours, or of the state ours was formed from: the rules' preference
            // decides. One of our round that the rules preferred would be a fork candidate;
            // one of the round before that they prefer to the state we built on means our
            // chain grew from a lesser state: back to the swarm's.
            // (Further back we do not know how many formed ours: left alone.)
            let prev = self
                .prev
                .as_ref()
                .filter(|(b, _)| claim.round < self.state.round && b.round == claim.round)?;
            let ours = (prev.0.formed_by.len(), prev.1);
            if rules::preferred((claim.formed, claim.hash), ours) != std::cmp::Ordering::Less {
                return None;
            }
        }
        Some(self.start_download(now, claim))
    }

    /// Replays `claim`, whose list a holder has sent, from its base (`None`: the base is gone).
    fn start_listed_replay(&mut self, now: Millis, claim: Claim, fork: bool) -> Option<Attempt> {
        let (base, base_hash) = if fork {
            self.prev
                .clone()
                .filter(|(b, _)| b.round + 1 == claim.round)?
        } else {
            (self.state.clone(), self.hash)
        };
        let ids = claim.formed_by.clone()?;
        Some(self.start_replay(now, claim, ids, fork, base, base_hash))
    }

    fn start_replay(
        &mut self,
        now: Millis,
        claim: Claim,
        ids: Vec<ContributionId>,
        fork: bool,
        base: Arc<StateSnapshot>,
        base_hash: Hash32,
    ) -> Attempt {
        let round = base.round;
        let mut have = BTreeMap::new();
        let mut asking = BTreeMap::new();
        for id in &ids {
            // One we hold, or one pushed to us early (the very one the claim names; the replay
            // verifies it like any other).
            let known = self.held_as(round, id).or_else(|| {
                self.stash
                    .iter()
                    .find(|(_, e)| e.header.round == round && ContributionId::of(e) == *id)
                    .map(|(_, e)| e.clone())
            });
            if let Some(env) = known {
                have.insert(id.sender, env);
                continue;
            }
            // The sender itself first when it holds the state too: every member serves its own.
            let mut holders = claim.holders.clone();
            if let Some(i) = holders.iter().position(|h| *h == id.sender) {
                holders.swap(0, i);
            }
            holders.truncate(rules::MAX_HOLDERS_ASKED);
            self.out.push(Output::Fetch {
                from: holders[0],
                round,
                sender: id.sender,
            });
            asking.insert(id.sender, (holders, 0, now));
        }
        Attempt::Replay(Replay {
            claim,
            ids,
            fork,
            base,
            base_hash,
            have,
            asking,
            bytes: 0,
            until: now + REPLAY_TIMEOUT_MS,
            combining: None,
        })
    }

    /// Asks a few of `claim`'s holders for its attested state.
    fn start_download(&mut self, now: Millis, claim: Claim) -> Attempt {
        let mut from = claim.holders.clone();
        from.truncate(8);
        self.out.push(Output::FetchState {
            from,
            round: claim.round,
            hash: claim.hash,
        });
        Attempt::Download {
            claim,
            until: now + STATE_DOWNLOAD_MS,
        }
    }

    /// A contribution arriving while verifying: kept when it is one the replay waits for (the
    /// very one the claim names), stashed when it is for a later round.
    pub(super) fn replay_offer(&mut self, now: Millis, from: Key, env: Arc<SignedEnvelope>) {
        let wanted = match &self.stage {
            Stage::Verifying(Verifying {
                current: Some(Attempt::Replay(rp)),
                ..
            }) => {
                env.header.round == rp.base.round
                    && rp.asking.contains_key(&env.header.sender)
                    && rp.ids.contains(&ContributionId::of(&env))
            }
            _ => false,
        };
        if !wanted {
            // The answer of the holder we asked, but another contribution than the claim names:
            // that holder does not have it, so ask the next at once (a claim naming contributions
            // nobody serves must not hold the node for a whole fetch time-out).
            let asked = match &self.stage {
                Stage::Verifying(Verifying {
                    current: Some(Attempt::Replay(rp)),
                    ..
                }) => {
                    env.header.round == rp.base.round
                        && rp
                            .asking
                            .get(&env.header.sender)
                            .is_some_and(|(holders, i, _)| holders.get(*i) == Some(&from))
                }
                _ => false,
            };
            let sender = env.header.sender;
            if env.header.round >= self.state.round {
                self.stash_push(from, env);
            }
            if asked {
                self.replay_not_found(now, from, sender);
            }
            return;
        }
        if let Stage::Verifying(Verifying {
            current: Some(Attempt::Replay(rp)),
            ..
        }) = &mut self.stage
        {
            rp.asking.remove(&env.header.sender);
            rp.bytes += env.payload.len() as u64;
            rp.have.insert(env.header.sender, env);
        }
        self.try_replay(now);
    }

    /// A holder had nothing (or failed) for a contribution the replay waits for: ask the next.
    pub(super) fn replay_not_found(&mut self, now: Millis, from: Key, sender: Key) {
        let Stage::Verifying(Verifying {
            current: Some(Attempt::Replay(rp)),
            ..
        }) = &mut self.stage
        else {
            return;
        };
        let round = rp.base.round;
        let Some((holders, i, at)) = rp.asking.get_mut(&sender) else {
            return;
        };
        if holders.get(*i) != Some(&from) {
            return;
        }
        *i += 1;
        *at = now;
        match holders.get(*i) {
            Some(h) => {
                let h = *h;
                self.out.push(Output::Fetch {
                    from: h,
                    round,
                    sender,
                });
            }
            None => {
                let reason = format!("no holder served {}'s contribution", short(&sender));
                self.attempt_failed(now, reason, false);
            }
        }
    }

    /// Replays the round once every contribution the claim names is here.
    fn try_replay(&mut self, now: Millis) {
        let Stage::Verifying(Verifying {
            current: Some(Attempt::Replay(rp)),
            ..
        }) = &self.stage
        else {
            return;
        };
        if !rp.asking.is_empty() {
            return;
        }
        if let Some(slicing) = self.cfg.recipe.round_slicing(&rp.base) {
            return self.replay_sliced(now, slicing);
        }
        let envs: Vec<Arc<SignedEnvelope>> = rp
            .ids
            .iter()
            .filter_map(|id| rp.have.get(&id.sender).cloned())
            .collect();
        let result = replay_round(
            &self.cfg.recipe,
            &rp.base,
            rp.base_hash,
            envs,
            rp.claim.hash,
        );
        match result {
            Ok(replayed) => {
                let Stage::Verifying(v) = &mut self.stage else {
                    return;
                };
                let Some(Attempt::Replay(rp)) = v.current.take() else {
                    return;
                };
                v.left = v.left.saturating_sub(1);
                for env in replayed.envelopes {
                    self.hold(rp.base.round, env);
                }
                let reason = if rp.fork {
                    "diverged from the swarm"
                } else {
                    "behind the swarm"
                };
                let from = rp.claim.holders[0];
                self.adopt(
                    replayed.state,
                    replayed.hash,
                    Some((rp.base, rp.base_hash)),
                    How::Synced {
                        from,
                        reason,
                        verified: "replay",
                        bytes: rp.bytes,
                        replaced: None,
                    },
                );
                self.verify_step(now);
            }
            Err(rules::ReplayError::OtherBase { .. }) if self.cfg.recipe.attested(&rp.claim) => {
                // We are on a fork of the round before (its holders built on another state):
                // a state the swarm's rules vouch for is downloaded instead.
                let claim = rp.claim.clone();
                let attempt = self.start_download(now, claim);
                if let Stage::Verifying(v) = &mut self.stage {
                    v.current = Some(attempt);
                }
            }
            Err(e) => {
                let fault = e.is_fault();
                self.attempt_failed(now, e.to_string(), fault);
            }
        }
    }

    /// The attempt under way failed: note it (its signers too when the claim was at fault) and
    /// try the next claim.
    fn attempt_failed(&mut self, now: Millis, reason: String, fault: bool) {
        let Stage::Verifying(v) = &mut self.stage else {
            return;
        };
        let claim = match v.current.take() {
            Some(Attempt::Lists { claim, .. }) => claim,
            Some(Attempt::Replay(rp)) => rp.claim,
            Some(Attempt::Download { claim, .. }) => claim,
            None => return,
        };
        self.rejected.note(&claim, fault, now);
        self.out.push(Output::Note(Note::Rejected {
            round: claim.round,
            hash: claim.hash,
            reason,
        }));
        self.verify_step(now);
    }

    pub(super) fn on_state(
        &mut self,
        now: Millis,
        from: Key,
        state: Arc<StateSnapshot>,
        bytes: u64,
    ) {
        let Stage::Verifying(Verifying {
            current: Some(Attempt::Download { claim, .. }),
            ..
        }) = &self.stage
        else {
            return;
        };
        let hash = state.hash();
        let fits = state.round == claim.round
            && hash == claim.hash
            && state.formed_by.len() == claim.formed
            && formed_root(&state.formed_by) == claim.formed_root
            && state.params.len() == self.cfg.recipe.num_params
            && state.momentum.len() == state.params.len();
        if !fits {
            self.attempt_failed(
                now,
                "the downloaded state is not the one claimed".into(),
                true,
            );
            return;
        }
        if let Stage::Verifying(v) = &mut self.stage {
            v.current = None;
            v.left = v.left.saturating_sub(1);
        }
        // A state of our round or an earlier one replaces a chain the swarm's rules do not attest.
        let reason = if state.round <= self.state.round {
            "diverged from the swarm"
        } else {
            "behind the swarm"
        };
        self.adopt(
            Arc::unwrap_or_clone(state),
            hash,
            None,
            How::Synced {
                from,
                reason,
                verified: "attested",
                bytes,
                replaced: None,
            },
        );
        self.verify_step(now);
    }

    pub(super) fn on_state_failed(&mut self, now: Millis, hash: Hash32) {
        if let Stage::Verifying(Verifying {
            current: Some(Attempt::Download { claim, .. }),
            ..
        }) = &self.stage
            && claim.hash == hash
        {
            self.attempt_failed(now, "no holder served the state".into(), false);
        }
    }

    pub(super) fn on_not_found(&mut self, now: Millis, from: Key, round: u64, sender: Key) {
        match &self.stage {
            Stage::Verifying(_) => self.replay_not_found(now, from, sender),
            Stage::Collecting(_) | Stage::Reconciling(_) if round == self.state.round => {
                self.fetch_failed(now, from, sender);
            }
            _ => {}
        }
    }

    /// Moves to a verified state.
    fn adopt(
        &mut self,
        state: StateSnapshot,
        hash: Hash32,
        prev: Option<(Arc<StateSnapshot>, Hash32)>,
        mut how: How,
    ) {
        if let How::Synced { replaced, .. } = &mut how
            && state.round == self.state.round
        {
            *replaced = Some(self.hash);
        }
        if self.cfg.role == NodeRole::Bootstrap {
            // A follower keeps what it needs to serve a replay of the last two rounds.
            let keep = state.round.saturating_sub(2);
            self.held.retain(|(r, _), _| *r >= keep);
            self.out.push(Output::ForgetBefore(keep));
        }
        self.state = Arc::new(state);
        self.hash = hash;
        self.prev = prev;
        self.note_chain();
        self.ef = ErrorFeedback::default();
        self.just_synced = true;
        self.holding.clear();
        self.out.push(Output::NewState(NewState {
            state: self.state.clone(),
            hash,
            how,
        }));
        self.announce(Phase::Ready);
    }
}
