//! A private swarm closed at the door: `swarm init --private` writes a standard libp2p
//! `swarm.key`, and every node of the swarm (the bootstrap included) runs libp2p pnet with it. A
//! stock rust-libp2p client (TCP, pnet, noise, yamux) cannot open a connection without the key;
//! with the key and a key on the allowlist it identifies, pings and finds the nodes with
//! Kademlia; with the key but a key outside the allowlist it is disconnected and served nothing.

use ed25519_dalek::SigningKey;
use futures::StreamExt;
use libp2p::swarm::SwarmEvent;
use libp2p::{Multiaddr, PeerId, identify, kad, ping};
use nightshift_node::events::NodeEvent;
use nightshift_node::net::{libp2p_keypair, protocol_names};
use nightshift_protocol::{Request, SignedManifest};
use nightshift_tests::probe::{self, ProbeEvent, ProbeSwarm};
use nightshift_tests::{TestSwarm, wait_until};
use std::collections::HashMap;
use std::time::Duration;

/// What a probe saw of one peer.
#[derive(Debug, Default)]
struct Seen {
    established: bool,
    closed: bool,
    dial_failed: bool,
    identified: Option<String>,
    pinged: bool,
}

/// Drives `p` for `secs`, dialling `targets`, and reports what it saw of each; with `find`, it
/// also asks Kademlia for closest peers once identified and returns the peers found.
async fn observe(
    p: &mut ProbeSwarm,
    targets: &[Multiaddr],
    secs: u64,
    find: bool,
) -> (HashMap<PeerId, Seen>, Vec<PeerId>) {
    let mut seen: HashMap<PeerId, Seen> = HashMap::new();
    for a in targets {
        if let Some(libp2p::multiaddr::Protocol::P2p(id)) = a.iter().last() {
            p.behaviour_mut().kad.add_address(&id, a.clone());
            seen.entry(id).or_default();
        }
        let _ = p.dial(a.clone());
    }
    let mut found = vec![];
    let mut asked = false;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while let Ok(ev) = tokio::time::timeout_at(deadline, p.select_next_some()).await {
        match ev {
            SwarmEvent::ConnectionEstablished { peer_id, .. } => {
                seen.entry(peer_id).or_default().established = true;
            }
            SwarmEvent::ConnectionClosed { peer_id, .. } => {
                seen.entry(peer_id).or_default().closed = true;
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer_id),
                ..
            } => {
                seen.entry(peer_id).or_default().dial_failed = true;
            }
            SwarmEvent::Behaviour(ProbeEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                ..
            })) => {
                seen.entry(peer_id).or_default().identified = Some(info.agent_version);
                if find && !asked {
                    p.behaviour_mut().kad.get_closest_peers(PeerId::random());
                    asked = true;
                }
            }
            SwarmEvent::Behaviour(ProbeEvent::Ping(ping::Event {
                peer,
                result: Ok(_),
                ..
            })) => seen.entry(peer).or_default().pinged = true,
            SwarmEvent::Behaviour(ProbeEvent::Kad(kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                ..
            })) => found.extend(ok.peers.into_iter().map(|i| i.peer_id)),
            _ => {}
        }
    }
    (seen, found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_libp2p_client_needs_the_swarm_key_and_a_key_on_the_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let member = SigningKey::from_bytes(&[31; 32]);
    let member_file = dir.path().join("member.key.json");
    nightshift_bootstrap::write_key(&member_file, &member).unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        1,
        &[
            "--private",
            "--allow",
            member_file.to_str().unwrap(),
            "--inner-steps",
            "5",
        ],
    );
    let psk_file = dir.path().join("swarm.key");
    let text = std::fs::read_to_string(&psk_file).unwrap();
    assert!(
        text.starts_with("/key/swarm/psk/1.0.0/\n/base16/\n"),
        "{text}"
    );
    let psk = nightshift_bootstrap::read_swarm_key(&psk_file).unwrap();
    let manifest: SignedManifest =
        serde_json::from_str(&std::fs::read_to_string(&swarm.manifest).unwrap()).unwrap();
    assert!(manifest.manifest.psk.is_some());
    let (kad_proto, rr_proto) = protocol_names(&manifest.swarm_id());

    // The bootstrap and a trainer (it picks swarm.key up beside the manifest) run with pnet.
    let (_boot, addr) = swarm.bootstrap();
    let boot_addr: Multiaddr = addr.parse().unwrap();
    let mut node = swarm.node(0, &addr, 1000);
    assert!(
        wait_until(Duration::from_secs(120), || !swarm.events(0).is_empty()),
        "the trainer did not start"
    );
    let node_id: PeerId = swarm
        .events(0)
        .into_iter()
        .find_map(|e| match e {
            NodeEvent::Started { peer_id, .. } => peer_id.parse().ok(),
            _ => None,
        })
        .unwrap();

    // With the key and a member's identity: identify, ping, and Kademlia finds the trainer.
    let mut ok = probe::probe(libp2p_keypair(&member), Some(psk), &kad_proto, &rr_proto);
    let (seen, found) = observe(&mut ok, std::slice::from_ref(&boot_addr), 8, true).await;
    let boot_id = seen.keys().copied().find(|p| *p != node_id).unwrap();
    let b = &seen[&boot_id];
    assert!(
        b.identified
            .as_deref()
            .is_some_and(|v| v.starts_with("nightshift/")),
        "{seen:?}"
    );
    assert!(b.pinged, "no ping answer: {seen:?}");
    assert!(
        found.contains(&node_id),
        "FIND_NODE did not return the trainer: {found:?}"
    );
    let node_addrs: Vec<Multiaddr> = ok
        .behaviour_mut()
        .kad
        .kbuckets()
        .flat_map(|b| {
            b.iter()
                .filter(|e| *e.node.key.preimage() == node_id)
                .flat_map(|e| e.node.value.iter().cloned().collect::<Vec<_>>())
                .collect::<Vec<_>>()
        })
        .map(|a| a.with(libp2p::multiaddr::Protocol::P2p(node_id)))
        .collect();
    assert!(!node_addrs.is_empty(), "no address for the trainer");
    let status = probe::request(&mut ok, node_id, Request::GetStatus).await;
    assert!(
        matches!(status, Ok(nightshift_protocol::Response::Status(_))),
        "{status:?}"
    );
    drop(ok);

    // Without the key: no connection opens, to the bootstrap or to the trainer.
    let stranger = SigningKey::from_bytes(&[32; 32]);
    let mut no_key = probe::probe(libp2p_keypair(&stranger), None, &kad_proto, &rr_proto);
    let mut targets = vec![boot_addr.clone()];
    targets.extend(node_addrs.iter().cloned());
    // (A handshake without the key may hang until the probe's 10 s transport time-out.)
    let (seen, _) = observe(&mut no_key, &targets, 14, false).await;
    for (peer, s) in &seen {
        assert!(
            !s.established && s.identified.is_none(),
            "{peer} let a client without the swarm key in: {s:?}"
        );
    }
    assert!(
        seen.values().any(|s| s.dial_failed),
        "no dial failed: {seen:?}"
    );
    drop(no_key);

    // With the key but outside the allowlist: disconnected at once, never identified or served.
    let mut outsider = probe::probe(libp2p_keypair(&stranger), Some(psk), &kad_proto, &rr_proto);
    let (seen, _) = observe(&mut outsider, &targets, 6, false).await;
    for (peer, s) in &seen {
        assert!(
            s.identified.is_none() && !s.pinged,
            "{peer} served an identity outside the allowlist: {s:?}"
        );
        assert!(
            !s.established || s.closed,
            "{peer} kept a connection from outside the allowlist: {s:?}"
        );
    }
    let refused = probe::request(&mut outsider, node_id, Request::GetStatus).await;
    assert!(refused.is_err(), "an outsider got {refused:?}");

    node.kill9();
}
