//! The `flood` mode: as many concurrent requests and large pushes as the transport takes.

use libp2p::{PeerId, Swarm};
use nightshift_protocol::message::MAX_CHUNK_BYTES;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{Hash32, PayloadKind, Request, SignedEnvelope};

use crate::net::Attacker;
use crate::{BIG_PAYLOAD, FLOOD_PUSH_INFLIGHT, FLOOD_SMALL_INFLIGHT, Purpose, Run};

impl Run {
    fn flood_pushes(&mut self) {
        if self.big_push.is_some() {
            return;
        }
        let fitting = self.node_max_frame.saturating_sub(64 << 10).max(1024);
        let round = self.honest_round.unwrap_or(0).saturating_add(1000);
        for (size, slot) in [(BIG_PAYLOAD, 0), (fitting, 1)] {
            let header = EnvelopeHeader {
                kind: PayloadKind::Contribution,
                swarm_id: self.swarm_id,
                round,
                sender: self.me,
                base_hash: Hash32::of(&[b"nowhere"]),
            };
            let env = SignedEnvelope::sign(&self.key, header, self.junk.bytes(size));
            if slot == 0 {
                self.big_push = Some(env);
            } else {
                self.fitting_push = Some(env);
            }
        }
    }

    pub(crate) fn flood_refill(&mut self, swarm: &mut Swarm<Attacker>) {
        self.flood_pushes();
        let genesis = self.manifest.manifest.initial_state_hash;
        for p in self.connected_trainers() {
            let (mut small, mut push) = self.flood_inflight.get(&p).copied().unwrap_or_default();
            while small < FLOOD_SMALL_INFLIGHT {
                small += 1;
                if self.junk.below(2) == 0 {
                    self.send(
                        swarm,
                        p,
                        Request::GetStateChunk {
                            hash: genesis,
                            offset: 0,
                            len: MAX_CHUNK_BYTES,
                        },
                        "flood_state_chunk",
                        Purpose::Flood { push: false },
                    );
                } else {
                    self.send(
                        swarm,
                        p,
                        Request::GetStatus,
                        "flood_get_status",
                        Purpose::Flood { push: false },
                    );
                }
            }
            while push < FLOOD_PUSH_INFLIGHT {
                push += 1;
                let (env, kind) = if self.junk.below(2) == 0 {
                    (self.big_push.clone(), "flood_push_2mb")
                } else {
                    (self.fitting_push.clone(), "flood_push_fitting")
                };
                if let Some(env) = env {
                    self.send(
                        swarm,
                        p,
                        Request::Push(env),
                        kind,
                        Purpose::Flood { push: true },
                    );
                }
            }
            self.flood_inflight.insert(p, (small, push));
        }
    }

    pub(crate) fn flood_done(&mut self, peer: PeerId, push: bool) {
        if let Some((small, pushes)) = self.flood_inflight.get_mut(&peer) {
            if push {
                *pushes = pushes.saturating_sub(1);
            } else {
                *small = small.saturating_sub(1);
            }
        }
    }
}
