//! The bootstrap node: the peer others dial first, and the swarm's verifier. A Kademlia server on
//! the swarm's protocol that hands out the manifest and the genesis state, and follows the swarm
//! by replaying every round (fetching the contributions that formed it, checking each, applying
//! the aggregator and outer step) without training. Its signed status therefore attests only
//! states it verified; a node too far behind to replay trusts that attestation, as the manifest
//! lists this node's key.

use anyhow::Context;
use ed25519_dalek::SigningKey;
use libp2p::Multiaddr;
use nightshift_protocol::NodeRole;
use nightshift_protocol::SignedManifest;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use nightshift_daemon::machine::{self, How, Input, Note, Output, RoundMachine};
use nightshift_daemon::net::{self, NetEvent, Served, StatusCheck};
use nightshift_daemon::round::io::NetIo;
use nightshift_daemon::round::verify::Recipe;
use nightshift_daemon::store::Store;

/// How often the machine's deadlines are re-checked.
const TICK_MS: u64 = 300;
/// How often the follower asks its peers for their statuses.
const STATUS_REFRESH_SECS: u64 = 3;

/// How to run a bootstrap node.
pub struct BootstrapOptions {
    pub manifest: SignedManifest,
    pub key: SigningKey,
    pub listen: Multiaddr,
    /// Other bootstrap nodes to peer with.
    pub peers: Vec<Multiaddr>,
    /// Where to write the full listen address (with `/p2p/<id>`) once known.
    pub addr_file: Option<PathBuf>,
    /// Where the node keeps the newest state it verified (sled), so a restart resumes there.
    pub data_dir: PathBuf,
    /// The swarm's pre-shared key, when its manifest pins one.
    pub psk: Option<[u8; 32]>,
    pub shutdown: watch::Receiver<bool>,
}

/// Runs until shut down.
///
/// # Errors
/// On a manifest that does not verify, an unusable data directory, or a network that cannot
/// start.
pub async fn run_bootstrap(opts: BootstrapOptions) -> anyhow::Result<()> {
    opts.manifest
        .verify()
        .context("the swarm manifest does not verify")?;
    let m = &opts.manifest.manifest;
    let swarm_id = opts.manifest.swarm_id();
    let me = opts.key.verifying_key().to_bytes();
    if !m.bootstraps.contains(&me) {
        warn!(
            "this bootstrap's key is not among the manifest's bootstrap keys: nodes will not trust \
             its attestations{}",
            if m.allowlist().is_some() {
                ", and those of a swarm with an allowlist will refuse to connect to it"
            } else {
                ""
            }
        );
    }
    let genesis = nightshift_genesis::genesis_state(m);
    anyhow::ensure!(
        genesis.hash() == m.initial_state_hash,
        "this build computes a different genesis state than the manifest's"
    );
    std::fs::create_dir_all(&opts.data_dir)
        .with_context(|| format!("cannot create {}", opts.data_dir.display()))?;
    let store = Store::open(&opts.data_dir.join("db"))?;
    if let Some(stored) = store.manifest()?
        && stored.swarm_id() != swarm_id
    {
        anyhow::bail!(
            "{} belongs to swarm {}, not {}; use another --data-dir",
            opts.data_dir.display(),
            stored.swarm_id().short(),
            swarm_id.short()
        );
    }
    store.set_manifest(&opts.manifest)?;
    let n = genesis.params.len();
    let state = match store.checkpoint()? {
        Some(s) if s.params.len() == n && s.momentum.len() == n => s,
        Some(_) => anyhow::bail!(
            "the checkpoint in {} does not fit this swarm's model",
            opts.data_dir.display()
        ),
        None => genesis.clone(),
    };
    let shapes = {
        let cfg = nightshift_genesis::model_config(&m.model);
        let model =
            cfg.init::<nightshift_model::backend::Cpu>(&nightshift_model::backend::cpu_device());
        Arc::new(nightshift_model::flat::param_shapes::<
            nightshift_model::backend::Cpu,
            _,
        >(&model))
    };
    let recipe = Arc::new(Recipe::new(&opts.manifest, shapes));
    let mut served = Served::new(Some(opts.manifest.clone()));
    let bytes = net::encode_state(&genesis);
    served.set_genesis(genesis.hash(), bytes);
    let hash = state.hash();
    served.set_state(hash, net::encode_state(&state));
    let served = net::ServedHandle::new(served);
    let max_frame = (4 * nightshift_protocol::delta::dense_bytes(n) + (1 << 20))
        .min(nightshift_protocol::MAX_MESSAGE_BYTES);
    let admitted = m.admitted();
    let (net, events) = net::spawn_network(
        net::NetConfig {
            keypair: net::libp2p_keypair(&opts.key),
            swarm_id,
            max_frame,
            listen: opts.listen,
            bootstrap: opts.peers,
            admitted: admitted.clone(),
            psk: opts.psk,
            relay_server: true,
            metrics: None,
        },
        served,
    )?;
    // Wait for the listen address, then publish it.
    let mut addrs = vec![];
    for _ in 0..100 {
        addrs = net.listen_addrs().await;
        if addrs.iter().any(is_tcp) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The TCP address when there is one: every node can dial it (pnet swarms have no QUIC).
    let first = addrs
        .iter()
        .find(|a| is_tcp(a))
        .or(addrs.first())
        .context("the bootstrap node got no listen address")?;
    info!(swarm = %swarm_id, address = %first, round = state.round, "bootstrap node ready");
    println!("{first}");
    if let Some(path) = &opts.addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{first}\n"))
            .and_then(|_| std::fs::rename(&tmp, path))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let cfg = machine::Config {
        key: opts.key.clone(),
        recipe,
        inner_steps: 0,
        round_deadline_ms: 0,
        round_tokens: 0.0,
        min_peers: 0,
        rounds: None,
        role: NodeRole::Bootstrap,
        overlap: false,
        timed_params: None,
    };
    let prev = nightshift_daemon::round::previous_checkpoint(&store, &state)?;
    let mut m = RoundMachine::new(cfg, state);
    if let Some(p) = prev {
        m = m.with_prev(p);
    }
    let (answers_tx, answers) = mpsc::unbounded_channel();
    let io = NetIo::new(
        net,
        opts.key,
        StatusCheck::new(swarm_id, admitted),
        store.clone(),
        n,
        answers_tx,
    );
    let mut f = Follower { m, io, store };
    f.run(events, answers, opts.shutdown).await;
    info!(round = f.m.round(), "bootstrap node stopping");
    Ok(())
}

fn is_tcp(addr: &Multiaddr) -> bool {
    addr.iter()
        .any(|p| matches!(p, libp2p::multiaddr::Protocol::Tcp(_)))
}

/// The bootstrap's round machine (a follower: it never trains) and its network side.
struct Follower {
    m: RoundMachine,
    io: NetIo,
    store: Store,
}

impl Follower {
    async fn run(
        &mut self,
        mut events: mpsc::Receiver<NetEvent>,
        mut answers: mpsc::UnboundedReceiver<Input>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_refresh = Instant::now();
        self.feed(Input::Start).await;
        loop {
            let inputs = tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.io.inputs_of(ev),
                    None => break,
                },
                Some(i) = answers.recv() => vec![i],
                _ = tick.tick() => {
                    // Peers announce every change; asking now and then also covers one that
                    // connected between its announcements.
                    if last_refresh.elapsed() >= Duration::from_secs(STATUS_REFRESH_SECS) {
                        let peers: Vec<_> = self.io.connected().copied().collect();
                        self.io.ask_statuses(peers, false);
                        last_refresh = Instant::now();
                    }
                    vec![Input::Tick]
                }
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break } else { continue },
            };
            for i in inputs {
                self.feed(i).await;
            }
        }
    }

    async fn feed(&mut self, input: Input) {
        let now = net::mono_ms();
        // Replaying a round of a large model takes a while: the network runs on meanwhile.
        let outputs = tokio::task::block_in_place(|| self.m.handle(now, input));
        for o in outputs {
            match self.io.carry(o) {
                None => {}
                Some(Output::NewState(ns)) => {
                    let how = match &ns.how {
                        How::Synced { verified, .. } => *verified,
                        How::Stepped(_) => "stepped",
                    };
                    info!(
                        round = ns.state.round,
                        hash = %ns.hash.short(),
                        verified = how,
                        contributors = ns.state.formed_by.len(),
                        "following the swarm"
                    );
                    nightshift_daemon::round::checkpoint_and_serve(
                        &self.store,
                        &self.io.net,
                        ns.state,
                        ns.hash,
                    )
                    .await;
                }
                Some(Output::Note(Note::Rejected {
                    round,
                    hash,
                    reason,
                })) => {
                    warn!(round, hash = %hash.short(), %reason, "a claimed state did not verify; not adopting it")
                }
                Some(Output::Note(note)) => debug!(?note, "bootstrap"),
                Some(Output::Failed(why)) => warn!(%why, "the follower stopped"),
                Some(_) => {}
            }
        }
    }
}
