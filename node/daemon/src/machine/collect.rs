//! Collect: the round's contributions — pushed, stashed early, fetched from peers that hold them —
//! each verified before it counts, until every live peer's is in (and stays so for a moment) or
//! the deadline passes.

use super::accept::accept;
use super::peers::KnownLists;
use super::reducer::RoundSlices;
use super::sliced::accept_header;
use super::*;

/// A round's collection under way.
#[derive(Debug)]
pub(super) struct Collecting {
    pub(super) collected: BTreeMap<Key, Accepted>,
    pub(super) pushed_at: Millis,
    pub(super) deadline: Millis,
    /// Since when nobody has been missing (the set closes after [`CONFIRM_MS`] of that).
    quiet_since: Option<Millis>,
    /// Contributions asked for: the holder, and when.
    asked: BTreeMap<Key, (Key, Millis)>,
    /// (sender, holder) pairs that had nothing: not asked again this round.
    failed: BTreeSet<(Key, Key)>,
    pub(super) own: Trained,
    pub(super) wire_delta_bytes: u64,
    /// When the statuses of the peers were last asked for while some were missing.
    refreshed_at: Millis,
    /// When each peer was last asked for its lists.
    lists_asked: BTreeMap<Key, Millis>,
    /// What the last look for a missing peer found: the first peer missing (or none), as of
    /// how many peer changes, for which round and state of ours ([`RoundMachine::any_missing`]).
    missing_hint: Option<(u64, u64, Hash32, Option<Key>)>,
}

impl Collecting {
    pub(super) fn new(
        now: Millis,
        deadline: Millis,
        collected: BTreeMap<Key, Accepted>,
        own: Trained,
        wire_delta_bytes: u64,
    ) -> Self {
        Collecting {
            collected,
            pushed_at: now,
            deadline,
            quiet_since: None,
            asked: BTreeMap::new(),
            failed: BTreeSet::new(),
            own,
            wire_delta_bytes,
            refreshed_at: now,
            lists_asked: BTreeMap::new(),
            missing_hint: None,
        }
    }
}

impl RoundMachine {
    pub(super) fn collected(&self) -> Option<&BTreeMap<Key, Accepted>> {
        match &self.stage {
            Stage::Collecting(c) => Some(&c.collected),
            Stage::Reconciling(rc) => Some(&rc.collecting.collected),
            _ => None,
        }
    }

    fn collected_mut(&mut self) -> Option<&mut BTreeMap<Key, Accepted>> {
        match &mut self.stage {
            Stage::Collecting(c) => Some(&mut c.collected),
            Stage::Reconciling(rc) => Some(&mut rc.collecting.collected),
            _ => None,
        }
    }

    /// Peers working on round `r` whose contributions the collecting stage lacks.
    fn missing(&self, r: u64) -> usize {
        let Stage::Collecting(c) = &self.stage else {
            return 0;
        };
        self.working_on(r)
            .filter(|(k, _)| !c.collected.contains_key(*k))
            .count()
    }

    /// Whether a peer working on round `r` has not had its contribution collected. Looked at on
    /// every input, so it costs O(1) per input, not O(N): the peer found missing last time is
    /// looked at first (it stays missing until its contribution comes), and when none was, only
    /// the peers that changed since (collected contributions are never taken back). All peers
    /// are looked at only when neither says.
    fn any_missing(&mut self, r: u64) -> bool {
        let Stage::Collecting(c) = &self.stage else {
            return false;
        };
        let missing = |k: &Key| self.works_on(k, r) && !c.collected.contains_key(k);
        let known = match c.missing_hint {
            // A hint about another round or state of ours says nothing.
            Some((_, round, hash, _)) if (round, hash) != (r, self.hash) => None,
            Some((_, _, _, Some(k))) if missing(&k) => Some(Some(k)),
            Some((seen, _, _, None)) => self
                .changed_since(seen)
                .map(|mut changed| changed.find(|k| missing(k)).copied()),
            _ => None,
        };
        let first = known.unwrap_or_else(|| {
            self.working_on(r)
                .find(|(k, _)| !c.collected.contains_key(*k))
                .map(|(k, _)| *k)
        });
        debug_assert_eq!(
            first.is_some(),
            self.working_on(r)
                .any(|(k, _)| !c.collected.contains_key(k)),
            "the hint for a missing peer disagrees with a full look"
        );
        let hint = (self.peer_changes, r, self.hash, first);
        if let Stage::Collecting(c) = &mut self.stage {
            c.missing_hint = Some(hint);
        }
        first.is_some()
    }

    /// The fetches of a collecting look chosen by walking every peer's list in full: what
    /// [`Self::collect_step`] computes walking each list once (checked against this in debug
    /// builds, so every test of the machine runs both).
    fn fetches_walking_every_list(
        &self,
        r: u64,
        now: Millis,
        patient: bool,
        known: &KnownLists,
    ) -> Vec<(Key, Key)> {
        let Stage::Collecting(c) = &self.stage else {
            return vec![];
        };
        let mut ask: Vec<(Key, Key)> = vec![];
        for (p, s) in self.trainer_peers().filter(|(_, s)| s.round == r) {
            let listed: Vec<Key> = match known.holding.get(&s.holding_root) {
                Some(l) => l.holding.clone(),
                None if s.phase == Phase::Collecting && s.state_hash == self.hash => vec![*p],
                None => vec![],
            };
            for k in &listed {
                let direct = self.peers.get(k).is_some_and(|x| x.connected);
                let asked_lately = c
                    .asked
                    .get(k)
                    .is_some_and(|(_, at)| now < at + FETCH_TIMEOUT_MS);
                if c.collected.contains_key(k)
                    || asked_lately
                    || c.failed.contains(&(*k, *p))
                    || ask.iter().any(|(_, s)| s == k)
                    || (direct && !patient)
                {
                    continue;
                }
                ask.push((*p, *k));
            }
        }
        ask
    }

    pub(super) fn collect_step(&mut self, now: Millis, tick: bool) {
        let r = self.state.round;
        // Only an attested state further on ends the round early: a mere claim of a later round,
        // which anyone can make, does not. (Looked at on the timer: claims change slowly.)
        if tick
            && self
                .claims()
                .iter()
                .any(|c| c.round > r + 1 && self.cfg.recipe.attested(c))
        {
            self.out.push(Output::Note(Note::Behind { round: r }));
            self.announce(Phase::Ready);
            self.begin_round(now);
            return;
        }
        // A state of our round that the rules prefer to ours, which peers already train on (a
        // late contribution counted there and not here): our round's work would only fork the
        // swarm, so the node replays that state instead, as its next alignment would.
        if tick && self.preferred_fork_trained(r) {
            self.out.push(Output::Note(Note::OnAFork { round: r }));
            self.announce(Phase::Ready);
            self.begin_round(now);
            return;
        }
        if !matches!(self.stage, Stage::Collecting(_)) {
            return;
        }
        let any_missing = self.any_missing(r);
        let Stage::Collecting(c) = &self.stage else {
            return;
        };
        let (deadline, quiet_since, pushed_at, refreshed_at) =
            (c.deadline, c.quiet_since, c.pushed_at, c.refreshed_at);
        if !any_missing {
            match quiet_since {
                // Before closing, look at the peers once more: one that resumed or joined the
                // round a moment ago would otherwise be left out (a fork, repaired but a fork).
                Some(t) if now >= t + CONFIRM_MS && !self.refreshing() => {
                    return self.start_reconcile(now, 0);
                }
                Some(_) => {}
                None => {
                    if let Stage::Collecting(c) = &mut self.stage {
                        c.quiet_since = Some(now);
                    }
                    self.refresh_statuses(now);
                }
            }
            return;
        }
        if let Stage::Collecting(c) = &mut self.stage {
            c.quiet_since = None;
        }
        if now >= deadline {
            let missing = self.missing(r);
            self.out
                .push(Output::Note(Note::DeadlinePassed { round: r, missing }));
            return self.start_reconcile(now, missing);
        }
        if !tick {
            return;
        }
        // A peer we wait for may have moved on in a status we missed (an announcement lost or
        // overtaken): look again now and then rather than wait for it until the deadline.
        if now >= refreshed_at + STATUS_REFRESH_MS && !self.refreshing() {
            if let Stage::Collecting(c) = &mut self.stage {
                c.refreshed_at = now;
            }
            self.refresh_statuses(now);
        }
        // Fetch what peers hold and we lack: at once when its sender cannot push to us (not
        // connected), else only after giving the push time to arrive. A peer's status only
        // counts what it holds: its own contribution once it collects is known, the rest is
        // in its lists, asked for (now and then) when it holds more than we do.
        let patient = now >= pushed_at + PUSH_GRACE_MS;
        let Stage::Collecting(c) = &self.stage else {
            return;
        };
        let mut ask: Vec<(Key, Key)> = vec![];
        // Peers holding more than we do whose lists we lack: (count, our order, peer, root).
        let mut richer: Vec<(u32, Key, Key, Hash32)> = vec![];
        let known = self.known_lists();
        // Senders settled this look: asked of a holder, or not to be asked of anyone.
        let mut settled: BTreeSet<Key> = BTreeSet::new();
        // Lists walked, by root, with the senders passed over only because every holder of
        // that list met so far failed to give them: a peer serving a list already walked can
        // add only those (peers committing to one root are often most of the swarm, and
        // walking its list again for each would cost O(N²) a look).
        let mut walked: BTreeMap<Hash32, Vec<Key>> = BTreeMap::new();
        for (p, s) in self.trainer_peers().filter(|(_, s)| s.round == r) {
            let list = known.holding.get(&s.holding_root);
            let own;
            let listed: &[Key] = match list {
                Some(_) if walked.contains_key(&s.holding_root) => &walked[&s.holding_root],
                Some(l) => &l.holding,
                None => {
                    let more = s.holding as usize > c.collected.len();
                    let lately = c.lists_asked.get(p).is_some_and(|at| now < at + LOOKUP_MS);
                    if more && patient && !lately {
                        richer.push((s.holding, self.spread(p), *p, s.holding_root));
                    }
                    own = [*p];
                    if s.phase == Phase::Collecting && s.state_hash == self.hash {
                        &own
                    } else {
                        &[]
                    }
                }
            };
            let mut passed = vec![];
            for k in listed {
                if settled.contains(k) {
                    continue;
                }
                let direct = self.peers.get(k).is_some_and(|x| x.connected);
                let asked_lately = c
                    .asked
                    .get(k)
                    .is_some_and(|(_, at)| now < at + FETCH_TIMEOUT_MS);
                if c.collected.contains_key(k) || asked_lately || (direct && !patient) {
                    settled.insert(*k);
                } else if c.failed.contains(&(*k, *p)) {
                    passed.push(*k);
                } else {
                    ask.push((*p, *k));
                    settled.insert(*k);
                }
            }
            if list.is_some() {
                walked.insert(s.holding_root, passed);
            }
        }
        debug_assert_eq!(
            ask,
            self.fetches_walking_every_list(r, now, patient, &known),
            "walking each list once chose other fetches than walking every peer's"
        );
        // Only the richest few within a look-up's time: one list names all a peer holds.
        let asked_lately = c
            .lists_asked
            .values()
            .filter(|at| now < **at + LOOKUP_MS)
            .count();
        richer.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut roots = BTreeSet::new();
        let lists_wanted: Vec<Key> = richer
            .into_iter()
            .filter(|(_, _, _, root)| roots.insert(*root))
            .take(LIST_ASKS_PER_LOOKUP.saturating_sub(asked_lately))
            .map(|(_, _, p, _)| p)
            .collect();
        if let Stage::Collecting(c) = &mut self.stage {
            for (p, k) in &ask {
                c.asked.insert(*k, (*p, now));
            }
            for p in &lists_wanted {
                c.lists_asked.insert(*p, now);
            }
        }
        self.ask_lists(now, lists_wanted, false);
        for (from, sender) in ask {
            self.out.push(Output::Fetch {
                from,
                round: r,
                sender,
            });
        }
    }

    /// Whether peers train or collect round `r` on a state of that round the rules prefer to
    /// ours, one we could replay (we hold the state before ours) and have not rejected.
    fn preferred_fork_trained(&self, r: u64) -> bool {
        let Some((prev, _)) = &self.prev else {
            return false;
        };
        if prev.round + 1 != r {
            return false;
        }
        let ours = (self.state.formed_by.len(), self.hash);
        self.claims().iter().any(|c| {
            c.round == r
                && c.hash != self.hash
                && rules::preferred((c.formed, c.hash), ours) == std::cmp::Ordering::Less
                && self.cfg.recipe.plausible(c)
                && !self.rejected.skips(c)
                && c.holders.iter().any(|h| {
                    self.peers.get(h).is_some_and(|p| {
                        p.status
                            .as_ref()
                            .is_some_and(|s| matches!(s.phase, Phase::Training | Phase::Collecting))
                    })
                })
        })
    }

    /// A fetch for this round had nothing: that holder is not asked for it again.
    pub(super) fn fetch_failed(&mut self, now: Millis, from: Key, sender: Key) {
        match &mut self.stage {
            Stage::Collecting(c) => {
                c.failed.insert((sender, from));
                c.asked.remove(&sender);
            }
            Stage::Reconciling(_) => self.reconcile_not_found(now, from, sender),
            _ => {}
        }
    }

    /// Verifies a contribution to the round that starts from `base` (hash `base_hash`): whole,
    /// or the signed header of a sliced one when the swarm averages slice by slice.
    pub(super) fn accept_env(
        &self,
        base: &StateSnapshot,
        base_hash: Hash32,
        env: &SignedEnvelope,
    ) -> Result<Accepted, String> {
        let recipe = &self.cfg.recipe;
        match recipe.round_slicing(base) {
            None => accept(&recipe.context(base.round, base_hash), env).map_err(|e| e.to_string()),
            Some(slicing) => {
                let rules = RoundSlices {
                    recipe: recipe.clone(),
                    round: base.round,
                    base_hash,
                    slicing,
                };
                accept_header(&rules.context(), env).map_err(|e| e.to_string())
            }
        }
    }

    /// Verifies and records one contribution for the current round.
    pub(super) fn consider(&mut self, from: Key, env: Arc<SignedEnvelope>) {
        let round = self.state.round;
        if env.header.round == round + 1 {
            self.stash_push(from, env);
            return;
        }
        if !self.reconcile_wants(&env) {
            return;
        }
        let Some(collected) = self.collected() else {
            return;
        };
        let duplicate = env.header.round == round && collected.contains_key(&env.header.sender);
        if duplicate
            && self
                .held
                .get(&(round, env.header.sender))
                .is_some_and(|held| held.signature == env.signature)
        {
            return; // the same contribution again (pushed and fetched)
        }
        if !duplicate && collected.len() >= self.cfg.recipe.round_max_contributors(&self.state) {
            return; // a round holds as many contributions as it may count
        }
        match self.accept_env(&self.state.clone(), self.hash, &env) {
            Ok(_) if duplicate => {
                self.out.push(Output::Note(Note::Refused {
                    round,
                    from,
                    reason: "a second, different contribution from this sender for this round \
                             (the first is kept)"
                        .into(),
                }));
            }
            Ok(a) => {
                let sender = a.sender;
                if let Some(c) = self.collected_mut() {
                    c.insert(sender, a);
                }
                self.hold(round, env);
                self.holding = self
                    .collected()
                    .map(|c| c.keys().copied().collect())
                    .unwrap_or_default();
                let (status, lists) = self.status();
                self.out.push(Output::Serve(status, lists));
                self.fetched(sender);
            }
            Err(e) => {
                self.out.push(Output::Note(Note::Refused {
                    round,
                    from,
                    reason: e.to_string(),
                }));
            }
        }
    }
}
