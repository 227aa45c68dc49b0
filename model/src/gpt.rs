//! A small GPT-style character model.

use burn::nn::attention::generate_autoregressive_mask;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;

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
        Gpt {
            tok: EmbeddingConfig::new(self.vocab, self.d_model).init(device),
            pos: EmbeddingConfig::new(self.seq_len, self.d_model).init(device),
            blocks: TransformerEncoderConfig::new(
                self.d_model,
                self.d_ff,
                self.n_heads,
                self.n_layers,
            )
            .with_norm_first(true)
            .with_dropout(0.0)
            .init(device),
            norm: LayerNormConfig::new(self.d_model).init(device),
            head: LinearConfig::new(self.d_model, self.vocab).init(device),
            seq_len: self.seq_len,
        }
    }
}

/// Token and position embeddings, pre-norm transformer blocks with a causal mask, a linear head.
#[derive(Module, Debug)]
pub struct Gpt<B: Backend> {
    tok: Embedding<B>,
    pos: Embedding<B>,
    blocks: TransformerEncoder<B>,
    norm: LayerNorm<B>,
    head: Linear<B>,
    seq_len: usize,
}

impl<B: Backend> Gpt<B> {
    /// Next-token logits.
    ///
    /// # Shapes
    /// - `tokens`: `[batch, seq]` with `seq <= seq_len`
    /// - returns: `[batch, seq, vocab]`
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [batch, seq] = tokens.dims();
        let device = tokens.device();
        let positions = Tensor::<B, 1, Int>::arange(0..seq as i64, &device)
            .reshape([1, seq])
            .expand([batch, seq]);
        let x = self.tok.forward(tokens) + self.pos.forward(positions);
        let mask = generate_autoregressive_mask::<B>(batch, seq, &device);
        let x = self
            .blocks
            .forward(TransformerEncoderInput::new(x).mask_attn(mask));
        self.head.forward(self.norm.forward(x))
    }

    /// Mean cross-entropy of predicting `targets` from `inputs`.
    ///
    /// # Shapes
    /// - `inputs`, `targets`: `[batch, seq]`
    /// - returns: `[1]`
    pub fn loss(&self, inputs: Tensor<B, 2, Int>, targets: Tensor<B, 2, Int>) -> Tensor<B, 1> {
        let logits = self.forward(inputs);
        let [batch, seq, vocab] = logits.dims();
        let loss = CrossEntropyLossConfig::new().init(&logits.device());
        loss.forward(
            logits.reshape([batch * seq, vocab]),
            targets.reshape([batch * seq]),
        )
    }

    /// The context length the model was built for.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
}
