//! Durable node state in sled: identity key, manifest, and the latest checkpoint.
//!
//! A checkpoint (round, θ, outer momentum, who formed it) is one value written with one `insert`
//! and flushed, so a crash at any moment leaves either the old or the new checkpoint, never a mix.

use nightshift_protocol::{SignedManifest, StateSnapshot, wire};
use std::path::Path;
use thiserror::Error;

const KEY_IDENTITY: &[u8] = b"identity";
const KEY_MANIFEST: &[u8] = b"manifest";
const KEY_STATE: &[u8] = b"state";

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
}

/// The node's store.
pub struct Store {
    db: sled::Db,
}

impl Store {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// When sled cannot open the directory (for example another node holds it).
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        let db = sled::open(dir).map_err(|source| StoreError::Open {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(Store { db })
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

    /// The latest checkpoint, if any.
    ///
    /// # Errors
    /// On storage failure or an undecodable value.
    pub fn checkpoint(&self) -> Result<Option<StateSnapshot>, StoreError> {
        self.get(KEY_STATE, "checkpoint")
    }

    /// Replaces the checkpoint atomically and flushes it to disk.
    ///
    /// # Errors
    /// On storage failure; the previous checkpoint is then still in place.
    pub fn save_checkpoint(&self, s: &StateSnapshot) -> Result<(), StoreError> {
        self.put(KEY_STATE, &wire::encode(s))
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
                .map_err(|e| StoreError::Corrupt {
                    what,
                    reason: e.to_string(),
                }),
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
            formed_by: vec![[1; 32]],
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
}
