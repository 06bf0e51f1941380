//! Invalid inputs give typed errors that name the value, and leave the
//! state as it was.

mod common;

use candle_core::{DType, Tensor};
use common::*;
use pmstate_norm::{
    NormConfig, NormError, NormState, PartsProblem, RewardConfig, RewardRunningMeanStd, RunningMeanStd, StateProblem,
};

#[test]
fn invalid_configs_name_the_field() {
    let cases: [(NormConfig, &str); 6] = [
        (NormConfig { epsilon: 0.0, ..Default::default() }, "epsilon"),
        (NormConfig { epsilon: f64::NAN, ..Default::default() }, "epsilon"),
        (NormConfig { ema_decay: Some(1.0), ..Default::default() }, "ema_decay"),
        (NormConfig { ema_decay: Some(0.0), ..Default::default() }, "ema_decay"),
        (NormConfig { clamp_value: Some(0.0), ..Default::default() }, "clamp_value"),
        (NormConfig { clamp_value: Some(-1.0), ..Default::default() }, "clamp_value"),
    ];
    for (cfg, field) in cases {
        let err = RunningMeanStd::new(cfg, None, &cpu()).unwrap_err();
        match &err {
            NormError::InvalidConfig { field: f, .. } => assert_eq!(*f, field),
            e => panic!("{e}"),
        }
        assert!(err.to_string().contains(field));
    }
    for gamma in [-0.1, 1.5, f64::NAN] {
        let err = RewardRunningMeanStd::new(RewardConfig::with_gamma(gamma), None, &cpu()).unwrap_err();
        assert!(matches!(err, NormError::InvalidConfig { field: "gamma", .. }), "{err}");
    }
    let mut rms = RunningMeanStd::new(NormConfig::default(), None, &cpu()).unwrap();
    assert!(rms.set_ema_decay(Some(2.0)).is_err());
    assert_eq!(rms.config().ema_decay, None);
}

fn loaded() -> (RunningMeanStd, NormState) {
    let mut rms = RunningMeanStd::new(NormConfig::default(), Some(&[3]), &cpu()).unwrap();
    rms.record_moments(&t2(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0]])).unwrap();
    let s = rms.state().unwrap();
    (rms, s)
}

fn same(a: &NormState, b: &NormState) {
    assert_eq!(f64s(&a.mean), f64s(&b.mean));
    assert_eq!(f64s(&a.var), f64s(&b.var));
    assert_eq!(a.count, b.count);
}

#[test]
fn bad_batches_are_errors_and_leave_the_state() {
    let (mut rms, before) = loaded();
    let bad: Vec<(Tensor, &str)> = vec![
        (Tensor::zeros((2, 4), DType::F32, &cpu()).unwrap(), "shape"),
        (Tensor::zeros((0, 3), DType::F32, &cpu()).unwrap(), "empty"),
        (Tensor::zeros((2, 3), DType::U8, &cpu()).unwrap(), "dtype"),
        (Tensor::zeros((2, 3), DType::I64, &cpu()).unwrap(), "dtype"),
        (Tensor::new(1.0f32, &cpu()).unwrap(), "shape"),
    ];
    for (x, kind) in bad {
        let err = rms.record_moments(&x).unwrap_err();
        let ok = match kind {
            "shape" => matches!(err, NormError::ShapeMismatch { op: "record_moments", .. }),
            "empty" => matches!(err, NormError::EmptyBatch { op: "record_moments", .. }),
            _ => matches!(err, NormError::UnsupportedDType { op: "record_moments", .. }),
        };
        assert!(ok, "{kind}: {err}");
        same(&rms.state().unwrap(), &before);
    }
    let err = rms.normalize(&Tensor::zeros((2, 4), DType::F32, &cpu()).unwrap()).unwrap_err();
    assert!(matches!(&err, NormError::ShapeMismatch { op: "normalize", got, .. } if got == &[2, 4]), "{err}");
}

#[test]
fn bad_states_are_refused() {
    let (mut rms, before) = loaded();
    let z = |n: usize, dt: DType| Tensor::zeros(n, dt, &cpu()).unwrap();
    type Case = (NormState, fn(&NormError) -> bool);
    let bad: [Case; 4] = [
        (NormState { mean: z(4, DType::F64), var: z(4, DType::F64), count: 1 }, |e| {
            matches!(e, NormError::InvalidState { field: "mean", problem: StateProblem::MeanShape { .. } })
        }),
        (NormState { mean: z(3, DType::F64), var: z(2, DType::F64), count: 1 }, |e| {
            matches!(e, NormError::InvalidState { field: "var", problem: StateProblem::VarShape { .. } })
        }),
        (NormState { mean: z(3, DType::I64), var: z(3, DType::F64), count: 1 }, |e| {
            matches!(e, NormError::InvalidState { field: "mean", problem: StateProblem::DType(DType::I64) })
        }),
        (NormState { mean: z(3, DType::F64), var: z(3, DType::F64), count: -1 }, |e| {
            matches!(e, NormError::InvalidState { field: "count", problem: StateProblem::NegativeCount(-1) })
        }),
    ];
    for (s, expected) in bad {
        let err = rms.load_state(s).unwrap_err();
        assert!(expected(&err), "{err}");
        same(&rms.state().unwrap(), &before);
    }
}

#[test]
fn reward_shape_changes_are_errors_and_keep_the_return() {
    let mut rew = RewardRunningMeanStd::new(RewardConfig::with_gamma(0.9), Some(&[1]), &cpu()).unwrap();
    let no = |n: usize| Tensor::zeros(n, DType::U8, &cpu()).unwrap();
    rew.record_reward(&t1(&[1.0, 2.0, 3.0]), &no(3)).unwrap();
    let err = rew.record_reward(&t1(&[1.0, 2.0]), &no(2)).unwrap_err();
    assert!(matches!(err, NormError::ShapeMismatch { .. }), "{err}");
    assert_eq!(f32s(rew.discounted_reward().unwrap()), [1.0, 2.0, 3.0]);
    assert_eq!(rew.state().unwrap().count, 4);
    let err = rew.record_reward(&Tensor::zeros(3, DType::I64, &cpu()).unwrap(), &no(3)).unwrap_err();
    assert!(matches!(err, NormError::UnsupportedDType { what: "reward", .. }), "{err}");
}

#[test]
fn combine_moments_rejects_parts_that_do_not_line_up() {
    use pmstate_norm::{combine_moments, Arithmetic};
    let m = |v: &[f32]| Tensor::new(v, &cpu()).unwrap();
    type Case = (Vec<Tensor>, Vec<Tensor>, Vec<i64>, fn(&PartsProblem) -> bool);
    let cases: Vec<Case> = vec![
        (vec![], vec![], vec![], |p| matches!(p, PartsProblem::Empty)),
        (vec![m(&[1.0])], vec![m(&[1.0]), m(&[1.0])], vec![1], |p| {
            matches!(p, PartsProblem::Lengths { means: 1, vars: 2, counts: 1 })
        }),
        (vec![m(&[1.0]), m(&[1.0, 2.0])], vec![m(&[1.0]), m(&[1.0, 2.0, 3.0])], vec![1, 1], |p| {
            matches!(p, PartsProblem::MeanVar { part: 1, .. })
        }),
        (vec![m(&[1.0])], vec![m(&[1.0])], vec![-3], |p| {
            matches!(p, PartsProblem::NegativeCount { part: 0, count: -3 })
        }),
        (vec![Tensor::new(&[1i64], &cpu()).unwrap()], vec![m(&[1.0])], vec![1], |p| {
            matches!(p, PartsProblem::DType { part: 0, what: "mean", dtype: DType::I64 })
        }),
    ];
    for (means, vars, counts, expected) in cases {
        for arith in [Arithmetic::Compat, Arithmetic::Exact] {
            match combine_moments(&means, &vars, &counts, arith) {
                Err(NormError::InvalidParts { problem }) => assert!(expected(&problem), "{problem}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
