//! Durable node state in sled: identity key, manifest, checkpoints, and partial state downloads.
//!
//! A checkpoint (round, θ, outer momentum, who formed it) is one value written with one `insert`
//! into the `checkpoints` tree under its round (big-endian, so the last key is the newest) and
//! flushed, so a crash at any moment leaves either the old or the new checkpoint, never a mix.
//! Only the newest [`KEEP_CHECKPOINTS`] are kept; older ones are pruned after the new one is on
//! disk. A value that does not decode (which sled's own checksums should prevent) is skipped in
//! favour of the next older one.

#[cfg(test)]
use nightshift_protocol::Hash32;
use nightshift_protocol::slices::Slice;
use nightshift_protocol::{SignedManifest, StateSnapshot, WIRE_VERSION, wire};
use std::path::Path;
use thiserror::Error;

const KEY_IDENTITY: &[u8] = b"identity";
const KEY_MANIFEST: &[u8] = b"manifest";
/// The single checkpoint key of stores written before checkpoints had a history.
const KEY_STATE: &[u8] = b"state";
const TREE_CHECKPOINTS: &str = "checkpoints";
const TREE_DOWNLOADS: &str = "downloads";
const TREE_OWN_SLICES: &str = "own-slices";
/// Rounds of our own slices kept on disk.
const KEEP_OWN_SLICE_ROUNDS: usize = 2;
/// Checkpoints kept on disk.
pub const KEEP_CHECKPOINTS: usize = 3;

/// Why storage failed.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}")]
    Open {
        path: String,
        #[source]
        source: sled::Error,
    },
    #[error("storage failure")]
    Sled(#[from] sled::Error),
    #[error("stored {what} is corrupt: {reason}")]
    Corrupt { what: &'static str, reason: String },
    #[error(
        "stored {what} was written by a nightshift speaking wire version {version} (this build \
         speaks {WIRE_VERSION}): start from a fresh --data-dir, or run that build"
    )]
    OtherVersion { what: &'static str, version: u8 },
}

/// A stored value that did not decode: another build's, or damaged.
fn undecodable(what: &'static str, e: wire::DecodeError) -> StoreError {
    match e {
        wire::DecodeError::Version(version) => StoreError::OtherVersion { what, version },
        e => StoreError::Corrupt {
            what,
            reason: e.to_string(),
        },
    }
}

/// The node's store.
#[derive(Clone)]
pub struct Store {
    db: sled::Db,
}

/// How long [`Store::open`] waits for another handle's lock on the directory to go away.
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

impl Store {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// When sled cannot open the directory (for example another node holds it).
    ///
    /// sled's file lock outlives a dropped handle by a moment (its flusher thread lets go
    /// last), so a lock held by someone else is waited for up to [`LOCK_WAIT`] before this
    /// gives up: a node restarted at once, or a store reopened in the same process, gets in.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match sled::open(dir) {
                Ok(db) => return Ok(Store { db }),
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                Err(source) => {
                    return Err(StoreError::Open {
                        path: dir.display().to_string(),
                        source,
                    });
                }
            }
        }
    }

    /// The stored identity secret, if any.
    ///
    /// # Errors
    /// On storage failure or a value that is not 32 bytes.
    pub fn identity(&self) -> Result<Option<[u8; 32]>, StoreError> {
        match self.db.get(KEY_IDENTITY)? {
            None => Ok(None),
            Some(v) => v
                .as_ref()
                .try_into()
                .map(Some)
                .map_err(|_| StoreError::Corrupt {
                    what: "identity",
                    reason: format!("{} bytes", v.len()),
                }),
        }
    }

    /// Stores the identity secret.
    ///
    /// # Errors
    /// On storage failure.
    pub fn set_identity(&self, secret: &[u8; 32]) -> Result<(), StoreError> {
        self.put(KEY_IDENTITY, secret)
    }

    /// One atomic insert, flushed to disk before returning.
    fn put(&self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.db.insert(key, value)?;
        self.db.flush()?;
        Ok(())
    }

    /// The stored manifest, if any.
    ///
    /// # Errors
    /// On storage failure or an undecodable value.
    pub fn manifest(&self) -> Result<Option<SignedManifest>, StoreError> {
        self.get(KEY_MANIFEST, "manifest")
    }

    /// Stores the manifest.
    ///
    /// # Errors
    /// On storage failure.
    pub fn set_manifest(&self, m: &SignedManifest) -> Result<(), StoreError> {
        self.put(KEY_MANIFEST, &wire::encode(m))
    }

    /// The newest checkpoint that decodes, if any.
    ///
    /// # Errors
    /// On storage failure, or when checkpoints exist and none decodes.
    pub fn checkpoint(&self) -> Result<Option<StateSnapshot>, StoreError> {
        let tree = self.db.open_tree(TREE_CHECKPOINTS)?;
        let mut last_err = None;
        for item in tree.iter().rev() {
            let (_, v) = item?;
            match wire::decode::<StateSnapshot>(&v, usize::MAX) {
                Ok(s) => return Ok(Some(s)),
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(e) = last_err {
            return Err(undecodable("checkpoint", e));
        }
        self.get(KEY_STATE, "checkpoint")
    }

    /// The checkpoint of `round`, when it is still on disk and decodes.
    ///
    /// # Errors
    /// On storage failure.
    pub fn checkpoint_at(&self, round: u64) -> Result<Option<StateSnapshot>, StoreError> {
        let tree = self.db.open_tree(TREE_CHECKPOINTS)?;
        Ok(tree
            .get(round.to_be_bytes())?
            .and_then(|v| wire::decode::<StateSnapshot>(&v, usize::MAX).ok()))
    }

    /// Rounds of the checkpoints on disk, oldest first.
    ///
    /// # Errors
    /// On storage failure.
    pub fn checkpoint_rounds(&self) -> Result<Vec<u64>, StoreError> {
        let tree = self.db.open_tree(TREE_CHECKPOINTS)?;
        tree.iter()
            .keys()
            .map(|k| {
                let k = k?;
                Ok(u64::from_be_bytes(k.as_ref().try_into().unwrap_or([0; 8])))
            })
            .collect()
    }

    /// Writes a checkpoint atomically, flushes it to disk, then prunes all but the newest
    /// [`KEEP_CHECKPOINTS`].
    ///
    /// # Errors
    /// On storage failure; the previous checkpoints are then still in place.
    pub fn save_checkpoint(&self, s: &StateSnapshot) -> Result<(), StoreError> {
        self.save_encoded_checkpoint(s.round, &wire::encode(s))
    }

    /// [`Store::save_checkpoint`] for a state already encoded (`wire::encode`) as `bytes`.
    ///
    /// # Errors
    /// On storage failure; the previous checkpoints are then still in place.
    pub fn save_encoded_checkpoint(&self, round: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let tree = self.db.open_tree(TREE_CHECKPOINTS)?;
        tree.insert(round.to_be_bytes(), bytes)?;
        tree.flush()?;
        // A newer round may already be on disk (after a repair to an older canonical round the
        // newest is ours again): prune by position, never the one just written.
        let keys: Vec<sled::IVec> = tree.iter().keys().collect::<Result<_, _>>()?;
        let excess = keys.len().saturating_sub(KEEP_CHECKPOINTS);
        for k in keys.iter().take(excess) {
            if k.as_ref() != round.to_be_bytes() {
                tree.remove(k)?;
            }
        }
        // A repair can go back to an older round: newer, diverged checkpoints must not win.
        for k in keys
            .iter()
            .filter(|k| k.as_ref() > &round.to_be_bytes()[..])
        {
            tree.remove(k)?;
        }
        if self.db.contains_key(KEY_STATE)? {
            self.db.remove(KEY_STATE)?;
        }
        tree.flush()?;
        Ok(())
    }

    /// Keeps our own contribution's slices to `round` on disk (flushed): until the round's
    /// reducers have fetched them, nobody else holds them, so a restart must not lose them.
    /// Only the newest `KEEP_OWN_SLICE_ROUNDS` rounds are kept.
    ///
    /// # Errors
    /// On storage failure.
    pub fn save_own_slices(&self, round: u64, slices: &[Slice]) -> Result<(), StoreError> {
        let tree = self.db.open_tree(TREE_OWN_SLICES)?;
        let mut key = round.to_be_bytes().to_vec();
        if let Some(first) = slices.first() {
            key.extend_from_slice(&first.envelope.digest().0);
        }
        tree.insert(key, wire::encode(&slices))?;
        let rounds: Vec<sled::IVec> = tree.iter().keys().collect::<Result<_, _>>()?;
        let mut seen: Vec<[u8; 8]> = rounds
            .iter()
            .map(|k| k[..8].try_into().unwrap_or([0; 8]))
            .collect();
        seen.dedup();
        if seen.len() > KEEP_OWN_SLICE_ROUNDS {
            let oldest = &seen[..seen.len() - KEEP_OWN_SLICE_ROUNDS];
            for k in rounds
                .iter()
                .filter(|k| oldest.iter().any(|o| k[..8] == o[..]))
            {
                tree.remove(k)?;
            }
        }
        tree.flush()?;
        Ok(())
    }

    /// Our own slices kept on disk (those that decode), newest rounds last.
    ///
    /// # Errors
    /// On storage failure.
    pub fn own_slices(&self) -> Result<Vec<Slice>, StoreError> {
        let tree = self.db.open_tree(TREE_OWN_SLICES)?;
        let mut out = vec![];
        for item in tree.iter() {
            let (_, v) = item?;
            if let Ok(slices) = wire::decode::<Vec<Slice>>(&v, usize::MAX) {
                out.extend(slices);
            }
        }
        Ok(out)
    }

    /// The bytes downloaded so far of the encoded state with hash `hash` (a resumable sync):
    /// the contiguous chunks from offset 0.
    ///
    /// # Errors
    /// On storage failure.
    pub fn download(&self, hash: &[u8; 32]) -> Result<Vec<u8>, StoreError> {
        let tree = self.db.open_tree(TREE_DOWNLOADS)?;
        let mut out = Vec::new();
        for item in tree.scan_prefix(hash) {
            let (k, v) = item?;
            let offset = u64::from_be_bytes(k[32..].try_into().unwrap_or([0xff; 8]));
            if offset != out.len() as u64 {
                break;
            }
            out.extend_from_slice(&v);
        }
        Ok(out)
    }

    /// Records one downloaded chunk of state `hash`; drops partial downloads of other states.
    ///
    /// # Errors
    /// On storage failure.
    pub fn save_chunk(&self, hash: &[u8; 32], offset: u64, bytes: &[u8]) -> Result<(), StoreError> {
        let tree = self.db.open_tree(TREE_DOWNLOADS)?;
        if offset == 0 {
            for k in tree.iter().keys() {
                let k = k?;
                if !k.starts_with(hash) {
                    tree.remove(k)?;
                }
            }
        }
        let mut key = hash.to_vec();
        key.extend_from_slice(&offset.to_be_bytes());
        tree.insert(key, bytes)?;
        tree.flush()?;
        Ok(())
    }

    /// Forgets every partial download.
    ///
    /// # Errors
    /// On storage failure.
    pub fn clear_downloads(&self) -> Result<(), StoreError> {
        self.db.open_tree(TREE_DOWNLOADS)?.clear()?;
        Ok(())
    }

    fn get<T: serde::de::DeserializeOwned>(
        &self,
        key: &[u8],
        what: &'static str,
    ) -> Result<Option<T>, StoreError> {
        match self.db.get(key)? {
            None => Ok(None),
            Some(v) => wire::decode(&v, usize::MAX)
                .map(Some)
                .map_err(|e| undecodable(what, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoints_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let s = StateSnapshot {
            round: 4,
            params: vec![1.0, 2.0],
            momentum: vec![0.5, 0.0],
            formed_by: vec![nightshift_protocol::ContributionId {
                sender: [1; 32],
                digest: Hash32::of(&[b"c"]),
            }],
            noise: Some(1.25),
        };
        {
            let store = Store::open(dir.path()).unwrap();
            assert!(store.checkpoint().unwrap().is_none());
            store.save_checkpoint(&s).unwrap();
            store.set_identity(&[9; 32]).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.checkpoint().unwrap(), Some(s));
        assert_eq!(store.identity().unwrap(), Some([9; 32]));
    }

    #[test]
    fn a_checkpoint_from_another_wire_version_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.save_checkpoint(&state(3)).unwrap();
            // What a version-1 build left behind: the same bytes under the old version byte.
            let tree = store.db.open_tree(TREE_CHECKPOINTS).unwrap();
            let mut old = wire::encode(&state(4));
            old[0] = 1;
            tree.clear().unwrap();
            tree.insert(4u64.to_be_bytes(), old).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let err = store.checkpoint().unwrap_err().to_string();
        assert!(
            err.contains("wire version 1") && err.contains("fresh --data-dir"),
            "{err}"
        );
    }

    fn state(round: u64) -> StateSnapshot {
        StateSnapshot {
            round,
            params: vec![round as f32; 3],
            momentum: vec![0.0; 3],
            formed_by: vec![],
            noise: None,
        }
    }

    #[test]
    fn old_checkpoints_are_pruned_and_the_newest_wins() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for r in 1..=6 {
            store.save_checkpoint(&state(r)).unwrap();
        }
        assert_eq!(store.checkpoint_rounds().unwrap(), vec![4, 5, 6]);
        assert_eq!(store.checkpoint().unwrap(), Some(state(6)));
        // A repair back to round 5 (the swarm's canonical state) replaces the diverged 6.
        let mut repaired = state(5);
        repaired.params[0] = -1.0;
        store.save_checkpoint(&repaired).unwrap();
        assert_eq!(store.checkpoint_rounds().unwrap(), vec![4, 5]);
        assert_eq!(store.checkpoint().unwrap(), Some(repaired));
    }

    #[test]
    fn partial_downloads_resume_and_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.save_chunk(&[1; 32], 0, b"ab").unwrap();
            store.save_chunk(&[1; 32], 2, b"c").unwrap();
            // A chunk past a gap is not part of the resumable prefix.
            store.save_chunk(&[1; 32], 9, b"z").unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.download(&[1; 32]).unwrap(), b"abc");
        store.save_chunk(&[2; 32], 0, b"x").unwrap();
        assert!(store.download(&[1; 32]).unwrap().is_empty());
        assert_eq!(store.download(&[2; 32]).unwrap(), b"x");
        store.clear_downloads().unwrap();
        assert!(store.download(&[2; 32]).unwrap().is_empty());
    }

    #[test]
    fn our_slices_survive_a_restart_and_only_the_newest_rounds_are_kept() {
        use nightshift_protocol::DeltaCodec;
        use nightshift_protocol::slices::{
            SlicedContribution, SlicedDelta, round_slices, sign_sliced,
        };
        let dir = tempfile::tempdir().unwrap();
        let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
        let codec = DeltaCodec::Int4 { block: 64 };
        let values: Vec<f32> = (0..512).map(|i| (i as f32 * 0.1).sin()).collect();
        let ranges = round_slices(values.len(), 2, codec, codec).unwrap();
        let slices_of = |round: u64| -> Vec<Slice> {
            let sliced = SlicedDelta::encode(codec, &values, &ranges);
            let header = SlicedContribution {
                tokens: 10,
                inner_steps: 1,
                train_loss: 1.0,
                expected: 1,
                codec,
                len: values.len() as u64,
                slices: 2,
                root: sliced.root,
            };
            let env = sign_sliced(&key, Hash32::default(), round, Hash32::default(), &header);
            (0..2).map(|j| sliced.slice(&env, j)).collect()
        };
        {
            let store = Store::open(dir.path()).unwrap();
            for round in 1..=3 {
                store.save_own_slices(round, &slices_of(round)).unwrap();
            }
        }
        let store = Store::open(dir.path()).unwrap();
        let kept = store.own_slices().unwrap();
        let rounds: Vec<u64> = kept.iter().map(|s| s.envelope.header.round).collect();
        assert_eq!(rounds, vec![2, 2, 3, 3]);
        assert_eq!(kept[2..], slices_of(3)[..]);
    }
}
