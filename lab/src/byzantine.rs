//! `nightshift-lab byzantine`: robust aggregation under attack.
//!
//! K workers train DiLoCo rounds in one process; some of them are malicious and send, each round,
//! a contribution made to hurt (computed from the honest workers' deltas of that round: the
//! attacker is assumed to see everything). Every round goes through the nodes' own code: the
//! swarm's codec, then [`Recipe::apply`] — the aggregator and the outer step a node runs and a
//! replay checks. Each attack runs with every aggregator asked for, and each is compared with
//! the same honest workers training alone (`honest_only_val_loss`).

use anyhow::Context;
use clap::Args;
use nightshift_bootstrap::SwarmSettings;
use nightshift_model::backend::CpuTrain;
use nightshift_model::{ErrorFeedback, InnerTrainer, Shard};
use nightshift_protocol::{Aggregator, DeltaCodec, Hash32, StateSnapshot, delta};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crate::convergence::Setup;
use nightshift_node::plot::{Series, line_chart};
use nightshift_node::round::accept::{Accepted, encode_delta};
use nightshift_node::round::verify::Recipe;

/// What a malicious worker sends each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Attack {
    /// No attacker: the malicious slots train honestly.
    None,
    /// The honest mean, negated.
    Signflip,
    /// The honest mean, ten times.
    Scale10,
    /// The honest mean, a hundred times.
    Scale100,
    /// Gaussian noise with the norm of an honest delta.
    Noise,
    /// "A little is enough" (Baruch et al. 2019): the honest mean minus z standard deviations
    /// in every coordinate, z the largest that stays within the honest spread.
    Alie,
    /// A free rider: a zero delta claiming a full round's tokens.
    Zero,
    /// Another member's delta, re-signed as its own.
    Copy,
}

impl Attack {
    pub const ALL: [Attack; 8] = [
        Attack::None,
        Attack::Signflip,
        Attack::Scale10,
        Attack::Scale100,
        Attack::Noise,
        Attack::Alie,
        Attack::Zero,
        Attack::Copy,
    ];

    fn name(self) -> &'static str {
        match self {
            Attack::None => "none",
            Attack::Signflip => "signflip",
            Attack::Scale10 => "scale10",
            Attack::Scale100 => "scale100",
            Attack::Noise => "noise",
            Attack::Alie => "alie",
            Attack::Zero => "zero",
            Attack::Copy => "copy",
        }
    }
}

/// Flags of `nightshift-lab byzantine`. With none it runs every attack with 2 of 8 workers
/// malicious, with the mean and the robust aggregator, on one seed.
#[derive(Args, Debug, Clone)]
pub struct ByzantineArgs {
    /// Attacks to run.
    #[arg(long, value_delimiter = ',', value_enum, default_values_t = Attack::ALL)]
    pub attacks: Vec<Attack>,
    /// Workers in all, malicious ones included.
    #[arg(long, default_value_t = 8)]
    pub nodes: usize,
    /// How many of them are malicious; several values give several tables.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    pub malicious: Vec<usize>,
    /// Aggregators to compare.
    #[arg(long, value_delimiter = ',', default_value = "mean,cclip")]
    pub aggregators: Vec<Aggregator>,
    /// Seeds (of the genesis and of every worker's batches); each a full table.
    #[arg(long, value_delimiter = ',', default_value = "42")]
    pub seeds: Vec<u64>,
    /// Inner steps per worker in all.
    #[arg(long, default_value_t = 500)]
    pub steps: u32,
    /// Model preset.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// H: inner steps per round.
    #[arg(long, default_value_t = SwarmSettings::default().inner_steps)]
    pub inner_steps: u32,
    /// The swarm's codec (every contribution, malicious ones too, goes through it).
    #[arg(long, default_value = "int4:64")]
    pub codec: DeltaCodec,
    /// Validation batches per evaluation.
    #[arg(long, default_value_t = 8)]
    pub val_batches: usize,
    /// Write the results as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Plot the final losses against the honest-only baseline (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Aggregate slice by slice, as reducers inside the network do (`sim --reduce S:CODEC`).
    #[arg(long, value_parser = crate::sim::parse_reduce)]
    pub reduce: Option<String>,
}

/// One run of the table.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ByzantineRun {
    pub attack: Attack,
    pub malicious: usize,
    pub nodes: usize,
    pub aggregator: String,
    pub seed: u64,
    pub final_val_loss: f32,
    /// The same honest workers (nodes − malicious) training alone with the same aggregator.
    pub honest_only_val_loss: f32,
    /// Validation loss after every round (per-worker steps, loss).
    pub curve: Vec<(u32, f32)>,
    pub wall_secs: f64,
}

/// Everything a result file records besides the runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ByzantineConfig {
    pub commit: String,
    pub preset: String,
    pub inner_steps: u32,
    pub steps: u32,
    pub codec: String,
    pub nodes: usize,
    pub malicious: Vec<usize>,
    pub aggregators: Vec<String>,
    pub seeds: Vec<u64>,
    pub attacks: Vec<Attack>,
    pub inner_lr: f32,
    pub outer_lr: f32,
    pub outer_momentum: f32,
    pub inner_optimizer: String,
    pub batch_size: u32,
    /// `--reduce`, when set.
    #[serde(default)]
    pub reduce: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ByzantineReport {
    pub config: ByzantineConfig,
    pub runs: Vec<ByzantineRun>,
}

/// The inverse of the standard normal CDF (Acklam's rational approximation, relative error
/// below 1.2e-9), for ALIE's z.
fn inv_normal(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-12, 1.0 - 1e-12);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// ALIE's z for `n` workers of which `f` are malicious: the attackers need `s = ⌊n/2⌋ + 1 − f`
/// honest workers on their side, so they stay within the spread of all but `s` of them.
pub fn alie_z(n: usize, f: usize) -> f64 {
    let s = (n / 2 + 1).saturating_sub(f).max(1);
    inv_normal((n - s) as f64 / n as f64)
}

fn norm(x: &[f32]) -> f64 {
    x.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt()
}

/// The malicious contributions of one round, given the honest deltas (as received: decoded).
fn attack_deltas(
    attack: Attack,
    honest: &[Vec<f32>],
    malicious: usize,
    nodes: usize,
    rng: &mut ChaCha8Rng,
) -> Vec<Vec<f32>> {
    let n = honest[0].len();
    let k = honest.len() as f64;
    let mean: Vec<f32> = (0..n)
        .map(|j| (honest.iter().map(|h| h[j] as f64).sum::<f64>() / k) as f32)
        .collect();
    let scaled = |f: f32| mean.iter().map(|v| v * f).collect::<Vec<f32>>();
    let one = match attack {
        Attack::None => return vec![],
        Attack::Signflip => scaled(-1.0),
        Attack::Scale10 => scaled(10.0),
        Attack::Scale100 => scaled(100.0),
        Attack::Zero => vec![0.0; n],
        Attack::Copy => honest[0].clone(),
        Attack::Alie => {
            let z = alie_z(nodes, malicious);
            (0..n)
                .map(|j| {
                    let m = mean[j] as f64;
                    let var = honest
                        .iter()
                        .map(|h| (h[j] as f64 - m).powi(2))
                        .sum::<f64>()
                        / k;
                    (m - z * var.sqrt()) as f32
                })
                .collect()
        }
        Attack::Noise => {
            let target = honest.iter().map(|h| norm(h)).sum::<f64>() / k;
            return (0..malicious)
                .map(|_| {
                    let sigma = target / (n as f64).sqrt();
                    (0..n)
                        .map(|_| {
                            // Box–Muller.
                            let (u1, u2): (f64, f64) = (rng.random(), rng.random());
                            let g = (-2.0 * (1.0 - u1).ln()).sqrt()
                                * (2.0 * std::f64::consts::PI * u2).cos();
                            (g * sigma) as f32
                        })
                        .collect()
                })
                .collect();
        }
    };
    vec![one; malicious]
}

struct Worker {
    trainer: InnerTrainer<CpuTrain>,
    rng: ChaCha8Rng,
    shard: Shard,
    ef: ErrorFeedback,
}

/// One training run: `honest` workers and `malicious` attackers (`attack`) for `steps` steps of
/// H each, aggregated by `aggregator`. Returns the loss curve.
#[allow(clippy::too_many_arguments)]
fn simulate(
    setup: &Setup,
    a: &ByzantineArgs,
    honest: usize,
    malicious: usize,
    attack: Attack,
    aggregator: Aggregator,
    seed: u64,
) -> anyhow::Result<Vec<(u32, f32)>> {
    let shapes = Arc::new(setup.shapes.clone());
    let n = setup.genesis.len();
    let tokens = (a.inner_steps as usize * setup.inner.batch_size * setup.cfg.seq_len) as u64;
    let recipe = Recipe {
        swarm_id: Hash32::default(),
        allowlist: None,
        bootstraps: vec![],
        attest_quorum: 0,
        num_params: n,
        shapes: shapes.clone(),
        codec: a.codec,
        max_tokens: tokens,
        aggregator,
        outer_lr: setup.outer_lr,
        outer_momentum: setup.outer_momentum,
        slicing: a
            .reduce
            .as_deref()
            .map(crate::sim::slicing)
            .transpose()
            .map_err(anyhow::Error::msg)?,
    };
    let workers_n = if attack == Attack::None {
        honest + malicious
    } else {
        honest
    };
    let mut workers: Vec<Worker> = (0..workers_n)
        .map(|i| {
            Ok(Worker {
                trainer: setup.trainer(1)?,
                rng: ChaCha8Rng::seed_from_u64(seed ^ ((i as u64 + 1) * 0x9E37)),
                shard: setup.corpus.full_shard(),
                ef: ErrorFeedback::default(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let mut attacker_rng = ChaCha8Rng::seed_from_u64(seed ^ 0xBAD5EED);
    let mut attacker_subspaces: Vec<Vec<f32>> = vec![];
    let mut state = StateSnapshot {
        round: 0,
        params: setup.genesis.clone(),
        momentum: vec![0.0; n],
        formed_by: vec![],
        noise: None,
    };
    let mut curve = vec![(0, setup.val_loss(&mut workers[0].trainer))];
    let mut done = 0u32;
    while done < a.steps {
        let h = a.inner_steps.min(a.steps - done);
        let mut set = BTreeMap::new();
        let mut sent_all = vec![];
        for (i, w) in workers.iter_mut().enumerate() {
            let rep = w
                .trainer
                .train(&setup.corpus, &w.shard, &mut w.rng, h, &|| false);
            let (_, sent) = encode_delta(
                &state.params,
                &w.trainer.params(),
                a.codec,
                &shapes,
                &mut w.ef,
            )?;
            let sender = [i as u8; 32];
            set.insert(
                sender,
                Accepted {
                    sender,
                    digest: nightshift_protocol::Hash32::default(),
                    tokens: rep.tokens,
                    train_loss: rep.mean_loss,
                    delta: sent.clone(),
                    expected: a.nodes as u32,
                },
            );
            sent_all.push(sent);
        }
        for (j, d) in attack_deltas(attack, &sent_all, malicious, a.nodes, &mut attacker_rng)
            .into_iter()
            .enumerate()
        {
            // What a peer receives: the attacker's delta through the swarm's codec.
            let enc = delta::encode_shaped(a.codec, &d, &shapes, &mut attacker_subspaces);
            let d = delta::decode_shaped(&enc, n, &shapes)?;
            let sender = [200 + j as u8; 32];
            set.insert(
                sender,
                Accepted {
                    sender,
                    digest: nightshift_protocol::Hash32::default(),
                    tokens,
                    train_loss: 0.0,
                    delta: d,
                    expected: a.nodes as u32,
                },
            );
        }
        let (next, _) = recipe
            .apply(&state, &set)
            .context("a round had nothing to aggregate")?;
        state = next;
        for w in &mut workers {
            w.trainer.load_params(&state.params)?;
        }
        done += h;
        let loss = setup.val_loss(&mut workers[0].trainer);
        curve.push((done, if loss.is_finite() { loss } else { f32::MAX }));
    }
    Ok(curve)
}

/// Runs the table.
///
/// # Errors
/// Bad flags, or a model that cannot be built.
pub fn run_byzantine(a: ByzantineArgs) -> anyhow::Result<ByzantineReport> {
    anyhow::ensure!(
        a.nodes >= 2 && a.nodes <= 64,
        "--nodes must be within 2..=64"
    );
    anyhow::ensure!(
        a.malicious.iter().all(|&m| m >= 1 && 2 * m < a.nodes),
        "--malicious must be at least 1 and a minority of --nodes"
    );
    anyhow::ensure!(
        a.steps >= a.inner_steps && a.inner_steps > 0,
        "--steps must cover a round"
    );
    let settings = SwarmSettings {
        preset: a.preset.clone(),
        inner_steps: a.inner_steps,
        codec: a.codec,
        ..SwarmSettings::default()
    };
    let config = ByzantineConfig {
        commit: crate::results::commit_here(),
        preset: a.preset.clone(),
        inner_steps: a.inner_steps,
        steps: a.steps,
        codec: a.codec.to_string(),
        nodes: a.nodes,
        malicious: a.malicious.clone(),
        aggregators: a.aggregators.iter().map(|g| g.to_string()).collect(),
        seeds: a.seeds.clone(),
        attacks: a.attacks.clone(),
        inner_lr: settings.inner_lr,
        outer_lr: settings.outer_lr,
        outer_momentum: settings.outer_momentum,
        inner_optimizer: settings.inner_optimizer.to_string(),
        batch_size: settings.batch_size,
        reduce: a.reduce.clone(),
    };
    println!(
        "bench byzantine: {} workers, preset {}, H = {}, {} steps, codec {}, commit {}",
        a.nodes, a.preset, a.inner_steps, a.steps, a.codec, config.commit
    );
    println!(
        "{:>5} {:>4} {:<10} {:<12} {:>9} {:>12} {:>7} {:>7}",
        "seed", "bad", "attack", "aggregator", "final", "honest-only", "ratio", "secs"
    );
    let mut runs = vec![];
    for &seed in &a.seeds {
        let settings = SwarmSettings {
            init_seed: seed,
            ..settings.clone()
        };
        let setup = Setup::from_settings(&settings, a.val_batches)?;
        for &m in &a.malicious {
            let honest = a.nodes - m;
            for &agg in &a.aggregators {
                let base = simulate(&setup, &a, honest, 0, Attack::None, agg, seed)?;
                let honest_only = base.last().map_or(f32::NAN, |c| c.1);
                for &attack in &a.attacks {
                    let t0 = Instant::now();
                    let curve = simulate(&setup, &a, honest, m, attack, agg, seed)?;
                    let run = ByzantineRun {
                        attack,
                        malicious: m,
                        nodes: a.nodes,
                        aggregator: agg.to_string(),
                        seed,
                        final_val_loss: curve.last().map_or(f32::NAN, |c| c.1),
                        honest_only_val_loss: honest_only,
                        curve,
                        wall_secs: t0.elapsed().as_secs_f64(),
                    };
                    println!(
                        "{:>5} {:>4} {:<10} {:<12} {:>9.4} {:>12.4} {:>7.3} {:>7.1}",
                        seed,
                        m,
                        attack.name(),
                        run.aggregator,
                        run.final_val_loss,
                        run.honest_only_val_loss,
                        run.final_val_loss / run.honest_only_val_loss,
                        run.wall_secs
                    );
                    runs.push(run);
                }
            }
        }
    }
    let report = ByzantineReport { config, runs };
    summarise(&report);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, plot(&report))
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(report)
}

/// The means over seeds that the targets read: each attack's final loss over the honest-only
/// loss, per aggregator and malicious count, and the robust aggregator against the mean with no
/// attacker.
fn summarise(r: &ByzantineReport) {
    println!("\nmean over seeds of final / honest-only:");
    let mut keys: Vec<(usize, String, Attack)> = r
        .runs
        .iter()
        .map(|x| (x.malicious, x.aggregator.clone(), x.attack))
        .collect();
    keys.dedup();
    let mut seen = std::collections::HashSet::new();
    for (m, agg, attack) in keys {
        if !seen.insert((m, agg.clone(), attack)) {
            continue;
        }
        let ratios: Vec<f64> = r
            .runs
            .iter()
            .filter(|x| x.malicious == m && x.aggregator == agg && x.attack == attack)
            .map(|x| (x.final_val_loss / x.honest_only_val_loss) as f64)
            .collect();
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        println!(
            "  {m} of {} {:<12} {:<10} {:.4} ({} seeds)",
            r.config.nodes,
            agg,
            attack.name(),
            mean,
            ratios.len()
        );
    }
    let none = |agg: &str| -> Vec<(u64, usize, f32)> {
        r.runs
            .iter()
            .filter(|x| x.attack == Attack::None && x.aggregator == agg)
            .map(|x| (x.seed, x.malicious, x.final_val_loss))
            .collect()
    };
    let mean_runs = none("mean");
    for agg in &r.config.aggregators {
        if agg == "mean" {
            continue;
        }
        let ratios: Vec<f64> = none(agg)
            .iter()
            .filter_map(|(s, m, l)| {
                mean_runs
                    .iter()
                    .find(|(s2, m2, _)| s2 == s && m2 == m)
                    .map(|(_, _, lm)| (*l / *lm) as f64)
            })
            .collect();
        if !ratios.is_empty() {
            println!(
                "  no attacker: {agg} / mean = {:.4} (mean of {} runs)",
                ratios.iter().sum::<f64>() / ratios.len() as f64,
                ratios.len()
            );
        }
    }
}

/// Loss curves of every run of the first seed and malicious count, one chart.
fn plot(r: &ByzantineReport) -> String {
    let first = r.runs.first().map(|x| (x.seed, x.malicious));
    let series: Vec<Series> = r
        .runs
        .iter()
        .filter(|x| Some((x.seed, x.malicious)) == first)
        .map(|x| Series {
            name: format!("{} / {}", x.attack.name(), x.aggregator),
            points: x
                .curve
                .iter()
                .map(|(s, l)| (*s as f64, (*l).min(10.0) as f64))
                .collect(),
        })
        .collect();
    line_chart(
        &format!(
            "validation loss under attack ({} of {} malicious, seed {})",
            first.map_or(0, |f| f.1),
            r.config.nodes,
            first.map_or(0, |f| f.0)
        ),
        "per-worker steps",
        &series,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alie_z_follows_the_paper() {
        // n = 50, f = 12 in Baruch et al.: s = 14, z = Φ⁻¹(36/50) ≈ 0.58.
        assert!((alie_z(50, 12) - 0.5828).abs() < 1e-3, "{}", alie_z(50, 12));
        assert!((alie_z(8, 2) - 0.3186).abs() < 1e-3, "{}", alie_z(8, 2));
        assert!((inv_normal(0.975) - 1.959_964).abs() < 1e-5);
        assert!((inv_normal(0.001) + 3.090_232).abs() < 1e-5);
    }

    #[test]
    fn attacks_are_what_they_say() {
        let honest = vec![vec![1.0f32, 2.0, 0.0], vec![3.0, 2.0, 0.0]];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let d = |a| attack_deltas(a, &honest, 2, 8, &mut ChaCha8Rng::seed_from_u64(1));
        assert_eq!(d(Attack::Signflip), vec![vec![-2.0, -2.0, 0.0]; 2]);
        assert_eq!(d(Attack::Scale10)[0], vec![20.0, 20.0, 0.0]);
        assert_eq!(d(Attack::Zero)[1], vec![0.0; 3]);
        assert_eq!(d(Attack::Copy)[0], honest[0]);
        assert!(d(Attack::None).is_empty());
        // ALIE: mean − z·std, per coordinate (std 1, 0, 0 here).
        let z = alie_z(8, 2) as f32;
        assert_eq!(d(Attack::Alie)[0], vec![2.0 - z, 2.0, 0.0]);
        let noise = attack_deltas(Attack::Noise, &honest, 2, 8, &mut rng);
        assert_eq!(noise.len(), 2);
        assert_ne!(noise[0], noise[1], "each attacker draws its own noise");
    }
}
