//! Real processes on 127.0.0.1 averaging slice by slice (`swarm init --averaging reduce`): each
//! round's contributors reduce one slice of every contribution each, a second checks it, and
//! every node takes the round's step from the co-signed slices.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{TestSwarm, assert_all_finish};
use std::time::Duration;

const EXIT_TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn four_nodes_averaging_slice_by_slice_agree_on_every_round_and_learn() {
    let dir = tempfile::tempdir().unwrap();
    let n = 4;
    let swarm = TestSwarm::create(
        dir.path(),
        n,
        &[
            "--inner-steps",
            "15",
            "--warmup-steps",
            "5",
            "--averaging",
            "reduce",
        ],
    );
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 5;
    let mut nodes: Vec<_> = (0..n).map(|i| swarm.node(i, &addr, rounds)).collect();
    let mut all: Vec<&mut _> = nodes.iter_mut().collect();
    assert_all_finish(&mut all, EXIT_TIMEOUT);
    let h: Vec<_> = (0..n).map(|i| swarm.hashes(i)).collect();
    for round in 1..=rounds {
        let r0 = h[0]
            .get(&round)
            .unwrap_or_else(|| panic!("node 0 has no state for round {round}"));
        for (i, hi) in h.iter().enumerate().skip(1) {
            assert_eq!(
                hi.get(&round),
                Some(r0),
                "node {i} disagrees at round {round}"
            );
        }
    }
    let ev = swarm.events(0);
    // Most rounds counted every node's contribution (the first may start before all joined).
    let full = ev
        .iter()
        .filter(|e| matches!(e, NodeEvent::RoundCompleted(r) if r.contributors == n))
        .count();
    assert!(
        full >= rounds as usize - 1,
        "only {full} rounds had all {n} contributions"
    );
    let initial = ev.iter().find_map(|e| match e {
        NodeEvent::Started { val_loss, .. } => Some(*val_loss),
        _ => None,
    });
    let last = ev.iter().rev().find_map(|e| match e {
        NodeEvent::RoundCompleted(r) => Some(r.val_loss),
        _ => None,
    });
    let (initial, last) = (initial.unwrap(), last.unwrap());
    assert!(
        last < initial - 0.3,
        "validation loss went {initial} -> {last}"
    );
}
