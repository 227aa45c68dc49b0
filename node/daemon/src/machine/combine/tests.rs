use super::*;
use crate::machine::reducer::tests::{N, contribute, key, rules};
use crate::machine::sliced::accept_header;
use nightshift_protocol::Aggregator;

/// The reduced-slice requests in `out`: (source, slice).
fn asks(out: &[Output]) -> Vec<(Key, u32)> {
    out.iter()
        .filter_map(|o| match o {
            Output::FetchReduced { from, index, .. } => Some((*from, *index)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_replay_asks_again_for_a_reduced_slice_whose_request_went_unanswered() {
    let r = rules(Aggregator::Mean);
    let set: BTreeMap<Key, Accepted> = (0..N)
        .map(|i| {
            let a = accept_header(&r.context(), &contribute(&r, i).0).unwrap();
            (a.sender, a)
        })
        .collect();
    let me = key(0);
    let holders = vec![
        key(1).verifying_key().to_bytes(),
        key(2).verifying_key().to_bytes(),
    ];
    let t0 = 10_000;
    let mut out = vec![];
    // A node replaying the round asks the claim's first holder for every slice's mean.
    let mut comb = Combining::new(
        t0,
        r.clone(),
        None,
        &set,
        me.verifying_key().to_bytes(),
        None,
        holders.clone(),
        &mut out,
    );
    let slices = r.slicing.slices;
    assert_eq!(
        asks(&out),
        (0..slices).map(|j| (holders[0], j)).collect::<Vec<_>>()
    );
    // The holder answers for slice 0 (it has none: the next holder is asked); the other
    // requests are lost. Before the fetch time-out they are asked of the same holder again —
    // a lost request costs a moment, not the whole wait (long enough, in a fast swarm, for
    // the holder to forget the round).
    comb.reduced_not_found(
        t0 + 100,
        holders[0],
        0,
        me.verifying_key().to_bytes(),
        &mut out,
    );
    let mut again = vec![];
    let mut now = t0 + 100;
    while now < t0 + SLICE_FETCH_MS - 100 {
        now += 100;
        let mut o = vec![];
        comb.drive(now, &me, &holders, &mut o);
        again.extend(asks(&o).into_iter().map(|a| (now, a)));
    }
    for j in 1..slices {
        let at: Vec<Millis> = again
            .iter()
            .filter(|(_, a)| *a == (holders[0], j))
            .map(|(t, _)| *t)
            .collect();
        assert!(!at.is_empty(), "slice {j}: {again:?}");
        assert!(at[0] >= t0 + HEDGE_MS && at[0] < t0 + SLICE_FETCH_MS);
    }
    // Slice 0 moved on to the next holder once, and is not asked of the first again.
    assert!(
        !again.iter().any(|(_, a)| *a == (holders[0], 0)),
        "{again:?}"
    );
}

/// Slice fetches and reduced-slice requests in `out`.
fn fetches(out: &[Output]) -> usize {
    out.iter()
        .filter(|o| matches!(o, Output::FetchSlice { .. } | Output::FetchReduced { .. }))
        .count()
}

#[test]
fn a_round_whose_reduced_slices_keep_coming_over_a_slow_link_is_waited_for_not_fetched_again() {
    let r = rules(Aggregator::Mean);
    let sent: Vec<_> = (0..N).map(|i| contribute(&r, i)).collect();
    let set: BTreeMap<Key, Accepted> = sent
        .iter()
        .map(|(env, _)| {
            let a = accept_header(&r.context(), env).unwrap();
            (a.sender, a)
        })
        .collect();
    let members: Vec<Key> = set.keys().copied().collect();
    let slices = r.slicing.slices;
    let idx = |k: &Key| {
        (0..N)
            .find(|i| key(*i).verifying_key().to_bytes() == *k)
            .unwrap()
    };
    // A member that neither reduces nor checks a slice: it waits for every reduced slice.
    let me_i = (0..N)
        .find(|i| {
            let k = key(*i).verifying_key().to_bytes();
            (0..slices).all(|j| {
                let (a, b) = assigned(&members, r.round, j);
                a != k && b != k
            })
        })
        .expect("5 members, 3 slices: two have no slice");
    let me = key(me_i).verifying_key().to_bytes();
    // Each slice's mean, reduced and checked by its two reducers.
    let reduced: Vec<Arc<Reduced>> = (0..slices)
        .map(|j| {
            let mut red = Reducer::new(r.clone(), j);
            for (env, d) in &sent {
                red.offer(&d.slice(env, j as usize)).unwrap();
            }
            let (payload, inputs) = red.reduce(None).unwrap();
            let (a, b) = assigned(&members, r.round, j);
            let signed = vec![
                red.sign(&key(idx(&a)), &payload),
                red.check(&key(idx(&b)), &payload, &inputs).unwrap(),
            ];
            Arc::new(Reduced { signed })
        })
        .collect();
    let t0 = 10_000;
    let mut out = vec![];
    let mut comb = Combining::new(t0, r.clone(), None, &set, me, None, vec![], &mut out);
    assert_eq!(fetches(&out), 0, "a member with no slice fetches none");
    // The means come one by one, each a little under REDUCED_GRACE_MS after the one before
    // (a slow link): the round takes longer than COMBINE_GRACE_MS, yet the node neither asks
    // for them again nor fetches every member's slices to compute them itself.
    let gap = REDUCED_GRACE_MS - 200;
    let peers = members.clone();
    let mut now = t0;
    for (j, red) in reduced.iter().enumerate().take(2) {
        let at = t0 + (j as u64 + 1) * gap;
        while now < at {
            now += 100;
            let mut o = vec![];
            comb.drive(now, &key(me_i), &peers, &mut o);
            assert_eq!(fetches(&o), 0, "at {} ms: {o:?}", now - t0);
        }
        comb.on_reduced(now, members[0], red, me, &mut out);
    }
    // The last one does not come: the node asks its reducers for it once the round has been
    // quiet for REDUCED_GRACE_MS (not REDUCED_GRACE_MS after the round began).
    let quiet = now;
    let mut asked = None;
    while asked.is_none() && now < quiet + COMBINE_GRACE_MS {
        now += 100;
        let mut o = vec![];
        comb.drive(now, &key(me_i), &peers, &mut o);
        assert!(
            !o.iter().any(|x| matches!(x, Output::FetchSlice { .. })),
            "{o:?}"
        );
        if o.iter().any(|x| matches!(x, Output::FetchReduced { .. })) {
            asked = Some(now - quiet);
        }
    }
    let asked = asked.expect("asked for the last mean");
    assert!(
        (REDUCED_GRACE_MS..REDUCED_GRACE_MS + 200).contains(&asked),
        "{asked}"
    );
    assert!(
        now - t0 > COMBINE_GRACE_MS,
        "the round outlasted the fixed grace"
    );
}
