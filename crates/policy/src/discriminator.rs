//! AMP's discriminator outputs.

use candle_core::Tensor;

use crate::error::Result;

/// `Discriminator.compute_disc_reward(logits, eps=1e-4)`:
/// `-log(max(1 - sigmoid(logits), 1e-4))` in float32, as torch computes it
/// (`prob = 1 / (1 + exp(-l))`); saturates at `-log(1e-4) = 9.2103`.
pub fn disc_reward(logits: &Tensor) -> Result<Tensor> {
    let prob = logits.neg()?.exp()?.affine(1.0, 1.0)?.recip()?;
    let one_minus = prob.affine(-1.0, 1.0)?;
    Ok(one_minus.maximum(1e-4)?.log()?.neg()?)
}
