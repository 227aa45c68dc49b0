//! Creating a swarm: its signed manifest and the keys it needs — the creator's, the bootstrap
//! node's, and for a private swarm the pre-shared key — written only once the manifest is known
//! to be valid, so that a refused setting leaves no file behind.

use anyhow::{Context, bail};
use nightshift_genesis::{
    SwarmSettings, build_manifest, generate_key, generate_psk, read_key, write_key, write_swarm_key,
};
use nightshift_protocol::SignedManifest;
use std::path::{Path, PathBuf};

/// Where swarm creation writes the bootstrap node's key, beside the manifest at `manifest` (and
/// where `nightshift bootstrap --manifest` looks for it).
pub fn default_bootstrap_key(manifest: &Path) -> PathBuf {
    manifest.with_extension("bootstrap.key.json")
}

/// Where a private swarm's pre-shared key is written, beside the manifest.
pub fn swarm_key_path(manifest: &Path) -> PathBuf {
    manifest.with_file_name("swarm.key")
}

/// A swarm to create.
#[derive(Clone, Debug)]
pub struct NewSwarm {
    /// Where the manifest goes.
    pub out: PathBuf,
    /// The creator's key file; a new key is written beside the manifest when `None`.
    pub creator_key: Option<PathBuf>,
    /// The recipe, name and allowlist; its bootstrap keys and pre-shared key are filled in here.
    pub settings: SwarmSettings,
    /// Close the swarm at the transport too (a pre-shared key; needs an allowlist).
    pub private: bool,
    /// The bootstrap nodes' public keys; when empty, the key beside the manifest (written anew
    /// when there is none).
    pub bootstrap_keys: Vec<[u8; 32]>,
    /// The manifest's creation time, seconds since the Unix epoch.
    pub created_unix: u64,
}

/// What creating a swarm produced.
#[derive(Debug)]
pub struct Created {
    pub manifest: SignedManifest,
    /// Each file written besides the manifest, and what it is.
    pub wrote: Vec<(&'static str, PathBuf)>,
}

/// Creates the swarm: checks the settings, signs the manifest, writes the keys it needs and then
/// the manifest.
///
/// # Errors
/// A refused setting or key, or a file that cannot be written (nothing is left behind then).
pub fn create(s: NewSwarm) -> anyhow::Result<Created> {
    let (key, new_key) = match &s.creator_key {
        Some(p) => (read_key(p)?, None),
        None => (
            generate_key()?,
            Some(s.out.with_extension("creator.key.json")),
        ),
    };
    let members = !s.settings.allowlist.is_empty();
    if s.private && !members {
        bail!("a --private swarm needs its members: give --allow KEY for each");
    }
    if s.settings.attest_quorum.is_some() && !members {
        bail!(
            "--attest-quorum is for a swarm with --allow (in an open swarm only bootstrap nodes attest)"
        );
    }
    let psk_path = swarm_key_path(&s.out);
    if s.private && psk_path.exists() {
        bail!(
            "{} already exists; refusing to overwrite a swarm key (move it away first)",
            psk_path.display()
        );
    }
    let (bootstraps, new_boot_key) = if s.bootstrap_keys.is_empty() {
        let path = default_bootstrap_key(&s.out);
        if path.exists() {
            (vec![read_key(&path)?.verifying_key().to_bytes()], None)
        } else {
            let k = generate_key()?;
            (vec![k.verifying_key().to_bytes()], Some((path, k)))
        }
    } else {
        (s.bootstrap_keys.clone(), None)
    };
    let psk = s.private.then(generate_psk).transpose()?;
    let settings = SwarmSettings {
        bootstraps,
        psk,
        ..s.settings
    };
    let manifest = build_manifest(&settings, &key, s.created_unix)?;
    let mut wrote = vec![];
    if let Some(p) = new_key {
        write_key(&p, &key)?;
        wrote.push(("the creator key", p));
    }
    if let Some((p, k)) = new_boot_key {
        write_key(&p, &k)?;
        wrote.push(("the bootstrap node's key", p));
    }
    if let Some(k) = psk {
        write_swarm_key(&psk_path, &k)?;
        wrote.push((
            "the swarm's pre-shared key (give it to every member, privately)",
            psk_path,
        ));
    }
    std::fs::write(&s.out, serde_json::to_string_pretty(&manifest)?)
        .with_context(|| format!("cannot write {}", s.out.display()))?;
    Ok(Created { manifest, wrote })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_swarm(dir: &Path) -> NewSwarm {
        NewSwarm {
            out: dir.join("manifest.json"),
            creator_key: None,
            settings: SwarmSettings::default(),
            private: false,
            bootstrap_keys: vec![],
            created_unix: 1,
        }
    }

    #[test]
    fn a_swarm_is_written_with_its_keys_and_a_refused_one_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let c = create(new_swarm(dir.path())).unwrap();
        assert!(dir.path().join("manifest.json").exists());
        assert_eq!(c.wrote.len(), 2, "{:?}", c.wrote);
        // The bootstrap key written beside it is the one the manifest names.
        let boot = read_key(&default_bootstrap_key(&dir.path().join("manifest.json"))).unwrap();
        assert_eq!(
            c.manifest.manifest.bootstraps,
            vec![boot.verifying_key().to_bytes()]
        );
        // A private swarm without members is refused before anything is written.
        let other = tempfile::tempdir().unwrap();
        let err = create(NewSwarm {
            private: true,
            ..new_swarm(other.path())
        })
        .unwrap_err();
        assert!(err.to_string().contains("needs its members"), "{err}");
        assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
    }
}
