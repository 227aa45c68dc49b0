//! Requests, dialling, and what the hostile peer learns from the honest nodes' statuses.

use libp2p::swarm::dial_opts::DialOpts;
use libp2p::{Multiaddr, PeerId, Swarm};
use nightshift_node::net::{public_key_of, unix_ms};
use nightshift_protocol::message::Phase;
use nightshift_protocol::{NodeRole, Request, SignedEnvelope, StatusLists, open_status};

use crate::args::Mode;
use crate::net::Attacker;
use crate::{MAX_CAPTURED, Pending, Purpose, Run, Tally};

impl Run {
    pub(crate) fn tally(&mut self, kind: &'static str) -> &mut Tally {
        self.tally.entry(kind).or_default()
    }

    pub(crate) fn send(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        peer: PeerId,
        req: Request,
        kind: &'static str,
        purpose: Purpose,
    ) {
        let id = swarm.behaviour_mut().probe.rr.send_request(&peer, req);
        self.tally(kind).sent += 1;
        self.pending.insert(
            id,
            Pending {
                peer,
                kind,
                purpose,
            },
        );
    }

    pub(crate) fn send_raw(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        peer: PeerId,
        bytes: Vec<u8>,
        kind: &'static str,
    ) {
        let Some(raw) = swarm.behaviour_mut().raw.as_mut() else {
            return;
        };
        let id = raw.send_request(&peer, bytes);
        self.tally(kind).sent += 1;
        self.raw_pending.insert(id, (peer, kind));
    }

    pub(crate) fn connected_trainers(&self) -> Vec<PeerId> {
        let mut v: Vec<PeerId> = self
            .trainers
            .iter()
            .filter(|p| self.connected.contains(p))
            .copied()
            .collect();
        v.sort();
        v
    }

    /// Dials the bootstrap and every known trainer we are not connected to.
    pub(crate) fn redial(&mut self, swarm: &mut Swarm<Attacker>) {
        if let Some(b) = self.boot
            && !self.connected.contains(&b)
            && swarm.dial(self.boot_addr.clone()).is_err()
        {
            self.dial_failures += 1;
        }
        let known: Vec<(PeerId, Vec<Multiaddr>)> = self
            .addrs
            .iter()
            .filter(|(p, a)| Some(**p) != self.boot && !self.connected.contains(p) && !a.is_empty())
            .map(|(p, a)| (*p, a.clone()))
            .collect();
        for (p, a) in known {
            if swarm
                .dial(DialOpts::peer_id(p).addresses(a).build())
                .is_err()
            {
                self.dial_failures += 1;
            }
        }
    }

    /// Asks every connected peer for its status; looks for more peers.
    pub(crate) fn poll_statuses(&mut self, swarm: &mut Swarm<Attacker>) {
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for p in peers {
            // Replaying what peers hold needs the lists their statuses commit to.
            if self.mode == Mode::Replay {
                let req = Request::GetStatusLists;
                self.send(swarm, p, req, "get_status_lists", Purpose::Status);
            } else {
                self.send(swarm, p, Request::GetStatus, "get_status", Purpose::Status);
            }
        }
        if !self.connected.is_empty() {
            swarm
                .behaviour_mut()
                .probe
                .kad
                .get_closest_peers(PeerId::random());
        }
    }

    /// Opens a status `peer` sent (an answer or an announcement) and learns from it; in the
    /// forging modes a higher honest round is answered at once with a forged state one round
    /// ahead of it.
    pub(crate) fn note_status(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        peer: PeerId,
        env: &SignedEnvelope,
        lists: Option<&StatusLists>,
    ) {
        let status = match open_status(env, &self.swarm_id, None, unix_ms()) {
            Ok(s) if public_key_of(&peer) == Some(env.header.sender) => s,
            _ => {
                self.statuses_refused += 1;
                return;
            }
        };
        self.statuses_opened += 1;
        let mut newer = false;
        if status.role == NodeRole::Trainer {
            self.trainers.insert(peer);
            newer = self.honest_round.is_none_or(|r| status.round > r);
            self.honest_round = Some(self.honest_round.unwrap_or(0).max(status.round));
            self.honest_hashes.insert(status.round, status.state_hash);
            if self.honest_hashes.len() > 64
                && let Some(first) = self.honest_hashes.keys().next().copied()
            {
                self.honest_hashes.remove(&first);
            }
        }
        let lists = lists.filter(|l| l.matches(&status));
        if let Some(lists) = lists
            && self.mode == Mode::Replay
            && status.role == NodeRole::Trainer
        {
            let mut wants: Vec<(u64, [u8; 32])> =
                lists.holding.iter().map(|k| (status.round, *k)).collect();
            if status.round > 0 {
                wants.extend(
                    lists
                        .formed_by
                        .iter()
                        .map(|id| (status.round - 1, id.sender)),
                );
            }
            for w in wants {
                if w.1 != self.me
                    && self.asked.len() < 4 * MAX_CAPTURED
                    && self.captured.len() < MAX_CAPTURED
                    && self.asked.insert(w)
                {
                    self.send(
                        swarm,
                        peer,
                        Request::GetContribution {
                            round: w.0,
                            sender: w.1,
                        },
                        "get_contribution",
                        Purpose::Capture(w.0, w.1),
                    );
                }
            }
        }
        let finishing = status.role == NodeRole::Trainer
            && status.phase == Phase::Collecting
            && Some(status.round) == self.honest_round;
        self.statuses.insert(peer, status);
        if self.mode == Mode::Forge && finishing {
            // The swarm is about to enter round R+1: be one round ahead of it when it aligns.
            self.forge_claim(swarm, self.honest_round.unwrap_or(0).saturating_add(2));
        } else if newer && self.mode.forges() {
            // The swarm entered a new round: claim the next one now.
            self.flip = false;
            self.forge_tick(swarm);
        }
    }
}
