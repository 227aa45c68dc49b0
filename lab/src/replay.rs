//! `nightshift-lab replay`: what verifying a state by replay costs a node — checking the
//! signatures and bounds of a round's contributions, decoding them, applying the aggregator and
//! the outer step, and hashing the result ([`verify::replay_round`], the code a node runs) — and
//! how large a signed status is.

use anyhow::Context;
use clap::Args;
use ed25519_dalek::SigningKey;
use nightshift_model::backend::{Cpu, cpu_device};
use nightshift_model::{GptConfig, flat};
use nightshift_protocol::message::Phase;
use nightshift_protocol::signed::EnvelopeHeader;
use nightshift_protocol::{
    Aggregator, Contribution, DeltaCodec, Hash32, NodeRole, PayloadKind, SignedEnvelope,
    StateSnapshot, Status, StatusLists, delta, sign_status, wire,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use nightshift_node::round::accept::Accepted;
use nightshift_node::round::verify::{self, Recipe};

/// Flags of `nightshift-lab replay`.
#[derive(Args, Debug, Clone)]
pub struct ReplayArgs {
    /// Model presets to measure.
    #[arg(long, value_delimiter = ',', default_value = "small,large")]
    pub presets: Vec<String>,
    /// Contributions per round.
    #[arg(long, default_value_t = 8)]
    pub contributors: usize,
    #[arg(long, default_value = "int4:64")]
    pub codec: DeltaCodec,
    /// Aggregators to replay with.
    #[arg(long, value_delimiter = ',', default_value = "mean,cclip")]
    pub aggregators: Vec<Aggregator>,
    /// Replays timed per preset and aggregator (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub repeats: usize,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplayRun {
    pub preset: String,
    pub params: usize,
    pub aggregator: String,
    pub contributors: usize,
    /// One contribution's signed envelope on the wire.
    pub contribution_bytes: usize,
    /// Median milliseconds of one replay (verify, decode, aggregate, outer step, hash).
    pub replay_ms_median: f64,
    pub replay_ms: Vec<f64>,
    /// A signed status of a round of `contributors` contributions, holding as many.
    pub status_bytes: usize,
    /// The lists it commits to (sent only when a peer asks).
    #[serde(default)]
    pub status_lists_bytes: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReplayReport {
    pub commit: String,
    pub codec: String,
    pub repeats: usize,
    pub runs: Vec<ReplayRun>,
}

/// Runs the measurement.
///
/// # Errors
/// An unknown preset, or a replay that does not verify (a bug).
pub fn run_replay(a: ReplayArgs) -> anyhow::Result<ReplayReport> {
    anyhow::ensure!(
        (1..=256).contains(&a.contributors) && a.repeats >= 1,
        "--contributors must be within 1..=256 and --repeats at least 1"
    );
    let commit = crate::results::commit_here();
    println!(
        "bench replay: {} contributions a round, codec {}, commit {commit}",
        a.contributors, a.codec
    );
    println!(
        "{:<7} {:>11} {:<12} {:>12} {:>11} {:>10}",
        "preset", "params", "aggregator", "contrib B", "replay ms", "status B"
    );
    let mut runs = vec![];
    let swarm_id = Hash32::of(&[b"bench replay"]);
    for preset in &a.presets {
        let cfg =
            GptConfig::preset(preset, 65).with_context(|| format!("unknown preset {preset}"))?;
        let model = cfg.init::<Cpu>(&cpu_device());
        let shapes = Arc::new(flat::param_shapes::<Cpu, _>(&model));
        let params = flat::genesis_params::<Cpu, _>(&model, 42);
        drop(model);
        let n = params.len();
        let base = StateSnapshot {
            round: 7,
            momentum: vec![0.0; n],
            params,
            formed_by: vec![],
            noise: Some(1.0),
        };
        let base_hash = base.hash();
        let max_tokens = 25 * 16 * cfg.seq_len as u64;
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let keys: Vec<SigningKey> = (0..a.contributors)
            .map(|i| SigningKey::from_bytes(&[i as u8 + 1; 32]))
            .collect();
        let envelopes: Vec<Arc<SignedEnvelope>> = keys
            .iter()
            .map(|k| {
                let d: Vec<f32> = (0..n).map(|_| rng.random_range(-1e-3f32..1e-3)).collect();
                let mut subspaces = vec![];
                let c = Contribution {
                    tokens: max_tokens,
                    inner_steps: 25,
                    train_loss: 2.0,
                    delta: delta::encode_shaped(a.codec, &d, &shapes, &mut subspaces),
                    expected: a.contributors as u32,
                };
                let h = EnvelopeHeader {
                    kind: PayloadKind::Contribution,
                    swarm_id,
                    round: base.round,
                    sender: [0; 32],
                    base_hash,
                };
                Arc::new(SignedEnvelope::sign(k, h, wire::encode(&c)))
            })
            .collect();
        let contribution_bytes = wire::encode(&*envelopes[0]).len();
        let lists = StatusLists {
            formed_by: envelopes
                .iter()
                .map(|e| nightshift_protocol::ContributionId::of(e))
                .collect(),
            holding: keys.iter().map(|k| k.verifying_key().to_bytes()).collect(),
        };
        let status = Status {
            unix_ms: 1_800_000_000_000,
            ..Status::summarizing(
                NodeRole::Trainer,
                Phase::Collecting,
                base.round,
                base_hash,
                &lists,
            )
        };
        let status_bytes = wire::encode(&sign_status(&keys[0], swarm_id, &status)).len();
        let status_lists_bytes = wire::encode(&lists).len();
        for &aggregator in &a.aggregators {
            let recipe = Recipe {
                swarm_id,
                allowlist: None,
                bootstraps: vec![],
                attest_quorum: 0,
                num_params: n,
                shapes: shapes.clone(),
                codec: a.codec,
                max_tokens,
                aggregator,
                outer_lr: 0.7,
                outer_momentum: 0.7,
                slicing: None,
            };
            // The claimed hash: the same round applied once directly.
            let ctx = recipe.context(base.round, base_hash);
            let set: BTreeMap<[u8; 32], Accepted> = envelopes
                .iter()
                .map(|e| {
                    let acc = nightshift_node::round::accept::accept(&ctx, e)?;
                    Ok((acc.sender, acc))
                })
                .collect::<Result<_, nightshift_node::round::accept::Refusal>>()?;
            let claimed = recipe
                .apply(&base, &set)
                .context("nothing to apply")?
                .0
                .hash();
            drop(set);
            let mut times = vec![];
            for _ in 0..a.repeats {
                let r =
                    verify::replay_round(&recipe, &base, base_hash, envelopes.clone(), claimed)?;
                times.push(r.replay_ms);
            }
            let mut sorted = times.clone();
            sorted.sort_by(f64::total_cmp);
            let run = ReplayRun {
                preset: preset.clone(),
                params: n,
                aggregator: aggregator.to_string(),
                contributors: a.contributors,
                contribution_bytes,
                replay_ms_median: sorted[sorted.len() / 2],
                replay_ms: times,
                status_bytes,
                status_lists_bytes,
            };
            println!(
                "{:<7} {:>11} {:<12} {:>12} {:>11.1} {:>10}",
                run.preset,
                run.params,
                run.aggregator,
                run.contribution_bytes,
                run.replay_ms_median,
                run.status_bytes
            );
            runs.push(run);
        }
    }
    let report = ReplayReport {
        commit,
        codec: a.codec.to_string(),
        repeats: a.repeats,
        runs,
    };
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(report)
}
