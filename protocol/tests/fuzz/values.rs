//! Realistic values to start from: keys, statuses, window records, states and manifests.

use ed25519_dalek::SigningKey;
use nightshift_protocol::manifest::{DataFile, DataSpec, MAX_BOOTSTRAPS, MAX_MEMBERS};
use nightshift_protocol::message::{
    NodeRole, Phase, StateSnapshot, Status, StatusLists, WindowRecord, WindowState,
};
use nightshift_protocol::signed::{EnvelopeHeader, PayloadKind};
use nightshift_protocol::{
    Aggregator, Contribution, ContributionId, DeltaCodec, EncodedDelta, Hash32, InnerOptimizer,
    Manifest, ModelSpec, TrainingSpec,
};

use crate::deltas::{FP32, INT4, INT8, LOWRANK, TOPK, mutate_codec};
use crate::harness::NOW_MS;
use crate::mutator::Rng;

pub(crate) fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// Another member of the private swarm.
pub(crate) fn member() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}

/// A key outside every allowlist.
pub(crate) fn outsider() -> SigningKey {
    SigningKey::from_bytes(&[11; 32])
}

pub(crate) fn members() -> [[u8; 32]; 2] {
    [
        key().verifying_key().to_bytes(),
        member().verifying_key().to_bytes(),
    ]
}

pub(crate) fn swarm() -> Hash32 {
    Hash32::of(&[b"fuzz swarm"])
}

pub(crate) fn base() -> Hash32 {
    Hash32::of(&[b"fuzz base"])
}

pub(crate) const ROUND: u64 = 3;

pub(crate) fn contribution(delta: EncodedDelta) -> Contribution {
    Contribution {
        tokens: 25 * 8 * 64,
        inner_steps: 25,
        train_loss: 2.31,
        delta,
        expected: 3,
    }
}

pub(crate) fn header(kind: PayloadKind, round: u64, base_hash: Hash32) -> EnvelopeHeader {
    EnvelopeHeader {
        kind,
        swarm_id: swarm(),
        round,
        sender: [0; 32],
        base_hash,
    }
}

/// Contribution ids of `senders`, each with a digest of its own.
pub(crate) fn ids(senders: &[[u8; 32]]) -> Vec<ContributionId> {
    senders
        .iter()
        .map(|&sender| ContributionId {
            sender,
            digest: Hash32::of(&[&sender, b"contribution"]),
        })
        .collect()
}

pub(crate) fn statuses() -> Vec<Status> {
    let keys: Vec<[u8; 32]> = (1..=5u8).map(|i| [i; 32]).collect();
    let status = |role, phase, round, state_hash, lists: &StatusLists, unix_ms| Status {
        unix_ms,
        ..Status::summarizing(role, phase, round, state_hash, lists)
    };
    vec![
        status(
            NodeRole::Trainer,
            Phase::Training,
            ROUND,
            base(),
            &status_lists()[0],
            NOW_MS - 1500,
        ),
        status(
            NodeRole::Bootstrap,
            Phase::Ready,
            0,
            Hash32::of(&[b"genesis"]),
            &StatusLists::default(),
            NOW_MS + 20,
        ),
        status(
            NodeRole::Trainer,
            Phase::Paused,
            1_000_000,
            base(),
            &StatusLists {
                formed_by: ids(&keys),
                holding: keys,
            },
            NOW_MS,
        ),
    ]
}

/// The lists of the first of [`statuses`].
pub(crate) fn status_lists() -> Vec<StatusLists> {
    let keys: Vec<[u8; 32]> = (1..=5u8).map(|i| [i; 32]).collect();
    vec![StatusLists {
        formed_by: ids(&keys[..3]),
        holding: keys[..1].to_vec(),
    }]
}

pub(crate) fn window_records() -> Vec<WindowRecord> {
    vec![
        WindowRecord {
            device_kind: "cuda".into(),
            device_name: "NVIDIA H200".into(),
            memory_bytes: 141 << 30,
            tokens_per_sec: 125_000.0,
            open_until: Some(1_700_003_600),
            state: WindowState::Training,
            reason: String::new(),
            round: 12,
            updated_at: 1_700_000_000,
        },
        WindowRecord {
            device_kind: "cpu".into(),
            device_name: "cpu (16 threads)".into(),
            memory_bytes: 0,
            tokens_per_sec: 0.0,
            open_until: None,
            state: WindowState::Busy,
            reason: "the owner is at the keyboard".into(),
            round: 0,
            updated_at: 1_700_000_100,
        },
    ]
}

pub(crate) fn snapshot(n: usize, noise: Option<f64>) -> StateSnapshot {
    let mut rng = Rng(0x57a7e);
    StateSnapshot {
        round: ROUND,
        params: (0..n).map(|_| rng.normalish() * 0.02).collect(),
        momentum: (0..n).map(|_| rng.normalish() * 1e-4).collect(),
        formed_by: ids(&members()),
        noise,
    }
}

pub(crate) fn manifests() -> Vec<Manifest> {
    let open = Manifest {
        version: nightshift_protocol::manifest::MANIFEST_VERSION,
        name: "fuzz".into(),
        created_unix: 1_700_000_000,
        model: ModelSpec {
            vocab: (b' '..=b'~').collect(),
            vocab_size: 95,
            d_model: 64,
            n_layers: 2,
            n_heads: 4,
            d_ff: 256,
            seq_len: 64,
        },
        training: TrainingSpec {
            inner_steps: 25,
            batch_size: 8,
            inner_lr: 1e-3,
            warmup_steps: 10,
            weight_decay: 0.1,
            grad_clip: 1.0,
            inner_optimizer: InnerOptimizer::Muon { lr_mult: 1.0 },
            outer_lr: 0.7,
            outer_momentum: 0.7,
            codec: DeltaCodec::Int4 { block: 64 },
            averaging: nightshift_protocol::slices::Averaging::AllToAll,
            round_deadline_secs: 30,
            init_seed: 7,
            data: DataSpec {
                name: "embedded:shakespeare".into(),
                files: vec![DataFile {
                    path: String::new(),
                    bytes: 1_115_394,
                    sha256: Hash32::of(&[b"corpus"]),
                }],
                val_permille: 50,
                shard_bytes: 1 << 20,
                shards_per_round: 16,
                tokenizer: None,
            },
        },
        initial_state_hash: Hash32::of(&[b"genesis"]),
        creator: [0; 32],
        allowlist: vec![],
        bootstraps: vec![[8; 32]],
        attest_quorum: 0,
        aggregator: Aggregator::ROBUST,
        psk: None,
    };
    let mut private = open.clone();
    private.name = "private fuzz".into();
    private.allowlist = members().to_vec();
    private.attest_quorum = 1;
    private.psk = Some(nightshift_protocol::psk_fingerprint(&[3; 32]));
    private.aggregator = Aggregator::Mean;
    private.training.inner_optimizer = InnerOptimizer::AdamW;
    private.training.codec = DeltaCodec::LowRank {
        rank: 23,
        block: 256,
    };
    let mut mean = open.clone();
    mean.aggregator = Aggregator::Mean;
    mean.training.codec = DeltaCodec::TopK { permille: 30 };
    mean.bootstraps = vec![[8; 32], [10; 32], [12; 32]];
    vec![open, private, mean]
}

/// `m` with one field set to a value at or beyond its bound.
pub(crate) fn tweak_manifest(rng: &mut Rng, m: &mut Manifest) {
    let u32s = [
        0,
        1,
        2,
        3,
        255,
        256,
        257,
        999,
        1000,
        65536,
        65537,
        1 << 18,
        u32::MAX,
    ];
    let f32s = [
        0.0, -0.0, -1.0, 0.5, 0.999, 1.0, 100.0, 100.1, 1000.0, 1000.5,
    ];
    let f32s_bad = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
    ];
    let f = |rng: &mut Rng| {
        if rng.chance(30) {
            *rng.pick(&f32s_bad)
        } else {
            *rng.pick(&f32s)
        }
    };
    match rng.below(28) {
        0 => m.version = *rng.pick(&[0, 1, 2, 3, 5, u32::MAX]),
        1 => m.model.vocab = vec![b'a'; *rng.pick(&[0usize, 1, 256, 257])],
        2 => m.model.d_model = *rng.pick(&u32s),
        3 => m.model.n_heads = *rng.pick(&u32s),
        4 => m.model.n_layers = *rng.pick(&u32s),
        5 => m.model.d_ff = *rng.pick(&u32s),
        6 => m.model.seq_len = *rng.pick(&u32s),
        7 => m.training.inner_steps = *rng.pick(&u32s),
        8 => m.training.batch_size = *rng.pick(&u32s),
        9 => m.training.inner_lr = f(rng),
        10 => m.training.weight_decay = f(rng),
        11 => m.training.grad_clip = f(rng),
        12 => m.training.outer_lr = f(rng),
        13 => m.training.outer_momentum = f(rng),
        14 => m.training.data.val_permille = *rng.pick(&u32s),
        15 => {
            let all: Vec<DeltaCodec> = [&FP32[..], &INT8, &INT4, &TOPK, &LOWRANK].concat();
            let c = *rng.pick(&all);
            m.training.codec = mutate_codec(rng, c);
        }
        16 => m.training.inner_optimizer = InnerOptimizer::Muon { lr_mult: f(rng) },
        17 => {
            let n = *rng.pick(&[0, 1, 2, MAX_MEMBERS, MAX_MEMBERS + 1]);
            m.allowlist = (0..n).map(|i| Hash32::of(&[&i.to_le_bytes()]).0).collect();
        }
        18 => m.bootstraps = vec![[8; 32]; *rng.pick(&[0, 1, MAX_BOOTSTRAPS, MAX_BOOTSTRAPS + 1])],
        19 => m.attest_quorum = *rng.pick(&u32s),
        20 => {
            m.aggregator = Aggregator::CenteredClip {
                clip_mult: f(rng),
                iters: *rng.pick(&[0, 1, 10, 11, u32::MAX]),
            }
        }
        21 => m.aggregator = Aggregator::Mean,
        22 => m.psk = rng.chance(50).then(|| Hash32::of(&[b"psk"])),
        23 => m.model.vocab_size = *rng.pick(&u32s),
        24 => {
            let n = *rng.pick(&[0usize, 1, 2, 65536, 65537]);
            let path = rng
                .pick(&["", "a.txt", "../a", "/etc/passwd", "d/./x"])
                .to_string();
            m.training.data.files = vec![
                DataFile {
                    path,
                    bytes: 1,
                    sha256: Hash32::default(),
                };
                n
            ];
        }
        25 => m.training.data.shard_bytes = *rng.pick(&[0, 1, 4095, 4096, u64::MAX]),
        26 => m.training.data.shards_per_round = *rng.pick(&[0, 1, 1024, 1025, u32::MAX]),
        _ => m.name = "n".repeat(*rng.pick(&[0, 1, 256, 4096])),
    }
}
