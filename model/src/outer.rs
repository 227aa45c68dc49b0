//! The outer step of DiLoCo: averaging pseudo-gradients and Nesterov SGD on the flat parameters.

use rayon::prelude::*;

/// One pseudo-gradient with its averaging weight (tokens trained).
#[derive(Clone, Copy, Debug)]
pub struct WeightedDelta<'a> {
    pub delta: &'a [f32],
    pub weight: f64,
}

/// The weighted mean Σ wᵢΔᵢ / Σ wᵢ, accumulated in f64 in the given order, so every node that
/// averages the same deltas in the same order gets bit-identical results.
///
/// Returns `None` when there is nothing to average (no deltas or zero total weight).
pub fn weighted_average(deltas: &[WeightedDelta<'_>]) -> Option<Vec<f32>> {
    let total: f64 = deltas.iter().map(|d| d.weight.max(0.0)).sum();
    let len = deltas.first()?.delta.len();
    if total <= 0.0 || deltas.iter().any(|d| d.delta.len() != len) {
        return None;
    }
    let weights: Vec<f64> = deltas.iter().map(|d| d.weight.max(0.0) / total).collect();
    // Each coordinate on its own (in parallel), its terms added in the given order: the same
    // bits as one pass per delta.
    let mut out = vec![0f32; len];
    out.par_chunks_mut(1 << 14)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let start = ci << 14;
            for (jj, o) in chunk.iter_mut().enumerate() {
                let j = start + jj;
                let mut a = 0f64;
                for (d, w) in deltas.iter().zip(&weights) {
                    a += w * d.delta[j] as f64;
                }
                *o = a as f32;
            }
        });
    Some(out)
}

/// How far a round's average lies from the direction every contribution agrees on: the
/// estimated variance of one contribution around the mean, over the squared norm of the mean's
/// expected value, `r = σ² / |g|²` with `σ² = Σ|Δᵢ − Δ̄|² / (n − 1)` and
/// `|g|² = |Δ̄|² − σ²/n` (unweighted). `None` below two contributions or when the mean carries
/// no signal above the spread.
pub fn noise_ratio(deltas: &[&[f32]]) -> Option<f64> {
    noise_ratio_of(&[noise_sums(deltas)?])
}

/// The sums [`noise_ratio`] is made of, over some of the values: with `m̄` the unweighted mean
/// of `n` deltas, `mean_sq = Σⱼ m̄ⱼ²` and `spread = Σᵢⱼ (Δᵢⱼ − m̄ⱼ)²`. The sums of disjoint
/// slices of the values, each averaged on its own, give the whole's ratio ([`noise_ratio_of`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseSums {
    pub n: usize,
    pub mean_sq: f64,
    pub spread: f64,
}

/// [`NoiseSums`] of `deltas`; `None` below two deltas or when their lengths differ.
pub fn noise_sums(deltas: &[&[f32]]) -> Option<NoiseSums> {
    let n = deltas.len();
    let len = deltas.first()?.len();
    if n < 2 || deltas.iter().any(|d| d.len() != len) {
        return None;
    }
    let (mut spread, mut mean_sq) = (0f64, 0f64);
    for j in 0..len {
        let m = deltas.iter().map(|d| d[j] as f64).sum::<f64>() / n as f64;
        mean_sq += m * m;
        spread += deltas
            .iter()
            .map(|d| (d[j] as f64 - m).powi(2))
            .sum::<f64>();
    }
    Some(NoiseSums { n, mean_sq, spread })
}

/// The noise ratio of the values whose disjoint slices have the sums `parts`, each slice with
/// its own count of deltas: `σ² = Σ spread/(n − 1)`, `|g|² = Σ (mean_sq − spread/(n − 1)/n)`.
/// One part gives [`noise_ratio`] bit for bit. Parts of fewer than two deltas are left out;
/// `None` when none is left or there is no signal above the spread.
pub fn noise_ratio_of(parts: &[NoiseSums]) -> Option<f64> {
    let (mut var, mut signal, mut any) = (0f64, 0f64, false);
    for p in parts.iter().filter(|p| p.n >= 2) {
        let v = p.spread / (p.n - 1) as f64;
        var += v;
        signal += p.mean_sq - v / p.n as f64;
        any = true;
    }
    (any && signal > 0.0).then(|| var / signal)
}

/// The running noise ratio after a round: a running mean (0.7 of the old value, 0.3 of the new)
/// of [`noise_ratio`] over the rounds where two or more contributions arrived; unchanged by a
/// round that cannot tell (fewer than two, or no signal above the spread). A non-finite or
/// negative old value counts as none.
pub fn update_noise(prev: Option<f64>, deltas: &[&[f32]]) -> Option<f64> {
    update_noise_with(prev, noise_ratio(deltas))
}

/// [`update_noise`] given the round's ratio.
pub fn update_noise_with(prev: Option<f64>, round: Option<f64>) -> Option<f64> {
    let prev = prev.filter(|r| r.is_finite() && *r >= 0.0);
    match round {
        Some(r) => Some(prev.map_or(r, |m| 0.7 * m + 0.3 * r)),
        None => prev,
    }
}

/// The factor a round's averaged delta is scaled by when fewer contributions arrived than were
/// planned: the shrinkage that minimises the expected squared error of an average of `arrived`
/// noisy contributions, `1 / (1 + r/arrived)`, relative to that of a full round of `planned`
/// (so a full round is unchanged). `r` is the noise ratio of one contribution
/// ([`noise_ratio`]); `r = 0` turns it off. `arrived` may be fractional (partial contributions
/// count by their share of a full round's tokens).
pub fn partial_round_scale(r: f64, planned: f64, arrived: f64) -> f32 {
    if r <= 0.0 || arrived <= 0.0 || arrived >= planned {
        return 1.0;
    }
    ((1.0 + r / planned) / (1.0 + r / arrived)) as f32
}

/// Nesterov-momentum SGD over flat parameters, treating the averaged delta as the gradient.
#[derive(Clone, Debug, PartialEq)]
pub struct OuterOptimizer {
    pub lr: f32,
    pub momentum: f32,
    /// Momentum buffer, one value per parameter.
    pub buf: Vec<f32>,
}

impl OuterOptimizer {
    /// A fresh optimizer (zero momentum) for `len` parameters.
    pub fn new(lr: f32, momentum: f32, len: usize) -> Self {
        OuterOptimizer {
            lr,
            momentum,
            buf: vec![0.0; len],
        }
    }

    /// θ ← θ − lr·(Δ + μ·b) with b ← μ·b + Δ (PyTorch's SGD with `nesterov=True`).
    pub fn step(&mut self, params: &mut [f32], delta: &[f32]) {
        let (lr, mu) = (self.lr, self.momentum);
        for ((p, b), d) in params.iter_mut().zip(self.buf.iter_mut()).zip(delta) {
            *b = mu * *b + d;
            *p -= lr * (d + mu * *b);
        }
    }
}

/// Error feedback for lossy codecs: what could not be sent is added to the next delta.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ErrorFeedback {
    pub residual: Vec<f32>,
    /// The low-rank codec's memory of each weight matrix's last subspace (PowerSGD's warm
    /// start; `nightshift_protocol::delta::encode_shaped`). Sender-side only, like the residual.
    pub subspaces: Vec<Vec<f32>>,
}

impl ErrorFeedback {
    /// Adds the carried residual to `delta` in place.
    pub fn compensate(&mut self, delta: &mut [f32]) {
        if self.residual.len() == delta.len() {
            delta
                .iter_mut()
                .zip(&self.residual)
                .for_each(|(d, r)| *d += r);
        }
    }

    /// Records what was lost: `compensated − sent`.
    pub fn record(&mut self, compensated: &[f32], sent: &[f32]) {
        self.residual = compensated.iter().zip(sent).map(|(c, s)| c - s).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averaging_is_weighted_by_tokens() {
        let a = [1.0f32, 0.0];
        let b = [0.0f32, 4.0];
        let avg = weighted_average(&[
            WeightedDelta {
                delta: &a,
                weight: 300.0,
            },
            WeightedDelta {
                delta: &b,
                weight: 100.0,
            },
        ])
        .unwrap();
        assert_eq!(avg, vec![0.75, 1.0]);
        assert!(weighted_average(&[]).is_none());
        assert!(
            weighted_average(&[WeightedDelta {
                delta: &a,
                weight: 0.0
            }])
            .is_none()
        );
    }

    #[test]
    fn noise_ratio_separates_agreement_from_spread() {
        // Identical contributions: no spread at all.
        let a = [1.0f32, 2.0, -1.0];
        assert_eq!(noise_ratio(&[&a, &a, &a]), Some(0.0));
        // Opposite contributions: no signal, no ratio.
        let b = [-1.0f32, -2.0, 1.0];
        assert_eq!(noise_ratio(&[&a, &b]), None);
        // A shared direction plus noise: r close to σ²/|g|².
        let g = [1.0f32, 0.0, 0.0, 0.0];
        let c1 = [1.0f32, 1.0, 0.0, 0.0];
        let c2 = [1.0f32, -1.0, 0.0, 0.0];
        // mean = g, spread = 2, var = 2, signal = 1 - 2/2 = 0 -> no signal
        assert_eq!(noise_ratio(&[&c1, &c2]), None);
        let c3 = [2.0f32, 0.5, 0.0, 0.0];
        let c4 = [2.0f32, -0.5, 0.0, 0.0];
        let r = noise_ratio(&[&c3, &c4]).unwrap(); // var 0.5, signal 4 - 0.25
        assert!((r - 0.5 / 3.75).abs() < 1e-9, "{r}");
        assert!(noise_ratio(&[&g]).is_none());
    }

    #[test]
    fn the_running_noise_ratio_moves_only_on_rounds_that_can_tell() {
        let c3 = [2.0f32, 0.5, 0.0, 0.0];
        let c4 = [2.0f32, -0.5, 0.0, 0.0];
        let r = 0.5 / 3.75;
        // The first estimate is taken as it is, later ones blend in at 0.3.
        assert_eq!(update_noise(None, &[&c3, &c4]), Some(r));
        let next = update_noise(Some(1.0), &[&c3, &c4]).unwrap();
        assert!((next - (0.7 + 0.3 * r)).abs() < 1e-12, "{next}");
        // One contribution says nothing about the spread: the old value stays.
        assert_eq!(update_noise(Some(1.0), &[&c3]), Some(1.0));
        assert_eq!(update_noise(None, &[&c3]), None);
        // A value that could only come from a bad state is dropped, not propagated.
        assert_eq!(update_noise(Some(f64::NAN), &[&c3]), None);
        assert_eq!(update_noise(Some(-1.0), &[&c3, &c4]), Some(r));
    }

    #[test]
    fn partial_rounds_shrink_and_full_rounds_do_not() {
        assert_eq!(partial_round_scale(1.0, 4.0, 4.0), 1.0);
        assert_eq!(partial_round_scale(0.0, 4.0, 1.0), 1.0);
        let one = partial_round_scale(1.0, 4.0, 1.0);
        let two = partial_round_scale(1.0, 4.0, 2.0);
        assert!((one - 0.625).abs() < 1e-6, "{one}");
        assert!(one < two && two < 1.0);
        assert_eq!(partial_round_scale(1.0, 4.0, 0.0), 1.0);
    }

    #[test]
    fn outer_step_with_lr_one_and_no_momentum_applies_the_average() {
        let mut p = vec![1.0f32, 2.0];
        let mut o = OuterOptimizer::new(1.0, 0.0, 2);
        o.step(&mut p, &[0.5, -1.0]);
        assert_eq!(p, vec![0.5, 3.0]);
    }

    #[test]
    fn nesterov_matches_the_reference_recurrence() {
        let mut p = vec![0.0f32];
        let mut o = OuterOptimizer::new(0.7, 0.9, 1);
        o.step(&mut p, &[1.0]); // b=1, p = -0.7*(1+0.9) = -1.33
        assert!((p[0] + 1.33).abs() < 1e-6);
        o.step(&mut p, &[1.0]); // b=1.9, p -= 0.7*(1+1.71)
        assert!((p[0] + 1.33 + 0.7 * 2.71).abs() < 1e-5);
    }

    #[test]
    fn error_feedback_loses_nothing_over_rounds() {
        use nightshift_test_codec::lossy;
        let deltas: Vec<Vec<f32>> = (0..20)
            .map(|r| {
                (0..50)
                    .map(|i| ((r * 50 + i) as f32 * 0.77).sin() * 0.01)
                    .collect()
            })
            .collect();
        let mut ef = ErrorFeedback::default();
        let mut sent_sum = [0f32; 50];
        for d in &deltas {
            let mut c = d.clone();
            ef.compensate(&mut c);
            let sent = lossy(&c);
            ef.record(&c, &sent);
            sent_sum.iter_mut().zip(&sent).for_each(|(s, x)| *s += x);
        }
        for i in 0..50 {
            let truth: f32 = deltas.iter().map(|d| d[i]).sum();
            assert!((sent_sum[i] + ef.residual[i] - truth).abs() < 1e-5);
        }
    }

    /// A crude lossy codec for the test: keep one decimal of the value scaled by 100.
    mod nightshift_test_codec {
        pub fn lossy(v: &[f32]) -> Vec<f32> {
            v.iter().map(|x| (x * 100.0).round() / 100.0).collect()
        }
    }
}
