//! Idle windows in the round loop: following the idle monitor, pausing and resuming, window
//! records, joining a round under way, and the per-round time budget.

use super::*;
use nightshift_protocol::WindowRecord;
use nightshift_protocol::message::sign_window;

/// The peers' window records as last looked up, by key.
pub(super) type PeerWindows =
    Arc<Mutex<std::collections::HashMap<crate::machine::Key, WindowRecord>>>;

/// How often an unchanged window record is re-published.
const WINDOW_REFRESH_SECS: u64 = 60;

/// Follows the idle monitor: keeps `avail` current for the training thread, notes when a window
/// closes (and when it was scheduled to), and tells the machine (`Input::Window`), after the flag.
pub(super) fn spawn_availability_watch(
    mut rx: watch::Receiver<Availability>,
    avail: Arc<AtomicBool>,
    closing: Arc<Mutex<Closing>>,
    machine: mpsc::UnboundedSender<Input>,
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
            if was != a.idle && machine.send(Input::Window(a.idle)).is_err() {
                break;
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

    /// What announcing `phase` means besides the status: a pause releases the device and a
    /// resume is recorded; the window record and `nightshift status` follow.
    pub(super) async fn announced(&mut self, phase: Phase) {
        let was = std::mem::replace(&mut self.phase, phase);
        let round = self.m.round();
        if phase == Phase::Syncing && was != Phase::Syncing {
            self.syncing_since = Some(Instant::now());
        }
        if phase == Phase::Paused && was != Phase::Paused {
            let reason = self
                .availability()
                .map_or_else(|| "busy".to_string(), |a| a.reason);
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
            info!(round, %reason, "training paused; the device is released");
            self.sink.emit(&NodeEvent::Paused { round, reason });
            self.paused_since = Some(Instant::now());
        } else if was == Phase::Paused
            && phase != Phase::Paused
            && let Some(t0) = self.paused_since.take()
        {
            let paused_secs = t0.elapsed().as_secs_f64();
            info!(round, paused_secs, "resuming");
            self.sink.emit(&NodeEvent::Resumed { round, paused_secs });
        }
        let (window, force) = match phase {
            Phase::Ready | Phase::Training | Phase::Collecting => (WindowState::Training, false),
            Phase::Syncing => (WindowState::Syncing, false),
            Phase::Paused => (WindowState::Busy, false),
            Phase::Done => (WindowState::Left, true),
        };
        self.publish_window(window, "", force).await;
        self.update_control_info(None);
    }

    /// Every tick: a paused node keeps its Busy window record fresh.
    pub(super) async fn on_tick(&mut self) {
        if self.phase == Phase::Paused {
            self.publish_window(WindowState::Busy, "", false).await;
        }
    }

    /// Signs and publishes our window record in Kademlia when its state changed (or `force`),
    /// when the measured speed moved by a quarter or more (the first measurement included), or
    /// when the last one is older than [`WINDOW_REFRESH_SECS`].
    pub(super) async fn publish_window(&mut self, state: WindowState, reason: &str, force: bool) {
        let speed = self.tokens_per_sec.unwrap_or(0.0) as f32;
        let stale = self.window_published.is_none_or(|(st, at, sent)| {
            st != state
                || at.elapsed() > Duration::from_secs(WINDOW_REFRESH_SECS)
                || (speed - sent).abs() > 0.25 * sent.max(f32::MIN_POSITIVE)
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
            tokens_per_sec: speed,
            open_until: avail.and_then(|a| a.open_until).map(unix_secs),
            state,
            reason,
            round: self.m.round(),
            updated_at: unix_secs(SystemTime::now()),
        };
        let env = sign_window(&self.key, self.swarm_id, self.m.hash(), &record);
        self.io.net.put_window(env).await;
        self.window_published = Some((state, Instant::now(), speed));
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
                "peer_id": self.io.net.local_peer.to_string(),
                "swarm_id": self.swarm_id.to_hex(),
                "round": self.m.round(),
                "state_hash": self.m.hash().to_hex(),
                "phase": format!("{:?}", self.phase).to_lowercase(),
                "idle": avail.as_ref().is_none_or(|a| a.idle),
                "idle_reason": avail.as_ref().map(|a| a.reason.clone()).unwrap_or_default(),
                "tokens_per_sec": self.tokens_per_sec,
            });
            if let Ok(r) = self.io.net.reach.read() {
                obj["network"] = serde_json::to_value(&*r).unwrap_or_default();
            }
            let view = self.m.peer_view();
            let windows = self.peer_windows.lock().ok().map(|mut w| {
                // Only the peers the machine still knows: the map stays as small as they are.
                w.retain(|k, _| view.iter().any(|(p, ..)| p == k));
                w.clone()
            });
            obj["peers"] = view
                .into_iter()
                .map(|(k, connected, s, speed)| {
                    let w = windows.as_ref().and_then(|w| w.get(&k));
                    serde_json::json!({
                        "device": w.map(|w| w.device_name.clone()),
                        "memory_bytes": w.map(|w| w.memory_bytes),
                        "window": w.map(|w| format!("{:?}", w.state).to_lowercase()),
                        "open_until": w.and_then(|w| w.open_until),
                        "key": hex::encode(&k[..6]),
                        "connected": connected,
                        "role": s.map(|s| format!("{:?}", s.role).to_lowercase()),
                        "phase": s.map(|s| format!("{:?}", s.phase).to_lowercase()),
                        "round": s.map(|s| s.round),
                        "tokens_per_sec": speed.or_else(|| {
                            w.map(|w| f64::from(w.tokens_per_sec)).filter(|t| *t > 0.0)
                        }),
                        "clock_offset_ms": self.io.clock_offset_ms(&k),
                    })
                })
                .collect();
            if let Some(w) = window {
                obj["window"] = serde_json::to_value(w).unwrap_or_default();
            } else if let Some(old) = v.get("window") {
                obj["window"] = old.clone();
            }
            *v = obj;
        }
    }

    /// Fetches the live peers' window records in the background; their speeds go to the
    /// machine (for the round's time budget).
    pub(super) fn refresh_peer_windows(&self) {
        self.look_up_windows(self.m.trainer_keys());
    }

    /// Fetches these peers' window records in the background; their speeds go to the machine,
    /// the records to [`PeerWindows`].
    pub(super) fn look_up_windows(&self, peers: Vec<crate::machine::Key>) {
        let net = self.io.net.clone();
        let answers = self.io.answers();
        let swarm = self.swarm_id;
        let seen = self.peer_windows.clone();
        tokio::spawn(async move {
            for key in peers {
                let got = tokio::time::timeout(
                    Duration::from_millis(crate::machine::LOOKUP_MS),
                    net.get_window(key),
                )
                .await;
                if let Ok(Some(env)) = got
                    && let Ok(rec) = nightshift_protocol::message::open_window(&env, &swarm)
                {
                    let _ = answers.send(Input::Speed {
                        from: key,
                        tokens_per_sec: f64::from(rec.tokens_per_sec),
                    });
                    if let Ok(mut seen) = seen.lock() {
                        seen.insert(key, rec);
                    }
                }
            }
        });
    }
}
