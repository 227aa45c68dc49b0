//! The run: set up the swarm, attack once a second (or faster) until the end, and report.

use futures::StreamExt;
use libp2p::multiaddr::Protocol;
use nightshift_node::net::{protocol_names, unix_ms};
use nightshift_protocol::{SignedManifest, delta};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::args::{Args, Mode};
use crate::net::build_swarm;
use crate::{Junk, Run, Tally};

impl Run {
    fn report(&self, secs: f64) -> serde_json::Value {
        let total = |f: fn(&Tally) -> u64| self.tally.values().map(f).sum::<u64>();
        let by_kind: serde_json::Map<String, serde_json::Value> = self
            .tally
            .iter()
            .map(|(k, t)| {
                (
                    (*k).to_string(),
                    serde_json::json!({"sent": t.sent, "answered": t.answered, "failed": t.failed}),
                )
            })
            .collect();
        let mut trainers: Vec<String> = self.trainers.iter().map(|p| p.to_string()).collect();
        trainers.sort();
        serde_json::json!({
            "mode": self.mode.name(),
            "peer_id": self.local.to_string(),
            "public_key": hex::encode(self.me),
            "secs": secs,
            "connected_peers": self.ever_connected.len(),
            "connected_at_end": self.connected.len(),
            "disconnected": self.disconnected,
            "dial_failures": self.dial_failures,
            "requests": total(|t| t.sent),
            "answered": total(|t| t.answered),
            "failed": total(|t| t.failed),
            "refused_answers": self.refused_answers,
            "raw_closed": self.raw_closed,
            "raw_answered": self.raw_answered,
            "by_kind": by_kind,
            "inbound": self.inbound.iter().map(|(k, v)| ((*k).to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
            "inbound_failures": self.inbound_failures,
            "statuses_opened": self.statuses_opened,
            "statuses_refused": self.statuses_refused,
            "honest_round": self.honest_round,
            "trainers": trainers,
            "forged": self.forged_log.iter().map(|(r, h)| serde_json::json!({"round": r, "hash": h.to_hex()})).collect::<Vec<_>>(),
            "announced": self.announced,
            "contributions_served": self.contributions_served,
            "state_chunks_served": self.state_chunks_served,
            "captured": self.captured.keys().map(|(r, k)| serde_json::json!({"round": r, "sender": hex::encode(&k[..6])})).collect::<Vec<_>>(),
            "replays_pushed": self.replays_pushed,
        })
    }
}

pub(crate) async fn run(args: Args) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(&args.manifest)
        .map_err(|e| format!("cannot read {}: {e}", args.manifest.display()))?;
    let manifest: SignedManifest =
        serde_json::from_str(&text).map_err(|e| format!("not a manifest: {e}"))?;
    let key = match &args.key {
        Some(p) => nightshift_bootstrap::read_key(p).map_err(|e| e.to_string())?,
        None => nightshift_bootstrap::generate_key().map_err(|e| e.to_string())?,
    };
    let psk = args
        .swarm_key
        .as_deref()
        .map(nightshift_bootstrap::read_swarm_key)
        .transpose()
        .map_err(|e| e.to_string())?;
    let swarm_id = manifest.swarm_id();
    let (kad_proto, rr_proto) = protocol_names(&swarm_id);
    let mut swarm = build_swarm(&key, psk, &kad_proto, &rr_proto, args.mode == Mode::Garbage)?;
    let genesis = Arc::new(nightshift_bootstrap::genesis_state(&manifest.manifest));
    let num_params = genesis.params.len();
    let node_max_frame = (2 * delta::dense_bytes(num_params) * 2 + (1 << 20))
        .min(nightshift_protocol::MAX_MESSAGE_BYTES);
    let boot = match args.bootstrap.iter().last() {
        Some(Protocol::P2p(id)) => Some(id),
        _ => None,
    };
    if let Some(b) = boot {
        swarm
            .behaviour_mut()
            .probe
            .kad
            .add_address(&b, args.bootstrap.clone());
    }
    let seed = unix_ms() ^ u64::from(std::process::id()).rotate_left(32) | 1;
    let me = key.verifying_key().to_bytes();
    let mut st = Run {
        mode: args.mode,
        manifest,
        swarm_id,
        local: *swarm.local_peer_id(),
        key,
        me,
        boot,
        boot_addr: args.bootstrap.clone(),
        num_params,
        node_max_frame,
        genesis,
        junk: Junk(seed),
        connected: HashSet::new(),
        ever_connected: HashSet::new(),
        addrs: HashMap::new(),
        statuses: HashMap::new(),
        trainers: HashSet::new(),
        disconnected: 0,
        dial_failures: 0,
        statuses_opened: 0,
        statuses_refused: 0,
        honest_round: None,
        honest_hashes: BTreeMap::new(),
        pending: HashMap::new(),
        raw_pending: HashMap::new(),
        tally: BTreeMap::new(),
        refused_answers: 0,
        raw_closed: 0,
        raw_answered: 0,
        inbound: BTreeMap::new(),
        inbound_failures: 0,
        forged: HashMap::new(),
        forged_log: vec![],
        current: None,
        flip: false,
        announced: 0,
        contributions_served: 0,
        state_chunks_served: 0,
        captured: BTreeMap::new(),
        asked: HashSet::new(),
        replays_pushed: 0,
        flood_inflight: HashMap::new(),
        big_push: None,
        fitting_push: None,
    };
    if swarm.dial(args.bootstrap.clone()).is_err() {
        st.dial_failures += 1;
    }
    let t0 = Instant::now();
    let end = tokio::time::Instant::now() + Duration::from_secs(args.secs);
    let mut second = tokio::time::interval(Duration::from_secs(1));
    let mut fast = tokio::time::interval(Duration::from_millis(20));
    fast.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("cannot watch SIGTERM: {e}"))?;
    let mut ticks = 0u64;
    loop {
        tokio::select! {
            ev = swarm.select_next_some() => {
                st.on_event(&mut swarm, ev);
                if st.mode == Mode::Flood {
                    st.flood_refill(&mut swarm);
                }
            }
            _ = second.tick() => {
                ticks += 1;
                if ticks.is_multiple_of(3) {
                    st.redial(&mut swarm);
                }
                st.poll_statuses(&mut swarm);
                match st.mode {
                    Mode::Forge | Mode::Relabel => st.forge_tick(&mut swarm),
                    Mode::Replay => st.replay_tick(&mut swarm),
                    Mode::Garbage => st.garbage_tick(&mut swarm),
                    Mode::Flood => {}
                }
            }
            _ = fast.tick(), if st.mode == Mode::Flood => st.flood_refill(&mut swarm),
            _ = tokio::time::sleep_until(end) => break,
            _ = term.recv() => break,
        }
    }
    Ok(st.report(t0.elapsed().as_secs_f64()))
}
