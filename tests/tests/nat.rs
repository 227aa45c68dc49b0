//! Two home machines, each behind its own NAT (network namespaces with masquerading routers that
//! let in only replies), and a bootstrap node on a public address: the only machine both can
//! reach. Real processes, real sockets, real NATs (Linux's conntrack).
//!
//! Needs root, iproute2 and iptables (`.ci/run` installs them).

use nightshift_node::events::NodeEvent;
use nightshift_tests::netns::{Nat, NatLab, PUBLIC_IP};
use nightshift_tests::{Proc, TestSwarm, assert_all_finish, nightshift_bin, spawn_in, wait_until};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

fn lab(tag: &str, nat: Nat) -> NatLab {
    let prefix = format!("nst{}{tag}", std::process::id() % 100_000);
    NatLab::new(&prefix, 2, nat).unwrap_or_else(|e| panic!("{e}"))
}

/// The bootstrap node on the public host; returns it with its address.
fn bootstrap(lab: &NatLab, swarm: &TestSwarm) -> (Proc, String) {
    let addr_file = swarm.dir.join("bootstrap.addr");
    let p = spawn_in(
        &lab.ns("pub"),
        &swarm.dir,
        "bootstrap",
        &[
            "bootstrap".into(),
            "--manifest".into(),
            swarm.manifest.display().to_string(),
            "--listen".into(),
            format!("/ip4/{PUBLIC_IP}/tcp/4001"),
            "--addr-file".into(),
            addr_file.display().to_string(),
            "--data-dir".into(),
            swarm.dir.join("bootstrap").display().to_string(),
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || addr_file.exists()),
        "bootstrap did not come up"
    );
    let addr = std::fs::read_to_string(&addr_file).unwrap();
    (p, addr.trim().to_string())
}

/// Trainer `i` (0-based) on home host `i + 1`, listening on port 4001 of its LAN address.
fn home_node(lab: &NatLab, swarm: &TestSwarm, i: usize, boot: &str, rounds: u64) -> Proc {
    let args = swarm.node_args(
        i,
        boot,
        rounds,
        &["--idle", "always", "--listen", "/ip4/0.0.0.0/tcp/4001"],
    );
    spawn_in(
        &lab.ns(&format!("host{}", i + 1)),
        &swarm.dir,
        &format!("node{i}"),
        &args,
    )
}

/// `nightshift status` of the node in `ns` with data directory `dir`, when it answers.
fn status(ns: &str, dir: &Path) -> Option<Value> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(nightshift_bin())
        .args(["status", "--data-dir"])
        .arg(dir)
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}

/// `nightshift doctor --json` in `ns` with node `i`'s key, probing from `listen`.
fn doctor(ns: &str, swarm: &TestSwarm, boot: &str, i: usize, listen: &str) -> Value {
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(nightshift_bin())
        .args([
            "doctor",
            "--json",
            "--wait",
            "90",
            "--listen",
            listen,
            "--bootstrap",
            boot,
        ])
        .arg("--manifest")
        .arg(&swarm.manifest)
        .arg("--key")
        .arg(swarm.dir.join(format!("node{i}.key.json")))
        .arg("--data-dir")
        .arg(swarm.dir.join(format!("doctor{i}")))
        .output()
        .expect("run nightshift doctor");
    assert!(
        out.status.success(),
        "doctor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn n(v: &Value, field: &str) -> u64 {
    v["network"][field].as_u64().unwrap_or(0)
}

/// Polls both nodes' statuses until `done` or every node has stopped answering; returns each
/// node's statuses in order.
fn watch(lab: &NatLab, swarm: &TestSwarm, timeout: Duration) -> Vec<Vec<Value>> {
    let mut seen = vec![vec![], vec![]];
    let start = Instant::now();
    let mut quiet = 0;
    while start.elapsed() < timeout && quiet < 20 {
        let mut any = false;
        for (i, s) in seen.iter_mut().enumerate() {
            let ns = lab.ns(&format!("host{}", i + 1));
            if let Some(v) = status(&ns, &swarm.dir.join(format!("node{i}"))) {
                if v.get("network").is_some() {
                    s.push(v);
                }
                any = true;
            }
        }
        quiet = if any { 0 } else { quiet + 1 };
        std::thread::sleep(Duration::from_millis(250));
    }
    seen
}

fn assert_agree(swarm: &TestSwarm, rounds: u64) {
    let h0 = swarm.hashes(0);
    let h1 = swarm.hashes(1);
    for r in 1..=rounds {
        let a = h0
            .get(&r)
            .unwrap_or_else(|| panic!("node 0 has no state for round {r}"));
        assert_eq!(h1.get(&r), Some(a), "the nodes disagree at round {r}");
    }
    let together = swarm
        .events(0)
        .iter()
        .filter(|e| matches!(e, NodeEvent::RoundCompleted(r) if r.contributors == 2))
        .count();
    assert!(
        together as u64 >= rounds - 1,
        "only {together} of {rounds} rounds had both nodes' contributions"
    );
}

/// A fresh directory, deleted at the end unless `NIGHTSHIFT_KEEP_TEST_DIR` is set (to read the
/// logs afterwards).
fn test_dir() -> (Option<tempfile::TempDir>, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    if std::env::var_os("NIGHTSHIFT_KEEP_TEST_DIR").is_some() {
        let kept = dir.keep();
        eprintln!("keeping {}", kept.display());
        return (None, kept);
    }
    let path = dir.path().to_path_buf();
    (Some(dir), path)
}

/// One NAT run: the namespaces, a swarm made with `init` flags, its bootstrap on the public
/// host and a node behind each NAT training `rounds` rounds; checks that they finished and
/// agree, and keeps their statuses and the public host's bytes.
struct PairRun {
    lab: NatLab,
    swarm: TestSwarm,
    addr: String,
    seen: Vec<Vec<Value>>,
    /// Bytes across the public host's link during the run (in, out).
    public: (u64, u64),
    _boot: Proc,
    _dir: Option<tempfile::TempDir>,
}

fn run_pair(tag: &str, nat: Nat, init: &[&str], rounds: u64) -> PairRun {
    let lab = lab(tag, nat);
    let (dir, path) = test_dir();
    let swarm = TestSwarm::create(&path, 2, init);
    let (boot, addr) = bootstrap(&lab, &swarm);
    let before = lab.public_bytes();
    let mut nodes: Vec<_> = (0..2)
        .map(|i| home_node(&lab, &swarm, i, &addr, rounds))
        .collect();
    let seen = watch(&lab, &swarm, EXIT_TIMEOUT);
    let mut all: Vec<&mut _> = nodes.iter_mut().collect();
    assert_all_finish(&mut all, EXIT_TIMEOUT);
    let after = lab.public_bytes();
    assert_agree(&swarm, rounds);
    PairRun {
        public: (after.0 - before.0, after.1 - before.1),
        lab,
        swarm,
        addr,
        seen,
        _boot: boot,
        _dir: dir,
    }
}

#[test]
fn nat_two_home_nodes_meet_through_the_bootstraps_relay_and_train_directly_after_hole_punching() {
    let rounds = 12;
    let run = run_pair("p", Nat::PortPreserving, &["--inner-steps", "10"], rounds);
    let (lab, swarm, addr, seen) = (&run.lab, &run.swarm, &run.addr, &run.seen);
    for (i, s) in seen.iter().enumerate() {
        let last = s
            .last()
            .unwrap_or_else(|| panic!("node {i} never answered status"));
        // Behind a NAT, and told so: the bootstrap could not dial it back.
        assert!(
            s.iter().any(|v| v["network"]["nat"] == "private"),
            "node {i} never learnt it is behind a NAT: {last}"
        );
        assert!(
            s.iter().any(|v| v["network"]["relayed_addresses"]
                .as_array()
                .is_some_and(|a| !a.is_empty())),
            "node {i} never held a relay reservation: {last}"
        );
        // It reached (or was reached by) the other node through the relay first ...
        assert!(
            n(last, "relayed_connections") >= 1,
            "node {i}: no relayed connection: {last}"
        );
    }
    // ... and at least one side saw the hole punch succeed, after which both stay direct: the
    // bootstrap and the other node, nothing through the relay.
    let punched: u64 = seen
        .iter()
        .filter_map(|s| s.last())
        .map(|v| n(v, "hole_punches_succeeded"))
        .sum();
    assert!(
        punched >= 1,
        "no hole punch succeeded: {:?}",
        seen.iter().map(|s| s.last()).collect::<Vec<_>>()
    );
    for (i, s) in seen.iter().enumerate() {
        assert!(
            s.iter()
                .any(|v| n(v, "direct_peers") == 2 && n(v, "relayed_peers") == 0),
            "node {i} never had a direct connection to both its peers: {:?}",
            s.last()
        );
    }
    // `doctor` on the public host: the bootstrap dials it back at once.
    let doc = doctor(&lab.ns("pub"), swarm, addr, 0, "/ip4/0.0.0.0/tcp/4002");
    assert_eq!(doc["network"]["nat"], "public", "{doc}");
    println!(
        "NAT (port-preserving): {punched} hole punches succeeded; the public host moved {} B in, {} B out over {rounds} rounds",
        run.public.0, run.public.1
    );
}

/// Routers that give every connection a new random port (symmetric NAT): the hole punch cannot
/// work, and the nodes train through the bootstrap's relay for the whole run. The swarm also has
/// a pre-shared key (TCP only, pnet under every direct connection).
#[test]
fn nat_nodes_behind_symmetric_nats_train_through_the_relay() {
    let rounds = 6;
    let run = run_pair(
        "s",
        Nat::Symmetric,
        &["--inner-steps", "10", "--private"],
        rounds,
    );
    let (lab, swarm, addr, seen) = (&run.lab, &run.swarm, &run.addr, &run.seen);
    for (i, s) in seen.iter().enumerate() {
        let last = s
            .last()
            .unwrap_or_else(|| panic!("node {i} never answered status"));
        assert_eq!(n(last, "hole_punches_succeeded"), 0, "node {i}: {last}");
        assert!(
            s.iter().all(|v| n(v, "direct_peers") <= 1),
            "node {i} had a direct connection to the other home node: {last}"
        );
        assert!(n(last, "relayed_connections") >= 1, "node {i}: {last}");
    }
    // `doctor` behind the NAT (the node has stopped): not reachable, a relay slot, what to open.
    let doc = doctor(&lab.ns("host1"), swarm, addr, 0, "/ip4/0.0.0.0/tcp/4001");
    assert_eq!(doc["network"]["nat"], "private", "{doc}");
    let advice = doc["advice"].to_string();
    assert!(
        advice.contains("through the relay at /ip4/10.9.0.2"),
        "{doc}"
    );
    assert!(advice.contains("forward the listen port"), "{doc}");
    let failed: u64 = seen
        .iter()
        .filter_map(|s| s.last())
        .map(|v| n(v, "hole_punches_failed"))
        .sum();
    println!(
        "NAT (symmetric): {failed} hole punches failed; the relay moved {} B in, {} B out over {rounds} rounds",
        run.public.0, run.public.1
    );
}
