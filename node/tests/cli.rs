//! The CLI as a user meets it. (Also makes `cargo test` build the `nightshift` binary that the
//! workspace's process-level tests start.)

use std::process::Command;

fn nightshift(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nightshift"))
        .args(args)
        .output()
        .expect("run nightshift")
}

#[test]
fn help_lists_every_command() {
    let out = nightshift(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "demo",
        "swarm",
        "bootstrap",
        "run",
        "keygen",
        "pause",
        "resume",
        "status",
        "peers",
    ] {
        assert!(text.contains(cmd), "--help lacks {cmd}:\n{text}");
    }
}

#[test]
fn swarm_init_writes_a_manifest_that_a_bad_flag_cannot_produce() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("m.json");
    let o = nightshift(&[
        "swarm",
        "init",
        "--out",
        out.to_str().unwrap(),
        "--preset",
        "tiny",
        "--codec",
        "fp16",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("swarm id: "));
    let m: nightshift_protocol::SignedManifest =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    m.verify().unwrap();
    assert_eq!(
        m.manifest.training.codec,
        nightshift_protocol::DeltaCodec::Fp16
    );

    let bad = nightshift(&[
        "swarm",
        "init",
        "--out",
        dir.path().join("x.json").to_str().unwrap(),
        "--codec",
        "zip",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown codec"));
    // A setting the manifest refuses: a clear reason, said once, and no key or manifest left.
    let refused = nightshift(&[
        "swarm",
        "init",
        "--out",
        dir.path().join("y.json").to_str().unwrap(),
        "--preset",
        "tiny",
        "--weight-decay",
        "nan",
    ]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(
        err.matches("optimiser settings must be finite").count(),
        1,
        "{err}"
    );
    assert!(!dir.path().join("y.json").exists());
    assert!(!dir.path().join("y.creator.key.json").exists(), "{err}");
    let missing = nightshift(&[
        "run",
        "--bootstrap",
        "/ip4/127.0.0.1/tcp/1",
        "--manifest",
        "/nonexistent.json",
        "--data-dir",
        dir.path().join("data").to_str().unwrap(),
    ]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read manifest"));
}

#[test]
fn keygen_refuses_to_overwrite_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let k = dir.path().join("k.json");
    assert!(
        nightshift(&["keygen", "--out", k.to_str().unwrap()])
            .status
            .success()
    );
    let again = nightshift(&["keygen", "--out", k.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("refusing to overwrite"));
}

#[test]
fn pause_without_a_running_node_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let o = nightshift(&["pause", "--data-dir", dir.path().to_str().unwrap()]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no node runs"), "{err}");
}

#[test]
fn run_refuses_an_unknown_idle_source() {
    let dir = tempfile::tempdir().unwrap();
    let o = nightshift(&[
        "run",
        "--bootstrap",
        "/ip4/127.0.0.1/tcp/1",
        "--manifest",
        "/nonexistent.json",
        "--idle",
        "sometimes",
        "--data-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(!o.status.success());
}

#[test]
fn the_benchmarks_say_where_they_went() {
    let o = nightshift(&["bench", "byzantine", "--seeds", "1"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nightshift-lab byzantine --seeds 1"), "{err}");
}

/// The demo's nodes derive their keys (which seed their batches) from `--seed`: running it again
/// with the same seed trains the same model, round by round; another seed trains another.
#[test]
fn demo_with_the_same_seed_trains_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let demo = |name: &str, seed: &str| {
        let report = dir.path().join(format!("{name}.json"));
        let o = nightshift(&[
            "demo",
            "--nodes",
            "2",
            "--rounds",
            "2",
            "--preset",
            "tiny",
            "--inner-steps",
            "4",
            "--seed",
            seed,
            "--dir",
            dir.path().join(name).to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let r: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let losses: Vec<f64> = r["rounds"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["val_loss"].as_f64().unwrap())
            .collect();
        assert_eq!(losses.len(), 2, "{r}");
        losses
    };
    let first = demo("a", "7");
    assert_eq!(demo("b", "7"), first);
    assert_ne!(demo("c", "8"), first);
}
