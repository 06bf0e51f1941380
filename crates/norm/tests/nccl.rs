//! NCCL collectives on CUDA tensors (feature `nccl`). Compiled by CI without
//! a GPU; each test skips with a printed reason where no GPU (or, for the
//! multi-rank test, fewer than two GPUs) is present.
#![cfg(feature = "nccl")]

use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use pmstate_norm::{
    Collective, CollectiveProblem, InProcessGroup, NcclCollective, NcclId, NormConfig, NormError, RunningMeanStd,
    Unsendable,
};

fn gpus(n: usize) -> Option<Vec<Device>> {
    let devs: Result<Vec<_>, _> = (0..n).map(Device::new_cuda).collect();
    match devs {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("skipping NCCL test: needs {n} usable GPU(s) ({e})");
            None
        }
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    let t = t.to_device(&Device::Cpu).unwrap().flatten_all().unwrap();
    t.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn an_id_round_trips_through_bytes() {
    // ncclGetUniqueId needs no GPU, but does need libnccl at run time.
    match NcclId::new() {
        Ok(id) => assert_eq!(NcclId::from_bytes(id.to_bytes()).to_bytes(), id.to_bytes()),
        Err(e) => eprintln!("skipping: no usable NCCL library ({e})"),
    }
}

#[test]
fn world_of_one_gathers_broadcasts_and_refuses_cpu_tensors() {
    let Some(d) = gpus(1) else { return };
    let c = NcclCollective::new(&d[0], 0, 1, NcclId::new().unwrap(), Duration::from_secs(30)).unwrap();
    for dtype in [DType::F32, DType::F64, DType::I64, DType::U8] {
        let t = Tensor::arange(0f64, 12.0, &d[0]).unwrap().reshape((3, 4)).unwrap().to_dtype(dtype).unwrap();
        let g = c.all_gather(&t).unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!((g[0].dtype(), g[0].dims()), (dtype, t.dims()));
        assert_eq!(bits(&g[0]), bits(&t));
        assert!(g[0].device().is_cuda());
        assert_eq!(bits(&c.broadcast(&t, 0).unwrap()), bits(&t));
    }
    // A strided view is sent in row-major order.
    let t = Tensor::arange(0f32, 6.0, &d[0]).unwrap().reshape((2, 3)).unwrap().t().unwrap();
    assert_eq!(bits(&c.all_gather(&t).unwrap()[0]), bits(&t));
    let e = c.all_gather(&Tensor::new(&[1f32], &Device::Cpu).unwrap()).unwrap_err();
    let wrong_device = CollectiveProblem::CannotSend(Unsendable::WrongDevice { found: "cpu".into() });
    assert!(matches!(&e, NormError::Collective { problem, .. } if *problem == wrong_device), "{e}");
    // The refusal was agreed by every rank (here: one): still usable.
    assert!(c.broken().is_none());
    assert!(c.broadcast(&Tensor::new(&[1f32], &d[0]).unwrap(), 1).is_err());
}

#[test]
fn ranks_on_distinct_gpus_update_like_the_in_process_group() {
    let Some(devs) = gpus(2) else { return };
    let w = devs.len();
    let run = |c: Arc<dyn Collective>, dev: Device| -> Vec<u64> {
        let r = c.rank();
        let mut m = RunningMeanStd::new(NormConfig::default(), Some(&[358]), &dev).unwrap().with_collective(c);
        for step in 0..5 {
            let x = Tensor::arange(0f32, (358 * (r + step + 1)) as f32, &Device::Cpu).unwrap();
            let x = (x.reshape((r + step + 1, 358)).unwrap() * 0.001).unwrap().to_device(&dev).unwrap();
            m.record_moments(&x).unwrap();
        }
        let s = m.state().unwrap();
        [bits(&s.mean), bits(&s.var), vec![s.count as u64]].concat()
    };
    let nccl = NcclCollective::group(&devs, Duration::from_secs(60)).unwrap();
    let on_gpu: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> =
            nccl.into_iter().zip(&devs).map(|(c, d)| s.spawn(move || run(Arc::new(c), d.clone()))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let on_cpu: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = InProcessGroup::new(w, Duration::from_secs(60))
            .into_iter()
            .map(|c| s.spawn(move || run(Arc::new(c), Device::Cpu)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in 0..w {
        assert_eq!(on_gpu[r], on_gpu[0], "rank {r} ends with rank 0's state");
    }
    // The update arithmetic is the same on both devices (tests/cuda.rs);
    // batch moments may differ by a float32 ulp, so compare counts only.
    assert_eq!(on_gpu[0].last(), on_cpu[0].last());
}
