//! Step: reconcile the round's set with what the peers hold or used — so that every node
//! averages the same contributions — then take the swarm's outer step ([`Recipe::apply`], the
//! function a replay runs too) and begin the next round.

use super::collect::Collecting;
use super::*;
use nightshift_protocol::message::{formed_root, holding_root};

/// Per sender still wanted while reconciling: where it is listed (holder, and the digest when a
/// peer's next state names the very contribution), the holder asked, and when.
type Pending = BTreeMap<Key, (Vec<(Key, Option<Hash32>)>, usize, Millis)>;

/// Reconciling under way.
#[derive(Debug)]
pub(super) struct Reconciling {
    pub(super) collecting: Collecting,
    /// The wanted list is drawn once the peers' fresh statuses are in, and the lists of those
    /// whose sets differ from ours.
    listed: bool,
    /// Times the differing peers' lists were asked for (twice at most: an answer may be lost).
    lists_asked: u8,
    pending: Pending,
    until: Millis,
    pub(super) missed: usize,
}

/// A sender a list names, with the digest of its contribution when the list says it (a
/// state's `formed_by`; a peer's holding list does not).
type Listed = (Key, Option<Hash32>);

impl RoundMachine {
    pub(super) fn start_reconcile(&mut self, now: Millis, missed: usize) {
        let Stage::Collecting(_) = &self.stage else {
            return;
        };
        let Stage::Collecting(collecting) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        self.stage = Stage::Reconciling(Reconciling {
            collecting,
            listed: false,
            lists_asked: 0,
            pending: BTreeMap::new(),
            until: now + RECONCILE_MS,
            missed,
        });
        self.refresh_statuses(now);
    }

    pub(super) fn reconcile_step(&mut self, now: Millis) {
        let Stage::Reconciling(rc) = &self.stage else {
            return;
        };
        let until = rc.until;
        if !rc.listed {
            if self.refreshing() && now < until {
                return;
            }
            if rc.lists_asked < 2 {
                self.ask_differing_lists(now);
                if self.refreshing() && now < until {
                    return;
                }
            }
            self.list_wanted(now);
        }
        let Stage::Reconciling(rc) = &mut self.stage else {
            return;
        };
        let r = self.state.round;
        let mut ask = vec![];
        let mut gone = vec![];
        for (sender, (holders, i, at)) in rc.pending.iter_mut() {
            if now >= *at + FETCH_TIMEOUT_MS {
                *i += 1;
                *at = now;
                match holders.get(*i) {
                    Some((h, _)) => ask.push((*h, *sender)),
                    None => gone.push(*sender),
                }
            }
        }
        for s in gone {
            rc.pending.remove(&s);
        }
        let finished = rc.pending.is_empty() || now >= until;
        for (from, sender) in ask {
            self.out.push(Output::Fetch {
                from,
                round: r,
                sender,
            });
        }
        if finished {
            self.outer_step(now);
        }
    }

    /// The peers whose statuses commit to another set than ours — what they hold of this
    /// round, or what formed their next state — and whose lists we lack: asked for them
    /// (peers that agree with us send no lists).
    fn ask_differing_lists(&mut self, now: Millis) {
        let r = self.state.round;
        let Some(collected) = self.collected() else {
            return;
        };
        let keys: Vec<Key> = collected.keys().copied().collect();
        let (holding, formed) = (holding_root(&keys), formed_root(&ids(collected)));
        let known = self.known_lists();
        // One peer for each set we lack the list of (the peers committing to one root hold one
        // list), this node's own pick among them; the largest sets first, a few at a time.
        let mut sets: BTreeMap<(bool, Hash32), (u32, Key, Key)> = BTreeMap::new();
        for (p, s) in self.trainer_peers() {
            let set = if s.round == r && s.holding_root != holding {
                (!known.holding.contains_key(&s.holding_root))
                    .then_some(((false, s.holding_root), s.holding))
            } else if s.round == r + 1 && s.formed_root != formed {
                (!known.formed.contains_key(&s.formed_root))
                    .then_some(((true, s.formed_root), s.formed))
            } else {
                None
            };
            let Some((set, count)) = set else { continue };
            let order = self.spread(p);
            let e = sets.entry(set).or_insert((count, order, *p));
            if order < e.1 {
                *e = (count, order, *p);
            }
        }
        let mut sets: Vec<(u32, Key, Key)> = sets.into_values().collect();
        sets.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let wanted: Vec<Key> = sets
            .into_iter()
            .take(RECONCILE_LIST_ASKS)
            .map(|(_, _, p)| p)
            .collect();
        if let Stage::Reconciling(rc) = &mut self.stage {
            rc.lists_asked += 1;
        }
        self.ask_lists(now, wanted, true);
    }

    /// What [`Self::list_wanted`] finds, by walking every peer's list in full (checked against
    /// it in debug builds, so every test of the machine runs both).
    fn wanted_walking_every_list(&self, cap: usize) -> BTreeMap<Key, Vec<Listed>> {
        let r = self.state.round;
        let members = &self.cfg.recipe.allowlist;
        let mut wanted: BTreeMap<Key, Vec<(Key, Option<Hash32>)>> = BTreeMap::new();
        let Some(collected) = self.collected() else {
            return wanted;
        };
        let mut count = 0;
        let known = self.known_lists();
        for (p, s) in self.trainer_peers() {
            let lists = if s.round == r {
                known.holding.get(&s.holding_root)
            } else {
                known.formed.get(&s.formed_root)
            };
            let Some(lists) = lists else {
                continue;
            };
            let listed: Vec<(Key, Option<Hash32>)> = if s.round == r {
                lists.holding.iter().map(|k| (*k, None)).collect()
            } else if s.round == r + 1 {
                lists
                    .formed_by
                    .iter()
                    .map(|id| (id.sender, Some(id.digest)))
                    .collect()
            } else {
                vec![]
            };
            for (k, d) in listed {
                if collected.contains_key(&k)
                    || members.as_ref().is_some_and(|m| !m.contains(&k))
                    || count >= cap
                {
                    continue;
                }
                count += 1;
                wanted.entry(k).or_default().push((*p, d));
            }
        }
        wanted
    }

    /// What the peers hold for this round, or the very contributions that formed their next
    /// state, that we lack (from the lists they sent); bounded ([`MAX_RECONCILE_FETCHES`]
    /// beyond the members), since a peer listing senders that do not exist costs a look-up each.
    fn list_wanted(&mut self, now: Millis) {
        let r = self.state.round;
        let members = self.cfg.recipe.allowlist.clone();
        let Some(collected) = self.collected() else {
            return;
        };
        let mut wanted: BTreeMap<Key, Vec<(Key, Option<Hash32>)>> = BTreeMap::new();
        let mut count = 0;
        let cap = MAX_RECONCILE_FETCHES + members.as_ref().map_or(0, Vec::len);
        let known = self.known_lists();
        let wanted_of = |(k, _): &Listed| {
            !collected.contains_key(k) && members.as_ref().is_none_or(|m| m.contains(k))
        };
        // What each list names that we lack, worked out once per list: peers committing to one
        // root share one list, and walking it again for each would cost O(N²).
        let mut lacking: BTreeMap<(bool, Hash32), Vec<Listed>> = BTreeMap::new();
        for (p, s) in self.trainer_peers() {
            let (set, lists) = if s.round == r {
                ((false, s.holding_root), known.holding.get(&s.holding_root))
            } else if s.round == r + 1 {
                ((true, s.formed_root), known.formed.get(&s.formed_root))
            } else {
                continue;
            };
            let Some(lists) = lists else {
                continue;
            };
            let listed = lacking.entry(set).or_insert_with(|| {
                if set.0 {
                    lists
                        .formed_by
                        .iter()
                        .map(|id| (id.sender, Some(id.digest)))
                        .filter(wanted_of)
                        .collect()
                } else {
                    lists
                        .holding
                        .iter()
                        .map(|k| (*k, None))
                        .filter(wanted_of)
                        .collect()
                }
            });
            for (k, d) in listed.iter() {
                if count >= cap {
                    break;
                }
                count += 1;
                wanted.entry(*k).or_default().push((*p, *d));
            }
        }
        debug_assert_eq!(
            wanted,
            self.wanted_walking_every_list(cap),
            "working each list out once chose other fetches than walking every peer's"
        );
        let mut asks = vec![];
        let pending: Pending = wanted
            .into_iter()
            .map(|(k, holders)| {
                asks.push((holders[0].0, k));
                (k, (holders, 0, now))
            })
            .collect();
        if let Stage::Reconciling(rc) = &mut self.stage {
            rc.pending = pending;
            rc.listed = true;
        }
        for (from, sender) in asks {
            self.out.push(Output::Fetch {
                from,
                round: r,
                sender,
            });
        }
    }

    /// Whether a contribution arriving now is one to consider: while reconciling, one asked for
    /// by the digest a peer's next state names must be that very one.
    pub(super) fn reconcile_wants(&self, env: &SignedEnvelope) -> bool {
        let Stage::Reconciling(rc) = &self.stage else {
            return true;
        };
        match rc.pending.get(&env.header.sender) {
            Some((holders, i, _)) => holders
                .get(*i)
                .and_then(|(_, d)| *d)
                .is_none_or(|d| d == env.digest()),
            None => true,
        }
    }

    /// A wanted contribution arrived and counted.
    pub(super) fn fetched(&mut self, sender: Key) {
        if let Stage::Reconciling(rc) = &mut self.stage {
            rc.pending.remove(&sender);
        }
    }

    pub(super) fn reconcile_not_found(&mut self, now: Millis, from: Key, sender: Key) {
        let r = self.state.round;
        let Stage::Reconciling(rc) = &mut self.stage else {
            return;
        };
        let Some((holders, i, at)) = rc.pending.get_mut(&sender) else {
            return;
        };
        if holders.get(*i).map(|(h, _)| *h) != Some(from) {
            return;
        }
        *i += 1;
        *at = now;
        match holders.get(*i) {
            Some((h, _)) => {
                let h = *h;
                self.out.push(Output::Fetch {
                    from: h,
                    round: r,
                    sender,
                });
            }
            None => {
                rc.pending.remove(&sender);
            }
        }
    }

    /// The swarm's aggregator and outer step on the round's set; the next round begins.
    fn outer_step(&mut self, now: Millis) {
        if let Some(slicing) = self.cfg.recipe.round_slicing(&self.state) {
            return self.start_combining(now, slicing);
        }
        let Stage::Reconciling(rc) = std::mem::replace(&mut self.stage, Stage::Done) else {
            return;
        };
        let Some((next, step)) = self.cfg.recipe.apply(&self.state, &rc.collecting.collected)
        else {
            self.out.push(Output::Failed("nothing to average".into()));
            return;
        };
        self.stepped(now, next, step, rc.collecting, rc.missed);
    }

    /// The round's step is taken: hold θ(r+1) and begin the next round.
    pub(super) fn stepped(
        &mut self,
        now: Millis,
        next: StateSnapshot,
        step: accept::RoundStep,
        collecting: Collecting,
        missed: usize,
    ) {
        let r = self.state.round;
        let set = collecting.collected;
        let own = collecting.own;
        let summary = RoundSummary {
            round: r + 1,
            contributors: set.len(),
            planned: step.planned,
            step_scale: step.scale,
            noise: step.noise,
            weights: set.values().map(|a| (a.sender, a.tokens)).collect(),
            tokens: own.tokens,
            inner_steps: own.steps,
            train_loss: own.mean_loss,
            train_secs: own.secs,
            wire_delta_bytes: collecting.wire_delta_bytes,
            missed_deadline: missed,
        };
        debug_assert_eq!(ids(&set), next.formed_by);
        let hash = next.hash();
        let base = std::mem::replace(&mut self.state, Arc::new(next));
        self.prev = Some((base, self.hash));
        self.hash = hash;
        self.note_chain();
        // Round r's contributions formed the new state; round r − 1's formed the one before,
        // which a peer on a fork of it replays from θ(r − 1), or a peer a round behind (lost
        // messages, or steps run ahead) is still reconciling. Older ones go.
        let keep = r.saturating_sub(1);
        self.held.retain(|(round, _), _| *round >= keep);
        self.out.push(Output::ForgetBefore(keep));
        self.holding.clear();
        self.out.push(Output::NewState(NewState {
            state: self.state.clone(),
            hash,
            how: How::Stepped(summary),
        }));
        self.announce(Phase::Ready);
        self.trained_any = true;
        self.waited_for_round = false;
        self.diverged_in_a_row = 0;
        self.begin_round(now);
    }
}
