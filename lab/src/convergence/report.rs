//! A run's outcome, the table, the comparisons the targets name, and the plot.

use anyhow::Context;
use serde::{Deserialize, Serialize};

use nightshift_node::plot::{Series, line_chart};

/// One run's outcome.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    pub name: String,
    pub k: usize,
    pub h: u32,
    pub codec: String,
    pub drop: f64,
    pub final_val_loss: f32,
    pub tokens: u64,
    pub per_worker_steps: u32,
    pub bytes_per_node_per_round: u64,
    pub total_bytes: u64,
    /// (per-worker steps, validation loss)
    pub curve: Vec<(u32, f32)>,
    /// Training throughput of the whole run (all workers), tokens per second of training time.
    pub tokens_per_sec: f64,
    pub wall_secs: f64,
    /// Final validation loss of each parameter average asked for with `--eval-ema`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ema: Vec<EmaResult>,
    /// `--seed` of the run (absent from files written before it was recorded): `nightshift-lab report`
    /// compares runs of the same seed only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// DiLoCo nodes trained the next round while a round was collected (absent: files written
    /// before overlap existed, none did).
    #[serde(default)]
    pub overlap: bool,
}

/// The final validation loss of a moving average of a run's parameters (`--eval-ema`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmaResult {
    /// Horizon in per-worker steps.
    pub horizon: u32,
    pub final_val_loss: f32,
}

impl RunResult {
    /// This run as if its budget had been `steps` per-worker steps (see `nightshift-lab report --at`):
    /// `None` when its curve has no point there or it is longer than the run.
    pub fn cut_at(&self, steps: u32) -> Option<RunResult> {
        let end = self.curve.iter().position(|(s, _)| *s == steps)?;
        if steps == 0 || steps > self.per_worker_steps {
            return None;
        }
        let share = steps as f64 / self.per_worker_steps.max(1) as f64;
        let rounds = |t: u32| t.div_ceil(self.h.max(1)) as f64;
        Some(RunResult {
            name: format!("{} T={steps}", self.name),
            final_val_loss: self.curve[end].1,
            tokens: (self.tokens as f64 * share).round() as u64,
            per_worker_steps: steps,
            total_bytes: (self.total_bytes as f64 * rounds(steps)
                / rounds(self.per_worker_steps).max(1.0))
            .round() as u64,
            curve: self.curve[..=end].to_vec(),
            wall_secs: self.wall_secs * share,
            // The averages were only taken at the end.
            ema: vec![],
            ..self.clone()
        })
    }

    /// First per-worker step count at which the curve reaches `target` (or below).
    pub fn steps_to(&self, target: f32) -> Option<u32> {
        self.curve
            .iter()
            .find(|(_, l)| *l <= target)
            .map(|(s, _)| *s)
    }
}

pub(crate) fn print_header() {
    println!(
        "{:<34} {:>9} {:>10} {:>13} {:>10} {:>8}",
        "run", "val loss", "tokens", "B/node/round", "tokens/s", "secs"
    );
}

pub(crate) fn print_row(r: &RunResult) {
    println!(
        "{:<34} {:>9.4} {:>10} {:>13} {:>10.0} {:>8.1}",
        r.name,
        r.final_val_loss,
        r.tokens,
        r.bytes_per_node_per_round,
        r.tokens_per_sec,
        r.wall_secs
    );
    for e in &r.ema {
        println!(
            "{:<34} {:>9.4}",
            format!("  parameters averaged over ~{}", e.horizon),
            e.final_val_loss
        );
    }
}

/// What both commands print after the table: the comparisons, then the plot if asked for.
pub(crate) fn finish(results: &[RunResult], plot: Option<&std::path::Path>) -> anyhow::Result<()> {
    println!();
    for line in comparisons(results) {
        println!("  {line}");
    }
    match plot {
        Some(p) => write_plot(results, p),
        None => Ok(()),
    }
}

pub(crate) fn write_plot(results: &[RunResult], p: &std::path::Path) -> anyhow::Result<()> {
    let series: Vec<Series> = results
        .iter()
        .map(|r| Series {
            name: r.name.clone(),
            points: r
                .curve
                .iter()
                .map(|(s, l)| (*s as f64, *l as f64))
                .collect(),
        })
        .collect();
    std::fs::write(
        p,
        line_chart(
            "validation loss against per-worker steps",
            "per-worker steps",
            &series,
        ),
    )
    .with_context(|| format!("cannot write {}", p.display()))
}

/// What the targets compare, one line each: every DiLoCo and sync run against the
/// single worker of the same per-worker budget (the step at which it reached that worker's final
/// loss) and against sync of the same budget and tokens (final-loss ratio); every lossy codec against fp32
/// DiLoCo of the same K and H (final loss, bytes); every run with drops against the same K, H and
/// codec without them. When several runs qualify as the reference, the first is used.
pub fn comparisons(results: &[RunResult]) -> Vec<String> {
    let mut out = vec![];
    let is_diloco = |r: &&RunResult| r.name.starts_with("diloco");
    // Runs of different seeds are never compared (a file without seeds matches any).
    let same_seed =
        |a: &RunResult, b: &RunResult| a.seed.is_none() || b.seed.is_none() || a.seed == b.seed;
    let single = |r: &RunResult, t: u32| {
        results.iter().find(|s| {
            s.name.starts_with("single") && s.k == 1 && s.per_worker_steps == t && same_seed(r, s)
        })
    };
    // Sync at equal tokens: the same per-worker steps over as many workers.
    let sync = |r: &RunResult| {
        results.iter().find(|s| {
            s.name.starts_with("sync")
                && s.per_worker_steps == r.per_worker_steps
                && s.tokens == r.tokens
                && same_seed(r, s)
        })
    };
    for r in results
        .iter()
        .filter(|r| r.name.starts_with("diloco") || r.name.starts_with("sync"))
    {
        if let Some(s) = single(r, r.per_worker_steps) {
            let t = r.per_worker_steps;
            match r.steps_to(s.final_val_loss) {
                Some(n) => out.push(format!(
                    "{:<34} reached single's final loss ({:.4}) after {n} of {t} per-worker steps",
                    r.name, s.final_val_loss
                )),
                None => out.push(format!(
                    "{:<34} never reached single's final loss ({:.4}) in {t} per-worker steps",
                    r.name, s.final_val_loss
                )),
            }
        }
    }
    for r in results.iter().filter(is_diloco) {
        if let Some(s) = single(r, r.k as u32 * r.per_worker_steps).filter(|_| r.k > 1) {
            out.push(format!(
                "{:<34} final loss {:.4}x one worker's over the same tokens ({} steps)",
                r.name,
                r.final_val_loss / s.final_val_loss,
                s.per_worker_steps
            ));
        }
    }
    for r in results.iter().filter(is_diloco) {
        if let Some(s) = sync(r) {
            out.push(format!(
                "{:<34} final loss {:.4}x sync's",
                r.name,
                r.final_val_loss / s.final_val_loss
            ));
        }
    }
    for r in results
        .iter()
        .filter(is_diloco)
        .filter(|r| r.drop == 0.0 && r.codec != "fp32")
    {
        let fp32 = results.iter().filter(is_diloco).find(|b| {
            b.codec == "fp32"
                && b.drop == 0.0
                && (b.k, b.h) == (r.k, r.h)
                && b.per_worker_steps == r.per_worker_steps
                && same_seed(r, b)
        });
        if let Some(b) = fp32 {
            out.push(format!(
                "{:<34} final loss {:+.2} % against fp32, {:.1}x fewer bytes per round",
                r.name,
                100.0 * (r.final_val_loss / b.final_val_loss - 1.0),
                b.bytes_per_node_per_round as f64 / r.bytes_per_node_per_round.max(1) as f64
            ));
        }
    }
    for r in results.iter().filter(is_diloco).filter(|r| r.drop > 0.0) {
        let whole = results.iter().filter(is_diloco).find(|b| {
            b.drop == 0.0
                && (b.k, b.h) == (r.k, r.h)
                && b.codec == r.codec
                && b.per_worker_steps == r.per_worker_steps
                && same_seed(r, b)
        });
        if let Some(b) = whole {
            out.push(format!(
                "{:<34} final loss {:+.2} % against no drops ({:.4})",
                r.name,
                100.0 * (r.final_val_loss / b.final_val_loss - 1.0),
                b.final_val_loss
            ));
        }
    }
    out
}
