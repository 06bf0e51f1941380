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

#[cfg(test)]
mod tests {
    use candle_core::{Device, Tensor};

    /// The floor and the far end, against the float64 value of the formula:
    /// at +20, `1 - sigmoid` is 2.1e-9 < 1e-4, so the reward is
    /// `-ln(1e-4 as f32)`; at -20, `1 - sigmoid` rounds to 1.0 in float32
    /// (it is 1 - 2.06e-9 and float32's spacing below 1 is 6e-8), so the
    /// reward is 0 where the exact one is 2.06e-9, as torch computes it.
    #[test]
    fn disc_reward_saturates_at_the_floor_and_vanishes_for_real_motions() {
        let logits = Tensor::new(&[[20.0f32], [-20.0], [0.0]], &Device::Cpu).unwrap();
        let r: Vec<f32> = super::disc_reward(&logits).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let floor = -(1e-4f32 as f64).ln();
        // within one float32 ulp (9.5e-7 at 9.2) of -ln(1e-4 as f32) = 9.2103404 (torch: 9.2103405)
        assert!((r[0] as f64 - floor).abs() <= 9.6e-7, "{} vs {floor}", r[0]);
        assert!((floor - 9.210_340_371_976_182).abs() < 1e-6, "{floor}");
        let exact = -(-1.0 / (1.0 + 20f64.exp())).ln_1p();
        assert!((exact - 2.061_153_6e-9).abs() < 1e-15, "{exact}");
        assert_eq!(r[1], 0.0, "1 - sigmoid(-20) rounds to 1 in float32");
        assert!((r[1] as f64 - exact).abs() <= exact, "{} vs {exact}", r[1]);
        assert_eq!(r[2], std::f32::consts::LN_2);
    }
}
