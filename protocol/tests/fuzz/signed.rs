//! Signed inputs mutated before signing, as a malicious member would send them.

use nightshift_protocol::signed::{EnvelopeHeader, PayloadKind, SignedEnvelope};
use nightshift_protocol::{Hash32, wire};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::harness::FRAME_LIMIT;
use crate::mutator::{Rng, mutate};
use crate::values::{key, member, members, outsider};

/// Signs `payload` under `h`, usually with the member key, sometimes with another member's or
/// an outsider's, sometimes with the header, the payload or the signature mutated around the
/// signing; returns the envelope frame.
pub(crate) fn signed_frame(rng: &mut Rng, mut h: EnvelopeHeader, mut payload: Vec<u8>) -> Vec<u8> {
    if rng.chance(40) {
        mutate(rng, &mut payload, &[]);
    }
    if rng.chance(15) {
        match rng.below(4) {
            0 => {
                h.kind = *rng.pick(&[
                    PayloadKind::Contribution,
                    PayloadKind::Window,
                    PayloadKind::Status,
                ])
            }
            1 => h.swarm_id = Hash32::of(&[b"another swarm"]),
            2 => h.round = *rng.pick(&[0, h.round.wrapping_sub(1), h.round + 1, u64::MAX]),
            _ => h.base_hash = Hash32::of(&[b"another state"]),
        }
    }
    let signer = match rng.below(20) {
        0 | 1 => member(),
        2 => outsider(),
        _ => key(),
    };
    let mut env = SignedEnvelope::sign(&signer, h, payload);
    if rng.chance(5) {
        match rng.below(4) {
            0 => env.signature.clear(),
            1 => env.signature.truncate(63),
            2 => env.signature.push(0),
            _ => env.signature[rng.below(64)] ^= 1 << rng.below(8),
        }
    }
    if rng.chance(3) {
        // A sender key that is not a valid point, or another member's.
        env.header.sender = if rng.chance(50) {
            [0xff; 32]
        } else {
            members()[1]
        };
    }
    let mut frame = wire::encode(&env);
    if rng.chance(10) {
        mutate(rng, &mut frame, &[]);
    }
    frame
}

/// A payload `T` encoded, decoded from a mutated encoding where that still decodes (so that
/// the value is well formed and its header can agree with it).
pub(crate) fn mutated_value<T: Serialize + DeserializeOwned>(rng: &mut Rng, v: &T) -> Option<T> {
    let mut b = wire::encode(v);
    mutate(rng, &mut b, &[]);
    wire::decode(&b, FRAME_LIMIT).ok()
}
