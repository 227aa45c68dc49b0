//! The network probe: start a network with the node's identity, connect to the bootstrap nodes
//! and wait until one has tried to dial this machine back.

use anyhow::Context;
use std::time::{Duration, Instant};

use super::DoctorArgs;
use crate::cmd::common::{read_manifest, swarm_key};
use crate::net::{self, Served, reach::Reachability};
use crate::store::Store;

/// Probes reachability through `--bootstrap` (or gives up after `--wait`).
pub(super) async fn probe(a: &DoctorArgs) -> anyhow::Result<Reachability> {
    let stored = Store::open(&a.data_dir.join("db")).ok();
    let manifest = match &a.manifest {
        Some(p) => Some(read_manifest(p)?),
        None => stored.as_ref().and_then(|s| s.manifest().ok().flatten()),
    };
    let manifest = manifest.with_context(|| {
        format!(
            "no swarm manifest in {}: give --manifest FILE",
            a.data_dir.display()
        )
    })?;
    let psk = swarm_key(&manifest, a.swarm_key.as_deref(), a.manifest.as_deref())?;
    // The node's own key: a swarm with an allowlist refuses any other.
    let key = match (
        &a.key,
        stored.as_ref().and_then(|s| s.identity().ok().flatten()),
    ) {
        (Some(p), _) => nightshift_bootstrap::read_key(p)?,
        (None, Some(secret)) => ed25519_dalek::SigningKey::from_bytes(&secret),
        (None, None) => nightshift_bootstrap::generate_key()?,
    };
    // The store must not stay open: a node started meanwhile needs its lock.
    drop(stored);
    let (net, _events) = net::spawn_network(
        net::NetConfig {
            keypair: net::libp2p_keypair(&key),
            swarm_id: manifest.swarm_id(),
            max_frame: nightshift_protocol::MAX_MESSAGE_BYTES,
            listen: a.listen.clone(),
            bootstrap: a.bootstrap.clone(),
            admitted: manifest.manifest.admitted(),
            psk,
            relay_server: false,
            metrics: None,
        },
        net::ServedHandle::new(Served::new(None)),
    )?;
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(a.wait);
    loop {
        let r = net.reach.read().map(|r| r.clone()).unwrap_or_default();
        // Done once a peer tried to dial back, and (behind a NAT) a relay slot is held.
        let settled = r.nat == "public" || (r.nat == "private" && !r.relayed_addresses.is_empty());
        if settled || start.elapsed() >= deadline {
            return Ok(r);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
