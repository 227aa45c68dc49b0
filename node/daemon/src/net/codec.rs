//! Length-prefixed request-response codec: `u32 big-endian length ++ wire frame`.
//!
//! The length is checked before anything is allocated: against `max_frame`, and for a request
//! against the bound of its kind (only a pushed contribution may be large). The buffers of
//! requests being read share one byte budget: a request that does not fit in what is left is
//! refused at once (its stream dropped), so many peers sending large frames at once cannot
//! exhaust memory, and peers that send slowly cannot make anyone wait. Responses answer our own
//! requests, whose number and sizes the node bounds, and do not draw on the budget. Every
//! stream, read and write, ends at the request time-out of the request-response behaviour
//! (`REQUEST_TIMEOUT_SECS`), which is the read deadline.

use futures::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::StreamProtocol;
use libp2p::request_response;
use nightshift_protocol::message::{MAX_SMALL_REQUEST_BYTES, may_be_large};
use nightshift_protocol::{Request, Response, wire};
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Semaphore;

/// The shared budget of frame buffers being read is this many times the largest frame, and at
/// least [`MIN_READ_BUDGET_BYTES`].
const READ_BUDGET_FRAMES: usize = 4;
const MIN_READ_BUDGET_BYTES: usize = 64 << 20;

/// Bytes this node wrote and read in request-response frames.
#[derive(Debug, Default)]
pub struct TrafficCounters {
    pub sent: AtomicU64,
    pub received: AtomicU64,
    /// Of `sent`, the signed statuses (announced or answered).
    pub status_sent: AtomicU64,
}

impl TrafficCounters {
    /// (sent, received) so far.
    pub fn snapshot(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.received.load(Ordering::Relaxed),
        )
    }

    /// Bytes of signed statuses sent so far.
    pub fn status_sent(&self) -> u64 {
        self.status_sent.load(Ordering::Relaxed)
    }
}

/// The codec; `max_frame` bounds every frame a peer may send.
#[derive(Clone, Debug)]
pub struct WireCodec {
    pub max_frame: usize,
    pub traffic: Arc<TrafficCounters>,
    /// KiB of frame buffers that may be being read at once, over every connection.
    budget: Arc<Semaphore>,
    budget_kib: u32,
}

impl WireCodec {
    /// A codec accepting frames of up to `max_frame` bytes, counting traffic in `traffic`.
    pub fn new(max_frame: usize, traffic: Arc<TrafficCounters>) -> Self {
        let budget = (READ_BUDGET_FRAMES * max_frame).max(MIN_READ_BUDGET_BYTES);
        let budget_kib = u32::try_from(budget.div_ceil(1024)).unwrap_or(u32::MAX);
        WireCodec {
            max_frame,
            traffic,
            budget: Arc::new(Semaphore::new(budget_kib as usize)),
            budget_kib,
        }
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads one frame of at most `max` bytes; for a request, a frame of a small kind may not
/// exceed [`MAX_SMALL_REQUEST_BYTES`].
async fn read_frame<T: AsyncRead + Unpin + Send>(
    io: &mut T,
    max: usize,
    request: bool,
    codec: &WireCodec,
) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    io.read_exact(&mut len).await?;
    let n = u32::from_be_bytes(len) as usize;
    if n > max {
        return Err(invalid(format!("frame of {n} bytes exceeds {max}")));
    }
    if n < 2 {
        return Err(invalid(format!("frame of {n} bytes is too short")));
    }
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await?;
    if request && !may_be_large(head) && n > MAX_SMALL_REQUEST_BYTES {
        return Err(invalid(format!(
            "request of {n} bytes exceeds {MAX_SMALL_REQUEST_BYTES} for its kind"
        )));
    }
    let _permit = if request {
        let kib = u32::try_from(n.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(codec.budget_kib);
        Some(codec.budget.try_acquire_many(kib).map_err(|_| {
            invalid(format!(
                "request of {n} bytes refused: the node is reading too many large requests"
            ))
        })?)
    } else {
        None
    };
    let mut buf = vec![0u8; n];
    buf[..2].copy_from_slice(&head);
    io.read_exact(&mut buf[2..]).await?;
    codec
        .traffic
        .received
        .fetch_add(n as u64 + 4, Ordering::Relaxed);
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
async fn read_value<T, IO>(io: &mut IO, request: bool, codec: &WireCodec) -> io::Result<T>
where
    T: serde::de::DeserializeOwned,
    IO: AsyncRead + Unpin + Send,
{
    let buf = read_frame(io, codec.max_frame, request, codec).await?;
    wire::decode(&buf, codec.max_frame).map_err(|e| invalid(e.to_string()))
}

impl request_response::Codec for WireCodec {
    type Protocol = StreamProtocol;
    type Request = Request;
    type Response = Response;

    async fn read_request<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Request>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_value(io, true, self).await
    }

    async fn read_response<T>(&mut self, _: &StreamProtocol, io: &mut T) -> io::Result<Response>
    where
        T: AsyncRead + Unpin + Send,
    {
        read_value(io, false, self).await
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
        let frame = wire::encode(&req);
        if matches!(req, Request::Announce(_)) {
            self.traffic
                .status_sent
                .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        }
        write_frame(io, &frame, &self.traffic).await
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
        let frame = wire::encode(&res);
        if matches!(res, Response::Status(_) | Response::StatusLists { .. }) {
            self.traffic
                .status_sent
                .fetch_add(frame.len() as u64 + 4, Ordering::Relaxed);
        }
        write_frame(io, &frame, &self.traffic).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nightshift_protocol::Hash32;
    use std::time::Duration;

    fn codec(max: usize) -> WireCodec {
        WireCodec::new(max, Arc::new(TrafficCounters::default()))
    }

    fn framed(bytes: &[u8], claimed: Option<u32>) -> Vec<u8> {
        let n = claimed.unwrap_or(bytes.len() as u32);
        let mut f = n.to_be_bytes().to_vec();
        f.extend_from_slice(bytes);
        f
    }

    #[tokio::test]
    async fn frames_over_the_bound_of_their_kind_are_refused_before_reading() {
        let c = codec(64 << 20);
        // A GetStatus that claims 10 MB: refused at the header.
        let small = wire::encode(&Request::GetStatus);
        let mut io = futures::io::Cursor::new(framed(&small, Some(10 << 20)));
        let err = read_value::<Request, _>(&mut io, true, &c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("for its kind"), "{err}");
        // The same claim over the codec's own limit.
        let mut io = futures::io::Cursor::new(framed(&small, Some(100 << 20)));
        let err = read_value::<Request, _>(&mut io, true, &c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exceeds"), "{err}");
        // A well-formed small request passes, and the budget is whole again after it.
        let mut io = futures::io::Cursor::new(framed(&small, None));
        let r: Request = read_value(&mut io, true, &c).await.unwrap();
        assert_eq!(r, Request::GetStatus);
        assert_eq!(c.budget.available_permits(), c.budget_kib as usize);
        // A large push frame may be large (here it is cut short and fails on reading).
        let push = wire::encode(&Request::GetStateChunk {
            hash: Hash32::default(),
            offset: 0,
            len: 1,
        });
        let mut io = futures::io::Cursor::new(framed(&push, None));
        assert!(read_value::<Request, _>(&mut io, true, &c).await.is_ok());
    }

    #[tokio::test]
    async fn a_request_that_does_not_fit_the_budget_is_refused_at_once_and_responses_pass() {
        let c = codec(1 << 20);
        // Peers holding the whole budget (large requests still being read).
        let held = c
            .budget
            .clone()
            .try_acquire_many_owned(c.budget_kib)
            .unwrap();
        let push = wire::encode(&Request::GetStateChunk {
            hash: Hash32::default(),
            offset: 0,
            len: 1,
        });
        let mut io = futures::io::Cursor::new(framed(&push, None));
        // Refused, not queued behind the slow readers (which would never finish here).
        let err = tokio::time::timeout(
            Duration::from_secs(60),
            read_value::<Request, _>(&mut io, true, &c),
        )
        .await
        .expect("a request that does not fit waits for nothing")
        .unwrap_err();
        assert!(err.to_string().contains("too many large requests"), "{err}");
        // The answer to one of our own requests is read whatever the budget.
        let res = wire::encode(&Response::Ack);
        let mut io = futures::io::Cursor::new(framed(&res, None));
        let r: Response = read_value(&mut io, false, &c).await.unwrap();
        assert_eq!(r, Response::Ack);
        drop(held);
        let mut io = futures::io::Cursor::new(framed(&push, None));
        assert!(read_value::<Request, _>(&mut io, true, &c).await.is_ok());
        assert_eq!(c.budget.available_permits(), c.budget_kib as usize);
    }
}
