//! Idle windows in the round loop: following the idle monitor, pausing and resuming, window
//! records, joining a round under way, and the per-round time budget.

use super::*;

/// Follows the idle monitor: keeps `avail` current for the training thread and notes when a
/// window closes (and when it was scheduled to).
pub(super) fn spawn_availability_watch(
    mut rx: watch::Receiver<Availability>,
    avail: Arc<AtomicBool>,
    closing: Arc<Mutex<Closing>>,
) {
    let first = rx.borrow_and_update().clone();
    avail.store(first.idle, Ordering::SeqCst);
    let mut last_until = first.open_until;
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            let a = rx.borrow_and_update().clone();
            let was = avail.swap(a.idle, Ordering::SeqCst);
            if was && !a.idle {
                if let Ok(mut c) = closing.lock() {
                    *c = Closing {
                        seen: Some(Instant::now()),
                        scheduled: last_until.filter(|t| *t <= SystemTime::now()),
                    };
                }
                info!(reason = %a.reason, "the machine is busy: yielding");
            } else if !was && a.idle {
                info!(reason = %a.reason, "the machine is idle again");
            }
            if a.idle {
                last_until = a.open_until;
            }
        }
    });
}

/// The device a trainer of backend `B` runs on.
pub(super) fn device_info<B: AutodiffBackend>() -> DeviceInfo {
    let name = std::any::type_name::<B>().to_ascii_lowercase();
    if name.contains("cuda") {
        DeviceInfo {
            kind: "cuda".into(),
            name: "cuda:0".into(),
            memory_bytes: 0,
        }
    } else {
        cpu_info()
    }
}

/// A round's training budget for `tokens` tokens (H · batch · seq) given the live nodes' measured
/// speeds (tokens/s): [`BUDGET_FACTOR`] × the time the median node needs (the upper median for
/// an even count). `None` with fewer than two known speeds. A node slower than that sends a
/// smaller contribution; nobody waits for it past the budget, and nobody shuts it out.
pub(super) fn round_budget(mut speeds: Vec<f64>, tokens: f64) -> Option<Duration> {
    speeds.retain(|s| s.is_finite() && *s > 0.0);
    if speeds.len() < 2 {
        return None;
    }
    speeds.sort_by(f64::total_cmp);
    let median = speeds[speeds.len() / 2];
    Some(Duration::from_secs_f64(BUDGET_FACTOR * tokens / median))
}

pub(super) fn cpu_info() -> DeviceInfo {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory_bytes = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    DeviceInfo {
        kind: "cpu".into(),
        name: format!("cpu ({threads} threads)"),
        memory_bytes,
    }
}

pub(super) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl<B: AutodiffBackend> Driver<B> {
    pub(super) fn available(&self) -> bool {
        self.avail.load(Ordering::SeqCst)
    }

    pub(super) fn availability(&self) -> Option<Availability> {
        self.idle.as_ref().map(|rx| rx.borrow().clone())
    }

    /// True when live peers hold our round and every one of them has started training it.
    pub(super) fn round_under_way(&self) -> bool {
        let r = self.state.round;
        let at_r: Vec<Phase> = self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| s.round == r && !matches!(s.phase, Phase::Syncing | Phase::Paused))
            .map(|(_, s)| s.phase)
            .collect();
        !at_r.is_empty()
            && at_r
                .iter()
                .all(|p| matches!(p, Phase::Training | Phase::Collecting))
    }

    /// Training time left in the round under way, when we know when it started and how long the
    /// live nodes take, and at least a fifth of it (and a second) is left.
    pub(super) fn late_budget(&self) -> Option<Duration> {
        let started = self.round_started.get(&self.state.round)?;
        let expected = self.train_budget()?.as_secs_f64() / BUDGET_FACTOR;
        let left = expected - started.elapsed().as_secs_f64();
        (left >= (expected * 0.2).max(1.0)).then(|| Duration::from_secs_f64(left))
    }

    /// Waits (as [`Phase::Syncing`], so that nobody waits for us) until the round under way ends.
    pub(super) async fn wait_for_round_end(&mut self) {
        let r = self.state.round;
        info!(
            round = r,
            "synced in the middle of a round; joining from the next one"
        );
        self.announce(Phase::Syncing).await;
        let t = &self.manifest.manifest.training;
        let cap = Duration::from_secs((t.round_deadline_secs as u64).max(60) * 4);
        let until = Instant::now() + cap;
        let mut last_refresh = Instant::now();
        while self.round_under_way()
            && Instant::now() < until
            && !self.shutting_down()
            && self.available()
        {
            self.next_event_within(Duration::from_millis(200)).await;
            if last_refresh.elapsed() > Duration::from_secs(1) {
                self.refresh_statuses().await;
                last_refresh = Instant::now();
            }
        }
    }

    /// Stops training until the machine is idle again: announces [`Phase::Paused`], moves the
    /// model and optimizer off the device, and keeps serving. Returns false on shutdown.
    pub(super) async fn pause(&mut self) -> bool {
        let t0 = Instant::now();
        let reason = self
            .availability()
            .map_or_else(|| "busy".to_string(), |a| a.reason);
        self.announce(Phase::Paused).await;
        if let Some(mut c) = self.compute.take() {
            match tokio::task::spawn_blocking(move || {
                c.trainer.suspend();
                c
            })
            .await
            {
                Ok(c) => self.compute = Some(c),
                Err(e) => warn!(error = %e, "could not release the device"),
            }
        }
        // `announce(Paused)` above has already published the Busy window record.
        info!(round = self.state.round, %reason, "training paused; the device is released");
        self.sink.emit(&NodeEvent::Paused {
            round: self.state.round,
            reason,
        });
        while !self.available() {
            if self.shutting_down() {
                return false;
            }
            self.next_event_within(Duration::from_millis(100)).await;
            self.publish_window(WindowState::Busy, "", false).await;
        }
        let paused_secs = t0.elapsed().as_secs_f64();
        info!(round = self.state.round, paused_secs, "resuming");
        self.sink.emit(&NodeEvent::Resumed {
            round: self.state.round,
            paused_secs,
        });
        self.announce(Phase::Ready).await;
        true
    }

    /// Signs and publishes our window record in Kademlia when its state changed (or `force`),
    /// or when the last one is older than [`WINDOW_REFRESH_SECS`].
    pub(super) async fn publish_window(&mut self, state: WindowState, reason: &str, force: bool) {
        let stale = self.window_published.is_none_or(|(st, at)| {
            st != state || at.elapsed() > Duration::from_secs(WINDOW_REFRESH_SECS)
        });
        if !force && !stale {
            return;
        }
        let avail = self.availability();
        let reason = if reason.is_empty() {
            avail.as_ref().map(|a| a.reason.clone()).unwrap_or_default()
        } else {
            reason.to_string()
        };
        let mut reason = reason;
        reason.truncate(nightshift_protocol::message::MAX_WINDOW_TEXT);
        let record = WindowRecord {
            device_kind: self.device.kind.clone(),
            device_name: self.device.name.clone(),
            memory_bytes: self.device.memory_bytes,
            tokens_per_sec: self.tokens_per_sec.unwrap_or(0.0) as f32,
            open_until: avail.and_then(|a| a.open_until).map(unix_secs),
            state,
            reason,
            round: self.state.round,
            updated_at: unix_secs(SystemTime::now()),
        };
        let env = sign_window(&self.key, self.swarm_id, self.hash, &record);
        self.net.put_window(env).await;
        self.window_published = Some((state, Instant::now()));
        self.update_control_info(Some(&record));
    }

    /// Refreshes what `nightshift status` shows.
    pub(super) fn update_control_info(&self, window: Option<&WindowRecord>) {
        let Some(info) = &self.control_info else {
            return;
        };
        let avail = self.availability();
        if let Ok(mut v) = info.write() {
            let mut obj = serde_json::json!({
                "peer_id": self.net.local_peer.to_string(),
                "swarm_id": self.swarm_id.to_hex(),
                "round": self.state.round,
                "state_hash": self.hash.to_hex(),
                "phase": format!("{:?}", self.phase).to_lowercase(),
                "idle": avail.as_ref().is_none_or(|a| a.idle),
                "idle_reason": avail.as_ref().map(|a| a.reason.clone()).unwrap_or_default(),
                "tokens_per_sec": self.tokens_per_sec,
            });
            if let Some(w) = window {
                obj["window"] = serde_json::to_value(w).unwrap_or_default();
            } else if let Some(old) = v.get("window") {
                obj["window"] = old.clone();
            }
            *v = obj;
        }
    }

    /// Fetches the live peers' window records in the background (for their speeds).
    pub(super) fn refresh_peer_windows(&self) {
        let peers: Vec<PeerId> = self.trainer_peers().iter().map(|(p, _)| *p).collect();
        let net = self.net.clone();
        let into = self.peer_windows.clone();
        let swarm = self.swarm_id;
        tokio::spawn(async move {
            for p in peers {
                let Some(key) = net::public_key_of(&p) else {
                    continue;
                };
                let got = tokio::time::timeout(
                    Duration::from_secs(LOOKUP_TIMEOUT_SECS),
                    net.get_window(key),
                )
                .await;
                if let Ok(Some(env)) = got
                    && let Ok(rec) = nightshift_protocol::message::open_window(&env, &swarm)
                    && let Ok(mut m) = into.lock()
                {
                    m.insert(p, rec);
                }
            }
        });
    }

    /// How long this round's training may take: [`BUDGET_FACTOR`] times the median expected
    /// training time of the live trainers whose speed is known (ours included). `None` until at
    /// least two speeds are known.
    pub(super) fn train_budget(&self) -> Option<Duration> {
        let t = &self.manifest.manifest.training;
        let tokens = f64::from(t.inner_steps)
            * f64::from(t.batch_size)
            * f64::from(self.manifest.manifest.model.seq_len);
        let live: HashSet<PeerId> = self
            .trainer_peers()
            .iter()
            .filter(|(_, s)| !matches!(s.phase, Phase::Paused | Phase::Syncing))
            .map(|(p, _)| *p)
            .collect();
        let mut speeds: Vec<f64> = self
            .peer_windows
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(p, w)| live.contains(p) && w.tokens_per_sec > 0.0)
                    .map(|(_, w)| f64::from(w.tokens_per_sec))
                    .collect()
            })
            .unwrap_or_default();
        speeds.extend(self.tokens_per_sec);
        round_budget(speeds, tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn the_budget_follows_the_median_node_not_the_slowest() {
        // Three nodes at 1000 tokens/s and one at 100: the slow one must not set the pace.
        let b = round_budget(vec![1000.0, 100.0, 1000.0, 1000.0], 10_000.0).unwrap();
        assert!((b.as_secs_f64() - 15.0).abs() < 1e-9, "{b:?}");
        // The slow node gets the same 15 s: it trains 1,500 of its 10,000 tokens, and its
        // contribution (weighted by those tokens) arrives in time.
        assert!(round_budget(vec![1000.0], 10_000.0).is_none());
        assert!(round_budget(vec![f64::NAN, 0.0, 500.0], 10_000.0).is_none());
    }
}
