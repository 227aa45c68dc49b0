//! Validation loss.

use burn::prelude::*;

use crate::Gpt;

/// Mean cross-entropy of `model` over `batches` (as made by [`crate::Corpus::val_batches`]).
pub fn val_loss<B: Backend>(model: &Gpt<B>, batches: &[(Vec<i32>, Vec<i32>)]) -> f32 {
    let Some(device) = model.devices().into_iter().next() else {
        return f32::NAN;
    };
    let device = &device;
    let seq = model.seq_len();
    let mut total = 0.0f64;
    for (x, y) in batches {
        let rows = x.len() / seq;
        let inputs =
            Tensor::<B, 2, Int>::from_data(TensorData::new(x.clone(), [rows, seq]), device);
        let targets =
            Tensor::<B, 2, Int>::from_data(TensorData::new(y.clone(), [rows, seq]), device);
        total += model.loss(inputs, targets).into_scalar().to_f64();
    }
    (total / batches.len().max(1) as f64) as f32
}
