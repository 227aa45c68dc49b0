//! Swarm events: connections, Kademlia answers, requests to answer and answers to requests.

use libp2p::Swarm;
use libp2p::kad;
use libp2p::request_response;
use libp2p::swarm::SwarmEvent;
use libp2p::swarm::dial_opts::DialOpts;
use nightshift_protocol::{Request, Response};
use nightshift_tests::probe::ProbeEvent;

use crate::net::{Attacker, AttackerEvent};
use crate::{MAX_CAPTURED, Purpose, Run};

impl Run {
    pub(crate) fn on_event(&mut self, swarm: &mut Swarm<Attacker>, ev: SwarmEvent<AttackerEvent>) {
        match ev {
            SwarmEvent::ConnectionEstablished {
                peer_id, endpoint, ..
            } => {
                self.connected.insert(peer_id);
                self.ever_connected.insert(peer_id);
                if endpoint.is_dialer() {
                    let a = endpoint.get_remote_address().clone();
                    let list = self.addrs.entry(peer_id).or_default();
                    if !list.contains(&a) {
                        list.push(a);
                    }
                }
                self.send(
                    swarm,
                    peer_id,
                    Request::GetStatus,
                    "get_status",
                    Purpose::Status,
                );
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                num_established,
                ..
            } => {
                self.disconnected += 1;
                if num_established == 0 {
                    self.connected.remove(&peer_id);
                    self.flood_inflight.remove(&peer_id);
                }
            }
            SwarmEvent::OutgoingConnectionError { .. } => self.dial_failures += 1,
            SwarmEvent::Behaviour(AttackerEvent::Probe(ProbeEvent::Kad(
                kad::Event::OutboundQueryProgressed {
                    result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                    ..
                },
            ))) => {
                for info in ok.peers {
                    if info.peer_id == self.local || info.addrs.is_empty() {
                        continue;
                    }
                    let list = self.addrs.entry(info.peer_id).or_default();
                    for a in &info.addrs {
                        if !list.contains(a) {
                            list.push(a.clone());
                        }
                    }
                    if !self.connected.contains(&info.peer_id) {
                        let opts = DialOpts::peer_id(info.peer_id)
                            .addresses(info.addrs)
                            .build();
                        if swarm.dial(opts).is_err() {
                            self.dial_failures += 1;
                        }
                    }
                }
            }
            SwarmEvent::Behaviour(AttackerEvent::Probe(ProbeEvent::Rr(ev))) => {
                self.on_rr(swarm, ev);
            }
            SwarmEvent::Behaviour(AttackerEvent::Raw(ev)) => self.on_raw(ev),
            _ => {}
        }
    }

    fn on_rr(
        &mut self,
        swarm: &mut Swarm<Attacker>,
        ev: request_response::Event<Request, Response>,
    ) {
        use request_response::{Event, Message};
        match ev {
            Event::Message {
                message:
                    Message::Request {
                        request, channel, ..
                    },
                ..
            } => {
                let resp = self.answer(request);
                let _ = swarm.behaviour_mut().probe.rr.send_response(channel, resp);
            }
            Event::Message {
                peer,
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                let Some(p) = self.pending.remove(&request_id) else {
                    return;
                };
                self.tally(p.kind).answered += 1;
                if matches!(response, Response::Refused(_)) {
                    self.refused_answers += 1;
                }
                match (p.purpose, response) {
                    (Purpose::Status, Response::Status(env)) => {
                        self.note_status(swarm, peer, &env, None)
                    }
                    (Purpose::Status, Response::StatusLists { status, lists }) => {
                        self.note_status(swarm, peer, &status, Some(&lists))
                    }
                    (Purpose::Capture(round, sender), Response::Contribution(Some(env)))
                        if env.header.round == round
                            && env.header.sender == sender
                            && self.captured.len() < MAX_CAPTURED =>
                    {
                        self.captured.insert((round, sender), env);
                    }
                    (Purpose::Flood { push }, _) => self.flood_done(p.peer, push),
                    _ => {}
                }
            }
            Event::OutboundFailure { request_id, .. } => {
                if let Some(p) = self.pending.remove(&request_id) {
                    self.tally(p.kind).failed += 1;
                    if let Purpose::Flood { push } = p.purpose {
                        self.flood_done(p.peer, push);
                    }
                }
            }
            Event::InboundFailure { .. } => self.inbound_failures += 1,
            Event::ResponseSent { .. } => {}
        }
    }

    fn on_raw(&mut self, ev: request_response::Event<Vec<u8>, Vec<u8>>) {
        use request_response::{Event, Message};
        match ev {
            Event::Message {
                message:
                    Message::Response {
                        request_id,
                        response,
                    },
                ..
            } => {
                if let Some((_, kind)) = self.raw_pending.remove(&request_id) {
                    self.tally(kind).answered += 1;
                    if response.is_empty() {
                        self.raw_closed += 1;
                    } else {
                        self.raw_answered += 1;
                    }
                }
            }
            Event::OutboundFailure { request_id, .. } => {
                if let Some((_, kind)) = self.raw_pending.remove(&request_id) {
                    self.tally(kind).failed += 1;
                }
            }
            _ => {}
        }
    }
}
