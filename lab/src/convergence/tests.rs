//! Tests of the convergence benchmark's math and runs.

use super::*;
use nightshift_model::{ErrorFeedback, OuterOptimizer};
use nightshift_node::round::accept::{Accepted, aggregate, encode_delta};
use nightshift_protocol::delta;
use std::collections::BTreeMap;

/// A quadratic loss ½‖Aθ − b‖² per worker, so gradients are exact and cheap.
fn grad(theta: &[f32], shift: f32) -> Vec<f32> {
    theta
        .iter()
        .enumerate()
        .map(|(j, t)| (1.0 + j as f32 * 0.1) * t - shift - j as f32 * 0.01)
        .collect()
}

#[test]
fn diloco_with_h1_outer_lr1_no_momentum_is_data_parallel_sgd() {
    let (lr, n, k) = (0.1f32, 16, 3);
    let mut theta_dp = vec![0.5f32; n];
    let mut theta_dl = theta_dp.clone();
    let mut outer = OuterOptimizer::new(1.0, 0.0, n);
    let mut efs = vec![ErrorFeedback::default(); k];
    for _step in 0..20 {
        // Data-parallel SGD: average the workers' gradients, one step.
        let g: Vec<Vec<f32>> = (0..k).map(|i| grad(&theta_dp, i as f32)).collect();
        for j in 0..n {
            theta_dp[j] -= lr * g.iter().map(|gi| gi[j]).sum::<f32>() / k as f32;
        }
        // DiLoCo with H = 1 inner SGD step, through the nodes' own code path.
        let mut collected = BTreeMap::new();
        for (i, ef) in efs.iter_mut().enumerate() {
            let local: Vec<f32> = theta_dl
                .iter()
                .zip(grad(&theta_dl, i as f32))
                .map(|(t, g)| t - lr * g)
                .collect();
            let (_, sent) = encode_delta(&theta_dl, &local, DeltaCodec::Fp32, &[], ef).unwrap();
            collected.insert(
                [i as u8; 32],
                Accepted {
                    sender: [i as u8; 32],
                    digest: nightshift_protocol::Hash32::default(),
                    tokens: 100,
                    train_loss: 0.0,
                    delta: sent,
                    expected: k as u32,
                },
            );
        }
        outer.step(&mut theta_dl, &aggregate(&collected).unwrap());
    }
    for (a, b) in theta_dp.iter().zip(&theta_dl) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
}

#[test]
fn a_tiny_diloco_swarm_learns_through_the_simulator_and_counts_its_bytes() {
    let recipe = SwarmFlags {
        preset: "tiny".into(),
        data: None,
        tokenizer: None,
        shard_kib: None,
        shards_per_round: None,
        inner_steps: 25,
        codec: DeltaCodec::Int8 { block: 64 },
        batch_size: 8,
        inner_lr: 3e-3,
        warmup_steps: 2,
        weight_decay: 0.1,
        inner_optimizer: nightshift_protocol::InnerOptimizer::AdamW,
        outer_lr: 0.7,
        outer_momentum: 0.9,
        aggregator: nightshift_protocol::Aggregator::ROBUST,
        averaging: nightshift_protocol::slices::Averaging::AllToAll,
        deadline_secs: 60,
        seed: 1,
    };
    let setup = || Setup::new(&recipe, 2).unwrap();
    let run = |name: &str, k: usize, codec: DeltaCodec, drop: f64| {
        diloco::Diloco {
            name,
            preset: "tiny",
            k,
            h: 25,
            codec,
            drop,
            steps: 100,
            deadline_secs: 60,
            overlap: true,
            reduce: None,
        }
        .run(setup())
        .unwrap()
    };
    let r = run("d", 2, recipe.codec, 0.0);
    let params = setup().genesis.len();
    assert_eq!(r.curve.len(), 5, "{:?}", r.curve);
    assert!(r.final_val_loss < r.curve[0].1 - 0.2, "{:?}", r.curve);
    // Every node trained every step: no round was lost or repeated.
    assert_eq!(r.tokens, 2 * 100 * 8 * 32);
    let dense = delta::dense_bytes(params) as u64;
    assert!(r.bytes_per_node_per_round > 0 && r.bytes_per_node_per_round < dense / 2);
    // The same seed gives the same run.
    assert_eq!(run("again", 2, recipe.codec, 0.0).curve, r.curve);

    // Low-rank deltas (rank 2 of the tiny model's 32-wide matrices) are smaller and still train.
    let low = run("l", 2, DeltaCodec::LowRank { rank: 2, block: 64 }, 0.0);
    assert!(low.bytes_per_node_per_round < r.bytes_per_node_per_round / 2);
    assert!(low.final_val_loss < low.curve[0].1 - 0.2, "{:?}", low.curve);

    // Losing contributions: the swarm still completes every round and learns, and the nodes
    // whose contribution was lost trained for nothing (more tokens than the rounds counted).
    let lossy = run("s", 3, recipe.codec, 0.5);
    assert_eq!(lossy.curve.len(), 5, "{:?}", lossy.curve);
    assert!(
        lossy.final_val_loss < lossy.curve[0].1 - 0.2,
        "{:?}",
        lossy.curve
    );

    // Averaged slice by slice (two slices, the means sent back as int8): the swarm learns as
    // much, within a hair of averaging whole contributions.
    let sliced = diloco::Diloco {
        name: "r",
        reduce: Some("2:int8:64".into()),
        ..small_run(recipe.codec)
    }
    .run(setup())
    .unwrap();
    assert_eq!(sliced.curve.len(), 5, "{:?}", sliced.curve);
    assert!(
        (sliced.final_val_loss - r.final_val_loss).abs() < 0.02 * r.final_val_loss,
        "{} against {}",
        sliced.final_val_loss,
        r.final_val_loss
    );

    // T must be whole rounds.
    let odd = diloco::Diloco {
        name: "odd",
        preset: "tiny",
        k: 2,
        h: 30,
        codec: recipe.codec,
        drop: 0.0,
        steps: 100,
        deadline_secs: 60,
        overlap: true,
        reduce: None,
    };
    assert!(odd.run(setup()).is_err());
    let single = setup().run_single("s", 10, 1, 5).unwrap();
    assert_eq!(single.curve.len(), 3);
    assert!(single.final_val_loss < single.curve[0].1);
}

fn run(name: &str, k: usize, codec: &str, drop: f64, steps: u32, curve: &[f32]) -> RunResult {
    let every = steps / (curve.len() as u32 - 1);
    RunResult {
        name: name.into(),
        k,
        h: 50,
        codec: codec.into(),
        drop,
        final_val_loss: *curve.last().unwrap(),
        tokens: (k as u64) * steps as u64 * 10,
        per_worker_steps: steps,
        bytes_per_node_per_round: if codec == "fp32" { 1000 } else { 125 },
        total_bytes: 0,
        curve: curve
            .iter()
            .enumerate()
            .map(|(i, l)| (i as u32 * every, *l))
            .collect(),
        tokens_per_sec: 0.0,
        wall_secs: 0.0,
        ema: vec![],
        seed: None,
        overlap: false,
    }
}

#[test]
fn report_compares_each_run_with_its_own_baseline() {
    let results = [
        run("single T=100", 1, "-", 0.0, 100, &[4.0, 3.0, 2.0]),
        run("single 4T", 1, "-", 0.0, 400, &[4.0, 2.0, 1.5]),
        run(
            "sync k=4",
            4,
            "fp32 (gradients)",
            0.0,
            100,
            &[4.0, 2.0, 1.6],
        ),
        run(
            "diloco k=4 h=50 fp32",
            4,
            "fp32",
            0.0,
            100,
            &[4.0, 2.5, 1.8],
        ),
        run(
            "diloco k=4 h=50 int4:64",
            4,
            "int4:64",
            0.0,
            100,
            &[4.0, 1.9, 1.818],
        ),
        run(
            "diloco k=4 h=50 drop=0.5",
            4,
            "int4:64",
            0.5,
            100,
            &[4.0, 2.1, 2.0907],
        ),
        // Another budget: no baseline of its own, so no comparison.
        run("diloco k=2 h=50", 2, "fp32", 0.0, 300, &[4.0, 2.0, 1.7]),
        // Half the workers of sync: half its tokens, so no ratio against it.
        run(
            "diloco k=2 h=50 half",
            2,
            "fp32",
            0.0,
            100,
            &[4.0, 2.0, 1.9],
        ),
    ];
    let lines = comparisons(&results);
    let has = |run: &str, says: &str| {
        assert!(
            lines
                .iter()
                .any(|l| l.split("  ").next() == Some(run) && l.contains(says)),
            "no line for {run:?} saying {says:?} in {lines:#?}"
        )
    };
    let reached = "reached single's final loss (2.0000) after";
    has("diloco k=4 h=50 fp32", &format!("{reached} 100 of 100"));
    has("diloco k=4 h=50 int4:64", &format!("{reached} 50 of 100"));
    has("sync k=4", &format!("{reached} 50 of 100"));
    has(
        "diloco k=4 h=50 drop=0.5",
        "never reached single's final loss",
    );
    has(
        "diloco k=4 h=50 fp32",
        "final loss 1.2000x one worker's over the same tokens (400 steps)",
    );
    has("diloco k=4 h=50 fp32", "final loss 1.1250x sync's");
    has(
        "diloco k=4 h=50 int4:64",
        "final loss +1.00 % against fp32, 8.0x fewer bytes",
    );
    has(
        "diloco k=4 h=50 drop=0.5",
        "final loss +15.00 % against no drops (1.8180)",
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.split("  ").next() == Some("diloco k=2 h=50")),
        "a run without a baseline was compared: {lines:#?}"
    );
    has("diloco k=2 h=50 half", &format!("{reached} 50 of 100"));
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("diloco k=2 h=50 half") && l.contains("sync")),
        "compared with sync at other tokens: {lines:#?}"
    );
}

#[test]
fn a_run_cut_at_an_earlier_budget_compares_at_that_budget() {
    let diloco = run("diloco k=4 h=50", 4, "fp32", 0.0, 100, &[4.0, 2.5, 1.8]);
    let drop = run(
        "diloco k=4 h=50 drop=0.5",
        4,
        "fp32",
        0.5,
        100,
        &[4.0, 3.0, 1.9],
    );
    let cut = drop.cut_at(50).expect("the curve has a point at 50");
    assert_eq!(cut.name, "diloco k=4 h=50 drop=0.5 T=50");
    assert_eq!(cut.final_val_loss, 3.0);
    assert_eq!(cut.per_worker_steps, 50);
    assert_eq!(cut.tokens, drop.tokens / 2);
    assert_eq!(cut.curve, vec![(0, 4.0), (50, 3.0)]);
    // No point at 70, nothing after the run's end, nothing at 0.
    assert!(drop.cut_at(70).is_none());
    assert!(drop.cut_at(150).is_none());
    assert!(drop.cut_at(0).is_none());
    // Cut at the same budget, each run is compared with its own reference there.
    let lines = comparisons(&[diloco.cut_at(50).unwrap(), cut]);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("diloco k=4 h=50 drop=0.5 T=50")
                && l.contains("+20.00 % against no drops (2.5000)")),
        "{lines:#?}"
    );
    assert_eq!(drop.cut_at(100).unwrap().final_val_loss, 1.9);
}

#[test]
fn report_compares_runs_of_the_same_seed_only() {
    let seeded = |name: &str, drop: f64, curve: &[f32], seed: u64| RunResult {
        overlap: false,
        seed: Some(seed),
        ..run(name, 4, "fp32", drop, 100, curve)
    };
    let results = [
        seeded("diloco k=4 h=50", 0.0, &[4.0, 2.5, 2.0], 42),
        seeded("diloco k=4 h=50", 0.0, &[4.0, 2.5, 1.6], 43),
        seeded("diloco k=4 h=50 drop=0.5", 0.5, &[4.0, 2.6, 1.8], 43),
    ];
    let mut results = results.to_vec();
    let lines = comparisons(&results);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("+12.50 % against no drops (1.6000)")),
        "not compared with seed 43's run: {lines:#?}"
    );
    // A run of another seed and no reference of its own is not compared.
    results[2].seed = Some(44);
    assert!(
        !comparisons(&results)
            .iter()
            .any(|l| l.contains("against no drops")),
    );
    // Files written before seeds were recorded still compare.
    results.iter_mut().for_each(|r| r.seed = None);
    assert!(
        comparisons(&results)
            .iter()
            .any(|l| l.contains("against no drops (2.0000)"))
    );
}

/// The settings of the small DiLoCo runs above (2 tiny nodes, H = 25, 100 steps).
fn small_run(codec: DeltaCodec) -> diloco::Diloco<'static> {
    diloco::Diloco {
        name: "d",
        preset: "tiny",
        k: 2,
        h: 25,
        codec,
        drop: 0.0,
        steps: 100,
        deadline_secs: 60,
        overlap: true,
        reduce: None,
    }
}
