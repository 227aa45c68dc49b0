//! `nightshift-lab convergence`: DiLoCo swarms of K nodes, each running the round machine the
//! daemon runs, through the simulator ([`diloco`]), against single-worker and synchronous
//! baselines at equal tokens.
//!
//! `sync` (K replicas averaging gradients every step) is run as one model on K·batch samples per
//! step: the mean of K equal-size batches' mean-loss gradients is the gradient of the mean loss
//! over their union, so the two are the same computation.

mod diloco;
mod report;
mod setup;
#[cfg(test)]
mod tests;

use anyhow::{Context, bail};
use clap::Args;
use nightshift_protocol::DeltaCodec;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

use nightshift_node::cmd::swarm::SwarmFlags;

pub use report::*;
pub use setup::*;

/// Flags of `nightshift-lab report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// JSON files written by `nightshift-lab convergence --json`.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Write every run's loss curve to one chart (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Read every run as if its per-worker budget T had been each of these step counts: its
    /// curve up to that step, the loss there its final loss, and the comparisons between runs
    /// cut at the same step. Exact for runs written since the outer anneal was retired (nothing
    /// in them depends on T); a run whose curve has no point at a step is left out there.
    #[arg(long, value_delimiter = ',')]
    pub at: Vec<u32>,
}

/// Flags of `nightshift-lab convergence`. The recipe flags (`--preset`, `--inner-lr`, `--codec`,
/// `--inner-steps` = the base H, ...) are those of `swarm init`.
#[derive(Args, Debug, Serialize)]
pub struct ConvergenceArgs {
    /// Run groups to include: single (T steps), single-long (K·T steps: the same tokens as the
    /// K-worker runs), sync, diloco (the K × H grid), codecs, drop, reduce.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "single,single-long,sync,diloco,codecs,drop"
    )]
    pub runs: Vec<String>,
    /// Worker counts of the DiLoCo grid.
    #[arg(long, value_delimiter = ',', default_value = "2,4,8")]
    pub k: Vec<usize>,
    /// Inner steps of the DiLoCo grid.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100,250")]
    pub h: Vec<u32>,
    /// K of the sync, codec and drop runs.
    #[arg(long, default_value_t = 4)]
    pub base_k: usize,
    /// Codecs compared on DiLoCo (base K, base H).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fp32,fp16,int8:64,int4:64,topk:10,topk:30,lowrank:23:256"
    )]
    pub codecs: Vec<DeltaCodec>,
    /// Probabilities of losing each contribution: its node stops the moment its training of a
    /// round ends and comes back at once, so the round goes on without it (`sim --drop`).
    #[arg(long, value_delimiter = ',', default_value = "0.3,0.5")]
    pub drop: Vec<f64>,
    /// Averaging slice by slice compared on DiLoCo (base K, base H), each as `S:CODEC` (`sim
    /// --reduce`): the run group `reduce`.
    #[arg(long, value_delimiter = ',', default_value = "4:int8:64,4:fp32", value_parser = crate::sim::parse_reduce)]
    pub reduce: Vec<String>,
    /// T: the per-worker step budget.
    #[arg(long, default_value_t = 1000)]
    pub steps: u32,
    /// Evaluate every this many per-worker steps (single and sync runs; DiLoCo evaluates per round).
    #[arg(long, default_value_t = 50)]
    pub eval_every: u32,
    #[arg(long, default_value_t = 8)]
    pub val_batches: usize,
    /// Write every run (with its loss curve) as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the loss curves (SVG).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Threads per inner step: each batch is cut into this many equal parts trained in
    /// parallel (the same gradient, up to float rounding). Workers still run one after another.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// What each DiLoCo worker samples from: `rotate` (each round a new shard of the training
    /// split, drawn from the worker and the round, cut as `swarm init` cuts a dataset: what
    /// nodes do), `contiguous` (worker i of K: the i-th contiguous K-th of the text, every
    /// round) or `whole` (the whole training split, each worker with its own random stream).
    #[arg(long, default_value = "rotate", value_parser = ["rotate", "contiguous", "whole"])]
    pub shards: String,
    /// Whether DiLoCo nodes train the next round while a round is collected (`nightshift run
    /// --overlap`); each DiLoCo run is made once per value given.
    #[arg(long, value_delimiter = ',', default_value = "false", action = clap::ArgAction::Set)]
    pub overlap: Vec<bool>,
    #[command(flatten)]
    pub recipe: SwarmFlags,
}

/// The runs the flags ask for, in order: (name, kind).
fn plan(a: &ConvergenceArgs) -> Vec<(String, Kind)> {
    let want = |g: &str| a.runs.iter().any(|r| r == g);
    let (bk, bh, t) = (a.base_k, a.recipe.inner_steps, a.steps);
    let mut p = vec![];
    if want("single") {
        p.push((format!("single T={t}"), Kind::Single { mult: 1, steps: t }));
    }
    if want("single-long") {
        p.push((
            format!("single {bk}T"),
            Kind::Single {
                mult: 1,
                steps: t * bk as u32,
            },
        ));
    }
    if want("sync") {
        p.push((format!("sync k={bk}"), Kind::Single { mult: bk, steps: t }));
    }
    let diloco = |k: usize, h: u32, codec: DeltaCodec, drop: f64, suffix: String| {
        (
            format!("diloco k={k} h={h}{suffix}"),
            Kind::Diloco {
                k,
                h,
                codec,
                drop,
                reduce: None,
            },
        )
    };
    if want("diloco") {
        for &k in &a.k {
            for &h in &a.h {
                p.push(diloco(k, h, a.recipe.codec, 0.0, String::new()));
            }
        }
    }
    if want("codecs") {
        for &c in &a.codecs {
            p.push(diloco(bk, bh, c, 0.0, format!(" {c}")));
        }
    }
    if want("drop") {
        for &d in &a.drop {
            p.push(diloco(bk, bh, a.recipe.codec, d, format!(" drop={d}")));
        }
    }
    if want("reduce") {
        for r in &a.reduce {
            let (name, mut kind) = diloco(bk, bh, a.recipe.codec, 0.0, format!(" reduce={r}"));
            if let Kind::Diloco { reduce, .. } = &mut kind {
                *reduce = Some(r.clone());
            }
            p.push((name, kind));
        }
    }
    p
}

enum Kind {
    Single {
        mult: usize,
        steps: u32,
    },
    Diloco {
        k: usize,
        h: u32,
        codec: DeltaCodec,
        drop: f64,
        reduce: Option<String>,
    },
}

/// Runs the benchmark, printing a table; writes `--json` and `--plot`.
///
/// # Errors
/// On bad flags, data or I/O.
pub fn run_convergence(a: ConvergenceArgs) -> anyhow::Result<Vec<RunResult>> {
    if a.steps == 0
        || a.base_k == 0
        || a.k.contains(&0)
        || a.h.contains(&0)
        || a.recipe.inner_steps == 0
    {
        bail!("--steps, --k, --h, --base-k and --inner-steps must be positive");
    }
    const GROUPS: [&str; 7] = [
        "single",
        "single-long",
        "sync",
        "diloco",
        "codecs",
        "drop",
        "reduce",
    ];
    if let Some(g) = a.runs.iter().find(|g| !GROUPS.contains(&g.as_str())) {
        bail!(
            "unknown run group {g:?}: expected some of {}",
            GROUPS.join(", ")
        );
    }
    if a.drop.iter().any(|d| !(0.0..1.0).contains(d)) {
        bail!("--drop probabilities must be in [0, 1)");
    }
    let new_setup = || -> anyhow::Result<Setup> {
        let mut setup = Setup::new(&a.recipe, a.val_batches)?;
        setup.shards = match a.shards.as_str() {
            "contiguous" => ShardMode::Contiguous,
            "whole" => ShardMode::Whole,
            _ => ShardMode::Rotate,
        };
        setup.inner.threads = a.threads as usize;
        Ok(setup)
    };
    let setup = new_setup()?;
    let runs = plan(&a);
    for (name, kind) in &runs {
        if let Kind::Diloco { h, .. } = kind
            && !a.steps.is_multiple_of(*h)
        {
            bail!(
                "{name}: --steps {} is not a multiple of H = {h} (every round of a node trains H steps)",
                a.steps
            );
        }
    }
    println!(
        "convergence: {} runs, T={} per-worker steps, model {} ({} params), batch {}, seq {}",
        runs.len(),
        a.steps,
        a.recipe.preset,
        setup.genesis.len(),
        setup.inner.batch_size,
        setup.cfg.seq_len
    );
    print_header();
    let mut results: Vec<RunResult> = vec![];
    let commit = crate::results::commit_here();
    for (name, kind) in runs {
        let done = match kind {
            Kind::Single { mult, steps } => {
                let r = setup.run_single(&name, steps, mult, a.eval_every)?;
                print_row(&r);
                vec![r]
            }
            Kind::Diloco {
                k,
                h,
                codec,
                drop,
                reduce,
            } => {
                let mut done = vec![];
                for &overlap in &a.overlap {
                    let name = if a.overlap.len() > 1 {
                        format!("{name} overlap={}", if overlap { "on" } else { "off" })
                    } else {
                        name.clone()
                    };
                    let r = diloco::Diloco {
                        name: &name,
                        preset: &a.recipe.preset,
                        k,
                        h,
                        codec,
                        drop,
                        reduce: reduce.clone(),
                        steps: a.steps,
                        deadline_secs: u64::from(a.recipe.deadline_secs),
                        overlap,
                    }
                    .run(new_setup()?)?;
                    print_row(&r);
                    done.push(r);
                }
                done
            }
        };
        results.extend(done);
        if let Some(p) = &a.json {
            crate::results::Recorded {
                commit: commit.clone(),
                config: &a,
                runs: results.clone(),
            }
            .write(p)?;
        }
    }
    finish(&results, a.plot.as_deref())?;
    Ok(results)
}

/// A `--json` file: `{"commit", "config", "runs"}`, or the bare list of runs that files written
/// before the configuration was recorded hold.
#[derive(Deserialize)]
#[serde(untagged)]
enum ConvergenceFile {
    Recorded { runs: Vec<RunResult> },
    Runs(Vec<RunResult>),
}

/// `nightshift-lab report`: earlier runs' JSON files as one table.
///
/// # Errors
/// When a file cannot be read or is not a list of runs, or the plot cannot be written.
pub fn run_report(a: ReportArgs) -> anyhow::Result<Vec<RunResult>> {
    let mut results: Vec<RunResult> = vec![];
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        let file: ConvergenceFile = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not the JSON of `nightshift-lab convergence --json`",
                f.display()
            )
        })?;
        results.extend(match file {
            ConvergenceFile::Recorded { runs } => runs,
            ConvergenceFile::Runs(runs) => runs,
        });
    }
    if !a.at.is_empty() {
        results =
            a.at.iter()
                .flat_map(|&t| results.iter().filter_map(move |r| r.cut_at(t)))
                .collect();
        if results.is_empty() {
            bail!("no run's curve has a point at any of --at {:?}", a.at);
        }
    }
    print_header();
    for r in &results {
        print_row(r);
    }
    finish(&results, a.plot.as_deref())?;
    Ok(results)
}
