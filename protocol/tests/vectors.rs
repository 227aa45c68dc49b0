//! Fixed test vectors that freeze the wire format. If one of these fails, the change breaks
//! compatibility with deployed nodes: bump `WIRE_VERSION` and update the vectors deliberately.

use ed25519_dalek::SigningKey;
use nightshift_protocol::message::Phase;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::slices::{Reduced, ReducedSlice, SliceAnswer, sign_reduced};
use nightshift_protocol::{
    Contribution, ContributionId, DeltaCodec, EncodedDelta, Hash32, NodeRole, PayloadKind, Request,
    Response, SignedEnvelope, Status, StatusLists, delta, wire,
};

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn request_encoding_is_frozen() {
    let r = Request::GetContribution {
        round: 300,
        sender: [7; 32],
    };
    assert_eq!(hex(&wire::encode(&r)), VECTOR_REQUEST);
}

#[test]
fn signed_envelope_encoding_is_frozen() {
    let key = SigningKey::from_bytes(&[1; 32]);
    let c = Contribution {
        tokens: 1024,
        inner_steps: 50,
        train_loss: 2.5,
        delta: EncodedDelta {
            codec: DeltaCodec::Int8 { block: 64 },
            len: 3,
            body: vec![1, 2, 3],
        },
        expected: 4,
    };
    let h = EnvelopeHeader {
        kind: PayloadKind::Contribution,
        swarm_id: Hash32::of(&[b"swarm"]),
        round: 5,
        sender: [0; 32],
        base_hash: Hash32::of(&[b"base"]),
    };
    let env = SignedEnvelope::sign(&key, h, wire::encode(&c));
    assert_eq!(
        Hash32::of(&[&wire::encode(&env)]).to_hex(),
        VECTOR_ENVELOPE_SHA256
    );
}

#[test]
fn status_encoding_is_frozen() {
    // A status counts its lists and commits to them by roots; a state names its contributions
    // by sender and envelope digest.
    let lists = StatusLists {
        formed_by: vec![ContributionId {
            sender: [2; 32],
            digest: Hash32::of(&[b"envelope"]),
        }],
        holding: vec![[3; 32]],
    };
    let mut s = Status::summarizing(
        NodeRole::Trainer,
        Phase::Collecting,
        9,
        Hash32::of(&[b"state"]),
        &lists,
    );
    s.unix_ms = 1_700_000_000_000;
    assert_eq!(
        Hash32::of(&[&wire::encode(&s)]).to_hex(),
        VECTOR_STATUS_SHA256
    );
}

#[test]
fn reduced_slice_encoding_is_frozen() {
    // A reduced slice travels as one payload with each signer's header and signature beside it.
    let payload = ReducedSlice {
        index: 1,
        slices: 4,
        inputs: Hash32::of(&[b"inputs"]),
        count: 3,
        mean: EncodedDelta {
            codec: DeltaCodec::Int8 { block: 64 },
            len: 3,
            body: vec![4, 5, 6],
        },
        mean_sq: 0.25,
        spread: 1.5,
    };
    let (swarm, base) = (Hash32::of(&[b"swarm"]), Hash32::of(&[b"base"]));
    let signed = [1u8, 2]
        .map(|k| sign_reduced(&SigningKey::from_bytes(&[k; 32]), swarm, 5, base, &payload))
        .to_vec();
    let reduced = Reduced { signed };
    let encoded = wire::encode(&reduced);
    let back: Reduced = wire::decode(&encoded, encoded.len()).unwrap();
    assert_eq!(back, reduced);
    assert_eq!(Hash32::of(&[&encoded]).to_hex(), VECTOR_REDUCED_SHA256);
}

#[test]
fn slice_answer_encoding_is_frozen() {
    // A slice answers a fetch with its index, values and Merkle path; its header only when
    // asked for (not here).
    let answer = Response::Slice(Some(Box::new(SliceAnswer {
        header: None,
        index: 2,
        body: EncodedDelta {
            codec: DeltaCodec::Int4 { block: 64 },
            len: 2,
            body: vec![7, 8],
        },
        path: vec![Hash32::of(&[b"leaf"])],
    })));
    assert_eq!(
        Hash32::of(&[&wire::encode(&answer)]).to_hex(),
        VECTOR_SLICE_ANSWER_SHA256
    );
}

#[test]
fn int8_body_layout_is_frozen() {
    // One block of 4 values: scale 0.5/127 (f32 LE) then q = [127, -127, 0, 64].
    let scale = 0.5f32 / 127.0;
    let mut raw = scale.to_le_bytes().to_vec();
    raw.extend_from_slice(&[127u8, 129, 0, 64]);
    let enc = EncodedDelta {
        codec: DeltaCodec::Int8 { block: 4 },
        len: 4,
        body: zstd::bulk::compress(&raw, 3).unwrap(),
    };
    let out = delta::decode(&enc, 4).unwrap();
    assert_eq!(out, vec![0.5, -0.5, 0.0, 64.0 * scale]);
}
const VECTOR_REQUEST: &str =
    "0803fb2c010707070707070707070707070707070707070707070707070707070707070707";
const VECTOR_ENVELOPE_SHA256: &str =
    "fd375e7a61c75c6257447149ca1cc80b2ecc2943825ed7c26790ec6101a29132";
const VECTOR_STATUS_SHA256: &str =
    "5e9b344d282dde6db75b073aa0f1571ffb8c587851127e8e178fa1f1a2b60f07";
const VECTOR_REDUCED_SHA256: &str =
    "72223ad696fa6187becc23f7ebd10c37c3661adf374e71c8f09dc941d0bb11d9";
const VECTOR_SLICE_ANSWER_SHA256: &str =
    "7fe8c0c41f2ec4d12c607fc9b2e1acdf71aa3e02857e294d46df443b4deaf93c";
