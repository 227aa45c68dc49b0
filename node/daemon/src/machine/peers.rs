//! What the machine knows of its peers: their statuses, the lists those commit to, and the
//! look-ups that refresh them.

use super::*;

/// Lists peers sent, by the root of the list each serves (see [`RoundMachine::known_lists`]).
#[derive(Default)]
pub(super) struct KnownLists {
    /// By `holding_root`: the senders a peer holds for its round.
    pub(super) holding: BTreeMap<Hash32, Arc<StatusLists>>,
    /// By `formed_root`: the contributions that formed a peer's state.
    pub(super) formed: BTreeMap<Hash32, Arc<StatusLists>>,
}

impl RoundMachine {
    /// Records a peer's status unless we hold a newer one from it.
    pub(super) fn note_status(
        &mut self,
        now: Millis,
        from: Key,
        status: Status,
        lists: Option<Arc<StatusLists>>,
    ) {
        let p = self.peers.entry(from).or_default();
        if p.status
            .as_ref()
            .is_some_and(|old| old.unix_ms > status.unix_ms)
        {
            return;
        }
        // The lists it sent now once they check against the status (hashed once, here), or
        // those it sent before while its status still commits to the same ones (a phase change
        // keeps them).
        let same = |old: &Status| {
            (old.formed, old.formed_root, old.holding, old.holding_root)
                == (
                    status.formed,
                    status.formed_root,
                    status.holding,
                    status.holding_root,
                )
        };
        p.lists = match lists {
            Some(l) => Some(l).filter(|l| l.matches(&status)),
            None => p
                .lists
                .take()
                .filter(|_| p.status.as_ref().is_some_and(same)),
        };
        if status.phase == Phase::Training && status.role == NodeRole::Trainer {
            self.round_started.entry(status.round).or_insert(now);
            let keep = status.round.saturating_sub(2);
            self.round_started.retain(|r, _| *r >= keep);
        }
        p.status = Some(status);
        self.peer_changed(from);
    }

    /// Notes that `k`'s status or connection changed (see [`RECENT_CHANGES`]).
    pub(super) fn peer_changed(&mut self, k: Key) {
        self.peer_changes += 1;
        self.recent_changes.push_back(k);
        if self.recent_changes.len() > RECENT_CHANGES {
            self.recent_changes.pop_front();
        }
    }

    /// The peers changed since `seen` changes, when all of them are still remembered.
    pub(super) fn changed_since(&self, seen: u64) -> Option<impl Iterator<Item = &Key>> {
        let new = usize::try_from(self.peer_changes.checked_sub(seen)?).ok()?;
        (new <= self.recent_changes.len()).then(|| self.recent_changes.iter().rev().take(new))
    }

    pub(super) fn answered(&mut self, from: Key) {
        if let Some((waiting, _)) = &mut self.asking {
            waiting.remove(&from);
            if waiting.is_empty() {
                self.asking = None;
            }
        }
    }

    /// Asks `peers` for their statuses with the lists they commit to; with `wait`, the stages
    /// that need fresh statuses wait for the answers (at most [`LOOKUP_MS`]).
    pub(super) fn ask_lists(&mut self, now: Millis, peers: Vec<Key>, wait: bool) {
        if peers.is_empty() {
            return;
        }
        if wait {
            let waiting = match self.asking.take() {
                Some((mut w, until)) if now < until => {
                    w.extend(peers.iter().copied());
                    w
                }
                _ => peers.iter().copied().collect(),
            };
            self.asking = Some((waiting, now + LOOKUP_MS));
        }
        self.out.push(Output::AskLists(peers));
    }

    /// The lists peers sent, by the roots they match: peers whose statuses commit to the same
    /// root hold the same list, so one copy serves them all.
    pub(super) fn known_lists(&self) -> KnownLists {
        let mut known = KnownLists::default();
        for p in self.peers.values() {
            if let (Some(s), Some(l)) = (&p.status, &p.lists) {
                known
                    .holding
                    .entry(s.holding_root)
                    .or_insert_with(|| l.clone());
                known
                    .formed
                    .entry(s.formed_root)
                    .or_insert_with(|| l.clone());
            }
        }
        known
    }

    /// This node's order among peers that are otherwise alike (their keys XOR ours): each node
    /// has its own, so a swarm's nodes do not all ask the same peer.
    pub(super) fn spread(&self, p: &Key) -> Key {
        std::array::from_fn(|i| p[i] ^ self.me[i])
    }

    /// Asks every connected peer for its status; the stages that need fresh statuses wait for
    /// the answers (at most [`LOOKUP_MS`]).
    pub(super) fn refresh_statuses(&mut self, now: Millis) {
        let peers: Vec<Key> = self
            .peers
            .iter()
            .filter(|(_, p)| p.connected)
            .map(|(k, _)| *k)
            .collect();
        self.refreshed_at = now;
        if peers.is_empty() {
            return;
        }
        self.asking = Some((peers.iter().copied().collect(), now + LOOKUP_MS));
        self.out.push(Output::AskStatuses(peers));
    }

    pub(super) fn refreshing(&self) -> bool {
        self.asking.is_some()
    }

    /// Connected trainer peers that have not left, with their statuses.
    pub(super) fn trainer_peers(&self) -> impl Iterator<Item = (&Key, &Status)> {
        self.peers
            .iter()
            .filter_map(|(k, p)| Some((k, trainer_status(p)?)))
    }

    /// At least `n` live peers (stops counting there: looked at on every input while starting).
    pub(super) fn live_peers_reach(&self, n: usize) -> bool {
        self.trainer_peers()
            .filter(|(_, s)| s.phase != Phase::Paused)
            .take(n)
            .count()
            >= n
    }

    /// Whether peer `k` is one of [`Self::working_on`]`(r)`.
    pub(super) fn works_on(&self, k: &Key, r: u64) -> bool {
        self.peers
            .get(k)
            .and_then(trainer_status)
            .is_some_and(|s| working_on_status(s, r, &self.hash))
    }

    /// Peers working on round `r` from our state (about to train, training or collecting): the
    /// ones whose contributions our round can count. A peer on another state of the round sends
    /// contributions we refuse, so nobody waits for it.
    pub(super) fn working_on(&self, r: u64) -> impl Iterator<Item = (&Key, &Status)> {
        let ours = self.hash;
        self.trainer_peers()
            .filter(move |(_, s)| working_on_status(s, r, &ours))
    }
}

/// How many of the latest peer changes the machine remembers: enough for the inputs between two
/// looks of the collecting stage (one, usually), few enough to cost nothing.
const RECENT_CHANGES: usize = 64;

/// A peer's status when it is a connected trainer that has not left ([`RoundMachine::trainer_peers`]).
fn trainer_status(p: &Peer) -> Option<&Status> {
    let s = p.status.as_ref()?;
    (p.connected && s.role == NodeRole::Trainer && s.phase != Phase::Done).then_some(s)
}

/// A trainer peer's status says it works on round `r` from the state `ours`.
fn working_on_status(s: &Status, r: u64, ours: &Hash32) -> bool {
    s.round == r
        && s.state_hash == *ours
        && matches!(s.phase, Phase::Ready | Phase::Training | Phase::Collecting)
}
