use super::*;
use ed25519_dalek::SigningKey;
use proptest::prelude::*;

fn key(i: u8) -> SigningKey {
    SigningKey::from_bytes(&[i; 32])
}

fn leaves(n: usize) -> Vec<Hash32> {
    (0..n)
        .map(|i| Hash32::of(&[b"leaf", &(i as u64).to_le_bytes()]))
        .collect()
}

const CODEC: DeltaCodec = DeltaCodec::Int4 { block: 64 };

fn ctx(allow: &[[u8; 32]], slices: u32, num_params: usize) -> SliceContext<'_> {
    SliceContext {
        swarm_id: Hash32::of(&[b"swarm"]),
        round: 7,
        base_hash: Hash32::of(&[b"theta7"]),
        allowlist: Some(allow),
        num_params,
        codec: CODEC,
        slices,
        mean_codec: DeltaCodec::Int8 { block: 64 },
        max_tokens: 10_000,
    }
}

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n)
        .map(|i| ((i as f32 + seed) * 0.37).sin() * 1e-2)
        .collect()
}

/// A member's contribution cut into `slices`, with its signed header.
fn sliced(k: &SigningKey, c: &SliceContext<'_>, v: &[f32]) -> (SignedEnvelope, SlicedDelta) {
    let d = SlicedDelta::encode(c.codec, v, &c.ranges().unwrap());
    let header = SlicedContribution {
        tokens: 4_000,
        inner_steps: 10,
        train_loss: 2.5,
        expected: 3,
        codec: c.codec,
        len: v.len() as u64,
        slices: c.slices,
        root: d.root,
    };
    (sign_sliced(k, c.swarm_id, c.round, c.base_hash, &header), d)
}

#[test]
fn slice_ranges_cover_the_values_in_whole_blocks() {
    let r = slice_ranges(1000, 3, 64).unwrap();
    assert_eq!(r, vec![0..384, 384..704, 704..1000]);
    assert_eq!(slice_ranges(10, 10, 1).unwrap().len(), 10);
    assert!(slice_ranges(10, 11, 1).is_none(), "more slices than blocks");
    assert!(slice_ranges(10, 0, 1).is_none());
    assert!(slice_align(DeltaCodec::LowRank { rank: 4, block: 64 }).is_none());
    // Blocks whole for both codecs: int4:48 and int8:64 cut in blocks of 192.
    let r = round_slices(
        1000,
        3,
        DeltaCodec::Int4 { block: 48 },
        DeltaCodec::Int8 { block: 64 },
    );
    assert_eq!(r.unwrap(), vec![0..384, 384..768, 768..1000]);
}

#[test]
fn the_whole_tree_at_once_gives_the_root_and_every_path_one_at_a_time_gives() {
    assert_eq!(merkle_tree(&[]), (Hash32::default(), vec![]));
    for n in 1..=70 {
        let l = leaves(n);
        let (root, paths) = merkle_tree(&l);
        assert_eq!(root, merkle_root(&l), "root of {n} leaves");
        assert_eq!(paths.len(), n);
        for (i, p) in paths.iter().enumerate() {
            assert_eq!(*p, merkle_path(&l, i), "path of leaf {i} of {n}");
        }
    }
}

proptest! {
    #[test]
    fn every_leaf_proves_its_place_and_no_other(n in 1usize..70, pick in any::<usize>()) {
        let l = leaves(n);
        let root = merkle_root(&l);
        let i = pick % n;
        let path = merkle_path(&l, i);
        prop_assert!(path.len() <= MAX_PATH);
        prop_assert!(verify_path(&root, &l[i], i as u64, n as u64, &path));
        // Another leaf, another index, another size or a changed path: refused.
        let j = (i + 1) % n;
        if j != i {
            prop_assert!(!verify_path(&root, &l[j], i as u64, n as u64, &path));
            prop_assert!(!verify_path(&root, &l[i], j as u64, n as u64, &path));
        }
        prop_assert!(!verify_path(&root, &l[i], n as u64, n as u64, &path));
        if let Some(first) = path.first() {
            let mut bad = path.clone();
            bad[0] = Hash32::of(&[&first.0, b"x"]);
            prop_assert!(!verify_path(&root, &l[i], i as u64, n as u64, &bad));
        }
    }

    #[test]
    fn slices_decode_to_what_the_whole_delta_decodes_to(
        len in 64usize..3000, slices in 1u32..40, block in prop::sample::select(vec![1u32, 7, 64]),
    ) {
        let codec = DeltaCodec::Int4 { block };
        let v = values(len, 1.0);
        prop_assume!(slice_ranges(len, slices, block as usize).is_some());
        let ranges = slice_ranges(len, slices, block as usize).unwrap();
        let d = SlicedDelta::encode(codec, &v, &ranges);
        let whole = delta::decode(&delta::encode(codec, &v), len).unwrap();
        let mut joined = vec![];
        for (s, r) in d.slices.iter().zip(&ranges) {
            joined.extend(delta::decode(s, r.len()).unwrap());
        }
        prop_assert_eq!(joined, whole);
    }
}

#[test]
fn a_reducer_opens_each_slice_against_its_senders_signature_alone() {
    let allow = [
        key(1).verifying_key().to_bytes(),
        key(2).verifying_key().to_bytes(),
    ];
    let c = ctx(&allow, 5, 1000);
    let v = values(1000, 0.0);
    let (env, d) = sliced(&key(1), &c, &v);
    let whole = delta::decode(&delta::encode(CODEC, &v), 1000).unwrap();
    let ranges = slice_ranges(1000, 5, 64).unwrap();
    for i in 0..5 {
        let s = d.slice(&env, i);
        let opened = open_slice(&s, &c).unwrap();
        assert_eq!(opened.index, i as u32);
        assert_eq!(opened.values, whole[ranges[i].clone()]);
        assert_eq!(opened.id, ContributionId::of(&env));
        assert_eq!(opened.header.tokens, 4_000);
    }
    // Slice 1 sent as slice 2, or with another's path, or changed: refused.
    let mut s = d.slice(&env, 1);
    s.index = 2;
    assert_eq!(open_slice(&s, &c), Err(SliceError::BadPath(2)));
    let mut s = d.slice(&env, 1);
    s.path = d.slice(&env, 3).path;
    assert_eq!(open_slice(&s, &c), Err(SliceError::BadPath(1)));
    let mut s = d.slice(&env, 1);
    let last = s.body.body.len() - 1;
    s.body.body[last] ^= 1;
    assert_eq!(open_slice(&s, &c), Err(SliceError::BadPath(1)));
    let mut s = d.slice(&env, 1);
    s.index = 9;
    assert!(matches!(
        open_slice(&s, &c),
        Err(SliceError::NoSuchSlice { .. })
    ));
    let mut s = d.slice(&env, 1);
    s.path = vec![Hash32::default(); MAX_PATH + 1];
    assert_eq!(open_slice(&s, &c), Err(SliceError::BadPath(1)));
    // An outsider's, a tampered header, another round's, another slicing's: refused.
    let (out_env, out_d) = sliced(&key(9), &c, &v);
    assert!(matches!(
        open_slice(&out_d.slice(&out_env, 0), &c),
        Err(SliceError::Envelope(VerifyError::NotAMember(_)))
    ));
    let mut s = d.slice(&env, 0);
    s.envelope.payload[0] ^= 1;
    assert!(matches!(
        open_slice(&s, &c),
        Err(SliceError::Envelope(VerifyError::BadSignature))
    ));
    let later = SliceContext { round: 8, ..c };
    assert!(matches!(
        open_slice(&d.slice(&env, 0), &later),
        Err(SliceError::Envelope(VerifyError::WrongRound { .. }))
    ));
    let resliced = SliceContext { slices: 4, ..c };
    assert!(
        matches!(open_slice(&d.slice(&env, 0), &resliced), Err(SliceError::Header(m)) if m.contains("slices"))
    );
}

#[test]
fn a_header_out_of_bounds_or_a_non_finite_slice_is_refused() {
    let allow = [key(1).verifying_key().to_bytes()];
    let c = ctx(&allow, 2, 256);
    let d = SlicedDelta::encode(CODEC, &values(256, 0.0), &c.ranges().unwrap());
    let good = SlicedContribution {
        tokens: 100,
        inner_steps: 1,
        train_loss: 1.0,
        expected: 1,
        codec: CODEC,
        len: 256,
        slices: 2,
        root: d.root,
    };
    let cases = [
        (
            SlicedContribution {
                tokens: 0,
                ..good.clone()
            },
            "tokens",
        ),
        (
            SlicedContribution {
                tokens: 10_001,
                ..good.clone()
            },
            "tokens",
        ),
        (
            SlicedContribution {
                len: 255,
                ..good.clone()
            },
            "values",
        ),
        (
            SlicedContribution {
                codec: DeltaCodec::Fp32,
                ..good.clone()
            },
            "fp32",
        ),
        (
            SlicedContribution {
                expected: MAX_EXPECTED + 1,
                ..good.clone()
            },
            "expects",
        ),
        (
            SlicedContribution {
                train_loss: f32::NAN,
                ..good.clone()
            },
            "loss",
        ),
    ];
    for (h, why) in cases {
        let env = sign_sliced(&key(1), c.swarm_id, c.round, c.base_hash, &h);
        match open_slice(&d.slice(&env, 0), &c) {
            Err(SliceError::Header(m)) => assert!(m.contains(why), "{m} lacks {why}"),
            other => panic!("{why}: {other:?}"),
        }
    }
    // A delta with an infinity, committed honestly: the slice holding it is refused on decode.
    let mut v = values(256, 0.0);
    v[200] = f32::INFINITY;
    let fp = SliceContext {
        codec: DeltaCodec::Fp32,
        ..c
    };
    let d = SlicedDelta::encode(DeltaCodec::Fp32, &v, &fp.ranges().unwrap());
    let h = SlicedContribution {
        codec: DeltaCodec::Fp32,
        root: d.root,
        ..good
    };
    let env = sign_sliced(&key(1), c.swarm_id, c.round, c.base_hash, &h);
    assert!(open_slice(&d.slice(&env, 0), &fp).is_ok());
    assert!(matches!(
        open_slice(&d.slice(&env, 1), &fp),
        Err(SliceError::Delta(DeltaError::NonFinite(_)))
    ));
}

#[test]
fn a_reduced_slice_needs_every_reducer_to_sign_one_bounded_payload() {
    let allow: Vec<[u8; 32]> = (1..=3).map(|i| key(i).verifying_key().to_bytes()).collect();
    let c = ctx(&allow, 4, 1000);
    let mean_codec = DeltaCodec::Int8 { block: 64 };
    let mut inputs: Vec<ReducedInput> = allow
        .iter()
        .map(|s| ReducedInput {
            id: ContributionId {
                sender: *s,
                digest: Hash32::of(&[s]),
            },
            tokens: 100,
            expected: 3,
        })
        .collect();
    inputs.sort();
    let ranges = slice_ranges(1000, 4, 64).unwrap();
    let mean = values(ranges[2].len(), 3.0);
    let named = |inputs: &[ReducedInput]| (inputs_digest(inputs), inputs.len() as u32);
    let (digest, count) = named(&inputs);
    let payload = ReducedSlice {
        index: 2,
        slices: 4,
        inputs: digest,
        count,
        mean: delta::encode(mean_codec, &mean),
        mean_sq: 0.5,
        spread: 0.25,
    };
    let reducers = [
        key(1).verifying_key().to_bytes(),
        key(2).verifying_key().to_bytes(),
    ];
    let sign = |k: u8, p: &ReducedSlice| sign_reduced(&key(k), c.swarm_id, c.round, c.base_hash, p);
    let both = [sign(1, &payload), sign(2, &payload)];
    let (got, v) = open_reduced(&both, &reducers, &inputs, &c).unwrap();
    assert_eq!(got, payload);
    assert_eq!(v, delta::decode(&payload.mean, ranges[2].len()).unwrap());
    // No reducer named, one signature only, a signer who is not the second reducer, or two
    // payloads: refused.
    assert!(open_reduced(&both, &[], &inputs, &c).is_err());
    assert!(open_reduced(&both[..1], &reducers, &inputs, &c).is_err());
    assert!(
        open_reduced(
            &[sign(1, &payload), sign(3, &payload)],
            &reducers,
            &inputs,
            &c
        )
        .is_err()
    );
    let other = ReducedSlice {
        spread: 0.3,
        ..payload.clone()
    };
    assert!(
        open_reduced(
            &[sign(1, &payload), sign(2, &other)],
            &reducers,
            &inputs,
            &c
        )
        .is_err()
    );
    // Another list than the one it names: refused.
    assert!(open_reduced(&both, &reducers, &inputs[1..], &c).is_err());
    // Bounds: inputs out of order or of an outsider, statistics, index, the mean's codec.
    let reversed: Vec<ReducedInput> = inputs.iter().rev().copied().collect();
    let outsider = vec![ReducedInput {
        id: ContributionId {
            sender: [9; 32],
            digest: Hash32::default(),
        },
        tokens: 1,
        expected: 1,
    }];
    let with = |l: &[ReducedInput]| {
        let (inputs, count) = named(l);
        ReducedSlice {
            inputs,
            count,
            ..payload.clone()
        }
    };
    let bad = [
        (with(&reversed), reversed.clone()),
        (with(&outsider), outsider.clone()),
        (with(&[]), vec![]),
        (
            ReducedSlice {
                spread: f64::NAN,
                ..payload.clone()
            },
            inputs.clone(),
        ),
        (
            ReducedSlice {
                mean_sq: -1.0,
                ..payload.clone()
            },
            inputs.clone(),
        ),
        (
            ReducedSlice {
                index: 4,
                ..payload.clone()
            },
            inputs.clone(),
        ),
        (
            ReducedSlice {
                mean: delta::encode(DeltaCodec::Fp32, &mean),
                ..payload.clone()
            },
            inputs.clone(),
        ),
        (
            ReducedSlice {
                mean: delta::encode(mean_codec, &mean[1..]),
                ..payload.clone()
            },
            inputs.clone(),
        ),
    ];
    for (p, l) in bad {
        let r = open_reduced(&[sign(1, &p), sign(2, &p)], &reducers, &l, &c);
        assert!(r.is_err(), "accepted {p:?}");
    }
}

#[test]
fn a_reduced_slice_travels_with_its_mean_once_and_at_most_two_signers() {
    let c = ctx(&[], 4, 1000);
    let mean = values(250, 2.0);
    let payload = ReducedSlice {
        index: 1,
        slices: 4,
        inputs: Hash32::default(),
        count: 3,
        mean: delta::encode(DeltaCodec::Int8 { block: 64 }, &mean),
        mean_sq: 0.5,
        spread: 0.25,
    };
    let sign = |k: u8| sign_reduced(&key(k), c.swarm_id, c.round, c.base_hash, &payload);
    let one = Reduced {
        signed: vec![sign(1)],
    };
    let two = Reduced {
        signed: vec![sign(1), sign(2)],
    };
    let (one_bytes, two_bytes) = (wire::encode(&one), wire::encode(&two));
    // The checker's signature adds its header and signature, not a second copy of the mean.
    let payload_len = one.signed[0].payload.len();
    assert!(payload_len > 250);
    assert!(
        two_bytes.len() - one_bytes.len() < 200,
        "{}",
        two_bytes.len()
    );
    let back: Reduced = wire::decode(&two_bytes, two_bytes.len()).unwrap();
    assert_eq!(back, two);
    // A third signer is refused before its copy of the payload is made.
    let three = Reduced {
        signed: vec![sign(1), sign(2), sign(3)],
    };
    let bytes = wire::encode(&three);
    assert!(wire::decode::<Reduced>(&bytes, bytes.len()).is_err());
    // A signer over another payload is sent with the first's: its signature no longer holds.
    let other = ReducedSlice {
        spread: 0.3,
        ..payload.clone()
    };
    let mixed = Reduced {
        signed: vec![
            sign(1),
            sign_reduced(&key(2), c.swarm_id, c.round, c.base_hash, &other),
        ],
    };
    let bytes = wire::encode(&mixed);
    let back: Reduced = wire::decode(&bytes, bytes.len()).unwrap();
    assert_eq!(back.signed[1].payload, back.signed[0].payload);
    assert!(
        back.signed[1]
            .verify(&Expectation {
                kind: PayloadKind::ReducedSlice,
                swarm_id: c.swarm_id,
                round: c.round,
                base_hash: c.base_hash,
                allowlist: None,
                max_payload: max_reduced_bytes(250),
            })
            .is_err()
    );
}
