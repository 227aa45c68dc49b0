//! `nightshift-lab convergence`: K DiLoCo replicas simulated in one process, through the same
//! code the nodes run (the burn inner loop, `encode_delta` with error feedback, token-weighted
//! `aggregate`, the Nesterov `OuterOptimizer`), against single-worker and synchronous baselines
//! at equal tokens.
//!
//! `sync` (K replicas averaging gradients every step) is run as one model on K·batch samples per
//! step: the mean of K equal-size batches' mean-loss gradients is the gradient of the mean loss
//! over their union, so the two are the same computation.

use anyhow::{Context, bail};
use clap::Args;
use nightshift_model::backend::{CpuTrain, cpu_device};
use nightshift_model::{
    Corpus, ErrorFeedback, GptConfig, InnerConfig, InnerTrainer, OuterOptimizer, Shard, Tokenizer,
    eval, flat,
};
use nightshift_protocol::{Aggregator, DeltaCodec, delta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use nightshift_bootstrap::SwarmSettings;
use nightshift_node::cmd::swarm::SwarmFlags;
use nightshift_node::plot::{Series, line_chart};
use nightshift_node::round::accept::{Accepted, aggregate, encode_delta, round_step};

/// Flags of `nightshift-lab report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// JSON files written by `nightshift-lab convergence --json`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write every run's loss curve to one chart (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Read every run as if its per-worker budget T had been each of these step counts: its
    /// curve up to that step, the loss there its final loss, and the comparisons between runs
    /// cut at the same step. Exact without an outer anneal (the default: nothing else in a run
    /// depends on T); a run whose curve has no point at a step is left out there.
    #[arg(long, value_delimiter = ',')]
    pub at: Vec<u32>,
}

/// Flags of `nightshift-lab convergence`. The recipe flags (`--preset`, `--inner-lr`, `--codec`,
/// `--inner-steps` = the base H, ...) are those of `swarm init`.
#[derive(Args, Debug, Serialize)]
pub struct ConvergenceArgs {
    /// Run groups to include: single (T steps), single-long (K·T steps: the same tokens as the
    /// K-worker runs), sync, diloco (the K × H grid), codecs, drop.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,single-long,sync,diloco,codecs,drop"
    )]
    pub runs: Vec<String>,
    /// Worker counts of the DiLoCo grid.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub k: Vec<usize>,
    /// Inner steps of the DiLoCo grid.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100,250")]
    pub h: Vec<u32>,
    /// K of the sync, codec and drop runs.
    #[arg(long, default_value_t = 4)]
    pub base_k: usize,
    /// Codecs compared on DiLoCo (base K, base H).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fp32,fp16,int8:64,int4:64,topk:10,topk:30,lowrank:23:256"
    )]
    pub codecs: Vec<DeltaCodec>,
    /// Probabilities of dropping each contribution.
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.5")]
    pub drop: Vec<f64>,
    /// T: the per-worker step budget.
    #[arg(long, default_value_t = 1000)]
    pub steps: u32,
    /// Evaluate every this many per-worker steps (single and sync runs; DiLoCo evaluates per round).
    #[arg(long, default_value_t = 50)]
    pub eval_every: u32,
    #[arg(long, default_value_t = 8)]
    pub val_batches: usize,
    /// Write every run (with its loss curve) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the loss curves (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Threads per inner step: each batch is cut into this many equal parts trained in
    /// parallel (the same gradient, up to float rounding). Workers still run one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// What each DiLoCo worker samples from: `contiguous` (worker i of K gets the i-th
    /// contiguous K-th of the text, as `demo` assigns them) or `whole` (the whole training
    /// split, each worker with its own random stream: what a node does unless given `--shard`).
    #[arg(long, default_value = "contiguous", value_parser = ["contiguous", "whole"])]
    pub shards: String,
    /// Anneal the outer step: over the last this many rounds of every DiLoCo run the outer
    /// learning rate falls linearly from `--outer-lr` to `--outer-lr-end` (reached in the last
    /// round). 0 is off (what nodes do: a constant outer rate).
    #[arg(long, default_value_t = 0)]
    pub outer_anneal_rounds: u32,
    /// The outer learning rate of the last round when `--outer-anneal-rounds` is set.
    #[arg(long, default_value_t = 0.2)]
    pub outer_lr_end: f32,
    /// Also evaluate, at the end of every run, an exponential moving average of its parameters
    /// (Polyak averaging) with each of these horizons, in per-worker steps: single and sync runs
    /// average after every step, DiLoCo runs after every round (θ holds between rounds), each
    /// with weight `exp(-steps/horizon)` on the past, normalised so the start does not count.
    /// Training is unchanged; the results go to `ema` in the JSON.
    #[arg(long, value_delimiter = ',')]
    pub eval_ema: Vec<u32>,
    #[command(flatten)]
    pub recipe: SwarmFlags,
}

/// One run's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub name: String,
    pub k: usize,
    pub h: u32,
    pub codec: String,
    pub drop: f64,
    pub final_val_loss: f32,
    pub tokens: u64,
    pub per_worker_steps: u32,
    pub bytes_per_node_per_round: u64,
    pub total_bytes: u64,
    /// (per-worker steps, validation loss)
    pub curve: Vec<(u32, f32)>,
    /// Training throughput of the whole run (all workers), tokens per second of training time.
    pub tokens_per_sec: f64,
    pub wall_secs: f64,
    /// Final validation loss of each parameter average asked for with `--eval-ema`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ema: Vec<EmaResult>,
    /// `--seed` of the run (absent from files written before it was recorded): `nightshift-lab report`
    /// compares runs of the same seed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// The final validation loss of a moving average of a run's parameters (`--eval-ema`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmaResult {
    /// Horizon in per-worker steps.
    pub horizon: u32,
    pub final_val_loss: f32,
}

/// A normalised exponential moving average of parameter vectors over per-worker steps.
struct ParamEma {
    horizon: u32,
    sum: Vec<f64>,
    weight: f64,
}

impl ParamEma {
    fn new(horizon: u32, len: usize) -> Self {
        ParamEma {
            horizon,
            sum: vec![0.0; len],
            weight: 0.0,
        }
    }

    /// Adds `params`, which held for the last `steps` per-worker steps.
    fn update(&mut self, params: &[f32], steps: u32) {
        let keep = (-(steps as f64) / self.horizon.max(1) as f64).exp();
        self.weight = keep * self.weight + (1.0 - keep);
        self.sum
            .iter_mut()
            .zip(params)
            .for_each(|(s, p)| *s = keep * *s + (1.0 - keep) * *p as f64);
    }

    fn average(&self) -> Vec<f32> {
        let w = self.weight.max(f64::MIN_POSITIVE);
        self.sum.iter().map(|s| (s / w) as f32).collect()
    }
}

impl RunResult {
    /// This run as if its budget had been `steps` per-worker steps (see `nightshift-lab report --at`):
    /// `None` when its curve has no point there or it is longer than the run.
    pub fn cut_at(&self, steps: u32) -> Option<RunResult> {
        let end = self.curve.iter().position(|(s, _)| *s == steps)?;
        if steps == 0 || steps > self.per_worker_steps {
            return None;
        }
        let share = steps as f64 / self.per_worker_steps.max(1) as f64;
        let rounds = |t: u32| t.div_ceil(self.h.max(1)) as f64;
        Some(RunResult {
            name: format!("{} T={steps}", self.name),
            final_val_loss: self.curve[end].1,
            tokens: (self.tokens as f64 * share).round() as u64,
            per_worker_steps: steps,
            total_bytes: (self.total_bytes as f64 * rounds(steps)
                / rounds(self.per_worker_steps).max(1.0))
            .round() as u64,
            curve: self.curve[..=end].to_vec(),
            wall_secs: self.wall_secs * share,
            // The averages were only taken at the end.
            ema: vec![],
            ..self.clone()
        })
    }

    /// First per-worker step count at which the curve reaches `target` (or below).
    pub fn steps_to(&self, target: f32) -> Option<u32> {
        self.curve
            .iter()
            .find(|(_, l)| *l <= target)
            .map(|(s, _)| *s)
    }
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

    fn emas(&self) -> Vec<ParamEma> {
        self.ema_horizons
            .iter()
            .map(|&h| ParamEma::new(h, self.genesis.len()))
            .collect()
    }

    /// Each average's validation loss, through `t` (whose parameters it replaces).
    fn eval_emas(
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

    fn tokens_per_step(&self) -> u64 {
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
    fn outer_lr_at(&self, left: u32, h: u32) -> f32 {
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

/// The runs the flags ask for, in order: (name, kind).
fn plan(a: &ConvergenceArgs) -> Vec<(String, Kind)> {
    let want = |g: &str| a.runs.iter().any(|r| r == g);
    let (bk, bh, t) = (a.base_k, a.recipe.inner_steps, a.steps);
    let mut p = vec![];
    if want("single") {
        p.push((format!("single T={t}"), Kind::Single { mult: 1, steps: t }));
    }
    if want("single-long") {
        p.push((
            format!("single {bk}T"),
            Kind::Single {
                mult: 1,
                steps: t * bk as u32,
            },
        ));
    }
    if want("sync") {
        p.push((format!("sync k={bk}"), Kind::Single { mult: bk, steps: t }));
    }
    // What every DiLoCo run of this invocation shares beyond the recipe, in its name.
    let mut schedule = String::new();
    if a.outer_anneal_rounds > 0 {
        schedule += &format!(" anneal={}->{}", a.outer_anneal_rounds, a.outer_lr_end);
    }
    let diloco = |k: usize, h: u32, codec: DeltaCodec, drop: f64, suffix: String| {
        (
            format!("diloco k={k} h={h}{schedule}{suffix}"),
            Kind::Diloco { k, h, codec, drop },
        )
    };
    if want("diloco") {
        for &k in &a.k {
            for &h in &a.h {
                p.push(diloco(k, h, a.recipe.codec, 0.0, String::new()));
            }
        }
    }
    if want("codecs") {
        for &c in &a.codecs {
            p.push(diloco(bk, bh, c, 0.0, format!(" {c}")));
        }
    }
    if want("drop") {
        for &d in &a.drop {
            p.push(diloco(bk, bh, a.recipe.codec, d, format!(" drop={d}")));
        }
    }
    p
}

enum Kind {
    Single {
        mult: usize,
        steps: u32,
    },
    Diloco {
        k: usize,
        h: u32,
        codec: DeltaCodec,
        drop: f64,
    },
}

/// Runs the benchmark, printing a table; writes `--json` and `--plot`.
///
/// # Errors
/// On bad flags, data or I/O.
pub fn run_convergence(a: ConvergenceArgs) -> anyhow::Result<Vec<RunResult>> {
    if a.steps == 0
        || a.base_k == 0
        || a.k.contains(&0)
        || a.h.contains(&0)
        || a.recipe.inner_steps == 0
    {
        bail!("--steps, --k, --h, --base-k and --inner-steps must be positive");
    }
    const GROUPS: [&str; 6] = ["single", "single-long", "sync", "diloco", "codecs", "drop"];
    if let Some(g) = a.runs.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        bail!(
            "unknown run group {g:?}: expected some of {}",
            GROUPS.join(", ")
        );
    }
    if a.drop.iter().any(|d| !(0.0..1.0).contains(d)) {
        bail!("--drop probabilities must be in [0, 1)");
    }
    let mut setup = Setup::new(&a.recipe, a.val_batches)?;
    setup.contiguous_shards = a.shards == "contiguous";
    setup.inner.threads = a.threads as usize;
    if a.eval_ema.contains(&0) {
        bail!("--eval-ema horizons must be positive");
    }
    setup.ema_horizons = a.eval_ema.clone();
    if !(a.outer_lr_end >= 0.0 && a.outer_lr_end.is_finite()) {
        bail!("--outer-lr-end must be a non-negative number");
    }
    setup.outer_anneal = (a.outer_anneal_rounds, a.outer_lr_end);
    let runs = plan(&a);
    println!(
        "convergence: {} runs, T={} per-worker steps, model {} ({} params), batch {}, seq {}",
        runs.len(),
        a.steps,
        a.recipe.preset,
        setup.genesis.len(),
        setup.inner.batch_size,
        setup.cfg.seq_len
    );
    print_header();
    let mut results: Vec<RunResult> = vec![];
    let commit = crate::results::commit_here();
    for (name, kind) in runs {
        let r = match kind {
            Kind::Single { mult, steps } => setup.run_single(&name, steps, mult, a.eval_every)?,
            Kind::Diloco { k, h, codec, drop } => {
                setup.run_diloco(&name, k, h, codec, drop, a.steps)?
            }
        };
        print_row(&r);
        results.push(r);
        if let Some(p) = &a.json {
            crate::results::Recorded {
                commit: commit.clone(),
                config: &a,
                runs: results.clone(),
            }
            .write(p)?;
        }
    }
    finish(&results, a.plot.as_deref())?;
    Ok(results)
}

/// A `--json` file: `{"commit", "config", "runs"}`, or the bare list of runs that files written
/// before the configuration was recorded hold.
#[derive(Deserialize)]
#[serde(untagged)]
enum ConvergenceFile {
    Recorded { runs: Vec<RunResult> },
    Runs(Vec<RunResult>),
}

/// `nightshift-lab report`: earlier runs' JSON files as one table.
///
/// # Errors
/// When a file cannot be read or is not a list of runs, or the plot cannot be written.
pub fn run_report(a: ReportArgs) -> anyhow::Result<Vec<RunResult>> {
    let mut results: Vec<RunResult> = vec![];
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        let file: ConvergenceFile = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not the JSON of `nightshift-lab convergence --json`",
                f.display()
            )
        })?;
        results.extend(match file {
            ConvergenceFile::Recorded { runs } => runs,
            ConvergenceFile::Runs(runs) => runs,
        });
    }
    if !a.at.is_empty() {
        results =
            a.at.iter()
                .flat_map(|&t| results.iter().filter_map(move |r| r.cut_at(t)))
                .collect();
        if results.is_empty() {
            bail!("no run's curve has a point at any of --at {:?}", a.at);
        }
    }
    print_header();
    for r in &results {
        print_row(r);
    }
    finish(&results, a.plot.as_deref())?;
    Ok(results)
}

fn print_header() {
    println!(
        "{:<34} {:>9} {:>10} {:>13} {:>10} {:>8}",
        "run", "val loss", "tokens", "B/node/round", "tokens/s", "secs"
    );
}

fn print_row(r: &RunResult) {
    println!(
        "{:<34} {:>9.4} {:>10} {:>13} {:>10.0} {:>8.1}",
        r.name,
        r.final_val_loss,
        r.tokens,
        r.bytes_per_node_per_round,
        r.tokens_per_sec,
        r.wall_secs
    );
    for e in &r.ema {
        println!(
            "{:<34} {:>9.4}",
            format!("  parameters averaged over ~{}", e.horizon),
            e.final_val_loss
        );
    }
}

/// What both commands print after the table: the comparisons, then the plot if asked for.
fn finish(results: &[RunResult], plot: Option<&std::path::Path>) -> anyhow::Result<()> {
    println!();
    for line in comparisons(results) {
        println!("  {line}");
    }
    match plot {
        Some(p) => write_plot(results, p),
        None => Ok(()),
    }
}

fn write_plot(results: &[RunResult], p: &std::path::Path) -> anyhow::Result<()> {
    let series: Vec<Series> = results
        .iter()
        .map(|r| Series {
            name: r.name.clone(),
            points: r
                .curve
                .iter()
                .map(|(s, l)| (*s as f64, *l as f64))
                .collect(),
        })
        .collect();
    std::fs::write(
        p,
        line_chart(
            "validation loss against per-worker steps",
            "per-worker steps",
            &series,
        ),
    )
    .with_context(|| format!("cannot write {}", p.display()))
}

/// What the targets compare, one line each: every DiLoCo and sync run against the
/// single worker of the same per-worker budget (the step at which it reached that worker's final
/// loss) and against sync of the same budget and tokens (final-loss ratio); every lossy codec against fp32
/// DiLoCo of the same K and H (final loss, bytes); every run with drops against the same K, H and
/// codec without them. When several runs qualify as the reference, the first is used.
pub fn comparisons(results: &[RunResult]) -> Vec<String> {
    let mut out = vec![];
    let is_diloco = |r: &&RunResult| r.name.starts_with("diloco");
    // Runs of different seeds are never compared (a file without seeds matches any).
    let same_seed =
        |a: &RunResult, b: &RunResult| a.seed.is_none() || b.seed.is_none() || a.seed == b.seed;
    let single = |r: &RunResult, t: u32| {
        results.iter().find(|s| {
            s.name.starts_with("single") && s.k == 1 && s.per_worker_steps == t && same_seed(r, s)
        })
    };
    // Sync at equal tokens: the same per-worker steps over as many workers.
    let sync = |r: &RunResult| {
        results.iter().find(|s| {
            s.name.starts_with("sync")
                && s.per_worker_steps == r.per_worker_steps
                && s.tokens == r.tokens
                && same_seed(r, s)
        })
    };
    for r in results
        .iter()
        .filter(|r| r.name.starts_with("diloco") || r.name.starts_with("sync"))
    {
        if let Some(s) = single(r, r.per_worker_steps) {
            let t = r.per_worker_steps;
            match r.steps_to(s.final_val_loss) {
                Some(n) => out.push(format!(
                    "{:<34} reached single's final loss ({:.4}) after {n} of {t} per-worker steps",
                    r.name, s.final_val_loss
                )),
                None => out.push(format!(
                    "{:<34} never reached single's final loss ({:.4}) in {t} per-worker steps",
                    r.name, s.final_val_loss
                )),
            }
        }
    }
    for r in results.iter().filter(is_diloco) {
        if let Some(s) = single(r, r.k as u32 * r.per_worker_steps).filter(|_| r.k > 1) {
            out.push(format!(
                "{:<34} final loss {:.4}x one worker's over the same tokens ({} steps)",
                r.name,
                r.final_val_loss / s.final_val_loss,
                s.per_worker_steps
            ));
        }
    }
    for r in results.iter().filter(is_diloco) {
        if let Some(s) = sync(r) {
            out.push(format!(
                "{:<34} final loss {:.4}x sync's",
                r.name,
                r.final_val_loss / s.final_val_loss
            ));
        }
    }
    for r in results
        .iter()
        .filter(is_diloco)
        .filter(|r| r.drop == 0.0 && r.codec != "fp32")
    {
        let fp32 = results.iter().filter(is_diloco).find(|b| {
            b.codec == "fp32"
                && b.drop == 0.0
                && (b.k, b.h) == (r.k, r.h)
                && b.per_worker_steps == r.per_worker_steps
                && same_seed(r, b)
        });
        if let Some(b) = fp32 {
            out.push(format!(
                "{:<34} final loss {:+.2} % against fp32, {:.1}x fewer bytes per round",
                r.name,
                100.0 * (r.final_val_loss / b.final_val_loss - 1.0),
                b.bytes_per_node_per_round as f64 / r.bytes_per_node_per_round.max(1) as f64
            ));
        }
    }
    for r in results.iter().filter(is_diloco).filter(|r| r.drop > 0.0) {
        let whole = results.iter().filter(is_diloco).find(|b| {
            b.drop == 0.0
                && (b.k, b.h) == (r.k, r.h)
                && b.codec == r.codec
                && b.per_worker_steps == r.per_worker_steps
                && same_seed(r, b)
        });
        if let Some(b) = whole {
            out.push(format!(
                "{:<34} final loss {:+.2} % against no drops ({:.4})",
                r.name,
                100.0 * (r.final_val_loss / b.final_val_loss - 1.0),
                b.final_val_loss
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quadratic loss ½‖Aθ − b‖² per worker, so gradients are exact and cheap.
    fn grad(theta: &[f32], shift: f32) -> Vec<f32> {
        theta
            .iter()
            .enumerate()
            .map(|(j, t)| (1.0 + j as f32 * 0.1) * t - shift - j as f32 * 0.01)
            .collect()
    }

    #[test]
    fn diloco_with_h1_outer_lr1_no_momentum_is_data_parallel_sgd() {
        let (lr, n, k) = (0.1f32, 16, 3);
        let mut theta_dp = vec![0.5f32; n];
        let mut theta_dl = theta_dp.clone();
        let mut outer = OuterOptimizer::new(1.0, 0.0, n);
        let mut efs = vec![ErrorFeedback::default(); k];
        for _step in 0..20 {
            // Data-parallel SGD: average the workers' gradients, one step.
            let g: Vec<Vec<f32>> = (0..k).map(|i| grad(&theta_dp, i as f32)).collect();
            for j in 0..n {
                theta_dp[j] -= lr * g.iter().map(|gi| gi[j]).sum::<f32>() / k as f32;
            }
            // DiLoCo with H = 1 inner SGD step, through the nodes' own code path.
            let mut collected = BTreeMap::new();
            for (i, ef) in efs.iter_mut().enumerate() {
                let local: Vec<f32> = theta_dl
                    .iter()
                    .zip(grad(&theta_dl, i as f32))
                    .map(|(t, g)| t - lr * g)
                    .collect();
                let (_, sent) = encode_delta(&theta_dl, &local, DeltaCodec::Fp32, &[], ef).unwrap();
                collected.insert(
                    [i as u8; 32],
                    Accepted {
                        sender: [i as u8; 32],
                        digest: nightshift_protocol::Hash32::default(),
                        tokens: 100,
                        train_loss: 0.0,
                        delta: sent,
                        expected: k as u32,
                    },
                );
            }
            outer.step(&mut theta_dl, &aggregate(&collected).unwrap());
        }
        for (a, b) in theta_dp.iter().zip(&theta_dl) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn a_tiny_diloco_run_learns_and_counts_its_bytes() {
        let recipe = SwarmFlags {
            preset: "tiny".into(),
            data: None,
            inner_steps: 5,
            codec: DeltaCodec::Int8 { block: 64 },
            batch_size: 8,
            inner_lr: 3e-3,
            warmup_steps: 2,
            weight_decay: 0.1,
            inner_optimizer: nightshift_protocol::InnerOptimizer::AdamW,
            outer_lr: 0.7,
            outer_momentum: 0.9,
            aggregator: nightshift_protocol::Aggregator::ROBUST,
            deadline_secs: 60,
            seed: 1,
        };
        let s = Setup::new(&recipe, 2).unwrap();
        let r = s.run_diloco("d", 2, 5, recipe.codec, 0.0, 20).unwrap();
        let dense_bytes = r.bytes_per_node_per_round;
        assert_eq!(r.curve.len(), 5);
        assert!(r.final_val_loss < r.curve[0].1 - 0.2, "{:?}", r.curve);
        assert_eq!(r.tokens, 2 * 20 * 8 * 32);
        assert!(
            r.bytes_per_node_per_round > 0
                && r.bytes_per_node_per_round < delta::dense_bytes(s.genesis.len()) as u64 / 2
        );
        // Dropping every contribution leaves θ where it started.
        let frozen = s
            .run_diloco("x", 2, 5, recipe.codec, 0.999_999, 10)
            .unwrap();
        assert_eq!(frozen.curve.first().unwrap().1, frozen.final_val_loss);

        // Low-rank deltas (rank 2 of the tiny model's 32-wide matrices) are smaller and still train.
        let low = s
            .run_diloco(
                "l",
                2,
                5,
                DeltaCodec::LowRank { rank: 2, block: 64 },
                0.0,
                20,
            )
            .unwrap();
        assert!(low.bytes_per_node_per_round < dense_bytes / 2);
        assert!(low.final_val_loss < low.curve[0].1 - 0.2, "{:?}", low.curve);
        let mut s = s;
        // Outer annealing: constant until the last two rounds, then down to the end rate.
        s.outer_anneal = (2, 0.1);
        let lrs: Vec<f32> = [20, 15, 10, 5, 3].map(|left| s.outer_lr_at(left, 5)).into();
        assert!(
            (lrs[0] - 0.7).abs() < 1e-6 && (lrs[1] - 0.7).abs() < 1e-6,
            "{lrs:?}"
        );
        assert!((lrs[2] - 0.4).abs() < 1e-6, "{lrs:?}");
        assert!(
            (lrs[3] - 0.1).abs() < 1e-6 && (lrs[4] - 0.1).abs() < 1e-6,
            "{lrs:?}"
        );
        s.outer_anneal = (0, 0.0);
        assert_eq!(s.outer_lr_at(5, 5), 0.7);
        // Shrinking short rounds keeps a dropping swarm training.
        let shrunk = s.run_diloco("s", 3, 5, recipe.codec, 0.5, 20).unwrap();
        assert!(
            shrunk.final_val_loss < shrunk.curve[0].1 - 0.2,
            "{:?}",
            shrunk.curve
        );
        let plain = s.run_diloco("p", 3, 5, recipe.codec, 0.0, 10).unwrap();
        // Averaging the parameters is evaluated beside the run, which it leaves unchanged.
        s.ema_horizons = vec![5, 1_000_000];
        let avg = s.run_diloco("a", 3, 5, recipe.codec, 0.0, 10).unwrap();
        assert_eq!(avg.curve, plain.curve);
        assert_eq!(avg.ema.len(), 2);
        // A horizon far beyond the run weighs both rounds alike: not the last θ, but trained.
        assert!(avg.ema[1].final_val_loss < avg.curve[0].1, "{:?}", avg.ema);
        assert_ne!(avg.ema[1].final_val_loss, avg.final_val_loss);
        let single = s.run_single("s", 10, 1, 5).unwrap();
        assert_eq!(single.ema.len(), 2);
        assert!(single.ema[0].final_val_loss < single.curve[0].1);
    }

    fn run(name: &str, k: usize, codec: &str, drop: f64, steps: u32, curve: &[f32]) -> RunResult {
        let every = steps / (curve.len() as u32 - 1);
        RunResult {
            name: name.into(),
            k,
            h: 50,
            codec: codec.into(),
            drop,
            final_val_loss: *curve.last().unwrap(),
            tokens: (k as u64) * steps as u64 * 10,
            per_worker_steps: steps,
            bytes_per_node_per_round: if codec == "fp32" { 1000 } else { 125 },
            total_bytes: 0,
            curve: curve
                .iter()
                .enumerate()
                .map(|(i, l)| (i as u32 * every, *l))
                .collect(),
            tokens_per_sec: 0.0,
            wall_secs: 0.0,
            ema: vec![],
            seed: None,
        }
    }

    #[test]
    fn a_parameter_average_weighs_by_time_held_and_forgets_the_start() {
        let mut e = ParamEma::new(100, 2);
        e.update(&[1.0, -2.0], 50);
        // One vector so far: the average is that vector, not pulled towards zero.
        assert_eq!(e.average(), vec![1.0, -2.0]);
        // A second vector held for as long weighs exp(-1/2)-relatively less for the first.
        e.update(&[3.0, 0.0], 50);
        let keep = (-0.5f64).exp();
        let w_first = keep * (1.0 - keep) / (keep * (1.0 - keep) + (1.0 - keep));
        let want = 1.0 * w_first + 3.0 * (1.0 - w_first);
        let got = e.average();
        assert!((got[0] as f64 - want).abs() < 1e-6, "{got:?} vs {want}");
        assert!(got[0] > 2.0, "the newer vector weighs more: {got:?}");
        // Held much longer than the horizon, the newest vector is all that is left.
        e.update(&[7.0, 7.0], 10_000);
        assert_eq!(e.average(), vec![7.0, 7.0]);
    }

    #[test]
    fn report_compares_each_run_with_its_own_baseline() {
        let results = [
            run("single T=100", 1, "-", 0.0, 100, &[4.0, 3.0, 2.0]),
            run("single 4T", 1, "-", 0.0, 400, &[4.0, 2.0, 1.5]),
            run(
                "sync k=4",
                4,
                "fp32 (gradients)",
                0.0,
                100,
                &[4.0, 2.0, 1.6],
            ),
            run(
                "diloco k=4 h=50 fp32",
                4,
                "fp32",
                0.0,
                100,
                &[4.0, 2.5, 1.8],
            ),
            run(
                "diloco k=4 h=50 int4:64",
                4,
                "int4:64",
                0.0,
                100,
                &[4.0, 1.9, 1.818],
            ),
            run(
                "diloco k=4 h=50 drop=0.5",
                4,
                "int4:64",
                0.5,
                100,
                &[4.0, 2.1, 2.0907],
            ),
            // Another budget: no baseline of its own, so no comparison.
            run("diloco k=2 h=50", 2, "fp32", 0.0, 300, &[4.0, 2.0, 1.7]),
            // Half the workers of sync: half its tokens, so no ratio against it.
            run(
                "diloco k=2 h=50 half",
                2,
                "fp32",
                0.0,
                100,
                &[4.0, 2.0, 1.9],
            ),
        ];
        let lines = comparisons(&results);
        let has = |run: &str, says: &str| {
            assert!(
                lines
                    .iter()
                    .any(|l| l.split("  ").next() == Some(run) && l.contains(says)),
                "no line for {run:?} saying {says:?} in {lines:#?}"
            )
        };
        let reached = "reached single's final loss (2.0000) after";
        has("diloco k=4 h=50 fp32", &format!("{reached} 100 of 100"));
        has("diloco k=4 h=50 int4:64", &format!("{reached} 50 of 100"));
        has("sync k=4", &format!("{reached} 50 of 100"));
        has(
            "diloco k=4 h=50 drop=0.5",
            "never reached single's final loss",
        );
        has(
            "diloco k=4 h=50 fp32",
            "final loss 1.2000x one worker's over the same tokens (400 steps)",
        );
        has("diloco k=4 h=50 fp32", "final loss 1.1250x sync's");
        has(
            "diloco k=4 h=50 int4:64",
            "final loss +1.00 % against fp32, 8.0x fewer bytes",
        );
        has(
            "diloco k=4 h=50 drop=0.5",
            "final loss +15.00 % against no drops (1.8180)",
        );
        assert!(
            !lines
                .iter()
                .any(|l| l.split("  ").next() == Some("diloco k=2 h=50")),
            "a run without a baseline was compared: {lines:#?}"
        );
        has("diloco k=2 h=50 half", &format!("{reached} 50 of 100"));
        assert!(
            !lines
                .iter()
                .any(|l| l.starts_with("diloco k=2 h=50 half") && l.contains("sync")),
            "compared with sync at other tokens: {lines:#?}"
        );
    }

    #[test]
    fn a_run_cut_at_an_earlier_budget_compares_at_that_budget() {
        let diloco = run("diloco k=4 h=50", 4, "fp32", 0.0, 100, &[4.0, 2.5, 1.8]);
        let drop = run(
            "diloco k=4 h=50 drop=0.5",
            4,
            "fp32",
            0.5,
            100,
            &[4.0, 3.0, 1.9],
        );
        let cut = drop.cut_at(50).expect("the curve has a point at 50");
        assert_eq!(cut.name, "diloco k=4 h=50 drop=0.5 T=50");
        assert_eq!(cut.final_val_loss, 3.0);
        assert_eq!(cut.per_worker_steps, 50);
        assert_eq!(cut.tokens, drop.tokens / 2);
        assert_eq!(cut.curve, vec![(0, 4.0), (50, 3.0)]);
        // No point at 70, nothing after the run's end, nothing at 0.
        assert!(drop.cut_at(70).is_none());
        assert!(drop.cut_at(150).is_none());
        assert!(drop.cut_at(0).is_none());
        // Cut at the same budget, each run is compared with its own reference there.
        let lines = comparisons(&[diloco.cut_at(50).unwrap(), cut]);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("diloco k=4 h=50 drop=0.5 T=50")
                    && l.contains("+20.00 % against no drops (2.5000)")),
            "{lines:#?}"
        );
        assert_eq!(drop.cut_at(100).unwrap().final_val_loss, 1.9);
    }

    #[test]
    fn report_compares_runs_of_the_same_seed_only() {
        let seeded = |name: &str, drop: f64, curve: &[f32], seed: u64| RunResult {
            seed: Some(seed),
            ..run(name, 4, "fp32", drop, 100, curve)
        };
        let results = [
            seeded("diloco k=4 h=50", 0.0, &[4.0, 2.5, 2.0], 42),
            seeded("diloco k=4 h=50", 0.0, &[4.0, 2.5, 1.6], 43),
            seeded("diloco k=4 h=50 drop=0.5", 0.5, &[4.0, 2.6, 1.8], 43),
        ];
        let mut results = results.to_vec();
        let lines = comparisons(&results);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("+12.50 % against no drops (1.6000)")),
            "not compared with seed 43's run: {lines:#?}"
        );
        // A run of another seed and no reference of its own is not compared.
        results[2].seed = Some(44);
        assert!(
            !comparisons(&results)
                .iter()
                .any(|l| l.contains("against no drops")),
        );
        // Files written before seeds were recorded still compare.
        results.iter_mut().for_each(|r| r.seed = None);
        assert!(
            comparisons(&results)
                .iter()
                .any(|l| l.contains("against no drops (2.0000)"))
        );
    }
}
