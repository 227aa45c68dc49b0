//! Catching up: downloading the swarm's state in resumable, hash-checked chunks.

use anyhow::bail;
use libp2p::PeerId;
use nightshift_protocol::message::MAX_CHUNK_BYTES;
use nightshift_protocol::{Hash32, Request, Response, StateSnapshot, wire};
use std::time::Duration;
use tracing::{debug, info, warn};

use super::{LOOKUP_TIMEOUT_SECS, SYNC_CHUNK_BYTES};
use crate::net::NetHandle;
use crate::store::Store;

/// Downloads the encoded state `hash` of `round` (a model of `num_params` parameters) in chunks
/// from `holders` (moving to the next holder when one fails), resuming a partial download left
/// in `store`, and verifies it against `hash`. Returns the state, the peer that sent the last
/// chunk, and the bytes fetched now.
///
/// # Errors
/// When no holder serves the whole state, or it does not decode or hash to `hash`.
pub async fn fetch_state(
    net: &NetHandle,
    store: &Store,
    num_params: usize,
    holders: &[PeerId],
    round: u64,
    hash: Hash32,
) -> anyhow::Result<(StateSnapshot, PeerId, u64)> {
    // An encoded state: round, two f32 vectors, and `formed_by` (at most one key per member).
    let max_total = (8 * num_params + 32 * 65_536 + 1024) as u64;
    let mut buf = store.download(&hash.0).unwrap_or_default();
    if !buf.is_empty() {
        info!(
            bytes = buf.len(),
            "resuming a partial state download from the store"
        );
    }
    let mut total: Option<u64> = None;
    let mut fetched = 0u64;
    let mut last_peer = None;
    'peers: for &peer in holders {
        loop {
            let offset = buf.len() as u64;
            if total.is_some_and(|t| offset >= t) {
                break 'peers;
            }
            let r = tokio::time::timeout(
                Duration::from_secs(LOOKUP_TIMEOUT_SECS * 6),
                net.request(
                    peer,
                    Request::GetStateChunk {
                        hash,
                        offset,
                        len: SYNC_CHUNK_BYTES.min(MAX_CHUNK_BYTES),
                    },
                ),
            )
            .await;
            let chunk = match r {
                Ok(Ok(Response::StateChunk(Some(c)))) => c,
                Ok(Ok(_)) => {
                    debug!(%peer, "peer no longer holds that state");
                    continue 'peers;
                }
                Ok(Err(e)) => {
                    debug!(%peer, error = %e, "chunk request failed");
                    continue 'peers;
                }
                Err(_) => continue 'peers,
            };
            let bad = chunk.offset != offset
                || chunk.total > max_total
                || total.is_some_and(|t| t != chunk.total)
                || chunk.bytes.len() > SYNC_CHUNK_BYTES as usize
                || (chunk.bytes.is_empty() && offset < chunk.total)
                || offset + chunk.bytes.len() as u64 > chunk.total;
            if bad {
                warn!(%peer, "peer sent a malformed state chunk; trying another peer");
                continue 'peers;
            }
            total = Some(chunk.total);
            if let Err(e) = store.save_chunk(&hash.0, offset, &chunk.bytes) {
                debug!(error = %e, "cannot record download progress");
            }
            fetched += chunk.bytes.len() as u64;
            buf.extend_from_slice(&chunk.bytes);
            last_peer = Some(peer);
        }
    }
    let (Some(t), Some(peer)) = (total, last_peer) else {
        bail!("no holder served the state");
    };
    if buf.len() as u64 != t {
        bail!("the download stopped at {} of {t} bytes", buf.len());
    }
    let n = num_params;
    let checked = tokio::task::spawn_blocking(move || {
        let s: StateSnapshot = wire::decode(&buf, max_total as usize)
            .map_err(|e| anyhow::anyhow!("the downloaded state does not decode: {e}"))?;
        if s.round != round || s.params.len() != n || s.momentum.len() != n {
            bail!("the downloaded state has the wrong round or shape");
        }
        let got = s.hash();
        if got != hash {
            bail!(
                "state hash {} does not match the swarm's {}",
                got.short(),
                hash.short()
            );
        }
        Ok(s)
    })
    .await?;
    let _ = store.clear_downloads();
    Ok((checked?, peer, fetched))
}
