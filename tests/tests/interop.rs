//! A plain rust-libp2p peer (TCP + noise + yamux, identify, ping, Kademlia) talks to real nodes:
//! it identifies and pings them, finds the trainers with FIND_NODE on the swarm's protocol, then
//! pushes forged and malformed contributions that the nodes must refuse without losing agreement.
//! The swarm has an allowlist, so the probe connects with a key on it.

use ed25519_dalek::SigningKey;
use futures::StreamExt;
use libp2p::kad;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, identify, ping};
use nightshift_node::events::NodeEvent;
use nightshift_node::net::{libp2p_keypair, protocol_names};
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Contribution, DeltaCodec, PayloadKind, Request, Response, SignedEnvelope, SignedManifest,
    delta, open_status, wire,
};
use nightshift_tests::probe::{self, ProbeEvent, ProbeSwarm};
use nightshift_tests::{TestSwarm, wait_until};
use std::collections::HashSet;
use std::time::Duration;

async fn request(swarm: &mut ProbeSwarm, peer: PeerId, req: Request) -> Response {
    probe::request(swarm, peer, req)
        .await
        .unwrap_or_else(|e| panic!("request failed: {e}"))
}

/// A contribution in the swarm's own codec.
fn signed(
    key: &SigningKey,
    swarm: &SignedManifest,
    round: u64,
    base: nightshift_protocol::Hash32,
    values: &[f32],
    tokens: u64,
) -> SignedEnvelope {
    let codec = swarm.manifest.training.codec;
    signed_as(key, swarm, round, base, codec, values, tokens)
}

fn signed_as(
    key: &SigningKey,
    swarm: &SignedManifest,
    round: u64,
    base: nightshift_protocol::Hash32,
    codec: DeltaCodec,
    values: &[f32],
    tokens: u64,
) -> SignedEnvelope {
    let c = Contribution {
        tokens,
        inner_steps: 1,
        train_loss: 1.0,
        delta: delta::encode(codec, values),
        expected: 2,
    };
    let h = EnvelopeHeader {
        kind: PayloadKind::Contribution,
        swarm_id: swarm.swarm_id(),
        round,
        sender: [0; 32],
        base_hash: base,
    };
    SignedEnvelope::sign(key, h, wire::encode(&c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standard_libp2p_peer_can_identify_ping_and_find_nodes_and_forgeries_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let probe_key = SigningKey::from_bytes(&[66; 32]);
    let probe_key_file = dir.path().join("probe.key.json");
    nightshift_bootstrap::write_key(&probe_key_file, &probe_key).unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &[
            "--inner-steps",
            "60",
            "--warmup-steps",
            "5",
            "--allow",
            probe_key_file.to_str().unwrap(),
        ],
    );
    let manifest: SignedManifest =
        serde_json::from_str(&std::fs::read_to_string(&swarm.manifest).unwrap()).unwrap();
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 6;
    let mut nodes: Vec<_> = (0..2).map(|i| swarm.node(i, &addr, rounds)).collect();
    assert!(wait_until(Duration::from_secs(60), || (0..2)
        .all(|i| !swarm.events(i).is_empty())));
    let started: Vec<(PeerId, usize)> = (0..2)
        .map(|i| {
            swarm
                .events(i)
                .into_iter()
                .find_map(|e| match e {
                    NodeEvent::Started {
                        peer_id,
                        num_params,
                        ..
                    } => Some((peer_id.parse().unwrap(), num_params)),
                    _ => None,
                })
                .unwrap()
        })
        .collect();
    let num_params = started[0].1;

    let (kad_proto, rr_proto) = protocol_names(&manifest.swarm_id());
    let mut p = probe::probe(libp2p_keypair(&probe_key), None, &kad_proto, &rr_proto);
    let boot_addr: Multiaddr = addr.parse().unwrap();
    let Some(libp2p::multiaddr::Protocol::P2p(boot_id)) = boot_addr.iter().last() else {
        panic!("no peer id in {addr}")
    };
    p.behaviour_mut()
        .kad
        .add_address(&boot_id, boot_addr.clone());
    p.dial(boot_addr).unwrap();

    // identify + ping with the bootstrap node, then FIND_NODE for the trainers.
    let (mut identified, mut pinged) = (false, false);
    let mut found: HashSet<PeerId> = HashSet::new();
    let mut addrs: Vec<(PeerId, Vec<Multiaddr>)> = vec![];
    let want: HashSet<PeerId> = started.iter().map(|s| s.0).collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut asked = false;
    while !(identified && pinged && want.is_subset(&found)) {
        let ev = tokio::time::timeout_at(deadline, p.select_next_some())
            .await
            .expect("interop timed out");
        match ev {
            SwarmEvent::Behaviour(ProbeEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) if peer_id == boot_id => {
                assert!(
                    info.agent_version.starts_with("nightshift/"),
                    "{}",
                    info.agent_version
                );
                assert!(
                    info.protocols.iter().any(|pr| pr.as_ref() == kad_proto),
                    "{:?}",
                    info.protocols
                );
                identified = true;
            }
            SwarmEvent::Behaviour(ProbeEvent::Ping(ping::Event {
                peer,
                result: Ok(_),
                ..
            })) if peer == boot_id => pinged = true,
            SwarmEvent::Behaviour(ProbeEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                ..
            })) => {
                for info in ok.peers {
                    found.insert(info.peer_id);
                    addrs.push((info.peer_id, info.addrs));
                }
                asked = false;
            }
            _ => {}
        }
        if identified && !asked && !want.is_subset(&found) {
            p.behaviour_mut().kad.get_closest_peers(PeerId::random());
            asked = true;
        }
    }

    // Dial trainer 0 and push bad contributions bound to its current round and state.
    let (n0, n0_addrs) = addrs
        .iter()
        .find(|(id, _)| *id == started[0].0)
        .cloned()
        .unwrap();
    for a in n0_addrs {
        p.behaviour_mut().kad.add_address(&n0, a);
    }
    let _ = p.dial(n0); // usually connected already by the FIND_NODE query
    let (n1, n1_addrs) = addrs
        .iter()
        .find(|(id, _)| *id == started[1].0)
        .cloned()
        .unwrap();
    for a in n1_addrs {
        p.behaviour_mut().kad.add_address(&n1, a);
    }
    // Pause both trainers (their owners want the machines), so that the round they hold stays
    // the round the bad contributions are bound to until they are resumed. Both must hold the
    // same state: one paused a round behind would, once resumed, catch up by syncing and find
    // the forgeries bound to a round it skipped.
    let control = |cmd: &str| {
        for i in 0..2 {
            nightshift_tests::run_ok(&[
                cmd,
                "--data-dir",
                swarm.dir.join(format!("node{i}")).to_str().unwrap(),
            ]);
        }
    };
    let mut attempt = 0;
    let status = loop {
        attempt += 1;
        control("pause");
        assert!(
            wait_until(Duration::from_secs(120), || (0..2).all(|i| swarm
                .events(i)
                .iter()
                .filter(|e| matches!(e, NodeEvent::Paused { .. }))
                .count()
                >= attempt)),
            "the trainers did not pause"
        );
        let mut held = vec![];
        for n in [n0, n1] {
            held.push(match request(&mut p, n, Request::GetStatus).await {
                Response::Status(env) => open_status(
                    &env,
                    &manifest.swarm_id(),
                    None,
                    nightshift_node::net::unix_ms(),
                )
                .unwrap(),
                other => panic!("unexpected status answer {other:?}"),
            });
        }
        if (held[0].round, held[0].state_hash) == (held[1].round, held[1].state_hash) {
            break held.swap_remove(0);
        }
        assert!(attempt < 5, "the trainers never paused on one state");
        control("resume");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(status.round < rounds - 1, "the swarm finished too early");
    let member = nightshift_bootstrap_key(&swarm, 1);
    let outsider = SigningKey::from_bytes(&[77; 32]);
    let (r, base) = (status.round, status.state_hash);
    let ok = vec![1e-4f32; num_params];
    // The swarm's int4 cannot carry a NaN (it quantises to 0); an infinity poisons its block.
    let mut inf = ok.clone();
    inf[3] = f32::INFINITY;
    let mut unsigned = signed(&member, &manifest, r, base, &ok, 100);
    unsigned.signature.clear();
    let mut tampered = signed(&member, &manifest, r, base, &ok, 100);
    let last = tampered.payload.len() - 1;
    tampered.payload[last] ^= 1;
    // Signed by two members, so that no sender has more than a node keeps waiting per round.
    let bad = [
        unsigned,
        signed(&outsider, &manifest, r, base, &ok, 100),
        tampered,
        signed(&member, &manifest, r + 7, base, &ok, 100),
        signed(
            &probe_key,
            &manifest,
            r,
            nightshift_protocol::Hash32::of(&[b"elsewhere"]),
            &ok,
            100,
        ),
        signed(&probe_key, &manifest, r, base, &ok[1..], 100),
        signed(&probe_key, &manifest, r, base, &inf, 100),
        signed_as(&member, &manifest, r, base, DeltaCodec::Fp32, &ok, 100),
    ];
    // A node queues at most a few unhandled pushes per peer (it refuses more until it has
    // handled them, as while it trains): push each until it is taken.
    let mut queue_full = 0;
    for env in bad {
        let taken = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            match request(&mut p, n0, Request::Push(env.clone())).await {
                Response::Ack => break,
                Response::Refused(why) if why.contains("waiting") => {
                    queue_full += 1;
                    assert!(tokio::time::Instant::now() < taken, "push never taken");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => panic!("unexpected answer to a push: {other:?}"),
            }
        }
    }
    println!("pushes refused while the queue was full: {queue_full}");
    control("resume");

    for n in &mut nodes {
        assert_eq!(
            n.wait_exit(Duration::from_secs(600)),
            Some(true),
            "{} did not finish cleanly",
            n.name
        );
    }
    let reasons: Vec<String> = swarm
        .events(0)
        .into_iter()
        .filter_map(|e| match e {
            NodeEvent::Refused { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    for why in [
        "unsigned",
        "not a member",
        "does not verify",
        &format!("round {}", r + 7),
        "based on state",
        "values, the model has",
        "non-finite",
        "delta sent as fp32, the swarm uses int4:64",
    ] {
        assert!(
            reasons.iter().any(|x| x.contains(why)),
            "no refusal mentioning {why:?} in {reasons:?}"
        );
    }
    // The forgeries changed nothing: the two nodes agree on every round both hold, and both
    // end on the same last state. (A node that fell behind may have caught up by downloading
    // an attested state past a round: it then holds no record of that round.)
    let (h0, h1) = (swarm.hashes(0), swarm.hashes(1));
    for round in 1..=rounds {
        if let (Some(a), Some(b)) = (h0.get(&round), h1.get(&round)) {
            assert_eq!(a, b, "disagreement at round {round}");
        }
    }
    assert!(
        h0.contains_key(&rounds) && h1.contains_key(&rounds),
        "both nodes end on round {rounds}: node 0 {:?}, node 1 {:?}",
        h0.get(&rounds),
        h1.get(&rounds)
    );
    assert!(r < rounds, "the forgeries came before the last round");
    let forks = swarm.forks(2);
    assert!(forks.values().all(|n| *n == 0), "forks: {forks:?}");
    for e in swarm.events(0) {
        if let NodeEvent::RoundCompleted(rec) = e {
            assert!(
                rec.contributors <= 2,
                "round {} counted {} contributors",
                rec.round,
                rec.contributors
            );
        }
    }
}

fn nightshift_bootstrap_key(swarm: &TestSwarm, i: usize) -> SigningKey {
    nightshift_bootstrap::read_key(&swarm.dir.join(format!("node{i}.key.json"))).unwrap()
}
