//! Align: waiting for peers, windows, joining late, replaying states ahead and forks, stalls.

use super::*;

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
            status: status(0, h, Phase::Ready, 0).wire(),
        },
    );
    assert!(train_of(&outs).is_none());
    assert_eq!(m.stage(), "starting");
    m.handle(0, Input::Connected(pk(3)));
    let outs = m.handle(
        0,
        Input::Status {
            from: pk(3),
            status: status(0, h, Phase::Ready, 0).wire(),
        },
    );
    // It looks at its peers once more before training.
    let more = answer_asks(&mut m, 10, &outs, |_| Some(status(0, h, Phase::Ready, 10)));
    assert_eq!(train_of(&more), Some((0, None)));
}

#[test]
fn a_closed_window_pauses_and_an_open_one_resumes() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let outs = m.handle(10, Input::Window(false));
    assert!(train_of(&outs).is_none());
    assert_eq!(m.stage(), "paused");
    assert_eq!(m.status().0.phase, Phase::Paused);
    let outs = m.handle(5_000, Input::Window(true));
    // Back at once: peers count on it again before it has looked at them.
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Announce(s, _) if s.phase == Phase::Ready)),
        "{outs:?}"
    );
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
                status: status(0, g, Phase::Training, 2_000).wire(),
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
    let next = formed_by_peer_two(g, &a);
    let ahead = |hash: Hash32, at: Millis| St {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, hash, Phase::Ready, at)
    };
    // A made-up claim first: the same contributions, another hash. It does not replay.
    let fake = Hash32::of(&[b"made up"]);
    let outs = peer_two_claims(&mut m, fake, &a);
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
            status: ahead(truth, now).wire(),
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
fn an_unverified_better_state_holds_training_back_a_few_times() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let ahead = |at: Millis| St {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, Hash32::of(&[b"ahead"]), Phase::Ready, at)
    };
    m.handle(
        T0,
        Input::Status {
            from: pk(2),
            status: ahead(T0).wire(),
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
    let (their_hash, formed) = formed_by_all(g, [&own, &a, &b]);
    assert_ne!(their_hash, ours.hash);
    // Both peers announce their θ(1): a fork of ours, preferred (three contributions to two).
    let claim = |now: Millis| St {
        formed_by: formed.clone(),
        ..status(1, their_hash, Phase::Ready, now)
    };
    // Only peer 3's contribution is missing; whoever is asked serves it.
    let mut adopted = None;
    follow_claim(&mut m, at, &keys, claim, (&a, &b), |all| {
        adopted = all.iter().find_map(|o| match o {
            Output::NewState(n) if n.hash == their_hash => Some(n.clone()),
            _ => None,
        });
        adopted.is_some()
    });
    let n = adopted.expect("the preferred fork was replayed and adopted");
    assert!(matches!(
        n.how,
        How::Synced { verified: "replay", reason: "diverged from the swarm", replaced: Some(h), .. } if h == ours.hash
    ));
    assert_eq!((m.round(), m.hash()), (1, their_hash));
}

#[test]
fn the_budget_follows_the_median_node_not_the_slowest() {
    use crate::machine::align::after::round_budget;
    // Three nodes at 1000 tokens/s and one at 100: the slow one must not set the pace.
    assert_eq!(
        round_budget(vec![1000.0, 100.0, 1000.0, 1000.0], 10_000.0),
        Some(15_000)
    );
    // The slow node gets the same 15 s: it trains 1,500 of its 10,000 tokens, and its
    // contribution (weighted by those tokens) arrives in time. One speed, or none usable: no
    // budget.
    assert!(round_budget(vec![1000.0], 10_000.0).is_none());
    assert!(round_budget(vec![f64::NAN, 0.0, 500.0], 10_000.0).is_none());
    // Rounds of a fraction of a second: a busy machine, not a slow node, would miss 1.5 × the
    // median (0.3 s here), so nobody's steps are cut before two seconds.
    assert_eq!(
        round_budget(vec![10_000.0, 10_000.0], 2_000.0),
        Some(crate::machine::MIN_TRAIN_BUDGET_MS)
    );
}

#[test]
fn a_contribution_pushed_early_serves_the_replay_without_a_fetch() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let next = formed_by_peer_two(g, &a);
    // Peer 2's contribution reaches us before we look at the swarm (we were syncing or waiting),
    // then its status says that contribution formed θ(1).
    m.handle(
        1,
        Input::Contribution {
            from: pk(2),
            envelope: a.clone(),
        },
    );
    let all = peer_two_claims(&mut m, next.hash(), &a);
    // Replayed from what we had: nothing fetched (a lost fetch cannot strand us), θ(1) adopted.
    assert!(
        !all.iter().any(|o| matches!(o, Output::Fetch { .. })),
        "{all:?}"
    );
    assert_eq!(
        new_state(&all).map(|n| n.hash),
        Some(next.hash()),
        "{all:?}"
    );
    assert_eq!(m.round(), 1);
}

#[test]
fn a_holder_answering_with_another_contribution_than_the_claim_names_is_passed_over_at_once() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let named = contribution(2, 0, g, 0.2, 1);
    let other = contribution(2, 0, g, 0.9, 1);
    // Peer 2 claims θ(1) formed by a contribution of its own that it then does not serve.
    let all = peer_two_claims(&mut m, Hash32::of(&[b"claimed"]), &named);
    assert!(
        all.iter()
            .any(|o| matches!(o, Output::Fetch { from, .. } if *from == pk(2))),
        "{all:?}"
    );
    // Its answer is another contribution: the replay gives up now, not after a time-out.
    let outs = m.handle(
        T0 + 20,
        Input::Contribution {
            from: pk(2),
            envelope: other,
        },
    );
    assert!(
        notes(&outs)
            .iter()
            .any(|n| matches!(n, Note::Rejected { .. })),
        "{outs:?}"
    );
    assert_eq!(m.round(), 0);
}

#[test]
fn a_node_that_synced_without_speeds_looks_them_up_and_joins_the_round_late() {
    // A node that just started (no speeds known) replays the state peer 2 trains on.
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let truth = formed_by_peer_two(g, &a).hash();
    let training = |at: Millis| St {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, truth, Phase::Training, at)
    };
    let mut now = T0;
    let mut outs = m.handle(
        now,
        Input::Status {
            from: pk(2),
            status: training(now).wire(),
        },
    );
    let mut all = vec![];
    for _ in 0..200 {
        let mut more = answer_asks(&mut m, now, &outs, |_| Some(training(now)));
        if outs
            .iter()
            .chain(&more)
            .any(|o| matches!(o, Output::Fetch { .. }))
        {
            more.extend(m.handle(
                now,
                Input::Contribution {
                    from: pk(2),
                    envelope: a.clone(),
                },
            ));
        }
        all.append(&mut outs);
        all.append(&mut more);
        if m.round() == 1 && all.iter().any(|o| matches!(o, Output::LookUpSpeeds(_))) {
            break;
        }
        now += CONFIRM_MS;
        outs = m.handle(now, Input::Tick);
    }
    assert_eq!(m.round(), 1, "{all:?}");
    // Without speeds it cannot tell how much of the round is left: it waits, and looks them up
    // (its own record too: the speed of its last run).
    assert!(
        notes(&all)
            .iter()
            .any(|n| matches!(n, Note::WaitingForRoundEnd { round: 1 })),
        "{all:?}"
    );
    let asked = all.iter().find_map(|o| match o {
        Output::LookUpSpeeds(k) => Some(k.clone()),
        _ => None,
    });
    assert_eq!(asked, Some(vec![pk(2), pk(1)]));
    assert!(train_of(&all).is_none());
    // The speeds come back (1,000 tokens a round at 100 tokens/s: 10 s): it joins for the rest.
    for k in [pk(1), pk(2)] {
        m.handle(
            now,
            Input::Speed {
                from: k,
                tokens_per_sec: 100.0,
            },
        );
    }
    let mut joined = vec![];
    for _ in 0..20 {
        now += CONFIRM_MS;
        let outs = m.handle(now, Input::Tick);
        joined.extend(answer_asks(&mut m, now, &outs, |_| Some(training(now))));
        joined.extend(outs);
        if train_of(&joined).is_some() {
            break;
        }
    }
    assert!(
        notes(&joined)
            .iter()
            .any(|n| matches!(n, Note::JoinedLate { round: 1, .. })),
        "{joined:?}"
    );
    let (round, budget) = train_of(&joined).expect("it trains");
    assert_eq!(round, 1);
    assert!(
        budget.is_some_and(|b| b > 2_000 && b < 10_000),
        "{budget:?}"
    );
}

#[test]
fn after_its_last_round_a_node_waits_for_peers_still_collecting_it_and_adopts_their_better_state() {
    // The swarm runs one round. Ours closes at the deadline with two contributions while both
    // peers are still collecting: no next round would repair the fork, so the node waits for
    // them before it finishes, and takes their state formed by all three.
    let (mut m, keys) = node_with(
        Config {
            rounds: Some(1),
            ..config(2)
        },
        2,
    );
    let g = m.hash();
    let outs = collecting(&mut m, &keys);
    let (own, a, b) = own_and_two_more(&mut m, &outs, g);
    let (at, ours, _) = run_until_new_state(&mut m, T0 + 1_100, T0 + 200_000, |_, now| {
        Some(status(0, g, Phase::Collecting, now))
    })
    .expect("the deadline closed our round");
    assert_eq!((m.round(), m.is_done()), (1, false));
    // Still waiting a while later: the peers are collecting the round.
    let mut now = at;
    for _ in 0..10 {
        now += CONFIRM_MS;
        let outs = m.handle(now, Input::Tick);
        assert!(
            !outs.iter().any(|o| matches!(o, Output::Finished(_))),
            "finished while its peers were still collecting the last round"
        );
        answer_asks(&mut m, now, &outs, |_| {
            Some(status(0, g, Phase::Collecting, now))
        });
    }
    assert_eq!(m.stage(), "aligning");
    let (their_hash, formed) = formed_by_all(g, [&own, &a, &b]);
    assert_ne!(their_hash, ours.hash);
    let claim = |now: Millis| St {
        formed_by: formed.clone(),
        ..status(1, their_hash, Phase::Ready, now)
    };
    let (mut adopted, mut finished) = (false, false);
    follow_claim(&mut m, now, &keys, claim, (&a, &b), |all| {
        adopted |= all
            .iter()
            .any(|o| matches!(o, Output::NewState(n) if n.hash == their_hash));
        finished |= all.iter().any(|o| matches!(o, Output::Finished(_)));
        finished
    });
    assert!(
        adopted,
        "the better state of the last round was not adopted"
    );
    assert!(finished, "the node did not finish after its last look");
    assert_eq!((m.round(), m.hash()), (1, their_hash));
}

#[test]
fn a_claim_is_replayed_only_from_a_list_that_checks_and_passed_over_when_none_comes() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let next = formed_by_peer_two(g, &a);
    let claim = |at: Millis| St {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, next.hash(), Phase::Ready, at)
    };
    // Peer 2 announces θ(1) (an announcement carries no lists) and answers every look-up with
    // its status alone: the node asks it for the list again and again, fetches nothing, and
    // passes the claim over in the end.
    let mut now = T0;
    let mut all = m.handle(
        now,
        Input::Status {
            from: pk(2),
            status: claim(now).wire(),
        },
    );
    let mut asked_lists = 0;
    while now < T0 + REPLAY_FETCH_MS + 2_000 {
        now += 100;
        let outs = m.handle(now, Input::Tick);
        for o in all.iter().chain(&outs) {
            match o {
                Output::AskStatuses(peers) | Output::AskLists(peers) => {
                    asked_lists += usize::from(matches!(o, Output::AskLists(_)));
                    for p in peers {
                        m.handle(
                            now,
                            Input::StatusAnswer {
                                from: *p,
                                status: Some(claim(now).wire()),
                                lists: None,
                            },
                        );
                    }
                }
                Output::Fetch { .. } => panic!("fetched without a list: {o:?}"),
                _ => {}
            }
        }
        all = outs;
        if notes(&all)
            .iter()
            .any(|n| matches!(n, Note::Rejected { .. }))
        {
            break;
        }
    }
    assert!(asked_lists >= 2, "asked {asked_lists} times");
    assert!(
        notes(&all).iter().any(
            |n| matches!(n, Note::Rejected { reason, .. } if reason.contains("no holder sent"))
        ),
        "{all:?}"
    );
    assert_eq!(m.round(), 0);

    // Another node: lists that are not the ones the status commits to are dropped; the true
    // ones start the replay (a fetch of the contribution they name), which adopts θ(1).
    let (mut m, _) = node(1);
    let now = T0;
    let outs = m.handle(
        now,
        Input::Status {
            from: pk(2),
            status: claim(now).wire(),
        },
    );
    let outs = [outs, m.handle(now + 10, Input::Tick)].concat();
    assert!(
        outs.iter().any(|o| matches!(o, Output::AskLists(_))),
        "{outs:?}"
    );
    let other = contribution(2, 0, g, 0.9, 1);
    let forged = Arc::new(StatusLists {
        formed_by: vec![ContributionId::of(&other)],
        holding: vec![],
    });
    let outs = m.handle(
        now + 20,
        Input::StatusAnswer {
            from: pk(2),
            status: Some(claim(now + 20).wire()),
            lists: Some(forged),
        },
    );
    let outs = [outs, m.handle(now + 30, Input::Tick)].concat();
    assert!(
        !outs.iter().any(|o| matches!(o, Output::Fetch { .. })),
        "{outs:?}"
    );
    let outs = m.handle(
        now + 40,
        Input::StatusAnswer {
            from: pk(2),
            status: Some(claim(now + 40).wire()),
            lists: Some(claim(now + 40).lists()),
        },
    );
    let outs = [outs, m.handle(now + 50, Input::Tick)].concat();
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Fetch { sender, .. } if *sender == pk(2))),
        "{outs:?}"
    );
    let outs = m.handle(
        now + 60,
        Input::Contribution {
            from: pk(2),
            envelope: a.clone(),
        },
    );
    assert_eq!(
        new_state(&outs).map(|n| n.hash),
        Some(next.hash()),
        "{outs:?}"
    );
}

#[test]
fn a_claim_whose_holders_moved_on_is_passed_over_at_once() {
    let (mut m, _) = node(1);
    let g = m.hash();
    let a = contribution(2, 0, g, 0.2, 1);
    let next = formed_by_peer_two(g, &a);
    let claim = St {
        formed_by: vec![ContributionId::of(&a)],
        ..status(1, next.hash(), Phase::Ready, T0)
    };
    // Peer 2 announces θ(1) (no lists in an announcement): the node asks for the list.
    let mut outs = m.handle(
        T0,
        Input::Status {
            from: pk(2),
            status: claim.wire(),
        },
    );
    outs.extend(m.handle(T0 + 10, Input::Tick));
    assert!(
        outs.iter().any(|o| matches!(o, Output::AskLists(_))),
        "{outs:?}"
    );
    // Before the list comes, peer 2 trains the next round on another state (its own θ(1)
    // replaced, say): nobody holds the claim any more, and its list will never come. The
    // node gives it up now, not after the whole wait for a list.
    let moved = status(2, Hash32::of(&[b"elsewhere"]), Phase::Training, T0 + 20);
    outs = m.handle(
        T0 + 20,
        Input::Status {
            from: pk(2),
            status: moved.wire(),
        },
    );
    outs.extend(m.handle(T0 + 30, Input::Tick));
    assert!(
        notes(&outs)
            .iter()
            .any(|n| matches!(n, Note::Rejected { reason, .. } if reason.contains("moved on"))),
        "{outs:?}"
    );
}

#[test]
fn a_starting_node_asks_again_for_statuses_that_never_came() {
    // A peer is connected but its greeting never came (lost, or it restarted under its key
    // while our connection to its old process still stood): the node does not wait for it
    // forever but asks, and starts once the answer shows a live trainer.
    let mut m = RoundMachine::new(config(1), genesis());
    let h = m.hash();
    m.handle(0, Input::Start);
    let outs = m.handle(0, Input::Connected(pk(2)));
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Greet(k) if *k == pk(2)))
    );
    let mut asked = vec![];
    let mut now = 0;
    while now < 2 * STATUS_REFRESH_MS {
        now += 100;
        let outs = m.handle(now, Input::Tick);
        asked.extend(outs.iter().filter_map(|o| match o {
            Output::AskStatuses(p) => Some((now, p.clone())),
            _ => None,
        }));
        assert_eq!(m.stage(), "starting");
        // No answer: the look-up is lost too.
    }
    assert!(asked.len() >= 2, "asked {asked:?}");
    assert!(asked.iter().all(|(_, p)| p == &vec![pk(2)]), "{asked:?}");
    let gaps: Vec<Millis> = asked.windows(2).map(|w| w[1].0 - w[0].0).collect();
    assert!(gaps.iter().all(|g| *g >= STATUS_REFRESH_MS), "{gaps:?}");
    // The answer comes: the node begins its round.
    m.handle(
        now,
        Input::StatusAnswer {
            from: pk(2),
            status: Some(status(0, h, Phase::Collecting, now).wire()),
            lists: None,
        },
    );
    m.handle(now + 10, Input::Tick);
    assert_ne!(m.stage(), "starting");
    // A second connection from the same peer (a restart) is greeted again.
    let outs = m.handle(now + 20, Input::Connected(pk(2)));
    assert!(
        outs.iter()
            .any(|o| matches!(o, Output::Greet(k) if *k == pk(2)))
    );
}
