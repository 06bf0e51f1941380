//! What the stage-by-stage parity tests (MaskedMimic, the GPC prior) check
//! of every stage once the float64 reference is settled.

use candle_core::Tensor;
use pmstate_policy::bound::{within, Bounded};

/// A float32 tensor's values.
pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Ours and torch's float32 values within the derived bound of the float64
/// reference `r`, within twice it of each other, the bound at most 1 % of
/// the stage's magnitude (`observed` says what the recordings use); returns
/// the stage's looseness (the largest bound over the largest observed
/// float32 error).
pub fn float32_within_bound(stage: &str, ours: &[f32], torch: &[f32], r: &Bounded, observed: &str) -> f64 {
    assert!(ours.iter().all(|v| v.is_finite()), "{stage}: non-finite");
    assert_eq!(within(torch, r, 1.0), None, "{stage}: torch float32 outside the derived bound");
    assert_eq!(within(ours, r, 1.0), None, "{stage}: ours outside the derived bound");
    let torch_centred =
        Bounded { shape: r.shape.clone(), value: torch.iter().map(|v| *v as f64).collect(), bound: r.bound.clone() };
    assert_eq!(within(ours, &torch_centred, 2.0), None, "{stage}: |ours - torch| > 2 bound");
    let max_bound = r.bound.iter().fold(0.0f64, |m, b| m.max(*b));
    let scale = r.value.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(max_bound <= 1e-2 * scale.max(1.0), "{stage}: bound {max_bound:e} vs scale {scale:e} ({observed})");
    let max_err = torch
        .iter()
        .chain(ours)
        .zip(r.value.iter().chain(&r.value))
        .fold(0.0f64, |m, (a, b)| m.max((*a as f64 - b).abs()));
    max_bound / max_err.max(f64::MIN_POSITIVE)
}
