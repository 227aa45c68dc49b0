//! The swarm manifest: what a swarm trains and how, signed by its creator.
//! The swarm id is the hash of the signed manifest's wire encoding.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::{DeltaCodec, Hash32, wire};

/// Domain tag of manifest signatures.
pub const MANIFEST_DOMAIN: &[u8] = b"nightshift/manifest/v1\0";
/// Manifest format version (2: the inner optimizer; 3: bootstrap keys, attestation quorum,
/// aggregator and pre-shared key fingerprint; 4: datasets of many files, shards, tokenizer.json;
/// 5: the averaging).
pub const MANIFEST_VERSION: u32 = 5;

/// Most files a dataset may list.
pub const MAX_DATA_FILES: usize = 1 << 16;
/// Longest file path in a dataset, in bytes.
pub const MAX_DATA_PATH: usize = 1024;
/// Largest vocabulary a model may have.
pub const MAX_VOCAB: u32 = 1 << 20;

/// Most bootstrap keys a manifest may list.
pub const MAX_BOOTSTRAPS: usize = 64;
/// Most members an allowlist may hold.
pub const MAX_MEMBERS: usize = crate::message::MAX_LISTED;

/// Domain tag of a pre-shared key's fingerprint.
pub const PSK_DOMAIN: &[u8] = b"nightshift/psk/v1\0";

/// The fingerprint a manifest pins a private swarm's pre-shared key by (SHA-256 of the key with a
/// domain tag): the key itself never enters the manifest, which anyone may read.
pub fn psk_fingerprint(key: &[u8; 32]) -> Hash32 {
    Hash32::of(&[PSK_DOMAIN, key])
}

/// How a round's contributions are combined into the outer step's input. Every node of a swarm
/// applies the manifest's aggregator to the same contributions in the same order, so all reach
/// the same state; the choice is part of the swarm's recipe.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Aggregator {
    /// The token-weighted mean: the most accurate when every member is honest, and moved
    /// anywhere by a single malicious contribution.
    Mean,
    /// Centered clipping (Karimireddy et al. 2021): every contribution's norm is first bounded
    /// by twice the round's median norm, then, from the coordinate-wise median, `iters` times:
    /// move the center by the token-weighted mean of each contribution's offset clipped to
    /// `clip_mult` times the median offset. A minority of contributions can move the result by
    /// a bounded amount only.
    CenteredClip { clip_mult: f32, iters: u32 },
}

impl Aggregator {
    /// The default: centered clipping at the median offset with three iterations. Without an
    /// attacker it ends where the mean does; with a minority attacking, close to the honest
    /// members alone (measured in BENCHMARKS.md).
    pub const ROBUST: Aggregator = Aggregator::CenteredClip {
        clip_mult: 1.0,
        iters: 3,
    };

    /// Checks the parameters.
    ///
    /// # Errors
    /// A parameter out of its range, named.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Aggregator::Mean => Ok(()),
            Aggregator::CenteredClip { clip_mult, iters } => {
                if !(clip_mult > 0.0 && clip_mult <= 100.0) {
                    return Err(format!("clip multiple {clip_mult} is not within (0, 100]"));
                }
                if !(1..=10).contains(&iters) {
                    return Err(format!("{iters} iterations is not within 1..=10"));
                }
                Ok(())
            }
        }
    }

    /// Whether the aggregator bounds what a minority of contributions can do.
    pub fn is_robust(&self) -> bool {
        !matches!(self, Aggregator::Mean)
    }
}

impl std::fmt::Display for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Aggregator::Mean => f.write_str("mean"),
            Aggregator::CenteredClip { clip_mult, iters } => {
                write!(f, "cclip:{clip_mult}:{iters}")
            }
        }
    }
}

impl std::str::FromStr for Aggregator {
    type Err = String;

    /// Parses `mean` or `cclip[:CLIP[:ITERS]]`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.split(':');
        let name = parts.next().unwrap_or_default().to_ascii_lowercase();
        let args: Vec<&str> = parts.collect();
        let num = |i: usize, what: &str| -> Result<Option<f64>, String> {
            args.get(i)
                .map(|a| {
                    a.parse::<f64>()
                        .map_err(|_| format!("{what} must be a number, not {a:?} (in {s:?})"))
                })
                .transpose()
        };
        let agg = match name.as_str() {
            "mean" if args.is_empty() => Aggregator::Mean,
            "cclip" if args.len() <= 2 => {
                let Aggregator::CenteredClip { clip_mult, iters } = Aggregator::ROBUST else {
                    unreachable!("the robust default is centered clipping")
                };
                Aggregator::CenteredClip {
                    clip_mult: num(0, "the clip multiple")?.map_or(clip_mult, |v| v as f32),
                    iters: num(1, "the iteration count")?.map_or(iters, |v| v as u32),
                }
            }
            _ => {
                return Err(format!(
                    "unknown aggregator {s:?}: expected mean or cclip[:CLIP[:ITERS]]"
                ));
            }
        };
        agg.validate().map_err(|e| format!("{s}: {e}"))?;
        Ok(agg)
    }
}

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

/// The model architecture (a GPT).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The byte tokenizer's symbols, in token order (the distinct bytes of the corpus); empty
    /// when the data names a `tokenizer.json`.
    pub vocab: Vec<u8>,
    /// Number of token ids: `vocab.len()`, or the `tokenizer.json`'s vocabulary size.
    pub vocab_size: u32,
    pub d_model: u32,
    pub n_layers: u32,
    pub n_heads: u32,
    pub d_ff: u32,
    pub seq_len: u32,
}

/// One file of a dataset, pinned by its size and hash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataFile {
    /// Path relative to the dataset's directory (`/`-separated); empty when the dataset is this
    /// one file.
    pub path: String,
    pub bytes: u64,
    /// SHA-256 of the file; nodes refuse a different one.
    pub sha256: Hash32,
}

/// The data every node trains on: files of UTF-8 text or JSON lines (a `text` field per line),
/// read as one stream in the listed order. The last `val_permille` thousandths of the stream
/// are held out for validation; the rest is cut into shards of about `shard_bytes` (a shard
/// never spans two files), and each node trains each round on `shards_per_round` shards drawn
/// from its key and the round.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataSpec {
    /// Where the creator's copy was: "embedded:shakespeare", a file, or a directory; a node
    /// looks there unless told otherwise (`run --data`).
    pub name: String,
    /// The files, in stream order.
    pub files: Vec<DataFile>,
    /// Thousandths of the stream held out for validation (taken from the end).
    pub val_permille: u32,
    /// Nominal size of a training shard.
    pub shard_bytes: u64,
    /// Shards each node reads per round (drawn independently; their text is joined).
    pub shards_per_round: u32,
    /// A Hugging Face `tokenizer.json` (its `path` as the creator gave it); `None`: the byte
    /// tokenizer over `ModelSpec::vocab`.
    pub tokenizer: Option<DataFile>,
}

impl DataSpec {
    /// Bytes of all files together.
    pub fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.bytes).sum()
    }
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
    /// How each round's contributions are averaged: sent to every peer, or slice by slice
    /// through reducers.
    #[serde(default)]
    pub averaging: crate::slices::Averaging,
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
    /// The bootstrap nodes' keys. A bootstrap follows the swarm by replaying every round and
    /// attests the states it verified; a node more than a round behind trusts its attestation.
    /// In a private swarm they are the only keys besides the members that may connect.
    pub bootstraps: Vec<[u8; 32]>,
    /// Private swarm: how many members must attest a state (sign a status holding it) before a
    /// node too far behind to replay adopts it (besides a bootstrap's attestation). 0 in an open
    /// swarm, where member signatures cost an attacker nothing and only bootstraps attest.
    pub attest_quorum: u32,
    /// How each round's contributions are combined.
    pub aggregator: Aggregator,
    /// [`psk_fingerprint`] of the swarm's pre-shared key (libp2p pnet) when the swarm is closed
    /// at the transport: a node needs the `swarm.key` file to connect at all.
    pub psk: Option<Hash32>,
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

    /// Keys that may connect to a node of this swarm and be served: the members and the
    /// bootstrap nodes; `None` for an open swarm.
    pub fn admitted(&self) -> Option<Vec<[u8; 32]>> {
        self.allowlist().map(|members| {
            let mut keys = members.to_vec();
            keys.extend(self.bootstraps.iter().filter(|b| !members.contains(b)));
            keys
        })
    }

    /// The attestation quorum a private swarm of `members` gets by default: one more than the
    /// number of malicious members it tolerates, ⌊(members − 1)/3⌋ (so 1 up to three members,
    /// 2 from four, 3 from seven).
    pub fn default_attest_quorum(members: usize) -> u32 {
        (members.saturating_sub(1) / 3 + 1) as u32
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
        let d = &t.data;
        match &d.tokenizer {
            None if md.vocab.is_empty() || md.vocab.len() > 256 => {
                return bad("the byte vocabulary must hold 1..=256 symbols");
            }
            None if md.vocab_size as usize != md.vocab.len() => {
                return bad("vocab_size must be the byte vocabulary's size");
            }
            Some(_) if !md.vocab.is_empty() => {
                return bad("a swarm with a tokenizer.json has no byte vocabulary");
            }
            Some(_) if md.vocab_size < 2 || md.vocab_size > MAX_VOCAB => {
                return bad("vocab_size out of range");
            }
            _ => {}
        }
        if d.files.is_empty() || d.files.len() > MAX_DATA_FILES {
            return bad("a dataset lists 1..=65536 files");
        }
        let paths_ok = d.files.iter().all(|f| {
            f.path.len() <= MAX_DATA_PATH
                && !f.path.split('/').any(|c| c == ".." || c == ".")
                && !f.path.starts_with('/')
        });
        if !paths_ok || (d.files.len() > 1 && d.files.iter().any(|f| f.path.is_empty())) {
            return bad("a data file's path must be relative, without . or .. parts");
        }
        if d.tokenizer
            .as_ref()
            .is_some_and(|t| t.path.len() > MAX_DATA_PATH)
        {
            return bad("the tokenizer's path is too long");
        }
        if d.shard_bytes < 4096 {
            return bad("shards must be at least 4096 bytes");
        }
        if !(1..=1024).contains(&d.shards_per_round) {
            return bad("shards per round must be within 1..=1024");
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
        if m.allowlist.len() > MAX_MEMBERS || m.bootstraps.len() > MAX_BOOTSTRAPS {
            return bad("too many members or bootstrap keys");
        }
        let distinct = |keys: &[[u8; 32]]| {
            keys.iter().collect::<std::collections::BTreeSet<_>>().len() == keys.len()
        };
        if !distinct(&m.allowlist) || !distinct(&m.bootstraps) {
            // A quorum counts distinct members: a key listed twice would count for two.
            return bad("a key is listed twice among the members or the bootstrap keys");
        }
        if m.allowlist.is_empty() {
            if m.attest_quorum != 0 {
                return bad("an open swarm has no attestation quorum (only bootstraps attest)");
            }
        } else if m.attest_quorum == 0 || m.attest_quorum as usize > m.allowlist.len() {
            return bad("the attestation quorum must be within 1..=members");
        }
        if let Err(e) = m.training.averaging.check(m.training.codec) {
            return bad(&format!("averaging {}: {e}", m.training.averaging));
        }
        if let Err(e) = m.aggregator.validate() {
            return bad(&format!("aggregator {}: {e}", m.aggregator));
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
                vocab_size: 3,
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
                averaging: crate::slices::Averaging::AllToAll,
                round_deadline_secs: 10,
                init_seed: 7,
                data: DataSpec {
                    name: "x".into(),
                    files: vec![DataFile {
                        path: String::new(),
                        bytes: 3,
                        sha256: Hash32::default(),
                    }],
                    val_permille: 100,
                    shard_bytes: 1 << 20,
                    shards_per_round: 16,
                    tokenizer: None,
                },
            },
            initial_state_hash: Hash32::default(),
            creator: [0; 32],
            allowlist: vec![],
            bootstraps: vec![[8; 32]],
            attest_quorum: 0,
            aggregator: Aggregator::ROBUST,
            psk: None,
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
    fn quorums_and_aggregators_are_checked() {
        let key = SigningKey::from_bytes(&[3; 32]);
        let mut m = sample();
        m.attest_quorum = 1;
        assert!(
            matches!(m.sign(&key).verify(), Err(ManifestError::Invalid(e)) if e.contains("open swarm"))
        );
        let mut m = sample();
        m.allowlist = vec![[1; 32], [2; 32]];
        m.attest_quorum = 3;
        assert!(
            matches!(m.clone().sign(&key).verify(), Err(ManifestError::Invalid(e)) if e.contains("quorum"))
        );
        m.attest_quorum = 2;
        assert!(m.clone().sign(&key).verify().is_ok());
        let mut twice = m.clone();
        twice.allowlist = vec![[1; 32], [1; 32]];
        assert!(
            matches!(twice.sign(&key).verify(), Err(ManifestError::Invalid(e)) if e.contains("twice"))
        );
        assert_eq!(
            m.admitted().unwrap(),
            vec![[1; 32], [2; 32], [8; 32]],
            "members, then bootstraps"
        );
        m.aggregator = Aggregator::CenteredClip {
            clip_mult: f32::NAN,
            iters: 3,
        };
        assert!(
            matches!(m.sign(&key).verify(), Err(ManifestError::Invalid(e)) if e.contains("aggregator"))
        );
        assert_eq!(sample().admitted(), None);
        let q: Vec<u32> = [1, 2, 3, 4, 6, 7, 10]
            .iter()
            .map(|&n| Manifest::default_attest_quorum(n))
            .collect();
        assert_eq!(q, [1, 1, 1, 2, 2, 3, 4]);
    }

    #[test]
    fn aggregators_parse_and_print_back() {
        for s in ["mean", "cclip:1.5:3", "cclip:2:1", "cclip:1:3"] {
            let a: Aggregator = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
        }
        assert_eq!("cclip".parse::<Aggregator>(), Ok(Aggregator::ROBUST));
        for bad in [
            "median",
            "cclip:0",
            "cclip:2:0",
            "cclip:x",
            "trimmed",
            "mean:1",
        ] {
            assert!(bad.parse::<Aggregator>().is_err(), "{bad}");
        }
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
