//! The bootstrap node: the peer others dial first, and the swarm's verifier. A Kademlia server on
//! the swarm's protocol that hands out the manifest and the genesis state, and follows the swarm
//! by replaying every round (fetching the contributions that formed it, checking each, applying
//! the aggregator and outer step) without training. Its signed status therefore attests only
//! states it verified; a node too far behind to replay trusts that attestation, as the manifest
//! lists this node's key.

use anyhow::Context;
use ed25519_dalek::SigningKey;
use libp2p::{Multiaddr, PeerId};
use nightshift_protocol::message::Phase;
use nightshift_protocol::{
    Hash32, NodeRole, SignedEnvelope, SignedManifest, StateSnapshot, Status, sign_status,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::net::{self, NetEvent, NetHandle, Served, StatusCheck};
use crate::round::verify::{self, Held, Recipe, candidates, group_claims};
use crate::store::Store;

/// How often the follower looks for a newer verified state.
const FOLLOW_TICK_MS: u64 = 500;
/// How often it asks its peers for their statuses.
const STATUS_REFRESH_SECS: u64 = 3;
/// Time-out of one status announcement or look-up.
const LOOKUP_TIMEOUT_SECS: u64 = 5;

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
    let genesis = nightshift_bootstrap::genesis_state(m);
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
        let cfg = nightshift_bootstrap::model_config(&m.model);
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
        },
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
    info!(swarm = %swarm_id, address = %first, round = state.round, "bootstrap node ready");
    println!("{first}");
    if let Some(path) = &opts.addr_file {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, format!("{first}\n"))
            .and_then(|_| std::fs::rename(&tmp, path))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut f = Follower {
        net,
        store,
        recipe,
        key: opts.key,
        swarm_id,
        state,
        hash,
        prev: None,
        statuses: HashMap::new(),
        connected: HashSet::new(),
        status_check: StatusCheck::new(swarm_id, admitted),
        rejected: verify::Rejections::default(),
    };
    f.serve_status();
    f.run(events, opts.shutdown).await;
    info!(round = f.state.round, "bootstrap node stopping");
    Ok(())
}

/// The bootstrap's view of the swarm: the newest state it verified, and the peers' statuses.
struct Follower {
    net: NetHandle,
    store: Store,
    recipe: Arc<Recipe>,
    key: SigningKey,
    swarm_id: Hash32,
    state: StateSnapshot,
    hash: Hash32,
    prev: Option<(Arc<StateSnapshot>, Hash32)>,
    statuses: HashMap<PeerId, Status>,
    connected: HashSet<PeerId>,
    status_check: StatusCheck,
    rejected: verify::Rejections,
}

impl Follower {
    async fn run(
        &mut self,
        mut events: tokio::sync::mpsc::Receiver<NetEvent>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(FOLLOW_TICK_MS));
        let mut last_refresh = Instant::now();
        loop {
            tokio::select! {
                ev = events.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
                _ = tick.tick() => {
                    if last_refresh.elapsed() >= Duration::from_secs(STATUS_REFRESH_SECS) {
                        self.refresh_statuses().await;
                        last_refresh = Instant::now();
                    }
                    // Follow round by round while there is a verified way forward.
                    for _ in 0..8 {
                        if !self.follow().await {
                            break;
                        }
                    }
                }
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break },
            }
        }
    }

    fn status(&self) -> Status {
        Status {
            role: NodeRole::Bootstrap,
            phase: Phase::Ready,
            round: self.state.round,
            state_hash: self.hash,
            formed_by: self.state.formed_by.clone(),
            holding: vec![],
            unix_ms: net::unix_ms(),
        }
    }

    fn signed_status(&self) -> Arc<SignedEnvelope> {
        Arc::new(sign_status(&self.key, self.swarm_id, &self.status()))
    }

    fn serve_status(&self) {
        let env = self.signed_status();
        self.net.served.update(|s| s.status = Some(env));
    }

    fn announce(&self) {
        self.net.announce_status(
            self.signed_status(),
            self.connected.iter().copied(),
            Duration::from_secs(LOOKUP_TIMEOUT_SECS),
        );
    }

    fn note(&mut self, peer: PeerId, status: Status) {
        net::note_newest(&mut self.statuses, peer, status);
    }

    fn on_event(&mut self, ev: NetEvent) {
        match ev {
            NetEvent::PeerConnected(p) => {
                info!(peer = %p, "peer connected");
                self.connected.insert(p);
            }
            NetEvent::PeerDisconnected(p) => {
                info!(peer = %p, "peer left");
                self.connected.remove(&p);
                self.statuses.remove(&p);
            }
            NetEvent::StatusAnnounced { peer, status } => {
                self.connected.insert(peer);
                self.note(peer, status);
            }
            NetEvent::ContributionPushed { .. } => {}
        }
    }

    async fn refresh_statuses(&mut self) {
        let peers = self.net.connected().await;
        self.connected = peers.iter().copied().collect();
        self.statuses.retain(|p, _| peers.contains(p));
        let answers = self
            .net
            .ask_statuses(
                peers,
                &self.status_check,
                Duration::from_secs(LOOKUP_TIMEOUT_SECS),
            )
            .await;
        for (p, s) in answers {
            self.note(p, s);
        }
    }

    /// Moves to a newer (or preferred) state of the swarm when one verifies; true if it did.
    async fn follow(&mut self) -> bool {
        let claims = group_claims(
            self.statuses
                .iter()
                .filter(|(p, s)| {
                    self.connected.contains(p)
                        && s.role == NodeRole::Trainer
                        && s.phase != Phase::Done
                })
                .filter_map(|(p, s)| Some((crate::net::public_key_of(p)?, s))),
        );
        self.rejected.prune(crate::net::mono_ms());
        let held = Held {
            round: self.state.round,
            hash: self.hash,
            formed: self.state.formed_by.len(),
        };
        let list = candidates(&self.recipe, held, &claims, &self.rejected);
        if list.is_empty() {
            return false;
        }
        let known = self.net.served.current().contributions.clone();
        let Some(v) = verify::first_verified(
            &self.net,
            &self.store,
            &self.recipe,
            (&self.state, self.hash),
            self.prev.as_ref(),
            list,
            &known,
            &mut self.rejected,
        )
        .await
        else {
            return false;
        };
        let hash = v.state.hash();
        info!(
            round = v.state.round,
            hash = %hash.short(),
            verified = v.verified,
            replay_ms = v.replay_ms,
            contributors = v.state.formed_by.len(),
            "following the swarm"
        );
        self.hash = hash;
        self.prev = v.prev;
        let round = v.state.round;
        self.state =
            crate::round::checkpoint_and_serve(&self.store, &self.net, v.state, hash).await;
        self.net.served.update(|s| {
            for env in v.envelopes {
                s.contributions
                    .insert((env.header.round, env.header.sender), env);
            }
            s.contributions.retain(|(r, _), _| *r + 2 >= round);
        });
        self.announce();
        true
    }
}
