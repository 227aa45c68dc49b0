//! Overlap: the next round's inner steps run while a round is collected, and go out as progress
//! on the state that round formed.

use super::*;

/// A node with overlap on and two peers, all at genesis and ready.
fn overlapping() -> (RoundMachine, Vec<Key>) {
    node_with(
        Config {
            overlap: true,
            ..config(2)
        },
        2,
    )
}

fn trains(outs: &[Output]) -> Vec<(u64, Start)> {
    outs.iter()
        .filter_map(|o| match o {
            Output::Train { round, start, .. } => Some((*round, start.clone())),
            _ => None,
        })
        .collect()
}

fn pushed(outs: &[Output]) -> Option<Arc<SignedEnvelope>> {
    outs.iter().find_map(|o| match o {
        Output::Push { envelope, .. } => Some(envelope.clone()),
        _ => None,
    })
}

#[test]
fn the_next_rounds_steps_run_while_a_round_is_collected_and_go_out_as_progress_on_its_state() {
    let (mut m, keys) = overlapping();
    let g = m.hash();
    // Round 0 trained (θ 0.5 → 0.4): its contribution goes out, and round 1's steps start at
    // once from where these ended.
    let first = collecting(&mut m, &keys);
    assert!(pushed(&first).is_some());
    let t = trains(&first);
    assert!(
        matches!(t.as_slice(), [(1, Start::Continue)]),
        "round 1's steps did not start while round 0 is collected: {t:?}"
    );
    // They end (0.4 → 0.35) before round 0 does: nothing goes out yet.
    let outs = m.handle(
        T0 + 1_050,
        Input::Trained(Trained {
            params: vec![0.35; P],
            ..trained(0.0)
        }),
    );
    assert!(
        pushed(&outs).is_none() && trains(&outs).is_empty(),
        "{outs:?}"
    );
    assert_eq!(m.round(), 0);
    let (_, _, b) = own_and_two_more(&mut m, &first, g);
    m.handle(
        T0 + 1_200,
        Input::Contribution {
            from: pk(3),
            envelope: b,
        },
    );
    // Round 0 closes; the node looks at its peers (on θ(1) too) and sends round 1's
    // contribution at once, without training again.
    let mut now = T0 + 1_200;
    let mut pending: Vec<Output> = vec![];
    let mut theta1 = None;
    let mut sent = None;
    let mut next = vec![];
    for _ in 0..100 {
        now += CONFIRM_MS;
        let h1 = theta1
            .as_ref()
            .map(|(_, h): &(Arc<StateSnapshot>, Hash32)| *h);
        let mut outs = answer_asks(&mut m, now, &pending, |k| match h1 {
            Some(h) => Some(status(1, h, Phase::Training, now)),
            None => Some(status(0, g, Phase::Collecting, now).with_holding(vec![*k])),
        });
        outs.extend(m.handle(now, Input::Tick));
        if let Some(n) = new_state(&outs) {
            theta1 = Some((n.state.clone(), n.hash));
        }
        assert!(
            !trains(&outs)
                .iter()
                .any(|(_, s)| matches!(s, Start::State { .. })),
            "trained round 1 again from θ(1)"
        );
        if let Some(e) = pushed(&outs) {
            sent = Some(e);
            next = trains(&outs);
            break;
        }
        pending = outs;
    }
    let (state1, h1) = theta1.expect("round 0 closed");
    let env = sent.expect("round 1's contribution went out once θ(1) was formed");
    assert_eq!((env.header.round, env.header.base_hash), (1, h1));
    let acc = accept::accept(&recipe().context(1, h1), &env).expect("a valid contribution");
    // Its delta is the progress of the steps that ran ahead: 0.4 − 0.35.
    for d in &acc.delta {
        assert!((d - 0.05).abs() < 1e-6, "{:?}", acc.delta);
    }
    assert_eq!(m.stage(), "collecting");
    // Round 2's steps start from θ(1) plus that progress, not averaged yet.
    let [(2, Start::Params(p))] = next.as_slice() else {
        panic!("round 2's steps did not start from θ(1) plus the progress: {next:?}")
    };
    for (x, th) in p.iter().zip(&state1.params) {
        assert!((x - (th - 0.05)).abs() < 1e-6);
    }
}

#[test]
fn no_steps_run_ahead_of_the_last_round_or_without_overlap() {
    // Without overlap: the next round trains only once θ(1) is formed.
    let (mut m, keys) = node(2);
    let outs = collecting(&mut m, &keys);
    assert!(trains(&outs).is_empty());
    // The last round: nothing to run ahead for.
    let (mut m, _) = node_with(
        Config {
            overlap: true,
            rounds: Some(1),
            ..config(2)
        },
        2,
    );
    let outs = collecting(&mut m, &keys);
    assert!(pushed(&outs).is_some());
    assert!(trains(&outs).is_empty(), "{:?}", trains(&outs));
}

#[test]
fn steps_ahead_stopped_by_a_closing_window_still_go_out_for_their_round() {
    let (mut m, keys) = overlapping();
    let g = m.hash();
    let first = collecting(&mut m, &keys);
    assert_eq!(trains(&first).len(), 1);
    // The window closes while round 1's steps run ahead and round 0 is collected.
    m.handle(T0 + 1_020, Input::Window(false));
    let (_, _, b) = own_and_two_more(&mut m, &first, g);
    m.handle(
        T0 + 1_200,
        Input::Contribution {
            from: pk(3),
            envelope: b,
        },
    );
    let mut now = T0 + 1_200;
    let mut pending: Vec<Output> = vec![];
    let mut h1 = None;
    for _ in 0..20 {
        now += CONFIRM_MS;
        let mut outs = answer_asks(&mut m, now, &pending, |k| match h1 {
            Some(h) => Some(status(1, h, Phase::Training, now)),
            None => Some(status(0, g, Phase::Collecting, now).with_holding(vec![*k])),
        });
        outs.extend(m.handle(now, Input::Tick));
        if let Some(n) = new_state(&outs) {
            h1 = Some(n.hash);
        }
        pending = outs;
    }
    let h1 = h1.expect("round 0 closed");
    assert_eq!(m.stage(), "paused");
    // The steps stop after 3 of 10: they still go out, for round 1.
    let mut outs = m.handle(
        now,
        Input::Trained(Trained {
            steps: 3,
            tokens: 300,
            yielded: true,
            params: vec![0.38; P],
            ..trained(0.0)
        }),
    );
    for _ in 0..20 {
        if pushed(&outs).is_some() {
            break;
        }
        now += CONFIRM_MS;
        let mut more = answer_asks(&mut m, now, &outs, |_| {
            Some(status(1, h1, Phase::Training, now))
        });
        more.extend(m.handle(now, Input::Tick));
        outs = more;
    }
    let env = pushed(&outs).expect("the steps done went out");
    assert_eq!((env.header.round, env.header.base_hash), (1, h1));
    assert!(
        trains(&outs).is_empty(),
        "trained while the window is closed"
    );
}
