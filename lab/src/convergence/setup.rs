//! What every run shares (data, architecture, recipe, genesis) and the runs of one model: one
//! worker, and synchronous training.

use anyhow::Context;
use nightshift_model::backend::{CpuTrain, cpu_device};
use nightshift_model::{Corpus, GptConfig, InnerConfig, InnerTrainer, Tokenizer, eval, flat};
use nightshift_protocol::{Aggregator, delta};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Instant;

use nightshift_bootstrap::SwarmSettings;
use nightshift_node::cmd::swarm::SwarmFlags;

use super::*;

/// What each DiLoCo worker samples from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardMode {
    /// The whole training split, each worker with its own random stream.
    Whole,
    /// Worker i of K: the i-th contiguous K-th of the split, every round.
    Contiguous,
    /// A new shard every round, drawn from the worker and the round (what nodes do).
    Rotate,
}

/// What every run shares: data, architecture, recipe, genesis.
pub struct Setup {
    pub(crate) corpus: Corpus,
    pub(crate) cfg: GptConfig,
    pub(crate) inner: InnerConfig,
    pub(crate) outer_lr: f32,
    pub(crate) outer_momentum: f32,
    pub(crate) genesis: Vec<f32>,
    /// Shape of every parameter tensor, in flat order.
    pub(crate) shapes: Vec<Vec<usize>>,
    pub(crate) val: Vec<(Vec<i32>, Vec<i32>)>,
    pub(crate) seed: u64,
    /// What each DiLoCo worker samples from (see `--shards`).
    pub shards: ShardMode,
    /// The training split's shards when they rotate, as a node cuts its dataset.
    pub rotate_shards: usize,
    /// Shards a worker reads per round when they rotate.
    pub shards_per_round: u32,
    /// How a round's contributions are combined (the nodes' own `round_step`).
    pub aggregator: Aggregator,
}

impl Setup {
    /// Builds the shared setup from a recipe.
    ///
    /// # Errors
    /// On an unknown preset or an unusable corpus.
    pub fn new(recipe: &SwarmFlags, val_batches: usize) -> anyhow::Result<Self> {
        Self::from_settings(&recipe.settings("bench", vec![]), val_batches)
    }

    /// Builds the shared setup from a swarm's settings.
    ///
    /// # Errors
    /// On an unknown preset or an unusable corpus.
    pub fn from_settings(s: &SwarmSettings, val_batches: usize) -> anyhow::Result<Self> {
        let text = match &s.data {
            Some(p) => std::fs::read(p).with_context(|| format!("cannot read {}", p.display()))?,
            None => nightshift_model::data::EMBEDDED_CORPUS.to_vec(),
        };
        let tok = Tokenizer::from_corpus(&text);
        let cfg = GptConfig::preset(&s.preset, tok.len())
            .with_context(|| format!("unknown preset {:?}", s.preset))?;
        let corpus = Corpus::new(&text, &tok, s.val_permille, cfg.seq_len)?;
        let model = cfg.init::<CpuTrain>(&cpu_device());
        let genesis = flat::genesis_params::<CpuTrain, _>(&model, s.init_seed);
        let shapes = flat::param_shapes::<CpuTrain, _>(&model);
        let val = corpus.val_batches(s.batch_size as usize, cfg.seq_len, val_batches);
        // As `swarm init` sizes shards (the byte tokenizer: a token is a byte).
        let (shard, per_round) =
            nightshift_bootstrap::default_shards(s.inner_steps, s.batch_size, cfg.seq_len, 1.0);
        let shard_bytes = s.shard_bytes.unwrap_or(shard);
        let rotate_shards = (corpus.train_len() as u64).div_ceil(shard_bytes).max(1) as usize;
        let inner = InnerConfig {
            lr: s.inner_lr as f64,
            warmup_steps: s.warmup_steps as u64,
            batch_size: s.batch_size as usize,
            weight_decay: s.weight_decay,
            grad_clip: s.grad_clip,
            muon: s.inner_optimizer.muon_lr_mult(),
            ..InnerConfig::default()
        };
        Ok(Setup {
            corpus,
            cfg,
            inner,
            outer_lr: s.outer_lr,
            outer_momentum: s.outer_momentum,
            genesis,
            shapes,
            val,
            seed: s.init_seed,
            shards: ShardMode::Rotate,
            rotate_shards,
            shards_per_round: s.shards_per_round.unwrap_or(per_round),
            aggregator: s.aggregator,
        })
    }

    /// What node `node` trains on in `round` when shards rotate: its draws
    /// ([`nightshift_model::dataset::shard_for`], seeded by the node's index here) among equal
    /// cuts of the training split, their tokens joined.
    pub(crate) fn rotating_corpus(&self, node: usize, round: u64) -> Corpus {
        let n = self.rotate_shards;
        let seed = (node as u64).to_le_bytes();
        let tokens = (0..self.shards_per_round.max(1))
            .flat_map(|j| {
                let i = nightshift_model::dataset::shard_for(&seed, round, j, n);
                let r = self.corpus.shard(i, n).range;
                self.corpus.train_tokens()[r].to_vec()
            })
            .collect();
        Corpus::from_parts(tokens, vec![])
    }

    /// A trainer on `batch_mult`·batch samples per step.
    pub(crate) fn trainer(&self, batch_mult: usize) -> anyhow::Result<InnerTrainer<CpuTrain>> {
        let inner = InnerConfig {
            batch_size: self.inner.batch_size * batch_mult,
            ..self.inner.clone()
        };
        Ok(InnerTrainer::new(
            &self.cfg,
            inner,
            &self.genesis,
            &cpu_device(),
        )?)
    }

    pub(crate) fn val_loss(&self, t: &mut InnerTrainer<CpuTrain>) -> f32 {
        eval::val_loss(&t.eval_model(), &self.val)
    }

    pub(crate) fn tokens_per_step(&self) -> u64 {
        (self.inner.batch_size * self.cfg.seq_len) as u64
    }

    /// One model for `steps` steps on `batch_mult`·batch samples per step.
    ///
    /// # Errors
    /// When the model cannot be built.
    pub fn run_single(
        &self,
        name: &str,
        steps: u32,
        batch_mult: usize,
        eval_every: u32,
    ) -> anyhow::Result<RunResult> {
        let start = Instant::now();
        let mut t = self.trainer(batch_mult)?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let shard = self.corpus.full_shard();
        let mut curve = vec![(0, self.val_loss(&mut t))];
        let (mut done, mut train_secs) = (0, 0.0);
        while done < steps {
            let n = eval_every.max(1).min(steps - done);
            let t0 = Instant::now();
            t.train(&self.corpus, &shard, &mut rng, n, &|| false);
            train_secs += t0.elapsed().as_secs_f64();
            done += n;
            curve.push((done, self.val_loss(&mut t)));
        }
        let tokens = steps as u64 * self.tokens_per_step() * batch_mult as u64;
        let dense = delta::dense_bytes(self.genesis.len()) as u64;
        let (per_round, total) = if batch_mult > 1 {
            (dense, dense * batch_mult as u64 * steps as u64)
        } else {
            (0, 0)
        };
        Ok(RunResult {
            name: name.into(),
            k: batch_mult,
            h: 1,
            codec: if batch_mult > 1 {
                "fp32 (gradients)".into()
            } else {
                "-".into()
            },
            drop: 0.0,
            final_val_loss: curve.last().map(|c| c.1).unwrap_or(f32::NAN),
            tokens,
            per_worker_steps: steps,
            bytes_per_node_per_round: per_round,
            total_bytes: total,
            curve,
            tokens_per_sec: tokens as f64 / train_secs.max(1e-9),
            wall_secs: start.elapsed().as_secs_f64(),
            ema: vec![],
            overlap: false,
            seed: Some(self.seed),
        })
    }
}
