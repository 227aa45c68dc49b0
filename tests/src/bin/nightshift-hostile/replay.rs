//! The `replay` mode: captured contributions pushed again rounds later.

use libp2p::{PeerId, Swarm};
use nightshift_protocol::{Request, SignedEnvelope};

use crate::net::Attacker;
use crate::{Purpose, Run};

impl Run {
    pub(crate) fn replay_tick(&mut self, swarm: &mut Swarm<Attacker>) {
        let Some(r) = self.honest_round else {
            return;
        };
        let stale: Vec<SignedEnvelope> = self
            .captured
            .iter()
            .filter(|((round, _), _)| r >= round.saturating_add(2))
            .map(|(_, e)| e.clone())
            .take(8)
            .collect();
        let peers: Vec<PeerId> = self.connected.iter().copied().collect();
        for env in stale {
            for p in &peers {
                self.replays_pushed += 1;
                self.send(
                    swarm,
                    *p,
                    Request::Push(env.clone()),
                    "push_replayed",
                    Purpose::Other,
                );
            }
        }
    }
}
