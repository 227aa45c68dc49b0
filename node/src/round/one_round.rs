//! One round from start to end: align, train, encode and sign, push and collect, reconcile,
//! step, checkpoint and announce.

use super::*;

impl<B: AutodiffBackend> Driver<B> {
    pub(super) async fn one_round(&mut self) -> anyhow::Result<Outcome> {
        let r = self.state.round;
        let t_round = Instant::now();
        let traffic0 = self.net.traffic.snapshot();
        let status0 = self.net.traffic.status_sent();
        self.holding.clear();
        self.announce(Phase::Training).await;
        let t = self.manifest.manifest.training.clone();
        self.refresh_peer_windows();

        // Inner phase, on a blocking thread: until H steps, the time budget, the window closing
        // or shutdown, whichever comes first.
        let budget = self.budget_override.take().or_else(|| self.train_budget());
        let report = match self.train(t.inner_steps, budget).await? {
            Trained::Nothing if self.shutting_down() => return Ok(Outcome::Shutdown),
            Trained::Nothing => return Ok(Outcome::Yielded),
            Trained::Report(r) => r,
        };
        let train_secs = t_round.elapsed().as_secs_f64();
        if self.shutting_down() {
            return Ok(Outcome::Shutdown);
        }
        let yielded = report.yielded && !self.available();
        if !yielded {
            // Throughput of a full-speed stretch (a yield cuts a step short of nothing, but the
            // partial stretch is also measured fairly; keep the newest).
            self.tokens_per_sec = Some(report.tokens as f64 / train_secs.max(1e-9));
        } else if budget.is_some() {
            debug!("stopped by the window, not the budget");
        }

        // Pseudo-gradient, error feedback, encoding and signing.
        let t_enc = Instant::now();
        let theta_i = self
            .compute
            .as_ref()
            .map(|c| c.trainer.params())
            .unwrap_or_default();
        let base = self.state.params.clone();
        let codec = t.codec;
        let mut ef = std::mem::take(&mut self.ef);
        let shapes = Arc::clone(&self.shapes);
        let (encoded, ef) = tokio::task::spawn_blocking(move || {
            let r = accept::encode_delta(&base, &theta_i, codec, &shapes, &mut ef);
            (r, ef)
        })
        .await?;
        self.ef = ef;
        if yielded {
            // The owner wants the machine: free the device before waiting for the others.
            if let Some(mut c) = self.compute.take() {
                self.compute = Some(
                    tokio::task::spawn_blocking(move || {
                        c.trainer.suspend();
                        c
                    })
                    .await?,
                );
            }
        }
        let (enc, sent) = match encoded {
            Ok(e) => e,
            Err(delta::DeltaError::NonFinite(index)) => return self.diverged(r, index).await,
            Err(e) => return Err(e).context("our own delta cannot be encoded"),
        };
        let wire_delta_bytes = enc.body.len() as u64;
        // The round's plan as this node sees it: the trainers working on it, itself included.
        let expected = 1 + self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| {
                s.round == r
                    && s.state_hash == self.hash
                    && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
            })
            .count() as u32;
        let expected = expected.min(MAX_EXPECTED);
        let contribution = Contribution {
            tokens: report.tokens,
            inner_steps: report.steps,
            train_loss: report.mean_loss,
            delta: enc,
            expected,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round: r,
            sender: self.me,
            base_hash: self.hash,
        };
        let env = SignedEnvelope::sign(&self.key, header, wire::encode(&contribution));
        let encode_secs = t_enc.elapsed().as_secs_f64();

        let mut collected: BTreeMap<[u8; 32], Accepted> = BTreeMap::new();
        collected.insert(
            self.me,
            Accepted {
                sender: self.me,
                digest: env.digest(),
                tokens: report.tokens,
                train_loss: report.mean_loss,
                delta: sent,
                expected,
            },
        );
        self.net
            .served
            .update(|s| _ = s.contributions.insert((r, self.me), Arc::new(env.clone())));
        self.holding = vec![self.me];
        self.announce(Phase::Collecting).await;

        // Push to every peer, concurrently with collecting.
        let t_push = Instant::now();
        for ev in self.drain_events_now() {
            self.on_event(ev, Some(&mut collected)).await;
        }
        let peers: Vec<PeerId> = self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| s.phase != Phase::Paused)
            .map(|(p, _)| *p)
            .collect();
        let push = {
            let net = self.net.clone();
            let env = env.clone();
            tokio::spawn(async move {
                let sends = peers.into_iter().map(|p| {
                    let net = net.clone();
                    let env = env.clone();
                    async move { net.request(p, Request::Push(env)).await }
                });
                futures::future::join_all(sends).await;
                t_push.elapsed()
            })
        };
        for env in std::mem::take(&mut self.stash) {
            let from = net::peer_id_of(&env.header.sender).unwrap_or(self.net.local_peer);
            self.consider(env, from, &mut collected);
        }

        // Collect until every live peer's contribution is in, or the deadline.
        let deadline_secs = (t.round_deadline_secs as f64).max(1.5 * train_secs);
        let deadline = Instant::now() + Duration::from_secs_f64(deadline_secs);
        let mut tick = tokio::time::interval(Duration::from_millis(COLLECT_TICK_MS));
        let mut shutdown = self.shutdown.clone();
        let mut confirmed = false;
        let base_hash_now = self.hash;
        loop {
            let have: HashSet<PeerId> = collected.keys().filter_map(net::peer_id_of).collect();
            let trainers = self.trainer_peers();
            // Only an attested state further on ends the round early: a mere claim of a later
            // round, which anyone can make, does not.
            if self
                .claims()
                .iter()
                .any(|c| c.round > r + 1 && self.recipe.attested(c))
            {
                info!(round = r, "the swarm has moved on (attested); catching up");
                return Ok(Outcome::Behind);
            }
            let missing: Vec<PeerId> = trainers
                .iter()
                // A peer on another state of this round sends contributions we refuse: nobody
                // waits for it.
                .filter(|(p, s)| {
                    s.round == r
                        && s.state_hash == base_hash_now
                        && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
                        && !have.contains(p)
                })
                .map(|(p, _)| *p)
                .collect();
            if missing.is_empty() {
                if confirmed {
                    break;
                }
                // Before closing, ask the peers once more: one that resumed or joined the round
                // a moment ago would otherwise be left out, and the state that counts its work
                // preferred over ours later (a fork, repaired but a fork).
                self.refresh_statuses().await;
                confirmed = true;
                continue;
            }
            if Instant::now() >= deadline {
                warn!(
                    round = r,
                    missing = missing.len(),
                    "round deadline passed; going on without them"
                );
                break;
            }
            tokio::select! {
                ev = self.events.recv() => match ev {
                    Some(ev) => self.on_event(ev, Some(&mut collected)).await,
                    None => bail!("network task stopped"),
                },
                _ = tick.tick() => {
                    // Fetch what peers hold and we lack: at once when its sender cannot push to
                    // us (not connected), else only after giving the push time to arrive.
                    let patient = t_push.elapsed() > Duration::from_secs(PUSH_GRACE_SECS);
                    let wanted: Vec<(PeerId, [u8; 32])> = self.trainer_peers().iter()
                        .filter(|(_, s)| s.round == r)
                        .flat_map(|(p, s)| s.holding.iter().map(move |k| (*p, *k)))
                        .collect();
                    for (p, k) in wanted {
                        let direct = net::peer_id_of(&k).is_some_and(|id| self.connected.contains(&id));
                        if !collected.contains_key(&k) && (patient || !direct) {
                            self.fetch_contribution(p, k, None, &mut collected).await;
                        }
                    }
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        return Ok(Outcome::Shutdown);
                    }
                }
            }
        }
        let collect_secs = t_enc.elapsed().as_secs_f64() - encode_secs;

        // Reconcile with what the peers hold or used, so that every node averages the same set.
        // Bounded: a peer listing senders that do not exist costs one look-up each, at most
        // MAX_RECONCILE_FETCHES in all, within RECONCILE_SECS.
        self.refresh_statuses().await;
        let members = self.recipe.allowlist.clone();
        // What each peer holds for this round (any of a sender's contributions), or the very
        // contributions that formed its next state.
        let mut wanted: Vec<(PeerId, [u8; 32], Option<Hash32>)> = self
            .trainer_peers()
            .iter()
            .flat_map(|(p, s)| {
                let listed: Vec<([u8; 32], Option<Hash32>)> = if s.round == r {
                    s.holding.iter().map(|k| (*k, None)).collect()
                } else if s.round == r + 1 {
                    s.formed_by
                        .iter()
                        .map(|id| (id.sender, Some(id.digest)))
                        .collect()
                } else {
                    vec![]
                };
                listed
                    .into_iter()
                    .filter(|(k, _)| !collected.contains_key(k))
                    .filter(|(k, _)| members.as_ref().is_none_or(|m| m.contains(k)))
                    .map(|(k, d)| (*p, k, d))
                    .collect::<Vec<_>>()
            })
            .collect();
        wanted.truncate(MAX_RECONCILE_FETCHES + members.as_ref().map_or(0, Vec::len));
        let reconcile_until = Instant::now() + Duration::from_secs(RECONCILE_SECS);
        for (p, k, digest) in wanted {
            if Instant::now() >= reconcile_until {
                warn!(
                    round = r,
                    "reconciling took too long; going on with what we hold"
                );
                break;
            }
            if !collected.contains_key(&k) {
                self.fetch_contribution(p, k, digest, &mut collected).await;
            }
        }

        // Outer step: the swarm's aggregator and Nesterov step, the same function a replay runs.
        let base = Arc::new(std::mem::replace(
            &mut self.state,
            StateSnapshot {
                round: r,
                params: vec![],
                momentum: vec![],
                formed_by: vec![],
                noise: None,
            },
        ));
        let base_hash = self.hash;
        let recipe = self.recipe.clone();
        let round_set = std::mem::take(&mut collected);
        let (applied, collected, base) = {
            let base = base.clone();
            tokio::task::spawn_blocking(move || {
                let applied = recipe.apply(&base, &round_set);
                (applied, round_set, base)
            })
            .await?
        };
        let step = match applied {
            Some((next, step)) => {
                self.state = next;
                Some(step)
            }
            None => None,
        };
        let Some(step) = step else {
            self.state = Arc::unwrap_or_clone(base);
            bail!("nothing to average");
        };
        if step.scale < 1.0 {
            info!(
                round = r,
                arrived = collected.len(),
                planned = step.planned,
                scale = step.scale,
                "short round: smaller step"
            );
        }
        self.prev = Some((base, base_hash));
        let state = self.state.clone();
        let (hash, compute, val_loss) = {
            let mut compute = self.compute.take().context("trainer state missing")?;
            tokio::task::spawn_blocking(move || {
                let h = state.hash();
                let loaded = compute.trainer.load_params(&state.params);
                // A suspended trainer keeps the device free: no evaluation then.
                let v = if loaded.is_ok() && !compute.trainer.is_suspended() {
                    compute.val_loss()
                } else {
                    f32::NAN
                };
                (h, compute, v)
            })
            .await?
        };
        self.compute = Some(compute);
        self.hash = hash;
        self.checkpoint().await;
        self.net
            .served
            .update(|s| s.contributions.retain(|(round, _), _| *round >= r));
        self.holding.clear();
        self.announce(Phase::Ready).await;

        let transfer_secs = match tokio::time::timeout(Duration::from_secs(1), push).await {
            Ok(Ok(d)) => d.as_secs_f64(),
            _ => t_push.elapsed().as_secs_f64(),
        };
        let traffic1 = self.net.traffic.snapshot();
        let rec = RoundRecord {
            round: r + 1,
            state_hash: self.hash.to_hex(),
            val_loss,
            train_loss: report.mean_loss,
            contributors: collected.len(),
            planned: step.planned,
            step_scale: step.scale,
            noise_ratio: step.noise,
            weights: collected
                .values()
                .map(|a| (short(&a.sender), a.tokens))
                .collect(),
            tokens: report.tokens,
            tokens_per_sec: report.tokens as f64 / train_secs.max(1e-9),
            inner_steps: report.steps,
            bytes_sent: traffic1.0 - traffic0.0,
            bytes_received: traffic1.1 - traffic0.1,
            status_bytes_sent: self.net.traffic.status_sent() - status0,
            dense_delta_bytes: delta::dense_bytes(self.num_params) as u64,
            wire_delta_bytes,
            codec: codec.to_string(),
            train_secs,
            encode_secs,
            transfer_secs,
            wait_secs: (collect_secs - transfer_secs).max(0.0),
            round_secs: t_round.elapsed().as_secs_f64(),
        };
        info!(round = r + 1, val_loss, contributors = collected.len(), hash = %self.hash.short(), secs = rec.round_secs, "round completed");
        self.sink.emit(&NodeEvent::RoundCompleted(rec));
        Ok(Outcome::Completed)
    }
}
