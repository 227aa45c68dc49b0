//! The network side of a node's round machine, shared by the trainer and the bootstrap node:
//! what the network saw becomes the machine's [`Input`]s, and the machine's network
//! [`Output`]s — announce, serve, ask, push, fetch, hold — are carried out on libp2p. Requests
//! run as tasks of their own; their answers come back to the node's loop as inputs.

use ed25519_dalek::SigningKey;
use libp2p::PeerId;
use nightshift_protocol::{ContributionId, Hash32, Request, Response, SignedEnvelope, sign_status};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::machine::{FETCH_TIMEOUT_MS, Input, Key, LOOKUP_MS, Output};
use crate::net::{self, NetEvent, NetHandle, StatusCheck, peer_id_of, public_key_of};
use crate::store::Store;

/// Carries a machine's network outputs out and turns network events into its inputs.
pub struct NetIo {
    pub net: NetHandle,
    key: SigningKey,
    swarm_id: Hash32,
    check: StatusCheck,
    store: Store,
    num_params: usize,
    /// Answers of requests under way come back to the node's loop here.
    answers: mpsc::UnboundedSender<Input>,
    /// Peers with an open connection, as the machine was told.
    connected: HashSet<Key>,
    /// Our signed status as last served.
    served_status: Option<Arc<SignedEnvelope>>,
    /// The time stamp of the last status signed: each next one is later, so that two statuses
    /// signed in one millisecond (ready, then syncing) are told apart by their receivers.
    last_stamp: u64,
    /// The last push to our peers, and when it began: how long it took is the round's
    /// transfer time.
    pub push: Option<(Instant, JoinHandle<Duration>)>,
    /// Per connected peer, the last few `stamp − our clock at arrival` of the statuses it
    /// pushed: see [`NetIo::clock_offset_ms`].
    clock: HashMap<Key, VecDeque<i64>>,
}

/// How many announced statuses per peer the clock offset is estimated from.
const CLOCK_SAMPLES: usize = 16;

impl NetIo {
    /// The network side of a node; answers to its requests are sent to `answers`.
    pub fn new(
        net: NetHandle,
        key: SigningKey,
        check: StatusCheck,
        store: Store,
        num_params: usize,
        answers: mpsc::UnboundedSender<Input>,
    ) -> Self {
        NetIo {
            net,
            key,
            swarm_id: check.swarm_id(),
            check,
            store,
            num_params,
            answers,
            connected: HashSet::new(),
            served_status: None,
            last_stamp: 0,
            push: None,
            clock: HashMap::new(),
        }
    }

    /// The machine's inputs for one network event (a peer whose key cannot be read is ignored:
    /// every nightshift peer id embeds its ed25519 key).
    pub fn inputs_of(&mut self, ev: NetEvent) -> Vec<Input> {
        let key = |p: &PeerId| public_key_of(p);
        match ev {
            NetEvent::ContributionPushed { peer, envelope, .. } => key(&peer)
                .map(|from| Input::Contribution {
                    from,
                    envelope: Arc::new(envelope),
                })
                .into_iter()
                .collect(),
            NetEvent::StatusAnnounced { peer, status } => {
                let Some(from) = key(&peer) else {
                    return vec![];
                };
                // A peer can only announce over a connection: one we were not told of yet is
                // connected now.
                let samples = self.clock.entry(from).or_default();
                if samples.len() == CLOCK_SAMPLES {
                    samples.pop_front();
                }
                samples.push_back(status.unix_ms as i64 - net::unix_ms() as i64);
                let mut out = vec![];
                if self.connected.insert(from) {
                    out.push(Input::Connected(from));
                }
                out.push(Input::Status { from, status });
                out
            }
            NetEvent::ReducedPushed { peer, reduced } => key(&peer)
                .map(|from| Input::Reduced {
                    from,
                    reduced: Arc::new(reduced),
                })
                .into_iter()
                .collect(),
            // Each new connection greets the peer again (it may be a restarted process).
            NetEvent::PeerConnected(peer) => match key(&peer) {
                Some(k) => {
                    self.connected.insert(k);
                    vec![Input::Connected(k)]
                }
                None => vec![],
            },
            NetEvent::PeerDisconnected(peer) => match key(&peer) {
                Some(k) => {
                    self.connected.remove(&k);
                    self.clock.remove(&k);
                    vec![Input::Disconnected(k)]
                }
                None => vec![],
            },
        }
    }

    /// How far `peer`'s clock is ahead of ours (negative: behind), in milliseconds, from the
    /// statuses it pushed: a status is signed when it is sent, so `stamp − arrival` is the
    /// offset less the transfer time, and the largest of the last few is the closest.
    pub fn clock_offset_ms(&self, peer: &Key) -> Option<i64> {
        self.clock.get(peer)?.iter().max().copied()
    }

    /// Where answers to requests go (for the driver's own look-ups).
    pub fn answers(&self) -> mpsc::UnboundedSender<Input> {
        self.answers.clone()
    }

    /// Connected peers, as the machine knows them.
    pub fn connected(&self) -> impl Iterator<Item = &Key> {
        self.connected.iter()
    }

    fn signed(&mut self, mut status: nightshift_protocol::Status) -> Arc<SignedEnvelope> {
        self.last_stamp = net::unix_ms().max(self.last_stamp + 1);
        status.unix_ms = self.last_stamp;
        Arc::new(sign_status(&self.key, self.swarm_id, &status))
    }

    /// Carries out `o` when it is a network output; hands any other back.
    pub fn carry(&mut self, o: Output) -> Option<Output> {
        let lookup = Duration::from_millis(LOOKUP_MS);
        match o {
            Output::Announce(status, lists) => {
                let env = self.signed(status);
                self.served_status = Some(env.clone());
                self.net.serve_status(env.clone(), lists);
                let peers: Vec<PeerId> = self.connected.iter().filter_map(peer_id_of).collect();
                self.net.announce_status(env, peers, lookup);
            }
            Output::Serve(status, lists) => {
                let env = self.signed(status);
                self.served_status = Some(env.clone());
                self.net.serve_status(env, lists);
            }
            Output::Greet(k) => {
                if let (Some(env), Some(p)) = (self.served_status.clone(), peer_id_of(&k)) {
                    self.net.announce_status(env, [p], lookup);
                }
            }
            Output::AskStatuses(keys) => self.ask_statuses(keys, false),
            Output::AskLists(keys) => self.ask_statuses(keys, true),
            Output::Push { to, envelope } => {
                let peers: Vec<PeerId> = to.iter().filter_map(peer_id_of).collect();
                let net = self.net.clone();
                let t0 = Instant::now();
                let env = (*envelope).clone();
                let task = tokio::spawn(async move {
                    let sends = peers.into_iter().map(|p| {
                        let net = net.clone();
                        let env = env.clone();
                        async move { net.request(p, Request::Push(env)).await }
                    });
                    futures::future::join_all(sends).await;
                    t0.elapsed()
                });
                self.push = Some((t0, task));
            }
            Output::Hold(env) => {
                self.net.served.update(|s| {
                    _ = s
                        .contributions
                        .insert((env.header.round, env.header.sender), env.clone())
                });
            }
            Output::ForgetBefore(r) => self.net.served.update(|s| s.forget_before(r)),
            Output::HoldSlices(slices) => {
                let me = self.key.verifying_key().to_bytes();
                let own: Vec<_> = slices
                    .iter()
                    .filter(|s| s.envelope.header.sender == me)
                    .map(|s| (**s).clone())
                    .collect();
                if let Some(first) = own.first()
                    && let Err(e) = self
                        .store
                        .save_own_slices(first.envelope.header.round, &own)
                {
                    tracing::warn!(error = %e, "could not keep our slices on disk");
                }
                self.net.served.update(|s| s.add_slices(&slices));
            }
            Output::HoldReduced {
                round,
                index,
                reduced,
            } => self.net.served.update(|s| {
                _ = s.reduced.insert((round, index), reduced);
            }),
            Output::SendReduced { to, reduced } => {
                let net = self.net.clone();
                let peers: Vec<PeerId> = to.iter().filter_map(peer_id_of).collect();
                let request = Request::PushReduced((*reduced).clone());
                tokio::spawn(async move {
                    let sends = peers.into_iter().map(|p| {
                        let (net, request) = (net.clone(), request.clone());
                        async move { net.request(p, request).await }
                    });
                    futures::future::join_all(sends).await;
                });
            }
            Output::FetchSlice {
                from,
                round,
                id,
                index,
            } => {
                // The answer comes without the signed header when we hold it (since the
                // contribution counted): ours goes with it.
                let held = self
                    .net
                    .served
                    .current()
                    .contributions
                    .get(&(round, id.sender))
                    .filter(|env| ContributionId::of(env) == id)
                    .map(|env| (**env).clone());
                let request = Request::GetSlice {
                    round,
                    id,
                    index,
                    header: held.is_none(),
                };
                self.ask(from, request, move |got| match got {
                    Some(Response::Slice(Some(answer))) if answer.index == index => {
                        match answer.into_slice(held) {
                            Some(slice) if ContributionId::of(&slice.envelope) == id => {
                                Input::Slice {
                                    from,
                                    slice: Arc::new(slice),
                                }
                            }
                            _ => Input::SliceNotFound {
                                from,
                                round,
                                id,
                                index,
                            },
                        }
                    }
                    _ => Input::SliceNotFound {
                        from,
                        round,
                        id,
                        index,
                    },
                });
            }
            Output::FetchReduced { from, round, index } => {
                let request = Request::GetReduced { round, index };
                self.ask(from, request, move |got| match got {
                    Some(Response::Reduced(Some(reduced))) => Input::Reduced {
                        from,
                        reduced: Arc::new(reduced),
                    },
                    _ => Input::ReducedNotFound { from, round, index },
                });
            }
            Output::Fetch {
                from,
                round,
                sender,
            } => self.fetch(from, round, sender),
            Output::FetchState { from, round, hash } => self.fetch_state(from, round, hash),
            other => return Some(other),
        }
        None
    }

    /// Asks `keys` for their statuses (with the lists they commit to when `lists`); each
    /// answers with [`Input::StatusAnswer`] (`None` when it did not, or its status did not
    /// check).
    pub fn ask_statuses(&self, keys: Vec<Key>, lists: bool) {
        let net = self.net.clone();
        let check = self.check.clone();
        let answers = self.answers.clone();
        tokio::spawn(async move {
            let peers: Vec<PeerId> = keys.iter().filter_map(peer_id_of).collect();
            let got = net
                .ask_statuses(peers, &check, Duration::from_millis(LOOKUP_MS), lists)
                .await;
            let mut got: Vec<(Key, _, _)> = got
                .into_iter()
                .filter_map(|(p, s, l)| Some((public_key_of(&p)?, s, l)))
                .collect();
            for k in keys {
                let (status, lists) = match got.iter().position(|(g, _, _)| *g == k) {
                    Some(i) => {
                        let (_, s, l) = got.swap_remove(i);
                        (Some(s), l.map(Arc::new))
                    }
                    None => (None, None),
                };
                let _ = answers.send(Input::StatusAnswer {
                    from: k,
                    status,
                    lists,
                });
            }
        });
    }

    /// Sends `request` to `from` (within [`FETCH_TIMEOUT_MS`]) and hands the machine what
    /// `answer` makes of the response (`None`: none came).
    fn ask(
        &self,
        from: Key,
        request: Request,
        answer: impl FnOnce(Option<Response>) -> Input + Send + 'static,
    ) {
        let net = self.net.clone();
        let answers = self.answers.clone();
        tokio::spawn(async move {
            let got = match peer_id_of(&from) {
                Some(p) => tokio::time::timeout(
                    Duration::from_millis(FETCH_TIMEOUT_MS),
                    net.request(p, request),
                )
                .await
                .ok()
                .and_then(Result::ok),
                None => None,
            };
            let _ = answers.send(answer(got));
        });
    }

    /// Asks `from` for `sender`'s contribution to `round`. Only that very contribution counts as
    /// an answer; anything else is as good as none.
    fn fetch(&self, from: Key, round: u64, sender: Key) {
        let request = Request::GetContribution { round, sender };
        self.ask(from, request, move |got| match got {
            Some(Response::Contribution(Some(env)))
                if env.header.sender == sender && env.header.round == round =>
            {
                Input::Contribution {
                    from,
                    envelope: Arc::new(env),
                }
            }
            _ => Input::NotFound {
                from,
                round,
                sender,
            },
        });
    }

    /// Downloads the state `hash` of `round` from `from` (resumable, hash-checked chunks); the
    /// machine checks it against the claim.
    fn fetch_state(&self, from: Vec<Key>, round: u64, hash: Hash32) {
        let net = self.net.clone();
        let store = self.store.clone();
        let answers = self.answers.clone();
        let n = self.num_params;
        tokio::spawn(async move {
            let holders: Vec<PeerId> = from.iter().filter_map(peer_id_of).collect();
            let input = match super::sync::fetch_state(&net, &store, n, &holders, round, hash).await
            {
                Ok((state, peer, bytes)) => match public_key_of(&peer) {
                    Some(from) => Input::State {
                        from,
                        state: Arc::new(state),
                        bytes,
                    },
                    None => Input::StateFailed { hash },
                },
                Err(e) => {
                    tracing::warn!(round, hash = %hash.short(), error = %e, "state download failed");
                    Input::StateFailed { hash }
                }
            };
            let _ = answers.send(input);
        });
    }
}
