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

mod deltas;
mod harness;
mod mutator;
mod seeds;
mod signed;
mod values;

use nightshift_protocol::delta;
use nightshift_protocol::message::{
    self, MAX_LISTED, MAX_STATUS_SKEW_MS, StateChunk, StateSnapshot,
};
use nightshift_protocol::signed::{Expectation, PayloadKind, SignedEnvelope};
use nightshift_protocol::{
    Contribution, DeltaCodec, Hash32, Request, Response, SignedManifest, wire,
};

use deltas::{FP16, FP32, INT4, INT8, LOWRANK, N, TOPK, delta_seeds, model_for, mutated_delta};
use harness::{FRAME_LIMIT, NOW_MS, assert_stable, fuzz, hex, refused};
use mutator::{frame_input, mutate};
use seeds::{contribution_seeds, envelope_seeds, request_seeds, response_seeds};
use signed::{mutated_value, signed_frame};
use values::{
    ROUND, base, contribution, header, key, manifests, members, outsider, snapshot, statuses,
    swarm, tweak_manifest, window_records,
};

// ---------------------------------------------------------------------------------------------
// The targets.
// ---------------------------------------------------------------------------------------------

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
                    // Counts at and over the limit.
                    let n = *rng.pick(&[MAX_LISTED as u32, MAX_LISTED as u32 + 1, u32::MAX]);
                    if rng.chance(50) {
                        s.holding = n;
                    } else {
                        s.formed = n;
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
                    assert!(s.formed as usize <= MAX_LISTED && s.holding as usize <= MAX_LISTED);
                    true
                }
                Err(e) => refused(e),
            }
        },
    );
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

mod round_trips;
