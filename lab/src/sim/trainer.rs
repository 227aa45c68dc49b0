//! What the simulated nodes train: by default a stand-in, a noisy quadratic cheap enough that a
//! thousand nodes train on one machine (each inner step is SGD on ½‖θ − θ*‖² with a gradient
//! noise of unit variance per coordinate, a minibatch's, so local steps drift apart as real
//! workers' do and the outer step's averaging matters); with `--model PRESET`, the real GPT of
//! that preset on the embedded corpus, each node with its own burn trainer (AdamW/Muon state kept
//! across rounds, as a daemon's is), for a few nodes. The codecs, signatures, aggregation and
//! outer step around either are the real ones.

use crate::convergence::{Setup, ShardMode};
use nightshift_model::backend::CpuTrain;
use nightshift_model::{InnerTrainer, Shard};
use nightshift_node::machine::Start;
use nightshift_protocol::Hash32;

use nightshift_protocol::StateSnapshot;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The inner learning rate of the stand-in's SGD.
const LR: f32 = 0.05;
/// Standard deviation of each coordinate's gradient noise.
const NOISE: f32 = 1.0;

/// The model the nodes train.
pub enum Model {
    Quadratic(Quadratic),
    Gpt(Box<Gpt>),
}

/// What one node's inner steps produced.
pub struct Steps {
    pub params: Vec<f32>,
    pub mean_loss: f32,
    pub tokens: u64,
}

impl Model {
    /// `--model`: `quadratic` (with `params` parameters) or a preset of the real GPT.
    pub fn new(name: &str, params: usize, nodes: usize, seed: u64) -> anyhow::Result<Self> {
        if name == "quadratic" {
            return Ok(Model::Quadratic(Quadratic::new(params, seed)));
        }
        Ok(Model::Gpt(Box::new(Gpt::new(name, nodes, seed)?)))
    }

    /// The real GPT as `setup` builds it (its recipe, genesis, data and node shards).
    ///
    /// # Errors
    /// When the model cannot be built.
    pub fn gpt(setup: Setup, nodes: usize) -> anyhow::Result<Self> {
        Ok(Model::Gpt(Box::new(Gpt::from_setup(setup, nodes)?)))
    }

    pub fn genesis(&self) -> StateSnapshot {
        match self {
            Model::Quadratic(q) => q.genesis(),
            Model::Gpt(g) => g.genesis(),
        }
    }

    pub fn num_params(&self) -> usize {
        match self {
            Model::Quadratic(q) => q.target.len(),
            Model::Gpt(g) => g.setup.genesis.len(),
        }
    }

    /// Shape of every parameter tensor, in flat order (what the low-rank codec reads).
    pub fn shapes(&self) -> Vec<Vec<usize>> {
        match self {
            Model::Quadratic(q) => vec![vec![q.target.len()]],
            Model::Gpt(g) => g.setup.shapes.clone(),
        }
    }

    /// Tokens of one inner step.
    pub fn tokens_per_step(&self) -> u64 {
        match self {
            Model::Quadratic(_) => crate::sim::TOKENS_PER_STEP,
            Model::Gpt(g) => g.setup.tokens_per_step(),
        }
    }

    /// The swarm's outer step and aggregator: the defaults of `swarm init`.
    pub fn outer(&self) -> (f32, f32, nightshift_protocol::Aggregator) {
        match self {
            Model::Quadratic(_) => (0.7, 0.7, nightshift_protocol::Aggregator::ROBUST),
            Model::Gpt(g) => (g.setup.outer_lr, g.setup.outer_momentum, g.setup.aggregator),
        }
    }

    pub fn val_loss(&mut self, params: &[f32]) -> f32 {
        match self {
            Model::Quadratic(q) => q.val_loss(params),
            Model::Gpt(g) => g.val_loss(params),
        }
    }

    /// Node `node`'s `steps` inner steps of `round` from `start`.
    pub fn train(
        &mut self,
        node: usize,
        round: u64,
        start: &Start,
        steps: u32,
        rng: &mut ChaCha8Rng,
    ) -> Steps {
        match self {
            Model::Quadratic(q) => {
                if q.last.len() <= node {
                    q.last.resize(node + 1, vec![]);
                }
                let mut params = match start {
                    Start::State { state, .. } => state.params.clone(),
                    Start::Continue => q.last[node].clone(),
                    Start::Params(p) => p.to_vec(),
                };
                let mean_loss = q.train(&mut params, steps, rng);
                q.last[node].clone_from(&params);
                Steps {
                    params,
                    mean_loss,
                    tokens: u64::from(steps) * crate::sim::TOKENS_PER_STEP,
                }
            }
            Model::Gpt(g) => g.train(node, round, start, steps, rng),
        }
    }
}

/// The real GPT: one burn trainer per node (created when it first trains), one for evaluation.
pub struct Gpt {
    setup: Setup,
    /// Each node's trainer and the state whose θ it holds.
    trainers: Vec<Option<(InnerTrainer<CpuTrain>, Hash32)>>,
    /// What each node samples from, unless shards rotate.
    shards: Vec<Shard>,
    eval: InnerTrainer<CpuTrain>,
}

impl Gpt {
    /// `preset` at `swarm init`'s defaults, its genesis drawn from `seed`.
    fn new(preset: &str, nodes: usize, seed: u64) -> anyhow::Result<Self> {
        let settings = nightshift_bootstrap::SwarmSettings {
            preset: preset.into(),
            init_seed: seed,
            ..nightshift_bootstrap::SwarmSettings::default()
        };
        // Every node draws a new shard each round, as `run` and the demo do.
        let setup = Setup::from_settings(&settings, 8)?;
        Self::from_setup(setup, nodes)
    }

    fn from_setup(setup: Setup, nodes: usize) -> anyhow::Result<Self> {
        let eval = setup.trainer(1)?;
        let shards = (0..nodes)
            .map(|i| {
                if setup.shards == ShardMode::Contiguous {
                    setup.corpus.shard(i, nodes)
                } else {
                    setup.corpus.full_shard()
                }
            })
            .collect();
        Ok(Gpt {
            setup,
            trainers: (0..nodes).map(|_| None).collect(),
            shards,
            eval,
        })
    }

    fn genesis(&self) -> StateSnapshot {
        let n = self.setup.genesis.len();
        StateSnapshot {
            round: 0,
            params: self.setup.genesis.clone(),
            momentum: vec![0.0; n],
            formed_by: vec![],
            noise: None,
        }
    }

    fn val_loss(&mut self, params: &[f32]) -> f32 {
        if self.eval.load_params(params).is_err() {
            return f32::NAN;
        }
        self.setup.val_loss(&mut self.eval)
    }

    fn train(
        &mut self,
        node: usize,
        round: u64,
        start: &Start,
        steps: u32,
        rng: &mut ChaCha8Rng,
    ) -> Steps {
        if self.trainers[node].is_none() {
            self.trainers[node] = self.setup.trainer(1).ok().map(|t| (t, Hash32::default()));
        }
        let Some((t, loaded)) = self.trainers[node].as_mut() else {
            // The model was built once already (for evaluation); a trainer that cannot be is a
            // node that trains nothing.
            return Steps {
                params: vec![],
                mean_loss: f32::NAN,
                tokens: 0,
            };
        };
        // As the daemon's driver: load θ only when the trainer holds another state (the inner
        // optimizer's state carries over).
        match start {
            Start::State { state, hash } => {
                if loaded != hash && t.load_params(&state.params).is_ok() {
                    *loaded = *hash;
                }
            }
            Start::Continue => *loaded = Hash32::default(),
            Start::Params(p) => {
                let _ = t.load_params(p);
                *loaded = Hash32::default();
            }
        }
        let rep = match self.setup.shards {
            ShardMode::Rotate => {
                let c = self.setup.rotating_corpus(node, round);
                t.train(&c, &c.full_shard(), rng, steps, &|| false)
            }
            _ => t.train(&self.setup.corpus, &self.shards[node], rng, steps, &|| {
                false
            }),
        };
        Steps {
            params: t.params(),
            mean_loss: rep.mean_loss,
            tokens: rep.tokens,
        }
    }
}

pub struct Quadratic {
    target: Vec<f32>,
    /// Where each node's last steps ended (what [`Start::Continue`] trains on from).
    last: Vec<Vec<f32>>,
}

impl Quadratic {
    /// θ* drawn uniformly from [−1, 1]^params by `seed`.
    pub fn new(params: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x007A_26E7);
        Quadratic {
            target: (0..params)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            last: vec![],
        }
    }

    /// θ = 0, no momentum: round 0.
    pub fn genesis(&self) -> StateSnapshot {
        StateSnapshot {
            round: 0,
            params: vec![0.0; self.target.len()],
            momentum: vec![0.0; self.target.len()],
            formed_by: vec![],
            noise: None,
        }
    }

    /// ½ mean (θ − θ*)²: the loss without noise.
    pub fn val_loss(&self, params: &[f32]) -> f32 {
        let s: f64 = params
            .iter()
            .zip(&self.target)
            .map(|(p, t)| f64::from(p - t).powi(2))
            .sum();
        (0.5 * s / self.target.len().max(1) as f64) as f32
    }

    /// `steps` SGD steps on `params`; returns the mean training loss (the noisy one).
    pub fn train(&self, params: &mut [f32], steps: u32, rng: &mut ChaCha8Rng) -> f32 {
        let half_width = NOISE * 3f32.sqrt(); // uniform noise of standard deviation NOISE
        let mut total = 0.0f64;
        for _ in 0..steps {
            total += f64::from(self.val_loss(params));
            for (p, t) in params.iter_mut().zip(&self.target) {
                let g = (*p - t) + rng.random_range(-half_width..half_width);
                *p -= LR * g;
            }
        }
        if steps == 0 {
            0.0
        } else {
            (total / f64::from(steps)) as f32
        }
    }
}
