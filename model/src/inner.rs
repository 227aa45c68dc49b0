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
mod tests;
