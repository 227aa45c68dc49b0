//! The swarm: transports (TCP with the optional pre-shared key, QUIC, relayed circuits) and the
//! behaviours.

use super::*;
use libp2p::core::muxing::StreamMuxerBox;
use libp2p::{autonat, dcutr, quic, relay};

/// Builds the swarm of a node with identity `keypair`. `psk` turns on pnet (and leaves QUIC
/// out: pnet runs over TCP only); `relay_circuit_bytes`, when given, makes the node a relay
/// whose circuits may carry that many bytes each.
pub(super) fn swarm(
    keypair: libp2p::identity::Keypair,
    psk: Option<[u8; 32]>,
    relay_circuit_bytes: Option<u64>,
    kad_proto: StreamProtocol,
    rr_proto: StreamProtocol,
    codec: WireCodec,
    admitted_peers: Option<HashSet<PeerId>>,
) -> anyhow::Result<Swarm<Behaviour>> {
    let psk = psk.map(pnet::PreSharedKey::new);
    let swarm = libp2p::SwarmBuilder::with_existing_identity(keypair)
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
                let tcp = maybe_private
                    .upgrade(Version::V1Lazy)
                    .authenticate(noise::Config::new(key)?)
                    .multiplex(yamux::Config::default())
                    .timeout(Duration::from_secs(20))
                    .map(|(peer, muxer), _| (peer, StreamMuxerBox::new(muxer)));
                Ok(if psk.is_some() {
                    tcp.boxed()
                } else {
                    let quic = quic::tokio::Transport::new(quic::Config::new(key))
                        .map(|(peer, conn), _| (peer, StreamMuxerBox::new(conn)));
                    tcp.or_transport(quic)
                        .map(|either, _| either.into_inner())
                        .boxed()
                })
            },
        )?
        .with_relay_client(noise::Config::new, yamux::Config::default)?
        .with_behaviour(|key, relay_client| {
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
            let relay = relay_circuit_bytes
                .map(|bytes| relay::Behaviour::new(peer, super::super::reach::relay_config(bytes)));
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
                        .with_agent_version(format!("nightshift/{}", env!("CARGO_PKG_VERSION")))
                        // A relayed address appears when a reservation is accepted: peers must
                        // hear of it then, not at the next periodic identify.
                        .with_push_listen_addr_updates(true),
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
                relay_client,
                relay: Toggle::from(relay),
                dcutr: dcutr::Behaviour::new(peer),
                autonat: autonat::Behaviour::new(peer, super::super::reach::autonat_config()),
            }
        })?
        .with_swarm_config(|c| c.with_idle_connection_timeout(Duration::from_secs(3600)))
        .build();
    Ok(swarm)
}
