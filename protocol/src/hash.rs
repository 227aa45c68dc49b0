//! SHA-256 digests.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// A 32-byte SHA-256 digest: swarm ids, state hashes, content hashes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
pub struct Hash32(pub [u8; 32]);

impl Hash32 {
    /// Hashes the concatenation of `parts`.
    pub fn of(parts: &[&[u8]]) -> Self {
        let mut h = Sha256::new();
        for p in parts {
            h.update(p);
        }
        Hash32(h.finalize().into())
    }

    /// Hashes a slice of f32 values by their little-endian bytes, after a domain tag.
    pub fn of_f32s(tag: &[u8], values: &[f32]) -> Self {
        let mut h = Sha256::new();
        h.update(tag);
        h.update((values.len() as u64).to_le_bytes());
        // Hash in chunks to avoid one big temporary buffer.
        let mut buf = Vec::with_capacity(4096 * 4);
        for chunk in values.chunks(4096) {
            buf.clear();
            for v in chunk {
                buf.extend_from_slice(&v.to_le_bytes());
            }
            h.update(&buf);
        }
        Hash32(h.finalize().into())
    }

    /// Lower-case hex of all 32 bytes.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 8 bytes in hex, for logs.
    pub fn short(&self) -> String {
        hex::encode(&self.0[..8])
    }

    /// Parses 64 hex characters.
    ///
    /// # Errors
    /// When the text is not 64 hex characters.
    pub fn from_hex(s: &str) -> Result<Self, hex::FromHexError> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s.trim(), &mut out)?;
        Ok(Hash32(out))
    }
}

impl fmt::Debug for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash32({})", self.short())
    }
}

impl fmt::Display for Hash32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        let h = Hash32::of(&[b"abc"]);
        assert_eq!(Hash32::from_hex(&h.to_hex()).unwrap(), h);
        assert_eq!(
            h.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn f32_hash_depends_on_every_value() {
        let a = Hash32::of_f32s(b"t", &[1.0, 2.0, 3.0]);
        let b = Hash32::of_f32s(b"t", &[1.0, 2.0, 3.0000002]);
        assert_ne!(a, b);
    }
}
