//! `nightshift-lab sim`: a deterministic simulator of a swarm. Every node runs the round machine
//! the daemon's rules live in (`nightshift_node::machine`) — real contributions, signatures,
//! codecs, verification, aggregation and outer step — over an in-memory network with per-link
//! latency, per-node bandwidth and loss, on a virtual clock, with an optional crash schedule.
//! Training is a stand-in (a noisy quadratic, [`trainer`]) so that a thousand nodes fit one
//! machine. The same seed writes the same file.

#[cfg(test)]
mod tests;
pub mod trainer;
mod world;

use anyhow::Context;
use clap::Args;
use ed25519_dalek::SigningKey;
use nightshift_node::machine::Config;
use nightshift_node::machine::rules::Recipe;
use nightshift_protocol::{DeltaCodec, Hash32, Manifest};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
pub use trainer::Model;

use crate::results::commit_here;
use world::World;

/// Nominal tokens one inner step of the stand-in trains (for weights and budgets).
pub const TOKENS_PER_STEP: u64 = 1024;

/// `nightshift-lab sim`.
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct SimArgs {
    /// Nodes in the swarm.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Rounds each node runs.
    #[arg(long, default_value_t = 20)]
    pub rounds: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the per-round results here.
    #[arg(long)]
    #[serde(skip)]
    pub json: Option<PathBuf>,
    /// What the nodes train: `quadratic` (the stand-in, `--params` wide) or a preset of the real
    /// GPT (`tiny`, `small`, ...) on the embedded corpus, its genesis drawn from `--seed`, for
    /// a few nodes.
    #[arg(long, default_value = "quadratic")]
    #[serde(default = "quadratic")]
    pub model: String,
    /// Parameters of the stand-in model.
    #[arg(long, default_value_t = 1024)]
    pub params: usize,
    /// Peers each node dials (links are both ways, so most nodes end with more); a swarm no
    /// larger than this is fully connected.
    #[arg(long, default_value_t = 32)]
    pub degree: usize,
    /// One-way latency of every link, plus up to `--jitter-ms` drawn per link.
    #[arg(long, default_value_t = 20)]
    pub latency_ms: u64,
    #[arg(long, default_value_t = 60)]
    pub jitter_ms: u64,
    /// Each node's upload bandwidth.
    #[arg(long, default_value_t = 50.0)]
    pub up_mbps: f64,
    /// Each node's download bandwidth.
    #[arg(long, default_value_t = 200.0)]
    pub down_mbps: f64,
    /// Probability that a message is lost.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Milliseconds per inner step of the median node.
    #[arg(long, default_value_t = 200.0)]
    pub step_ms: f64,
    /// Speeds spread log-uniformly over [1/(1+s), 1+s] × the median.
    #[arg(long, default_value_t = 0.5)]
    pub speed_spread: f64,
    /// Inner steps per round (H).
    #[arg(long, default_value_t = 25)]
    pub inner_steps: u32,
    /// The swarm's round deadline.
    #[arg(long, default_value_t = 60)]
    pub deadline_secs: u64,
    /// Every this many virtual seconds a random node is killed (kill -9; 0: never) ...
    #[arg(long, default_value_t = 0.0)]
    pub crash_every_secs: f64,
    /// ... and restarts from its checkpoint this much later.
    #[arg(long, default_value_t = 30.0)]
    pub down_secs: f64,
    /// No crashes after this many virtual seconds (0: crashes all along).
    #[arg(long, default_value_t = 0.0)]
    pub crashes_until_secs: f64,
    /// Probability that a node's contribution of a round is lost: the node stops the moment its
    /// training ends, before it sends anything, and comes back at once from its checkpoint with
    /// its trainer's state intact, so the round goes on without that contribution.
    #[arg(long, default_value_t = 0.0)]
    #[serde(default)]
    pub drop: f64,
    /// Bootstrap nodes besides `--nodes`: every trainer dials them; they follow the swarm by
    /// replay and attest its state (the manifest names their keys), so a node left behind can
    /// catch up in an open swarm too.
    #[arg(long, default_value_t = 0)]
    pub bootstraps: usize,
    /// A private swarm: every node on the allowlist, and the manifest's default quorum attests
    /// a state for a node too far behind to replay (an open swarm has no bootstrap here, so such
    /// a node cannot catch up).
    #[arg(long)]
    pub private: bool,
    /// How a round's contributions are combined (`mean`, `cclip:...`, `trimmed:...`); the
    /// default is `swarm init`'s.
    #[arg(long, default_value = "cclip:1:3")]
    #[serde(default = "default_aggregator")]
    pub aggregator: String,
    /// Contribution codec.
    #[arg(long, default_value = "int4:64", value_parser = parse_codec)]
    #[serde(with = "codec_str")]
    pub codec: DeltaCodec,
    /// Stop after this much virtual time even if nodes have rounds left.
    #[arg(long, default_value_t = 7200)]
    pub max_virtual_secs: u64,
    /// Nodes train the next round while a round's contributions are exchanged (`nightshift
    /// run --overlap`).
    #[arg(long)]
    #[serde(default)]
    pub overlap: bool,
    /// Average each round slice by slice through reducers inside the network: `S:CODEC` (S
    /// slices, 0: one per contributor to the round before; the reducers' means sent as CODEC,
    /// e.g. `0:int8:64`). Unset: nodes send whole contributions to every peer.
    #[arg(long, value_parser = parse_reduce)]
    #[serde(default)]
    pub reduce: Option<String>,
    /// Count every transfer as if the model had this many parameters (the stand-in still
    /// computes on `--params` values): the values inside contributions, slices, reduced slices
    /// and states weigh `wire-params / params` times their encoded size, headers, signatures,
    /// paths and statuses what they weigh; the nodes' graces allow for that width too. A large
    /// swarm's bytes at a realistic width without holding every value in memory. Unset: the
    /// transfers as encoded.
    #[arg(long)]
    #[serde(default)]
    pub wire_params: Option<usize>,
}

/// Parses `sim --reduce`: `S:CODEC`.
pub fn parse_reduce(s: &str) -> Result<String, String> {
    slicing(s).map(|_| s.to_string())
}

/// The slicing `S:CODEC` names.
pub fn slicing(s: &str) -> Result<nightshift_node::machine::sliced::Slicing, String> {
    let (n, codec) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?}: expected SLICES:CODEC, e.g. 4:int8:64"))?;
    let slices: u32 = n
        .parse()
        .ok()
        .filter(|n| (0..=nightshift_protocol::slices::MAX_SLICES).contains(n))
        .ok_or_else(|| {
            format!(
                "{s:?}: slices must be 0..={} (0: one per contributor)",
                nightshift_protocol::slices::MAX_SLICES
            )
        })?;
    let mean_codec: DeltaCodec = codec.parse()?;
    if nightshift_protocol::slices::slice_align(mean_codec).is_none() {
        return Err(format!("{s:?}: {mean_codec} does not cut into slices"));
    }
    Ok(nightshift_node::machine::sliced::Slicing { slices, mean_codec })
}

impl Default for SimArgs {
    /// `nightshift-lab sim`'s defaults.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: SimArgs,
        }
        <Cli as clap::Parser>::parse_from(["sim"]).args
    }
}

fn default_aggregator() -> String {
    "cclip:1:3".into()
}

fn quadratic() -> String {
    "quadratic".into()
}

fn parse_codec(s: &str) -> Result<DeltaCodec, String> {
    s.parse::<DeltaCodec>().map_err(|e| e.to_string())
}

mod codec_str {
    use nightshift_protocol::DeltaCodec;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(c: &DeltaCodec, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&c.to_string())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DeltaCodec, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// One round of the simulated swarm: θ(`round`) and the traffic of the round that formed it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct RoundRow {
    /// r: the row describes the round that formed θ(r) from θ(r−1).
    pub round: u64,
    /// Nodes that came to hold θ(r).
    pub nodes_completed: usize,
    /// Distinct hashes of θ(r) among them, each node counted by the state it ended with (1: the
    /// swarm agrees); a node that later jumped past its θ(r) to an attested state is counted in
    /// `nodes_skipped` instead.
    pub distinct_state_hashes: usize,
    /// Nodes that left a fork of θ(r) behind by taking an attested later state.
    pub nodes_skipped: usize,
    /// Distinct hashes each node first formed for θ(r) (more than `distinct_state_hashes` when
    /// forks were repaired).
    pub distinct_first_hashes: usize,
    /// Bytes each node sent and received while holding θ(r−1): the largest, the median.
    pub bytes_up_max: u64,
    pub bytes_up_median: u64,
    pub bytes_down_max: u64,
    #[serde(default)]
    pub bytes_down_median: u64,
    /// The median node's upload that was statuses (announcements, look-ups, answers).
    pub status_bytes_up_median: u64,
    /// Virtual seconds between the median node holding θ(r−1) and holding θ(r).
    pub round_secs: f64,
    /// The stand-in's loss at the θ(r) most nodes hold.
    pub val_loss: Option<f32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub nodes_finished: usize,
    pub virtual_secs: f64,
    pub inputs_handled: u64,
    pub crashes: u64,
    pub states_synced: u64,
    pub failures: Vec<String>,
    /// Contributions lost to `--drop`.
    #[serde(default)]
    pub contributions_dropped: u64,
    /// Tokens trained, over all nodes.
    #[serde(default)]
    pub tokens_trained: u64,
    /// Contributions pushed to peers and their payload bytes, over all nodes.
    #[serde(default)]
    pub contributions_sent: u64,
    #[serde(default)]
    pub contribution_bytes: u64,
    /// The validation loss of θ(0).
    #[serde(default)]
    pub genesis_val_loss: f32,
    /// Messages sent and their bytes, by kind, over all nodes and the whole run.
    #[serde(default)]
    pub traffic: BTreeMap<String, Traffic>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Traffic {
    pub messages: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SimResult {
    pub commit: String,
    pub config: SimArgs,
    pub rounds: Vec<RoundRow>,
    pub summary: Summary,
}

/// The node keys of a simulated swarm, drawn from the seed.
fn secrets(n: usize, seed: u64) -> Vec<[u8; 32]> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6B65_7973);
    (0..n)
        .map(|_| {
            let mut s = [0u8; 32];
            rng.fill(&mut s);
            s
        })
        .collect()
}

/// The machines' settings, as a manifest with `args`' settings would give them.
fn template(args: &SimArgs, keys: &[[u8; 32]], model: &Model) -> Config {
    let (trainers, bootstraps) = keys.split_at(args.nodes);
    let allowlist = args.private.then(|| trainers.to_vec());
    let members = allowlist.as_ref().map_or(0, Vec::len);
    let (outer_lr, outer_momentum, default) = model.outer();
    let aggregator = args.aggregator.parse().unwrap_or(default);
    let recipe = Recipe {
        swarm_id: Hash32::of(&[b"nightshift-sim", &args.seed.to_le_bytes()]),
        allowlist,
        bootstraps: bootstraps.to_vec(),
        attest_quorum: if members > 0 {
            Manifest::default_attest_quorum(members)
        } else {
            0
        },
        num_params: model.num_params(),
        shapes: Arc::new(model.shapes()),
        codec: args.codec,
        max_tokens: u64::from(args.inner_steps) * model.tokens_per_step(),
        aggregator,
        outer_lr,
        outer_momentum,
        slicing: args
            .reduce
            .as_deref()
            .map(|s| slicing(s).expect("checked when parsed")),
    };
    Config {
        key: SigningKey::from_bytes(&[0; 32]),
        recipe: Arc::new(recipe),
        inner_steps: args.inner_steps,
        round_deadline_ms: args.deadline_secs * 1000,
        round_tokens: f64::from(args.inner_steps) * model.tokens_per_step() as f64,
        // As `nightshift run` does: wait for one peer (a restarted node learns where the swarm is).
        min_peers: usize::from(args.nodes > 1),
        rounds: Some(args.rounds),
        role: nightshift_protocol::NodeRole::Trainer,
        overlap: args.overlap,
        timed_params: args.wire_params.map(|w| w as u64),
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

/// Runs one simulation.
///
/// # Errors
/// When `--model` names no preset of the real GPT.
pub fn simulate(args: &SimArgs) -> anyhow::Result<SimResult> {
    let model = Model::new(&args.model, args.params, args.nodes, args.seed)?;
    Ok(simulate_with(args, model))
}

/// Runs one simulation of nodes training `model` (`args.model` is only recorded).
pub fn simulate_with(args: &SimArgs, model: Model) -> SimResult {
    let secrets = secrets(args.nodes + args.bootstraps, args.seed);
    let keys: Vec<[u8; 32]> = secrets
        .iter()
        .map(|s| SigningKey::from_bytes(s).verifying_key().to_bytes())
        .collect();
    let config = template(args, &keys, &model);
    let mut world = World::new(args, args.seed, config, &secrets, model);
    world.run(args.max_virtual_secs * 1000);
    if std::env::var_os("NIGHTSHIFT_SIM_DUMP").is_some() {
        eprint!("{}", world.dump());
    }
    let mut rows = vec![];
    let mut prev_at = 0.0;
    for r in 1..=args.rounds {
        let held = world.held(r);
        let last: std::collections::BTreeSet<_> = held
            .iter()
            .filter(|h| !h.skipped)
            .filter_map(|h| h.last)
            .collect();
        let first: std::collections::BTreeSet<_> = held.iter().filter_map(|h| h.first).collect();
        let at = median(held.iter().map(|h| h.at).collect()) as f64 / 1000.0;
        let bytes = world.bytes(r - 1);
        rows.push(RoundRow {
            round: r,
            nodes_completed: held.len(),
            distinct_state_hashes: last.len(),
            nodes_skipped: held.iter().filter(|h| h.skipped).count(),
            distinct_first_hashes: first.len(),
            bytes_up_max: bytes.iter().map(|b| b.0).max().unwrap_or(0),
            bytes_up_median: median(bytes.iter().map(|b| b.0).collect()),
            bytes_down_max: bytes.iter().map(|b| b.1).max().unwrap_or(0),
            bytes_down_median: median(bytes.iter().map(|b| b.1).collect()),
            status_bytes_up_median: median(world.status_bytes(r - 1)),
            round_secs: if held.is_empty() { 0.0 } else { at - prev_at },
            val_loss: world.majority_loss(r),
        });
        if !held.is_empty() {
            prev_at = at;
        }
    }
    SimResult {
        commit: commit_here(),
        config: args.clone(),
        rounds: rows,
        summary: Summary {
            nodes_finished: world.finished(),
            virtual_secs: world.now as f64 / 1000.0,
            inputs_handled: world.inputs,
            crashes: world.crashes,
            states_synced: world.synced,
            failures: world.failures.clone(),
            contributions_dropped: world.dropped,
            tokens_trained: world.tokens,
            contributions_sent: world.contributions,
            contribution_bytes: world.contribution_bytes,
            genesis_val_loss: world.genesis_loss,
            traffic: world
                .traffic
                .iter()
                .map(|(k, &(messages, bytes))| ((*k).to_string(), Traffic { messages, bytes }))
                .collect(),
        },
    }
}

/// `nightshift-lab sim`: runs, prints a table, writes the JSON.
///
/// # Errors
/// When the settings cannot run or the file cannot be written.
pub fn run_sim(args: SimArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
    anyhow::ensure!(args.params >= 1, "--params must be at least 1");
    args.aggregator
        .parse::<nightshift_protocol::Aggregator>()
        .map_err(|e| anyhow::anyhow!("--aggregator {}: {e}", args.aggregator))?;
    anyhow::ensure!(
        (0.0..1.0).contains(&args.loss) && (0.0..1.0).contains(&args.drop),
        "--loss and --drop are probabilities below 1"
    );
    anyhow::ensure!(
        args.up_mbps > 0.0 && args.down_mbps > 0.0 && args.step_ms > 0.0,
        "bandwidths and --step-ms must be positive"
    );
    let t0 = std::time::Instant::now();
    let result = simulate(&args)?;
    let wall = t0.elapsed().as_secs_f64();
    println!(
        "{:>5} {:>6} {:>6} {:>6} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "round", "nodes", "hashes", "first", "up max", "up median", "down max", "secs", "loss"
    );
    for r in &result.rounds {
        println!(
            "{:>5} {:>6} {:>6} {:>6} {:>12} {:>12} {:>12} {:>9.1} {:>9}",
            r.round,
            r.nodes_completed,
            r.distinct_state_hashes,
            r.distinct_first_hashes,
            r.bytes_up_max,
            r.bytes_up_median,
            r.bytes_down_max,
            r.round_secs,
            r.val_loss.map_or("-".into(), |l| format!("{l:.5}"))
        );
    }
    let s = &result.summary;
    let node_rounds: usize = result.rounds.iter().map(|r| r.nodes_completed).sum();
    println!(
        "{} of {} nodes finished; {:.0} virtual s in {:.1} s wall; {} node-rounds, {:.1} node-rounds/s; {} inputs; {} crashes; {} states synced",
        s.nodes_finished,
        args.nodes,
        s.virtual_secs,
        wall,
        node_rounds,
        node_rounds as f64 / wall.max(1e-9),
        s.inputs_handled,
        s.crashes,
        s.states_synced
    );
    for f in &s.failures {
        println!("failed: {f}");
    }
    if node_rounds > 0 {
        println!(
            "{:<24} {:>14} {:>18}",
            "sent, by kind", "msgs/node-rnd", "bytes/node-round"
        );
        let per = node_rounds as f64;
        for (kind, t) in &s.traffic {
            println!(
                "{kind:<24} {:>14.1} {:>18.0}",
                t.messages as f64 / per,
                t.bytes as f64 / per
            );
        }
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
