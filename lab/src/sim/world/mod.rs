//! The simulated world: N round machines, a virtual clock, an in-memory network with per-link
//! latency, per-node bandwidth and loss, a stand-in trainer, and a crash schedule. Everything is
//! drawn from one seed and events run in (time, sequence) order, so a seed replays bit for bit.

use ed25519_dalek::SigningKey;
use nightshift_node::machine::{
    Config, How, Input, Key, Millis, Output, Reduced, RoundMachine, Start, Trained,
};
use nightshift_protocol::slices::Slice;
use nightshift_protocol::{
    ContributionId, Hash32, SignedEnvelope, StateSnapshot, Status, StatusLists, wire,
};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::sync::Arc;

use super::SimArgs;

mod net;
mod outputs;
mod progress;
use super::trainer::Model;
use progress::Progress;

/// Bytes a signed envelope adds to its payload (header, signature, framing).
const ENVELOPE_BYTES: u64 = 180;
/// Bytes of a request (a status or contribution look-up).
const REQUEST_BYTES: u64 = 64;
/// How long a lost request takes to fail (libp2p's request time-out).
const REQUEST_TIMEOUT_MS: Millis = 10_000;
/// How often each machine's timers are checked.
const TICK_MS: Millis = 300;

/// What one node's machine saw of one round.
#[derive(Clone, Debug, Default)]
pub struct Held {
    /// The first and the last hash it held for θ(r), and when it first held θ(r).
    pub first: Option<Hash32>,
    pub last: Option<Hash32>,
    pub at: Millis,
    /// It left its θ(r) behind: the state it ended with does not descend from it (it later took
    /// a state further on by attestation, built on another θ(r) that the swarm's rules vouched
    /// for).
    pub skipped: bool,
}

struct Node {
    key: Key,
    /// A bootstrap: follows and attests, never trains (not counted in the round tallies).
    bootstrap: bool,
    secret: [u8; 32],
    machine: Option<RoundMachine>,
    /// Bumped on every crash: events for an earlier life are dropped.
    epoch: u32,
    neighbours: Vec<usize>,
    up_free: f64,
    down_free: f64,
    /// Milliseconds per inner step.
    step_ms: f64,
    /// Tokens per second of its last training (what its window record says).
    speed: Option<f64>,
    served_status: Option<(Status, Arc<StatusLists>)>,
    served: BTreeMap<(u64, Key), Arc<SignedEnvelope>>,
    /// Slices served (round, sender, index) and reduced slices (round, index).
    slices: BTreeMap<(u64, ContributionId, u32), Arc<Slice>>,
    reduced: BTreeMap<(u64, u32), Arc<Reduced>>,
    /// The last checkpoint (what a restart resumes from) and its hash.
    checkpoint: Arc<StateSnapshot>,
    checkpoint_hash: Hash32,
    /// The checkpoint before it (kept on disk, as sled keeps the last few).
    previous: Option<Arc<StateSnapshot>>,
    rng: ChaCha8Rng,
    finished: bool,
    /// Bytes sent and received while holding θ(r), by r.
    up: BTreeMap<u64, u64>,
    /// The part of `up` that was statuses (announcements, look-ups and their answers).
    up_status: BTreeMap<u64, u64>,
    down: BTreeMap<u64, u64>,
    /// Per round r: the hashes it held for θ(r).
    held: BTreeMap<u64, Held>,
}

enum Ev {
    Deliver {
        to: usize,
        epoch: u32,
        input: Input,
    },
    Request {
        to: usize,
        from: usize,
        epoch: u32,
        req: Req,
    },
    Tick {
        node: usize,
        epoch: u32,
    },
    Crash {
        node: usize,
    },
    Restart {
        node: usize,
    },
    /// The node's contribution of the round it just trained is lost (`--drop`).
    Lose {
        node: usize,
        epoch: u32,
    },
    /// A node whose contribution of `round` was lost comes back once its live peers have
    /// closed that round.
    Rejoin {
        node: usize,
        round: u64,
    },
}

enum Req {
    Status,
    /// A status with the lists it commits to.
    Lists,
    Contribution {
        round: u64,
        sender: Key,
    },
    Slice {
        round: u64,
        id: ContributionId,
        index: u32,
    },
    Reduced {
        round: u64,
        index: u32,
    },
    State {
        round: u64,
        hash: Hash32,
    },
}

pub struct World {
    pub now: Millis,
    nodes: Vec<Node>,
    index: HashMap<Key, usize>,
    queue: BinaryHeap<Reverse<(Millis, u64, usize)>>,
    events: Vec<Option<Ev>>,
    free: Vec<usize>,
    seq: u64,
    rng: ChaCha8Rng,
    model: Model,
    template: Config,
    /// Validation loss of each state hash seen.
    losses: HashMap<Hash32, f32>,
    args: SimArgs,
    seed: u64,
    /// Inputs handled (a measure of the simulator's work).
    pub inputs: u64,
    pub crashes: u64,
    /// Contributions lost to `--drop`.
    pub dropped: u64,
    /// Draws for `--drop` (a stream of their own, so drops leave the rest of a run unchanged).
    drops: ChaCha8Rng,
    /// Tokens trained, over all nodes.
    pub tokens: u64,
    /// Contributions pushed and their payload bytes, over all nodes.
    pub contributions: u64,
    pub contribution_bytes: u64,
    /// The validation loss of θ(0).
    pub genesis_loss: f32,
    /// States adopted from peers (verified), over all nodes.
    pub synced: u64,
    pub failures: Vec<String>,
    /// The state each state was stepped from (by a round or a replay), by hash.
    parents: HashMap<Hash32, Hash32>,
    /// Messages and bytes sent, by kind, over all nodes and the whole run.
    pub traffic: BTreeMap<&'static str, (u64, u64)>,
    /// Print every note as it happens (NIGHTSHIFT_SIM_DUMP).
    trace: bool,
    /// Also print every output of this node (NIGHTSHIFT_SIM_NODE).
    trace_node: Option<usize>,
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl World {
    pub fn new(
        args: &SimArgs,
        seed: u64,
        template: Config,
        secrets: &[[u8; 32]],
        mut model: Model,
    ) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = args.nodes;
        let genesis = Arc::new(model.genesis());
        let genesis_hash = genesis.hash();
        let genesis_loss = model.val_loss(&genesis.params);
        let mut nodes: Vec<Node> = (0..n)
            .map(|i| {
                let secret = secrets[i];
                let key = SigningKey::from_bytes(&secret);
                // Speeds spread log-uniformly over ±spread.
                let f: f64 = rng.random_range(-1.0..=1.0);
                let step_ms = args.step_ms * (1.0 + args.speed_spread).powf(f);
                Node {
                    key: key.verifying_key().to_bytes(),
                    secret,
                    machine: Some(RoundMachine::new(
                        Config {
                            key,
                            ..template.clone()
                        },
                        (*genesis).clone(),
                    )),
                    epoch: 0,
                    neighbours: vec![],
                    up_free: 0.0,
                    down_free: 0.0,
                    step_ms,
                    speed: None,
                    served_status: None,
                    served: BTreeMap::new(),
                    slices: BTreeMap::new(),
                    reduced: BTreeMap::new(),
                    checkpoint: genesis.clone(),
                    previous: None,
                    checkpoint_hash: genesis_hash,
                    rng: ChaCha8Rng::seed_from_u64(splitmix(seed ^ (i as u64 + 1))),
                    finished: false,
                    bootstrap: false,
                    up: BTreeMap::new(),
                    up_status: BTreeMap::new(),
                    down: BTreeMap::new(),
                    held: BTreeMap::from([(
                        0,
                        Held {
                            first: Some(genesis_hash),
                            last: Some(genesis_hash),
                            at: 0,
                            skipped: false,
                        },
                    )]),
                }
            })
            .collect();
        // Bootstraps, after the trainers: every trainer dials them.
        for secret in &secrets[n..] {
            let key = SigningKey::from_bytes(secret);
            let cfg = Config {
                key: key.clone(),
                rounds: None,
                min_peers: 0,
                role: nightshift_protocol::NodeRole::Bootstrap,
                ..template.clone()
            };
            nodes.push(Node {
                key: key.verifying_key().to_bytes(),
                bootstrap: true,
                secret: *secret,
                machine: Some(RoundMachine::new(cfg, (*genesis).clone())),
                epoch: 0,
                neighbours: (0..n).collect(),
                up_free: 0.0,
                down_free: 0.0,
                step_ms: args.step_ms,
                speed: None,
                served_status: None,
                served: BTreeMap::new(),
                slices: BTreeMap::new(),
                reduced: BTreeMap::new(),
                checkpoint: genesis.clone(),
                checkpoint_hash: genesis_hash,
                previous: None,
                rng: ChaCha8Rng::seed_from_u64(0),
                finished: true,
                up: BTreeMap::new(),
                up_status: BTreeMap::new(),
                down: BTreeMap::new(),
                held: BTreeMap::new(),
            });
        }
        // Links: each node dials `degree` others at random (all of them in a small swarm).
        let mut links = vec![std::collections::BTreeSet::new(); n];
        for i in 0..n {
            if args.degree + 1 >= n {
                links[i].extend((0..n).filter(|j| *j != i));
                continue;
            }
            while links[i].len() < args.degree {
                let j = rng.random_range(0..n);
                if j != i {
                    links[i].insert(j);
                    links[j].insert(i);
                }
            }
        }
        let bootstraps: Vec<usize> = (n..nodes.len()).collect();
        for (node, l) in nodes.iter_mut().zip(links) {
            node.neighbours = l.into_iter().chain(bootstraps.iter().copied()).collect();
        }
        let index = nodes.iter().enumerate().map(|(i, n)| (n.key, i)).collect();
        let mut w = World {
            now: 0,
            nodes,
            index,
            queue: BinaryHeap::new(),
            events: vec![],
            free: vec![],
            seq: 0,
            rng,
            model,
            template,
            losses: HashMap::from([(genesis_hash, genesis_loss)]),
            args: args.clone(),
            seed,
            inputs: 0,
            crashes: 0,
            dropped: 0,
            drops: ChaCha8Rng::seed_from_u64(seed ^ 0xD209),
            tokens: 0,
            contributions: 0,
            contribution_bytes: 0,
            traffic: BTreeMap::new(),
            parents: HashMap::new(),
            genesis_loss,
            synced: 0,
            failures: vec![],
            trace: std::env::var_os("NIGHTSHIFT_SIM_DUMP").is_some(),
            trace_node: std::env::var("NIGHTSHIFT_SIM_NODE")
                .ok()
                .and_then(|v| v.parse().ok()),
        };
        for i in 0..w.nodes.len() {
            w.boot(i);
        }
        let last = (args.crashes_until_secs * 1000.0) as Millis;
        if args.crash_every_secs > 0.0
            && (last == 0 || (args.crash_every_secs * 1000.0) as Millis <= last)
        {
            let at = (args.crash_every_secs * 1000.0) as Millis;
            let node = w.rng.random_range(0..n);
            w.schedule(at, Ev::Crash { node });
        }
        w
    }

    fn schedule(&mut self, at: Millis, ev: Ev) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.events[s] = Some(ev);
                s
            }
            None => {
                self.events.push(Some(ev));
                self.events.len() - 1
            }
        };
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, slot)));
    }

    /// A node starts (or restarts): it connects to its live neighbours and starts its machine.
    fn boot(&mut self, i: usize) {
        let epoch = self.nodes[i].epoch;
        let now = self.now;
        self.deliver_at(now, i, Input::Start);
        for j in self.nodes[i].neighbours.clone() {
            if self.nodes[j].machine.is_some() {
                let lat = self.latency(i, j);
                self.deliver_at(now + lat, i, Input::Connected(self.nodes[j].key));
                let k = self.nodes[i].key;
                self.deliver_at(now + lat, j, Input::Connected(k));
            }
        }
        let phase = splitmix(self.seed ^ i as u64) % TICK_MS;
        self.schedule(now + 1 + phase, Ev::Tick { node: i, epoch });
    }

    fn deliver_at(&mut self, at: Millis, to: usize, input: Input) {
        let epoch = self.nodes[to].epoch;
        self.schedule(at, Ev::Deliver { to, epoch, input });
    }

    /// One-way latency of the link between `a` and `b` (the same both ways).
    fn latency(&self, a: usize, b: usize) -> Millis {
        let (lo, hi) = (a.min(b) as u64, a.max(b) as u64);
        let jitter = if self.args.jitter_ms > 0 {
            splitmix(self.seed ^ (lo << 32) ^ hi) % (self.args.jitter_ms + 1)
        } else {
            0
        };
        self.args.latency_ms + jitter
    }

    fn round_of(&self, i: usize) -> u64 {
        self.nodes[i]
            .machine
            .as_ref()
            .map_or(0, RoundMachine::round)
    }

    /// Runs until every node finished or `until` (virtual) passes.
    pub fn run(&mut self, until: Millis) {
        let mut progress = Progress::new();
        while let Some(Reverse((at, _, slot))) = self.queue.pop() {
            if at > until {
                break;
            }
            progress.tick(self);
            self.now = at;
            let ev = self.events[slot].take();
            self.free.push(slot);
            let Some(ev) = ev else { continue };
            match ev {
                Ev::Deliver { to, epoch, input } => {
                    if self.nodes[to].epoch == epoch {
                        self.handle(to, input);
                    }
                }
                Ev::Request {
                    to,
                    from,
                    epoch,
                    req,
                } => self.answer(to, from, epoch, req),
                Ev::Tick { node, epoch } => {
                    if self.nodes[node].epoch == epoch && self.nodes[node].machine.is_some() {
                        self.handle(node, Input::Tick);
                        if self.nodes[node].machine.is_some()
                            && (!self.nodes[node].finished || self.nodes[node].bootstrap)
                        {
                            self.schedule(self.now + TICK_MS, Ev::Tick { node, epoch });
                        }
                    }
                }
                Ev::Crash { node } => self.crash(node),
                Ev::Restart { node } => self.restart(node),
                Ev::Lose { node, epoch } => {
                    if self.nodes[node].epoch == epoch {
                        self.dropped += 1;
                        let round = self.round_of(node);
                        self.kill(node);
                        self.schedule(self.now + 1, Ev::Rejoin { node, round });
                    }
                }
                Ev::Rejoin { node, round } => {
                    // Back once no live peer is still training, collecting or closing that
                    // round (a peer left alone on it waits for peers: come back then too).
                    let waiting = self.nodes[node].neighbours.iter().any(|&j| {
                        self.nodes[j].machine.as_ref().is_some_and(|m| {
                            m.round() == round
                                && matches!(m.stage(), "training" | "collecting" | "reconciling")
                        })
                    });
                    if waiting {
                        self.schedule(self.now + TICK_MS, Ev::Rejoin { node, round });
                    } else {
                        self.restart(node);
                    }
                }
            }
            if self.nodes.iter().all(|n| n.finished) {
                break;
            }
        }
        self.mark_left_behind();
    }

    /// Marks each node's states that the state it ended with does not descend from (as far as
    /// the chain of parents is known): forks it left by taking an attested state further on.
    fn mark_left_behind(&mut self) {
        for n in &mut self.nodes {
            let mut chain = BTreeMap::new();
            let mut at = Some((n.checkpoint.round, n.checkpoint_hash));
            while let Some((r, h)) = at {
                chain.insert(r, h);
                at = self
                    .parents
                    .get(&h)
                    .and_then(|p| Some((r.checked_sub(1)?, *p)));
            }
            for (r, held) in &mut n.held {
                if let (Some(last), Some(ours)) = (held.last, chain.get(r))
                    && last != *ours
                {
                    held.skipped = true;
                }
            }
        }
    }

    fn crash(&mut self, i: usize) {
        let every = (self.args.crash_every_secs * 1000.0) as Millis;
        let next = self.rng.random_range(0..self.args.nodes);
        let last = (self.args.crashes_until_secs * 1000.0) as Millis;
        if last == 0 || self.now + every <= last {
            self.schedule(self.now + every, Ev::Crash { node: next });
        }
        if self.nodes[i].machine.is_none() || self.nodes[i].finished {
            return;
        }
        self.crashes += 1;
        self.kill(i);
        let down = (self.args.down_secs * 1000.0) as Millis;
        self.schedule(self.now + down, Ev::Restart { node: i });
    }

    /// Node `i` stops as kill -9 stops it (its peers see the connection drop).
    fn kill(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.machine = None;
        n.epoch += 1;
        n.served.clear();
        // A node's own slices are on its disk (they are all the swarm has of them until the
        // round's reducers fetch them); what it gathered for others is not.
        let own = n.key;
        n.slices.retain(|(_, id, _), _| id.sender == own);
        n.reduced.clear();
        n.served_status = None;
        let key = n.key;
        for j in n.neighbours.clone() {
            let lat = self.latency(i, j);
            self.deliver_at(self.now + lat, j, Input::Disconnected(key));
        }
    }

    fn restart(&mut self, i: usize) {
        let n = &self.nodes[i];
        let cfg = Config {
            key: SigningKey::from_bytes(&n.secret),
            ..self.template.clone()
        };
        let state = (*n.checkpoint).clone();
        // Its own slices are on its disk (kept through the crash), as `nightshift run` has them.
        let own_key = cfg.key.verifying_key().to_bytes();
        let own: Vec<Arc<Slice>> = n
            .slices
            .iter()
            .filter(|((_, id, _), _)| id.sender == own_key)
            .map(|(_, s)| s.clone())
            .collect();
        let mut m = RoundMachine::new(cfg, state).with_own_slices(own);
        if let Some(p) = &n.previous {
            m = m.with_prev((**p).clone());
        }
        self.nodes[i].machine = Some(m);
        self.nodes[i].up_free = self.now as f64;
        self.nodes[i].down_free = self.now as f64;
        self.boot(i);
    }

    fn handle(&mut self, i: usize, input: Input) {
        let now = self.now;
        let Some(m) = self.nodes[i].machine.as_mut() else {
            return;
        };
        self.inputs += 1;
        if self.trace
            && !matches!(
                input,
                Input::Tick
                    | Input::Status { .. }
                    | Input::Speed { .. }
                    | Input::StatusAnswer { lists: None, .. }
            )
        {
            let short = match &input {
                Input::Contribution { from, envelope } => format!(
                    "Contribution from {} sender {} r{}",
                    hex::encode(&from[..3]),
                    hex::encode(&envelope.header.sender[..3]),
                    envelope.header.round
                ),
                Input::SliceNotFound {
                    from,
                    round,
                    id,
                    index,
                } => format!(
                    "SliceNotFound from {} r{round} sender {} digest {} slice {index}",
                    hex::encode(&from[..3]),
                    hex::encode(&id.sender[..3]),
                    id.digest.short()
                ),
                Input::StatusAnswer {
                    from,
                    status: Some(s),
                    lists: Some(l),
                } => format!(
                    "lists from {} r{} {} {:?} formed {} holding {}",
                    hex::encode(&from[..3]),
                    s.round,
                    s.state_hash.short(),
                    s.phase,
                    l.formed_by.len(),
                    l.holding.len()
                ),
                other => format!("{other:?}").chars().take(150).collect(),
            };
            eprintln!("{:>8} node {i} stage {} <- {short}", now, m.stage());
        }
        let outputs = m.handle(now, input);
        if self.trace && self.trace_node == Some(i) {
            for o in &outputs {
                let t = format!("{o:?}");
                eprintln!("{:>8} node {i} out {}", now, &t[..t.len().min(100)]);
            }
        }
        if self.trace {
            for o in &outputs {
                if let Output::Fetch {
                    from,
                    round,
                    sender,
                } = o
                {
                    eprintln!(
                        "{:>8} node {i} -> fetch r{round} sender {} from {}",
                        now,
                        hex::encode(&sender[..3]),
                        hex::encode(&from[..3])
                    );
                }
            }
        }
        for o in outputs {
            self.carry_out(i, o);
        }
    }

    /// Per node: what it held of θ(r).
    pub fn held(&self, r: u64) -> Vec<&Held> {
        self.nodes
            .iter()
            .filter(|n| !n.bootstrap)
            .filter_map(|n| n.held.get(&r))
            .collect()
    }

    /// What `encoded` bytes, of which `values` are values of the model, weigh on the wire with
    /// `--wire-params`.
    pub(super) fn weigh(&self, encoded: u64, values: u64) -> u64 {
        match self.args.wire_params {
            Some(p) if self.args.params > 0 => {
                let scale = p as f64 / self.args.params as f64;
                encoded - values.min(encoded) + (values as f64 * scale).round() as u64
            }
            _ => encoded,
        }
    }

    /// Per node: bytes sent while holding θ(r) that were statuses.
    pub fn status_bytes(&self, r: u64) -> Vec<u64> {
        self.nodes
            .iter()
            .filter(|n| !n.bootstrap)
            .map(|n| n.up_status.get(&r).copied().unwrap_or(0))
            .collect()
    }

    /// Per node: bytes sent and received while holding θ(r).
    pub fn bytes(&self, r: u64) -> Vec<(u64, u64)> {
        self.nodes
            .iter()
            .filter(|n| !n.bootstrap)
            .map(|n| {
                (
                    n.up.get(&r).copied().unwrap_or(0),
                    n.down.get(&r).copied().unwrap_or(0),
                )
            })
            .collect()
    }

    /// The validation loss of the state most nodes ended up holding for θ(r).
    pub fn majority_loss(&self, r: u64) -> Option<f32> {
        let mut count: BTreeMap<Hash32, usize> = BTreeMap::new();
        for h in self.held(r) {
            if let Some(x) = h.last {
                *count.entry(x).or_default() += 1;
            }
        }
        let best = count.iter().max_by_key(|(h, c)| (**c, Reverse(**h)))?.0;
        self.losses.get(best).copied()
    }

    /// Per node, per round: the first and last hash it held (for debugging a run).
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            out += &format!("node {i} {}:", &hex::encode(&n.key[..3]));
            for (r, h) in &n.held {
                let f = h.first.map_or("-".into(), |x| x.short());
                let l = h.last.map_or("-".into(), |x| x.short());
                out += &format!(
                    " {r}:{}{}@{}",
                    &f[..4],
                    if f == l {
                        String::new()
                    } else {
                        format!(">{}", &l[..4])
                    },
                    h.at / 1000
                );
            }
            out += "\n";
        }
        out
    }

    pub fn finished(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.finished && !n.bootstrap)
            .count()
    }
}
