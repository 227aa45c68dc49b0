//! A stable-Rust fuzzing harness for every decoder a peer can reach (no cargo-fuzz, no nightly).
//!
//! Each `fuzz_*` test feeds one decoder a deterministic stream of inputs: a few purely random
//! byte strings, and mostly *valid* encodings of realistic values (envelopes signed with a fixed
//! key, deltas from the crate's own encoders, a signed manifest) mutated by bit flips, byte
//! overwrites with interesting values, truncation, extension, insertion and deletion of runs,
//! splices from other seeds and varint length fields rewritten to huge values. Signed inputs are
//! also mutated *before* signing, as a malicious member would, so that the decoders behind the
//! signature check are reached. Every decode runs inside `catch_unwind`; a test fails on the
//! first panic (printing the input in hex), on an input slower than `NIGHTSHIFT_FUZZ_SLOW_MS`
//! (2000 by default), or when a decoded value breaks an invariant of its decoder.
//!
//! `NIGHTSHIFT_FUZZ_CASES` sets the inputs per target (2000 by default) and
//! `NIGHTSHIFT_FUZZ_SEED` the seed (decimal or `0x` hex). `scripts/fuzz.sh` runs a million per
//! target in a release build. Each target prints one line:
//! `fuzz <target>: <inputs> inputs, <ok> decoded, <err> refused, <panics> panics (...)`,
//! whose parenthesis gives the seed, the time, the slowest input and the process's peak virtual
//! memory so far (with `--test-threads=1`, a jump there after a target means one of its inputs
//! made a decoder allocate that much). `NIGHTSHIFT_FUZZ_REASONS=1` also lists the refusals by
//! reason, which shows how deep into each decoder the inputs get.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use ed25519_dalek::SigningKey;
use nightshift_protocol::delta::{self, MAX_BLOCK, MAX_RANK};
use nightshift_protocol::manifest::{DataSpec, MAX_BOOTSTRAPS, MAX_MEMBERS};
use nightshift_protocol::message::{
    self, MAX_CHUNK_BYTES, MAX_LISTED, MAX_STATUS_SKEW_MS, NodeRole, Phase, StateChunk,
    StateSnapshot, Status, WindowRecord, WindowState,
};
use nightshift_protocol::signed::{EnvelopeHeader, Expectation, PayloadKind, SignedEnvelope};
use nightshift_protocol::{
    Aggregator, Contribution, ContributionId, DeltaCodec, EncodedDelta, Hash32, InnerOptimizer,
    MAX_MESSAGE_BYTES, Manifest, ModelSpec, Request, Response, SignedManifest, TrainingSpec,
    WIRE_VERSION, wire,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

// ---------------------------------------------------------------------------------------------
// The harness: configuration, a deterministic RNG, the mutator and the runner.
// ---------------------------------------------------------------------------------------------

const DEFAULT_CASES: usize = 2000;
const DEFAULT_SEED: u64 = 0x6e69_6768_7473_6869;
const DEFAULT_SLOW_MS: u64 = 2000;

/// Largest frame the frame targets accept (the node's limits are of this order for everything
/// but full states).
const FRAME_LIMIT: usize = 1 << 20;
/// The receiver's clock in the status target.
const NOW_MS: u64 = 1_700_000_000_000;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

fn cases() -> usize {
    env_u64("NIGHTSHIFT_FUZZ_CASES").map_or(DEFAULT_CASES, |n| n as usize)
}

fn base_seed() -> u64 {
    env_u64("NIGHTSHIFT_FUZZ_SEED").unwrap_or(DEFAULT_SEED)
}

fn slow_limit() -> Duration {
    Duration::from_millis(env_u64("NIGHTSHIFT_FUZZ_SLOW_MS").unwrap_or(DEFAULT_SLOW_MS))
}

/// splitmix64: tiny, deterministic, good enough to drive a mutator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `pct`/100.
    fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }

    /// Roughly normal, mean 0, spread 1.
    fn normalish(&mut self) -> f32 {
        let u = (0..4)
            .map(|_| (self.next() >> 11) as f64 / (1u64 << 53) as f64)
            .sum::<f64>();
        ((u - 2.0) * 1.7) as f32
    }
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Bytes that make decoders take other paths: 0 and 1 (empty, false, first variant), 0x7f/0x80
/// (sign bits), 0xfa (largest one-byte varint), 0xfb..=0xfe (bincode's u16/u32/u64/u128 varint
/// markers) and 0xff.
const INTERESTING: [u8; 10] = [0, 1, 2, 0x7f, 0x80, 0xfa, 0xfb, 0xfc, 0xfd, 0xff];

/// A varint claiming a huge length or count.
fn huge_varint(rng: &mut Rng) -> Vec<u8> {
    let mut v = Vec::with_capacity(17);
    match rng.below(9) {
        0 => v.extend([0xfb, 0xff, 0xff]),
        1 => {
            v.push(0xfc);
            v.extend(u32::MAX.to_le_bytes());
        }
        2 => {
            // Just within bincode's own limit: only the frame's size can refuse it.
            v.push(0xfc);
            v.extend((MAX_MESSAGE_BYTES as u32 - 16 - rng.below(64) as u32).to_le_bytes());
        }
        3 => {
            v.push(0xfc);
            v.extend(((1u32 << 20) + rng.below(1 << 20) as u32).to_le_bytes());
        }
        4 => {
            v.push(0xfd);
            v.extend(u64::MAX.to_le_bytes());
        }
        5 => {
            v.push(0xfd);
            v.extend(((1u64 << 32) + rng.below(1 << 20) as u64).to_le_bytes());
        }
        6 => {
            v.push(0xfe);
            v.extend(u128::MAX.to_le_bytes());
        }
        7 => {
            // A non-canonical encoding of a small value.
            v.push(0xfb);
            v.extend((rng.below(251) as u16).to_le_bytes());
        }
        _ => {
            v.push(0xfc);
            v.extend((rng.next() as u32).to_le_bytes());
        }
    }
    v
}

/// Applies one to a few random mutations to `data`; `pool` is spliced from.
fn mutate(rng: &mut Rng, data: &mut Vec<u8>, pool: &[Vec<u8>]) {
    let rounds = if rng.chance(10) {
        2 + rng.below(8)
    } else {
        1 + rng.below(3)
    };
    for _ in 0..rounds {
        let len = data.len();
        match rng.below(13) {
            0 | 1 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            2 if len > 0 => {
                let i = rng.below(len);
                data[i] = *rng.pick(&INTERESTING);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.byte();
            }
            4 => {
                // Truncation, usually near the end.
                let cut = if rng.chance(50) {
                    len.saturating_sub(1 + rng.below(8))
                } else {
                    rng.below(len + 1)
                };
                data.truncate(cut);
            }
            5 => {
                let n = 1 + rng.below(64);
                let extra = rng.bytes(n);
                data.extend(extra);
            }
            6 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(32);
                let run: Vec<u8> = if rng.chance(50) {
                    rng.bytes(n)
                } else {
                    vec![*rng.pick(&INTERESTING); n]
                };
                data.splice(at..at, run);
            }
            7 if len > 0 => {
                let at = rng.below(len);
                let n = (1 + rng.below(32)).min(len - at);
                data.drain(at..at + n);
            }
            8 | 9 if len > 1 => {
                // Rewrite what may be a one-byte varint (length, count, variant) as a huge one.
                let at = 1 + rng.below(len - 1);
                let v = huge_varint(rng);
                data.splice(at..at + 1, v);
            }
            10 if len > 0 => {
                // Copy a run elsewhere.
                let a = rng.below(len);
                let b = (a + 1 + rng.below(64)).min(len);
                let chunk = data[a..b].to_vec();
                let at = rng.below(len + 1);
                data.splice(at..at, chunk);
            }
            11 if !pool.is_empty() && len > 0 => {
                // Splice the tail of another seed.
                let other = rng.pick(pool);
                let at = rng.below(len);
                let from = rng.below(other.len() + 1);
                data.truncate(at);
                data.extend_from_slice(&other[from..]);
            }
            12 if len > 0 => {
                // Small arithmetic: a length off by a little.
                let i = rng.below(len);
                let d = 1 + rng.below(4) as u8;
                data[i] = if rng.chance(50) {
                    data[i].wrapping_add(d)
                } else {
                    data[i].wrapping_sub(d)
                };
            }
            _ => {
                let i = rng.below(len + 1);
                data.insert(i, rng.byte());
            }
        }
    }
}

/// A frame-level input: random bytes, a seed as is, or a mutated seed.
fn frame_input(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    match rng.below(100) {
        0..=2 => {
            let n = rng.below(300);
            rng.bytes(n)
        }
        3..=5 => {
            let n = rng.below(300);
            let mut b = vec![WIRE_VERSION];
            b.extend(rng.bytes(n));
            b
        }
        6..=10 => rng.pick(seeds).clone(),
        _ => {
            let mut b = rng.pick(seeds).clone();
            mutate(rng, &mut b, seeds);
            b
        }
    }
}

thread_local! {
    /// Set while a fuzz input runs: the panic hook records instead of printing.
    static QUIET: Cell<bool> = const { Cell::new(false) };
    static LAST_PANIC: RefCell<String> = const { RefCell::new(String::new()) };
    static REASONS: RefCell<BTreeMap<String, u64>> = const { RefCell::new(BTreeMap::new()) };
}

fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if QUIET.with(Cell::get) {
                LAST_PANIC.with(|p| *p.borrow_mut() = info.to_string());
            } else {
                default(info);
            }
        }));
    });
}

fn reasons_wanted() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("NIGHTSHIFT_FUZZ_REASONS").is_some())
}

/// Counts a refusal; with `NIGHTSHIFT_FUZZ_REASONS` set, by its reason (numbers elided), which
/// the summary then lists: how deep the inputs get.
fn refused(e: impl std::fmt::Debug) -> bool {
    if reasons_wanted() {
        // Words holding a digit (numbers, hashes) become '#', so that reasons group.
        let text = format!("{e:?}");
        let mut key = String::new();
        let mut word = String::new();
        for c in text.chars().chain([' ']) {
            if c.is_ascii_alphanumeric() {
                word.push(c);
                continue;
            }
            if word.bytes().any(|b| b.is_ascii_digit()) {
                key.push('#');
            } else {
                key.push_str(&word);
            }
            word.clear();
            key.push(c);
        }
        key.truncate(key.floor_char_boundary(90));
        REASONS.with(|r| *r.borrow_mut().entry(key).or_default() += 1);
    }
    false
}

fn hex(b: &[u8]) -> String {
    hex::encode(b)
}

/// Peak virtual memory of the process (Linux), for the summary line.
fn vm_peak_mib() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmPeak:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or_else(|| "n/a".into(), |kb| format!("{} MiB", kb / 1024))
}

/// Runs `cases()` inputs from `generate` through `check` (true: decoded, false: refused), each inside
/// `catch_unwind`, prints the summary line and fails on a panic or a slow input.
fn fuzz<I>(
    target: &str,
    mut generate: impl FnMut(&mut Rng) -> I,
    show: impl Fn(&I) -> String,
    check: impl Fn(&I) -> bool,
) {
    install_quiet_hook();
    let n = cases();
    let seed = base_seed();
    let mut rng = Rng(seed ^ fnv1a(target));
    let (mut ok, mut err, mut panics) = (0u64, 0u64, 0u64);
    let mut first_panic: Option<(String, String)> = None;
    let mut slowest = (Duration::ZERO, String::new());
    let started = Instant::now();
    for _ in 0..n {
        let input = generate(&mut rng);
        QUIET.with(|q| q.set(true));
        let t = Instant::now();
        let r = panic::catch_unwind(AssertUnwindSafe(|| check(&input)));
        let dt = t.elapsed();
        QUIET.with(|q| q.set(false));
        match r {
            Ok(true) => ok += 1,
            Ok(false) => err += 1,
            Err(_) => {
                panics += 1;
                if first_panic.is_none() {
                    let msg = LAST_PANIC.with(|p| p.borrow().clone());
                    first_panic = Some((show(&input), msg));
                }
            }
        }
        if dt > slowest.0 {
            slowest = (dt, show(&input));
        }
    }
    println!(
        "fuzz {target}: {n} inputs, {ok} decoded, {err} refused, {panics} panics \
         (seed {seed:#x}, {:.1} s, slowest input {:.2} ms, vm peak {})",
        started.elapsed().as_secs_f64(),
        slowest.0.as_secs_f64() * 1e3,
        vm_peak_mib(),
    );
    let mut reasons: Vec<(String, u64)> = REASONS
        .with(|r| std::mem::take(&mut *r.borrow_mut()))
        .into_iter()
        .collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (why, count) in reasons {
        println!("  {target} refused {count}: {why}");
    }
    if let Some((input, msg)) = &first_panic {
        println!("fuzz {target}: first panicking input: {input}\n  {msg}");
    }
    assert_eq!(
        panics,
        0,
        "{target}: first panicking input: {}",
        first_panic
            .map(|(i, m)| format!("{i}\n{m}"))
            .unwrap_or_default()
    );
    assert!(
        slowest.0 < slow_limit(),
        "{target}: an input took {:?}: {}",
        slowest.0,
        slowest.1
    );
}

/// A decoded value re-encodes to a frame that decodes to the same encoding.
fn assert_stable<T: Serialize + DeserializeOwned>(v: &T, limit: usize) {
    let re = wire::encode(v);
    let back: T = wire::decode(&re, limit).expect("a decoded value's encoding decodes");
    assert_eq!(wire::encode(&back), re, "re-encoding is stable");
}

// ---------------------------------------------------------------------------------------------
// Realistic values to start from.
// ---------------------------------------------------------------------------------------------

fn key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

/// Another member of the private swarm.
fn member() -> SigningKey {
    SigningKey::from_bytes(&[9; 32])
}

/// A key outside every allowlist.
fn outsider() -> SigningKey {
    SigningKey::from_bytes(&[11; 32])
}

fn members() -> [[u8; 32]; 2] {
    [
        key().verifying_key().to_bytes(),
        member().verifying_key().to_bytes(),
    ]
}

fn swarm() -> Hash32 {
    Hash32::of(&[b"fuzz swarm"])
}

fn base() -> Hash32 {
    Hash32::of(&[b"fuzz base"])
}

const ROUND: u64 = 3;

/// The receiver's model for every codec but low-rank: a 16×24 matrix and a bias.
fn shapes() -> Vec<Vec<usize>> {
    vec![vec![16, 24], vec![8]]
}
const N: usize = 16 * 24 + 8;

/// The receiver's model for the low-rank codec: two matrices and a bias.
fn lowrank_shapes() -> Vec<Vec<usize>> {
    vec![vec![16, 24], vec![8], vec![24, 8]]
}
const N_LOWRANK: usize = 16 * 24 + 8 + 24 * 8;

fn model_for(codec: DeltaCodec) -> (usize, Vec<Vec<usize>>) {
    match codec {
        DeltaCodec::LowRank { .. } => (N_LOWRANK, lowrank_shapes()),
        _ => (N, shapes()),
    }
}

/// A delta of `n` values of one of a few kinds.
fn delta_values(rng: &mut Rng, n: usize, kind: usize) -> Vec<f32> {
    match kind % 5 {
        0 => (0..n).map(|_| rng.normalish() * 1e-3).collect(),
        1 => vec![0.0; n],
        2 => (0..n)
            .map(|i| {
                if i % 97 == 5 {
                    rng.normalish() * 10.0
                } else {
                    rng.normalish() * 1e-5
                }
            })
            .collect(),
        3 => (0..n)
            .map(|k| {
                let (i, j) = ((k / 24) as f32, (k % 24) as f32);
                ((i * 0.3).sin() * (j * 0.2).cos() + 0.3 * (i * 0.1).cos()) * 1e-2
            })
            .collect(),
        _ => (0..n)
            .map(|_| [-6e4f32, 6e4, 1e-8, -1e-8][rng.below(4)])
            .collect(),
    }
}

/// An encoded delta with its uncompressed codec body.
#[derive(Clone)]
struct DeltaSeed {
    enc: EncodedDelta,
    raw: Vec<u8>,
}

fn delta_seeds(codecs: &[DeltaCodec]) -> Vec<DeltaSeed> {
    let mut rng = Rng(0xde17a);
    let mut out = Vec::new();
    for &codec in codecs {
        let (n, shapes) = model_for(codec);
        for kind in 0..5 {
            let v = delta_values(&mut rng, n, kind);
            let enc = delta::encode_shaped(codec, &v, &shapes, &mut Vec::new());
            let size = delta::raw_body_size_shaped(codec, n, &shapes);
            let raw = zstd::bulk::decompress(&enc.body, size).expect("our own body decompresses");
            assert!(delta::decode_shaped(&enc, n, &shapes).is_ok() || kind == 4);
            out.push(DeltaSeed { enc, raw });
        }
    }
    out
}

const FP32: [DeltaCodec; 1] = [DeltaCodec::Fp32];
const FP16: [DeltaCodec; 1] = [DeltaCodec::Fp16];
const INT8: [DeltaCodec; 5] = [
    DeltaCodec::Int8 { block: 64 },
    DeltaCodec::Int8 { block: 7 },
    DeltaCodec::Int8 { block: 1 },
    DeltaCodec::Int8 { block: N as u32 },
    DeltaCodec::Int8 { block: MAX_BLOCK },
];
const INT4: [DeltaCodec; 5] = [
    DeltaCodec::Int4 { block: 64 },
    DeltaCodec::Int4 { block: 32 },
    DeltaCodec::Int4 { block: 1 },
    DeltaCodec::Int4 { block: 3 },
    DeltaCodec::Int4 { block: MAX_BLOCK },
];
const TOPK: [DeltaCodec; 4] = [
    DeltaCodec::TopK { permille: 30 },
    DeltaCodec::TopK { permille: 1 },
    DeltaCodec::TopK { permille: 500 },
    DeltaCodec::TopK { permille: 1000 },
];
const LOWRANK: [DeltaCodec; 6] = [
    DeltaCodec::LowRank { rank: 4, block: 32 },
    DeltaCodec::LowRank { rank: 1, block: 16 },
    // Rank 9 still factors the 16×24 matrix, not the 24×8 one; rank 10 factors neither.
    DeltaCodec::LowRank { rank: 9, block: 64 },
    DeltaCodec::LowRank {
        rank: 10,
        block: 256,
    },
    DeltaCodec::LowRank { rank: 2, block: 1 },
    DeltaCodec::LowRank {
        rank: MAX_RANK,
        block: MAX_BLOCK,
    },
];

/// Another codec of the same family with parameters at or beyond their bounds (or, rarely,
/// another family: a body read as the wrong codec).
fn mutate_codec(rng: &mut Rng, c: DeltaCodec) -> DeltaCodec {
    let b32 = [
        0,
        1,
        2,
        7,
        64,
        N as u32,
        MAX_BLOCK,
        MAX_BLOCK + 1,
        u32::MAX,
        rng.next() as u32,
    ];
    let b16 = [
        0,
        1,
        2,
        4,
        9,
        10,
        999,
        1000,
        1001,
        MAX_RANK,
        MAX_RANK + 1,
        u16::MAX,
        rng.next() as u16,
    ];
    if rng.chance(10) {
        let all = [FP32[0], FP16[0], INT8[0], INT4[0], TOPK[0], LOWRANK[0]];
        return *rng.pick(&all);
    }
    match c {
        DeltaCodec::Fp32 | DeltaCodec::Fp16 => c,
        DeltaCodec::Int8 { .. } => DeltaCodec::Int8 {
            block: *rng.pick(&b32),
        },
        DeltaCodec::Int4 { .. } => DeltaCodec::Int4 {
            block: *rng.pick(&b32),
        },
        DeltaCodec::TopK { .. } => DeltaCodec::TopK {
            permille: *rng.pick(&b16),
        },
        DeltaCodec::LowRank { rank, block } => match rng.below(3) {
            0 => DeltaCodec::LowRank {
                rank: *rng.pick(&b16),
                block,
            },
            1 => DeltaCodec::LowRank {
                rank,
                block: *rng.pick(&b32),
            },
            _ => DeltaCodec::LowRank {
                rank: *rng.pick(&b16),
                block: *rng.pick(&b32),
            },
        },
    }
}

/// A delta derived from `seed`: its compressed body mutated, or its raw body mutated and
/// compressed again (which reaches the codec's own checks), sometimes with another length or
/// codec parameters.
fn mutated_delta(rng: &mut Rng, seed: &DeltaSeed, pool: &[Vec<u8>]) -> EncodedDelta {
    let mut enc = seed.enc.clone();
    match rng.below(100) {
        0..=7 => {}
        8..=42 => mutate(rng, &mut enc.body, pool),
        43..=84 => {
            let mut raw = seed.raw.clone();
            if rng.chance(15) {
                // Right size, random content: NaN scales, indices out of order.
                raw = rng.bytes(raw.len());
            } else {
                mutate(rng, &mut raw, &[]);
            }
            enc.body = zstd::bulk::compress(&raw, 1).expect("compressing in memory");
        }
        85..=89 => {
            let n = rng.below(200);
            enc.body = rng.bytes(n);
        }
        _ => {
            // A valid zstd frame of some other size.
            let n = rng.below(2 * seed.raw.len() + 16);
            enc.body = zstd::bulk::compress(&rng.bytes(n), 1).expect("compressing in memory");
        }
    }
    if rng.chance(5) {
        let (n, r) = (enc.len, rng.next() as u32);
        enc.len = *rng.pick(&[0, 1, n.wrapping_sub(1), n + 1, 2 * n, u32::MAX, r]);
    }
    if rng.chance(8) {
        enc.codec = mutate_codec(rng, enc.codec);
    }
    enc
}

fn contribution(delta: EncodedDelta) -> Contribution {
    Contribution {
        tokens: 25 * 8 * 64,
        inner_steps: 25,
        train_loss: 2.31,
        delta,
        expected: 3,
    }
}

fn header(kind: PayloadKind, round: u64, base_hash: Hash32) -> EnvelopeHeader {
    EnvelopeHeader {
        kind,
        swarm_id: swarm(),
        round,
        sender: [0; 32],
        base_hash,
    }
}

/// Contribution ids of `senders`, each with a digest of its own.
fn ids(senders: &[[u8; 32]]) -> Vec<ContributionId> {
    senders
        .iter()
        .map(|&sender| ContributionId {
            sender,
            digest: Hash32::of(&[&sender, b"contribution"]),
        })
        .collect()
}

fn statuses() -> Vec<Status> {
    let keys: Vec<[u8; 32]> = (1..=5u8).map(|i| [i; 32]).collect();
    vec![
        Status {
            role: NodeRole::Trainer,
            phase: Phase::Training,
            round: ROUND,
            state_hash: base(),
            formed_by: ids(&keys[..3]),
            holding: keys[..1].to_vec(),
            unix_ms: NOW_MS - 1500,
        },
        Status {
            role: NodeRole::Bootstrap,
            phase: Phase::Ready,
            round: 0,
            state_hash: Hash32::of(&[b"genesis"]),
            formed_by: vec![],
            holding: vec![],
            unix_ms: NOW_MS + 20,
        },
        Status {
            role: NodeRole::Trainer,
            phase: Phase::Paused,
            round: 1_000_000,
            state_hash: base(),
            formed_by: ids(&keys),
            holding: keys,
            unix_ms: NOW_MS,
        },
    ]
}

fn window_records() -> Vec<WindowRecord> {
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

fn snapshot(n: usize, noise: Option<f64>) -> StateSnapshot {
    let mut rng = Rng(0x57a7e);
    StateSnapshot {
        round: ROUND,
        params: (0..n).map(|_| rng.normalish() * 0.02).collect(),
        momentum: (0..n).map(|_| rng.normalish() * 1e-4).collect(),
        formed_by: ids(&members()),
        noise,
    }
}

fn manifests() -> Vec<Manifest> {
    let open = Manifest {
        version: nightshift_protocol::manifest::MANIFEST_VERSION,
        name: "fuzz".into(),
        created_unix: 1_700_000_000,
        model: ModelSpec {
            vocab: (b' '..=b'~').collect(),
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
            round_deadline_secs: 30,
            init_seed: 7,
            data: DataSpec {
                name: "embedded:shakespeare".into(),
                bytes: 1_115_394,
                sha256: Hash32::of(&[b"corpus"]),
                val_permille: 50,
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
fn tweak_manifest(rng: &mut Rng, m: &mut Manifest) {
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
    match rng.below(24) {
        0 => m.version = *rng.pick(&[0, 1, 2, 4, u32::MAX]),
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
        _ => m.name = "n".repeat(*rng.pick(&[0, 1, 256, 4096])),
    }
}

// ---------------------------------------------------------------------------------------------
// Signed inputs mutated before signing, as a malicious member would send them.
// ---------------------------------------------------------------------------------------------

/// Signs `payload` under `h`, usually with the member key, sometimes with another member's or
/// an outsider's, sometimes with the header, the payload or the signature mutated around the
/// signing; returns the envelope frame.
fn signed_frame(rng: &mut Rng, mut h: EnvelopeHeader, mut payload: Vec<u8>) -> Vec<u8> {
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
fn mutated_value<T: Serialize + DeserializeOwned>(rng: &mut Rng, v: &T) -> Option<T> {
    let mut b = wire::encode(v);
    mutate(rng, &mut b, &[]);
    wire::decode(&b, FRAME_LIMIT).ok()
}

// ---------------------------------------------------------------------------------------------
// The targets.
// ---------------------------------------------------------------------------------------------

fn envelope_seeds() -> Vec<SignedEnvelope> {
    let mut out: Vec<SignedEnvelope> = delta_seeds(&[INT4[0], TOPK[0], FP16[0]])
        .into_iter()
        .step_by(2)
        .map(|s| {
            SignedEnvelope::sign(
                &key(),
                header(PayloadKind::Contribution, ROUND, base()),
                wire::encode(&contribution(s.enc)),
            )
        })
        .collect();
    out.extend(
        statuses()
            .iter()
            .map(|s| message::sign_status(&key(), swarm(), s)),
    );
    out.extend(
        window_records()
            .iter()
            .map(|r| message::sign_window(&member(), swarm(), base(), r)),
    );
    out
}

fn request_seeds() -> Vec<Vec<u8>> {
    let envs = envelope_seeds();
    let mut reqs = vec![
        Request::GetStatus,
        Request::GetContribution {
            round: ROUND,
            sender: members()[1],
        },
        Request::GetState { round: None },
        Request::GetState { round: Some(0) },
        Request::GetManifest,
        Request::GetStateChunk {
            hash: base(),
            offset: 3 << 20,
            len: MAX_CHUNK_BYTES,
        },
    ];
    for e in envs {
        reqs.push(match e.header.kind {
            PayloadKind::Contribution => Request::Push(e),
            _ => Request::Announce(e),
        });
    }
    reqs.iter().map(wire::encode).collect()
}

#[test]
fn fuzz_frame_request() {
    let seeds = request_seeds();
    fuzz(
        "frame-request",
        |rng| frame_input(rng, &seeds),
        |b| hex(b),
        |b| match wire::decode::<Request>(b, FRAME_LIMIT) {
            Ok(r) => {
                assert_stable(&r, FRAME_LIMIT);
                true
            }
            Err(e) => refused(e),
        },
    );
}

fn response_seeds() -> Vec<Vec<u8>> {
    let envs = envelope_seeds();
    let manifest = manifests()[1].clone().sign(&key());
    let state = snapshot(64, Some(0.25));
    let encoded_state = wire::encode(&snapshot(N, None));
    let resps = vec![
        Response::Ack,
        Response::Status(envs[envs.len() - 3].clone()),
        Response::Contribution(Some(envs[0].clone())),
        Response::Contribution(None),
        Response::State(Some(state)),
        Response::State(None),
        Response::Manifest(Some(Box::new(manifest))),
        Response::Manifest(None),
        Response::StateChunk(Some(StateChunk {
            total: encoded_state.len() as u64,
            offset: 1024,
            bytes: encoded_state[1024..1536].to_vec(),
        })),
        Response::StateChunk(None),
        Response::Refused("not holding that state".into()),
    ];
    resps.iter().map(wire::encode).collect()
}

#[test]
fn fuzz_frame_response() {
    let seeds = response_seeds();
    fuzz(
        "frame-response",
        |rng| frame_input(rng, &seeds),
        |b| hex(b),
        |b| match wire::decode::<Response>(b, FRAME_LIMIT) {
            Ok(r) => {
                assert_stable(&r, FRAME_LIMIT);
                true
            }
            Err(e) => refused(e),
        },
    );
}

/// What the envelope target expects: a contribution to this swarm's round on its base state.
fn contribution_expectation(allowlist: Option<&[[u8; 32]]>) -> Expectation<'_> {
    Expectation {
        kind: PayloadKind::Contribution,
        swarm_id: swarm(),
        round: ROUND,
        base_hash: base(),
        allowlist,
        max_payload: 64 << 10,
    }
}

#[test]
fn fuzz_envelope() {
    let envs = envelope_seeds();
    let seeds: Vec<Vec<u8>> = envs.iter().map(wire::encode).collect();
    let allow = members();
    fuzz(
        "envelope",
        |rng| {
            if rng.chance(50) {
                frame_input(rng, &seeds)
            } else {
                let e = rng.pick(&envs);
                signed_frame(rng, e.header.clone(), e.payload.clone())
            }
        },
        |b| hex(b),
        |b| {
            let env = match wire::decode::<SignedEnvelope>(b, FRAME_LIMIT) {
                Ok(v) => v,
                Err(e) => return refused(e),
            };
            let open = env.verify(&contribution_expectation(None));
            let private = env.verify(&contribution_expectation(Some(&allow[..])));
            if let Ok(p) = private {
                assert_eq!(open, Ok(p), "an allowlist only refuses more");
                assert!(allow.contains(&env.header.sender));
            }
            match open {
                Ok(p) => {
                    assert_eq!(p, env.payload.as_slice());
                    let h = &env.header;
                    assert_eq!(
                        (h.kind, h.swarm_id, h.round, h.base_hash),
                        (PayloadKind::Contribution, swarm(), ROUND, base())
                    );
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
}

#[test]
fn fuzz_status() {
    let statuses = statuses();
    let seeds: Vec<Vec<u8>> = statuses
        .iter()
        .map(|s| wire::encode(&message::sign_status(&key(), swarm(), s)))
        .collect();
    let allow = members();
    fuzz(
        "status",
        |rng| {
            if rng.chance(25) {
                return frame_input(rng, &seeds);
            }
            let mut s = rng.pick(&statuses).clone();
            match rng.below(10) {
                0 | 1 => {
                    s.unix_ms = *rng.pick(&[
                        NOW_MS,
                        NOW_MS - MAX_STATUS_SKEW_MS,
                        NOW_MS - MAX_STATUS_SKEW_MS - 1,
                        NOW_MS + MAX_STATUS_SKEW_MS,
                        NOW_MS + MAX_STATUS_SKEW_MS + 1,
                        0,
                        u64::MAX,
                    ])
                }
                2 if rng.chance(10) => {
                    // Lists at and over the limit (large: rarely).
                    let n = *rng.pick(&[MAX_LISTED, MAX_LISTED + 1]);
                    if rng.chance(50) {
                        s.holding = vec![[5; 32]; n];
                    } else {
                        s.formed_by = ids(&vec![[6; 32]; n]);
                    }
                }
                3 | 4 => {
                    if let Some(t) = mutated_value(rng, &s) {
                        s = t;
                    }
                }
                _ => {}
            }
            // The header as `sign_status` makes it; `signed_frame` may still change it.
            let h = header(PayloadKind::Status, s.round, s.state_hash);
            signed_frame(rng, h, wire::encode(&s))
        },
        |b| hex(b),
        |b| {
            let env = match wire::decode::<SignedEnvelope>(b, FRAME_LIMIT) {
                Ok(v) => v,
                Err(e) => return refused(e),
            };
            let open = message::open_status(&env, &swarm(), None, NOW_MS);
            let private = message::open_status(&env, &swarm(), Some(&allow[..]), NOW_MS);
            if let Ok(s) = &private {
                assert_eq!(open.as_ref(), Ok(s), "an allowlist only refuses more");
            }
            match open {
                Ok(s) => {
                    assert_eq!(
                        (s.round, s.state_hash),
                        (env.header.round, env.header.base_hash)
                    );
                    assert!(s.unix_ms.abs_diff(NOW_MS) <= MAX_STATUS_SKEW_MS);
                    assert!(s.formed_by.len() <= MAX_LISTED && s.holding.len() <= MAX_LISTED);
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
}

fn contribution_seeds() -> Vec<DeltaSeed> {
    let all: Vec<DeltaCodec> = [&FP32[..], &FP16, &INT8, &INT4, &TOPK, &LOWRANK[..4]].concat();
    delta_seeds(&all)
}

#[test]
fn fuzz_contribution() {
    let deltas = contribution_seeds();
    let seeds: Vec<Vec<u8>> = deltas
        .iter()
        .map(|d| wire::encode(&contribution(d.enc.clone())))
        .collect();
    let bodies: Vec<Vec<u8>> = deltas.iter().map(|d| d.enc.body.clone()).collect();
    fuzz(
        "contribution",
        |rng| {
            if rng.chance(40) {
                return frame_input(rng, &seeds);
            }
            let seed = rng.pick(&deltas);
            let mut c = contribution(mutated_delta(rng, seed, &bodies));
            if rng.chance(10) {
                match rng.below(4) {
                    0 => c.tokens = *rng.pick(&[0, 1, u64::MAX]),
                    1 => c.inner_steps = *rng.pick(&[0, u32::MAX]),
                    2 => c.train_loss = *rng.pick(&[f32::NAN, f32::INFINITY, -1.0]),
                    _ => c.expected = *rng.pick(&[0, 1, 4096, 4097, u32::MAX]),
                }
            }
            let mut frame = wire::encode(&c);
            if rng.chance(10) {
                mutate(rng, &mut frame, &seeds);
            }
            frame
        },
        |b| hex(b),
        |b| {
            let c = match wire::decode::<Contribution>(b, FRAME_LIMIT) {
                Ok(v) => v,
                Err(e) => return refused(e),
            };
            let (n, shapes) = model_for(c.delta.codec);
            match delta::decode_shaped(&c.delta, n, &shapes) {
                Ok(v) => {
                    assert_eq!(v.len(), n);
                    assert!(v.iter().all(|x| x.is_finite()));
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
}

/// One delta codec's target: mutated `EncodedDelta`s straight into `decode_shaped`.
fn fuzz_delta(target: &str, codecs: &[DeltaCodec]) {
    let seeds = delta_seeds(codecs);
    let bodies: Vec<Vec<u8>> = seeds.iter().map(|d| d.enc.body.clone()).collect();
    let (n, shapes) = model_for(codecs[0]);
    fuzz(
        target,
        |rng| {
            let seed = rng.pick(&seeds);
            mutated_delta(rng, seed, &bodies)
        },
        |e| format!("codec {:?}, len {}, body {}", e.codec, e.len, hex(&e.body)),
        |e| match delta::decode_shaped(e, n, &shapes) {
            Ok(v) => {
                assert_eq!(v.len(), n);
                assert!(v.iter().all(|x| x.is_finite()));
                true
            }
            Err(e) => refused(e),
        },
    );
}

#[test]
fn fuzz_delta_fp32() {
    fuzz_delta("delta-fp32", &FP32);
}

#[test]
fn fuzz_delta_fp16() {
    fuzz_delta("delta-fp16", &FP16);
}

#[test]
fn fuzz_delta_int8() {
    fuzz_delta("delta-int8", &INT8);
}

#[test]
fn fuzz_delta_int4() {
    fuzz_delta("delta-int4", &INT4);
}

#[test]
fn fuzz_delta_topk() {
    fuzz_delta("delta-topk", &TOPK);
}

#[test]
fn fuzz_delta_lowrank() {
    fuzz_delta("delta-lowrank", &LOWRANK);
}

#[test]
fn fuzz_manifest() {
    // Manifests travel in `Response::Manifest` and sit in the store as ordinary frames
    // (`WIRE_VERSION`); `MANIFEST_FRAME_VERSION` only frames the bytes that are signed and
    // hashed into the swarm id, and no decoder reads it: seeds framed with it must be refused
    // unless a mutation turns their first byte into `WIRE_VERSION`.
    let manifests = manifests();
    let signed: Vec<SignedManifest> = manifests.iter().map(|m| m.clone().sign(&key())).collect();
    let mut seeds: Vec<Vec<u8>> = signed.iter().map(wire::encode).collect();
    seeds.push(wire::encode_as(wire::MANIFEST_FRAME_VERSION, &signed[0]));
    fuzz(
        "manifest",
        |rng| {
            if rng.chance(45) {
                return frame_input(rng, &seeds);
            }
            let mut m = rng.pick(&manifests).clone();
            if rng.chance(40) {
                if let Some(t) = mutated_value(rng, &m) {
                    m = t;
                }
            } else {
                for _ in 0..1 + rng.below(2) {
                    tweak_manifest(rng, &mut m);
                }
            }
            let signer = if rng.chance(90) { key() } else { outsider() };
            let mut s = m.sign(&signer);
            if rng.chance(5) {
                s.manifest.creator = if rng.chance(50) {
                    [0xff; 32]
                } else {
                    members()[1]
                };
            }
            if rng.chance(5) {
                s.signature.truncate(rng.below(65));
            }
            let mut frame = wire::encode(&s);
            if rng.chance(10) {
                mutate(rng, &mut frame, &seeds);
            }
            frame
        },
        |b| hex(b),
        |b| {
            let m = match wire::decode::<SignedManifest>(b, FRAME_LIMIT) {
                Ok(v) => v,
                Err(e) => return refused(e),
            };
            match m.verify() {
                Ok(()) => {
                    assert_stable(&m, FRAME_LIMIT);
                    let id = m.swarm_id();
                    assert_eq!(
                        id,
                        Hash32::of(&[&wire::encode_as(wire::MANIFEST_FRAME_VERSION, &m)])
                    );
                    let _ = m.manifest.admitted();
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
}

#[test]
fn fuzz_window() {
    let records = window_records();
    let seeds: Vec<Vec<u8>> = records
        .iter()
        .map(|r| wire::encode(&message::sign_window(&key(), swarm(), base(), r)))
        .collect();
    fuzz(
        "window",
        |rng| {
            if rng.chance(25) {
                return frame_input(rng, &seeds);
            }
            let mut r = rng.pick(&records).clone();
            match rng.below(10) {
                0 => {
                    r.reason = "r".repeat(*rng.pick(&[
                        message::MAX_WINDOW_TEXT,
                        message::MAX_WINDOW_TEXT + 1,
                        1000,
                        2000,
                    ]))
                }
                1 => r.tokens_per_sec = *rng.pick(&[f32::NAN, f32::INFINITY, -1.0, -0.0, f32::MAX]),
                2 | 3 => {
                    if let Some(t) = mutated_value(rng, &r) {
                        r = t;
                    }
                }
                _ => {}
            }
            let h = header(PayloadKind::Window, r.updated_at, base());
            signed_frame(rng, h, wire::encode(&r))
        },
        |b| hex(b),
        |b| {
            let env = match wire::decode::<SignedEnvelope>(b, FRAME_LIMIT) {
                Ok(v) => v,
                Err(e) => return refused(e),
            };
            match message::open_window(&env, &swarm()) {
                Ok(r) => {
                    assert_eq!(r.check(), Ok(()));
                    assert_eq!(r.updated_at, env.header.round);
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
}

#[test]
fn fuzz_state_chunk() {
    let snapshots = [
        snapshot(N, None),
        snapshot(16, Some(0.4)),
        snapshot(0, None),
    ];
    let encoded = wire::encode(&snapshots[0]);
    let mut seeds: Vec<Vec<u8>> = snapshots.iter().map(wire::encode).collect();
    for (offset, len) in [(0, 700), (700, 1500), (2200, encoded.len() - 2200)] {
        seeds.push(wire::encode(&StateChunk {
            total: encoded.len() as u64,
            offset: offset as u64,
            bytes: encoded[offset..offset + len].to_vec(),
        }));
    }
    seeds.push(wire::encode(&StateChunk {
        total: 0,
        offset: 0,
        bytes: vec![],
    }));
    fuzz(
        "state-chunk",
        |rng| frame_input(rng, &seeds),
        |b| hex(b),
        |b| {
            let chunk = wire::decode::<StateChunk>(b, FRAME_LIMIT);
            if let Ok(c) = &chunk {
                assert_stable(c, FRAME_LIMIT);
            }
            let snap = wire::decode::<StateSnapshot>(b, FRAME_LIMIT);
            if let Ok(s) = &snap {
                assert_stable(s, FRAME_LIMIT);
                assert_eq!(s.hash(), s.hash());
            }
            match (chunk, snap) {
                (Err(a), Err(b)) => refused((a, b)),
                _ => true,
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Round trips of the encoders (proptest, few cases).
// ---------------------------------------------------------------------------------------------

mod round_trips {
    use super::*;
    use proptest::prelude::*;

    fn role() -> impl Strategy<Value = NodeRole> {
        prop_oneof![Just(NodeRole::Trainer), Just(NodeRole::Bootstrap)]
    }

    fn phase() -> impl Strategy<Value = Phase> {
        prop_oneof![
            Just(Phase::Syncing),
            Just(Phase::Ready),
            Just(Phase::Training),
            Just(Phase::Collecting),
            Just(Phase::Done),
            Just(Phase::Paused),
        ]
    }

    fn keys() -> impl Strategy<Value = Vec<[u8; 32]>> {
        prop::collection::vec(any::<[u8; 32]>(), 0..6)
    }

    fn status() -> impl Strategy<Value = Status> {
        (
            role(),
            phase(),
            any::<u64>(),
            any::<[u8; 32]>(),
            keys(),
            keys(),
            any::<u64>(),
        )
            .prop_map(
                |(role, phase, round, h, formed_by, holding, unix_ms)| Status {
                    role,
                    phase,
                    round,
                    state_hash: Hash32(h),
                    formed_by: ids(&formed_by),
                    holding,
                    unix_ms,
                },
            )
    }

    fn envelope() -> impl Strategy<Value = SignedEnvelope> {
        (
            prop_oneof![
                Just(PayloadKind::Contribution),
                Just(PayloadKind::Window),
                Just(PayloadKind::Status),
            ],
            any::<[u8; 32]>(),
            any::<u64>(),
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            prop::collection::vec(any::<u8>(), 0..96),
            prop::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(kind, swarm, round, sender, b, payload, signature)| {
                SignedEnvelope {
                    header: EnvelopeHeader {
                        kind,
                        swarm_id: Hash32(swarm),
                        round,
                        sender,
                        base_hash: Hash32(b),
                    },
                    payload,
                    signature,
                }
            })
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            envelope().prop_map(Request::Announce),
            Just(Request::GetStatus),
            envelope().prop_map(Request::Push),
            (any::<u64>(), any::<[u8; 32]>())
                .prop_map(|(round, sender)| Request::GetContribution { round, sender }),
            proptest::option::of(any::<u64>()).prop_map(|round| Request::GetState { round }),
            Just(Request::GetManifest),
            (any::<[u8; 32]>(), any::<u64>(), any::<u32>()).prop_map(|(h, offset, len)| {
                Request::GetStateChunk {
                    hash: Hash32(h),
                    offset,
                    len,
                }
            }),
        ]
    }

    /// Every codec, a low-rank one with the matrix's shape; values and shapes together.
    fn shaped_values(
        values: impl Strategy<Value = f32> + Clone,
    ) -> impl Strategy<Value = (Vec<f32>, Vec<Vec<usize>>)> {
        (1usize..20, 1usize..20, 0usize..9).prop_flat_map(move |(rows, cols, extra)| {
            prop::collection::vec(values.clone(), rows * cols + extra).prop_map(move |v| {
                let mut shapes = vec![vec![rows, cols]];
                if extra > 0 {
                    shapes.push(vec![extra]);
                }
                (v, shapes)
            })
        })
    }

    const CODECS: [DeltaCodec; 8] = [
        DeltaCodec::Fp32,
        DeltaCodec::Fp16,
        DeltaCodec::Int8 { block: 64 },
        DeltaCodec::Int8 { block: 5 },
        DeltaCodec::Int4 { block: 32 },
        DeltaCodec::TopK { permille: 50 },
        DeltaCodec::LowRank { rank: 2, block: 16 },
        DeltaCodec::LowRank { rank: 4, block: 64 },
    ];

    proptest! {
        // No regression files: an integration test has no lib.rs for proptest to put them by.
        #![proptest_config(ProptestConfig {
            cases: 64,
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        #[test]
        fn statuses_round_trip_through_the_wire_and_a_signature(s in status()) {
            let back: Status = wire::decode(&wire::encode(&s), FRAME_LIMIT).unwrap();
            prop_assert_eq!(&back, &s);
            let env = message::sign_status(&key(), swarm(), &s);
            let env: SignedEnvelope = wire::decode(&wire::encode(&env), FRAME_LIMIT).unwrap();
            prop_assert_eq!(message::open_status(&env, &swarm(), None, s.unix_ms), Ok(s));
        }

        #[test]
        fn requests_round_trip_through_the_wire(r in request()) {
            let back: Request = wire::decode(&wire::encode(&r), FRAME_LIMIT).unwrap();
            prop_assert_eq!(back, r);
        }

        #[test]
        fn every_codec_decodes_what_it_encodes((v, shapes) in shaped_values(-4.0f32..4.0)) {
            for codec in CODECS {
                let enc = delta::encode_shaped(codec, &v, &shapes, &mut Vec::new());
                let enc: EncodedDelta = wire::decode(&wire::encode(&enc), FRAME_LIMIT).unwrap();
                let out = delta::decode_shaped(&enc, v.len(), &shapes);
                prop_assert!(out.is_ok(), "{codec}: {:?}", out);
                let out = out.unwrap();
                prop_assert_eq!(out.len(), v.len());
                if codec == DeltaCodec::Fp32 {
                    prop_assert_eq!(&out, &v);
                }
            }
        }

        #[test]
        fn arbitrary_floats_never_make_a_codec_panic((v, shapes) in shaped_values(any::<f32>())) {
            for codec in CODECS {
                let enc = delta::encode_shaped(codec, &v, &shapes, &mut Vec::new());
                let out = delta::decode_shaped(&enc, v.len(), &shapes);
                if let Ok(out) = &out {
                    prop_assert_eq!(out.len(), v.len());
                    prop_assert!(out.iter().all(|x| x.is_finite()));
                }
                if codec == DeltaCodec::Fp32 {
                    // Lossless: exactly the input when it is finite, refused when it is not.
                    if v.iter().all(|x| x.is_finite()) {
                        let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        prop_assert_eq!(bits(&out.unwrap()), bits(&v));
                    } else {
                        prop_assert!(out.is_err());
                    }
                }
            }
        }
    }
}
