//! A small GPT-style character model.

use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::TensorData;
use burn::tensor::activation::{gelu, softmax};

/// Architecture of a [`Gpt`].
#[derive(Config, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Width of the residual stream.
    #[config(default = 128)]
    pub d_model: usize,
    #[config(default = 2)]
    pub n_layers: usize,
    #[config(default = 4)]
    pub n_heads: usize,
    /// Width of the feed-forward layers.
    #[config(default = 512)]
    pub d_ff: usize,
    /// Context length in tokens.
    #[config(default = 64)]
    pub seq_len: usize,
}

impl GptConfig {
    /// Preset by name: `tiny` (tests), `small` (default, 2 CPU cores), `medium` and `large` (GPUs).
    pub fn preset(name: &str, vocab: usize) -> Option<Self> {
        let c = GptConfig::new(vocab);
        Some(match name {
            "tiny" => c
                .with_d_model(32)
                .with_n_layers(1)
                .with_n_heads(2)
                .with_d_ff(64)
                .with_seq_len(32),
            "small" => c,
            "medium" => c
                .with_d_model(384)
                .with_n_layers(6)
                .with_n_heads(6)
                .with_d_ff(1536)
                .with_seq_len(256),
            "large" => c
                .with_d_model(768)
                .with_n_layers(12)
                .with_n_heads(12)
                .with_d_ff(3072)
                .with_seq_len(512),
            _ => return None,
        })
    }

    /// Builds the model with burn's default initialisation. Use
    /// [`crate::flat::genesis_params`] for the swarm's deterministic initial parameters.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Gpt<B> {
        let d = self.d_model;
        Gpt {
            tok: EmbeddingConfig::new(self.vocab, d).init(device),
            pos: EmbeddingConfig::new(self.seq_len, d).init(device),
            blocks: (0..self.n_layers)
                .map(|_| Block {
                    norm_attn: LayerNormConfig::new(d).init(device),
                    qkv: LinearConfig::new(d, 3 * d).init(device),
                    proj: LinearConfig::new(d, d).init(device),
                    norm_ff: LayerNormConfig::new(d).init(device),
                    ff_in: LinearConfig::new(d, self.d_ff).init(device),
                    ff_out: LinearConfig::new(self.d_ff, d).init(device),
                    n_heads: self.n_heads,
                })
                .collect(),
            norm: LayerNormConfig::new(d).init(device),
            head: LinearConfig::new(d, self.vocab)
                .with_bias(false)
                .init(device),
            seq_len: self.seq_len,
        }
    }
}

/// One pre-norm transformer block: causal multi-head self-attention, then a GELU feed-forward,
/// each added to the residual stream.
///
/// Written here rather than taken from burn-nn's `TransformerEncoder` for speed on the CPU
/// (docs/bench/HISTORY.md, "Where the inner loop's time goes"): the residual stream stays a 2-D
/// `[batch·seq, d_model]` matrix, so every linear layer is one large matrix product forwards and
/// backwards (burn's default linear on 3-D input runs one small product per batch row and sums
/// the weight gradients over the batch), Q, K and V come from one fused projection, and the
/// causal mask is added as a contiguous bias instead of a broadcast mask fill.
#[derive(Module, Debug)]
pub struct Block<B: Backend> {
    norm_attn: LayerNorm<B>,
    qkv: Linear<B>,
    proj: Linear<B>,
    norm_ff: LayerNorm<B>,
    ff_in: Linear<B>,
    ff_out: Linear<B>,
    n_heads: usize,
}

impl<B: Backend> Block<B> {
    /// # Shapes
    /// - `x`: `[batch * seq, d_model]`
    /// - `causal`: `[batch, n_heads, seq, seq]`, 0 where a position may attend, a large negative
    ///   number where it may not
    /// - returns: `[batch * seq, d_model]`
    fn forward(
        &self,
        x: Tensor<B, 2>,
        batch: usize,
        seq: usize,
        causal: Tensor<B, 4>,
    ) -> Tensor<B, 2> {
        let [rows, d_model] = x.dims();
        let heads = self.n_heads;
        let head_dim = d_model / heads;
        // [batch, 3·heads, seq, head_dim]: Q, K and V heads side by side.
        let qkv = self
            .qkv
            .forward(self.norm_attn.forward(x.clone()))
            .reshape([batch, seq, 3 * heads, head_dim])
            .swap_dims(1, 2);
        let q = qkv.clone().narrow(1, 0, heads);
        let k = qkv.clone().narrow(1, heads, heads);
        let v = qkv.narrow(1, 2 * heads, heads);
        let scores = q
            .mul_scalar(1.0 / (head_dim as f64).sqrt())
            .matmul(k.transpose())
            + causal;
        let context = softmax(scores, 3)
            .matmul(v)
            .swap_dims(1, 2)
            .reshape([rows, d_model]);
        let x = x + self.proj.forward(context);
        let ff = self
            .ff_out
            .forward(gelu(self.ff_in.forward(self.norm_ff.forward(x.clone()))));
        x + ff
    }
}

/// Token and position embeddings, pre-norm transformer blocks with a causal mask, a linear head
/// without a bias: GPT-2's architecture (see [`crate::export`]).
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tok: Embedding<B>,
    pos: Embedding<B>,
    blocks: Vec<Block<B>>,
    norm: LayerNorm<B>,
    head: Linear<B>,
    seq_len: usize,
}

impl<B: Backend> Gpt<B> {
    /// The ids of the blocks' weight matrices: what a Muon inner optimizer trains
    /// ([`crate::InnerConfig::muon`]); embeddings, the head, biases and norms stay with AdamW.
    pub fn hidden_matrix_ids(&self) -> Vec<burn::module::ParamId> {
        self.blocks
            .iter()
            .flat_map(|b| {
                [
                    b.qkv.weight.id,
                    b.proj.weight.id,
                    b.ff_in.weight.id,
                    b.ff_out.weight.id,
                ]
            })
            .collect()
    }

    /// Next-token logits.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]` with `seq <= seq_len`
    /// - returns: `[batch, seq, vocab]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let logits = self.logits(tokens);
        let [_, vocab] = logits.dims();
        logits.reshape([batch, seq, vocab])
    }

    /// Next-token logits, one row per position: `[batch * seq, vocab]`.
    fn logits(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .expand([batch, seq]);
        let x = self.tok.forward(tokens) + self.pos.forward(positions);
        let [_, _, d_model] = x.dims();
        let mut x = x.reshape([batch * seq, d_model]);
        let heads = self.blocks.first().map_or(1, |b| b.n_heads);
        let causal = causal_bias::<B>(batch, heads, seq, &device);
        for block in &self.blocks {
            x = block.forward(x, batch, seq, causal.clone());
        }
        self.head.forward(self.norm.forward(x))
    }

    /// Mean cross-entropy of predicting `targets` from `inputs`.
    ///
    /// # Shapes
    /// - `inputs`, `targets`: `[batch, seq]`
    /// - returns: `[1]`
    pub fn loss(&self, inputs: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let [batch, seq] = targets.dims();
        let logits = self.logits(inputs);
        let loss = CrossEntropyLossConfig::new().init(&logits.device());
        loss.forward(logits, targets.reshape([batch * seq]))
    }

    /// The context length the model was built for.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}

/// What is added to the attention scores for causal attention: 0 on and below the diagonal, a
/// large negative number above it (so softmax gives those positions weight 0), laid out
/// contiguously in the scores' own shape `[batch, heads, seq, seq]`.
fn causal_bias<B: Backend>(
    batch: usize,
    heads: usize,
    seq: usize,
    device: &B::Device,
) -> Tensor<B, 4> {
    let mut one = vec![0.0f32; seq * seq];
    for (i, row) in one.chunks_mut(seq).enumerate() {
        for v in &mut row[i + 1..] {
            *v = -1.0e9;
        }
    }
    let mut all = Vec::with_capacity(batch * heads * seq * seq);
    for _ in 0..batch * heads {
        all.extend_from_slice(&one);
    }
    Tensor::from_data(TensorData::new(all, [batch, heads, seq, seq]), device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Cpu, cpu_device};

    /// The model is causal: changing a later token changes no earlier position's logits.
    #[test]
    fn logits_do_not_see_the_future() {
        let dev = cpu_device();
        let m = GptConfig::preset("tiny", 12).unwrap().init::<Cpu>(&dev);
        let a = Tensor::<Cpu, 2, Int>::from_data(
            TensorData::new(vec![1i64, 2, 3, 4, 5, 6], [1, 6]),
            &dev,
        );
        let b = Tensor::<Cpu, 2, Int>::from_data(
            TensorData::new(vec![1i64, 2, 3, 9, 5, 6], [1, 6]),
            &dev,
        );
        let la = m.forward(a).into_data().to_vec::<f32>().unwrap();
        let lb = m.forward(b).into_data().to_vec::<f32>().unwrap();
        assert_eq!(la[..3 * 12], lb[..3 * 12], "positions before the change");
        assert_ne!(
            la[3 * 12..4 * 12],
            lb[3 * 12..4 * 12],
            "the changed position"
        );
    }
}
