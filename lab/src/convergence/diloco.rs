//! The DiLoCo runs of `convergence`: K nodes training the real GPT through the simulator, each
//! running the round machine the daemon runs (contributions encoded, signed and verified, the
//! swarm's aggregator and outer step, short rounds shrunk, lost contributions handled as nodes
//! handle them), so the numbers are those of the nodes' own rules.

use anyhow::bail;
use nightshift_protocol::DeltaCodec;
use std::time::Instant;

use super::{RunResult, Setup};
use crate::sim::{Model, SimArgs, simulate_with};

/// One DiLoCo run: what it trains and how.
pub struct Diloco<'a> {
    pub name: &'a str,
    /// The recipe's preset (recorded in the simulator's settings).
    pub preset: &'a str,
    pub k: usize,
    pub h: u32,
    pub codec: DeltaCodec,
    /// Probability that a node's contribution of a round is lost (`sim --drop`).
    pub drop: f64,
    /// T: per-worker steps, a multiple of `h`.
    pub steps: u32,
    /// The swarm's round deadline.
    pub deadline_secs: u64,
    /// Nodes train the next round while a round is collected.
    pub overlap: bool,
    /// Average slice by slice (`sim --reduce`).
    pub reduce: Option<String>,
}

impl Diloco<'_> {
    /// The simulator's settings for this run: a private swarm of K nodes, fully connected, alike
    /// in speed, over the simulator's default links, for T/H rounds.
    pub fn sim_args(&self, setup: &Setup) -> anyhow::Result<SimArgs> {
        if self.h == 0 || !self.steps.is_multiple_of(self.h) {
            bail!(
                "T = {} per-worker steps is not a multiple of H = {}: every round of a node trains H steps",
                self.steps,
                self.h
            );
        }
        let rounds = u64::from(self.steps / self.h);
        Ok(SimArgs {
            nodes: self.k,
            rounds,
            seed: setup.seed,
            model: self.preset.into(),
            degree: self.k,
            speed_spread: 0.0,
            inner_steps: self.h,
            deadline_secs: self.deadline_secs,
            drop: self.drop,
            private: true,
            aggregator: setup.aggregator.to_string(),
            codec: self.codec,
            // Virtual time is free: room for every round to wait out its deadline twice.
            max_virtual_secs: rounds * (2 * self.deadline_secs + 120) + 600,
            overlap: self.overlap,
            reduce: self.reduce.clone(),
            ..SimArgs::default()
        })
    }

    /// Runs it on `setup`'s model, data and genesis.
    ///
    /// # Errors
    /// When T is not a multiple of H, the model cannot be built, or the swarm did not finish.
    pub fn run(&self, setup: Setup) -> anyhow::Result<RunResult> {
        let start = Instant::now();
        let args = self.sim_args(&setup)?;
        let seed = setup.seed;
        let sim = simulate_with(&args, Model::gpt(setup, self.k)?);
        let s = &sim.summary;
        if let Some(f) = s.failures.first() {
            bail!("{}: a node failed: {f}", self.name);
        }
        let mut curve = vec![(0, s.genesis_val_loss)];
        for row in &sim.rounds {
            match row.val_loss {
                Some(l) if row.nodes_completed > 0 => curve.push((row.round as u32 * self.h, l)),
                _ => bail!(
                    "{}: the swarm did not complete round {} of {} ({} virtual s)",
                    self.name,
                    row.round,
                    args.rounds,
                    s.virtual_secs
                ),
            }
        }
        let split: Vec<u64> = sim
            .rounds
            .iter()
            .filter(|r| r.distinct_state_hashes > 1)
            .map(|r| r.round)
            .collect();
        if !split.is_empty() {
            eprintln!(
                "{}: the nodes ended rounds {split:?} on different states; the curve follows the state most held",
                self.name
            );
        }
        let tokens = s.tokens_trained;
        let wall = start.elapsed().as_secs_f64();
        Ok(RunResult {
            name: self.name.into(),
            k: self.k,
            h: self.h,
            codec: self.codec.to_string(),
            drop: self.drop,
            final_val_loss: curve.last().map_or(f32::NAN, |c| c.1),
            tokens,
            per_worker_steps: self.steps,
            bytes_per_node_per_round: s.contribution_bytes / s.contributions_sent.max(1),
            total_bytes: s.contribution_bytes,
            curve,
            tokens_per_sec: tokens as f64 / wall.max(1e-9),
            wall_secs: wall,
            ema: vec![],
            seed: Some(seed),
            overlap: self.overlap,
        })
    }
}
