//! A plain rust-libp2p peer, built here from the stock crates (TCP, optional pnet, noise, yamux,
//! identify, ping, Kademlia, request-response with nightshift's frame codec): what any libp2p
//! implementation could run against a swarm. The integration tests use it as a client, as an
//! outsider, and (driven by the `nightshift-hostile` binary) as an attacker.

use futures::StreamExt;
use libp2p::core::transport::upgrade::Version;
use libp2p::kad::{self, store::MemoryStore};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::{NetworkBehaviour, SwarmEvent};
use libp2p::{
    PeerId, StreamProtocol, Transport, identify, identity, noise, ping, pnet, tcp, yamux,
};
use nightshift_node::net::{TrafficCounters, WireCodec};
use nightshift_protocol::{Request, Response};
use std::sync::Arc;
use std::time::Duration;

#[derive(NetworkBehaviour)]
pub struct Probe {
    pub identify: identify::Behaviour,
    pub ping: ping::Behaviour,
    pub kad: kad::Behaviour<MemoryStore>,
    pub rr: request_response::Behaviour<WireCodec>,
}

pub type ProbeSwarm = libp2p::Swarm<Probe>;

/// A swarm with identity `key` on the stock transport (TCP, pnet with `psk` when given, noise,
/// yamux) running the behaviour `make` builds.
///
/// # Panics
/// When the transport or behaviour cannot be built (a test set-up error).
pub fn build<B: NetworkBehaviour>(
    key: identity::Keypair,
    psk: Option<[u8; 32]>,
    make: impl FnOnce(&identity::Keypair) -> B,
) -> libp2p::Swarm<B> {
    let psk = psk.map(pnet::PreSharedKey::new);
    libp2p::SwarmBuilder::with_existing_identity(key)
        .with_tokio()
        .with_other_transport(
            |key| -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
                let base = tcp::tokio::Transport::new(tcp::Config::default().nodelay(true));
                let maybe_private = match psk {
                    Some(psk) => either::Either::Left(
                        base.and_then(move |s, _| pnet::PnetConfig::new(psk).handshake(s)),
                    ),
                    None => either::Either::Right(base),
                };
                Ok(maybe_private
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default())
                    .timeout(Duration::from_secs(10)))
            },
        )
        .expect("transport")
        .with_behaviour(|key| make(key))
        .expect("behaviour")
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(60)))
        .build()
}

/// The probe's behaviours for identity `key` on the swarm protocols `kad_proto` (Kademlia as a
/// client) and `rr_proto` (request-response with nightshift's frame codec, `rr_config`).
pub fn behaviour(
    key: &identity::Keypair,
    kad_proto: StreamProtocol,
    rr_proto: StreamProtocol,
    rr_config: request_response::Config,
) -> Probe {
    let id = key.public().to_peer_id();
    let mut kad =
        kad::Behaviour::with_config(id, MemoryStore::new(id), kad::Config::new(kad_proto));
    kad.set_mode(Some(kad::Mode::Client));
    Probe {
        identify: identify::Behaviour::new(identify::Config::new(
            "/probe/1.0.0".into(),
            key.public(),
        )),
        ping: ping::Behaviour::new(ping::Config::new().with_interval(Duration::from_millis(200))),
        kad,
        rr: request_response::Behaviour::with_codec(
            WireCodec::new(256 << 20, Arc::new(TrafficCounters::default())),
            [(rr_proto, ProtocolSupport::Full)],
            rr_config,
        ),
    }
}

/// A probe with identity `key` speaking the swarm protocols `kad_proto` and `rr_proto`, over
/// pnet with `psk` when given.
pub fn probe(
    key: identity::Keypair,
    psk: Option<[u8; 32]>,
    kad_proto: &str,
    rr_proto: &str,
) -> ProbeSwarm {
    let kad_proto = StreamProtocol::try_from_owned(kad_proto.to_string()).expect("kad protocol");
    let rr_proto = StreamProtocol::try_from_owned(rr_proto.to_string()).expect("rr protocol");
    build(key, psk, |k| {
        behaviour(
            k,
            kad_proto,
            rr_proto,
            request_response::Config::default().with_request_timeout(Duration::from_secs(30)),
        )
    })
}

/// Sends `req` to `peer` and drives the swarm until the answer (or a failure) comes back,
/// within 30 s.
///
/// # Errors
/// The request's failure, or a time-out.
pub async fn request(
    swarm: &mut ProbeSwarm,
    peer: PeerId,
    req: Request,
) -> Result<Response, String> {
    let id = swarm.behaviour_mut().rr.send_request(&peer, req);
    let fut = async {
        loop {
            if let SwarmEvent::Behaviour(ProbeEvent::Rr(ev)) = swarm.select_next_some().await {
                match ev {
                    request_response::Event::Message {
                        message:
                            request_response::Message::Response {
                                request_id,
                                response,
                            },
                        ..
                    } if request_id == id => return Ok(response),
                    request_response::Event::OutboundFailure {
                        request_id, error, ..
                    } if request_id == id => return Err(error.to_string()),
                    _ => {}
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| "request timed out".to_string())?
}
