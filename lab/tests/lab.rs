//! The lab's commands end to end, as a person running the benchmarks meets them.

use std::process::Command;

fn lab(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nightshift-lab"))
        .args(args)
        .output()
        .expect("run nightshift-lab")
}

/// A short churn benchmark end to end: the churning pool yields, nobody loses a round, every
/// round ends agreed, the always-on swarm never forks, and the JSON report has the fields
/// scripts read.
#[test]
fn churn_reports_yields_joins_and_no_lost_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("churn.json");
    let o = lab(&[
        "churn",
        "--preset",
        "tiny",
        "--inner-steps",
        "40",
        "--nodes",
        "2",
        "--runs",
        "stable-half,churn",
        "--max-secs",
        "16",
        "--period-secs",
        "5",
        "--dir",
        dir.path().join("work").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The file records what produced it: the commit and every flag.
    assert!(
        file["commit"].as_str().is_some_and(|c| !c.is_empty()),
        "{file}"
    );
    assert_eq!(file["config"]["max_secs"], 16.0, "{file}");
    let runs = file["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    let churn = runs.iter().find(|r| r["name"] == "churn").unwrap();
    for field in [
        "time_to_target_secs",
        "yield_p50_ms",
        "yield_p99_ms",
        "join_sync_secs",
        "recovery_secs",
        "curve",
    ] {
        assert!(churn.get(field).is_some(), "no {field} in {churn}");
    }
    // Windows closed and the nodes gave the machine back: mid-training (a yield, timed) or
    // between rounds (a pause), as the cycles fell.
    let gave_back = churn["yields"].as_u64().unwrap() + churn["pauses"].as_u64().unwrap();
    assert!(gave_back > 0, "{churn}");
    assert_eq!(churn["rounds_lost"], 0);
    assert_eq!(churn["rounds_disagreeing"], 0);
    assert!(churn["forks"].as_u64().is_some(), "{churn}");
    let stable = runs.iter().find(|r| r["name"] == "stable-half").unwrap();
    assert_eq!(stable["forks"], 0, "an always-on swarm forked: {stable}");
    assert_eq!(stable["rounds_disagreeing"], 0);
    assert!(churn["curve"].as_array().unwrap().len() > 2);
}

#[test]
fn report_joins_runs_written_by_separate_processes() {
    let dir = tempfile::tempdir().unwrap();
    let path = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
    // A grid split over two processes, as on a machine with two cores.
    for (runs, json) in [("single,sync", "base.json"), ("diloco", "diloco.json")] {
        let o = lab(&[
            "convergence",
            "--preset",
            "tiny",
            "--steps",
            "20",
            "--inner-steps",
            "10",
            "--val-batches",
            "2",
            "--runs",
            runs,
            "--k",
            "2",
            "--base-k",
            "2",
            "--h",
            "10",
            "--json",
            &path(json),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let o = lab(&[
        "report",
        &path("base.json"),
        &path("diloco.json"),
        "--plot",
        &path("all.svg"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for run in ["single T=20", "sync k=2", "diloco k=2 h=10"] {
        assert!(text.contains(run), "no {run} in:\n{text}");
    }
    // The comparison needs both files: DiLoCo from one, sync (at equal tokens) from the other.
    assert!(text.contains("x sync's"), "{text}");
    let svg = std::fs::read_to_string(path("all.svg")).unwrap();
    assert!(svg.contains("diloco k=2 h=10") && svg.contains("sync k=2"));
    // Each file records the commit and every flag that produced it.
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path("diloco.json")).unwrap()).unwrap();
    assert!(
        file["commit"].as_str().is_some_and(|c| !c.is_empty()),
        "{file}"
    );
    assert_eq!(file["config"]["steps"], 20);
    assert_eq!(file["config"]["recipe"]["preset"], "tiny");
    // Files written before the configuration was recorded (a bare list of runs) still read.
    let old = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/bench/grid/sixteenth/h25-m07-whole-diloco-s42.json"
    );
    let o = lab(&["report", old]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("diloco k=4 h=25"));

    std::fs::write(path("bad.json"), "{\"not\": \"runs\"}").unwrap();
    for (file, says) in [
        ("missing.json", "cannot read"),
        (
            "bad.json",
            "is not the JSON of `nightshift-lab convergence --json`",
        ),
    ] {
        let o = lab(&["report", &path(file)]);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{file}: {err}");
    }
}

/// `scale` end to end: each swarm size as real processes and in the simulator, with the fields
/// scripts read, every swarm agreeing at its last round.
#[test]
fn scale_measures_each_swarm_size_as_processes_and_in_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("scale.json");
    let o = lab(&[
        "scale",
        "--nodes",
        "2,3",
        "--sim-nodes",
        "6",
        "--rounds",
        "3",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(file["commit"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(file["config"]["rounds"], 3);
    let runs = file["runs"].as_array().unwrap();
    let sizes: Vec<(u64, &str)> = runs
        .iter()
        .map(|r| (r["nodes"].as_u64().unwrap(), r["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        sizes,
        [(2, "processes"), (3, "processes"), (6, "simulator")],
        "{file}"
    );
    for r in runs {
        for field in [
            "bytes_up_per_node_per_round",
            "bytes_down_per_node_per_round",
        ] {
            assert!(r[field].as_u64().unwrap() > 0, "{field} in {r}");
        }
        assert!(r["round_secs"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["distinct_final_states"], 1, "{r}");
    }
}

/// `links` end to end over the emulated WAN (root, iproute2 and /dev/net/tun, as in CI): a
/// round over 1 Mbit/s links takes clearly longer than over 100 Mbit/s ones, the same seed
/// trains the same model over both, with overlap and without, and the JSON has the fields the
/// issue names.
#[test]
fn links_times_rounds_over_slow_and_fast_emulated_links() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("links.json");
    let o = lab(&[
        "links",
        "--mbps",
        "1,100",
        "--loss-mbps",
        "0",
        "--inner-steps",
        "2",
        "--rounds",
        "3",
        "--overlap",
        "false,true",
        "--json",
        json.to_str().unwrap(),
        "--dir",
        dir.path().join("runs").to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(file["commit"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(file["config"]["seed"], 42);
    let runs = file["runs"].as_array().unwrap();
    // 1 Mbit/s without and with overlap, then 100 Mbit/s.
    assert_eq!(runs.len(), 4, "{file}");
    for (r, overlap) in runs.iter().zip([false, true, false, true]) {
        assert_eq!(r["overlap"], overlap, "{r}");
    }
    for r in runs {
        for field in [
            "mbps",
            "rtt_ms",
            "loss_pct",
            "nodes",
            "overlap",
            "utilization",
            "secs_to_target",
            "bytes_up_per_node_per_round",
        ] {
            assert!(r.get(field).is_some(), "no {field} in {r}");
        }
        let u = r["utilization"].as_f64().unwrap();
        assert!(u > 0.0 && u <= 1.0, "{r}");
        assert!(
            r["bytes_up_per_node_per_round"].as_u64().unwrap() > 100_000,
            "{r}"
        );
    }
    let secs = |i: usize| runs[i]["round_secs"].as_f64().unwrap();
    assert!(
        secs(0) > 2.0 * secs(2),
        "a round over 1 Mbit/s links ({} s) is not clearly slower than over 100 Mbit/s ({} s)",
        secs(0),
        secs(2)
    );
    for (slow, fast) in [(0, 2), (1, 3)] {
        assert_eq!(
            runs[slow]["final_val_loss"],
            runs[fast]["final_val_loss"],
            "{file}\nthe nodes' rounds:\n{}",
            rounds_of_every_run(&dir.path().join("runs"))
        );
    }
}

/// Every node's completed rounds in every run under `dir` (what a failure needs to be read).
fn rounds_of_every_run(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut runs: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    runs.sort();
    for run in runs {
        for node in 0..2 {
            let events = run.join(format!("node{node}.events.jsonl"));
            for line in std::fs::read_to_string(&events).unwrap_or_default().lines() {
                if line.contains("round_completed") || line.contains("yield") {
                    out += &format!("{} node{node}: {line}\n", run.display());
                }
            }
            let log = run.join(format!("node{node}.log"));
            for line in std::fs::read_to_string(&log).unwrap_or_default().lines() {
                if line.contains("budget") || line.contains("WARN") {
                    out += &format!("{} node{node}: {line}\n", run.display());
                }
            }
        }
    }
    out
}
