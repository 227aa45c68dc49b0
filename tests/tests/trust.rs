//! Hostile peers against real nodes (processes on 127.0.0.1). The attacker is
//! `nightshift-hostile`, a plain rust-libp2p peer run as its own process: a member announcing
//! forged states (zero θ formed by itself, one and five rounds ahead; the genesis state
//! relabelled five rounds ahead), an outsider doing the same to an open swarm, an outsider
//! knocking at a private swarm, and a member replaying old contributions, sending malformed
//! frames and flooding requests. The honest nodes must finish their rounds on states they
//! verified, agree on every round (every state each of them ever held for it), learn, and keep
//! their memory bounded.
//!
//! The scenarios run one at a time (a lock): each is a swarm of processes on a 2-core machine.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{Proc, TestSwarm, run_ok, wait_until};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static ONE_SWARM_AT_A_TIME: Mutex<()> = Mutex::new(());
const EXIT_TIMEOUT: Duration = Duration::from_secs(600);
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
const MAX_NODE_HWM_KIB: u64 = 1536 * 1024;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_SWARM_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// A scratch directory, kept (and printed) when `NIGHTSHIFT_KEEP_TEST_DIRS` is set.
fn scratch() -> (Option<tempfile::TempDir>, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("NIGHTSHIFT_KEEP_TEST_DIRS").is_some() {
        let p = dir.keep();
        eprintln!("test directory: {}", p.display());
        return (None, p);
    }
    let p = dir.path().to_path_buf();
    (Some(dir), p)
}

fn keygen(path: &Path) {
    run_ok(&["keygen", "--out", path.to_str().unwrap()]);
}

/// A swarm with an allowlist of `nodes` trainers and the hostile member's key `hostile`, closed
/// at the transport by a pre-shared key (`swarm.key` beside the manifest).
fn private_swarm(dir: &Path, nodes: usize, hostile: Option<&Path>) -> TestSwarm {
    let mut extra: Vec<&str> = SWARM_FLAGS.to_vec();
    extra.push("--private");
    if let Some(k) = hostile {
        extra.extend(["--allow", k.to_str().unwrap()]);
    }
    TestSwarm::create(dir, nodes, &extra)
}

/// An open swarm (no allowlist): `TestSwarm::create` always writes one, so `swarm init` is run
/// here without `--allow`.
fn open_swarm(dir: &Path, nodes: usize) -> TestSwarm {
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

fn start_nodes(swarm: &TestSwarm, addr: &str, rounds: u64) -> Vec<Proc> {
    (0..swarm.nodes)
        .map(|i| swarm.node_with(i, addr, rounds, NODE_FLAGS))
        .collect()
}

/// Waits until every node has begun training (so that the hostile peer joins a running swarm).
fn wait_training(swarm: &TestSwarm) {
    assert!(
        wait_until(Duration::from_secs(180), || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Training { .. })))),
        "the nodes did not start training"
    );
}

fn min_round(swarm: &TestSwarm) -> u64 {
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
struct Hostile {
    proc: Proc,
    report: PathBuf,
    mode: String,
    tag: String,
}

struct HostileArgs<'a> {
    mode: &'a str,
    key: Option<&'a Path>,
    swarm_key: Option<&'a Path>,
    secs: u64,
    tag: &'a str,
}

fn hostile(swarm: &TestSwarm, bootstrap: &str, a: HostileArgs<'_>) -> Hostile {
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
    fn stop(mut self) -> serde_json::Value {
        sigterm(self.proc.child.id());
        self.finish()
    }

    /// Waits for it to end on its own (`--secs`) and returns the report.
    fn finish(&mut self) -> serde_json::Value {
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

fn u(v: &serde_json::Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("report field {field} missing: {v}"))
}

/// The state hashes a report says the hostile peer forged.
fn forged_hashes(reports: &[&serde_json::Value]) -> BTreeSet<String> {
    reports
        .iter()
        .flat_map(|r| r["forged"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["hash"].as_str().map(str::to_string))
        .collect()
}

/// Peak resident memory (KiB) of a running process so far.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The address node `i` listens on, from its log.
fn listen_addr(swarm: &TestSwarm, i: usize) -> Option<String> {
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
fn stop_nodes(swarm: &TestSwarm, nodes: &mut [Proc], more: u64) {
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
fn assert_finished(swarm: &TestSwarm, nodes: &mut [Proc], rounds: u64) {
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
fn assert_unmoved(swarm: &TestSwarm, hostile: &[String], forged: &BTreeSet<String>) {
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
        let initial = ev.iter().find_map(|e| match e {
            NodeEvent::Started { val_loss, .. } => Some(*val_loss),
            _ => None,
        });
        let last = ev.iter().rev().find_map(|e| match e {
            NodeEvent::RoundCompleted(r) => Some(r.val_loss),
            _ => None,
        });
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
fn rounds_counting(swarm: &TestSwarm, public_hex: &str) -> Vec<u64> {
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

#[test]
fn a_member_announcing_a_forged_state_changes_no_honest_nodes_state() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let hostile_key = dir.join("hostile.key.json");
    keygen(&hostile_key);
    // 3 honest members and the hostile one: the default quorum, ⌊(4 − 1)/3⌋ + 1 = 2, is more
    // than the hostile member alone.
    let swarm = private_swarm(&dir, 3, Some(&hostile_key));
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 8;
    let mut nodes = start_nodes(&swarm, &addr, rounds);
    wait_training(&swarm);

    let forge = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "forge",
            key: Some(&hostile_key),
            swarm_key: Some(&swarm_key),
            secs: 600,
            tag: "forge",
        },
    );
    assert!(
        wait_until(Duration::from_secs(300), || min_round(&swarm) >= rounds / 2),
        "the swarm did not reach round {}",
        rounds / 2
    );
    let forged = forge.stop();
    let relabel = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "relabel",
            key: Some(&hostile_key),
            swarm_key: Some(&swarm_key),
            secs: 600,
            tag: "relabel",
        },
    );
    // Wait for the nodes while the relabelled genesis is announced.
    assert!(
        wait_until(EXIT_TIMEOUT, || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Stopped { .. })))),
        "the nodes did not stop"
    );
    let relabelled = relabel.stop();
    assert_finished(&swarm, &mut nodes, rounds);

    for r in [&forged, &relabelled] {
        assert!(
            u(r, "connected_peers") >= 3 && u(r, "statuses_opened") > 0,
            "the hostile member never reached the swarm: {r}"
        );
        assert!(u(r, "announced") > 0, "nothing was announced: {r}");
    }
    // The forged states were considered (a replay asked for the hostile's contribution) and
    // refused.
    assert!(
        u(&forged, "contributions_served") > 0,
        "no node tried to verify the forged state: {forged}"
    );
    let peer = forged["peer_id"].as_str().unwrap().to_string();
    let all_forged = forged_hashes(&[&forged, &relabelled]);
    assert_unmoved(&swarm, &[peer], &all_forged);
    println!(
        "rounds that counted the hostile member's contribution: {:?}",
        rounds_counting(&swarm, forged["public_key"].as_str().unwrap())
    );
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn an_outsider_announcing_a_forged_state_to_an_open_swarm_changes_nothing() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let swarm = open_swarm(&dir, 3);
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 6;
    let mut nodes = start_nodes(&swarm, &addr, rounds);
    wait_training(&swarm);
    // A fresh key: in an open swarm anyone may connect.
    let forge = hostile(
        &swarm,
        &addr,
        HostileArgs {
            mode: "forge",
            key: None,
            swarm_key: None,
            secs: 600,
            tag: "forge",
        },
    );
    assert!(
        wait_until(EXIT_TIMEOUT, || (0..swarm.nodes).all(|i| swarm
            .events(i)
            .iter()
            .any(|e| matches!(e, NodeEvent::Stopped { .. })))),
        "the nodes did not stop"
    );
    let forged = forge.stop();
    assert_finished(&swarm, &mut nodes, rounds);
    assert!(
        u(&forged, "connected_peers") >= 3 && u(&forged, "announced") > 0,
        "the outsider never reached the swarm: {forged}"
    );
    assert!(
        u(&forged, "contributions_served") > 0,
        "no node tried to verify the forged state: {forged}"
    );
    let peer = forged["peer_id"].as_str().unwrap().to_string();
    assert_unmoved(&swarm, &[peer], &forged_hashes(&[&forged]));
    println!(
        "rounds that counted the outsider's contribution: {:?}",
        rounds_counting(&swarm, forged["public_key"].as_str().unwrap())
    );
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn an_outsider_cannot_connect_to_a_private_swarm() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let swarm = private_swarm(&dir, 2, None);
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the attempts last: the nodes are stopped (SIGTERM) after them.
    let mut nodes = start_nodes(&swarm, &addr, 10_000);
    wait_training(&swarm);
    let trainer = listen_addr(&swarm, 0).expect("node 0's listen address in its log");
    // Without the swarm key (pnet stops the handshake); with a stolen one (the allowlist gate
    // refuses the key), at the bootstrap and at a trainer directly.
    let attempts = [
        ("no-swarm-key", None, &addr),
        ("stolen-swarm-key", Some(&swarm_key), &addr),
        ("stolen-swarm-key-at-a-trainer", Some(&swarm_key), &trainer),
    ];
    let mut reports = vec![];
    for (tag, psk, target) in attempts {
        let mut h = hostile(
            &swarm,
            target,
            HostileArgs {
                mode: "forge",
                key: None,
                swarm_key: psk.map(PathBuf::as_path),
                secs: 6,
                tag,
            },
        );
        let r = h.finish();
        let (connected, disconnected) = (u(&r, "connected_peers"), u(&r, "disconnected"));
        assert!(
            connected == 0 || disconnected >= connected,
            "{tag}: a connection survived: {r}"
        );
        assert_eq!(u(&r, "connected_at_end"), 0, "{tag}: {r}");
        assert_eq!(u(&r, "answered"), 0, "{tag}: a node answered: {r}");
        assert_eq!(u(&r, "statuses_opened"), 0, "{tag}: {r}");
        assert!(r["honest_round"].is_null(), "{tag}: {r}");
        reports.push(r);
    }
    stop_nodes(&swarm, &mut nodes, 1);
    let peers: Vec<String> = reports
        .iter()
        .map(|r| r["peer_id"].as_str().unwrap().to_string())
        .collect();
    assert_unmoved(&swarm, &peers, &BTreeSet::new());
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}

#[test]
fn replayed_garbage_and_flooding_peers_change_nothing_and_memory_stays_bounded() {
    let _one = serial();
    let t0 = Instant::now();
    let (_keep, dir) = scratch();
    let hostile_key = dir.join("hostile.key.json");
    keygen(&hostile_key);
    let swarm = private_swarm(&dir, 2, Some(&hostile_key));
    let swarm_key = dir.join("swarm.key");
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the attacks last: the nodes are stopped (SIGTERM) after them.
    let mut nodes = start_nodes(&swarm, &addr, 10_000);
    wait_training(&swarm);
    let pids: Vec<u32> = nodes.iter().map(|n| n.child.id()).collect();
    let hwm = |when: &str| -> Vec<u64> {
        let v: Vec<u64> = pids
            .iter()
            .map(|p| vm_hwm_kib(*p).expect("node process is gone"))
            .collect();
        println!("VmHWM {when}: {v:?} KiB");
        v
    };
    let before = hwm("before the attacks");
    let args = |mode, secs| HostileArgs {
        mode,
        key: Some(&hostile_key),
        swarm_key: Some(&swarm_key),
        secs,
        tag: mode,
    };

    // 1. Replay: the contributions of a round, pushed again two rounds later, until the nodes
    // refused some of them and went two more rounds on.
    let replay = hostile(&swarm, &addr, args("replay", 600));
    let start = min_round(&swarm);
    let hostile_peer = nightshift_node::net::libp2p_keypair(
        &nightshift_bootstrap::read_key(&hostile_key).unwrap(),
    )
    .public()
    .to_peer_id()
    .to_string();
    let refused_replays = |swarm: &TestSwarm| -> Vec<(usize, u64, String)> {
        (0..swarm.nodes)
            .flat_map(|i| {
                swarm
                    .events(i)
                    .into_iter()
                    .filter_map(move |e| match e {
                        NodeEvent::Refused {
                            round,
                            from,
                            reason,
                        } if reason.contains("envelope is for round") => {
                            Some((i, round, from, reason))
                        }
                        _ => None,
                    })
                    .filter(|(_, _, from, _)| *from == hostile_peer)
                    .map(|(i, round, _, reason)| (i, round, reason))
            })
            .collect()
    };
    let refused_ok = wait_until(Duration::from_secs(300), || {
        min_round(&swarm) >= start + 5
            && (0..swarm.nodes).all(|i| refused_replays(&swarm).iter().any(|r| r.0 == i))
    });
    let replayed = replay.stop();
    let refused = refused_replays(&swarm);
    println!(
        "replayed contributions refused: {} (e.g. {:?})",
        refused.len(),
        refused.first()
    );
    assert!(
        u(&replayed, "replays_pushed") > 0,
        "nothing was replayed: {replayed}"
    );
    assert!(
        refused_ok,
        "the nodes did not refuse the replayed contributions (rounds {start} -> {}): {refused:?}",
        min_round(&swarm)
    );

    // 2. Malformed frames, then 3. a flood; the nodes train on under both.
    let mut garbage = hostile(&swarm, &addr, args("garbage", 15));
    let garbaged = garbage.finish();
    assert!(
        u(&garbaged, "requests") > 0 && u(&garbaged, "connected_peers") >= 2,
        "{garbaged}"
    );
    assert_eq!(
        u(&garbaged, "raw_answered"),
        0,
        "a node answered a malformed frame: {garbaged}"
    );
    let round_before_flood = min_round(&swarm);
    let mut flood = hostile(&swarm, &addr, args("flood", 20));
    let flooded = flood.finish();
    assert!(u(&flooded, "requests") > 1000, "{flooded}");
    assert!(
        u(&flooded, "answered") > 0,
        "no request was served: {flooded}"
    );
    let during = hwm("after the flood");
    let after_flood = min_round(&swarm);
    // The nodes go on training; their peak memory is read just before they are stopped.
    assert!(
        wait_until(Duration::from_secs(300), || min_round(&swarm)
            >= after_flood + 2),
        "the nodes stopped making progress after the flood (round {after_flood})"
    );
    let peak = hwm("at the end");
    println!(
        "rounds: replay from {start}, flood from {round_before_flood} to {after_flood}, end {}",
        min_round(&swarm)
    );
    for (i, kib) in peak.iter().enumerate() {
        assert!(
            *kib < MAX_NODE_HWM_KIB,
            "node {i} peaked at {kib} KiB (before the attacks {} KiB, after the flood {} KiB)",
            before[i],
            during[i]
        );
    }
    stop_nodes(&swarm, &mut nodes, 0);
    assert_unmoved(&swarm, &[hostile_peer], &BTreeSet::new());
    println!("scenario took {:.0} s", t0.elapsed().as_secs_f64());
}
