//! The libp2p side of a node: one task owns the libp2p `Swarm`; everything else talks to it through a
//! cloneable [`NetHandle`] over a bounded channel, each command carrying a oneshot reply.
//!
//! Transports: TCP + noise + yamux (with pnet under noise in a swarm with a pre-shared key), QUIC
//! (not in such a swarm), and circuits through relays. Behaviours: identify, ping, Kademlia
//! (server mode, protocol `/nightshift/<swarm>/kad/1.0.0`), request-response with our own
//! length-prefixed codec (`/nightshift/<swarm>/rr/1`), and for reachability AutoNAT, the relay
//! client (a relay server in bootstrap nodes) and DCUtR ([`reach`]). Inbound status, manifest, state and contribution look-ups are
//! answered on the loop from [`Served`]; pushes and announcements go to the round task as
//! [`NetEvent`]s. Nothing heavy runs on the loop.

pub mod codec;
mod event_loop;
pub mod limits;
pub mod reach;
mod served;

pub use codec::{TrafficCounters, WireCodec};
pub use event_loop::{
    MAX_QUEUED_PUSHES_PER_PEER, NetConfig, NetEvent, NetHandle, Served, ServedHandle,
    WINDOW_TTL_SECS, encode_state, spawn_network,
};

use libp2p::{PeerId, identity};
use nightshift_protocol::{Hash32, SignedEnvelope, Status, StatusError, StatusLists, open_status};

/// Keeps `info["network"]` (what `nightshift status` shows) equal to `reach`, refreshed every
/// second, for as long as the process runs.
pub fn show_reachability(
    reach: std::sync::Arc<std::sync::RwLock<reach::Reachability>>,
    info: std::sync::Arc<std::sync::RwLock<serde_json::Value>>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Ok(r) = reach.read().map(|r| r.clone()) else {
                return;
            };
            if let Ok(mut v) = info.write()
                && v.is_object()
            {
                v["network"] = serde_json::to_value(&r).unwrap_or_default();
            }
        }
    });
}

/// Milliseconds since the Unix epoch by this machine's clock (0 if it is before 1970).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds on a monotonic clock since this process first asked: the daemon's clock for the
/// round machine's rules (which take time as an argument).
pub fn mono_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Keeps `status` as `peer`'s in `book` unless the one held is newer (an older status arriving
/// late, or replayed, changes nothing). Returns whether it was kept.
pub fn note_newest(
    book: &mut std::collections::HashMap<PeerId, Status>,
    peer: PeerId,
    status: Status,
) -> bool {
    if book
        .get(&peer)
        .is_some_and(|held| held.unix_ms > status.unix_ms)
    {
        return false;
    }
    book.insert(peer, status);
    true
}

/// Checks the signed statuses peers send: signed by the very peer that sent it, for this swarm,
/// by an admitted key (in a swarm with an allowlist), and close to this node's clock.
#[derive(Clone, Debug)]
pub struct StatusCheck {
    swarm_id: Hash32,
    admitted: Option<Vec<[u8; 32]>>,
}

/// Why a peer's status was refused.
#[derive(Debug, thiserror::Error)]
pub enum StatusRefusal {
    #[error(transparent)]
    Status(#[from] StatusError),
    #[error("status signed by {signer}, sent by another peer")]
    NotTheSender { signer: String },
}

impl StatusCheck {
    /// The check for swarm `swarm_id`; `admitted` as in [`NetConfig::admitted`].
    pub fn new(swarm_id: Hash32, admitted: Option<Vec<[u8; 32]>>) -> Self {
        StatusCheck { swarm_id, admitted }
    }

    /// The swarm whose statuses this checks.
    pub fn swarm_id(&self) -> Hash32 {
        self.swarm_id
    }

    /// Opens `env`, a status that `peer` sent (as an announcement or an answer), at `now_ms`.
    ///
    /// # Errors
    /// When it is not `peer`'s own signed, current status of this swarm.
    pub fn open(
        &self,
        peer: &PeerId,
        env: &SignedEnvelope,
        now_ms: u64,
    ) -> Result<Status, StatusRefusal> {
        if public_key_of(peer) != Some(env.header.sender) {
            return Err(StatusRefusal::NotTheSender {
                signer: hex::encode(&env.header.sender[..6]),
            });
        }
        Ok(open_status(
            env,
            &self.swarm_id,
            self.admitted.as_deref(),
            now_ms,
        )?)
    }

    /// Opens `env` as [`StatusCheck::open`] does, with the lists it commits to.
    ///
    /// # Errors
    /// As [`StatusCheck::open`], or lists that are not the ones the status commits to.
    pub fn open_lists(
        &self,
        peer: &PeerId,
        env: &SignedEnvelope,
        lists: &StatusLists,
        now_ms: u64,
    ) -> Result<Status, StatusRefusal> {
        let s = self.open(peer, env, now_ms)?;
        if !lists.matches(&s) {
            return Err(StatusError::ListsMismatch.into());
        }
        Ok(s)
    }
}

/// The libp2p keypair of an ed25519 signing key (the same key signs contributions).
pub fn libp2p_keypair(key: &ed25519_dalek::SigningKey) -> identity::Keypair {
    let mut secret = key.to_bytes();
    // Infallible for 32 bytes.
    identity::Keypair::ed25519_from_bytes(&mut secret).expect("32-byte ed25519 secret")
}

/// The peer id of an ed25519 public key, or `None` when the bytes are not a valid key.
pub fn peer_id_of(public: &[u8; 32]) -> Option<PeerId> {
    let pk = identity::ed25519::PublicKey::try_from_bytes(public).ok()?;
    Some(identity::PublicKey::from(pk).to_peer_id())
}

/// Protocol names of a swarm: (kad, request-response).
pub fn protocol_names(swarm_id: &Hash32) -> (String, String) {
    let s = hex::encode(&swarm_id.0[..8]);
    (
        format!("/nightshift/{s}/kad/1.0.0"),
        format!("/nightshift/{s}/rr/1"),
    )
}

/// The ed25519 public key inside a peer id (ed25519 peer ids embed their key), if any.
pub fn public_key_of(peer: &PeerId) -> Option<[u8; 32]> {
    let mh: &libp2p::multihash::Multihash<64> = peer.as_ref();
    if mh.code() != 0 {
        return None;
    }
    let pk = identity::PublicKey::try_decode_protobuf(mh.digest()).ok()?;
    Some(pk.try_into_ed25519().ok()?.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_id_gives_back_its_key() {
        let key = ed25519_dalek::SigningKey::from_bytes(&[4; 32]);
        let public = key.verifying_key().to_bytes();
        let peer = peer_id_of(&public).unwrap();
        assert_eq!(public_key_of(&peer), Some(public));
        assert_eq!(libp2p_keypair(&key).public().to_peer_id(), peer);
    }
}
