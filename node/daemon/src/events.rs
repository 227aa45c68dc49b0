//! Machine-readable node events, one JSON object per line (`--events FILE`). The demo and the
//! integration tests read these; humans read the tracing log.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

/// One thing a node did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum NodeEvent {
    /// The node is up and holds θ(round).
    Started {
        peer_id: String,
        round: u64,
        state_hash: String,
        num_params: usize,
        val_loss: f32,
        resumed: bool,
    },
    /// Round `round - 1` completed: the node now holds θ(round).
    RoundCompleted(RoundRecord),
    /// The node replaced its state with the swarm's (catching up, or repairing a divergence).
    Synced {
        round: u64,
        state_hash: String,
        from: String,
        reason: String,
        /// Seconds the download took, and its size (what was fetched this time; a resumed
        /// download counts only the rest).
        secs: f64,
        bytes: u64,
        /// How the state was checked: "replay" (its round replayed from a state the node
        /// trusted) or "attested" (signed by a bootstrap or the members' quorum).
        #[serde(default)]
        verified: String,
        /// When the node replaced a state of the same round (a fork it repaired), that state's
        /// hash.
        #[serde(default)]
        replaced: Option<String>,
    },
    /// Training of round `round` (from θ(round)) began: up to `steps` inner steps.
    Training { round: u64, steps: u32 },
    /// The machine stopped being idle: training stopped at the next step boundary.
    Yielded {
        round: u64,
        /// Inner steps and tokens done in the round before the yield (sent as a partial
        /// contribution when more than zero).
        steps: u32,
        tokens: u64,
        /// From the moment the window closed (or was seen to close) to training stopped.
        latency_ms: f64,
        reason: String,
    },
    /// This node's own training of `round` produced a non-finite parameter (at `index` of the
    /// flat vector): its work was dropped (nothing sent) and its trainer restarted from θ(round)
    /// with a fresh inner optimizer. `in_a_row` counts such rounds; at 3 the node stops.
    Diverged {
        round: u64,
        index: u64,
        in_a_row: u32,
    },
    /// The node stopped training until the machine is idle again (the device is released).
    Paused { round: u64, reason: String },
    /// The machine is idle again; the node rejoins the rounds.
    Resumed { round: u64, paused_secs: f64 },
    /// A contribution was refused.
    Refused {
        round: u64,
        from: String,
        reason: String,
    },
    /// The node stopped; its last checkpoint is θ(round).
    Stopped {
        round: u64,
        state_hash: String,
        reason: String,
    },
}

/// What one completed round looked like from one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoundRecord {
    /// The new round number: the node holds θ(round).
    pub round: u64,
    pub state_hash: String,
    pub val_loss: f32,
    pub train_loss: f32,
    pub contributors: usize,
    /// Contributions the round planned for (the median of what they expected); a round with
    /// fewer took a smaller step.
    #[serde(default)]
    pub planned: u32,
    /// The factor the round's mean delta was scaled by (1 for a full round).
    #[serde(default = "one")]
    pub step_scale: f32,
    /// The swarm's running noise ratio of one contribution after the round, if known.
    #[serde(default)]
    pub noise_ratio: Option<f64>,
    /// Tokens behind each averaged contribution (the weights), by sender (first 6 bytes, hex).
    #[serde(default)]
    pub weights: Vec<(String, u64)>,
    /// Tokens this node trained in the round.
    pub tokens: u64,
    pub tokens_per_sec: f64,
    pub inner_steps: u32,
    /// Request-response bytes this node wrote during the round.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Of `bytes_sent`, its signed statuses (announced to peers or answered on request).
    #[serde(default)]
    pub status_bytes_sent: u64,
    /// This node's delta as raw f32.
    pub dense_delta_bytes: u64,
    /// This node's delta as encoded on the wire (zstd body).
    pub wire_delta_bytes: u64,
    pub codec: String,
    pub train_secs: f64,
    pub encode_secs: f64,
    pub transfer_secs: f64,
    pub wait_secs: f64,
    pub round_secs: f64,
}

fn one() -> f32 {
    1.0
}

/// Appends events to a file (or nowhere), and feeds them to the node's metrics and dashboard.
pub struct EventSink {
    file: Option<Mutex<std::fs::File>>,
    metrics: Option<std::sync::Arc<crate::metrics::NodeMetrics>>,
    feed: Option<std::sync::Arc<EventFeed>>,
}

/// The node's events as JSON lines for live readers (the dashboard's server-sent events): the
/// last [`EventFeed::KEEP`] for a reader that arrives late, then each new one.
pub struct EventFeed {
    history: Mutex<std::collections::VecDeque<String>>,
    tx: tokio::sync::broadcast::Sender<String>,
}

impl Default for EventFeed {
    fn default() -> Self {
        EventFeed {
            history: Mutex::new(std::collections::VecDeque::new()),
            tx: tokio::sync::broadcast::channel(256).0,
        }
    }
}

impl EventFeed {
    /// Events kept for readers that arrive late.
    pub const KEEP: usize = 4096;

    fn push(&self, line: String) {
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == Self::KEEP {
            h.pop_front();
        }
        h.push_back(line.clone());
        // Sent under the lock, so a reader subscribing meanwhile misses or repeats nothing.
        let _ = self.tx.send(line);
    }

    /// The events so far, and a receiver of the ones to come.
    pub fn subscribe(&self) -> (Vec<String>, tokio::sync::broadcast::Receiver<String>) {
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        (h.iter().cloned().collect(), self.tx.subscribe())
    }
}

impl EventSink {
    /// A sink writing to `path`, or a silent one.
    ///
    /// # Errors
    /// When the file cannot be opened for appending.
    pub fn open(path: Option<&Path>) -> std::io::Result<Self> {
        let file = match path {
            Some(p) => Some(Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
            None => None,
        };
        Ok(EventSink {
            file,
            metrics: None,
            feed: None,
        })
    }

    /// Also sends every event to `feed`.
    pub fn with_feed(mut self, feed: Option<std::sync::Arc<EventFeed>>) -> Self {
        self.feed = feed;
        self
    }

    /// Also updates `metrics` with every event.
    pub fn with_metrics(
        mut self,
        metrics: Option<std::sync::Arc<crate::metrics::NodeMetrics>>,
    ) -> Self {
        self.metrics = metrics;
        self
    }

    /// Writes one event line and flushes it. Failures are logged, never fatal.
    pub fn emit(&self, ev: &NodeEvent) {
        if let Some(m) = &self.metrics {
            m.observe(ev);
        }
        if self.file.is_none() && self.feed.is_none() {
            return;
        }
        let Ok(mut v) = serde_json::to_value(ev) else {
            return;
        };
        // Every line carries its wall-clock time (unix milliseconds) for tools like
        // `bench churn`; readers of `NodeEvent` ignore it.
        v["at_ms"] = serde_json::json!(unix_ms());
        let line = v.to_string();
        if let Some(feed) = &self.feed {
            feed.push(line.clone());
        }
        let Some(f) = &self.file else { return };
        if let Ok(mut f) = f.lock()
            && let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush())
        {
            tracing::warn!(error = %e, "cannot write event");
        }
    }
}

/// Reads every event of a JSON-lines file, skipping a torn last line.
pub fn read_events(path: &Path) -> Vec<NodeEvent> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Forks per round: how many more distinct states than one any node held for that round, as the
/// nodes' events tell (every completion and every sync, not just the last of each). A
/// divergence that a node later repaired by adopting another state counts; 0 everywhere means
/// every node only ever held the one state of each round.
pub fn forks_per_round<'a>(
    nodes: impl IntoIterator<Item = &'a [NodeEvent]>,
) -> std::collections::BTreeMap<u64, usize> {
    let mut held: std::collections::BTreeMap<u64, std::collections::BTreeSet<&str>> =
        Default::default();
    for events in nodes {
        for e in events {
            let (round, hash) = match e {
                NodeEvent::RoundCompleted(r) => (r.round, r.state_hash.as_str()),
                NodeEvent::Synced {
                    round,
                    state_hash,
                    replaced,
                    ..
                } => {
                    if let Some(old) = replaced {
                        held.entry(*round).or_default().insert(old.as_str());
                    }
                    (*round, state_hash.as_str())
                }
                _ => continue,
            };
            held.entry(round).or_default().insert(hash);
        }
    }
    held.into_iter()
        .map(|(round, hashes)| (round, hashes.len().saturating_sub(1)))
        .collect()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Like [`read_events`], with each event's wall-clock time (unix ms; 0 when absent).
pub fn read_timed_events(path: &Path) -> Vec<(u64, NodeEvent)> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter_map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).ok()?;
                    let at = v
                        .get("at_ms")
                        .and_then(serde_json::Value::as_u64)
                        .unwrap_or(0);
                    Some((at, serde_json::from_value(v).ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(round: u64, hash: &str) -> NodeEvent {
        NodeEvent::RoundCompleted(RoundRecord {
            round,
            state_hash: hash.into(),
            val_loss: 1.0,
            train_loss: 1.0,
            contributors: 2,
            planned: 2,
            step_scale: 1.0,
            noise_ratio: None,
            weights: vec![],
            tokens: 1,
            tokens_per_sec: 1.0,
            inner_steps: 1,
            bytes_sent: 0,
            bytes_received: 0,
            status_bytes_sent: 0,
            dense_delta_bytes: 0,
            wire_delta_bytes: 0,
            codec: "fp32".into(),
            train_secs: 0.0,
            encode_secs: 0.0,
            transfer_secs: 0.0,
            wait_secs: 0.0,
            round_secs: 0.0,
        })
    }

    fn synced(round: u64, hash: &str, replaced: Option<&str>) -> NodeEvent {
        NodeEvent::Synced {
            round,
            state_hash: hash.into(),
            from: "peer".into(),
            reason: "diverged from the swarm".into(),
            secs: 0.0,
            bytes: 0,
            verified: "replay".into(),
            replaced: replaced.map(Into::into),
        }
    }

    #[test]
    fn a_repaired_divergence_counts_as_a_fork() {
        // Node a completed round 2 on a state it later replaced by b's: one fork at round 2,
        // though both nodes end on the same state.
        let a = vec![
            completed(1, "x"),
            completed(2, "y1"),
            synced(2, "y2", Some("y1")),
        ];
        let b = vec![completed(1, "x"), completed(2, "y2"), completed(3, "z")];
        let f = forks_per_round([a.as_slice(), b.as_slice()]);
        assert_eq!(f.get(&1), Some(&0));
        assert_eq!(f.get(&2), Some(&1));
        assert_eq!(f.get(&3), Some(&0));
        // A catch-up sync to the swarm's state is no fork.
        let c = vec![synced(3, "z", None)];
        let f = forks_per_round([b.as_slice(), c.as_slice()]);
        assert!(f.values().all(|n| *n == 0), "{f:?}");
    }
}
