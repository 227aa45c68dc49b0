//! The round's step when contributions are averaged slice by slice, as reducers inside the
//! network average them (`nightshift_protocol::slices`): each slice aggregated on its own with
//! the swarm's aggregator, its mean re-encoded as a reducer sends it, the noise ratio put
//! together from the slices' sums.
//!
//! With the mean aggregator the slices' means are the whole mean's values, bit for bit, so a
//! sliced round differs from an all-to-all one only by the re-encoding of its mean. Centered
//! clipping clips each slice by its own radius (block-wise robust aggregation): a contribution
//! far off in one slice pulls that slice alone.

use super::accept::{
    Accepted, RoundStep, aggregate_parts, compensated_delta, round_noise_sums, scaled_step,
};
use nightshift_model::ErrorFeedback;
use nightshift_model::outer::{NoiseSums, WeightedDelta, noise_ratio_of, update_noise_with};
use nightshift_protocol::slices::{
    SliceContext, SliceError, SlicedDelta, open_header, round_slices,
};
use nightshift_protocol::{
    Aggregator, DeltaCodec, DeltaError, EncodedDelta, SignedEnvelope, delta,
};
use std::collections::BTreeMap;
use std::ops::Range;

/// How a round's contributions are cut and their means sent back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slicing {
    pub slices: u32,
    pub mean_codec: DeltaCodec,
}

impl Slicing {
    /// The slices of a model of `num_params` values whose contributions are sent as `codec`;
    /// `None` when they do not cut ([`round_slices`]).
    pub fn ranges(&self, num_params: usize, codec: DeltaCodec) -> Option<Vec<Range<usize>>> {
        round_slices(num_params, self.slices, codec, self.mean_codec)
    }
}

/// What the reducer of one slice computes: the slice's aggregate encoded as it is sent, the
/// values it decodes to, and the slice's noise sums (of the norm-bounded slices with a robust
/// aggregator). `None` when nothing arrived.
pub fn reduce_slice(
    parts: &[WeightedDelta<'_>],
    aggregator: Aggregator,
    mean_codec: DeltaCodec,
) -> Option<(EncodedDelta, Vec<f32>, Option<NoiseSums>)> {
    let mean = aggregate_parts(parts, aggregator)?;
    let deltas: Vec<&[f32]> = parts.iter().map(|p| p.delta).collect();
    let sums = round_noise_sums(&deltas, aggregator);
    let encoded = delta::encode(mean_codec, &mean);
    let sent = delta::decode(&encoded, mean.len()).ok()?;
    Some((encoded, sent, sums))
}

/// The round's step from its slices' reductions (in slice order): the means joined, the noise
/// ratio updated from the slices' sums, the whole scaled down when fewer contributions arrived
/// than the round planned for (as [`super::accept::round_step`] does). `expected` holds what
/// each counted contribution expected.
pub fn combine(
    reduced: Vec<(Vec<f32>, Option<NoiseSums>)>,
    expected: &[u32],
    noise: Option<f64>,
) -> Option<RoundStep> {
    if expected.is_empty() {
        return None;
    }
    let sums: Vec<NoiseSums> = reduced.iter().filter_map(|r| r.1).collect();
    let noise = update_noise_with(noise, noise_ratio_of(&sums));
    let delta: Vec<f32> = reduced.into_iter().flat_map(|r| r.0).collect();
    Some(scaled_step(delta, noise, expected))
}

/// The round's step from `accepted` averaged slice by slice: what every node computes from the
/// reducers' slices when each reducer counted all of `accepted`. `None` when nothing arrived or
/// the model does not cut into the slices.
pub fn sliced_round_step(
    accepted: &BTreeMap<[u8; 32], Accepted>,
    noise: Option<f64>,
    aggregator: Aggregator,
    codec: DeltaCodec,
    slicing: Slicing,
) -> Option<RoundStep> {
    let len = accepted.values().next()?.delta.len();
    let ranges = slicing.ranges(len, codec)?;
    let reduced = ranges
        .iter()
        .map(|r| {
            let parts: Vec<WeightedDelta<'_>> = accepted
                .values()
                .map(|a| WeightedDelta {
                    delta: &a.delta[r.clone()],
                    weight: a.tokens as f64,
                })
                .collect();
            reduce_slice(&parts, aggregator, slicing.mean_codec).map(|(_, v, sums)| (v, sums))
        })
        .collect::<Option<Vec<_>>>()?;
    let expected: Vec<u32> = accepted.values().map(|a| a.expected).collect();
    combine(reduced, &expected, noise)
}

/// A sliced contribution's header verified against the round's rules, as the machine holds
/// a contribution: sender, digest, tokens, loss and what it expected (its values travel in
/// slices, to the reducers).
///
/// # Errors
/// See [`open_header`].
pub fn accept_header(ctx: &SliceContext<'_>, env: &SignedEnvelope) -> Result<Accepted, SliceError> {
    let h = open_header(env, ctx)?;
    Ok(Accepted {
        sender: env.header.sender,
        digest: env.digest(),
        tokens: h.tokens,
        train_loss: h.train_loss,
        delta: vec![],
        expected: h.expected,
    })
}

/// This node's pseudo-gradient cut into `ranges` and encoded slice by slice (as
/// [`super::accept::encode_delta`] encodes it whole: Δ = θ(r) − θ_local plus the error-feedback
/// residual): the slices, and the values they decode to.
///
/// # Errors
/// When Δ does not survive the codec (non-finite values from diverged training).
pub fn encode_sliced(
    base: &[f32],
    local: &[f32],
    codec: DeltaCodec,
    ranges: &[Range<usize>],
    ef: &mut ErrorFeedback,
) -> Result<(SlicedDelta, Vec<f32>), DeltaError> {
    let d = compensated_delta(base, local, ef)?;
    let sliced = SlicedDelta::encode(codec, &d, ranges);
    let mut sent = Vec::with_capacity(d.len());
    for (s, r) in sliced.slices.iter().zip(ranges) {
        sent.extend(delta::decode(s, r.len())?);
    }
    ef.record(&d, &sent);
    Ok((sliced, sent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::accept::round_step;
    use nightshift_protocol::Hash32;

    fn accepted(n: usize, len: usize) -> BTreeMap<[u8; 32], Accepted> {
        (0..n)
            .map(|i| {
                let sender = [i as u8 + 1; 32];
                let delta = (0..len)
                    .map(|j| ((j * 7 + i * 13) as f32 * 0.31).sin() * 1e-2 + 3e-3)
                    .collect();
                let a = Accepted {
                    sender,
                    digest: Hash32::default(),
                    tokens: 100 + 10 * i as u64,
                    train_loss: 1.0,
                    delta,
                    expected: n as u32,
                };
                (sender, a)
            })
            .collect()
    }

    #[test]
    fn a_sliced_mean_sent_in_fp32_is_the_all_to_all_step() {
        let acc = accepted(3, 1000);
        let codec = DeltaCodec::Int4 { block: 64 };
        let whole = round_step(&acc, Some(0.5), Aggregator::Mean).unwrap();
        for slices in [1, 4, 7] {
            let slicing = Slicing {
                slices,
                mean_codec: DeltaCodec::Fp32,
            };
            let s = sliced_round_step(&acc, Some(0.5), Aggregator::Mean, codec, slicing).unwrap();
            assert_eq!(s.delta, whole.delta, "{slices} slices");
            assert_eq!((s.scale, s.planned), (whole.scale, whole.planned));
            let (a, b) = (s.noise.unwrap(), whole.noise.unwrap());
            assert!((a - b).abs() <= 1e-9 * b, "noise {a} against {b}");
        }
    }

    #[test]
    fn int8_means_and_blockwise_clipping_stay_close_to_the_whole_step() {
        let acc = accepted(4, 2048);
        let codec = DeltaCodec::Int4 { block: 64 };
        let slicing = Slicing {
            slices: 8,
            mean_codec: DeltaCodec::Int8 { block: 64 },
        };
        for agg in [Aggregator::Mean, Aggregator::ROBUST] {
            let whole = round_step(&acc, None, agg).unwrap();
            let s = sliced_round_step(&acc, None, agg, codec, slicing).unwrap();
            let err: f64 = s
                .delta
                .iter()
                .zip(&whole.delta)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let norm: f64 = whole
                .delta
                .iter()
                .map(|v| (*v as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            assert!(err < 0.02 * norm, "{agg}: off by {err} of {norm}");
        }
        // Too many slices for the model: no step rather than a wrong one.
        let many = Slicing {
            slices: 33,
            ..slicing
        };
        assert!(sliced_round_step(&acc, None, Aggregator::Mean, codec, many).is_none());
    }
}
