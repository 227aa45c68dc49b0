//! The combining stage in the node's round machine: starting it once the set is agreed,
//! handing it the slices and reduced slices that arrive, and taking the round's step (or
//! leaving the round) when it is done.

use super::*;

/// The combining stage of a node's own round: the combining, and what the round's summary needs.
#[derive(Debug)]
pub(in crate::machine) struct CombineStage {
    pub(in crate::machine) combining: Combining,
    pub(in crate::machine) collecting: Collecting,
    pub(in crate::machine) missed: usize,
}

impl Combining {
    /// The round it combines.
    pub(in crate::machine) fn round(&self) -> u64 {
        self.rules.round
    }
}

/// The combining under way for `round`, in the node's own round or in a replay.
fn combining_in(stage: &mut Stage, round: u64) -> Option<&mut Combining> {
    let c = match stage {
        Stage::Combining(cs) => &mut cs.combining,
        Stage::Verifying(v) => align::replay_combining(v)?,
        _ => return None,
    };
    (c.round() == round).then_some(c)
}

impl RoundMachine {
    /// The round's set is agreed: combine it slice by slice.
    pub(in crate::machine) fn start_combining(&mut self, now: Millis, slicing: Slicing) {
        let Stage::Reconciling(rc) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        let r = self.state.round;
        let rules = RoundSlices {
            recipe: self.cfg.recipe.clone(),
            round: r,
            base_hash: self.hash,
            slicing,
        };
        let own = self
            .own_slices
            .as_ref()
            .filter(|(round, _)| *round == r)
            .map(|(_, s)| s.clone());
        let combining = Combining::new(
            now,
            rules,
            self.state.noise,
            &rc.collecting.collected,
            self.me,
            own.as_deref(),
            vec![],
            &mut self.out,
        )
        .timed_for(self.cfg.timed_params);
        self.stage = Stage::Combining(Box::new(CombineStage {
            combining,
            collecting: rc.collecting,
            missed: rc.missed,
        }));
        self.offer_early_reduced(now);
    }

    /// Reduced slices that came before the node was ready for them.
    pub(in crate::machine) fn offer_early_reduced(&mut self, now: Millis) {
        let r = self.state.round;
        let early = std::mem::take(&mut self.early_reduced);
        for (from, reduced) in early {
            let round = reduced.signed.first().map_or(0, |e| e.header.round);
            if round == r || combining_in(&mut self.stage, round).is_some() {
                self.on_reduced(now, from, reduced);
            } else if round > r {
                self.early_reduced.push((from, reduced));
            }
        }
    }

    pub(in crate::machine) fn combine_step(&mut self, now: Millis, tick: bool) {
        let peers = self.connected_keys();
        let Stage::Combining(cs) = &self.stage else {
            return;
        };
        let round = cs.combining.round();
        // An attested state further on: the swarm has moved past this round (we came late, or
        // combine over a set the others did not), so waiting for its slices helps no one.
        if tick
            && round == self.state.round
            && self
                .claims()
                .iter()
                .any(|c| c.round > round + 1 && self.cfg.recipe.attested(c))
        {
            self.out.push(Output::Note(Note::Behind { round }));
            self.announce(Phase::Ready);
            self.begin_round(now);
            return;
        }
        let Stage::Combining(cs) = &mut self.stage else {
            return;
        };
        match cs
            .combining
            .drive(now, &self.cfg.key, &peers, &mut self.out)
        {
            Outcome::Pending => {}
            Outcome::Done(step, formed) => {
                let Stage::Combining(cs) = std::mem::replace(&mut self.stage, Stage::Done) else {
                    return;
                };
                let cs = *cs;
                let next = self.cfg.recipe.next_state(&self.state, &step, formed);
                self.stepped(now, next, step, cs.collecting, cs.missed);
            }
            Outcome::Failed(reason) => {
                self.out
                    .push(Output::Note(Note::LeftRound { round, reason }));
                self.announce(Phase::Ready);
                self.begin_round(now);
            }
        }
    }

    pub(in crate::machine) fn on_slice(&mut self, now: Millis, from: Key, slice: Arc<Slice>) {
        let round = slice.envelope.header.round;
        // The header counted in the round's set, verified then.
        let verified = self.held.get(&(round, slice.envelope.header.sender));
        if let Some(c) = combining_in(&mut self.stage, round) {
            c.on_slice(now, from, &slice, verified.map(|v| &**v), &mut self.out);
        }
    }

    pub(in crate::machine) fn on_slice_not_found(
        &mut self,
        now: Millis,
        from: Key,
        round: u64,
        id: ContributionId,
        index: u32,
    ) {
        if let Some(c) = combining_in(&mut self.stage, round) {
            c.slice_not_found(now, from, id.sender, index, &mut self.out);
        }
    }

    pub(in crate::machine) fn on_reduced(&mut self, now: Millis, from: Key, reduced: Arc<Reduced>) {
        let Some(round) = reduced.signed.first().map(|e| e.header.round) else {
            return;
        };
        let me = self.me;
        if let Some(c) = combining_in(&mut self.stage, round) {
            c.on_reduced(now, from, &reduced, me, &mut self.out);
        } else if round >= self.state.round && self.early_worth_keeping(&reduced) {
            self.early_reduced.push((from, reduced));
        }
    }

    pub(in crate::machine) fn on_reduced_not_found(
        &mut self,
        now: Millis,
        from: Key,
        round: u64,
        index: u32,
    ) {
        let me = self.me;
        if let Some(c) = combining_in(&mut self.stage, round) {
            c.reduced_not_found(now, from, index, me, &mut self.out);
        }
    }

    /// Whether a reduced slice that came early is kept for later: signed (by a member, in a
    /// private swarm) for this swarm, of a bounded size, a few per signer, a bounded number in
    /// all — what a peer can make us hold before we can check it fully.
    fn early_worth_keeping(&self, reduced: &Reduced) -> bool {
        let recipe = &self.cfg.recipe;
        let limit = nightshift_protocol::slices::max_reduced_bytes(recipe.num_params);
        let Some(first) = reduced.signed.first() else {
            return false;
        };
        let signer = first.header.sender;
        let bytes = |r: &Reduced| r.signed.iter().map(|e| e.payload.len()).sum::<usize>();
        let held: usize = self.early_reduced.iter().map(|(_, r)| bytes(r)).sum();
        let same = self
            .early_reduced
            .iter()
            .filter(|(_, r)| r.signed.first().is_some_and(|e| e.header.sender == signer))
            .count();
        reduced.signed.len() <= 2
            && self.early_reduced.len() < MAX_EARLY_REDUCED
            && held + bytes(reduced) <= EARLY_REDUCED_MODELS * limit + MAX_EARLY_REDUCED * 1024
            && same < STASH_PER_SENDER
            && reduced.signed.iter().all(|e| {
                e.payload.len() <= limit
                    && e.header.kind == nightshift_protocol::PayloadKind::ReducedSlice
                    && e.header.swarm_id == recipe.swarm_id
                    && e.check_signer(recipe.allowlist.as_deref()).is_ok()
            })
    }

    /// The connected peers' keys.
    pub(in crate::machine) fn connected_keys(&self) -> Vec<Key> {
        self.peers
            .iter()
            .filter(|(_, p)| p.connected)
            .map(|(k, _)| *k)
            .collect()
    }
}
