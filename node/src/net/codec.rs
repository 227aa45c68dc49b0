//! Length-prefixed request-response codec: `u32 big-endian length ++ wire frame`.
//!
//! The length is checked against `max_frame` before anything is allocated.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;
use libp2p::request_response;
use nightshift_protocol::{Request, Response, wire};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes this node wrote and read in request-response frames.
#[derive(Debug, Default)]
pub struct TrafficCounters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
}

impl TrafficCounters {
    /// (sent, received) so far.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }
}

/// The codec; `max_frame` bounds every frame a peer may send.
#[derive(Clone, Debug)]
pub struct WireCodec {
    pub max_frame: usize,
    pub traffic: Arc<TrafficCounters>,
}

async fn read_frame<T: AsyncRead + Unpin + Send>(
    io: &mut T,
    max: usize,
    c: &TrafficCounters,
) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {n} bytes exceeds {max}"),
        ));
    }
    let mut buf = vec![0u8; n];
    io.read_exact(&mut buf).await?;
    c.received.fetch_add(n as u64 + 4, Ordering::Relaxed);
    Ok(buf)
}

async fn write_frame<T: AsyncWrite + Unpin + Send>(
    io: &mut T,
    bytes: &[u8],
    c: &TrafficCounters,
) -> io::Result<()> {
    let n = u32::try_from(bytes.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    io.write_all(&n.to_be_bytes()).await?;
    io.write_all(bytes).await?;
    io.flush().await?;
    c.sent.fetch_add(bytes.len() as u64 + 4, Ordering::Relaxed);
    Ok(())
}

/// Reads one frame and decodes it as a `T`.
async fn read_value<T, IO>(io: &mut IO, max: usize, c: &TrafficCounters) -> io::Result<T>
where
    T: serde::de::DeserializeOwned,
    IO: AsyncRead + Unpin + Send,
{
    let buf = read_frame(io, max, c).await?;
    wire::decode(&buf, max).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

impl request_response::Codec for WireCodec {
    type Protocol = StreamProtocol;
    type Request = Request;
    type Response = Response;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Request>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_value(io, self.max_frame, &self.traffic).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Response>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_value(io, self.max_frame, &self.traffic).await
    }

    async fn write_request<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        req: Request,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &wire::encode(&req), &self.traffic).await
    }

    async fn write_response<T>(
        &mut self,
        _: &StreamProtocol,
        io: &mut T,
        res: Response,
    ) -> io::Result<()>
    where
        T: AsyncWrite + Unpin + Send,
    {
        write_frame(io, &wire::encode(&res), &self.traffic).await
    }
}
