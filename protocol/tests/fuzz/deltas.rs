//! Delta seeds from the crate's own encoders, the codecs under test and the delta mutator.

use nightshift_protocol::delta::{self, MAX_BLOCK, MAX_RANK};
use nightshift_protocol::{DeltaCodec, EncodedDelta};

use crate::mutator::{Rng, mutate};

/// The receiver's model for every codec but low-rank: a 16×24 matrix and a bias.
fn shapes() -> Vec<Vec<usize>> {
    vec![vec![16, 24], vec![8]]
}
pub(crate) const N: usize = 16 * 24 + 8;

/// The receiver's model for the low-rank codec: two matrices and a bias.
fn lowrank_shapes() -> Vec<Vec<usize>> {
    vec![vec![16, 24], vec![8], vec![24, 8]]
}
const N_LOWRANK: usize = 16 * 24 + 8 + 24 * 8;

pub(crate) fn model_for(codec: DeltaCodec) -> (usize, Vec<Vec<usize>>) {
    match codec {
        DeltaCodec::LowRank { .. } => (N_LOWRANK, lowrank_shapes()),
        _ => (N, shapes()),
    }
}

/// A delta of `n` values of one of a few kinds.
fn delta_values(rng: &mut Rng, n: usize, kind: usize) -> Vec<f32> {
    match kind % 5 {
        0 => (0..n).map(|_| rng.normalish() * 1e-3).collect(),
        1 => vec![0.0; n],
        2 => (0..n)
            .map(|i| {
                if i % 97 == 5 {
                    rng.normalish() * 10.0
                } else {
                    rng.normalish() * 1e-5
                }
            })
            .collect(),
        3 => (0..n)
            .map(|k| {
                let (i, j) = ((k / 24) as f32, (k % 24) as f32);
                ((i * 0.3).sin() * (j * 0.2).cos() + 0.3 * (i * 0.1).cos()) * 1e-2
            })
            .collect(),
        _ => (0..n)
            .map(|_| [-6e4f32, 6e4, 1e-8, -1e-8][rng.below(4)])
            .collect(),
    }
}

/// An encoded delta with its uncompressed codec body.
#[derive(Clone)]
pub(crate) struct DeltaSeed {
    pub(crate) enc: EncodedDelta,
    pub(crate) raw: Vec<u8>,
}

pub(crate) fn delta_seeds(codecs: &[DeltaCodec]) -> Vec<DeltaSeed> {
    let mut rng = Rng(0xde17a);
    let mut out = Vec::new();
    for &codec in codecs {
        let (n, shapes) = model_for(codec);
        for kind in 0..5 {
            let v = delta_values(&mut rng, n, kind);
            let enc = delta::encode_shaped(codec, &v, &shapes, &mut Vec::new());
            let size = delta::raw_body_size_shaped(codec, n, &shapes);
            let raw = zstd::bulk::decompress(&enc.body, size).expect("our own body decompresses");
            assert!(delta::decode_shaped(&enc, n, &shapes).is_ok() || kind == 4);
            out.push(DeltaSeed { enc, raw });
        }
    }
    out
}

pub(crate) const FP32: [DeltaCodec; 1] = [DeltaCodec::Fp32];
pub(crate) const FP16: [DeltaCodec; 1] = [DeltaCodec::Fp16];
pub(crate) const INT8: [DeltaCodec; 5] = [
    DeltaCodec::Int8 { block: 64 },
    DeltaCodec::Int8 { block: 7 },
    DeltaCodec::Int8 { block: 1 },
    DeltaCodec::Int8 { block: N as u32 },
    DeltaCodec::Int8 { block: MAX_BLOCK },
];
pub(crate) const INT4: [DeltaCodec; 5] = [
    DeltaCodec::Int4 { block: 64 },
    DeltaCodec::Int4 { block: 32 },
    DeltaCodec::Int4 { block: 1 },
    DeltaCodec::Int4 { block: 3 },
    DeltaCodec::Int4 { block: MAX_BLOCK },
];
pub(crate) const TOPK: [DeltaCodec; 4] = [
    DeltaCodec::TopK { permille: 30 },
    DeltaCodec::TopK { permille: 1 },
    DeltaCodec::TopK { permille: 500 },
    DeltaCodec::TopK { permille: 1000 },
];
pub(crate) const LOWRANK: [DeltaCodec; 6] = [
    DeltaCodec::LowRank { rank: 4, block: 32 },
    DeltaCodec::LowRank { rank: 1, block: 16 },
    // Rank 9 still factors the 16×24 matrix, not the 24×8 one; rank 10 factors neither.
    DeltaCodec::LowRank { rank: 9, block: 64 },
    DeltaCodec::LowRank {
        rank: 10,
        block: 256,
    },
    DeltaCodec::LowRank { rank: 2, block: 1 },
    DeltaCodec::LowRank {
        rank: MAX_RANK,
        block: MAX_BLOCK,
    },
];

/// Another codec of the same family with parameters at or beyond their bounds (or, rarely,
/// another family: a body read as the wrong codec).
pub(crate) fn mutate_codec(rng: &mut Rng, c: DeltaCodec) -> DeltaCodec {
    let b32 = [
        0,
        1,
        2,
        7,
        64,
        N as u32,
        MAX_BLOCK,
        MAX_BLOCK + 1,
        u32::MAX,
        rng.next() as u32,
    ];
    let b16 = [
        0,
        1,
        2,
        4,
        9,
        10,
        999,
        1000,
        1001,
        MAX_RANK,
        MAX_RANK + 1,
        u16::MAX,
        rng.next() as u16,
    ];
    if rng.chance(10) {
        let all = [FP32[0], FP16[0], INT8[0], INT4[0], TOPK[0], LOWRANK[0]];
        return *rng.pick(&all);
    }
    match c {
        DeltaCodec::Fp32 | DeltaCodec::Fp16 => c,
        DeltaCodec::Int8 { .. } => DeltaCodec::Int8 {
            block: *rng.pick(&b32),
        },
        DeltaCodec::Int4 { .. } => DeltaCodec::Int4 {
            block: *rng.pick(&b32),
        },
        DeltaCodec::TopK { .. } => DeltaCodec::TopK {
            permille: *rng.pick(&b16),
        },
        DeltaCodec::LowRank { rank, block } => match rng.below(3) {
            0 => DeltaCodec::LowRank {
                rank: *rng.pick(&b16),
                block,
            },
            1 => DeltaCodec::LowRank {
                rank,
                block: *rng.pick(&b32),
            },
            _ => DeltaCodec::LowRank {
                rank: *rng.pick(&b16),
                block: *rng.pick(&b32),
            },
        },
    }
}

/// A delta derived from `seed`: its compressed body mutated, or its raw body mutated and
/// compressed again (which reaches the codec's own checks), sometimes with another length or
/// codec parameters.
pub(crate) fn mutated_delta(rng: &mut Rng, seed: &DeltaSeed, pool: &[Vec<u8>]) -> EncodedDelta {
    let mut enc = seed.enc.clone();
    match rng.below(100) {
        0..=7 => {}
        8..=42 => mutate(rng, &mut enc.body, pool),
        43..=84 => {
            let mut raw = seed.raw.clone();
            if rng.chance(15) {
                // Right size, random content: NaN scales, indices out of order.
                raw = rng.bytes(raw.len());
            } else {
                mutate(rng, &mut raw, &[]);
            }
            enc.body = zstd::bulk::compress(&raw, 1).expect("compressing in memory");
        }
        85..=89 => {
            let n = rng.below(200);
            enc.body = rng.bytes(n);
        }
        _ => {
            // A valid zstd frame of some other size.
            let n = rng.below(2 * seed.raw.len() + 16);
            enc.body = zstd::bulk::compress(&rng.bytes(n), 1).expect("compressing in memory");
        }
    }
    if rng.chance(5) {
        let (n, r) = (enc.len, rng.next() as u32);
        enc.len = *rng.pick(&[0, 1, n.wrapping_sub(1), n + 1, 2 * n, u32::MAX, r]);
    }
    if rng.chance(8) {
        enc.codec = mutate_codec(rng, enc.codec);
    }
    enc
}
