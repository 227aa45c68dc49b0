//! Prometheus metrics of a running node (`nightshift run --http ADDR`, `GET /metrics`): the
//! rounds as the node's events tell them, and libp2p's own connection and protocol metrics.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use crate::events::NodeEvent;

type FloatGauge = Gauge<f64, AtomicU64>;

/// The node's metrics and the registry that serves them.
pub struct NodeMetrics {
    registry: Mutex<Registry>,
    round: Gauge,
    val_loss: FloatGauge,
    contributors: Gauge,
    tokens_per_sec: FloatGauge,
    round_secs: FloatGauge,
    training: Gauge,
    rounds_completed: Counter,
    tokens: Counter,
    bytes_sent: Counter,
    bytes_received: Counter,
    syncs: Family<Vec<(String, String)>, Counter>,
    forks_repaired: Counter,
    yields: Counter,
    refused: Counter,
    diverged: Counter,
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl NodeMetrics {
    /// A registry with the node's metrics (prefix `nightshift_`; libp2p's, once added, go
    /// under `libp2p_`).
    pub fn new() -> Self {
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("nightshift");
        let m = NodeMetrics {
            registry: Mutex::new(Registry::default()),
            round: Gauge::default(),
            val_loss: FloatGauge::default(),
            contributors: Gauge::default(),
            tokens_per_sec: FloatGauge::default(),
            round_secs: FloatGauge::default(),
            training: Gauge::default(),
            rounds_completed: Counter::default(),
            tokens: Counter::default(),
            bytes_sent: Counter::default(),
            bytes_received: Counter::default(),
            syncs: Family::default(),
            forks_repaired: Counter::default(),
            yields: Counter::default(),
            refused: Counter::default(),
            diverged: Counter::default(),
        };
        r.register(
            "round",
            "The round of the state this node holds (θ(round))",
            m.round.clone(),
        );
        r.register(
            "val_loss",
            "Validation loss of the state this node holds",
            m.val_loss.clone(),
        );
        r.register(
            "round_contributors",
            "Contributions that formed the last completed round",
            m.contributors.clone(),
        );
        r.register(
            "tokens_per_second",
            "This node's training throughput in the last completed round",
            m.tokens_per_sec.clone(),
        );
        r.register(
            "round_seconds",
            "Wall time of the last completed round on this node",
            m.round_secs.clone(),
        );
        r.register(
            "training",
            "1 while this node trains (its machine is idle), 0 while paused",
            m.training.clone(),
        );
        r.register(
            "rounds_completed",
            "Rounds this node completed since it started",
            m.rounds_completed.clone(),
        );
        r.register(
            "tokens_trained",
            "Tokens this node trained in completed rounds",
            m.tokens.clone(),
        );
        r.register(
            "round_bytes_sent",
            "Request-response bytes this node wrote in completed rounds",
            m.bytes_sent.clone(),
        );
        r.register(
            "round_bytes_received",
            "Request-response bytes this node read in completed rounds",
            m.bytes_received.clone(),
        );
        r.register(
            "syncs",
            "States adopted from peers, by how they were checked (replay or attested)",
            m.syncs.clone(),
        );
        r.register(
            "forks_repaired",
            "States of a round replaced by the swarm's (a fork left)",
            m.forks_repaired.clone(),
        );
        r.register(
            "yields",
            "Times training stopped because the machine's owner needed it",
            m.yields.clone(),
        );
        r.register(
            "contributions_refused",
            "Peers' contributions refused (bad signature, base, size, ...)",
            m.refused.clone(),
        );
        r.register(
            "rounds_diverged",
            "Rounds whose local training produced a non-finite value (nothing sent)",
            m.diverged.clone(),
        );
        *m.registry.lock().expect("fresh") = root;
        m
    }

    /// libp2p's metrics (connections, Kademlia, identify, ping, relay, hole punching), in the
    /// same registry under `libp2p_`.
    pub fn libp2p(&self) -> libp2p::metrics::Metrics {
        let mut r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        libp2p::metrics::Metrics::new(&mut r)
    }

    /// Updates the metrics from one of the node's events.
    pub fn observe(&self, ev: &NodeEvent) {
        match ev {
            NodeEvent::Started {
                round, val_loss, ..
            } => {
                self.round.set(*round as i64);
                self.val_loss.set(f64::from(*val_loss));
            }
            NodeEvent::RoundCompleted(r) => {
                self.round.set(r.round as i64);
                self.val_loss.set(f64::from(r.val_loss));
                self.contributors.set(r.contributors as i64);
                self.tokens_per_sec.set(r.tokens_per_sec);
                self.round_secs.set(r.round_secs);
                self.rounds_completed.inc();
                self.tokens.inc_by(r.tokens);
                self.bytes_sent.inc_by(r.bytes_sent);
                self.bytes_received.inc_by(r.bytes_received);
            }
            NodeEvent::Synced {
                round,
                verified,
                replaced,
                ..
            } => {
                self.round.set(*round as i64);
                self.syncs
                    .get_or_create(&vec![("verified".into(), verified.clone())])
                    .inc();
                if replaced.is_some() {
                    self.forks_repaired.inc();
                }
            }
            NodeEvent::Training { round, .. } => {
                self.round.set(*round as i64);
                self.training.set(1);
            }
            NodeEvent::Yielded { .. } => {
                self.yields.inc();
            }
            NodeEvent::Paused { .. } | NodeEvent::Stopped { .. } => {
                self.training.set(0);
            }
            NodeEvent::Resumed { .. } => {
                self.training.set(1);
            }
            NodeEvent::Refused { .. } => {
                self.refused.inc();
            }
            NodeEvent::Diverged { .. } => {
                self.diverged.inc();
            }
        }
    }

    /// The metrics in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let r = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        if encode(&mut out, &r).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_move_the_metrics_and_libp2p_shares_the_registry() {
        let m = NodeMetrics::new();
        let _p2p = m.libp2p();
        m.observe(&NodeEvent::Training {
            round: 4,
            steps: 25,
        });
        m.observe(&NodeEvent::Refused {
            round: 4,
            from: "x".into(),
            reason: "bad".into(),
        });
        let text = m.render();
        assert!(text.contains("nightshift_round 4"), "{text}");
        assert!(text.contains("nightshift_training 1"), "{text}");
        assert!(
            text.contains("nightshift_contributions_refused_total 1"),
            "{text}"
        );
        assert!(text.contains("\nlibp2p_swarm"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
