//! Catching up: downloading the swarm's state in resumable, hash-checked chunks.

use anyhow::bail;
use libp2p::PeerId;
use nightshift_protocol::message::MAX_CHUNK_BYTES;
use nightshift_protocol::{Hash32, Request, Response, StateSnapshot, wire};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

use crate::machine::LOOKUP_MS;
use crate::net::NetHandle;
use crate::store::Store;

/// Checkpoints `state` (whose hash is `hash`) to `store` and serves it in chunks, with one
/// encoding for both, off the async threads.
pub async fn checkpoint_and_serve(
    store: &Store,
    net: &NetHandle,
    state: Arc<StateSnapshot>,
    hash: Hash32,
) {
    let round = state.round;
    let encoded = tokio::task::spawn_blocking(move || wire::encode(&*state))
        .await
        .ok();
    let Some(bytes) = encoded else {
        warn!("cannot encode the state (shutting down?); not checkpointed");
        return;
    };
    if let Err(e) = store.save_encoded_checkpoint(round, &bytes) {
        warn!(error = %e, "cannot write checkpoint");
    }
    net.served.update(|s| s.set_state(hash, Arc::new(bytes)));
}

/// The checkpoint before `state`, when still on disk: the base from which a preferred fork of
/// its round is replayed (a wrong one only costs a replay that fails).
///
/// # Errors
/// On storage failure.
pub fn previous_checkpoint(
    store: &Store,
    state: &StateSnapshot,
) -> anyhow::Result<Option<StateSnapshot>> {
    if state.round == 0 {
        return Ok(None);
    }
    Ok(store
        .checkpoint_at(state.round - 1)?
        .filter(|p| p.params.len() == state.params.len()))
}

/// Size of one state chunk asked for when syncing.
const SYNC_CHUNK_BYTES: u32 = 1 << 20;
/// Holders asked for chunks of one state before the download gives up.
const MAX_HOLDERS_ASKED: usize = 8;

/// Downloads the encoded state `hash` of `round` (a model of `num_params` parameters) in chunks
/// from `holders` (moving to the next holder when one fails), resuming a partial download left
/// in `store`, and verifies it against `hash` and the contributions `formed_by` that the claim
/// (which the hash does not cover) lists. Every chunk must be whole; a download that does not
/// check is deleted, not resumed. Returns the state, the peer that sent the last chunk, and the
/// bytes fetched now.
///
/// # Errors
/// When no holder serves the whole state in time, or it does not decode or check.
pub async fn fetch_state(
    net: &NetHandle,
    store: &Store,
    num_params: usize,
    holders: &[PeerId],
    round: u64,
    hash: Hash32,
) -> anyhow::Result<(StateSnapshot, PeerId, u64)> {
    // An encoded state: round, two f32 vectors, and `formed_by` (at most one id per member).
    let max_total = (8 * num_params + 66 * 65_536 + 1024) as u64;
    let until = Instant::now() + Duration::from_millis(crate::machine::STATE_DOWNLOAD_MS);
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
    'peers: for &peer in holders.iter().take(MAX_HOLDERS_ASKED) {
        loop {
            let offset = buf.len() as u64;
            if total.is_some_and(|t| offset >= t) {
                break 'peers;
            }
            if Instant::now() >= until {
                bail!(
                    "the state download took longer than {} s",
                    crate::machine::STATE_DOWNLOAD_MS / 1000
                );
            }
            let r = tokio::time::timeout(
                Duration::from_millis(6 * LOOKUP_MS),
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
            // Whole chunks only: a holder trickling bytes is passed over.
            let whole = (SYNC_CHUNK_BYTES.min(MAX_CHUNK_BYTES) as u64)
                .min(chunk.total.saturating_sub(offset));
            let bad = chunk.offset != offset
                || chunk.total > max_total
                || total.is_some_and(|t| t != chunk.total)
                || chunk.bytes.len() as u64 != whole
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
    // Done, or not what was attested: either way the partial download is not resumed.
    let _ = store.clear_downloads();
    Ok((checked?, peer, fetched))
}
