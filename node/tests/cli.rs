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
    for cmd in ["demo", "swarm", "bootstrap", "run", "keygen"] {
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
    let missing = nightshift(&[
        "run",
        "--bootstrap",
        "/ip4/127.0.0.1/tcp/1",
        "--manifest",
        "/nonexistent.json",
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
