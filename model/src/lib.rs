//! The nightshift model: everything that touches tensors, and nothing that touches the network.
//!
//! # Layout
//! - [`backend`] — the backend types (CPU `Flex` by default, CUDA behind the `cuda` feature).
//! - [`gpt`] — a small GPT ([`GptConfig`], [`Gpt`]).
//! - [`data`] — a tokenized corpus in memory: train/validation split, shards, batches.
//! - [`tokenizer`] — the byte tokenizer and Hugging Face `tokenizer.json` files.
//! - [`dataset`] — datasets of many files, streamed in shards.
//! - [`flat`] — model parameters to and from one `Vec<f32>`, and the backend-independent genesis init.
//! - [`inner`] — the DiLoCo inner loop ([`InnerTrainer`]: AdamW, warm-up, clipping, yield between steps).
//! - [`outer`] — averaging pseudo-gradients, the Nesterov outer optimizer, error feedback.
//! - [`robust`] — robust aggregation: norm bounds, centered clipping, trimmed mean.
//! - [`eval`] — validation loss.
//! - [`export`] — the model in Hugging Face's GPT-2 layout (safetensors, `config.json`, `tokenizer.json`).
//! - [`sample`] — text generation.

pub mod backend;
pub mod data;
pub mod dataset;
pub mod eval;
pub mod export;
pub mod flat;
pub mod gpt;
pub mod inner;
pub mod outer;
pub mod robust;
pub mod sample;
pub mod tokenizer;

pub use data::{Corpus, DataError, Shard, Tokenizer};
pub use gpt::{Gpt, GptConfig};
pub use inner::{InnerConfig, InnerReport, InnerTrainer};
pub use outer::{
    ErrorFeedback, OuterOptimizer, WeightedDelta, noise_ratio, partial_round_scale, update_noise,
    weighted_average,
};
