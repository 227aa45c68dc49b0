//! The trainer: a node that runs DiLoCo rounds with its peers.
//!
//! Each round r: align with the swarm (catch up or repair a diverged state), train H inner steps
//! from θ(r), encode and sign Δ, push it to every peer, collect the others' until every live
//! peer's has arrived or the deadline passes, reconcile the set with the peers' views, average by
//! tokens, take the outer step, checkpoint θ(r+1) to sled, and announce the new state hash.
//!
//! Idle windows: the node trains only while its idle monitor says the machine is idle. When the
//! window closes, training stops at the next inner-step boundary; the steps done so far go out
//! as a partial contribution (weighted by its tokens), the model and AdamW state leave the
//! device, and the node announces [`Phase::Paused`] until the machine is idle again. A node that
//! synced while the swarm was in the middle of a round waits for that round to end and joins
//! the next. Each node advertises a signed window record in Kademlia; the measured speeds there
//! set a time budget per round, so a slow node sends a smaller contribution rather than stall
//! the others or miss the deadline.

pub mod accept;
mod sync;
pub mod verify;
mod windows;

pub(crate) use sync::checkpoint_and_serve;

use windows::{device_info, spawn_availability_watch};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use ed25519_dalek::SigningKey;
use libp2p::{Multiaddr, PeerId};
use nightshift_model::{Corpus, ErrorFeedback, InnerConfig, InnerTrainer, Shard, Tokenizer, eval};
use nightshift_protocol::message::{MAX_EXPECTED, Phase, sign_window};
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Contribution, Hash32, NodeRole, PayloadKind, Request, Response, SignedEnvelope, SignedManifest,
    StateSnapshot, Status, WindowRecord, WindowState, delta, sign_status, wire,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::events::{EventSink, NodeEvent, RoundRecord};
use crate::idle::Availability;
use crate::net::{self, NetEvent, NetHandle, Served, StatusCheck};
use crate::store::Store;
use accept::{Accepted, accept};
use verify::{Claim, Held, Recipe, candidates, group_claims};

/// How long a node waits for peers still finishing the previous round before it starts the next.
const ALIGN_WAIT_SECS: u64 = 10;
/// Time-out for the small status/contribution look-ups between rounds.
const LOOKUP_TIMEOUT_SECS: u64 = 5;
/// How often collection re-checks the peers' holdings for contributions it lacks.
const COLLECT_TICK_MS: u64 = 300;
/// How long a pushed contribution may take to arrive before it is fetched instead.
const PUSH_GRACE_SECS: u64 = 2;
/// How long a finished node keeps serving before it leaves.
const LINGER_SECS: u64 = 2;
/// Rounds in a row whose local training may go non-finite before the node gives up: one bad
/// round is dropped and retried from θ; several in a row mean the settings diverge.
const MAX_DIVERGED_IN_A_ROW: u32 = 3;
/// Size of one state chunk asked for when syncing.
const SYNC_CHUNK_BYTES: u32 = 1 << 20;
/// How often an unchanged window record is re-published.
const WINDOW_REFRESH_SECS: u64 = 60;
/// A round's time budget: this many times the median live peer's expected training time.
const BUDGET_FACTOR: f64 = 1.5;
/// Most contributions fetched while reconciling one round (beyond those of the members).
const MAX_RECONCILE_FETCHES: usize = 64;
/// The longest reconciling a round may take.
const RECONCILE_SECS: u64 = 30;
/// Most early contributions (for a round not reached yet) kept in an open swarm.
const MAX_STASHED: usize = 64;

/// How to run a trainer.
pub struct TrainerOptions {
    pub data_dir: PathBuf,
    pub listen: Multiaddr,
    pub bootstrap: Vec<Multiaddr>,
    pub manifest: SignedManifest,
    pub key: SigningKey,
    /// Corpus file; `None` uses the manifest's (embedded) corpus.
    pub data_path: Option<PathBuf>,
    /// Stop once the node holds θ(rounds).
    pub rounds: Option<u64>,
    pub events: Option<PathBuf>,
    /// (index, count) of this node's shard; `None` samples the whole training split.
    pub shard: Option<(usize, usize)>,
    /// Trainer peers to wait for before the first round.
    pub min_peers: usize,
    /// Set to true to stop (Ctrl-C).
    pub shutdown: watch::Receiver<bool>,
    /// The idle monitor's verdicts; `None` trains whenever it can.
    pub idle: Option<watch::Receiver<Availability>>,
    /// Owner-facing status shared with the control endpoint (`nightshift status`).
    pub control_info: Option<Arc<RwLock<serde_json::Value>>>,
    /// Threads of each inner step on the CPU (see [`InnerConfig::threads`]).
    pub threads: usize,
    /// The swarm's pre-shared key (`swarm.key`) when its manifest pins one.
    pub psk: Option<[u8; 32]>,
}

/// Runs a trainer until it has done `rounds` or is shut down. Picks CUDA when built with the
/// `cuda` feature and a driver is present, else the CPU.
///
/// # Errors
/// On a bad manifest, corpus or store, or when the network cannot start.
pub async fn run_trainer(opts: TrainerOptions) -> anyhow::Result<()> {
    #[cfg(feature = "cuda")]
    {
        if nightshift_model::backend::cuda_available() {
            info!("using the CUDA backend");
            // The GPU runs the whole batch at once; splitting it over CPU threads buys nothing.
            let opts = TrainerOptions { threads: 1, ..opts };
            return Driver::<nightshift_model::backend::CudaTrain>::start(opts, Default::default())
                .await;
        }
        warn!("built with cuda but no NVIDIA driver found (libcuda.so.1); training on the CPU");
    }
    Driver::<nightshift_model::backend::CpuTrain>::start(
        opts,
        nightshift_model::backend::cpu_device(),
    )
    .await
}

/// The tensor side of a trainer; moved onto a blocking thread for every heavy call.
struct Compute<B: AutodiffBackend> {
    trainer: InnerTrainer<B>,
    corpus: Arc<Corpus>,
    shard: Shard,
    rng: ChaCha8Rng,
    val: Arc<Vec<(Vec<i32>, Vec<i32>)>>,
}

impl<B: AutodiffBackend> Compute<B> {
    fn val_loss(&mut self) -> f32 {
        eval::val_loss(&self.trainer.eval_model(), &self.val)
    }
}

enum Outcome {
    Completed,
    Behind,
    /// The window closed before the first step: nothing to send.
    Yielded,
    /// Our own training went non-finite: nothing sent, the trainer is back at θ.
    Diverged,
    Shutdown,
}

/// What the node knows about its device, for its window record.
#[derive(Clone, Debug)]
struct DeviceInfo {
    kind: String,
    name: String,
    memory_bytes: u64,
}

/// The moment the idle window was seen to close, and when it was scheduled to close.
#[derive(Clone, Copy, Debug, Default)]
struct Closing {
    seen: Option<Instant>,
    scheduled: Option<SystemTime>,
}

enum Trained {
    /// No step ran (shutdown or the window closed first).
    Nothing,
    Report(nightshift_model::InnerReport),
}

struct Driver<B: AutodiffBackend> {
    net: NetHandle,
    events: mpsc::Receiver<NetEvent>,
    sink: EventSink,
    store: Store,
    manifest: SignedManifest,
    swarm_id: Hash32,
    key: SigningKey,
    me: [u8; 32],
    compute: Option<Compute<B>>,
    state: StateSnapshot,
    hash: Hash32,
    ef: ErrorFeedback,
    phase: Phase,
    holding: Vec<[u8; 32]>,
    /// Peers' newest statuses, each checked by `status_check` (signed by that peer, for this
    /// swarm, by an admitted key, current).
    statuses: HashMap<PeerId, Status>,
    status_check: StatusCheck,
    /// The swarm's rules for replaying a round.
    recipe: Arc<Recipe>,
    /// θ(r−1), the state before ours, when we computed or replayed ours from it: the base
    /// from which a fork of our round is replayed.
    prev: Option<(Arc<StateSnapshot>, Hash32)>,
    /// Claims (state hashes) that failed to verify, and when: not tried again for a while.
    rejected: verify::Rejections,
    connected: HashSet<PeerId>,
    stash: Vec<SignedEnvelope>,
    stop: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
    rounds: Option<u64>,
    min_peers: usize,
    num_params: usize,
    /// Parameter shapes in flat order (the low-rank codec finds the matrices with them).
    shapes: Arc<Vec<Vec<usize>>>,
    // Idle windows.
    idle: Option<watch::Receiver<Availability>>,
    avail: Arc<AtomicBool>,
    closing: Arc<Mutex<Closing>>,
    device: DeviceInfo,
    /// Our measured inner-loop throughput (tokens/s), once a round has run.
    tokens_per_sec: Option<f64>,
    /// Peers' window records (for speeds), refreshed in the background every round.
    peer_windows: Arc<Mutex<HashMap<PeerId, WindowRecord>>>,
    window_published: Option<(WindowState, Instant)>,
    control_info: Option<Arc<RwLock<serde_json::Value>>>,
    /// Set when `align` replaced our state with a peer's.
    just_synced: bool,
    /// Set after waiting out the round that was under way when we synced; the next round is ours.
    waited_for_round: bool,
    /// Rounds in a row whose local training went non-finite (reset by a completed round).
    diverged_in_a_row: u32,
    /// When a peer was first seen training each recent round.
    round_started: BTreeMap<u64, Instant>,
    /// The training budget of the next round when it is joined late.
    budget_override: Option<Duration>,
}

fn short(k: &[u8; 32]) -> String {
    hex::encode(&k[..6])
}

impl<B: AutodiffBackend> Driver<B> {
    async fn start(opts: TrainerOptions, device: B::Device) -> anyhow::Result<()> {
        let manifest = opts.manifest;
        manifest
            .verify()
            .context("the swarm manifest does not verify")?;
        let m = &manifest.manifest;
        let swarm_id = manifest.swarm_id();
        std::fs::create_dir_all(&opts.data_dir)
            .with_context(|| format!("cannot create {}", opts.data_dir.display()))?;
        let store = Store::open(&opts.data_dir.join("db"))?;
        if let Some(stored) = store.manifest()?
            && stored.swarm_id() != swarm_id
        {
            bail!(
                "{} belongs to swarm {}, not {}; use another --data-dir",
                opts.data_dir.display(),
                stored.swarm_id().short(),
                swarm_id.short()
            );
        }
        store.set_manifest(&manifest)?;

        // Data.
        let text = nightshift_bootstrap::load_corpus(&m.training.data, opts.data_path.as_deref())?;
        let tok = Tokenizer::from_vocab(m.model.vocab.clone())?;
        let cfg = nightshift_bootstrap::model_config(&m.model);
        let corpus = Arc::new(Corpus::new(
            &text,
            &tok,
            m.training.data.val_permille,
            cfg.seq_len,
        )?);
        let shard = match opts.shard {
            Some((i, n)) => corpus.shard(i, n),
            None => corpus.full_shard(),
        };
        let val = Arc::new(corpus.val_batches(m.training.batch_size as usize, cfg.seq_len, 8));

        // State: the checkpoint, or genesis.
        if m.psk.is_some() != opts.psk.is_some()
            || opts
                .psk
                .is_some_and(|k| Some(nightshift_protocol::psk_fingerprint(&k)) != m.psk)
        {
            bail!(
                "this swarm {} a pre-shared key{}",
                if m.psk.is_some() {
                    "is closed by"
                } else {
                    "has no"
                },
                if m.psk.is_some() {
                    " (swarm.key): give the one its creator wrote with --swarm-key"
                } else {
                    ", but one was given"
                }
            );
        }
        let genesis = nightshift_bootstrap::genesis_state(m);
        if genesis.hash() != m.initial_state_hash {
            bail!(
                "this build computes a different genesis state than the manifest's ({}); the swarm was created by an incompatible version",
                m.initial_state_hash.short()
            );
        }
        let (state, resumed) = match store.checkpoint()? {
            Some(s)
                if s.params.len() == genesis.params.len() && s.momentum.len() == s.params.len() =>
            {
                (s, true)
            }
            Some(_) => bail!(
                "the checkpoint in {} does not fit this swarm's model",
                opts.data_dir.display()
            ),
            None => (genesis.clone(), false),
        };
        let hash = state.hash();
        let num_params = state.params.len();
        let inner = InnerConfig {
            lr: m.training.inner_lr as f64,
            warmup_steps: m.training.warmup_steps as u64,
            batch_size: m.training.batch_size as usize,
            weight_decay: m.training.weight_decay,
            grad_clip: m.training.grad_clip,
            threads: opts.threads,
            muon: m.training.inner_optimizer.muon_lr_mult(),
        };
        let trainer = InnerTrainer::<B>::new(&cfg, inner, &state.params, &device)?;
        let me = opts.key.verifying_key().to_bytes();
        let seed = u64::from_le_bytes(me[..8].try_into().unwrap_or_default())
            ^ state.round.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let compute = Compute {
            trainer,
            corpus,
            shard,
            rng: ChaCha8Rng::seed_from_u64(seed),
            val,
        };

        // Network.
        let mut served = Served::new(Some(manifest.clone()));
        let genesis_bytes = net::encode_state(&genesis);
        served.set_genesis(genesis.hash(), genesis_bytes);
        served.set_state(hash, net::encode_state(&state));
        let served = Arc::new(RwLock::new(served));
        let max_frame = 2 * delta::dense_bytes(num_params) * 2 + (1 << 20);
        let admitted = m.admitted();
        let status_check = StatusCheck::new(swarm_id, admitted.clone());
        let (net, events) = net::spawn_network(
            net::NetConfig {
                keypair: net::libp2p_keypair(&opts.key),
                swarm_id,
                max_frame: max_frame.min(nightshift_protocol::MAX_MESSAGE_BYTES),
                listen: opts.listen,
                bootstrap: opts.bootstrap,
                admitted,
                psk: opts.psk,
            },
            served,
        )?;
        let sink =
            EventSink::open(opts.events.as_deref()).context("cannot open the events file")?;
        let stop = Arc::new(AtomicBool::new(false));
        {
            let stop = stop.clone();
            let mut sd = opts.shutdown.clone();
            tokio::spawn(async move {
                while sd.changed().await.is_ok() {
                    if *sd.borrow() {
                        stop.store(true, Ordering::SeqCst);
                        break;
                    }
                }
            });
        }
        let avail = Arc::new(AtomicBool::new(true));
        let closing = Arc::new(Mutex::new(Closing::default()));
        if let Some(rx) = opts.idle.clone() {
            spawn_availability_watch(rx, avail.clone(), closing.clone());
        }
        info!(swarm = %swarm_id.short(), peer = %net.local_peer, round = state.round, params = num_params, resumed, "trainer started");
        let mut compute = compute;
        let val_loss = compute.val_loss();
        sink.emit(&NodeEvent::Started {
            peer_id: net.local_peer.to_string(),
            round: state.round,
            state_hash: hash.to_hex(),
            num_params,
            val_loss,
            resumed,
        });
        let shapes = Arc::new(compute.trainer.param_shapes().to_vec());
        let recipe = Arc::new(Recipe::new(&manifest, shapes.clone()));
        let driver = Driver {
            net,
            events,
            sink,
            store,
            manifest,
            swarm_id,
            key: opts.key,
            me,
            compute: Some(compute),
            state,
            hash,
            ef: ErrorFeedback::default(),
            phase: Phase::Ready,
            holding: vec![],
            statuses: HashMap::new(),
            status_check,
            recipe,
            prev: None,
            rejected: verify::Rejections::default(),
            connected: HashSet::new(),
            stash: vec![],
            stop,
            shutdown: opts.shutdown,
            rounds: opts.rounds,
            min_peers: opts.min_peers,
            num_params,
            shapes,
            idle: opts.idle,
            avail,
            closing,
            device: device_info::<B>(),
            tokens_per_sec: None,
            peer_windows: Arc::new(Mutex::new(HashMap::new())),
            window_published: None,
            control_info: opts.control_info,
            just_synced: false,
            waited_for_round: false,
            diverged_in_a_row: 0,
            round_started: BTreeMap::new(),
            budget_override: None,
        };
        driver.run().await
    }

    fn shutting_down(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn done(&self) -> bool {
        self.rounds.is_some_and(|n| self.state.round >= n)
    }

    async fn run(mut self) -> anyhow::Result<()> {
        self.announce(Phase::Ready).await;
        // Wait for company once, before the first round; later a swarm goes on with whoever is left.
        let ready = self.done() || self.wait_for_peers().await;
        let reason = loop {
            if self.shutting_down() || !ready {
                break "shutdown";
            }
            if self.done() {
                break "finished";
            }
            if !self.available() {
                if !self.pause().await {
                    break "shutdown";
                }
                continue;
            }
            self.just_synced = false;
            self.align().await;
            if self.done() {
                break "finished";
            }
            if self.round_under_way() {
                // The others are already training this round. With enough of its time left,
                // train for what is left (a smaller contribution that arrives with theirs);
                // else, having just synced, wait for the next round rather than hold them up.
                match self.late_budget() {
                    Some(left) => {
                        info!(
                            round = self.state.round,
                            secs = left.as_secs_f64(),
                            "joining the round under way for the time it has left"
                        );
                        self.budget_override = Some(left);
                    }
                    None if self.just_synced && !self.waited_for_round => {
                        self.waited_for_round = true;
                        self.wait_for_round_end().await;
                        continue;
                    }
                    None => {}
                }
            }
            match self.one_round().await? {
                Outcome::Completed => {
                    self.waited_for_round = false;
                    self.diverged_in_a_row = 0;
                }
                Outcome::Behind | Outcome::Yielded | Outcome::Diverged => {}
                Outcome::Shutdown => break "shutdown",
            }
        };
        self.announce(Phase::Done).await;
        self.sink.emit(&NodeEvent::Stopped {
            round: self.state.round,
            state_hash: self.hash.to_hex(),
            reason: reason.into(),
        });
        info!(round = self.state.round, reason, "trainer stopping");
        // Keep serving a moment so that peers finishing the same round can fetch from us.
        let linger = tokio::time::sleep(Duration::from_secs(LINGER_SECS));
        tokio::pin!(linger);
        loop {
            tokio::select! {
                _ = &mut linger => break,
                ev = self.events.recv() => match ev { Some(ev) => self.on_event(ev, None).await, None => break },
            }
        }
        Ok(())
    }

    fn status(&self) -> Status {
        Status {
            role: NodeRole::Trainer,
            phase: self.phase,
            round: self.state.round,
            state_hash: self.hash,
            formed_by: self.state.formed_by.clone(),
            holding: self.holding.clone(),
            unix_ms: net::unix_ms(),
        }
    }

    /// Our status, signed: what we announce and serve.
    fn signed_status(&self) -> Arc<SignedEnvelope> {
        Arc::new(sign_status(&self.key, self.swarm_id, &self.status()))
    }

    /// Re-signs the served status (the holding list changed).
    fn serve_status(&self) {
        let env = self.signed_status();
        if let Ok(mut s) = self.net.served.write() {
            s.status = Some(env);
        }
    }

    /// Publishes the status to the served table and to every connected peer.
    async fn announce(&mut self, phase: Phase) {
        self.phase = phase;
        let peers = self.net.connected().await;
        self.net.announce_status(
            self.signed_status(),
            peers,
            Duration::from_secs(LOOKUP_TIMEOUT_SECS),
        );
        let (window, force) = match phase {
            Phase::Ready | Phase::Training | Phase::Collecting => (WindowState::Training, false),
            Phase::Syncing => (WindowState::Syncing, false),
            Phase::Paused => (WindowState::Busy, false),
            Phase::Done => (WindowState::Left, true),
        };
        self.publish_window(window, "", force).await;
        self.update_control_info(None);
    }

    /// Records a checked status of `peer` unless we hold a newer one (an older status arriving
    /// late, or replayed, changes nothing).
    fn note_status(&mut self, peer: PeerId, status: Status) {
        let (training, round) = (
            status.phase == Phase::Training && status.role == NodeRole::Trainer,
            status.round,
        );
        if net::note_newest(&mut self.statuses, peer, status) && training {
            self.round_started.entry(round).or_insert_with(Instant::now);
            let keep = round.saturating_sub(2);
            self.round_started.retain(|r, _| *r >= keep);
        }
    }

    fn trainer_peers(&self) -> Vec<(PeerId, &Status)> {
        self.statuses
            .iter()
            .filter(|(p, s)| {
                s.role == NodeRole::Trainer && s.phase != Phase::Done && self.connected.contains(p)
            })
            .map(|(p, s)| (*p, s))
            .collect()
    }

    /// Trainer peers that are not paused.
    fn live_peers(&self) -> usize {
        self.trainer_peers()
            .iter()
            .filter(|(_, s)| s.phase != Phase::Paused)
            .count()
    }

    /// Asks every connected peer for its status.
    async fn refresh_statuses(&mut self) {
        let peers = self.net.connected().await;
        self.connected.extend(peers.iter().copied());
        let answers = self
            .net
            .ask_statuses(
                peers,
                &self.status_check,
                Duration::from_secs(LOOKUP_TIMEOUT_SECS),
            )
            .await;
        for (p, s) in answers {
            self.note_status(p, s);
        }
    }

    fn drain_events_now(&mut self) -> Vec<NetEvent> {
        let mut out = vec![];
        while let Ok(ev) = self.events.try_recv() {
            out.push(ev);
        }
        out
    }

    /// Waits until at least `min_peers` trainers are known. Returns false on shutdown.
    async fn wait_for_peers(&mut self) -> bool {
        let mut last_log = Instant::now();
        loop {
            for ev in self.drain_events_now() {
                self.on_event(ev, None).await;
            }
            if self.live_peers() >= self.min_peers {
                return true;
            }
            if self.shutting_down() {
                return false;
            }
            self.refresh_statuses().await;
            if self.live_peers() >= self.min_peers {
                return true;
            }
            if last_log.elapsed() > Duration::from_secs(5) {
                info!(
                    have = self.trainer_peers().len(),
                    want = self.min_peers,
                    "waiting for peers"
                );
                last_log = Instant::now();
            }
            self.next_event_within(Duration::from_millis(250)).await;
        }
    }

    /// Handles the next network event, waiting for it at most `max` (then the caller re-polls).
    async fn next_event_within(&mut self, max: Duration) {
        if let Ok(Some(ev)) = tokio::time::timeout(max, self.events.recv()).await {
            self.on_event(ev, None).await;
        }
    }

    /// Before a round: wait briefly for peers finishing the previous one, then catch up with a
    /// swarm that is ahead or move to the state the rules prefer over ours — only ever to a
    /// state we verified ([`verify`]).
    async fn align(&mut self) {
        let until = Instant::now() + Duration::from_secs(ALIGN_WAIT_SECS);
        loop {
            for ev in self.drain_events_now() {
                self.on_event(ev, None).await;
            }
            // A window that closes while we wait for lagging peers ends the wait: the owner gets
            // the machine back now, not after the slowest peer (the round loop yields next).
            if !self.available() {
                break;
            }
            self.refresh_statuses().await;
            let r = self.state.round;
            let lagging = self
                .trainer_peers()
                .iter()
                .filter(|(_, s)| {
                    s.round < r && matches!(s.phase, Phase::Training | Phase::Collecting)
                })
                .count();
            if lagging == 0 || Instant::now() >= until || self.shutting_down() || !self.available()
            {
                break;
            }
            self.next_event_within(Duration::from_millis(200)).await;
        }
        // Catch up one verified round at a time (a replay each), or in one step to an attested
        // state; a few steps at most before training again.
        for _ in 0..8 {
            if self.shutting_down() || !self.improve_state().await {
                break;
            }
        }
    }

    /// The claims of the connected peers' checked statuses.
    fn claims(&self) -> Vec<Claim> {
        group_claims(
            self.statuses
                .iter()
                .filter(|(p, s)| self.connected.contains(p) && s.phase != Phase::Done)
                .map(|(p, s)| (*p, s)),
        )
    }

    /// Tries the states the peers' claims offer, best first ([`verify::candidates`]), and adopts
    /// the first that verifies. Returns whether our state changed.
    async fn improve_state(&mut self) -> bool {
        let claims = self.claims();
        let held = Held {
            round: self.state.round,
            hash: self.hash,
            formed: self.state.formed_by.len(),
        };
        self.rejected.prune();
        let list = candidates(&self.recipe, held, &claims, &self.rejected);
        if list.is_empty() {
            return false;
        }
        self.announce(Phase::Syncing).await;
        let t0 = Instant::now();
        let known = self.held_contributions();
        let found = verify::first_verified(
            &self.net,
            &self.store,
            &self.recipe,
            (&self.state, self.hash),
            self.prev.as_ref(),
            list,
            &known,
            &mut self.rejected,
        )
        .await;
        match found {
            Some(v) => {
                let reason = if v.state.round == self.state.round {
                    "diverged from the swarm"
                } else {
                    "behind the swarm"
                };
                self.adopt(v, reason, t0.elapsed().as_secs_f64()).await;
                true
            }
            None => {
                self.announce(Phase::Ready).await;
                false
            }
        }
    }

    /// Verified contributions that we hold and serve, by round and sender.
    fn held_contributions(&self) -> HashMap<(u64, [u8; 32]), Arc<SignedEnvelope>> {
        self.net
            .served
            .read()
            .map(|s| s.contributions.clone())
            .unwrap_or_default()
    }

    async fn adopt(&mut self, a: verify::Verified, reason: &str, secs: f64) {
        let hash = a.state.hash();
        let replaced = (a.state.round == self.state.round).then_some(self.hash);
        info!(round = a.state.round, hash = %hash.short(), from = %a.from, reason, verified = a.verified, "synced state from peer");
        if let Some(c) = self.compute.as_mut()
            && let Err(e) = c.trainer.load_params(&a.state.params)
        {
            warn!(error = %e, "synced state does not fit the model");
            return;
        }
        self.hash = hash;
        self.ef = ErrorFeedback::default();
        self.state = a.state;
        self.prev = a.prev;
        if let Ok(mut s) = self.net.served.write() {
            for env in a.envelopes {
                s.contributions
                    .insert((env.header.round, env.header.sender), env);
            }
        }
        self.just_synced = true;
        self.checkpoint().await;
        self.sink.emit(&NodeEvent::Synced {
            round: self.state.round,
            state_hash: self.hash.to_hex(),
            from: a.from.to_string(),
            reason: reason.into(),
            secs,
            bytes: a.bytes,
            verified: a.verified.into(),
            replaced: replaced.map(|h| h.to_hex()),
        });
        self.announce(Phase::Ready).await;
    }

    /// Checkpoints the state to sled and serves it in chunks.
    async fn checkpoint(&mut self) {
        let state = std::mem::replace(
            &mut self.state,
            StateSnapshot {
                round: 0,
                params: vec![],
                momentum: vec![],
                formed_by: vec![],
                noise: None,
            },
        );
        self.state = sync::checkpoint_and_serve(&self.store, &self.net, state, self.hash).await;
    }

    /// Keeps a contribution for a round we have not reached yet (or that arrived while we were
    /// not collecting): a few per sender and round (as many as a peer may have queued), and no
    /// more than that many per member of the swarm (or [`MAX_STASHED`] in an open swarm).
    fn stash_push(&mut self, env: SignedEnvelope, from: PeerId) {
        // Only what its sender signed (and, in a private swarm, a member): a forged envelope
        // naming another sender must not take that sender's place.
        if let Err(e) = env.check_signer(self.recipe.allowlist.as_deref()) {
            warn!(%from, sender = %short(&env.header.sender), round = env.header.round, reason = %e, "contribution refused");
            self.sink.emit(&NodeEvent::Refused {
                round: self.state.round,
                from: from.to_string(),
                reason: e.to_string(),
            });
            return;
        }
        let per_sender = net::MAX_QUEUED_PUSHES_PER_PEER;
        let max = self
            .recipe
            .allowlist
            .as_ref()
            .map_or(MAX_STASHED, |m| m.len() * per_sender);
        let same = self
            .stash
            .iter()
            .filter(|e| e.header.sender == env.header.sender && e.header.round == env.header.round)
            .count();
        if self.stash.len() < max && same < per_sender {
            self.stash.push(env);
        }
    }

    /// Verifies and records one contribution for the current round.
    fn consider(
        &mut self,
        env: SignedEnvelope,
        from: PeerId,
        collected: &mut BTreeMap<[u8; 32], Accepted>,
    ) {
        let round = self.state.round;
        if env.header.round == round + 1 {
            self.stash_push(env, from);
            return;
        }
        let duplicate = env.header.round == round && collected.contains_key(&env.header.sender);
        if duplicate {
            let same = self.net.served.read().ok().and_then(|s| {
                s.contributions
                    .get(&(round, env.header.sender))
                    .map(|held| held.signature == env.signature)
            });
            if same == Some(true) {
                return; // the same contribution again (pushed and fetched)
            }
        }
        if !duplicate && collected.len() >= self.recipe.max_contributors() {
            debug!(%from, round, "a round holds as many contributions as it may count; refused one more");
            return;
        }
        let ctx = self.recipe.context(round, self.hash);
        match accept(&ctx, &env) {
            Ok(_) if duplicate => {
                let reason = "a second, different contribution from this sender for this round (the first is kept)";
                warn!(%from, sender = %short(&env.header.sender), round, reason, "contribution refused");
                self.sink.emit(&NodeEvent::Refused {
                    round,
                    from: from.to_string(),
                    reason: reason.into(),
                });
            }
            Ok(a) => {
                debug!(sender = %short(&a.sender), tokens = a.tokens, "contribution accepted");
                if let Ok(mut s) = self.net.served.write() {
                    s.contributions.insert((round, a.sender), Arc::new(env));
                }
                collected.insert(a.sender, a);
                self.holding = collected.keys().copied().collect();
                self.serve_status();
            }
            Err(e) => {
                if env.header.round < round
                    && matches!(
                        e,
                        accept::Refusal::Verify(
                            nightshift_protocol::VerifyError::WrongRound { .. }
                        )
                    )
                {
                    debug!(%from, sender = %short(&env.header.sender), round, reason = %e, "late contribution refused");
                } else {
                    warn!(%from, sender = %short(&env.header.sender), round, reason = %e, "contribution refused");
                }
                self.sink.emit(&NodeEvent::Refused {
                    round,
                    from: from.to_string(),
                    reason: e.to_string(),
                });
            }
        }
    }

    async fn on_event(
        &mut self,
        ev: NetEvent,
        collected: Option<&mut BTreeMap<[u8; 32], Accepted>>,
    ) {
        match ev {
            NetEvent::ContributionPushed { peer, envelope, .. } => match collected {
                Some(c) => self.consider(envelope, peer, c),
                None => {
                    if envelope.header.round >= self.state.round {
                        self.stash_push(envelope, peer);
                    }
                }
            },
            NetEvent::StatusAnnounced { peer, status } => {
                self.connected.insert(peer);
                self.note_status(peer, status);
            }
            NetEvent::PeerConnected(peer) => {
                self.connected.insert(peer);
                self.net.announce_status(
                    self.signed_status(),
                    [peer],
                    Duration::from_secs(LOOKUP_TIMEOUT_SECS),
                );
            }
            NetEvent::PeerDisconnected(peer) => {
                self.connected.remove(&peer);
                self.statuses.remove(&peer);
            }
        }
    }

    /// Fetches `sender`'s contribution for the current round from `peer` (the one whose
    /// [`SignedEnvelope::digest`] is `digest`, when given).
    async fn fetch_contribution(
        &mut self,
        peer: PeerId,
        sender: [u8; 32],
        digest: Option<Hash32>,
        collected: &mut BTreeMap<[u8; 32], Accepted>,
    ) {
        let round = self.state.round;
        let r = tokio::time::timeout(
            Duration::from_secs(LOOKUP_TIMEOUT_SECS * 4),
            self.net
                .request(peer, Request::GetContribution { round, sender }),
        )
        .await;
        if let Ok(Ok(Response::Contribution(Some(env)))) = r {
            if env.header.sender != sender
                || env.header.round != round
                || digest.is_some_and(|d| d != env.digest())
            {
                warn!(%peer, "peer answered with a different contribution than asked for");
                return;
            }
            self.consider(env, peer, collected);
        }
    }

    /// Runs up to `steps` inner steps on a blocking thread, stopping at a step boundary when the
    /// window closes, `budget` runs out, or the node shuts down. Emits a `yielded` event when
    /// the window closed.
    async fn train(&mut self, steps: u32, budget: Option<Duration>) -> anyhow::Result<Trained> {
        let r = self.state.round;
        let mut compute = self.compute.take().context("trainer state missing")?;
        let stop = self.stop.clone();
        let avail = self.avail.clone();
        self.sink.emit(&NodeEvent::Training { round: r, steps });
        let t0 = Instant::now();
        let (compute, report, stopped_at) = tokio::task::spawn_blocking(move || {
            let c = &mut compute;
            c.trainer.wake();
            let rep = c
                .trainer
                .train(&c.corpus, &c.shard, &mut c.rng, steps, &|| {
                    stop.load(Ordering::SeqCst)
                        || !avail.load(Ordering::SeqCst)
                        || budget.is_some_and(|b| t0.elapsed() >= b)
                });
            (compute, rep, (Instant::now(), SystemTime::now()))
        })
        .await?;
        self.compute = Some(compute);
        if report.yielded && !self.available() && !self.shutting_down() {
            let closing = self.closing.lock().map(|c| *c).unwrap_or_default();
            let latency = match (closing.scheduled, closing.seen) {
                (Some(at), _) => stopped_at.1.duration_since(at).unwrap_or_default(),
                (None, Some(seen)) => stopped_at.0.saturating_duration_since(seen),
                (None, None) => Duration::ZERO,
            };
            let reason = self
                .availability()
                .map_or_else(|| "busy".into(), |a| a.reason);
            info!(
                round = r,
                steps = report.steps,
                latency_ms = latency.as_secs_f64() * 1e3,
                "yielded at a step boundary"
            );
            self.sink.emit(&NodeEvent::Yielded {
                round: r,
                steps: report.steps,
                tokens: report.tokens,
                latency_ms: latency.as_secs_f64() * 1e3,
                reason,
            });
        } else if report.yielded && budget.is_some() && !self.shutting_down() {
            info!(
                round = r,
                steps = report.steps,
                "round time budget reached; sending a smaller contribution"
            );
        }
        if report.steps == 0 {
            return Ok(Trained::Nothing);
        }
        Ok(Trained::Report(report))
    }

    /// Our training of round `r` produced a non-finite parameter (at `index`): send nothing, put
    /// the trainer back at θ(r) with a fresh inner optimizer, and go on (the round loop may
    /// retry the round for the time it has left). Several rounds in a row stop the node.
    async fn diverged(&mut self, r: u64, index: usize) -> anyhow::Result<Outcome> {
        self.diverged_in_a_row += 1;
        let in_a_row = self.diverged_in_a_row;
        self.sink.emit(&NodeEvent::Diverged {
            round: r,
            index: index as u64,
            in_a_row,
        });
        if in_a_row >= MAX_DIVERGED_IN_A_ROW {
            bail!(
                "local training went non-finite in {in_a_row} rounds in a row (round {r}, \
                 parameter {index}): the swarm's settings (its inner learning rate?) make \
                 training diverge on this machine; the last checkpoint, θ({r}), is unchanged"
            );
        }
        warn!(
            round = r,
            index,
            in_a_row,
            "local training went non-finite; dropping this round's work and restarting from θ"
        );
        let params = self.state.params.clone();
        if let Some(mut c) = self.compute.take() {
            let (c, reset) = tokio::task::spawn_blocking(move || {
                let reset = c.trainer.reset(&params);
                (c, reset)
            })
            .await?;
            self.compute = Some(c);
            reset.context("θ does not fit the model")?;
        }
        self.announce(Phase::Ready).await;
        Ok(Outcome::Diverged)
    }

    async fn one_round(&mut self) -> anyhow::Result<Outcome> {
        let r = self.state.round;
        let t_round = Instant::now();
        let traffic0 = self.net.traffic.snapshot();
        let status0 = self.net.traffic.status_sent();
        self.holding.clear();
        self.announce(Phase::Training).await;
        let t = self.manifest.manifest.training.clone();
        self.refresh_peer_windows();

        // Inner phase, on a blocking thread: until H steps, the time budget, the window closing
        // or shutdown, whichever comes first.
        let budget = self.budget_override.take().or_else(|| self.train_budget());
        let report = match self.train(t.inner_steps, budget).await? {
            Trained::Nothing if self.shutting_down() => return Ok(Outcome::Shutdown),
            Trained::Nothing => return Ok(Outcome::Yielded),
            Trained::Report(r) => r,
        };
        let train_secs = t_round.elapsed().as_secs_f64();
        if self.shutting_down() {
            return Ok(Outcome::Shutdown);
        }
        let yielded = report.yielded && !self.available();
        if !yielded {
            // Throughput of a full-speed stretch (a yield cuts a step short of nothing, but the
            // partial stretch is also measured fairly; keep the newest).
            self.tokens_per_sec = Some(report.tokens as f64 / train_secs.max(1e-9));
        } else if budget.is_some() {
            debug!("stopped by the window, not the budget");
        }

        // Pseudo-gradient, error feedback, encoding and signing.
        let t_enc = Instant::now();
        let theta_i = self
            .compute
            .as_ref()
            .map(|c| c.trainer.params())
            .unwrap_or_default();
        let base = self.state.params.clone();
        let codec = t.codec;
        let mut ef = std::mem::take(&mut self.ef);
        let shapes = Arc::clone(&self.shapes);
        let (encoded, ef) = tokio::task::spawn_blocking(move || {
            let r = accept::encode_delta(&base, &theta_i, codec, &shapes, &mut ef);
            (r, ef)
        })
        .await?;
        self.ef = ef;
        if yielded {
            // The owner wants the machine: free the device before waiting for the others.
            if let Some(mut c) = self.compute.take() {
                self.compute = Some(
                    tokio::task::spawn_blocking(move || {
                        c.trainer.suspend();
                        c
                    })
                    .await?,
                );
            }
        }
        let (enc, sent) = match encoded {
            Ok(e) => e,
            Err(delta::DeltaError::NonFinite(index)) => return self.diverged(r, index).await,
            Err(e) => return Err(e).context("our own delta cannot be encoded"),
        };
        let wire_delta_bytes = enc.body.len() as u64;
        // The round's plan as this node sees it: the trainers working on it, itself included.
        let expected = 1 + self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| {
                s.round == r
                    && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
            })
            .count() as u32;
        let expected = expected.min(MAX_EXPECTED);
        let contribution = Contribution {
            tokens: report.tokens,
            inner_steps: report.steps,
            train_loss: report.mean_loss,
            delta: enc,
            expected,
        };
        let header = EnvelopeHeader {
            kind: PayloadKind::Contribution,
            swarm_id: self.swarm_id,
            round: r,
            sender: self.me,
            base_hash: self.hash,
        };
        let env = SignedEnvelope::sign(&self.key, header, wire::encode(&contribution));
        let encode_secs = t_enc.elapsed().as_secs_f64();

        let mut collected: BTreeMap<[u8; 32], Accepted> = BTreeMap::new();
        collected.insert(
            self.me,
            Accepted {
                sender: self.me,
                digest: env.digest(),
                tokens: report.tokens,
                train_loss: report.mean_loss,
                delta: sent,
                expected,
            },
        );
        if let Ok(mut s) = self.net.served.write() {
            s.contributions.insert((r, self.me), Arc::new(env.clone()));
        }
        self.holding = vec![self.me];
        self.announce(Phase::Collecting).await;

        // Push to every peer, concurrently with collecting.
        let t_push = Instant::now();
        for ev in self.drain_events_now() {
            self.on_event(ev, Some(&mut collected)).await;
        }
        let peers: Vec<PeerId> = self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| s.phase != Phase::Paused)
            .map(|(p, _)| *p)
            .collect();
        let push = {
            let net = self.net.clone();
            let env = env.clone();
            tokio::spawn(async move {
                let sends = peers.into_iter().map(|p| {
                    let net = net.clone();
                    let env = env.clone();
                    async move { net.request(p, Request::Push(env)).await }
                });
                futures::future::join_all(sends).await;
                t_push.elapsed()
            })
        };
        for env in std::mem::take(&mut self.stash) {
            let from = net::peer_id_of(&env.header.sender).unwrap_or(self.net.local_peer);
            self.consider(env, from, &mut collected);
        }

        // Collect until every live peer's contribution is in, or the deadline.
        let deadline_secs = (t.round_deadline_secs as f64).max(1.5 * train_secs);
        let deadline = Instant::now() + Duration::from_secs_f64(deadline_secs);
        let mut tick = tokio::time::interval(Duration::from_millis(COLLECT_TICK_MS));
        let mut shutdown = self.shutdown.clone();
        let mut confirmed = false;
        loop {
            let have: HashSet<PeerId> = collected.keys().filter_map(net::peer_id_of).collect();
            let trainers = self.trainer_peers();
            // Only an attested state further on ends the round early: a mere claim of a later
            // round, which anyone can make, does not.
            if self
                .claims()
                .iter()
                .any(|c| c.round > r + 1 && self.recipe.attested(c))
            {
                info!(round = r, "the swarm has moved on (attested); catching up");
                return Ok(Outcome::Behind);
            }
            let missing: Vec<PeerId> = trainers
                .iter()
                .filter(|(p, s)| {
                    s.round == r
                        && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
                        && !have.contains(p)
                })
                .map(|(p, _)| *p)
                .collect();
            if missing.is_empty() {
                if confirmed {
                    break;
                }
                // Before closing, ask the peers once more: one that resumed or joined the round
                // a moment ago would otherwise be left out, and the state that counts its work
                // preferred over ours later (a fork, repaired but a fork).
                self.refresh_statuses().await;
                confirmed = true;
                continue;
            }
            if Instant::now() >= deadline {
                warn!(
                    round = r,
                    missing = missing.len(),
                    "round deadline passed; going on without them"
                );
                break;
            }
            tokio::select! {
                ev = self.events.recv() => match ev {
                    Some(ev) => self.on_event(ev, Some(&mut collected)).await,
                    None => bail!("network task stopped"),
                },
                _ = tick.tick() => {
                    // Fetch what peers hold and we lack: at once when its sender cannot push to
                    // us (not connected), else only after giving the push time to arrive.
                    let patient = t_push.elapsed() > Duration::from_secs(PUSH_GRACE_SECS);
                    let wanted: Vec<(PeerId, [u8; 32])> = self.trainer_peers().iter()
                        .filter(|(_, s)| s.round == r)
                        .flat_map(|(p, s)| s.holding.iter().map(move |k| (*p, *k)))
                        .collect();
                    for (p, k) in wanted {
                        let direct = net::peer_id_of(&k).is_some_and(|id| self.connected.contains(&id));
                        if !collected.contains_key(&k) && (patient || !direct) {
                            self.fetch_contribution(p, k, None, &mut collected).await;
                        }
                    }
                }
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        return Ok(Outcome::Shutdown);
                    }
                }
            }
        }
        let collect_secs = t_enc.elapsed().as_secs_f64() - encode_secs;

        // Reconcile with what the peers hold or used, so that every node averages the same set.
        // Bounded: a peer listing senders that do not exist costs one look-up each, at most
        // MAX_RECONCILE_FETCHES in all, within RECONCILE_SECS.
        self.refresh_statuses().await;
        let members = self.recipe.allowlist.clone();
        // What each peer holds for this round (any of a sender's contributions), or the very
        // contributions that formed its next state.
        let mut wanted: Vec<(PeerId, [u8; 32], Option<Hash32>)> = self
            .trainer_peers()
            .iter()
            .flat_map(|(p, s)| {
                let listed: Vec<([u8; 32], Option<Hash32>)> = if s.round == r {
                    s.holding.iter().map(|k| (*k, None)).collect()
                } else if s.round == r + 1 {
                    s.formed_by
                        .iter()
                        .map(|id| (id.sender, Some(id.digest)))
                        .collect()
                } else {
                    vec![]
                };
                listed
                    .into_iter()
                    .filter(|(k, _)| !collected.contains_key(k))
                    .filter(|(k, _)| members.as_ref().is_none_or(|m| m.contains(k)))
                    .map(|(k, d)| (*p, k, d))
                    .collect::<Vec<_>>()
            })
            .collect();
        wanted.truncate(MAX_RECONCILE_FETCHES + members.as_ref().map_or(0, Vec::len));
        let reconcile_until = Instant::now() + Duration::from_secs(RECONCILE_SECS);
        for (p, k, digest) in wanted {
            if Instant::now() >= reconcile_until {
                warn!(
                    round = r,
                    "reconciling took too long; going on with what we hold"
                );
                break;
            }
            if !collected.contains_key(&k) {
                self.fetch_contribution(p, k, digest, &mut collected).await;
            }
        }

        // Outer step: the swarm's aggregator and Nesterov step, the same function a replay runs.
        let base = Arc::new(std::mem::replace(
            &mut self.state,
            StateSnapshot {
                round: r,
                params: vec![],
                momentum: vec![],
                formed_by: vec![],
                noise: None,
            },
        ));
        let base_hash = self.hash;
        let recipe = self.recipe.clone();
        let round_set = std::mem::take(&mut collected);
        let (applied, collected, base) = {
            let base = base.clone();
            tokio::task::spawn_blocking(move || {
                let applied = recipe.apply(&base, &round_set);
                (applied, round_set, base)
            })
            .await?
        };
        let step = match applied {
            Some((next, step)) => {
                self.state = next;
                Some(step)
            }
            None => None,
        };
        let Some(step) = step else {
            self.state = Arc::unwrap_or_clone(base);
            bail!("nothing to average");
        };
        if step.scale < 1.0 {
            info!(
                round = r,
                arrived = collected.len(),
                planned = step.planned,
                scale = step.scale,
                "short round: smaller step"
            );
        }
        self.prev = Some((base, base_hash));
        let state = self.state.clone();
        let (hash, compute, val_loss) = {
            let mut compute = self.compute.take().context("trainer state missing")?;
            tokio::task::spawn_blocking(move || {
                let h = state.hash();
                let loaded = compute.trainer.load_params(&state.params);
                // A suspended trainer keeps the device free: no evaluation then.
                let v = if loaded.is_ok() && !compute.trainer.is_suspended() {
                    compute.val_loss()
                } else {
                    f32::NAN
                };
                (h, compute, v)
            })
            .await?
        };
        self.compute = Some(compute);
        self.hash = hash;
        self.checkpoint().await;
        if let Ok(mut s) = self.net.served.write() {
            s.contributions.retain(|(round, _), _| *round >= r);
        }
        self.holding.clear();
        self.announce(Phase::Ready).await;

        let transfer_secs = match tokio::time::timeout(Duration::from_secs(1), push).await {
            Ok(Ok(d)) => d.as_secs_f64(),
            _ => t_push.elapsed().as_secs_f64(),
        };
        let traffic1 = self.net.traffic.snapshot();
        let rec = RoundRecord {
            round: r + 1,
            state_hash: self.hash.to_hex(),
            val_loss,
            train_loss: report.mean_loss,
            contributors: collected.len(),
            planned: step.planned,
            step_scale: step.scale,
            noise_ratio: step.noise,
            weights: collected
                .values()
                .map(|a| (short(&a.sender), a.tokens))
                .collect(),
            tokens: report.tokens,
            tokens_per_sec: report.tokens as f64 / train_secs.max(1e-9),
            inner_steps: report.steps,
            bytes_sent: traffic1.0 - traffic0.0,
            bytes_received: traffic1.1 - traffic0.1,
            status_bytes_sent: self.net.traffic.status_sent() - status0,
            dense_delta_bytes: delta::dense_bytes(self.num_params) as u64,
            wire_delta_bytes,
            codec: codec.to_string(),
            train_secs,
            encode_secs,
            transfer_secs,
            wait_secs: (collect_secs - transfer_secs).max(0.0),
            round_secs: t_round.elapsed().as_secs_f64(),
        };
        info!(round = r + 1, val_loss, contributors = collected.len(), hash = %self.hash.short(), secs = rec.round_secs, "round completed");
        self.sink.emit(&NodeEvent::RoundCompleted(rec));
        Ok(Outcome::Completed)
    }
}
