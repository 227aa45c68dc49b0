//! Round trips of the encoders (proptest, few cases).

use nightshift_protocol::delta;
use nightshift_protocol::message::{self, NodeRole, Phase, Status, StatusLists};
use nightshift_protocol::signed::{EnvelopeHeader, PayloadKind, SignedEnvelope};
use nightshift_protocol::{DeltaCodec, EncodedDelta, Hash32, Request, wire};
use proptest::prelude::*;

use crate::harness::FRAME_LIMIT;
use crate::values::{ids, key, swarm};

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
                unix_ms,
                ..Status::summarizing(
                    role,
                    phase,
                    round,
                    Hash32(h),
                    &StatusLists {
                        formed_by: ids(&formed_by),
                        holding,
                    },
                )
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
        .prop_map(
            |(kind, swarm, round, sender, b, payload, signature)| SignedEnvelope {
                header: EnvelopeHeader {
                    kind,
                    swarm_id: Hash32(swarm),
                    round,
                    sender,
                    base_hash: Hash32(b),
                },
                payload,
                signature,
            },
        )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        envelope().prop_map(Request::Announce),
        Just(Request::GetStatus),
        Just(Request::GetStatusLists),
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
