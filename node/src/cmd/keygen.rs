//! `nightshift keygen`: a new ed25519 identity key.

use anyhow::bail;
use nightshift_bootstrap::{generate_key, write_key};
use std::path::Path;

/// Writes a new key to `out`, refusing to overwrite one.
///
/// # Errors
/// When `out` exists or cannot be written.
pub fn keygen(out: &Path) -> anyhow::Result<()> {
    if out.exists() {
        bail!(
            "{} already exists; refusing to overwrite a key",
            out.display()
        );
    }
    let key = generate_key()?;
    write_key(out, &key)?;
    println!(
        "public key: {}",
        hex::encode(key.verifying_key().to_bytes())
    );
    println!(
        "peer id:    {}",
        crate::net::libp2p_keypair(&key).public().to_peer_id()
    );
    Ok(())
}
