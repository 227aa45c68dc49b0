//! What a node serves to peers without asking the round task: its signed status, the
//! contributions it verified, the manifest, and encoded states in chunks — published as
//! immutable snapshots ([`ServedHandle`]): the round task publishes a new one, the network loop
//! answers from whichever is current and never waits for the round task.

use nightshift_protocol::message::MAX_CHUNK_BYTES;
use nightshift_protocol::slices::{Reduced, Slice};
use nightshift_protocol::{
    ContributionId, Hash32, SignedEnvelope, SignedManifest, StateChunk, StateSnapshot, StatusLists,
    wire,
};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// What a node serves to peers without asking the round task. Cheap to clone: every value is
/// shared.
#[derive(Clone, Debug)]
pub struct Served {
    /// The node's signed status ([`nightshift_protocol::sign_status`]) and the lists it
    /// commits to.
    pub status: Option<Arc<SignedEnvelope>>,
    pub status_lists: Option<Arc<StatusLists>>,
    /// Verified contributions by (round, sender).
    pub contributions: HashMap<(u64, [u8; 32]), Arc<SignedEnvelope>>,
    /// Slices (ours, and those gathered as a reducer) by (round, contribution, index).
    pub slices: HashMap<(u64, ContributionId, u32), Arc<Slice>>,
    /// Reduced slices signed by both their reducers, by (round, index).
    pub reduced: HashMap<(u64, u32), Arc<Reduced>>,
    /// Hash of the genesis state θ(0), served as long as the node runs.
    pub genesis: Option<Hash32>,
    pub manifest: Option<Arc<SignedManifest>>,
    /// Encoded states by hash (genesis and the current state), served in chunks to joiners.
    pub encoded: HashMap<Hash32, Arc<Vec<u8>>>,
    /// The hash of the current state (see [`Served::set_state`]).
    pub current: Option<Hash32>,
}

impl Served {
    /// Nothing served yet but the manifest.
    pub fn new(manifest: Option<SignedManifest>) -> Self {
        Served {
            status: None,
            status_lists: None,
            contributions: HashMap::new(),
            slices: HashMap::new(),
            reduced: HashMap::new(),
            genesis: None,
            manifest: manifest.map(Arc::new),
            encoded: HashMap::new(),
            current: None,
        }
    }

    /// The current state's hash and encoding (`wire::encode` of the
    /// [`nightshift_protocol::StateSnapshot`]), once one is served.
    pub fn current_state(&self) -> Option<(Hash32, Arc<Vec<u8>>)> {
        let h = self.current?;
        Some((h, self.encoded.get(&h)?.clone()))
    }

    /// Serves `slices`.
    pub fn add_slices<'a>(&mut self, slices: impl IntoIterator<Item = &'a Arc<Slice>>) {
        for s in slices {
            let key = (
                s.envelope.header.round,
                ContributionId::of(&s.envelope),
                s.index,
            );
            self.slices.insert(key, s.clone());
        }
    }

    /// Stops serving contributions, slices and reduced slices of rounds before `round`.
    pub fn forget_before(&mut self, round: u64) {
        self.contributions.retain(|(r, _), _| *r >= round);
        self.slices.retain(|(r, _, _), _| *r >= round);
        self.reduced.retain(|(r, _), _| *r >= round);
    }

    /// Serves the genesis state θ(0) (hash `hash`, encoding `bytes`) in chunks.
    pub fn set_genesis(&mut self, hash: Hash32, bytes: Arc<Vec<u8>>) {
        self.encoded.insert(hash, bytes);
        self.genesis = Some(hash);
    }

    /// Serves the state whose hash is `hash` and encoding `bytes` as the current state, in
    /// chunks; the previous current state stops being served, the genesis stays.
    pub fn set_state(&mut self, hash: Hash32, bytes: Arc<Vec<u8>>) {
        let keep = self.genesis;
        self.encoded.retain(|h, _| Some(*h) == keep);
        self.encoded.insert(hash, bytes);
        self.current = Some(hash);
    }

    pub(crate) fn chunk(&self, hash: &Hash32, offset: u64, len: u32) -> Option<StateChunk> {
        let bytes = self.encoded.get(hash)?;
        let total = bytes.len() as u64;
        let start = offset.min(total) as usize;
        let end = (offset.saturating_add(u64::from(len.min(MAX_CHUNK_BYTES)))).min(total) as usize;
        Some(StateChunk {
            total,
            offset: start as u64,
            bytes: bytes[start..end].to_vec(),
        })
    }
}

/// Where the current [`Served`] snapshot is published. Clones share it.
#[derive(Clone, Debug)]
pub struct ServedHandle {
    tx: Arc<watch::Sender<Arc<Served>>>,
}

impl ServedHandle {
    pub fn new(served: Served) -> Self {
        ServedHandle {
            tx: Arc::new(watch::Sender::new(Arc::new(served))),
        }
    }

    /// The snapshot served now; it never changes (a later [`ServedHandle::update`] publishes a
    /// new one).
    pub fn current(&self) -> Arc<Served> {
        self.tx.borrow().clone()
    }

    /// Publishes a new snapshot: the current one changed by `f`. A snapshot nobody holds any
    /// more (the usual case: answers hold one only while they are built) is changed in place;
    /// one still held is copied first, so its holder never sees it change. Copying every time
    /// cost O(N) per held contribution or slice, O(N²) a round.
    pub fn update(&self, f: impl FnOnce(&mut Served)) {
        self.tx.send_modify(|cur| match Arc::get_mut(cur) {
            Some(alone) => f(alone),
            None => {
                let mut next = Served::clone(cur);
                f(&mut next);
                *cur = Arc::new(next);
            }
        });
    }
}

/// The wire encoding of a state, as served in chunks.
pub fn encode_state(s: &StateSnapshot) -> Arc<Vec<u8>> {
    Arc::new(wire::encode(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_a_reader_holds_never_changes_and_one_nobody_holds_is_changed_in_place() {
        let served = ServedHandle::new(Served::new(None));
        let held = served.current();
        served.update(|s| s.genesis = Some(Hash32([1; 32])));
        assert_eq!(held.genesis, None, "a snapshot changed under its reader");
        assert_eq!(served.current().genesis, Some(Hash32([1; 32])));
        drop(held);
        let before = Arc::as_ptr(&served.current());
        served.update(|s| s.genesis = Some(Hash32([2; 32])));
        let now = served.current();
        assert_eq!(now.genesis, Some(Hash32([2; 32])));
        assert_eq!(
            Arc::as_ptr(&now),
            before,
            "a snapshot nobody held was copied instead of changed in place"
        );
    }
}
