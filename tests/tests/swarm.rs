//! Real processes on 127.0.0.1: a bootstrap and three trainers that know only its address.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{TestSwarm, assert_all_finish, val_losses, wait_until};
use std::time::Duration;

const EXIT_TIMEOUT: Duration = Duration::from_secs(600);

/// The swarm sends its deltas as low-rank factors (the most compact codec; the other tests
/// use the default int4), so this also checks that every node decodes them identically.
#[test]
fn three_nodes_find_each_other_and_train_five_rounds_in_agreement() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        3,
        &[
            "--inner-steps",
            "15",
            "--warmup-steps",
            "5",
            "--inner-lr",
            "0.003",
            "--codec",
            "lowrank:4:64",
        ],
    );
    let (_boot, addr) = swarm.bootstrap();
    let mut nodes: Vec<_> = (0..3).map(|i| swarm.node(i, &addr, 5)).collect();
    let mut all: Vec<&mut _> = nodes.iter_mut().collect();
    assert_all_finish(&mut all, EXIT_TIMEOUT);
    swarm.assert_agree(3, 5);
    // No node ever held another state of any round, not even one it repaired later.
    let forks = swarm.forks(3);
    assert!(forks.values().all(|n| *n == 0), "forks: {forks:?}");
    // Every node heard from the two others (so they found each other through Kademlia).
    let full_rounds = swarm
        .events(0)
        .iter()
        .filter(|e| matches!(e, NodeEvent::RoundCompleted(r) if r.contributors == 3))
        .count();
    assert!(
        full_rounds >= 4,
        "only {full_rounds} rounds had all three contributions"
    );
    let ev = swarm.events(0);
    let (initial, last) = val_losses(&ev);
    let (initial, last) = (initial.unwrap(), last.unwrap());
    assert!(
        last < initial - 0.3,
        "validation loss went {initial} -> {last}"
    );
    // The factors are what travelled: far fewer bytes than int4 (8x) would take.
    for e in &ev {
        if let NodeEvent::RoundCompleted(r) = e {
            assert_eq!(r.codec, "lowrank:4:64");
            assert!(
                r.wire_delta_bytes * 16 < r.dense_delta_bytes,
                "{} of {} bytes",
                r.wire_delta_bytes,
                r.dense_delta_bytes
            );
        }
    }
}

#[test]
fn a_killed_node_is_not_waited_for_and_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        3,
        &[
            "--inner-steps",
            "150",
            "--warmup-steps",
            "5",
            "--deadline-secs",
            "120",
        ],
    );
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 14;
    let mut n0 = swarm.node(0, &addr, rounds);
    let mut n1 = swarm.node(1, &addr, rounds);
    let mut n2 = swarm.node(2, &addr, rounds);
    assert!(
        wait_until(Duration::from_secs(300), || swarm.round_of(2) >= 2),
        "the swarm did not reach round 2"
    );
    // SIGKILL in the middle of the next round.
    wait_until(Duration::from_secs(5), || {
        swarm
            .events(2)
            .iter()
            .filter(|e| matches!(e, NodeEvent::RoundCompleted(_)))
            .count()
            >= 2
    });
    n2.kill9();
    let killed_at = swarm.round_of(2);
    // The others finish the round without it (long before the 120 s deadline) and go on.
    assert!(
        wait_until(Duration::from_secs(100), || swarm.round_of(0)
            >= killed_at + 2),
        "the survivors stalled after the kill"
    );
    // Restart with the same store: it resumes from its checkpoint and catches up.
    let mut n2 = swarm.node(2, &addr, rounds);
    assert!(
        wait_until(Duration::from_secs(60), || swarm
            .events(2)
            .iter()
            .any(|e| matches!(e, NodeEvent::Started { resumed: true, .. }))),
        "the restarted node did not resume"
    );
    assert_all_finish(&mut [&mut n0, &mut n1, &mut n2], EXIT_TIMEOUT);
    let started = swarm.events(2).into_iter().find_map(|e| match e {
        NodeEvent::Started {
            round,
            resumed: true,
            ..
        } => Some(round),
        _ => None,
    });
    assert!(
        started.unwrap() >= killed_at,
        "resumed from round {started:?}, had {killed_at}"
    );
    // It took part again after catching up, and everyone ends on the same state.
    let h: Vec<_> = (0..3).map(|i| swarm.hashes(i)).collect();
    assert_eq!(
        h[2].get(&rounds),
        h[0].get(&rounds),
        "the restarted node ended on another state"
    );
    assert_eq!(h[1].get(&rounds), h[0].get(&rounds));
    for (round, hash) in &h[0] {
        for (i, hi) in h.iter().enumerate().skip(1) {
            if let Some(other) = hi.get(round) {
                assert_eq!(other, hash, "node {i} disagrees at round {round}");
            }
        }
    }
    let rejoined = swarm
        .events(2)
        .iter()
        .filter(|e| matches!(e, NodeEvent::RoundCompleted(r) if r.round > killed_at + 2))
        .count();
    assert!(
        rejoined >= 1,
        "the restarted node completed no round after rejoining"
    );
}

#[test]
fn a_node_given_only_the_swarm_id_fetches_the_manifest_from_the_bootstrap() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(dir.path(), 1, &[]);
    let manifest: nightshift_protocol::SignedManifest =
        serde_json::from_str(&std::fs::read_to_string(&swarm.manifest).unwrap()).unwrap();
    let (_boot, addr) = swarm.bootstrap();
    let member_key = dir.path().join("node0.key.json");
    let run = |id: &str, data_dir: &str, key: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(nightshift_tests::nightshift_bin());
        c.args(["run", "--bootstrap", &addr, "--swarm", id, "--rounds", "0"])
            .args([
                "--data-dir",
                dir.path().join(data_dir).to_str().unwrap(),
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
            ]);
        if let Some(k) = key {
            c.args(["--key", k.to_str().unwrap()]);
        }
        c.output().unwrap()
    };
    let id = manifest.swarm_id().to_hex();
    let ok = run(&id, "fetcher", Some(&member_key));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // The fetched manifest was checked against the id and stored.
    let wrong = run(&"ab".repeat(32), "fetcher-wrong", Some(&member_key));
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("manifest"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );
    // The swarm has an allowlist: a key that is not on it is not served the manifest.
    let outsider = run(&id, "outsider", None);
    assert!(!outsider.status.success());
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains("members only"),
        "{}",
        String::from_utf8_lossy(&outsider.stderr)
    );
}

/// An inner learning rate far too high for the model: every round's local training ends with
/// non-finite weights. The node sends none of them, restarts from θ each time, and after three
/// rounds in a row stops with an error that says why, θ(0) untouched.
#[test]
fn a_node_whose_training_goes_non_finite_sends_nothing_and_stops_after_three_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        1,
        &[
            "--inner-steps",
            "3",
            "--warmup-steps",
            "0",
            "--inner-lr",
            "1e30",
        ],
    );
    let (_boot, addr) = swarm.bootstrap();
    let mut node = swarm.node(0, &addr, 5);
    assert_eq!(
        node.wait_exit(EXIT_TIMEOUT),
        Some(false),
        "the node should stop with an error"
    );
    let ev = swarm.events(0);
    let diverged: Vec<(u64, u32)> = ev
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Diverged {
                round, in_a_row, ..
            } => Some((*round, *in_a_row)),
            _ => None,
        })
        .collect();
    assert_eq!(diverged, vec![(0, 1), (0, 2), (0, 3)], "{ev:?}");
    assert!(
        !ev.iter().any(|e| matches!(e, NodeEvent::RoundCompleted(_))),
        "a non-finite round completed: {ev:?}"
    );
    let log = std::fs::read_to_string(dir.path().join(format!("{}.log", node.name))).unwrap();
    assert!(
        log.contains("non-finite in 3 rounds in a row"),
        "the error does not say why: {log}"
    );
}
