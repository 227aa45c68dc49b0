//! The DiLoCo inner loop: H AdamW steps from θ(t) on the node's own shard.

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::{AdamW, AdamWConfig, AdjustLrFn, GradientsParams, Muon, MuonConfig, Optimizer};
use burn::prelude::*;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder as _};
use burn::tensor::backend::AutodiffBackend;
use rand::Rng;

use crate::flat::{self, LengthMismatch};
use crate::{Corpus, Gpt, GptConfig, Shard};

/// Inner optimizer settings.
#[derive(Clone, Debug, PartialEq)]
pub struct InnerConfig {
    pub lr: f64,
    /// Linear warm-up over this many inner steps (counted over the node's whole life).
    pub warmup_steps: u64,
    pub batch_size: usize,
    pub weight_decay: f32,
    /// Gradient clipping: the global norm of all gradients together is held to at most this
    /// (PyTorch's `clip_grad_norm_`, what the recipe means). 0 disables it.
    pub grad_clip: f32,
    /// Threads one inner step uses: the batch is cut into this many equal parts whose
    /// gradients are computed in parallel and averaged — the same gradient as the whole batch
    /// (up to float rounding), so it is a local choice, not part of the swarm's recipe. Capped at
    /// the largest divisor of the batch size it does not exceed; 1 runs the step on the calling
    /// thread.
    pub threads: usize,
    /// Train the blocks' weight matrices with Muon (Nesterov momentum 0.95, orthogonalised
    /// updates scaled to AdamW's RMS, the same decoupled weight decay) at this multiple of
    /// the inner rate; everything else stays with AdamW. `None`: AdamW for all.
    pub muon: Option<f64>,
}

impl Default for InnerConfig {
    fn default() -> Self {
        InnerConfig {
            lr: 1e-3,
            warmup_steps: 50,
            batch_size: 16,
            weight_decay: 0.1,
            grad_clip: 1.0,
            threads: 1,
            muon: None,
        }
    }
}

impl InnerConfig {
    /// The number of parts a batch is actually cut into: `threads`, lowered to a divisor of
    /// the batch size (at least 1).
    pub fn parts(&self) -> usize {
        let batch = self.batch_size.max(1);
        (1..=self.threads.clamp(1, batch))
            .rev()
            .find(|p| batch.is_multiple_of(*p))
            .unwrap_or(1)
    }

    /// The learning rate of inner step `step` (0-based): linear warm-up, then constant.
    pub fn lr_at(&self, step: u64) -> f64 {
        let w = self.warmup_steps;
        if w > 0 && step < w {
            return self.lr * (step + 1) as f64 / w as f64;
        }
        self.lr
    }
}

/// What one call to [`InnerTrainer::train`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InnerReport {
    pub steps: u32,
    pub tokens: u64,
    /// Mean training loss over the steps (NaN when no step ran).
    pub mean_loss: f32,
    /// True when `should_stop` cut the run short.
    pub yielded: bool,
}

/// Scales all gradients by one factor so that their global L2 norm is at most `max_norm`.
fn clip_global_norm<B: AutodiffBackend>(
    model: &Gpt<B>,
    grads: &mut GradientsParams,
    max_norm: f32,
) {
    struct SumSquares<'a> {
        grads: &'a GradientsParams,
        total: f64,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for SumSquares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.get::<B::InnerBackend, D>(param.id) {
                self.total += (g.clone() * g).sum().into_scalar().to_f64();
            }
        }
    }
    struct Scale<'a> {
        grads: &'a mut GradientsParams,
        factor: f32,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if let Some(g) = self.grads.remove::<B::InnerBackend, D>(param.id) {
                self.grads.register(param.id, g.mul_scalar(self.factor));
            }
        }
    }
    let mut sum = SumSquares { grads, total: 0.0 };
    model.visit(&mut sum);
    let norm = sum.total.sqrt();
    if norm.is_finite() && norm > max_norm as f64 {
        let factor = (max_norm as f64 / (norm + 1e-6)) as f32;
        model.visit(&mut Scale { grads, factor });
    }
}

/// A copy of `model` whose parameters are new autodiff leaves (same values, same ids): its
/// forward pass builds a graph of its own, so several copies can run backward at once (burn keeps
/// one lock per connected graph, and shared parameter leaves would join the graphs).
struct FreshLeaves;

impl<B: AutodiffBackend> ModuleMapper<B> for FreshLeaves {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.detach().require_grad(), mapper)
    }
}

/// The mean loss and gradient of the batch `x → y` (`parts · b` rows of `seq` tokens), computed
/// as `parts` equal slices on as many threads and averaged. The loss is a mean over tokens, so
/// the average of the slices' means is the whole batch's.
fn parallel_gradients<B: AutodiffBackend>(
    model: &Gpt<B>,
    x: &[i32],
    y: &[i32],
    parts: usize,
    seq: usize,
    device: &B::Device,
) -> (f64, GradientsParams) {
    let rows = x.len() / seq / parts;
    let slice = rows * seq;
    let one = |i: usize| {
        let replica = model.clone().map(&mut FreshLeaves);
        let range = i * slice..(i + 1) * slice;
        let inputs = Tensor::<B, 2, Int>::from_data(
            TensorData::new(x[range.clone()].to_vec(), [rows, seq]),
            device,
        );
        let targets =
            Tensor::<B, 2, Int>::from_data(TensorData::new(y[range].to_vec(), [rows, seq]), device);
        let loss = replica.loss(inputs, targets);
        let grads = loss.backward();
        let loss = loss.into_scalar().to_f64();
        (loss, GradientsParams::from_grads(grads, &replica))
    };
    let results: Vec<(f64, GradientsParams)> = std::thread::scope(|scope| {
        let one = &one;
        let handles: Vec<_> = (1..parts).map(|i| scope.spawn(move || one(i))).collect();
        let mut all = vec![one(0)];
        // A panic in a part is a bug in the model code: surface it as on one thread.
        all.extend(
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e))),
        );
        all
    });
    let loss = results.iter().map(|(l, _)| l).sum::<f64>() / parts as f64;
    let mut parts_grads: Vec<GradientsParams> = results.into_iter().map(|(_, g)| g).collect();
    let mut total = parts_grads.remove(0);
    struct Average<'a> {
        total: &'a mut GradientsParams,
        rest: &'a mut [GradientsParams],
        scale: f32,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Average<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(mut g) = self.total.remove::<B::InnerBackend, D>(param.id) else {
                return;
            };
            for other in self.rest.iter_mut() {
                if let Some(o) = other.remove::<B::InnerBackend, D>(param.id) {
                    g = g + o;
                }
            }
            self.total.register(param.id, g.mul_scalar(self.scale));
        }
    }
    model.visit(&mut Average {
        total: &mut total,
        rest: &mut parts_grads,
        scale: 1.0 / parts as f32,
    });
    (loss, total)
}

/// A model, its AdamW state and its step counter. The optimizer state survives parameter loads.
///
/// [`InnerTrainer::suspend`] moves the model and the AdamW state off the device (into host
/// memory) so that the device is free while the owner uses the machine; the next call that
/// needs the device brings them back, unchanged.
pub struct InnerTrainer<B: AutodiffBackend> {
    model: Option<Gpt<B>>,
    optim: OptimizerAdaptor<AdamW, Gpt<B>, B>,
    /// Muon for the blocks' matrices when [`InnerConfig::muon`] asks for it.
    muon: Option<MuonOptim<B>>,
    cfg: InnerConfig,
    model_cfg: GptConfig,
    steps_taken: u64,
    device: B::Device,
    /// Host copy while suspended.
    suspended: Option<Suspended>,
    /// Parameter shapes in flat order (what a low-rank codec needs to find the matrices).
    shapes: Vec<Vec<usize>>,
}

type Recorder = BinBytesRecorder<FullPrecisionSettings>;
type MuonOptim<B> = OptimizerAdaptor<Muon<<B as AutodiffBackend>::InnerBackend>, Gpt<B>, B>;

/// A trainer's state in host memory: θ, and the model and AdamW records (the model record keeps
/// the parameter ids the AdamW state is keyed by).
struct Suspended {
    params: Vec<f32>,
    model: Vec<u8>,
    optim: Vec<u8>,
    muon: Vec<u8>,
}

/// AdamW with burn's moment rates and epsilon (0.9, 0.999, 1e-5); gradients are clipped
/// before it, by their global norm ([`clip_global_norm`]).
fn fresh_adamw<B: AutodiffBackend>(cfg: &InnerConfig) -> OptimizerAdaptor<AdamW, Gpt<B>, B> {
    AdamWConfig::new()
        .with_weight_decay(cfg.weight_decay)
        .init()
}

fn fresh_muon<B: AutodiffBackend>(cfg: &InnerConfig) -> Option<MuonOptim<B>> {
    cfg.muon?;
    // burn's five Newton–Schulz iterations.
    let mut muon = MuonConfig::new().with_adjust_lr_fn(AdjustLrFn::MatchRmsAdamW);
    if cfg.weight_decay > 0.0 {
        muon = muon.with_weight_decay(Some(WeightDecayConfig::new(cfg.weight_decay)));
    }
    Some(muon.init())
}

impl<B: AutodiffBackend> InnerTrainer<B> {
    /// A trainer for a fresh model of `model_cfg`, loaded with `params`.
    ///
    /// # Errors
    /// When `params` does not fit the architecture.
    pub fn new(
        model_cfg: &GptConfig,
        cfg: InnerConfig,
        params: &[f32],
        device: &B::Device,
    ) -> Result<Self, LengthMismatch> {
        let model = flat::unflatten(model_cfg.init::<B>(device), params, device)?;
        Ok(InnerTrainer {
            shapes: flat::param_shapes(&model),
            model: Some(model),
            optim: fresh_adamw(&cfg),
            muon: fresh_muon::<B>(&cfg),
            cfg,
            model_cfg: model_cfg.clone(),
            steps_taken: 0,
            device: device.clone(),
            suspended: None,
        })
    }

    fn model(&mut self) -> &Gpt<B> {
        self.wake();
        // `model` is only `None` inside `train`'s step or while suspended (just undone).
        self.model.as_ref().expect("model present between steps")
    }

    /// Moves θ and the AdamW state to host memory and drops every device tensor, so that the
    /// device (GPU memory) is free. Idempotent.
    pub fn suspend(&mut self) {
        if self.suspended.is_some() {
            return;
        }
        let Some(model) = self.model.take() else {
            return;
        };
        let params = flat::flatten(&model);
        let optim = std::mem::replace(&mut self.optim, fresh_adamw(&self.cfg));
        // Encoding our own records into memory cannot fail; `wake` falls back to fresh ones.
        let optim = Recorder::default()
            .record(optim.to_record(), ())
            .unwrap_or_default();
        let muon = self
            .muon
            .take()
            .and_then(|m| Recorder::default().record(m.to_record(), ()).ok())
            .unwrap_or_default();
        let model = Recorder::default()
            .record(model.into_record(), ())
            .unwrap_or_default();
        self.suspended = Some(Suspended {
            params,
            model,
            optim,
            muon,
        });
    }

    /// True while [`InnerTrainer::suspend`] holds the state off the device.
    pub fn is_suspended(&self) -> bool {
        self.suspended.is_some()
    }

    /// Brings a suspended state back onto the device (a no-op when not suspended).
    pub fn wake(&mut self) {
        let Some(s) = self.suspended.take() else {
            return;
        };
        let mut model = self.model_cfg.init::<B>(&self.device);
        if !s.model.is_empty()
            && let Ok(record) = Recorder::default().load(s.model, &self.device)
        {
            model = model.load_record(record);
        }
        let model = flat::unflatten(model, &s.params, &self.device)
            .expect("suspended parameters come from this model");
        let optim = fresh_adamw::<B>(&self.cfg);
        // An empty record (cleared by `reset`, or one that could not be written) starts AdamW
        // afresh; it must not reach the recorder, which panics on an empty input.
        self.optim = if s.optim.is_empty() {
            optim
        } else {
            match Recorder::default().load(s.optim, &self.device) {
                Ok(record) => optim.load_record(record),
                Err(_) => optim,
            }
        };
        self.muon = fresh_muon::<B>(&self.cfg).map(|m| {
            if s.muon.is_empty() {
                return m;
            }
            match Recorder::default().load(s.muon, &self.device) {
                Ok(record) => m.load_record(record),
                Err(_) => m,
            }
        });
        self.model = Some(model);
    }

    /// The shape of every parameter tensor, in the flat vector's order.
    pub fn param_shapes(&self) -> &[Vec<usize>] {
        &self.shapes
    }

    /// Number of parameters.
    pub fn num_params(&self) -> usize {
        match (&self.model, &self.suspended) {
            (Some(m), _) => m.num_params(),
            (None, Some(s)) => s.params.len(),
            (None, None) => 0,
        }
    }

    /// Current parameters, flat (from host memory while suspended).
    pub fn params(&self) -> Vec<f32> {
        match (&self.model, &self.suspended) {
            (_, Some(s)) => s.params.clone(),
            (Some(m), None) => flat::flatten(m),
            (None, None) => vec![],
        }
    }

    /// Replaces the parameters (keeping the AdamW state). While suspended, only the host copy
    /// changes: the device stays free.
    ///
    /// # Errors
    /// When `params` has the wrong length; the model is unchanged then.
    pub fn load_params(&mut self, params: &[f32]) -> Result<(), LengthMismatch> {
        let expected = self.num_params();
        if params.len() != expected {
            return Err(LengthMismatch {
                got: params.len(),
                expected,
            });
        }
        if let Some(s) = self.suspended.as_mut() {
            s.params.copy_from_slice(params);
            return Ok(());
        }
        let m = self.model.take().expect("model present between steps");
        self.model = Some(flat::unflatten(m, params, &self.device)?);
        Ok(())
    }

    /// Replaces the parameters and starts AdamW afresh (its moments are dropped; the step count,
    /// which drives the warm-up, is kept). The way back from a diverged inner loop: once a step
    /// has produced a non-finite value, the moments hold it too and would poison any parameters
    /// loaded after it.
    ///
    /// # Errors
    /// When `params` has the wrong length; the trainer is unchanged then.
    pub fn reset(&mut self, params: &[f32]) -> Result<(), LengthMismatch> {
        self.load_params(params)?;
        match self.suspended.as_mut() {
            // Stays off the device; `wake` starts AdamW afresh from an empty record.
            Some(s) => {
                s.optim.clear();
                s.muon.clear();
            }
            None => {
                self.optim = fresh_adamw(&self.cfg);
                self.muon = fresh_muon::<B>(&self.cfg);
            }
        }
        Ok(())
    }

    /// Inner steps taken so far (drives the warm-up).
    pub fn steps_taken(&self) -> u64 {
        self.steps_taken
    }

    /// The learning rate of the next step.
    pub fn current_lr(&self) -> f64 {
        self.cfg.lr_at(self.steps_taken)
    }

    /// Runs up to `steps` AdamW steps on random batches of `shard`. `should_stop` is checked
    /// before every step, so a yield takes effect at the next step boundary.
    pub fn train(
        &mut self,
        corpus: &Corpus,
        shard: &Shard,
        rng: &mut impl Rng,
        steps: u32,
        should_stop: &dyn Fn() -> bool,
    ) -> InnerReport {
        let seq = self.model().seq_len();
        let batch = self.cfg.batch_size;
        let parts = self.cfg.parts();
        let mut report = InnerReport::default();
        let mut loss_sum = 0.0f64;
        for _ in 0..steps {
            if should_stop() {
                report.yielded = true;
                break;
            }
            let (x, y) = corpus.sample_batch(shard, rng, batch, seq);
            let model = self.model.take().expect("model present between steps");
            let (loss, mut grads) = if parts <= 1 {
                let inputs =
                    Tensor::<B, 2, Int>::from_data(TensorData::new(x, [batch, seq]), &self.device);
                let targets =
                    Tensor::<B, 2, Int>::from_data(TensorData::new(y, [batch, seq]), &self.device);
                let loss = model.loss(inputs, targets);
                let grads = loss.backward();
                let loss = loss.into_scalar().to_f64();
                (loss, GradientsParams::from_grads(grads, &model))
            } else {
                parallel_gradients(&model, &x, &y, parts, seq, &self.device)
            };
            loss_sum += loss;
            if self.cfg.grad_clip > 0.0 {
                clip_global_norm(&model, &mut grads, self.cfg.grad_clip);
            }
            let lr = self.current_lr();
            let model = match (self.muon.as_mut(), self.cfg.muon) {
                (Some(muon), Some(mult)) => {
                    let mut matrices = GradientsParams::new();
                    for id in model.hidden_matrix_ids() {
                        if let Some(g) = grads.remove::<B::InnerBackend, 2>(id) {
                            matrices.register(id, g);
                        }
                    }
                    muon.step(lr * mult, model, matrices)
                }
                _ => model,
            };
            self.model = Some(self.optim.step(lr, model, grads));
            self.steps_taken += 1;
            report.steps += 1;
            report.tokens += (batch * seq) as u64;
        }
        report.mean_loss = if report.steps == 0 {
            f32::NAN
        } else {
            (loss_sum / report.steps as f64) as f32
        };
        report
    }

    /// The model without autodiff, for evaluation (wakes a suspended trainer).
    pub fn eval_model(&mut self) -> Gpt<B::InnerBackend> {
        self.model().valid()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tokenizer;
    use crate::backend::{CpuTrain, cpu_device};
    use crate::data::EMBEDDED_CORPUS;
    use crate::eval::val_loss;
    use rand::SeedableRng;

    /// The tiny model on the first `chars` characters of the embedded corpus (seq 32), and its
    /// genesis parameters.
    fn tiny(chars: usize) -> (burn::backend::flex::FlexDevice, Corpus, GptConfig, Vec<f32>) {
        let dev = cpu_device();
        let text = &EMBEDDED_CORPUS[..chars];
        let tok = Tokenizer::from_corpus(text);
        let corpus = Corpus::new(text, &tok, 100, 32).unwrap();
        let cfg = GptConfig::preset("tiny", tok.len()).unwrap();
        let init = flat::genesis_params::<CpuTrain, _>(&cfg.init::<CpuTrain>(&dev), 3);
        (dev, corpus, cfg, init)
    }

    /// Settings that train the tiny model visibly in a few dozen steps.
    fn quick() -> InnerConfig {
        InnerConfig {
            lr: 3e-3,
            warmup_steps: 5,
            batch_size: 8,
            ..Default::default()
        }
    }

    #[test]
    fn a_few_inner_steps_lower_the_validation_loss() {
        let (dev, corpus, cfg, init) = tiny(200_000);
        let mut t = InnerTrainer::<CpuTrain>::new(&cfg, quick(), &init, &dev).unwrap();
        let val = corpus.val_batches(8, 32, 4);
        let before = val_loss(&t.eval_model(), &val);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 40, &|| false);
        assert_eq!(r.steps, 40);
        assert_eq!(r.tokens, 40 * 8 * 32);
        let after = val_loss(&t.eval_model(), &val);
        assert!(after < before - 0.3, "{before} -> {after}");
        // Params changed and a reload restores them exactly.
        let p = t.params();
        assert_ne!(p, init);
        t.load_params(&init).unwrap();
        assert_eq!(t.params(), init);
        assert!(t.load_params(&init[1..]).is_err());
    }

    #[test]
    fn a_reset_recovers_a_trainer_whose_training_went_non_finite() {
        let (dev, corpus, cfg, init) = tiny(100_000);
        let inner = InnerConfig {
            lr: 3e-3,
            warmup_steps: 2,
            batch_size: 4,
            ..Default::default()
        };
        let mut t = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        // A NaN in θ makes every gradient NaN, and AdamW's moments with it.
        let mut bad = init.clone();
        bad[7] = f32::NAN;
        t.load_params(&bad).unwrap();
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 2, &|| false);
        assert!(r.mean_loss.is_nan());
        // Loading good parameters alone does not help: the moments are poisoned.
        t.load_params(&init).unwrap();
        t.train(&corpus, &corpus.full_shard(), &mut rng, 1, &|| false);
        assert!(t.params().iter().any(|v| !v.is_finite()));
        // A reset does, also while suspended (without waking the trainer).
        assert!(t.reset(&init[1..]).is_err());
        t.suspend();
        t.reset(&init).unwrap();
        assert!(t.is_suspended());
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 2, &|| false);
        assert!(r.mean_loss.is_finite(), "{}", r.mean_loss);
        assert!(t.params().iter().all(|v| v.is_finite()));
        // And a poisoned one again, awake.
        t.load_params(&bad).unwrap();
        t.train(&corpus, &corpus.full_shard(), &mut rng, 1, &|| false);
        t.reset(&init).unwrap();
        assert_eq!(t.params(), init);
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 3, &|| false);
        assert!(r.mean_loss.is_finite(), "{}", r.mean_loss);
        assert!(t.params().iter().all(|v| v.is_finite()));
        assert_ne!(t.params(), init);
    }

    #[test]
    fn a_batch_split_over_threads_takes_the_same_steps() {
        let (dev, corpus, cfg, init) = tiny(100_000);
        let run = |threads: usize| {
            let inner = InnerConfig {
                lr: 3e-3,
                warmup_steps: 2,
                batch_size: 8,
                threads,
                ..Default::default()
            };
            let mut t = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
            let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 4, &|| false);
            (r, t.params())
        };
        let (one, p1) = run(1);
        let (four, p4) = run(4);
        assert_eq!(one.tokens, four.tokens, "every row of the batch is trained");
        assert!((one.mean_loss - four.mean_loss).abs() < 1e-4);
        // Same data, same gradient up to summation order: AdamW's first steps move every
        // parameter by about the learning rate, so a different gradient would show at 1e-3.
        let moved = p1
            .iter()
            .zip(&init)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let apart = p1
            .iter()
            .zip(&p4)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(moved > 1e-3, "training moved the parameters ({moved})");
        assert!(apart < 2e-4, "one thread and four differ by {apart}");
    }

    #[test]
    fn threads_are_lowered_to_a_divisor_of_the_batch() {
        let c = |batch_size, threads| InnerConfig {
            batch_size,
            threads,
            ..Default::default()
        };
        assert_eq!(c(16, 1).parts(), 1);
        assert_eq!(c(16, 0).parts(), 1);
        assert_eq!(c(16, 2).parts(), 2);
        assert_eq!(c(16, 3).parts(), 2);
        assert_eq!(c(16, 6).parts(), 4);
        assert_eq!(c(12, 5).parts(), 4);
        assert_eq!(c(7, 4).parts(), 1);
        assert_eq!(c(4, 32).parts(), 4);
    }

    #[test]
    fn the_rate_warms_up_then_holds() {
        let c = InnerConfig {
            lr: 1e-3,
            warmup_steps: 10,
            ..Default::default()
        };
        assert!((c.lr_at(0) - 1e-4).abs() < 1e-12);
        assert!((c.lr_at(9) - 1e-3).abs() < 1e-12);
        assert_eq!(c.lr_at(5000), 1e-3, "constant after the warm-up");
    }

    #[test]
    fn training_stops_at_the_next_step_when_asked() {
        let (dev, corpus, cfg, init) = tiny(50_000);
        let mut t =
            InnerTrainer::<CpuTrain>::new(&cfg, InnerConfig::default(), &init, &dev).unwrap();
        let calls = std::cell::Cell::new(0);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 10, &|| {
            calls.set(calls.get() + 1);
            calls.get() > 3
        });
        assert!(r.yielded);
        assert_eq!(r.steps, 3);
    }

    #[test]
    fn muon_trains_the_matrices_and_its_momentum_survives_a_suspend() {
        let (dev, corpus, cfg, init) = tiny(200_000);
        let adamw = quick();
        let muon = InnerConfig {
            muon: Some(1.0),
            ..adamw.clone()
        };
        let val = corpus.val_batches(8, 32, 4);
        let shard = corpus.full_shard();
        let mut plain = InnerTrainer::<CpuTrain>::new(&cfg, adamw, &init, &dev).unwrap();
        let mut a = InnerTrainer::<CpuTrain>::new(&cfg, muon.clone(), &init, &dev).unwrap();
        let mut b = InnerTrainer::<CpuTrain>::new(&cfg, muon, &init, &dev).unwrap();
        let before = val_loss(&a.eval_model(), &val);
        let rng = || rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let (mut rp, mut ra, mut rb) = (rng(), rng(), rng());
        plain.train(&corpus, &shard, &mut rp, 20, &|| false);
        a.train(&corpus, &shard, &mut ra, 20, &|| false);
        b.train(&corpus, &shard, &mut rb, 20, &|| false);
        // Same batches, another optimizer for the matrices: other parameters.
        assert_ne!(a.params(), plain.params());
        // Muon's momentum is kept over a suspend, as AdamW's moments are.
        a.suspend();
        a.train(&corpus, &shard, &mut ra, 20, &|| false);
        b.train(&corpus, &shard, &mut rb, 20, &|| false);
        assert_eq!(a.params(), b.params());
        let after = val_loss(&a.eval_model(), &val);
        assert!(after < before - 0.3, "{before} -> {after}");
    }

    #[test]
    fn suspending_frees_the_device_and_loses_nothing() {
        let (dev, corpus, cfg, init) = tiny(50_000);
        let inner = InnerConfig {
            batch_size: 4,
            ..Default::default()
        };
        let mut a = InnerTrainer::<CpuTrain>::new(&cfg, inner.clone(), &init, &dev).unwrap();
        let mut b = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
        let mut ra = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut rb = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        a.train(&corpus, &corpus.full_shard(), &mut ra, 3, &|| false);
        b.train(&corpus, &corpus.full_shard(), &mut rb, 3, &|| false);
        // `a` is suspended between its steps; `b` is not. AdamW moments must survive, so both
        // continue identically.
        a.suspend();
        assert!(a.is_suspended());
        assert!(a.model.is_none());
        assert_eq!(a.params(), b.params());
        a.train(&corpus, &corpus.full_shard(), &mut ra, 3, &|| false);
        b.train(&corpus, &corpus.full_shard(), &mut rb, 3, &|| false);
        assert!(!a.is_suspended());
        assert_eq!(a.params(), b.params());
        // Loading parameters while suspended keeps the device free and the values exact.
        a.suspend();
        a.load_params(&init).unwrap();
        assert!(a.model.is_none());
        assert_eq!(a.params(), init);
    }
}
