//! What the event loop does with a peer's request: the per-peer limits, then the answer from
//! what the node serves.

use super::*;

impl EventLoop {
    pub(super) fn on_rr(&mut self, ev: request_response::Event<Request, Response>) {
        use request_response::{Event, Message};
        match ev {
            Event::Message {
                peer,
                message:
                    Message::Request {
                        request,
                        channel,
                        request_id,
                    },
                ..
            } => {
                self.on_request(peer, request_id, request, channel);
            }
            Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some(reply) = self.pending.remove(&request_id) {
                    let _ = reply.send(Ok(response));
                }
            }
            Event::OutboundFailure {
                request_id,
                error,
                peer,
                ..
            } => {
                if let Some(reply) = self.pending.remove(&request_id) {
                    let _ = reply.send(Err(anyhow::anyhow!("request to {peer} failed: {error}")));
                }
            }
            Event::InboundFailure {
                peer,
                error,
                request_id,
                ..
            } => {
                self.done_inbound(peer, request_id);
                debug!(%peer, %error, "inbound request failed");
            }
            Event::ResponseSent {
                peer, request_id, ..
            } => self.done_inbound(peer, request_id),
        }
    }

    fn done_inbound(&mut self, peer: PeerId, id: InboundRequestId) {
        if let Some(b) = self.inflight_bytes.remove(&id) {
            self.inflight_total = self.inflight_total.saturating_sub(b);
        }
        if let Some(set) = self.inflight.get_mut(&peer) {
            set.remove(&id);
            if set.is_empty() {
                self.inflight.remove(&peer);
            }
        }
    }

    /// Answers or forwards one inbound request. A request from a peer outside the swarm's
    /// allowlist, over its rate or with too many requests in flight is dropped unanswered (the
    /// channel closes); a status that does not check is dropped with its reason logged.
    fn on_request(
        &mut self,
        peer: PeerId,
        id: InboundRequestId,
        request: Request,
        channel: ResponseChannel<Response>,
    ) {
        if !self.admits(&peer) {
            debug!(%peer, "dropped a request from outside the swarm");
            self.swarm.disconnect_peer_id(peer).ok();
            return;
        }
        let inflight = self.inflight.get(&peer).map_or(0, |s| s.len());
        let push = matches!(request, Request::Push(_) | Request::PushReduced(_));
        match self.limits.check(
            peer,
            push,
            inflight >= MAX_INFLIGHT_PER_PEER,
            Instant::now(),
        ) {
            Verdict::Serve => {}
            Verdict::Drop { warn_now } => {
                if warn_now {
                    warn!(%peer, dropped = self.limits.dropped(&peer), "peer exceeds its request rate; dropping its requests");
                }
                return;
            }
            Verdict::Disconnect => {
                warn!(%peer, "peer keeps flooding requests; disconnecting it");
                self.swarm.disconnect_peer_id(peer).ok();
                return;
            }
        }
        let response = match request {
            Request::Push(envelope) => {
                let queued = self.queued_pushes.entry(peer).or_default().clone();
                if queued.load(std::sync::atomic::Ordering::Relaxed) >= MAX_QUEUED_PUSHES_PER_PEER {
                    debug!(%peer, "dropped a push: the peer has too many waiting");
                    Response::Refused("too many contributions waiting".into())
                } else {
                    queued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.forward(NetEvent::ContributionPushed {
                        peer,
                        envelope,
                        ticket: PushTicket(queued),
                    });
                    Response::Ack
                }
            }
            Request::PushReduced(reduced) => {
                self.forward(NetEvent::ReducedPushed { peer, reduced });
                Response::Ack
            }
            Request::Announce(envelope) => {
                match self
                    .status_check
                    .open(&peer, &envelope, crate::net::unix_ms())
                {
                    Ok(status) => self.forward(NetEvent::StatusAnnounced { peer, status }),
                    Err(e) => debug!(%peer, reason = %e, "status refused"),
                }
                Response::Ack
            }
            Request::GetStateChunk { .. } if self.inflight_total >= MAX_INFLIGHT_CHUNK_BYTES => {
                Response::Refused("busy: too many state chunks in flight; ask again".into())
            }
            other => self.answer(other),
        };
        let chunk_bytes = match &response {
            Response::StateChunk(Some(c)) => c.bytes.len() as u64,
            _ => 0,
        };
        if self
            .swarm
            .behaviour_mut()
            .rr
            .send_response(channel, response)
            .is_err()
        {
            debug!(%peer, "peer went away before the response was sent");
        } else {
            self.inflight.entry(peer).or_default().insert(id);
            if chunk_bytes > 0 {
                self.inflight_bytes.insert(id, chunk_bytes);
                self.inflight_total += chunk_bytes;
            }
        }
    }

    fn answer(&self, request: Request) -> Response {
        let served = self.served.current();
        match request {
            Request::GetStatus => match &served.status {
                Some(s) => Response::Status((**s).clone()),
                None => Response::Refused("not ready".into()),
            },
            Request::GetStatusLists => match (&served.status, &served.status_lists) {
                (Some(s), Some(l)) => Response::StatusLists {
                    status: (**s).clone(),
                    lists: (**l).clone(),
                },
                _ => Response::Refused("not ready".into()),
            },
            Request::GetContribution { round, sender } => Response::Contribution(
                served
                    .contributions
                    .get(&(round, sender))
                    .map(|e| (**e).clone()),
            ),
            // A whole state in one frame would copy it for every asker: states go in chunks.
            Request::GetState { .. } => {
                Response::Refused("states are served in chunks (GetStateChunk)".into())
            }
            Request::GetManifest => {
                Response::Manifest(served.manifest.as_ref().map(|m| Box::new((**m).clone())))
            }
            Request::GetStateChunk { hash, offset, len } => {
                Response::StateChunk(served.chunk(&hash, offset, len))
            }
            Request::GetSlice {
                round,
                id,
                index,
                header,
            } => Response::Slice(
                served
                    .slices
                    .get(&(round, id, index))
                    .map(|s| Box::new(s.answer(header))),
            ),
            Request::GetReduced { round, index } => {
                Response::Reduced(served.reduced.get(&(round, index)).map(|r| (**r).clone()))
            }
            Request::Push(_) | Request::Announce(_) | Request::PushReduced(_) => Response::Ack,
        }
    }
}
