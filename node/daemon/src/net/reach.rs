//! Reachability: whether peers can dial this node, and how the node is reached when they cannot.
//!
//! - **AutoNAT** (v1): the node asks connected peers to dial it back at the addresses they see it
//!   at; "public" once one succeeds, "private" once one reports that it could not.
//! - **Circuit relay v2**: bootstrap nodes relay by default ([`relay_config`]'s limits). A node
//!   AutoNAT found unreachable reserves a slot on each bootstrap it is connected to, and advertises
//!   the `/p2p-circuit` address; peers that cannot dial it directly dial that.
//! - **DCUtR**: over a relayed connection the two nodes exchange the addresses each is seen at
//!   and dial each other at once (hole punching). On success the relayed connection is closed,
//!   so that the round's traffic goes direct.
//! - **QUIC** listens beside TCP on the same port number (UDP), except in a swarm with a
//!   pre-shared key: pnet runs over TCP only.

use libp2p::multiaddr::Protocol;
use libp2p::{Multiaddr, autonat, relay};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What this node knows of its own reachability (`nightshift status` shows it under
/// `"network"`, `nightshift doctor` explains it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Reachability {
    /// `"unknown"` until a peer has tried to dial this node back, then `"public"` or
    /// `"private"` (behind a NAT or a firewall).
    pub nat: String,
    /// The address a peer dialled this node back at, when public.
    pub public_address: Option<String>,
    /// The addresses this node listens on.
    pub listen: Vec<String>,
    /// The addresses peers see this node's connections come from.
    pub observed: Vec<String>,
    /// Relayed addresses this node holds a reservation on (peers that cannot dial it directly
    /// dial these).
    pub relayed_addresses: Vec<String>,
    /// Peers connected directly, and peers connected through a relay only.
    pub direct_peers: usize,
    pub relayed_peers: usize,
    /// Relayed connections opened so far (in either direction).
    pub relayed_connections: u64,
    /// Hole punches (DCUtR) that turned a relayed connection into a direct one, and those
    /// that failed; the last failure's reason.
    pub hole_punches_succeeded: u64,
    pub hole_punches_failed: u64,
    pub last_hole_punch_error: Option<String>,
    /// Whether this node relays for others (bootstrap nodes do).
    pub relay_server: bool,
    /// Reservations other nodes hold on this relay, and circuits it has carried.
    pub relay_reservations: usize,
    pub relay_circuits: u64,
}

impl Reachability {
    /// Lines for a person: whether this node can be reached, through which addresses, and why
    /// not.
    pub fn explain(&self) -> Vec<String> {
        let mut out = vec![];
        match self.nat.as_str() {
            "public" => out.push(format!(
                "reachable: peers dial this node directly at {}",
                self.public_address
                    .as_deref()
                    .unwrap_or("its listen address")
            )),
            "private" => {
                out.push(
                    "not reachable directly: a peer that tried to dial this node back could not \
                     (a NAT or a firewall is in the way)"
                        .into(),
                );
                if self.relayed_addresses.is_empty() {
                    out.push(
                        "no relay reservation yet: peers cannot reach this node until it holds \
                         one on a bootstrap node (this node can still dial out to public peers)"
                            .into(),
                    );
                } else {
                    out.push(format!(
                        "peers reach this node through the relay at {}; then both sides punch a \
                         hole through their NATs for a direct connection",
                        self.relayed_addresses.join(", ")
                    ));
                }
                out.push(
                    "to be reachable directly, forward the listen port (TCP, and UDP for QUIC) \
                     on the router to this machine, or enable UPnP/NAT-PMP port mapping there"
                        .into(),
                );
            }
            _ => out.push(
                "reachability not known yet: no peer has dialled this node back (it needs a \
                 connection to a bootstrap node or another peer)"
                    .into(),
            ),
        }
        if !self.observed.is_empty() {
            out.push(format!(
                "peers see this node at {}",
                self.observed.join(", ")
            ));
        }
        if self.hole_punches_succeeded + self.hole_punches_failed > 0 {
            out.push(format!(
                "hole punching: {} succeeded, {} failed{}",
                self.hole_punches_succeeded,
                self.hole_punches_failed,
                self.last_hole_punch_error
                    .as_deref()
                    .map(|e| format!(" (last: {e})"))
                    .unwrap_or_default()
            ));
        }
        out.push(format!(
            "peers: {} direct, {} through a relay only",
            self.direct_peers, self.relayed_peers
        ));
        out
    }
}

/// Relay limits of a bootstrap node. The defaults of circuit relay v2 (128 KiB and 2 minutes a
/// circuit) are meant for a hole punch's handshake; a swarm's members may also have to train
/// through the relay when hole punching fails, so a circuit may carry `circuit_bytes` (several
/// rounds of contributions) for up to an hour. The rate limits stay circuit relay's.
pub fn relay_config(circuit_bytes: u64) -> relay::Config {
    relay::Config {
        max_reservations: 512,
        max_reservations_per_peer: 4,
        reservation_duration: Duration::from_secs(3600),
        max_circuits: 128,
        max_circuits_per_peer: 8,
        max_circuit_duration: Duration::from_secs(3600),
        max_circuit_bytes: circuit_bytes,
        ..relay::Config::default()
    }
}

/// AutoNAT probes: the first two seconds after start, then every 30 s until three peers agree,
/// then every 15 minutes. Private addresses are probed too (a swarm may live on one LAN).
pub fn autonat_config() -> autonat::Config {
    autonat::Config {
        boot_delay: Duration::from_secs(2),
        retry_interval: Duration::from_secs(30),
        throttle_server_period: Duration::from_secs(15),
        only_global_ips: false,
        ..autonat::Config::default()
    }
}

/// The QUIC address beside a TCP listen address: the same IP and port number, over UDP
/// (`/ip4/0.0.0.0/tcp/4001` → `/ip4/0.0.0.0/udp/4001/quic-v1`); `None` when `tcp` is not a
/// plain TCP address.
pub fn quic_beside(tcp: &Multiaddr) -> Option<Multiaddr> {
    let mut out = Multiaddr::empty();
    let mut saw_tcp = false;
    for p in tcp.iter() {
        match p {
            Protocol::Ip4(_) | Protocol::Ip6(_) if out.is_empty() => out.push(p),
            Protocol::Tcp(port) if !saw_tcp && !out.is_empty() => {
                out.push(Protocol::Udp(port));
                out.push(Protocol::QuicV1);
                saw_tcp = true;
            }
            _ => return None,
        }
    }
    saw_tcp.then_some(out)
}

/// Whether `addr` is a loopback address (127.0.0.0/8, ::1).
pub fn is_loopback(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| match p {
        Protocol::Ip4(ip) => ip.is_loopback(),
        Protocol::Ip6(ip) => ip.is_loopback(),
        _ => false,
    })
}

/// Whether `addr` goes through a relay.
pub fn is_relayed(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| p == Protocol::P2pCircuit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quic_listens_on_the_tcp_port_number_and_only_beside_plain_tcp() {
        let a: Multiaddr = "/ip4/0.0.0.0/tcp/4001".parse().unwrap();
        assert_eq!(
            quic_beside(&a).unwrap().to_string(),
            "/ip4/0.0.0.0/udp/4001/quic-v1"
        );
        let b: Multiaddr = "/ip6/::1/tcp/0".parse().unwrap();
        assert_eq!(
            quic_beside(&b).unwrap().to_string(),
            "/ip6/::1/udp/0/quic-v1"
        );
        for odd in [
            "/ip4/1.2.3.4/udp/5/quic-v1",
            "/dns4/example.org/tcp/1",
            "/ip4/1.2.3.4",
        ] {
            assert!(quic_beside(&odd.parse().unwrap()).is_none(), "{odd}");
        }
    }

    #[test]
    fn a_private_node_is_told_what_reaches_it_and_what_to_open() {
        let r = Reachability {
            nat: "private".into(),
            relayed_addresses: vec!["/ip4/10.9.0.2/tcp/4001/p2p/R/p2p-circuit".into()],
            observed: vec!["/ip4/10.9.0.11/tcp/4001".into()],
            ..Reachability::default()
        };
        let text = r.explain().join("\n");
        assert!(text.contains("not reachable directly"), "{text}");
        assert!(
            text.contains("through the relay at /ip4/10.9.0.2"),
            "{text}"
        );
        assert!(text.contains("forward the listen port"), "{text}");
        assert!(
            text.contains("peers see this node at /ip4/10.9.0.11"),
            "{text}"
        );
        let unknown = Reachability::default().explain().join("\n");
        assert!(unknown.contains("not known yet"), "{unknown}");
    }
}
