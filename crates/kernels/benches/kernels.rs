//! Criterion benchmarks of one packed `Linear + ReLU` layer on one thread,
//! the smpl tracker's hidden layer (1024 x 1024) at the batch sizes
//! `pmstate bench-policy` times, and a block that stays in L1/L2 (the
//! micro-kernel with its operands in cache).
//!
//! 12 rows is a single AVX-512 micro-panel, where asking for the next slice
//! costs most (a whole slice requested before a sweep that reads it once).
//!
//! Throughput is in multiply-adds counted twice (`2 m n k`): criterion's
//! "elem/s" reads as FLOP/s, so "78 Gelem/s" is 78 GFLOP/s on one core.
//! `pmstate bench-policy` times the whole policy; this isolates the kernel.
//! Each shape runs twice: with the next-slice hint this CPU gets by default
//! (`default`) and the other way (`prefetch` or `leave`), so one run says
//! whether the default is the right one here.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmstate_kernels::testing::values;
use pmstate_kernels::{Epilogue, NextSlice, PackedLinear};

/// `(m, n, k)`: batch rows, output width, input width.
const SHAPES: [(usize, usize, usize); 6] =
    [(1, 1024, 1024), (12, 1024, 1024), (64, 1024, 1024), (1024, 1024, 1024), (4096, 1024, 1024), (240, 32, 256)];

fn benches(c: &mut Criterion) {
    // one thread: the per-core throughput, as `bench-policy --threads 1`
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread rayon pool");
    let mut g = c.benchmark_group("packed_linear");
    g.sample_size(10);
    for (m, n, k) in SHAPES {
        let weight = values(n * k, 0x9e37_79b9, 1.0 / (k as f32).sqrt());
        let bias = values(n, 0x85eb_ca6b, 0.1);
        let x = values(m * k, 0xc2b2_ae35, 1.0);
        let layer = PackedLinear::new(&weight, &bias, n, k).expect("the CPU kernels' instruction set");
        let (other, other_name) = match NextSlice::for_this_cpu() {
            NextSlice::Prefetch => (NextSlice::Leave, "leave"),
            NextSlice::Leave => (NextSlice::Prefetch, "prefetch"),
        };
        let mut y = Vec::new();
        g.throughput(Throughput::Elements(2 * (m * n * k) as u64));
        for (name, layer) in [("default", layer.clone()), (other_name, layer.with_next_slice(other))] {
            g.bench_function(BenchmarkId::new(format!("relu/{name}"), format!("{m}x{n}x{k}")), |b| {
                pool.install(|| b.iter(|| layer.forward_into(&x, m, Epilogue::Relu, &mut y)))
            });
        }
    }
    g.finish();
}

criterion_group!(kernels, benches);
criterion_main!(kernels);
