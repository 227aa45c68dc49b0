//! The swarm manifest: what a swarm trains and how, signed by its creator.
//! The swarm id is the hash of the signed manifest's wire encoding.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{DeltaCodec, Hash32, wire};

/// Domain tag of manifest signatures.
pub const MANIFEST_DOMAIN: &[u8] = b"nightshift/manifest/v1\0";
/// Manifest format version (2: the inner optimizer).
pub const MANIFEST_VERSION: u32 = 2;

/// The optimizer of the inner steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum InnerOptimizer {
    /// AdamW for every parameter (the DiLoCo paper's inner optimizer).
    #[default]
    AdamW,
    /// Muon (orthogonalised Nesterov-momentum updates scaled to AdamW's RMS) for the
    /// transformer blocks' weight matrices at `lr_mult` times the inner rate, AdamW for the
    /// embeddings, the head, biases and norms (MuLoCo, arXiv 2505.23725; BENCHMARKS.md).
    Muon { lr_mult: f32 },
}

impl InnerOptimizer {
    /// Muon's rate as a multiple of the inner rate; `None` for AdamW alone.
    pub fn muon_lr_mult(&self) -> Option<f64> {
        match self {
            InnerOptimizer::AdamW => None,
            InnerOptimizer::Muon { lr_mult } => Some(*lr_mult as f64),
        }
    }
}

impl std::fmt::Display for InnerOptimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InnerOptimizer::AdamW => f.write_str("adamw"),
            InnerOptimizer::Muon { lr_mult } if *lr_mult == 1.0 => f.write_str("muon"),
            InnerOptimizer::Muon { lr_mult } => write!(f, "muon:{lr_mult}"),
        }
    }
}

impl std::str::FromStr for InnerOptimizer {
    type Err = String;

    /// Parses `adamw`, `muon` or `muon:MULT` (Muon's rate as a multiple of the inner rate).
    fn from_str(s: &str) -> Result<Self, String> {
        let (name, arg) = match s.split_once(':') {
            Some((n, a)) => (n, Some(a)),
            None => (s, None),
        };
        match (name.to_ascii_lowercase().as_str(), arg) {
            ("adamw", None) => Ok(InnerOptimizer::AdamW),
            ("muon", None) => Ok(InnerOptimizer::Muon { lr_mult: 1.0 }),
            ("muon", Some(a)) => match a.parse::<f32>() {
                Ok(m) if m > 0.0 && m.is_finite() => Ok(InnerOptimizer::Muon { lr_mult: m }),
                _ => Err(format!(
                    "Muon's rate multiple must be a positive number, not {a:?} (in {s:?})"
                )),
            },
            _ => Err(format!(
                "unknown inner optimizer {s:?}: expected adamw, muon or muon:MULT"
            )),
        }
    }
}

/// The model architecture (a character-level GPT).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The characters of the vocabulary, in token order (bytes of the corpus).
    pub vocab: Vec<u8>,
    pub d_model: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    pub d_ff: u32,
    pub seq_len: u32,
}

/// The data every node trains on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataSpec {
    /// A human name ("embedded:shakespeare" or a file name).
    pub name: String,
    pub bytes: u64,
    /// SHA-256 of the corpus file; nodes refuse a different corpus.
    pub sha256: Hash32,
    /// Thousandths of the corpus held out for validation (taken from the end).
    pub val_permille: u32,
}

/// Inner and outer optimisation settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainingSpec {
    /// H: inner steps per round.
    pub inner_steps: u32,
    pub batch_size: u32,
    pub inner_lr: f32,
    pub warmup_steps: u32,
    pub weight_decay: f32,
    /// Largest global L2 norm of all inner gradients together (PyTorch's `clip_grad_norm_`); 0
    /// disables clipping.
    pub grad_clip: f32,
    /// The inner optimizer (absent from a version-1 manifest, which is refused anyway).
    #[serde(default)]
    pub inner_optimizer: InnerOptimizer,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    pub codec: DeltaCodec,
    /// How long a node waits for the others after its own contribution is out.
    pub round_deadline_secs: u32,
    pub init_seed: u64,
    pub data: DataSpec,
}

/// A swarm manifest before signing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub version: u32,
    pub name: String,
    pub created_unix: u64,
    pub model: ModelSpec,
    pub training: TrainingSpec,
    /// Hash of the genesis state θ(0) (round 0, zero momentum).
    pub initial_state_hash: Hash32,
    /// Creator's ed25519 public key.
    pub creator: [u8; 32],
    /// When non-empty, only these keys may contribute (a private swarm).
    pub allowlist: Vec<[u8; 32]>,
}

/// A manifest with its creator's signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignedManifest {
    pub manifest: Manifest,
    pub signature: Vec<u8>,
}

/// Why a manifest was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error(
        "manifest version {0} is not supported (this build reads version {MANIFEST_VERSION}): \
         create the swarm again with `nightshift swarm init`"
    )]
    Version(u32),
    #[error("manifest signature is malformed or does not verify")]
    BadSignature,
    #[error("creator key is invalid")]
    BadCreator,
    #[error("manifest is inconsistent: {0}")]
    Invalid(String),
}

impl Manifest {
    fn signing_bytes(&self) -> Vec<u8> {
        let mut msg = MANIFEST_DOMAIN.to_vec();
        msg.extend_from_slice(&wire::encode_as(wire::MANIFEST_FRAME_VERSION, self));
        msg
    }

    /// Signs the manifest; `creator` is set from `key`.
    pub fn sign(mut self, key: &SigningKey) -> SignedManifest {
        self.creator = key.verifying_key().to_bytes();
        let signature = key.sign(&self.signing_bytes()).to_bytes().to_vec();
        SignedManifest {
            manifest: self,
            signature,
        }
    }

    /// The allowlist as an option: `None` for an open swarm.
    pub fn allowlist(&self) -> Option<&[[u8; 32]]> {
        (!self.allowlist.is_empty()).then_some(self.allowlist.as_slice())
    }
}

impl SignedManifest {
    /// The swarm id: hash of the whole signed manifest.
    pub fn swarm_id(&self) -> Hash32 {
        Hash32::of(&[&wire::encode_as(wire::MANIFEST_FRAME_VERSION, self)])
    }

    /// Checks the version, the creator's signature and basic consistency.
    ///
    /// # Errors
    /// See [`ManifestError`].
    pub fn verify(&self) -> Result<(), ManifestError> {
        let m = &self.manifest;
        if m.version != MANIFEST_VERSION {
            return Err(ManifestError::Version(m.version));
        }
        let sig: [u8; 64] = self
            .signature
            .as_slice()
            .try_into()
            .map_err(|_| ManifestError::BadSignature)?;
        let key = VerifyingKey::from_bytes(&m.creator).map_err(|_| ManifestError::BadCreator)?;
        key.verify(&m.signing_bytes(), &Signature::from_bytes(&sig))
            .map_err(|_| ManifestError::BadSignature)?;
        let md = &m.model;
        let t = &m.training;
        let bad = |s: &str| Err(ManifestError::Invalid(s.to_string()));
        if md.vocab.is_empty() || md.vocab.len() > 256 {
            return bad("vocabulary must hold 1..=256 symbols");
        }
        if md.n_heads == 0 || md.d_model == 0 || !md.d_model.is_multiple_of(md.n_heads) {
            return bad("d_model must be a positive multiple of n_heads");
        }
        if md.n_layers == 0
            || md.n_layers > 256
            || md.d_model > 65536
            || md.d_ff == 0
            || md.d_ff > 1 << 18
        {
            return bad("model dimensions out of range");
        }
        if md.seq_len < 2 || md.seq_len > 1 << 16 {
            return bad("seq_len out of range");
        }
        if t.inner_steps == 0 || t.batch_size == 0 || t.batch_size > 1 << 16 {
            return bad("inner_steps and batch_size must be positive");
        }
        let finite = [
            t.inner_lr,
            t.weight_decay,
            t.grad_clip,
            t.outer_lr,
            t.outer_momentum,
        ];
        if finite.iter().any(|v| !v.is_finite() || *v < 0.0) || t.outer_momentum >= 1.0 {
            return bad("optimiser settings must be finite, non-negative, momentum < 1");
        }
        if t.data.val_permille == 0 || t.data.val_permille >= 1000 {
            return bad("val_permille must be within 1..=999");
        }
        if let Err(e) = t.codec.validate() {
            return bad(&format!("codec {}: {e}", t.codec));
        }
        if let InnerOptimizer::Muon { lr_mult } = t.inner_optimizer
            && !(lr_mult > 0.0 && lr_mult.is_finite() && lr_mult <= 1000.0)
        {
            return bad("Muon's rate multiple must be within (0, 1000]");
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn sample() -> Manifest {
        Manifest {
            version: MANIFEST_VERSION,
            name: "test".into(),
            created_unix: 1,
            model: ModelSpec {
                vocab: b"abc".to_vec(),
                d_model: 8,
                n_layers: 1,
                n_heads: 2,
                d_ff: 16,
                seq_len: 4,
            },
            training: TrainingSpec {
                inner_steps: 5,
                batch_size: 2,
                inner_lr: 1e-3,
                warmup_steps: 1,
                weight_decay: 0.1,
                grad_clip: 1.0,
                inner_optimizer: InnerOptimizer::Muon { lr_mult: 1.0 },
                outer_lr: 0.7,
                outer_momentum: 0.9,
                codec: DeltaCodec::Int8 { block: 64 },
                round_deadline_secs: 10,
                init_seed: 7,
                data: DataSpec {
                    name: "x".into(),
                    bytes: 3,
                    sha256: Hash32::default(),
                    val_permille: 100,
                },
            },
            initial_state_hash: Hash32::default(),
            creator: [0; 32],
            allowlist: vec![],
        }
    }

    #[test]
    fn signed_manifest_verifies_and_any_change_breaks_it() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let s = sample().sign(&key);
        s.verify().unwrap();
        let mut t = s.clone();
        t.manifest.training.outer_lr = 0.8;
        assert_eq!(t.verify(), Err(ManifestError::BadSignature));
        assert_ne!(s.swarm_id(), t.swarm_id());
    }

    #[test]
    fn inconsistent_manifests_are_refused_even_when_signed() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut m = sample();
        m.model.n_heads = 3;
        assert!(matches!(
            m.sign(&key).verify(),
            Err(ManifestError::Invalid(_))
        ));
        let mut m = sample();
        m.training.codec = DeltaCodec::LowRank {
            rank: 0,
            block: 256,
        };
        assert!(matches!(
            m.sign(&key).verify(),
            Err(ManifestError::Invalid(e)) if e.contains("rank 0")
        ));
        let mut m = sample();
        m.training.codec = DeltaCodec::LowRank {
            rank: 20,
            block: 256,
        };
        assert!(m.sign(&key).verify().is_ok());
        let mut m = sample();
        m.training.inner_optimizer = InnerOptimizer::Muon { lr_mult: f32::NAN };
        assert!(matches!(
            m.sign(&key).verify(),
            Err(ManifestError::Invalid(e)) if e.contains("Muon")
        ));
    }

    #[test]
    fn a_version_1_manifest_is_refused_with_what_to_do() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut m = sample();
        m.version = 1;
        let err = m.sign(&key).verify().unwrap_err();
        assert_eq!(err, ManifestError::Version(1));
        assert!(err.to_string().contains("swarm init"), "{err}");
    }

    #[test]
    fn inner_optimizers_parse_and_print_back() {
        for s in ["adamw", "muon", "muon:2", "muon:0.5"] {
            let o: InnerOptimizer = s.parse().unwrap();
            assert_eq!(o.to_string(), s);
        }
        assert_eq!(
            "Muon:1".parse::<InnerOptimizer>(),
            Ok(InnerOptimizer::Muon { lr_mult: 1.0 })
        );
        for bad in ["sgd", "muon:0", "muon:-1", "muon:x", "adamw:2", "muon:inf"] {
            assert!(bad.parse::<InnerOptimizer>().is_err(), "{bad}");
        }
    }
}
