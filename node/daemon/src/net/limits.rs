//! Per-peer request limits: a token bucket for requests and a smaller one for pushed
//! contributions (the only large frames a peer may send unasked). A peer over its rate has its
//! requests dropped unanswered; one that keeps on is disconnected.

use libp2p::PeerId;
use std::collections::HashMap;
use std::time::Instant;

/// Requests a peer may send per second on average, and in a burst. An honest node sends a few
/// statuses, look-ups and chunk requests a second.
pub const REQUESTS_PER_SEC: f64 = 50.0;
pub const REQUEST_BURST: f64 = 200.0;
/// Pushed contributions per second on average, and in a burst: an honest node pushes one per
/// round (rounds of a tiny model can be a fraction of a second); what waits unhandled is bounded
/// separately ([`super::event_loop::MAX_QUEUED_PUSHES_PER_PEER`]).
pub const PUSHES_PER_SEC: f64 = 5.0;
pub const PUSH_BURST: f64 = 20.0;
/// Requests dropped in a row after which the peer is disconnected.
pub const DISCONNECT_AFTER_DROPS: u64 = 1000;
/// Least seconds between two warnings about the same peer.
const WARN_EVERY_SECS: f64 = 10.0;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: f64, burst: f64, now: Instant) -> Self {
        Bucket {
            tokens: burst,
            rate,
            burst,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.at = now;
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug)]
struct PeerState {
    requests: Bucket,
    pushes: Bucket,
    /// Requests dropped since the last one served.
    dropped_in_a_row: u64,
    dropped: u64,
    warned: Option<Instant>,
}

/// What to do with one inbound request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Serve,
    /// Drop it unanswered; `warn_now` when this peer has not been warned about lately.
    Drop {
        warn_now: bool,
    },
    Disconnect,
}

/// The limits of every peer that sent a request.
#[derive(Debug, Default)]
pub struct PeerLimits {
    peers: HashMap<PeerId, PeerState>,
}

impl PeerLimits {
    /// Counts one request from `peer` (a pushed contribution when `push`) and says what to do
    /// with it; `inflight_full` when the peer already has as many requests in flight as it may.
    pub fn check(
        &mut self,
        peer: PeerId,
        push: bool,
        inflight_full: bool,
        now: Instant,
    ) -> Verdict {
        let st = self.peers.entry(peer).or_insert_with(|| PeerState {
            requests: Bucket::new(REQUESTS_PER_SEC, REQUEST_BURST, now),
            pushes: Bucket::new(PUSHES_PER_SEC, PUSH_BURST, now),
            dropped_in_a_row: 0,
            dropped: 0,
            warned: None,
        });
        let ok = st.requests.take(now) && !inflight_full && (!push || st.pushes.take(now));
        if ok {
            st.dropped_in_a_row = 0;
            return Verdict::Serve;
        }
        st.dropped += 1;
        st.dropped_in_a_row += 1;
        if st.dropped_in_a_row >= DISCONNECT_AFTER_DROPS {
            st.dropped_in_a_row = 0;
            return Verdict::Disconnect;
        }
        let warn_now = st
            .warned
            .is_none_or(|w| now.saturating_duration_since(w).as_secs_f64() >= WARN_EVERY_SECS);
        if warn_now {
            st.warned = Some(now);
        }
        Verdict::Drop { warn_now }
    }

    /// Requests of `peer` dropped so far.
    pub fn dropped(&self, peer: &PeerId) -> u64 {
        self.peers.get(peer).map_or(0, |s| s.dropped)
    }

    /// Forgets a peer that disconnected.
    pub fn forget(&mut self, peer: &PeerId) {
        self.peers.remove(peer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_flood_is_cut_to_the_rate_and_then_disconnected() {
        let mut l = PeerLimits::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        let served = (0..1000)
            .filter(|_| l.check(p, false, false, t0) == Verdict::Serve)
            .count();
        assert_eq!(served, REQUEST_BURST as usize);
        // A second later the bucket has refilled by the rate.
        let t1 = t0 + Duration::from_secs(1);
        let served = (0..1000)
            .filter(|_| l.check(p, false, false, t1) == Verdict::Serve)
            .count();
        assert_eq!(served, REQUESTS_PER_SEC as usize);
        // It keeps on: after DISCONNECT_AFTER_DROPS drops in a row it is cut off.
        let disconnected = (0..DISCONNECT_AFTER_DROPS)
            .map(|_| l.check(p, false, false, t1))
            .any(|v| v == Verdict::Disconnect);
        assert!(disconnected);
        // Another peer is not affected.
        assert_eq!(l.check(PeerId::random(), false, false, t1), Verdict::Serve);
    }

    #[test]
    fn pushes_have_a_smaller_budget_and_in_flight_limits_drop() {
        let mut l = PeerLimits::default();
        let p = PeerId::random();
        let t0 = Instant::now();
        let pushes = (0..100)
            .filter(|_| l.check(p, true, false, t0) == Verdict::Serve)
            .count();
        assert_eq!(pushes, PUSH_BURST as usize);
        assert!(matches!(l.check(p, false, true, t0), Verdict::Drop { .. }));
        assert_eq!(l.check(p, false, false, t0), Verdict::Serve);
        assert!(l.dropped(&p) > 0);
    }
}
