//! Messages nodes exchange over request-response.

use serde::{Deserialize, Serialize};

use crate::slices::{Reduced, SliceAnswer};
use crate::{EncodedDelta, Hash32, SignedEnvelope, SignedManifest};

pub use crate::status::{
    MAX_LISTED, MAX_STATUS_BYTES, MAX_STATUS_LISTS_BYTES, MAX_STATUS_SKEW_MS, Status, StatusError,
    StatusLists, formed_root, holding_root, open_status, open_status_lists, sign_status,
};

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
    /// Its owner needs the machine: not training, not expected to contribute, still serving.
    /// (Appended last so that older encodings keep their meaning.)
    Paused,
}

/// One contribution, named exactly: its sender and the digest of what it signed
/// ([`SignedEnvelope::digest`]). A state lists the contributions that formed it this way, so a
/// node replaying it uses those very contributions even when a sender signed two different ones
/// for the round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ContributionId {
    pub sender: [u8; 32],
    pub digest: Hash32,
}

impl ContributionId {
    /// The id of `env`.
    pub fn of(env: &SignedEnvelope) -> Self {
        ContributionId {
            sender: env.header.sender,
            digest: env.digest(),
        }
    }
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
    /// How many contributions the sender expected this round, itself included: the trainers
    /// it saw working on the round. A round that gathers fewer takes a smaller step (the
    /// median of these over the round's contributions is the round's plan).
    pub expected: u32,
}

/// Largest `expected` a contribution may claim.
pub const MAX_EXPECTED: u32 = 4096;

/// Everything needed to continue from round `round`: θ(round) and the outer momentum.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StateSnapshot {
    pub round: u64,
    pub params: Vec<f32>,
    pub momentum: Vec<f32>,
    /// The contributions that formed this state (not covered by its hash: a node that adopts a
    /// state checks this list against the claim it verified).
    pub formed_by: Vec<ContributionId>,
    /// The running noise ratio of one contribution (spread around the round's mean over the
    /// mean's signal), which sizes the step of a round short of contributions; `None` until a
    /// round with two or more contributions.
    pub noise: Option<f64>,
}

impl StateSnapshot {
    /// The state hash the swarm agrees on. Covers the round, θ, the outer momentum and the
    /// noise ratio (a state without one hashes as [`state_hash`] of the first three).
    pub fn hash(&self) -> Hash32 {
        let h = state_hash(self.round, &self.params, &self.momentum);
        match self.noise {
            None => h,
            Some(r) => Hash32::of(&[STATE_DOMAIN, &h.0, b"noise", &r.to_bits().to_le_bytes()]),
        }
    }
}

/// Hash of a state given by parts; equal to [`StateSnapshot::hash`].
pub fn state_hash(round: u64, params: &[f32], momentum: &[f32]) -> Hash32 {
    let p = Hash32::of_f32s(b"params", params);
    let m = Hash32::of_f32s(b"momentum", momentum);
    Hash32::of(&[STATE_DOMAIN, &round.to_le_bytes(), &p.0, &m.0])
}

/// Largest state chunk a peer may ask for or send.
pub const MAX_CHUNK_BYTES: u32 = 4 << 20;

/// A piece of an encoded state (see [`Request::GetStateChunk`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChunk {
    /// Length of the whole encoded state.
    pub total: u64,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// What a node's window says it is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WindowState {
    /// The machine is idle and the node trains.
    Training,
    /// The machine is idle, but the node waits out the hysteresis or for peers.
    Waiting,
    /// The owner needs the machine (busy, scheduled off, or paused by hand).
    Busy,
    /// Catching up with the swarm's state.
    Syncing,
    /// Left the swarm.
    Left,
}

/// Longest free-text field in a [`WindowRecord`].
pub const MAX_WINDOW_TEXT: usize = 256;

/// A node's advertised window, signed (as a [`crate::PayloadKind::Window`] envelope whose
/// `round` is `updated_at`) and kept in Kademlia under [`window_key`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRecord {
    /// "cpu" or "cuda".
    pub device_kind: String,
    /// e.g. "NVIDIA H200" or "cpu (16 threads)".
    pub device_name: String,
    /// Device memory in bytes (0 when unknown).
    pub memory_bytes: u64,
    /// Measured inner-loop throughput (0 before the first round).
    pub tokens_per_sec: f32,
    /// Unix seconds at which the current window closes, when known.
    pub open_until: Option<u64>,
    pub state: WindowState,
    /// Why busy, or what it waits for.
    pub reason: String,
    /// The round the node holds.
    pub round: u64,
    /// Unix seconds of this record (also the envelope's round: newer wins).
    pub updated_at: u64,
}

impl WindowRecord {
    /// Checks the bounds a peer controls.
    ///
    /// # Errors
    /// A text field over [`MAX_WINDOW_TEXT`] or a non-finite throughput.
    pub fn check(&self) -> Result<(), String> {
        for (name, v) in [
            ("device_kind", &self.device_kind),
            ("device_name", &self.device_name),
            ("reason", &self.reason),
        ] {
            if v.len() > MAX_WINDOW_TEXT {
                return Err(format!(
                    "{name} is {} bytes (limit {MAX_WINDOW_TEXT})",
                    v.len()
                ));
            }
        }
        if !self.tokens_per_sec.is_finite() || self.tokens_per_sec < 0.0 {
            return Err(format!("tokens_per_sec is {}", self.tokens_per_sec));
        }
        Ok(())
    }
}

/// Signs `record` as `key`'s window in swarm `swarm_id`.
pub fn sign_window(
    key: &ed25519_dalek::SigningKey,
    swarm_id: Hash32,
    state_hash: Hash32,
    record: &WindowRecord,
) -> SignedEnvelope {
    let header = crate::signed::EnvelopeHeader {
        kind: crate::PayloadKind::Window,
        swarm_id,
        round: record.updated_at,
        sender: [0; 32],
        base_hash: state_hash,
    };
    SignedEnvelope::sign(key, header, crate::wire::encode(record))
}

/// Verifies a window envelope for swarm `swarm_id` and decodes its record.
///
/// # Errors
/// A bad signature, another swarm or kind, an undecodable or out-of-bounds record, or a record
/// whose time stamp differs from the signed one.
pub fn open_window(env: &SignedEnvelope, swarm_id: &Hash32) -> Result<WindowRecord, String> {
    let expect = crate::Expectation {
        kind: crate::PayloadKind::Window,
        swarm_id: *swarm_id,
        round: env.header.round,
        base_hash: env.header.base_hash,
        allowlist: None,
        max_payload: 4 * MAX_WINDOW_TEXT + 256,
    };
    let body = env.verify(&expect).map_err(|e| e.to_string())?;
    let rec: WindowRecord =
        crate::wire::decode(body, 4 * MAX_WINDOW_TEXT + 256).map_err(|e| e.to_string())?;
    rec.check()?;
    if rec.updated_at != env.header.round {
        return Err("the record's time stamp differs from the signed one".into());
    }
    Ok(rec)
}

/// The Kademlia key of `sender`'s window record in swarm `swarm_id`.
pub fn window_key(swarm_id: &Hash32, sender: &[u8; 32]) -> Vec<u8> {
    let mut k = b"/nightshift/window/".to_vec();
    k.extend_from_slice(&swarm_id.0);
    k.push(b'/');
    k.extend_from_slice(sender);
    k
}

/// A request from one peer to another.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// "Here is my signed status" (sent on phase changes; see [`sign_status`]).
    Announce(SignedEnvelope),
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
    /// "Send me `len` bytes from `offset` of the encoded state whose hash is `hash`" (the genesis
    /// or the current state). A joiner downloads θ(t) in such chunks, resumably.
    GetStateChunk { hash: Hash32, offset: u64, len: u32 },
    /// "Here is a reduced slice": a reducer's, to the slice's checker; the checker's, signed by
    /// both, to every peer (a swarm that averages slice by slice).
    PushReduced(Reduced),
    /// "Send me slice `index` of contribution `id` to `round`, if you hold it" — with the
    /// contribution's signed header only when `header` (the asker does not hold it).
    GetSlice {
        round: u64,
        id: ContributionId,
        index: u32,
        header: bool,
    },
    /// "Send me reduced slice `index` of `round`, signed by both its reducers, if you hold it."
    GetReduced { round: u64, index: u32 },
    /// "What is your status, with the lists it commits to?"
    GetStatusLists,
}

/// Largest frame of any request but [`Request::Push`] and [`Request::PushReduced`]: a signed
/// status and some room.
pub const MAX_SMALL_REQUEST_BYTES: usize = MAX_STATUS_BYTES + 4096;

/// Whether a request frame that starts with `head` (its first two bytes: the wire version and
/// the variant) may be large: only a pushed contribution or reduced slice may. A receiver checks this before
/// reading the rest, so a peer cannot make it buffer a large frame of a small kind.
pub fn may_be_large(head: [u8; 2]) -> bool {
    // bincode writes the variant index as a one-byte varint below 251: Push, PushReduced.
    head[1] == 2 || head[1] == 7
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ack,
    /// The responder's signed status ([`sign_status`]).
    Status(SignedEnvelope),
    Contribution(Option<SignedEnvelope>),
    State(Option<StateSnapshot>),
    Manifest(Option<Box<SignedManifest>>),
    /// A piece of an encoded [`StateSnapshot`]: `total` bytes in all; `None` when the peer no
    /// longer holds that state.
    StateChunk(Option<StateChunk>),
    /// The request was understood and refused, with the reason.
    Refused(String),
    /// Slice `index` of a sliced contribution (its signed header only when asked for).
    Slice(Option<Box<SliceAnswer>>),
    Reduced(Option<Reduced>),
    /// The responder's signed status and the lists it commits to.
    StatusLists {
        status: SignedEnvelope,
        lists: StatusLists,
    },
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
            noise: None,
        };
        let mut t = s.clone();
        t.round = 2;
        assert_ne!(s.hash(), t.hash());
        let mut t = s.clone();
        t.momentum[1] = 1e-9;
        assert_ne!(s.hash(), t.hash());
        // formed_by is metadata, not state.
        let mut t = s.clone();
        t.formed_by.push(ContributionId {
            sender: [1; 32],
            digest: Hash32::default(),
        });
        assert_eq!(s.hash(), t.hash());
        // The noise ratio sizes later steps: it is state.
        let mut t = s.clone();
        t.noise = Some(0.5);
        assert_ne!(s.hash(), t.hash());
        let mut u = t.clone();
        u.noise = Some(0.5000001);
        assert_ne!(t.hash(), u.hash());
    }

    #[test]
    fn window_records_verify_and_refuse_tampering() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let swarm = Hash32::of(&[b"swarm"]);
        let rec = WindowRecord {
            device_kind: "cpu".into(),
            device_name: "cpu (2 threads)".into(),
            memory_bytes: 0,
            tokens_per_sec: 5000.0,
            open_until: Some(1_800_000_000),
            state: WindowState::Training,
            reason: String::new(),
            round: 4,
            updated_at: 1_700_000_000,
        };
        let env = sign_window(&key, swarm, Hash32::of(&[b"state"]), &rec);
        assert_eq!(open_window(&env, &swarm).unwrap(), rec);
        assert!(open_window(&env, &Hash32::of(&[b"other"])).is_err());
        let mut t = env.clone();
        t.payload[0] ^= 1;
        assert!(open_window(&t, &swarm).unwrap_err().contains("signature"));
        let mut long = rec.clone();
        long.reason = "x".repeat(MAX_WINDOW_TEXT + 1);
        let env = sign_window(&key, swarm, Hash32::of(&[b"state"]), &long);
        assert!(open_window(&env, &swarm).is_err());
        let mut nan = rec;
        nan.tokens_per_sec = f32::NAN;
        let env = sign_window(&key, swarm, Hash32::of(&[b"state"]), &nan);
        assert!(
            open_window(&env, &swarm)
                .unwrap_err()
                .contains("tokens_per_sec")
        );
    }

    #[test]
    fn only_a_push_may_be_a_large_request() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32]);
        let status = Status::summarizing(
            NodeRole::Trainer,
            Phase::Ready,
            1,
            Hash32::default(),
            &StatusLists::default(),
        );
        let env = sign_status(&key, Hash32::default(), &status);
        let all = [
            (Request::Announce(env.clone()), false),
            (Request::GetStatus, false),
            (Request::GetStatusLists, false),
            (Request::Push(env), true),
            (
                Request::GetContribution {
                    round: 1,
                    sender: [1; 32],
                },
                false,
            ),
            (Request::GetState { round: None }, false),
            (Request::GetManifest, false),
            (
                Request::GetStateChunk {
                    hash: Hash32::default(),
                    offset: 0,
                    len: 1,
                },
                false,
            ),
        ];
        for (r, large) in all {
            let f = wire::encode(&r);
            assert_eq!(may_be_large([f[0], f[1]]), large, "{r:?}");
        }
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
