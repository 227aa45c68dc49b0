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
//!
//! # Layout
//! This file holds the trainer's state ([`Driver`]), its start and its loop; each phase of a
//! round lives beside it: `align` (move to a verified better state), `train` (the inner steps),
//! `collect` (contributions, verified as they come), `one_round` (a round from start to end:
//! encode, push, collect, reconcile, step, checkpoint); `accept` and `verify` hold the pure
//! rules, `sync` state downloads, `windows` the idle window's record and budget.

pub use crate::machine::accept;
mod align;
mod collect;
mod one_round;
mod sync;
mod train;
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
        let prev = if resumed {
            sync::previous_checkpoint(&store, &state)?
        } else {
            None
        };
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
        let served = net::ServedHandle::new(served);
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
            prev,
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
        let mut trained = false;
        let mut stalls = 0;
        let reason = loop {
            if self.shutting_down() || !ready {
                break "shutdown";
            }
            if self.done() {
                if trained {
                    // No next round's align will repair a fork of the last round: look once
                    // more before leaving (a peer that counted more contributions wins, as
                    // in every round, and only once its state replays).
                    self.align().await;
                }
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
            // A better state our peers hold did not verify yet (a lost fetch), and nobody is left
            // on ours: a round trained alone counts for nobody, so try again first, a few times.
            if stalls < crate::machine::MAX_STALLS && self.better_unverified() {
                stalls += 1;
                info!(
                    round = self.state.round,
                    times = stalls,
                    "a better state did not verify yet; trying again before training alone"
                );
                let until = Instant::now() + Duration::from_secs(verify::RETRY_SECS);
                while Instant::now() < until && !self.shutting_down() {
                    self.next_event_within(Duration::from_millis(200)).await;
                }
                continue;
            }
            stalls = 0;
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
                    trained = true;
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
        self.net.served.update(|s| s.status = Some(env));
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
}
