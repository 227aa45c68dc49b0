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
    Multiaddr, PeerId, StreamProtocol, Swarm, Transport, allow_block_list, connection_limits,
    identify, noise, ping, pnet, tcp, yamux,
};
use nightshift_protocol::message::{open_window, window_key};
use nightshift_protocol::{Hash32, Request, Response, SignedEnvelope, Status, wire};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::StatusCheck;
use super::codec::{TrafficCounters, WireCodec};
use super::limits::{PeerLimits, Verdict};

mod inbound;

pub use super::served::{Served, ServedHandle, encode_state};

/// How long one request may take before it fails.
pub const REQUEST_TIMEOUT_SECS: u64 = 120;
/// How long a window record lives in Kademlia without a refresh.
pub const WINDOW_TTL_SECS: u64 = 600;
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

    /// Sends `request` to `peer` and waits for the answer (bounded by [`REQUEST_TIMEOUT_SECS`]).
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

    /// Serves `status` (our signed status) from now on and announces it to `peers` in the
    /// background, each announcement bounded by `timeout` (best effort).
    pub fn announce_status(
        &self,
        status: Arc<SignedEnvelope>,
        peers: impl IntoIterator<Item = PeerId>,
        timeout: Duration,
    ) {
        self.served.update(|s| s.status = Some(status.clone()));
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

    /// Asks every peer of `peers` for its status (each bounded by `timeout`) and returns those
    /// that `check` accepts; refusals are logged.
    pub async fn ask_statuses(
        &self,
        peers: Vec<PeerId>,
        check: &super::StatusCheck,
        timeout: Duration,
    ) -> Vec<(PeerId, Status)> {
        let asks = peers.into_iter().map(|p| async move {
            (
                p,
                tokio::time::timeout(timeout, self.request(p, Request::GetStatus)).await,
            )
        });
        let now = super::unix_ms();
        let mut out = vec![];
        for (p, r) in futures::future::join_all(asks).await {
            if let Ok(Ok(Response::Status(env))) = r {
                match check.open(&p, &env, now) {
                    Ok(s) => out.push((p, s)),
                    Err(e) => debug!(peer = %p, reason = %e, "status refused"),
                }
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
}

/// Most connections a node keeps with one peer, and in all.
const MAX_CONNECTIONS_PER_PEER: u32 = 2;
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
    let psk = psk.map(pnet::PreSharedKey::new);
    let mut swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
        .with_tokio()
        .with_other_transport(
            |key| -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
                let base = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
                let maybe_private =
                    match psk {
                        Some(psk) => either::Either::Left(base.and_then(move |socket, _| {
                            pnet::PnetConfig::new(psk).handshake(socket)
                        })),
                        None => either::Either::Right(base),
                    };
                Ok(maybe_private
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default())
                    .timeout(Duration::from_secs(20)))
            },
        )?
        .with_behaviour(|key| {
            let peer = key.public().to_peer_id();
            let mut kcfg = kad::Config::new(kad_proto.clone());
            kcfg.set_query_timeout(Duration::from_secs(30));
            // Records are verified (signed window records of this swarm) before they are stored.
            kcfg.set_record_filtering(kad::StoreInserts::FilterBoth);
            kcfg.set_record_ttl(Some(Duration::from_secs(WINDOW_TTL_SECS)));
            let mut kad = kad::Behaviour::with_config(peer, MemoryStore::new(peer), kcfg);
            kad.set_mode(Some(kad::Mode::Server));
            let gate = admitted_peers.as_ref().map(|peers| {
                let mut g =
                    allow_block_list::Behaviour::<allow_block_list::AllowedPeers>::default();
                for p in peers {
                    g.allow_peer(*p);
                }
                g
            });
            Behaviour {
                gate: Toggle::from(gate),
                limits: connection_limits::Behaviour::new(
                    connection_limits::ConnectionLimits::default()
                        .with_max_established_per_peer(Some(MAX_CONNECTIONS_PER_PEER))
                        .with_max_established(Some(MAX_CONNECTIONS))
                        .with_max_pending_incoming(Some(MAX_PENDING_INCOMING)),
                ),
                identify: identify::Behaviour::new(
                    identify::Config::new("/nightshift/1.0.0".into(), key.public())
                        .with_agent_version(format!("nightshift/{}", env!("CARGO_PKG_VERSION"))),
                ),
                ping: ping::Behaviour::new(ping::Config::new()),
                kad,
                rr: request_response::Behaviour::with_codec(
                    codec,
                    [(rr_proto, ProtocolSupport::Full)],
                    request_response::Config::default()
                        .with_request_timeout(Duration::from_secs(REQUEST_TIMEOUT_SECS))
                        .with_max_concurrent_streams(MAX_STREAMS_PER_CONNECTION),
                ),
            }
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build();
    swarm
        .listen_on(listen.clone())
        .with_context(|| format!("cannot listen on {listen}"))?;
    for addr in bootstrap {
        if let Some(Protocol::P2p(peer)) = addr.iter().last() {
            swarm.behaviour_mut().kad.add_address(&peer, addr.clone());
        }
        if let Err(e) = swarm.dial(addr.clone()) {
            warn!(%addr, error = %e, "cannot dial bootstrap address");
        }
    }
    let (cmd_tx, cmd_rx) = mpsc::channel(256);
    let (ev_tx, ev_rx) = mpsc::channel(1024);
    let handle = NetHandle {
        tx: cmd_tx,
        local_peer: *swarm.local_peer_id(),
        served: served.clone(),
        traffic,
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
        loop {
            tokio::select! {
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

    fn discover(&mut self) {
        if self.swarm.connected_peers().next().is_some() {
            let me = *self.swarm.local_peer_id();
            self.swarm.behaviour_mut().kad.get_closest_peers(me);
        }
    }

    fn dial_peer(&mut self, peer: PeerId, addrs: Vec<Multiaddr>) {
        if peer == *self.swarm.local_peer_id()
            || self.swarm.is_connected(&peer)
            || addrs.is_empty()
            || !self.admits(&peer)
        {
            return;
        }
        let opts = DialOpts::peer_id(peer).addresses(addrs).build();
        if let Err(e) = self.swarm.dial(opts) {
            debug!(%peer, error = %e, "dial failed");
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

    /// The window envelope in `record` when it is a valid, signed window of this swarm stored
    /// under its sender's key.
    fn valid_window(&self, record: &kad::Record) -> Option<SignedEnvelope> {
        let env: SignedEnvelope = wire::decode(
            &record.value,
            nightshift_protocol::message::MAX_WINDOW_TEXT * 8,
        )
        .ok()?;
        let expected = window_key(&self.swarm_id, &env.header.sender);
        if record.key.as_ref() != expected.as_slice() {
            return None;
        }
        open_window(&env, &self.swarm_id).ok()?;
        Some(env)
    }

    fn forward(&self, ev: NetEvent) {
        if let Err(e) = self.events.try_send(ev) {
            warn!(error = %e, "round task is not keeping up; dropped a network event");
        }
    }

    fn on_swarm_event(&mut self, ev: SwarmEvent<BehaviourEvent>) {
        match ev {
            SwarmEvent::NewListenAddr { address, .. } => {
                let full = address.with(Protocol::P2p(*self.swarm.local_peer_id()));
                info!(address = %full, "listening");
                self.listen_addrs.push(full);
            }
            SwarmEvent::ConnectionEstablished {
                peer_id,
                num_established,
                ..
            } if num_established.get() == 1 => {
                debug!(peer = %peer_id, "connected");
                self.forward(NetEvent::PeerConnected(peer_id));
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established: 0,
                ..
            } => {
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
                ..
            })) if info.protocols.contains(&self.kad_proto) && self.admits(&peer_id) => {
                // Only peers that speak this swarm's Kademlia protocol go into the routing table.
                for addr in info.listen_addrs {
                    self.swarm.behaviour_mut().kad.add_address(&peer_id, addr);
                }
            }
            SwarmEvent::Behaviour(BehaviourEvent::Kad(ev)) => self.on_kad(ev),
            SwarmEvent::Behaviour(BehaviourEvent::Rr(ev)) => self.on_rr(ev),
            _ => {}
        }
    }

    fn on_kad(&mut self, ev: kad::Event) {
        match ev {
            kad::Event::RoutingUpdated {
                peer, addresses, ..
            } => {
                self.dial_peer(peer, addresses.into_vec());
            }
            kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                ..
            } => {
                for p in ok.peers {
                    if self.admits(&p.peer_id) {
                        self.dial_peer(p.peer_id, p.addrs);
                    } else {
                        // Another node's routing table listed an outsider: keep it out of ours.
                        self.swarm.behaviour_mut().kad.remove_peer(&p.peer_id);
                    }
                }
            }
            kad::Event::InboundRequest {
                request:
                    kad::InboundRequest::PutRecord {
                        source,
                        record: Some(record),
                        ..
                    },
            } => match self.valid_window(&record) {
                Some(env) => {
                    // Keep the newer of two records for the same sender.
                    let held = self
                        .swarm
                        .behaviour_mut()
                        .kad
                        .store_mut()
                        .get(&record.key)
                        .map(|r| r.into_owned());
                    // What the store holds was verified when it went in: only its time stamp
                    // matters here.
                    let older = held
                        .and_then(|r| {
                            wire::decode::<SignedEnvelope>(
                                &r.value,
                                nightshift_protocol::message::MAX_WINDOW_TEXT * 8,
                            )
                            .ok()
                        })
                        .is_some_and(|held| held.header.round > env.header.round);
                    if !older && let Err(e) = self.swarm.behaviour_mut().kad.store_mut().put(record)
                    {
                        debug!(peer = %source, error = %e, "window record not stored");
                    }
                }
                None => {
                    debug!(peer = %source, "refused a record that is not a valid window of this swarm")
                }
            },
            kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::GetRecord(result),
                step,
                ..
            } => {
                let Some(mut q) = self.window_queries.remove(&id) else {
                    return;
                };
                let mut finished = step.last;
                match result {
                    Ok(kad::GetRecordOk::FoundRecord(found)) => {
                        if let Some(env) = self.valid_window(&found.record)
                            && env.header.sender == q.sender
                            && q.best
                                .as_ref()
                                .is_none_or(|b| b.header.round < env.header.round)
                        {
                            q.best = Some(env);
                        }
                    }
                    Ok(kad::GetRecordOk::FinishedWithNoAdditionalRecord { .. }) | Err(_) => {
                        finished = true;
                    }
                }
                if finished {
                    let _ = q.reply.send(q.best);
                } else {
                    self.window_queries.insert(id, q);
                }
            }
            _ => {}
        }
    }
}
