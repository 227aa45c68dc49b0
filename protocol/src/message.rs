//! Messages nodes exchange over request-response.

use serde::{Deserialize, Serialize};

use crate::{EncodedDelta, Hash32, SignedEnvelope, SignedManifest};

/// Domain tag of state hashes.
pub const STATE_DOMAIN: &[u8] = b"nightshift/state/v1\0";

/// What part a peer plays in the swarm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeRole {
    /// Trains and contributes.
    Trainer,
    /// Serves the manifest, the genesis state and Kademlia; never contributes.
    Bootstrap,
}

/// Where a trainer is within its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Catching up with the swarm; not expected to contribute to `round`.
    Syncing,
    /// Holds θ(round) and is about to train it (between rounds).
    Ready,
    /// Running inner steps from θ(round).
    Training,
    /// Its contribution for `round` is out; gathering the others'.
    Collecting,
    /// Finished its last round and leaving.
    Done,
}

/// A node's view of itself, sent on every phase change and on request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub role: NodeRole,
    pub phase: Phase,
    /// The round being worked on: the node holds θ(round).
    pub round: u64,
    /// Hash of θ(round) and the outer-optimizer state ([`StateSnapshot::hash`]).
    pub state_hash: Hash32,
    /// Senders whose contributions formed θ(round) (empty for round 0).
    pub formed_by: Vec<[u8; 32]>,
    /// Senders whose verified contributions for `round` this node holds so far.
    pub holding: Vec<[u8; 32]>,
}

/// The payload of a [`crate::PayloadKind::Contribution`] envelope.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Contribution {
    /// Tokens actually trained for this delta (the averaging weight).
    pub tokens: u64,
    /// Inner steps taken.
    pub inner_steps: u32,
    /// Mean training loss over those steps, for display.
    pub train_loss: f32,
    /// The pseudo-gradient θ(round) − θ_i.
    pub delta: EncodedDelta,
}

/// Everything needed to continue from round `round`: θ(round) and the outer momentum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateSnapshot {
    pub round: u64,
    pub params: Vec<f32>,
    pub momentum: Vec<f32>,
    /// Senders whose contributions formed this state.
    pub formed_by: Vec<[u8; 32]>,
}

impl StateSnapshot {
    /// The state hash the swarm agrees on. Covers the round, θ and the outer momentum.
    pub fn hash(&self) -> Hash32 {
        state_hash(self.round, &self.params, &self.momentum)
    }
}

/// Hash of a state given by parts; equal to [`StateSnapshot::hash`].
pub fn state_hash(round: u64, params: &[f32], momentum: &[f32]) -> Hash32 {
    let p = Hash32::of_f32s(b"params", params);
    let m = Hash32::of_f32s(b"momentum", momentum);
    Hash32::of(&[STATE_DOMAIN, &round.to_le_bytes(), &p.0, &m.0])
}

/// A request from one peer to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// "Here is my status" (sent on phase changes).
    Announce(Status),
    /// "What is your status?"
    GetStatus,
    /// "Here is my (or a relayed) contribution."
    Push(SignedEnvelope),
    /// "Send me `sender`'s contribution for `round`, if you hold it."
    GetContribution { round: u64, sender: [u8; 32] },
    /// "Send me your current state" (or the genesis state when `round` is `Some(0)`).
    GetState { round: Option<u64> },
    /// "Send me the swarm manifest."
    GetManifest,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ack,
    Status(Status),
    Contribution(Option<SignedEnvelope>),
    State(Option<StateSnapshot>),
    Manifest(Option<SignedManifest>),
    /// The request was understood and refused, with the reason.
    Refused(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire;

    #[test]
    fn state_hash_covers_round_params_and_momentum() {
        let s = StateSnapshot {
            round: 1,
            params: vec![1.0, 2.0],
            momentum: vec![0.0, 0.0],
            formed_by: vec![],
        };
        let mut t = s.clone();
        t.round = 2;
        assert_ne!(s.hash(), t.hash());
        let mut t = s.clone();
        t.momentum[1] = 1e-9;
        assert_ne!(s.hash(), t.hash());
        // formed_by is metadata, not state.
        let mut t = s.clone();
        t.formed_by.push([1; 32]);
        assert_eq!(s.hash(), t.hash());
    }

    #[test]
    fn requests_round_trip_through_the_wire() {
        let r = Request::GetContribution {
            round: 9,
            sender: [7; 32],
        };
        assert_eq!(
            wire::decode::<Request>(&wire::encode(&r), 1 << 20).unwrap(),
            r
        );
    }
}
