//! The bootstrap node: the peer others dial first. A Kademlia server on the swarm's protocol
//! that hands out the manifest and the genesis state; it never trains.

use anyhow::Context;
use ed25519_dalek::SigningKey;
use libp2p::Multiaddr;
use nightshift_protocol::message::Phase;
use nightshift_protocol::{NodeRole, SignedManifest, Status};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

use crate::net::{self, NetEvent, Served};

/// How to run a bootstrap node.
pub struct BootstrapOptions {
    pub manifest: SignedManifest,
    pub key: SigningKey,
    pub listen: Multiaddr,
    /// Other bootstrap nodes to peer with.
    pub peers: Vec<Multiaddr>,
    /// Where to write the full listen address (with `/p2p/<id>`) once known.
    pub addr_file: Option<PathBuf>,
    pub shutdown: watch::Receiver<bool>,
}

/// Runs until shut down.
///
/// # Errors
/// On a manifest that does not verify or a network that cannot start.
pub async fn run_bootstrap(opts: BootstrapOptions) -> anyhow::Result<()> {
    opts.manifest
        .verify()
        .context("the swarm manifest does not verify")?;
    let m = &opts.manifest.manifest;
    let swarm_id = opts.manifest.swarm_id();
    let genesis = nightshift_bootstrap::genesis_state(m);
    anyhow::ensure!(
        genesis.hash() == m.initial_state_hash,
        "this build computes a different genesis state than the manifest's"
    );
    let n = genesis.params.len();
    let mut served = Served::new(Some(opts.manifest.clone()));
    served.status = Some(Status {
        role: NodeRole::Bootstrap,
        phase: Phase::Ready,
        round: 0,
        state_hash: genesis.hash(),
        formed_by: vec![],
        holding: vec![],
    });
    let bytes = net::encode_state(&genesis);
    served.set_genesis(Arc::new(genesis), bytes);
    let served = Arc::new(RwLock::new(served));
    let max_frame = (4 * nightshift_protocol::delta::dense_bytes(n) + (1 << 20))
        .min(nightshift_protocol::MAX_MESSAGE_BYTES);
    let (net, mut events) = net::spawn_network(
        net::libp2p_keypair(&opts.key),
        swarm_id,
        max_frame,
        opts.listen,
        opts.peers,
        served,
    )?;
    // Wait for the listen address, then publish it.
    let mut addrs = vec![];
    for _ in 0..100 {
        addrs = net.listen_addrs().await;
        if !addrs.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let first = addrs
        .first()
        .context("the bootstrap node got no listen address")?;
    info!(swarm = %swarm_id, address = %first, "bootstrap node ready");
    println!("{first}");
    if let Some(path) = &opts.addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{first}\n"))
            .and_then(|_| std::fs::rename(&tmp, path))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut shutdown = opts.shutdown;
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Some(NetEvent::PeerConnected(p)) => info!(peer = %p, "peer connected"),
                Some(NetEvent::PeerDisconnected(p)) => info!(peer = %p, "peer left"),
                Some(_) => {}
                None => break,
            },
            r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break },
        }
    }
    info!("bootstrap node stopping");
    Ok(())
}
