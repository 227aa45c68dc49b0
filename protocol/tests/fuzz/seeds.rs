//! The seed corpora of the targets: valid frames that the mutator starts from.

use nightshift_protocol::message::{self, MAX_CHUNK_BYTES, StateChunk};
use nightshift_protocol::signed::{PayloadKind, SignedEnvelope};
use nightshift_protocol::{DeltaCodec, Request, Response, wire};

use crate::deltas::{DeltaSeed, FP16, FP32, INT4, INT8, LOWRANK, N, TOPK, delta_seeds};
use crate::values::{
    ROUND, base, contribution, header, key, manifests, member, members, snapshot, status_lists,
    statuses, swarm, window_records,
};

pub(crate) fn envelope_seeds() -> Vec<SignedEnvelope> {
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

pub(crate) fn request_seeds() -> Vec<Vec<u8>> {
    let envs = envelope_seeds();
    let mut reqs = vec![
        Request::GetStatus,
        Request::GetStatusLists,
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

pub(crate) fn response_seeds() -> Vec<Vec<u8>> {
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
        Response::StatusLists {
            status: message::sign_status(&key(), swarm(), &statuses()[0]),
            lists: status_lists()[0].clone(),
        },
    ];
    resps.iter().map(wire::encode).collect()
}

pub(crate) fn contribution_seeds() -> Vec<DeltaSeed> {
    let all: Vec<DeltaCodec> = [&FP32[..], &FP16, &INT8, &INT4, &TOPK, &LOWRANK[..4]].concat();
    delta_seeds(&all)
}
