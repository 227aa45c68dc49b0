//! `nightshift doctor`: whether this machine can take part, and if not, why — starting with the
//! network: can peers reach this node, through which addresses, and what to open if they cannot.

use anyhow::Context;
use clap::Args;
use libp2p::Multiaddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::common::{read_manifest, swarm_key};
use crate::net::{self, Served, reach::Reachability};
use crate::store::Store;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The node's data directory: a node running there is asked directly; otherwise its key and
    /// swarm (stored by an earlier `run`) are used for the probe.
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
    /// Bootstrap address(es) to probe reachability through, when no node runs in --data-dir.
    #[arg(long)]
    pub bootstrap: Vec<Multiaddr>,
    /// The swarm manifest (default: the one stored in --data-dir).
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Identity key file (default: the one stored in --data-dir); a swarm with an allowlist
    /// admits its members' keys only.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside --manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    /// Address to probe from: give the one your node listens on (`run --listen`), so the
    /// verdict is about its port.
    #[arg(long, default_value = "/ip4/0.0.0.0/tcp/0")]
    pub listen: Multiaddr,
    /// Longest wait for a peer to try dialling this machine back, in seconds.
    #[arg(long, default_value_t = 45.0)]
    pub wait: f64,
    /// Print the findings as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `nightshift doctor`.
///
/// # Errors
/// A manifest or key that cannot be read, or a network that cannot start.
pub async fn run_doctor(a: DoctorArgs) -> anyhow::Result<()> {
    if !(1.0..=600.0).contains(&a.wait) {
        anyhow::bail!("--wait must be between 1 and 600 seconds");
    }
    let device = if cfg!(feature = "cuda") {
        "this build can train on an NVIDIA GPU (CUDA) or the CPU".to_string()
    } else {
        format!(
            "this build trains on the CPU ({} threads); for an NVIDIA GPU, build with \
             `--features cuda`",
            super::demo::cores()
        )
    };
    let (source, reach) = match crate::control::call(&a.data_dir, "status").await {
        Ok(v) => {
            let r: Reachability = serde_json::from_value(v["network"].clone())
                .context("the running node's status has no network section")?;
            (format!("the node running in {}", a.data_dir.display()), r)
        }
        Err(_) if a.bootstrap.is_empty() => {
            println!("device:    {device}");
            println!(
                "network:   not checked: no node runs in {} (its control endpoint does not \
                 answer); give --bootstrap ADDR to probe this machine's reachability through \
                 the swarm's bootstrap nodes",
                a.data_dir.display()
            );
            return Ok(());
        }
        Err(_) => (format!("a probe from {}", a.listen), probe(&a).await?),
    };
    if a.json {
        let out = serde_json::json!({
            "source": source,
            "device": device,
            "network": reach,
            "advice": reach.explain(),
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("device:    {device}");
    println!("network ({source}):");
    for line in reach.explain() {
        println!("  - {line}");
    }
    Ok(())
}

/// Starts a network with the node's identity, connects to the bootstrap nodes and waits until
/// one has tried to dial it back (or `--wait` passes).
async fn probe(a: &DoctorArgs) -> anyhow::Result<Reachability> {
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
