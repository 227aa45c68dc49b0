//! The round machine: a node's round rules as a pure state machine.
//!
//! [`RoundMachine::handle`] takes the time (`now`, milliseconds on the caller's clock) and one
//! [`Input`] — a peer's status or contribution, a fetch's answer, training finished, the idle
//! window, a timer tick — and returns the [`Output`]s to carry out: announce a status, push or
//! fetch a contribution, fetch an attested state, train H steps from θ, adopt a new state. It does
//! no I/O, reads no clock and draws no random number, so the same inputs give the same outputs
//! bit for bit: the simulator (`nightshift-lab sim`) runs thousands of machines on a virtual
//! clock, and the unit tests drive every rule directly.
//!
//! A round, stage by stage (one file each):
//! - **align** (`align.rs`): wait briefly for peers still finishing the previous round, then move
//!   to a better state only once it verifies — a fork of our round or the next round replayed
//!   from contributions, a state further ahead by attestation ([`rules`]) — then train at once,
//!   join the round under way for the time it has left, or wait for it to end;
//! - **train** (`train.rs`): ask for H inner steps within the round's budget; turn the result into
//!   a signed, encoded contribution; a non-finite one is dropped;
//! - **collect** (`collect.rs`): gather the round's contributions, pushed or fetched, each
//!   verified ([`accept`]), until every live peer's is in or the deadline passes;
//! - **step** (`step.rs`): reconcile the set with what the peers hold or used, and take the
//!   swarm's outer step ([`rules::Recipe::apply`]).
//!
//! What a peer says reaches the machine already checked by the network layer where that is
//! cheap and stateless (a status's signature, swarm and age); everything else — contributions,
//! claimed states — the machine verifies itself.

pub mod accept;
mod align;
mod collect;
pub mod combine;
mod io;
mod peers;
pub mod reducer;
pub mod rules;
pub mod sliced;
mod step;
#[cfg(test)]
mod tests;
mod train;

use ed25519_dalek::SigningKey;
use nightshift_model::ErrorFeedback;
use nightshift_protocol::message::Phase;
use nightshift_protocol::slices::Slice;
use nightshift_protocol::{
    ContributionId, Hash32, NodeRole, SignedEnvelope, StateSnapshot, Status, StatusLists,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use io::{How, Input, NewState, Note, Output, Reduced, RoundSummary, Start, Trained};

use accept::Accepted;
use rules::{Recipe, Rejections};

/// A node's identity: its ed25519 public key (its libp2p peer id is derived from it).
pub type Key = [u8; 32];
/// Milliseconds on the caller's clock (monotonic in the daemon, virtual in the simulator).
pub type Millis = u64;

/// How long a node waits for peers still finishing the previous round before it starts the next.
pub const ALIGN_WAIT_MS: Millis = 10_000;
/// How much longer a node waits for a peer still collecting the previous round that holds more
/// of its contributions than formed the node's state.
pub const RICHER_WAIT_MS: Millis = 20_000;
/// How long a status look-up may take.
pub const LOOKUP_MS: Millis = 5_000;
/// How long one contribution fetch may take before the next holder is asked.
pub const FETCH_TIMEOUT_MS: Millis = 20_000;
/// How long one contribution fetch for a replay may take before the next holder is asked.
pub const REPLAY_FETCH_MS: Millis = 10_000;
/// How often a peer is asked again for the lists its status commits to while they are wanted.
pub const LISTS_RETRY_MS: Millis = 1_500;
/// How long a pushed contribution may take to arrive before it is fetched instead.
pub const PUSH_GRACE_MS: Millis = 2_000;
/// How long collection stays quiet (nobody missing) before it closes: one more look at the
/// peers, so that one that joined the round a moment ago is not left out.
pub const CONFIRM_MS: Millis = 300;
/// How often a collection still missing contributions asks its peers for their statuses again.
pub const STATUS_REFRESH_MS: Millis = 3_000;
/// The longest reconciling a round may take.
pub const RECONCILE_MS: Millis = 30_000;
/// The longest a replay may spend fetching.
pub const REPLAY_TIMEOUT_MS: Millis = 60_000;
/// The longest an attested state's download may take.
pub const STATE_DOWNLOAD_MS: Millis = 1_800_000;
/// Most contributions fetched while reconciling one round (beyond those of the members).
pub const MAX_RECONCILE_FETCHES: usize = 64;
/// Peers a collecting node asks for their lists within one [`LOOKUP_MS`]: the richest ones (one
/// list names all they hold), not every peer holding more than we do, which is O(N) lists of
/// O(N) entries a node a round.
pub const LIST_ASKS_PER_LOOKUP: usize = 2;
/// Lists a reconciling node asks for at once: one peer for each distinct set (peers whose
/// statuses commit to the same root hold the same list), the largest sets first.
pub const RECONCILE_LIST_ASKS: usize = 4;
/// Most early contributions (for a round not reached yet) kept in an open swarm.
pub const MAX_STASHED: usize = 64;
/// Early contributions kept per sender and round (as many as a peer may have queued).
pub const STASH_PER_SENDER: usize = 4;
/// Rounds in a row whose local training may go non-finite before the node gives up.
pub const MAX_DIVERGED_IN_A_ROW: u32 = 3;
/// A round's time budget: this many times the median live peer's expected training time.
pub const BUDGET_FACTOR: f64 = 1.5;
/// A round's training budget is never shorter than this: below it, the noise of a busy machine
/// (loading the model, other processes) would cut a node's steps, not its being slow.
pub const MIN_TRAIN_BUDGET_MS: Millis = 2_000;
/// How often a bootstrap looks for a newer state to verify.
pub const FOLLOW_MS: Millis = 500;
/// Verified improvements (a replay or an attested download each) per alignment.
pub const MAX_IMPROVEMENTS: u8 = 8;
/// Rounds of our own chain remembered, to tell a claim of an earlier round on another chain.
pub const CHAIN_ROUNDS: usize = 8;
/// Times in a row a node waits (each [`rules::RETRY_SECS`]) for a better state it could not
/// verify yet — a fork of its round or the next round, which no peer of its own state is
/// training past — before it trains its round anyway.
pub const MAX_STALLS: u32 = 3;

/// How a node runs its rounds: the swarm's recipe and the node's own settings.
#[derive(Clone)]
pub struct Config {
    pub key: SigningKey,
    pub recipe: Arc<Recipe>,
    /// Inner steps per round (H).
    pub inner_steps: u32,
    /// The manifest's round deadline.
    pub round_deadline_ms: Millis,
    /// Tokens of a full round of inner steps (H · batch · seq), for the time budget.
    pub round_tokens: f64,
    /// Trainer peers to wait for before the first round.
    pub min_peers: usize,
    /// Stop once the node holds θ(rounds).
    pub rounds: Option<u64>,
    /// A trainer, or a bootstrap: a follower that never trains, moves to every state it can
    /// verify, and attests it by its signed status (the manifest names its key).
    pub role: NodeRole,
    /// Train the next round's inner steps while a round's contributions are collected; they
    /// are sent, once the round's state is formed, as progress on it (the outer step then
    /// reaches a node's training one round late).
    pub overlap: bool,
    /// The model width the combining graces allow time for (their slack grows with the bytes
    /// a slice's reducers move); `None`: the recipe's. The simulator sets its `--wire-params`
    /// here, so that its nodes' timers expect the bytes its links carry.
    pub timed_params: Option<u64>,
}

/// Inner steps running ahead, while the round before them is collected (overlap).
#[derive(Debug)]
struct Early {
    /// Where they started: their contribution is the progress from here.
    start: Arc<Vec<f32>>,
    started: Millis,
    /// What they produced, when they ended before the round before them did.
    done: Option<Trained>,
}

/// What the machine knows of one peer.
#[derive(Clone, Debug, Default)]
struct Peer {
    connected: bool,
    status: Option<Status>,
    /// The lists its status commits to, when it sent them (asked for: [`Output::AskLists`]).
    lists: Option<Arc<StatusLists>>,
    tokens_per_sec: Option<f64>,
}

/// Where the node is in its round.
#[derive(Debug)]
enum Stage {
    /// Waiting for `min_peers` trainers before the first round.
    Starting,
    /// Waiting (until the deadline) for peers still finishing the previous round; `finish`:
    /// this is the look after the node's last round.
    Aligning {
        until: Millis,
        finish: bool,
    },
    Verifying(align::Verifying),
    /// Synced in the middle of a round: waiting for it to end.
    Waiting {
        until: Millis,
    },
    /// A better state exists that did not verify yet (a fetch failed): aligning again at `at`
    /// rather than training a round nobody else works on.
    Retrying {
        at: Millis,
    },
    Training {
        started: Millis,
        /// Trainers on our state and round when training began (our plan for the round; a
        /// peer that dies before it contributes is still missed).
        planned_peers: u32,
        /// Where the steps started when not from θ (steps run ahead, overlap).
        base: Option<Arc<Vec<f32>>>,
    },
    Collecting(collect::Collecting),
    Reconciling(step::Reconciling),
    /// Averaging the agreed set slice by slice (a round of a swarm that averages so).
    Combining(Box<combine::CombineStage>),
    Paused,
    /// A bootstrap between two looks for a newer state.
    Following {
        at: Millis,
    },
    Done,
}

/// A node's round rules, as a pure state machine. See the [module docs](self).
pub struct RoundMachine {
    cfg: Config,
    me: Key,
    state: Arc<StateSnapshot>,
    hash: Hash32,
    /// θ(r−1) when we computed or replayed ours from it: the base a fork of our round replays from.
    prev: Option<(Arc<StateSnapshot>, Hash32)>,
    /// The states we held lately, one per round, oldest first (at most [`CHAIN_ROUNDS`]): what
    /// an attested claim of an earlier round is compared with ([`rules::Candidate::Cross`]).
    chain: Vec<(u64, Hash32)>,
    ef: ErrorFeedback,
    phase: Phase,
    holding: Vec<Key>,
    peers: BTreeMap<Key, Peer>,
    /// Verified contributions we hold and serve, by round and sender.
    held: BTreeMap<(u64, Key), Arc<SignedEnvelope>>,
    /// Contributions for a round we have not reached (or that came while not collecting).
    stash: Vec<(Key, Arc<SignedEnvelope>)>,
    rejected: Rejections,
    /// When a peer was first seen training each recent round.
    round_started: BTreeMap<u64, Millis>,
    /// Status look-ups still unanswered, and until when they are waited for.
    asking: Option<(BTreeSet<Key>, Millis)>,
    /// When every peer was last asked for its status.
    refreshed_at: Millis,
    /// Changes to peers' statuses or connections, counted, and the peers of the latest ones
    /// (what lets the collecting stage look at a few peers per input instead of all of them).
    peer_changes: u64,
    recent_changes: std::collections::VecDeque<Key>,
    available: bool,
    stage: Stage,
    just_synced: bool,
    waited_for_round: bool,
    diverged_in_a_row: u32,
    /// Waits in a row for a better state that did not verify yet ([`MAX_STALLS`]).
    stalls: u32,
    /// The next training starts afresh from θ (after a non-finite round).
    fresh: bool,
    /// Inner steps under way (or done) for the round after the one being collected.
    early: Option<Early>,
    trained_any: bool,
    tokens_per_sec: Option<f64>,
    /// Our contribution's slices of the round we last trained (a sliced round).
    own_slices: Option<(u64, Vec<Arc<Slice>>)>,
    /// Reduced slices that came before the node was ready for them.
    early_reduced: Vec<(Key, Arc<Reduced>)>,
    /// The look after the last round asked for fresh statuses.
    final_look: bool,
    out: Vec<Output>,
}

impl RoundMachine {
    /// A machine holding `state` (genesis, or the node's checkpoint).
    pub fn new(cfg: Config, state: StateSnapshot) -> Self {
        let hash = state.hash();
        let round = state.round;
        let me = cfg.key.verifying_key().to_bytes();
        RoundMachine {
            cfg,
            me,
            state: Arc::new(state),
            hash,
            prev: None,
            chain: vec![(round, hash)],
            ef: ErrorFeedback::default(),
            phase: Phase::Ready,
            holding: vec![],
            peers: BTreeMap::new(),
            held: BTreeMap::new(),
            stash: vec![],
            rejected: Rejections::default(),
            round_started: BTreeMap::new(),
            asking: None,
            refreshed_at: 0,
            peer_changes: 0,
            recent_changes: std::collections::VecDeque::new(),
            available: true,
            stage: Stage::Starting,
            just_synced: false,
            waited_for_round: false,
            diverged_in_a_row: 0,
            stalls: 0,
            fresh: false,
            early: None,
            trained_any: false,
            tokens_per_sec: None,
            own_slices: None,
            early_reduced: vec![],
            final_look: false,
            out: vec![],
        }
    }

    /// The machine of a node that resumes from a checkpoint and still has the state before it:
    /// the base from which a preferred fork of its round is replayed.
    pub fn with_prev(mut self, prev: StateSnapshot) -> Self {
        if prev.round + 1 == self.state.round {
            let h = prev.hash();
            self.prev = Some((Arc::new(prev), h));
        }
        self
    }

    /// The machine of a node that restarts after sending slices of its contribution (kept on
    /// disk): if it trains that round again, the contribution already sent stands, so that no
    /// peer ever holds two of ours for one round. Only the newest round's slices count.
    pub fn with_own_slices(mut self, slices: Vec<Arc<Slice>>) -> Self {
        let Some(round) = slices.iter().map(|s| s.envelope.header.round).max() else {
            return self;
        };
        let mut newest: Vec<Arc<Slice>> = slices
            .into_iter()
            .filter(|s| s.envelope.header.round == round)
            .collect();
        newest.sort_by_key(|s| s.index);
        let one = newest
            .first()
            .map(|f| ContributionId::of(&f.envelope))
            .is_some_and(|id| newest.iter().all(|s| ContributionId::of(&s.envelope) == id));
        if one
            && newest
                .first()
                .is_some_and(|f| f.envelope.header.sender == self.me)
        {
            self.own_slices = Some((round, newest));
        }
        self
    }

    /// The round this node holds θ of.
    pub fn round(&self) -> u64 {
        self.state.round
    }

    pub fn hash(&self) -> Hash32 {
        self.hash
    }

    pub fn state(&self) -> &Arc<StateSnapshot> {
        &self.state
    }

    pub fn key(&self) -> Key {
        self.me
    }

    /// The stage's name, for logs and the simulator's tallies.
    pub fn stage(&self) -> &'static str {
        match self.stage {
            Stage::Starting => "starting",
            Stage::Aligning { .. } => "aligning",
            Stage::Verifying(_) => "verifying",
            Stage::Waiting { .. } => "waiting",
            Stage::Retrying { .. } => "retrying",
            Stage::Training { .. } => "training",
            Stage::Collecting(_) => "collecting",
            Stage::Reconciling(_) => "reconciling",
            Stage::Combining(_) => "combining",
            Stage::Paused => "paused",
            Stage::Following { .. } => "following",
            Stage::Done => "done",
        }
    }

    /// The connected trainers that have not left (whose window records give their speeds).
    pub fn trainer_keys(&self) -> Vec<Key> {
        self.trainer_peers().map(|(k, _)| *k).collect()
    }

    /// Every peer heard from, as this node sees it: key, connected, last status, tokens/s (for
    /// the dashboard).
    pub fn peer_view(&self) -> Vec<(Key, bool, Option<&Status>, Option<f64>)> {
        self.peers
            .iter()
            .map(|(k, p)| (*k, p.connected, p.status.as_ref(), p.tokens_per_sec))
            .collect()
    }

    pub fn is_done(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }

    /// Whether a connected trainer is still finishing our round or looking at the states held
    /// for it (it may replay ours, fetching the contributions we hold): a node that is done keeps
    /// serving while this holds.
    pub fn peers_finishing(&self) -> bool {
        let r = self.state.round;
        self.trainer_peers().any(|(_, s)| {
            (s.round < r && s.phase != Phase::Paused)
                || (s.round == r && matches!(s.phase, Phase::Ready | Phase::Syncing))
        })
    }

    /// The status this node would announce now (`unix_ms` left for the signer to set), with the
    /// lists it commits to.
    pub fn status(&self) -> (Status, Arc<StatusLists>) {
        let lists = StatusLists {
            formed_by: self.state.formed_by.clone(),
            holding: self.holding.clone(),
        };
        let status = Status::summarizing(
            self.cfg.role,
            self.phase,
            self.state.round,
            self.hash,
            &lists,
        );
        (status, Arc::new(lists))
    }

    /// Handles one input at `now` and returns what to do.
    pub fn handle(&mut self, now: Millis, input: Input) -> Vec<Output> {
        let tick = matches!(input, Input::Tick);
        match input {
            Input::Start => {
                self.announce(Phase::Ready);
            }
            Input::Tick => {}
            Input::Connected(k) => {
                self.peers.entry(k).or_default().connected = true;
                self.peer_changed(k);
                self.out.push(Output::Greet(k));
            }
            Input::Disconnected(k) => {
                if let Some(p) = self.peers.get_mut(&k) {
                    p.connected = false;
                    p.status = None;
                    p.lists = None;
                }
                self.peer_changed(k);
                self.answered(k);
            }
            Input::Status { from, status } => self.note_status(now, from, status, None),
            Input::StatusAnswer {
                from,
                status,
                lists,
            } => {
                if let Some(s) = status {
                    self.note_status(now, from, s, lists);
                }
                self.answered(from);
            }
            Input::Speed {
                from,
                tokens_per_sec,
            } => {
                let valid = tokens_per_sec.is_finite() && tokens_per_sec > 0.0;
                if valid && from == self.me {
                    // Our own window record: the speed of our last run, until we train.
                    self.tokens_per_sec.get_or_insert(tokens_per_sec);
                } else if valid {
                    self.peers.entry(from).or_default().tokens_per_sec = Some(tokens_per_sec);
                }
            }
            Input::Contribution { from, envelope } => self.on_contribution(now, from, envelope),
            Input::NotFound {
                from,
                round,
                sender,
            } => self.on_not_found(now, from, round, sender),
            Input::Slice { from, slice } => self.on_slice(now, from, slice),
            Input::SliceNotFound {
                from,
                round,
                id,
                index,
            } => self.on_slice_not_found(now, from, round, id, index),
            Input::Reduced { from, reduced } => self.on_reduced(now, from, reduced),
            Input::ReducedNotFound { from, round, index } => {
                self.on_reduced_not_found(now, from, round, index)
            }
            Input::State { from, state, bytes } => self.on_state(now, from, state, bytes),
            Input::StateFailed { hash } => self.on_state_failed(now, hash),
            Input::Trained(t) => {
                if let Some(e) = self.early.as_mut() {
                    // Steps run ahead: they count once the round before them has ended.
                    e.done = Some(t);
                } else if matches!(self.stage, Stage::Training { .. }) {
                    self.on_trained(now, t);
                }
            }
            Input::Window(open) => self.available = open,
            Input::Shutdown => {
                if !self.is_done() {
                    self.finish("shutdown");
                }
            }
        }
        self.advance(now, tick);
        std::mem::take(&mut self.out)
    }

    /// Moves the round on as far as what is known allows.
    fn advance(&mut self, now: Millis, tick: bool) {
        if let Some((_, until)) = &self.asking
            && now >= *until
        {
            self.asking = None;
        }
        // Each pass either changes the stage or leaves it; a few passes settle any input.
        for _ in 0..16 {
            let before = self.stage();
            match &self.stage {
                Stage::Starting => {
                    if self.done() || self.live_peers_reach(self.cfg.min_peers) {
                        self.begin_round(now);
                    } else if tick && now >= self.refreshed_at + STATUS_REFRESH_MS {
                        // A greeting lost (or one that never came: a peer that restarted
                        // under its key) must not keep us waiting: ask now and then.
                        self.refresh_statuses(now);
                    }
                }
                Stage::Aligning { until, finish } => {
                    let (until, finish) = (*until, *finish);
                    self.align_wait(now, until, finish);
                }
                Stage::Verifying(_) => self.verify_step(now),
                Stage::Waiting { until } => {
                    let until = *until;
                    // The round ended, or the wait is over, or speeds that came meanwhile
                    // leave time to join the round late.
                    if !self.round_under_way()
                        || now >= until
                        || !self.available
                        || self.late_budget(now).is_some()
                    {
                        self.begin_round(now);
                    }
                }
                Stage::Retrying { at } => {
                    if now >= *at {
                        self.begin_round(now);
                    }
                }
                Stage::Training { .. } | Stage::Done => {}
                Stage::Collecting(_) => self.collect_step(now, tick),
                Stage::Reconciling(_) => self.reconcile_step(now),
                Stage::Combining(_) => self.combine_step(now, tick),
                Stage::Paused => {
                    if self.available || self.early_ended() {
                        self.begin_round(now);
                    }
                }
                Stage::Following { at } => {
                    if now >= *at {
                        self.start_verifying(now, false);
                    }
                }
            }
            if self.stage() == before {
                break;
            }
        }
    }

    fn done(&self) -> bool {
        self.cfg.rounds.is_some_and(|n| self.state.round >= n)
    }

    fn announce(&mut self, phase: Phase) {
        self.phase = phase;
        let (status, lists) = self.status();
        self.out.push(Output::Announce(status, lists));
    }

    fn finish(&mut self, reason: &'static str) {
        self.stage = Stage::Done;
        self.announce(Phase::Done);
        self.out.push(Output::Finished(reason));
    }

    /// Steps ran ahead and ended with something to send.
    fn early_ended(&self) -> bool {
        self.early
            .as_ref()
            .is_some_and(|e| e.done.as_ref().is_some_and(|t| t.steps > 0))
    }

    /// Starts the next round: finish, pause, or align (a bootstrap: look for a newer state).
    fn begin_round(&mut self, now: Millis) {
        if self.cfg.role == NodeRole::Bootstrap {
            return self.start_verifying(now, false);
        }
        if self.done() {
            if self.trained_any {
                // No next round's align will repair a fork of the last round: wait for the
                // peers still finishing it, as every round does, and look once more.
                self.stage = Stage::Aligning {
                    until: now + ALIGN_WAIT_MS,
                    finish: true,
                };
                self.refresh_statuses(now);
            } else {
                self.finish("finished");
            }
            return;
        }
        // Steps that ran ahead and stopped when the window closed still go out for their round.
        if !self.available && !self.early_ended() {
            self.stage = Stage::Paused;
            if self.phase != Phase::Paused {
                self.announce(Phase::Paused);
            }
            return;
        }
        if self.phase == Phase::Paused {
            // Back from a pause: peers may count on us again from now on.
            self.announce(Phase::Ready);
        }
        self.just_synced = false;
        self.stage = Stage::Aligning {
            until: now + ALIGN_WAIT_MS,
            finish: false,
        };
        self.refresh_statuses(now);
    }

    /// Keeps `env` for a round not reached yet: only what its sender signed (and, in a private
    /// swarm, a member's), a few per sender and round, a bounded number in all.
    fn stash_push(&mut self, from: Key, env: Arc<SignedEnvelope>) {
        if let Err(e) = env.check_signer(self.cfg.recipe.allowlist.as_deref()) {
            self.out.push(Output::Note(Note::Refused {
                round: self.state.round,
                from,
                reason: e.to_string(),
            }));
            return;
        }
        let max = self
            .cfg
            .recipe
            .allowlist
            .as_ref()
            .map_or(MAX_STASHED, |m| m.len() * STASH_PER_SENDER);
        let same = self
            .stash
            .iter()
            .filter(|(_, e)| {
                e.header.sender == env.header.sender && e.header.round == env.header.round
            })
            .count();
        if self.stash.len() < max && same < STASH_PER_SENDER {
            self.stash.push((from, env));
        }
    }

    fn on_contribution(&mut self, now: Millis, from: Key, env: Arc<SignedEnvelope>) {
        match &self.stage {
            Stage::Collecting(_) | Stage::Reconciling(_) | Stage::Combining(_) => {
                self.consider(from, env)
            }
            Stage::Verifying(_) => self.replay_offer(now, from, env),
            _ => {
                if env.header.round >= self.state.round {
                    self.stash_push(from, env);
                }
            }
        }
    }

    /// The contribution id of a held envelope, when it is `id`.
    fn held_as(&self, round: u64, id: &ContributionId) -> Option<Arc<SignedEnvelope>> {
        self.held
            .get(&(round, id.sender))
            .filter(|e| ContributionId::of(e) == *id)
            .cloned()
    }

    /// Notes the state we now hold in [`RoundMachine::chain`]: a state of an earlier (or the
    /// same) round replaces what the chain had from that round on.
    fn note_chain(&mut self) {
        let round = self.state.round;
        self.chain.retain(|(r, _)| *r < round);
        self.chain.push((round, self.hash));
        let excess = self.chain.len().saturating_sub(CHAIN_ROUNDS);
        self.chain.drain(..excess);
    }

    /// Records a verified contribution as held and served.
    fn hold(&mut self, round: u64, env: Arc<SignedEnvelope>) {
        self.held.insert((round, env.header.sender), env.clone());
        self.out.push(Output::Hold(env));
    }
}

/// The collected set in sender order, as the wire lists it.
fn ids(set: &BTreeMap<Key, Accepted>) -> Vec<ContributionId> {
    set.values()
        .map(|a| ContributionId {
            sender: a.sender,
            digest: a.digest,
        })
        .collect()
}

/// Short hex of a key, for messages.
fn short(k: &Key) -> String {
    hex::encode(&k[..6])
}
