//! What a node's machine asked for, carried out: statuses, pushes, fetches, training (the
//! stand-in), new states.

use super::*;

impl World {
    pub(super) fn carry_out(&mut self, i: usize, o: Output) {
        let now = self.now;
        match o {
            Output::Announce(mut s, lists) => {
                s.unix_ms = now;
                self.nodes[i].served_status = Some((s.clone(), lists));
                let bytes = wire::encode(&s).len() as u64 + ENVELOPE_BYTES;
                let from = self.nodes[i].key;
                for j in self.connected_neighbours(i) {
                    self.send(
                        i,
                        j,
                        bytes,
                        Input::Status {
                            from,
                            status: s.clone(),
                        },
                    );
                }
            }
            Output::Serve(mut s, lists) => {
                s.unix_ms = now;
                self.nodes[i].served_status = Some((s, lists));
            }
            Output::Greet(k) => {
                if let (Some(&j), Some((s, _))) =
                    (self.index.get(&k), self.nodes[i].served_status.clone())
                {
                    let bytes = wire::encode(&s).len() as u64 + ENVELOPE_BYTES;
                    let from = self.nodes[i].key;
                    self.send(i, j, bytes, Input::Status { from, status: s });
                }
            }
            Output::AskStatuses(peers) => {
                for k in peers {
                    if let Some(&j) = self.index.get(&k) {
                        self.request(i, j, Req::Status);
                    }
                }
            }
            Output::AskLists(peers) => {
                for k in peers {
                    if let Some(&j) = self.index.get(&k) {
                        self.request(i, j, Req::Lists);
                    }
                }
            }
            Output::LookUpSpeeds(keys) => {
                // A DHT look-up of each peer's window record: about a round trip.
                for k in keys {
                    if let Some(&j) = self.index.get(&k)
                        && let Some(tokens_per_sec) = self.nodes[j].speed
                    {
                        let at = now + 2 * self.latency(i, j);
                        self.deliver_at(
                            at,
                            i,
                            Input::Speed {
                                from: k,
                                tokens_per_sec,
                            },
                        );
                    }
                }
            }
            Output::Push { to, envelope } => {
                self.contributions += 1;
                self.contribution_bytes += envelope.payload.len() as u64;
                let bytes = self.weigh(
                    envelope.payload.len() as u64 + ENVELOPE_BYTES,
                    net::contribution_values(&envelope),
                );
                let from = self.nodes[i].key;
                for k in to {
                    if let Some(&j) = self.index.get(&k) {
                        self.send(
                            i,
                            j,
                            bytes,
                            Input::Contribution {
                                from,
                                envelope: envelope.clone(),
                            },
                        );
                    }
                }
            }
            Output::Hold(env) => {
                self.nodes[i]
                    .served
                    .insert((env.header.round, env.header.sender), env);
            }
            Output::ForgetBefore(r) => {
                let n = &mut self.nodes[i];
                n.served.retain(|(round, _), _| *round >= r);
                n.slices.retain(|(round, _, _), _| *round >= r);
                n.reduced.retain(|(round, _), _| *round >= r);
            }
            Output::HoldSlices(slices) => {
                for s in slices {
                    let id = ContributionId::of(&s.envelope);
                    let key = (s.envelope.header.round, id, s.index);
                    self.nodes[i].slices.insert(key, s);
                }
            }
            Output::FetchSlice {
                from,
                round,
                id,
                index,
            } => {
                if let Some(&j) = self.index.get(&from) {
                    self.request(i, j, Req::Slice { round, id, index });
                }
            }
            Output::SendReduced { to, reduced } => {
                let bytes = self.weigh(
                    wire::encode(&*reduced).len() as u64,
                    net::reduced_values(&reduced),
                );
                let from = self.nodes[i].key;
                for k in to {
                    if let Some(&j) = self.index.get(&k) {
                        let input = Input::Reduced {
                            from,
                            reduced: reduced.clone(),
                        };
                        self.send(i, j, bytes, input);
                    }
                }
            }
            Output::HoldReduced {
                round,
                index,
                reduced,
            } => _ = self.nodes[i].reduced.insert((round, index), reduced),
            Output::FetchReduced { from, round, index } => {
                if let Some(&j) = self.index.get(&from) {
                    self.request(i, j, Req::Reduced { round, index });
                }
            }
            Output::Fetch {
                from,
                round,
                sender,
            } => {
                if let Some(&j) = self.index.get(&from) {
                    self.request(i, j, Req::Contribution { round, sender });
                }
            }
            Output::FetchState { from, round, hash } => {
                if let Some(&j) = from.first().and_then(|k| self.index.get(k)) {
                    self.request(i, j, Req::State { round, hash });
                } else {
                    self.deliver_at(now + 1, i, Input::StateFailed { hash });
                }
            }
            Output::Train {
                round,
                start,
                steps,
                budget_ms,
                ..
            } => self.train(i, round, &start, steps, budget_ms),
            Output::NewState(ns) => {
                let n = &mut self.nodes[i];
                let attested = matches!(
                    ns.how,
                    How::Synced {
                        verified: "attested",
                        ..
                    }
                );
                if attested {
                    let from = n.checkpoint.round.min(ns.state.round.saturating_sub(1));
                    for r in from..ns.state.round {
                        if let Some(h) = n.held.get_mut(&r) {
                            h.skipped = true;
                        }
                    }
                } else if n.checkpoint.round + 1 == ns.state.round {
                    // Stepped or replayed from the state it held.
                    self.parents.insert(ns.hash, n.checkpoint_hash);
                }
                if n.checkpoint.round + 1 == ns.state.round {
                    n.previous = Some(n.checkpoint.clone());
                }
                n.checkpoint = ns.state.clone();
                n.checkpoint_hash = ns.hash;
                let h = n.held.entry(ns.state.round).or_default();
                if h.first.is_none() {
                    h.first = Some(ns.hash);
                    h.at = now;
                }
                h.last = Some(ns.hash);
                if !self.losses.contains_key(&ns.hash) {
                    let loss = self.model.val_loss(&ns.state.params);
                    self.losses.insert(ns.hash, loss);
                }
                if let How::Synced { .. } = ns.how {
                    self.synced += 1;
                }
            }
            Output::Note(note) => {
                if self.trace {
                    eprintln!("{:>8} node {i} r{}: {note:?}", now, self.round_of(i));
                }
            }
            Output::Finished(_) => self.nodes[i].finished = true,
            Output::Failed(why) => {
                self.nodes[i].finished = true;
                self.failures.push(format!("node {i}: {why}"));
            }
        }
    }

    /// The node's inner steps from `start` (the model's, within the budget); the result arrives
    /// when the steps would have finished at the node's simulated speed.
    pub(super) fn train(
        &mut self,
        i: usize,
        round: u64,
        start: &Start,
        steps: u32,
        budget_ms: Option<Millis>,
    ) {
        let step_ms = self.nodes[i].step_ms;
        // As the daemon's trainer: a step starts while the budget has time left.
        let fit = budget_ms.map_or(steps, |b| ((b as f64 / step_ms).ceil() as u32).min(steps));
        let done = self
            .model
            .train(i, round, start, fit, &mut self.nodes[i].rng);
        self.tokens += done.tokens;
        let secs = fit as f64 * step_ms / 1000.0;
        let trained = Trained {
            steps: fit,
            tokens: done.tokens,
            mean_loss: done.mean_loss,
            params: done.params,
            secs,
            yielded: fit < steps,
        };
        let at = self.now + (fit as f64 * step_ms).ceil() as Millis;
        // Its speed goes out with its window record (Kademlia; not counted, as in the daemon).
        if fit > 0 {
            let tokens_per_sec = trained.tokens as f64 / secs.max(1e-9);
            self.nodes[i].speed = Some(tokens_per_sec);
            let from = self.nodes[i].key;
            for j in self.connected_neighbours(i) {
                self.deliver_at(
                    at,
                    j,
                    Input::Speed {
                        from,
                        tokens_per_sec,
                    },
                );
            }
        }
        let at = at.max(self.now + 1);
        if fit > 0 && self.args.drop > 0.0 && self.drops.random_bool(self.args.drop) {
            let epoch = self.nodes[i].epoch;
            self.schedule(at, Ev::Lose { node: i, epoch });
        } else {
            self.deliver_at(at, i, Input::Trained(trained));
        }
    }

    pub(super) fn connected_neighbours(&self, i: usize) -> Vec<usize> {
        self.nodes[i]
            .neighbours
            .iter()
            .copied()
            .filter(|j| self.nodes[*j].machine.is_some())
            .collect()
    }
}
