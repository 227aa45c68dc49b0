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

/// The first line of a libp2p pre-shared key file (`swarm.key`), as go-libp2p and IPFS write it.
pub const SWARM_KEY_HEADER: &str = "/key/swarm/psk/1.0.0/";

/// 32 fresh random bytes: a pre-shared key for a private swarm.
///
/// # Errors
/// When the operating system has no randomness to give.
pub fn generate_psk() -> Result<[u8; 32], KeyError> {
    let mut k = [0u8; 32];
    getrandom_fill(&mut k).map_err(KeyError::Random)?;
    Ok(k)
}

/// Writes `psk` to `path` in the standard libp2p `swarm.key` format (three lines: the header,
/// `/base16/`, 64 hex digits), mode 0600 on Unix.
///
/// # Errors
/// On I/O failure.
pub fn write_swarm_key(path: &Path, psk: &[u8; 32]) -> Result<(), KeyError> {
    let text = format!("{SWARM_KEY_HEADER}\n/base16/\n{}\n", hex::encode(psk));
    let w = |source| KeyError::Write {
        path: path.display().to_string(),
        source,
    };
    std::fs::write(path, text).map_err(w)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(w)?;
    }
    Ok(())
}

/// Reads a `swarm.key` written by [`write_swarm_key`] (or by any libp2p implementation).
///
/// # Errors
/// When the file is missing or not a base16 pre-shared key.
pub fn read_swarm_key(path: &Path) -> Result<[u8; 32], KeyError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        path: p.clone(),
        source,
    })?;
    parse_swarm_key(&text).map_err(|reason| KeyError::Malformed { path: p, reason })
}

/// Parses the text of a `swarm.key`.
///
/// # Errors
/// A wrong header or encoding, or a key that is not 64 hex digits.
pub fn parse_swarm_key(text: &str) -> Result<[u8; 32], String> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    if lines.next() != Some(SWARM_KEY_HEADER) {
        return Err(format!("the first line must be {SWARM_KEY_HEADER}"));
    }
    if lines.next() != Some("/base16/") {
        return Err("the second line must be /base16/ (the only encoding supported)".into());
    }
    let hex_key = lines.next().ok_or("the key line is missing")?;
    let mut k = [0u8; 32];
    hex::decode_to_slice(hex_key, &mut k)
        .map_err(|e| format!("the key is not 64 hex digits: {e}"))?;
    if lines.next().is_some() {
        return Err("text after the key".into());
    }
    Ok(k)
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
    fn swarm_keys_round_trip_and_malformed_ones_are_refused() {
        let dir = tempfile_dir("psk");
        let path = dir.join("swarm.key");
        let k = generate_psk().unwrap();
        write_swarm_key(&path, &k).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with("/key/swarm/psk/1.0.0/\n/base16/\n"));
        assert_eq!(read_swarm_key(&path).unwrap(), k);
        for bad in [
            "",
            "/key/swarm/psk/1.0.0/\n/base64/\nAAAA\n",
            "/key/swarm/psk/1.0.0/\n/base16/\n1234\n",
            "/key/other/\n/base16/\n",
        ] {
            assert!(parse_swarm_key(bad).is_err(), "{bad:?}");
        }
        std::fs::remove_dir_all(dir).ok();
    }

    fn tempfile_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ns-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

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
