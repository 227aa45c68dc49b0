//! Idle windows on real nodes (processes on 127.0.0.1) driven by scripted idle sources: a window
//! closing mid-round (partial contribution, counted with its tokens), the node paused with its
//! device released and the swarm going on without it, the window opening again; a node joining
//! mid-run; SIGKILL at random moments with restarts. After every round, every live node holds
//! the same state hash.
//!
//! The scenarios run one at a time (a lock): each is a swarm of processes on a 2-core machine.

use nightshift_node::events::NodeEvent;
use nightshift_tests::{TestSwarm, assert_all_finish, run_ok, wait_until};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

static ONE_SWARM_AT_A_TIME: Mutex<()> = Mutex::new(());
const EXIT_TIMEOUT: Duration = Duration::from_secs(600);

/// A scratch directory, kept (and printed) when `NIGHTSHIFT_KEEP_TEST_DIRS` is set.
fn scratch() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("NIGHTSHIFT_KEEP_TEST_DIRS").is_some() {
        let p = dir.keep();
        eprintln!("test directory: {}", p.display());
        return (None, p);
    }
    let p = dir.path().to_path_buf();
    (Some(dir), p)
}

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_SWARM_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Keys and a manifest for three trainers of the tiny model with H = `inner_steps` (a 5-step
/// warm-up; a 120 s deadline, so that only a stalled swarm ever reaches it), and a fourth
/// allowed key, `watcher.key.json`, for `nightshift peers` to look in with (the swarm's nodes
/// refuse keys outside its allowlist).
fn three_nodes(dir: &Path, inner_steps: &str) -> TestSwarm {
    let watcher = dir.join("watcher.key.json");
    run_ok(&["keygen", "--out", watcher.to_str().unwrap()]);
    TestSwarm::create(
        dir,
        3,
        &[
            "--inner-steps",
            inner_steps,
            "--warmup-steps",
            "5",
            "--deadline-secs",
            "120",
            "--allow",
            watcher.to_str().unwrap(),
            "--attest-quorum",
            "1",
        ],
    )
}

/// First 6 bytes (hex) of node `i`'s public key: how round records name senders.
fn short_key(swarm: &TestSwarm, i: usize) -> String {
    let text = std::fs::read_to_string(swarm.dir.join(format!("node{i}.key.json"))).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["public"].as_str().unwrap()[..12].to_string()
}

fn set_idle(path: &Path, idle: bool) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, if idle { "idle\n" } else { "busy\n" }).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Every pair of nodes agrees on the state of every round both reached.
fn assert_agreement(swarm: &TestSwarm, nodes: usize) {
    let h: Vec<_> = (0..nodes).map(|i| swarm.hashes(i)).collect();
    for (i, hi) in h.iter().enumerate() {
        for (j, hj) in h.iter().enumerate().skip(i + 1) {
            for (round, hash) in hi {
                if let Some(other) = hj.get(round) {
                    assert_eq!(hash, other, "nodes {i} and {j} disagree at round {round}");
                }
            }
        }
    }
}

fn completed(swarm: &TestSwarm, i: usize) -> Vec<nightshift_node::events::RoundRecord> {
    swarm
        .events(i)
        .into_iter()
        .filter_map(|e| match e {
            NodeEvent::RoundCompleted(r) => Some(r),
            _ => None,
        })
        .collect()
}

#[test]
fn a_closing_window_yields_a_partial_contribution_and_the_node_rejoins_when_idle() {
    let _one = serial();
    let (_keep, dir) = scratch();
    let swarm = three_nodes(&dir, "200");
    let (_boot, addr) = swarm.bootstrap();
    let idle_file = dir.join("node2.idle");
    set_idle(&idle_file, true);
    let spec = format!("file:{}", idle_file.display());
    // Enough rounds that the swarm is still training when node 2 comes back: the checks while
    // it is paused (`status`, `peers`, two-contributor rounds) take several rounds' time.
    let rounds = 14;
    let mut n0 = swarm.node(0, &addr, rounds);
    let mut n1 = swarm.node(1, &addr, rounds);
    let mut n2 = swarm.node_with(2, &addr, rounds, &["--idle", &spec, "--idle-after", "0"]);
    let me2 = short_key(&swarm, 2);

    // Close node 2's window in the middle of its training from θ(2): a moment after it began
    // (the first steps take milliseconds; 200 take about a second on 2 shared cores).
    assert!(
        wait_until(Duration::from_secs(300), || swarm.events(2).iter().any(
            |e| matches!(e, NodeEvent::Training { round, .. } if *round >= 2)
        )),
        "node 2 did not start training round 2"
    );
    std::thread::sleep(Duration::from_millis(300));
    set_idle(&idle_file, false);
    assert!(
        wait_until(Duration::from_secs(60), || swarm
            .events(2)
            .iter()
            .any(|e| matches!(e, NodeEvent::Paused { .. }))),
        "node 2 did not pause"
    );
    let yielded = swarm.events(2).into_iter().find_map(|e| match e {
        NodeEvent::Yielded {
            round,
            steps,
            tokens,
            latency_ms,
            ..
        } => Some((round, steps, tokens, latency_ms)),
        _ => None,
    });
    let (y_round, y_steps, y_tokens, latency_ms) = yielded.expect("node 2 reported no yield");
    assert!(
        y_steps > 0 && y_steps < 200,
        "yielded after {y_steps} of 200 steps"
    );
    assert!(latency_ms >= 0.0);

    // While node 2 is paused it reports so on its control endpoint.
    let status = run_ok(&[
        "status",
        "--data-dir",
        swarm.dir.join("node2").to_str().unwrap(),
    ]);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["idle"], serde_json::json!(false), "{status}");

    // `nightshift peers` lists the swarm's nodes with their signed windows: node 2's is busy.
    let peers = run_ok(&[
        "peers",
        "--bootstrap",
        &addr,
        "--manifest",
        swarm.manifest.to_str().unwrap(),
        "--key",
        dir.join("watcher.key.json").to_str().unwrap(),
        "--json",
        "--wait",
        "3",
    ]);
    let peers: serde_json::Value = serde_json::from_str(&peers).unwrap();
    let windows: Vec<&serde_json::Value> = peers
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "trainer")
        .filter_map(|p| p.get("window").filter(|w| !w.is_null()))
        .collect();
    assert!(
        windows.len() >= 2,
        "peers found {} trainer windows: {peers}",
        windows.len()
    );
    assert!(
        windows.iter().any(|w| w["state"] == "Busy"),
        "no busy window among {peers}"
    );
    // The training nodes (two rounds in) advertise the speed they measured, not 0.
    let training: Vec<_> = windows
        .iter()
        .filter(|w| w["state"] == "Training")
        .collect();
    assert!(
        !training.is_empty()
            && training
                .iter()
                .all(|w| w["tokens_per_sec"].as_f64().is_some_and(|t| t > 0.0)),
        "a training window without its speed among {peers}"
    );
    // The swarm does not wait for a paused node: a round completes with two contributors.
    assert!(
        wait_until(Duration::from_secs(200), || completed(&swarm, 0)
            .iter()
            .any(|r| r.round > y_round + 1 && r.contributors == 2)),
        "the others did not go on without the paused node"
    );
    // Open the window again: node 2 catches up and contributes again.
    set_idle(&idle_file, true);
    assert_all_finish(&mut [&mut n0, &mut n1, &mut n2], EXIT_TIMEOUT);
    let ev2 = swarm.events(2);
    assert!(
        ev2.iter().any(|e| matches!(e, NodeEvent::Resumed { .. })),
        "node 2 did not resume"
    );
    // The partial contribution was averaged with its own weight (its tokens, not a full
    // round's), by every node.
    let r0 = completed(&swarm, 0);
    let with_partial = r0
        .iter()
        .find(|r| r.round == y_round + 1)
        .expect("node 0 completed the round of the yield");
    let w2 = with_partial.weights.iter().find(|(k, _)| *k == me2);
    assert_eq!(
        w2.map(|(_, t)| *t),
        Some(y_tokens),
        "round {} weights: {:?}",
        y_round + 1,
        with_partial.weights
    );
    let full = with_partial
        .weights
        .iter()
        .filter(|(k, _)| *k != me2)
        .map(|(_, t)| *t)
        .max()
        .unwrap();
    assert!(y_tokens < full, "partial {y_tokens} vs full {full}");
    // It contributed again after resuming.
    assert!(
        r0.iter()
            .any(|r| r.round > y_round + 2 && r.weights.iter().any(|(k, _)| *k == me2)),
        "node 2 never contributed after resuming: {:?}",
        r0.iter()
            .map(|r| (r.round, r.contributors))
            .collect::<Vec<_>>()
    );
    assert_agreement(&swarm, 3);
    assert_eq!(swarm.hashes(2).get(&rounds), swarm.hashes(0).get(&rounds));
}

#[test]
fn a_node_joining_mid_run_syncs_and_contributes_in_the_next_round() {
    let _one = serial();
    let (_keep, dir) = scratch();
    let swarm = three_nodes(&dir, "200");
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 14;
    let mut n0 = swarm.node_with(0, &addr, rounds, &["--idle", "always", "--min-peers", "1"]);
    let mut n1 = swarm.node_with(1, &addr, rounds, &["--idle", "always", "--min-peers", "1"]);
    assert!(
        wait_until(Duration::from_secs(300), || swarm.round_of(0) >= 5),
        "the first two nodes did not reach round 5"
    );
    let mut n2 = swarm.node_with(2, &addr, rounds, &["--idle", "always", "--min-peers", "1"]);
    assert_all_finish(&mut [&mut n0, &mut n1, &mut n2], EXIT_TIMEOUT);
    let ev2 = swarm.events(2);
    let first_sync = ev2
        .iter()
        .find_map(|e| match e {
            NodeEvent::Synced { round, bytes, .. } => Some((*round, *bytes)),
            _ => None,
        })
        .expect("the joiner never synced");
    assert!(first_sync.0 >= 5, "joined at round {}", first_sync.0);
    assert!(first_sync.1 > 0, "nothing was downloaded");
    // It contributes to the round that starts after its sync: at the latest the one after
    // the round that was under way when it synced.
    let me2 = short_key(&swarm, 2);
    let first_contribution = completed(&swarm, 0)
        .into_iter()
        .filter(|r| r.weights.iter().any(|(k, _)| *k == me2))
        .map(|r| r.round)
        .min()
        .expect("the joiner never contributed");
    assert!(
        first_contribution <= first_sync.0 + 2,
        "synced to round {} but first contributed to round {first_contribution}",
        first_sync.0
    );
    assert_agreement(&swarm, 3);
    assert_eq!(swarm.hashes(2).get(&rounds), swarm.hashes(0).get(&rounds));
}

#[test]
fn sigkill_at_random_moments_loses_no_completed_round() {
    let _one = serial();
    let (_keep, dir) = scratch();
    let swarm = three_nodes(&dir, "40");
    let (_boot, addr) = swarm.bootstrap();
    let rounds = 12;
    let mut n0 = swarm.node(0, &addr, rounds);
    let mut n1 = swarm.node(1, &addr, rounds);
    let mut n2 = swarm.node(2, &addr, rounds);
    assert!(
        wait_until(Duration::from_secs(300), || swarm.round_of(0) >= 1),
        "the swarm did not start"
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill schedule seed {seed}");
    let mut x = seed | 1;
    for _ in 0..3 {
        // xorshift: a random delay of 0.2–4 s, so kills land in training, collection, or the
        // checkpoint write.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(200 + x % 3800));
        if swarm.round_of(0) >= rounds - 2 {
            break;
        }
        let before = swarm.round_of(2);
        n2.kill9();
        n2 = swarm.node(2, &addr, rounds);
        assert!(
            wait_until(Duration::from_secs(60), || swarm.events(2).iter().any(
                |e| matches!(e, NodeEvent::Started { resumed: true, round, .. } if *round >= before)
            )),
            "node 2 did not resume from its last completed round {before}"
        );
    }
    assert_all_finish(&mut [&mut n0, &mut n1, &mut n2], EXIT_TIMEOUT);
    assert_agreement(&swarm, 3);
    for i in 1..3 {
        assert_eq!(swarm.hashes(i).get(&rounds), swarm.hashes(0).get(&rounds));
    }
    // Old checkpoints were pruned: at most three on disk.
    drop(n2);
    let store = nightshift_node::store::Store::open(&swarm.dir.join("node2").join("db")).unwrap();
    let kept = store.checkpoint_rounds().unwrap();
    assert!(
        !kept.is_empty() && kept.len() <= nightshift_node::store::KEEP_CHECKPOINTS,
        "{kept:?}"
    );
    assert_eq!(kept.last(), Some(&rounds));
}
