//! The simulator's stand-in for the model: a noisy quadratic, cheap enough that a thousand
//! nodes train on one machine. Each inner step is SGD on ½‖θ − θ*‖² with a gradient noise of
//! unit variance per coordinate (a minibatch's), so local steps drift apart as real workers' do
//! and the outer step's averaging matters. The codecs, signatures, aggregation and outer step
//! around it are the real ones.

use nightshift_protocol::StateSnapshot;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The inner learning rate of the stand-in's SGD.
const LR: f32 = 0.05;
/// Standard deviation of each coordinate's gradient noise.
const NOISE: f32 = 1.0;

pub struct Objective {
    target: Vec<f32>,
}

impl Objective {
    /// θ* drawn uniformly from [−1, 1]^params by `seed`.
    pub fn new(params: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x007A_26E7);
        Objective {
            target: (0..params)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
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
