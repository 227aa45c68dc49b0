//! Pseudo-gradient codecs: quantize or sparsify, then zstd.
//!
//! Every codec turns a `&[f32]` of length `n` into an [`EncodedDelta`] and back. Lossy codecs are
//! meant to be used with error feedback (the node keeps `delta - decode(encode(delta))` and adds it
//! to its next delta); see `nightshift_model::outer::ErrorFeedback`.
//!
//! Decoding checks the declared length against the length the receiver expects, bounds the
//! decompressed size before decompressing, and refuses NaN/Inf in the result.

use half::f16;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

use crate::MAX_PARAMS;

/// zstd level used for every codec (3 is zstd's default: fast, and most of the gain).
pub const ZSTD_LEVEL: i32 = 3;
/// Largest quantization block accepted from a peer.
pub const MAX_BLOCK: u32 = 1 << 16;

/// How a delta is represented on the wire (before zstd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeltaCodec {
    /// Raw little-endian f32.
    Fp32,
    /// IEEE half precision.
    Fp16,
    /// Blockwise symmetric int8: one f32 scale per `block` values.
    Int8 { block: u32 },
    /// Blockwise symmetric int4 (values −7..=7), two per byte: one f32 scale per `block` values.
    Int4 { block: u32 },
    /// The `permille`/1000 largest-magnitude values (at least one) as (u32 index, f16 value).
    TopK { permille: u16 },
}

impl Default for DeltaCodec {
    fn default() -> Self {
        DeltaCodec::Int4 { block: 64 }
    }
}

impl fmt::Display for DeltaCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeltaCodec::Fp32 => f.write_str("fp32"),
            DeltaCodec::Fp16 => f.write_str("fp16"),
            DeltaCodec::Int8 { block } => write!(f, "int8:{block}"),
            DeltaCodec::Int4 { block } => write!(f, "int4:{block}"),
            DeltaCodec::TopK { permille } => write!(f, "topk:{permille}"),
        }
    }
}

impl FromStr for DeltaCodec {
    type Err = String;

    /// Parses `fp32`, `fp16`, `int8[:BLOCK]`, `int4[:BLOCK]` or `topk[:PERMILLE]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let num = |default: u32, max: u32| -> Result<u32, String> {
            let v = match arg {
                None => default,
                Some(a) => a
                    .parse::<u32>()
                    .map_err(|_| format!("bad number {a:?} in codec {s:?}"))?,
            };
            if v == 0 || v > max {
                return Err(format!(
                    "codec parameter {v} out of range 1..={max} in {s:?}"
                ));
            }
            Ok(v)
        };
        let codec = match name.to_ascii_lowercase().as_str() {
            "fp32" | "f32" => DeltaCodec::Fp32,
            "fp16" | "f16" => DeltaCodec::Fp16,
            "int8" => DeltaCodec::Int8 {
                block: num(64, MAX_BLOCK)?,
            },
            "int4" => DeltaCodec::Int4 {
                block: num(64, MAX_BLOCK)?,
            },
            "topk" => DeltaCodec::TopK {
                permille: num(30, 1000)? as u16,
            },
            _ => {
                return Err(format!(
                    "unknown codec {s:?}: expected fp32, fp16, int8[:block], int4[:block] or topk[:permille]"
                ));
            }
        };
        if arg.is_some() && matches!(codec, DeltaCodec::Fp32 | DeltaCodec::Fp16) {
            return Err(format!("codec {name} takes no parameter"));
        }
        Ok(codec)
    }
}

/// A compressed delta as it travels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EncodedDelta {
    pub codec: DeltaCodec,
    /// Number of f32 values the delta decodes to.
    pub len: u32,
    /// zstd-compressed codec body.
    pub body: Vec<u8>,
}

/// Why a delta could not be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DeltaError {
    #[error("delta has {got} values, the model has {expected}")]
    WrongLength { got: usize, expected: usize },
    #[error("delta of {0} values exceeds the limit")]
    TooLarge(usize),
    #[error("invalid codec parameter: {0}")]
    BadParameter(String),
    #[error("zstd: {0}")]
    Decompress(String),
    #[error("decompressed body is {got} bytes, expected {expected}")]
    WrongBodySize { got: usize, expected: usize },
    #[error("delta holds a non-finite value at index {0}")]
    NonFinite(usize),
    #[error("sparse index {0} out of range or not increasing")]
    BadIndex(u32),
}

fn n_blocks(len: usize, block: u32) -> usize {
    len.div_ceil(block as usize)
}

/// Number of values the top-k codec keeps for a delta of `len` values.
pub fn topk_count(len: usize, permille: u16) -> usize {
    if len == 0 {
        return 0;
    }
    ((len as u64 * permille as u64).div_ceil(1000) as usize).clamp(1, len)
}

fn check_params(codec: DeltaCodec, len: usize) -> Result<(), DeltaError> {
    if len > MAX_PARAMS {
        return Err(DeltaError::TooLarge(len));
    }
    match codec {
        DeltaCodec::Int8 { block } | DeltaCodec::Int4 { block }
            if block == 0 || block > MAX_BLOCK =>
        {
            Err(DeltaError::BadParameter(format!("block {block}")))
        }
        DeltaCodec::TopK { permille } if permille == 0 || permille > 1000 => {
            Err(DeltaError::BadParameter(format!("permille {permille}")))
        }
        _ => Ok(()),
    }
}

/// Exact size of the uncompressed codec body for `len` values.
pub fn raw_body_size(codec: DeltaCodec, len: usize) -> usize {
    match codec {
        DeltaCodec::Fp32 => len * 4,
        DeltaCodec::Fp16 => len * 2,
        DeltaCodec::Int8 { block } => n_blocks(len, block) * 4 + len,
        DeltaCodec::Int4 { block } => n_blocks(len, block) * 4 + len.div_ceil(2),
        DeltaCodec::TopK { permille } => topk_count(len, permille) * 6,
    }
}

fn block_scales(values: &[f32], block: u32, qmax: f32) -> Vec<f32> {
    values
        .chunks(block as usize)
        .map(|c| c.iter().fold(0f32, |m, v| m.max(v.abs())) / qmax)
        .collect()
}

fn quantize(v: f32, scale: f32, qmax: f32) -> i8 {
    if scale == 0.0 {
        0
    } else {
        (v / scale).round().clamp(-qmax, qmax) as i8
    }
}

/// Encodes `values` (expected finite) with `codec`, then zstd.
pub fn encode(codec: DeltaCodec, values: &[f32]) -> EncodedDelta {
    let mut raw = Vec::with_capacity(raw_body_size(codec, values.len()));
    match codec {
        DeltaCodec::Fp32 => values
            .iter()
            .for_each(|v| raw.extend_from_slice(&v.to_le_bytes())),
        DeltaCodec::Fp16 => values
            .iter()
            .for_each(|v| raw.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        DeltaCodec::Int8 { block } => {
            let scales = block_scales(values, block, 127.0);
            scales
                .iter()
                .for_each(|s| raw.extend_from_slice(&s.to_le_bytes()));
            for (chunk, s) in values.chunks(block as usize).zip(&scales) {
                raw.extend(chunk.iter().map(|v| quantize(*v, *s, 127.0) as u8));
            }
        }
        DeltaCodec::Int4 { block } => {
            let scales = block_scales(values, block, 7.0);
            scales
                .iter()
                .for_each(|s| raw.extend_from_slice(&s.to_le_bytes()));
            let mut nibbles = Vec::with_capacity(values.len());
            for (chunk, s) in values.chunks(block as usize).zip(&scales) {
                nibbles.extend(chunk.iter().map(|v| (quantize(*v, *s, 7.0) + 8) as u8));
            }
            for pair in nibbles.chunks(2) {
                raw.push(pair[0] | (pair.get(1).copied().unwrap_or(8) << 4));
            }
        }
        DeltaCodec::TopK { permille } => {
            let k = topk_count(values.len(), permille);
            let mut idx: Vec<u32> = (0..values.len() as u32).collect();
            if k < values.len() {
                idx.select_nth_unstable_by(k, |a, b| {
                    values[*b as usize]
                        .abs()
                        .total_cmp(&values[*a as usize].abs())
                });
                idx.truncate(k);
            }
            idx.sort_unstable();
            idx.iter()
                .for_each(|i| raw.extend_from_slice(&i.to_le_bytes()));
            idx.iter().for_each(|i| {
                raw.extend_from_slice(&f16::from_f32(values[*i as usize]).to_le_bytes())
            });
        }
    }
    // Compressing an in-memory buffer only fails on allocation failure.
    let body = zstd::bulk::compress(&raw, ZSTD_LEVEL).unwrap_or(raw);
    EncodedDelta {
        codec,
        len: values.len() as u32,
        body,
    }
}

/// Decodes `enc`, which must describe exactly `expected_len` values.
///
/// # Errors
/// See [`DeltaError`]; never panics and never allocates more than the expected body size.
pub fn decode(enc: &EncodedDelta, expected_len: usize) -> Result<Vec<f32>, DeltaError> {
    let len = enc.len as usize;
    if len != expected_len {
        return Err(DeltaError::WrongLength {
            got: len,
            expected: expected_len,
        });
    }
    check_params(enc.codec, len)?;
    let expected = raw_body_size(enc.codec, len);
    let raw = zstd::bulk::decompress(&enc.body, expected)
        .map_err(|e| DeltaError::Decompress(e.to_string()))?;
    if raw.len() != expected {
        return Err(DeltaError::WrongBodySize {
            got: raw.len(),
            expected,
        });
    }
    let f32_at = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let out: Vec<f32> = match enc.codec {
        DeltaCodec::Fp32 => raw.chunks_exact(4).map(f32_at).collect(),
        DeltaCodec::Fp16 => raw
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DeltaCodec::Int8 { block } => {
            let nb = n_blocks(len, block);
            let (scales, q) = raw.split_at(nb * 4);
            let scales: Vec<f32> = scales.chunks_exact(4).map(f32_at).collect();
            q.iter()
                .enumerate()
                .map(|(i, b)| (*b as i8) as f32 * scales[i / block as usize])
                .collect()
        }
        DeltaCodec::Int4 { block } => {
            let nb = n_blocks(len, block);
            let (scales, q) = raw.split_at(nb * 4);
            let scales: Vec<f32> = scales.chunks_exact(4).map(f32_at).collect();
            (0..len)
                .map(|i| {
                    let byte = q[i / 2];
                    let nib = if i % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                    (nib as i32 - 8) as f32 * scales[i / block as usize]
                })
                .collect()
        }
        DeltaCodec::TopK { permille } => {
            let k = topk_count(len, permille);
            let (idx, vals) = raw.split_at(k * 4);
            let mut out = vec![0f32; len];
            let mut prev: Option<u32> = None;
            for (ib, vb) in idx.chunks_exact(4).zip(vals.chunks_exact(2)) {
                let i = u32::from_le_bytes([ib[0], ib[1], ib[2], ib[3]]);
                if i as usize >= len || prev.is_some_and(|p| p >= i) {
                    return Err(DeltaError::BadIndex(i));
                }
                prev = Some(i);
                out[i as usize] = f16::from_le_bytes([vb[0], vb[1]]).to_f32();
            }
            out
        }
    };
    if let Some(i) = out.iter().position(|v| !v.is_finite()) {
        return Err(DeltaError::NonFinite(i));
    }
    Ok(out)
}

/// Bytes the same delta would take as raw f32 (the baseline for compression ratios).
pub fn dense_bytes(len: usize) -> usize {
    len * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [DeltaCodec; 6] = [
        DeltaCodec::Fp32,
        DeltaCodec::Fp16,
        DeltaCodec::Int8 { block: 64 },
        DeltaCodec::Int8 { block: 7 },
        DeltaCodec::Int4 { block: 32 },
        DeltaCodec::TopK { permille: 50 },
    ];

    #[test]
    fn codec_names_parse_and_print() {
        for c in ALL {
            assert_eq!(c.to_string().parse::<DeltaCodec>().unwrap(), c);
        }
        assert_eq!(
            "int8".parse::<DeltaCodec>().unwrap(),
            DeltaCodec::Int8 { block: 64 }
        );
        assert!("int8:0".parse::<DeltaCodec>().is_err());
        assert!("fp16:3".parse::<DeltaCodec>().is_err());
        assert!("zip".parse::<DeltaCodec>().is_err());
    }

    #[test]
    fn fp32_is_exact() {
        let v: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 1e-3).collect();
        assert_eq!(decode(&encode(DeltaCodec::Fp32, &v), v.len()).unwrap(), v);
    }

    #[test]
    fn int8_shrinks_a_delta_about_four_times() {
        let v: Vec<f32> = (0..100_000)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-6 - 5e-4)
            .collect();
        let enc = encode(DeltaCodec::Int8 { block: 64 }, &v);
        assert!(
            enc.body.len() * 3 < dense_bytes(v.len()),
            "{} bytes",
            enc.body.len()
        );
    }

    #[test]
    fn refuses_wrong_length_nan_and_oversized_bodies() {
        let v = vec![0.5f32; 100];
        let enc = encode(DeltaCodec::Fp32, &v);
        assert_eq!(
            decode(&enc, 99),
            Err(DeltaError::WrongLength {
                got: 100,
                expected: 99
            })
        );

        let mut nan = v.clone();
        nan[17] = f32::NAN;
        assert_eq!(
            decode(&encode(DeltaCodec::Fp32, &nan), 100),
            Err(DeltaError::NonFinite(17))
        );
        let mut inf = v.clone();
        inf[3] = f32::INFINITY;
        assert_eq!(
            decode(&encode(DeltaCodec::Fp16, &inf), 100),
            Err(DeltaError::NonFinite(3))
        );

        // A body that decompresses to more than the declared length allows.
        let mut lying = encode(DeltaCodec::Fp32, &vec![0.5f32; 200]);
        lying.len = 100;
        assert!(decode(&lying, 100).is_err());

        let bad_block = EncodedDelta {
            codec: DeltaCodec::Int8 { block: 0 },
            ..enc.clone()
        };
        assert!(matches!(
            decode(&bad_block, 100),
            Err(DeltaError::BadParameter(_))
        ));
    }

    #[test]
    fn topk_keeps_the_largest_values() {
        let mut v = vec![0.001f32; 1000];
        v[10] = 5.0;
        v[500] = -4.0;
        let out = decode(&encode(DeltaCodec::TopK { permille: 2 }, &v), 1000).unwrap();
        assert_eq!(out[10], 5.0);
        assert_eq!(out[500], -4.0);
        assert_eq!(out.iter().filter(|x| **x != 0.0).count(), 2);
    }

    proptest! {
        #[test]
        fn every_codec_round_trips_within_its_error_bound(
            v in prop::collection::vec(-1.0f32..1.0, 0..600),
        ) {
            for c in ALL {
                let out = decode(&encode(c, &v), v.len()).unwrap();
                prop_assert_eq!(out.len(), v.len());
                for (i, (a, b)) in v.iter().zip(&out).enumerate() {
                    let bound = match c {
                        DeltaCodec::Fp32 => 0.0,
                        DeltaCodec::Fp16 => a.abs() * 1e-3 + 1e-7,
                        DeltaCodec::Int8 { block } => {
                            let blk = &v[(i / block as usize) * block as usize..];
                            let m = blk.iter().take(block as usize).fold(0f32, |m, x| m.max(x.abs()));
                            m / 127.0 * 0.5 + 1e-6
                        }
                        DeltaCodec::Int4 { block } => {
                            let blk = &v[(i / block as usize) * block as usize..];
                            let m = blk.iter().take(block as usize).fold(0f32, |m, x| m.max(x.abs()));
                            m / 7.0 * 0.5 + 1e-6
                        }
                        // Dropped values err by themselves; kept ones by f16 rounding.
                        DeltaCodec::TopK { .. } => a.abs(),
                    };
                    prop_assert!((a - b).abs() <= bound, "{c}: {a} vs {b} (bound {bound})");
                }
            }
        }

        #[test]
        fn corrupted_bodies_never_panic(
            v in prop::collection::vec(-1.0f32..1.0, 1..300),
            flips in prop::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            cut in any::<usize>(),
        ) {
            for c in ALL {
                let mut enc = encode(c, &v);
                for (pos, x) in &flips {
                    if !enc.body.is_empty() {
                        let n = enc.body.len();
                        enc.body[pos % n] ^= x;
                    }
                }
                let _ = decode(&enc, v.len());
                enc.body.truncate(cut % (enc.body.len() + 1));
                let _ = decode(&enc, v.len());
            }
        }
    }
}
