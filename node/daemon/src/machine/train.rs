//! Train: ask for H inner steps from θ within the round's budget, and turn what they produced
//! into a signed, encoded contribution — or drop a round whose training went non-finite.

use super::accept::encode_delta;
use super::collect::Collecting;
use super::sliced::{Slicing, encode_sliced};
use super::*;
use nightshift_protocol::message::MAX_EXPECTED;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::slices::{SlicedContribution, sign_sliced};
use nightshift_protocol::{Contribution, DeltaError, PayloadKind, wire};

impl RoundMachine {
    pub(super) fn start_training(&mut self, now: Millis, budget_ms: Option<Millis>) {
        self.holding.clear();
        self.announce(Phase::Training);
        let planned_peers = self.working_on(self.state.round).count() as u32;
        self.stage = Stage::Training {
            started: now,
            planned_peers,
            base: None,
        };
        self.out.push(Output::Train {
            round: self.state.round,
            start: Start::State {
                state: self.state.clone(),
                hash: self.hash,
            },
            steps: self.cfg.inner_steps,
            budget_ms,
            fresh: std::mem::take(&mut self.fresh),
        });
    }

    /// The round is aligned and steps ran ahead for it: they are this round's training (what
    /// they produced goes out at once when they are done already).
    pub(super) fn resume_early(&mut self, now: Millis, e: Early) {
        self.holding.clear();
        self.announce(Phase::Training);
        let planned_peers = self.working_on(self.state.round).count() as u32;
        self.stage = Stage::Training {
            started: e.started,
            planned_peers,
            base: Some(e.start),
        };
        if let Some(t) = e.done {
            self.on_trained(now, t);
        }
    }

    /// Right after a contribution went out: train the next round's steps while this round is
    /// collected, from where these steps ended, rebased on θ when they did not start from it.
    fn start_early(&mut self, now: Millis, base: Option<&[f32]>, t: &Trained) {
        let next = self.state.round + 1;
        let last = self.cfg.rounds.is_some_and(|n| next >= n);
        if !self.cfg.overlap || !self.available || last || t.steps == 0 {
            return;
        }
        let (start, from) = match base {
            None => (Start::Continue, Arc::new(t.params.clone())),
            Some(b) => {
                // θ(r) plus the progress not averaged yet: x − b.
                let p: Vec<f32> = self
                    .state
                    .params
                    .iter()
                    .zip(&t.params)
                    .zip(b)
                    .map(|((th, x), b)| th + (x - b))
                    .collect();
                let p = Arc::new(p);
                (Start::Params(p.clone()), p)
            }
        };
        self.early = Some(Early {
            start: from,
            started: now,
            done: None,
        });
        self.out.push(Output::Train {
            round: next,
            start,
            steps: self.cfg.inner_steps,
            budget_ms: self.train_budget(),
            fresh: false,
        });
    }

    pub(super) fn on_trained(&mut self, now: Millis, t: Trained) {
        let Stage::Training {
            started,
            planned_peers,
            ref base,
        } = self.stage
        else {
            return;
        };
        let base = base.clone();
        let r = self.state.round;
        if t.steps == 0 {
            self.out.push(Output::Note(Note::Yielded { round: r }));
            self.announce(Phase::Ready);
            self.begin_round(now);
            return;
        }
        if !t.yielded || self.available {
            self.tokens_per_sec = Some(t.tokens as f64 / t.secs.max(1e-9));
        }
        // The round's plan as this node sees it: the trainers working on it, itself included —
        // those on it when we began (one that died since is a contribution missing, and the
        // round's step shrinks for it) or now (one that joined late), whichever are more.
        let now_peers = self.working_on(r).count() as u32;
        let expected = (1 + planned_peers.max(now_peers)).min(MAX_EXPECTED);
        let state = self.state.clone();
        let from: &[f32] = base.as_deref().map_or(&state.params, |b| b);
        let made = match self.cfg.recipe.round_slicing(&state) {
            None => self.whole_contribution(from, &t, expected),
            Some(s) => self.sliced_contribution(from, &t, expected, s),
        };
        let (env, wire_delta_bytes, own) = match made {
            Ok(e) => e,
            Err(DeltaError::NonFinite(index)) => return self.diverged(now, r, index),
            Err(e) => {
                self.stage = Stage::Done;
                self.out.push(Output::Failed(format!(
                    "our own delta cannot be encoded: {e}"
                )));
                return;
            }
        };
        let mut collected = BTreeMap::new();
        collected.insert(self.me, own);
        self.hold(r, env.clone());
        self.holding = vec![self.me];
        self.announce(Phase::Collecting);
        let to: Vec<Key> = self
            .trainer_peers()
            .filter(|(_, s)| s.phase != Phase::Paused)
            .map(|(k, _)| *k)
            .collect();
        if !to.is_empty() {
            self.out.push(Output::Push { to, envelope: env });
        }
        // Steps that ran ahead started before this round did: their own time counts.
        let train_ms = if base.is_some() {
            (t.secs * 1000.0) as Millis
        } else {
            now.saturating_sub(started)
        };
        self.start_early(now, base.as_ref().map(|b| b.as_slice()), &t);
        let deadline_ms = self
            .cfg
            .round_deadline_ms
            .max((1.5 * train_ms as f64) as Millis);
        self.stage = Stage::Collecting(Collecting::new(
            now,
            now + deadline_ms,
            collected,
            t,
            wire_delta_bytes,
        ));
        // This round's early arrivals count now; the next round's stay stashed; one further on
        // is refused (a node gets there only by syncing, and then fetches what it needs).
        for (from, env) in std::mem::take(&mut self.stash) {
            if env.header.round >= r {
                self.consider(from, env);
            }
        }
    }

    /// Our contribution whole: Δ encoded with the swarm's codec, signed. Returns it, the bytes
    /// of its delta and our own entry in the round's set (the values every peer decodes).
    fn whole_contribution(
        &mut self,
        from: &[f32],
        t: &Trained,
        expected: u32,
    ) -> Result<(Arc<SignedEnvelope>, u64, Accepted), DeltaError> {
        let recipe = self.cfg.recipe.clone();
        let (enc, sent) =
            encode_delta(from, &t.params, recipe.codec, &recipe.shapes, &mut self.ef)?;
        let bytes = enc.body.len() as u64;
        let contribution = Contribution {
            tokens: t.tokens,
            inner_steps: t.steps,
            train_loss: t.mean_loss,
            delta: enc,
            expected,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: recipe.swarm_id,
            round: self.state.round,
            sender: self.me,
            base_hash: self.hash,
        };
        let env = SignedEnvelope::sign(&self.cfg.key, header, wire::encode(&contribution));
        let own = Accepted {
            sender: self.me,
            digest: env.digest(),
            tokens: t.tokens,
            train_loss: t.mean_loss,
            delta: sent,
            expected,
        };
        Ok((Arc::new(env), bytes, own))
    }

    /// Our contribution cut into the round's slices: a small signed header (the slices' Merkle
    /// root), the slices kept and served to the reducers that fetch them. Returns the header
    /// and the bytes of the slices, and our own entry in the round's set (no values: the step is
    /// taken from the reducers' slices).
    fn sliced_contribution(
        &mut self,
        from: &[f32],
        t: &Trained,
        expected: u32,
        slicing: Slicing,
    ) -> Result<(Arc<SignedEnvelope>, u64, Accepted), DeltaError> {
        let recipe = self.cfg.recipe.clone();
        let r = self.state.round;
        let own = |env: &SignedEnvelope| Accepted {
            sender: env.header.sender,
            digest: env.digest(),
            tokens: t.tokens,
            train_loss: t.mean_loss,
            delta: vec![],
            expected,
        };
        // A round trained again (it could not be completed, and the node aligned back to it):
        // the contribution already sent stands, so that no peer holds two of ours.
        if let Some((round, slices)) = &self.own_slices
            && *round == r
            && let Some(first) = slices.first()
            && first.envelope.header.base_hash == self.hash
            && let Ok(a) = self.accept_env(&self.state.clone(), self.hash, &first.envelope)
        {
            let bytes = slices.iter().map(|s| s.body.body.len() as u64).sum();
            return Ok((Arc::new(first.envelope.clone()), bytes, a));
        }
        let ranges =
            slicing
                .ranges(recipe.num_params, recipe.codec)
                .ok_or(DeltaError::WrongLength {
                    expected: recipe.num_params,
                    got: 0,
                })?;
        let (sliced, _) = encode_sliced(from, &t.params, recipe.codec, &ranges, &mut self.ef)?;
        let header = SlicedContribution {
            tokens: t.tokens,
            inner_steps: t.steps,
            train_loss: t.mean_loss,
            expected,
            codec: recipe.codec,
            len: recipe.num_params as u64,
            slices: slicing.slices,
            root: sliced.root,
        };
        let env = sign_sliced(&self.cfg.key, recipe.swarm_id, r, self.hash, &header);
        let bytes = sliced.slices.iter().map(|s| s.body.len() as u64).sum();
        let slices: Vec<Arc<Slice>> = (0..sliced.slices.len())
            .map(|j| Arc::new(sliced.slice(&env, j)))
            .collect();
        self.out.push(Output::HoldSlices(slices.clone()));
        self.own_slices = Some((r, slices));
        let a = own(&env);
        Ok((Arc::new(env), bytes, a))
    }

    /// Our training of round `r` produced a non-finite parameter (at `index`): send nothing, start
    /// afresh from θ(r) next time. Several rounds in a row stop the node.
    fn diverged(&mut self, now: Millis, r: u64, index: usize) {
        self.diverged_in_a_row += 1;
        let in_a_row = self.diverged_in_a_row;
        self.out.push(Output::Note(Note::Diverged {
            round: r,
            index,
            in_a_row,
        }));
        if in_a_row >= MAX_DIVERGED_IN_A_ROW {
            self.stage = Stage::Done;
            self.out.push(Output::Failed(format!(
                "local training went non-finite in {in_a_row} rounds in a row (round {r}, \
                 parameter {index}): the swarm's settings (its inner learning rate?) make \
                 training diverge on this machine; the last checkpoint, θ({r}), is unchanged"
            )));
            return;
        }
        self.fresh = true;
        self.announce(Phase::Ready);
        self.begin_round(now);
    }
}
