//! The round's rules, one at a time, on a machine fed by hand: no network, no clock.

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
    }
}

fn status(round: u64, hash: Hash32, phase: Phase, at: Millis) -> Status {
    Status {
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

/// A node (key 1) with `peers` (keys 2, 3, ...) connected, all at genesis and ready.
fn node(peers: u8) -> (RoundMachine, Vec<Key>) {
    let mut m = RoundMachine::new(config(peers as usize), genesis());
    let h = m.hash();
    m.handle(0, Input::Start);
    let keys: Vec<Key> = (2..2 + peers).map(pk).collect();
    for k in &keys {
        m.handle(0, Input::Connected(*k));
        m.handle(
            0,
            Input::Status {
                from: *k,
                status: status(0, h, Phase::Ready, 0),
            },
        );
    }
    (m, keys)
}

/// Answers every status look-up in `outs` with what `answer` gives for each peer.
fn answer_asks(
    m: &mut RoundMachine,
    now: Millis,
    outs: &[Output],
    answer: impl Fn(&Key) -> Option<Status>,
) -> Vec<Output> {
    let mut more = vec![];
    for o in outs {
        if let Output::AskStatuses(peers) = o {
            for p in peers {
                more.extend(m.handle(
                    now,
                    Input::StatusAnswer {
                        from: *p,
                        status: answer(p),
                    },
                ));
            }
        }
    }
    more
}

fn train_of(outs: &[Output]) -> Option<(u64, Option<Millis>)> {
    outs.iter().find_map(|o| match o {
        Output::Train {
            state, budget_ms, ..
        } => Some((state.round, *budget_ms)),
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
                status: status(0, h, Phase::Training, T0 + 10),
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

#[test]
fn a_node_waits_for_its_peers_then_trains() {
    let mut m = RoundMachine::new(config(2), genesis());
    let h = m.hash();
    m.handle(0, Input::Start);
    m.handle(0, Input::Connected(pk(2)));
    let outs = m.handle(
        0,
        Input::Status {
            from: pk(2),
            status: status(0, h, Phase::Ready, 0),
        },
    );
    assert!(train_of(&outs).is_none());
    assert_eq!(m.stage(), "starting");
    m.handle(0, Input::Connected(pk(3)));
    let outs = m.handle(
        0,
        Input::Status {
            from: pk(3),
            status: status(0, h, Phase::Ready, 0),
        },
    );
    // It looks at its peers once more before training.
    let more = answer_asks(&mut m, 10, &outs, |_| Some(status(0, h, Phase::Ready, 10)));
    assert_eq!(train_of(&more), Some((0, None)));
}

#[test]
fn a_round_closes_when_every_live_peer_is_in_and_steps_like_a_replay() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    let outs = collecting(&mut m, &keys);
    let pushed: Vec<Key> = outs
        .iter()
        .find_map(|o| match o {
            Output::Push { to, .. } => Some(to.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(pushed, keys, "the contribution goes to every live peer");
    let (own, a, b) = own_and_two_more(&mut m, &outs, g);
    let outs = m.handle(
        T0 + 1_200,
        Input::Contribution {
            from: pk(3),
            envelope: b.clone(),
        },
    );
    assert!(
        new_state(&outs).is_none(),
        "one more look at the peers first"
    );
    let mut now = T0 + 1_200;
    let mut got = None;
    let mut pending = outs;
    for _ in 0..10 {
        now += CONFIRM_MS;
        let mut outs = answer_asks(&mut m, now, &pending, |k| {
            Some(status(0, g, Phase::Collecting, now).with_holding(vec![*k]))
        });
        outs.extend(m.handle(now, Input::Tick));
        if let Some(n) = new_state(&outs) {
            got = Some(n.clone());
            break;
        }
        pending = outs;
    }
    let n = got.expect("the round closed");
    let How::Stepped(s) = &n.how else { panic!() };
    assert_eq!((s.round, s.contributors, s.missed_deadline), (1, 3, 0));
    // The very state a peer replaying the round from these contributions computes.
    let replayed =
        rules::replay_round(&recipe(), &genesis(), g, vec![own, a, b], n.hash).expect("replays");
    assert_eq!(replayed.hash, n.hash);
    assert_eq!(m.round(), 1);
}

trait WithHolding {
    fn with_holding(self, h: Vec<Key>) -> Self;
}
impl WithHolding for Status {
    fn with_holding(mut self, h: Vec<Key>) -> Self {
        self.holding = h;
        self
    }
}

/// Ticks (answering look-ups as `answer` says) until the node moves to a new state.
fn run_until_new_state(
    m: &mut RoundMachine,
    mut now: Millis,
    until: Millis,
    answer: impl Fn(&Key, Millis) -> Option<Status>,
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

#[test]
fn the_deadline_closes_a_round_without_a_missing_peer() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: contribution(2, 0, g, 0.2, 3),
        },
    );
    // Peer 3 trains on and never sends: the round waits for it until the deadline.
    let (at, n, seen) = run_until_new_state(&mut m, T0 + 1_100, T0 + 200_000, |_, now| {
        Some(status(0, g, Phase::Training, now))
    })
    .expect("the deadline closed the round");
    assert!(
        at >= T0 + 1_000 + 60_000,
        "closed at {at}, before the deadline"
    );
    assert!(
        seen.contains(&Note::DeadlinePassed {
            round: 0,
            missing: 1
        }),
        "{seen:?}"
    );
    let How::Stepped(s) = &n.how else { panic!() };
    assert_eq!((s.contributors, s.missed_deadline, s.planned), (2, 1, 3));
    assert!(s.step_scale <= 1.0);
}

#[test]
fn duplicate_late_and_early_contributions() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    let a = contribution(2, 0, g, 0.2, 3);
    let outs = m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: a.clone(),
        },
    );
    assert!(outs.iter().any(|o| matches!(o, Output::Hold(_))));
    // The same again (pushed and fetched): nothing happens.
    let outs = m.handle(
        T0 + 1_200,
        Input::Contribution {
            from: pk(3),
            envelope: a.clone(),
        },
    );
    assert!(
        outs.iter()
            .all(|o| !matches!(o, Output::Hold(_) | Output::Note(_))),
        "{outs:?}"
    );
    // Another one from the same sender: refused, the first is kept.
    let other = contribution(2, 0, g, 0.9, 3);
    let outs = m.handle(
        T0 + 1_300,
        Input::Contribution {
            from: pk(2),
            envelope: other,
        },
    );
    assert!(
        matches!(notes(&outs)[..], [Note::Refused { .. }]),
        "{outs:?}"
    );
    assert_eq!(m.status().holding.len(), 2);
    // One for an earlier round (a base we do not hold): refused quietly, not counted.
    let late = contribution(3, 0, Hash32::of(&[b"old"]), 0.3, 3);
    let outs = m.handle(
        T0 + 1_400,
        Input::Contribution {
            from: pk(3),
            envelope: late,
        },
    );
    assert!(matches!(notes(&outs)[..], [Note::Refused { .. }]));
    assert_eq!(m.status().holding.len(), 2);
    // One for the next round: kept for then, not counted now.
    let early = contribution(3, 1, Hash32::of(&[b"next"]), 0.3, 3);
    m.handle(
        T0 + 1_500,
        Input::Contribution {
            from: pk(3),
            envelope: early,
        },
    );
    assert_eq!(m.status().holding.len(), 2);
    assert_eq!(m.stash.len(), 1);
}

#[test]
fn reconciling_fetches_what_a_peer_holds_and_we_lack() {
    let (mut m, keys) = node(1);
    let g = m.hash();
    collecting(&mut m, &keys);
    m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: contribution(2, 0, g, 0.2, 2),
        },
    );
    // Peer 2 also holds peer 9's contribution (9 is not connected to us).
    let mut now = T0 + 1_100;
    let mut fetched = None;
    let mut pending = vec![];
    for _ in 0..20 {
        now += CONFIRM_MS;
        let mut outs = answer_asks(&mut m, now, &pending, |_| {
            Some(status(0, g, Phase::Collecting, now).with_holding(vec![pk(2), pk(9)]))
        });
        outs.extend(m.handle(now, Input::Tick));
        if let Some(f) = outs.iter().find_map(|o| match o {
            Output::Fetch { from, sender, .. } if *sender == pk(9) => Some(*from),
            _ => None,
        }) {
            fetched = Some(f);
            break;
        }
        pending = outs;
    }
    assert_eq!(fetched, Some(pk(2)), "asks the peer that holds it");
    let outs = m.handle(
        now + 50,
        Input::Contribution {
            from: pk(2),
            envelope: contribution(9, 0, g, 0.4, 2),
        },
    );
    let n = new_state(&outs).expect("the round closes once it is in");
    let How::Stepped(s) = &n.how else { panic!() };
    assert_eq!(s.contributors, 3);
}

#[test]
fn a_closed_window_pauses_and_an_open_one_resumes() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let outs = m.handle(10, Input::Window(false));
    assert!(train_of(&outs).is_none());
    assert_eq!(m.stage(), "paused");
    assert_eq!(m.status().phase, Phase::Paused);
    let outs = m.handle(5_000, Input::Window(true));
    let more = answer_asks(&mut m, 5_000, &outs, |_| {
        Some(status(0, g, Phase::Ready, 5_000))
    });
    assert_eq!(train_of(&more).map(|t| t.0), Some(0));
}

#[test]
fn a_node_joins_the_round_under_way_for_the_time_left() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    // The peers started training round 0 at 2 s (while we still looked at them) and take 10 s
    // for a round.
    for k in &keys {
        m.handle(
            2_000,
            Input::Speed {
                from: *k,
                tokens_per_sec: 100.0,
            },
        );
        m.handle(
            2_000,
            Input::Status {
                from: *k,
                status: status(0, g, Phase::Training, 2_000),
            },
        );
    }
    let outs = m.handle(5_000, Input::Tick);
    let more = answer_asks(&mut m, 5_000, &outs, |_| {
        Some(status(0, g, Phase::Training, 5_000))
    });
    let all = [outs, more].concat();
    assert!(
        notes(&all)
            .iter()
            .any(|n| matches!(n, Note::JoinedLate { .. })),
        "{all:?}"
    );
    assert_eq!(train_of(&all), Some((0, Some(7_000))));
}

#[test]
fn a_state_ahead_is_adopted_only_once_it_replays() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let (next, _) = recipe()
        .apply(
            &genesis(),
            &BTreeMap::from([(pk(2), accept::accept(&recipe().context(0, g), &a).unwrap())]),
        )
        .unwrap();
    let ahead = |hash: Hash32, at: Millis| Status {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, hash, Phase::Ready, at)
    };
    // A made-up claim first: the same contributions, another hash. It does not replay.
    let fake = Hash32::of(&[b"made up"]);
    let first = m.handle(
        T0,
        Input::Status {
            from: pk(2),
            status: ahead(fake, T0),
        },
    );
    let outs = m.handle(T0 + 10, Input::Tick);
    let outs = [
        first,
        answer_asks(&mut m, T0 + 10, &outs, |_| Some(ahead(fake, T0 + 10))),
        outs,
    ]
    .concat();
    assert!(
        outs.iter().any(|o| matches!(o, Output::Fetch { .. })),
        "{outs:?}"
    );
    let outs = m.handle(
        T0 + 20,
        Input::Contribution {
            from: pk(2),
            envelope: a.clone(),
        },
    );
    assert!(new_state(&outs).is_none());
    assert!(
        notes(&outs)
            .iter()
            .any(|n| matches!(n, Note::Rejected { .. })),
        "{outs:?}"
    );
    assert_eq!(m.round(), 0);
    // The true one replays and is adopted (by a node that was not shown the fake first: that
    // one went on to train its round).
    let (mut m, _) = node(1);
    let truth = next.hash();
    let mut now = T0;
    let first_truth = m.handle(
        now,
        Input::Status {
            from: pk(2),
            status: ahead(truth, now),
        },
    );
    let mut adopted = None;
    let mut first = first_truth;
    for _ in 0..200 {
        now += CONFIRM_MS;
        let mut outs = std::mem::take(&mut first);
        outs.extend(m.handle(now, Input::Tick));
        let mut all = answer_asks(&mut m, now, &outs, |_| Some(ahead(truth, now)));
        all.extend(outs.clone());
        if all.iter().any(|o| matches!(o, Output::Fetch { .. })) {
            all.extend(m.handle(
                now,
                Input::Contribution {
                    from: pk(2),
                    envelope: a.clone(),
                },
            ));
        }
        if let Some(n) = new_state(&all) {
            adopted = Some(n.clone());
            break;
        }
    }
    let n = adopted.expect("adopted after the replay");
    assert_eq!(n.hash, truth);
    assert!(matches!(
        n.how,
        How::Synced {
            verified: "replay",
            ..
        }
    ));
    assert_eq!(m.round(), 1);
}

#[test]
fn peers_on_another_state_are_not_waited_for() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: contribution(2, 0, g, 0.2, 3),
        },
    );
    // Peer 3 trains round 0 from another state: its contribution would be refused, so the
    // round does not wait for it.
    let other = Hash32::of(&[b"another state of round 0"]);
    m.handle(
        T0 + 1_150,
        Input::Status {
            from: pk(3),
            status: status(0, other, Phase::Training, T0 + 1_150),
        },
    );
    let (at, _, _) = run_until_new_state(&mut m, T0 + 1_200, T0 + 100_000, |k, now| {
        let h = if *k == pk(3) { other } else { g };
        Some(status(0, h, Phase::Training, now))
    })
    .expect("closed");
    assert!(at < T0 + 10_000, "waited until {at}");
}

#[test]
fn an_unverified_better_state_holds_training_back_a_few_times() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let ahead = |at: Millis| Status {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, Hash32::of(&[b"ahead"]), Phase::Ready, at)
    };
    m.handle(
        T0,
        Input::Status {
            from: pk(2),
            status: ahead(T0),
        },
    );
    let mut now = T0;
    let mut stalls = 0;
    let mut trained_at = None;
    for _ in 0..400 {
        now += CONFIRM_MS;
        let outs = m.handle(now, Input::Tick);
        let mut all = answer_asks(&mut m, now, &outs, |_| Some(ahead(now)));
        all.extend(outs);
        // The holder never has the contribution: the replay fails through no fault of the claim.
        for o in all.clone() {
            if let Output::Fetch {
                from,
                round,
                sender,
            } = o
            {
                all.extend(m.handle(
                    now,
                    Input::NotFound {
                        from,
                        round,
                        sender,
                    },
                ));
            }
        }
        stalls += notes(&all)
            .iter()
            .filter(|n| matches!(n, Note::Stalled { .. }))
            .count();
        if train_of(&all).is_some() {
            trained_at = Some(now);
            break;
        }
    }
    assert_eq!(stalls as u32, MAX_STALLS);
    let at = trained_at.expect("trains in the end");
    assert!(at >= T0 + u64::from(MAX_STALLS) * rules::RETRY_SECS * 1000);
}

#[test]
fn a_fork_formed_by_more_contributions_replaces_ours_by_replay_from_the_state_before() {
    // Round 0 closes at the deadline with our contribution and peer 2's; peer 3's arrived
    // elsewhere: the peers' θ(1) counts all three.
    let (mut m, keys) = node(2);
    let g = m.hash();
    let outs = collecting(&mut m, &keys);
    let (own, a, b) = own_and_two_more(&mut m, &outs, g);
    let (at, ours, _) = run_until_new_state(&mut m, T0 + 1_100, T0 + 200_000, |_, now| {
        Some(status(0, g, Phase::Training, now))
    })
    .expect("the deadline closed our round");
    let How::Stepped(s) = &ours.how else { panic!() };
    assert_eq!(s.contributors, 2);
    let set: BTreeMap<Key, Accepted> = [&own, &a, &b]
        .iter()
        .map(|e| {
            let x = accept::accept(&recipe().context(0, g), e).unwrap();
            (x.sender, x)
        })
        .collect();
    let (theirs, _) = recipe().apply(&genesis(), &set).unwrap();
    let (their_hash, formed) = (theirs.hash(), theirs.formed_by.clone());
    assert_ne!(their_hash, ours.hash);
    // Both peers announce their θ(1): a fork of ours, preferred (three contributions to two).
    let claim = |now: Millis| Status {
        formed_by: formed.clone(),
        ..status(1, their_hash, Phase::Ready, now)
    };
    let mut now = at;
    let mut outs = vec![];
    for k in &keys {
        outs.extend(m.handle(
            now,
            Input::Status {
                from: *k,
                status: claim(now),
            },
        ));
    }
    let mut adopted = None;
    for _ in 0..200 {
        now += CONFIRM_MS;
        let mut all = std::mem::take(&mut outs);
        all.extend(m.handle(now, Input::Tick));
        let answers = answer_asks(&mut m, now, &all, |_| Some(claim(now)));
        all.extend(answers);
        // Only peer 3's contribution is missing; whoever is asked serves it.
        for o in all.clone() {
            if let Output::Fetch { from, sender, .. } = o {
                let env = if sender == pk(3) {
                    b.clone()
                } else {
                    a.clone()
                };
                all.extend(m.handle(
                    now,
                    Input::Contribution {
                        from,
                        envelope: env,
                    },
                ));
            }
        }
        if let Some(n) = all.iter().find_map(|o| match o {
            Output::NewState(n) if n.hash == their_hash => Some(n.clone()),
            _ => None,
        }) {
            adopted = Some(n);
            break;
        }
        outs = vec![];
    }
    let n = adopted.expect("the preferred fork was replayed and adopted");
    assert!(matches!(
        n.how,
        How::Synced { verified: "replay", reason: "diverged from the swarm", replaced: Some(h), .. } if h == ours.hash
    ));
    assert_eq!((m.round(), m.hash()), (1, their_hash));
}
