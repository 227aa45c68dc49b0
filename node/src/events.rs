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

/// Appends events to a file (or nowhere).
pub struct EventSink {
    file: Option<Mutex<std::fs::File>>,
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
        Ok(EventSink { file })
    }

    /// Writes one event line and flushes it. Failures are logged, never fatal.
    pub fn emit(&self, ev: &NodeEvent) {
        let Some(f) = &self.file else { return };
        let Ok(mut v) = serde_json::to_value(ev) else {
            return;
        };
        // Every line carries its wall-clock time (unix milliseconds) for tools like
        // `bench churn`; readers of `NodeEvent` ignore it.
        v["at_ms"] = serde_json::json!(unix_ms());
        let line = v.to_string();
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
