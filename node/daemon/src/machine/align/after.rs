//! After aligning: train at once, join the round under way for the time it has left, or wait
//! for it to end; how long a round's training may take.

use super::super::rules::{self, Candidate, candidates};
use super::super::*;

impl RoundMachine {
    /// After aligning: train now, join the round under way for what is left of it, or (just
    /// synced, too late to join) wait for it to end. A node that could not verify a better
    /// state its peers hold yet, with no peer left on its own, tries again first (a few times):
    /// a round trained alone counts for nobody.
    pub(in crate::machine) fn after_align(&mut self, now: Millis) {
        if self.cfg.role == NodeRole::Bootstrap {
            self.stage = Stage::Following {
                at: now + FOLLOW_MS,
            };
            return;
        }
        if !self.available && self.early_ended() {
            // Steps ran ahead for this round until the window closed: what they did counts.
            let e = self.early.take().expect("checked");
            return self.resume_early(now, e);
        }
        if !self.available {
            return self.begin_round(now);
        }
        if self.stalls < MAX_STALLS && self.better_unverified() {
            self.stalls += 1;
            self.out.push(Output::Note(Note::Stalled {
                round: self.state.round,
                times: self.stalls,
            }));
            self.stage = Stage::Retrying {
                at: now + rules::RETRY_SECS * 1000,
            };
            return;
        }
        self.stalls = 0;
        if let Some(e) = self.early.take() {
            // Steps ran ahead for this round while the last one was collected.
            return self.resume_early(now, e);
        }
        if self.round_under_way() {
            match self.late_budget(now) {
                Some(left) => {
                    self.out.push(Output::Note(Note::JoinedLate {
                        round: self.state.round,
                        budget_ms: left,
                    }));
                    self.start_training(now, Some(left));
                    return;
                }
                None if self.just_synced && !self.waited_for_round => {
                    self.waited_for_round = true;
                    self.out.push(Output::Note(Note::WaitingForRoundEnd {
                        round: self.state.round,
                    }));
                    // A node that just started knows no speeds yet: with its peers' it can
                    // still join this round late (see the waiting stage).
                    if self.train_budget().is_none() {
                        let mut keys = self.trainer_keys();
                        keys.push(self.me);
                        self.out.push(Output::LookUpSpeeds(keys));
                    }
                    self.announce(Phase::Syncing);
                    let cap = self.cfg.round_deadline_ms.max(60_000) * 4;
                    self.stage = Stage::Waiting { until: now + cap };
                    return;
                }
                None => {}
            }
        }
        let budget = self.train_budget();
        self.start_training(now, budget);
    }

    /// True when no live peer works on our state's round while some hold a state the rules
    /// prefer (a fork of our round, or the next round) that did not verify, through no fault of
    /// its own.
    fn better_unverified(&self) -> bool {
        if self.working_on(self.state.round).next().is_some() {
            return false;
        }
        let claims = self.claims();
        candidates(
            &self.cfg.recipe,
            self.held_now(&claims),
            &claims,
            &rules::Rejections::default(),
        )
        .iter()
        .any(|c| {
            matches!(c, Candidate::Fork(_) | Candidate::Ahead(_))
                && !self.rejected.faulty(c.claim())
        })
    }

    /// True when live peers hold our round and every one of them has started training it.
    pub(in crate::machine) fn round_under_way(&self) -> bool {
        let r = self.state.round;
        let mut any = false;
        for (_, s) in self.trainer_peers() {
            if s.round != r || matches!(s.phase, Phase::Syncing | Phase::Paused) {
                continue;
            }
            if !matches!(s.phase, Phase::Training | Phase::Collecting) {
                return false;
            }
            any = true;
        }
        any
    }

    /// Training time left in the round under way, when we know when it started and how long the
    /// live nodes take, and at least a fifth of it (and a second) is left.
    pub(in crate::machine) fn late_budget(&self, now: Millis) -> Option<Millis> {
        let started = *self.round_started.get(&self.state.round)?;
        let expected = self.train_budget()? as f64 / BUDGET_FACTOR;
        let left = expected - now.saturating_sub(started) as f64;
        (left >= (expected * 0.2).max(1000.0)).then_some(left as Millis)
    }

    /// How long this round's training may take: [`BUDGET_FACTOR`] times the median expected
    /// training time of the live trainers whose speed is known (ours included); `None` until
    /// two speeds are known.
    pub(in crate::machine) fn train_budget(&self) -> Option<Millis> {
        let mut speeds: Vec<f64> = self
            .peers
            .values()
            .filter(|p| {
                p.connected
                    && p.status.as_ref().is_some_and(|s| {
                        s.role == NodeRole::Trainer
                            && !matches!(s.phase, Phase::Done | Phase::Paused | Phase::Syncing)
                    })
            })
            .filter_map(|p| p.tokens_per_sec)
            .collect();
        speeds.extend(self.tokens_per_sec);
        round_budget(speeds, self.cfg.round_tokens)
    }
}

/// A round's training budget in milliseconds for `tokens` tokens given the live nodes' speeds
/// (tokens/s): [`BUDGET_FACTOR`] × the time the median node needs (the upper median of an even
/// count), and at least [`MIN_TRAIN_BUDGET_MS`]. `None` with fewer than two known speeds. A node slower than that sends a smaller
/// contribution; nobody waits for it past the budget, and nobody shuts it out.
pub fn round_budget(mut speeds: Vec<f64>, tokens: f64) -> Option<Millis> {
    speeds.retain(|s| s.is_finite() && *s > 0.0);
    if speeds.len() < 2 {
        return None;
    }
    speeds.sort_by(f64::total_cmp);
    let median = speeds[speeds.len() / 2];
    Some(((BUDGET_FACTOR * tokens / median * 1000.0) as Millis).max(MIN_TRAIN_BUDGET_MS))
}
