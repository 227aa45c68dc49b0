//! Sliced contributions and reduced slices: the messages of averaging inside the network (a
//! reduce-scatter), each checkable on its own.
//!
//! A contributor cuts its delta into `S` slices of whole codec blocks ([`slice_ranges`]), encodes
//! each on its own and signs one small header ([`SlicedContribution`]) that commits to all of
//! them by a Merkle root ([`merkle_root`], RFC 9162's tree hash, leaves bound to their index).
//! Reducer `j` receives slice `j` of every contribution as a [`Slice`] — the signed header, the
//! slice and its Merkle path — and checks it against its sender's signature alone
//! ([`open_slice`]), without the rest of the delta. It averages what it received and signs the
//! result, a [`ReducedSlice`] naming every contribution it counted; a second reducer, given the
//! same inputs, signs the same payload, and a node accepts a reduced slice that two reducers
//! signed ([`open_reduced`] checks each signature and the payload's bounds).
//!
//! Slicing at block boundaries changes nothing a codec does: the slices of a blockwise codec
//! decode to exactly the values the whole delta decodes to.

use serde::{Deserialize, Serialize};
use std::ops::Range;
use thiserror::Error;

use crate::message::{ContributionId, MAX_EXPECTED};
use crate::signed::{EnvelopeHeader, Expectation, PayloadKind, SignedEnvelope, VerifyError};
use crate::{DeltaCodec, DeltaError, EncodedDelta, Hash32, MAX_PARAMS, delta, wire};

/// Most slices a contribution may be cut into.
pub const MAX_SLICES: u32 = 4096;
/// Longest Merkle path of a tree of at most [`MAX_SLICES`] leaves.
pub const MAX_PATH: usize = 12;
/// Largest encoded [`SlicedContribution`] (fixed fields only).
pub const MAX_SLICED_HEADER_BYTES: usize = 256;
/// Most contributions one reduced slice may count.
pub const MAX_REDUCED_INPUTS: usize = MAX_EXPECTED as usize;

const LEAF: u8 = 0;
const NODE: u8 = 1;
const LEAF_DOMAIN: &[u8] = b"nightshift/slice/v1\0";

/// How a swarm averages each round's contributions (the manifest's `training.averaging`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Averaging {
    /// Every node sends its whole contribution to every peer and averages them all: simple,
    /// and what a node sends and receives grows with the swarm.
    #[default]
    AllToAll,
    /// Slice by slice, through reducers inside the network: each contributor of a round
    /// averages one slice of every contribution, a second checks it, and every node gathers the
    /// averaged slices. What a node sends and receives stays about the same as the swarm grows.
    Reduce {
        /// Slices a contribution is cut into; 0: one per contributor to the round before.
        slices: u32,
        /// How the reducers send their averages.
        mean_codec: DeltaCodec,
    },
}

impl Averaging {
    /// Slicing by contributors, the reducers' averages sent as `int8:64`.
    pub const REDUCE: Averaging = Averaging::Reduce {
        slices: 0,
        mean_codec: DeltaCodec::Int8 { block: 64 },
    };

    /// Whether contributions sent as `codec` can be averaged this way.
    ///
    /// # Errors
    /// Why not.
    pub fn check(&self, codec: DeltaCodec) -> Result<(), String> {
        let Averaging::Reduce { slices, mean_codec } = *self else {
            return Ok(());
        };
        if slices > MAX_SLICES {
            return Err(format!("at most {MAX_SLICES} slices"));
        }
        if slice_align(codec).is_none() {
            return Err(format!(
                "contributions sent as {codec} do not cut into slices"
            ));
        }
        if slice_align(mean_codec).is_none() {
            return Err(format!(
                "averages sent as {mean_codec} do not cut into slices"
            ));
        }
        Ok(())
    }
}

impl std::fmt::Display for Averaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Averaging::AllToAll => write!(f, "all-to-all"),
            Averaging::Reduce { slices, mean_codec } => write!(f, "reduce:{slices}:{mean_codec}"),
        }
    }
}

impl std::str::FromStr for Averaging {
    type Err = String;

    /// Parses `all-to-all` or `reduce[:SLICES[:CODEC]]` (e.g. `reduce`, `reduce:0:int8:64`).
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("unknown averaging {s:?}: expected all-to-all or reduce[:SLICES[:CODEC]]");
        let (name, rest) = s.split_once(':').map_or((s, None), |(a, b)| (a, Some(b)));
        match (name, rest) {
            ("all-to-all", None) => Ok(Averaging::AllToAll),
            ("reduce", None) => Ok(Averaging::REDUCE),
            ("reduce", Some(rest)) => {
                let (n, codec) = rest
                    .split_once(':')
                    .map_or((rest, None), |(a, b)| (a, Some(b)));
                let slices = n.parse().map_err(|_| bad())?;
                let mean_codec = match codec {
                    Some(c) => c.parse()?,
                    None => DeltaCodec::Int8 { block: 64 },
                };
                let a = Averaging::Reduce { slices, mean_codec };
                a.check(DeltaCodec::Fp32).map(|()| a)
            }
            _ => Err(bad()),
        }
    }
}

/// The values a slice of a delta covers: `slices` ranges of whole `align`-value blocks, as equal
/// as blocks allow (the first ones one block longer), in order, covering `0..len`. `None` when
/// `slices` is 0 or larger than the number of blocks.
pub fn slice_ranges(len: usize, slices: u32, align: usize) -> Option<Vec<Range<usize>>> {
    let align = align.max(1);
    let blocks = len.div_ceil(align);
    let s = slices as usize;
    if s == 0 || s > blocks {
        return None;
    }
    let (base, extra) = (blocks / s, blocks % s);
    let mut start = 0;
    Some(
        (0..s)
            .map(|i| {
                let n = base + usize::from(i < extra);
                let end = ((start + n) * align).min(len);
                let r = start * align..end;
                start += n;
                r
            })
            .collect(),
    )
}

/// The block a codec's slices must keep whole (1 for element-wise codecs); `None` for a codec
/// whose encoding does not split by value ranges (low-rank factors).
pub fn slice_align(codec: DeltaCodec) -> Option<usize> {
    match codec {
        DeltaCodec::Fp32 | DeltaCodec::Fp16 | DeltaCodec::TopK { .. } => Some(1),
        DeltaCodec::Int8 { block } | DeltaCodec::Int4 { block } => Some(block as usize),
        DeltaCodec::LowRank { .. } => None,
    }
}

/// The slices of a round whose contributions are encoded with `codec` and whose reduced means
/// with `mean_codec`: [`slice_ranges`] in blocks whole for both. `None` when either codec does
/// not slice or `slices` is out of range.
pub fn round_slices(
    len: usize,
    slices: u32,
    codec: DeltaCodec,
    mean_codec: DeltaCodec,
) -> Option<Vec<Range<usize>>> {
    let (a, b) = (slice_align(codec)?, slice_align(mean_codec)?);
    let lcm = a / gcd(a, b) * b;
    if slices > MAX_SLICES || len > MAX_PARAMS {
        return None;
    }
    slice_ranges(len, slices, lcm)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

fn node_hash(left: &Hash32, right: &Hash32) -> Hash32 {
    Hash32::of(&[&[NODE], &left.0, &right.0])
}

/// The leaf of slice `index`: its encoded bytes bound to its place.
pub fn leaf_hash(index: u32, slice: &EncodedDelta) -> Hash32 {
    let bytes = wire::encode(slice);
    Hash32::of(&[&[LEAF], LEAF_DOMAIN, &index.to_le_bytes(), &bytes])
}

fn split_point(n: usize) -> usize {
    // The largest power of two smaller than n (n ≥ 2).
    1 << (usize::BITS - 1 - (n - 1).leading_zeros())
}

/// The Merkle tree hash of `leaves` (RFC 9162 §2.1.1; the zero hash for no leaves).
pub fn merkle_root(leaves: &[Hash32]) -> Hash32 {
    match leaves.len() {
        0 => Hash32::default(),
        1 => leaves[0],
        n => {
            let k = split_point(n);
            node_hash(&merkle_root(&leaves[..k]), &merkle_root(&leaves[k..]))
        }
    }
}

/// The inclusion path of leaf `index` (RFC 9162 §2.1.3.1), from the leaf up.
///
/// # Panics
/// When `index` is not a leaf of `leaves`.
pub fn merkle_path(leaves: &[Hash32], index: usize) -> Vec<Hash32> {
    assert!(index < leaves.len(), "leaf {index} of {}", leaves.len());
    let n = leaves.len();
    if n == 1 {
        return vec![];
    }
    let k = split_point(n);
    if index < k {
        let mut p = merkle_path(&leaves[..k], index);
        p.push(merkle_root(&leaves[k..]));
        p
    } else {
        let mut p = merkle_path(&leaves[k..], index - k);
        p.push(merkle_root(&leaves[..k]));
        p
    }
}

/// The root of `leaves` and every leaf's inclusion path, in leaf order: what [`merkle_root`]
/// and [`merkle_path`] give, with each node hashed once (O(n) hashes; a path at a time is
/// O(n) each, O(n²) for all of them, which at 1,000 slices was most of a contributor's work).
pub fn merkle_tree(leaves: &[Hash32]) -> (Hash32, Vec<Vec<Hash32>>) {
    match leaves.len() {
        0 => (Hash32::default(), vec![]),
        1 => (leaves[0], vec![vec![]]),
        n => {
            let k = split_point(n);
            let (left, mut paths) = merkle_tree(&leaves[..k]);
            let (right, right_paths) = merkle_tree(&leaves[k..]);
            for p in &mut paths {
                p.push(right);
            }
            paths.extend(right_paths.into_iter().map(|mut p| {
                p.push(left);
                p
            }));
            (node_hash(&left, &right), paths)
        }
    }
}

/// Whether `path` proves `leaf` is leaf `index` of a tree of `size` leaves with `root`
/// (RFC 9162 §2.1.3.2).
pub fn verify_path(root: &Hash32, leaf: &Hash32, index: u64, size: u64, path: &[Hash32]) -> bool {
    if index >= size {
        return false;
    }
    let (mut fn_, mut sn, mut r) = (index, size - 1, *leaf);
    for p in path {
        if sn == 0 {
            return false;
        }
        if fn_ & 1 == 1 || fn_ == sn {
            r = node_hash(p, &r);
            while fn_ & 1 == 0 && fn_ != 0 {
                fn_ >>= 1;
                sn >>= 1;
            }
        } else {
            r = node_hash(&r, p);
        }
        fn_ >>= 1;
        sn >>= 1;
    }
    sn == 0 && r == *root
}

/// The signed part of a sliced contribution (the payload of a
/// [`PayloadKind::SlicedContribution`] envelope): what [`crate::Contribution`] says, with the
/// values replaced by the root of their slices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlicedContribution {
    /// Tokens trained for this delta (its averaging weight).
    pub tokens: u64,
    pub inner_steps: u32,
    /// Mean training loss over those steps, for display.
    pub train_loss: f32,
    /// Contributions the sender expected this round, itself included.
    pub expected: u32,
    pub codec: DeltaCodec,
    /// Values in the whole delta.
    pub len: u64,
    pub slices: u32,
    /// [`merkle_root`] of the slices' [`leaf_hash`]es.
    pub root: Hash32,
}

/// A delta cut into slices, ready to send: the encoded slices, their leaves and root.
#[derive(Clone, Debug)]
pub struct SlicedDelta {
    pub slices: Vec<EncodedDelta>,
    pub leaves: Vec<Hash32>,
    pub root: Hash32,
    /// Each slice's Merkle path, in slice order.
    pub paths: Vec<Vec<Hash32>>,
}

impl SlicedDelta {
    /// Encodes each of `ranges` of `values` with `codec` (the ranges of [`round_slices`]).
    pub fn encode(codec: DeltaCodec, values: &[f32], ranges: &[Range<usize>]) -> Self {
        let slices: Vec<EncodedDelta> = ranges
            .iter()
            .map(|r| delta::encode(codec, &values[r.clone()]))
            .collect();
        let leaves: Vec<Hash32> = slices
            .iter()
            .enumerate()
            .map(|(i, s)| leaf_hash(i as u32, s))
            .collect();
        let (root, paths) = merkle_tree(&leaves);
        SlicedDelta {
            slices,
            leaves,
            root,
            paths,
        }
    }

    /// The message that carries slice `index` to its reducer.
    pub fn slice(&self, envelope: &SignedEnvelope, index: usize) -> Slice {
        Slice {
            envelope: envelope.clone(),
            index: index as u32,
            body: self.slices[index].clone(),
            path: self.paths[index].clone(),
        }
    }
}

/// One slice of a sliced contribution as its reducer receives it: the contributor's signed
/// header, the slice, and the Merkle path that ties the slice to the header's root.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slice {
    pub envelope: SignedEnvelope,
    pub index: u32,
    pub body: EncodedDelta,
    pub path: Vec<Hash32>,
}

/// A slice as it answers [`crate::Request::GetSlice`]: its index, values and Merkle path, and
/// the contributor's signed header only when the asker lacks it. Whoever asks for a slice
/// usually holds that header already (it counted the contribution in the round's set): sent
/// again with every slice, it was ≈ 230 B per (contributor, reducer) pair.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SliceAnswer {
    pub header: Option<SignedEnvelope>,
    pub index: u32,
    pub body: EncodedDelta,
    pub path: Vec<Hash32>,
}

impl Slice {
    /// What travels of this slice when it is asked for: the header only `with_header`.
    pub fn answer(&self, with_header: bool) -> SliceAnswer {
        SliceAnswer {
            header: with_header.then(|| self.envelope.clone()),
            index: self.index,
            body: self.body.clone(),
            path: self.path.clone(),
        }
    }
}

impl SliceAnswer {
    /// The slice again, with the header it came with or else the one the asker holds; `None`
    /// with neither. Still to be checked ([`open_slice`]).
    pub fn into_slice(self, held: Option<SignedEnvelope>) -> Option<Slice> {
        Some(Slice {
            envelope: self.header.or(held)?,
            index: self.index,
            body: self.body,
            path: self.path,
        })
    }
}

/// What a slice must match: the round it is for and the swarm's rules.
#[derive(Clone, Copy, Debug)]
pub struct SliceContext<'a> {
    pub swarm_id: Hash32,
    pub round: u64,
    pub base_hash: Hash32,
    /// Members who may contribute (`None`: an open swarm).
    pub allowlist: Option<&'a [[u8; 32]]>,
    pub num_params: usize,
    pub codec: DeltaCodec,
    /// How many slices the round's contributions are cut into.
    pub slices: u32,
    /// How reducers send their means.
    pub mean_codec: DeltaCodec,
    /// Most tokens a round can train.
    pub max_tokens: u64,
}

impl SliceContext<'_> {
    /// The round's slices ([`round_slices`]).
    ///
    /// # Errors
    /// When the model's values do not cut into the round's slices.
    pub fn ranges(&self) -> Result<Vec<Range<usize>>, SliceError> {
        round_slices(self.num_params, self.slices, self.codec, self.mean_codec).ok_or_else(|| {
            SliceError::Header(format!(
                "{} values do not cut into {} slices of {} and {}",
                self.num_params, self.slices, self.codec, self.mean_codec
            ))
        })
    }
}

/// Why a slice or a reduced slice was refused.
#[derive(Debug, Error, PartialEq)]
pub enum SliceError {
    #[error("{0}")]
    Envelope(#[from] VerifyError),
    #[error("header does not decode: {0}")]
    Decode(#[from] crate::DecodeError),
    #[error("{0}")]
    Delta(#[from] DeltaError),
    #[error("{0}")]
    Header(String),
    #[error("slice {index} of {slices} does not exist")]
    NoSuchSlice { index: u32, slices: u32 },
    #[error("slice {0} does not match its sender's signed root")]
    BadPath(u32),
}

/// A slice that checked out: its contribution, the header's figures and the slice's values.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenedSlice {
    pub id: ContributionId,
    pub header: SlicedContribution,
    pub index: u32,
    pub values: Vec<f32>,
}

fn check_header(h: &SlicedContribution, ctx: &SliceContext<'_>) -> Result<(), SliceError> {
    let bad = |m: String| Err(SliceError::Header(m));
    if h.codec != ctx.codec {
        return bad(format!(
            "delta sent as {}, the swarm uses {}",
            h.codec, ctx.codec
        ));
    }
    if h.len != ctx.num_params as u64 {
        return bad(format!(
            "delta of {} values, the model has {}",
            h.len, ctx.num_params
        ));
    }
    if h.slices != ctx.slices {
        return bad(format!(
            "cut into {} slices, the round uses {}",
            h.slices, ctx.slices
        ));
    }
    if h.tokens == 0 || h.tokens > ctx.max_tokens {
        return bad(format!(
            "claims {} tokens (limit {})",
            h.tokens, ctx.max_tokens
        ));
    }
    if h.expected == 0 || h.expected > MAX_EXPECTED {
        return bad(format!(
            "expects {} contributions (between 1 and {MAX_EXPECTED})",
            h.expected
        ));
    }
    if !h.train_loss.is_finite() {
        return bad("non-finite training loss".into());
    }
    Ok(())
}

/// Checks a sliced contribution's signed header: its signature and bindings (swarm, round,
/// base, member) and its figures against the swarm's rules (codec, length, slices, tokens).
///
/// # Errors
/// The first reason the header is unacceptable.
pub fn open_header(
    envelope: &SignedEnvelope,
    ctx: &SliceContext<'_>,
) -> Result<SlicedContribution, SliceError> {
    open_header_unless_verified(envelope, ctx, None)
}

/// [`open_header`] without checking the signature again when `envelope` is byte for byte
/// `verified` (see [`SignedEnvelope::verify_unless_verified`]).
///
/// # Errors
/// As [`open_header`].
fn open_header_unless_verified(
    envelope: &SignedEnvelope,
    ctx: &SliceContext<'_>,
    verified: Option<&SignedEnvelope>,
) -> Result<SlicedContribution, SliceError> {
    let payload = envelope.verify_unless_verified(
        &Expectation {
            kind: PayloadKind::SlicedContribution,
            swarm_id: ctx.swarm_id,
            round: ctx.round,
            base_hash: ctx.base_hash,
            allowlist: ctx.allowlist,
            max_payload: MAX_SLICED_HEADER_BYTES,
        },
        verified,
    )?;
    let header: SlicedContribution = wire::decode(payload, MAX_SLICED_HEADER_BYTES)?;
    check_header(&header, ctx)?;
    Ok(header)
}

/// Checks a slice: its header's signature and bindings (swarm, round, base, member), the
/// header's figures against the swarm's rules, the slice's place in the Merkle tree its sender
/// signed, and its values (length, finite). Bounded before anything is decoded.
///
/// # Errors
/// The first reason the slice is unacceptable.
pub fn open_slice(slice: &Slice, ctx: &SliceContext<'_>) -> Result<OpenedSlice, SliceError> {
    open_slice_unless_verified(slice, ctx, None)
}

/// [`open_slice`] without checking the header's signature again when the slice carries, byte
/// for byte, the header `verified` (see [`SignedEnvelope::verify_unless_verified`]).
///
/// # Errors
/// As [`open_slice`].
pub fn open_slice_unless_verified(
    slice: &Slice,
    ctx: &SliceContext<'_>,
    verified: Option<&SignedEnvelope>,
) -> Result<OpenedSlice, SliceError> {
    let header = open_header_unless_verified(&slice.envelope, ctx, verified)?;
    if slice.index >= header.slices {
        return Err(SliceError::NoSuchSlice {
            index: slice.index,
            slices: header.slices,
        });
    }
    let ranges = ctx.ranges()?;
    let leaf = leaf_hash(slice.index, &slice.body);
    if slice.path.len() > MAX_PATH
        || !verify_path(
            &header.root,
            &leaf,
            slice.index as u64,
            header.slices as u64,
            &slice.path,
        )
    {
        return Err(SliceError::BadPath(slice.index));
    }
    let range = &ranges[slice.index as usize];
    let values = delta::decode(&slice.body, range.len())?;
    Ok(OpenedSlice {
        id: ContributionId::of(&slice.envelope),
        header,
        index: slice.index,
        values,
    })
}

/// One contribution a reducer counted, with what the round's step needs of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReducedInput {
    pub id: ContributionId,
    pub tokens: u64,
    pub expected: u32,
}

/// A reducer's result for one slice of a round (the payload of a [`PayloadKind::ReducedSlice`]
/// envelope, signed by the reducer and by the second reducer that checked it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReducedSlice {
    pub index: u32,
    pub slices: u32,
    /// [`inputs_digest`] of the contributions averaged, in key order. The list travels on its
    /// own ([`ReducedInputs`]): a round's reducers usually count the same contributions, so a
    /// node fetches one list, not one per slice.
    pub inputs: Hash32,
    /// How many contributions it counts.
    pub count: u32,
    /// Their token-weighted mean over the slice's values.
    pub mean: EncodedDelta,
    /// Σ over the slice's values of the unweighted mean squared, and Σ of each input's squared
    /// distance from it: the parts of the round's noise ratio.
    pub mean_sq: f64,
    pub spread: f64,
}

/// A reduced slice as it travels: the envelopes of its reducers (the reducer's alone on its
/// way to the checker; both once checked), all over one [`ReducedSlice`] payload. The inputs it
/// counts do not travel with it: it names them by digest, and a node that can use it holds the
/// same set already.
///
/// On the wire the payload travels once, each reducer's header and signature beside it (a
/// second copy of the mean was half of what a node downloaded a round); an envelope whose
/// payload differs from the first's is sent with the first's, and its signature then fails.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(into = "ReducedWire", try_from = "ReducedWire")]
pub struct Reduced {
    pub signed: Vec<SignedEnvelope>,
}

/// The most envelopes a [`Reduced`] may carry: its reducer's and its checker's.
pub const MAX_REDUCED_SIGNERS: usize = 2;

/// [`Reduced`] as encoded: one payload, the signers' headers and signatures.
#[derive(Serialize, Deserialize)]
struct ReducedWire {
    payload: Vec<u8>,
    signers: Vec<(EnvelopeHeader, Vec<u8>)>,
}

impl From<Reduced> for ReducedWire {
    fn from(r: Reduced) -> Self {
        let mut signed = r.signed.into_iter();
        let Some(first) = signed.next() else {
            return ReducedWire {
                payload: vec![],
                signers: vec![],
            };
        };
        let mut signers = vec![(first.header, first.signature)];
        signers.extend(signed.map(|e| (e.header, e.signature)));
        ReducedWire {
            payload: first.payload,
            signers,
        }
    }
}

impl TryFrom<ReducedWire> for Reduced {
    type Error = String;

    fn try_from(w: ReducedWire) -> Result<Self, String> {
        if w.signers.len() > MAX_REDUCED_SIGNERS {
            return Err(format!(
                "a reduced slice signed {} times (at most {MAX_REDUCED_SIGNERS})",
                w.signers.len()
            ));
        }
        let signed = w
            .signers
            .into_iter()
            .map(|(header, signature)| SignedEnvelope {
                header,
                payload: w.payload.clone(),
                signature,
            })
            .collect();
        Ok(Reduced { signed })
    }
}

/// The contributions a reduced slice counts, in key order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReducedInputs(pub Vec<ReducedInput>);

/// The digest a [`ReducedSlice`] names its inputs by.
pub fn inputs_digest(inputs: &[ReducedInput]) -> Hash32 {
    Hash32::of(&[b"nightshift/reduced-inputs/v1\0", &wire::encode(&inputs)])
}

/// A reduced slice's input list, checked (non-empty, at most [`MAX_REDUCED_INPUTS`], in strictly
/// increasing key order, members only, plausible figures) and named by its digest, once: every
/// reduced slice of a round counts the same list, so a node checks the list once and each slice
/// only against its digest ([`open_reduced_checked`]). Built only by [`CheckedInputs::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedInputs {
    list: Vec<ReducedInput>,
    digest: Hash32,
}

impl CheckedInputs {
    /// Checks `list` for the round of `ctx` and names it.
    ///
    /// # Errors
    /// The first reason the list cannot be a reduced slice's inputs.
    pub fn new(list: Vec<ReducedInput>, ctx: &SliceContext<'_>) -> Result<Self, SliceError> {
        if list.is_empty() || list.len() > MAX_REDUCED_INPUTS {
            return Err(SliceError::Header(format!("counts {} inputs", list.len())));
        }
        if !list.windows(2).all(|w| w[0].id.sender < w[1].id.sender) {
            return Err(SliceError::Header("inputs not in key order".into()));
        }
        let members: Option<std::collections::HashSet<&[u8; 32]>> =
            ctx.allowlist.map(|a| a.iter().collect());
        for i in &list {
            if members.as_ref().is_some_and(|m| !m.contains(&i.id.sender)) {
                return Err(VerifyError::NotAMember(hex::encode(&i.id.sender[..8])).into());
            }
            if i.tokens == 0 || i.tokens > ctx.max_tokens || i.expected > MAX_EXPECTED {
                return Err(SliceError::Header(
                    "an input's figures are out of range".into(),
                ));
            }
        }
        let digest = inputs_digest(&list);
        Ok(CheckedInputs { list, digest })
    }

    pub fn list(&self) -> &[ReducedInput] {
        &self.list
    }

    /// [`inputs_digest`] of the list.
    pub fn digest(&self) -> Hash32 {
        self.digest
    }
}

/// The most a reduced slice's payload may take for a slice of `values` values.
pub fn max_reduced_bytes(values: usize) -> usize {
    values * 4 + 1024
}

/// Checks the signatures of a reduced slice (by `reducers`, each a key the round assigned to the
/// slice; every one must have signed the same payload) and its bounds: the index, the inputs
/// (the list its digest names: members, in strictly increasing key order, each with plausible
/// tokens), the mean's codec and length, finite statistics. Returns the payload and its
/// decoded mean.
///
/// # Errors
/// The first reason the reduced slice is unacceptable.
pub fn open_reduced(
    signed: &[SignedEnvelope],
    reducers: &[[u8; 32]],
    inputs: &[ReducedInput],
    ctx: &SliceContext<'_>,
) -> Result<(ReducedSlice, Vec<f32>), SliceError> {
    open_reduced_checked(
        signed,
        reducers,
        &CheckedInputs::new(inputs.to_vec(), ctx)?,
        ctx,
    )
}

/// [`open_reduced`] over inputs already checked and named ([`CheckedInputs`]): the list's own
/// checks and digest are not repeated for every slice.
///
/// # Errors
/// The first reason the reduced slice is unacceptable.
pub fn open_reduced_checked(
    signed: &[SignedEnvelope],
    reducers: &[[u8; 32]],
    inputs: &CheckedInputs,
    ctx: &SliceContext<'_>,
) -> Result<(ReducedSlice, Vec<f32>), SliceError> {
    let mean_codec = ctx.mean_codec;
    let (Some(first), false) = (signed.first(), reducers.is_empty()) else {
        return Err(SliceError::Header(
            "no signature, or no reducer to sign".into(),
        ));
    };
    let ranges = ctx.ranges()?;
    let limit = max_reduced_bytes(ranges.first().map_or(0, Range::len));
    for (env, key) in signed.iter().zip(reducers) {
        if env.header.sender != *key || env.payload != first.payload {
            return Err(SliceError::Header(
                "reduced slice not signed by its reducers over one payload".into(),
            ));
        }
        env.verify(&Expectation {
            kind: PayloadKind::ReducedSlice,
            swarm_id: ctx.swarm_id,
            round: ctx.round,
            base_hash: ctx.base_hash,
            allowlist: None,
            max_payload: limit,
        })?;
    }
    if signed.len() < reducers.len() {
        return Err(SliceError::Header(format!(
            "{} of {} reducers signed",
            signed.len(),
            reducers.len()
        )));
    }
    let r: ReducedSlice = wire::decode(&first.payload, limit)?;
    if r.slices != ctx.slices || r.index >= r.slices {
        return Err(SliceError::NoSuchSlice {
            index: r.index,
            slices: r.slices,
        });
    }
    if inputs.digest != r.inputs || inputs.list.len() != r.count as usize {
        return Err(SliceError::Header(
            "inputs are not the ones it names".into(),
        ));
    }
    if !(r.mean_sq.is_finite() && r.spread.is_finite() && r.mean_sq >= 0.0 && r.spread >= 0.0) {
        return Err(SliceError::Header("statistics out of range".into()));
    }
    if r.mean.codec != mean_codec {
        return Err(SliceError::Header(format!(
            "mean sent as {}, reducers send {mean_codec}",
            r.mean.codec
        )));
    }
    let values = delta::decode(&r.mean, ranges[r.index as usize].len())?;
    Ok((r, values))
}

/// Signs `payload` as `key`'s reduced slice `payload.index` of `round` from `base_hash`.
pub fn sign_reduced(
    key: &ed25519_dalek::SigningKey,
    swarm_id: Hash32,
    round: u64,
    base_hash: Hash32,
    payload: &ReducedSlice,
) -> SignedEnvelope {
    let header = header(PayloadKind::ReducedSlice, swarm_id, round, base_hash);
    SignedEnvelope::sign(key, header, wire::encode(payload))
}

/// Signs `header` as `key`'s sliced contribution to `round` from `base_hash`.
pub fn sign_sliced(
    key: &ed25519_dalek::SigningKey,
    swarm_id: Hash32,
    round: u64,
    base_hash: Hash32,
    sliced: &SlicedContribution,
) -> SignedEnvelope {
    let header = header(PayloadKind::SlicedContribution, swarm_id, round, base_hash);
    SignedEnvelope::sign(key, header, wire::encode(sliced))
}

fn header(kind: PayloadKind, swarm_id: Hash32, round: u64, base_hash: Hash32) -> EnvelopeHeader {
    EnvelopeHeader {
        kind,
        swarm_id,
        round,
        sender: [0; 32],
        base_hash,
    }
}

#[cfg(test)]
mod tests;
