//! Real processes on 127.0.0.1 averaging slice by slice (`swarm init --averaging reduce`): each
//! round's contributors reduce one slice of every contribution each, a second checks it, and
//! every node takes the round's step from the co-signed slices.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{TestSwarm, assert_all_finish, val_losses};
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
    swarm.assert_agree(n, rounds);
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
    let (initial, last) = val_losses(&ev);
    let (initial, last) = (initial.unwrap(), last.unwrap());
    assert!(
        last < initial - 0.3,
        "validation loss went {initial} -> {last}"
    );
}
