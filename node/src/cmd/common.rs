//! What several commands share: signals, manifests, keys and the swarm key.

use anyhow::{Context, bail};
use ed25519_dalek::SigningKey;
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use nightshift_bootstrap::{generate_key, read_key, read_swarm_key};
use nightshift_protocol::{Hash32, Request, Response, SignedManifest};
use std::path::Path;
use tokio::sync::watch;
use tracing::info;

use crate::store::Store;

/// A watch that turns true on Ctrl-C (SIGINT) or SIGTERM.
pub fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        info!("shutting down (signal)");
        let _ = tx.send(true);
    });
    rx
}

/// Reads a manifest file.
///
/// # Errors
/// When it cannot be read, parsed or verified.
pub fn read_manifest(path: &Path) -> anyhow::Result<SignedManifest> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read manifest {}", path.display()))?;
    let m: SignedManifest = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a nightshift manifest", path.display()))?;
    m.verify()
        .with_context(|| format!("manifest {} does not verify", path.display()))?;
    Ok(m)
}

/// The pre-shared key a node of swarm `m` needs: the file `explicit`, else `swarm.key` beside
/// the manifest at `manifest_path`; `None` for a swarm without one.
///
/// # Errors
/// When the swarm needs a key and none can be read, or the key is not the manifest's.
pub fn swarm_key(
    m: &SignedManifest,
    explicit: Option<&Path>,
    manifest_path: Option<&Path>,
) -> anyhow::Result<Option<[u8; 32]>> {
    let Some(fingerprint) = m.manifest.psk else {
        if let Some(p) = explicit {
            bail!(
                "{} was given, but this swarm has no pre-shared key (it was not created with --private)",
                p.display()
            );
        }
        return Ok(None);
    };
    let path = match (explicit, manifest_path) {
        (Some(p), _) => p.to_path_buf(),
        (None, Some(mp)) => mp.with_file_name("swarm.key"),
        (None, None) => bail!(
            "this swarm is closed by a pre-shared key: give the swarm.key its creator wrote with --swarm-key"
        ),
    };
    let key = read_swarm_key(&path).with_context(|| {
        format!(
            "this swarm is closed by a pre-shared key; cannot use {} (give the swarm.key its creator wrote with --swarm-key)",
            path.display()
        )
    })?;
    if nightshift_protocol::psk_fingerprint(&key) != fingerprint {
        bail!(
            "{} is not this swarm's pre-shared key (the manifest pins another)",
            path.display()
        );
    }
    Ok(Some(key))
}

pub(crate) fn parse_public_key(s: &str) -> anyhow::Result<[u8; 32]> {
    if Path::new(s).exists() {
        return Ok(read_key(Path::new(s))?.verifying_key().to_bytes());
    }
    let mut k = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut k)
        .with_context(|| format!("{s:?} is neither a key file nor a 64-hex public key"))?;
    Ok(k)
}

pub use nightshift_bootstrap::swarm::default_bootstrap_key;

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn identity_from_store(dir: &Path) -> anyhow::Result<SigningKey> {
    let store = Store::open(&dir.join("db"))?;
    if let Some(secret) = store.identity()? {
        return Ok(SigningKey::from_bytes(&secret));
    }
    let key = generate_key()?;
    store.set_identity(&key.to_bytes())?;
    Ok(key)
}

/// Fetches swarm `id`'s manifest from the bootstrap nodes, as `key` (a swarm with an allowlist
/// serves its members only) with the swarm's pre-shared key `psk` when it has one.
pub(crate) async fn fetch_manifest(
    bootstrap: &[Multiaddr],
    id: Hash32,
    key: &SigningKey,
    psk: Option<[u8; 32]>,
) -> anyhow::Result<SignedManifest> {
    let served = crate::net::ServedHandle::new(crate::net::Served::new(None));
    let (net, _events) = crate::net::spawn_network(
        crate::net::NetConfig {
            keypair: crate::net::libp2p_keypair(key),
            swarm_id: id,
            max_frame: nightshift_protocol::MAX_MESSAGE_BYTES,
            listen: "/ip4/127.0.0.1/tcp/0".parse()?,
            bootstrap: bootstrap.to_vec(),
            admitted: None,
            psk,
            relay_server: false,
            metrics: None,
        },
        served,
    )?;
    for addr in bootstrap {
        let Some(Protocol::P2p(peer)) = addr.iter().last() else {
            continue;
        };
        // request-response dials the peer itself (Kademlia knows its address) and waits for it.
        if let Ok(Response::Manifest(Some(m))) = net.request(peer, Request::GetManifest).await {
            if m.swarm_id() != id {
                bail!(
                    "the bootstrap node serves swarm {}, not {}",
                    m.swarm_id().short(),
                    id.short()
                );
            }
            m.verify()?;
            return Ok(*m);
        }
    }
    bail!(
        "no bootstrap node answered with the manifest (addresses need a /p2p/<peer id> suffix; a \
         private swarm answers its members only, and needs --swarm-key if it has a swarm.key)"
    )
}

/// What a command-line binary's `main` does: logs to stderr (`NIGHTSHIFT_LOG` overrides
/// `default_log`, an `EnvFilter` directive), runs `command` on a multi-threaded runtime, and
/// prints its error for the user.
pub fn run_main<F>(default_log: &str, command: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("NIGHTSHIFT_LOG").unwrap_or_else(|_| EnvFilter::new(default_log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
