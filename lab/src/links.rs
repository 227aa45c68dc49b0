//! `nightshift-lab links`: how fast a swarm trains as its links get slower (issue 26's V2).
//! Real `nightshift` processes, each in its own network namespace, every namespace's only link
//! an emulated WAN link ([`crate::wan`]: rate, delay, loss, a half-second buffer) — 1, 10 and
//! 100 Mbit/s at 50 ms round trip by default, plus one run at 1 % loss. The bootstrap node's link
//! has the delay but no rate limit (a server in a data centre).
//!
//! The default model is chosen so that the network matters: `small` (421,697 parameters,
//! ~230 kB a contribution at `int4:64`) with 15 inner steps a round (~1.4 s on one thread here):
//! at 1 Mbit/s one contribution takes ~1.9 s to send, longer than the round's training, and a
//! node uploads it to each peer and to the bootstrap node (which replays every round).
//!
//! Per run: `utilization`, the share of a node's wall time spent in inner steps (from its first
//! round's start to its last round's end; median node); `secs_to_target`, seconds from the
//! swarm's first round until the median node's validation loss first reaches the target (the
//! highest final loss of all runs unless `--target-loss`, so every run reaches it); bytes up
//! per node per round (median). Every setting runs without and with overlap (`nightshift run
//! --overlap`: the next round trains while a round's contributions travel).

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nightshift_node::cmd::demo::{nightshift_exe, tempfile_dir};
use nightshift_node::events::{NodeEvent, read_timed_events};

use crate::local::{LocalSwarm, wait_nodes};
use crate::results::{Recorded, commit_here};
use crate::wan::{Shape, Wan};

/// Flags of `nightshift-lab links`.
#[derive(Args, Debug, Serialize)]
pub struct LinksArgs {
    /// Link rates to run, in Mbit/s (each node's uplink and downlink alike).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    pub mbps: Vec<f64>,
    /// Round-trip time between two nodes, in milliseconds.
    #[arg(long, default_value_t = 50.0)]
    pub rtt_ms: f64,
    /// One more run at this loss (percent of each node's packets) ...
    #[arg(long, default_value_t = 1.0)]
    pub loss_pct: f64,
    /// ... at this rate (0: no lossy run).
    #[arg(long, default_value_t = 10.0)]
    pub loss_mbps: f64,
    /// Training nodes (each one thread: keep nodes at most the machine's cores).
    #[arg(long, default_value_t = 2)]
    pub nodes: usize,
    #[arg(long, default_value = "small")]
    pub preset: String,
    /// Inner steps per round.
    #[arg(long, default_value_t = 15)]
    pub inner_steps: u32,
    /// Rounds each run trains.
    #[arg(long, default_value_t = 12)]
    pub rounds: u64,
    /// Run every link setting with these `--overlap` values of the nodes.
    #[arg(long, value_delimiter = ',', default_value = "false,true", action = clap::ArgAction::Set)]
    pub overlap: Vec<bool>,
    /// Seeds the genesis state and the nodes' keys (which seed the batches they sample); the
    /// timing still varies from run to run.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// The loss every run is timed to (default: the highest final loss among the runs).
    #[arg(long)]
    pub target_loss: Option<f32>,
    /// Give up on a run after this long.
    #[arg(long, default_value_t = 600.0)]
    pub max_secs: f64,
    /// Keep the runs' directories here (default: a temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write time to target against bandwidth as an SVG chart.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// One link setting.
#[derive(Clone, Debug, Serialize)]
pub struct LinksRun {
    pub mbps: f64,
    pub rtt_ms: f64,
    pub loss_pct: f64,
    pub nodes: usize,
    /// Whether the next round trained while this one's contributions travelled.
    pub overlap: bool,
    pub utilization: f64,
    pub secs_to_target: Option<f64>,
    pub bytes_up_per_node_per_round: u64,
    pub round_secs: f64,
    pub final_val_loss: f32,
    pub rounds: u64,
    pub wall_secs: f64,
    /// Packets the emulated WAN dropped (lost or buffer full).
    pub packets_dropped: u64,
    /// Each node's validation loss by seconds since the swarm's first round (median node's
    /// curve is read from these).
    #[serde(skip)]
    curves: Vec<Vec<(f64, f32)>>,
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Some(v[v.len() / 2])
}

fn start_in(ns: &str, args: &[String], log: &Path) -> anyhow::Result<tokio::process::Child> {
    let log =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    tokio::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(nightshift_exe()?)
        .args(args)
        .env("RAYON_NUM_THREADS", "1")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a node (ip netns exec)")
}

/// One run: a fresh swarm and WAN at `shape`.
async fn run_one(
    a: &LinksArgs,
    shape: Shape,
    overlap: bool,
    dir: &Path,
) -> anyhow::Result<LinksRun> {
    let n = a.nodes;
    let dir = dir.join(format!(
        "{}mbit-{}loss-overlap-{overlap}",
        shape.mbps, shape.loss_pct
    ));
    let mpath = LocalSwarm::write_seeded(&dir, n, Some(a.seed), |allowlist| {
        nightshift_bootstrap::SwarmSettings {
            name: "links".into(),
            preset: a.preset.clone(),
            inner_steps: a.inner_steps,
            init_seed: a.seed,
            allowlist,
            ..nightshift_bootstrap::SwarmSettings::default()
        }
    })?
    .manifest;
    // Host 0 is the bootstrap: the delay, no rate limit, no loss.
    let mut shapes = vec![Shape {
        delay_ms: shape.delay_ms,
        ..Shape::OPEN
    }];
    shapes.extend(std::iter::repeat_n(shape, n));
    let prefix = format!("nsl{}", std::process::id() % 100_000);
    let wan = Wan::start(&prefix, &shapes).map_err(|e| {
        anyhow::anyhow!(
            "{e}\nthe links benchmark emulates a WAN between network namespaces: it needs root, \
             `ip` (iproute2) and /dev/net/tun"
        )
    })?;
    let s = |p: &Path| p.display().to_string();
    let addr_file = dir.join("bootstrap.addr");
    let _boot = start_in(
        &wan.ns(0),
        &[
            "bootstrap".into(),
            "--manifest".into(),
            s(&mpath),
            "--listen".into(),
            format!("/ip4/{}/tcp/4001", Wan::ip(0)),
            "--addr-file".into(),
            s(&addr_file),
            "--data-dir".into(),
            s(&dir.join("bootstrap")),
        ],
        &dir.join("bootstrap.log"),
    )?;
    let started = Instant::now();
    let boot_addr = loop {
        if let Ok(t) = std::fs::read_to_string(&addr_file) {
            break t.trim().to_string();
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the bootstrap node did not come up; see {}", dir.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut children = vec![];
    for i in 0..n {
        let mut args: Vec<String> = [
            "run",
            "--manifest",
            &s(&mpath),
            "--key",
            &s(&dir.join(format!("node{i}.key.json"))),
            "--bootstrap",
            &boot_addr,
            "--listen",
            "/ip4/0.0.0.0/tcp/4001",
            "--data-dir",
            &s(&dir.join(format!("node{i}"))),
            "--events",
            &s(&dir.join(format!("node{i}.events.jsonl"))),
            "--rounds",
            &a.rounds.to_string(),
            "--min-peers",
            &(n - 1).to_string(),
            "--idle",
            "always",
            "--threads",
            "1",
        ]
        .map(String::from)
        .to_vec();
        if overlap {
            args.push("--overlap".into());
        }
        children.push(start_in(
            &wan.ns(i + 1),
            &args,
            &dir.join(format!("node{i}.log")),
        )?);
    }
    wait_nodes(&mut children, a.max_secs, &dir, |_| {}).await?;
    let wall_secs = started.elapsed().as_secs_f64();
    let mut util = vec![];
    let mut up = vec![];
    let mut secs = vec![];
    let mut finals = vec![];
    let mut firsts = vec![];
    let mut rounds_of = vec![];
    for i in 0..n {
        let rounds: Vec<(u64, _)> = read_timed_events(&dir.join(format!("node{i}.events.jsonl")))
            .into_iter()
            .filter_map(|(at, e)| match e {
                NodeEvent::RoundCompleted(r) => Some((at, r)),
                _ => None,
            })
            .collect();
        let (Some((t0, r0)), Some((t1, rl))) = (rounds.first(), rounds.last()) else {
            bail!("node {i} completed no round; see {}", dir.display());
        };
        let begin = *t0 as f64 / 1e3 - r0.round_secs;
        let span = *t1 as f64 / 1e3 - begin;
        let trained: f64 = rounds.iter().map(|(_, r)| r.train_secs).sum();
        util.push(trained / span.max(1e-9));
        finals.push(rl.val_loss);
        firsts.push(begin);
        for (_, r) in rounds.iter().skip(1) {
            up.push(r.bytes_sent);
            secs.push(r.round_secs);
        }
        rounds_of.push(rounds);
    }
    let swarm_start = firsts.iter().copied().fold(f64::INFINITY, f64::min);
    let curves = rounds_of
        .iter()
        .map(|rs| {
            rs.iter()
                .map(|(at, r)| (*at as f64 / 1e3 - swarm_start, r.val_loss))
                .collect()
        })
        .collect();
    Ok(LinksRun {
        mbps: shape.mbps,
        rtt_ms: a.rtt_ms,
        loss_pct: shape.loss_pct,
        nodes: n,
        overlap,
        utilization: median(util).unwrap_or(0.0),
        secs_to_target: None,
        bytes_up_per_node_per_round: median(up).unwrap_or(0),
        round_secs: median(secs).unwrap_or(0.0),
        final_val_loss: median(finals).unwrap_or(f32::NAN),
        rounds: a.rounds,
        wall_secs,
        packets_dropped: wan.dropped.load(std::sync::atomic::Ordering::Relaxed),
        curves,
    })
}

/// Seconds until the median node first reaches `target`.
fn secs_to(curves: &[Vec<(f64, f32)>], target: f32) -> Option<f64> {
    let each: Vec<f64> = curves
        .iter()
        .map(|c| {
            c.iter()
                .find(|(_, l)| *l <= target)
                .map_or(f64::INFINITY, |(t, _)| *t)
        })
        .collect();
    median(each).filter(|t| t.is_finite())
}

/// `nightshift-lab links`: every link setting in turn; prints a table, writes the JSON and the
/// chart.
///
/// # Errors
/// When a run fails, or a file cannot be written.
pub async fn run_links(a: LinksArgs) -> anyhow::Result<Vec<LinksRun>> {
    if a.nodes < 2 || a.rounds < 2 || a.mbps.iter().any(|m| *m <= 0.0) {
        bail!("--nodes and --rounds must be at least 2, and every --mbps positive");
    }
    if !(0.0..100.0).contains(&a.loss_pct) || a.rtt_ms < 0.0 {
        bail!("--loss-pct must be in [0, 100) and --rtt-ms not negative");
    }
    let (dir, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (tempfile_dir()?, true),
    };
    // Two hosts' links make a path: each link carries half of the one-way delay.
    let delay_ms = a.rtt_ms / 4.0;
    let mut shapes: Vec<Shape> = a
        .mbps
        .iter()
        .map(|&mbps| Shape {
            mbps,
            delay_ms,
            loss_pct: 0.0,
        })
        .collect();
    if a.loss_mbps > 0.0 && a.loss_pct > 0.0 {
        shapes.push(Shape {
            mbps: a.loss_mbps,
            delay_ms,
            loss_pct: a.loss_pct,
        });
    }
    let commit = commit_here();
    let mut runs = vec![];
    println!(
        "{:>7} {:>7} {:>6} {:>8} {:>6} {:>12} {:>10} {:>12} {:>9}",
        "mbit/s",
        "rtt ms",
        "loss%",
        "overlap",
        "util",
        "up/round",
        "round s",
        "final loss",
        "wall s"
    );
    let settings = shapes
        .iter()
        .flat_map(|s| a.overlap.iter().map(move |o| (*s, *o)));
    for (shape, overlap) in settings {
        let r = run_one(&a, shape, overlap, &dir).await?;
        println!(
            "{:>7} {:>7} {:>6} {:>8} {:>6.2} {:>12} {:>10.2} {:>12.4} {:>9.1}",
            r.mbps,
            r.rtt_ms,
            r.loss_pct,
            if r.overlap { "on" } else { "off" },
            r.utilization,
            r.bytes_up_per_node_per_round,
            r.round_secs,
            r.final_val_loss,
            r.wall_secs
        );
        runs.push(r);
    }
    let target = a.target_loss.unwrap_or_else(|| {
        runs.iter()
            .map(|r| r.final_val_loss)
            .fold(f32::NEG_INFINITY, f32::max)
    });
    for r in &mut runs {
        r.secs_to_target = secs_to(&r.curves, target);
    }
    println!("seconds to validation loss {target:.4}:");
    for r in &runs {
        println!(
            "  {:>7} Mbit/s, {}% loss, overlap {}: {}",
            r.mbps,
            r.loss_pct,
            if r.overlap { "on" } else { "off" },
            r.secs_to_target
                .map_or("not reached".into(), |s| format!("{s:.1}"))
        );
    }
    if let Some(p) = &a.json {
        #[derive(Serialize)]
        struct Config<'a> {
            #[serde(flatten)]
            args: &'a LinksArgs,
            target_loss_used: f32,
        }
        Recorded {
            commit,
            config: Config {
                args: &a,
                target_loss_used: target,
            },
            runs: runs.clone(),
        }
        .write(p)?;
    }
    if let Some(p) = &a.plot {
        let series = [false, true]
            .into_iter()
            .filter(|o| a.overlap.contains(o))
            .map(|o| nightshift_node::plot::Series {
                name: if o { "overlap" } else { "no overlap" }.into(),
                points: runs
                    .iter()
                    .filter(|r| r.loss_pct == 0.0 && r.overlap == o)
                    .filter_map(|r| r.secs_to_target.map(|s| (r.mbps.log10(), s)))
                    .collect(),
            })
            .collect::<Vec<_>>();
        let svg = nightshift_node::plot::line_chart(
            &format!(
                "time to validation loss {target:.3} ({} nodes, {} ms RTT)",
                a.nodes, a.rtt_ms
            ),
            "log10 link rate (Mbit/s)",
            &series,
        );
        std::fs::write(p, svg).with_context(|| format!("cannot write {}", p.display()))?;
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(runs)
}
