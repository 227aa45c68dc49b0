//! Replaying a round averaged slice by slice: the claim's headers verified, its reduced slices
//! fetched from the claim's holders (checked against the round's reducers' signatures) or
//! computed from the members' slices, the step taken and its hash compared.

use super::*;

/// The combining of the replay under way, if any.
pub(in crate::machine) fn replay_combining(v: &mut Verifying) -> Option<&mut Combining> {
    match &mut v.current {
        Some(Attempt::Replay(rp)) => rp.combining.as_deref_mut(),
        _ => None,
    }
}

impl RoundMachine {
    /// Replays a round averaged slice by slice: the claim's headers verified, its reduced
    /// slices fetched from the claim's holders (checked against the round's reducers'
    /// signatures) or computed from the members' slices, the step taken and its hash compared.
    pub(super) fn replay_sliced(&mut self, now: Millis, slicing: sliced::Slicing) {
        let peers = self.connected_keys();
        let me = self.me;
        let own = self.own_slices.clone();
        let Stage::Verifying(Verifying {
            current: Some(Attempt::Replay(rp)),
            ..
        }) = &mut self.stage
        else {
            return;
        };
        if rp.combining.is_none() {
            let mut set = BTreeMap::new();
            for id in &rp.ids {
                let Some(env) = rp.have.get(&id.sender) else {
                    continue;
                };
                let recipe = &self.cfg.recipe;
                let rules = RoundSlices {
                    recipe: recipe.clone(),
                    round: rp.base.round,
                    base_hash: rp.base_hash,
                    slicing,
                };
                match sliced::accept_header(&rules.context(), env) {
                    Ok(a) => _ = set.insert(a.sender, a),
                    Err(SliceError::Envelope(VerifyError::WrongBase { .. }))
                        if self.cfg.recipe.attested(&rp.claim) =>
                    {
                        // We are on a fork of the round before: a state the swarm's rules
                        // vouch for is downloaded instead (as for a whole round).
                        let claim = rp.claim.clone();
                        let attempt = self.start_download(now, claim);
                        if let Stage::Verifying(v) = &mut self.stage {
                            v.current = Some(attempt);
                        }
                        return;
                    }
                    Err(e) => {
                        // Signed for another base: nobody's fault in particular.
                        let fault =
                            !matches!(e, SliceError::Envelope(VerifyError::WrongBase { .. }));
                        let reason = format!("{}'s contribution: {e}", short(&id.sender));
                        return self.attempt_failed(now, reason, fault);
                    }
                }
            }
            if set.is_empty() {
                return self.attempt_failed(now, "a state formed by nothing".into(), true);
            }
            let rules = RoundSlices {
                recipe: self.cfg.recipe.clone(),
                round: rp.base.round,
                base_hash: rp.base_hash,
                slicing,
            };
            let own = own
                .as_ref()
                .filter(|(r, _)| *r == rp.base.round)
                .map(|(_, s)| s.as_slice());
            let mut sources = rp.claim.holders.clone();
            sources.truncate(rules::MAX_HOLDERS_ASKED);
            rp.combining = Some(Box::new(
                Combining::new(
                    now,
                    rules,
                    rp.base.noise,
                    &set,
                    me,
                    own,
                    sources,
                    &mut self.out,
                )
                .timed_for(self.cfg.timed_params),
            ));
            self.offer_early_reduced(now);
        }
        let Stage::Verifying(Verifying {
            current: Some(Attempt::Replay(rp)),
            ..
        }) = &mut self.stage
        else {
            return;
        };
        let Some(c) = rp.combining.as_mut() else {
            return;
        };
        match c.drive(now, &self.cfg.key, &peers, &mut self.out) {
            Outcome::Pending => {}
            Outcome::Failed(reason) => self.attempt_failed(now, reason, false),
            Outcome::Done(step, formed) => {
                let next = self.cfg.recipe.next_state(&rp.base, &step, formed);
                let hash = next.hash();
                if hash != rp.claim.hash {
                    let reason = format!(
                        "replayed to {}, not the claimed {}",
                        hash.short(),
                        rp.claim.hash.short()
                    );
                    return self.attempt_failed(now, reason, true);
                }
                let bytes = rp.bytes + c.bytes;
                let Stage::Verifying(v) = &mut self.stage else {
                    return;
                };
                let Some(Attempt::Replay(rp)) = v.current.take() else {
                    return;
                };
                v.left = v.left.saturating_sub(1);
                for env in rp.have.into_values() {
                    self.hold(rp.base.round, env);
                }
                let reason = if rp.fork {
                    "diverged from the swarm"
                } else {
                    "behind the swarm"
                };
                self.adopt(
                    next,
                    hash,
                    Some((rp.base, rp.base_hash)),
                    How::Synced {
                        from: rp.claim.holders[0],
                        reason,
                        verified: "replay",
                        bytes,
                        replaced: None,
                    },
                );
                self.verify_step(now);
            }
        }
    }
}
