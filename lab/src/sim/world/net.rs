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
        kind: &'static str,
    ) -> Option<Millis> {
        let (ra, rb) = (self.round_of(a), self.round_of(b));
        *self.nodes[a].up.entry(ra).or_default() += bytes;
        let t = self.traffic.entry(kind).or_default();
        t.0 += 1;
        t.1 += bytes;
        if kind.contains("status") || kind.contains("lists") {
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
        let kind = match &input {
            Input::Status { .. } => "status push",
            Input::Contribution { envelope, .. }
                if envelope.header.kind == nightshift_protocol::PayloadKind::SlicedContribution =>
            {
                "sliced header push"
            }
            Input::Contribution { .. } => "contribution push",
            Input::Reduced { .. } => "reduced slice push",
            _ => "other push",
        };
        if let Some(at) = self.transfer(a, b, bytes, kind) {
            self.deliver_at(at, b, input);
        }
    }

    /// `b`'s answer to `a`'s request; a lost answer fails the request after the time-out, as
    /// libp2p's request-response does.
    pub(super) fn respond(&mut self, b: usize, a: usize, bytes: u64, input: Input, req: &Req) {
        match self.transfer(b, a, bytes, req.answer_kind()) {
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
        match self.transfer(a, b, REQUEST_BYTES, req.kind()) {
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
                // As the daemon: the answer carries the signed header only when the asker does
                // not hold it.
                let asker_holds = self.nodes[a]
                    .served
                    .get(&(*round, id.sender))
                    .is_some_and(|env| ContributionId::of(env) == *id);
                match self.nodes[b].slices.get(&(*round, *id, *index)).cloned() {
                    Some(slice) => (
                        self.weigh(
                            wire::encode(&slice.answer(!asker_holds)).len() as u64,
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

impl Req {
    /// The request's line in the traffic breakdown.
    fn kind(&self) -> &'static str {
        match self {
            Req::Status => "status request",
            Req::Lists => "lists request",
            Req::Contribution { .. } => "contribution request",
            Req::Slice { .. } => "slice request",
            Req::Reduced { .. } => "reduced slice request",
            Req::State { .. } => "state request",
        }
    }

    /// Its answer's line.
    fn answer_kind(&self) -> &'static str {
        match self {
            Req::Status => "status answer",
            Req::Lists => "lists answer",
            Req::Contribution { .. } => "contribution answer",
            Req::Slice { .. } => "slice answer",
            Req::Reduced { .. } => "reduced slice answer",
            Req::State { .. } => "state answer",
        }
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

/// The bytes of a reduced slice's encoded mean (it travels once, whoever signed it).
pub(super) fn reduced_values(r: &Reduced) -> u64 {
    r.signed
        .first()
        .into_iter()
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
