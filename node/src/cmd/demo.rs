//! `nightshift demo`: a bootstrap node and N trainers as separate processes on 127.0.0.1,
//! training on the embedded corpus; a live table, a summary, a JSON report and an SVG plot.

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::sync::watch;

use super::swarm::SwarmFlags;
use crate::events::{NodeEvent, RoundRecord, read_events};

/// The key of demo node `i`, derived from the swarm's `--seed`. A node's key seeds the batches
/// it samples, so fixed keys make a demo repeatable: the same seed on the same machine trains the
/// same model, round by round. These keys are public knowledge; they never leave the demo's
/// private loopback swarm (real nodes make theirs with `nightshift keygen`).
pub fn demo_key(seed: u64, i: usize) -> ed25519_dalek::SigningKey {
    use rand::{RngCore, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
        seed ^ 0x6465_6d6f_6b65_7973 ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut secret);
    ed25519_dalek::SigningKey::from_bytes(&secret)
}

/// Flags of `nightshift demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Number of trainer processes.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Outer rounds to run (12 rounds of the default 25 inner steps: 300 steps per node).
    #[arg(long, default_value_t = 12)]
    pub rounds: u64,
    /// Write the machine-readable report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write the loss curve (SVG) here; defaults to <dir>/loss.svg.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Working directory for keys, manifest, stores and logs; a fresh temporary one by default.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout_secs: u64,
    /// Serve node 0's live dashboard (and its Prometheus metrics at /metrics) on this address,
    /// e.g. 127.0.0.1:8080.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub swarm: SwarmFlags,
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct ReportRound {
    pub round: u64,
    pub val_loss: f32,
    pub contributors: usize,
    pub state_hash_agreed: bool,
    /// Distinct states the nodes held for this round, less one: a divergence that a node
    /// repaired later (by adopting another node's state) counts. 0 in a healthy swarm.
    pub forks: usize,
    /// Mean request-response bytes sent per node in this round.
    pub bytes_sent: u64,
    /// Of those, the mean bytes of signed statuses per node.
    pub status_bytes_sent: u64,
    pub bytes_sent_per_node: Vec<u64>,
    /// Sum of the nodes' training throughput.
    pub tokens_per_sec: f64,
    pub round_secs: f64,
    pub train_secs: f64,
    pub encode_secs: f64,
    pub transfer_secs: f64,
    pub wait_secs: f64,
}

/// The demo's report (`--report FILE`).
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub nodes: usize,
    pub rounds: Vec<ReportRound>,
    pub initial_val_loss: f32,
    pub final_val_loss: f32,
    pub dense_delta_bytes: u64,
    pub wire_delta_bytes: u64,
    /// Forks over every round (see [`ReportRound::forks`]).
    pub forks: usize,
    pub compression_ratio: f64,
    pub codec: String,
    pub inner_steps: u32,
    pub swarm_id: String,
    pub wall_secs: f64,
}

fn exe() -> anyhow::Result<PathBuf> {
    nightshift_exe()
}

/// The `nightshift` executable that local swarms start: `$NIGHTSHIFT_BIN` when set; from
/// `nightshift-lab`, the `nightshift` beside it (as cargo's target directory has them); else this
/// very executable, whatever its name.
///
/// # Errors
/// When this executable cannot be found, or `nightshift-lab` has no `nightshift` beside it.
pub fn nightshift_exe() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("NIGHTSHIFT_BIN") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().context("cannot find this executable")?;
    let lab = format!("nightshift-lab{}", std::env::consts::EXE_SUFFIX);
    if me.file_name().is_none_or(|n| n != lab.as_str()) {
        return Ok(me);
    }
    let beside = me.with_file_name(format!("nightshift{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        beside.exists(),
        "cannot find the nightshift executable beside {}: build it (`cargo build --release -p \
         nightshift-node`) or set NIGHTSHIFT_BIN",
        me.display()
    );
    Ok(beside)
}

/// Starts `nightshift bootstrap` for the manifest at `mpath` and waits for its address.
/// Writes a new bootstrap key where `nightshift bootstrap` looks for it beside the manifest at
/// `mpath`, and returns its public key (for the manifest's bootstrap list).
pub fn new_bootstrap_key(mpath: &Path) -> anyhow::Result<[u8; 32]> {
    let k = nightshift_bootstrap::generate_key()?;
    nightshift_bootstrap::write_key(&super::common::default_bootstrap_key(mpath), &k)?;
    Ok(k.verifying_key().to_bytes())
}

pub async fn start_bootstrap(
    dir: &Path,
    mpath: &Path,
    started: Instant,
) -> anyhow::Result<(Child, String)> {
    let addr_file = dir.join("bootstrap.addr");
    let _ = std::fs::remove_file(&addr_file);
    let s = |p: &Path| p.display().to_string();
    let mut boot = spawn(
        &[
            "bootstrap".into(),
            "--manifest".into(),
            s(mpath),
            "--listen".into(),
            "/ip4/127.0.0.1/tcp/0".into(),
            "--addr-file".into(),
            s(&addr_file),
            "--data-dir".into(),
            s(&dir.join("bootstrap")),
        ],
        &dir.join("bootstrap.log"),
    )?;
    loop {
        if let Ok(a) = std::fs::read_to_string(&addr_file) {
            return Ok((boot, a.trim().to_string()));
        }
        if let Some(st) = boot.try_wait()? {
            bail!(
                "the bootstrap node exited ({st}); see {}",
                dir.join("bootstrap.log").display()
            );
        }
        if started.elapsed() > Duration::from_secs(30) {
            bail!("the bootstrap node did not come up within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// This machine's cores (1 when unknown).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The arguments of `nightshift run` for local node `i` of a swarm kept in `dir`: its key
/// `node<i>.key.json`, store `node<i>/` and events `node<i>.events.jsonl` there, on 127.0.0.1.
pub fn local_node_args(dir: &Path, mpath: &Path, boot_addr: &str, i: usize) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    vec![
        "run".into(),
        "--manifest".into(),
        s(mpath),
        "--key".into(),
        s(&dir.join(format!("node{i}.key.json"))),
        "--bootstrap".into(),
        boot_addr.into(),
        "--listen".into(),
        "/ip4/127.0.0.1/tcp/0".into(),
        "--data-dir".into(),
        s(&dir.join(format!("node{i}"))),
        "--events".into(),
        s(&dir.join(format!("node{i}.events.jsonl"))),
    ]
}

/// Starts the binary with `args`, its output going to `log`; killed when dropped.
pub fn spawn(args: &[String], log: &Path) -> anyhow::Result<Child> {
    let log =
        std::fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    Command::new(exe()?)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a nightshift process")
}

/// Builds the report from the nodes' event files.
pub fn build_report(
    events: &[Vec<NodeEvent>],
    codec: &str,
    inner_steps: u32,
    swarm_id: &str,
    wall_secs: f64,
) -> Option<Report> {
    let initial = events.iter().flatten().find_map(|e| match e {
        NodeEvent::Started {
            val_loss, round: 0, ..
        } => Some(*val_loss),
        _ => None,
    })?;
    // Final hash per (round, node): the last RoundCompleted or Synced for that round.
    let mut hashes: BTreeMap<u64, Vec<Option<String>>> = BTreeMap::new();
    let mut records: BTreeMap<u64, Vec<RoundRecord>> = BTreeMap::new();
    for (i, evs) in events.iter().enumerate() {
        for e in evs {
            let (round, hash) = match e {
                NodeEvent::RoundCompleted(r) => {
                    records.entry(r.round).or_default().push(r.clone());
                    (r.round, r.state_hash.clone())
                }
                NodeEvent::Synced {
                    round, state_hash, ..
                } => (*round, state_hash.clone()),
                _ => continue,
            };
            hashes
                .entry(round)
                .or_insert_with(|| vec![None; events.len()])[i] = Some(hash);
        }
    }
    let forks = crate::events::forks_per_round(events.iter().map(Vec::as_slice));
    let mut rounds = vec![];
    for (round, recs) in &records {
        let hs: Vec<&String> = hashes
            .get(round)
            .map(|v| v.iter().flatten().collect())
            .unwrap_or_default();
        let agreed = !hs.is_empty() && hs.iter().all(|h| *h == hs[0]);
        let n = recs.len() as f64;
        let mean = |f: fn(&RoundRecord) -> f64| recs.iter().map(f).sum::<f64>() / n;
        let per_node: Vec<u64> = recs.iter().map(|r| r.bytes_sent).collect();
        rounds.push(ReportRound {
            round: *round,
            val_loss: recs[0].val_loss,
            contributors: recs.iter().map(|r| r.contributors).max().unwrap_or(0),
            state_hash_agreed: agreed,
            forks: forks.get(round).copied().unwrap_or(0),
            bytes_sent: per_node.iter().sum::<u64>() / per_node.len().max(1) as u64,
            status_bytes_sent: recs.iter().map(|r| r.status_bytes_sent).sum::<u64>()
                / recs.len().max(1) as u64,
            bytes_sent_per_node: per_node,
            tokens_per_sec: recs.iter().map(|r| r.tokens_per_sec).sum(),
            round_secs: mean(|r| r.round_secs),
            train_secs: mean(|r| r.train_secs),
            encode_secs: mean(|r| r.encode_secs),
            transfer_secs: mean(|r| r.transfer_secs),
            wait_secs: mean(|r| r.wait_secs),
        });
    }
    let all: Vec<&RoundRecord> = records.values().flatten().collect();
    let dense = all.first().map(|r| r.dense_delta_bytes).unwrap_or(0);
    let wire = if all.is_empty() {
        0
    } else {
        all.iter().map(|r| r.wire_delta_bytes).sum::<u64>() / all.len() as u64
    };
    Some(Report {
        nodes: events.len(),
        final_val_loss: rounds.last().map(|r| r.val_loss).unwrap_or(initial),
        initial_val_loss: initial,
        rounds,
        dense_delta_bytes: dense,
        wire_delta_bytes: wire,
        forks: forks.values().sum(),
        compression_ratio: if wire > 0 {
            dense as f64 / wire as f64
        } else {
            0.0
        },
        codec: codec.into(),
        inner_steps,
        swarm_id: swarm_id.into(),
        wall_secs,
    })
}

/// The demo's loss curve: validation loss against round, starting at θ(0).
pub fn loss_svg(initial: f32, rounds: &[(u64, f32)]) -> String {
    let points = std::iter::once((0.0, initial as f64))
        .chain(rounds.iter().map(|(r, l)| (*r as f64, *l as f64)))
        .collect();
    crate::plot::line_chart(
        "nightshift demo: validation loss per round",
        "round",
        &[crate::plot::Series {
            name: "swarm".into(),
            points,
        }],
    )
}

/// Prints above the progress bar, or plainly when there is no terminal to draw it on.
fn say(pb: &ProgressBar, line: impl AsRef<str>) {
    if pb.is_hidden() {
        println!("{}", line.as_ref());
    } else {
        pb.println(line);
    }
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 => format!("{:.2} MiB", b as f64 / (1 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

/// Runs the demo.
///
/// # Errors
/// When the swarm cannot be set up, a process fails, or the time limit passes.
pub async fn run_demo(args: DemoArgs, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    if args.nodes == 0 || args.rounds == 0 {
        bail!("--nodes and --rounds must be at least 1");
    }
    let started = Instant::now();
    let (dir, _tmp) = match &args.dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile_dir()?;
            (t.clone(), Some(t))
        }
    };
    std::fs::create_dir_all(&dir)?;
    // Keys and the private swarm's manifest.
    let creator = nightshift_bootstrap::generate_key()?;
    let mut allow = vec![];
    for i in 0..args.nodes {
        let k = demo_key(args.swarm.seed, i);
        nightshift_bootstrap::write_key(&dir.join(format!("node{i}.key.json")), &k)?;
        allow.push(k.verifying_key().to_bytes());
    }
    let mpath = dir.join("manifest.json");
    let settings = nightshift_bootstrap::SwarmSettings {
        bootstraps: vec![new_bootstrap_key(&mpath)?],
        ..args.swarm.settings("demo", allow)
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let manifest = nightshift_bootstrap::build_manifest(&settings, &creator, now)?;
    std::fs::write(&mpath, serde_json::to_string_pretty(&manifest)?)?;
    let swarm_id = manifest.swarm_id().to_hex();
    let m = &manifest.manifest.model;
    println!(
        "nightshift demo: {} nodes, {} rounds of H={} inner steps ({}), codec {}, model d={} L={} ({} tokens), data {}",
        args.nodes,
        args.rounds,
        settings.inner_steps,
        settings.inner_optimizer,
        settings.codec,
        m.d_model,
        m.n_layers,
        m.vocab_size,
        manifest.manifest.training.data.name
    );
    println!("swarm {}   work dir {}", &swarm_id[..16], dir.display());

    // Bootstrap.
    let (mut boot, boot_addr) = start_bootstrap(&dir, &mpath, started).await?;
    let s = |p: &Path| p.display().to_string();

    // Trainers.
    let mut children = vec![];
    let mut event_files = vec![];
    for i in 0..args.nodes {
        let ev = dir.join(format!("node{i}.events.jsonl"));
        let _ = std::fs::remove_file(&ev);
        let mut a = local_node_args(&dir, &mpath, &boot_addr, i);
        a.extend([
            "--rounds".into(),
            args.rounds.to_string(),
            "--min-peers".into(),
            (args.nodes - 1).to_string(),
            // The demo's nodes share this machine: each would see the others' load as busy,
            // and each gets its share of the cores.
            "--idle".into(),
            "always".into(),
            "--threads".into(),
            (cores() / args.nodes).max(1).to_string(),
        ]);
        if let Some(d) = &args.swarm.data {
            a.extend(["--data".into(), s(d)]);
        }
        if let Some(t) = &args.swarm.tokenizer {
            a.extend(["--tokenizer".into(), s(t)]);
        }
        if let (0, Some(addr)) = (i, args.http) {
            let _ = std::fs::remove_file(crate::http::http_file(&dir.join("node0")));
            a.extend(["--http".into(), addr.to_string()]);
        }
        children.push(spawn(&a, &dir.join(format!("node{i}.log")))?);
        event_files.push(ev);
    }

    let pb = ProgressBar::new(args.rounds);
    pb.set_style(
        ProgressStyle::with_template("{spinner} round {pos}/{len} [{elapsed_precise}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb.set_message("waiting for the nodes to find each other");
    if args.http.is_some() {
        let file = crate::http::http_file(&dir.join("node0"));
        let start = std::time::Instant::now();
        while !file.exists() && start.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        match std::fs::read_to_string(&file) {
            Ok(a) => say(&pb, format!("dashboard: http://{}/", a.trim())),
            Err(_) => say(
                &pb,
                format!(
                    "node 0 did not start its dashboard; see {}",
                    dir.join("node0.log").display()
                ),
            ),
        }
    }
    say(
        &pb,
        format!(
            "{:>5}  {:>8}  {:>6}  {:>9}  {:>11}  {:>7}  {:>6}  {:>5}",
            "round", "val loss", "nodes", "tokens/s", "sent/node", "ratio", "agreed", "forks"
        ),
    );
    let mut shown = 0u64;
    let mut initial_shown = false;
    let limit = Duration::from_secs(args.timeout_secs);
    let mut interrupted = false;
    loop {
        let events: Vec<Vec<NodeEvent>> = event_files.iter().map(|p| read_events(p)).collect();
        if !initial_shown && let Some(r) = build_report(&events, "", 0, "", 0.0) {
            say(&pb, format!("{:>5}  {:>8.4}", 0, r.initial_val_loss));
            initial_shown = true;
        }
        if let Some(r) = build_report(&events, "", 0, "", 0.0) {
            let from = shown;
            for row in r.rounds.iter().filter(|row| row.round > from) {
                // Print a round once every running node has reported it.
                let reported = events
                    .iter()
                    .filter(|e| {
                        e.iter().any(
                            |x| matches!(x, NodeEvent::RoundCompleted(rr) if rr.round == row.round),
                        )
                    })
                    .count();
                let running = children.len();
                if reported < running
                    && children
                        .iter_mut()
                        .all(|c| matches!(c.try_wait(), Ok(None)))
                {
                    break;
                }
                let ratio = if r.wire_delta_bytes > 0 {
                    r.dense_delta_bytes as f64 / r.wire_delta_bytes as f64
                } else {
                    0.0
                };
                say(
                    &pb,
                    format!(
                        "{:>5}  {:>8.4}  {:>6}  {:>9.0}  {:>11}  {:>6.1}x  {:>6}  {:>5}",
                        row.round,
                        row.val_loss,
                        row.contributors,
                        row.tokens_per_sec,
                        human_bytes(row.bytes_sent),
                        ratio,
                        if row.state_hash_agreed { "yes" } else { "NO" },
                        row.forks
                    ),
                );
                shown = row.round;
                pb.set_position(shown);
                pb.set_message(format!("val loss {:.4}", row.val_loss));
            }
        }
        let mut all_done = true;
        for (i, c) in children.iter_mut().enumerate() {
            match c.try_wait()? {
                None => all_done = false,
                Some(st) if !st.success() && !interrupted => {
                    pb.abandon();
                    bail!(
                        "node {i} exited with {st}; see {}",
                        dir.join(format!("node{i}.log")).display()
                    );
                }
                Some(_) => {}
            }
        }
        if all_done {
            break;
        }
        if started.elapsed() > limit {
            pb.abandon();
            bail!(
                "the demo did not finish within {} s; logs are in {}",
                args.timeout_secs,
                dir.display()
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
            _ = shutdown.changed() => {
                // The children got the same SIGINT from the terminal; let them checkpoint and go.
                interrupted = true;
                say(&pb, "interrupted: waiting for the nodes to save and stop");
            }
        }
    }
    pb.finish_and_clear();
    let _ = boot.start_kill();
    let _ = boot.wait().await;

    let events: Vec<Vec<NodeEvent>> = event_files.iter().map(|p| read_events(p)).collect();
    let report = build_report(
        &events,
        &settings.codec.to_string(),
        settings.inner_steps,
        &swarm_id,
        started.elapsed().as_secs_f64(),
    )
    .context("the nodes reported nothing")?;
    let plot = args.plot.clone().unwrap_or_else(|| dir.join("loss.svg"));
    let pts: Vec<(u64, f32)> = report
        .rounds
        .iter()
        .map(|r| (r.round, r.val_loss))
        .collect();
    std::fs::write(&plot, loss_svg(report.initial_val_loss, &pts))
        .with_context(|| format!("cannot write {}", plot.display()))?;
    if let Some(p) = &args.report {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    let agreed = report.rounds.iter().filter(|r| r.state_hash_agreed).count();
    let sent: u64 = report.rounds.iter().map(|r| r.bytes_sent).sum();
    println!();
    println!("summary");
    println!(
        "  validation loss   {:.4} -> {:.4} over {} rounds",
        report.initial_val_loss,
        report.final_val_loss,
        report.rounds.len()
    );
    println!(
        "  state hashes      agreed on {agreed} of {} rounds, {} forks (divergences repaired)",
        report.rounds.len(),
        report.forks
    );
    println!(
        "  delta per node    {} on the wire vs {} as fp32 ({:.1}x smaller, codec {})",
        human_bytes(report.wire_delta_bytes),
        human_bytes(report.dense_delta_bytes),
        report.compression_ratio,
        report.codec
    );
    println!("  sent per node     {} in total", human_bytes(sent));
    let status: u64 = report.rounds.iter().map(|r| r.status_bytes_sent).sum();
    println!(
        "  signed statuses   {} per node per round",
        human_bytes(status / report.rounds.len().max(1) as u64)
    );
    println!("  wall time         {:.1} s", report.wall_secs);
    println!("  loss curve        {}", plot.display());
    if let Some(p) = &args.report {
        println!("  report            {}", p.display());
    }
    println!("  logs              {}", dir.display());
    if interrupted {
        bail!("interrupted");
    }
    Ok(())
}

pub fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "nightshift-demo-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demo_keys_repeat_with_the_seed_and_differ_between_nodes() {
        let k = |seed, i| demo_key(seed, i).verifying_key().to_bytes();
        assert_eq!(k(42, 0), k(42, 0));
        assert_ne!(k(42, 0), k(42, 1));
        assert_ne!(k(42, 0), k(43, 0));
        // The batch seed a node derives from its key's first eight bytes differs too.
        assert_ne!(k(42, 0)[..8], k(42, 1)[..8]);
    }
}
