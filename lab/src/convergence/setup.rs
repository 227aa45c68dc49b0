//! What every run shares (data, architecture, recipe, genesis) and the runs themselves: one
//! worker, synchronous training, and DiLoCo through the nodes' own round step.

use anyhow::Context;
use nightshift_model::backend::{CpuTrain, cpu_device};
use nightshift_model::{
    Corpus, ErrorFeedback, GptConfig, InnerConfig, InnerTrainer, OuterOptimizer, Shard, Tokenizer,
    eval, flat,
};
use nightshift_protocol::{Aggregator, DeltaCodec, delta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::time::Instant;

use nightshift_bootstrap::SwarmSettings;
use nightshift_node::cmd::swarm::SwarmFlags;
use nightshift_node::round::accept::{Accepted, aggregate, encode_delta, round_step};

use super::*;

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
    /// DiLoCo workers sample contiguous shards rather than the whole split (see `--shards`).
    pub contiguous_shards: bool,
    /// Outer-rate annealing: (last rounds, final rate); see `--outer-anneal-rounds`.
    pub outer_anneal: (u32, f32),
    /// Horizons of the parameter averages evaluated at the end (see `--eval-ema`).
    pub ema_horizons: Vec<u32>,
    /// How a round's contributions are combined (the nodes' own [`round_step`]).
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
            contiguous_shards: true,
            outer_anneal: (0, 0.0),
            ema_horizons: vec![],
            aggregator: s.aggregator,
        })
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

    pub(crate) fn emas(&self) -> Vec<ParamEma> {
        self.ema_horizons
            .iter()
            .map(|&h| ParamEma::new(h, self.genesis.len()))
            .collect()
    }

    /// Each average's validation loss, through `t` (whose parameters it replaces).
    pub(crate) fn eval_emas(
        &self,
        t: &mut InnerTrainer<CpuTrain>,
        emas: &[ParamEma],
    ) -> anyhow::Result<Vec<EmaResult>> {
        emas.iter()
            .map(|e| {
                t.load_params(&e.average())?;
                Ok(EmaResult {
                    horizon: e.horizon,
                    final_val_loss: self.val_loss(t),
                })
            })
            .collect()
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
        let mut emas = self.emas();
        while done < steps {
            let n = eval_every.max(1).min(steps - done);
            let t0 = Instant::now();
            if emas.is_empty() {
                t.train(&self.corpus, &shard, &mut rng, n, &|| false);
            } else {
                for _ in 0..n {
                    t.train(&self.corpus, &shard, &mut rng, 1, &|| false);
                    let p = t.params();
                    emas.iter_mut().for_each(|e| e.update(&p, 1));
                }
            }
            train_secs += t0.elapsed().as_secs_f64();
            done += n;
            curve.push((done, self.val_loss(&mut t)));
        }
        let ema = self.eval_emas(&mut t, &emas)?;
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
            ema,
            seed: Some(self.seed),
        })
    }

    /// The outer rate of a round that starts with `left` per-worker steps to go (this round's
    /// included) at `h` steps a round: `--outer-lr`, falling linearly to `--outer-lr-end` over
    /// the last `--outer-anneal-rounds` rounds.
    pub(crate) fn outer_lr_at(&self, left: u32, h: u32) -> f32 {
        let (r, end) = self.outer_anneal;
        let rounds_left = left.div_ceil(h.max(1));
        if r == 0 || rounds_left > r {
            return self.outer_lr;
        }
        let t = (r - rounds_left + 1) as f32 / r as f32;
        self.outer_lr + (end - self.outer_lr) * t
    }

    /// K workers, H inner steps per round, `steps` per worker in all.
    ///
    /// # Errors
    /// When a model cannot be built or a worker's delta does not survive its codec.
    pub fn run_diloco(
        &self,
        name: &str,
        k: usize,
        h: u32,
        codec: DeltaCodec,
        drop: f64,
        steps: u32,
    ) -> anyhow::Result<RunResult> {
        let start = Instant::now();
        let mut workers: Vec<(InnerTrainer<CpuTrain>, ChaCha8Rng, Shard, ErrorFeedback)> = (0..k)
            .map(|i| {
                Ok((
                    self.trainer(1)?,
                    ChaCha8Rng::seed_from_u64(self.seed ^ ((i as u64 + 1) * 0x9E37)),
                    if self.contiguous_shards {
                        self.corpus.shard(i, k)
                    } else {
                        self.corpus.full_shard()
                    },
                    ErrorFeedback::default(),
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        let mut drops = ChaCha8Rng::seed_from_u64(self.seed ^ 0xD209);
        let mut theta = self.genesis.clone();
        let mut outer = OuterOptimizer::new(self.outer_lr, self.outer_momentum, theta.len());
        let mut noise: Option<f64> = None;
        let mut curve = vec![(0, self.val_loss(&mut workers[0].0))];
        let (mut done, mut train_secs, mut bytes, mut sends, mut tokens) =
            (0u32, 0.0, 0u64, 0u64, 0u64);
        let mut emas = self.emas();
        while done < steps {
            let n = h.min(steps - done);
            let mut collected = BTreeMap::new();
            for (i, (t, rng, shard, ef)) in workers.iter_mut().enumerate() {
                let t0 = Instant::now();
                let rep = t.train(&self.corpus, shard, rng, n, &|| false);
                train_secs += t0.elapsed().as_secs_f64();
                tokens += rep.tokens;
                let (enc, sent) = encode_delta(&theta, &t.params(), codec, &self.shapes, ef)?;
                bytes += enc.body.len() as u64;
                sends += 1;
                if drops.random::<f64>() >= drop {
                    let sender = [i as u8; 32];
                    collected.insert(
                        sender,
                        Accepted {
                            sender,
                            digest: nightshift_protocol::Hash32::default(),
                            tokens: rep.tokens,
                            train_loss: rep.mean_loss,
                            delta: sent,
                            expected: k as u32,
                        },
                    );
                }
            }
            // The nodes' own step: the round's aggregate, shrunk when contributions are missing
            // (the plain mean if the aggregator gives none; nothing when nothing arrived).
            let step = match round_step(&collected, noise, self.aggregator) {
                Some(s) => {
                    noise = s.noise;
                    Some(s.delta)
                }
                None => aggregate(&collected),
            };
            if let Some(step) = step {
                outer.lr = self.outer_lr_at(steps - done, h);
                outer.step(&mut theta, &step);
            }
            for (t, ..) in workers.iter_mut() {
                t.load_params(&theta)?;
            }
            done += n;
            emas.iter_mut().for_each(|e| e.update(&theta, n));
            curve.push((done, self.val_loss(&mut workers[0].0)));
        }
        let ema = self.eval_emas(&mut workers[0].0, &emas)?;
        Ok(RunResult {
            name: name.into(),
            k,
            h,
            codec: codec.to_string(),
            drop,
            final_val_loss: curve.last().map(|c| c.1).unwrap_or(f32::NAN),
            tokens,
            per_worker_steps: steps,
            bytes_per_node_per_round: bytes / sends.max(1),
            total_bytes: bytes,
            curve,
            tokens_per_sec: tokens as f64 / train_secs.max(1e-9),
            wall_secs: start.elapsed().as_secs_f64(),
            ema,
            seed: Some(self.seed),
        })
    }
}

/// A normalised exponential moving average of parameter vectors over per-worker steps.
pub(crate) struct ParamEma {
    pub(crate) horizon: u32,
    pub(crate) sum: Vec<f64>,
    pub(crate) weight: f64,
}

impl ParamEma {
    pub(crate) fn new(horizon: u32, len: usize) -> Self {
        ParamEma {
            horizon,
            sum: vec![0.0; len],
            weight: 0.0,
        }
    }

    /// Adds `params`, which held for the last `steps` per-worker steps.
    pub(crate) fn update(&mut self, params: &[f32], steps: u32) {
        let keep = (-(steps as f64) / self.horizon.max(1) as f64).exp();
        self.weight = keep * self.weight + (1.0 - keep);
        self.sum
            .iter_mut()
            .zip(params)
            .for_each(|(s, p)| *s = keep * *s + (1.0 - keep) * *p as f64);
    }

    pub(crate) fn average(&self) -> Vec<f32> {
        let w = self.weight.max(f64::MIN_POSITIVE);
        self.sum.iter().map(|s| (s / w) as f32).collect()
    }
}
