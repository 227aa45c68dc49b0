//! Robust aggregation: combining a round's pseudo-gradients so that a minority of malicious
//! contributions can move the result by a bounded amount only.
//!
//! Every function here is plain arithmetic over the given contributions in the given order, with
//! f64 accumulation and medians taken by a total order, so every node that aggregates the same
//! contributions gets the same bits (the swarm's state hash depends on it).
//!
//! Both robust aggregators first bound each contribution's L2 norm by [`NORM_BOUND_MULT`] times
//! the round's median norm: a contribution scaled up a hundredfold counts as one of ordinary
//! size pointing its way, and no single one can dominate the round.

use crate::WeightedDelta;

/// A contribution's norm is bounded by this many times the round's median norm.
pub const NORM_BOUND_MULT: f64 = 2.0;

fn norm(x: &[f32]) -> f64 {
    x.iter()
        .map(|v| (*v as f64) * (*v as f64))
        .sum::<f64>()
        .sqrt()
}

/// The median of `v` (the mean of the two middle values for an even count); `v` is reordered.
fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => v[n / 2],
        _ => 0.5 * (v[n / 2 - 1] + v[n / 2]),
    }
}

/// Weights normalised to sum to one (negative weights count as zero); `None` when they sum to
/// zero or the deltas differ in length.
fn normalised(parts: &[WeightedDelta<'_>]) -> Option<(Vec<f64>, usize)> {
    let len = parts.first()?.delta.len();
    if parts.iter().any(|p| p.delta.len() != len) {
        return None;
    }
    let total: f64 = parts.iter().map(|p| p.weight.max(0.0)).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    Some((
        parts.iter().map(|p| p.weight.max(0.0) / total).collect(),
        len,
    ))
}

/// Each delta scaled down, where needed, to at most [`NORM_BOUND_MULT`] times the median norm of
/// `deltas`. A delta within the bound is returned unchanged (bit for bit).
pub fn bound_norms(deltas: &[&[f32]]) -> Vec<Vec<f32>> {
    let norms: Vec<f64> = deltas.iter().map(|d| norm(d)).collect();
    let bound = NORM_BOUND_MULT * median(&mut norms.clone());
    deltas
        .iter()
        .zip(&norms)
        .map(|(d, &n)| {
            if n > bound && n > 0.0 {
                let s = bound / n;
                d.iter().map(|v| (*v as f64 * s) as f32).collect()
            } else {
                d.to_vec()
            }
        })
        .collect()
}

/// Centered clipping (Karimireddy, He & Jaggi 2021, "Learning from History for Byzantine Robust
/// Optimization"), started from the coordinate-wise median: after bounding the norms, `iters`
/// times move the center `v` by `Σ wᵢ · clip(xᵢ − v, τ)` where `clip` scales an offset down to
/// norm `τ` and `τ = clip_mult ·` the median offset norm of the round. Offsets within `τ` count
/// in full, so when every contribution lies within `τ` of the center one iteration gives the
/// weighted mean exactly; a far-off contribution pulls the center by at most `wᵢ·τ`.
///
/// `None` when there is nothing to aggregate (see [`crate::weighted_average`]).
pub fn centered_clip(parts: &[WeightedDelta<'_>], clip_mult: f64, iters: u32) -> Option<Vec<f32>> {
    let (w, len) = normalised(parts)?;
    let raw: Vec<&[f32]> = parts.iter().map(|p| p.delta).collect();
    let xs = bound_norms(&raw);
    let k = xs.len();
    // The coordinate-wise median as the starting center.
    let mut center = vec![0f64; len];
    let mut col = vec![0f64; k];
    for (j, c) in center.iter_mut().enumerate() {
        for (slot, x) in col.iter_mut().zip(&xs) {
            *slot = x[j] as f64;
        }
        *c = median(&mut col);
    }
    for _ in 0..iters {
        let mut dists: Vec<f64> = xs
            .iter()
            .map(|x| {
                x.iter()
                    .zip(&center)
                    .map(|(a, c)| (*a as f64 - c).powi(2))
                    .sum::<f64>()
                    .sqrt()
            })
            .collect();
        let tau = clip_mult * median(&mut dists.clone());
        if tau.is_nan() || tau <= 0.0 {
            break; // every contribution sits on the center
        }
        let mut step = vec![0f64; len];
        for ((x, wi), d) in xs.iter().zip(&w).zip(&mut dists) {
            let s = if *d > tau { tau / *d } else { 1.0 };
            let f = wi * s;
            step.iter_mut()
                .zip(x.iter().zip(&center))
                .for_each(|(st, (a, c))| *st += f * (*a as f64 - c));
        }
        center.iter_mut().zip(&step).for_each(|(c, s)| *c += s);
    }
    Some(center.into_iter().map(|c| c as f32).collect())
}

/// How many values a trimmed mean of `k` drops from each side at `trim_permille`: at least one
/// when `k ≥ 3`, never so many that nothing is left.
pub fn trimmed_count(k: usize, trim_permille: u32) -> usize {
    if k < 3 {
        return 0;
    }
    (k * trim_permille as usize / 1000).clamp(1, (k - 1) / 2)
}

/// Coordinate-wise trimmed mean: after bounding the norms, in every coordinate the
/// [`trimmed_count`] largest and smallest values are dropped and the rest averaged by weight.
pub fn trimmed_mean(parts: &[WeightedDelta<'_>], trim_permille: u32) -> Option<Vec<f32>> {
    let (w, len) = normalised(parts)?;
    let raw: Vec<&[f32]> = parts.iter().map(|p| p.delta).collect();
    let xs = bound_norms(&raw);
    let k = xs.len();
    let t = trimmed_count(k, trim_permille);
    let mut col: Vec<(f64, f64)> = vec![(0.0, 0.0); k];
    let mut out = Vec::with_capacity(len);
    for j in 0..len {
        for (slot, (x, wi)) in col.iter_mut().zip(xs.iter().zip(&w)) {
            *slot = (x[j] as f64, *wi);
        }
        // Ties broken by weight, then they are equal: the kept sum does not depend on it.
        col.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
        let kept = &col[t..k - t];
        let (sum, wsum) = kept
            .iter()
            .fold((0f64, 0f64), |(s, ws), (v, wi)| (s + v * wi, ws + wi));
        out.push(if wsum > 0.0 {
            (sum / wsum) as f32
        } else {
            // Every kept value had zero weight: the plain mean of what was kept.
            (kept.iter().map(|(v, _)| v).sum::<f64>() / kept.len() as f64) as f32
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weighted_average;

    fn parts<'a>(xs: &'a [Vec<f32>], w: &[f64]) -> Vec<WeightedDelta<'a>> {
        xs.iter()
            .zip(w)
            .map(|(x, w)| WeightedDelta {
                delta: x,
                weight: *w,
            })
            .collect()
    }

    /// Honest deltas: a common direction plus per-worker noise, deterministic.
    fn honest(k: usize, len: usize) -> Vec<Vec<f32>> {
        (0..k)
            .map(|i| {
                (0..len)
                    .map(|j| {
                        let g = ((j as f32) * 0.37).sin() * 0.01;
                        let noise =
                            (((i * 7919 + j * 104_729) % 1000) as f32 / 1000.0 - 0.5) * 0.004;
                        g + noise
                    })
                    .collect()
            })
            .collect()
    }

    fn dist(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    }

    #[test]
    fn without_an_attacker_centered_clipping_is_the_weighted_mean() {
        let xs = honest(8, 500);
        let w = [1.0, 2.0, 1.0, 1.0, 3.0, 1.0, 1.0, 2.0];
        let p = parts(&xs, &w);
        let mean = weighted_average(&p).unwrap();
        let cc = centered_clip(&p, 1.5, 3).unwrap();
        let rel = dist(&cc, &mean) / norm(&mean);
        assert!(rel < 1e-3, "relative distance {rel}");
    }

    #[test]
    fn a_scaled_or_flipped_minority_moves_the_robust_result_little_and_the_mean_a_lot() {
        let mut xs = honest(8, 500);
        let clean = weighted_average(&parts(&xs[..6], &[1.0; 6])).unwrap();
        let scale = norm(&clean);
        for (attack, f) in [
            ("scale100", 100.0f32),
            ("signflip", -1.0),
            ("scale10", -10.0),
        ] {
            for x in xs.iter_mut().skip(6) {
                *x = clean.iter().map(|v| v * f).collect();
            }
            let p = parts(&xs, &[1.0; 8]);
            let mean = weighted_average(&p).unwrap();
            let cc = centered_clip(&p, 1.5, 3).unwrap();
            let tm = trimmed_mean(&p, 250).unwrap();
            let (dm, dc, dt) = (
                dist(&mean, &clean) / scale,
                dist(&cc, &clean) / scale,
                dist(&tm, &clean) / scale,
            );
            assert!(dc < 0.6 && dt < 0.6, "{attack}: cclip {dc}, trimmed {dt}");
            assert!(
                dm > dc && dm > dt,
                "{attack}: mean {dm}, cclip {dc}, trimmed {dt}"
            );
        }
    }

    #[test]
    fn norms_are_bounded_by_twice_the_median_and_others_left_alone() {
        let xs = [
            vec![3.0f32, 4.0],
            vec![0.0, 1.0],
            vec![0.0, 2.0],
            vec![300.0, 400.0],
        ];
        let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
        let b = bound_norms(&refs);
        // Median norm of (5, 1, 2, 500) is 3.5: bound 7.
        assert_eq!(b[0], xs[0]);
        assert_eq!(b[1], xs[1]);
        assert!((norm(&b[3]) - 7.0).abs() < 1e-5, "{:?}", b[3]);
        assert!((b[3][0] / b[3][1] - 0.75).abs() < 1e-6, "direction kept");
    }

    #[test]
    fn trimmed_mean_drops_the_extremes_of_each_coordinate() {
        let xs: Vec<Vec<f32>> = [1.0f32, 2.0, 3.0, 4.0, 1000.0]
            .iter()
            .map(|v| vec![*v, -*v])
            .collect();
        let p = parts(&xs, &[1.0; 5]);
        // Norms (1.4, 2.8, 4.2, 5.7, 1414): the median is 4.2, so 1000 is bounded to about 6,
        // then one value is dropped each side: the mean of 2, 3, 4.
        let t = trimmed_mean(&p, 200).unwrap();
        assert!(
            (t[0] - 3.0).abs() < 1e-6 && (t[1] + 3.0).abs() < 1e-6,
            "{t:?}"
        );
        assert_eq!(trimmed_count(8, 250), 2);
        assert_eq!(trimmed_count(2, 250), 0);
        assert_eq!(trimmed_count(3, 10), 1);
        assert_eq!(trimmed_count(4, 499), 1);
    }

    #[test]
    fn aggregation_is_bit_identical_when_repeated_and_refuses_nothing_to_do() {
        let xs = honest(5, 300);
        let p = parts(&xs, &[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(centered_clip(&p, 1.5, 3), centered_clip(&p, 1.5, 3));
        assert_eq!(trimmed_mean(&p, 250), trimmed_mean(&p, 250));
        assert_eq!(centered_clip(&[], 1.5, 3), None);
        let zero = parts(&xs, &[0.0; 5]);
        assert_eq!(centered_clip(&zero, 1.5, 3), None);
        // One contribution alone is returned as it is.
        let one = parts(&xs[..1], &[1.0]);
        assert_eq!(centered_clip(&one, 1.5, 3).unwrap(), xs[0]);
        assert_eq!(trimmed_mean(&one, 250).unwrap(), xs[0]);
    }
}
