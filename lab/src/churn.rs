//! `nightshift-lab churn`: what idle windows cost (the seed's checks V1 and V3).
//!
//! Three swarms of real processes on 127.0.0.1 train the same manifest on the embedded corpus:
//! - `stable-half`: N/2 always-on nodes (the same average compute as the churning pool);
//! - `churn`: N nodes whose windows open and close on a cycle (idle `--duty` of every
//!   `--period-secs`, random phases), one of which joins late, and one of which is SIGKILLed
//!   and restarted halfway;
//! - `stable-full`: N always-on nodes.
//!
//! `stable-half` runs first, for `--max-secs`; the target loss is the best validation loss it
//! reached (or `--target-loss`). The others run until they reach it or 1.5 × `--max-secs`.
//! Reported per swarm: validation loss against wall time and tokens, time to the target, rounds
//! lost (a restarted node resuming from an older round than it had completed), hash agreement,
//! join time, yield latency p50/p99, recovery time after SIGKILL.
//!
//! Every node runs with `--threads` and `RAYON_NUM_THREADS` set to `--threads-per-node`
//! (default: this machine's cores, as `nightshift run` does). With every node allowed the whole
//! machine, a churning node whose window is the only one open trains on all cores, as the
//! stable nodes together do: the churning pool never gets more compute than the stable pool
//! (on one machine it gets less while every window is closed), as on separate machines.

use anyhow::{Context, bail};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::process::Child;

use nightshift_node::cmd::demo::{local_node_args, start_bootstrap, tempfile_dir};
use nightshift_node::cmd::swarm::SwarmFlags;
use nightshift_node::events::{NodeEvent, read_timed_events};
use nightshift_node::plot::{Series, line_chart};

use crate::local::{LocalSwarm, start_node};

impl ChurnArgs {
    /// Threads of each node process: `--threads-per-node`, else this machine's cores.
    fn threads(&self) -> usize {
        self.threads_per_node
            .unwrap_or_else(nightshift_node::cmd::demo::cores)
            .max(1)
    }
}

/// Flags of `nightshift-lab churn`. The recipe flags are those of `swarm init`.
#[derive(Args, Debug, Serialize)]
pub struct ChurnArgs {
    /// Nodes in the churning pool (the stable swarms have N/2 and N).
    #[arg(long, default_value_t = 4)]
    pub nodes: usize,
    /// Length of one idle/busy cycle of a churning node, in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub period_secs: f64,
    /// Fraction of each cycle a churning node is idle.
    #[arg(long, default_value_t = 0.5)]
    pub duty: f64,
    /// Wall-clock budget of the `stable-half` swarm (the others get 1.5×).
    #[arg(long, default_value_t = 300.0)]
    pub max_secs: f64,
    /// Target validation loss; default: the best `stable-half` reached.
    #[arg(long)]
    pub target_loss: Option<f32>,
    /// Threads of each node process (its `--threads` and RAYON_NUM_THREADS); default: this
    /// machine's cores.
    #[arg(long)]
    pub threads_per_node: Option<usize>,
    /// Which swarms to run, comma-separated: stable-half, churn, stable-full.
    #[arg(long, default_value = "stable-half,churn,stable-full")]
    pub runs: String,
    /// Seed of the window phases.
    #[arg(long, default_value_t = 7)]
    pub phase_seed: u64,
    /// Skip the SIGKILL and the late joiner in the churn swarm.
    #[arg(long)]
    pub no_faults: bool,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// SVG of validation loss against wall time.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Working directory (keys, stores, logs); a fresh temporary one by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[command(flatten)]
    pub swarm: SwarmFlags,
}

/// One point of a swarm's progress: the first time any node held θ(round).
#[derive(Clone, Debug, Serialize)]
pub struct Point {
    pub round: u64,
    pub secs: f64,
    /// Tokens trained by the whole swarm up to this round.
    pub tokens: u64,
    pub val_loss: Option<f32>,
    pub contributors: usize,
}

/// The result of one swarm.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnRun {
    pub name: String,
    pub nodes: usize,
    pub windows: Vec<String>,
    pub wall_secs: f64,
    pub rounds: u64,
    pub final_val_loss: Option<f32>,
    pub best_val_loss: Option<f32>,
    pub target_loss: Option<f32>,
    pub time_to_target_secs: Option<f64>,
    pub tokens_to_target: Option<u64>,
    pub total_tokens: u64,
    /// Rounds a restarted node had completed but did not resume from (must be 0).
    pub rounds_lost: u64,
    /// Rounds at which two nodes ended on different states (must be 0).
    pub rounds_disagreeing: usize,
    /// Distinct states held for a round beyond one, over every round, a divergence repaired
    /// later included (see [`nightshift_node::events::forks_per_round`]): 0 for an always-on swarm; a
    /// node whose window opens just as the others close a round can fork it for a moment.
    #[serde(default)]
    pub forks: usize,
    /// Late joiner: from its start to its state download done, and to its first contribution.
    pub join_sync_secs: Option<f64>,
    pub join_contribute_secs: Option<f64>,
    /// Yield latency (window closed → training stopped) over every yield, in milliseconds.
    pub yields: usize,
    pub yield_p50_ms: Option<f64>,
    pub yield_p99_ms: Option<f64>,
    /// Windows that closed while the node was not training (it paused without a step to stop).
    #[serde(default)]
    pub pauses: usize,
    pub partial_contributions: usize,
    /// SIGKILLed node: from its restart to running again, and to its next contribution.
    pub restart_secs: Option<f64>,
    pub recovery_secs: Option<f64>,
    pub curve: Vec<Point>,
}

fn percentile(v: &mut [f64], p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p * (v.len() - 1) as f64).round() as usize).min(v.len() - 1);
    Some(v[i])
}

struct Plan {
    name: &'static str,
    nodes: usize,
    /// `--idle` spec per node.
    windows: Vec<String>,
    /// Node started late (index, after seconds).
    late: Option<(usize, f64)>,
    /// Node SIGKILLed and restarted (index, after seconds).
    kill: Option<(usize, f64)>,
    budget: f64,
}

/// Summarizes the event files of one swarm.
#[allow(clippy::too_many_arguments)]
fn summarize(
    plan: &Plan,
    events: &[Vec<(u64, NodeEvent)>],
    keys: &[String],
    t0_ms: u64,
    wall_secs: f64,
    target: Option<f32>,
    late_started_ms: Option<u64>,
    restarted_ms: Option<u64>,
    lost: u64,
) -> ChurnRun {
    let secs = |at: u64| at.saturating_sub(t0_ms) as f64 / 1e3;
    // Per round: first time seen, loss, tokens, contributors.
    let mut first: BTreeMap<u64, (u64, Option<f32>, u64, usize)> = BTreeMap::new();
    let mut yields = vec![];
    let mut partial = 0;
    let mut pauses = 0;
    for ev in events {
        for (at, e) in ev {
            match e {
                NodeEvent::RoundCompleted(r) => {
                    let tokens = r.weights.iter().map(|(_, t)| *t).sum();
                    let loss = r.val_loss.is_finite().then_some(r.val_loss);
                    let entry = first
                        .entry(r.round)
                        .or_insert((*at, loss, tokens, r.contributors));
                    if *at < entry.0 {
                        entry.0 = *at;
                    }
                    if entry.1.is_none() {
                        entry.1 = loss;
                    }
                }
                NodeEvent::Yielded {
                    latency_ms, steps, ..
                } => {
                    yields.push(*latency_ms);
                    if *steps > 0 {
                        partial += 1;
                    }
                }
                NodeEvent::Paused { .. } => pauses += 1,
                _ => {}
            }
        }
    }
    let mut cum = 0u64;
    let curve: Vec<Point> = first
        .iter()
        .map(|(round, (at, loss, tokens, contributors))| {
            cum += tokens;
            Point {
                round: *round,
                secs: secs(*at),
                tokens: cum,
                val_loss: *loss,
                contributors: *contributors,
            }
        })
        .collect();
    let hit = target.and_then(|t| {
        curve
            .iter()
            .find(|p| p.val_loss.is_some_and(|l| l <= t))
            .map(|p| (p.secs, p.tokens))
    });
    let plain: Vec<Vec<NodeEvent>> = events
        .iter()
        .map(|ev| ev.iter().map(|(_, e)| e.clone()).collect())
        .collect();
    let forks: usize = nightshift_node::events::forks_per_round(plain.iter().map(Vec::as_slice))
        .values()
        .sum();
    // The state each node ended each round on (its last completion or sync of it). A state
    // the node left by syncing a peer's state of that round or a later one is no longer its
    // history (a fork repaired, counted in `forks`), so it is not compared.
    let mut last: BTreeMap<u64, BTreeMap<usize, &str>> = BTreeMap::new();
    for (i, ev) in plain.iter().enumerate() {
        for e in ev {
            match e {
                NodeEvent::RoundCompleted(r) => {
                    last.entry(r.round).or_default().insert(i, &r.state_hash);
                }
                NodeEvent::Synced {
                    round, state_hash, ..
                } => {
                    for (_, m) in last.range_mut(..*round) {
                        m.remove(&i);
                    }
                    last.entry(*round).or_default().insert(i, state_hash);
                }
                _ => {}
            }
        }
    }
    let disagreeing = last
        .values()
        .filter(|m| {
            let v: std::collections::BTreeSet<&&str> = m.values().collect();
            v.len() > 1
        })
        .count();
    // First contribution of node `i` after `since` (unix ms).
    let contributed_after = |i: usize, since: u64| -> Option<u64> {
        events
            .iter()
            .flatten()
            .filter_map(|(at, e)| match e {
                NodeEvent::RoundCompleted(r)
                    if *at >= since && r.weights.iter().any(|(k, _)| *k == keys[i]) =>
                {
                    Some(*at)
                }
                _ => None,
            })
            .min()
    };
    let (join_sync_secs, join_contribute_secs) = match (plan.late, late_started_ms) {
        (Some((i, _)), Some(start)) => {
            let sync = events[i].iter().find_map(|(at, e)| {
                matches!(e, NodeEvent::Synced { .. })
                    .then(|| (at.saturating_sub(start)) as f64 / 1e3)
            });
            let contrib = contributed_after(i, start).map(|at| (at - start) as f64 / 1e3);
            (sync, contrib)
        }
        _ => (None, None),
    };
    let (restart_secs, recovery_secs) = match (plan.kill, restarted_ms) {
        (Some((i, _)), Some(start)) => {
            let up = events[i].iter().find_map(|(at, e)| {
                (*at >= start && matches!(e, NodeEvent::Started { .. }))
                    .then(|| (at - start) as f64 / 1e3)
            });
            (
                up,
                contributed_after(i, start).map(|at| (at - start) as f64 / 1e3),
            )
        }
        _ => (None, None),
    };
    let losses: Vec<f32> = curve.iter().filter_map(|p| p.val_loss).collect();
    ChurnRun {
        name: plan.name.into(),
        nodes: plan.nodes,
        windows: plan.windows.clone(),
        wall_secs,
        rounds: curve.last().map_or(0, |p| p.round),
        final_val_loss: losses.last().copied(),
        best_val_loss: losses.iter().copied().reduce(f32::min),
        target_loss: target,
        time_to_target_secs: hit.map(|h| h.0),
        tokens_to_target: hit.map(|h| h.1),
        total_tokens: cum,
        rounds_lost: lost,
        rounds_disagreeing: disagreeing,
        forks,
        join_sync_secs,
        join_contribute_secs,
        yields: yields.len(),
        yield_p50_ms: percentile(&mut yields.clone(), 0.5),
        yield_p99_ms: percentile(&mut yields, 0.99),
        pauses,
        partial_contributions: partial,
        restart_secs,
        recovery_secs,
        curve,
    }
}

/// The highest round node events show as held (completed or synced).
/// The round of the state a node holds now: that of its last completion or sync (a repair
/// can take it back to an older round than it completed before).
fn held_round(ev: &[(u64, NodeEvent)]) -> u64 {
    ev.iter()
        .filter_map(|(_, e)| match e {
            NodeEvent::RoundCompleted(r) => Some(r.round),
            NodeEvent::Synced { round, .. } => Some(*round),
            _ => None,
        })
        .next_back()
        .unwrap_or(0)
}

async fn run_plan(
    plan: &Plan,
    args: &ChurnArgs,
    dir: &Path,
    target: Option<f32>,
) -> anyhow::Result<ChurnRun> {
    let started = Instant::now();
    let dir = dir.join(plan.name);
    std::fs::create_dir_all(&dir)?;
    let swarm = LocalSwarm::write(&dir, plan.nodes, |allow| {
        args.swarm.settings("churn-bench", allow)
    })?;
    let (mpath, keys) = (swarm.manifest, swarm.short_keys);
    let (_boot, boot_addr) = start_bootstrap(&dir, &mpath, started).await?;
    let node_args = |i: usize| -> Vec<String> {
        let mut a = local_node_args(&dir, &mpath, &boot_addr, i);
        a.extend([
            "--min-peers".into(),
            usize::from(plan.nodes > 1).to_string(),
            "--idle".into(),
            plan.windows[i].clone(),
            "--idle-after".into(),
            "0".into(),
            "--threads".into(),
            args.threads().to_string(),
        ]);
        a
    };
    let start_node = |i: usize, tag: &str| -> anyhow::Result<Child> {
        start_node(
            &node_args(i),
            args.threads(),
            &dir.join(format!("node{i}{tag}.log")),
        )
    };
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let t0_ms = now_ms();
    let t0 = Instant::now();
    let mut children: Vec<Option<Child>> = (0..plan.nodes).map(|_| None).collect();
    for (i, child) in children.iter_mut().enumerate() {
        if plan.late.is_none_or(|(l, _)| l != i) {
            *child = Some(start_node(i, "")?);
        }
    }
    let ev_path = |i: usize| dir.join(format!("node{i}.events.jsonl"));
    let read_all = || -> Vec<Vec<(u64, NodeEvent)>> {
        (0..plan.nodes)
            .map(|i| read_timed_events(&ev_path(i)))
            .collect()
    };
    let mut late_started_ms = None;
    let mut restarted_ms = None;
    let mut lost = 0;
    let mut last_print = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let el = t0.elapsed().as_secs_f64();
        if let Some((i, at)) = plan.late
            && late_started_ms.is_none()
            && el >= at
        {
            late_started_ms = Some(now_ms());
            children[i] = Some(start_node(i, "")?);
        }
        if let Some((i, at)) = plan.kill
            && restarted_ms.is_none()
            && el >= at
            && let Some(mut c) = children[i].take()
        {
            let before = held_round(&read_timed_events(&ev_path(i)));
            let _ = c.start_kill();
            let _ = c.wait().await;
            restarted_ms = Some(now_ms());
            children[i] = Some(start_node(i, "-restarted")?);
            // Wait for it to say where it resumed from.
            let until = Instant::now() + Duration::from_secs(60);
            while Instant::now() < until {
                let resumed = read_timed_events(&ev_path(i))
                    .into_iter()
                    .filter(|(at, _)| *at >= restarted_ms.unwrap_or(0))
                    .find_map(|(_, e)| match e {
                        NodeEvent::Started { round, .. } => Some(round),
                        _ => None,
                    });
                if let Some(r) = resumed {
                    lost = before.saturating_sub(r);
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let evs = read_all();
        let best = evs
            .iter()
            .flatten()
            .filter_map(|(_, e)| match e {
                NodeEvent::RoundCompleted(r) if r.val_loss.is_finite() => Some(r.val_loss),
                _ => None,
            })
            .reduce(f32::min);
        if last_print.elapsed() > Duration::from_secs(15) {
            let round = evs.iter().map(|e| held_round(e)).max().unwrap_or(0);
            println!(
                "  {:<12} {:>6.0} s  round {:>4}  best val loss {}",
                plan.name,
                el,
                round,
                best.map_or("-".into(), |b| format!("{b:.4}"))
            );
            last_print = Instant::now();
        }
        let reached = target.is_some_and(|t| best.is_some_and(|b| b <= t));
        if reached || el >= plan.budget {
            break;
        }
        for (i, c) in children.iter_mut().enumerate() {
            if let Some(ch) = c
                && let Ok(Some(st)) = ch.try_wait()
            {
                bail!(
                    "node {i} of {} exited early ({st}); see {}",
                    plan.name,
                    dir.display()
                );
            }
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    for c in children.iter_mut().flatten() {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    Ok(summarize(
        plan,
        &read_all(),
        &keys,
        t0_ms,
        wall,
        target,
        late_started_ms,
        restarted_ms,
        lost,
    ))
}

fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map_or("-".into(), |x| format!("{x:.1}{unit}"))
}

/// Runs `nightshift-lab churn`.
///
/// # Errors
/// Bad flags, or a swarm that cannot start.
pub async fn run_churn(args: ChurnArgs) -> anyhow::Result<Vec<ChurnRun>> {
    if args.nodes < 2 || !(0.05..=1.0).contains(&args.duty) || args.period_secs <= 0.0 {
        bail!("need --nodes >= 2, 0.05 <= --duty <= 1 and --period-secs > 0");
    }
    let wanted: Vec<&str> = args.runs.split(',').map(str::trim).collect();
    for w in &wanted {
        if !["stable-half", "churn", "stable-full"].contains(w) {
            bail!("unknown run {w:?}; choose from stable-half, churn, stable-full");
        }
    }
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => tempfile_dir()?,
    };
    std::fs::create_dir_all(&dir)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.phase_seed);
    let idle = args.period_secs * args.duty;
    let churn_windows: Vec<String> = (0..args.nodes)
        .map(|_| {
            let phase = rng.random_range(0.0..args.period_secs);
            format!("cycle:{}:{idle}:{phase:.2}", args.period_secs)
        })
        .collect();
    let half = (args.nodes / 2).max(1);
    let plans = [
        Plan {
            name: "stable-half",
            nodes: half,
            windows: vec!["always".into(); half],
            late: None,
            kill: None,
            budget: args.max_secs,
        },
        Plan {
            name: "churn",
            nodes: args.nodes,
            windows: churn_windows,
            late: (!args.no_faults).then_some((args.nodes - 1, args.max_secs * 0.2)),
            kill: (!args.no_faults).then_some((0, args.max_secs * 0.5)),
            budget: args.max_secs * 1.5,
        },
        Plan {
            name: "stable-full",
            nodes: args.nodes,
            windows: vec!["always".into(); args.nodes],
            late: None,
            kill: None,
            budget: args.max_secs * 1.5,
        },
    ];
    println!(
        "nightshift-lab churn: preset {}, H={}, codec {}, {} threads per node, windows idle {:.0}% of {} s; work dir {}",
        args.swarm.preset,
        args.swarm.inner_steps,
        args.swarm.codec,
        args.threads(),
        args.duty * 100.0,
        args.period_secs,
        dir.display()
    );
    let mut target = args.target_loss;
    let mut runs = vec![];
    for plan in plans.iter().filter(|p| wanted.contains(&p.name)) {
        let run = run_plan(plan, &args, &dir, target).await?;
        if target.is_none() {
            target = run.best_val_loss;
            if let Some(t) = target {
                println!("  target loss {t:.4} (best of {})", run.name);
            }
        }
        runs.push(run);
    }
    // Every run is measured against the same target (the first run set it after it ran).
    for r in &mut runs {
        if r.target_loss.is_none() && target.is_some() {
            r.target_loss = target;
            let t = target.unwrap_or(f32::NEG_INFINITY);
            let hit = r.curve.iter().find(|p| p.val_loss.is_some_and(|l| l <= t));
            r.time_to_target_secs = hit.map(|p| p.secs);
            r.tokens_to_target = hit.map(|p| p.tokens);
        }
    }
    println!();
    println!(
        "{:<12} {:>5} {:>7} {:>6} {:>9} {:>10} {:>11} {:>6} {:>6} {:>7} {:>8} {:>8} {:>8} {:>9}",
        "swarm",
        "nodes",
        "wall s",
        "rounds",
        "best val",
        "to target",
        "tok to tgt",
        "lost",
        "forks",
        "yields",
        "y p50",
        "y p99",
        "join s",
        "recover s"
    );
    for r in &runs {
        println!(
            "{:<12} {:>5} {:>7.0} {:>6} {:>9} {:>10} {:>11} {:>6} {:>6} {:>7} {:>8} {:>8} {:>8} {:>9}",
            r.name,
            r.nodes,
            r.wall_secs,
            r.rounds,
            r.best_val_loss.map_or("-".into(), |l| format!("{l:.4}")),
            fmt_opt(r.time_to_target_secs, " s"),
            r.tokens_to_target.map_or("-".into(), |t| t.to_string()),
            r.rounds_lost,
            r.forks,
            r.yields,
            fmt_opt(r.yield_p50_ms, " ms"),
            fmt_opt(r.yield_p99_ms, " ms"),
            fmt_opt(r.join_contribute_secs, ""),
            fmt_opt(r.recovery_secs, ""),
        );
    }
    let base = runs
        .iter()
        .find(|r| r.name == "stable-half")
        .and_then(|r| r.time_to_target_secs);
    if let (Some(b), Some(c)) = (
        base,
        runs.iter()
            .find(|r| r.name == "churn")
            .and_then(|r| r.time_to_target_secs),
    ) {
        println!(
            "churn / stable-half time to target: {:.2}× (target ≤ 1.1×)",
            c / b
        );
    }
    if let Some(p) = &args.json {
        crate::results::Recorded {
            commit: crate::results::commit_here(),
            config: &args,
            runs: runs.clone(),
        }
        .write(p)?;
        println!("wrote {}", p.display());
    }
    let plot = args.plot.clone().unwrap_or_else(|| dir.join("churn.svg"));
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: r.name.clone(),
            points: r
                .curve
                .iter()
                .filter_map(|p| p.val_loss.map(|l| (p.secs, f64::from(l))))
                .collect(),
        })
        .collect();
    std::fs::write(
        &plot,
        line_chart("validation loss against wall time", "seconds", &series),
    )
    .with_context(|| format!("cannot write {}", plot.display()))?;
    println!("plot: {}", plot.display());
    Ok(runs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), Some(3.0));
        assert_eq!(percentile(&mut v, 0.99), Some(5.0));
        assert_eq!(percentile(&mut [], 0.5), None);
    }
}
