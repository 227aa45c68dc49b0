//! Collect: the contributions of the round — pushed, stashed early, fetched when missing —
//! each verified before it counts.

use super::*;

impl<B: AutodiffBackend> Driver<B> {
    /// Keeps a contribution for a round we have not reached yet (or that arrived while we were
    /// not collecting): a few per sender and round (as many as a peer may have queued), and no
    /// more than that many per member of the swarm (or [`MAX_STASHED`] in an open swarm).
    pub(super) fn stash_push(&mut self, env: SignedEnvelope, from: PeerId) {
        // Only what its sender signed (and, in a private swarm, a member): a forged envelope
        // naming another sender must not take that sender's place.
        if let Err(e) = env.check_signer(self.recipe.allowlist.as_deref()) {
            warn!(%from, sender = %short(&env.header.sender), round = env.header.round, reason = %e, "contribution refused");
            self.sink.emit(&NodeEvent::Refused {
                round: self.state.round,
                from: from.to_string(),
                reason: e.to_string(),
            });
            return;
        }
        let per_sender = net::MAX_QUEUED_PUSHES_PER_PEER;
        let max = self
            .recipe
            .allowlist
            .as_ref()
            .map_or(MAX_STASHED, |m| m.len() * per_sender);
        let same = self
            .stash
            .iter()
            .filter(|e| e.header.sender == env.header.sender && e.header.round == env.header.round)
            .count();
        if self.stash.len() < max && same < per_sender {
            self.stash.push(env);
        }
    }

    /// Verifies and records one contribution for the current round.
    pub(super) fn consider(
        &mut self,
        env: SignedEnvelope,
        from: PeerId,
        collected: &mut BTreeMap<[u8; 32], Accepted>,
    ) {
        let round = self.state.round;
        if env.header.round == round + 1 {
            self.stash_push(env, from);
            return;
        }
        let duplicate = env.header.round == round && collected.contains_key(&env.header.sender);
        if duplicate {
            let same = self
                .net
                .served
                .current()
                .contributions
                .get(&(round, env.header.sender))
                .map(|held| held.signature == env.signature);
            if same == Some(true) {
                return; // the same contribution again (pushed and fetched)
            }
        }
        if !duplicate && collected.len() >= self.recipe.max_contributors() {
            debug!(%from, round, "a round holds as many contributions as it may count; refused one more");
            return;
        }
        let ctx = self.recipe.context(round, self.hash);
        match accept(&ctx, &env) {
            Ok(_) if duplicate => {
                let reason = "a second, different contribution from this sender for this round (the first is kept)";
                warn!(%from, sender = %short(&env.header.sender), round, reason, "contribution refused");
                self.sink.emit(&NodeEvent::Refused {
                    round,
                    from: from.to_string(),
                    reason: reason.into(),
                });
            }
            Ok(a) => {
                debug!(sender = %short(&a.sender), tokens = a.tokens, "contribution accepted");
                self.net
                    .served
                    .update(|s| _ = s.contributions.insert((round, a.sender), Arc::new(env)));
                collected.insert(a.sender, a);
                self.holding = collected.keys().copied().collect();
                self.serve_status();
            }
            Err(e) => {
                if env.header.round < round
                    && matches!(
                        e,
                        accept::Refusal::Verify(
                            nightshift_protocol::VerifyError::WrongRound { .. }
                        )
                    )
                {
                    debug!(%from, sender = %short(&env.header.sender), round, reason = %e, "late contribution refused");
                } else {
                    warn!(%from, sender = %short(&env.header.sender), round, reason = %e, "contribution refused");
                }
                self.sink.emit(&NodeEvent::Refused {
                    round,
                    from: from.to_string(),
                    reason: e.to_string(),
                });
            }
        }
    }

    pub(super) async fn on_event(
        &mut self,
        ev: NetEvent,
        collected: Option<&mut BTreeMap<[u8; 32], Accepted>>,
    ) {
        match ev {
            NetEvent::ContributionPushed { peer, envelope, .. } => match collected {
                Some(c) => self.consider(envelope, peer, c),
                None => {
                    if envelope.header.round >= self.state.round {
                        self.stash_push(envelope, peer);
                    }
                }
            },
            NetEvent::StatusAnnounced { peer, status } => {
                self.connected.insert(peer);
                self.note_status(peer, status);
            }
            NetEvent::PeerConnected(peer) => {
                self.connected.insert(peer);
                self.net.announce_status(
                    self.signed_status(),
                    [peer],
                    Duration::from_secs(LOOKUP_TIMEOUT_SECS),
                );
            }
            NetEvent::PeerDisconnected(peer) => {
                self.connected.remove(&peer);
                self.statuses.remove(&peer);
            }
        }
    }

    /// Fetches `sender`'s contribution for the current round from `peer` (the one whose
    /// [`SignedEnvelope::digest`] is `digest`, when given).
    pub(super) async fn fetch_contribution(
        &mut self,
        peer: PeerId,
        sender: [u8; 32],
        digest: Option<Hash32>,
        collected: &mut BTreeMap<[u8; 32], Accepted>,
    ) {
        let round = self.state.round;
        let r = tokio::time::timeout(
            Duration::from_secs(LOOKUP_TIMEOUT_SECS * 4),
            self.net
                .request(peer, Request::GetContribution { round, sender }),
        )
        .await;
        if let Ok(Ok(Response::Contribution(Some(env)))) = r {
            if env.header.sender != sender
                || env.header.round != round
                || digest.is_some_and(|d| d != env.digest())
            {
                warn!(%peer, "peer answered with a different contribution than asked for");
                return;
            }
            self.consider(env, peer, collected);
        }
    }
}
