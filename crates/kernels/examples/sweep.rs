//! Times the packed kernels over a sweep of batch sizes on one thread: a
//! stack of ten `Linear(1024, 1024) + ReLU` layers (40 MiB of weights, more
//! than most L3 caches, as the smpl tracker's 42 MB), the fastest of 40
//! calls per batch size, the sizes taking turns over `--rounds` rounds so
//! that a slow spell of a shared machine touches all of them.
//!
//! usage: `cargo run --release -p pmstate-kernels --example sweep -- [--rounds N] [BATCH...]`
//! (default: every batch from 1 to 64, then 128 and 256;
//! `PMSTATE_CPU_ISA=avx2` times the AVX2 kernels on an AVX-512 CPU).
//!
//! Where `pmstate bench-policy` times a whole policy, this isolates the
//! matrix product: a step in its per-row time shows a kernel's block shape
//! (the latency-bound tail this was written to find).

use std::time::Instant;

use pmstate_kernels::testing::values;
use pmstate_kernels::{Epilogue, PackedLinear};

const WIDTH: usize = 1024;
const LAYERS: usize = 10;
const CALLS: usize = 40;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut rounds = 2;
    let mut batches = vec![];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--rounds" {
            rounds = args.next().ok_or("--rounds needs a number")?.parse()?;
        } else {
            batches.push(a.parse::<usize>().map_err(|e| format!("batch size {a:?}: {e}"))?);
        }
    }
    if batches.is_empty() {
        batches = (1..=64).chain([128, 256]).collect();
    }
    let layers = (0..LAYERS as u32)
        .map(|i| {
            let w = values(WIDTH * WIDTH, 0x9e37_79b9 + i, 0.03);
            let b = values(WIDTH, 0x85eb_ca6b + i, 0.1);
            PackedLinear::new(&w, &b, WIDTH, WIDTH)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let isa = layers[0].isa();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let mut best = vec![f64::INFINITY; batches.len()];
    pool.install(|| {
        for _ in 0..rounds {
            for (m, best) in batches.iter().zip(&mut best) {
                let x = values(m * WIDTH, 7, 1.0);
                let mut y = Vec::new();
                for _ in 0..CALLS {
                    let t = Instant::now();
                    for layer in &layers {
                        layer.forward_into(&x, *m, Epilogue::Relu, &mut y);
                    }
                    *best = best.min(t.elapsed().as_secs_f64());
                }
            }
        }
    });
    println!("{LAYERS} x Linear({WIDTH}, {WIDTH}) + ReLU, one thread, {isa}, fastest of {} calls", CALLS * rounds);
    println!("{:>6} {:>10} {:>10} {:>10}", "batch", "µs", "µs/row", "rows/s");
    for (m, t) in batches.iter().zip(best) {
        println!("{m:>6} {:>10.1} {:>10.1} {:>10.0}", t * 1e6, t * 1e6 / *m as f64, *m as f64 / t);
    }
    Ok(())
}
