//! The eight normalization scenarios of ProtoMotions'
//! `protomotions/tests/test_agent_utils.py`, rewritten against this crate
//! with the same inputs and expectations.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use candle_core::{DType, Tensor};
use common::*;
use pmstate_norm::{
    combine_moments, Arithmetic, Collective, NormConfig, NormState, Result, RewardConfig, RewardRunningMeanStd,
    RunningMeanStd,
};

#[test]
fn combine_moments_matches_equivalent_concatenated_batch() {
    let m = combine_moments(&[t1(&[0.0]), t1(&[4.0])], &[t1(&[1.0]), t1(&[1.0])], &[2, 2], Arithmetic::Compat).unwrap();
    // Data [-1, 1, 3, 5]: mean 2, population variance 5.
    assert_eq!(f32s(&m.mean), [2.0]);
    assert_eq!(f32s(&m.var), [5.0]);
    assert_eq!(m.count, 4);
}

#[test]
fn combine_moments_carries_odd_batch_through_pairwise_reduction() {
    let m = combine_moments(
        &[t1(&[0.0]), t1(&[4.0]), t1(&[10.0])],
        &[t1(&[1.0]), t1(&[1.0]), t1(&[0.0])],
        &[2, 2, 1],
        Arithmetic::Compat,
    )
    .unwrap();
    let values = [-1.0f64, 1.0, 3.0, 5.0, 10.0];
    let mean = values.iter().sum::<f64>() / 5.0;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 5.0;
    assert_close(&f64s(&m.mean.to_dtype(DType::F64).unwrap()), &[mean], 1e-5);
    assert_close(&f64s(&m.var.to_dtype(DType::F64).unwrap()), &[var], 1e-5);
    assert_eq!(m.count, 5);
}

#[test]
fn running_mean_std_lazy_init_records_and_round_trips_normalized_values() {
    let mut rms = RunningMeanStd::new(NormConfig::default(), None, &cpu()).unwrap();
    let values = t2(&[&[1.0, 3.0], &[3.0, 5.0], &[5.0, 7.0]]);
    rms.record_moments(&values).unwrap();
    let normalized = rms.normalize(&values).unwrap();
    let restored = rms.un_norm(&normalized).unwrap();
    assert!(rms.is_initialized());
    assert_eq!(rms.shape(), Some(&[2usize][..]));
    let want: Vec<f64> = f32s(&values).iter().map(|&v| v as f64).collect();
    let got: Vec<f64> = f32s(&restored).iter().map(|&v| v as f64).collect();
    assert_close(&got, &want, 1e-5);
    assert!(rms.device().is_cpu());
}

#[test]
fn running_mean_std_ema_updates_without_accumulating_count() {
    let cfg = NormConfig { ema_decay: Some(0.5), ..NormConfig::default() };
    let mut rms = RunningMeanStd::new(cfg, Some(&[1]), &cpu()).unwrap();
    rms.record_moments(&t2(&[&[2.0], &[4.0]])).unwrap();
    let s = rms.state().unwrap();
    assert_eq!(f64s(&s.mean), [1.5]);
    assert_eq!(f64s(&s.var), [1.0]);
    assert_eq!(s.count, 1);
}

/// The test's `_DistributedFabric`: world size 2, this process is rank 0,
/// the first gathered tensor comes back as [v, v + 2], later ones as [v, v];
/// broadcasts are recorded and return their argument.
struct FakeFabric {
    gathers: AtomicUsize,
    broadcasts: Mutex<Vec<(Tensor, usize)>>,
}

impl Collective for FakeFabric {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        2
    }
    fn all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>> {
        let call = self.gathers.fetch_add(1, Ordering::SeqCst) + 1;
        if call == 1 && t.dtype().is_float() {
            let shifted = (t + 2.0)?;
            return Ok(vec![t.clone(), shifted]);
        }
        Ok(vec![t.clone(), t.clone()])
    }
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<Tensor> {
        self.broadcasts.lock().unwrap().push((t.copy()?, src));
        Ok(t.clone())
    }
}

#[test]
fn running_mean_std_records_distributed_moments_and_broadcasts() {
    let fabric = Arc::new(FakeFabric { gathers: AtomicUsize::new(0), broadcasts: Mutex::new(vec![]) });
    let mut rms =
        RunningMeanStd::new(NormConfig::default(), Some(&[1]), &cpu()).unwrap().with_collective(fabric.clone());
    // rms.count.zero_()
    let s = rms.state().unwrap();
    rms.load_state(NormState { count: 0, ..s }).unwrap();

    rms.record_moments(&t2(&[&[1.0], &[3.0]])).unwrap();

    let all = [1.0f64, 3.0, 3.0, 5.0];
    let mean = all.iter().sum::<f64>() / 4.0;
    let var = all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
    let s = rms.state().unwrap();
    assert_close(&f64s(&s.mean), &[mean], 1e-8);
    assert_close(&f64s(&s.var), &[var], 1e-8);
    assert_eq!(s.count, 4);
    let b = fabric.broadcasts.lock().unwrap();
    assert_eq!(b.len(), 3);
    assert!(b.iter().all(|(_, src)| *src == 0));
}

#[test]
fn materialize_lazy_running_stats_from_state_dict_creates_missing_buffers() {
    let mut obs_norm = RunningMeanStd::new(NormConfig::default(), None, &cpu()).unwrap();
    let state = NormState {
        mean: Tensor::zeros(3, DType::F64, &cpu()).unwrap(),
        var: Tensor::ones(3, DType::F64, &cpu()).unwrap(),
        count: 10,
    };
    assert!(obs_norm.materialize(state.mean.dims()).unwrap());
    obs_norm.load_state(state).unwrap();
    assert!(obs_norm.is_initialized());
    assert_eq!(obs_norm.shape(), Some(&[3usize][..]));
    assert_eq!(obs_norm.count(), Some(10));
}

#[test]
fn materialize_lazy_running_stats_skips_initialized_or_missing_state() {
    let mut initialized = RunningMeanStd::new(NormConfig::default(), Some(&[2]), &cpu()).unwrap();
    let missing = RunningMeanStd::new(NormConfig::default(), None, &cpu()).unwrap();
    // The state dict holds `initialized.mean` of shape [3] only.
    assert!(!initialized.materialize(&[3]).unwrap());
    assert_eq!(initialized.shape(), Some(&[2usize][..]));
    assert!(!missing.is_initialized());
}

#[test]
fn reward_running_mean_std_tracks_discounted_returns_with_termination_reset() {
    let mut rms = RewardRunningMeanStd::new(RewardConfig::with_gamma(0.5), Some(&[2]), &cpu()).unwrap();
    let no = Tensor::new(&[0u8, 0], &cpu()).unwrap();
    let second_done = Tensor::new(&[0u8, 1], &cpu()).unwrap();
    rms.record_reward(&t1(&[1.0, 2.0]), &no).unwrap();
    rms.record_reward(&t1(&[1.0, 2.0]), &second_done).unwrap();
    assert_eq!(f32s(rms.discounted_reward().unwrap()), [1.5, 2.0]);
    assert!(f32s(&rms.normalize(&t1(&[1.0, 2.0])).unwrap()).iter().all(|v| v.is_finite()));
    assert!(f32s(&rms.un_norm(&t1(&[1.0, 2.0])).unwrap()).iter().all(|v| v.is_finite()));
}
