//! `nightshift peers`: joins the swarm's Kademlia for a few seconds as a client, finds its nodes,
//! and lists each with its status and its signed window record (verified, newest wins).

use anyhow::Context;
use libp2p::PeerId;
use nightshift_protocol::message::open_window;
use nightshift_protocol::{Hash32, NodeRole, Request, Response, Status, WindowRecord};
use serde::Serialize;
use std::time::{Duration, SystemTime};

use clap::Args;
use libp2p::Multiaddr;
use std::path::PathBuf;

use super::common::{read_manifest, swarm_key};
use crate::net::{self, NetHandle, Served, StatusCheck};

#[derive(Args, Debug)]
pub struct PeersArgs {
    /// Bootstrap address(es) of the swarm.
    #[arg(long, required = true)]
    pub bootstrap: Vec<Multiaddr>,
    /// Swarm id (64 hex); or give --manifest.
    #[arg(long)]
    pub swarm: Option<String>,
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// A member's key, to look into a swarm with an allowlist (its nodes refuse other keys).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside --manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    /// Seconds to spend discovering peers.
    #[arg(long, default_value_t = 4.0)]
    pub wait: f64,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One row of `nightshift peers`.
#[derive(Clone, Debug, Serialize)]
pub struct PeerRow {
    pub peer_id: String,
    pub role: String,
    pub phase: Option<String>,
    pub round: Option<u64>,
    pub state_hash: Option<String>,
    pub window: Option<WindowRecord>,
}

/// Looks up status and window of `peer` (each bounded by a time-out).
async fn describe(net: &NetHandle, swarm: &Hash32, check: &StatusCheck, peer: PeerId) -> PeerRow {
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        net.request(peer, Request::GetStatus),
    )
    .await
    .ok()
    .and_then(|r| r.ok());
    let status: Option<Status> = match status {
        Some(Response::Status(env)) => check.open(&peer, &env, net::unix_ms()).ok(),
        _ => None,
    };
    let window = match net::public_key_of(&peer) {
        Some(k) => tokio::time::timeout(Duration::from_secs(10), net.get_window(k))
            .await
            .ok()
            .flatten()
            .and_then(|env| open_window(&env, swarm).ok()),
        None => None,
    };
    PeerRow {
        peer_id: peer.to_string(),
        role: match status.as_ref().map(|s| s.role) {
            Some(NodeRole::Trainer) => "trainer".into(),
            Some(NodeRole::Bootstrap) => "bootstrap".into(),
            None => "unknown".into(),
        },
        phase: status
            .as_ref()
            .map(|s| format!("{:?}", s.phase).to_lowercase()),
        round: status.as_ref().map(|s| s.round),
        state_hash: status.as_ref().map(|s| s.state_hash.short()),
        window,
    }
}

fn ago(unix: u64) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    if unix > now {
        format!("in {}s", unix - now)
    } else {
        format!("{}s ago", now - unix)
    }
}

/// Runs `nightshift peers`.
///
/// # Errors
/// A bad swarm id or manifest, or a network that cannot start.
pub async fn run_peers(a: PeersArgs) -> anyhow::Result<()> {
    let manifest = a.manifest.as_deref().map(read_manifest).transpose()?;
    let swarm = match (&manifest, &a.swarm) {
        (Some(m), _) => m.swarm_id(),
        (None, Some(id)) => Hash32::from_hex(id).context("--swarm must be 64 hex characters")?,
        (None, None) => anyhow::bail!("give --swarm ID or --manifest FILE"),
    };
    let psk = match &manifest {
        Some(m) => swarm_key(m, a.swarm_key.as_deref(), a.manifest.as_deref())?,
        None => a
            .swarm_key
            .as_deref()
            .map(nightshift_bootstrap::read_swarm_key)
            .transpose()?,
    };
    let key = match &a.key {
        Some(p) => nightshift_bootstrap::read_key(p)?,
        None => nightshift_bootstrap::generate_key()?,
    };
    let admitted = manifest.as_ref().and_then(|m| m.manifest.admitted());
    let check = StatusCheck::new(swarm, admitted);
    if !(0.0..=600.0).contains(&a.wait) {
        anyhow::bail!("--wait must be between 0 and 600 seconds");
    }
    let served = net::ServedHandle::new(Served::new(None));
    let (net, _events) = net::spawn_network(
        net::NetConfig {
            keypair: net::libp2p_keypair(&key),
            swarm_id: swarm,
            max_frame: nightshift_protocol::MAX_MESSAGE_BYTES,
            listen: "/ip4/127.0.0.1/tcp/0".parse()?,
            bootstrap: a.bootstrap.clone(),
            admitted: None,
            psk,
            relay_server: false,
            metrics: None,
        },
        served,
    )?;
    // Discovery runs in the network task (Kademlia closest-peer queries, then dials).
    tokio::time::sleep(Duration::from_secs_f64(a.wait)).await;
    let peers = net.connected().await;
    let rows: Vec<PeerRow> =
        futures::future::join_all(peers.iter().map(|p| describe(&net, &swarm, &check, *p)))
            .await
            .into_iter()
            .filter(|r| r.role != "unknown" || r.window.is_some())
            .collect();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "{:<54} {:<9} {:<9} {:>5} {:<8} {:<18} {:>9} {:<12} {:<10} reason",
        "peer", "role", "phase", "round", "window", "device", "tok/s", "open until", "updated"
    );
    for r in &rows {
        let w = r.window.as_ref();
        println!(
            "{:<54} {:<9} {:<9} {:>5} {:<8} {:<18} {:>9} {:<12} {:<10} {}",
            r.peer_id,
            r.role,
            r.phase.as_deref().unwrap_or("-"),
            r.round.map_or("-".into(), |x| x.to_string()),
            w.map_or("-".into(), |w| format!("{:?}", w.state).to_lowercase()),
            w.map_or("-".into(), |w| w.device_name.clone()),
            w.map_or("-".into(), |w| format!("{:.0}", w.tokens_per_sec)),
            w.and_then(|w| w.open_until).map_or("-".into(), ago),
            w.map_or("-".into(), |w| ago(w.updated_at)),
            w.map_or("", |w| w.reason.as_str()),
        );
    }
    if rows.is_empty() {
        println!("(no nodes found; is the bootstrap address right, with its /p2p/<id>?)");
    }
    Ok(())
}
