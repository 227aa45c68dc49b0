//! What the event loop does with Kademlia: dialling the swarm's peers it finds, and keeping only
//! verified window records of this swarm.

use super::*;

impl EventLoop {
    /// The window envelope in `record` when it is a valid, signed window of this swarm stored
    /// under its sender's key.
    pub(super) fn valid_window(&self, record: &kad::Record) -> Option<SignedEnvelope> {
        let env: SignedEnvelope = wire::decode(
            &record.value,
            nightshift_protocol::message::MAX_WINDOW_TEXT * 8,
        )
        .ok()?;
        let expected = window_key(&self.swarm_id, &env.header.sender);
        if record.key.as_ref() != expected.as_slice() {
            return None;
        }
        open_window(&env, &self.swarm_id).ok()?;
        Some(env)
    }

    pub(super) fn on_kad(&mut self, ev: kad::Event) {
        match ev {
            kad::Event::RoutingUpdated {
                peer, addresses, ..
            } => {
                self.dial_peer(peer, addresses.into_vec());
            }
            kad::Event::OutboundQueryProgressed {
                result: kad::QueryResult::GetClosestPeers(Ok(ok)),
                ..
            } => {
                for p in ok.peers {
                    if self.admits(&p.peer_id) {
                        self.dial_peer(p.peer_id, p.addrs);
                    } else {
                        // Another node's routing table listed an outsider: keep it out of ours.
                        self.swarm.behaviour_mut().kad.remove_peer(&p.peer_id);
                    }
                }
            }
            kad::Event::InboundRequest {
                request:
                    kad::InboundRequest::PutRecord {
                        source,
                        record: Some(record),
                        ..
                    },
            } => match self.valid_window(&record) {
                Some(env) => {
                    // Keep the newer of two records for the same sender.
                    let held = self
                        .swarm
                        .behaviour_mut()
                        .kad
                        .store_mut()
                        .get(&record.key)
                        .map(|r| r.into_owned());
                    // What the store holds was verified when it went in: only its time stamp
                    // matters here.
                    let older = held
                        .and_then(|r| {
                            wire::decode::<SignedEnvelope>(
                                &r.value,
                                nightshift_protocol::message::MAX_WINDOW_TEXT * 8,
                            )
                            .ok()
                        })
                        .is_some_and(|held| held.header.round > env.header.round);
                    if !older && let Err(e) = self.swarm.behaviour_mut().kad.store_mut().put(record)
                    {
                        debug!(peer = %source, error = %e, "window record not stored");
                    }
                }
                None => {
                    debug!(peer = %source, "refused a record that is not a valid window of this swarm")
                }
            },
            kad::Event::OutboundQueryProgressed {
                id,
                result: kad::QueryResult::GetRecord(result),
                step,
                ..
            } => {
                let Some(mut q) = self.window_queries.remove(&id) else {
                    return;
                };
                let mut finished = step.last;
                match result {
                    Ok(kad::GetRecordOk::FoundRecord(found)) => {
                        if let Some(env) = self.valid_window(&found.record)
                            && env.header.sender == q.sender
                            && q.best
                                .as_ref()
                                .is_none_or(|b| b.header.round < env.header.round)
                        {
                            q.best = Some(env);
                        }
                    }
                    Ok(kad::GetRecordOk::FinishedWithNoAdditionalRecord { .. }) | Err(_) => {
                        finished = true;
                    }
                }
                if finished {
                    let _ = q.reply.send(q.best);
                } else {
                    self.window_queries.insert(id, q);
                }
            }
            _ => {}
        }
    }
}
