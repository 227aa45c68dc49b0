//! The versioned bincode framing. Every frame is `[WIRE_VERSION] ++ bincode(value)`.
//!
//! bincode 2 is marked unmaintained upstream (RUSTSEC-2025-0141); it is used only here, so that
//! swapping it later touches one module.

use serde::{Serialize, de::DeserializeOwned};
use thiserror::Error;

use crate::MAX_MESSAGE_BYTES;

/// Version byte at the start of every frame. Bump on any incompatible change.
pub const WIRE_VERSION: u8 = 3;

/// Why a frame could not be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame is empty.
    #[error("empty frame")]
    Empty,
    /// The frame is larger than the limit.
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    /// The version byte is not one we speak.
    #[error("unsupported wire version {0} (this build speaks {WIRE_VERSION})")]
    Version(u8),
    /// bincode rejected the body.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// Bytes were left over after the value.
    #[error("{0} trailing bytes after the value")]
    Trailing(usize),
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<MAX_MESSAGE_BYTES>()
}

/// Encodes `value` as a versioned frame.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_as(WIRE_VERSION, value)
}

/// The frame version a manifest's signed bytes and swarm id are computed with. A manifest's
/// layout is versioned by its own `MANIFEST_VERSION`, so bumping [`WIRE_VERSION`] for a message
/// change must not change the id of every swarm or void its creator's signature.
pub const MANIFEST_FRAME_VERSION: u8 = 1;

/// Encodes `value` as a frame with the given version byte.
pub fn encode_as<T: Serialize>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
    // Serialising our own plain data types into a Vec cannot fail except on the size limit,
    // which only a caller building an absurd message can hit; report it as an empty body.
    match bincode::serde::encode_to_vec(value, config()) {
        Ok(body) => out.extend_from_slice(&body),
        Err(_) => out.clear(),
    }
    out
}

/// Decodes a versioned frame of at most `limit` bytes (and never more than [`MAX_MESSAGE_BYTES`]).
///
/// # Errors
/// See [`DecodeError`]. Never panics on any input.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], limit: usize) -> Result<T, DecodeError> {
    let limit = limit.min(MAX_MESSAGE_BYTES);
    if bytes.len() > limit {
        return Err(DecodeError::TooLarge {
            len: bytes.len(),
            limit,
        });
    }
    let (&version, body) = bytes.split_first().ok_or(DecodeError::Empty)?;
    if version != WIRE_VERSION {
        return Err(DecodeError::Version(version));
    }
    let (value, used) = bincode::serde::decode_from_slice(body, config())
        .map_err(|e| DecodeError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(DecodeError::Trailing(body.len() - used));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_unknown_version_and_trailing_bytes() {
        let mut f = encode(&(7u32, String::from("x")));
        assert_eq!(decode::<(u32, String)>(&f, 1024).unwrap(), (7, "x".into()));
        f.push(0);
        assert_eq!(
            decode::<(u32, String)>(&f, 1024),
            Err(DecodeError::Trailing(1))
        );
        f[0] = 9;
        assert_eq!(
            decode::<(u32, String)>(&f, 1024),
            Err(DecodeError::Version(9))
        );
        assert_eq!(decode::<u32>(&[], 10), Err(DecodeError::Empty));
    }

    #[test]
    fn rejects_frames_over_the_limit_before_decoding() {
        let f = encode(&vec![0u8; 100]);
        assert!(matches!(
            decode::<Vec<u8>>(&f, 50),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn a_huge_declared_length_does_not_allocate() {
        // A Vec<u8> whose varint length claims ~2^60 elements: must fail cleanly.
        let frame = [WIRE_VERSION, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0x10];
        assert!(decode::<Vec<u8>>(&frame, 1024).is_err());
    }
}
