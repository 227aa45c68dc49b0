//! Pure round logic: accepting a contribution and aggregating a round. No I/O, so every rule
//! here is tested directly.

use nightshift_model::outer::{NoiseSums, noise_ratio_of, noise_sums, update_noise_with};
use nightshift_model::robust::{bound_norms, centered_clip};
use nightshift_model::{ErrorFeedback, WeightedDelta, partial_round_scale, weighted_average};
use nightshift_protocol::{
    Aggregator, Contribution, DecodeError, DeltaCodec, DeltaError, EncodedDelta, Expectation,
    Hash32, MAX_EXPECTED, PayloadKind, SignedEnvelope, VerifyError, delta, wire,
};
use std::collections::BTreeMap;
use thiserror::Error;

/// A verified, decoded contribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Accepted {
    pub sender: [u8; 32],
    /// [`SignedEnvelope::digest`] of the envelope it came in (the default in simulations).
    pub digest: Hash32,
    pub tokens: u64,
    pub train_loss: f32,
    pub delta: Vec<f32>,
    /// How many contributions its sender expected this round (itself included).
    pub expected: u32,
}

/// What a contribution for one round must match.
#[derive(Clone, Copy, Debug)]
pub struct RoundContext<'a> {
    pub swarm_id: Hash32,
    pub round: u64,
    pub base_hash: Hash32,
    pub allowlist: Option<&'a [[u8; 32]]>,
    pub num_params: usize,
    /// Parameter shapes in flat order (the low-rank codec's matrices).
    pub shapes: &'a [Vec<usize>],
    /// The swarm's codec (the manifest's): a delta in any other is refused, so a peer cannot
    /// pick a codec that is costlier to decode than the swarm agreed to.
    pub codec: DeltaCodec,
    /// Most tokens one round of inner steps can train (H · batch · seq).
    pub max_tokens: u64,
}

impl RoundContext<'_> {
    /// Largest acceptable payload: an fp32 delta plus slack for the header fields.
    pub fn max_payload(&self) -> usize {
        delta::dense_bytes(self.num_params) + 4096
    }
}

/// Why a contribution was refused.
#[derive(Debug, Error, PartialEq)]
pub enum Refusal {
    #[error("{0}")]
    Verify(#[from] VerifyError),
    #[error("payload: {0}")]
    Decode(#[from] DecodeError),
    #[error("delta: {0}")]
    Delta(#[from] DeltaError),
    #[error("claims {got} tokens, a round trains at most {max}")]
    TooManyTokens { got: u64, max: u64 },
    #[error("claims zero tokens")]
    NoTokens,
    #[error("expects {0} contributions this round; between 1 and {MAX_EXPECTED} are possible")]
    BadExpected(u32),
    #[error("delta sent as {got}, the swarm uses {expected}")]
    WrongCodec {
        got: DeltaCodec,
        expected: DeltaCodec,
    },
}

/// Verifies `env` against `ctx` (signature and bindings first, then decoding), bounds its claims
/// and decodes its delta.
///
/// # Errors
/// The reason it is refused; nothing is kept from a refused contribution.
pub fn accept(ctx: &RoundContext<'_>, env: &SignedEnvelope) -> Result<Accepted, Refusal> {
    let expect = Expectation {
        kind: PayloadKind::Contribution,
        swarm_id: ctx.swarm_id,
        round: ctx.round,
        base_hash: ctx.base_hash,
        allowlist: ctx.allowlist,
        max_payload: ctx.max_payload(),
    };
    let payload = env.verify(&expect)?;
    let c: Contribution = wire::decode(payload, ctx.max_payload())?;
    if c.tokens == 0 {
        return Err(Refusal::NoTokens);
    }
    if c.tokens > ctx.max_tokens {
        return Err(Refusal::TooManyTokens {
            got: c.tokens,
            max: ctx.max_tokens,
        });
    }
    if c.expected == 0 || c.expected > MAX_EXPECTED {
        return Err(Refusal::BadExpected(c.expected));
    }
    if c.delta.codec != ctx.codec {
        return Err(Refusal::WrongCodec {
            got: c.delta.codec,
            expected: ctx.codec,
        });
    }
    let delta = delta::decode_shaped(&c.delta, ctx.num_params, ctx.shapes)?;
    Ok(Accepted {
        sender: env.header.sender,
        digest: env.digest(),
        tokens: c.tokens,
        train_loss: c.train_loss,
        delta,
        expected: c.expected,
    })
}

/// This node's pseudo-gradient for the wire: Δ = θ(r) − θ_local plus the error-feedback residual,
/// encoded with `codec` (`shapes`: the parameter shapes, for the low-rank codec). Returns the
/// encoding and the decoded values — what every peer will average, so the node averages
/// exactly that too — and updates `ef` with what was lost.
///
/// # Errors
/// When Δ does not survive its own codec (non-finite values from diverged training).
pub fn encode_delta(
    base: &[f32],
    local: &[f32],
    codec: DeltaCodec,
    shapes: &[Vec<usize>],
    ef: &mut ErrorFeedback,
) -> Result<(EncodedDelta, Vec<f32>), DeltaError> {
    let d = compensated_delta(base, local, ef)?;
    let enc = delta::encode_shaped(codec, &d, shapes, &mut ef.subspaces);
    let sent = delta::decode_shaped(&enc, d.len(), shapes)?;
    ef.record(&d, &sent);
    Ok((enc, sent))
}

/// Δ = θ(r) − θ_local plus the error-feedback residual, as it is encoded for the wire.
///
/// # Errors
/// A non-finite value (diverged training), checked here for every codec: blockwise int4/int8
/// would quietly quantise a NaN to 0.
pub fn compensated_delta(
    base: &[f32],
    local: &[f32],
    ef: &mut ErrorFeedback,
) -> Result<Vec<f32>, DeltaError> {
    let mut d: Vec<f32> = base.iter().zip(local).map(|(a, b)| a - b).collect();
    ef.compensate(&mut d);
    if let Some(i) = d.iter().position(|v| !v.is_finite()) {
        return Err(DeltaError::NonFinite(i));
    }
    Ok(d)
}

/// The token-weighted mean of the accepted deltas, in sender order (the same on every node).
pub fn aggregate(accepted: &BTreeMap<[u8; 32], Accepted>) -> Option<Vec<f32>> {
    aggregate_with(accepted, Aggregator::Mean)
}

/// The accepted deltas combined by `aggregator`, weighted by tokens, in sender order.
pub fn aggregate_with(
    accepted: &BTreeMap<[u8; 32], Accepted>,
    aggregator: Aggregator,
) -> Option<Vec<f32>> {
    let parts: Vec<WeightedDelta<'_>> = accepted
        .values()
        .map(|a| WeightedDelta {
            delta: &a.delta,
            weight: a.tokens as f64,
        })
        .collect();
    aggregate_parts(&parts, aggregator)
}

/// `parts` combined by `aggregator`, in the given order.
pub fn aggregate_parts(parts: &[WeightedDelta<'_>], aggregator: Aggregator) -> Option<Vec<f32>> {
    match aggregator {
        Aggregator::Mean => weighted_average(parts),
        Aggregator::CenteredClip { clip_mult, iters } => {
            centered_clip(parts, clip_mult as f64, iters)
        }
    }
}

/// The sums of the round's noise ratio over `deltas`: of the norm-bounded deltas with a robust
/// aggregator, so an oversized contribution cannot inflate it.
pub fn round_noise_sums(deltas: &[&[f32]], aggregator: Aggregator) -> Option<NoiseSums> {
    if aggregator.is_robust() {
        let bounded = bound_norms(deltas);
        noise_sums(&bounded.iter().map(Vec::as_slice).collect::<Vec<_>>())
    } else {
        noise_sums(deltas)
    }
}

/// A round's outer-step input: the token-weighted mean of what arrived, scaled down when fewer
/// contributions arrived than the round planned for.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundStep {
    /// What the outer optimizer steps with.
    pub delta: Vec<f32>,
    /// The factor the mean was scaled by (1 for a full round).
    pub scale: f32,
    /// Contributions the round planned for: the median (the upper one of an even count) of
    /// what the contributions expected, so a minority cannot move it.
    pub planned: u32,
    /// The running noise ratio after this round (the next state's).
    pub noise: Option<f64>,
}

/// The outer step's input for the contributions of one round, given the state's running noise
/// ratio and the swarm's aggregator. A round of `n` contributions against `planned` is scaled by
/// [`partial_round_scale`]`(r, planned, n)`: the shrinkage that minimises the expected error of
/// a mean of `n` noisy deltas relative to a full round's, so a full round is unchanged and a
/// round of one is trusted least. With a robust aggregator the noise ratio is measured on the
/// norm-bounded deltas, so an oversized contribution cannot inflate it. Every node computes it
/// from the same contributions in the same order, so every node takes the same step. `None`
/// when nothing arrived.
pub fn round_step(
    accepted: &BTreeMap<[u8; 32], Accepted>,
    noise: Option<f64>,
    aggregator: Aggregator,
) -> Option<RoundStep> {
    let delta = aggregate_with(accepted, aggregator)?;
    let deltas: Vec<&[f32]> = accepted.values().map(|a| a.delta.as_slice()).collect();
    let sums = round_noise_sums(&deltas, aggregator);
    let noise = update_noise_with(noise, sums.and_then(|s| noise_ratio_of(&[s])));
    let expected: Vec<u32> = accepted.values().map(|a| a.expected).collect();
    Some(scaled_step(delta, noise, &expected))
}

/// The round's step from its aggregate `delta`, the running noise ratio after the round, and
/// what each counted contribution expected: scaled down when fewer arrived than the round
/// planned for (the median of `expected`). `expected` must not be empty.
pub(super) fn scaled_step(mut delta: Vec<f32>, noise: Option<f64>, expected: &[u32]) -> RoundStep {
    let mut wants: Vec<u32> = expected
        .iter()
        .map(|e| (*e).clamp(1, MAX_EXPECTED))
        .collect();
    wants.sort_unstable();
    let planned = wants[wants.len() / 2];
    let scale = partial_round_scale(noise.unwrap_or(0.0), planned as f64, expected.len() as f64);
    if scale < 1.0 {
        delta.iter_mut().for_each(|v| *v *= scale);
    }
    RoundStep {
        delta,
        scale,
        planned,
        noise,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::SigningKey;
    use nightshift_model::update_noise;
    use nightshift_protocol::signed::EnvelopeHeader;

    const N: usize = 64;

    fn key(i: u8) -> SigningKey {
        SigningKey::from_bytes(&[i; 32])
    }

    fn ctx(allow: &[[u8; 32]]) -> RoundContext<'_> {
        RoundContext {
            swarm_id: Hash32::of(&[b"swarm"]),
            round: 5,
            base_hash: Hash32::of(&[b"theta5"]),
            allowlist: Some(allow),
            num_params: N,
            shapes: &[],
            codec: DeltaCodec::Fp32,
            max_tokens: 10_000,
        }
    }

    fn contribution(
        k: &SigningKey,
        round: u64,
        base: Hash32,
        delta: EncodedDelta,
        tokens: u64,
    ) -> SignedEnvelope {
        expecting(k, round, base, delta, tokens, 3)
    }

    fn expecting(
        k: &SigningKey,
        round: u64,
        base: Hash32,
        delta: EncodedDelta,
        tokens: u64,
        expected: u32,
    ) -> SignedEnvelope {
        let c = Contribution {
            tokens,
            inner_steps: 10,
            train_loss: 2.0,
            delta,
            expected,
        };
        let h = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: Hash32::of(&[b"swarm"]),
            round,
            sender: [0; 32],
            base_hash: base,
        };
        SignedEnvelope::sign(k, h, wire::encode(&c))
    }

    fn good(i: u8, tokens: u64) -> SignedEnvelope {
        let d: Vec<f32> = (0..N).map(|j| (j as f32 + i as f32) * 1e-3).collect();
        contribution(
            &key(i),
            5,
            Hash32::of(&[b"theta5"]),
            delta::encode(DeltaCodec::Fp32, &d),
            tokens,
        )
    }

    #[test]
    fn bad_contributions_are_refused_and_leave_the_result_unchanged() {
        let allow: Vec<[u8; 32]> = (1..=3).map(|i| key(i).verifying_key().to_bytes()).collect();
        let ctx = ctx(&allow);
        let honest = [good(1, 1000), good(2, 3000)];
        let mut clean = BTreeMap::new();
        for e in &honest {
            let a = accept(&ctx, e).unwrap();
            clean.insert(a.sender, a);
        }
        let expected = aggregate(&clean).unwrap();

        let mut unsigned = good(3, 1000);
        unsigned.signature.clear();
        let outsider = {
            let d = vec![0.5f32; N];
            contribution(
                &key(9),
                5,
                ctx.base_hash,
                delta::encode(DeltaCodec::Fp32, &d),
                1000,
            )
        };
        let mut tampered = good(3, 1000);
        let last = tampered.payload.len() - 1;
        tampered.payload[last] ^= 0x55;
        let stale = contribution(
            &key(3),
            4,
            ctx.base_hash,
            delta::encode(DeltaCodec::Fp32, &[0.1; N]),
            1000,
        );
        let wrong_base = contribution(
            &key(3),
            5,
            Hash32::of(&[b"theta4"]),
            delta::encode(DeltaCodec::Fp32, &[0.1; N]),
            1000,
        );
        let wrong_len = contribution(
            &key(3),
            5,
            ctx.base_hash,
            delta::encode(DeltaCodec::Fp32, &[0.1; N + 1]),
            1000,
        );
        let mut nan = vec![0.1f32; N];
        nan[7] = f32::NAN;
        let nan = contribution(
            &key(3),
            5,
            ctx.base_hash,
            delta::encode(DeltaCodec::Fp32, &nan),
            1000,
        );
        let mut inf = vec![0.1f32; N];
        inf[0] = f32::NEG_INFINITY;
        let inf = contribution(
            &key(3),
            5,
            ctx.base_hash,
            delta::encode(DeltaCodec::Fp32, &inf),
            1000,
        );
        let other_codec = contribution(
            &key(3),
            5,
            ctx.base_hash,
            delta::encode(DeltaCodec::Int8 { block: 8 }, &[0.1; N]),
            1000,
        );
        let greedy = contribution(
            &key(3),
            5,
            ctx.base_hash,
            delta::encode(DeltaCodec::Fp32, &[0.1; N]),
            1 << 40,
        );
        let hopeless = |expected| {
            expecting(
                &key(3),
                5,
                ctx.base_hash,
                delta::encode(DeltaCodec::Fp32, &[0.1; N]),
                1000,
                expected,
            )
        };

        let cases = [
            ("expects nobody", hopeless(0), "expects 0 contributions"),
            (
                "expects a crowd",
                hopeless(MAX_EXPECTED + 1),
                "expects 4097",
            ),
            ("unsigned", unsigned, "unsigned"),
            ("outsider", outsider, "not a member"),
            ("tampered", tampered, "does not verify"),
            ("stale", stale, "round 4"),
            ("wrong base", wrong_base, "based on state"),
            ("wrong length", wrong_len, "values, the model has"),
            ("nan", nan, "non-finite"),
            ("inf", inf, "non-finite"),
            ("other codec", other_codec, "the swarm uses fp32"),
            ("greedy", greedy, "tokens"),
        ];
        // Every bad contribution goes through the same path as a good one: what `accept`
        // returns (nothing, for these) joins the round.
        let mut all = clean.clone();
        for (name, env, why) in cases {
            let outcome = accept(&ctx, &env);
            match &outcome {
                Err(e) => assert!(e.to_string().contains(why), "{name}: {e}"),
                Ok(_) => panic!("{name} was accepted"),
            }
            all.extend(outcome.ok().map(|a| (a.sender, a)));
        }
        // The round's result is the honest-only one, bit for bit, under every aggregator.
        assert_eq!(all.len(), 2);
        assert_eq!(aggregate(&all).unwrap(), expected);
        for agg in [Aggregator::Mean, Aggregator::ROBUST] {
            assert_eq!(
                round_step(&all, Some(1.0), agg),
                round_step(&clean, Some(1.0), agg)
            );
        }
    }

    fn round_of(deltas: &[(&[f32], u32)]) -> BTreeMap<[u8; 32], Accepted> {
        deltas
            .iter()
            .enumerate()
            .map(|(i, (d, expected))| {
                let sender = [i as u8; 32];
                let a = Accepted {
                    sender,
                    digest: Hash32::default(),
                    tokens: 1000,
                    train_loss: 0.0,
                    delta: d.to_vec(),
                    expected: *expected,
                };
                (sender, a)
            })
            .collect()
    }

    #[test]
    fn a_short_round_steps_less_and_a_full_one_as_before() {
        let (a, b, c) = ([2.0f32, 0.5, 0.0], [2.0f32, -0.5, 0.1], [1.8f32, 0.0, -0.1]);
        // A full round: the plain mean, the noise ratio learnt from it.
        let full = round_of(&[(&a, 3), (&b, 3), (&c, 3)]);
        let step = round_step(&full, Some(2.0), Aggregator::Mean).unwrap();
        assert_eq!((step.scale, step.planned), (1.0, 3));
        assert_eq!(step.delta, aggregate(&full).unwrap());
        let deltas: Vec<&[f32]> = vec![&a, &b, &c];
        assert_eq!(step.noise, update_noise(Some(2.0), &deltas));
        // Two of the three planned: shrunk by (1 + r/3) / (1 + r/2) with the updated r.
        let short = round_of(&[(&a, 3), (&b, 3)]);
        let step = round_step(&short, Some(2.0), Aggregator::Mean).unwrap();
        let r = update_noise(Some(2.0), &[&a, &b]).unwrap();
        let want = ((1.0 + r / 3.0) / (1.0 + r / 2.0)) as f32;
        assert!(
            step.scale < 1.0 && (step.scale - want).abs() < 1e-6,
            "{step:?}"
        );
        let mean = aggregate(&short).unwrap();
        for (x, m) in step.delta.iter().zip(&mean) {
            assert!((x - m * want).abs() < 1e-6);
        }
        // One alone: no spread to learn from, the state's r sizes the step.
        let alone = round_of(&[(&c, 3)]);
        let step = round_step(&alone, Some(2.0), Aggregator::Mean).unwrap();
        assert_eq!(step.noise, Some(2.0));
        assert!((step.scale - (1.0 + 2.0 / 3.0) / 3.0).abs() < 1e-6);
        // Before any round could tell the noise, nothing is shrunk.
        assert_eq!(
            round_step(&alone, None, Aggregator::Mean).unwrap().scale,
            1.0
        );
        // One contribution claiming a crowd does not shrink the round of the others.
        let liar = round_of(&[(&a, 3), (&b, 3), (&c, MAX_EXPECTED)]);
        let step = round_step(&liar, Some(2.0), Aggregator::Mean).unwrap();
        assert_eq!((step.scale, step.planned), (1.0, 3));
        assert!(round_step(&BTreeMap::new(), Some(2.0), Aggregator::Mean).is_none());
    }

    /// Through the node's own encoding path, with every lossy codec (the low-rank one with real
    /// shapes): what was sent over the rounds plus the residual is what was trained.
    #[test]
    fn error_feedback_through_the_codecs_loses_nothing() {
        let shapes = vec![vec![16, 24], vec![8]];
        let n = 16 * 24 + 8;
        for codec in [
            DeltaCodec::Int4 { block: 32 },
            DeltaCodec::TopK { permille: 50 },
            DeltaCodec::LowRank { rank: 3, block: 32 },
        ] {
            let mut ef = ErrorFeedback::default();
            let (mut sent_sum, mut truth) = (vec![0f64; n], vec![0f64; n]);
            let base = vec![0f32; n];
            for r in 0..12 {
                let local: Vec<f32> = (0..n)
                    .map(|i| ((r * n + i) as f32 * 0.37).sin() * 0.01)
                    .collect();
                let (_, sent) = encode_delta(&base, &local, codec, &shapes, &mut ef).unwrap();
                truth
                    .iter_mut()
                    .zip(&local)
                    .for_each(|(t, x)| *t -= *x as f64);
                sent_sum
                    .iter_mut()
                    .zip(&sent)
                    .for_each(|(s, x)| *s += *x as f64);
            }
            for i in 0..n {
                let back = sent_sum[i] + ef.residual[i] as f64;
                assert!(
                    (back - truth[i]).abs() < 1e-5,
                    "{codec} index {i}: {back} vs {}",
                    truth[i]
                );
            }
            assert!(
                sent_sum.iter().any(|s| s.abs() > 1e-4),
                "{codec} sent something"
            );
        }
    }

    /// A diverged worker's NaN is refused before encoding under every codec (int4 would
    /// otherwise send it as 0), and its error feedback is left as it was.
    #[test]
    fn a_non_finite_delta_is_refused_by_every_codec() {
        let shapes = vec![vec![16, 24], vec![8]];
        let n = 16 * 24 + 8;
        let base = vec![0f32; n];
        for codec in [
            DeltaCodec::Fp32,
            DeltaCodec::Int8 { block: 64 },
            DeltaCodec::Int4 { block: 32 },
            DeltaCodec::TopK { permille: 50 },
            DeltaCodec::LowRank { rank: 3, block: 32 },
        ] {
            let mut ef = ErrorFeedback::default();
            let fine: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin() * 0.01).collect();
            encode_delta(&base, &fine, codec, &shapes, &mut ef).unwrap();
            let before = ef.residual.clone();
            let mut bad = fine.clone();
            bad[17] = f32::NAN;
            let err = encode_delta(&base, &bad, codec, &shapes, &mut ef).unwrap_err();
            assert_eq!(err, DeltaError::NonFinite(17), "{codec}");
            assert_eq!(ef.residual, before, "{codec}: residual untouched");
        }
    }

    #[test]
    fn aggregation_weights_by_tokens_in_sender_order() {
        let allow: Vec<[u8; 32]> = (1..=2).map(|i| key(i).verifying_key().to_bytes()).collect();
        let ctx = ctx(&allow);
        let mut m = BTreeMap::new();
        for e in [good(2, 3000), good(1, 1000)] {
            let a = accept(&ctx, &e).unwrap();
            m.insert(a.sender, a);
        }
        let avg = aggregate(&m).unwrap();
        // (j+1)e-3 * 0.25 + (j+2)e-3 * 0.75 = (j + 1.75)e-3
        for (j, v) in avg.iter().enumerate() {
            assert!((v - (j as f32 + 1.75) * 1e-3).abs() < 1e-6);
        }
    }
}
