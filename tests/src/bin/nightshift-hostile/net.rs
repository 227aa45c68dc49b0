//! The swarm: the probe's behaviours, and the raw outbound-only codec for garbage frames.

use ed25519_dalek::SigningKey;
use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::request_response::{self, ProtocolSupport};
use libp2p::swarm::NetworkBehaviour;
use libp2p::swarm::behaviour::toggle::Toggle;
use libp2p::{StreamProtocol, Swarm};
use nightshift_node::net::libp2p_keypair;
use nightshift_tests::probe::{self, Probe};
use std::io;
use std::time::Duration;

use crate::RAW_RESPONSE_BOUND;

/// Sends raw bytes as a request and reads whatever comes back (bounded). Outbound only.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RawCodec;

impl request_response::Codec for RawCodec {
    type Protocol = StreamProtocol;
    type Request = Vec<u8>;
    type Response = Vec<u8>;

    async fn read_request<T>(&mut self, _: &StreamProtocol, _: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        Err(io::Error::other("the raw codec only sends"))
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Vec<u8>>
    where
        T: AsyncRead + Unpin + Send,
    {
        let mut buf = Vec::new();
        (&mut *io)
            .take(RAW_RESPONSE_BOUND)
            .read_to_end(&mut buf)
            .await?;
        Ok(buf)
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        io.write_all(&req).await?;
        io.flush().await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        _: &mut T,
        _: Vec<u8>,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        Err(io::Error::other("the raw codec only sends"))
    }
}

/// The probe's behaviours, plus (in `garbage` mode) the raw outbound-only request-response.
#[derive(NetworkBehaviour)]
pub(crate) struct Attacker {
    pub(crate) probe: Probe,
    pub(crate) raw: Toggle<request_response::Behaviour<RawCodec>>,
}

/// The swarm: the probe's transport and behaviours, with the raw behaviour beside them.
pub(crate) fn build_swarm(
    key: &SigningKey,
    psk: Option<[u8; 32]>,
    kad_proto: &str,
    rr_proto: &str,
    raw: bool,
) -> Result<Swarm<Attacker>, String> {
    let kad_proto = StreamProtocol::try_from_owned(kad_proto.to_string())
        .map_err(|e| format!("kad protocol: {e}"))?;
    let rr_proto = StreamProtocol::try_from_owned(rr_proto.to_string())
        .map_err(|e| format!("rr protocol: {e}"))?;
    let rr_config = request_response::Config::default()
        .with_request_timeout(Duration::from_secs(30))
        .with_max_concurrent_streams(256);
    Ok(probe::build(libp2p_keypair(key), psk, |k| Attacker {
        probe: probe::behaviour(k, kad_proto, rr_proto.clone(), rr_config.clone()),
        raw: Toggle::from(raw.then(|| {
            request_response::Behaviour::with_codec(
                RawCodec,
                [(rr_proto, ProtocolSupport::Outbound)],
                rr_config,
            )
        })),
    }))
}
