use super::*;
use crate::Tokenizer;
use crate::backend::{CpuTrain, cpu_device};
use crate::data::EMBEDDED_CORPUS;
use crate::eval::val_loss;
use rand::SeedableRng;

/// The tiny model on the first `chars` characters of the embedded corpus (seq 32), and its
/// genesis parameters.
fn tiny(chars: usize) -> (burn::backend::flex::FlexDevice, Corpus, GptConfig, Vec<f32>) {
    let dev = cpu_device();
    let text = &EMBEDDED_CORPUS[..chars];
    let tok = Tokenizer::from_corpus(text);
    let corpus = Corpus::new(text, &tok, 100, 32).unwrap();
    let cfg = GptConfig::preset("tiny", tok.len()).unwrap();
    let init = flat::genesis_params::<CpuTrain, _>(&cfg.init::<CpuTrain>(&dev), 3);
    (dev, corpus, cfg, init)
}

/// Settings that train the tiny model visibly in a few dozen steps.
fn quick() -> InnerConfig {
    InnerConfig {
        lr: 3e-3,
        warmup_steps: 5,
        batch_size: 8,
        ..Default::default()
    }
}

#[test]
fn a_few_inner_steps_lower_the_validation_loss() {
    let (dev, corpus, cfg, init) = tiny(200_000);
    let mut t = InnerTrainer::<CpuTrain>::new(&cfg, quick(), &init, &dev).unwrap();
    let val = corpus.val_batches(8, 32, 4);
    let before = val_loss(&t.eval_model(), &val);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 40, &|| false);
    assert_eq!(r.steps, 40);
    assert_eq!(r.tokens, 40 * 8 * 32);
    let after = val_loss(&t.eval_model(), &val);
    assert!(after < before - 0.3, "{before} -> {after}");
    // Params changed and a reload restores them exactly.
    let p = t.params();
    assert_ne!(p, init);
    t.load_params(&init).unwrap();
    assert_eq!(t.params(), init);
    assert!(t.load_params(&init[1..]).is_err());
}

#[test]
fn a_reset_recovers_a_trainer_whose_training_went_non_finite() {
    let (dev, corpus, cfg, init) = tiny(100_000);
    let inner = InnerConfig {
        lr: 3e-3,
        warmup_steps: 2,
        batch_size: 4,
        ..Default::default()
    };
    let mut t = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    // A NaN in θ makes every gradient NaN, and AdamW's moments with it.
    let mut bad = init.clone();
    bad[7] = f32::NAN;
    t.load_params(&bad).unwrap();
    let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 2, &|| false);
    assert!(r.mean_loss.is_nan());
    // Loading good parameters alone does not help: the moments are poisoned.
    t.load_params(&init).unwrap();
    t.train(&corpus, &corpus.full_shard(), &mut rng, 1, &|| false);
    assert!(t.params().iter().any(|v| !v.is_finite()));
    // A reset does, also while suspended (without waking the trainer).
    assert!(t.reset(&init[1..]).is_err());
    t.suspend();
    t.reset(&init).unwrap();
    assert!(t.is_suspended());
    let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 2, &|| false);
    assert!(r.mean_loss.is_finite(), "{}", r.mean_loss);
    assert!(t.params().iter().all(|v| v.is_finite()));
    // And a poisoned one again, awake.
    t.load_params(&bad).unwrap();
    t.train(&corpus, &corpus.full_shard(), &mut rng, 1, &|| false);
    t.reset(&init).unwrap();
    assert_eq!(t.params(), init);
    let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 3, &|| false);
    assert!(r.mean_loss.is_finite(), "{}", r.mean_loss);
    assert!(t.params().iter().all(|v| v.is_finite()));
    assert_ne!(t.params(), init);
}

#[test]
fn a_batch_split_over_threads_takes_the_same_steps() {
    let (dev, corpus, cfg, init) = tiny(100_000);
    let run = |threads: usize| {
        let inner = InnerConfig {
            lr: 3e-3,
            warmup_steps: 2,
            batch_size: 8,
            threads,
            ..Default::default()
        };
        let mut t = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 4, &|| false);
        (r, t.params())
    };
    let (one, p1) = run(1);
    let (four, p4) = run(4);
    assert_eq!(one.tokens, four.tokens, "every row of the batch is trained");
    assert!((one.mean_loss - four.mean_loss).abs() < 1e-4);
    // Same data, same gradient up to summation order: AdamW's first steps move every
    // parameter by about the learning rate, so a different gradient would show at 1e-3.
    let moved = p1
        .iter()
        .zip(&init)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let apart = p1
        .iter()
        .zip(&p4)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(moved > 1e-3, "training moved the parameters ({moved})");
    assert!(apart < 2e-4, "one thread and four differ by {apart}");
}

#[test]
fn threads_are_lowered_to_a_divisor_of_the_batch() {
    let c = |batch_size, threads| InnerConfig {
        batch_size,
        threads,
        ..Default::default()
    };
    assert_eq!(c(16, 1).parts(), 1);
    assert_eq!(c(16, 0).parts(), 1);
    assert_eq!(c(16, 2).parts(), 2);
    assert_eq!(c(16, 3).parts(), 2);
    assert_eq!(c(16, 6).parts(), 4);
    assert_eq!(c(12, 5).parts(), 4);
    assert_eq!(c(7, 4).parts(), 1);
    assert_eq!(c(4, 32).parts(), 4);
}

#[test]
fn the_rate_warms_up_then_holds() {
    let c = InnerConfig {
        lr: 1e-3,
        warmup_steps: 10,
        ..Default::default()
    };
    assert!((c.lr_at(0) - 1e-4).abs() < 1e-12);
    assert!((c.lr_at(9) - 1e-3).abs() < 1e-12);
    assert_eq!(c.lr_at(5000), 1e-3, "constant after the warm-up");
}

#[test]
fn training_stops_at_the_next_step_when_asked() {
    let (dev, corpus, cfg, init) = tiny(50_000);
    let mut t = InnerTrainer::<CpuTrain>::new(&cfg, InnerConfig::default(), &init, &dev).unwrap();
    let calls = std::cell::Cell::new(0);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let r = t.train(&corpus, &corpus.full_shard(), &mut rng, 10, &|| {
        calls.set(calls.get() + 1);
        calls.get() > 3
    });
    assert!(r.yielded);
    assert_eq!(r.steps, 3);
}

#[test]
fn muon_trains_the_matrices_and_its_momentum_survives_a_suspend() {
    let (dev, corpus, cfg, init) = tiny(200_000);
    let adamw = quick();
    let muon = InnerConfig {
        muon: Some(1.0),
        ..adamw.clone()
    };
    let val = corpus.val_batches(8, 32, 4);
    let shard = corpus.full_shard();
    let mut plain = InnerTrainer::<CpuTrain>::new(&cfg, adamw, &init, &dev).unwrap();
    let mut a = InnerTrainer::<CpuTrain>::new(&cfg, muon.clone(), &init, &dev).unwrap();
    let mut b = InnerTrainer::<CpuTrain>::new(&cfg, muon, &init, &dev).unwrap();
    let before = val_loss(&a.eval_model(), &val);
    let rng = || rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let (mut rp, mut ra, mut rb) = (rng(), rng(), rng());
    plain.train(&corpus, &shard, &mut rp, 20, &|| false);
    a.train(&corpus, &shard, &mut ra, 20, &|| false);
    b.train(&corpus, &shard, &mut rb, 20, &|| false);
    // Same batches, another optimizer for the matrices: other parameters.
    assert_ne!(a.params(), plain.params());
    // Muon's momentum is kept over a suspend, as AdamW's moments are.
    a.suspend();
    a.train(&corpus, &shard, &mut ra, 20, &|| false);
    b.train(&corpus, &shard, &mut rb, 20, &|| false);
    assert_eq!(a.params(), b.params());
    let after = val_loss(&a.eval_model(), &val);
    assert!(after < before - 0.3, "{before} -> {after}");
}

#[test]
fn suspending_frees_the_device_and_loses_nothing() {
    let (dev, corpus, cfg, init) = tiny(50_000);
    let inner = InnerConfig {
        batch_size: 4,
        ..Default::default()
    };
    let mut a = InnerTrainer::<CpuTrain>::new(&cfg, inner.clone(), &init, &dev).unwrap();
    let mut b = InnerTrainer::<CpuTrain>::new(&cfg, inner, &init, &dev).unwrap();
    let mut ra = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    let mut rb = rand_chacha::ChaCha8Rng::seed_from_u64(5);
    a.train(&corpus, &corpus.full_shard(), &mut ra, 3, &|| false);
    b.train(&corpus, &corpus.full_shard(), &mut rb, 3, &|| false);
    // `a` is suspended between its steps; `b` is not. AdamW moments must survive, so both
    // continue identically.
    a.suspend();
    assert!(a.is_suspended());
    assert!(a.model.is_none());
    assert_eq!(a.params(), b.params());
    a.train(&corpus, &corpus.full_shard(), &mut ra, 3, &|| false);
    b.train(&corpus, &corpus.full_shard(), &mut rb, 3, &|| false);
    assert!(!a.is_suspended());
    assert_eq!(a.params(), b.params());
    // Loading parameters while suspended keeps the device free and the values exact.
    a.suspend();
    a.load_params(&init).unwrap();
    assert!(a.model.is_none());
    assert_eq!(a.params(), init);
}
