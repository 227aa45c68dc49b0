//! ed25519 identity key files.
//!
//! A key file is JSON: `{"secret": "<64 hex>", "public": "<64 hex>"}`. The same key signs
//! contributions and is the node's libp2p identity.

use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};
use std::path::Path;
use thiserror::Error;

/// Why a key file could not be read or written.
#[derive(Debug, Error)]
pub enum KeyError {
    #[error("cannot read key file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write key file {path}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {path} is not a nightshift key: {reason}")]
    Malformed { path: String, reason: String },
    #[error("no randomness available")]
    Random(#[source] std::io::Error),
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    secret: String,
    public: String,
}

/// A fresh random key.
///
/// # Errors
/// When the operating system has no randomness to give.
pub fn generate_key() -> Result<SigningKey, KeyError> {
    let mut secret = [0u8; 32];
    getrandom_fill(&mut secret).map_err(KeyError::Random)?;
    Ok(SigningKey::from_bytes(&secret))
}

fn getrandom_fill(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// Writes `key` to `path` (mode 0600 on Unix).
///
/// # Errors
/// On I/O failure.
pub fn write_key(path: &Path, key: &SigningKey) -> Result<(), KeyError> {
    let file = KeyFile {
        secret: hex::encode(key.to_bytes()),
        public: hex::encode(key.verifying_key().to_bytes()),
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| KeyError::Malformed {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let w = |source| KeyError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(path, text + "\n").map_err(w)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(w)?;
    }
    Ok(())
}

/// Reads a key written by [`write_key`].
///
/// # Errors
/// When the file is missing or malformed, or its public key does not match its secret.
pub fn read_key(path: &Path) -> Result<SigningKey, KeyError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        path: p.clone(),
        source,
    })?;
    let bad = |reason: String| KeyError::Malformed {
        path: p.clone(),
        reason,
    };
    let file: KeyFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let mut secret = [0u8; 32];
    hex::decode_to_slice(file.secret.trim(), &mut secret)
        .map_err(|e| bad(format!("secret: {e}")))?;
    let key = SigningKey::from_bytes(&secret);
    if hex::encode(key.verifying_key().to_bytes()) != file.public.trim().to_ascii_lowercase() {
        return Err(bad("public key does not match the secret".into()));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_files_round_trip_and_mismatches_are_refused() {
        let dir = std::env::temp_dir().join(format!("ns-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("k.json");
        let k = generate_key().unwrap();
        write_key(&path, &k).unwrap();
        assert_eq!(read_key(&path).unwrap().to_bytes(), k.to_bytes());
        let other = generate_key().unwrap();
        let text = std::fs::read_to_string(&path).unwrap().replace(
            &hex::encode(k.verifying_key().to_bytes()),
            &hex::encode(other.verifying_key().to_bytes()),
        );
        std::fs::write(&path, text).unwrap();
        assert!(matches!(read_key(&path), Err(KeyError::Malformed { .. })));
        std::fs::remove_dir_all(dir).ok();
    }
}
