//! Hostile peers against real nodes (processes on 127.0.0.1). The attacker is
//! `nightshift-hostile`, a plain rust-libp2p peer run as its own process: a member announcing
//! forged states (zero θ formed by itself, one and five rounds ahead; the genesis state
//! relabelled five rounds ahead), an outsider doing the same to an open swarm, an outsider
//! knocking at a private swarm, and a member replaying old contributions, sending malformed
//! frames and flooding requests. The honest nodes must finish their rounds on states they
//! verified, agree on every round (every state each of them ever held for it), learn, and keep
//! their memory bounded.
//!
//! The scenarios run one at a time (a lock): each is a swarm of processes on a 2-core machine.

mod helpers;

use helpers::{
    EXIT_TIMEOUT, HostileArgs, MAX_NODE_HWM_KIB, assert_finished, assert_unmoved, forged_hashes,
    hostile, keygen, listen_addr, min_round, open_swarm, private_swarm, rounds_counting, scratch,
    serial, start_nodes, stop_nodes, u, vm_hwm_kib, wait_training,
};
use nightshift_node::events::NodeEvent;
use nightshift_tests::{TestSwarm, wait_until};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[test]
fn a_member_announcing_a_forged_state_changes_no_honest_nodes_state() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let hostile_key = dir.join("hostile.key.json");
    keygen(&hostile_key);
    // 3 honest members and the hostile one: the default quorum, ⌊(4 − 1)/3⌋ + 1 = 2, is more
    // than the hostile member alone.
    let swarm = private_swarm(&dir, 3, Some(&hostile_key));
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 8;
    let mut nodes = start_nodes(&swarm, &addr, rounds);
    wait_training(&swarm);

    let forge = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "forge",
            key: Some(&hostile_key),
            swarm_key: Some(&swarm_key),
            secs: 600,
            tag: "forge",
        },
    );
    assert!(
        wait_until(Duration::from_secs(300), || min_round(&swarm) >= rounds / 2),
        "the swarm did not reach round {}",
        rounds / 2
    );
    let forged = forge.stop();
    let relabel = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "relabel",
            key: Some(&hostile_key),
            swarm_key: Some(&swarm_key),
            secs: 600,
            tag: "relabel",
        },
    );
    // Wait for the nodes while the relabelled genesis is announced.
    assert!(
        wait_until(EXIT_TIMEOUT, || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Stopped { .. })))),
        "the nodes did not stop"
    );
    let relabelled = relabel.stop();
    assert_finished(&swarm, &mut nodes, rounds);

    for r in [&forged, &relabelled] {
        assert!(
            u(r, "connected_peers") >= 3 && u(r, "statuses_opened") > 0,
            "the hostile member never reached the swarm: {r}"
        );
        assert!(u(r, "announced") > 0, "nothing was announced: {r}");
    }
    // The forged states were considered (a replay asked for the hostile's contribution) and
    // refused.
    assert!(
        u(&forged, "contributions_served") > 0,
        "no node tried to verify the forged state: {forged}"
    );
    let peer = forged["peer_id"].as_str().unwrap().to_string();
    let all_forged = forged_hashes(&[&forged, &relabelled]);
    assert_unmoved(&swarm, &[peer], &all_forged);
    println!(
        "rounds that counted the hostile member's contribution: {:?}",
        rounds_counting(&swarm, forged["public_key"].as_str().unwrap())
    );
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn an_outsider_announcing_a_forged_state_to_an_open_swarm_changes_nothing() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let swarm = open_swarm(&dir, 3);
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 6;
    let mut nodes = start_nodes(&swarm, &addr, rounds);
    wait_training(&swarm);
    // A fresh key: in an open swarm anyone may connect.
    let forge = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "forge",
            key: None,
            swarm_key: None,
            secs: 600,
            tag: "forge",
        },
    );
    assert!(
        wait_until(EXIT_TIMEOUT, || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Stopped { .. })))),
        "the nodes did not stop"
    );
    let forged = forge.stop();
    assert_finished(&swarm, &mut nodes, rounds);
    assert!(
        u(&forged, "connected_peers") >= 3 && u(&forged, "announced") > 0,
        "the outsider never reached the swarm: {forged}"
    );
    assert!(
        u(&forged, "contributions_served") > 0,
        "no node tried to verify the forged state: {forged}"
    );
    let peer = forged["peer_id"].as_str().unwrap().to_string();
    assert_unmoved(&swarm, &[peer], &forged_hashes(&[&forged]));
    println!(
        "rounds that counted the outsider's contribution: {:?}",
        rounds_counting(&swarm, forged["public_key"].as_str().unwrap())
    );
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn an_outsider_cannot_connect_to_a_private_swarm() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let swarm = private_swarm(&dir, 2, None);
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the attempts last: the nodes are stopped (SIGTERM) after them.
    let mut nodes = start_nodes(&swarm, &addr, 10_000);
    wait_training(&swarm);
    let trainer = listen_addr(&swarm, 0).expect("node 0's listen address in its log");
    // Without the swarm key (pnet stops the handshake); with a stolen one (the allowlist gate
    // refuses the key), at the bootstrap and at a trainer directly.
    let attempts = [
        ("no-swarm-key", None, &addr),
        ("stolen-swarm-key", Some(&swarm_key), &addr),
        ("stolen-swarm-key-at-a-trainer", Some(&swarm_key), &trainer),
    ];
    let mut reports = vec![];
    for (tag, psk, target) in attempts {
        let mut h = hostile(
            &swarm,
            target,
            HostileArgs {
                mode: "forge",
                key: None,
                swarm_key: psk.map(PathBuf::as_path),
                secs: 6,
                tag,
            },
        );
        let r = h.finish();
        let (connected, disconnected) = (u(&r, "connected_peers"), u(&r, "disconnected"));
        assert!(
            connected == 0 || disconnected >= connected,
            "{tag}: a connection survived: {r}"
        );
        assert_eq!(u(&r, "connected_at_end"), 0, "{tag}: {r}");
        assert_eq!(u(&r, "answered"), 0, "{tag}: a node answered: {r}");
        assert_eq!(u(&r, "statuses_opened"), 0, "{tag}: {r}");
        assert!(r["honest_round"].is_null(), "{tag}: {r}");
        reports.push(r);
    }
    stop_nodes(&swarm, &mut nodes, 1);
    let peers: Vec<String> = reports
        .iter()
        .map(|r| r["peer_id"].as_str().unwrap().to_string())
        .collect();
    assert_unmoved(&swarm, &peers, &BTreeSet::new());
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn replayed_garbage_and_flooding_peers_change_nothing_and_memory_stays_bounded() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let hostile_key = dir.join("hostile.key.json");
    keygen(&hostile_key);
    let swarm = private_swarm(&dir, 2, Some(&hostile_key));
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the attacks last: the nodes are stopped (SIGTERM) after them.
    let mut nodes = start_nodes(&swarm, &addr, 10_000);
    wait_training(&swarm);
    let pids: Vec<u32> = nodes.iter().map(|n| n.child.id()).collect();
    let hwm = |when: &str| -> Vec<u64> {
        let v: Vec<u64> = pids
            .iter()
            .map(|p| vm_hwm_kib(*p).expect("node process is gone"))
            .collect();
        println!("VmHWM {when}: {v:?} KiB");
        v
    };
    let before = hwm("before the attacks");
    let args = |mode, secs| HostileArgs {
        mode,
        key: Some(&hostile_key),
        swarm_key: Some(&swarm_key),
        secs,
        tag: mode,
    };

    // 1. Replay: the contributions of a round, pushed again two rounds later, until the nodes
    // refused some of them and went two more rounds on.
    let replay = hostile(&swarm, &addr, args("replay", 600));
    let start = min_round(&swarm);
    let hostile_peer = nightshift_node::net::libp2p_keypair(
        &nightshift_bootstrap::read_key(&hostile_key).unwrap(),
    )
    .public()
    .to_peer_id()
    .to_string();
    let refused_replays = |swarm: &TestSwarm| -> Vec<(usize, u64, String)> {
        (0..swarm.nodes)
            .flat_map(|i| {
                swarm
                    .events(i)
                    .into_iter()
                    .filter_map(move |e| match e {
                        NodeEvent::Refused {
                            round,
                            from,
                            reason,
                        } if reason.contains("envelope is for round") => {
                            Some((i, round, from, reason))
                        }
                        _ => None,
                    })
                    .filter(|(_, _, from, _)| *from == hostile_peer)
                    .map(|(i, round, _, reason)| (i, round, reason))
            })
            .collect()
    };
    let refused_ok = wait_until(Duration::from_secs(300), || {
        min_round(&swarm) >= start + 5
            && (0..swarm.nodes).all(|i| refused_replays(&swarm).iter().any(|r| r.0 == i))
    });
    let replayed = replay.stop();
    let refused = refused_replays(&swarm);
    println!(
        "replayed contributions refused: {} (e.g. {:?})",
        refused.len(),
        refused.first()
    );
    assert!(
        u(&replayed, "replays_pushed") > 0,
        "nothing was replayed: {replayed}"
    );
    assert!(
        refused_ok,
        "the nodes did not refuse the replayed contributions (rounds {start} -> {}): {refused:?}",
        min_round(&swarm)
    );

    // 2. Malformed frames, then 3. a flood; the nodes train on under both.
    let mut garbage = hostile(&swarm, &addr, args("garbage", 15));
    let garbaged = garbage.finish();
    assert!(
        u(&garbaged, "requests") > 0 && u(&garbaged, "connected_peers") >= 2,
        "{garbaged}"
    );
    assert_eq!(
        u(&garbaged, "raw_answered"),
        0,
        "a node answered a malformed frame: {garbaged}"
    );
    let round_before_flood = min_round(&swarm);
    let mut flood = hostile(&swarm, &addr, args("flood", 20));
    let flooded = flood.finish();
    assert!(u(&flooded, "requests") > 1000, "{flooded}");
    assert!(
        u(&flooded, "answered") > 0,
        "no request was served: {flooded}"
    );
    let during = hwm("after the flood");
    let after_flood = min_round(&swarm);
    // The nodes go on training; their peak memory is read just before they are stopped.
    assert!(
        wait_until(Duration::from_secs(300), || min_round(&swarm)
            >= after_flood + 2),
        "the nodes stopped making progress after the flood (round {after_flood})"
    );
    let peak = hwm("at the end");
    println!(
        "rounds: replay from {start}, flood from {round_before_flood} to {after_flood}, end {}",
        min_round(&swarm)
    );
    for (i, kib) in peak.iter().enumerate() {
        assert!(
            *kib < MAX_NODE_HWM_KIB,
            "node {i} peaked at {kib} KiB (before the attacks {} KiB, after the flood {} KiB)",
            before[i],
            during[i]
        );
    }
    stop_nodes(&swarm, &mut nodes, 0);
    assert_unmoved(&swarm, &[hostile_peer], &BTreeSet::new());
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}
