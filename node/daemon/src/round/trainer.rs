//! What the machine asks of the trainer: inner steps on a blocking thread (stopping at a step
//! boundary when the idle window closes, the round's budget runs out or the node shuts down),
//! new states loaded, checkpointed and evaluated, and the round's record.

use super::*;
use crate::events::RoundRecord;
use crate::machine::{How, Millis, NewState, Note, Start, Trained};
use burn::module::Module;
use nightshift_model::{Gpt, InnerReport};
use nightshift_protocol::{StateSnapshot, delta};
use tracing::debug;

/// Training finished on its thread.
pub(super) struct TrainDone<B: AutodiffBackend> {
    compute: Compute<B>,
    report: InnerReport,
    /// θ after the steps (empty when none ran).
    params: Vec<f32>,
    secs: f64,
    /// When training stopped, on both clocks (for the yield latency).
    stopped_at: (Instant, SystemTime),
    round: u64,
    budget: bool,
    /// The state given could not be loaded into the trainer.
    failed: Option<String>,
}

/// A round's record with its validation loss, and the copy of the model that computed it.
pub(super) struct Evaluated<B: AutodiffBackend> {
    rec: RoundRecord,
    model: Option<Gpt<B::InnerBackend>>,
}

/// The round under way, for its record.
pub(super) struct RoundClock {
    started: Instant,
    traffic0: (u64, u64),
    status0: u64,
    /// How long turning the trained θ into a signed contribution took.
    pub(super) encode_secs: f64,
    /// When collecting began.
    pub(super) collect_from: Option<Instant>,
}

impl<B: AutodiffBackend> Driver<B> {
    /// Runs up to `steps` inner steps for `round` from `start` on a blocking thread (loading θ
    /// first when the trainer holds another state; with a fresh inner optimizer when `fresh`).
    pub(super) fn train(
        &mut self,
        round: u64,
        start: Start,
        steps: u32,
        budget_ms: Option<Millis>,
        fresh: bool,
    ) -> anyhow::Result<()> {
        let reload = match start {
            Start::State { state, hash } => {
                self.ahead = false;
                self.round = Some(self.clock());
                let reload = (fresh || self.loaded != hash).then(|| Arc::new(state.params.clone()));
                self.loaded = hash;
                reload
            }
            // Ahead of the round being collected: its record starts when that one's ends.
            Start::Continue => {
                self.ahead = true;
                self.loaded = Hash32::default();
                None
            }
            Start::Params(p) => {
                self.ahead = true;
                self.loaded = Hash32::default();
                Some(p)
            }
        };
        self.refresh_peer_windows();
        let mut compute = self.compute.take().context("the trainer is busy")?;
        self.sink.emit(&NodeEvent::Training { round, steps });
        let (stop, avail, tx) = (
            self.stop.clone(),
            self.avail.clone(),
            self.trained_tx.clone(),
        );
        let budget = budget_ms.map(Duration::from_millis);
        tokio::task::spawn_blocking(move || {
            let t0 = Instant::now();
            let c = &mut compute;
            let failed = reload.and_then(|p| {
                let r = if fresh {
                    c.trainer.reset(&p)
                } else {
                    c.trainer.load_params(&p)
                };
                r.err().map(|e| e.to_string())
            });
            c.trainer.wake();
            let (report, failed) = match c.feed.for_round(round) {
                Ok((corpus, shard)) => (
                    c.trainer.train(corpus, &shard, &mut c.rng, steps, &|| {
                        stop.load(Ordering::SeqCst)
                            || !avail.load(Ordering::SeqCst)
                            || budget.is_some_and(|b| t0.elapsed() >= b)
                    }),
                    failed,
                ),
                Err(e) => (nightshift_model::InnerReport::default(), Some(e)),
            };
            let stopped_at = (Instant::now(), SystemTime::now());
            let secs = t0.elapsed().as_secs_f64();
            let params = if report.steps > 0 {
                c.trainer.params()
            } else {
                vec![]
            };
            if !avail.load(Ordering::SeqCst) {
                // The owner wants the machine: free the device before waiting for the others.
                c.trainer.suspend();
            }
            let _ = tx.send(TrainDone {
                compute,
                report,
                params,
                secs,
                stopped_at,
                round,
                budget: budget.is_some(),
                failed,
            });
        });
        Ok(())
    }

    fn clock(&self) -> RoundClock {
        RoundClock {
            started: Instant::now(),
            traffic0: self.io.net.traffic.snapshot(),
            status0: self.io.net.traffic.status_sent(),
            encode_secs: 0.0,
            collect_from: None,
        }
    }

    /// Loads `state` into the trainer and returns its validation loss (NaN when `evaluate` is
    /// false or the trainer is suspended); `None` when the trainer is training ahead.
    async fn evaluate_on_trainer(
        &mut self,
        state: &Arc<StateSnapshot>,
        hash: Hash32,
        evaluate: bool,
    ) -> anyhow::Result<Option<f32>> {
        let Some(mut c) = self.compute.take() else {
            return Ok(None);
        };
        let s = state.clone();
        let (c, loaded, v) = tokio::task::spawn_blocking(move || {
            let loaded = c.trainer.load_params(&s.params).is_ok();
            // A suspended trainer keeps the device free: no evaluation then.
            let v = if evaluate && loaded && !c.trainer.is_suspended() {
                c.val_loss()
            } else {
                f32::NAN
            };
            (c, loaded, v)
        })
        .await?;
        self.compute = Some(c);
        if loaded {
            self.loaded = hash;
        } else {
            warn!(round = state.round, "the new state does not fit the model");
        }
        Ok(Some(v))
    }

    /// While the trainer trains ahead: `rec`'s validation loss is computed on the copy of the
    /// model in the background, and the record emitted once it is ([`Self::evaluated`]); at once
    /// without it when the copy is busy with the last one.
    fn evaluate_later(&mut self, state: Arc<StateSnapshot>, rec: RoundRecord) {
        let Some(model) = self.evaluator.take() else {
            return self.evaluated(Evaluated { rec, model: None });
        };
        let (val, tx) = (self.val.clone(), self.eval_tx.clone());
        self.evals_pending += 1;
        tokio::task::spawn_blocking(move || {
            let mut rec = rec;
            let model = model.devices().into_iter().next().and_then(|device| {
                nightshift_model::flat::unflatten(model, &state.params, &device).ok()
            });
            if let Some(m) = &model {
                rec.val_loss = eval::val_loss(m, &val);
            }
            let _ = tx.blocking_send(Evaluated { rec, model });
        });
    }

    /// A round's record, its validation loss known.
    pub(super) fn evaluated(&mut self, e: Evaluated<B>) {
        let Evaluated { rec, model } = e;
        if model.is_some() {
            self.evaluator = model;
            self.evals_pending = self.evals_pending.saturating_sub(1);
        }
        info!(round = rec.round, val_loss = rec.val_loss, contributors = rec.contributors, hash = %&rec.state_hash[..16], secs = rec.round_secs, "round completed");
        self.sink.emit(&NodeEvent::RoundCompleted(rec));
        self.update_control_info(None);
    }

    /// Waits for the records still being evaluated (the node is leaving).
    pub(super) async fn finish_evaluations(&mut self) {
        while self.evals_pending > 0 {
            match self.eval_rx.recv().await {
                Some(e) => self.evaluated(e),
                None => break,
            }
        }
    }

    /// The trainer is back: what it did goes to the machine (and a yield to the events).
    pub(super) fn on_trained(&mut self, done: TrainDone<B>) -> Input {
        let TrainDone {
            compute,
            report,
            params,
            secs,
            stopped_at,
            round: r,
            budget,
            failed,
        } = done;
        self.compute = Some(compute);
        if let Some(e) = failed {
            warn!(round = r, error = %e, "this round was not trained");
        }
        let by_window = report.yielded && !self.available() && !self.shutting_down();
        if by_window {
            let closing = self.closing.lock().map(|c| *c).unwrap_or_default();
            let latency = match (closing.scheduled, closing.seen) {
                (Some(at), _) => stopped_at.1.duration_since(at).unwrap_or_default(),
                (None, Some(seen)) => stopped_at.0.saturating_duration_since(seen),
                (None, None) => Duration::ZERO,
            };
            let reason = self
                .availability()
                .map_or_else(|| "busy".into(), |a| a.reason);
            info!(
                round = r,
                steps = report.steps,
                latency_ms = latency.as_secs_f64() * 1e3,
                "yielded at a step boundary"
            );
            self.sink.emit(&NodeEvent::Yielded {
                round: r,
                steps: report.steps,
                tokens: report.tokens,
                latency_ms: latency.as_secs_f64() * 1e3,
                reason,
            });
        } else if report.yielded && budget && !self.shutting_down() {
            info!(
                round = r,
                steps = report.steps,
                "round time budget reached; sending a smaller contribution"
            );
        }
        if report.steps > 0 && !by_window {
            self.tokens_per_sec = Some(report.tokens as f64 / secs.max(1e-9));
        }
        Input::Trained(Trained {
            steps: report.steps,
            tokens: report.tokens,
            mean_loss: report.mean_loss,
            params,
            secs,
            yielded: report.yielded,
        })
    }

    /// The node holds a new state: checkpoint and serve it, load it into the trainer, and say so.
    pub(super) async fn new_state(&mut self, ns: NewState) -> anyhow::Result<()> {
        let NewState { state, hash, how } = ns;
        checkpoint_and_serve(&self.store, &self.io.net, state.clone(), hash).await;
        let evaluate = matches!(how, How::Stepped(_));
        let on_trainer = self.evaluate_on_trainer(&state, hash, evaluate).await?;
        let val_loss = on_trainer.unwrap_or(f32::NAN);
        let next = self.ahead.then(|| self.clock());
        match how {
            How::Stepped(s) => {
                if s.step_scale < 1.0 {
                    info!(
                        round = s.round - 1,
                        arrived = s.contributors,
                        planned = s.planned,
                        scale = s.step_scale,
                        "short round: smaller step"
                    );
                }
                let clock = self.round.take();
                let traffic = self.io.net.traffic.snapshot();
                let (sent, received, status) = clock.as_ref().map_or((0, 0, 0), |c| {
                    (
                        traffic.0 - c.traffic0.0,
                        traffic.1 - c.traffic0.1,
                        self.io.net.traffic.status_sent() - c.status0,
                    )
                });
                let collect_secs = clock
                    .as_ref()
                    .and_then(|c| c.collect_from)
                    .map_or(0.0, |t| t.elapsed().as_secs_f64());
                let transfer_secs = match self.io.push.take() {
                    Some((_, task)) if task.is_finished() => {
                        task.await.map_or(0.0, |d| d.as_secs_f64())
                    }
                    Some((t0, _)) => t0.elapsed().as_secs_f64(),
                    None => 0.0,
                };
                let rec = RoundRecord {
                    round: s.round,
                    state_hash: hash.to_hex(),
                    val_loss,
                    train_loss: s.train_loss,
                    contributors: s.contributors,
                    planned: s.planned,
                    step_scale: s.step_scale,
                    noise_ratio: s.noise,
                    weights: s.weights.iter().map(|(k, t)| (short(k), *t)).collect(),
                    tokens: s.tokens,
                    tokens_per_sec: s.tokens as f64 / s.train_secs.max(1e-9),
                    inner_steps: s.inner_steps,
                    bytes_sent: sent,
                    bytes_received: received,
                    status_bytes_sent: status,
                    dense_delta_bytes: delta::dense_bytes(self.num_params) as u64,
                    wire_delta_bytes: s.wire_delta_bytes,
                    codec: self.manifest.manifest.training.codec.to_string(),
                    train_secs: s.train_secs,
                    encode_secs: clock.as_ref().map_or(0.0, |c| c.encode_secs),
                    transfer_secs,
                    wait_secs: (collect_secs - transfer_secs).max(0.0),
                    round_secs: clock.map_or(0.0, |c| c.started.elapsed().as_secs_f64()),
                };
                self.round = next;
                match on_trainer {
                    Some(_) => self.evaluated(Evaluated { rec, model: None }),
                    None => self.evaluate_later(state, rec),
                }
            }
            How::Synced {
                from,
                reason,
                verified,
                bytes,
                replaced,
            } => {
                info!(round = state.round, hash = %hash.short(), from = %peer_name(&from), reason, verified, "synced state from peer");
                self.round = next;
                self.sink.emit(&NodeEvent::Synced {
                    round: state.round,
                    state_hash: hash.to_hex(),
                    from: peer_name(&from),
                    reason: reason.into(),
                    secs: self
                        .syncing_since
                        .map_or(0.0, |t| t.elapsed().as_secs_f64()),
                    bytes,
                    verified: verified.into(),
                    replaced: replaced.map(|h| h.to_hex()),
                });
            }
        }
        Ok(())
    }

    /// Logs a note, and emits the events users and tests watch.
    pub(super) fn note(&mut self, note: Note) {
        match note {
            Note::Refused {
                round,
                from,
                reason,
            } => {
                // One for a round already closed is common in an honest swarm (it came after
                // the deadline): not worth a warning.
                if reason.starts_with("envelope is for round") {
                    debug!(from = %peer_name(&from), round, %reason, "late contribution refused");
                } else {
                    warn!(from = %peer_name(&from), round, %reason, "contribution refused");
                }
                self.sink.emit(&NodeEvent::Refused {
                    round,
                    from: peer_name(&from),
                    reason,
                });
            }
            Note::Rejected {
                round,
                hash,
                reason,
            } => {
                warn!(round, hash = %hash.short(), %reason, "a claimed state did not verify; not adopting it")
            }
            Note::DeadlinePassed { round, missing } => {
                warn!(
                    round,
                    missing, "round deadline passed; going on without them"
                )
            }
            Note::Diverged {
                round,
                index,
                in_a_row,
            } => {
                warn!(
                    round,
                    index,
                    in_a_row,
                    "local training went non-finite; dropping this round's work and restarting from θ"
                );
                self.sink.emit(&NodeEvent::Diverged {
                    round,
                    index: index as u64,
                    in_a_row,
                });
            }
            Note::Behind { round } => {
                info!(round, "the swarm has moved on (attested); catching up")
            }
            Note::OnAFork { round } => {
                info!(
                    round,
                    "peers train on a state of this round the rules prefer; replaying it"
                )
            }
            Note::JoinedLate { round, budget_ms } => info!(
                round,
                secs = budget_ms as f64 / 1e3,
                "joining the round under way for the time it has left"
            ),
            Note::WaitingForRoundEnd { round } => info!(
                round,
                "synced in the middle of a round; joining from the next one"
            ),
            Note::Stalled { round, times } => info!(
                round,
                times, "a better state did not verify yet; trying again before training alone"
            ),
            Note::Yielded { round } => debug!(round, "the window closed before the first step"),
            Note::LeftRound { round, reason } => warn!(
                round,
                %reason, "the round's averaging could not be completed; aligning to the swarm"
            ),
        }
    }
}
