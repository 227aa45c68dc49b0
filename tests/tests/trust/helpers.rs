//! Shared helpers of the trust tests: scratch swarms, honest nodes, the `nightshift-hostile`
//! process and its report, and the checks on what the honest nodes did.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{Proc, TestSwarm, run_ok, wait_until};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

static ONE_SWARM_AT_A_TIME: Mutex<()> = Mutex::new(());
pub(crate) const EXIT_TIMEOUT: Duration = Duration::from_secs(600);
/// The tiny model, rounds of a second or two (100 inner steps), and a deadline only a stalled
/// round reaches.
const SWARM_FLAGS: &[&str] = &[
    "--inner-steps",
    "100",
    "--warmup-steps",
    "5",
    "--deadline-secs",
    "60",
];
/// Always idle, and one thread each: several nodes share two cores.
const NODE_FLAGS: &[&str] = &["--idle", "always", "--threads", "1"];
/// A generous bound on a node's peak resident memory under attack.
pub(crate) const MAX_NODE_HWM_KIB: u64 = 1536 * 1024;

pub(crate) fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_SWARM_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A scratch directory, kept (and printed) when `NIGHTSHIFT_KEEP_TEST_DIRS` is set.
pub(crate) fn scratch() -> (Option<tempfile::TempDir>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("NIGHTSHIFT_KEEP_TEST_DIRS").is_some() {
        let p = dir.keep();
        eprintln!("test directory: {}", p.display());
        return (None, p);
    }
    let p = dir.path().to_path_buf();
    (Some(dir), p)
}

pub(crate) fn keygen(path: &Path) {
    run_ok(&["keygen", "--out", path.to_str().unwrap()]);
}

/// A swarm with an allowlist of `nodes` trainers and the hostile member's key `hostile`, closed
/// at the transport by a pre-shared key (`swarm.key` beside the manifest).
pub(crate) fn private_swarm(dir: &Path, nodes: usize, hostile: Option<&Path>) -> TestSwarm {
    let mut extra: Vec<&str> = SWARM_FLAGS.to_vec();
    extra.push("--private");
    if let Some(k) = hostile {
        extra.extend(["--allow", k.to_str().unwrap()]);
    }
    TestSwarm::create(dir, nodes, &extra)
}

/// An open swarm (no allowlist): `TestSwarm::create` always writes one, so `swarm init` is run
/// here without `--allow`.
pub(crate) fn open_swarm(dir: &Path, nodes: usize) -> TestSwarm {
    for i in 0..nodes {
        keygen(&dir.join(format!("node{i}.key.json")));
    }
    let manifest = dir.join("manifest.json");
    let mut args = vec![
        "swarm",
        "init",
        "--out",
        manifest.to_str().unwrap(),
        "--preset",
        "tiny",
        "--name",
        "test",
    ];
    args.extend(SWARM_FLAGS);
    run_ok(&args);
    TestSwarm {
        dir: dir.to_path_buf(),
        manifest,
        nodes,
    }
}

pub(crate) fn start_nodes(swarm: &TestSwarm, addr: &str, rounds: u64) -> Vec<Proc> {
    (0..swarm.nodes)
        .map(|i| swarm.node_with(i, addr, rounds, NODE_FLAGS))
        .collect()
}

/// Waits until every node has begun training (so that the hostile peer joins a running swarm).
pub(crate) fn wait_training(swarm: &TestSwarm) {
    assert!(
        wait_until(Duration::from_secs(180), || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Training { .. })))),
        "the nodes did not start training"
    );
}

pub(crate) fn min_round(swarm: &TestSwarm) -> u64 {
    (0..swarm.nodes)
        .map(|i| swarm.round_of(i))
        .min()
        .unwrap_or(0)
}

fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// A running `nightshift-hostile` process and where its report goes.
pub(crate) struct Hostile {
    proc: Proc,
    report: PathBuf,
    mode: String,
    tag: String,
}

pub(crate) struct HostileArgs<'a> {
    pub(crate) mode: &'a str,
    pub(crate) key: Option<&'a Path>,
    pub(crate) swarm_key: Option<&'a Path>,
    pub(crate) secs: u64,
    pub(crate) tag: &'a str,
}

pub(crate) fn hostile(swarm: &TestSwarm, bootstrap: &str, a: HostileArgs<'_>) -> Hostile {
    let report = swarm.dir.join(format!("hostile-{}.json", a.tag));
    let log = std::fs::File::create(swarm.dir.join(format!("hostile-{}.log", a.tag))).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nightshift-hostile"));
    cmd.args(["--manifest", swarm.manifest.to_str().unwrap()])
        .args(["--bootstrap", bootstrap])
        .args(["--mode", a.mode])
        .args(["--secs", &a.secs.to_string()])
        .args(["--report", report.to_str().unwrap()]);
    if let Some(k) = a.key {
        cmd.args(["--key", k.to_str().unwrap()]);
    }
    if let Some(k) = a.swarm_key {
        cmd.args(["--swarm-key", k.to_str().unwrap()]);
    }
    let child = cmd
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start nightshift-hostile");
    Hostile {
        proc: Proc {
            child,
            name: format!("hostile {}", a.tag),
        },
        report,
        mode: a.mode.into(),
        tag: a.tag.into(),
    }
}

impl Hostile {
    /// Stops it now (SIGTERM: it writes its report and exits 0) and returns the report.
    pub(crate) fn stop(mut self) -> serde_json::Value {
        sigterm(self.proc.child.id());
        self.finish()
    }

    /// Waits for it to end on its own (`--secs`) and returns the report.
    pub(crate) fn finish(&mut self) -> serde_json::Value {
        assert_eq!(
            self.proc.wait_exit(Duration::from_secs(120)),
            Some(true),
            "{} did not exit cleanly",
            self.proc.name
        );
        let text = std::fs::read_to_string(&self.report).expect("hostile report");
        let v: serde_json::Value = serde_json::from_str(&text).expect("hostile report is JSON");
        assert_eq!(v["mode"], self.mode.as_str());
        println!(
            "hostile {}: connected_peers {} connected_at_end {} disconnected {} requests {} answered {} failed {} refused_answers {} dial_failures {}",
            self.tag,
            v["connected_peers"],
            v["connected_at_end"],
            v["disconnected"],
            v["requests"],
            v["answered"],
            v["failed"],
            v["refused_answers"],
            v["dial_failures"],
        );
        println!("hostile {} by kind: {}", self.tag, v["by_kind"]);
        println!(
            "hostile {}: inbound {} statuses_opened {} honest_round {} forged {} contributions_served {} state_chunks_served {} captured {} replays_pushed {} raw_closed {} raw_answered {}",
            self.tag,
            v["inbound"],
            v["statuses_opened"],
            v["honest_round"],
            v["forged"].as_array().map_or(0, Vec::len),
            v["contributions_served"],
            v["state_chunks_served"],
            v["captured"],
            v["replays_pushed"],
            v["raw_closed"],
            v["raw_answered"],
        );
        v
    }
}

pub(crate) fn u(v: &serde_json::Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("report field {field} missing: {v}"))
}

/// The state hashes a report says the hostile peer forged.
pub(crate) fn forged_hashes(reports: &[&serde_json::Value]) -> BTreeSet<String> {
    reports
        .iter()
        .flat_map(|r| r["forged"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["hash"].as_str().map(str::to_string))
        .collect()
}

/// Peak resident memory (KiB) of a running process so far.
pub(crate) fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The address node `i` listens on, from its log.
pub(crate) fn listen_addr(swarm: &TestSwarm, i: usize) -> Option<String> {
    let prefix = format!("node{i}-");
    for entry in std::fs::read_dir(&swarm.dir).ok()?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !(name.starts_with(&prefix) && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).ok()?;
        for line in text.lines().map(strip_ansi) {
            if line.contains("event_loop: listening")
                && let Some(rest) = line.split("address=").nth(1)
            {
                return rest.split_whitespace().next().map(str::to_string);
            }
        }
    }
    None
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Stops running nodes (SIGTERM) once each has gone `more` rounds past where the slowest is now,
/// and checks that each exits cleanly with its stop event.
pub(crate) fn stop_nodes(swarm: &TestSwarm, nodes: &mut [Proc], more: u64) {
    for (i, n) in nodes.iter_mut().enumerate() {
        assert!(
            n.child.try_wait().unwrap().is_none(),
            "node {i} exited during the attacks"
        );
    }
    let now = min_round(swarm);
    assert!(
        wait_until(Duration::from_secs(300), || min_round(swarm) >= now + more),
        "the nodes stopped making progress (round {now})"
    );
    for n in nodes.iter() {
        sigterm(n.child.id());
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        assert_eq!(
            n.wait_exit(Duration::from_secs(120)),
            Some(true),
            "node {i} did not stop cleanly"
        );
        assert!(
            swarm
                .events(i)
                .iter()
                .any(|e| matches!(e, NodeEvent::Stopped { .. })),
            "node {i} wrote no stop event"
        );
    }
}

/// Every node exits cleanly having reached θ(rounds).
pub(crate) fn assert_finished(swarm: &TestSwarm, nodes: &mut [Proc], rounds: u64) {
    for (i, n) in nodes.iter_mut().enumerate() {
        assert_eq!(
            n.wait_exit(EXIT_TIMEOUT),
            Some(true),
            "{} did not finish cleanly",
            n.name
        );
        let stopped = swarm.events(i).into_iter().find_map(|e| match e {
            NodeEvent::Stopped { round, reason, .. } => Some((round, reason)),
            _ => None,
        });
        assert_eq!(
            stopped,
            Some((rounds, "finished".to_string())),
            "node {i} did not complete its {rounds} rounds"
        );
    }
}

/// What the honest nodes' events say after an attack by the peers `hostile` (peer ids) that
/// forged the states `forged`: no state came from them or was one of theirs, every round has
/// exactly one state across every node and every moment (a divergence repaired later counts),
/// and every node's validation loss fell.
pub(crate) fn assert_unmoved(swarm: &TestSwarm, hostile: &[String], forged: &BTreeSet<String>) {
    let mut held: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    let mut syncs = 0;
    for i in 0..swarm.nodes {
        let ev = swarm.events(i);
        for e in &ev {
            match e {
                NodeEvent::RoundCompleted(r) => {
                    held.entry(r.round)
                        .or_default()
                        .insert(r.state_hash.clone());
                }
                NodeEvent::Synced {
                    round,
                    state_hash,
                    from,
                    replaced,
                    verified,
                    ..
                } => {
                    syncs += 1;
                    println!("node {i} synced round {round} from {from} ({verified})");
                    assert!(
                        !hostile.contains(from),
                        "node {i} took the state of round {round} from the hostile peer {from}"
                    );
                    held.entry(*round).or_default().insert(state_hash.clone());
                    if let Some(old) = replaced {
                        held.entry(*round).or_default().insert(old.clone());
                    }
                }
                _ => {}
            }
        }
        let (initial, last) = nightshift_tests::val_losses(&ev);
        let (initial, last) = (initial.unwrap(), last.expect("no round completed"));
        println!("node {i}: validation loss {initial:.4} -> {last:.4}");
        assert!(
            last.is_finite() && last < initial,
            "node {i}: validation loss went {initial} -> {last}"
        );
    }
    for (round, hashes) in &held {
        for h in hashes {
            assert!(
                !forged.contains(h),
                "a node held the forged state {h} at round {round}"
            );
        }
        assert_eq!(
            hashes.len(),
            1,
            "the nodes held {} states of round {round}: {hashes:?}",
            hashes.len()
        );
    }
    println!(
        "{} rounds, one state each across {} nodes; {syncs} syncs",
        held.len(),
        swarm.nodes
    );
}

/// Rounds whose averaged set counted the sender `public_hex` (as the round records name senders).
pub(crate) fn rounds_counting(swarm: &TestSwarm, public_hex: &str) -> Vec<u64> {
    let short = &public_hex[..12];
    (0..swarm.nodes)
        .flat_map(|i| swarm.events(i))
        .filter_map(|e| match e {
            NodeEvent::RoundCompleted(r) if r.weights.iter().any(|(s, _)| s == short) => {
                Some(r.round)
            }
            _ => None,
        })
        .collect()
}
