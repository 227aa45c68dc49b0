//! `nightshift-lab scale`: what one round costs each node as the swarm grows (issue 26's
//! measure of flat gossip). Real `nightshift` processes on 127.0.0.1 — N = 4, 8 and 16 by
//! default, the `tiny` preset, one thread each — train `--rounds` rounds of a private swarm;
//! each node's round records give the request-response bytes it sent and received in the round
//! and the round's wall time. The simulator (every node running the same round machine, with
//! the stand-in model as wide as the preset) gives the same figures for larger swarms
//! (`--sim-nodes`). Medians over
//! nodes and rounds; a process swarm's first round (which includes finding the peers) is left
//! out.

use anyhow::bail;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nightshift_node::cmd::demo::{local_node_args, start_bootstrap, tempfile_dir};
use nightshift_node::events::{NodeEvent, read_timed_events};
use nightshift_protocol::slices::Averaging;

use crate::local::{LocalSwarm, start_node, wait_nodes};
use crate::results::{Recorded, commit_here};
use crate::sim::{SimArgs, simulate};

/// Flags of `nightshift-lab scale`.
#[derive(Args, Debug, Serialize)]
pub struct ScaleArgs {
    /// Swarm sizes run as real processes on this machine.
    #[arg(long, value_delimiter = ',', default_value = "4,8,16")]
    pub nodes: Vec<usize>,
    /// Swarm sizes run in the simulator (`nightshift-lab sim` at its defaults otherwise).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1000")]
    pub sim_nodes: Vec<usize>,
    /// Rounds each swarm trains.
    #[arg(long, default_value_t = 6)]
    pub rounds: u64,
    /// Model preset of the process swarms.
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// How the swarms average each round (`nightshift swarm init --averaging`).
    #[arg(long, default_value = "all-to-all")]
    pub averaging: Averaging,
    /// Values of the simulator's stand-in model (default: as many as the preset has). Past
    /// 65,536 the stand-in computes on 65,536 values and its transfers are counted at this
    /// width (`sim --wire-params`), so that a thousand nodes fit in memory.
    #[arg(long)]
    pub sim_params: Option<usize>,
    /// Peers each simulated node dials (default: the simulator's; every other node when the
    /// swarm averages slice by slice, which needs every contributor's header).
    #[arg(long)]
    pub sim_degree: Option<usize>,
    /// Give up on a process swarm after this long.
    #[arg(long, default_value_t = 900.0)]
    pub max_secs: f64,
    /// Keep the swarms' directories here (default: a temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One swarm size: medians over nodes and rounds.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleRun {
    pub nodes: usize,
    /// `processes` (real `nightshift` processes) or `simulator`.
    pub source: &'static str,
    pub bytes_up_per_node_per_round: u64,
    pub bytes_down_per_node_per_round: u64,
    /// Of the upload, the signed statuses (announcements, look-ups and their answers).
    pub status_bytes_up_per_node_per_round: u64,
    /// Wall seconds for processes, virtual seconds for the simulator.
    pub round_secs: f64,
    /// Rounds the medians are over (per node).
    pub rounds: u64,
    /// Distinct states among the nodes at the last round (1: they agree).
    pub distinct_final_states: usize,
}

fn median<T: Copy + PartialOrd>(mut v: Vec<T>) -> Option<T> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    Some(v[v.len() / 2])
}

/// N processes and a bootstrap, `rounds` rounds; the nodes' round records.
async fn run_processes(a: &ScaleArgs, n: usize, dir: &Path) -> anyhow::Result<ScaleRun> {
    let started = Instant::now();
    let dir = dir.join(format!("n{n}"));
    let mpath = LocalSwarm::write(&dir, n, |allowlist| nightshift_bootstrap::SwarmSettings {
        name: format!("scale-{n}"),
        preset: a.preset.clone(),
        allowlist,
        averaging: a.averaging,
        ..nightshift_bootstrap::SwarmSettings::default()
    })?
    .manifest;
    let (_boot, boot_addr) = start_bootstrap(&dir, &mpath, started).await?;
    let mut children = vec![];
    for i in 0..n {
        let mut args = local_node_args(&dir, &mpath, &boot_addr, i);
        args.extend(
            [
                "--rounds",
                &a.rounds.to_string(),
                "--min-peers",
                &(n - 1).to_string(),
                "--idle",
                "always",
                "--threads",
                "1",
            ]
            .map(String::from),
        );
        children.push(start_node(&args, 1, &dir.join(format!("node{i}.log")))?);
    }
    wait_nodes(&mut children, a.max_secs, &dir, |running| {
        println!(
            "  {n:>5} processes: {running} still training after {:.0} s",
            started.elapsed().as_secs_f64()
        );
    })
    .await?;
    let mut up = vec![];
    let mut down = vec![];
    let mut status = vec![];
    let mut secs = vec![];
    let mut last = std::collections::BTreeSet::new();
    for i in 0..n {
        let events = read_timed_events(&dir.join(format!("node{i}.events.jsonl")));
        for (_, e) in &events {
            if let NodeEvent::RoundCompleted(r) = e
                && r.round >= 2
            {
                up.push(r.bytes_sent);
                down.push(r.bytes_received);
                status.push(r.status_bytes_sent);
                secs.push(r.round_secs);
            }
        }
        // The state it ended the last round on: its last step or sync to that round.
        let held = events.iter().rev().find_map(|(_, e)| match e {
            NodeEvent::RoundCompleted(r) if r.round == a.rounds => Some(r.state_hash.clone()),
            NodeEvent::Synced {
                round, state_hash, ..
            } if *round == a.rounds => Some(state_hash.clone()),
            _ => None,
        });
        last.extend(held);
    }
    Ok(ScaleRun {
        nodes: n,
        source: "processes",
        bytes_up_per_node_per_round: median(up).unwrap_or(0),
        bytes_down_per_node_per_round: median(down).unwrap_or(0),
        status_bytes_up_per_node_per_round: median(status).unwrap_or(0),
        round_secs: median(secs).unwrap_or(0.0),
        rounds: a.rounds.saturating_sub(1),
        distinct_final_states: last.len(),
    })
}

/// Values the simulator's stand-in computes on at most (wider models are counted on the wire).
const SIM_COMPUTE_PARAMS: usize = 65_536;

/// The simulator at `n` nodes, its stand-in model as wide as the preset (so that contributions
/// weigh what the processes' do), its defaults otherwise.
fn run_sim(a: &ScaleArgs, n: usize, params: usize) -> anyhow::Result<ScaleRun> {
    let reduce = match a.averaging {
        Averaging::AllToAll => None,
        Averaging::Reduce { slices, mean_codec } => Some(format!("{slices}:{mean_codec}")),
    };
    let default_degree = SimArgs::default().degree;
    let degree = a.sim_degree.unwrap_or(if reduce.is_some() {
        n - 1
    } else {
        default_degree
    });
    let width = a.sim_params.unwrap_or(params);
    let r = simulate(&SimArgs {
        nodes: n,
        rounds: a.rounds,
        params: width.min(SIM_COMPUTE_PARAMS),
        wire_params: (width > SIM_COMPUTE_PARAMS).then_some(width),
        degree,
        reduce,
        ..SimArgs::default()
    })?;
    let rows = &r.rounds;
    Ok(ScaleRun {
        nodes: n,
        source: "simulator",
        bytes_up_per_node_per_round: median(rows.iter().map(|r| r.bytes_up_median).collect())
            .unwrap_or(0),
        bytes_down_per_node_per_round: median(rows.iter().map(|r| r.bytes_down_median).collect())
            .unwrap_or(0),
        status_bytes_up_per_node_per_round: median(
            rows.iter().map(|r| r.status_bytes_up_median).collect(),
        )
        .unwrap_or(0),
        round_secs: median(rows.iter().map(|r| r.round_secs).collect()).unwrap_or(0.0),
        rounds: a.rounds,
        distinct_final_states: rows.last().map_or(0, |r| r.distinct_state_hashes),
    })
}

/// `nightshift-lab scale`: runs every size, prints a table, writes the JSON.
///
/// # Errors
/// When a swarm fails or does not finish, or the file cannot be written.
pub async fn run_scale(a: ScaleArgs) -> anyhow::Result<Vec<ScaleRun>> {
    if a.rounds < 2 || a.nodes.iter().chain(&a.sim_nodes).any(|n| *n < 2) {
        bail!("--rounds and every swarm size must be at least 2");
    }
    let (dir, temporary) = match &a.dir {
        Some(d) => (d.clone(), false),
        None => (tempfile_dir()?, true),
    };
    let commit = commit_here();
    let mut runs = vec![];
    println!(
        "{:>6} {:>10} {:>14} {:>14} {:>14} {:>9} {:>7}",
        "nodes", "source", "up/round", "down/round", "statuses up", "secs", "states"
    );
    let print = |r: &ScaleRun| {
        println!(
            "{:>6} {:>10} {:>14} {:>14} {:>14} {:>9.1} {:>7}",
            r.nodes,
            r.source,
            r.bytes_up_per_node_per_round,
            r.bytes_down_per_node_per_round,
            r.status_bytes_up_per_node_per_round,
            r.round_secs,
            r.distinct_final_states
        );
    };
    let write = |runs: &Vec<ScaleRun>| -> anyhow::Result<()> {
        if let Some(p) = &a.json {
            Recorded {
                commit: commit.clone(),
                config: &a,
                runs: runs.clone(),
            }
            .write(p)?;
        }
        Ok(())
    };
    for &n in &a.nodes {
        let r = run_processes(&a, n, &dir).await?;
        print(&r);
        runs.push(r);
        write(&runs)?;
    }
    let settings = nightshift_bootstrap::SwarmSettings {
        preset: a.preset.clone(),
        ..nightshift_bootstrap::SwarmSettings::default()
    };
    let params = crate::convergence::Setup::from_settings(&settings, 1)?
        .genesis
        .len();
    for &n in &a.sim_nodes {
        let r = {
            let a = &a;
            tokio::task::block_in_place(|| run_sim(a, n, params))?
        };
        print(&r);
        runs.push(r);
        write(&runs)?;
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(runs)
}
