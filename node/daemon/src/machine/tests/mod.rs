//! The round's rules, one at a time, on a machine fed by hand: no network, no clock. The
//! helpers live here; the tests by stage in `align.rs` and `collect.rs`.

use super::*;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Aggregator, Contribution, DeltaCodec, PayloadKind, StateSnapshot, delta, wire,
};

const P: usize = 8;
/// Past the look-ups `node` leaves unanswered.
const T0: Millis = 10_000;

fn key(i: u8) -> SigningKey {
    SigningKey::from_bytes(&[i; 32])
}

fn pk(i: u8) -> Key {
    key(i).verifying_key().to_bytes()
}

fn recipe() -> Recipe {
    Recipe {
        swarm_id: Hash32::of(&[b"test swarm"]),
        allowlist: None,
        bootstraps: vec![],
        attest_quorum: 0,
        num_params: P,
        shapes: Arc::new(vec![vec![P]]),
        codec: DeltaCodec::Fp32,
        max_tokens: 10_000,
        aggregator: Aggregator::Mean,
        outer_lr: 0.7,
        outer_momentum: 0.7,
        slicing: None,
    }
}

fn genesis() -> StateSnapshot {
    StateSnapshot {
        round: 0,
        params: vec![0.5; P],
        momentum: vec![0.0; P],
        formed_by: vec![],
        noise: None,
    }
}

fn config(min_peers: usize) -> Config {
    Config {
        key: key(1),
        recipe: Arc::new(recipe()),
        inner_steps: 10,
        round_deadline_ms: 60_000,
        round_tokens: 1000.0,
        min_peers,
        rounds: None,
        role: NodeRole::Trainer,
        overlap: false,
        timed_params: None,
    }
}

/// A peer's status as the tests write it: with the lists it commits to.
#[derive(Clone, Debug)]
struct St {
    role: NodeRole,
    phase: Phase,
    round: u64,
    state_hash: Hash32,
    formed_by: Vec<ContributionId>,
    holding: Vec<Key>,
    unix_ms: Millis,
}

impl St {
    fn lists(&self) -> Arc<StatusLists> {
        Arc::new(StatusLists {
            formed_by: self.formed_by.clone(),
            holding: self.holding.clone(),
        })
    }

    /// The status that goes on the wire (lists only counted and committed to).
    fn wire(&self) -> Status {
        Status {
            unix_ms: self.unix_ms,
            ..Status::summarizing(
                self.role,
                self.phase,
                self.round,
                self.state_hash,
                &self.lists(),
            )
        }
    }
}

fn status(round: u64, hash: Hash32, phase: Phase, at: Millis) -> St {
    St {
        role: NodeRole::Trainer,
        phase,
        round,
        state_hash: hash,
        formed_by: vec![],
        holding: vec![],
        unix_ms: at,
    }
}

/// Peer `i`'s contribution to `round` from the state `base`, with a delta of `v` everywhere.
fn contribution(i: u8, round: u64, base: Hash32, v: f32, expected: u32) -> Arc<SignedEnvelope> {
    let c = Contribution {
        tokens: 1000,
        inner_steps: 10,
        train_loss: 2.0,
        delta: delta::encode(DeltaCodec::Fp32, &[v; P]),
        expected,
    };
    let h = EnvelopeHeader {
        kind: PayloadKind::Contribution,
        swarm_id: recipe().swarm_id,
        round,
        sender: [0; 32],
        base_hash: base,
    };
    Arc::new(SignedEnvelope::sign(&key(i), h, wire::encode(&c)))
}

fn trained(v: f32) -> Trained {
    Trained {
        steps: 10,
        tokens: 1000,
        mean_loss: 2.0,
        params: vec![0.5 - v; P],
        secs: 1.0,
        yielded: false,
    }
}

/// θ(1): genesis stepped with peer 2's contribution `a` (based on genesis, hash `g`) alone.
fn formed_by_peer_two(g: Hash32, a: &SignedEnvelope) -> StateSnapshot {
    let accepted = accept::accept(&recipe().context(0, g), a).unwrap();
    recipe()
        .apply(&genesis(), &BTreeMap::from([(pk(2), accepted)]))
        .unwrap()
        .0
}

/// θ(1) stepped from genesis (hash `g`) with all of `contributions`: its hash and `formed_by`.
fn formed_by_all(g: Hash32, contributions: [&SignedEnvelope; 3]) -> (Hash32, Vec<ContributionId>) {
    let set: BTreeMap<Key, Accepted> = contributions
        .iter()
        .map(|e| {
            let x = accept::accept(&recipe().context(0, g), e).unwrap();
            (x.sender, x)
        })
        .collect();
    let (theirs, _) = recipe().apply(&genesis(), &set).unwrap();
    (theirs.hash(), theirs.formed_by.clone())
}

/// Peer 2 says it holds θ(1) `hash`, formed by its contribution `a`; the node hears it at `T0`,
/// looks at its peers (peer 2 answers with the same claim) and acts. Every output.
fn peer_two_claims(m: &mut RoundMachine, hash: Hash32, a: &SignedEnvelope) -> Vec<Output> {
    let claim = |at: Millis| St {
        formed_by: vec![ContributionId::of(a)],
        ..status(1, hash, Phase::Ready, at)
    };
    let first = m.handle(
        T0,
        Input::Status {
            from: pk(2),
            status: claim(T0).wire(),
        },
    );
    let outs = m.handle(T0 + 10, Input::Tick);
    let asked = [first.clone(), outs.clone()].concat();
    let more = answer_asks(m, T0 + 10, &asked, |_| Some(claim(T0 + 10)));
    [first, outs, more].concat()
}

/// A node (key 1) with `peers` (keys 2, 3, ...) connected, all at genesis and ready.
fn node(peers: u8) -> (RoundMachine, Vec<Key>) {
    node_with(config(peers as usize), peers)
}

/// The same with `cfg`.
fn node_with(cfg: Config, peers: u8) -> (RoundMachine, Vec<Key>) {
    let mut m = RoundMachine::new(cfg, genesis());
    let h = m.hash();
    m.handle(0, Input::Start);
    let keys: Vec<Key> = (2..2 + peers).map(pk).collect();
    for k in &keys {
        m.handle(0, Input::Connected(*k));
        m.handle(
            0,
            Input::Status {
                from: *k,
                status: status(0, h, Phase::Ready, 0).wire(),
            },
        );
    }
    (m, keys)
}

/// Answers every status look-up in `outs` with what `answer` gives for each peer (with its
/// lists when they were asked for), and the look-ups that those answers lead to.
fn answer_asks(
    m: &mut RoundMachine,
    now: Millis,
    outs: &[Output],
    answer: impl Fn(&Key) -> Option<St>,
) -> Vec<Output> {
    let mut all = vec![];
    let mut more = answer_once(m, now, outs, &answer);
    for _ in 0..4 {
        let next = answer_once(m, now, &more, &answer);
        all.append(&mut more);
        more = next;
    }
    all.append(&mut more);
    all
}

fn answer_once(
    m: &mut RoundMachine,
    now: Millis,
    outs: &[Output],
    answer: &impl Fn(&Key) -> Option<St>,
) -> Vec<Output> {
    let mut more = vec![];
    for o in outs {
        let (peers, with_lists) = match o {
            Output::AskStatuses(peers) => (peers, false),
            Output::AskLists(peers) => (peers, true),
            _ => continue,
        };
        for p in peers {
            let st = answer(p);
            more.extend(m.handle(
                now,
                Input::StatusAnswer {
                    from: *p,
                    status: st.as_ref().map(St::wire),
                    lists: st.filter(|_| with_lists).map(|s| s.lists()),
                },
            ));
        }
    }
    more
}

fn train_of(outs: &[Output]) -> Option<(u64, Option<Millis>)> {
    outs.iter().find_map(|o| match o {
        Output::Train {
            round, budget_ms, ..
        } => Some((*round, *budget_ms)),
        _ => None,
    })
}

/// The peer asked for `sender`'s contribution in `outs`, if any.
fn fetched_from(outs: &[Output], sender: Key) -> Option<Key> {
    outs.iter().find_map(|o| match o {
        Output::Fetch {
            from, sender: s, ..
        } if *s == sender => Some(*from),
        _ => None,
    })
}

fn new_state(outs: &[Output]) -> Option<&NewState> {
    outs.iter().find_map(|o| match o {
        Output::NewState(n) => Some(n),
        _ => None,
    })
}

fn notes(outs: &[Output]) -> Vec<&Note> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Note(n) => Some(n),
            _ => None,
        })
        .collect()
}

/// Brings the node into round 0's collection: the peers answer (ready at genesis), it trains.
fn collecting(m: &mut RoundMachine, keys: &[Key]) -> Vec<Output> {
    let h = m.hash();
    let outs = m.handle(T0, Input::Tick);
    let outs = [outs, vec![]].concat();
    let mut all = answer_asks(m, T0, &outs, |_| Some(status(0, h, Phase::Ready, T0)));
    all.extend(outs);
    assert_eq!(train_of(&all).map(|t| t.0), Some(0), "{all:?}");
    for k in keys {
        m.handle(
            T0 + 10,
            Input::Status {
                from: *k,
                status: status(0, h, Phase::Training, T0 + 10).wire(),
            },
        );
    }
    m.handle(T0 + 1_000, Input::Trained(trained(0.1)))
}

/// Our contribution (held once trained), and peers 2's and 3's for round 0; peer 2's is
/// delivered now.
fn own_and_two_more(
    m: &mut RoundMachine,
    outs: &[Output],
    g: Hash32,
) -> (
    Arc<SignedEnvelope>,
    Arc<SignedEnvelope>,
    Arc<SignedEnvelope>,
) {
    let own = outs
        .iter()
        .find_map(|o| match o {
            Output::Hold(e) => Some(e.clone()),
            _ => None,
        })
        .unwrap();
    let a = contribution(2, 0, g, 0.2, 3);
    let b = contribution(3, 0, g, 0.3, 3);
    m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: a.clone(),
        },
    );
    (own, a, b)
}

trait WithHolding {
    fn with_holding(self, h: Vec<Key>) -> Self;
}
impl WithHolding for St {
    fn with_holding(mut self, h: Vec<Key>) -> Self {
        self.holding = h;
        self
    }
}

/// Every peer claims `claim(now)`; the node ticks, its look-ups answered with the claim and its
/// fetches with `a` (peer 3's contribution: `b`), until `done` holds of a tick's outputs.
fn follow_claim(
    m: &mut RoundMachine,
    mut now: Millis,
    keys: &[Key],
    claim: impl Fn(Millis) -> St,
    (a, b): (&Arc<SignedEnvelope>, &Arc<SignedEnvelope>),
    mut done: impl FnMut(&[Output]) -> bool,
) -> bool {
    let mut outs = vec![];
    for k in keys {
        outs.extend(m.handle(
            now,
            Input::Status {
                from: *k,
                status: claim(now).wire(),
            },
        ));
    }
    for _ in 0..200 {
        now += CONFIRM_MS;
        let mut all = std::mem::take(&mut outs);
        all.extend(m.handle(now, Input::Tick));
        let answers = answer_asks(m, now, &all, |_| Some(claim(now)));
        all.extend(answers);
        for o in all.clone() {
            if let Output::Fetch { from, sender, .. } = o {
                let env = if sender == pk(3) { b } else { a };
                all.extend(m.handle(
                    now,
                    Input::Contribution {
                        from,
                        envelope: env.clone(),
                    },
                ));
            }
        }
        if done(&all) {
            return true;
        }
    }
    false
}

/// Ticks (answering look-ups as `answer` says) until the node moves to a new state.
fn run_until_new_state(
    m: &mut RoundMachine,
    mut now: Millis,
    until: Millis,
    answer: impl Fn(&Key, Millis) -> Option<St>,
) -> Option<(Millis, NewState, Vec<Note>)> {
    let mut seen = vec![];
    let mut pending: Vec<Output> = vec![];
    while now < until {
        now += CONFIRM_MS;
        let mut outs = answer_asks(m, now, &pending, |k| answer(k, now));
        outs.extend(m.handle(now, Input::Tick));
        seen.extend(notes(&outs).into_iter().cloned());
        if let Some(n) = new_state(&outs) {
            return Some((now, n.clone(), seen));
        }
        pending = outs;
    }
    None
}

mod align;
mod collect;
mod overlap;
