//! `nightshift export` and `nightshift sample` on what a real swarm trained.

use nightshift_node::events::NodeEvent;
use nightshift_tests::*;
use std::path::Path;
use std::time::Duration;

const EXIT_TIMEOUT: Duration = Duration::from_secs(300);

/// The JSON header of a safetensors file (after its 8-byte little-endian length).
fn safetensors_header(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn a_trained_model_exports_in_the_gpt2_layout_and_samples_the_same_text_from_either_place() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &["--inner-steps", "15", "--warmup-steps", "5"],
    );
    let (_boot, addr) = swarm.bootstrap();
    let mut nodes: Vec<_> = (0..2).map(|i| swarm.node(i, &addr, 3)).collect();
    let mut all: Vec<&mut _> = nodes.iter_mut().collect();
    assert_all_finish(&mut all, EXIT_TIMEOUT);
    let data_dir = dir.path().join("node0");
    let out = dir.path().join("export");
    let said = run_ok(&[
        "export",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(said.contains("exported round 3"), "{said}");

    // What the node agreed on last is what was exported.
    let about = read_json(&out.join("nightshift.json"));
    assert_eq!(about["round"], 3);
    assert_eq!(
        Some(about["state_hash"].as_str().unwrap().to_string()),
        swarm.hashes(0).get(&3).cloned(),
        "the export is not the swarm's state of round 3"
    );
    let loss = about["check"]["loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0, "reference loss {loss}");
    let vocab = about["vocab"].as_array().unwrap().len();

    // GPT-2's names and layouts: Conv1D [in, out] in the blocks, nn.Linear [out, in] for the head.
    let config = read_json(&out.join("config.json"));
    assert_eq!(config["model_type"], "gpt2");
    assert_eq!(config["vocab_size"], vocab);
    let d = config["n_embd"].as_u64().unwrap();
    let header = safetensors_header(&out.join("model.safetensors"));
    assert_eq!(header["__metadata__"]["format"], "pt");
    assert_eq!(header["lm_head.weight"]["dtype"], "F32");
    assert_eq!(
        header["lm_head.weight"]["shape"],
        serde_json::json!([vocab, d])
    );
    assert_eq!(
        header["transformer.h.0.attn.c_attn.weight"]["shape"],
        serde_json::json!([d, 3 * d])
    );
    assert_eq!(
        header["transformer.wpe.weight"]["shape"],
        serde_json::json!([config["n_positions"], d])
    );
    let tokenizer = read_json(&out.join("tokenizer.json"));
    assert_eq!(
        tokenizer["model"]["vocab"].as_object().unwrap().len(),
        vocab
    );

    // The export holds the very model: the same seed samples the same text from both.
    let sample = |from: &str, path: &Path, seed: &str| {
        run_ok(&[
            "sample",
            from,
            path.to_str().unwrap(),
            "--prompt",
            "the ",
            "--tokens",
            "80",
            "--seed",
            seed,
        ])
    };
    let a = sample("--data-dir", &data_dir, "7");
    assert!(a.starts_with("the "), "{a}");
    assert!(a.trim_end().len() > 40, "{a:?}");
    assert_eq!(a, sample("--model", &out, "7"));
    assert_eq!(a, sample("--data-dir", &data_dir, "7"));
    assert_ne!(a, sample("--data-dir", &data_dir, "8"));

    // Places that hold no model say so.
    let empty = dir.path().join("nothing-here");
    std::fs::create_dir_all(&empty).unwrap();
    let o = std::process::Command::new(nightshift_bin())
        .args(["export", "--data-dir", empty.to_str().unwrap(), "--out"])
        .arg(dir.path().join("x"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("holds no node data"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = std::process::Command::new(nightshift_bin())
        .args(["sample", "--model", empty.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("config.json"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_running_node_exports_and_samples_the_state_it_holds_without_being_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &["--inner-steps", "10", "--warmup-steps", "5"],
    );
    let (_boot, addr) = swarm.bootstrap();
    // More rounds than the test waits for: the nodes are still training when it exports.
    let _nodes: Vec<_> = (0..2).map(|i| swarm.node(i, &addr, 1000)).collect();
    assert!(
        wait_until(EXIT_TIMEOUT, || swarm.hashes(0).contains_key(&2)),
        "node 0 did not reach round 2"
    );
    let data_dir = dir.path().join("node0");
    let out = dir.path().join("export");
    let said = run_ok(&[
        "export",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    // The state the node held when asked: one of the states it reported.
    let about = read_json(&out.join("nightshift.json"));
    let round = about["round"].as_u64().unwrap();
    assert!(round >= 2, "{about}");
    assert!(said.contains(&format!("exported round {round}")), "{said}");
    let hash = about["state_hash"].as_str().unwrap().to_string();
    assert!(
        wait_until(Duration::from_secs(30), || swarm.hashes(0).get(&round)
            == Some(&hash)),
        "the export is not node 0's state of round {round}: {:?}",
        swarm.hashes(0)
    );
    assert!(out.join("model.safetensors").is_file());
    // `sample` reads a running node the same way.
    let text = run_ok(&[
        "sample",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--prompt",
        "the ",
        "--tokens",
        "20",
    ]);
    assert!(text.starts_with("the "), "{text}");
}

/// A dataset of several files: two text files and a JSON-lines file of documents, cut from the
/// Shakespeare corpus.
fn write_dataset(dir: &Path) {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/data/shakespeare.txt"),
    )
    .unwrap();
    // Cut at line ends, so every piece is whole lines of UTF-8.
    let lines: Vec<&str> = text.lines().collect();
    let piece = |from: usize, to: usize| lines[from..to].join("\n") + "\n";
    std::fs::create_dir_all(dir.join("plays")).unwrap();
    std::fs::write(dir.join("plays/a.txt"), piece(0, 6000)).unwrap();
    std::fs::write(dir.join("plays/b.txt"), piece(6000, 12000)).unwrap();
    let docs: String = lines[12000..18000]
        .chunks(40)
        .map(|c| serde_json::json!({ "text": c.join("\n"), "id": 1 }).to_string() + "\n")
        .collect();
    std::fs::write(dir.join("scenes.jsonl"), docs).unwrap();
    // Files that are not data are left out.
    std::fs::write(dir.join("README"), "not data").unwrap();
}

fn fails(args: &[&str]) -> String {
    let o = std::process::Command::new(nightshift_bin())
        .args(args)
        .output()
        .unwrap();
    assert!(!o.status.success(), "nightshift {args:?} succeeded");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_swarm_trains_with_a_bpe_tokenizer_on_a_dataset_of_several_files_and_samples_text() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dataset");
    write_dataset(&data);
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/bpe-512.json");
    let swarm = TestSwarm::create(
        dir.path(),
        2,
        &[
            "--inner-steps",
            "15",
            "--warmup-steps",
            "5",
            "--data",
            data.to_str().unwrap(),
            "--tokenizer",
            tokenizer.to_str().unwrap(),
        ],
    );
    // The manifest pins each data file and the tokenizer by hash, and sizes its shards.
    let m = read_json(&swarm.manifest)["manifest"].clone();
    let d = &m["training"]["data"];
    let files: Vec<&str> = d["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["plays/a.txt", "plays/b.txt", "scenes.jsonl"]);
    assert_eq!(m["model"]["vocab_size"], 512);
    assert!(d["tokenizer"]["sha256"].is_array() || d["tokenizer"]["sha256"].is_string());

    let (_boot, addr) = swarm.bootstrap();
    let mut nodes: Vec<_> = (0..2).map(|i| swarm.node(i, &addr, 4)).collect();
    let mut all: Vec<&mut _> = nodes.iter_mut().collect();
    assert_all_finish(&mut all, EXIT_TIMEOUT);
    let losses: Vec<f32> = swarm
        .events(0)
        .iter()
        .filter_map(|e| match e {
            NodeEvent::Started { val_loss, .. } => Some(*val_loss),
            NodeEvent::RoundCompleted(r) => Some(r.val_loss),
            _ => None,
        })
        .collect();
    assert!(losses.len() >= 4, "{losses:?}");
    let (first, last) = (losses[0], *losses.last().unwrap());
    // A 512-token vocabulary starts near ln 512 = 6.2 and must fall well below it.
    assert!(first > 5.5 && last < first - 0.5, "{losses:?}");
    assert_eq!(swarm.hashes(0).get(&4), swarm.hashes(1).get(&4));

    // The export carries the swarm's own tokenizer.json, unchanged; sample prints text.
    let node0 = dir.path().join("node0");
    let out = dir.path().join("export");
    run_ok(&[
        "export",
        "--data-dir",
        node0.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        std::fs::read(&tokenizer).unwrap()
    );
    let about = read_json(&out.join("nightshift.json"));
    assert!(about.get("vocab").is_none(), "{about}");
    assert!(about["check"]["loss"].as_f64().unwrap() > 0.0);
    assert_eq!(read_json(&out.join("config.json"))["vocab_size"], 512);
    let sample = |from: &str, path: &Path| {
        run_ok(&[
            "sample",
            from,
            path.to_str().unwrap(),
            "--prompt",
            "KING HENRY:",
            "--tokens",
            "60",
            "--seed",
            "3",
        ])
    };
    let text = sample("--data-dir", &node0);
    assert!(text.starts_with("KING HENRY:"), "{text}");
    assert!(text.len() > "KING HENRY:".len() + 60, "{text:?}");
    assert_eq!(text, sample("--model", &out));

    // A node with another copy of the data, or another tokenizer, says which file differs.
    let altered = dir.path().join("altered");
    write_dataset(&altered);
    let mut b = std::fs::read(altered.join("plays/b.txt")).unwrap();
    b[100] ^= 0x20;
    std::fs::write(altered.join("plays/b.txt"), b).unwrap();
    let (other, key) = (dir.path().join("other"), dir.path().join("node0.key.json"));
    let base = [
        "run",
        "--manifest",
        swarm.manifest.to_str().unwrap(),
        "--bootstrap",
        &addr,
        "--data-dir",
        other.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let err = fails(&[&base[..], &["--data", altered.to_str().unwrap()]].concat());
    assert!(
        err.contains("b.txt") && err.contains("does not match"),
        "{err}"
    );
    let err = fails(
        &[
            &base[..],
            &["--tokenizer", swarm.manifest.to_str().unwrap()],
        ]
        .concat(),
    );
    assert!(err.contains("does not match"), "{err}");
}
