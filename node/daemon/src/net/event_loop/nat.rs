//! What the event loop does for reachability: AutoNAT's verdicts, relay reservations on the
//! bootstrap nodes, hole punching, and keeping the round's traffic off relays once a direct
//! connection exists (see [`super::super::reach`]).

use super::*;
use libp2p::core::ConnectedPoint;
use libp2p::core::transport::ListenerId;
use libp2p::swarm::ConnectionId;
use std::sync::RwLock;

use super::super::reach::is_relayed;

/// The event loop's reachability book-keeping; [`Reachability`] is its public face.
pub(super) struct Conn {
    id: ConnectionId,
    relayed: bool,
    loopback: bool,
}

pub(super) struct NatState {
    reach: Arc<RwLock<Reachability>>,
    /// The bootstrap nodes' addresses (they relay), by peer.
    bootstraps: HashMap<PeerId, Multiaddr>,
    /// Our relay listeners (reservations, pending or held), by relay.
    reservations: HashMap<PeerId, ListenerId>,
    /// Open connections by peer: relayed or not, over loopback or not.
    conns: HashMap<PeerId, Vec<Conn>>,
    /// Relayed addresses of peers being dialled directly, tried if those dials fail.
    relayed_fallback: HashMap<PeerId, Vec<Multiaddr>>,
    /// AutoNAT's verdict is "private": peers cannot dial this node.
    private: bool,
}

impl NatState {
    pub(super) fn new(
        reach: Arc<RwLock<Reachability>>,
        bootstraps: HashMap<PeerId, Multiaddr>,
    ) -> Self {
        NatState {
            reach,
            bootstraps,
            reservations: HashMap::new(),
            conns: HashMap::new(),
            relayed_fallback: HashMap::new(),
            private: false,
        }
    }

    fn update(&self, f: impl FnOnce(&mut Reachability)) {
        if let Ok(mut r) = self.reach.write() {
            f(&mut r);
        }
    }

    fn count_peers(&self) {
        let direct = self
            .conns
            .values()
            .filter(|c| c.iter().any(|c| !c.relayed))
            .count();
        let relayed = self.conns.len() - direct;
        self.update(|r| {
            r.direct_peers = direct;
            r.relayed_peers = relayed;
        });
    }

    pub(super) fn on_listen_addr(&self, id: ListenerId, addr: &Multiaddr) {
        let relayed = self.reservations.values().any(|l| *l == id);
        self.update(|r| {
            let a = addr.to_string();
            let list = if relayed {
                &mut r.relayed_addresses
            } else {
                &mut r.listen
            };
            if !list.contains(&a) {
                list.push(a);
            }
        });
    }

    pub(super) fn on_listen_addr_gone(&self, addr: &Multiaddr) {
        let a = addr.to_string();
        self.update(|r| {
            r.listen.retain(|x| !x.starts_with(&a));
            r.relayed_addresses.retain(|x| !x.starts_with(&a));
        });
    }

    pub(super) fn on_listener_closed(&mut self, id: ListenerId) {
        if let Some(relay) = self
            .reservations
            .iter()
            .find(|(_, l)| **l == id)
            .map(|(p, _)| *p)
        {
            self.reservations.remove(&relay);
            let r = relay.to_string();
            self.update(|reach| reach.relayed_addresses.retain(|a| !a.contains(&r)));
        }
    }

    pub(super) fn on_connection_closed(&mut self, peer: PeerId, id: ConnectionId) {
        if let Some(c) = self.conns.get_mut(&peer) {
            c.retain(|c| c.id != id);
            if c.is_empty() {
                self.conns.remove(&peer);
            }
        }
        self.count_peers();
    }

    /// Whether connection `id` to `peer` runs over loopback (the peer is on this machine).
    pub(super) fn is_loopback(&self, peer: PeerId, id: ConnectionId) -> bool {
        self.conns
            .get(&peer)
            .is_some_and(|c| c.iter().any(|c| c.id == id && c.loopback))
    }

    pub(super) fn observed(&self, addr: &Multiaddr) {
        if is_relayed(addr)
            || !addr
                .iter()
                .next()
                .is_some_and(|p| matches!(p, Protocol::Ip4(_) | Protocol::Ip6(_)))
        {
            return;
        }
        let a = addr.to_string();
        self.update(|r| {
            if !r.observed.contains(&a) {
                r.observed.push(a);
                // Keep the newest few: ports change behind some NATs.
                if r.observed.len() > 8 {
                    r.observed.remove(0);
                }
            }
        });
    }

    pub(super) fn on_relay_server(&self, ev: relay::Event) {
        match ev {
            relay::Event::ReservationReqAccepted { src_peer_id, .. } => {
                debug!(peer = %src_peer_id, "relaying for a peer (reservation accepted)");
                self.update(|r| r.relay_reservations += 1);
            }
            relay::Event::ReservationClosed { .. } | relay::Event::ReservationTimedOut { .. } => {
                self.update(|r| r.relay_reservations = r.relay_reservations.saturating_sub(1));
            }
            relay::Event::CircuitReqAccepted {
                src_peer_id,
                dst_peer_id,
            } => {
                debug!(src = %src_peer_id, dst = %dst_peer_id, "relaying a circuit");
                self.update(|r| r.relay_circuits += 1);
            }
            relay::Event::CircuitClosed {
                src_peer_id,
                dst_peer_id,
                error,
            } => {
                debug!(src = %src_peer_id, dst = %dst_peer_id, ?error, "relayed circuit closed");
            }
            other => debug!(event = ?other, "relay"),
        }
    }
}

impl EventLoop {
    /// A connection is up: note its kind; a direct connection makes relayed ones to the same
    /// peer redundant (request-response would spread requests over both), so they close.
    pub(super) fn on_connection(
        &mut self,
        peer: PeerId,
        id: ConnectionId,
        endpoint: &ConnectedPoint,
    ) {
        let relayed = endpoint.is_relayed();
        if relayed {
            info!(%peer, "connected through a relay");
            self.nat.update(|r| r.relayed_connections += 1);
        }
        let loopback = super::super::reach::is_loopback(endpoint.get_remote_address());
        self.nat.relayed_fallback.remove(&peer);
        let conns = self.nat.conns.entry(peer).or_default();
        conns.push(Conn {
            id,
            relayed,
            loopback,
        });
        let has_direct = conns.iter().any(|c| !c.relayed);
        let redundant: Vec<ConnectionId> = if has_direct {
            conns.iter().filter(|c| c.relayed).map(|c| c.id).collect()
        } else {
            vec![]
        };
        self.nat.count_peers();
        // A relayed connection that just came up carries the hole punch: keep it until DCUtR
        // has run unless a direct one already exists.
        for c in redundant {
            debug!(%peer, "closing a relayed connection: a direct one is open");
            self.swarm.close_connection(c);
        }
    }

    /// Dials `peer` (a swarm peer found through Kademlia) at its direct addresses first, and at
    /// its relayed ones only if those fail. (One dial over all of them would end at the first
    /// connection made, and a direct address that reaches the wrong machine, as another home's
    /// LAN address may, would end it with an error before the relay had a chance.)
    pub(super) fn dial_peer(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        if peer == *self.swarm.local_peer_id()
            || self.swarm.is_connected(&peer)
            || addrs.is_empty()
            || !self.admits(&peer)
        {
            return;
        }
        let (relayed, direct): (Vec<_>, Vec<_>) = addrs.into_iter().partition(is_relayed);
        let first = if direct.is_empty() {
            relayed
        } else {
            if !relayed.is_empty() {
                self.nat.relayed_fallback.insert(peer, relayed);
            }
            direct
        };
        let opts = DialOpts::peer_id(peer).addresses(first).build();
        if let Err(e) = self.swarm.dial(opts) {
            debug!(%peer, error = %e, "dial failed");
        }
    }

    /// A dial of `peer` failed: try its relayed addresses if its direct ones were tried first.
    pub(super) fn on_dial_failed(&mut self, peer: PeerId, error: &libp2p::swarm::DialError) {
        let Some(relayed) = self.nat.relayed_fallback.remove(&peer) else {
            return;
        };
        if self.swarm.is_connected(&peer) {
            return;
        }
        debug!(%peer, %error, "no direct connection: dialling through the relay");
        let opts = DialOpts::peer_id(peer).addresses(relayed).build();
        if let Err(e) = self.swarm.dial(opts) {
            debug!(%peer, error = %e, "dial failed");
        }
    }

    /// `relay` (a bootstrap node that speaks the relay protocol) is connected: reserve a slot
    /// on it once AutoNAT has found this node unreachable. (Not before: a reachable node that
    /// advertised a relayed address would be dialled through the relay too, and the relayed
    /// connection, closed once a direct one is up, would take its requests with it.)
    pub(super) fn maybe_reserve(&mut self, relay: PeerId) {
        if !self.nat.private || self.nat.reservations.contains_key(&relay) {
            return;
        }
        let Some(addr) = self.nat.bootstraps.get(&relay) else {
            return;
        };
        if is_relayed(addr) {
            return;
        }
        let circuit = addr.clone().with(Protocol::P2pCircuit);
        match self.swarm.listen_on(circuit.clone()) {
            Ok(id) => {
                debug!(address = %circuit, "asking the relay for a reservation");
                self.nat.reservations.insert(relay, id);
            }
            Err(e) => warn!(address = %circuit, error = %e, "cannot listen through the relay"),
        }
    }

    pub(super) fn on_autonat(&mut self, ev: autonat::Event) {
        let autonat::Event::StatusChanged { new, .. } = ev else {
            return;
        };
        match &new {
            autonat::NatStatus::Public(addr) => {
                info!(address = %addr, "reachable: a peer dialled this node back");
                // No new relay slots. Those held stay: removing a relay listener while its
                // reservation is being answered panics libp2p-relay 0.22 (priv_client.rs:303,
                // "Relay connection exist"), and peers dial direct addresses first anyway.
                self.nat.private = false;
                let a = addr.to_string();
                self.nat.update(|r| {
                    r.nat = "public".into();
                    r.public_address = Some(a);
                });
            }
            autonat::NatStatus::Private => {
                info!(
                    "not reachable directly (behind a NAT or a firewall): peers reach this node \
                     through the bootstrap nodes' relays"
                );
                self.nat.private = true;
                self.nat.update(|r| {
                    r.nat = "private".into();
                    r.public_address = None;
                });
                let relays: Vec<PeerId> = self
                    .nat
                    .bootstraps
                    .keys()
                    .filter(|p| self.swarm.is_connected(p))
                    .copied()
                    .collect();
                for p in relays {
                    self.maybe_reserve(p);
                }
            }
            autonat::NatStatus::Unknown => {
                self.nat.private = false;
                self.nat.update(|r| {
                    r.nat = "unknown".into();
                    r.public_address = None;
                });
            }
        }
    }

    pub(super) fn on_dcutr(&mut self, ev: dcutr::Event) {
        let peer = ev.remote_peer_id;
        match ev.result {
            Ok(_) => {
                info!(%peer, "hole punched: connected directly");
                self.nat.update(|r| r.hole_punches_succeeded += 1);
                let relayed: Vec<ConnectionId> = self
                    .nat
                    .conns
                    .get(&peer)
                    .map(|c| c.iter().filter(|c| c.relayed).map(|c| c.id).collect())
                    .unwrap_or_default();
                for c in relayed {
                    self.swarm.close_connection(c);
                }
            }
            Err(e) => {
                info!(%peer, error = %e, "hole punching failed: staying on the relay");
                let e = e.to_string();
                self.nat.update(|r| {
                    r.hole_punches_failed += 1;
                    r.last_hole_punch_error = Some(e);
                });
            }
        }
    }

    pub(super) fn on_relay_client(&mut self, ev: relay::client::Event) {
        match ev {
            relay::client::Event::ReservationReqAccepted {
                relay_peer_id,
                renewal: false,
                ..
            } => {
                info!(relay = %relay_peer_id, "reachable through the relay");
            }
            relay::client::Event::InboundCircuitEstablished { src_peer_id, .. } => {
                debug!(peer = %src_peer_id, "a peer reached this node through a relay");
            }
            _ => {}
        }
    }
}
