//! Swarm genesis: the manifest, θ(0), and the corpus a manifest names.

use ed25519_dalek::SigningKey;
use nightshift_model::backend::{Cpu, cpu_device};
use nightshift_model::{GptConfig, flat};
use nightshift_protocol::manifest::{InnerOptimizer, MANIFEST_VERSION};
use nightshift_protocol::slices::Averaging;
use nightshift_protocol::{
    Aggregator, DeltaCodec, Hash32, Manifest, ModelSpec, SignedManifest, StateSnapshot,
    TrainingSpec, psk_fingerprint,
};
use std::path::PathBuf;
use thiserror::Error;

/// Why a swarm could not be created or its data loaded.
#[derive(Debug, Error)]
pub enum GenesisError {
    #[error("unknown model preset {0:?} (expected tiny, small, medium or large)")]
    UnknownPreset(String),
    #[error("cannot read corpus {path}")]
    ReadCorpus {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    BadData { path: String, why: String },
    #[error("data file {path} does not match the manifest ({got}, expected {expected})")]
    CorpusMismatch {
        path: String,
        got: String,
        expected: String,
    },
    // Transparent: the inner messages say "corpus" and "manifest" themselves, and a wrapping
    // message with `{0}` would print twice through anyhow's `{:#}` (once more as the source).
    #[error(transparent)]
    Corpus(#[from] nightshift_model::DataError),
    #[error(transparent)]
    Manifest(#[from] nightshift_protocol::ManifestError),
    #[error("the manifest's model does not fit the model code: {0}")]
    Model(String),
}

/// Everything `nightshift swarm init` can set. Defaults are the settings measured best (see
/// BENCHMARKS.md).
#[derive(Clone, Debug)]
pub struct SwarmSettings {
    pub name: String,
    pub preset: String,
    /// `None`: the embedded Shakespeare corpus; else a text or JSON-lines file, or a directory of
    /// them.
    pub data: Option<PathBuf>,
    /// A Hugging Face `tokenizer.json`; `None`: the byte tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// Nominal size of a training shard; `None`: [`default_shards`].
    pub shard_bytes: Option<u64>,
    /// Shards a node reads per round; `None`: [`default_shards`].
    pub shards_per_round: Option<u32>,
    pub inner_steps: u32,
    pub batch_size: u32,
    pub inner_lr: f32,
    pub warmup_steps: u32,
    pub weight_decay: f32,
    pub grad_clip: f32,
    pub inner_optimizer: InnerOptimizer,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    pub codec: DeltaCodec,
    /// How each round's contributions are averaged.
    pub averaging: Averaging,
    pub round_deadline_secs: u32,
    pub init_seed: u64,
    pub val_permille: u32,
    /// Keys allowed to contribute; empty for an open swarm.
    pub allowlist: Vec<[u8; 32]>,
    /// The bootstrap nodes' keys.
    pub bootstraps: Vec<[u8; 32]>,
    /// Members that must attest a state for a node too far behind to replay (private swarms);
    /// `None`: [`Manifest::default_attest_quorum`].
    pub attest_quorum: Option<u32>,
    /// How each round's contributions are combined.
    pub aggregator: Aggregator,
    /// The pre-shared key that closes the swarm at the transport (libp2p pnet).
    pub psk: Option<[u8; 32]>,
}

impl Default for SwarmSettings {
    fn default() -> Self {
        SwarmSettings {
            name: "nightshift".into(),
            preset: "small".into(),
            data: None,
            tokenizer: None,
            shard_bytes: None,
            shards_per_round: None,
            // H = 25 ended as low as H = 50 at T = 1000 and lost half as much to dropped
            // contributions (docs/bench/HISTORY.md, sixteenth pass).
            inner_steps: 25,
            batch_size: 16,
            // Behind a 200-step warm-up, 3e-3 trained DiLoCo best at T = 1000 (docs/bench/HISTORY.md).
            inner_lr: 3e-3,
            warmup_steps: 200,
            weight_decay: 0.1,
            grad_clip: 1.0,
            // Muon for the matrices ended DiLoCo and sync several percent lower (docs/bench/HISTORY.md).
            inner_optimizer: InnerOptimizer::Muon { lr_mult: 1.0 },
            outer_lr: 0.7,
            // 0.7 at H = 25: as low as 0.8 without drops, lower with them (docs/bench/HISTORY.md).
            outer_momentum: 0.7,
            // int4 was free against fp32 at T = 1000 (BENCHMARKS.md) and sends half of int8.
            codec: DeltaCodec::Int4 { block: 64 },
            averaging: Averaging::AllToAll,
            round_deadline_secs: 60,
            init_seed: 42,
            val_permille: 100,
            allowlist: vec![],
            bootstraps: vec![],
            attest_quorum: None,
            // Free without an attacker, bounded with one (BENCHMARKS.md, trust).
            aggregator: Aggregator::ROBUST,
            psk: None,
        }
    }
}

/// Most shards a node reads per round.
pub const MAX_SHARDS_PER_ROUND: u32 = 1024;
/// The smallest default shard.
pub const MIN_SHARD_BYTES: u64 = 4096;

/// How a recipe's data is cut by default: (shard bytes, shards per round). A node's round reads
/// about one shard per window it trains on (H × batch, at most [`MAX_SHARDS_PER_ROUND`]), so
/// that its windows come from as many places of the dataset as if each were drawn from all of
/// it; together they hold eight times the round's text (so that windows rarely repeat), and a
/// shard at least [`MIN_SHARD_BYTES`].
pub fn default_shards(
    inner_steps: u32,
    batch: u32,
    seq_len: usize,
    bytes_per_token: f64,
) -> (u64, u32) {
    let per_round = (inner_steps.saturating_mul(batch)).clamp(1, MAX_SHARDS_PER_ROUND);
    let round_bytes = inner_steps as f64 * batch as f64 * seq_len as f64 * bytes_per_token;
    let shard = ((8.0 * round_bytes) as u64 / u64::from(per_round)).max(MIN_SHARD_BYTES);
    (shard, per_round)
}

/// The burn model config a manifest describes.
pub fn model_config(spec: &ModelSpec) -> GptConfig {
    GptConfig::new(spec.vocab_size as usize)
        .with_d_model(spec.d_model as usize)
        .with_n_layers(spec.n_layers as usize)
        .with_n_heads(spec.n_heads as usize)
        .with_d_ff(spec.d_ff as usize)
        .with_seq_len(spec.seq_len as usize)
}

/// θ(0) of the swarm `m` describes: round 0, genesis parameters, zero momentum.
pub fn genesis_state(m: &Manifest) -> StateSnapshot {
    let cfg = model_config(&m.model);
    let model = cfg.init::<Cpu>(&cpu_device());
    let params = flat::genesis_params::<Cpu, _>(&model, m.training.init_seed);
    let momentum = vec![0.0; params.len()];
    StateSnapshot {
        round: 0,
        params,
        momentum,
        formed_by: vec![],
        noise: None,
    }
}

/// Builds, checks and signs a manifest.
///
/// # Errors
/// On an unknown preset, an unreadable or unusable corpus, or inconsistent settings.
pub fn build_manifest(
    s: &SwarmSettings,
    creator: &SigningKey,
    created_unix: u64,
) -> Result<SignedManifest, GenesisError> {
    let built = crate::data::build_data(s.data.as_deref(), s.tokenizer.as_deref(), s.val_permille)?;
    let tok = &built.tokenizer;
    let cfg = GptConfig::preset(&s.preset, tok.len())
        .ok_or_else(|| GenesisError::UnknownPreset(s.preset.clone()))?;
    let mut data = built.spec;
    // Refuse data the nodes could not use, now rather than on every node: enough validation
    // text, and shards long enough for a window.
    let val = tok.encode(
        &built
            .dataset
            .val_text(crate::data::VAL_MAX_BYTES)
            .map_err(|e| GenesisError::ReadCorpus {
                path: data.name.clone(),
                source: e,
            })?,
    )?;
    let sample = built.dataset.shard_text(0).unwrap_or_default();
    let sample = &sample[..sample.len().min(1 << 20)];
    let sample_tokens = tok.encode(sample)?.len().max(1);
    let bytes_per_token = sample.len() as f64 / sample_tokens as f64;
    let needed = cfg.seq_len + 1;
    if val.len() < needed || (sample.len() as f64 / bytes_per_token) < needed as f64 {
        return Err(nightshift_model::DataError::TooSmall {
            tokens: val.len().min(sample_tokens),
            needed,
        }
        .into());
    }
    let (shard, per_round) =
        default_shards(s.inner_steps, s.batch_size, cfg.seq_len, bytes_per_token);
    data.shard_bytes = s.shard_bytes.unwrap_or(shard);
    data.shards_per_round = s.shards_per_round.unwrap_or(per_round);
    let mut m = Manifest {
        version: MANIFEST_VERSION,
        name: s.name.clone(),
        created_unix,
        model: ModelSpec {
            vocab: tok.byte_vocab().map(<[u8]>::to_vec).unwrap_or_default(),
            vocab_size: tok.len() as u32,
            d_model: cfg.d_model as u32,
            n_layers: cfg.n_layers as u32,
            n_heads: cfg.n_heads as u32,
            d_ff: cfg.d_ff as u32,
            seq_len: cfg.seq_len as u32,
        },
        training: TrainingSpec {
            inner_steps: s.inner_steps,
            batch_size: s.batch_size,
            inner_lr: s.inner_lr,
            warmup_steps: s.warmup_steps,
            weight_decay: s.weight_decay,
            grad_clip: s.grad_clip,
            inner_optimizer: s.inner_optimizer,
            outer_lr: s.outer_lr,
            outer_momentum: s.outer_momentum,
            codec: s.codec,
            averaging: s.averaging,
            round_deadline_secs: s.round_deadline_secs,
            init_seed: s.init_seed,
            data,
        },
        initial_state_hash: Hash32::default(),
        creator: [0; 32],
        allowlist: s.allowlist.clone(),
        bootstraps: s.bootstraps.clone(),
        attest_quorum: if s.allowlist.is_empty() {
            0
        } else {
            s.attest_quorum
                .unwrap_or_else(|| Manifest::default_attest_quorum(s.allowlist.len()))
        },
        aggregator: s.aggregator,
        psk: s.psk.as_ref().map(psk_fingerprint),
    };
    m.initial_state_hash = genesis_state(&m).hash();
    let signed = m.sign(creator);
    signed.verify()?;
    Ok(signed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_pins_its_corpus_and_genesis() {
        let key = SigningKey::from_bytes(&[5; 32]);
        let s = SwarmSettings {
            preset: "tiny".into(),
            ..Default::default()
        };
        let m = build_manifest(&s, &key, 0).unwrap();
        m.verify().unwrap();
        assert_eq!(m.manifest.model.vocab.len(), 84);
        assert_eq!(
            genesis_state(&m.manifest).hash(),
            m.manifest.initial_state_hash
        );
        let md = &m.manifest;
        let load =
            |spec| crate::data::load_data(spec, &md.model.vocab, md.model.vocab_size, None, None);
        assert!(load(&md.training.data).is_ok());
        let mut other = md.training.data.clone();
        other.files[0].sha256 = Hash32::default();
        assert!(matches!(
            load(&other),
            Err(GenesisError::CorpusMismatch { .. })
        ));
        let bad = SwarmSettings {
            preset: "huge".into(),
            ..Default::default()
        };
        assert!(matches!(
            build_manifest(&bad, &key, 0),
            Err(GenesisError::UnknownPreset(_))
        ));
    }
}
