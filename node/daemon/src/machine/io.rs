//! What goes into the round machine ([`Input`]) and what comes out ([`Output`]).

use super::{Key, Millis};
pub use nightshift_protocol::slices::Reduced;
use nightshift_protocol::slices::Slice;
use nightshift_protocol::{
    ContributionId, Hash32, SignedEnvelope, StateSnapshot, Status, StatusLists,
};
use std::sync::Arc;

/// What happens to a node.
#[derive(Clone, Debug)]
pub enum Input {
    /// The node starts: announce, then wait for `min_peers` trainers.
    Start,
    /// Time passed; the machine re-checks its deadlines.
    Tick,
    Connected(Key),
    Disconnected(Key),
    /// A peer's status, checked by the network layer (signed by that peer, for this swarm, an
    /// admitted key, current).
    Status {
        from: Key,
        status: Status,
    },
    /// The answer to [`Output::AskStatuses`] or [`Output::AskLists`] from one peer (`None`: no
    /// answer); to the latter, with the lists the status commits to (checked by the network
    /// layer, and again by the machine).
    StatusAnswer {
        from: Key,
        status: Option<Status>,
        lists: Option<Arc<StatusLists>>,
    },
    /// A peer's measured training speed (its window record).
    Speed {
        from: Key,
        tokens_per_sec: f64,
    },
    /// A contribution, pushed by a peer or answering a fetch; not yet verified.
    Contribution {
        from: Key,
        envelope: Arc<SignedEnvelope>,
    },
    /// A fetch ([`Output::Fetch`]) came back empty or failed.
    NotFound {
        from: Key,
        round: u64,
        sender: Key,
    },
    /// One slice of a sliced contribution, answering [`Output::FetchSlice`]; not yet verified.
    Slice {
        from: Key,
        slice: Arc<Slice>,
    },
    /// A [`Output::FetchSlice`] came back empty or failed.
    SliceNotFound {
        from: Key,
        round: u64,
        id: ContributionId,
        index: u32,
    },
    /// A reduced slice, pushed by its checker (or its reducer, for the checker) or answering
    /// [`Output::FetchReduced`]; not yet verified.
    Reduced {
        from: Key,
        reduced: Arc<Reduced>,
    },
    /// A [`Output::FetchReduced`] came back empty or failed.
    ReducedNotFound {
        from: Key,
        round: u64,
        index: u32,
    },
    /// A state downloaded for [`Output::FetchState`]; its hash is checked here.
    State {
        from: Key,
        state: Arc<StateSnapshot>,
        bytes: u64,
    },
    /// The download of [`Output::FetchState`] failed.
    StateFailed {
        hash: Hash32,
    },
    /// The inner steps asked for by [`Output::Train`] finished.
    Trained(Trained),
    /// The idle window opened (`true`) or closed.
    Window(bool),
    /// Ctrl-C: leave now.
    Shutdown,
}

/// What a round's inner steps produced.
#[derive(Clone, Debug)]
pub struct Trained {
    pub steps: u32,
    pub tokens: u64,
    pub mean_loss: f32,
    /// θ after the inner steps.
    pub params: Vec<f32>,
    /// How long training took (for the node's speed).
    pub secs: f64,
    /// Stopped before H steps (the window closed or the budget ran out).
    pub yielded: bool,
}

/// What the machine wants done.
#[derive(Clone, Debug)]
pub enum Output {
    /// Sign this status, serve it with its lists and send it (without them) to every connected
    /// peer.
    Announce(Status, Arc<StatusLists>),
    /// Sign this status and serve it with its lists (peers ask for them); nothing is sent.
    Serve(Status, Arc<StatusLists>),
    /// Send our served status to one peer (it just connected).
    Greet(Key),
    /// Ask these peers for their statuses; each answers with [`Input::StatusAnswer`].
    AskStatuses(Vec<Key>),
    /// Ask these peers for their statuses with the lists they commit to; each answers with
    /// [`Input::StatusAnswer`].
    AskLists(Vec<Key>),
    /// Look up these peers' window records; each speed found comes back as [`Input::Speed`].
    LookUpSpeeds(Vec<Key>),
    /// Send our contribution to these peers.
    Push {
        to: Vec<Key>,
        envelope: Arc<SignedEnvelope>,
    },
    /// Serve this verified contribution to peers who ask for it.
    Hold(Arc<SignedEnvelope>),
    /// Stop serving contributions of rounds before this one.
    ForgetBefore(u64),
    /// Ask `from` for `sender`'s contribution to `round`; the answer comes back as
    /// [`Input::Contribution`] or [`Input::NotFound`].
    Fetch { from: Key, round: u64, sender: Key },
    /// Serve these slices (of our contribution, or gathered as a slice's reducer) to peers who
    /// ask for them.
    HoldSlices(Vec<Arc<Slice>>),
    /// Ask `from` for slice `index` of contribution `id` to `round`; the answer comes back as
    /// [`Input::Slice`] or [`Input::SliceNotFound`].
    FetchSlice {
        from: Key,
        round: u64,
        id: ContributionId,
        index: u32,
    },
    /// Send a reduced slice to these peers.
    SendReduced { to: Vec<Key>, reduced: Arc<Reduced> },
    /// Serve this reduced slice (signed by both its reducers) to peers who ask for it.
    HoldReduced {
        round: u64,
        index: u32,
        reduced: Arc<Reduced>,
    },
    /// Ask `from` for reduced slice `index` of `round`; the answer comes back as
    /// [`Input::Reduced`] or [`Input::ReducedNotFound`].
    FetchReduced { from: Key, round: u64, index: u32 },
    /// Download the state `hash` of `round` from one of `from`; the answer comes back as
    /// [`Input::State`] or [`Input::StateFailed`].
    FetchState {
        from: Vec<Key>,
        round: u64,
        hash: Hash32,
    },
    /// Run up to `steps` inner steps for `round` from `start` (with a fresh inner optimizer when
    /// `fresh`), within `budget_ms` when set.
    Train {
        round: u64,
        start: Start,
        steps: u32,
        budget_ms: Option<Millis>,
        fresh: bool,
    },
    /// The node holds a new state: load it, checkpoint it, serve it.
    NewState(NewState),
    /// Something a user or a test would want to know.
    Note(Note),
    /// The node holds θ(rounds), or was shut down: it leaves.
    Finished(&'static str),
    /// The node cannot go on.
    Failed(String),
}

/// Where the inner steps of [`Output::Train`] start.
#[derive(Clone, Debug)]
pub enum Start {
    /// From the state's θ (loaded unless the trainer holds it already).
    State {
        state: Arc<StateSnapshot>,
        hash: Hash32,
    },
    /// From where the trainer's last steps ended: training on while the contribution they made
    /// is being averaged (overlap).
    Continue,
    /// From these parameters, keeping the inner optimizer's state: the newest θ plus the progress
    /// of the steps whose contribution is being averaged (overlap).
    Params(Arc<Vec<f32>>),
}

/// A state the node moved to, and how.
#[derive(Clone, Debug)]
pub struct NewState {
    pub state: Arc<StateSnapshot>,
    pub hash: Hash32,
    pub how: How,
}

/// How a node came to hold a state.
#[derive(Clone, Debug)]
pub enum How {
    /// Its own round's outer step.
    Stepped(RoundSummary),
    /// A peer's state, verified.
    Synced {
        from: Key,
        /// "behind the swarm" or "diverged from the swarm".
        reason: &'static str,
        /// "replay" or "attested".
        verified: &'static str,
        bytes: u64,
        /// The state it replaced (a fork of the same round).
        replaced: Option<Hash32>,
    },
}

/// One completed round as the node saw it.
#[derive(Clone, Debug)]
pub struct RoundSummary {
    /// The round the new state begins (r + 1).
    pub round: u64,
    pub contributors: usize,
    pub planned: u32,
    pub step_scale: f32,
    pub noise: Option<f64>,
    /// Tokens each contributor's delta was weighted by.
    pub weights: Vec<(Key, u64)>,
    pub tokens: u64,
    pub inner_steps: u32,
    pub train_loss: f32,
    pub train_secs: f64,
    pub wire_delta_bytes: u64,
    /// Peers still missing when the deadline passed (0 when everyone arrived).
    pub missed_deadline: usize,
}

/// Notable happenings, for logs, events and tests.
#[derive(Clone, Debug, PartialEq)]
pub enum Note {
    Refused {
        round: u64,
        from: Key,
        reason: String,
    },
    /// A claimed state did not verify; it is not adopted.
    Rejected {
        round: u64,
        hash: Hash32,
        reason: String,
    },
    DeadlinePassed {
        round: u64,
        missing: usize,
    },
    /// Our training went non-finite; the round's work is dropped.
    Diverged {
        round: u64,
        index: usize,
        in_a_row: u32,
    },
    /// An attested state further on exists: this round is abandoned to catch up.
    Behind {
        round: u64,
    },
    /// Peers hold a state of our round that the rules prefer to ours, and they train on it:
    /// this round is abandoned to replay it.
    OnAFork {
        round: u64,
    },
    /// Joined the round under way for the time it has left.
    JoinedLate {
        round: u64,
        budget_ms: Millis,
    },
    /// Synced in the middle of a round: waiting for it to end.
    WaitingForRoundEnd {
        round: u64,
    },
    /// A better state did not verify yet and nobody else trains our state's round: trying
    /// again before training alone.
    Stalled {
        round: u64,
        times: u32,
    },
    /// The round's averaging could not be completed: the node leaves the round and aligns to
    /// what its peers formed.
    LeftRound {
        round: u64,
        reason: String,
    },
    /// The window closed before the first step: nothing to send.
    Yielded {
        round: u64,
    },
}
