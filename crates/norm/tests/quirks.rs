//! The reference's numerical quirks, each with an expectation derived by
//! hand from torch's rules (not from running this crate).

mod common;

use std::sync::Arc;

use candle_core::{DType, Tensor};
use common::*;
use pmstate_norm::{
    combine_moments, Arithmetic, Collective, Moments, NormConfig, NormError, NormState, Result, RewardConfig,
    RewardRunningMeanStd, RunningMeanStd,
};

fn with_count(rms: &mut RunningMeanStd, count: i64) {
    let s = rms.state().unwrap();
    rms.load_state(NormState { count, ..s }).unwrap();
}

fn rows(n: usize, v: f32) -> Tensor {
    Tensor::from_vec(vec![v; n], (n, 1), &cpu()).unwrap()
}

#[test]
fn counts_pass_through_float32_and_round_past_2_pow_24() {
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    with_count(&mut rms, 16_777_210);
    // 16777210 + 7 = 16777217 is not a float32; ties-to-even gives 16777216.
    rms.record_moments(&rows(7, 1.0)).unwrap();
    assert_eq!(rms.count(), Some(16_777_216));
    // 16777216 + 1 rounds back to 16777216: the sample is not counted.
    rms.record_moments(&rows(1, 1.0)).unwrap();
    assert_eq!(rms.count(), Some(16_777_216));
    // 2^24 + 2 is representable again.
    rms.record_moments(&rows(2, 1.0)).unwrap();
    assert_eq!(rms.count(), Some(16_777_218));
}

#[test]
fn exact_mode_counts_every_sample() {
    let cfg = NormConfig { arithmetic: Arithmetic::Exact, ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    with_count(&mut rms, 16_777_210);
    rms.record_moments(&rows(7, 1.0)).unwrap();
    assert_eq!(rms.count(), Some(16_777_217));
    rms.record_moments(&rows(1, 1.0)).unwrap();
    assert_eq!(rms.count(), Some(16_777_218));
}

#[test]
fn exact_mode_reports_count_overflow_and_keeps_state() {
    let cfg = NormConfig { arithmetic: Arithmetic::Exact, ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    with_count(&mut rms, i64::MAX - 1);
    let err = rms.record_moments(&rows(2, 1.0)).unwrap_err();
    assert!(matches!(err, NormError::InvalidCount { .. }), "{err}");
    assert_eq!(rms.count(), Some(i64::MAX - 1));
}

#[test]
fn welford_weight_of_a_new_sample_past_2_pow_24_is_float32() {
    // count_a = 2^24, count_b = 1: total rounds to 2^24 in float32, so the
    // new sample's weight count_b/total is exactly 2^-24, and
    // mean = 0 + (x - 0) * 2^-24 in f64, with x the batch mean (float32).
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    with_count(&mut rms, 1 << 24);
    rms.record_moments(&rows(1, 3.0)).unwrap();
    assert_eq!(f64s(&rms.state().unwrap().mean), [3.0 * 2f64.powi(-24)]);
}

#[test]
fn ema_blends_in_float32_for_the_batch_term() {
    // d = 0.9: d*mean is f64; (1-d)*batch_mean is a Python float times a
    // float32 tensor, so both factors are float32 and so is the product:
    // (1-0.9) in f64 is 0.09999999999999998, as float32 0.1f32, and
    // 0.1f32 * 3f32 = 0.30000001192092896 (float32), then widened.
    let cfg = NormConfig { ema_decay: Some(0.9), ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&rows(2, 3.0)).unwrap();
    let s = rms.state().unwrap();
    assert_eq!(f64s(&s.mean), [0.30000001192092896]);
    assert_ne!(0.30000001192092896, (1.0 - 0.9) * 3.0); // the f64-only answer differs
                                                        // var: 0.9 * 1.0 (f64) + (0.1f32 * 0f32) = 0.9
    assert_eq!(f64s(&s.var), [0.9]);
    assert_eq!(s.count, 1);
}

#[test]
fn exact_ema_adds_the_between_batch_term() {
    // mean 0, var 1, batch mean 3, var 0, d = 0.5:
    // var = 0.5*1 + 0.5*0 + 0.5*0.5*(3-0)^2 = 2.75; mean = 1.5.
    let cfg = NormConfig { ema_decay: Some(0.5), arithmetic: Arithmetic::Exact, ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&rows(4, 3.0)).unwrap();
    let s = rms.state().unwrap();
    assert_eq!(f64s(&s.mean), [1.5]);
    assert_eq!(f64s(&s.var), [2.75]);
}

#[test]
fn un_norm_clamps_before_scaling() {
    let cfg = NormConfig { clamp_value: Some(1.0), ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    rms.load_state(NormState {
        mean: Tensor::new(&[10.0f64], &cpu()).unwrap(),
        var: Tensor::new(&[4.0f64], &cpu()).unwrap(),
        count: 5,
    })
    .unwrap();
    let std = (4.0f32 + 1e-5f32).sqrt();
    // 3 is clamped to 1 first: 1 * std + 10, not clamp(3 * std + 10).
    let y = f32s(&rms.un_norm(&t2(&[&[3.0], &[-0.5]])).unwrap());
    assert_eq!(y, [1.0 * std + 10.0, -0.5 * std + 10.0]);
    // normalize clamps after: (30 - 10) / std = ~10 -> 1.
    assert_eq!(f32s(&rms.normalize(&t2(&[&[30.0]])).unwrap()), [1.0]);
}

#[test]
fn normalize_rounds_mean_and_var_to_float32_first() {
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    let mean = 0.1f64; // not a float32
    let var = 2.0f64 / 3.0;
    rms.load_state(NormState {
        mean: Tensor::new(&[mean], &cpu()).unwrap(),
        var: Tensor::new(&[var], &cpu()).unwrap(),
        count: 3,
    })
    .unwrap();
    let x = 1.0f32;
    let want = (x - mean as f32) / ((var as f32) + 1e-5f32).sqrt();
    assert_eq!(f32s(&rms.normalize(&t2(&[&[x]])).unwrap()), [want]);
}

#[test]
fn reward_return_resets_on_termination_only() {
    // gamma 0.9, one env: G1 = 1; G2 = 1*0.9*(1-0) + 2 = 2.9 (f32 ops);
    // G3 (terminated) = 2.9*0.9*0 + 5 = 5; G4 = 5*0.9 + 1.
    let mut rew = RewardRunningMeanStd::new(RewardConfig::with_gamma(0.9), Some(&[1]), &cpu()).unwrap();
    let steps = [(1.0f32, 0u8), (2.0, 0), (5.0, 1), (1.0, 0)];
    let g = 0.9f32;
    let mut want = vec![];
    let mut acc: Option<f32> = None;
    for (r, t) in steps {
        acc = Some(match acc {
            None => r,
            Some(a) => a * g * (1.0 - t as f32) + r,
        });
        want.push(acc.unwrap());
        rew.record_reward(&t1(&[r]), &Tensor::new(&[t], &cpu()).unwrap()).unwrap();
        assert_eq!(f32s(rew.discounted_reward().unwrap()), [*want.last().unwrap()]);
    }
    assert_eq!(want, [1.0, 2.9f32, 5.0, 5.0 * 0.9f32 + 1.0]);
    // 4 updates of 1 row on top of the 1-sample prior.
    assert_eq!(rew.state().unwrap().count, 5);
}

#[test]
fn reward_normalize_divides_without_subtracting_the_mean() {
    let cfg = NormConfig { clamp_value: Some(5.0), ..NormConfig::default() };
    let mut rew = RewardRunningMeanStd::new(RewardConfig { norm: cfg, gamma: 0.99 }, Some(&[1]), &cpu()).unwrap();
    rew.load_state(NormState {
        mean: Tensor::new(&[100.0f64], &cpu()).unwrap(),
        var: Tensor::new(&[4.0f64], &cpu()).unwrap(),
        count: 9,
    })
    .unwrap();
    let s = (4.0f32 + 1e-5).sqrt();
    let y = f32s(&rew.normalize(&t1(&[2.0, 100.0, -100.0])).unwrap());
    assert_eq!(y, [2.0 / s, 5.0, -5.0]);
    assert_eq!(f32s(&rew.un_norm(&t1(&[2.0, 9.0])).unwrap()), [2.0 * s, 5.0 * s]);
}

#[test]
fn reward_normalize_before_any_state_is_an_error() {
    let rew = RewardRunningMeanStd::new(RewardConfig::with_gamma(0.99), None, &cpu()).unwrap();
    assert!(matches!(rew.normalize(&t1(&[1.0])), Err(NormError::Uninitialized { .. })));
}

#[test]
fn lazy_shape_comes_from_the_first_input() {
    let mut rms = RunningMeanStd::new(NormConfig::default(), None, &cpu()).unwrap();
    assert_eq!(rms.shape(), None);
    let x = Tensor::ones((4, 2, 3), DType::F32, &cpu()).unwrap();
    // normalize on a lazy normalizer creates the default buffers (0, 1, 1).
    let y = f32s(&rms.normalize(&x).unwrap());
    assert_eq!(rms.shape(), Some(&[2usize, 3][..]));
    assert_eq!(rms.count(), Some(1));
    let want = 1.0f32 / (1.0f32 + 1e-5).sqrt();
    assert!(y.iter().all(|v| *v == want));
    // a different feature shape is then an error, and nothing changes.
    let err = rms.record_moments(&Tensor::ones((4, 5), DType::F32, &cpu()).unwrap()).unwrap_err();
    assert!(matches!(err, NormError::ShapeMismatch { .. }), "{err}");
    assert_eq!(rms.count(), Some(1));
}

#[test]
fn rewards_of_shape_n_broadcast_into_a_shape_1_normalizer() {
    // Batch moments of a [N] tensor are 0-dim; they broadcast into [1].
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&t1(&[1.0, 3.0])).unwrap();
    let s = rms.state().unwrap();
    // prior (0, 1, n=1) + batch (2, 1, n=2): mean 4/3, var (1 + 2 + 4*2/3)/3.
    let total = 3.0f32;
    let mean = 0.0 + 2.0 * (2.0f32 / total) as f64;
    let var = (1.0 * 1.0 + (1.0f32 * 2.0f32) as f64 + 4.0 * (1.0f32 * 2.0 / total) as f64) / 3.0;
    assert_eq!(f64s(&s.mean), [mean]);
    assert_eq!(f64s(&s.var), [var]);
    assert_eq!(s.count, 3);
}

/// Two ranks inside one test: rank 0's view of a world of 2 whose other
/// rank recorded `other`.
struct TwoRanks {
    other: Moments,
}
impl Collective for TwoRanks {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let theirs = match t.dtype() {
            DType::I64 => Tensor::new(self.other.count, &cpu())?,
            _ if t.dims() == self.other.mean.dims() && t.to_vec1::<f32>()? == [0.1f32] => self.other.mean.clone(),
            _ => self.other.var.clone(),
        };
        Ok(vec![t.clone(), theirs])
    }
    fn broadcast(&self, t: &Tensor, _: usize) -> Result<Tensor> {
        Ok(t.clone())
    }
}

#[test]
fn cross_rank_combine_runs_in_float32() {
    // Rank 0: mean 0.1, var 0 (n=3). Rank 1: mean 0.2, var 0 (n=3).
    // combine in f32: 0.1f32 + (0.2f32 - 0.1f32) * (3/6 in f32).
    let other = Moments { mean: t1(&[0.2]), var: t1(&[0.0]), count: 3 };
    let coll = Arc::new(TwoRanks { other });
    let cfg = NormConfig { ema_decay: Some(0.5), ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap().with_collective(coll);
    rms.record_batch_moments(Moments { mean: t1(&[0.1]), var: t1(&[0.0]), count: 3 }).unwrap();
    let combined = 0.1f32 + (0.2f32 - 0.1f32) * 0.5f32;
    // EMA d = 0.5: 0.5*0 + (0.5f32 * combined) in f32.
    assert_eq!(f64s(&rms.state().unwrap().mean), [(0.5f32 * combined) as f64]);
    assert_ne!((0.5f32 * combined) as f64, 0.5 * (0.1f32 as f64 + 0.2f32 as f64) / 2.0 * 1.0);
}

#[test]
fn combine_clamps_variance_at_zero_and_keeps_nan() {
    let m = combine_moments(&[t1(&[1.0])], &[t1(&[-2.0])], &[3], Arithmetic::Compat).unwrap();
    assert_eq!(f32s(&m.var), [0.0]);
    let m = combine_moments(&[t1(&[1.0])], &[t1(&[f32::NAN])], &[3], Arithmetic::Compat).unwrap();
    assert!(f32s(&m.var)[0].is_nan());
    // one part: the count still goes through float32.
    let m = combine_moments(&[t1(&[1.0])], &[t1(&[1.0])], &[16_777_217], Arithmetic::Compat).unwrap();
    assert_eq!(m.count, 16_777_216);
}

#[test]
fn switching_welford_ema_welford_keeps_the_stale_count() {
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&rows(4, 2.0)).unwrap();
    assert_eq!(rms.count(), Some(5));
    let before = rms.state().unwrap();
    rms.set_ema_decay(Some(0.5)).unwrap();
    rms.record_moments(&rows(10, 8.0)).unwrap();
    let s = rms.state().unwrap();
    // EMA starts from the Welford mean and ignores count.
    let m0 = f64s(&before.mean)[0];
    assert_eq!(f64s(&s.mean), [0.5 * m0 + (0.5f32 * 8.0f32) as f64]);
    assert_eq!(s.count, 5);
    rms.set_ema_decay(None).unwrap();
    rms.record_moments(&rows(5, 8.0)).unwrap();
    assert_eq!(rms.count(), Some(10));
}

#[test]
fn non_finite_input_propagates_in_compat_and_is_rejected_by_the_guard() {
    let x = t2(&[&[1.0], &[f32::NAN]]);
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&x).unwrap();
    assert!(f64s(&rms.state().unwrap().mean)[0].is_nan());

    let guarded = NormConfig { reject_non_finite: true, ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(guarded, Some(&[1]), &cpu()).unwrap();
    let err = rms.record_moments(&t2(&[&[1.0], &[f32::INFINITY]])).unwrap_err();
    assert!(matches!(err, NormError::NonFinite { what: "x", .. }), "{err}");
    assert_eq!(f64s(&rms.state().unwrap().mean), [0.0]);
    assert_eq!(rms.count(), Some(1));
}
