//! Text generation: next-token sampling with a temperature and top-k.

use burn::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::Gpt;

/// How [`generate`] picks each next token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature; 0 always takes the likeliest token.
    pub temperature: f32,
    /// Draw from the `top_k` likeliest tokens only (0: from all).
    pub top_k: usize,
    /// Seeds the draws: the same seed, prompt and model give the same text.
    pub seed: u64,
}

/// `n` tokens that follow `prompt` (token ids; at least one), each drawn from the model's
/// next-token distribution given the last `seq_len` tokens.
pub fn generate<B: Backend>(model: &Gpt<B>, prompt: &[u32], n: usize, s: Sampling) -> Vec<u32> {
    let Some(device) = model.devices().into_iter().next() else {
        return vec![];
    };
    let mut rng = ChaCha8Rng::seed_from_u64(s.seed);
    let mut tokens = prompt.to_vec();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = tokens.len().saturating_sub(model.seq_len());
        let window: Vec<i32> = tokens[start..].iter().map(|t| *t as i32).collect();
        let len = window.len();
        let input = Tensor::<B, 2, Int>::from_data(TensorData::new(window, [1, len]), &device);
        let logits = model
            .forward(input)
            .narrow(1, len - 1, 1)
            .into_data()
            .to_vec::<f32>()
            .unwrap_or_default();
        let next = pick(&logits, s, &mut rng);
        tokens.push(next);
        out.push(next);
    }
    out
}

/// One token from `logits` as `s` says.
fn pick(logits: &[f32], s: Sampling, rng: &mut impl Rng) -> u32 {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
    if s.temperature <= 0.0 || order.len() == 1 {
        return order.first().copied().unwrap_or(0) as u32;
    }
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let top = logits[order[0]];
    let weights: Vec<f64> = order
        .iter()
        .map(|i| f64::from((logits[*i] - top) / s.temperature).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut x = rng.random::<f64>() * total;
    for (i, w) in order.iter().zip(&weights) {
        if x < *w {
            return *i as u32;
        }
        x -= w;
    }
    order[order.len() - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GptConfig;
    use crate::backend::{Cpu, cpu_device};

    #[test]
    fn greedy_takes_the_likeliest_and_top_k_keeps_to_the_k_likeliest() {
        let logits = [0.1, 3.0, -1.0, 2.5];
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let greedy = Sampling {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
        };
        assert_eq!(pick(&logits, greedy, &mut rng), 1);
        let top2 = Sampling {
            temperature: 5.0,
            top_k: 2,
            seed: 0,
        };
        let drawn: std::collections::BTreeSet<u32> =
            (0..200).map(|_| pick(&logits, top2, &mut rng)).collect();
        assert_eq!(drawn, [1u32, 3].into_iter().collect());
    }

    #[test]
    fn the_same_seed_gives_the_same_text_and_prompts_longer_than_the_context_work() {
        let dev = cpu_device();
        let m = GptConfig::preset("tiny", 20).unwrap().init::<Cpu>(&dev);
        let s = Sampling {
            temperature: 1.0,
            top_k: 10,
            seed: 3,
        };
        let prompt: Vec<u32> = (0..50).map(|i| i % 20).collect();
        let a = generate(&m, &prompt, 12, s);
        assert_eq!(a.len(), 12);
        assert!(a.iter().all(|t| *t < 20));
        assert_eq!(a, generate(&m, &prompt, 12, s));
    }
}
