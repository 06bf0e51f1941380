use candle_core::{Device, Tensor};
use std::time::Instant;
fn main() {
    let (r, c) = (4096usize, 358usize);
    let v: Vec<f32> = (0..r * c).map(|i| (i % 97) as f32 * 0.1).collect();
    let x = Tensor::from_vec(v.clone(), (r, c), &Device::Cpu).unwrap();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    pool.install(|| {
        for _ in 0..3 {
            let t = Instant::now();
            for _ in 0..100 { std::hint::black_box(pmstate_norm::batch_moments(&x).unwrap()); }
            println!("batch_moments {:?}", t.elapsed() / 100);
            let mut rms = pmstate_norm::RunningMeanStd::new(Default::default(), Some(&[c]), &Device::Cpu).unwrap();
            let t = Instant::now();
            for _ in 0..100 { rms.record_moments(&x).unwrap(); }
            println!("record {:?}", t.elapsed() / 100);
            let m = pmstate_norm::batch_moments(&x).unwrap();
            let t = Instant::now();
            for _ in 0..100 { rms.record_batch_moments(m.clone()).unwrap(); }
            println!("update only {:?}", t.elapsed() / 100);
        }
    });
}
