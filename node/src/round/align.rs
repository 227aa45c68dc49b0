//! Align: before a round, move to a better state of the swarm only once it verifies (a fork
//! of our round or the next round by replay, a state further ahead by attestation), and keep
//! what we hold checkpointed and served.

use super::*;

impl<B: AutodiffBackend> Driver<B> {
    /// Before a round: wait briefly for peers finishing the previous one, then catch up with a
    /// swarm that is ahead or move to the state the rules prefer over ours — only ever to a
    /// state we verified ([`verify`]).
    pub(super) async fn align(&mut self) {
        let until = Instant::now() + Duration::from_secs(ALIGN_WAIT_SECS);
        loop {
            for ev in self.drain_events_now() {
                self.on_event(ev, None).await;
            }
            // A window that closes while we wait for lagging peers ends the wait: the owner gets
            // the machine back now, not after the slowest peer (the round loop yields next).
            if !self.available() {
                break;
            }
            self.refresh_statuses().await;
            let r = self.state.round;
            let lagging = self
                .trainer_peers()
                .iter()
                .filter(|(_, s)| {
                    s.round < r && matches!(s.phase, Phase::Training | Phase::Collecting)
                })
                .count();
            if lagging == 0 || Instant::now() >= until || self.shutting_down() || !self.available()
            {
                break;
            }
            self.next_event_within(Duration::from_millis(200)).await;
        }
        // Catch up one verified round at a time (a replay each), or in one step to an attested
        // state; a few steps at most before training again.
        for _ in 0..8 {
            if self.shutting_down() || !self.improve_state().await {
                break;
            }
        }
    }

    /// The claims of the connected peers' checked statuses.
    pub(super) fn claims(&self) -> Vec<Claim> {
        group_claims(
            self.statuses
                .iter()
                // A peer that finished its rounds still holds a state of ours to compare with.
                .filter(|(p, s)| {
                    self.connected.contains(p)
                        && (s.phase != Phase::Done || s.round == self.state.round)
                })
                .filter_map(|(p, s)| Some((crate::net::public_key_of(p)?, s))),
        )
    }

    /// True when no live peer works on our state's round while some hold a state the rules
    /// prefer (a fork of our round, or the next round) that did not verify through no fault of
    /// its own (the machine's rule: `machine::align`).
    pub(super) fn better_unverified(&self) -> bool {
        let r = self.state.round;
        let ours = self.trainer_peers().iter().any(|(_, s)| {
            s.round == r
                && s.state_hash == self.hash
                && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
        });
        if ours {
            return false;
        }
        let held = Held {
            round: r,
            hash: self.hash,
            formed: self.state.formed_by.len(),
        };
        candidates(
            &self.recipe,
            held,
            &self.claims(),
            &verify::Rejections::default(),
        )
        .iter()
        .any(|c| !matches!(c, verify::Candidate::Attested(_)) && !self.rejected.faulty(c.claim()))
    }

    /// Tries the states the peers' claims offer, best first ([`verify::candidates`]), and adopts
    /// the first that verifies. Returns whether our state changed.
    pub(super) async fn improve_state(&mut self) -> bool {
        let claims = self.claims();
        let held = Held {
            round: self.state.round,
            hash: self.hash,
            formed: self.state.formed_by.len(),
        };
        self.rejected.prune(crate::net::mono_ms());
        let list = candidates(&self.recipe, held, &claims, &self.rejected);
        if list.is_empty() {
            return false;
        }
        self.announce(Phase::Syncing).await;
        let t0 = Instant::now();
        let known = self.held_contributions();
        let found = verify::first_verified(
            &self.net,
            &self.store,
            &self.recipe,
            (&self.state, self.hash),
            self.prev.as_ref(),
            list,
            &known,
            &mut self.rejected,
        )
        .await;
        match found {
            Some(v) => {
                let reason = if v.state.round == self.state.round {
                    "diverged from the swarm"
                } else {
                    "behind the swarm"
                };
                self.adopt(v, reason, t0.elapsed().as_secs_f64()).await;
                true
            }
            None => {
                self.announce(Phase::Ready).await;
                false
            }
        }
    }

    /// Verified contributions that we hold and serve, by round and sender.
    pub(super) fn held_contributions(&self) -> HashMap<(u64, [u8; 32]), Arc<SignedEnvelope>> {
        self.net.served.current().contributions.clone()
    }

    pub(super) async fn adopt(&mut self, a: verify::Verified, reason: &str, secs: f64) {
        let hash = a.state.hash();
        let replaced = (a.state.round == self.state.round).then_some(self.hash);
        info!(round = a.state.round, hash = %hash.short(), from = %a.from, reason, verified = a.verified, "synced state from peer");
        if let Some(c) = self.compute.as_mut()
            && let Err(e) = c.trainer.load_params(&a.state.params)
        {
            warn!(error = %e, "synced state does not fit the model");
            return;
        }
        self.hash = hash;
        self.ef = ErrorFeedback::default();
        self.state = a.state;
        self.prev = a.prev;
        self.net.served.update(|s| {
            for env in a.envelopes {
                s.contributions
                    .insert((env.header.round, env.header.sender), env);
            }
        });
        self.just_synced = true;
        self.checkpoint().await;
        self.sink.emit(&NodeEvent::Synced {
            round: self.state.round,
            state_hash: self.hash.to_hex(),
            from: a.from.to_string(),
            reason: reason.into(),
            secs,
            bytes: a.bytes,
            verified: a.verified.into(),
            replaced: replaced.map(|h| h.to_hex()),
        });
        self.announce(Phase::Ready).await;
    }

    /// Checkpoints the state to sled and serves it in chunks.
    pub(super) async fn checkpoint(&mut self) {
        let state = std::mem::replace(
            &mut self.state,
            StateSnapshot {
                round: 0,
                params: vec![],
                momentum: vec![],
                formed_by: vec![],
                noise: None,
            },
        );
        self.state = sync::checkpoint_and_serve(&self.store, &self.net, state, self.hash).await;
    }
}
