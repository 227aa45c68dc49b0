//! The `forge` and `relabel` modes: made-up states, announced and served in chunks.

use libp2p::{PeerId, Swarm};
use nightshift_node::net::unix_ms;
use nightshift_protocol::message::{MAX_CHUNK_BYTES, Phase};
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Contribution, ContributionId, Hash32, NodeRole, PayloadKind, Request, Response, SignedEnvelope,
    StateChunk, StateSnapshot, Status, StatusLists, delta, sign_status, wire,
};
use std::sync::Arc;

use crate::args::Mode;
use crate::net::Attacker;
use crate::{Forged, Purpose, Run};

impl Run {
    fn forge(&mut self, round: u64) -> (u64, Hash32) {
        if let Some(f) = self.forged.values().find(|f| f.round == round) {
            return (f.round, f.hash);
        }
        let n = self.num_params;
        // Named by its digest, as an honest state names its contributions: the one we serve.
        let own = ContributionId::of(&self.own_contribution(round.saturating_sub(1)));
        let state = match self.mode {
            Mode::Relabel => StateSnapshot {
                round,
                params: self.genesis.params.clone(),
                momentum: self.genesis.momentum.clone(),
                formed_by: vec![own],
                noise: self.genesis.noise,
            },
            _ => StateSnapshot {
                round,
                params: vec![0.0; n],
                momentum: vec![0.0; n],
                formed_by: vec![own],
                noise: None,
            },
        };
        let hash = state.hash();
        let encoded = Arc::new(wire::encode(&state));
        self.forged.insert(
            hash,
            Forged {
                round,
                hash,
                encoded,
                formed_by: state.formed_by,
            },
        );
        self.forged_log.push((round, hash));
        (round, hash)
    }

    pub(crate) fn forge_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let Some(r) = self.honest_round else {
            return;
        };
        self.flip = !self.flip;
        let target = match self.mode {
            Mode::Relabel => r.saturating_add(5),
            _ if self.flip => r.saturating_add(1),
            _ => r.saturating_add(5),
        };
        self.forge_claim(swarm, target);
    }

    /// Forges a state of round `target` (unless this round's is made already) and announces
    /// it, signed with our own key, to every connected peer.
    pub(crate) fn forge_claim(&mut self, swarm: &mut Swarm<Attacker>, target: u64) {
        if self
            .current
            .as_ref()
            .is_some_and(|(c, _)| c.round == target && unix_ms().saturating_sub(c.unix_ms) < 200)
        {
            return;
        }
        let (round, hash) = self.forge(target);
        let formed_by = self
            .forged
            .get(&hash)
            .map(|f| f.formed_by.clone())
            .unwrap_or_default();
        let lists = StatusLists {
            formed_by,
            holding: vec![],
        };
        let status = Status {
            unix_ms: unix_ms(),
            ..Status::summarizing(NodeRole::Trainer, Phase::Ready, round, hash, &lists)
        };
        let env = sign_status(&self.key, self.swarm_id, &status);
        self.current = Some((status, lists));
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for p in peers {
            self.announced += 1;
            self.send(
                swarm,
                p,
                Request::Announce(env.clone()),
                "announce",
                Purpose::Other,
            );
        }
    }

    /// Our own contribution for `round`, signed, a large constant in the swarm's codec.
    fn own_contribution(&mut self, round: u64) -> SignedEnvelope {
        let base = self
            .honest_hashes
            .get(&round)
            .copied()
            .or_else(|| {
                self.forged
                    .values()
                    .find(|f| f.round == round)
                    .map(|f| f.hash)
            })
            .unwrap_or_else(|| Hash32::of(&[b"hostile", &round.to_le_bytes()]));
        let c = Contribution {
            tokens: 1,
            inner_steps: 1,
            train_loss: 0.5,
            delta: delta::encode(
                self.manifest.manifest.training.codec,
                &vec![1000.0f32; self.num_params],
            ),
            expected: 1,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round,
            sender: self.me,
            base_hash: base,
        };
        SignedEnvelope::sign(&self.key, header, wire::encode(&c))
    }

    pub(crate) fn answer(&mut self, req: Request) -> Response {
        let kind = kind_of(&req);
        *self.inbound.entry(kind).or_default() += 1;
        match req {
            Request::GetStatus | Request::GetStatusLists => match &self.current {
                Some((s, lists)) if self.mode.forges() => {
                    let mut s = s.clone();
                    s.unix_ms = unix_ms();
                    let status = sign_status(&self.key, self.swarm_id, &s);
                    if matches!(req, Request::GetStatus) {
                        Response::Status(status)
                    } else {
                        Response::StatusLists {
                            status,
                            lists: lists.clone(),
                        }
                    }
                }
                _ => Response::Refused("not ready".into()),
            },
            Request::GetStateChunk { hash, offset, len } => match self.forged.get(&hash) {
                Some(f) => {
                    self.state_chunks_served += 1;
                    let total = f.encoded.len() as u64;
                    let start = offset.min(total) as usize;
                    let want = u64::from(len.min(MAX_CHUNK_BYTES));
                    let end = offset.saturating_add(want).min(total) as usize;
                    Response::StateChunk(Some(StateChunk {
                        total,
                        offset: start as u64,
                        bytes: f.encoded.get(start..end).unwrap_or_default().to_vec(),
                    }))
                }
                None => Response::StateChunk(None),
            },
            Request::GetContribution { round, sender }
                if sender == self.me && self.mode.forges() =>
            {
                self.contributions_served += 1;
                Response::Contribution(Some(self.own_contribution(round)))
            }
            Request::GetContribution { .. } => Response::Contribution(None),
            Request::GetState { .. } => Response::State(None),
            Request::GetManifest => Response::Manifest(None),
            Request::GetSlice { .. } => Response::Slice(None),
            Request::GetReduced { .. } => Response::Reduced(None),
            Request::Push(_) | Request::Announce(_) | Request::PushReduced(_) => Response::Ack,
        }
    }
}

fn kind_of(r: &Request) -> &'static str {
    match r {
        Request::Announce(_) => "announce",
        Request::GetStatus => "get_status",
        Request::GetStatusLists => "get_status_lists",
        Request::Push(_) => "push",
        Request::GetContribution { .. } => "get_contribution",
        Request::GetState { .. } => "get_state",
        Request::GetManifest => "get_manifest",
        Request::GetStateChunk { .. } => "get_state_chunk",
        Request::PushReduced(_) => "push_reduced",
        Request::GetSlice { .. } => "get_slice",
        Request::GetReduced { .. } => "get_reduced",
    }
}
