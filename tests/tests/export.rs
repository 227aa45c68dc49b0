//! `nightshift export` and `nightshift sample` on what a real swarm trained.

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
