//! `nightshift run`: join a swarm and train whenever the machine is idle.

use anyhow::{Context, bail};
use clap::Args;
use libp2p::Multiaddr;
use nightshift_bootstrap::{read_key, read_swarm_key};
use nightshift_protocol::Hash32;
use std::path::PathBuf;
use tracing::info;

use super::common::{
    fetch_manifest, identity_from_store, read_manifest, shutdown_signal, swarm_key,
};
use crate::round::{TrainerOptions, run_trainer};
use crate::store::Store;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Bootstrap address(es), e.g. /ip4/1.2.3.4/tcp/4001/p2p/12D3Koo...
    #[arg(long, required = true)]
    pub bootstrap: Vec<Multiaddr>,
    /// The swarm manifest; or give --swarm to fetch it from the bootstrap node.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    /// Swarm id (64 hex) to fetch and check the manifest against.
    #[arg(long)]
    pub swarm: Option<String>,
    /// Identity key file; else the one stored in --data-dir (created on first run).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside --manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
    #[arg(long, default_value = "/ip4/0.0.0.0/tcp/0")]
    pub listen: Multiaddr,
    /// The swarm's data file or directory, when it is not where the manifest says (the path
    /// its creator gave). Every file is checked against the manifest's hashes.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The swarm's `tokenizer.json`, when the swarm has one and it is not where the manifest
    /// says.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Stop after this many rounds in total (θ(N) reached).
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Append JSON-lines events to this file.
    #[arg(long)]
    pub events: Option<PathBuf>,
    /// Train only on the dataset's shards numbered INDEX modulo COUNT (as INDEX/COUNT); by
    /// default a node draws from all of them, a new one every round.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(usize, usize)>,
    /// Trainer peers to wait for before the first round.
    #[arg(long, default_value_t = 1)]
    pub min_peers: usize,
    /// When the machine counts as idle; repeat to combine (all must agree): auto (nvml where an
    /// NVIDIA driver is present, else cpu), always, cpu[:THRESHOLD], nvml,
    /// "schedule:mon-fri 22:00-07:00", file:PATH, cycle:PERIOD:IDLE:PHASE. `nightshift pause`
    /// works with every choice.
    #[arg(long = "idle", default_value = "auto")]
    pub idle: Vec<String>,
    /// Seconds the machine must stay idle before training starts (hysteresis); default 30, or
    /// 0 when the only source is `always`.
    #[arg(long)]
    pub idle_after: Option<f64>,
    /// Loopback address of the control endpoint (`nightshift pause/resume/status`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub control: std::net::SocketAddr,
    /// Threads of each inner step on the CPU: the batch is split over them (the same gradient,
    /// computed in parallel). Default: this machine's cores; nodes that share a machine should
    /// each get their share. Ignored on a GPU.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub threads: Option<u32>,
    /// Train the next round while the last round's contributions are still being exchanged, so
    /// that a slow link does not leave the device idle. The swarm's average then reaches this
    /// node's training a round late, which costs accuracy (about 5 % higher validation loss at
    /// equal tokens with 4 nodes): worth it where the network, not the device, is the
    /// bottleneck.
    #[arg(long)]
    pub overlap: bool,
    /// Serve a live dashboard at http://ADDR/ (loss curve, rounds, peers, yields and refusals)
    /// and Prometheus metrics at http://ADDR/metrics (the node's rounds, and libp2p's
    /// connection and protocol metrics), e.g. 127.0.0.1:8080; port 0 picks a free one, written
    /// to <data-dir>/http.addr. Use a loopback address unless others should see it.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
}

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or("expected INDEX/COUNT, e.g. 0/3")?;
    let i: usize = i.parse().map_err(|_| format!("bad index {i:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("bad count {n:?}"))?;
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= INDEX < COUNT"));
    }
    Ok((i, n))
}

/// Runs `run` until a signal or `--rounds`.
///
/// # Errors
/// Bad flags, a manifest or key that cannot be had, or a node that cannot start.
pub async fn run(a: RunArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("cannot create {}", a.data_dir.display()))?;
    let key = match &a.key {
        Some(p) => read_key(p)?,
        None => identity_from_store(&a.data_dir)?,
    };
    let explicit_psk = a.swarm_key.as_deref().map(read_swarm_key).transpose()?;
    let manifest = match (&a.manifest, &a.swarm) {
        (Some(p), _) => read_manifest(p)?,
        (None, Some(id)) => {
            let id = Hash32::from_hex(id).context("--swarm must be 64 hex characters")?;
            fetch_manifest(&a.bootstrap, id, &key, explicit_psk).await?
        }
        (None, None) => match Store::open(&a.data_dir.join("db"))
            .ok()
            .and_then(|s| s.manifest().ok().flatten())
        {
            Some(m) => m,
            None => {
                bail!("give --manifest FILE, or --swarm ID to fetch it from the bootstrap node")
            }
        },
    };
    let psk = swarm_key(&manifest, a.swarm_key.as_deref(), a.manifest.as_deref())?;
    let idle_after = a
        .idle_after
        .unwrap_or(if a.idle.iter().all(|s| s == "always") {
            0.0
        } else {
            30.0
        });
    if !(0.0..=86_400.0).contains(&idle_after) {
        bail!("--idle-after must be between 0 and 86400 seconds");
    }
    let mut sources = a
        .idle
        .iter()
        .map(|spec| crate::idle::parse_spec(spec).with_context(|| format!("--idle {spec}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names: Vec<&str> = sources.iter().map(|s| s.name()).collect();
    info!(sources = ?names, idle_after, "idle detection");
    let manual = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    sources.push(Box::new(crate::idle::Manual(manual.clone())));
    let mut idle =
        crate::idle::Monitor::new(sources, std::time::Duration::from_secs_f64(idle_after))
            .spawn(std::time::Duration::from_millis(100));
    // Start from the monitor's first real verdict, not its "checking" placeholder.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), idle.changed()).await;
    let info = std::sync::Arc::new(std::sync::RwLock::new(serde_json::json!({})));
    let served = crate::control::ServedSource::default();
    crate::control::serve(a.control, &a.data_dir, manual, info.clone(), served.clone()).await?;
    let observed = match a.http {
        Some(addr) => {
            let o = crate::http::Observed {
                metrics: std::sync::Arc::new(crate::metrics::NodeMetrics::new()),
                feed: std::sync::Arc::default(),
                info: info.clone(),
            };
            crate::http::serve(addr, &a.data_dir, o.clone()).await?;
            Some(o)
        }
        None => None,
    };
    run_trainer(TrainerOptions {
        data_dir: a.data_dir,
        listen: a.listen,
        bootstrap: a.bootstrap,
        manifest,
        key,
        data_path: a.data,
        tokenizer_path: a.tokenizer,
        rounds: a.rounds,
        events: a.events,
        shard: a.shard,
        min_peers: a.min_peers,
        shutdown: shutdown_signal(),
        idle: Some(idle),
        control_info: Some(info),
        threads: a.threads.map_or_else(super::demo::cores, |t| t as usize),
        psk,
        overlap: a.overlap,
        metrics: observed.as_ref().map(|o| o.metrics.clone()),
        feed: observed.map(|o| o.feed),
        served: Some(served),
    })
    .await
}
