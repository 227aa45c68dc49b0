//! Low-rank approximation of a pseudo-gradient's weight matrices (PowerSGD-style): a matrix
//! `M` (`rows × cols`, row-major) is sent as two factors `P` (`rows × r`) and `Q` (`cols × r`)
//! with `M ≈ P·Qᵀ`, `P` orthonormal, found by randomized subspace iteration.
//!
//! Pure f64 arithmetic on small matrices, deterministic for a given seed. The wire codec
//! [`crate::DeltaCodec::LowRank`] sends deltas this way; `bench convergence --lowrank` is the
//! older bench-only form (any inner codec for the factors).

/// Subspace iterations after the first projection (2 is enough for a clear spectral gap).
pub const POWER_ITERS: usize = 2;

/// Subspace iterations when starting from the previous round's `Q`. PowerSGD uses one; three
/// cost four more products of the matrix with a thin factor (little beside an inner step) and
/// cut what `lowrank:23:256` costs over fp32 DiLoCo from +1.04 % (one) and +0.69 % (two) to
/// +0.42 % on the mean of five seeds at H = 10 (docs/bench/HISTORY.md, twelfth pass): the
/// pseudo-gradient's top subspace moves between rounds, and one iteration lags it.
pub const WARM_ITERS: usize = 3;

/// The rank-`rank` factors `(P, Q)` of `m` (`rows × cols`, row-major). `P` is `rows × r`, `Q` is
/// `cols × r` (both row-major), `r = min(rank, rows, cols)`, and `P·Qᵀ` is the projection of `m`
/// onto the span of `P`'s orthonormal columns.
///
/// # Panics
/// If `m.len() != rows * cols`.
pub fn factorize(
    m: &[f32],
    rows: usize,
    cols: usize,
    rank: usize,
    seed: u64,
) -> (Vec<f32>, Vec<f32>) {
    let r = rank.min(rows).min(cols);
    let mut state = seed;
    let q: Vec<f32> = (0..cols * r)
        .map(|_| gaussianish(&mut state) as f32)
        .collect();
    factorize_from(m, rows, cols, &q, r, POWER_ITERS)
}

/// [`factorize`] starting from the subspace `q0` (`cols × r`; e.g. the previous round's `Q`,
/// as PowerSGD warm-starts) with `iters` subspace iterations after the first projection.
///
/// # Panics
/// If `m.len() != rows * cols` or `q0.len() != cols * r`.
pub fn factorize_from(
    m: &[f32],
    rows: usize,
    cols: usize,
    q0: &[f32],
    r: usize,
    iters: usize,
) -> (Vec<f32>, Vec<f32>) {
    assert_eq!(m.len(), rows * cols, "matrix size");
    assert_eq!(q0.len(), cols * r, "start subspace size");
    let m: Vec<f64> = m.iter().map(|&v| v as f64).collect();
    let mut q: Vec<f64> = q0.iter().map(|&v| v as f64).collect();
    orthonormalize(&mut q, cols, r);
    let mut p = mul(&m, rows, cols, &q, r);
    orthonormalize(&mut p, rows, r);
    for _ in 0..iters {
        q = mul_t(&m, rows, cols, &p, r);
        orthonormalize(&mut q, cols, r);
        p = mul(&m, rows, cols, &q, r);
        orthonormalize(&mut p, rows, r);
    }
    let q = mul_t(&m, rows, cols, &p, r);
    (
        p.into_iter().map(|v| v as f32).collect(),
        q.into_iter().map(|v| v as f32).collect(),
    )
}

/// `P·Qᵀ` (`rows × cols`, row-major) from factors of rank `r`.
pub fn reconstruct(p: &[f32], q: &[f32], rows: usize, cols: usize, r: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for i in 0..rows {
        let pi = &p[i * r..(i + 1) * r];
        for j in 0..cols {
            let qj = &q[j * r..(j + 1) * r];
            out[i * cols + j] = pi.iter().zip(qj).map(|(a, b)| a * b).sum();
        }
    }
    out
}

/// `M·X`: (`rows × cols`)·(`cols × r`).
fn mul(m: &[f64], rows: usize, cols: usize, x: &[f64], r: usize) -> Vec<f64> {
    let mut out = vec![0f64; rows * r];
    for i in 0..rows {
        let o = &mut out[i * r..(i + 1) * r];
        for (j, &mij) in m[i * cols..(i + 1) * cols].iter().enumerate() {
            o.iter_mut()
                .zip(&x[j * r..(j + 1) * r])
                .for_each(|(a, b)| *a += mij * b);
        }
    }
    out
}

/// `Mᵀ·Y`: (`cols × rows`)·(`rows × r`).
fn mul_t(m: &[f64], rows: usize, cols: usize, y: &[f64], r: usize) -> Vec<f64> {
    let mut out = vec![0f64; cols * r];
    for i in 0..rows {
        let yi = &y[i * r..(i + 1) * r];
        for (j, &mij) in m[i * cols..(i + 1) * cols].iter().enumerate() {
            out[j * r..(j + 1) * r]
                .iter_mut()
                .zip(yi)
                .for_each(|(a, b)| *a += mij * b);
        }
    }
    out
}

/// Modified Gram–Schmidt on the `r` columns of `a` (`n × r`, row-major); a column that
/// vanishes (rank deficiency) is left zero.
fn orthonormalize(a: &mut [f64], n: usize, r: usize) {
    for c in 0..r {
        for prev in 0..c {
            let dot: f64 = (0..n).map(|i| a[i * r + c] * a[i * r + prev]).sum();
            (0..n).for_each(|i| a[i * r + c] -= dot * a[i * r + prev]);
        }
        let norm = (0..n).map(|i| a[i * r + c].powi(2)).sum::<f64>().sqrt();
        let inv = if norm > 1e-30 { 1.0 / norm } else { 0.0 };
        (0..n).for_each(|i| a[i * r + c] *= inv);
    }
}

/// A cheap deterministic value in (−2, 2) with zero mean (sum of two uniforms, splitmix64).
fn gaussianish(state: &mut u64) -> f64 {
    let mut next = || {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    };
    2.0 * (next() + next()) - 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(a: &[f32], b: &[f32]) -> f64 {
        a.iter()
            .zip(b)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
    }

    #[test]
    fn a_matrix_of_rank_r_comes_back_whole() {
        let (rows, cols) = (12, 20);
        // rank 2: u1 v1ᵀ + u2 v2ᵀ
        let m: Vec<f32> = (0..rows * cols)
            .map(|k| {
                let (i, j) = ((k / cols) as f32, (k % cols) as f32);
                (i + 1.0) * (j * 0.3 - 1.0) + (i * i * 0.1 - 2.0) * (j % 3.0)
            })
            .collect();
        let (p, q) = factorize(&m, rows, cols, 2, 7);
        let back = reconstruct(&p, &q, rows, cols, 2);
        let total: f64 = m.iter().map(|v| (*v as f64).powi(2)).sum();
        assert!(err(&m, &back) < 1e-8 * total, "{}", err(&m, &back));
    }

    #[test]
    fn more_rank_never_loses_more() {
        let (rows, cols) = (16, 24);
        let mut s = 3u64;
        let m: Vec<f32> = (0..rows * cols)
            .map(|_| gaussianish(&mut s) as f32)
            .collect();
        let total: f64 = m.iter().map(|v| (*v as f64).powi(2)).sum();
        let errs: Vec<f64> = [1, 4, 8, 16]
            .iter()
            .map(|&r| {
                let (p, q) = factorize(&m, rows, cols, r, 1);
                err(&m, &reconstruct(&p, &q, rows, cols, r.min(rows)))
            })
            .collect();
        assert!(errs.windows(2).all(|w| w[1] <= w[0] + 1e-9), "{errs:?}");
        assert!(errs[3] < 1e-8 * total, "full rank is exact: {errs:?}");
        assert!(errs[0] < total, "rank 1 keeps something");
    }

    #[test]
    fn warm_iterations_follow_a_moving_subspace() {
        // A sequence of matrices whose strong directions turn a little every round, under
        // noise, as a pseudo-gradient's do: each warm start begins from the last round's `Q`.
        let (rows, cols, r) = (32, 48, 4);
        let mut noise = 11u64;
        let rounds: Vec<Vec<f32>> = (0..8)
            .map(|t| {
                let turn = t as f32 * 0.15;
                (0..rows * cols)
                    .map(|k| {
                        let (i, j) = ((k / cols) as f32, (k % cols) as f32);
                        (0..6)
                            .map(|c| {
                                let c = c as f32;
                                0.6f32.powf(c)
                                    * (i * (0.2 + 0.13 * c) + turn).sin()
                                    * (j * (0.1 + 0.07 * c) - turn * c).cos()
                            })
                            .sum::<f32>()
                            + 0.05 * gaussianish(&mut noise) as f32
                    })
                    .collect()
            })
            .collect();
        let lost = |iters: usize| {
            let mut q = factorize(&rounds[0], rows, cols, r, 5).1;
            rounds[1..]
                .iter()
                .map(|m| {
                    let (p, q_new) = factorize_from(m, rows, cols, &q, r, iters);
                    q.clone_from(&q_new);
                    err(m, &reconstruct(&p, &q_new, rows, cols, r))
                })
                .sum::<f64>()
        };
        // Against the best rank-r approximation (many iterations from a fixed start), what each
        // loses beyond it.
        let best: f64 = rounds[1..]
            .iter()
            .map(|m| {
                let (p, q) = factorize_from(m, rows, cols, &rounds[0][..cols * r], r, 60);
                err(m, &reconstruct(&p, &q, rows, cols, r))
            })
            .sum();
        let (one, warm) = (lost(1) - best, lost(WARM_ITERS) - best);
        assert!(
            warm * 2.0 < one,
            "beyond the best: {WARM_ITERS} iterations lose {warm}, one loses {one} (of {best})"
        );
    }
}
