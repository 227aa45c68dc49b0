//! The trainer: the driver that runs a node's [`RoundMachine`] over libp2p, sled and burn.
//!
//! The round's rules — align, train, collect, reconcile, step — live in [`crate::machine`], a
//! pure state machine; this driver feeds it what happens (network events, the answers of its
//! requests, training finished, the idle window, a 300 ms tick, Ctrl-C) and carries out what it
//! asks: network outputs through [`io::NetIo`] (shared with the bootstrap node), inner steps on a
//! blocking thread (`trainer.rs`), new states checkpointed to sled, loaded and evaluated, and
//! the events, window records and control status a user sees.
//!
//! Idle windows: the node trains only while its idle monitor says the machine is idle. When the
//! window closes, training stops at the next inner-step boundary; the steps done so far go out
//! as a partial contribution (weighted by its tokens), the model and AdamW state leave the
//! device, and the node announces [`Phase::Paused`] until the machine is idle again. Each node
//! advertises a signed window record in Kademlia; the measured speeds there set a time budget
//! per round, so a slow node sends a smaller contribution rather than stall the others.
//!
//! # Layout
//! This file holds the driver's state (`Driver`), its start and its loop; `io` the network
//! side, `trainer` training and new states, `windows` the idle window's record, pause and
//! resume, `sync` checkpoints and state downloads; `verify` re-exports the machine's rules.

pub use crate::machine::accept;
mod feed;
pub mod io;
mod sync;
mod trainer;
pub mod verify;
mod windows;

pub use sync::{checkpoint_and_serve, previous_checkpoint};

use windows::{device_info, spawn_availability_watch};

use anyhow::{Context, bail};
use burn::tensor::backend::AutodiffBackend;
use ed25519_dalek::SigningKey;
use libp2p::Multiaddr;
use nightshift_model::{Corpus, Gpt, InnerConfig, InnerTrainer, eval};
use nightshift_protocol::message::Phase;
use nightshift_protocol::{Hash32, NodeRole, SignedManifest, WindowState};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::events::{EventSink, NodeEvent};
use crate::idle::Availability;
use crate::machine::{self, Input, Output, RoundMachine};
use crate::net::{self, NetEvent, Served, StatusCheck};
use crate::store::Store;
use io::NetIo;
use verify::Recipe;

/// How long a finished node keeps serving before it leaves, at least; and at most, while peers
/// are still finishing its round ([`RoundMachine::peers_finishing`]).
const LINGER_SECS: u64 = 2;
const LINGER_MAX_SECS: u64 = 15;
/// How often the machine's deadlines are re-checked.
const TICK_MS: u64 = 300;

/// How to run a trainer.
pub struct TrainerOptions {
    pub data_dir: PathBuf,
    pub listen: Multiaddr,
    pub bootstrap: Vec<Multiaddr>,
    pub manifest: SignedManifest,
    pub key: SigningKey,
    /// The swarm's data file or directory; `None`: where the manifest says (or embedded).
    pub data_path: Option<PathBuf>,
    /// The swarm's `tokenizer.json`; `None`: where the manifest says.
    pub tokenizer_path: Option<PathBuf>,
    /// Stop once the node holds θ(rounds).
    pub rounds: Option<u64>,
    pub events: Option<PathBuf>,
    /// (index, count): train only on the dataset's shards numbered INDEX mod COUNT; `None`: on
    /// all of them (a new one each round).
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
    /// Train the next round while the last one's contributions travel (see
    /// [`machine::Config::overlap`]).
    pub overlap: bool,
    /// Prometheus metrics to keep up to date (`run --http`).
    pub metrics: Option<Arc<crate::metrics::NodeMetrics>>,
    /// Where the dashboard reads the node's events (`run --http`).
    pub feed: Option<Arc<crate::events::EventFeed>>,
    /// Set to what the node serves its peers once its network is up: the control endpoint's
    /// `snapshot` reads the current state there.
    pub served: Option<crate::control::ServedSource>,
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
    feed: feed::Feed,
    rng: ChaCha8Rng,
    val: Arc<Vec<(Vec<i32>, Vec<i32>)>>,
}

impl<B: AutodiffBackend> Compute<B> {
    fn val_loss(&mut self) -> f32 {
        eval::val_loss(&self.trainer.eval_model(), &self.val)
    }
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

struct Driver<B: AutodiffBackend> {
    m: RoundMachine,
    io: NetIo,
    events: mpsc::Receiver<NetEvent>,
    /// Answers of the network requests under way. Unbounded, yet bounded by what we asked: only
    /// our own request tasks, window look-ups and the idle watch send here (peers' messages come
    /// through the network task's bounded channel), and the machine bounds its requests.
    answers: mpsc::UnboundedReceiver<Input>,
    /// Training finished on its thread: the trainer comes back with what it produced.
    trained_tx: mpsc::UnboundedSender<trainer::TrainDone<B>>,
    trained_rx: mpsc::UnboundedReceiver<trainer::TrainDone<B>>,
    sink: EventSink,
    store: Store,
    manifest: SignedManifest,
    swarm_id: Hash32,
    key: ed25519_dalek::SigningKey,
    /// The trainer; `None` while it trains on its thread.
    compute: Option<Compute<B>>,
    /// The state whose θ the trainer holds.
    loaded: Hash32,
    /// The phase last announced.
    phase: Phase,
    stop: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
    num_params: usize,
    // Idle windows.
    idle: Option<watch::Receiver<Availability>>,
    avail: Arc<AtomicBool>,
    closing: Arc<Mutex<Closing>>,
    device: DeviceInfo,
    /// Our measured inner-loop throughput (tokens/s), once a round has run.
    tokens_per_sec: Option<f64>,
    /// The last window record published: its state, when, and the speed it carried.
    window_published: Option<(WindowState, Instant, f32)>,
    /// The peers' advertised windows as last looked up (for `/status` and the dashboard).
    peer_windows: windows::PeerWindows,
    control_info: Option<Arc<RwLock<serde_json::Value>>>,
    /// The round under way, for its record.
    round: Option<trainer::RoundClock>,
    /// Steps run ahead for the next round (overlap): its record starts when this one's ends.
    ahead: bool,
    /// A copy of the model for validation while the trainer trains ahead; its results come back
    /// on `eval_rx`.
    evaluator: Option<Gpt<B::InnerBackend>>,
    eval_tx: mpsc::Sender<trainer::Evaluated<B>>,
    eval_rx: mpsc::Receiver<trainer::Evaluated<B>>,
    evals_pending: usize,
    val: Arc<Vec<(Vec<i32>, Vec<i32>)>>,
    /// Since when the node is paused.
    paused_since: Option<Instant>,
    /// Since when the node is verifying a better state.
    syncing_since: Option<Instant>,
}

fn short(k: &[u8; 32]) -> String {
    hex::encode(&k[..6])
}

/// The peer id of `key`, for events and logs.
fn peer_name(key: &[u8; 32]) -> String {
    net::peer_id_of(key).map_or_else(|| short(key), |p| p.to_string())
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
        let (dataset, tok) = nightshift_genesis::load_data(
            &m.training.data,
            &m.model.vocab,
            m.model.vocab_size,
            opts.data_path.as_deref(),
            opts.tokenizer_path.as_deref(),
        )?;
        let cfg = nightshift_genesis::model_config(&m.model);
        let val_text = dataset
            .val_text(nightshift_genesis::data::VAL_MAX_BYTES)
            .context("cannot read the dataset's validation part")?;
        let corpus = Corpus::from_parts(vec![], tok.encode(&val_text)?);
        if corpus.val_len() <= cfg.seq_len {
            bail!("the dataset's validation part is shorter than one window");
        }
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
        let genesis = nightshift_genesis::genesis_state(m);
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
        let feed = feed::Feed::new(
            dataset,
            tok,
            cfg.seq_len,
            me,
            opts.shard,
            m.training.data.shards_per_round,
        )?;
        info!(
            shards = feed.shard_count(),
            drawn_from = feed.allowed_count(),
            per_round = m.training.data.shards_per_round,
            "training data: new shards every round"
        );
        let mut compute = Compute {
            trainer,
            feed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            val,
        };

        // Network.
        let mut served = Served::new(Some(manifest.clone()));
        let genesis_bytes = net::encode_state(&genesis);
        served.set_genesis(genesis.hash(), genesis_bytes);
        served.set_state(hash, net::encode_state(&state));
        // Our slices of a round we contributed to before a restart: the round's reducers may
        // still need them.
        let own: Vec<Arc<nightshift_protocol::slices::Slice>> =
            store.own_slices()?.into_iter().map(Arc::new).collect();
        served.add_slices(&own);
        let served = net::ServedHandle::new(served);
        if let Some(out) = &opts.served {
            _ = out.set(served.clone());
        }
        let max_frame = 2 * nightshift_protocol::delta::dense_bytes(num_params) * 2 + (1 << 20);
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
                relay_server: false,
                metrics: opts.metrics.as_ref().map(|m| m.libp2p()),
            },
            served,
        )?;
        let sink = EventSink::open(opts.events.as_deref())
            .context("cannot open the events file")?
            .with_metrics(opts.metrics.clone())
            .with_feed(opts.feed.clone());
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
        let reach = net.reach.clone();
        info!(swarm = %swarm_id.short(), peer = %net.local_peer, round = state.round, params = num_params, resumed, "trainer started");
        let val_loss = compute.val_loss();
        let evaluator = opts.overlap.then(|| compute.trainer.eval_model());
        let val = compute.val.clone();
        sink.emit(&NodeEvent::Started {
            peer_id: net.local_peer.to_string(),
            round: state.round,
            state_hash: hash.to_hex(),
            num_params,
            val_loss,
            resumed,
        });
        let shapes = Arc::new(compute.trainer.param_shapes().to_vec());
        let recipe = Arc::new(Recipe::new(&manifest, shapes));
        let t = &m.training;
        let machine_cfg = machine::Config {
            key: opts.key.clone(),
            recipe,
            inner_steps: t.inner_steps,
            round_deadline_ms: u64::from(t.round_deadline_secs) * 1000,
            round_tokens: f64::from(t.inner_steps)
                * f64::from(t.batch_size)
                * f64::from(m.model.seq_len),
            min_peers: opts.min_peers,
            rounds: opts.rounds,
            role: NodeRole::Trainer,
            overlap: opts.overlap,
            timed_params: None,
        };
        let mut rm = RoundMachine::new(machine_cfg, state).with_own_slices(own);
        if let Some(p) = prev {
            rm = rm.with_prev(p);
        }
        let (answers_tx, answers) = mpsc::unbounded_channel();
        let (trained_tx, trained_rx) = mpsc::unbounded_channel();
        // One copy of the model evaluates at a time: at most one result is ever waiting.
        let (eval_tx, eval_rx) = mpsc::channel(1);
        if let Some(rx) = opts.idle.clone() {
            spawn_availability_watch(rx, avail.clone(), closing.clone(), answers_tx.clone());
        }
        let io = NetIo::new(
            net,
            opts.key.clone(),
            status_check,
            store.clone(),
            num_params,
            answers_tx,
        );
        let driver = Driver {
            m: rm,
            io,
            events,
            answers,
            trained_tx,
            trained_rx,
            sink,
            store,
            manifest,
            swarm_id,
            key: opts.key,
            compute: Some(compute),
            loaded: hash,
            phase: Phase::Ready,
            stop,
            shutdown: opts.shutdown,
            num_params,
            idle: opts.idle,
            avail,
            closing,
            device: device_info::<B>(),
            tokens_per_sec: None,
            window_published: None,
            peer_windows: Default::default(),
            control_info: opts.control_info.inspect(|info| {
                net::show_reachability(reach.clone(), info.clone());
            }),
            round: None,
            ahead: false,
            evaluator,
            eval_tx,
            eval_rx,
            evals_pending: 0,
            val,
            paused_since: None,
            syncing_since: None,
        };
        driver.run().await
    }

    fn shutting_down(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    async fn run(mut self) -> anyhow::Result<()> {
        let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut shutdown = self.shutdown.clone();
        // Later changes of the window come through `answers` (`spawn_availability_watch`).
        let open = self.available();
        let mut reason = self.feed(Input::Window(open)).await?;
        if reason.is_none() {
            reason = self.feed(Input::Start).await?;
        }
        let reason = loop {
            if let Some(r) = reason {
                break r;
            }
            let input = tokio::select! {
                ev = self.events.recv() => match ev {
                    Some(ev) => {
                        let inputs = self.io.inputs_of(ev);
                        for i in inputs {
                            reason = self.feed(i).await?;
                            if reason.is_some() {
                                break;
                            }
                        }
                        continue;
                    }
                    None => bail!("the network task stopped"),
                },
                Some(i) = self.answers.recv() => i,
                Some(done) = self.trained_rx.recv() => self.on_trained(done),
                Some(e) = self.eval_rx.recv() => {
                    self.evaluated(e);
                    continue;
                }
                _ = tick.tick() => {
                    self.on_tick().await;
                    Input::Tick
                }
                r = shutdown.changed() => {
                    if r.is_err() || *shutdown.borrow() {
                        Input::Shutdown
                    } else {
                        continue;
                    }
                }
            };
            reason = self.feed(input).await?;
        };
        self.finish_evaluations().await;
        self.sink.emit(&NodeEvent::Stopped {
            round: self.m.round(),
            state_hash: self.m.hash().to_hex(),
            reason: reason.into(),
        });
        info!(round = self.m.round(), reason, "trainer stopping");
        // Keep serving a moment so that peers finishing the same round can fetch from us; after
        // the last round, until they are done with it (a shutdown leaves at once after the
        // minimum).
        let t0 = Instant::now();
        let wait_for_peers = reason == "finished";
        let mut tick = tokio::time::interval(Duration::from_millis(TICK_MS));
        loop {
            let held = t0.elapsed();
            if held >= Duration::from_secs(LINGER_MAX_SECS)
                || (held >= Duration::from_secs(LINGER_SECS)
                    && !(wait_for_peers && self.m.peers_finishing()))
            {
                break;
            }
            tokio::select! {
                _ = tick.tick() => {}
                ev = self.events.recv() => match ev {
                    // Statuses and connections keep the machine's view of its peers current.
                    Some(ev) => for i in self.io.inputs_of(ev) {
                        if matches!(i, Input::Status { .. } | Input::Connected(_) | Input::Disconnected(_)) {
                            self.feed(i).await?;
                        }
                    },
                    None => break,
                },
            }
        }
        Ok(())
    }

    /// Hands `input` to the machine and carries out what it asks, in order. Returns why the
    /// node leaves, once it does.
    async fn feed(&mut self, input: Input) -> anyhow::Result<Option<&'static str>> {
        let now = net::mono_ms();
        let t0 = Instant::now();
        let trained = matches!(input, Input::Trained(_));
        // Verifying contributions, replaying a round or taking the outer step can take a while
        // on a large model: the network keeps running on the other threads meanwhile.
        let stage = self.m.stage();
        let outputs = tokio::task::block_in_place(|| self.m.handle(now, input));
        if self.m.stage() != stage {
            debug!(
                round = self.m.round(),
                from = stage,
                to = self.m.stage(),
                "stage"
            );
        }
        if trained && let Some(r) = self.round.as_mut() {
            r.encode_secs = t0.elapsed().as_secs_f64();
            r.collect_from = Some(Instant::now());
        }
        for o in outputs {
            let announced = match &o {
                Output::Announce(s, _) => Some(s.phase),
                _ => None,
            };
            let Some(o) = self.io.carry(o) else {
                if let Some(phase) = announced {
                    self.announced(phase).await;
                }
                continue;
            };
            match o {
                Output::Train {
                    round,
                    start,
                    steps,
                    budget_ms,
                    fresh,
                } => self.train(round, start, steps, budget_ms, fresh)?,
                Output::NewState(ns) => self.new_state(ns).await?,
                Output::LookUpSpeeds(keys) => self.look_up_windows(keys),
                Output::Note(note) => self.note(note),
                Output::Finished(reason) => return Ok(Some(reason)),
                Output::Failed(why) => bail!(why),
                // Network outputs were carried out above.
                _ => {}
            }
        }
        Ok(None)
    }
}
