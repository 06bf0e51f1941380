#![allow(dead_code)]
//! Helpers shared by the integration tests.

use candle_core::{DType, Device, Tensor};

pub fn cpu() -> Device {
    Device::Cpu
}

pub fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

pub fn f64s(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

pub fn t1(v: &[f32]) -> Tensor {
    Tensor::new(v, &cpu()).unwrap()
}

pub fn t2(rows: &[&[f32]]) -> Tensor {
    let cols = rows[0].len();
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), cols), &cpu()).unwrap()
}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol, "got {got:?}, want {want:?} (tol {tol})");
    }
}
