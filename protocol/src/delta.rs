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
    /// Every weight matrix (`rows × cols` with `rank·(rows + cols) < rows·cols`) as rank-`rank`
    /// factors `P·Qᵀ` (randomized subspace iteration, [`crate::lowrank`]), every other tensor
    /// as is; each factor and tensor then as blockwise int4 (one f32 scale per `block` values,
    /// blocks restarting at each piece). Needs the model's tensor shapes on both sides
    /// ([`encode_shaped`], [`decode_shaped`]); without them the delta is one flat tensor.
    LowRank { rank: u16, block: u32 },
}

/// Largest rank [`DeltaCodec::LowRank`] accepts.
pub const MAX_RANK: u16 = 1024;

impl DeltaCodec {
    /// Checks the codec's parameters (block, permille, rank) are within what peers accept.
    ///
    /// # Errors
    /// [`DeltaError::BadParameter`] naming the parameter.
    pub fn validate(self) -> Result<(), DeltaError> {
        check_params(self, 0)
    }
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
            DeltaCodec::LowRank { rank, block } => write!(f, "lowrank:{rank}:{block}"),
        }
    }
}

impl FromStr for DeltaCodec {
    type Err = String;

    /// Parses `fp32`, `fp16`, `int8[:BLOCK]`, `int4[:BLOCK]`, `topk[:PERMILLE]` or
    /// `lowrank[:RANK[:BLOCK]]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        let parse = |arg: Option<&str>, default: u32, max: u32| -> Result<u32, String> {
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
        let num = |default: u32, max: u32| parse(arg, default, max);
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
            "lowrank" => {
                let (rank, block) = match arg.map(|a| a.split_once(':')) {
                    Some(Some((r, b))) => (Some(r), Some(b)),
                    Some(None) => (arg, None),
                    None => (None, None),
                };
                DeltaCodec::LowRank {
                    rank: parse(rank, 23, MAX_RANK as u32)? as u16,
                    block: parse(block, 256, MAX_BLOCK)?,
                }
            }
            _ => {
                return Err(format!(
                    "unknown codec {s:?}: expected fp32, fp16, int8[:block], int4[:block], topk[:permille] or lowrank[:rank[:block]]"
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
        DeltaCodec::LowRank { rank, block }
            if rank == 0 || rank > MAX_RANK || block == 0 || block > MAX_BLOCK =>
        {
            Err(DeltaError::BadParameter(format!(
                "rank {rank}, block {block}"
            )))
        }
        _ => Ok(()),
    }
}

/// How one tensor travels under [`DeltaCodec::LowRank`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Piece {
    /// `n` values as they are.
    Plain(usize),
    /// A `rows × cols` matrix as factors of rank `r`: `P` (`rows × r`) then `Q` (`cols × r`).
    Factored { rows: usize, cols: usize, r: usize },
}

impl Piece {
    /// Lengths of the parts it is sent as.
    fn parts(self) -> [usize; 2] {
        match self {
            Piece::Plain(n) => [n, 0],
            Piece::Factored { rows, cols, r } => [rows * r, cols * r],
        }
    }
}

/// The pieces of a delta of `len` values whose tensors have `shapes` (in flat order), under
/// rank `rank`. Shapes that do not add up to `len` (or none) make the delta one flat tensor.
/// A matrix is factored only when its factors are smaller than it, so the pieces never hold
/// more values than `len`.
fn pieces(shapes: &[Vec<usize>], len: usize, rank: usize) -> Vec<Piece> {
    let total = shapes.iter().try_fold(0usize, |acc, s| {
        s.iter()
            .try_fold(1usize, |p, d| p.checked_mul(*d))
            .and_then(|n| acc.checked_add(n))
    });
    if shapes.is_empty() || total != Some(len) {
        return vec![Piece::Plain(len)];
    }
    shapes
        .iter()
        .map(|s| match s[..] {
            [rows, cols]
                if rank
                    .checked_mul(rows + cols)
                    .is_some_and(|f| f < rows * cols) =>
            {
                Piece::Factored {
                    rows,
                    cols,
                    r: rank.min(rows).min(cols),
                }
            }
            _ => Piece::Plain(s.iter().product()),
        })
        .collect()
}

fn int4_size(len: usize, block: u32) -> usize {
    n_blocks(len, block) * 4 + len.div_ceil(2)
}

/// Exact size of the uncompressed codec body for `len` values (a low-rank codec: as one flat
/// tensor; see [`raw_body_size_shaped`]).
pub fn raw_body_size(codec: DeltaCodec, len: usize) -> usize {
    raw_body_size_shaped(codec, len, &[])
}

/// Exact size of the uncompressed codec body for `len` values in tensors of `shapes`.
pub fn raw_body_size_shaped(codec: DeltaCodec, len: usize, shapes: &[Vec<usize>]) -> usize {
    match codec {
        DeltaCodec::Fp32 => len * 4,
        DeltaCodec::Fp16 => len * 2,
        DeltaCodec::Int8 { block } => n_blocks(len, block) * 4 + len,
        DeltaCodec::Int4 { block } => int4_size(len, block),
        DeltaCodec::TopK { permille } => topk_count(len, permille) * 6,
        DeltaCodec::LowRank { rank, block } => pieces(shapes, len, rank as usize)
            .iter()
            .flat_map(|p| p.parts())
            .filter(|n| *n > 0)
            .map(|n| int4_size(n, block))
            .sum(),
    }
}

/// Appends `values` as blockwise int4: the f32 scales, then two values per byte.
fn int4_into(raw: &mut Vec<u8>, values: &[f32], block: u32) {
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

/// Reads `len` blockwise int4 values from the front of `raw` (which holds at least
/// [`int4_size`] bytes) and returns them with the rest of `raw`.
fn int4_from(raw: &[u8], len: usize, block: u32) -> (Vec<f32>, &[u8]) {
    let nb = n_blocks(len, block);
    let (scales, rest) = raw.split_at(nb * 4);
    let (q, rest) = rest.split_at(len.div_ceil(2));
    let scales: Vec<f32> = scales
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let out = (0..len)
        .map(|i| {
            let byte = q[i / 2];
            let nib = if i % 2 == 0 { byte & 0x0F } else { byte >> 4 };
            (nib as i32 - 8) as f32 * scales[i / block as usize]
        })
        .collect();
    (out, rest)
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

/// Encodes `values` (expected finite) with `codec`, then zstd. A low-rank codec sees one flat
/// tensor here; [`encode_shaped`] gives it the model's shapes.
pub fn encode(codec: DeltaCodec, values: &[f32]) -> EncodedDelta {
    encode_shaped(codec, values, &[], &mut Vec::new())
}

/// Seed of the random start subspace of a matrix without a previous one (any value works: the
/// factors themselves are sent).
const LOWRANK_SEED: u64 = 0x6E69_6768_7473_6866;

/// [`encode`] with the shapes of the model's tensors (in flat order), which
/// [`DeltaCodec::LowRank`] needs to find the matrices; other codecs ignore them. `subspaces`
/// is the sender's memory of each matrix's last `Q`: a matrix whose previous `Q` fits starts
/// its subspace iteration there, with [`crate::lowrank::WARM_ITERS`] iterations (PowerSGD's
/// warm start), else from a random subspace with [`crate::lowrank::POWER_ITERS`]. It is
/// updated in place; pass an empty vector to start fresh.
pub fn encode_shaped(
    codec: DeltaCodec,
    values: &[f32],
    shapes: &[Vec<usize>],
    subspaces: &mut Vec<Vec<f32>>,
) -> EncodedDelta {
    let mut raw = Vec::with_capacity(raw_body_size_shaped(codec, values.len(), shapes));
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
        DeltaCodec::Int4 { block } => int4_into(&mut raw, values, block),
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
        DeltaCodec::LowRank { rank, block } => {
            let pieces = pieces(shapes, values.len(), rank as usize);
            subspaces.resize(pieces.len(), vec![]);
            let mut off = 0;
            for (piece, q_prev) in pieces.iter().zip(subspaces.iter_mut()) {
                match *piece {
                    Piece::Plain(n) => {
                        int4_into(&mut raw, &values[off..off + n], block);
                        off += n;
                    }
                    Piece::Factored { rows, cols, r } => {
                        let m = &values[off..off + rows * cols];
                        let (p, q) = if q_prev.len() == cols * r {
                            crate::lowrank::factorize_from(
                                m,
                                rows,
                                cols,
                                q_prev,
                                r,
                                crate::lowrank::WARM_ITERS,
                            )
                        } else {
                            crate::lowrank::factorize(m, rows, cols, r, LOWRANK_SEED ^ off as u64)
                        };
                        int4_into(&mut raw, &p, block);
                        int4_into(&mut raw, &q, block);
                        *q_prev = q;
                        off += rows * cols;
                    }
                }
            }
        }
    }
    // Compressing an in-memory buffer only fails on allocation failure.
    let body = compress_body(&raw).unwrap_or(raw);
    EncodedDelta {
        codec,
        len: values.len() as u32,
        body,
    }
}

thread_local! {
    /// One zstd context each way per thread: creating one allocates and initialises more state
    /// than a small slice takes to code, and a node codes hundreds of slices a round.
    static COMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static DECOMPRESSOR: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> =
        const { std::cell::RefCell::new(None) };
}

/// `raw` compressed at [`ZSTD_LEVEL`], with this thread's context.
fn compress_body(raw: &[u8]) -> std::io::Result<Vec<u8>> {
    COMPRESSOR.with(|c| {
        let mut c = c.borrow_mut();
        if c.is_none() {
            *c = Some(zstd::bulk::Compressor::new(ZSTD_LEVEL)?);
        }
        c.as_mut().map_or_else(
            || zstd::bulk::compress(raw, ZSTD_LEVEL),
            |c| c.compress(raw),
        )
    })
}

/// `body` decompressed into at most `capacity` bytes, with this thread's context.
fn decompress_body(body: &[u8], capacity: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_none() {
            *d = Some(zstd::bulk::Decompressor::new()?);
        }
        d.as_mut().map_or_else(
            || zstd::bulk::decompress(body, capacity),
            |d| d.decompress(body, capacity),
        )
    })
}

/// Decodes `enc`, which must describe exactly `expected_len` values (a low-rank codec: as one
/// flat tensor; see [`decode_shaped`]).
///
/// # Errors
/// See [`DeltaError`]; never panics and never allocates more than the expected body size.
pub fn decode(enc: &EncodedDelta, expected_len: usize) -> Result<Vec<f32>, DeltaError> {
    decode_shaped(enc, expected_len, &[])
}

/// [`decode`] with the shapes of the receiver's own model (in flat order), as
/// [`encode_shaped`] was given them; the sizes come from them and the codec's parameters,
/// never from the body.
///
/// # Errors
/// See [`DeltaError`]; never panics and never allocates more than the expected body size.
pub fn decode_shaped(
    enc: &EncodedDelta,
    expected_len: usize,
    shapes: &[Vec<usize>],
) -> Result<Vec<f32>, DeltaError> {
    let len = enc.len as usize;
    if len != expected_len {
        return Err(DeltaError::WrongLength {
            got: len,
            expected: expected_len,
        });
    }
    check_params(enc.codec, len)?;
    let expected = raw_body_size_shaped(enc.codec, len, shapes);
    let raw =
        decompress_body(&enc.body, expected).map_err(|e| DeltaError::Decompress(e.to_string()))?;
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
        DeltaCodec::Int4 { block } => int4_from(&raw, len, block).0,
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
        DeltaCodec::LowRank { rank, block } => {
            let mut out = Vec::with_capacity(len);
            let mut rest = &raw[..];
            for piece in pieces(shapes, len, rank as usize) {
                match piece {
                    Piece::Plain(n) => {
                        let (v, r) = int4_from(rest, n, block);
                        out.extend(v);
                        rest = r;
                    }
                    Piece::Factored { rows, cols, r } => {
                        let (p, after_p) = int4_from(rest, rows * r, block);
                        let (q, after_q) = int4_from(after_p, cols * r, block);
                        out.extend(crate::lowrank::reconstruct(&p, &q, rows, cols, r));
                        rest = after_q;
                    }
                }
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
mod tests;
