//! CUDA against CPU: the same updates and outputs, bit for bit (batch
//! moments excepted: CUDA's f64 reductions sum in another order, so they are
//! compared within a float32 ulp). Compiled with `--features cuda`; skipped
//! with a printed reason where no GPU is present.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use pmstate_norm::{batch_moments, NormConfig, RunningMeanStd};

fn gpu() -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping CUDA test: no usable GPU ({e})");
            None
        }
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    let t = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    match t.dtype() {
        DType::F32 => t.to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits() as u64).collect(),
        _ => t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap().iter().map(|v| v.to_bits()).collect(),
    }
}

#[test]
fn cuda_updates_and_normalize_match_cpu() {
    let Some(gpu) = gpu() else { return };
    let (rows, cols) = (1000, 37);
    let host: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 5.0).collect();
    let x_cpu = Tensor::from_vec(host, (rows, cols), &Device::Cpu).unwrap();
    let x_gpu = x_cpu.to_device(&gpu).unwrap();
    for ema in [None, Some(0.99)] {
        let cfg = NormConfig { clamp_value: Some(3.0), ema_decay: ema, ..NormConfig::default() };
        let mut a = RunningMeanStd::new(cfg, None, &Device::Cpu).unwrap();
        let mut b = RunningMeanStd::new(cfg, None, &gpu).unwrap();
        // Same batch moments on both: the update arithmetic must agree bit for bit.
        let m = batch_moments(&x_cpu).unwrap();
        let mg = batch_moments(&x_gpu).unwrap();
        for (c, g) in bits(&m.mean).iter().zip(bits(&mg.mean)) {
            assert!((*c as i64 - g as i64).abs() <= 1, "batch mean differs by more than 1 ulp");
        }
        a.record_batch_moments(m.clone()).unwrap();
        b.record_batch_moments(pmstate_norm::Moments {
            mean: m.mean.to_device(&gpu).unwrap(),
            var: m.var.to_device(&gpu).unwrap(),
            count: m.count,
        })
        .unwrap();
        let (sa, sb) = (a.state().unwrap(), b.state().unwrap());
        assert_eq!(bits(&sa.mean), bits(&sb.mean));
        assert_eq!(bits(&sa.var), bits(&sb.var));
        assert_eq!(sa.count, sb.count);
        for direction in [pmstate_norm::Direction::Normalize, pmstate_norm::Direction::UnNormalize] {
            let ya = a.apply(&x_cpu, direction).unwrap();
            let yb = b.apply(&x_gpu, direction).unwrap();
            assert_eq!(bits(&ya), bits(&yb), "{}", direction.op_name());
        }
    }
}
