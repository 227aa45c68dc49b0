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
fn a_tiny_diloco_run_learns_and_counts_its_bytes() {
    let recipe = SwarmFlags {
        preset: "tiny".into(),
        data: None,
        inner_steps: 5,
        codec: DeltaCodec::Int8 { block: 64 },
        batch_size: 8,
        inner_lr: 3e-3,
        warmup_steps: 2,
        weight_decay: 0.1,
        inner_optimizer: nightshift_protocol::InnerOptimizer::AdamW,
        outer_lr: 0.7,
        outer_momentum: 0.9,
        aggregator: nightshift_protocol::Aggregator::ROBUST,
        deadline_secs: 60,
        seed: 1,
    };
    let s = Setup::new(&recipe, 2).unwrap();
    let r = s.run_diloco("d", 2, 5, recipe.codec, 0.0, 20).unwrap();
    let dense_bytes = r.bytes_per_node_per_round;
    assert_eq!(r.curve.len(), 5);
    assert!(r.final_val_loss < r.curve[0].1 - 0.2, "{:?}", r.curve);
    assert_eq!(r.tokens, 2 * 20 * 8 * 32);
    assert!(
        r.bytes_per_node_per_round > 0
            && r.bytes_per_node_per_round < delta::dense_bytes(s.genesis.len()) as u64 / 2
    );
    // Dropping every contribution leaves θ where it started.
    let frozen = s
        .run_diloco("x", 2, 5, recipe.codec, 0.999_999, 10)
        .unwrap();
    assert_eq!(frozen.curve.first().unwrap().1, frozen.final_val_loss);

    // Low-rank deltas (rank 2 of the tiny model's 32-wide matrices) are smaller and still train.
    let low = s
        .run_diloco(
            "l",
            2,
            5,
            DeltaCodec::LowRank { rank: 2, block: 64 },
            0.0,
            20,
        )
        .unwrap();
    assert!(low.bytes_per_node_per_round < dense_bytes / 2);
    assert!(low.final_val_loss < low.curve[0].1 - 0.2, "{:?}", low.curve);
    let mut s = s;
    // Outer annealing: constant until the last two rounds, then down to the end rate.
    s.outer_anneal = (2, 0.1);
    let lrs: Vec<f32> = [20, 15, 10, 5, 3].map(|left| s.outer_lr_at(left, 5)).into();
    assert!(
        (lrs[0] - 0.7).abs() < 1e-6 && (lrs[1] - 0.7).abs() < 1e-6,
        "{lrs:?}"
    );
    assert!((lrs[2] - 0.4).abs() < 1e-6, "{lrs:?}");
    assert!(
        (lrs[3] - 0.1).abs() < 1e-6 && (lrs[4] - 0.1).abs() < 1e-6,
        "{lrs:?}"
    );
    s.outer_anneal = (0, 0.0);
    assert_eq!(s.outer_lr_at(5, 5), 0.7);
    // Shrinking short rounds keeps a dropping swarm training.
    let shrunk = s.run_diloco("s", 3, 5, recipe.codec, 0.5, 20).unwrap();
    assert!(
        shrunk.final_val_loss < shrunk.curve[0].1 - 0.2,
        "{:?}",
        shrunk.curve
    );
    let plain = s.run_diloco("p", 3, 5, recipe.codec, 0.0, 10).unwrap();
    // Averaging the parameters is evaluated beside the run, which it leaves unchanged.
    s.ema_horizons = vec![5, 1_000_000];
    let avg = s.run_diloco("a", 3, 5, recipe.codec, 0.0, 10).unwrap();
    assert_eq!(avg.curve, plain.curve);
    assert_eq!(avg.ema.len(), 2);
    // A horizon far beyond the run weighs both rounds alike: not the last θ, but trained.
    assert!(avg.ema[1].final_val_loss < avg.curve[0].1, "{:?}", avg.ema);
    assert_ne!(avg.ema[1].final_val_loss, avg.final_val_loss);
    let single = s.run_single("s", 10, 1, 5).unwrap();
    assert_eq!(single.ema.len(), 2);
    assert!(single.ema[0].final_val_loss < single.curve[0].1);
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
    }
}

#[test]
fn a_parameter_average_weighs_by_time_held_and_forgets_the_start() {
    let mut e = ParamEma::new(100, 2);
    e.update(&[1.0, -2.0], 50);
    // One vector so far: the average is that vector, not pulled towards zero.
    assert_eq!(e.average(), vec![1.0, -2.0]);
    // A second vector held for as long weighs exp(-1/2)-relatively less for the first.
    e.update(&[3.0, 0.0], 50);
    let keep = (-0.5f64).exp();
    let w_first = keep * (1.0 - keep) / (keep * (1.0 - keep) + (1.0 - keep));
    let want = 1.0 * w_first + 3.0 * (1.0 - w_first);
    let got = e.average();
    assert!((got[0] as f64 - want).abs() < 1e-6, "{got:?} vs {want}");
    assert!(got[0] > 2.0, "the newer vector weighs more: {got:?}");
    // Held much longer than the horizon, the newest vector is all that is left.
    e.update(&[7.0, 7.0], 10_000);
    assert_eq!(e.average(), vec![7.0, 7.0]);
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
