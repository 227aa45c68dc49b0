//! Collection and the step: deadlines, duplicates, reconciling, peers on another state.

use super::*;

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

/// Peer 2's contribution to round 0 (planning for three) arrives.
fn peer_two_sends(m: &mut RoundMachine, g: Hash32) {
    m.handle(
        T0 + 1_100,
        Input::Contribution {
            from: pk(2),
            envelope: contribution(2, 0, g, 0.2, 3),
        },
    );
}

#[test]
fn the_deadline_closes_a_round_without_a_missing_peer() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    peer_two_sends(&mut m, g);
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
    assert_eq!(m.status().0.holding, 2);
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
    assert_eq!(m.status().0.holding, 2);
    // One for the next round: kept for then, not counted now.
    let early = contribution(3, 1, Hash32::of(&[b"next"]), 0.3, 3);
    m.handle(
        T0 + 1_500,
        Input::Contribution {
            from: pk(3),
            envelope: early,
        },
    );
    assert_eq!(m.status().0.holding, 2);
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
        if let Some(f) = fetched_from(&outs, pk(9)) {
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
fn peers_on_another_state_are_not_waited_for() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    peer_two_sends(&mut m, g);
    // Peer 3 trains round 0 from another state: its contribution would be refused, so the
    // round does not wait for it.
    let other = Hash32::of(&[b"another state of round 0"]);
    m.handle(
        T0 + 1_150,
        Input::Status {
            from: pk(3),
            status: status(0, other, Phase::Training, T0 + 1_150).wire(),
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
fn contributions_that_came_before_training_count_or_are_refused_once_it_ends() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    // While the node still waits for its peers' statuses: peer 2's for this round, peer 3's for
    // the next, and one from peer 2 for a round far ahead.
    for (i, round, base) in [(2, 0, g), (3, 1, Hash32::of(&[b"next"])), (2, 7, g)] {
        m.handle(
            1,
            Input::Contribution {
                from: pk(i),
                envelope: contribution(i, round, base, 0.2, 3),
            },
        );
    }
    assert_eq!(m.stash.len(), 3);
    let outs = collecting(&mut m, &keys);
    // This round's counts, the next round's waits, the far one is refused.
    assert_eq!(m.status().0.holding, 2, "{outs:?}");
    assert_eq!(m.stash.len(), 1);
    assert!(
        matches!(notes(&outs)[..], [Note::Refused { round: 0, reason, .. }] if reason.contains("round 7")),
        "{outs:?}"
    );
}

#[test]
fn a_peer_that_dies_during_the_round_is_still_expected_in_it() {
    let (mut m, keys) = node(2);
    let h = m.hash();
    let outs = m.handle(T0, Input::Tick);
    let more = answer_asks(&mut m, T0, &outs, |_| Some(status(0, h, Phase::Ready, T0)));
    assert_eq!(train_of(&[outs, more].concat()).map(|t| t.0), Some(0));
    for k in &keys {
        m.handle(
            T0 + 10,
            Input::Status {
                from: *k,
                status: status(0, h, Phase::Training, T0 + 10).wire(),
            },
        );
    }
    // Peer 3 dies while we train: its contribution will be missing from the round, which the
    // round's plan (the contributions' `expected`) must still count, so that the step shrinks.
    m.handle(T0 + 500, Input::Disconnected(pk(3)));
    let outs = m.handle(T0 + 1_000, Input::Trained(trained(0.1)));
    let own = outs
        .iter()
        .find_map(|o| match o {
            Output::Hold(e) => Some(e.clone()),
            _ => None,
        })
        .expect("our contribution");
    let c: Contribution = wire::decode(&own.payload, own.payload.len()).unwrap();
    assert_eq!(c.expected, 3);
    // Pushed only to the peer still there.
    let pushed = outs.iter().find_map(|o| match o {
        Output::Push { to, .. } => Some(to.clone()),
        _ => None,
    });
    assert_eq!(pushed, Some(vec![pk(2)]));
}

#[test]
fn a_peer_whose_last_status_we_missed_is_looked_at_again_instead_of_waited_for() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    collecting(&mut m, &keys);
    peer_two_sends(&mut m, g);
    // Peer 3 joined mid-round: its "ready" reached us, its "syncing" (it waits for the next
    // round) did not. Asked again, it says so.
    m.handle(
        T0 + 1_150,
        Input::Status {
            from: pk(3),
            status: status(0, g, Phase::Ready, T0 + 1_150).wire(),
        },
    );
    let (at, n, _) = run_until_new_state(&mut m, T0 + 1_200, T0 + 200_000, |k, now| {
        let phase = if *k == pk(3) {
            Phase::Syncing
        } else {
            Phase::Collecting
        };
        Some(status(0, g, phase, now))
    })
    .expect("closed");
    assert!(
        at < T0 + 10_000,
        "waited until {at} for a peer that was not training"
    );
    let How::Stepped(s) = &n.how else { panic!() };
    assert_eq!(s.contributors, 2);
}

#[test]
fn only_peers_whose_sets_differ_from_ours_are_asked_for_their_lists() {
    let (mut m, keys) = node(2);
    let g = m.hash();
    let outs = collecting(&mut m, &keys);
    let (_, _, b) = own_and_two_more(&mut m, &outs, g);
    m.handle(
        T0 + 1_200,
        Input::Contribution {
            from: pk(3),
            envelope: b,
        },
    );
    let same = vec![m.key(), pk(2), pk(3)];
    let more = [same.clone(), vec![pk(9)]].concat();
    // Peer 2 holds what we hold; peer 3 also holds peer 9's (9 is not connected to us).
    let answer = |k: &Key, now: Millis| {
        let holding = if *k == pk(3) {
            more.clone()
        } else {
            same.clone()
        };
        Some(status(0, g, Phase::Collecting, now).with_holding(holding))
    };
    let mut now = T0 + 1_100;
    let mut asked: Vec<Key> = vec![];
    let mut fetched = None;
    let mut pending = vec![];
    for _ in 0..40 {
        now += CONFIRM_MS;
        let mut outs = answer_asks(&mut m, now, &pending, |k| answer(k, now));
        outs.extend(m.handle(now, Input::Tick));
        for o in pending.iter().chain(&outs) {
            if let Output::AskLists(peers) = o {
                asked.extend(peers);
            }
        }
        if let Some(f) = fetched_from(&outs, pk(9)) {
            fetched = Some(f);
            break;
        }
        pending = outs;
    }
    assert!(
        !asked.is_empty() && asked.iter().all(|k| *k == pk(3)),
        "{asked:?}"
    );
    assert_eq!(
        fetched,
        Some(pk(3)),
        "fetched from the peer whose list names it"
    );
}

#[test]
fn a_node_restarted_after_sending_its_slices_sends_the_same_contribution_again() {
    let sliced = || Config {
        recipe: Arc::new(Recipe {
            slicing: Some(sliced::Slicing {
                slices: 2,
                mean_codec: DeltaCodec::Fp32,
            }),
            ..recipe()
        }),
        ..config(1)
    };
    // Round 0 trained once: its slices are held (and kept on disk), its header pushed.
    let (mut m, keys) = node_with(sliced(), 1);
    let outs = collecting(&mut m, &keys);
    let held: Vec<Arc<Slice>> = outs
        .iter()
        .find_map(|o| match o {
            Output::HoldSlices(s) => Some(s.clone()),
            _ => None,
        })
        .expect("slices held");
    let first = outs
        .iter()
        .find_map(|o| match o {
            Output::Push { envelope, .. } => Some(ContributionId::of(envelope)),
            _ => None,
        })
        .expect("header pushed");
    // The node crashes and trains round 0 again from the same state, to other values. Its
    // peers may hold the first contribution already: with its slices back from disk it sends
    // that one again; without them, a second one of its own for the round (a fork).
    let again = |own: Option<Vec<Arc<Slice>>>| {
        let (m, _) = node_with(sliced(), 1);
        let mut m = match own {
            Some(own) => m.with_own_slices(own),
            None => m,
        };
        let h = m.hash();
        let outs = m.handle(T0, Input::Tick);
        answer_asks(&mut m, T0, &outs, |_| Some(status(0, h, Phase::Ready, T0)));
        let outs = m.handle(T0 + 1_000, Input::Trained(trained(0.3)));
        outs.iter()
            .find_map(|o| match o {
                Output::Push { envelope, .. } => Some(ContributionId::of(envelope)),
                _ => None,
            })
            .expect("header pushed")
    };
    assert_eq!(again(Some(held)), first);
    assert_ne!(again(None), first);
}

#[test]
fn reduced_slices_that_come_before_the_round_is_combined_are_all_kept_for_it() {
    // A round of many slices (one per member): while this node still collects, every slice's
    // mean reaches it early. It keeps all of them (it kept 64 and fetched the rest again).
    let members: Vec<Key> = (1..=131).map(pk).collect();
    let cfg = Config {
        recipe: Arc::new(Recipe {
            allowlist: Some(members.clone()),
            slicing: Some(sliced::Slicing {
                slices: 0,
                mean_codec: DeltaCodec::Fp32,
            }),
            ..recipe()
        }),
        ..config(1)
    };
    let swarm_id = cfg.recipe.swarm_id;
    let (mut m, _) = node_with(cfg, 1);
    let base = m.hash();
    // Slice `j`'s mean, signed by key `i` alone (its reducer's, on its way to the checker).
    let mean_of = |j: u32, i: u8| {
        let payload = nightshift_protocol::slices::ReducedSlice {
            index: j,
            slices: 130,
            inputs: Hash32::of(&[b"the round's inputs"]),
            count: 130,
            mean: delta::encode(DeltaCodec::Fp32, &[0.1]),
            mean_sq: 0.0,
            spread: 0.0,
        };
        let signed = vec![nightshift_protocol::slices::sign_reduced(
            &key(i),
            swarm_id,
            0,
            base,
            &payload,
        )];
        Input::Reduced {
            from: pk(i),
            reduced: Arc::new(Reduced { signed }),
        }
    };
    for (j, i) in (2u8..=131).enumerate() {
        m.handle(T0, mean_of(j as u32, i));
    }
    assert_eq!(m.early_reduced.len(), 130);
    // One from outside the swarm is not kept.
    m.handle(T0, mean_of(0, 200));
    assert_eq!(m.early_reduced.len(), 130);
}

#[test]
fn a_collecting_node_asks_the_richest_few_peers_for_their_lists_not_every_richer_one() {
    let (mut m, keys) = node(10);
    let g = m.hash();
    let _ = collecting(&mut m, &keys);
    let me = m.key();
    // Every peer holds more than we do: all of us, and i contributions of senders that are not
    // connected to us (peer 11 the most).
    let holding = |k: &Key| -> Vec<Key> {
        let extra = keys.iter().position(|x| x == k).unwrap_or(0) as u8 + 1;
        [vec![me], keys.clone(), (60..60 + extra).map(pk).collect()].concat()
    };
    let answer =
        |k: &Key, now: Millis| Some(status(0, g, Phase::Collecting, now).with_holding(holding(k)));
    let mut outs = vec![];
    for k in &keys {
        outs.extend(m.handle(
            T0 + 1_100,
            Input::Status {
                from: *k,
                status: answer(k, T0 + 1_100).unwrap().wire(),
            },
        ));
    }
    let extras: BTreeSet<Key> = (60..71).map(pk).collect();
    let mut now = T0 + 1_100;
    let mut asked: Vec<(Millis, Key)> = vec![];
    let mut fetched_from = BTreeSet::new();
    let mut pending = outs;
    while now < T0 + 1_100 + 2 * LOOKUP_MS {
        now += CONFIRM_MS;
        let mut outs = answer_asks(&mut m, now, &pending, |k| answer(k, now));
        outs.extend(m.handle(now, Input::Tick));
        for o in &outs {
            match o {
                Output::AskLists(peers) => asked.extend(peers.iter().map(|p| (now, *p))),
                Output::Fetch { from, sender, .. } if extras.contains(sender) => {
                    fetched_from.insert(*from);
                }
                _ => {}
            }
        }
        pending = outs;
    }
    let first: Vec<Key> = asked
        .iter()
        .filter(|(at, _)| *at < T0 + 1_100 + LOOKUP_MS)
        .map(|(_, p)| *p)
        .collect();
    assert!(
        !first.is_empty() && first.len() <= LIST_ASKS_PER_LOOKUP,
        "asked {} of 10 richer peers for their lists within one look-up: {asked:?}",
        first.len()
    );
    assert_eq!(first[0], pk(11), "the richest peer is asked first");
    // Its list names every sender the others hold: what we lack is fetched from the peers
    // whose lists we asked for.
    assert!(
        !fetched_from.is_empty() && fetched_from.iter().all(|p| first.contains(p)),
        "fetched from {fetched_from:?}"
    );
}
