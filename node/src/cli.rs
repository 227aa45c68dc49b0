//! The command-line interface.

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use ed25519_dalek::SigningKey;
use libp2p::Multiaddr;
use libp2p::multiaddr::Protocol;
use nightshift_bootstrap::{
    SwarmSettings, build_manifest, generate_key, generate_psk, read_key, read_swarm_key, write_key,
    write_swarm_key,
};
use nightshift_protocol::{
    Aggregator, DeltaCodec, Hash32, InnerOptimizer, Request, Response, SignedManifest,
};
use std::path::{Path, PathBuf};
use tokio::sync::watch;
use tracing::info;

use crate::bootstrap_node::{BootstrapOptions, run_bootstrap};
use crate::round::{TrainerOptions, run_trainer};
use crate::store::Store;

/// nightshift: idle machines train one model together over libp2p with DiLoCo.
#[derive(Parser, Debug)]
#[command(name = "nightshift", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a local swarm (a bootstrap and N nodes as processes on 127.0.0.1) and train it.
    ///
    /// The nodes' keys, which seed the batches each one samples, are derived from `--seed`: the
    /// same seed on the same machine trains the same model.
    Demo(crate::demo::DemoArgs),
    /// Swarm creation.
    #[command(subcommand)]
    Swarm(SwarmCommand),
    /// Run the node others dial first: a Kademlia server that hands out the manifest.
    Bootstrap(BootstrapArgs),
    /// Join a swarm and train whenever the machine is idle.
    Run(RunArgs),
    /// Pause a running node (it yields at the next step boundary and frees the device).
    Pause(ControlArgs),
    /// Let a paused node train again (once its machine is idle).
    Resume(ControlArgs),
    /// Show a running node's state, window and idle verdict (JSON).
    Status(ControlArgs),
    /// List the swarm's nodes with their advertised windows and state.
    Peers(PeersArgs),
    /// The benchmarks moved to `nightshift-lab` (this says how to run them).
    #[command(hide = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        rest: Vec<String>,
    },
    /// Write a new ed25519 identity key.
    Keygen {
        /// Where to write the key (JSON).
        #[arg(long, short)]
        out: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
pub enum SwarmCommand {
    /// Write a signed swarm manifest.
    Init(InitArgs),
}

/// Settings of a new swarm. The defaults are [`SwarmSettings::default`]'s; why each default
/// was chosen is in docs/DESIGN-NOTES.md ("Why the defaults").
#[derive(Args, Debug, Clone)]
pub struct SwarmFlags {
    /// Model preset: tiny, small, medium or large.
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Training corpus (UTF-8 text); defaults to the embedded Shakespeare.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// H: inner steps each node trains per round before the contributions are averaged.
    #[arg(long, default_value_t = SwarmSettings::default().inner_steps)]
    pub inner_steps: u32,
    /// How contributions are compressed on the wire: fp32, fp16, int8[:block], int4[:block],
    /// topk[:permille] or lowrank[:rank[:block]] (weight matrices as rank-r factors in int4;
    /// suits `--inner-optimizer adamw` swarms, not Muon's full-rank updates).
    #[arg(long, default_value = "int4:64")]
    pub codec: DeltaCodec,
    /// Sequences per inner step on each node.
    #[arg(long, default_value_t = SwarmSettings::default().batch_size)]
    pub batch_size: u32,
    /// Learning rate of the inner steps (AdamW's; Muon's is a multiple of it).
    #[arg(long, default_value_t = SwarmSettings::default().inner_lr)]
    pub inner_lr: f32,
    /// Inner steps over which the rate rises linearly to `--inner-lr`, counted from the node's
    /// start.
    #[arg(long, default_value_t = SwarmSettings::default().warmup_steps)]
    pub warmup_steps: u32,
    /// Decoupled weight decay of the inner steps.
    #[arg(long, default_value_t = SwarmSettings::default().weight_decay)]
    pub weight_decay: f32,
    /// Inner optimizer: `muon[:MULT]` (Muon for the blocks' weight matrices at MULT times
    /// `--inner-lr`, with updates scaled to AdamW's RMS and the same weight decay; AdamW for the
    /// embeddings, head, biases and norms) or `adamw` (every parameter, as in the DiLoCo
    /// paper).
    #[arg(long, default_value = "muon")]
    pub inner_optimizer: InnerOptimizer,
    /// Learning rate of the outer Nesterov step applied to each round's averaged
    /// pseudo-gradient (lower it, or the momentum, for short rounds such as H = 10).
    #[arg(long, default_value_t = SwarmSettings::default().outer_lr)]
    pub outer_lr: f32,
    /// Momentum of the outer Nesterov step.
    #[arg(long, default_value_t = SwarmSettings::default().outer_momentum)]
    pub outer_momentum: f32,
    /// How each round's contributions are combined: `cclip[:CLIP[:ITERS]]` (centered clipping:
    /// each contribution's size is capped and outliers clipped, so a malicious minority moves
    /// the result by a bounded amount; as good as the mean when nobody attacks) or `mean`
    /// (token-weighted; one member can move it anywhere).
    #[arg(long, default_value = "cclip")]
    pub aggregator: Aggregator,
    /// Seconds a node waits for the others after its contribution is out.
    #[arg(long, default_value_t = SwarmSettings::default().round_deadline_secs)]
    pub deadline_secs: u32,
    /// Seed of the model's initial weights (in `demo`, also of its nodes' keys).
    #[arg(long, default_value_t = SwarmSettings::default().init_seed)]
    pub seed: u64,
}

impl SwarmFlags {
    /// The genesis settings these flags describe.
    pub fn settings(&self, name: &str, allowlist: Vec<[u8; 32]>) -> SwarmSettings {
        SwarmSettings {
            name: name.into(),
            preset: self.preset.clone(),
            data: self.data.clone(),
            inner_steps: self.inner_steps,
            batch_size: self.batch_size,
            inner_lr: self.inner_lr,
            warmup_steps: self.warmup_steps,
            weight_decay: self.weight_decay,
            inner_optimizer: self.inner_optimizer,
            outer_lr: self.outer_lr,
            outer_momentum: self.outer_momentum,
            codec: self.codec,
            round_deadline_secs: self.deadline_secs,
            aggregator: self.aggregator,
            init_seed: self.seed,
            allowlist,
            ..SwarmSettings::default()
        }
    }
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Where to write the manifest (JSON).
    #[arg(long, short, default_value = "manifest.json")]
    pub out: PathBuf,
    /// The creator's key; a new one is written beside the manifest when absent.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// The swarm's name, shown to those who join it.
    #[arg(long, default_value = "nightshift")]
    pub name: String,
    /// Only these keys may contribute (key files or 64-hex public keys); repeatable. Nodes of
    /// such a swarm refuse connections from any other key (but the bootstrap nodes').
    #[arg(long = "allow")]
    pub allow: Vec<String>,
    /// Also close the swarm at the transport: write a pre-shared key (`swarm.key`, the standard
    /// libp2p format) beside the manifest; every node needs it to connect at all (libp2p pnet,
    /// TCP only). Needs --allow.
    #[arg(long)]
    pub private: bool,
    /// Bootstrap node keys (key files or 64-hex public keys); repeatable. Default: a new key
    /// written beside the manifest (`<manifest>.bootstrap.key.json`), which `nightshift
    /// bootstrap --manifest` picks up.
    #[arg(long = "bootstrap-key")]
    pub bootstrap_keys: Vec<String>,
    /// With --allow: how many members must attest a state before a node too far behind to
    /// replay it adopts it (a bootstrap's attestation always suffices). Default: one more than
    /// the malicious members tolerated, ⌊(members − 1)/3⌋ + 1.
    #[arg(long)]
    pub attest_quorum: Option<u32>,
    #[command(flatten)]
    pub swarm: SwarmFlags,
}

#[derive(Args, Debug)]
pub struct BootstrapArgs {
    #[arg(long)]
    pub manifest: PathBuf,
    /// Identity key: one of the manifest's bootstrap keys. Default: the
    /// `<manifest>.bootstrap.key.json` that `swarm init` wrote beside it.
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Where the node keeps the newest state it verified.
    #[arg(long, default_value = "nightshift-bootstrap")]
    pub data_dir: PathBuf,
    /// The swarm's pre-shared key, for a swarm created with --private. Default: `swarm.key`
    /// beside the manifest.
    #[arg(long)]
    pub swarm_key: Option<PathBuf>,
    #[arg(long, default_value = "/ip4/0.0.0.0/tcp/4001")]
    pub listen: Multiaddr,
    /// Write the full listen address here once known.
    #[arg(long)]
    pub addr_file: Option<PathBuf>,
    /// Other bootstrap nodes to peer with.
    #[arg(long)]
    pub peer: Vec<Multiaddr>,
}

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
    /// The corpus file, when the manifest names a file that lives elsewhere here.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Stop after this many rounds in total (θ(N) reached).
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Append JSON-lines events to this file.
    #[arg(long)]
    pub events: Option<PathBuf>,
    /// This node's shard of the training data, as INDEX/COUNT.
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
}

#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The running node's data directory.
    #[arg(long, default_value = "nightshift-data")]
    pub data_dir: PathBuf,
}

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

fn parse_shard(s: &str) -> Result<(usize, usize), String> {
    let (i, n) = s.split_once('/').ok_or("expected INDEX/COUNT, e.g. 0/3")?;
    let i: usize = i.parse().map_err(|_| format!("bad index {i:?}"))?;
    let n: usize = n.parse().map_err(|_| format!("bad count {n:?}"))?;
    if n == 0 || i >= n {
        return Err(format!("shard {i}/{n}: need 0 <= INDEX < COUNT"));
    }
    Ok((i, n))
}

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

fn parse_public_key(s: &str) -> anyhow::Result<[u8; 32]> {
    if Path::new(s).exists() {
        return Ok(read_key(Path::new(s))?.verifying_key().to_bytes());
    }
    let mut k = [0u8; 32];
    hex::decode_to_slice(s.trim(), &mut k)
        .with_context(|| format!("{s:?} is neither a key file nor a 64-hex public key"))?;
    Ok(k)
}

/// Where `swarm init` writes the bootstrap node's key, beside the manifest at `manifest`.
pub fn default_bootstrap_key(manifest: &Path) -> PathBuf {
    manifest.with_extension("bootstrap.key.json")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Runs a parsed command.
///
/// # Errors
/// Whatever the command fails with, with context for the user.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => crate::demo::run_demo(args, shutdown_signal()).await,
        Command::Keygen { out } => {
            if out.exists() {
                bail!(
                    "{} already exists; refusing to overwrite a key",
                    out.display()
                );
            }
            let key = generate_key()?;
            write_key(&out, &key)?;
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
        Command::Swarm(SwarmCommand::Init(a)) => {
            // A new key is written only once the manifest it signs is known to be valid, so a
            // refused setting leaves no file behind.
            let (key, new_key) = match &a.key {
                Some(p) => (read_key(p)?, None),
                None => (
                    generate_key()?,
                    Some(a.out.with_extension("creator.key.json")),
                ),
            };
            let allow = a
                .allow
                .iter()
                .map(|s| parse_public_key(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            if a.private && allow.is_empty() {
                bail!("a --private swarm needs its members: give --allow KEY for each");
            }
            if a.attest_quorum.is_some() && allow.is_empty() {
                bail!(
                    "--attest-quorum is for a swarm with --allow (in an open swarm only bootstrap nodes attest)"
                );
            }
            let psk_path = a.out.with_file_name("swarm.key");
            if a.private && psk_path.exists() {
                bail!(
                    "{} already exists; refusing to overwrite a swarm key (move it away first)",
                    psk_path.display()
                );
            }
            let (bootstraps, new_boot_key) = if a.bootstrap_keys.is_empty() {
                let path = default_bootstrap_key(&a.out);
                if path.exists() {
                    (vec![read_key(&path)?.verifying_key().to_bytes()], None)
                } else {
                    let k = generate_key()?;
                    (vec![k.verifying_key().to_bytes()], Some((path, k)))
                }
            } else {
                let keys = a
                    .bootstrap_keys
                    .iter()
                    .map(|s| parse_public_key(s))
                    .collect::<anyhow::Result<Vec<_>>>()?;
                (keys, None)
            };
            let psk = a.private.then(generate_psk).transpose()?;
            let settings = SwarmSettings {
                bootstraps,
                attest_quorum: a.attest_quorum,
                psk,
                ..a.swarm.settings(&a.name, allow)
            };
            let m = build_manifest(&settings, &key, unix_now())?;
            if let Some(p) = new_key {
                write_key(&p, &key)?;
                eprintln!("wrote the creator key to {}", p.display());
            }
            if let Some((p, k)) = new_boot_key {
                write_key(&p, &k)?;
                eprintln!("wrote the bootstrap node's key to {}", p.display());
            }
            if let Some(k) = psk {
                write_swarm_key(&psk_path, &k)?;
                eprintln!(
                    "wrote the swarm's pre-shared key to {} (give it to every member, privately)",
                    psk_path.display()
                );
            }
            std::fs::write(&a.out, serde_json::to_string_pretty(&m)?)
                .with_context(|| format!("cannot write {}", a.out.display()))?;
            println!("swarm id: {}", m.swarm_id());
            println!("manifest: {}", a.out.display());
            println!("aggregator: {}", m.manifest.aggregator);
            Ok(())
        }
        Command::Bootstrap(a) => {
            let manifest = read_manifest(&a.manifest)?;
            let key = match &a.key {
                Some(p) => read_key(p)?,
                None => {
                    let p = default_bootstrap_key(&a.manifest);
                    read_key(&p).with_context(|| {
                        format!(
                            "no --key given and no bootstrap key at {} (written by `swarm init`)",
                            p.display()
                        )
                    })?
                }
            };
            let psk = swarm_key(&manifest, a.swarm_key.as_deref(), Some(&a.manifest))?;
            run_bootstrap(BootstrapOptions {
                manifest,
                key,
                listen: a.listen,
                peers: a.peer,
                addr_file: a.addr_file,
                data_dir: a.data_dir,
                psk,
                shutdown: shutdown_signal(),
            })
            .await
        }
        Command::Run(a) => run(a).await,
        Command::Pause(a) => control_command(&a, "pause").await,
        Command::Resume(a) => control_command(&a, "resume").await,
        Command::Status(a) => control_command(&a, "status").await,
        Command::Peers(a) => crate::peers::run_peers(a).await,
        Command::Bench { rest } => bail!(
            "the benchmarks are not part of nightshift: run `nightshift-lab {}` (built by \
             `cargo build --release -p nightshift-lab`)",
            rest.join(" ")
        ),
    }
}

async fn run(a: RunArgs) -> anyhow::Result<()> {
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
    crate::control::serve(a.control, &a.data_dir, manual, info.clone()).await?;
    run_trainer(TrainerOptions {
        data_dir: a.data_dir,
        listen: a.listen,
        bootstrap: a.bootstrap,
        manifest,
        key,
        data_path: a.data,
        rounds: a.rounds,
        events: a.events,
        shard: a.shard,
        min_peers: a.min_peers,
        shutdown: shutdown_signal(),
        idle: Some(idle),
        control_info: Some(info),
        threads: a.threads.map_or_else(crate::demo::cores, |t| t as usize),
        psk,
    })
    .await
}

async fn control_command(a: &ControlArgs, command: &str) -> anyhow::Result<()> {
    let v = crate::control::call(&a.data_dir, command).await?;
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

fn identity_from_store(dir: &Path) -> anyhow::Result<SigningKey> {
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
    let served = std::sync::Arc::new(std::sync::RwLock::new(crate::net::Served::new(None)));
    let (net, _events) = crate::net::spawn_network(
        crate::net::NetConfig {
            keypair: crate::net::libp2p_keypair(key),
            swarm_id: id,
            max_frame: nightshift_protocol::MAX_MESSAGE_BYTES,
            listen: "/ip4/127.0.0.1/tcp/0".parse()?,
            bootstrap: bootstrap.to_vec(),
            admitted: None,
            psk,
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
