//! Criterion benchmarks of the normalizer hot paths, beside a plain copy of
//! the same bytes (the bandwidth limit). `pmstate bench` reports the same
//! operations as JSON; `benches/torch_side_by_side.py` compares with torch.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmstate_norm::{NormConfig, RunningMeanStd};

const SHAPES: [(usize, usize); 3] = [(4096, 358), (16384, 512), (65536, 64)];

fn data(rows: usize, cols: usize) -> Vec<f32> {
    (0..rows * cols).map(|i| ((i * 2_654_435_761) % 1000) as f32 * 0.003 - 1.5 + (i % cols) as f32 * 0.01).collect()
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("norm");
    g.sample_size(20);
    for (rows, cols) in SHAPES {
        let host = data(rows, cols);
        let x = Tensor::from_vec(host.clone(), (rows, cols), &Device::Cpu).unwrap();
        let id = format!("{rows}x{cols}");
        let bytes = (rows * cols * 4) as u64;
        let obs = NormConfig { clamp_value: Some(5.0), ..NormConfig::default() };
        let mut welford = RunningMeanStd::new(obs, Some(&[cols]), &Device::Cpu).unwrap();
        let mut ema =
            RunningMeanStd::new(NormConfig { ema_decay: Some(0.999), ..obs }, Some(&[cols]), &Device::Cpu).unwrap();
        welford.record_moments(&x).unwrap();

        g.throughput(Throughput::Bytes(2 * bytes));
        g.bench_function(BenchmarkId::new("normalize", &id), |b| {
            b.iter(|| welford.apply(&x, pmstate_norm::Direction::Normalize).unwrap())
        });
        g.bench_function(BenchmarkId::new("copy", &id), |b| b.iter(|| pmstate_norm::bench_support::copy(&host, cols)));
        g.throughput(Throughput::Bytes(bytes));
        g.bench_function(BenchmarkId::new("record_moments", &id), |b| b.iter(|| welford.record_moments(&x).unwrap()));
        g.bench_function(BenchmarkId::new("record_moments_ema", &id), |b| b.iter(|| ema.record_moments(&x).unwrap()));
    }
    g.finish();
}

criterion_group!(norm, benches);
criterion_main!(norm);
