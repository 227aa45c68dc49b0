//! What is decided before any node runs: identity keys, the signed swarm manifest and the
//! genesis state. Every node reads it (the daemon depends on this crate); the bootstrap node and
//! swarm creation sit above it, in `nightshift-bootstrap`, which re-exports it.
//!
//! # Layout
//! - [`keys`] — ed25519 identity key files (`nightshift keygen`).
//! - [`genesis`] — building and signing a manifest (`nightshift swarm init`), the genesis state
//!   θ(0).
//! - [`data`] — the dataset and tokenizer a manifest pins: built from the creator's files, found
//!   and checked on every node.

pub mod data;
pub mod genesis;
pub mod keys;

pub use data::{load_data, load_tokenizer};
pub use genesis::{
    GenesisError, SwarmSettings, build_manifest, default_shards, genesis_state, model_config,
};
pub use keys::{
    KeyError, generate_key, generate_psk, parse_swarm_key, read_key, read_swarm_key, write_key,
    write_swarm_key,
};
