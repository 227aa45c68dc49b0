//! The nightshift wire format. Pure: no I/O, no async, no network, no tensors.
//!
//! # Layout
//! - [`hash`] — 32-byte SHA-256 digests ([`Hash32`]) used for swarm ids and state hashes.
//! - [`wire`] — the versioned bincode framing every message goes through, with size limits.
//! - [`signed`] — ed25519 signed envelopes that bind a payload to (swarm, round, sender, base state).
//! - [`delta`] — pseudo-gradient codecs (fp32, fp16, blockwise int8/int4, top-k) followed by zstd.
//! - [`message`] — the request/response messages nodes exchange.
//! - [`manifest`] — the signed swarm manifest; its hash is the swarm id.
//! - [`slices`] — contributions cut into Merkle-committed slices and the reducers' averages of
//!   them: averaging inside the network.
//!
//! Everything a peer sends is bounded before it is allocated and verified before it is decoded.

pub mod delta;
pub mod hash;
pub mod lowrank;
pub mod manifest;
pub mod message;
pub mod signed;
pub mod slices;
pub mod status;
pub mod wire;

pub use delta::{DeltaCodec, DeltaError, EncodedDelta};
pub use hash::Hash32;
pub use manifest::{
    Aggregator, InnerOptimizer, Manifest, ManifestError, ModelSpec, SignedManifest, TrainingSpec,
    psk_fingerprint,
};
pub use message::{
    Contribution, ContributionId, MAX_EXPECTED, NodeRole, Request, Response, StateChunk,
    StateSnapshot, Status, StatusError, StatusLists, WindowRecord, WindowState, open_status,
    open_status_lists, sign_status,
};
pub use signed::{Expectation, PayloadKind, SignedEnvelope, VerifyError};
pub use wire::{DecodeError, WIRE_VERSION};

/// Largest frame a peer may send us (a full state snapshot of a large preset fits).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// Largest number of parameters a delta or a state may describe (1 G parameters).
pub const MAX_PARAMS: usize = 1 << 30;
