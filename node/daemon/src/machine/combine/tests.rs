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
