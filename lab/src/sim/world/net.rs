//! The simulated network: a message's bytes through the sender's uplink, the link's latency
//! and the receiver's downlink; losses; requests and their answers.

use super::*;

impl World {
    /// When `bytes` sent now from `a` reach `b`: after `a`'s uplink, the link's latency and
    /// `b`'s downlink, each a FIFO at its bandwidth. `None` when the message is lost.
    pub(super) fn transfer(
        &mut self,
        a: usize,
        b: usize,
        bytes: u64,
        status: bool,
    ) -> Option<Millis> {
        let (ra, rb) = (self.round_of(a), self.round_of(b));
        *self.nodes[a].up.entry(ra).or_default() += bytes;
        if status {
            *self.nodes[a].up_status.entry(ra).or_default() += bytes;
        }
        let up_ms = bytes as f64 * 8.0 / (self.args.up_mbps * 1e3);
        let down_ms = bytes as f64 * 8.0 / (self.args.down_mbps * 1e3);
        let depart = self.nodes[a].up_free.max(self.now as f64) + up_ms;
        self.nodes[a].up_free = depart;
        if self.args.loss > 0.0 && self.rng.random_bool(self.args.loss) {
            return None;
        }
        *self.nodes[b].down.entry(rb).or_default() += bytes;
        let arrive = depart + self.latency(a, b) as f64;
        let done = self.nodes[b].down_free.max(arrive) + down_ms;
        self.nodes[b].down_free = done;
        Some(done.ceil() as Millis)
    }

    /// Sends `input` from `a` to `b` as a message of `bytes`.
    pub(super) fn send(&mut self, a: usize, b: usize, bytes: u64, input: Input) {
        let status = matches!(input, Input::Status { .. } | Input::StatusAnswer { .. });
        if let Some(at) = self.transfer(a, b, bytes, status) {
            self.deliver_at(at, b, input);
        }
    }

    /// `b`'s answer to `a`'s request; a lost answer fails the request after the time-out, as
    /// libp2p's request-response does.
    pub(super) fn respond(&mut self, b: usize, a: usize, bytes: u64, input: Input, req: &Req) {
        let status = matches!(input, Input::StatusAnswer { .. });
        match self.transfer(b, a, bytes, status) {
            Some(at) => self.deliver_at(at, a, input),
            None => {
                let failed = self.failed_answer(b, req);
                self.deliver_at(self.now + REQUEST_TIMEOUT_MS, a, failed);
            }
        }
    }

    /// A request from `a` to `b`; a lost one fails after the time-out.
    pub(super) fn request(&mut self, a: usize, b: usize, req: Req) {
        let epoch = self.nodes[a].epoch;
        let status = matches!(req, Req::Status | Req::Lists);
        match self.transfer(a, b, REQUEST_BYTES, status) {
            Some(at) => self.schedule(
                at,
                Ev::Request {
                    to: b,
                    from: a,
                    epoch,
                    req,
                },
            ),
            None => {
                let failed = self.failed_answer(b, &req);
                self.deliver_at(self.now + REQUEST_TIMEOUT_MS, a, failed);
            }
        }
    }

    pub(super) fn failed_answer(&self, b: usize, req: &Req) -> Input {
        let from = self.nodes[b].key;
        match req {
            Req::Status | Req::Lists => Input::StatusAnswer {
                from,
                status: None,
                lists: None,
            },
            Req::Contribution { round, sender } => Input::NotFound {
                from,
                round: *round,
                sender: *sender,
            },
            Req::State { hash, .. } => Input::StateFailed { hash: *hash },
            Req::Slice { round, id, index } => Input::SliceNotFound {
                from,
                round: *round,
                id: *id,
                index: *index,
            },
            Req::Reduced { round, index } => Input::ReducedNotFound {
                from,
                round: *round,
                index: *index,
            },
        }
    }

    pub(super) fn answer(&mut self, b: usize, a: usize, epoch: u32, req: Req) {
        if self.nodes[a].epoch != epoch {
            return;
        }
        let from = self.nodes[b].key;
        if self.nodes[b].machine.is_none() {
            // The connection is gone: the request fails at once.
            let failed = self.failed_answer(b, &req);
            let lat = self.latency(a, b);
            self.deliver_at(self.now + lat, a, failed);
            return;
        }
        let (bytes, input) = match &req {
            Req::Status | Req::Lists => {
                let served = self.nodes[b].served_status.clone();
                let with_lists = matches!(req, Req::Lists);
                let bytes = served.as_ref().map_or(16, |(s, l)| {
                    let lists = if with_lists {
                        wire::encode(&**l).len() as u64
                    } else {
                        0
                    };
                    wire::encode(s).len() as u64 + ENVELOPE_BYTES + lists
                });
                let (status, lists) = match served {
                    Some((s, l)) => (Some(s), with_lists.then_some(l)),
                    None => (None, None),
                };
                (
                    bytes,
                    Input::StatusAnswer {
                        from,
                        status,
                        lists,
                    },
                )
            }
            Req::Contribution { round, sender } => {
                match self.nodes[b].served.get(&(*round, *sender)).cloned() {
                    Some(envelope) => (
                        self.weigh(
                            envelope.payload.len() as u64 + ENVELOPE_BYTES,
                            contribution_values(&envelope),
                        ),
                        Input::Contribution { from, envelope },
                    ),
                    None => (
                        16,
                        Input::NotFound {
                            from,
                            round: *round,
                            sender: *sender,
                        },
                    ),
                }
            }
            Req::Slice { round, id, index } => {
                match self.nodes[b].slices.get(&(*round, *id, *index)).cloned() {
                    Some(slice) => (
                        self.weigh(
                            wire::encode(&*slice).len() as u64,
                            slice.body.body.len() as u64,
                        ),
                        Input::Slice { from, slice },
                    ),
                    None => (16, self.failed_answer(b, &req)),
                }
            }
            Req::Reduced { round, index } => {
                match self.nodes[b].reduced.get(&(*round, *index)).cloned() {
                    Some(reduced) => (
                        self.weigh(
                            wire::encode(&*reduced).len() as u64,
                            reduced_values(&reduced),
                        ),
                        Input::Reduced { from, reduced },
                    ),
                    None => (16, self.failed_answer(b, &req)),
                }
            }
            Req::State { round, hash } => {
                let n = &self.nodes[b];
                if n.checkpoint_hash == *hash && n.checkpoint.round == *round {
                    let state = n.checkpoint.clone();
                    let bytes = self.weigh(
                        (state.params.len() * 8) as u64 + 64,
                        (state.params.len() * 8) as u64,
                    );
                    (bytes, Input::State { from, state, bytes })
                } else {
                    (16, Input::StateFailed { hash: *hash })
                }
            }
        };
        self.respond(b, a, bytes, input, &req);
    }
}

/// The bytes of a whole contribution's encoded values (0 for a sliced contribution's header).
pub(super) fn contribution_values(env: &SignedEnvelope) -> u64 {
    if env.header.kind != nightshift_protocol::PayloadKind::Contribution {
        return 0;
    }
    wire::decode::<nightshift_protocol::Contribution>(&env.payload, env.payload.len() + 64)
        .map_or(0, |c| c.delta.body.len() as u64)
}

/// The bytes of a reduced slice's encoded mean, in each of its signed copies.
pub(super) fn reduced_values(r: &Reduced) -> u64 {
    r.signed
        .iter()
        .filter_map(|e| {
            wire::decode::<nightshift_protocol::slices::ReducedSlice>(
                &e.payload,
                e.payload.len() + 64,
            )
            .ok()
        })
        .map(|s| s.mean.body.len() as u64)
        .sum()
}
