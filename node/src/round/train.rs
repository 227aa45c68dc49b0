//! Train: H inner steps on a blocking thread, stopping at a step boundary when the idle window
//! closes, and what a non-finite round does.

use super::*;

impl<B: AutodiffBackend> Driver<B> {
    /// Runs up to `steps` inner steps on a blocking thread, stopping at a step boundary when the
    /// window closes, `budget` runs out, or the node shuts down. Emits a `yielded` event when
    /// the window closed.
    pub(super) async fn train(
        &mut self,
        steps: u32,
        budget: Option<Duration>,
    ) -> anyhow::Result<Trained> {
        let r = self.state.round;
        let mut compute = self.compute.take().context("trainer state missing")?;
        let stop = self.stop.clone();
        let avail = self.avail.clone();
        self.sink.emit(&NodeEvent::Training { round: r, steps });
        let t0 = Instant::now();
        let (compute, report, stopped_at) = tokio::task::spawn_blocking(move || {
            let c = &mut compute;
            c.trainer.wake();
            let rep = c
                .trainer
                .train(&c.corpus, &c.shard, &mut c.rng, steps, &|| {
                    stop.load(Ordering::SeqCst)
                        || !avail.load(Ordering::SeqCst)
                        || budget.is_some_and(|b| t0.elapsed() >= b)
                });
            (compute, rep, (Instant::now(), SystemTime::now()))
        })
        .await?;
        self.compute = Some(compute);
        if report.yielded && !self.available() && !self.shutting_down() {
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
        } else if report.yielded && budget.is_some() && !self.shutting_down() {
            info!(
                round = r,
                steps = report.steps,
                "round time budget reached; sending a smaller contribution"
            );
        }
        if report.steps == 0 {
            return Ok(Trained::Nothing);
        }
        Ok(Trained::Report(report))
    }

    /// Our training of round `r` produced a non-finite parameter (at `index`): send nothing, put
    /// the trainer back at θ(r) with a fresh inner optimizer, and go on (the round loop may
    /// retry the round for the time it has left). Several rounds in a row stop the node.
    pub(super) async fn diverged(&mut self, r: u64, index: usize) -> anyhow::Result<Outcome> {
        self.diverged_in_a_row += 1;
        let in_a_row = self.diverged_in_a_row;
        self.sink.emit(&NodeEvent::Diverged {
            round: r,
            index: index as u64,
            in_a_row,
        });
        if in_a_row >= MAX_DIVERGED_IN_A_ROW {
            bail!(
                "local training went non-finite in {in_a_row} rounds in a row (round {r}, \
                 parameter {index}): the swarm's settings (its inner learning rate?) make \
                 training diverge on this machine; the last checkpoint, θ({r}), is unchanged"
            );
        }
        warn!(
            round = r,
            index,
            in_a_row,
            "local training went non-finite; dropping this round's work and restarting from θ"
        );
        let params = self.state.params.clone();
        if let Some(mut c) = self.compute.take() {
            let (c, reset) = tokio::task::spawn_blocking(move || {
                let reset = c.trainer.reset(&params);
                (c, reset)
            })
            .await?;
            self.compute = Some(c);
            reset.context("θ does not fit the model")?;
        }
        self.announce(Phase::Ready).await;
        Ok(Outcome::Diverged)
    }
}
