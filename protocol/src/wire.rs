//! The versioned bincode framing. Every frame is `[WIRE_VERSION] ++ bincode(value)`.
//!
//! bincode 2 is marked unmaintained upstream (RUSTSEC-2025-0141); it is used only here, so that
//! swapping it later touches one module.

use serde::{Serialize, de::DeserializeOwned};
use thiserror::Error;

use crate::MAX_MESSAGE_BYTES;

/// Version byte at the start of every frame. Bump on any incompatible change.
pub const WIRE_VERSION: u8 = 8;

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

/// [`config`] with the limit `LIMIT` on what bincode may claim (allocate) while decoding.
fn decode_body<T: DeserializeOwned, const LIMIT: usize>(
    body: &[u8],
) -> Result<(T, usize), bincode::error::DecodeError> {
    let config = bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<LIMIT>();
    bincode::serde::decode_from_slice(body, config)
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
    // bincode checks every declared length against its limit *before* allocating (a string's
    // bytes are allocated whole, then read), so the limit must follow the body, not the largest
    // frame: under MAX_MESSAGE_BYTES a 6-byte frame declaring a 255 MiB string allocated it. A
    // value decoded from `n` bytes claims at most 16·n (bincode counts each varint at its
    // in-memory size, 16 bytes at most, and each string at its length), so a limit of at least
    // 16·n refuses nothing the largest one accepts.
    const KIB: usize = 1024;
    let decoded = match body.len().saturating_mul(16) {
        n if n <= 4 * KIB => decode_body::<T, { 4 * KIB }>(body),
        n if n <= 64 * KIB => decode_body::<T, { 64 * KIB }>(body),
        n if n <= KIB * KIB => decode_body::<T, { KIB * KIB }>(body),
        n if n <= 16 * KIB * KIB => decode_body::<T, { 16 * KIB * KIB }>(body),
        _ => decode_body::<T, MAX_MESSAGE_BYTES>(body),
    };
    let (value, used) = decoded.map_err(|e| DecodeError::Malformed(e.to_string()))?;
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
    fn a_short_frame_declaring_a_huge_string_is_refused_before_the_string_is_allocated() {
        // A 6-byte frame whose string claims 255 MiB, within MAX_MESSAGE_BYTES: bincode must
        // refuse the claim (LimitExceeded) rather than allocate it and run out of input.
        let mut frame = vec![WIRE_VERSION, 0xFC];
        frame.extend_from_slice(&(255u32 << 20).to_le_bytes());
        match decode::<String>(&frame, MAX_MESSAGE_BYTES) {
            Err(DecodeError::Malformed(m)) => assert!(m.contains("LimitExceeded"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The same claim in a frame big enough to hold it is only short of input.
        frame.resize(16 << 20, 0);
        match decode::<String>(&frame, MAX_MESSAGE_BYTES) {
            Err(DecodeError::Malformed(m)) => assert!(m.contains("UnexpectedEnd"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn values_that_claim_more_than_their_wire_size_still_decode() {
        // Each small u64 is one byte on the wire and claims eight: the limit follows the body
        // with room for that, at every size step.
        for n in [0usize, 1, 200, 5_000, 100_000, 2_000_000] {
            let v: Vec<u64> = (0..n as u64).map(|i| i % 200).collect();
            let s = String::from_utf8(vec![b'x'; n]).unwrap();
            let f = encode(&(v.clone(), s.clone(), vec![Some(()); n]));
            assert_eq!(decode(&f, MAX_MESSAGE_BYTES), Ok((v, s, vec![Some(()); n])));
        }
    }

    #[test]
    fn a_huge_declared_length_does_not_allocate() {
        // A Vec<u8> whose varint length claims ~2^60 elements: must fail cleanly.
        let frame = [WIRE_VERSION, 0xFF, 0, 0, 0, 0, 0, 0, 0, 0x10];
        assert!(decode::<Vec<u8>>(&frame, 1024).is_err());
    }
}
