//! Train: ask for H inner steps from θ within the round's budget, and turn what they produced
//! into a signed, encoded contribution — or drop a round whose training went non-finite.

use super::accept::encode_delta;
use super::collect::Collecting;
use super::*;
use nightshift_protocol::message::MAX_EXPECTED;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{Contribution, DeltaError, PayloadKind, wire};

impl RoundMachine {
    pub(super) fn start_training(&mut self, now: Millis, budget_ms: Option<Millis>) {
        self.holding.clear();
        self.announce(Phase::Training);
        let planned_peers = self.working_on(self.state.round).count() as u32;
        self.stage = Stage::Training {
            started: now,
            planned_peers,
        };
        self.out.push(Output::Train {
            state: self.state.clone(),
            hash: self.hash,
            steps: self.cfg.inner_steps,
            budget_ms,
            fresh: std::mem::take(&mut self.fresh),
        });
    }

    pub(super) fn on_trained(&mut self, now: Millis, t: Trained) {
        let Stage::Training {
            started,
            planned_peers,
        } = self.stage
        else {
            return;
        };
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
        let encoded = encode_delta(
            &self.state.params,
            &t.params,
            self.cfg.recipe.codec,
            &self.cfg.recipe.shapes,
            &mut self.ef,
        );
        let (enc, sent) = match encoded {
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
        let wire_delta_bytes = enc.body.len() as u64;
        // The round's plan as this node sees it: the trainers working on it, itself included —
        // those on it when we began (one that died since is a contribution missing, and the
        // round's step shrinks for it) or now (one that joined late), whichever are more.
        let now_peers = self.working_on(r).count() as u32;
        let expected = (1 + planned_peers.max(now_peers)).min(MAX_EXPECTED);
        let contribution = Contribution {
            tokens: t.tokens,
            inner_steps: t.steps,
            train_loss: t.mean_loss,
            delta: enc,
            expected,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.cfg.recipe.swarm_id,
            round: r,
            sender: self.me,
            base_hash: self.hash,
        };
        let env = Arc::new(SignedEnvelope::sign(
            &self.cfg.key,
            header,
            wire::encode(&contribution),
        ));
        let mut collected = BTreeMap::new();
        collected.insert(
            self.me,
            Accepted {
                sender: self.me,
                digest: env.digest(),
                tokens: t.tokens,
                train_loss: t.mean_loss,
                delta: sent,
                expected,
            },
        );
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
        let train_ms = now.saturating_sub(started);
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
