//! The `garbage` mode: malformed raw frames and pushes under a bad signature.

use libp2p::Swarm;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{PayloadKind, Request, SignedEnvelope, wire};

use crate::net::Attacker;
use crate::{BIG_PAYLOAD, Purpose, Run};

impl Run {
    fn bad_push(&mut self, payload: usize) -> SignedEnvelope {
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round: self.honest_round.unwrap_or(0),
            sender: self.me,
            base_hash: self
                .honest_round
                .and_then(|r| self.honest_hashes.get(&r).copied())
                .unwrap_or_default(),
        };
        SignedEnvelope {
            header,
            payload: self.junk.bytes(payload),
            signature: self.junk.bytes(64),
        }
    }

    pub(crate) fn garbage_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let trainers = self.connected_trainers();
        let get_status = wire::encode(&Request::GetStatus);
        let lookup = wire::encode(&Request::GetContribution {
            round: 7,
            sender: [9; 32],
        });
        let fitting = self.node_max_frame.saturating_sub(64 << 10).max(1024);
        for p in trainers {
            // A length prefix claiming ~4 GB, and nothing more.
            self.send_raw(swarm, p, 0xEE6B_2800u32.to_be_bytes().to_vec(), "raw_4gb");
            // 10 MB claimed for a small kind: the head of a GetStatus frame, then junk.
            let mut f = (10u32 << 20).to_be_bytes().to_vec();
            f.extend_from_slice(get_status.get(..2).unwrap_or(&[4, 1]));
            f.extend(self.junk.bytes(4096));
            self.send_raw(swarm, p, f, "raw_10mb_small_kind");
            // Valid lengths, random bytes; and random bodies behind a valid version and variant.
            // (Random bytes that happen to spell a well-formed request are drawn again: a node
            // rightly answers those.)
            for _ in 0..2 {
                let f = loop {
                    let n = 16 + self.junk.below(8192) as usize;
                    let mut f = (n as u32).to_be_bytes().to_vec();
                    f.extend(self.junk.bytes(n));
                    if !well_formed(&f) {
                        break f;
                    }
                };
                self.send_raw(swarm, p, f, "raw_random");
                let f = loop {
                    let n = 16 + self.junk.below(4096) as usize;
                    let mut f = (n as u32).to_be_bytes().to_vec();
                    f.push(wire::WIRE_VERSION);
                    f.push(self.junk.below(11) as u8);
                    f.extend(self.junk.bytes(n - 2));
                    if !well_formed(&f) {
                        break f;
                    }
                };
                self.send_raw(swarm, p, f, "raw_random_body");
            }
            // A truncated frame: the prefix of a whole look-up, half of its bytes.
            let mut f = (lookup.len() as u32).to_be_bytes().to_vec();
            f.extend_from_slice(lookup.get(..lookup.len() / 2).unwrap_or_default());
            self.send_raw(swarm, p, f, "raw_truncated");
            // Well-formed pushes of random payloads under a bad signature: 2 MB (over the
            // node's frame bound for a small model) and one that fits the bound.
            let big = self.bad_push(BIG_PAYLOAD);
            self.send(
                swarm,
                p,
                Request::Push(big),
                "push_bad_sig_2mb",
                Purpose::Other,
            );
            let fit = self.bad_push(fitting);
            self.send(
                swarm,
                p,
                Request::Push(fit),
                "push_bad_sig_fitting",
                Purpose::Other,
            );
        }
    }
}

/// Whether a length-prefixed frame holds a request a node would decode.
fn well_formed(frame: &[u8]) -> bool {
    wire::decode::<Request>(frame.get(4..).unwrap_or_default(), frame.len()).is_ok()
}
