//! Combine: the end of a round averaged slice by slice ([`Recipe::slicing`]). The round's set X
//! is agreed on small signed headers (collect and reconcile, as for whole contributions); then
//! X's contributors, in key order, are the round's reducers: slice j of round r is reduced by
//! member (j + r) mod n and checked by the next one ([`assigned`]). Each of them fetches slice j
//! of every member of X from its sender (the header's Merkle root ties it to the sender's
//! signature), the reducer sends its signed average to the checker, the checker recomputes it
//! from its own copies and, when the bytes match, co-signs it and sends it to every peer. A node
//! takes the round's step once it holds every slice ([`Combiner::step`], bit for bit
//! [`super::sliced::sliced_round_step`] over X, which a replay computes too).
//!
//! What a node moves per round stays flat in n: it serves each of its slices twice (to the
//! slice's reducer and checker), fetches the two slices it reduces and checks from every
//! member, and receives each reduced slice once.
//!
//! Failures: every grace and time-out counts from the round's last progress (the last slice or
//! reduced slice that came in), so a round whose bytes still arrive over a slow link is waited
//! for. A slice whose reduced form has not come [`COMBINE_GRACE_MS`] after that the node
//! computes itself, fetching that slice of every member (from its sender, else from the slice's
//! reducer or checker); a checker whose result differs refuses to co-sign and computes its
//! own; a round whose slices cannot all be had within [`COMBINE_MS`] is left, and the node
//! aligns to what the swarm formed. A replay asks a claim's holders for the reduced slices
//! (checked against the round's reducers' signatures) before computing any itself.

use super::collect::Collecting;
use super::reducer::{Combiner, Reducer, RoundSlices};
use super::sliced::Slicing;
use super::*;
use accept::RoundStep;
use nightshift_protocol::slices::{CheckedInputs, ReducedInput, ReducedSlice, Slice};
use nightshift_protocol::wire;

pub use io::Reduced;

/// How long a node waits, after the round's last progress, for a slice's reduced form to be
/// pushed before it asks the slice's checker and reducer for it (a push may be lost).
pub const REDUCED_GRACE_MS: Millis = 2_000;
/// How long a node waits, after the round's last progress, for a slice's reduced form before
/// it computes the slice itself.
pub const COMBINE_GRACE_MS: Millis = 5_000;
/// How long a slice fetch goes unanswered before it is sent again (the first answer counts).
pub const HEDGE_MS: Millis = 1_500;
/// The longest a round's combining may go without progress before the node leaves the round.
pub const COMBINE_MS: Millis = 60_000;
/// At most this many times [`COMBINE_MS`] (from its start) a round's combining may take, however
/// slowly its slices keep coming.
pub const COMBINE_LIMIT_FACTOR: Millis = 4;
/// How long one slice fetch may take before the next holder is asked.
pub const SLICE_FETCH_MS: Millis = 10_000;
/// How long a node waits before asking a slice's holders again once every one had nothing (a
/// sender that restarts serves its slices again).
pub const SLICE_RETRY_MS: Millis = 2_000;
/// The download and upload rate the graces allow a slice's reducers (bytes per second): a slow
/// home link. A slice that many inputs make large gets that much longer before others fetch or
/// compute it in its reducers' stead (`Combining::slack`).
pub const ASSUMED_RATE_BYTES: u64 = 1_000_000;
/// Reduced slices kept for a round the node has not reached the end of yet: two rounds' worth
/// of slices at most ...
pub const MAX_EARLY_REDUCED: usize = 2 * nightshift_protocol::slices::MAX_SLICES as usize;
/// ... and at most this many models' worth of their bytes (fp32 means, every signer's copy
/// counted; plus 1 KiB a slice for the rest of its payload), so that what peers can make a
/// node hold before it can check it stays bounded whatever the round's slicing. A round of 256 slices reaching a node still reducing its own
/// kept only 64 and fetched or computed the rest.
pub const EARLY_REDUCED_MODELS: usize = 2;

/// The reducer and the checker of slice `j` of round `round`, among `members` (X's senders in
/// key order; not empty).
pub fn assigned(members: &[Key], round: u64, j: u32) -> (Key, Key) {
    let n = members.len() as u64;
    let a = (j as u64 + round) % n;
    (members[a as usize], members[((a + 1) % n) as usize])
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    /// Average the slice, sign it, send it to the checker.
    Reduce,
    /// Recompute the reducer's average and co-sign it.
    Check,
    /// Compute it for ourselves (its reducers were too slow, or we are X's only member).
    Compute,
}

/// Asking the holders of one slice in turn, round and round until the round's deadline.
#[derive(Debug)]
struct Asking {
    id: ContributionId,
    holders: Vec<Key>,
    /// The holder asked (or to ask next).
    at: usize,
    /// When the fetch under way began; `None`: none under way, the next goes out at `next`.
    since: Option<Millis>,
    next: Millis,
    /// The holder was asked again, the first request being slow.
    hedged: bool,
}

impl Asking {
    /// The holder asked had nothing, or did not answer in time: the next one at once, or —
    /// every one asked — all again after a pause.
    fn next_holder(&mut self, now: Millis) {
        self.at = (self.at + 1) % self.holders.len();
        self.since = None;
        self.hedged = false;
        self.next = if self.at == 0 {
            now + SLICE_RETRY_MS
        } else {
            now
        };
    }
}

/// A slice this node gathers the inputs of.
#[derive(Debug)]
struct Work {
    role: Role,
    reducer: Reducer,
    /// Per member still missing: who may hold its slice, and where the asking stands.
    asking: BTreeMap<Key, Asking>,
    done: bool,
}

/// A round's combining under way (the round's own, or a replay's).
#[derive(Debug)]
pub(super) struct Combining {
    rules: RoundSlices,
    members: Vec<Key>,
    ids: Vec<ContributionId>,
    /// The set as reduced slices list it, checked and named once (reduced slices over another
    /// set are of no use); an error when the set itself could not be a reduced slice's inputs.
    inputs: Result<CheckedInputs, String>,
    combiner: Combiner,
    work: BTreeMap<u32, Work>,
    /// Our own contribution's slices, when it is one of the set.
    own: Vec<Arc<Slice>>,
    /// Reducers' single-signed slices waiting for our check.
    to_check: BTreeMap<u32, SignedEnvelope>,
    /// A replay: the claim's holders, asked for every reduced slice before any is computed
    /// (and for slices, when one is).
    replay: bool,
    sources: Vec<Key>,
    /// Reduced slices asked for: per slice, the peers to ask, the one asked, and when.
    asked: BTreeMap<u32, (Vec<Key>, usize, Millis)>,
    /// Slices asked of their reducers once already (not asked again).
    asked_once: BTreeSet<u32>,
    /// When each reduced slice asked for was last sent for (a lost request is sent again
    /// after [`HEDGE_MS`], not left until [`SLICE_FETCH_MS`]).
    reduced_sent: BTreeMap<u32, Millis>,
    /// The base state's noise ratio (the step's input).
    noise: Option<f64>,
    started: Millis,
    /// When the last slice or reduced slice that moved the round on came in: every grace and
    /// time-out counts from it, so a round whose bytes are still arriving over a slow link is
    /// waited for, and only a silent one is worked around.
    progress: Millis,
    until: Millis,
    /// What the graces add for the time a slice's reducers need to move it ([`Self::slack`]).
    slack: Millis,
    /// Bytes of slices and reduced slices received.
    pub(super) bytes: u64,
}

/// What combining came to.
pub(super) enum Outcome {
    Pending,
    /// Every slice is in: the step, and the contributions that formed it.
    Done(RoundStep, Vec<ContributionId>),
    Failed(String),
}

impl Combining {
    /// Starts combining `set` (the round's agreed headers) under `rules`, as `me` (`own`: our
    /// slices, when we contributed), asking `sources` for the reduced slices first (a replay).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        now: Millis,
        rules: RoundSlices,
        noise: Option<f64>,
        set: &BTreeMap<Key, Accepted>,
        me: Key,
        own: Option<&[Arc<Slice>]>,
        sources: Vec<Key>,
        out: &mut Vec<Output>,
    ) -> Self {
        let members: Vec<Key> = set.keys().copied().collect();
        let ids = ids(set);
        let inputs: Vec<ReducedInput> = set
            .values()
            .map(|a| ReducedInput {
                id: ContributionId {
                    sender: a.sender,
                    digest: a.digest,
                },
                tokens: a.tokens,
                expected: a.expected,
            })
            .collect();
        let inputs = CheckedInputs::new(inputs, &rules.context()).map_err(|e| e.to_string());
        let own = own
            .filter(|o| {
                o.first()
                    .is_some_and(|s| ids.contains(&ContributionId::of(&s.envelope)))
            })
            .map(<[Arc<Slice>]>::to_vec)
            .unwrap_or_default();
        let mut c = Combining {
            own,
            combiner: Combiner::new(rules.clone()),
            rules,
            members,
            ids,
            inputs,
            work: BTreeMap::new(),
            to_check: BTreeMap::new(),
            replay: !sources.is_empty(),
            sources: sources.clone(),
            asked: BTreeMap::new(),
            asked_once: BTreeSet::new(),
            reduced_sent: BTreeMap::new(),
            noise,
            started: now,
            progress: now,
            until: now,
            slack: 0,
            bytes: 0,
        };
        c.slack = c.slack(None);
        c.until = now + c.wait();
        let round = c.rules.round;
        if sources.is_empty() {
            for j in 0..c.slices() {
                let (red, chk) = assigned(&c.members, round, j);
                let role = match (red == me, chk == me) {
                    (true, true) => Role::Compute,
                    (true, false) => Role::Reduce,
                    (false, true) => Role::Check,
                    (false, false) => continue,
                };
                c.gather(now, j, role, me, out);
            }
        } else {
            for j in 0..c.slices() {
                c.ask_reduced(now, j, sources.clone(), out);
            }
        }
        c
    }

    fn slices(&self) -> u32 {
        self.rules.slicing.slices
    }

    /// How long a slice's reducers need, at [`ASSUMED_RATE_BYTES`], to fetch the slice of every
    /// member and push its mean to every peer: twice the members times a slice's bytes (one
    /// byte a value, as `int8` sends it). Negligible when a round has about as many slices as
    /// members; many seconds for a round of few slices over a large swarm.
    fn slack(&self, params: Option<u64>) -> Millis {
        let params = params.unwrap_or(self.rules.recipe.num_params as u64);
        let values = params / u64::from(self.slices().max(1));
        2 * self.members.len() as u64 * values * 1000 / ASSUMED_RATE_BYTES
    }

    /// Times the graces for a model `params` wide instead of the recipe's width
    /// ([`super::Config::timed_params`]).
    pub(super) fn timed_for(mut self, params: Option<u64>) -> Self {
        self.slack = self.slack(params);
        self.until = self.until.max(self.started + self.wait());
        self
    }

    /// How long the round may go without progress: [`COMBINE_MS`] and the reducers' slack.
    fn wait(&self) -> Millis {
        COMBINE_MS + 4 * self.slack
    }

    /// Starts gathering slice `j` of every member: ours from `own`, the others' fetched.
    fn gather(&mut self, now: Millis, j: u32, role: Role, me: Key, out: &mut Vec<Output>) {
        if let Some(w) = self.work.get_mut(&j) {
            w.role = role;
            w.done = false;
            return;
        }
        let mut reducer = Reducer::new(self.rules.clone(), j);
        if let Some(s) = self.own.get(j as usize) {
            _ = reducer.offer(s);
        }
        let (red, chk) = assigned(&self.members, self.rules.round, j);
        let mut asking = BTreeMap::new();
        for id in &self.ids {
            if reducer.holds(std::slice::from_ref(id)) {
                continue;
            }
            // The sender, the slice's reducers, and (a replay) the claim's holders, who
            // gathered the slices they computed themselves.
            let mut holders = vec![id.sender];
            for h in [red, chk].into_iter().chain(self.sources.iter().copied()) {
                if !holders.contains(&h) && h != me {
                    holders.push(h);
                }
            }
            holders.retain(|h| *h != me);
            if holders.is_empty() {
                continue;
            }
            let a = Asking {
                id: *id,
                holders,
                at: 0,
                since: None,
                next: now,
                hedged: false,
            };
            asking.insert(id.sender, a);
        }
        self.work.insert(
            j,
            Work {
                role,
                reducer,
                asking,
                done: false,
            },
        );
        self.ask(now, out);
    }

    /// A slice answering one of our fetches.
    pub(super) fn on_slice(
        &mut self,
        now: Millis,
        from: Key,
        slice: &Arc<Slice>,
        verified: Option<&SignedEnvelope>,
        out: &mut Vec<Output>,
    ) {
        let j = slice.index;
        let sender = slice.envelope.header.sender;
        let Some(w) = self.work.get_mut(&j) else {
            return;
        };
        if !w.asking.contains_key(&sender)
            || !self.ids.contains(&ContributionId::of(&slice.envelope))
        {
            return;
        }
        match w.reducer.offer_verified(slice, verified) {
            Ok(new) => {
                w.asking.remove(&sender);
                self.bytes += slice.body.body.len() as u64;
                if new {
                    self.progressed(now);
                }
                out.push(Output::HoldSlices(vec![slice.clone()]));
            }
            Err(e) => {
                out.push(Output::Note(Note::Refused {
                    round: self.rules.round,
                    from,
                    reason: format!("slice {j} of {}: {e}", short(&sender)),
                }));
                self.slice_not_found(now, from, sender, j, out);
            }
        }
    }

    /// Something new that moves the round on came in at `now` (a copy of what we hold does
    /// not: hedged fetches answered twice would otherwise keep a stuck round alive). The round
    /// is left [`COMBINE_MS`] after its last progress, and at the latest
    /// [`COMBINE_LIMIT_FACTOR`] times that after it began.
    fn progressed(&mut self, now: Millis) {
        self.progress = self.progress.max(now);
        let wait = self.wait();
        let cap = self.started + COMBINE_LIMIT_FACTOR * wait;
        self.until = (now + wait).min(cap).max(self.until);
    }

    /// A holder had nothing (or failed) for a slice we asked it for: ask the next.
    pub(super) fn slice_not_found(
        &mut self,
        now: Millis,
        from: Key,
        sender: Key,
        j: u32,
        out: &mut Vec<Output>,
    ) {
        let Some(a) = self
            .work
            .get_mut(&j)
            .and_then(|w| w.asking.get_mut(&sender))
        else {
            return;
        };
        if a.since.is_none() || a.holders.get(a.at) != Some(&from) {
            return;
        }
        a.next_holder(now);
        self.ask(now, out);
    }

    /// Sends the slice fetches that are due.
    fn ask(&mut self, now: Millis, out: &mut Vec<Output>) {
        let round = self.rules.round;
        let (slack, progress) = (self.slack, self.progress);
        for (j, w) in &mut self.work {
            for a in w.asking.values_mut() {
                if a.since.is_some_and(|t| now >= t + SLICE_FETCH_MS + slack) {
                    a.next_holder(now);
                }
                if let Some(t) = a.since
                    && now >= t.max(progress) + HEDGE_MS + slack / 2
                    && !a.hedged
                {
                    // Asked again (a request or its answer may be lost): the first answer
                    // counts.
                    a.hedged = true;
                    out.push(Output::FetchSlice {
                        from: a.holders[a.at],
                        round,
                        id: a.id,
                        index: *j,
                    });
                }
                if a.since.is_none() && now >= a.next {
                    a.since = Some(now);
                    out.push(Output::FetchSlice {
                        from: a.holders[a.at],
                        round,
                        id: a.id,
                        index: *j,
                    });
                }
            }
        }
    }

    /// A reduced slice pushed to us or answering a fetch.
    pub(super) fn on_reduced(
        &mut self,
        now: Millis,
        from: Key,
        reduced: &Arc<Reduced>,
        me: Key,
        out: &mut Vec<Output>,
    ) {
        let Some(first) = reduced.signed.first() else {
            return;
        };
        let refuse = |out: &mut Vec<Output>, reason: String| {
            out.push(Output::Note(Note::Refused {
                round: first.header.round,
                from,
                reason,
            }));
        };
        let limit = nightshift_protocol::slices::max_reduced_bytes(self.rules.recipe.num_params);
        let Ok(payload) = wire::decode::<ReducedSlice>(&first.payload, limit) else {
            return refuse(out, "a reduced slice that does not decode".into());
        };
        let j = payload.index;
        if j >= self.slices() || self.combiner.has(j) {
            return;
        }
        let ours = self.inputs.as_ref().ok().map(CheckedInputs::digest);
        if Some(payload.inputs) != ours {
            // Averaged over another set than ours: of no use to our step.
            return refuse(
                out,
                format!("reduced slice {j} over another set of contributions"),
            );
        }
        let (red, chk) = assigned(&self.members, self.rules.round, j);
        if reduced.signed.len() == 1 {
            // The reducer's, for us to check.
            let ours = self
                .work
                .get(&j)
                .is_some_and(|w| w.role == Role::Check && !w.done);
            if ours && first.header.sender == red && chk == me {
                self.bytes += first.payload.len() as u64;
                if self.to_check.insert(j, first.clone()).is_none() {
                    self.progressed(now);
                }
            }
            return;
        }
        let Ok(inputs) = &self.inputs else {
            return;
        };
        match self.combiner.offer(&reduced.signed, &[red, chk], inputs) {
            Ok(_) => {
                self.bytes += first.payload.len() as u64;
                self.progressed(now);
                if let Some(w) = self.work.get_mut(&j) {
                    w.done = true;
                    w.asking.clear();
                }
                out.push(Output::HoldReduced {
                    round: self.rules.round,
                    index: j,
                    reduced: reduced.clone(),
                });
            }
            Err(e) => refuse(out, format!("reduced slice {j}: {e}")),
        }
    }

    /// Asks `sources`, one after another, for reduced slice `j`.
    fn ask_reduced(&mut self, now: Millis, j: u32, sources: Vec<Key>, out: &mut Vec<Output>) {
        let Some(first) = sources.first() else {
            return;
        };
        out.push(Output::FetchReduced {
            from: *first,
            round: self.rules.round,
            index: j,
        });
        self.asked.insert(j, (sources, 0, now));
    }

    /// A source had no reduced slice `j`: ask the next, or compute it.
    pub(super) fn reduced_not_found(
        &mut self,
        now: Millis,
        from: Key,
        j: u32,
        me: Key,
        out: &mut Vec<Output>,
    ) {
        let Some((sources, i, at)) = self.asked.get_mut(&j) else {
            return;
        };
        if sources.get(*i) != Some(&from) || self.combiner.has(j) {
            return;
        }
        *i += 1;
        *at = now;
        match sources.get(*i) {
            Some(s) => out.push(Output::FetchReduced {
                from: *s,
                round: self.rules.round,
                index: j,
            }),
            None => {
                self.asked.remove(&j);
                self.gather(now, j, Role::Compute, me, out);
            }
        }
    }

    /// Moves combining on: fetches that timed out go to the next holder, slices whose inputs
    /// are all in are reduced, checked or computed, slices overdue are computed here.
    pub(super) fn drive(
        &mut self,
        now: Millis,
        key: &SigningKey,
        peers: &[Key],
        out: &mut Vec<Output>,
    ) -> Outcome {
        if let Err(e) = &self.inputs {
            return Outcome::Failed(format!("the round's set cannot be reduced: {e}"));
        }
        let me = key.verifying_key().to_bytes();
        self.ask(now, out);
        // Reduced slices asked for and not answered: asked again of the same source now and
        // then (the first answer counts; a second "not found" from it is ignored).
        let hedge = HEDGE_MS + self.slack / 2;
        let progress = self.progress;
        let resend: Vec<(u32, Key)> = self
            .asked
            .iter()
            .filter(|(j, (_, _, at))| {
                let last = self.reduced_sent.get(j).map_or(*at, |t| (*t).max(*at));
                now >= last.max(progress) + hedge
            })
            .filter_map(|(j, (sources, i, _))| Some((*j, *sources.get(*i)?)))
            .collect();
        for (j, from) in resend {
            out.push(Output::FetchReduced {
                from,
                round: self.rules.round,
                index: j,
            });
            self.reduced_sent.insert(j, now);
        }
        let timed_out: Vec<(u32, Key)> = self
            .asked
            .iter()
            .filter(|(_, (_, _, at))| now >= *at + SLICE_FETCH_MS)
            .filter_map(|(j, (sources, i, _))| Some((*j, *sources.get(*i)?)))
            .collect();
        for (j, from) in timed_out {
            self.reduced_not_found(now, from, j, me, out);
        }
        if !self.replay {
            // Slices whose push has not come: asked of their checker and reducer (a push may
            // be lost, or we came late); later, computed here.
            let waiting = |c: &Self, j: u32| {
                !c.combiner.has(j)
                    && !c.asked.contains_key(&j)
                    && !c.work.get(&j).is_some_and(|w| w.role == Role::Compute)
            };
            let quiet_since = self.progress;
            if now >= quiet_since + REDUCED_GRACE_MS + self.slack {
                for j in 0..self.slices() {
                    let (red, chk) = assigned(&self.members, self.rules.round, j);
                    if waiting(self, j)
                        && !self.work.contains_key(&j)
                        && !self.asked_once.contains(&j)
                    {
                        let sources = [chk, red].into_iter().filter(|k| *k != me).collect();
                        self.ask_reduced(now, j, sources, out);
                        self.asked_once.insert(j);
                    }
                }
            }
            if now >= quiet_since + COMBINE_GRACE_MS + 2 * self.slack {
                for j in 0..self.slices() {
                    if waiting(self, j) {
                        self.gather(now, j, Role::Compute, me, out);
                    }
                }
            }
        }
        // Slices whose inputs are all in.
        let ready: Vec<u32> = self
            .work
            .iter()
            .filter(|(j, w)| {
                !w.done
                    && (w.role != Role::Check || self.to_check.contains_key(j))
                    && w.reducer.holds(&self.ids)
            })
            .map(|(j, _)| *j)
            .collect();
        for j in ready {
            self.finish_slice(j, key, peers, out);
        }
        if self.combiner.missing().is_empty() {
            return match self.combiner.step(self.noise) {
                Some((step, formed)) if formed == self.ids => Outcome::Done(step, formed),
                _ => Outcome::Failed("the reduced slices do not make the round's step".into()),
            };
        }
        if now >= self.until {
            let missing = self.combiner.missing().len();
            return Outcome::Failed(format!(
                "{missing} of {} slices could not be had in time",
                self.slices()
            ));
        }
        Outcome::Pending
    }

    /// Slice `j`'s inputs are all in: reduce and send it to the checker, check and co-sign it,
    /// or keep our own result.
    fn finish_slice(&mut self, j: u32, key: &SigningKey, peers: &[Key], out: &mut Vec<Output>) {
        let me = key.verifying_key().to_bytes();
        let (red, chk) = assigned(&self.members, self.rules.round, j);
        let Some(w) = self.work.get_mut(&j) else {
            return;
        };
        let Some((mine, _)) = w.reducer.reduce(Some(&self.ids)) else {
            return;
        };
        let Ok(inputs) = &self.inputs else {
            return;
        };
        match w.role {
            Role::Reduce => {
                let env = w.reducer.sign(key, &mine);
                w.done = true;
                out.push(Output::SendReduced {
                    to: vec![chk],
                    reduced: Arc::new(Reduced { signed: vec![env] }),
                });
            }
            Role::Check => {
                let Some(theirs_env) = self.to_check.get(&j).cloned() else {
                    return; // the reducer's has not come yet
                };
                let limit =
                    nightshift_protocol::slices::max_reduced_bytes(self.rules.recipe.num_params);
                let theirs = wire::decode::<ReducedSlice>(&theirs_env.payload, limit);
                match theirs
                    .map_err(|e| e.to_string())
                    .and_then(|t| w.reducer.check(key, &t, inputs.list()))
                {
                    Ok(cosigned) => {
                        w.done = true;
                        let reduced = Arc::new(Reduced {
                            signed: vec![theirs_env, cosigned],
                        });
                        match self.combiner.offer(&reduced.signed, &[red, chk], inputs) {
                            Ok(_) => {
                                let to: Vec<Key> =
                                    peers.iter().copied().filter(|p| *p != me).collect();
                                out.push(Output::HoldReduced {
                                    round: self.rules.round,
                                    index: j,
                                    reduced: reduced.clone(),
                                });
                                out.push(Output::SendReduced { to, reduced });
                            }
                            Err(e) => out.push(Output::Note(Note::Refused {
                                round: self.rules.round,
                                from: red,
                                reason: format!("reduced slice {j}: {e}"),
                            })),
                        }
                    }
                    Err(reason) => {
                        // The reducer's average is not ours: keep ours, send nothing signed.
                        out.push(Output::Note(Note::Refused {
                            round: self.rules.round,
                            from: red,
                            reason: format!("reduced slice {j}: {reason}"),
                        }));
                        self.to_check.remove(&j);
                        w.role = Role::Compute;
                        w.done = true;
                        _ = self.combiner.insert_own(mine, inputs.list());
                    }
                }
            }
            Role::Compute => {
                w.done = true;
                _ = self.combiner.insert_own(mine, inputs.list());
            }
        }
    }
}

mod round;
pub(super) use round::CombineStage;

#[cfg(test)]
mod tests;
