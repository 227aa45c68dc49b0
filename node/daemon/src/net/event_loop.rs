//! The task that owns the swarm, and the handle that talks to it.

use anyhow::Context;
use futures::StreamExt;
use libp2p::core::transport::upgrade::Version;
use libp2p::kad::{self, store::MemoryStore, store::RecordStore};
use libp2p::multiaddr::Protocol;
use libp2p::request_response::{
    self, InboundRequestId, OutboundRequestId, ProtocolSupport, ResponseChannel,
};
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::swarm::{NetworkBehaviour, SwarmEvent, dial_opts::DialOpts};
use libp2p::{
    Multiaddr, PeerId, StreamProtocol, Swarm, Transport, allow_block_list, autonat,
    connection_limits, dcutr, identify, noise, ping, pnet, relay, tcp, yamux,
};
use nightshift_protocol::message::{open_window, window_key};
use nightshift_protocol::{Hash32, Request, Response, SignedEnvelope, Status, StatusLists, wire};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::StatusCheck;
use super::codec::{TrafficCounters, WireCodec};
use super::limits::{PeerLimits, Verdict};
use super::reach::Reachability;

mod build;
mod dht;
mod inbound;
mod nat;

pub use super::served::{Served, ServedHandle, encode_state};

/// How long one request may take before it fails.
pub const REQUEST_TIMEOUT_SECS: u64 = 120;
/// How long a window record lives in Kademlia without a refresh.
pub const WINDOW_TTL_SECS: u64 = 600;
/// How long the node waits for a listen address that suits a bootstrap address before dialling
/// it anyway.
const BOOTSTRAP_DIAL_WAIT_MS: u64 = 2000;
/// How often the node looks for more swarm peers through Kademlia.
const DISCOVERY_INTERVAL_MS: u64 = 2000;

/// One pushed contribution waiting in the round task's queue; dropping it (once the event is
/// handled) frees the sender's slot. A peer may have [`MAX_QUEUED_PUSHES_PER_PEER`] queued, so
/// pushes sent faster than the round task takes them are dropped instead of piling up in memory.
#[derive(Debug)]
pub struct PushTicket(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PushTicket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Pushed contributions of one peer that may wait, unhandled, in the round task's queue (an
/// honest peer pushes one a round).
pub const MAX_QUEUED_PUSHES_PER_PEER: usize = 4;

/// Something the network saw that the round task should know.
#[derive(Debug)]
pub enum NetEvent {
    /// A peer pushed a contribution (not yet verified). The ticket counts it among the
    /// peer's pushes waiting to be handled until the event is dropped.
    ContributionPushed {
        peer: PeerId,
        envelope: SignedEnvelope,
        ticket: PushTicket,
    },
    /// A peer announced its status, signed by its own key and checked (swarm, membership,
    /// time) by [`StatusCheck`]; unsigned and outsiders' statuses never get here.
    StatusAnnounced {
        peer: PeerId,
        status: Status,
    },
    /// A peer pushed a reduced slice (not yet verified).
    ReducedPushed {
        peer: PeerId,
        reduced: nightshift_protocol::slices::Reduced,
    },
    PeerConnected(PeerId),
    PeerDisconnected(PeerId),
}

#[derive(NetworkBehaviour)]
struct Behaviour {
    /// In a swarm with an allowlist, refuses every connection from or to a key that is not on it
    /// (members and bootstrap nodes), right after the handshake, before any protocol runs.
    gate: Toggle<allow_block_list::Behaviour<allow_block_list::AllowedPeers>>,
    limits: connection_limits::Behaviour,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    kad: kad::Behaviour<MemoryStore>,
    rr: request_response::Behaviour<WireCodec>,
    /// Reservations on relays and circuits through them (see [`super::reach`]).
    relay_client: relay::client::Behaviour,
    /// Relaying for others: on in bootstrap nodes.
    relay: Toggle<relay::Behaviour>,
    /// Hole punching over relayed connections.
    dcutr: dcutr::Behaviour,
    /// Whether peers can dial this node back.
    autonat: autonat::Behaviour,
}

type Reply<T> = oneshot::Sender<T>;

enum Command {
    Dial(Multiaddr, Reply<anyhow::Result<()>>),
    Request {
        peer: PeerId,
        request: Request,
        reply: Reply<anyhow::Result<Response>>,
    },
    Connected(Reply<Vec<PeerId>>),
    ListenAddrs(Reply<Vec<Multiaddr>>),
    PutWindow(SignedEnvelope),
    GetWindow([u8; 32], Reply<Option<SignedEnvelope>>),
}

/// A cloneable handle to the network task. When the task is gone every call fails cleanly.
#[derive(Clone)]
pub struct NetHandle {
    tx: mpsc::Sender<Command>,
    pub local_peer: PeerId,
    pub served: ServedHandle,
    pub traffic: Arc<TrafficCounters>,
    /// This node's reachability, kept up to date by the network task.
    pub reach: Arc<std::sync::RwLock<Reachability>>,
}

impl NetHandle {
    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> anyhow::Result<T> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| anyhow::anyhow!("network task has stopped"))?;
        rx.await
            .map_err(|_| anyhow::anyhow!("network task has stopped"))
    }

    /// Dials `addr`.
    ///
    /// # Errors
    /// When the dial cannot be started.
    pub async fn dial(&self, addr: Multiaddr) -> anyhow::Result<()> {
        self.call(|r| Command::Dial(addr, r)).await?
    }

    /// Sends `request` to `peer` and waits for the answer (bounded by `REQUEST_TIMEOUT_SECS`).
    ///
    /// # Errors
    /// On any transport failure or time-out.
    pub async fn request(&self, peer: PeerId, request: Request) -> anyhow::Result<Response> {
        self.call(|reply| Command::Request {
            peer,
            request,
            reply,
        })
        .await?
    }

    /// Peers with an open connection.
    pub async fn connected(&self) -> Vec<PeerId> {
        self.call(Command::Connected).await.unwrap_or_default()
    }

    /// Publishes our signed window record in Kademlia (locally and at the closest peers).
    pub async fn put_window(&self, env: SignedEnvelope) {
        let _ = self.tx.send(Command::PutWindow(env)).await;
    }

    /// Looks up `sender`'s newest verified window record in Kademlia.
    pub async fn get_window(&self, sender: [u8; 32]) -> Option<SignedEnvelope> {
        self.call(|r| Command::GetWindow(sender, r))
            .await
            .ok()
            .flatten()
    }

    /// Serves `status` (our signed status) and the lists it commits to from now on.
    pub fn serve_status(&self, status: Arc<SignedEnvelope>, lists: Arc<StatusLists>) {
        self.served.update(|s| {
            s.status = Some(status);
            s.status_lists = Some(lists);
        });
    }

    /// Announces `status` (our signed status, without its lists) to `peers` in the background,
    /// each announcement bounded by `timeout` (best effort).
    pub fn announce_status(
        &self,
        status: Arc<SignedEnvelope>,
        peers: impl IntoIterator<Item = PeerId>,
        timeout: Duration,
    ) {
        for peer in peers {
            let net = self.clone();
            let status = status.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(
                    timeout,
                    net.request(peer, Request::Announce((*status).clone())),
                )
                .await;
            });
        }
    }

    /// Asks every peer of `peers` for its status (each bounded by `timeout`), with the lists it
    /// commits to when `lists`, and returns those that `check` accepts; refusals are logged.
    pub async fn ask_statuses(
        &self,
        peers: Vec<PeerId>,
        check: &super::StatusCheck,
        timeout: Duration,
        with_lists: bool,
    ) -> Vec<(PeerId, Status, Option<StatusLists>)> {
        let request = if with_lists {
            Request::GetStatusLists
        } else {
            Request::GetStatus
        };
        let asks = peers.into_iter().map(|p| {
            let request = request.clone();
            async move {
                (
                    p,
                    tokio::time::timeout(timeout, self.request(p, request)).await,
                )
            }
        });
        let now = super::unix_ms();
        let mut out = vec![];
        for (p, r) in futures::future::join_all(asks).await {
            let opened = match r {
                Ok(Ok(Response::Status(env))) if !with_lists => {
                    check.open(&p, &env, now).map(|s| (s, None))
                }
                Ok(Ok(Response::StatusLists { status, lists })) if with_lists => check
                    .open_lists(&p, &status, &lists, now)
                    .map(|s| (s, Some(lists))),
                _ => continue,
            };
            match opened {
                Ok((s, l)) => out.push((p, s, l)),
                Err(e) => debug!(peer = %p, reason = %e, "status refused"),
            }
        }
        out
    }

    /// Addresses this node listens on, each ending in `/p2p/<id>`.
    pub async fn listen_addrs(&self) -> Vec<Multiaddr> {
        self.call(Command::ListenAddrs).await.unwrap_or_default()
    }
}

/// How a node's network is set up.
pub struct NetConfig {
    pub keypair: libp2p::identity::Keypair,
    pub swarm_id: Hash32,
    /// Largest frame a peer may send (see [`WireCodec`]).
    pub max_frame: usize,
    pub listen: Multiaddr,
    /// Addresses dialled at the start (bootstrap nodes).
    pub bootstrap: Vec<Multiaddr>,
    /// In a swarm with an allowlist, the only keys that may connect: the members and the
    /// bootstrap nodes ([`nightshift_protocol::Manifest::admitted`]); `None` in an open swarm.
    pub admitted: Option<Vec<[u8; 32]>>,
    /// The swarm's pre-shared key: every connection then runs libp2p pnet under noise, so a
    /// peer without the key cannot complete a handshake at all. pnet works over TCP only.
    pub psk: Option<[u8; 32]>,
    /// Relay circuits for other nodes (bootstrap nodes do), within [`super::reach::relay_config`]'s
    /// limits.
    pub relay_server: bool,
    /// libp2p's metrics to record the swarm's events into (`run --http`).
    pub metrics: Option<libp2p::metrics::Metrics>,
}

/// A relay circuit carries at most this many of the largest frames, then closes (the peers
/// reconnect through a new one, or directly).
const RELAYED_FRAMES_PER_CIRCUIT: u64 = 64;

/// Most connections a node keeps with one peer, and in all.
/// (A relayed connection and direct ones over TCP and QUIC may overlap while a hole is punched.)
const MAX_CONNECTIONS_PER_PEER: u32 = 4;
const MAX_CONNECTIONS: u32 = 512;
const MAX_PENDING_INCOMING: u32 = 64;
/// Concurrent request-response streams on one connection (each may carry a frame of up to
/// `max_frame` bytes).
const MAX_STREAMS_PER_CONNECTION: usize = 16;

/// Builds the swarm, starts listening, dials the bootstrap addresses, and spawns the event loop.
///
/// # Errors
/// When the transport cannot be built or the listen address is refused.
pub fn spawn_network(
    cfg: NetConfig,
    served: ServedHandle,
) -> anyhow::Result<(NetHandle, mpsc::Receiver<NetEvent>)> {
    let NetConfig {
        keypair,
        swarm_id,
        max_frame,
        listen,
        bootstrap,
        admitted,
        psk,
        relay_server,
        metrics,
    } = cfg;
    let protocols = super::protocol_names(&swarm_id);
    let traffic = Arc::new(TrafficCounters::default());
    let kad_proto = StreamProtocol::try_from_owned(protocols.0).context("kad protocol name")?;
    let rr_proto = StreamProtocol::try_from_owned(protocols.1).context("rr protocol name")?;
    let codec = WireCodec::new(max_frame, traffic.clone());
    let admitted_peers: Option<HashSet<PeerId>> = admitted.as_ref().map(|keys| {
        keys.iter()
            .filter_map(super::peer_id_of)
            .chain(std::iter::once(keypair.public().to_peer_id()))
            .collect()
    });
    let status_check = StatusCheck::new(swarm_id, admitted.clone());
    let mut swarm = build::swarm(
        keypair,
        psk,
        relay_server.then_some(max_frame as u64 * RELAYED_FRAMES_PER_CIRCUIT),
        kad_proto.clone(),
        rr_proto,
        codec,
        admitted_peers.clone(),
    )?;
    swarm
        .listen_on(listen.clone())
        .with_context(|| format!("cannot listen on {listen}"))?;
    if psk.is_none()
        && let Some(quic) = super::reach::quic_beside(&listen)
        && let Err(e) = swarm.listen_on(quic.clone())
    {
        warn!(address = %quic, error = %e, "cannot listen for QUIC; TCP only");
    }
    let mut bootstrap_peers = HashMap::new();
    for addr in &bootstrap {
        if let Some(Protocol::P2p(peer)) = addr.iter().last() {
            swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
            bootstrap_peers.insert(peer, addr.clone());
        }
    }
    let (cmd_tx, cmd_rx) = mpsc::channel(256);
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let handle = NetHandle {
        tx: cmd_tx,
        local_peer: *swarm.local_peer_id(),
        served: served.clone(),
        traffic,
        reach: Arc::new(std::sync::RwLock::new(Reachability {
            nat: "unknown".into(),
            relay_server,
            ..Reachability::default()
        })),
    };
    let ev = EventLoop {
        swarm,
        cmds: cmd_rx,
        events: ev_tx,
        served,
        pending: HashMap::new(),
        window_queries: HashMap::new(),
        swarm_id,
        kad_proto,
        listen_addrs: vec![],
        admitted: admitted_peers,
        status_check,
        limits: PeerLimits::default(),
        inflight: HashMap::new(),
        inflight_bytes: HashMap::new(),
        inflight_total: 0,
        queued_pushes: HashMap::new(),
        nat: nat::NatState::new(handle.reach.clone(), bootstrap_peers),
        bootstrap_dials: bootstrap,
        metrics,
    };
    tokio::spawn(ev.run());
    Ok((handle, ev_rx))
}

struct WindowQuery {
    sender: [u8; 32],
    best: Option<SignedEnvelope>,
    reply: Reply<Option<SignedEnvelope>>,
}

struct EventLoop {
    swarm: Swarm<Behaviour>,
    /// libp2p's metrics, when the node serves them (`run --http`).
    metrics: Option<libp2p::metrics::Metrics>,
    cmds: mpsc::Receiver<Command>,
    events: mpsc::Sender<NetEvent>,
    served: ServedHandle,
    pending: HashMap<OutboundRequestId, Reply<anyhow::Result<Response>>>,
    /// Window look-ups in flight: the sender asked for, the best record so far, the reply.
    window_queries: HashMap<kad::QueryId, WindowQuery>,
    swarm_id: Hash32,
    kad_proto: StreamProtocol,
    listen_addrs: Vec<Multiaddr>,
    /// `Some` in a swarm with an allowlist: the peers that may connect (the gate refuses the
    /// others; this set also keeps them out of Kademlia).
    admitted: Option<HashSet<PeerId>>,
    status_check: StatusCheck,
    /// Per-peer request rates.
    limits: PeerLimits,
    /// Inbound requests each peer has in flight (answered but not yet sent).
    inflight: HashMap<PeerId, HashSet<InboundRequestId>>,
    /// Bytes of the large answers (state chunks) in flight, by request, and in all.
    inflight_bytes: HashMap<InboundRequestId, u64>,
    inflight_total: u64,
    /// Pushed contributions of each peer waiting in the round task's queue.
    queued_pushes: HashMap<PeerId, Arc<std::sync::atomic::AtomicUsize>>,
    /// Connections by kind, relay reservations, what AutoNAT and hole punching said.
    nat: nat::NatState,
    /// Bootstrap addresses not dialled yet (see [`EventLoop::dial_bootstraps`]).
    bootstrap_dials: Vec<Multiaddr>,
}

/// Inbound requests one peer may have in flight at once; more are dropped unanswered.
const MAX_INFLIGHT_PER_PEER: usize = 8;
/// State chunks being sent, in bytes over every peer; more chunk requests are refused for now.
const MAX_INFLIGHT_CHUNK_BYTES: u64 = 256 << 20;

impl EventLoop {
    fn admits(&self, peer: &PeerId) -> bool {
        self.admitted.as_ref().is_none_or(|a| a.contains(peer))
    }

    async fn run(mut self) {
        let mut discovery = tokio::time::interval(Duration::from_millis(DISCOVERY_INTERVAL_MS));
        let dial_anyway = tokio::time::sleep(Duration::from_millis(BOOTSTRAP_DIAL_WAIT_MS));
        tokio::pin!(dial_anyway);
        loop {
            tokio::select! {
                () = &mut dial_anyway, if !self.bootstrap_dials.is_empty() => self.dial_bootstraps(None),
                ev = self.swarm.select_next_some() => self.on_swarm_event(ev),
                cmd = self.cmds.recv() => match cmd {
                    Some(c) => self.on_command(c),
                    None => break, // every handle dropped: shut down
                },
                _ = discovery.tick() => self.discover(),
            }
        }
        debug!("network task stopped");
    }

    /// Dials the bootstrap addresses that a connection from `listening` (a TCP address this node
    /// just began to listen on) can reach, or all that are left when `None`. Dialling from the
    /// listen port (TCP port reuse) makes peers see this node at its listen port, which is what
    /// a port-preserving NAT maps it to and what hole punching needs; the port can be used only
    /// once the listener is up.
    fn dial_bootstraps(&mut self, listening: Option<&Multiaddr>) {
        let ip_of = |a: &Multiaddr| {
            a.iter().find_map(|p| match p {
                Protocol::Ip4(ip) => Some(std::net::IpAddr::V4(ip)),
                Protocol::Ip6(ip) => Some(std::net::IpAddr::V6(ip)),
                _ => None,
            })
        };
        let local = match listening {
            Some(a) if a.iter().any(|p| matches!(p, Protocol::Tcp(_))) => match ip_of(a) {
                Some(ip) => Some(ip),
                None => return,
            },
            Some(_) => return,
            None => None,
        };
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.bootstrap_dials)
            .into_iter()
            .partition(|addr| match (local, ip_of(addr)) {
                (None, _) => true,
                (Some(l), Some(r)) => {
                    l.is_ipv4() == r.is_ipv4() && l.is_loopback() == r.is_loopback()
                }
                (Some(_), None) => false,
            });
        self.bootstrap_dials = later;
        for addr in now {
            if let Err(e) = self.swarm.dial(addr.clone()) {
                warn!(%addr, error = %e, "cannot dial bootstrap address");
            }
        }
    }

    fn discover(&mut self) {
        if self.swarm.connected_peers().next().is_some() {
            let me = *self.swarm.local_peer_id();
            self.swarm.behaviour_mut().kad.get_closest_peers(me);
        }
    }

    fn on_command(&mut self, cmd: Command) {
        match cmd {
            Command::Dial(addr, reply) => {
                let r = self
                    .swarm
                    .dial(addr)
                    .map_err(|e| anyhow::anyhow!("dial: {e}"));
                let _ = reply.send(r);
            }
            Command::Request {
                peer,
                request,
                reply,
            } => {
                let id = self.swarm.behaviour_mut().rr.send_request(&peer, request);
                self.pending.insert(id, reply);
            }
            Command::Connected(reply) => {
                let _ = reply.send(self.swarm.connected_peers().copied().collect());
            }
            Command::ListenAddrs(reply) => {
                let _ = reply.send(self.listen_addrs.clone());
            }
            Command::PutWindow(env) => {
                let key = kad::RecordKey::new(&window_key(&self.swarm_id, &env.header.sender));
                let record = kad::Record::new(key, wire::encode(&env));
                if let Err(e) = self
                    .swarm
                    .behaviour_mut()
                    .kad
                    .put_record(record, kad::Quorum::One)
                {
                    warn!(error = %e, "cannot store our window record");
                }
            }
            Command::GetWindow(sender, reply) => {
                let key = kad::RecordKey::new(&window_key(&self.swarm_id, &sender));
                let id = self.swarm.behaviour_mut().kad.get_record(key);
                self.window_queries.insert(
                    id,
                    WindowQuery {
                        sender,
                        best: None,
                        reply,
                    },
                );
            }
        }
    }

    fn forward(&self, ev: NetEvent) {
        if let Err(e) = self.events.try_send(ev) {
            warn!(error = %e, "round task is not keeping up; dropped a network event");
        }
    }

    fn on_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        if let Some(m) = &self.metrics {
            record(m, &ev);
        }
        match ev {
            SwarmEvent::NewListenAddr {
                address,
                listener_id,
            } => {
                let full = if address
                    .iter()
                    .last()
                    .is_some_and(|p| matches!(p, Protocol::P2p(_)))
                {
                    address
                } else {
                    address.with(Protocol::P2p(*self.swarm.local_peer_id()))
                };
                info!(address = %full, "listening");
                self.dial_bootstraps(Some(&full));
                self.nat.on_listen_addr(listener_id, &full);
                self.listen_addrs.push(full);
            }
            SwarmEvent::ExpiredListenAddr { address, .. } => {
                let full = address
                    .clone()
                    .with(Protocol::P2p(*self.swarm.local_peer_id()));
                self.listen_addrs.retain(|a| *a != address && *a != full);
                self.nat.on_listen_addr_gone(&address);
            }
            SwarmEvent::ListenerClosed { listener_id, .. } => {
                self.nat.on_listener_closed(listener_id);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                num_established,
                endpoint,
                connection_id,
                ..
            } => {
                self.on_connection(peer_id, connection_id, &endpoint);
                debug!(peer = %peer_id, connections = num_established.get(), "connected");
                // Every new connection, not only the first: a peer that restarted under the
                // same key dials in while our connection to its old process (over QUIC, with
                // no close to notice) still counts, and it must be greeted again.
                self.forward(NetEvent::PeerConnected(peer_id));
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } if num_established > 0 => {
                self.nat.on_connection_closed(peer_id, connection_id);
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established: 0,
                ..
            } => {
                self.nat.on_connection_closed(peer_id, connection_id);
                debug!(peer = %peer_id, "disconnected");
                if let Some(ids) = self.inflight.remove(&peer_id) {
                    for id in ids {
                        if let Some(b) = self.inflight_bytes.remove(&id) {
                            self.inflight_total = self.inflight_total.saturating_sub(b);
                        }
                    }
                }
                self.limits.forget(&peer_id);
                self.queued_pushes.remove(&peer_id);
                self.forward(NetEvent::PeerDisconnected(peer_id));
            }
            SwarmEvent::IncomingConnectionError { error, .. } => {
                debug!(%error, "refused an incoming connection");
            }
            SwarmEvent::Behaviour(BehaviourEvent::Identify(identify::Event::Received {
                peer_id,
                info,
                connection_id,
            })) if info.protocols.contains(&self.kad_proto) && self.admits(&peer_id) => {
                self.nat.observed(&info.observed_addr);
                if info.protocols.contains(&relay::HOP_PROTOCOL_NAME) {
                    self.maybe_reserve(peer_id);
                }
                // Only peers that speak this swarm's Kademlia protocol go into the routing table;
                // a peer's loopback addresses only when it is on this machine.
                let local = self.nat.is_loopback(peer_id, connection_id);
                for addr in info.listen_addrs {
                    if local || !super::reach::is_loopback(&addr) {
                        self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                    }
                }
            }
            SwarmEvent::OutgoingConnectionError {
                peer_id: Some(peer),
                error,
                ..
            } => self.on_dial_failed(peer, &error),
            SwarmEvent::Behaviour(BehaviourEvent::Autonat(ev)) => self.on_autonat(ev),
            SwarmEvent::Behaviour(BehaviourEvent::Dcutr(ev)) => self.on_dcutr(ev),
            SwarmEvent::Behaviour(BehaviourEvent::RelayClient(ev)) => self.on_relay_client(ev),
            SwarmEvent::Behaviour(BehaviourEvent::Relay(ev)) => self.nat.on_relay_server(ev),
            SwarmEvent::Behaviour(BehaviourEvent::Kad(ev)) => self.on_kad(ev),
            SwarmEvent::Behaviour(BehaviourEvent::Rr(ev)) => self.on_rr(ev),
            _ => {}
        }
    }
}

/// Records a swarm event, and the protocol events libp2p's metrics know, into `m`.
fn record(m: &libp2p::metrics::Metrics, ev: &SwarmEvent<BehaviourEvent>) {
    use libp2p::metrics::Recorder;
    m.record(ev);
    if let SwarmEvent::Behaviour(b) = ev {
        match b {
            BehaviourEvent::Kad(e) => m.record(e),
            BehaviourEvent::Identify(e) => m.record(e),
            BehaviourEvent::Ping(e) => m.record(e),
            BehaviourEvent::Dcutr(e) => m.record(e),
            BehaviourEvent::Relay(e) => m.record(e),
            _ => {}
        }
    }
}
