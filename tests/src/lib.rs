//! Helpers for the integration tests: build a swarm with the real `nightshift` binary, start
//! bootstrap and trainer processes on 127.0.0.1, and read their events.
//!
//! The binary is the one cargo built next to the test executable (`target/<profile>/nightshift`);
//! `cargo test --workspace` builds it because `nightshift-node` has integration tests of its own.

pub mod netns;
pub mod probe;

use nightshift_node::events::{NodeEvent, read_events};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the `nightshift` binary built for this test run.
pub fn nightshift_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NIGHTSHIFT_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let bin = profile_dir.join("nightshift");
    assert!(
        bin.exists(),
        "{} not built; run `cargo test --workspace`",
        bin.display()
    );
    bin
}

/// A child process that is killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Proc {
    /// Sends SIGKILL and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for the process to exit, up to `timeout`; returns its success.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<bool> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.success());
            }
            pause();
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for every process to exit successfully, each within `timeout`; names the first that
/// does not.
pub fn assert_all_finish(procs: &mut [&mut Proc], timeout: Duration) {
    for p in procs.iter_mut() {
        assert_eq!(
            p.wait_exit(timeout),
            Some(true),
            "{} did not finish cleanly",
            p.name
        );
    }
}

/// Runs the binary to completion and returns stdout.
pub fn run_ok(args: &[&str]) -> String {
    let out = Command::new(nightshift_bin())
        .args(args)
        .output()
        .expect("run nightshift");
    assert!(
        out.status.success(),
        "nightshift {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts the binary with its output in `dir/<name>.log`.
pub fn spawn(dir: &Path, name: &str, args: &[String]) -> Proc {
    spawn_cmd(Command::new(nightshift_bin()), dir, name, args)
}

/// Starts the binary inside network namespace `ns` (`ip netns exec`), its output in
/// `dir/<name>.log`.
pub fn spawn_in(ns: &str, dir: &Path, name: &str, args: &[String]) -> Proc {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns]).arg(nightshift_bin());
    spawn_cmd(cmd, dir, name, args)
}

fn spawn_cmd(mut cmd: Command, dir: &Path, name: &str, args: &[String]) -> Proc {
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let child = cmd
        .args(args)
        .env("NIGHTSHIFT_LOG", "info,nightshift_node=debug")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("start nightshift");
    Proc {
        child,
        name: name.into(),
    }
}

/// Polls `cond` until it holds or `timeout` passes (files written by other processes have no
/// event to wait on).
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        pause();
    }
    cond()
}

fn pause() {
    std::thread::sleep(Duration::from_millis(50));
}

/// A private test swarm: keys for `nodes` trainers and a manifest that allows exactly them.
pub struct TestSwarm {
    pub dir: PathBuf,
    pub manifest: PathBuf,
    pub nodes: usize,
}

impl TestSwarm {
    /// Writes keys and a manifest (tiny model) into `dir`. `extra` goes to `swarm init`.
    pub fn create(dir: &Path, nodes: usize, extra: &[&str]) -> Self {
        let mut allow = vec![];
        for i in 0..nodes {
            let k = dir.join(format!("node{i}.key.json"));
            run_ok(&["keygen", "--out", k.to_str().unwrap()]);
            allow.push(k);
        }
        let manifest = dir.join("manifest.json");
        let mut args: Vec<String> = [
            "swarm",
            "init",
            "--out",
            manifest.to_str().unwrap(),
            "--preset",
            "tiny",
            "--name",
            "test",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for k in &allow {
            args.push("--allow".into());
            args.push(k.display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        run_ok(&args);
        TestSwarm {
            dir: dir.to_path_buf(),
            manifest,
            nodes,
        }
    }

    /// Starts the bootstrap node and returns it with its full address.
    pub fn bootstrap(&self) -> (Proc, String) {
        let addr_file = self.dir.join("bootstrap.addr");
        let p = spawn(
            &self.dir,
            "bootstrap",
            &[
                "bootstrap".into(),
                "--manifest".into(),
                self.manifest.display().to_string(),
                "--listen".into(),
                "/ip4/127.0.0.1/tcp/0".into(),
                "--addr-file".into(),
                addr_file.display().to_string(),
                "--data-dir".into(),
                self.dir.join("bootstrap").display().to_string(),
            ],
        );
        assert!(
            wait_until(Duration::from_secs(30), || addr_file.exists()),
            "bootstrap did not come up"
        );
        let addr = std::fs::read_to_string(&addr_file)
            .unwrap()
            .trim()
            .to_string();
        (p, addr)
    }

    /// Events file of node `i`.
    pub fn events_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}.events.jsonl"))
    }

    /// Starts trainer `i` knowing only the bootstrap address, always idle.
    pub fn node(&self, i: usize, bootstrap: &str, rounds: u64) -> Proc {
        self.node_with(i, bootstrap, rounds, &["--idle", "always"])
    }

    /// Starts trainer `i` with `extra` arguments (which must say `--idle SPEC`: the default,
    /// `auto`, reads this shared machine's CPU load).
    pub fn node_with(&self, i: usize, bootstrap: &str, rounds: u64, extra: &[&str]) -> Proc {
        let args = self.node_args(i, bootstrap, rounds, extra);
        spawn(
            &self.dir,
            &format!("node{i}-{}", Instant::now().elapsed().as_nanos()),
            &args,
        )
    }

    /// The `run` arguments of trainer `i` (listening on 127.0.0.1 unless `extra` says
    /// `--listen`).
    pub fn node_args(&self, i: usize, bootstrap: &str, rounds: u64, extra: &[&str]) -> Vec<String> {
        let listen = extra
            .iter()
            .position(|a| *a == "--listen")
            .and_then(|p| extra.get(p + 1))
            .copied()
            .unwrap_or("/ip4/127.0.0.1/tcp/0");
        let extra: Vec<&str> = match extra.iter().position(|a| *a == "--listen") {
            Some(p) => extra[..p]
                .iter()
                .chain(&extra[(p + 2).min(extra.len())..])
                .copied()
                .collect(),
            None => extra.to_vec(),
        };
        let mut args: Vec<String> = vec![
            "run".into(),
            "--manifest".into(),
            self.manifest.display().to_string(),
            "--key".into(),
            self.dir
                .join(format!("node{i}.key.json"))
                .display()
                .to_string(),
            "--bootstrap".into(),
            bootstrap.into(),
            "--listen".into(),
            listen.into(),
            "--data-dir".into(),
            self.dir.join(format!("node{i}")).display().to_string(),
            "--rounds".into(),
            rounds.to_string(),
            "--events".into(),
            self.events_path(i).display().to_string(),
        ];
        if !extra.contains(&"--min-peers") {
            args.extend(["--min-peers".into(), (self.nodes - 1).to_string()]);
        }
        args.extend(extra.iter().map(|a| (*a).to_string()));
        args
    }

    /// Node `i`'s events so far.
    pub fn events(&self, i: usize) -> Vec<NodeEvent> {
        read_events(&self.events_path(i))
    }

    /// The highest round node `i` has completed or synced to.
    pub fn round_of(&self, i: usize) -> u64 {
        self.events(i)
            .iter()
            .filter_map(|e| match e {
                NodeEvent::RoundCompleted(r) => Some(r.round),
                NodeEvent::Synced { round, .. } => Some(*round),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Forks per round among nodes `0..n`: distinct states any of them ever held for the round,
    /// less one — a divergence that `align` repaired counts
    /// ([`nightshift_node::events::forks_per_round`]).
    pub fn forks(&self, n: usize) -> std::collections::BTreeMap<u64, usize> {
        let all: Vec<Vec<NodeEvent>> = (0..n).map(|i| self.events(i)).collect();
        nightshift_node::events::forks_per_round(all.iter().map(Vec::as_slice))
    }

    /// Node `i`'s final state hash per round (the last completion or sync of that round).
    pub fn hashes(&self, i: usize) -> std::collections::BTreeMap<u64, String> {
        let mut m = std::collections::BTreeMap::new();
        for e in self.events(i) {
            match e {
                NodeEvent::RoundCompleted(r) => {
                    m.insert(r.round, r.state_hash);
                }
                NodeEvent::Synced {
                    round, state_hash, ..
                } => {
                    m.insert(round, state_hash);
                }
                _ => {}
            }
        }
        m
    }

    /// Asserts that nodes `0..n` hold the same state for every round `1..=rounds`.
    pub fn assert_agree(&self, n: usize, rounds: u64) {
        let h: Vec<_> = (0..n).map(|i| self.hashes(i)).collect();
        for round in 1..=rounds {
            let r0 = h[0]
                .get(&round)
                .unwrap_or_else(|| panic!("node 0 has no state for round {round}"));
            for (i, hi) in h.iter().enumerate().skip(1) {
                assert_eq!(
                    hi.get(&round),
                    Some(r0),
                    "node {i} disagrees at round {round}"
                );
            }
        }
    }
}

/// The validation loss a node started from and the one of its last completed round.
pub fn val_losses(events: &[NodeEvent]) -> (Option<f32>, Option<f32>) {
    let initial = events.iter().find_map(|e| match e {
        NodeEvent::Started { val_loss, .. } => Some(*val_loss),
        _ => None,
    });
    let last = events.iter().rev().find_map(|e| match e {
        NodeEvent::RoundCompleted(r) => Some(r.val_loss),
        _ => None,
    });
    (initial, last)
}
