//! ed25519 signed envelopes.
//!
//! An envelope binds its payload to a swarm, a round, a sender and the hash of the state the
//! payload was computed from. The signature covers a domain tag, the encoded header and the
//! SHA-256 of the payload, so any change to any of them is caught. Receivers call
//! [`SignedEnvelope::verify`] *before* decoding the payload.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Hash32;

/// Domain separation for envelope signatures.
pub const ENVELOPE_DOMAIN: &[u8] = b"nightshift/envelope/v1\0";

/// What an envelope carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PayloadKind {
    /// A pseudo-gradient for one round ([`crate::Contribution`]).
    Contribution,
    /// A node's advertised window ([`crate::message::WindowRecord`]); `round` is its time stamp.
    Window,
    /// A node's status ([`crate::Status`]): `round` and `base_hash` are the round and the hash of
    /// the state it holds, so a signed status is also its signer's attestation of that state.
    Status,
    /// The signed header of a contribution cut into slices ([`crate::slices::SlicedContribution`]).
    SlicedContribution,
    /// A reducer's average of one slice of a round ([`crate::slices::ReducedSlice`]).
    ReducedSlice,
}

/// The signed, bound part of an envelope besides the payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeHeader {
    pub kind: PayloadKind,
    pub swarm_id: Hash32,
    pub round: u64,
    /// The sender's ed25519 public key (also its libp2p identity).
    pub sender: [u8; 32],
    /// Hash of the state θ(round) the payload was computed from.
    pub base_hash: Hash32,
}

/// A payload with its header and an ed25519 signature over both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedEnvelope {
    pub header: EnvelopeHeader,
    pub payload: Vec<u8>,
    /// 64 bytes when well formed; anything else is refused by [`SignedEnvelope::verify`].
    pub signature: Vec<u8>,
}

/// What a receiver expects of an envelope.
#[derive(Clone, Copy, Debug)]
pub struct Expectation<'a> {
    pub kind: PayloadKind,
    pub swarm_id: Hash32,
    pub round: u64,
    pub base_hash: Hash32,
    /// When `Some`, only these senders are accepted (a private swarm's allowlist).
    pub allowlist: Option<&'a [[u8; 32]]>,
    /// Largest payload accepted.
    pub max_payload: usize,
}

/// Why an envelope was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("envelope is unsigned or its signature is malformed ({0} bytes)")]
    MalformedSignature(usize),
    #[error("sender key is not a valid ed25519 public key")]
    BadSenderKey,
    #[error("signature does not verify (forged or tampered)")]
    BadSignature,
    #[error("sender {0} is not a member of this swarm")]
    NotAMember(String),
    #[error("envelope is for another swarm ({0})")]
    WrongSwarm(String),
    #[error("envelope is for round {got}, expected {expected}")]
    WrongRound { got: u64, expected: u64 },
    #[error("envelope is based on state {got}, expected {expected}")]
    WrongBase { got: String, expected: String },
    #[error("envelope carries {got:?}, expected {expected:?}")]
    WrongKind {
        got: PayloadKind,
        expected: PayloadKind,
    },
    #[error("payload of {len} bytes exceeds {limit}")]
    PayloadTooLarge { len: usize, limit: usize },
}

fn signing_bytes(header: &EnvelopeHeader, payload: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(ENVELOPE_DOMAIN.len() + 128);
    msg.extend_from_slice(ENVELOPE_DOMAIN);
    msg.extend_from_slice(&crate::wire::encode(header));
    msg.extend_from_slice(&Hash32::of(&[payload]).0);
    msg
}

impl SignedEnvelope {
    /// Signs `payload` under `header`; `header.sender` is set from `key`.
    pub fn sign(key: &SigningKey, mut header: EnvelopeHeader, payload: Vec<u8>) -> Self {
        header.sender = key.verifying_key().to_bytes();
        let sig = key.sign(&signing_bytes(&header, &payload));
        SignedEnvelope {
            header,
            payload,
            signature: sig.to_bytes().to_vec(),
        }
    }

    /// What the signature covers, hashed: the same for every copy of this envelope and different
    /// for any other envelope (another payload or header), whatever the signature bytes.
    pub fn digest(&self) -> Hash32 {
        Hash32::of(&[&signing_bytes(&self.header, &self.payload)])
    }

    /// Checks the signature alone (and, when given, that the sender is on `allowlist`): enough
    /// to keep an envelope for a round not reached yet, whose other bindings cannot be checked.
    ///
    /// # Errors
    /// A malformed or wrong signature, a bad key, or a sender not on the allowlist.
    pub fn check_signer(&self, allowlist: Option<&[[u8; 32]]>) -> Result<(), VerifyError> {
        let sig: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| VerifyError::MalformedSignature(self.signature.len()))?;
        let key =
            VerifyingKey::from_bytes(&self.header.sender).map_err(|_| VerifyError::BadSenderKey)?;
        key.verify(
            &signing_bytes(&self.header, &self.payload),
            &Signature::from_bytes(&sig),
        )
        .map_err(|_| VerifyError::BadSignature)?;
        if let Some(allow) = allowlist
            && !allow.contains(&self.header.sender)
        {
            return Err(VerifyError::NotAMember(hex::encode(
                &self.header.sender[..8],
            )));
        }
        Ok(())
    }

    /// Checks the signature, then every binding in `expect`. Returns the payload on success.
    ///
    /// # Errors
    /// The first reason the envelope is unacceptable; see [`VerifyError`].
    pub fn verify(&self, expect: &Expectation<'_>) -> Result<&[u8], VerifyError> {
        self.verify_unless_verified(expect, None)
    }

    /// [`Self::verify`], except that the signature is not checked again when this envelope is
    /// byte for byte `verified` (signature included), which the caller verified before: every
    /// binding in `expect` still is. A node holds a contributor's header once it counted it;
    /// each slice of that contribution carries the same header (at 1,000 contributors, each
    /// reducer's 1,000 slice checks were a third of its work).
    ///
    /// # Errors
    /// As [`Self::verify`].
    pub fn verify_unless_verified(
        &self,
        expect: &Expectation<'_>,
        verified: Option<&SignedEnvelope>,
    ) -> Result<&[u8], VerifyError> {
        if self.payload.len() > expect.max_payload {
            return Err(VerifyError::PayloadTooLarge {
                len: self.payload.len(),
                limit: expect.max_payload,
            });
        }
        if verified == Some(self) {
            if let Some(allow) = expect.allowlist
                && !allow.contains(&self.header.sender)
            {
                return Err(VerifyError::NotAMember(hex::encode(
                    &self.header.sender[..8],
                )));
            }
        } else {
            self.check_signer(expect.allowlist)?;
        }
        let h = &self.header;
        if h.kind != expect.kind {
            return Err(VerifyError::WrongKind {
                got: h.kind,
                expected: expect.kind,
            });
        }
        if h.swarm_id != expect.swarm_id {
            return Err(VerifyError::WrongSwarm(h.swarm_id.short()));
        }
        if h.round != expect.round {
            return Err(VerifyError::WrongRound {
                got: h.round,
                expected: expect.round,
            });
        }
        if h.base_hash != expect.base_hash {
            return Err(VerifyError::WrongBase {
                got: h.base_hash.short(),
                expected: expect.base_hash.short(),
            });
        }
        Ok(&self.payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn header(round: u64) -> EnvelopeHeader {
        EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: Hash32::of(&[b"swarm"]),
            round,
            sender: [0; 32],
            base_hash: Hash32::of(&[b"base"]),
        }
    }

    fn expect(allow: Option<&[[u8; 32]]>) -> Expectation<'_> {
        Expectation {
            kind: PayloadKind::Contribution,
            swarm_id: Hash32::of(&[b"swarm"]),
            round: 3,
            base_hash: Hash32::of(&[b"base"]),
            allowlist: allow,
            max_payload: 1024,
        }
    }

    #[test]
    fn only_the_very_envelope_verified_before_skips_its_signature_and_never_its_bindings() {
        let a = SignedEnvelope::sign(&key(1), header(3), b"delta".to_vec());
        assert!(a.verify_unless_verified(&expect(None), Some(&a)).is_ok());
        // The same content under another signature is checked, and refused.
        let mut forged = a.clone();
        forged.signature[0] ^= 1;
        assert_eq!(
            forged.verify_unless_verified(&expect(None), Some(&a)),
            Err(VerifyError::BadSignature)
        );
        // Verified before or not, the bindings and the allowlist still hold.
        let mut later = expect(None);
        later.round = 4;
        assert!(matches!(
            a.verify_unless_verified(&later, Some(&a)),
            Err(VerifyError::WrongRound { .. })
        ));
        let other = [key(2).verifying_key().to_bytes()];
        assert!(matches!(
            a.verify_unless_verified(&expect(Some(&other)), Some(&a)),
            Err(VerifyError::NotAMember(_))
        ));
        // Another envelope given as verified changes nothing.
        let b = SignedEnvelope::sign(&key(1), header(3), b"other".to_vec());
        assert_eq!(
            forged.verify_unless_verified(&expect(None), Some(&b)),
            Err(VerifyError::BadSignature)
        );
    }

    #[test]
    fn a_digest_names_the_content_not_the_copy() {
        let a = SignedEnvelope::sign(&key(1), header(3), b"delta".to_vec());
        assert_eq!(a.digest(), a.clone().digest());
        let b = SignedEnvelope::sign(&key(1), header(3), b"other".to_vec());
        assert_ne!(
            a.digest(),
            b.digest(),
            "two contributions of one sender differ"
        );
        let c = SignedEnvelope::sign(&key(1), header(4), b"delta".to_vec());
        assert_ne!(a.digest(), c.digest());
        assert!(a.check_signer(None).is_ok());
        assert!(matches!(
            a.check_signer(Some(&[key(2).verifying_key().to_bytes()])),
            Err(VerifyError::NotAMember(_))
        ));
        let mut t = a.clone();
        t.payload[0] ^= 1;
        assert_eq!(t.check_signer(None), Err(VerifyError::BadSignature));
    }

    #[test]
    fn accepts_a_correctly_bound_envelope() {
        let e = SignedEnvelope::sign(&key(1), header(3), b"delta".to_vec());
        assert_eq!(e.verify(&expect(None)).unwrap(), b"delta");
        let allow = [key(1).verifying_key().to_bytes()];
        assert!(e.verify(&expect(Some(&allow))).is_ok());
    }

    #[test]
    fn refuses_tampering_forgery_and_wrong_bindings() {
        let good = SignedEnvelope::sign(&key(1), header(3), b"delta".to_vec());

        let mut t = good.clone();
        t.payload[0] ^= 1;
        assert_eq!(t.verify(&expect(None)), Err(VerifyError::BadSignature));

        let mut t = good.clone();
        t.header.round = 4;
        assert_eq!(t.verify(&expect(None)), Err(VerifyError::BadSignature));

        let mut t = good.clone();
        t.signature.clear();
        assert_eq!(
            t.verify(&expect(None)),
            Err(VerifyError::MalformedSignature(0))
        );

        // Claims to be from key 2 but signed by key 1.
        let mut t = good.clone();
        t.header.sender = key(2).verifying_key().to_bytes();
        assert_eq!(t.verify(&expect(None)), Err(VerifyError::BadSignature));

        let outsider = [key(9).verifying_key().to_bytes()];
        assert!(matches!(
            good.verify(&expect(Some(&outsider))),
            Err(VerifyError::NotAMember(_))
        ));

        let stale = SignedEnvelope::sign(&key(1), header(2), b"delta".to_vec());
        assert_eq!(
            stale.verify(&expect(None)),
            Err(VerifyError::WrongRound {
                got: 2,
                expected: 3
            })
        );

        let mut h = header(3);
        h.base_hash = Hash32::of(&[b"other"]);
        let other_base = SignedEnvelope::sign(&key(1), h, b"delta".to_vec());
        assert!(matches!(
            other_base.verify(&expect(None)),
            Err(VerifyError::WrongBase { .. })
        ));

        let mut h = header(3);
        h.swarm_id = Hash32::of(&[b"other swarm"]);
        let other_swarm = SignedEnvelope::sign(&key(1), h, b"delta".to_vec());
        assert!(matches!(
            other_swarm.verify(&expect(None)),
            Err(VerifyError::WrongSwarm(_))
        ));

        let big = SignedEnvelope::sign(&key(1), header(3), vec![0; 2000]);
        assert!(matches!(
            big.verify(&expect(None)),
            Err(VerifyError::PayloadTooLarge { .. })
        ));
    }
}
